"""A pool worker lets go of each hold's proof of life exactly once, whatever the outcome: a
failed attempt, and a hold left to work its command started outside its group (kept, proof
and all, while that work runs; let go once it has ended). A worker runs for many features: a
descriptor kept per feature ends in "too many open files"."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from contextlib import suppress
from pathlib import Path
from typing import Final

import pytest

from mahabharatha import constants, locks
from mahabharatha.owner import ownership, proof
from mahabharatha.run import runner
from mahabharatha.states import WorkOutcome
from tests.cli._support import wait_for
from tests.support.marks import needs_fifo, needs_proc

FEATURES: Final = ("f0", "f1", "f2")
OUTCOMES: Final = ["done", "failed", "lost"]

needs_proofs = pytest.mark.skipif(not proof.supported(), reason="no OFD locks here")


def _proofs_open(root: Path) -> list[str]:
    """The proof files under ``root`` this process has a descriptor of."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        with suppress(OSError):  # the listing's own descriptor is gone by now
            target = os.readlink(f"/proc/self/fd/{name}")
            if target.startswith(str(root)) and proof.PROOF_PREFIX in target:
                found.append(target)
    return found


def _gsd(tmp_path: Path) -> Path:
    gsd = tmp_path / ".gsd"
    for feature in FEATURES:
        (gsd / "specs" / feature).mkdir(parents=True)
    return gsd


def _proof_kept(gsd: Path, feature: str) -> bool:
    """Does this process still hold the proof of its lock on ``feature``?"""
    folder = os.open(gsd / "specs" / feature, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return proof.kept_slot(folder) is not None
    finally:
        os.close(folder)


@needs_proc
@needs_proofs
@pytest.mark.parametrize("code", [0, 1, None], ids=["done", "failed", "released"])
def test_each_outcome_lets_go_of_the_holds_proofs(tmp_path: Path, code: int | None) -> None:
    """The lock's proof and the one handed to its work (``proof_fds``) go with the hold.
    Fails before the fix: ``PoolLock.finish`` never closed the handed proof (two descriptors
    per hold), and the file backend's ``fail`` kept the lock's own (``done`` let it go)."""
    gsd = _gsd(tmp_path)

    def step(lock: locks.PoolLock) -> locks.WorkResult:
        with lock:
            assert lock.proof_fds  # as a step that starts work with ``pass_fds`` asks
        return lock.finish(code, "it failed", 1)

    report = locks.run_pool(step, None, gsd, attempts=1, heartbeat=None, once=True)
    assert len(report.results) == 1
    assert _proofs_open(tmp_path) == []


@needs_proc
@needs_proofs
@pytest.mark.parametrize("code", [0, 1], ids=["done", "failed"])
def test_a_hold_forced_away_before_its_outcome_lets_go_of_its_proofs(
    tmp_path: Path, code: int
) -> None:
    """Another process forces the lock away while the step runs (no heartbeat saw it): the
    outcome is lost, and the hold's proof still goes. Fails before the fix: the done or fail
    that found the lock gone raised before it let go of the proof (one descriptor a hold)."""
    gsd = _gsd(tmp_path)
    force = [sys.executable, "-m", "mahabharatha", "lock", "release", "--force"]

    def step(lock: locks.PoolLock) -> locks.WorkResult:
        with lock:
            subprocess.run([*force, lock.feature, "--gsd-dir", str(gsd)], check=True)
        return lock.finish(code, "it failed", 1)

    report = locks.run_pool(step, None, gsd, attempts=1, heartbeat=None, once=True)
    assert [r.outcome for r in report.results] == [WorkOutcome.LOST]
    assert _proofs_open(tmp_path) == []


@needs_proc
@needs_fifo
@needs_proofs
@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs setsid")
@pytest.mark.parametrize(("code", "lost"), [(0, False), (1, False), (0, True)], ids=OUTCOMES)
def test_a_hold_left_to_work_keeps_its_proof_until_that_work_ends_then_lets_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, lost: bool
) -> None:
    """``lock work``'s step (``_run_step``): CMD leaves work in a session of its own. While
    that work runs, its lock keeps this worker's proof (its owner's evidence of life); once it
    has ended, the worker lets go of the proof and of the watch on that work. Fails before the
    fix (done, lost): both descriptors stayed open, two per feature, as long as the worker
    ran; (failed) the lock's own, which ``fail`` kept."""
    monkeypatch.setenv(constants.GRACE_ENV, "0")  # the work left the group: no grace ends it
    monkeypatch.setattr(runner, "WORK_KILL_WAIT_SECONDS", 0.0)
    gsd = _gsd(tmp_path)
    fifo = tmp_path / "work.fifo"
    os.mkfifo(fifo)

    def step(lock: locks.PoolLock) -> locks.WorkResult:
        runs.append(lock.feature)
        pid_file = tmp_path / f"{len(runs)}.pid"
        leave = (
            f"setsid sh -c 'echo $$ > {pid_file}; read x < {fifo}' & "
            f"while [ ! -s {pid_file} ]; do :; done; exit {code}"
        )
        with pytest.raises(runner.WorkLeftError) as left, runner.Run(lock) as run:
            run.acquire()
            run.command(["sh", "-c", leave])
        if lost and runs.count(lock.feature) == 1:  # as a heartbeat finding it replaced
            lock._declare_lost(locks.LockLostError(lock.feature))
        result = lock.finish_leaving_work(left.value.status, left.value.still_running)
        assert _proof_kept(gsd, lock.feature)  # never let go while that work runs
        os.close(os.open(fifo, os.O_WRONLY))  # the work reads end of input and ends
        work = int(pid_file.read_text())
        wait_for(lambda: not ownership.is_alive(ownership.proc_stat(work), work), what="work")
        return result

    runs: list[str] = []
    report = locks.run_pool(step, None, gsd, attempts=1, wait=5.0, heartbeat=None)
    outcomes = {(r.feature, r.outcome) for r in report.results}
    if lost:  # released once its work ended, then claimed and built again
        assert outcomes == {(f, o) for f in FEATURES for o in (WorkOutcome.LOST, WorkOutcome.DONE)}
    elif code == 0:
        assert outcomes == {(f, WorkOutcome.DONE) for f in FEATURES}
    else:
        assert outcomes == {
            (f, o) for f in FEATURES for o in (WorkOutcome.LEFT, WorkOutcome.FAILED)
        }
    assert _proofs_open(tmp_path) == []
    assert not list(gsd.glob("specs/*/.lock"))  # every lock let go once its work ended
