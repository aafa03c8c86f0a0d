"""A lock that cannot be read for a passing reason is held, never reclaimed ("Unreadable means
unreadable").

While another process holds a kernel write lease on ``.lock`` (``fcntl(F_SETLEASE, F_WRLCK)``),
every open of it fails with ``EWOULDBLOCK`` until the lease is given up. That says nothing about
the lock: it is a live lock someone is reading with a lease (Samba, an NFS server, a backup
tool). The lease holder ignores the lease-break signal and keeps its lease for the whole test
(the kernel would break it only after ``/proc/sys/fs/lease-break-time`` seconds, 45 by default;
the ``needs_leases`` mark asks for at least 10), so every look we take fails the same way.
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from mahabharatha import locks
from mahabharatha.backends.files import snapshot
from mahabharatha.backends.files.snapshot import format_record
from mahabharatha.commands import _utils
from mahabharatha.constants import READ_WAIT_SECONDS
from tests.cli._support import invoke, one_document
from tests.concurrency._harness import CTX, FEATURE, SYNC_TIMEOUT, lock_path, team
from tests.support.marks import needs_leases


def _lease_holder(lock: Path, planted: Any, leased: Any, done: Any) -> None:
    # The lease-break notice (SIGIO) would end this process: ignore it and keep the lease.
    signal.signal(signal.SIGIO, signal.SIG_IGN)
    if not planted.wait(SYNC_TIMEOUT):
        raise RuntimeError("no lock was planted")
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
        leased.set()
        if not done.wait(SYNC_TIMEOUT):
            raise RuntimeError("the test never finished")
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    finally:
        os.close(fd)


def _outcome(call: Any) -> str:
    try:
        return f"returned {call()!r}"
    except OSError as error:
        return f"raised {type(error).__name__} errno {error.errno}"


@needs_leases
@pytest.mark.timeout(60)
def test_a_live_lock_under_a_kernel_lease_is_held_not_reclaimed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fails before the fix: the ``EWOULDBLOCK`` open made the lock "unreadable", so
    ``check_feature_lock`` said None, ``acquire_feature_lock`` took the live lock and a
    non-owner's ``release_feature_lock`` deleted it. The lease outlasts any wait: each look
    retries the refused read for a tenth of the package's 0.5 s (busy is busy either way)."""
    monkeypatch.setattr(snapshot, "READ_WAIT_SECONDS", READ_WAIT_SECONDS / 10)
    gsd = tmp_path / "gsd"
    lock = lock_path(gsd)
    lock.parent.mkdir(parents=True)
    with team(tmp_path) as crew:
        planted, leased, done = CTX.Event(), CTX.Event(), CTX.Event()
        holder = crew.spawn(_lease_holder, lock, planted, leased, done)
        record = format_record(holder, _utils.now())
        lock.write_bytes(record)
        before = os.lstat(lock)
        planted.set()
        assert leased.wait(SYNC_TIMEOUT), "the holder could not take its lease"
        try:
            acquired = _outcome(lambda: _utils.acquire_feature_lock(FEATURE, str(gsd)))
            checked = _outcome(lambda: _utils.check_feature_lock(FEATURE, str(gsd)))
            released = _outcome(lambda: _utils.release_feature_lock(FEATURE, str(gsd)))
            cleaned = locks.clean(gsd)
            listed = [info.state for info in locks.status(gsd)]
            with pytest.raises(locks.LockHeldError) as held:
                locks.acquire(FEATURE, gsd, pid=os.getpid(), timeout=0)
            cli = invoke("lock", "check", FEATURE, "--gsd-dir", gsd, "--json")
        finally:
            done.set()
        crew.join()
    after = os.lstat(lock)
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino), "the lock was replaced"
    assert lock.read_bytes() == record, "the leased lock was rewritten"
    assert acquired == "returned False"
    assert checked == f"raised LockBusyError errno {errno.EWOULDBLOCK}"
    assert released == f"raised LockBusyError errno {errno.EWOULDBLOCK}"
    assert cleaned == [] and listed == ["busy"]
    assert held.value.info.state == "busy"
    assert cli.exit_code == 1 and one_document(cli.stdout)["state"] == "busy", cli.output
