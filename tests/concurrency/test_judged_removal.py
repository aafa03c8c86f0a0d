"""No process removes a lock it did not judge: a winner's lock stays put until it releases it.

Each trial starts from a planted stale or corrupt lock. Four workers are released at once and
each makes three acquire / release cycles, so slow workers still reclaiming the planted lock race
fast workers that already published fresh locks of their own. Every winner reads its record back
right after acquiring and again while it holds the lock, the last time just before releasing: it
must be its own record each time. The planted lock may be removed (it was judged stale or
corrupt); a winner's lock, never. Once every winner has released, no lock is left behind.

The old design loses this: two workers that both judged the planted lock each unlink it by name,
and the second unlinks the first one's fresh lock. For the old design only, a hook makes every
worker finish its first read of the trial before any acts on it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from mahabharatha.owner.proof import PROOF_PREFIX
from tests.concurrency._harness import (
    CTX,
    TEST_TIMEOUT,
    Rounds,
    corrupt_lock,
    implementations,
    load,
    lock_path,
    meet,
    plant,
    read_entry,
    record_pid,
    require,
    stale_lock,
    stress,
    team,
    trials,
)

WORKERS = 4
CYCLES = 3
"""Acquire / release cycles per worker and trial: later cycles publish fresh locks while slower
workers are still reclaiming the planted one."""
HOLD_READS = 50
"""A winner re-reads its lock this many times while it holds it (the last just before release)."""


def _worker(
    impl_name: str, gsd: Path, rounds: Rounds, align: Any, wins: Any, vanished: Any
) -> None:
    impl = load(impl_name)
    first_read = [False]

    def align_first_read() -> None:
        if first_read[0]:
            first_read[0] = False
            meet(align)

    impl.widen("acquire_after_read", align_first_read)
    lock = lock_path(gsd)
    me = os.getpid()
    while rounds.next_trial():
        first_read[0] = True
        for _ in range(CYCLES):
            if not impl.acquire(gsd):
                continue
            wins.value += 1  # one writer per slot: this worker's own counter
            mine = read_entry(lock)
            again = mine
            for _ in range(HOLD_READS):
                again = read_entry(lock)
                if again != mine:
                    break
            if record_pid(mine) != me or again != mine:
                vanished.value += 1
                if vanished.value == 1:
                    report = f"pid {me} published {mine!r}, found {again!r} while holding it"
                    (gsd / f"vanished-{me}").write_text(report)
            impl.release(gsd)
        rounds.end_trial()


@stress
@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize(
    "impl_name",
    implementations("a reclaimer unlinks by name the fresh lock another reclaimer just won"),
)
def test_a_winners_lock_stays_until_it_releases_it(impl_name: str, tmp_path: Path) -> None:
    gsd = tmp_path / "gsd"
    lock = lock_path(gsd)
    folder = lock.parent
    folder.mkdir(parents=True)
    total = trials()
    wins = [CTX.Value("q", 0, lock=False) for _ in range(WORKERS)]
    vanished = [CTX.Value("q", 0, lock=False) for _ in range(WORKERS)]
    leftovers: list[str] = []
    with team(tmp_path) as crew:
        rounds = Rounds(crew, WORKERS)
        align = crew.barrier(WORKERS)
        for i in range(WORKERS):
            crew.spawn(_worker, impl_name, gsd, rounds, align, wins[i], vanished[i])
        for trial in range(total):
            make = stale_lock if trial % 2 else corrupt_lock
            content, age = make(os.getpid(), trial // 2)
            plant(lock, content, age_seconds=age)
            rounds.run_trial()
            entries = sorted(n for n in os.listdir(folder) if not n.startswith(PROOF_PREFIX))
            if entries:
                leftovers.append(f"trial {trial}: {entries}, lock {read_entry(lock)!r}")
            for name in entries:
                os.unlink(folder / name)
            if leftovers or any(v.value for v in vanished):
                break  # caught: the rest of the run would prove nothing more
        rounds.finish()
    won = sum(w.value for w in wins)
    lost = sum(v.value for v in vanished)
    require(won > 0, "no worker ever acquired the lock")
    reports = [p.read_text() for p in sorted(gsd.glob("vanished-*"))]
    assert lost == 0, f"{lost} of {won} winners lost their lock while holding it: {reports[:3]}"
    assert not leftovers, f"locks left after every winner released: {leftovers[:3]}"
