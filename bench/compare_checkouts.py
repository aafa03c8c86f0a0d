"""The uncontended acquire + release cycle of two checkouts, side by side in one run.

    python bench/compare_checkouts.py BEFORE_DIR AFTER_DIR [--rounds 31] [--cycles 2000]

Each checkout runs in its own long-lived worker process (``PYTHONPATH`` = that checkout); the
parent asks them for one round at a time, alternating which goes first, so a disturbance on a
shared machine hits both alike. Printed: the median cycles/s of each over the rounds, and
after/before. Contenders: the legacy functions, ``FeatureLock`` entered per cycle, and
``locks.acquire`` + ``locks.release``. (Make a checkout with ``git archive REV | tar -x -C DIR``.)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Final

CONTENDERS: Final = ("legacy", "FeatureLock", "acquire/release")

WORKER: Final = """
import gc, os, sys, tempfile, time
from mahabharatha import locks
from mahabharatha.commands._utils import acquire_feature_lock, release_feature_lock
gsd = os.path.join(tempfile.mkdtemp(prefix="compare-"), "gsd")
os.makedirs(os.path.join(gsd, "specs", "feat"))
held = locks.FeatureLock("feat", gsd, timeout=0, heartbeat=None)
def legacy():
    assert acquire_feature_lock("feat", gsd)
    release_feature_lock("feat", gsd)
def feature_lock():
    with held:
        pass
def functions():
    locks.acquire("feat", gsd)
    locks.release("feat", gsd)
cycles = {"legacy": legacy, "FeatureLock": feature_lock, "acquire/release": functions}
for cycle in cycles.values():
    for _ in range(200):
        cycle()
for line in sys.stdin:
    name, count = line.rsplit(" ", 1)
    cycle, n = cycles[name], int(count)
    gc.collect()
    start = time.perf_counter()
    for _ in range(n):
        cycle()
    print(n / (time.perf_counter() - start), flush=True)
"""


def _worker(checkout: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(checkout.resolve())}
    return subprocess.Popen(
        [sys.executable, "-c", WORKER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def _round(worker: subprocess.Popen[str], contender: str, cycles: int) -> float:
    assert worker.stdin is not None and worker.stdout is not None
    worker.stdin.write(f"{contender} {cycles}\n")
    worker.stdin.flush()
    return float(worker.stdout.readline())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--cycles", type=int, default=2000)
    args = parser.parse_args(argv)
    workers = [_worker(args.before), _worker(args.after)]
    samples: dict[tuple[int, str], list[float]] = {}
    try:
        for round_no in range(args.rounds):
            order = [0, 1] if round_no % 2 == 0 else [1, 0]
            for contender in CONTENDERS:
                for side in order:
                    figure = _round(workers[side], contender, args.cycles)
                    samples.setdefault((side, contender), []).append(figure)
    finally:
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.close()
            worker.wait()
    print(f"{'contender':16} {'before':>14} {'after':>14}  after/before  (cycles/s, medians)")
    for contender in CONTENDERS:
        before, after = (statistics.median(samples[(side, contender)]) for side in (0, 1))
        print(f"{contender:16} {before:>14.0f} {after:>14.0f}  {after / before:>12.3f}")


if __name__ == "__main__":
    main()
