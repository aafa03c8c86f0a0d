"""An acquirer never answers "held" because another process is removing a dead lock right then.

Contract ("No sleeping, no spurious held"): ``acquire_feature_lock`` returns False only when an
active (or writing) lock of someone else was there during the call, never because another
process was at that moment removing a stale, corrupt or unreadable lock. In each trial one
remover and one acquirer are released at once by a barrier over a lock nobody holds: the owner
releasing its own stale lock, or ``locks.clean`` removing a corrupt one. Whatever the
interleaving, the acquirer must win, and its lock must be the one left on disk.

Fails before the fix: ``_reclaim`` tried the guard once without waiting and answered "held" when
the remover had it, so the acquirer lost a few percent of the trials.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import Any

import pytest

from mahabharatha import locks
from mahabharatha.commands import _utils
from tests.concurrency._harness import (
    CTX,
    TEST_TIMEOUT,
    Rounds,
    corrupt_lock,
    lock_path,
    plant,
    read_entry,
    record_pid,
    stale_lock,
    stress,
    team,
    trials,
)
from tests.concurrency._harness import FEATURE as F

DEFAULT_STORM_TRIALS = 400
"""Trials per remover kind by default (a few seconds); MAHABHARATHA_STRESS=5000 for the storm."""


SWEEP_SECONDS = 0.0008
"""Each trial the remover starts after a busy wait of a different length in [0, 0.5 ms): the
offsets sweep the acquirer's publish-judge-guard window (about 0.25 ms after the barrier here),
which a remover starting at once almost always beats (0.1 % losses before the fix instead of a
few percent). A busy wait, not a sleep: it shifts a start, it synchronises nothing."""

GOLDEN = 0.6180339887
"""Offsets ``trial * GOLDEN mod 1`` fill the sweep evenly whatever the number of trials."""


def _offset(trial: int) -> float:
    """How much later than the acquirer the remover starts in ``trial`` (negative: earlier)."""
    return (trial * GOLDEN % 1.0 - 0.5) * 2 * SWEEP_SECONDS


def _busy_wait(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass


def _remover(kind: str, gsd: Path, rounds: Rounds) -> None:
    trial = 0
    while rounds.next_trial():
        _busy_wait(max(0.0, _offset(trial)))
        trial += 1
        if kind == "owner-release":
            _utils.release_feature_lock(F, str(gsd))  # the lock is this process's own, stale
        else:
            locks.clean(gsd)  # the lock is corrupt
        rounds.end_trial()


def _acquirer(gsd: Path, rounds: Rounds, won: Any) -> None:
    trial = 0
    while rounds.next_trial():
        _busy_wait(max(0.0, -_offset(trial)))
        trial += 1
        won.value = int(_utils.acquire_feature_lock(F, str(gsd)))
        rounds.end_trial()


@stress
@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize("kind", ["owner-release", "clean-corrupt"])
def test_an_acquirer_racing_the_removal_of_a_dead_lock_always_wins(
    kind: str, tmp_path: Path
) -> None:
    gsd = tmp_path / "gsd"
    lock = lock_path(gsd)
    folder = lock.parent
    folder.mkdir(parents=True)
    losses: list[str] = []
    total = trials(DEFAULT_STORM_TRIALS)
    with team(tmp_path) as crew:
        rounds = Rounds(crew, 2)
        won = CTX.Value("i", -1, lock=False)
        remover = crew.spawn(_remover, kind, gsd, rounds)
        acquirer = crew.spawn(_acquirer, gsd, rounds, won)
        for trial in range(total):
            make = stale_lock if kind == "owner-release" else corrupt_lock
            content, age = make(remover, trial)
            plant(lock, content, age_seconds=age)
            won.value = -1
            rounds.run_trial()
            left = read_entry(lock)
            if won.value != 1 or record_pid(left) != acquirer:
                losses.append(f"trial {trial}: acquired={won.value}, lock left: {left!r}")
            for name in os.listdir(folder):
                os.unlink(folder / name)
        rounds.finish()
    assert not losses, f"{len(losses)} of {total} trials lost:\n" + "\n".join(losses[:5])


GUARD_HOLD_SECONDS = 0.05
"""How long the stand-in remover keeps the guard after the acquirer has started: far inside the
0.5 s an acquirer may wait, and far longer than an acquirer needs to reach the guard, so the old
code's "busy guard means held" answer shows every time. The test's verdict (the acquirer wins)
does not depend on this length; only how surely the old code is caught does."""


def _remove_under_the_guard(folder: Path, holding: Any, started: Any) -> None:
    """A remover caught mid-removal: it holds the folder's guard, then unlinks the dead lock."""
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(dfd, fcntl.LOCK_EX)
        holding.set()
        if not started.wait(30):
            raise RuntimeError("the acquirer never started")
        _busy_wait(GUARD_HOLD_SECONDS)
        os.unlink(".lock", dir_fd=dfd)
        fcntl.flock(dfd, fcntl.LOCK_UN)
    finally:
        os.close(dfd)


@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize("kind", ["stale", "corrupt"])
def test_an_acquirer_waits_for_a_removal_in_progress_and_then_wins(
    kind: str, tmp_path: Path
) -> None:
    """Fails before the fix: the acquirer found the guard busy and answered False at once."""
    gsd = tmp_path / "gsd"
    lock = lock_path(gsd)
    content, age = stale_lock(4242, 0) if kind == "stale" else corrupt_lock(4242, 0)
    plant(lock, content, age_seconds=age)
    with team(tmp_path) as crew:
        holding, started = CTX.Event(), CTX.Event()
        crew.spawn(_remove_under_the_guard, lock.parent, holding, started)
        assert holding.wait(30), "the remover never took the guard"
        started.set()
        acquired = _utils.acquire_feature_lock(F, str(gsd))
        crew.join()
    assert acquired, "acquire answered held while a dead lock was being removed"
    assert record_pid(read_entry(lock)) == os.getpid()
