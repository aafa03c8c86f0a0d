"""Benchmark (11): a pool of ``lock work`` workers against ``xargs -P`` running the same commands.

    python3 bench/pool_work.py [--features 400] [--workers 8] [--rounds 3] [--no-postgres]

Eight ``lock work`` workers (console script, each a process of its own, started at once) take
400 features, each command ``sleep 0.05`` (the target: at most 1.2x xargs) and ``true`` (pure
overhead), against ``xargs -P 8 -I {}`` (one command per feature) running the same 400
commands, side by side in each round, on files and on PostgreSQL (a throw-away server, as the
tests start one). The overhead per feature is (pool - xargs) / features * workers: what one
worker spends per feature beyond the command itself. Writes its section of
``bench/results/results.md`` (between markers, so the rest of the page, written by
``bench/run.py``, stays).
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import pg_scenarios  # noqa: E402

RESULTS: Final = ROOT / "bench" / "results" / "results.md"
BEGIN: Final = "<!-- pool-work: begin (bench/pool_work.py) -->"
END: Final = "<!-- pool-work: end -->"
TARGET: Final = 1.2
COMMANDS: Final = {"sleep 0.05": ["sleep", "0.05"], "true": ["true"]}


def _cli() -> list[str]:
    script = shutil.which("mahabharatha")
    return [script] if script else [sys.executable, "-m", "mahabharatha"]


def _features(work: Path, count: int) -> list[str]:
    names = [f"feat-{i:04d}" for i in range(count)]
    shutil.rmtree(work / ".gsd", ignore_errors=True)
    for name in names:
        (work / ".gsd" / "specs" / name).mkdir(parents=True)
    return names


def _pool(work: Path, workers: int, command: list[str], env: dict[str, str]) -> float:
    """``workers`` separate ``lock work`` commands (the README's shell loop)."""
    argv = [*_cli(), "lock", "work", "--", *command]
    started = time.perf_counter()
    team = [
        subprocess.Popen(
            argv, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for _ in range(workers)
    ]
    codes = [worker.wait() for worker in team]
    elapsed = time.perf_counter() - started
    if codes != [0] * workers:
        raise RuntimeError(f"lock work exited {codes}")
    return elapsed


def _jobs(work: Path, workers: int, command: list[str], env: dict[str, str]) -> float:
    """One ``lock work -j workers`` (as ``xargs -P`` is one command)."""
    argv = [*_cli(), "lock", "work", "-j", str(workers), "--", *command]
    started = time.perf_counter()
    code = subprocess.call(
        argv, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    elapsed = time.perf_counter() - started
    if code != 0:
        raise RuntimeError(f"lock work -j exited {code}")
    return elapsed


FORMS: Final = {"processes": _pool, "-j": _jobs}
"""The two ways to run the pool: N ``lock work`` commands, or one ``lock work -j N``."""


def _xargs(work: Path, names: list[str], workers: int, command: list[str]) -> float:
    # The same commands, one per feature (-I: one input line each, as -n 1 would be, which
    # xargs ignores beside -I with a warning): ``sleep 0.05 feat-0001`` would be a wrong sleep,
    # and -I with no {} in the command runs it as it is.
    argv = ["xargs", "-P", str(workers), "-I", "{}", *command]
    started = time.perf_counter()
    subprocess.run(argv, input="\n".join(names) + "\n", text=True, check=True, cwd=work)
    return time.perf_counter() - started


def _done_count(work: Path) -> int:
    return sum(1 for _ in (work / ".gsd" / "specs").glob("*/.completed"))


@contextmanager
def _backends(use_postgres: bool) -> Iterator[list[tuple[str, dict[str, str]]]]:
    base = {**os.environ}
    base.pop("MAHABHARATHA_LOCK_URL", None)
    if not use_postgres:
        yield [("files", base)]
        return
    with pg_scenarios.server() as server:
        if server is None:
            yield [("files", base)]
            return
        on_pg = {**base, "MAHABHARATHA_LOCK_URL": server.url()}
        yield [("files", base), ("PostgreSQL", on_pg)]


def measure(
    features: int, workers: int, rounds: int, use_postgres: bool
) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="pool-bench-") as folder:
        work = Path(folder)
        with _backends(use_postgres) as backends:
            for backend, env in backends:
                for label, command in COMMANDS.items():
                    rows += _measure_one(
                        work, backend, env, label, command, features, workers, rounds
                    )
    return rows


def _measure_one(
    work: Path,
    backend: str,
    env: dict[str, str],
    label: str,
    command: list[str],
    features: int,
    workers: int,
    rounds: int,
) -> list[dict[str, object]]:
    """xargs and both forms of the pool, in an order that turns each round (nobody always
    gets a warm cache), the same commands over fresh feature folders each time."""
    times: dict[str, list[float]] = {"xargs": [], **{form: [] for form in FORMS}}
    for round_no in range(rounds):
        order = list(times)
        order = order[round_no % len(order) :] + order[: round_no % len(order)]
        for who in order:
            names = _features(work, features)
            run_env = {**env, "MAHABHARATHA_LOCK_NAMESPACE": f"bench-{uuid.uuid4().hex}"}
            if who == "xargs":
                times[who].append(_xargs(work, names, workers, command))
                continue
            times[who].append(FORMS[who](work, workers, command, run_env))
            if _done_count(work) != features:
                raise RuntimeError(f"{backend} {who}: {_done_count(work)} of {features} done")
    xargs = statistics.median(times["xargs"])
    rows: list[dict[str, object]] = []
    for form in FORMS:
        pool = statistics.median(times[form])
        rows.append(
            {
                "backend": backend,
                "command": label,
                "form": f"{workers} processes" if form == "processes" else f"-j {workers}",
                "pool_s": pool,
                "xargs_s": xargs,
                "ratio": pool / xargs,
                "overhead_ms": (pool - xargs) / features * workers * 1000,
            }
        )
        print(rows[-1], flush=True)
    return rows


def section(rows: list[dict[str, object]], features: int, workers: int, rounds: int) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [
        BEGIN,
        "## (11) A pool of `lock work` workers against `xargs -P` (issue 18)",
        "",
        f"Produced by `python3 bench/pool_work.py` on {stamp}: {workers} `lock work` workers over "
        f"{features} features against `xargs -P {workers} -I {{}}` (one command per feature) "
        "running the same commands, side by "
        f"side, median of {rounds} rounds. The pool runs two ways: {workers} separate `lock work` "
        f"commands (the README's shell loop: {workers} interpreter start-ups), and one "
        f"`lock work -j {workers}` (one command, as `xargs -P {workers}` is: one start-up, the "
        "workers forked from it). Every feature is marked done once (checked). Overhead "
        "per feature: what one worker spends per feature beyond the command (claim, `lock run`'s "
        "runner, done), (pool - xargs) / features x workers. Target: <= 1.2x xargs with "
        "`sleep 0.05`.",
        "",
        "| backend | command | pool | pool (s) | xargs (s) | ratio | overhead per feature "
        "| target |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ratio = float(str(row["ratio"]))
        target = ""
        if row["command"] == "sleep 0.05":
            target = "met" if ratio <= TARGET else "**missed**"
        lines.append(
            f"| {row['backend']} | `{row['command']}` | {row['form']} | "
            f"{float(str(row['pool_s'])):.2f} | "
            f"{float(str(row['xargs_s'])):.2f} | {ratio:.2f}x | "
            f"{float(str(row['overhead_ms'])):.1f} ms | {target} |"
        )
    lines += ["", END]
    return "\n".join(lines) + "\n"


def _with_section(page: str, text: str) -> str:
    if BEGIN in page and END in page:
        before = page[: page.index(BEGIN)]
        after = page[page.index(END) + len(END) :].lstrip("\n")
        return before + text + ("\n" + after if after else "")
    return page.rstrip("\n") + "\n\n" + text


def with_kept_section(page: str, old_page: Path) -> str:
    """``page`` (``run.py``'s new results) with this scenario's section of ``old_page``."""
    try:
        old = old_page.read_text()
    except OSError:
        return page
    if BEGIN not in old or END not in old:
        return page
    return _with_section(page, old[old.index(BEGIN) : old.index(END) + len(END)] + "\n")


def write_section(text: str) -> None:
    page = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    RESULTS.write_text(_with_section(page, text))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--features", type=int, default=400)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--print-only", action="store_true", help="do not write results.md")
    options = parser.parse_args()
    # An installed package has its bytecode compiled (pip does it); a checkout run with
    # PYTHONDONTWRITEBYTECODE set would compile every module at every start of every worker.
    compileall.compile_dir(ROOT / "mahabharatha", quiet=1)
    rows = measure(options.features, options.workers, options.rounds, not options.no_postgres)
    text = section(rows, options.features, options.workers, options.rounds)
    print(text)
    if not options.print_only:
        write_section(text)


if __name__ == "__main__":
    main()
