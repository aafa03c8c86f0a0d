"""Eight processes hammering one feature lock never hold it at the same time.

Each process loops acquire / release. While it believes it holds the lock it creates an occupancy
marker with ``O_CREAT | O_EXCL`` and removes it before releasing (filelock's stress test does the
same): a marker that already exists means two holders at once.

The old design loses this through its empty window: between ``os.open(O_EXCL)`` and ``os.write``
the lock is empty, another acquirer judges it corrupt, removes it and takes the lock too (left
alone it does so only a few times per run: too rare to count on). For the old design only, a
creator keeps its window open until another acquirer has read the lock.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.concurrency._harness import (
    CTX,
    TEST_TIMEOUT,
    WindowHold,
    implementations,
    load,
    meet,
    require,
    stress,
    team,
    trials,
)

PROCESSES = 8


def _contender(
    impl_name: str, gsd: Path, rounds: int, start: Any, overlaps: Any, wins: Any, window: WindowHold
) -> None:
    impl = load(impl_name)
    impl.widen("acquire_after_create", window.hold)
    impl.widen("acquire_after_read", window.passed)
    marker = gsd / "occupied"
    meet(start)
    try:
        for _ in range(rounds):
            if overlaps.value:
                break  # caught: the rest of the run would prove nothing more
            if not impl.acquire(gsd):
                continue
            with wins.get_lock():
                wins.value += 1
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                with overlaps.get_lock():
                    overlaps.value += 1
            else:
                os.close(fd)
                os.unlink(marker)
            impl.release(gsd)
    finally:
        window.leave()


@stress
@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize(
    "impl_name",
    implementations("a lock caught between create and write is judged corrupt and taken twice"),
)
def test_eight_processes_never_hold_the_lock_at_once(impl_name: str, tmp_path: Path) -> None:
    gsd = tmp_path / "gsd"
    (gsd / "specs").mkdir(parents=True)
    rounds = 10 * trials(80)
    overlaps = CTX.Value("q", 0)
    wins = CTX.Value("q", 0)
    window = WindowHold(PROCESSES)
    with team(tmp_path) as crew:
        start = crew.barrier(PROCESSES)
        for _ in range(PROCESSES):
            crew.spawn(_contender, impl_name, gsd, rounds, start, overlaps, wins, window)
        crew.join()
    require(wins.value > 0, "nobody ever acquired the lock")
    assert overlaps.value == 0, f"two holders at once {overlaps.value} times in {wins.value} wins"
