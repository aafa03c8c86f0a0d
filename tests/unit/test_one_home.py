"""Issue 10 ("one home per idea"): the facts a lock reports are enums, every exit code has one
map, callbacks are passed in rather than patched onto a lock, a write that accepts nothing
fails."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from mahabharatha import locks
from mahabharatha.backends.base import LockInfo, Owner, State
from mahabharatha.backends.files import lockfile
from mahabharatha.backends.files.folder import Guard, OpenFeatureDir
from mahabharatha.cli._output import exit_code_for
from mahabharatha.commands import _utils
from mahabharatha.run import runner

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def gsd(tmp_path: Path) -> str:
    return str(tmp_path / "gsd")


def test_lock_info_holds_enums_and_json_shows_their_values(gsd: str) -> None:
    """Fails before the fix: ``state``/``owner`` were plain strings and ``State`` and
    ``LockInfo.held`` did not exist; the CLI compared strings to decide "held"."""
    locks.acquire("feat", gsd)
    info = locks.inspect("feat", gsd)
    assert info.state is State.ACTIVE and info.owner is Owner.RUNNING
    assert info.held
    shown = json.loads(json.dumps(info.to_dict()))
    assert (shown["state"], shown["owner"]) == ("active", "running")
    # A backend may give plain strings; they become the members.
    given = LockInfo("feat", "writing", None, None, None, None, "unknown")  # type: ignore[arg-type]
    assert given.state is State.WRITING and given.held
    assert not LockInfo("feat", State.STALE, 1, 0.0, 1.0, None, Owner.UNKNOWN).held


def test_every_exit_code_of_lock_run_comes_from_exit_code_for() -> None:
    """Fails before the fix: ``exit_code_for`` knew none of 75, 126, 127 or 128+n (the run
    command and the error classes each held their own)."""
    busy = locks.LockHeldError(LockInfo("f", State.ACTIVE, 1, 0.0, 0.0, 1.0, Owner.RUNNING))
    mine = locks.AlreadyHeldError(busy.info)
    assert exit_code_for(busy, before_run=True) == 75
    assert exit_code_for(busy) == 1
    assert exit_code_for(mine, before_run=True) == 1
    assert exit_code_for(runner.Interrupted(signal.SIGTERM), before_run=True) == 143
    assert exit_code_for(runner.CommandNotFoundError(errno.ENOENT, "no"), before_run=True) == 127
    unrunnable = runner.CommandNotExecutableError(errno.EACCES, "no")
    assert exit_code_for(unrunnable, before_run=True) == 126


def test_lock_run_passes_its_callbacks_in_and_never_rewrites_the_lock(gsd: str) -> None:
    """``run_locked`` adds its own checks to the wait and to a loss for this acquisition only.
    Fails before the fix: while it waited, ``lock.on_wait`` was its wrapper (rewritten and
    restored afterwards), so a caller looking at the lock saw someone else's callback."""
    locks.acquire("feat", gsd, pid=os.getppid())  # held by another live process
    seen: list[bool] = []

    def on_wait(_info: LockInfo, _left: float | None) -> None:
        seen.append(holder.on_wait is on_wait)

    holder = locks.FeatureLock("feat", gsd, timeout=0.05, heartbeat=None, on_wait=on_wait)
    with pytest.raises(locks.LockTimeoutError):
        runner.run_locked(holder, [sys.executable, "-c", "pass"])
    assert seen and all(seen)
    assert holder.on_wait is on_wait and holder.on_lost is None


def test_a_write_that_accepts_no_bytes_fails_with_eio(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fails before the fix: ``_write_all`` retried a 0-byte write for ever (here: the fake
    ``write`` gives up after 100 calls and the test sees its error, not EIO)."""
    calls: list[int] = []

    def accepts_nothing(_fd: int, _data: object) -> int:
        calls.append(1)
        if len(calls) > 100:
            raise AssertionError("retried a write that accepts nothing")
        return 0

    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        monkeypatch.setattr(_utils.os, "write", accepts_nothing)
        with pytest.raises(OSError) as failed:
            lockfile.write_all(fd, b"1234:1.0")
        assert failed.value.errno == errno.EIO
    finally:
        monkeypatch.undo()
        os.close(fd)


def test_the_guard_and_the_folder_descriptor_do_their_work_only_inside_with(gsd: str) -> None:
    """Fails before the fix: ``guard(...)`` took the flock and ``open_feature_dir(...)`` opened
    the folder in the constructor, so an object made without ``with`` leaked both."""
    os.makedirs(os.path.join(gsd, "specs", "feat"))
    fds_before = len(os.listdir("/proc/self/fd"))
    unused = OpenFeatureDir(gsd, "feat", create=False)
    assert len(os.listdir("/proc/self/fd")) == fds_before  # nothing opened yet
    with unused as dfd:
        assert dfd is not None
        other = os.open(os.path.join(gsd, "specs", "feat"), os.O_RDONLY | os.O_DIRECTORY)
        try:
            Guard(dfd, wait=False)  # made, never entered: must hold nothing
            assert Guard(other, wait=False).__enter__() is True  # so another takes it
            fcntl.flock(other, fcntl.LOCK_UN)
            with Guard(dfd, wait=False) as taken:
                assert taken
                assert not fcntl_try(other)  # held now, inside the block
        finally:
            os.close(other)
    assert len(os.listdir("/proc/self/fd")) == fds_before  # closed on leaving


def fcntl_try(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    fcntl.flock(fd, fcntl.LOCK_UN)
    return True
