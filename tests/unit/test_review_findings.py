"""Regressions for what an adversarial review found: each test failed before its fix.

- a reclaim re-judges under the guard, so an old writer's fresh empty lock that took the place
  (and the inode) of the empty lock that was judged corrupt is never removed;
- a symlink at ``.lock`` that vanishes or changes during a look never makes a call raise;
- a FIFO at the audit log's path never hangs an operation;
- a child forked from a holder never releases or refreshes its parent's lock;
- Ctrl-C during ``lock acquire --wait --json`` still prints one document;
- a directory at ``.lock`` or a symlinked feature folder makes ``lock check`` and ``lock release``
  exit 3, as ``lock acquire`` does.
"""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mahabharatha import locks
from mahabharatha.commands import _utils
from tests.support.marks import needs_fifo, needs_symlinks

pytestmark = pytest.mark.timeout(30)
FEATURE = "feat"


@pytest.fixture
def gsd(tmp_path: Path) -> Path:
    (tmp_path / "gsd" / "specs" / FEATURE).mkdir(parents=True)
    return tmp_path / "gsd"


def lock_of(gsd: Path) -> Path:
    return gsd / "specs" / FEATURE / ".lock"


def test_a_reclaim_never_removes_an_old_writers_fresh_empty_lock_in_the_judged_inode(
    gsd: Path,
) -> None:
    lock = lock_of(gsd)
    lock.write_bytes(b"")
    os.utime(lock, (time.time() - 10,) * 2)  # an old writer died before writing, 10 s ago
    with _utils.open_feature_dir(gsd, FEATURE, create=False) as dfd:
        assert dfd is not None
        judged = _utils.read_lock(dfd)
        assert _utils.judge_lock(judged, time.time()) is _utils.LockState.CORRUPT
        # Meanwhile a new old-style writer starts in that very inode (or one reused at once):
        # an empty file, just created. Same inode, same (empty) bytes: only its age differs.
        os.utime(lock, None)
        now = time.time()
        assert _utils.judge_lock(_utils.read_lock(dfd), now) is _utils.LockState.WRITING

        def reclaimable(entry: _utils.LockSnapshot) -> bool:
            return _utils.age_only(entry, _utils.judge_lock(entry, now))

        with _utils.guard(dfd, wait=True):
            assert not _utils.remove_if_unchanged(dfd, judged, reclaimable)
    assert lock.exists()


def test_a_reclaim_rejudges_under_the_guard_even_when_the_entry_looks_the_same(gsd: Path) -> None:
    lock = lock_of(gsd)
    lock.write_bytes(b"garbage")
    with _utils.open_feature_dir(gsd, FEATURE, create=False) as dfd:
        assert dfd is not None
        judged = _utils.read_lock(dfd)
        with _utils.guard(dfd, wait=True):
            assert not _utils.remove_if_unchanged(dfd, judged, lambda _entry: False)
            assert lock.exists()
            assert _utils.remove_if_unchanged(dfd, judged, lambda _entry: True)
    assert not lock.exists()


@needs_symlinks
@pytest.mark.parametrize("becomes", ["gone", "a file"])
def test_a_symlink_that_changes_during_a_look_is_never_an_error(
    gsd: Path, monkeypatch: pytest.MonkeyPatch, becomes: str
) -> None:
    lock = lock_of(gsd)
    lock.symlink_to("/etc/passwd")
    real_readlink = os.readlink

    def readlink_after_a_change(path: Any, *args: Any, **kwargs: Any) -> str:
        if lock.is_symlink():  # the first time: the link changes between lstat and readlink
            lock.unlink()
            if becomes == "a file":
                lock.write_text("garbage")
        return str(real_readlink(path, *args, **kwargs))

    monkeypatch.setattr(_utils.os, "readlink", readlink_after_a_change)
    assert _utils.check_feature_lock(FEATURE, str(gsd)) is None
    assert _utils.acquire_feature_lock(FEATURE, str(gsd))


@needs_fifo
def test_a_fifo_at_the_audit_log_never_hangs_a_clean_or_a_reclaim(gsd: Path) -> None:
    os.mkfifo(gsd / locks.AUDIT_LOG_NAME)
    lock_of(gsd).write_text("5:1000")  # stale: cleaning it writes an audit line
    assert [e.state for e in locks.clean(gsd)] == ["stale"]
    lock_of(gsd).write_text("5:1000")
    locks.acquire(FEATURE, gsd, pid=7)  # reclaims: writes an audit line
    assert lock_of(gsd).read_text().startswith("7:")


def test_a_child_forked_from_a_holder_never_releases_its_parents_lock(gsd: Path) -> None:
    held = locks.FeatureLock(FEATURE, gsd, heartbeat=None, timeout=0).acquire()
    mine = lock_of(gsd).read_bytes()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            held.release()
            refused = not held.held
            try:
                held.refresh()
            except locks.LockLostError:
                os._exit(0 if refused else 3)
            os._exit(2)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert lock_of(gsd).read_bytes() == mine
    assert held.held
    held.release()
    assert not lock_of(gsd).exists()


def _cli(*args: object) -> list[str]:
    return [sys.executable, "-m", "mahabharatha", *(str(arg) for arg in args)]


def test_ctrl_c_during_a_json_wait_still_prints_one_document(gsd: Path) -> None:
    locks.acquire(FEATURE, gsd, pid=1)  # another owner: the CLI (our child) must wait for it
    terminal, secondary = pty.openpty()  # stderr at a terminal: the waiting line is the handshake
    waiter = subprocess.Popen(
        _cli("lock", "acquire", FEATURE, "--gsd-dir", gsd, "--wait", 30, "--json"),
        stdout=subprocess.PIPE,
        stderr=secondary,
        text=True,
    )
    os.close(secondary)
    try:
        shown = b""
        while b"waiting:" not in shown:
            shown += os.read(terminal, 4096)
        waiter.send_signal(signal.SIGINT)
        out, _ = waiter.communicate(timeout=30)
    finally:
        waiter.kill()
        os.close(terminal)
    assert waiter.returncode == 130
    document = json.loads(out)
    assert document["acquired"] is False
    assert document["error"] == "interrupted"


@pytest.mark.parametrize("command", ["check", "release"])
@pytest.mark.parametrize("in_the_way", ["directory at .lock", "symlinked folder"])
def test_check_and_release_exit_3_when_something_is_in_the_way(
    tmp_path: Path, command: str, in_the_way: str
) -> None:
    gsd = tmp_path / "gsd"
    folder = gsd / "specs" / FEATURE
    if in_the_way == "directory at .lock":
        (folder / ".lock").mkdir(parents=True)
    else:
        (tmp_path / "elsewhere").mkdir()
        folder.parent.mkdir(parents=True)
        folder.symlink_to(tmp_path / "elsewhere")
    done = subprocess.run(
        _cli("lock", command, FEATURE, "--gsd-dir", gsd, "--json"),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert str(folder) in json.loads(done.stdout)["error"]
    assert len(done.stderr.strip().splitlines()) == 1
