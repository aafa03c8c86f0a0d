"""The folder guard waits for a busy holder on a busy machine instead of giving up.

Eight contenders take and leave one feature folder's guard (``Guard(wait=True)``, as release,
refresh, ``done`` and ``fail`` take it) over and over, while three busy loops keep both cores
full. Inside the guard each marks its occupancy with an exclusive file, so two holders at once
are seen. Every guarded step must get the guard: a ``GuardBusyError`` here is the library
telling a user "try again" only because their machine was busy.

On the code as it was (a ``sched_yield`` spin bounded by 0.5 s) the spinning contenders kept
the descheduled holder off the CPU and some steps raised ``GuardBusyError`` (dozens per run on
this 2-core machine); the guard now waits blocked in the kernel, so the holder runs.
"""

from __future__ import annotations

import os
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Final

import pytest

from mahabharatha.backends.files import lockfile
from tests.concurrency._harness import CTX, SYNC_TIMEOUT, TEST_TIMEOUT, trials
from tests.support import load

CONTENDERS: Final = 8
STEPS: Final = trials(1500)
"""Guarded steps per contender (``MAHABHARATHA_STRESS`` sets it)."""
OCCUPIED: Final = "occupied"


def _guarded_steps(folder: str, steps: int, start: Barrier, out: Queue[tuple[int, int]]) -> None:
    """Take the guard ``steps`` times; report (steps refused with GuardBusyError, overlaps)."""
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    refused = overlaps = 0
    start.wait(SYNC_TIMEOUT)
    for _ in range(steps):
        try:
            with lockfile.Guard(dfd, wait=True):
                try:
                    os.close(os.open(OCCUPIED, os.O_CREAT | os.O_EXCL | os.O_WRONLY, dir_fd=dfd))
                except FileExistsError:
                    overlaps += 1  # another contender is inside the guard too
                    continue
                lockfile.read_lock(dfd)  # the kind of work a guarded step does
                os.unlink(OCCUPIED, dir_fd=dfd)
        except lockfile.GuardBusyError:
            refused += 1
    out.put((refused, overlaps))


@pytest.mark.timeout(TEST_TIMEOUT)
def test_a_guarded_step_waits_for_the_guard_while_both_cores_are_busy(tmp_path: Path) -> None:
    """No guarded step is refused, and no two contenders are ever inside the guard at once,
    with contenders and busy loops spinning on both cores."""
    start = CTX.Barrier(CONTENDERS)
    out: Queue[tuple[int, int]] = CTX.Queue()
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
    assert sum(overlaps for _, overlaps in reports) == 0, "two holders of the guard at once"
    refused = sum(refused for refused, _ in reports)
    assert refused == 0, f"{refused} guarded steps gave up on a busy machine"
