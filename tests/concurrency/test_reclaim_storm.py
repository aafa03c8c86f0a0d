"""A stale or corrupt lock is reclaimed by exactly one of K racers released at once.

K long-lived workers meet the parent at a barrier; the parent plants one stale (resp. corrupt or
unreadable) lock, releases them together, and counts who acquired. Exactly one must win, the lock
left behind must be the winner's record, and the losers must leave nothing behind.

The old design loses this: two racers that both judged the stale lock each unlink "the lock" by
name, and the second unlinks the first one's fresh lock and wins too. For the old design only,
hooks make every racer finish its read before any acts on it, and all but the first act only once
the first has created its lock: on a quiet machine two racers otherwise unlinked in step and
the old design's loss showed in fewer than one trial of 250.
"""

from __future__ import annotations

import os
from multiprocessing.synchronize import Barrier
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
    stale_lock,
    stress,
    team,
    trials,
)

RACERS = [2, 4, 8]


_KINDS = {"stale": stale_lock, "corrupt": corrupt_lock}


def _racer(
    impl_name: str,
    gsd: Path,
    index: int,
    rounds: Rounds,
    won: Any,
    widen: Barrier,
    first_created: Barrier,
) -> None:
    impl = load(impl_name)
    if index == 0:  # the old design's first racer creates its lock while the others wait...
        impl.widen("acquire_after_read", lambda: meet(widen))
        impl.widen("acquire_after_create", lambda: meet(first_created))
    else:  # ...and they then act on the stale lock they read: by name, on the first's lock

        def after_the_first_created() -> None:
            meet(widen)
            meet(first_created)

        impl.widen("acquire_after_read", after_the_first_created)
    while rounds.next_trial():
        won[index] = int(impl.acquire(gsd))
        rounds.end_trial()


@stress
@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize("kind", sorted(_KINDS))
@pytest.mark.parametrize("racers", RACERS)
@pytest.mark.parametrize(
    "impl_name", implementations("two racers that judged one stale lock both win")
)
def test_stale_or_corrupt_lock_is_reclaimed_by_exactly_one_racer(
    impl_name: str, racers: int, kind: str, tmp_path: Path
) -> None:
    gsd = tmp_path / "gsd"
    lock = lock_path(gsd)
    folder = lock.parent
    folder.mkdir(parents=True)
    make = _KINDS[kind]
    violations: list[str] = []
    with team(tmp_path) as crew:
        rounds = Rounds(crew, racers)
        widen, first_created = crew.barrier(racers), crew.barrier(racers)
        results = CTX.Array("i", racers, lock=False)
        pids = [
            crew.spawn(_racer, impl_name, gsd, i, rounds, results, widen, first_created)
            for i in range(racers)
        ]
        total = trials()
        for trial in range(total):
            content, age = make(os.getpid(), trial)
            plant(lock, content, age_seconds=age)
            for i in range(racers):
                results[i] = -1
            rounds.run_trial()
            winners = [pids[i] for i in range(racers) if results[i] == 1]
            left = record_pid(read_entry(lock))
            extra = sorted(
                n for n in os.listdir(folder) if n != ".lock" and not n.startswith(PROOF_PREFIX)
            )
            if len(winners) != 1 or left != winners[0] or extra:
                violations.append(
                    f"trial {trial} ({content!r}): winners {winners}, lock left by {left},"
                    f" other entries {extra}"
                )
                if len(violations) >= 3:
                    break
            for name in os.listdir(folder):
                os.unlink(folder / name)
        rounds.finish()
    assert not violations, f"{len(violations)}+ of {total} trials:\n" + "\n".join(violations)
