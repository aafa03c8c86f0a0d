"""The folder guard waits for a busy holder on a busy machine instead of giving up.

Eight contenders take and leave one feature folder's guard (``Guard(wait=True)``, as release,
refresh, ``done`` and ``fail`` take it) over and over, while three busy loops keep both cores
full. Inside the guard each marks its occupancy with an exclusive file, so two holders at once
are seen. A ``GuardBusyError`` is the contract's answer when the holder did not run for
``GUARD_WAIT_SECONDS`` ("try again"): a step so refused tries again, as a user would, and every
step must get the guard in the end (a guard that gave up without waiting starves many: twenty
refusals in a row take it no time).

On the code as it was (a ``sched_yield`` spin bounded by 0.5 s) the spinning contenders kept
the descheduled holder off the CPU and some steps raised ``GuardBusyError`` (dozens per run on
this 2-core machine); the guard now waits blocked in the kernel, so the holder runs. Under a
parallel run a starved holder is refused now and then too, so the storm
cannot tell a spin from a sleep: a second test looks at the waiter itself: every thread of a
process waiting for a held guard must be asleep in the kernel.
"""

from __future__ import annotations

import fcntl
import os
from functools import partial
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path
from time import monotonic
from types import SimpleNamespace
from typing import Final

import pytest

from mahabharatha.backends.files.folder import Guard, GuardBusyError
from mahabharatha.backends.files.snapshot import read_lock
from tests.concurrency._harness import (
    CTX,
    GUARD_TRIES,
    SYNC_TIMEOUT,
    TEST_TIMEOUT,
    trials,
    tried_again,
)
from tests.support import load

CONTENDERS: Final = 8
STEPS: Final = trials(1500)
"""Guarded steps per contender (``MAHABHARATHA_STRESS`` sets it)."""
OCCUPIED: Final = "occupied"
WAITER_PATIENCE: Final = 10.0
"""How long the waiter waits for the held guard: a spinner ends then, a sleeper is seen sooner."""


def _guarded_step(dfd: int) -> bool:
    """Take the guard once and mark our occupancy inside; False if another held it too."""
    with Guard(dfd, wait=True):
        try:
            os.close(os.open(OCCUPIED, os.O_CREAT | os.O_EXCL | os.O_WRONLY, dir_fd=dfd))
        except FileExistsError:
            return False  # another contender is inside the guard too
        read_lock(dfd)  # the kind of work a guarded step does
        os.unlink(OCCUPIED, dir_fd=dfd)
    return True


def _guarded_steps(
    folder: str, steps: int, start: Barrier, out: Queue[tuple[int, int, int]]
) -> None:
    """Take the guard ``steps`` times, each tried again when refused; report (refusals, steps
    starved: refused ``GUARD_TRIES`` times in a row, overlaps)."""
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    refused, starved, overlaps = SimpleNamespace(value=0), 0, 0
    start.wait(SYNC_TIMEOUT)
    for _ in range(steps):
        try:
            overlaps += not tried_again(partial(_guarded_step, dfd), refused)
        except GuardBusyError:  # refused GUARD_TRIES times in a row: never let go
            starved += 1
    out.put((refused.value, starved, overlaps))


@pytest.mark.timeout(TEST_TIMEOUT)
def test_a_guarded_step_waits_for_the_guard_while_both_cores_are_busy(tmp_path: Path) -> None:
    """No two contenders are ever inside the guard at once and every guarded step gets it
    (told to try again at worst), with contenders and busy loops spinning on both cores."""
    start = CTX.Barrier(CONTENDERS)
    out: Queue[tuple[int, int, int]] = CTX.Queue()
    with load.busy_loops():
        procs = [
            CTX.Process(target=_guarded_steps, args=(str(tmp_path), STEPS, start, out))
            for _ in range(CONTENDERS)
        ]
        for proc in procs:
            proc.start()
        reports = [out.get(timeout=TEST_TIMEOUT) for _ in procs]
        for proc in procs:
            proc.join(SYNC_TIMEOUT)
    assert [proc.exitcode for proc in procs] == [0] * CONTENDERS
    refused, starved, overlaps = (sum(column) for column in zip(*reports, strict=True))
    assert overlaps == 0, "two holders of the guard at once"
    assert starved == 0, (
        f"{starved} guarded steps refused {GUARD_TRIES} times in a row ({refused} in all)"
    )


def _wait_for_the_held_guard(folder: str, entering: int) -> None:
    """Say (one byte on ``entering``) that we wait for the guard, then wait for it; exit 0 when
    taken, 3 when refused. Nothing after the byte may sleep but the wait itself."""
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    os.write(entering, b"w")
    try:
        with Guard(dfd, wait=False, until=monotonic() + WAITER_PATIENCE) as taken:
            os._exit(0 if taken else 3)
    except GuardBusyError:
        os._exit(3)


def _all_threads_asleep(pid: int) -> bool:
    """Whether every thread of ``pid`` is asleep in the kernel (state S), not running."""
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except FileNotFoundError:  # Race: a thread ended as we listed them
            continue
        states.append(stat.rpartition(")")[2].split()[0])
    return bool(states) and all(state == "S" for state in states)


@pytest.mark.timeout(TEST_TIMEOUT)
def test_a_process_waiting_for_a_held_guard_sleeps_in_the_kernel(tmp_path: Path) -> None:
    """While we hold the guard, a waiter's threads all go to sleep (a spinner stays runnable
    and never does: the spin of the old code failed here every time), and once we let go the
    waiter gets the guard."""
    guard = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(guard, fcntl.LOCK_EX)
    entering, told = os.pipe()
    waiter = CTX.Process(target=_wait_for_the_held_guard, args=(str(tmp_path), told))
    waiter.start()
    try:
        assert os.read(entering, 1) == b"w"
        assert waiter.pid is not None
        deadline = monotonic() + SYNC_TIMEOUT
        while not _all_threads_asleep(waiter.pid):
            assert waiter.exitcode is None, "the waiter never slept: it spun until it gave up"
            assert monotonic() < deadline, "the waiter never slept: it spins for the guard"
            os.sched_yield()
    finally:
        fcntl.flock(guard, fcntl.LOCK_UN)
        os.close(guard)
        waiter.join(SYNC_TIMEOUT)
        os.close(entering)
        os.close(told)
    assert waiter.exitcode == 0, "the waiter did not get the guard once it was let go"
