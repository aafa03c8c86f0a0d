"""The mutation check: break each guarantee of ``design/contract.md`` one line at a time and
check that the tests named for it notice, by a failed assertion.

``tools/mutants.toml`` lists the mutants: a name, the guarantee it breaks, the file, the exact
original text (it must occur once), its replacement, and the tests that must catch it; or
``equivalent`` with the reason it cannot be caught (then it is not run). Each mutant is applied
to a temporary copy of the checkout (never to the checkout itself), and only its tests run, with
the copy first on ``PYTHONPATH`` (so the CLI processes the tests start run the mutant too).

A mutant is *caught* when one of its tests fails on an ``AssertionError`` (or ``pytest.fail``,
``pytest.raises``' "DID NOT RAISE"); *missed* when they all pass; *broken* when they fail
otherwise (a crash, a timeout, a harness error): that is no proof, and fails the check too.

    python3 tools/mutants.py                 # every mutant; exit 1 unless all caught
    python3 tools/mutants.py NAME ...        # only these
    python3 tools/mutants.py --runs 3        # each mutant three times (determinism)
    python3 tools/mutants.py --list
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent
LIST: Final = ROOT / "tools" / "mutants.toml"
PLUGIN_DIR: Final = ROOT / "tools"
TEST_TIMEOUT: Final = 120
"""pytest-timeout per test of a mutant run: a mutant that hangs a test is broken, not caught."""
RUN_TIMEOUT: Final = 300
"""The whole pytest run of one mutant."""


@dataclass(frozen=True)
class Mutant:
    """One named one-line change that breaks one guarantee."""

    name: str
    guarantee: str
    file: str
    original: str
    replacement: str
    tests: tuple[str, ...]
    equivalent: str | None = None
    env: dict[str, str] = field(default_factory=dict)


def load(path: Path = LIST) -> list[Mutant]:
    """The mutants of the list, checked for the keys each needs."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    mutants = []
    for entry in data.get("mutant", []):
        mutants.append(
            Mutant(
                name=entry["name"],
                guarantee=entry["guarantee"],
                file=entry["file"],
                original=entry["original"],
                replacement=entry["replacement"],
                tests=tuple(entry.get("tests", ())),
                equivalent=entry.get("equivalent"),
                env=dict(entry.get("env", {})),
            )
        )
    names = [mutant.name for mutant in mutants]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise SystemExit(f"mutants: names used twice: {', '.join(duplicates)}")
    return mutants


def tracked_files() -> list[str]:
    """The checkout's files as git sees them (tracked and new, never ignored ones)."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    return [name for name in out.decode().split("\0") if name]


def copy_tree(dest: Path) -> None:
    """A copy of the checkout in ``dest`` (the mutants are applied there, never here)."""
    for name in tracked_files():
        source = ROOT / name
        if not source.is_file() or source.is_symlink():
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def check_list(mutants: list[Mutant]) -> list[str]:
    """Problems of the list against the checkout: each original must occur exactly once."""
    problems = []
    for mutant in mutants:
        path = ROOT / mutant.file
        if not path.is_file():
            problems.append(f"{mutant.name}: no file {mutant.file}")
            continue
        count = path.read_text(encoding="utf-8").count(mutant.original)
        if count != 1:
            problems.append(f"{mutant.name}: original found {count} times in {mutant.file}")
        if mutant.equivalent is None and not mutant.tests:
            problems.append(f"{mutant.name}: names no test (and is not marked equivalent)")
    return problems


def run_tests(tree: Path, mutant: Mutant, report: Path) -> subprocess.CompletedProcess[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), str(PLUGIN_DIR)]))
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no stale bytecode of the original between mutants
    env["MAHABHARATHA_MUTANT_REPORT"] = str(report)
    env.update(mutant.env)
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "mutant_outcomes",
        f"--timeout={TEST_TIMEOUT}",
        *mutant.tests,
    ]
    return subprocess.run(argv, cwd=tree, env=env, capture_output=True, timeout=RUN_TIMEOUT)


def verdict(report: Path) -> tuple[str, str]:
    """(caught | missed | broken, detail) from the outcomes the plugin wrote."""
    try:
        outcomes = [json.loads(line) for line in report.read_text().splitlines() if line]
    except FileNotFoundError:
        return "broken", "pytest wrote no outcome (it crashed or collected nothing)"
    if not outcomes:
        return "broken", "no test ran"
    asserted = [o for o in outcomes if o["outcome"] == "failed" and o["assertion"]]
    if asserted:
        return "caught", asserted[0]["nodeid"]
    other = [o for o in outcomes if o["outcome"] not in ("passed", "skipped")]
    if other:
        first = other[0]
        return "broken", f"{first['nodeid']}: {first['outcome']} ({first['detail']})"
    if any(o["outcome"] == "skipped" for o in outcomes):
        return "broken", "a test skipped: it proves nothing"
    return "missed", "every named test passed"


def try_mutant(tree: Path, mutant: Mutant) -> tuple[str, str, float]:
    """Apply ``mutant`` in ``tree``, run its tests, put the file back."""
    path = tree / mutant.file
    original = path.read_text(encoding="utf-8")
    path.write_text(original.replace(mutant.original, mutant.replacement, 1), encoding="utf-8")
    report = tree / ".mutant-outcomes.jsonl"
    report.unlink(missing_ok=True)
    began = time.monotonic()
    try:
        result = run_tests(tree, mutant, report)
        outcome, detail = verdict(report)
        if outcome == "broken" and result.returncode not in (0, 1):
            tail = result.stdout.decode(errors="replace").strip().splitlines()[-1:]
            detail = f"{detail}; pytest exit {result.returncode}: {' '.join(tail)}"
    except subprocess.TimeoutExpired:
        outcome, detail = "broken", f"the run took over {RUN_TIMEOUT} s"
    finally:
        path.write_text(original, encoding="utf-8")
    return outcome, detail, time.monotonic() - began


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("names", nargs="*", help="run only these mutants")
    parser.add_argument("--runs", type=int, default=1, help="times to try each mutant")
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    args = parser.parse_args(argv)
    mutants = load()
    problems = check_list(mutants)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 2
    if args.names:
        unknown = sorted(set(args.names) - {m.name for m in mutants})
        if unknown:
            print(f"mutants: no such mutant: {', '.join(unknown)}", file=sys.stderr)
            return 2
        mutants = [m for m in mutants if m.name in args.names]
    if args.list:
        for mutant in mutants:
            print(f"{mutant.name}: {mutant.guarantee}")
        return 0
    failed = 0
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mahabharatha-mutants.") as work:
        tree = Path(work) / "tree"
        copy_tree(tree)
        os.chmod(work, 0o755)  # the hidepid tests run this tree's code as nobody
        for mutant in mutants:
            if mutant.equivalent is not None:
                print(f"equivalent {mutant.name}: {mutant.equivalent}", flush=True)
                continue
            for _ in range(args.runs):
                outcome, detail, seconds = try_mutant(tree, mutant)
                print(f"{outcome:6} {mutant.name} ({seconds:.0f} s): {detail}", flush=True)
                failed += outcome != "caught"
    print(f"mutants: {failed} run(s) not caught; {time.monotonic() - began:.0f} s in all")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
