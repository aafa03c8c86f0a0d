"""A pool worker's heartbeat (``locks.Heartbeat``): one thread for the worker's whole run
keeps fresh whichever lock the worker holds, and never touches a lock it was told to let go of.

The pool used to start and join a heartbeat thread per feature; these tests pin what the one
thread must still do: refresh every lock the worker holds in turn (a long task never loses its
lock), stop with the pool, and wait out a step of a lock being let go of (a refresh after the
release would report a loss that never was)."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Final

from mahabharatha import locks
from mahabharatha.backends import open_backend
from tests.cli._support import SYNC_TIMEOUT, read_record, wait_for

BEAT: Final = 0.02
"""The heartbeat of the pools below: a refresh every 20 ms (a real one is every 20 s)."""


REFRESH_WAIT: Final = 5.0
"""A hang guard for one refresh (250 heartbeats): a broken heartbeat fails in seconds."""


class _NotRefreshedError(BaseException):
    """A task's lock was not refreshed: ends ``locks.work`` at once (a ``BaseException``
    propagates; an ``Exception`` would be recorded as a failed attempt and retried)."""


def test_every_lock_a_worker_holds_is_refreshed_in_turn(tmp_path: Path) -> None:
    """The task of each of three features waits until its own lock has been refreshed twice:
    with no refresh (the thread gone after the first feature, never started, or a step that
    does not refresh) the first wait fails the test on its own assertion, once (it used to be
    recorded as a failed attempt and retried, until the suite's global timeout)."""
    gsd = tmp_path / ".gsd"
    for name in ("a", "b", "c"):
        (gsd / "specs" / name).mkdir(parents=True)
    refreshed: list[str] = []

    def refreshed_past(lock: Path, stamps: set[float], count: int) -> None:
        try:
            seen = lambda: len(stamps | {read_record(lock)[1]}) >= count  # noqa: E731
            wait_for(seen, REFRESH_WAIT, "a refresh")
        except AssertionError as error:
            raise _NotRefreshedError(f"{lock.parent.name}: {error}") from None
        stamps.add(read_record(lock)[1])

    def task(feature: str) -> None:
        lock = gsd / "specs" / feature / ".lock"
        stamps = {read_record(lock)[1]}
        refreshed_past(lock, stamps, 2)
        refreshed_past(lock, stamps, 3)
        refreshed.append(feature)

    try:
        report = locks.work(task, gsd_dir=gsd, heartbeat=BEAT)
    except _NotRefreshedError as error:
        raise AssertionError(f"a held lock was never refreshed ({error})") from None
    assert report.ended == "finished"
    assert refreshed == ["a", "b", "c"]
    assert not [t for t in threading.enumerate() if t.name.startswith("lock-heartbeat")]


class _Recorder:
    """Stands in for a ``PoolLock``: counts its steps; ``gate`` (when set) holds a step."""

    _connection_grace = None

    def __init__(self, name: str, gate: threading.Event | None = None) -> None:
        self.feature = name
        self.heartbeat = BEAT
        self.steps = 0
        self.entered = threading.Event()
        self.gate = gate

    def _beat_once(self, first: bool = False) -> float | None:
        self.steps += 1
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(SYNC_TIMEOUT)
        return BEAT


def test_letting_go_waits_out_a_running_step_and_none_runs_after() -> None:
    beats = locks.Heartbeat()
    gate = threading.Event()
    first = _Recorder("first", gate)
    try:
        beats.hold(first)  # type: ignore[arg-type]
        assert first.entered.wait(SYNC_TIMEOUT)  # its step runs, held at the gate
        gone = threading.Event()

        def let_go() -> None:
            beats.let_go(first)  # type: ignore[arg-type]
            gone.set()

        letting_go = threading.Thread(target=let_go)
        letting_go.start()
        assert not gone.wait(0.1)  # still inside the step: let_go must not have returned
        gate.set()
        assert gone.wait(SYNC_TIMEOUT)
        letting_go.join()
        steps_at_let_go = first.steps
        second = _Recorder("second")
        beats.hold(second)  # type: ignore[arg-type]
        wait_for(lambda: second.steps >= 3, what="three steps of the next lock")
        assert first.steps == steps_at_let_go  # never stepped again once let go of
    finally:
        beats.close()


class _GatedPoolLock(locks.PoolLock):
    """A pool lock whose heartbeat steps say when they start and wait at ``gate``."""

    entered: threading.Event
    gate: threading.Event

    def _beat_once(self, first: bool = False) -> float | None:
        self.entered.set()
        self.gate.wait(SYNC_TIMEOUT * 2)  # set by the test once its child is judged
        return super()._beat_once(first)


def _claimed(gsd: Path) -> _GatedPoolLock:
    held = locks.claim_held(["a"], gsd)
    assert held is not None
    lock = _GatedPoolLock(
        held, gsd, backend=open_backend(None, gsd), heartbeat=BEAT, command=None, lease=None
    )
    lock.entered, lock.gate = threading.Event(), threading.Event()
    return lock


def _exit_code_of(child: int) -> int | None:
    """``child``'s exit code once it ended (``None``: still running)."""
    done, status = os.waitpid(child, os.WNOHANG)
    return None if done == 0 else os.waitstatus_to_exitcode(status)


def test_a_child_forked_during_a_heartbeat_step_lets_go_of_its_lock_without_waiting(
    tmp_path: Path,
) -> None:
    """Fork-safe as a ``FeatureLock`` is: the child of a worker forked while the worker's
    heartbeat thread was stepping its lock has no such thread; its release must not wait for
    that step to end (it hung for ever: the copied heartbeat still said the step ran)."""
    gsd = tmp_path / ".gsd"
    (gsd / "specs" / "a").mkdir(parents=True)
    lock = _claimed(gsd)
    lock.acquire()
    child = 0
    try:
        assert lock.entered.wait(SYNC_TIMEOUT)  # the heartbeat thread is inside the step
        child = os.fork()
        if child == 0:  # pragma: no cover - runs in the child
            try:
                lock.release()
                os._exit(0 if not lock.held else 2)
            except BaseException:
                os._exit(1)
        ended: list[int | None] = [None]

        def child_ended() -> bool:
            ended[0] = _exit_code_of(child)
            return ended[0] is not None

        wait_for(child_ended, what="the forked child's release")
        child = 0
        assert ended[0] == 0
    finally:
        if child:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
        lock.gate.set()
        result = lock.finish(0, None, locks.DEFAULT_ATTEMPTS)
    assert result.outcome == "done"  # the parent's lock was its own throughout


def test_an_on_lost_callback_that_releases_the_lock_does_not_hang_the_worker(
    tmp_path: Path,
) -> None:
    """``on_lost`` runs in the heartbeat thread, inside its step; a callback that releases the
    lock (as it may a ``FeatureLock``'s) made ``let_go`` wait for that very step to end: the
    heartbeat thread waited on itself, then the worker's ``finish`` on it, for ever."""
    gsd = tmp_path / ".gsd"
    (gsd / "specs" / "a").mkdir(parents=True)
    told = threading.Event()
    ended: list[locks.WorkReport] = []
    finished = threading.Event()

    def step(lock: locks.PoolLock) -> locks.WorkResult:
        def lost(error: locks.LockLostError) -> None:
            lock.release()
            told.set()

        lock.acquire(on_lost=lost)
        locks.release(lock.feature, gsd, force=True)  # taken away: the next refresh sees it
        assert told.wait(SYNC_TIMEOUT)
        return lock.finish(0, None, locks.DEFAULT_ATTEMPTS)

    def worker() -> None:
        ended.append(locks.run_pool(step, ["a"], gsd, heartbeat=BEAT, once=True))
        finished.set()

    threading.Thread(target=worker, daemon=True).start()
    assert finished.wait(SYNC_TIMEOUT * 2)
    assert [result.outcome for result in ended[0].results] == ["lost"]
