"""Writers and cleaners that bypass this module: what holds when they share the lock folder.

- The OLD module (``tests/support/old_design.py``) creates ``.lock`` empty and writes the record
  a moment later. Caught between the two, its empty lock is "writing": this module's acquire
  says held, release and clean leave it, check says nothing is held yet. Then its record lands.
- A shell writer, ``echo "$$:$(date +%s)" > .lock``: a valid record (whole seconds), respected
  as an active lock; reclaimable once stale. Its owner is ``unknown`` (a shell publishes no
  owner details), so ``reclaim_dead`` does not take it although the shell is gone. ``>`` is
  not a lock: it overwrites ours, and the holder learns on its next refresh that it lost (and
  never removes the shell's record). ``set -C`` (noclobber) makes it respect ours.
- ``find <gsd>/specs -name .lock -mmin +120 -delete``, run alongside ``lock run`` with a fast
  heartbeat: every refresh gives the lock a new mtime, so find never deletes a live lock, while
  it does delete a stale one (aged with ``os.utime``).

The foreign processes are synchronised by events and output lines, never by sleeping.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Final

import pytest

from mahabharatha import locks
from mahabharatha.commands import _utils
from mahabharatha.constants import STALE_AFTER_SECONDS
from tests.cli._support import Child, wait_for
from tests.faults._kills import clock_ahead, entry_at, lock_of, plant, record_pid, stale_record
from tests.support import old_design

FEATURE: Final = "feat"
CTX: Final = multiprocessing.get_context("fork")
SYNC: Final = 20.0
THREE_HOURS: Final = 3 * 3600

bounded = pytest.mark.timeout(60)
needs_find = pytest.mark.skipif(
    subprocess.run(["find", "--version"], capture_output=True).returncode != 0,
    reason="needs GNU find (-mmin, -delete)",
)


@pytest.fixture
def gsd(tmp_path: Path) -> Path:
    return tmp_path / "gsd"


# --------------------------------------------------------------------------- the old module


def _old_writer(gsd: Path, created: Event, attempted: Event) -> None:
    """The old acquire, paused between its ``O_CREAT | O_EXCL`` and its write."""

    def between_create_and_write() -> None:
        created.set()
        if not attempted.wait(SYNC):
            raise TimeoutError("the test never tried to acquire")

    old_design.HOOKS["acquire_after_create"] = between_create_and_write
    if not old_design.acquire_feature_lock(FEATURE, str(gsd)):
        raise RuntimeError("the old writer did not get the lock")


@pytest.fixture
def old_writer(gsd: Path) -> Iterator[tuple[BaseProcess, Event, Event]]:
    created, attempted = CTX.Event(), CTX.Event()
    proc = CTX.Process(target=_old_writer, args=(gsd, created, attempted), daemon=True)
    proc.start()
    try:
        yield proc, created, attempted
    finally:
        attempted.set()
        proc.join(SYNC)
        if proc.is_alive():
            proc.kill()
            proc.join()


@bounded
def test_an_old_writers_empty_lock_is_held_not_reclaimed_and_its_record_then_lands(
    gsd: Path, old_writer: tuple[multiprocessing.Process, Event, Event]
) -> None:
    proc, created, attempted = old_writer
    assert created.wait(SYNC), "the old writer never created its lock"
    lock = lock_of(gsd, FEATURE)
    empty = entry_at(lock)
    assert empty.content == b"", "the pause is not between create and write"
    # Every call of ours, while the old writer has not written yet:
    assert _utils.acquire_feature_lock(FEATURE, str(gsd)) is False
    with pytest.raises(locks.LockHeldError):
        locks.acquire(FEATURE, gsd, pid=4242)
    assert _utils.check_feature_lock(FEATURE, str(gsd)) is None
    assert locks.inspect(FEATURE, gsd).state == "writing"
    _utils.release_feature_lock(FEATURE, str(gsd))
    with pytest.raises(locks.NotOwnerError):
        locks.release(FEATURE, gsd, pid=4242, force=True)
    assert not [e for e in locks.clean(gsd) if e.removed]
    assert entry_at(lock) == empty, "this module touched the old writer's lock mid-write"
    attempted.set()  # only now may the old writer write its record
    proc.join(SYNC)
    assert proc.exitcode == 0
    written = entry_at(lock)
    assert written.inode == empty.inode and record_pid(written.content) == proc.pid
    checked = _utils.check_feature_lock(FEATURE, str(gsd))
    assert checked is not None and checked["pid"] == proc.pid
    assert _utils.acquire_feature_lock(FEATURE, str(gsd)) is False


@bounded
def test_an_empty_lock_past_the_grace_is_corrupt_and_reclaimed(gsd: Path) -> None:
    """The grace is 2 s by mtime: an old writer that died between create and write blocks
    nobody for longer."""
    plant(gsd, FEATURE, b"", age=2.5)
    assert locks.inspect(FEATURE, gsd).state == "corrupt"
    assert _utils.acquire_feature_lock(FEATURE, str(gsd)) is True
    assert record_pid(entry_at(lock_of(gsd, FEATURE)).content) == os.getpid()


@bounded
def test_the_old_writer_respects_a_lock_this_module_holds(gsd: Path) -> None:
    assert _utils.acquire_feature_lock(FEATURE, str(gsd))
    mine = entry_at(lock_of(gsd, FEATURE))
    assert old_design.acquire_feature_lock(FEATURE, str(gsd)) is False
    assert entry_at(lock_of(gsd, FEATURE)) == mine


# --------------------------------------------------------------------------- a shell writer


SHELL_WRITER: Final = 'echo "$$:$(date +%s)" > .lock'


def _shell(folder: Path, script: str) -> subprocess.CompletedProcess[str]:
    folder.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        ["sh", "-c", script], cwd=folder, capture_output=True, text=True, timeout=SYNC
    )


@bounded
def test_a_shell_writers_lock_is_respected_as_active_and_reclaimed_once_stale(
    gsd: Path,
) -> None:
    folder = gsd / "specs" / FEATURE
    assert _shell(folder, SHELL_WRITER).returncode == 0
    lock = lock_of(gsd, FEATURE)
    shells = entry_at(lock)
    shell_pid = record_pid(shells.content)
    assert shell_pid is not None, shells
    checked = _utils.check_feature_lock(FEATURE, str(gsd))
    assert checked is not None and checked["pid"] == shell_pid
    assert checked["timestamp"] == int(checked["timestamp"])  # whole seconds, still valid
    assert _utils.acquire_feature_lock(FEATURE, str(gsd)) is False
    _utils.release_feature_lock(FEATURE, str(gsd))
    assert not [e for e in locks.clean(gsd) if e.removed]
    assert entry_at(lock) == shells
    info = locks.inspect(FEATURE, gsd)
    # The shell has exited, but without owner details its pid proves nothing (contract).
    assert (info.state, info.owner) == ("active", "unknown")
    with pytest.raises(locks.LockHeldError):
        locks.acquire(FEATURE, gsd, reclaim_dead=True)
    with clock_ahead(STALE_AFTER_SECONDS + 1):
        assert locks.inspect(FEATURE, gsd).state == "stale"
        locks.acquire(FEATURE, gsd)
    assert record_pid(entry_at(lock).content) == os.getpid()


@bounded
def test_a_clobbering_shell_writer_takes_the_lock_and_the_holder_learns_it_lost(
    gsd: Path,
) -> None:
    """``>`` bypasses the protocol (it truncates ours in place); what still holds: the holder's
    refresh says it lost, its release leaves the shell's record, and ``set -C`` would have
    refused to clobber."""
    folder = gsd / "specs" / FEATURE
    held = locks.FeatureLock(FEATURE, gsd, heartbeat=None, timeout=0).acquire()
    mine = entry_at(lock_of(gsd, FEATURE))
    polite = _shell(folder, f"set -C; {SHELL_WRITER}")
    assert polite.returncode != 0, "noclobber wrote over an existing lock"
    assert entry_at(lock_of(gsd, FEATURE)) == mine
    assert _shell(folder, SHELL_WRITER).returncode == 0
    clobbered = entry_at(lock_of(gsd, FEATURE))
    assert clobbered != mine and record_pid(clobbered.content) not in (None, os.getpid())
    with pytest.raises(locks.LockLostError):
        held.refresh()
    held.release()
    assert entry_at(lock_of(gsd, FEATURE)) == clobbered


# --------------------------------------------------------------------------- a find cleaner


def _find_clean(gsd: Path) -> None:
    cmd = ["find", str(gsd / "specs"), "-name", ".lock", "-mmin", "+120", "-delete"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=SYNC)


def _age(path: Path, seconds: float) -> None:
    when = time.time() - seconds
    os.utime(path, (when, when), follow_symlinks=False)


@bounded
@needs_find
def test_a_find_mmin_cleaner_deletes_stale_locks_but_never_a_live_refreshed_one(
    tmp_path: Path, gsd: Path
) -> None:
    plant(gsd, "old", stale_record())
    _age(lock_of(gsd, "old"), THREE_HOURS)
    argv = [
        sys.executable, "-m", "mahabharatha", "lock", "run", FEATURE, "--gsd-dir", str(gsd),
        "--heartbeat", "0.05", "--", "sh", "-c", "echo ready; read line",
    ]  # fmt: skip
    runner = Child(argv, tmp_path, stdin=subprocess.PIPE)
    try:
        assert runner.next_line() == "ready"
        live = lock_of(gsd, FEATURE)
        assert record_pid(entry_at(live).content) == runner.pid
        _find_clean(gsd)
        assert entry_at(lock_of(gsd, "old")).missing, "find left a lock 3 hours old"
        # A live lock whose mtime somehow looks 3 hours old: the next beat makes it fresh.
        _age(live, THREE_HOURS)
        wait_for(
            lambda: time.time() - live.stat().st_mtime < 60,
            what="the heartbeat to rewrite the lock",
        )
        for _ in range(5):
            _find_clean(gsd)
            assert record_pid(entry_at(live).content) == runner.pid, "find deleted a live lock"
        runner.send("done\n")
        assert runner.wait() == 0, runner.stderr
        assert entry_at(live).missing, "lock run did not release"
    finally:
        runner.reap()
