"""The ``PENDING`` byte of the proof of life: a lock judged between its publisher's ``link``
and its ``LIFE`` is alive; once that publisher is gone, it is not.

A publisher (its own pid, so its lock carries a proof) is paused inside that window by the
test seam ``lockfile.AFTER_LINK``. A judge in another PID namespace (where the publisher's pid
means nothing, so only the proof can speak for it) tries ``--reclaim-dead``:

* while the publisher is paused it must answer HELD. Fails without ``PENDING``: a judge that
  looks at ``LIFE`` only, or a publisher that takes ``PENDING`` only after its ``link``, calls
  the owner not running and takes the lock (WON) from a live publisher: two holders.
* once the paused publisher is SIGKILLed, it must answer WON: a ``PENDING`` left by a dead
  publisher keeps no lock (fails if ``PENDING`` were counted alive whoever holds it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

import pytest

from mahabharatha import locks
from mahabharatha.backends.files import lockfile
from tests.concurrency._harness import CTX, RECLAIM_DEAD_JUDGE, SYNC_TIMEOUT
from tests.support.marks import needs_pid_namespaces, needs_proc

pytestmark = [needs_proc, needs_pid_namespaces]

ANSWER_SECONDS: Final = 30.0
"""A hang guard only."""


def _paused_publisher(gsd: str, linked: Any, go: tuple[int, int], held: Any, end: Any) -> None:
    """Take ``feat`` for this process, pausing between ``link`` and ``LIFE`` until a byte
    arrives on the pipe ``go`` (a pipe, not an event: this process may be killed while it
    waits, and a killed waiter would hang the event's next ``set``)."""
    go_read, go_write = go
    os.close(go_write)  # only the test's end: its close (a failed test) ends the pause too

    def pause() -> None:
        linked.set()
        os.read(go_read, 1)

    lockfile.AFTER_LINK = pause
    locks.acquire("feat", gsd)
    held.set()
    end.wait(SYNC_TIMEOUT)  # keep the lock (and its proof) until the test is done


def _judge_in_another_pid_namespace(gsd: Path) -> str:
    argv = ["unshare", "--pid", "--fork", "--mount-proc"]
    argv += [sys.executable, "-c", RECLAIM_DEAD_JUDGE, str(gsd)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=ANSWER_SECONDS)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def paused(tmp_path: Path) -> Any:
    """A publisher paused in the window: (gsd, process, go); the process is reaped after."""
    gsd = tmp_path / "gsd"
    (gsd / "specs" / "feat").mkdir(parents=True)
    linked, held, end = CTX.Event(), CTX.Event(), CTX.Event()
    go_read, go_write = os.pipe()
    proc = CTX.Process(
        target=_paused_publisher, args=(str(gsd), linked, (go_read, go_write), held, end)
    )
    proc.start()
    os.close(go_read)

    def go() -> None:
        os.write(go_write, b"g")

    try:
        assert linked.wait(SYNC_TIMEOUT), "the publisher never linked its lock"
        yield gsd, proc, go, held
    finally:
        os.close(go_write)  # the end of the pipe: a paused publisher goes on
        end.set()
        proc.join(SYNC_TIMEOUT)
        if proc.is_alive():
            proc.kill()
            proc.join()


def test_a_lock_between_its_link_and_its_life_is_alive(paused: Any) -> None:
    """Judged inside the window the live publisher keeps its lock (HELD); after the window,
    too (its ``LIFE`` now)."""
    gsd, _proc, go, held = paused
    assert (gsd / "specs" / "feat" / ".lock").exists()  # the window: linked, LIFE not yet
    assert _judge_in_another_pid_namespace(gsd) == "HELD"
    go()
    assert held.wait(SYNC_TIMEOUT)
    assert _judge_in_another_pid_namespace(gsd) == "HELD"


def test_a_publisher_that_died_in_the_window_leaves_a_lock_that_is_taken(paused: Any) -> None:
    """The publisher is SIGKILLed inside the window: its ``PENDING`` goes with it, and the
    judge takes the lock at once (WON)."""
    gsd, proc, _go, _held = paused
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(SYNC_TIMEOUT)
    assert _judge_in_another_pid_namespace(gsd) == "WON"
