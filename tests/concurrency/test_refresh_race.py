"""A holder's refresh (the heartbeat) never overwrites a lock that was taken from it.

Each trial: a holder process takes the lock and refreshes it in a loop; at the same moment a
taker process force-releases it, takes it for another pid, says so (the ``taken`` event), and then
reads it many times. Every read must be the taker's own record: a refresh that lands after the
takeover would put the holder's record back (two holders). The holder must learn that it lost the
lock: by a refresh that raced the takeover, or at the latest by its first refresh after ``taken``
(a liveness check that does not depend on how the two processes were scheduled).

``new`` refreshes with ``FeatureLock.refresh`` (guarded, replace-if-unchanged); a refresh or
release told to try again (``GuardBusyError``: on a loaded machine the guard's holder may not run
for 0.5 s) is tried again, as its caller would, having changed nothing. ``old`` is the
obvious refresh by name: read ``.lock``, and if it is still ours, rewrite it in place; it loses
the race (strict xfail), which shows the test can fail.
"""

from __future__ import annotations

import os
import time
from contextlib import suppress
from pathlib import Path
from typing import Any, Final

import pytest

from mahabharatha import locks
from tests.concurrency._harness import (
    CTX,
    SYNC_TIMEOUT,
    TEST_TIMEOUT,
    HarnessError,
    Team,
    lock_path,
    meet,
    read_entry,
    record_pid,
    stress,
    team,
    trials,
    tried_again,
)

FEATURE: Final = "race-feat"
TAKER_PID: Final = 4_000_001
"""The pid the taker records: no process has it (above the default pid_max)."""
READS: Final = 50
REFRESHES: Final = 200
"""Racing refreshes per trial (the old design's first one holds its race window open)."""
TAKE_PATIENCE: Final = 5.0
"""How long the taker waits for the lock it has just forced free (a busy machine)."""

IMPLEMENTATIONS: Final = [
    pytest.param("new", id="new"),
    pytest.param(
        "old",
        id="old",
        marks=pytest.mark.xfail(
            strict=True,
            raises=AssertionError,
            reason="old design: a refresh by name rewrites the taker's lock",
        ),
    ),
]


def _refresh_by_name(path: Path, pid: int, window: Any | None) -> bool:
    """The unguarded refresh: check that the lock is ours, then rewrite it in place.

    ``window`` (old design only, first refresh of a trial) holds the gap between check and
    write open until the taker has acted, so the race is run every trial, not by chance.
    """
    if record_pid(read_entry(path)) != pid:
        return False
    if window is not None:
        meet(window)  # the taker takes over now
        meet(window)  # ... and has done so
    with open(path, "w") as lock:  # Race: the lock may have been replaced since the check.
        lock.write(f"{pid}:{time.time()}")
    return True


def _take_by_name(path: Path) -> None:
    """The old takeover: unlink by name, then create with O_EXCL and write."""
    with suppress(FileNotFoundError):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    os.write(fd, f"{TAKER_PID}:{time.time()}".encode())
    os.close(fd)


def _refresh_once(
    impl: str, held: locks.FeatureLock, path: Path, window: Any | None, refused: Any
) -> bool:
    """One refresh by ``impl``; False when the holder finds that the lock is no longer its own."""
    if impl == "new":
        try:
            tried_again(held.refresh, refused)  # Race: the taker's release holds the guard
        except locks.LockLostError:
            return False
        return True
    return _refresh_by_name(path, os.getpid(), window)


def _refresh_until_taken(
    impl: str, held: locks.FeatureLock, path: Path, sync: Any, refused: Any
) -> bool:
    """Refresh while the taker acts, then once more after it has: True if the loss was seen.

    The racing refreshes are bounded (``REFRESHES``): an unbounded loop would keep the folder's
    guard so busy that, on a loaded machine, the taker's own release could not get it in time.
    """
    window, taken = sync[3], sync[4]
    for attempt in range(REFRESHES):
        # Race: refreshes run while the taker force-releases and re-takes the lock.
        if taken.is_set():
            break
        if not _refresh_once(impl, held, path, window if attempt == 0 else None, refused):
            return True
    if not taken.wait(SYNC_TIMEOUT):
        raise HarnessError("the taker never took the lock over")
    # The takeover is complete: this refresh must report it, however the two were scheduled.
    return not _refresh_once(impl, held, path, None, refused)


def _holder(impl: str, gsd: Path, total: int, sync: Any, lost: Any, refused: Any) -> None:
    begin, race, done = sync[:3]
    path = lock_path(gsd)
    for _ in range(total):
        meet(begin)
        held = locks.FeatureLock(FEATURE, gsd, heartbeat=None, timeout=0).acquire()
        meet(race)
        if _refresh_until_taken(impl, held, path, sync, refused):
            lost.value += 1
        meet(done)


def _force_and_take(gsd: Path, refused: Any, patience: float) -> bool:
    """Force the holder's lock away and take it; False if the lock was not free to take."""
    # Race: the holder's refreshes keep the guard busy; refused, the release did nothing.
    tried_again(lambda: locks.release(FEATURE, gsd, force=True), refused)
    try:
        locks.acquire(FEATURE, gsd, pid=TAKER_PID, timeout=patience)
    except locks.LockHeldError:
        return False  # Race: a refresh put the holder's lock back after the forced release
    return True


def _taker(impl: str, gsd: Path, total: int, sync: Any, bad: Any, refused: Any) -> None:
    begin, race, done, window, taken = sync
    path = lock_path(gsd)
    for _ in range(total):
        meet(begin)
        meet(race)
        took = True
        if impl == "new":
            # Once a trial has failed, the verdict is in: no later trial waits to take.
            took = _force_and_take(gsd, refused, TAKE_PATIENCE if bad.value == 0 else 0)
        else:
            meet(window)  # the holder has checked that the lock is its own
            _take_by_name(path)
            meet(window)
        taken.set()
        for _ in range(READS if took else 0):
            if record_pid(read_entry(path)) != TAKER_PID:
                took = False
                break
        bad.value += not took
        meet(done)


def _run_trials(crew: Team, gsd: Path, impl: str, total: int) -> tuple[int, int, int]:
    begin, race, done = crew.barrier(3), crew.barrier(2), crew.barrier(3)
    taken = CTX.Event()
    sync = (begin, race, done, crew.barrier(2), taken)
    lost = CTX.Value("q", 0, lock=False)
    bad = CTX.Value("q", 0, lock=False)
    refused = (CTX.Value("q", 0, lock=False), CTX.Value("q", 0, lock=False))  # one per child
    crew.spawn(_holder, impl, gsd, total, sync, lost, refused[0])
    crew.spawn(_taker, impl, gsd, total, sync, bad, refused[1])
    for _ in range(total):
        taken.clear()  # both children are between ``done`` and ``race``: neither looks at it now
        crew.wait(begin)
        crew.wait(done)
        with suppress(FileNotFoundError):  # the taker's lock: the next trial starts free
            os.unlink(lock_path(gsd))
    crew.join()
    return lost.value, bad.value, refused[0].value + refused[1].value


@stress
@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_a_refresh_never_overwrites_the_lock_of_whoever_took_it(impl: str, tmp_path: Path) -> None:
    gsd = tmp_path / "gsd"
    total = trials(100)
    with team(tmp_path) as crew:
        lost, bad, refused = _run_trials(crew, gsd, impl, total)
    if lost == 0 and bad == 0:
        raise HarnessError("the holder never noticed a takeover: the race was not run")
    tried = f" ({refused} guarded steps told to try again)"
    assert bad == 0, f"in {bad} of {total} trials the taker's lock was overwritten{tried}"
    assert lost == total, f"the holder learned of only {lost} of {total} takeovers{tried}"
