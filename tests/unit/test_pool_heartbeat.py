"""A pool worker's heartbeat (``locks.PoolHeartbeat``): one thread for the worker's whole run
keeps fresh whichever lock the worker holds, and never touches a lock it was told to let go of.

The pool used to start and join a heartbeat thread per feature; these tests pin what the one
thread must still do: refresh every lock the worker holds in turn (a long task never loses its
lock), stop with the pool, and wait out a step of a lock being let go of (a refresh after the
release would report a loss that never was)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Final

from mahabharatha import locks
from tests.cli._support import SYNC_TIMEOUT, read_record, wait_for

BEAT: Final = 0.02
"""The heartbeat of the pools below: a refresh every 20 ms (a real one is every 20 s)."""


def test_every_lock_a_worker_holds_is_refreshed_in_turn(tmp_path: Path) -> None:
    """The task of each of three features waits until its own lock has been refreshed twice:
    with no refresh (the thread gone after the first feature, or never started) it times out."""
    gsd = tmp_path / ".gsd"
    for name in ("a", "b", "c"):
        (gsd / "specs" / name).mkdir(parents=True)
    refreshed: list[str] = []

    def task(feature: str) -> None:
        lock = gsd / "specs" / feature / ".lock"
        stamps = {read_record(lock)[1]}
        wait_for(lambda: len(stamps | {read_record(lock)[1]}) >= 2, what=f"{feature} refreshed")
        stamps.add(read_record(lock)[1])
        wait_for(lambda: len(stamps | {read_record(lock)[1]}) >= 3, what=f"{feature} again")
        refreshed.append(feature)

    report = locks.work(task, gsd_dir=gsd, heartbeat=BEAT)
    assert report.ended == "finished"
    assert refreshed == ["a", "b", "c"]
    assert not [t for t in threading.enumerate() if t.name.startswith("lock-heartbeat")]


class _Recorder:
    """Stands in for a ``PoolLock``: counts its steps; ``gate`` (when set) holds a step."""

    def __init__(self, name: str, gate: threading.Event | None = None) -> None:
        self.feature = name
        self.heartbeat = BEAT
        self.steps = 0
        self.entered = threading.Event()
        self.gate = gate

    def pool_beat(self, first: bool) -> float | None:
        self.steps += 1
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(SYNC_TIMEOUT)
        return BEAT


def test_letting_go_waits_out_a_running_step_and_none_runs_after() -> None:
    beats = locks.PoolHeartbeat()
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
