"""A release never removes a lock other than the releaser's own, even racing a reclaim of it.

The owner's lock has gone stale. In each trial the owner calls ``release_feature_lock`` while one
or three reclaimers call ``acquire_feature_lock``, all released at once by a barrier. Whatever the
interleaving: at most one reclaimer wins, and the winner's lock is still in place afterwards (the
owner's release, which judged its own stale lock, never removes the newcomer's); when nobody won,
the owner's lock is gone (released).

The old design loses this: its release reads the lock, checks the pid and then unlinks *by name*;
a reclaimer that replaced the lock in between loses its fresh lock. For the old design only,
hooks make the owner and the reclaimers all finish their read before any of them acts on it, and
the owner then waits until a reclaimer has created its lock before it unlinks "the lock".
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from mahabharatha.owner.proof import PROOF_PREFIX
from tests.concurrency._harness import (
    CTX,
    SYNC_TIMEOUT,
    TEST_TIMEOUT,
    Rounds,
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


def _owner(impl_name: str, gsd: Path, rounds: Rounds, widen: Any, created: Any) -> None:
    impl = load(impl_name)

    def read_then_let_a_reclaimer_in() -> None:
        meet(widen)
        created.wait(SYNC_TIMEOUT)

    impl.widen("release_after_read", read_then_let_a_reclaimer_in)
    while rounds.next_trial():
        impl.release(gsd)
        rounds.end_trial()


def _reclaimer(
    impl_name: str, gsd: Path, index: int, rounds: Rounds, won: Any, widen: Any, created: Any
) -> None:
    impl = load(impl_name)
    impl.widen("acquire_after_read", lambda: meet(widen))
    impl.widen("acquire_after_create", created.set)
    while rounds.next_trial():
        won[index] = int(impl.acquire(gsd))
        rounds.end_trial()


@stress
@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize("reclaimers", [1, 3])
@pytest.mark.parametrize(
    "impl_name",
    implementations("a release that judged its own stale lock unlinks the reclaimer's by name"),
)
def test_release_of_own_stale_lock_never_removes_the_reclaimers_lock(
    impl_name: str, reclaimers: int, tmp_path: Path
) -> None:
    gsd = tmp_path / "gsd"
    lock = lock_path(gsd)
    folder = lock.parent
    folder.mkdir(parents=True)
    violations: list[str] = []
    total = trials()
    with team(tmp_path) as crew:
        rounds = Rounds(crew, reclaimers + 1)
        widen = crew.barrier(reclaimers + 1)
        created = CTX.Event()
        won = CTX.Array("i", reclaimers, lock=False)
        owner = crew.spawn(_owner, impl_name, gsd, rounds, widen, created)
        pids = [
            crew.spawn(_reclaimer, impl_name, gsd, i, rounds, won, widen, created)
            for i in range(reclaimers)
        ]
        for trial in range(total):
            content, _ = stale_lock(owner, trial)
            plant(lock, content)
            for i in range(reclaimers):
                won[i] = -1
            created.clear()
            rounds.run_trial()
            winners = [pids[i] for i in range(reclaimers) if won[i] == 1]
            left = read_entry(lock)
            expected = winners[0] if len(winners) == 1 else None
            extra = sorted(
                n for n in os.listdir(folder) if n != ".lock" and not n.startswith(PROOF_PREFIX)
            )
            if len(winners) > 1 or record_pid(left) != expected or extra:
                violations.append(
                    f"trial {trial}: owner {owner}, reclaimers {pids}, winners {winners},"
                    f" lock left: {left!r}, other entries {extra}"
                )
                if len(violations) >= 3:
                    break
            for name in os.listdir(folder):
                os.unlink(folder / name)
        rounds.finish()
    assert not violations, f"{len(violations)}+ of {total} trials:\n" + "\n".join(violations)
