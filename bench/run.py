"""Run every benchmark scenario side by side and write results.md, results.json and chart.png.

    python3 bench/run.py [--quick] [--out bench/results] [--workdir DIR] [--only 1,4]

Install the peers first: ``python3 -m pip install -e '.[bench]'``. A peer that is not installed
is skipped (the results say so); ours, the floors and the naive baseline always run.
See ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: import this work tree's bench and mahabharatha
    sys.path.insert(0, str(ROOT))

from bench import machine, pg_scenarios, pool_work, report, scenarios  # noqa: E402


@dataclass(frozen=True)
class Sizes:
    """How much of each scenario to run. The scenario shapes (8 processes, 1,000 features,
    10,000 locks) are the issue's; only ``--tiny`` (the smoke test) shrinks them."""

    uncontended_rounds: int
    uncontended_cycles: int
    contended_rounds: int
    contended_seconds: float
    contended_procs: int
    storm_rounds: int
    storm_features: int
    storm_workers: int
    status_rounds: int
    status_locks: int
    cli_runs: int
    handoffs: int


SIZES = {
    "full": Sizes(15, 2000, 7, 1.0, 8, 7, 1000, 8, 7, 10_000, 21, 200),
    "quick": Sizes(5, 300, 3, 0.3, 8, 3, 1000, 8, 3, 10_000, 5, 30),
    # tiny: 0.3 s per contended round, so that on a loaded machine (MAHABHARATHA_LOAD=1) each
    # contender is scheduled within the round and wins at least once (0.05 s won none).
    "tiny": Sizes(2, 20, 1, 0.3, 8, 1, 40, 8, 1, 50, 1, 3),
}

SCENARIO_NUMBERS = {
    1: "uncontended",
    2: "contended",
    3: "storm",
    4: "status",
    5: "cli",
    6: "handoff",
    7: "pg-uncontended",
    8: "pg-storm",
    9: "pg-handoff",
    10: "pg-cli",
}
"""7-10: PostgreSQL (bench/pg_scenarios.py), against a server the benchmark starts itself."""


def _runners(sizes: Sizes) -> dict[str, Callable[[Path], dict[str, Any]]]:
    return {
        # (1) is run by _uncontended_on_two: on the disk and on a tmpfs of its own.
        "uncontended": lambda _w: {},
        "contended": lambda w: scenarios.contended(
            w,
            rounds=sizes.contended_rounds,
            seconds=sizes.contended_seconds,
            procs=sizes.contended_procs,
        ),
        "storm": lambda w: scenarios.storm(
            w, rounds=sizes.storm_rounds, features=sizes.storm_features, workers=sizes.storm_workers
        ),
        "status": lambda w: scenarios.status(
            w, rounds=sizes.status_rounds, locks_count=sizes.status_locks
        ),
        "cli": lambda w: scenarios.cli(w, runs=sizes.cli_runs),
        "handoff": lambda w: scenarios.handoff(w, handoffs=sizes.handoffs),
        **pg_scenarios.runners(sizes.uncontended_rounds, sizes.handoffs, sizes.cli_runs),
    }


def _uncontended_on_two(
    work: Path, parent: Path, sizes: Sizes, results: dict[str, Any]
) -> dict[str, Any]:
    """Scenario (1) on the work folder's file system and, side by side in the same rounds, on
    a tmpfs this run mounts (and unmounts) itself; on the one alone when it cannot mount."""
    with machine.scratch_tmpfs(parent) as (tmpfs, why_not):
        places = {"uncontended": work}
        if tmpfs is None:
            print(f"[bench] {why_not}", file=sys.stderr)
            results["second_filesystem"] = why_not
        else:
            print(f"[bench] mounted a tmpfs at {tmpfs}", file=sys.stderr, flush=True)
            places["uncontended-tmpfs"] = tmpfs
        found = scenarios.uncontended_on(
            places, rounds=sizes.uncontended_rounds, cycles=sizes.uncontended_cycles
        )
        for name, scenario in found.items():
            scenario["filesystem"] = machine.filesystem_of(places[name])
    if "uncontended-tmpfs" in found:
        found["uncontended-tmpfs"].update(
            id="uncontended-tmpfs",
            number="1b",
            title=found["uncontended-tmpfs"]["title"] + ", on a tmpfs the run mounted",
        )
    return found


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="fewer rounds (under a minute)")
    mode.add_argument(
        "--tiny",
        action="store_true",
        help="tiny sizes for the smoke test: proves the scenarios run, not speed",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "bench" / "results",
        help="folder for results.md, results.json, chart.png",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where the locks are made (default: a temp folder in bench/.work); "
        "its file system is what is measured",
    )
    parser.add_argument(
        "--only", default="", help="comma-separated scenario numbers (1-10) to run; default all"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = _parse(argv)
    mode = "tiny" if args.tiny else "quick" if args.quick else "full"
    sizes = SIZES[mode]
    wanted = (
        [SCENARIO_NUMBERS[int(n)] for n in args.only.split(",") if n.strip()]
        if args.only
        else list(SCENARIO_NUMBERS.values())
    )
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    parent = args.workdir or ROOT / "bench" / ".work"
    parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="run-", dir=parent))
    shown = ["python3", "bench/run.py", *(sys.argv[1:] if argv is None else argv)]
    results: dict[str, Any] = {
        "command": shlex.join(shown),
        "mode": mode,
        "sizes": asdict(sizes),
        "started": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine.machine_info(work),
        "scenarios": {},
    }
    began = time.perf_counter()
    try:
        runners = _runners(sizes)
        if any(name not in runners for name in wanted):
            print("[bench] PostgreSQL not installed: scenarios 7-10 left out", file=sys.stderr)
            wanted = [name for name in wanted if name in runners]
        for name in wanted:
            print(
                f"[bench] ({list(SCENARIO_NUMBERS.values()).index(name) + 1}) {name} ...",
                file=sys.stderr,
                flush=True,
            )
            started = time.perf_counter()
            if name == "uncontended":
                results["scenarios"].update(_uncontended_on_two(work, parent, sizes, results))
            else:
                results["scenarios"][name] = runners[name](work)
            print(
                f"[bench]     done in {time.perf_counter() - started:.1f} s",
                file=sys.stderr,
                flush=True,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["elapsed_s"] = time.perf_counter() - began
    results["machine"]["loadavg_at_end"] = list(os.getloadavg())
    results["machine"]["io_pressure_at_end"] = machine.io_pressure()
    results["targets"] = report.targets(results)
    chart = report.chart(results, out / "chart.png")
    if chart is None:
        print("[bench] matplotlib not installed: no chart", file=sys.stderr)
    page = report.markdown(results, chart)
    # (11), bench/pool_work.py's own run, keeps its section of the page.
    page = pool_work.with_kept_section(page, out / "results.md")
    (out / "results.md").write_text(page, encoding="utf-8")
    report.write_json(results, out / "results.json")
    print(f"[bench] wrote {out / 'results.md'}", file=sys.stderr)
    return results


if __name__ == "__main__":
    main()
