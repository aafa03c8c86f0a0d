"""The uncontended acquire + release cycle of two checkouts, side by side in one run.

    python bench/compare_checkouts.py BEFORE_DIR AFTER_DIR [--rounds 31] [--cycles 2000] [--cpu]

Each checkout runs in its own long-lived worker process (``PYTHONPATH`` = that checkout); the
parent asks them for one round at a time, alternating which goes first, so a disturbance on a
shared machine hits both alike. Printed: the median cycles/s of each over the rounds, and
after/before. Contenders: the legacy functions, ``FeatureLock`` entered per cycle, and
``locks.acquire`` + ``locks.release``. (Make a checkout with ``git archive REV | tar -x -C DIR``.)

``--postgres`` adds the PostgreSQL backend on a throw-away server of the suite's kind
(``tests/support/postgres.py``, the one this script runs from): ``pg-cycle`` (benchmark 7's
``try_acquire`` + ``release_held`` on a warm connection), ``pg-claim`` (a registered claim from
a 200-feature list + ``release_held``: benchmark 8's statement, one worker) and ``pg-connect``
(a new backend's connection, session set-up and one ``inspect``: what each CLI command pays
besides Python's start, benchmark 10's server part). Each checkout uses its own namespace.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

CONTENDERS: Final = ("legacy", "FeatureLock", "acquire/release")
PG_CONTENDERS: Final = ("pg-cycle", "pg-claim", "pg-connect")
PG_CYCLES_DIVISOR: Final = 10
"""A server round trip costs some 50 file cycles: the PostgreSQL contenders run a tenth."""

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
url = os.environ.get("MAHABHARATHA_BENCH_PG_URL")
if url:
    from mahabharatha.backends.base import Requester
    try:  # the layer folders; a checkout older than them has flat modules
        from mahabharatha.owner import ownership
        from mahabharatha.backends.postgres.backend import PostgresBackend
    except ImportError:
        from mahabharatha import ownership
        from mahabharatha.backends.postgres import PostgresBackend
    space = os.environ["MAHABHARATHA_BENCH_PG_NAMESPACE"]
    backend = PostgresBackend(url, namespace=space)
    me = Requester(os.getpid(), ownership.details_of(os.getpid()))
    names = [f"f{number:03d}" for number in range(200)]
    def pg_cycle():
        backend.release_held(backend.try_acquire("feature", me).held)
    def pg_claim():
        backend.release_held(backend.try_claim(names, me).held)
    def pg_connect():
        fresh = PostgresBackend(url, namespace=space)
        fresh.inspect("feature")
        fresh.close()
    cycles.update({"pg-cycle": pg_cycle, "pg-claim": pg_claim, "pg-connect": pg_connect})
for cycle in cycles.values():
    for _ in range(200):
        cycle()
clock = time.process_time if os.environ.get("MAHABHARATHA_BENCH_CPU") else time.perf_counter
for line in sys.stdin:
    name, count = line.rsplit(" ", 1)
    cycle, n = cycles[name], int(count)
    gc.collect()
    start = clock()
    for _ in range(n):
        cycle()
    print(n / (clock() - start), flush=True)
"""


def _worker(checkout: Path, pg_url: str | None, side: str, cpu: bool) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(checkout.resolve())}
    if cpu:
        env["MAHABHARATHA_BENCH_CPU"] = "1"
    if pg_url is not None:
        env["MAHABHARATHA_BENCH_PG_URL"] = pg_url
        env["MAHABHARATHA_BENCH_PG_NAMESPACE"] = f"compare-{side}"
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


@contextmanager
def _server(wanted: bool) -> Iterator[str | None]:
    """A throw-away PostgreSQL server's URL (None when not wanted)."""
    if not wanted:
        yield None
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.support.postgres import start_server

    server = start_server()
    try:
        yield server.url()
    finally:
        server.stop("immediate")
        server.cleanup()


def _sample(
    args: argparse.Namespace, pg_url: str | None, contenders: tuple[str, ...]
) -> dict[tuple[int, str], list[float]]:
    workers = [
        _worker(checkout, pg_url, side, args.cpu)
        for checkout, side in ((args.before, "before"), (args.after, "after"))
    ]
    samples: dict[tuple[int, str], list[float]] = {}
    try:
        for round_no in range(args.rounds):
            order = [0, 1] if round_no % 2 == 0 else [1, 0]
            for contender in contenders:
                cycles = args.cycles
                if contender in PG_CONTENDERS:
                    cycles = max(1, cycles // PG_CYCLES_DIVISOR)
                for side in order:
                    figure = _round(workers[side], contender, cycles)
                    samples.setdefault((side, contender), []).append(figure)
    finally:
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.close()
            worker.wait()
    return samples


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--postgres", action="store_true", help="add the PostgreSQL contenders")
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="time each round by the worker's CPU time (process_time): on a loaded machine the "
        "time a worker waits for a core is left out",
    )
    args = parser.parse_args(argv)
    with _server(args.postgres) as pg_url:
        contenders = CONTENDERS + (PG_CONTENDERS if pg_url else ())
        samples = _sample(args, pg_url, contenders)
    per = "cycles per CPU second" if args.cpu else "cycles/s"
    print(f"{'contender':16} {'before':>14} {'after':>14}  after/before  ({per}, medians)")
    for contender in contenders:
        before, after = (statistics.median(samples[(side, contender)]) for side in (0, 1))
        print(f"{contender:16} {before:>14.0f} {after:>14.0f}  {after / before:>12.3f}")


if __name__ == "__main__":
    main()
