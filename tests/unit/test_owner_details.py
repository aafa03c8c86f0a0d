"""Owner details: published with every lock, carried by refreshes, and the only ground on
which a pid may be judged dead (contract: "Who owns a lock, and when an owner is dead")."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from mahabharatha import locks
from mahabharatha.backends.files import lockfile
from mahabharatha.commands import _utils
from mahabharatha.constants import STALE_AFTER_SECONDS
from mahabharatha.owner import ownership
from tests.support.marks import needs_proc
from tests.support.owner_details import attach, attached, details_for

pytestmark = needs_proc

FEATURE: Final = "owned"


@pytest.fixture
def gsd(tmp_path: Path) -> Path:
    return tmp_path / "gsd"


def lock_file(gsd: Path, feature: str = FEATURE) -> Path:
    return gsd / "specs" / feature / ".lock"


def write_record(gsd: Path, pid: int, timestamp: float | None = None) -> Path:
    """An older writer's lock: the record only, no owner details."""
    path = lock_file(gsd)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{pid}:{time.time() if timestamp is None else timestamp}")
    return path


@pytest.fixture
def gone() -> int:
    """A pid no process has (a reaped child's)."""
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    return done.pid


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A live process in its own group, to stand as an owner other than us."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        yield child
    finally:
        child.kill()
        child.wait()
        assert child.stdin is not None
        child.stdin.close()


def details_at(path: Path) -> ownership.OwnerDetails:
    details = ownership.decode(attached(path))
    assert details is not None, "the lock carries no owner details"
    return details


# --------------------------------------------------------------------------- publishing


@pytest.mark.parametrize("named", [False, True], ids=["tmpfile", "named-temp"])
def test_every_lock_of_this_package_carries_its_owners_details(
    gsd: Path, named: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fails before the fix: a lock had no owner details at all."""
    if named:
        monkeypatch.setattr(lockfile.TMPFILE, "usable", False)
    assert _utils.acquire_feature_lock(FEATURE, str(gsd))
    me = ownership.proc_stat(os.getpid())
    assert me is not None
    details = details_at(lock_file(gsd))
    assert (details.boot, details.ns) == (ownership.this_boot(), ownership.this_pid_namespace())
    assert (details.start, details.pgid) == (me.start, os.getpgrp())
    assert details.host and details.cmd is None
    assert lock_file(gsd).read_text().startswith(f"{os.getpid()}:"), "the record is unchanged"


def test_the_details_are_the_owners_not_the_writers(
    gsd: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """``acquire --pid`` records the owner's start time and group. Fails before: none."""
    locks.acquire(FEATURE, gsd, pid=sleeper.pid)
    owner = ownership.proc_stat(sleeper.pid)
    assert owner is not None
    details = details_at(lock_file(gsd))
    assert (details.start, details.pgid, details.gstart) == (owner.start, sleeper.pid, owner.start)


def test_a_refresh_carries_the_details_forward(gsd: Path) -> None:
    """Fails before the fix: no details to carry."""
    held = locks.FeatureLock(FEATURE, gsd, heartbeat=None, command=["make", "all"]).acquire()
    try:
        before = attached(lock_file(gsd))
        held.refresh()
        after_path = lock_file(gsd)
        assert attached(after_path) == before
        assert details_at(after_path).cmd == "make all"
    finally:
        held.release()


def test_the_command_is_bounded(gsd: Path) -> None:
    held = locks.FeatureLock(FEATURE, gsd, heartbeat=None, command=["x" * 5000]).acquire()
    try:
        raw = attached(lock_file(gsd))
        assert raw is not None and len(raw) <= ownership.MAX_DETAILS_BYTES
        assert len(details_at(lock_file(gsd)).cmd or "") <= ownership.MAX_COMMAND_CHARS
    finally:
        held.release()


def test_without_a_command_the_details_fit_in_the_inode(gsd: Path) -> None:
    """ext4 keeps a value this small inside the inode: no disk block per lock."""
    assert _utils.acquire_feature_lock(FEATURE, str(gsd))
    raw = attached(lock_file(gsd))
    assert raw is not None and len(raw) <= ownership.INLINE_BYTES


def test_without_extended_attributes_a_lock_is_valid_with_unknown_owner(
    gsd: Path, monkeypatch: pytest.MonkeyPatch, gone: int
) -> None:
    """A file system that keeps no extended attributes: locks work, owners are unknown."""

    def unsupported(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(ownership.os, "setxattr", unsupported)
    locks.acquire(FEATURE, gsd, pid=gone)
    assert attached(lock_file(gsd)) is None
    info = locks.inspect(FEATURE, gsd)
    assert (info.state, info.owner) == ("active", "unknown")
    with pytest.raises(locks.LockHeldError):
        locks.acquire(FEATURE, gsd, reclaim_dead=True)


# --------------------------------------------------------------------------- judging


@pytest.mark.parametrize(
    "elsewhere",
    [{"boot": "00000000-0000-0000-0000-000000000000"}, {"ns": 1}, {"boot": None}, {"ns": None}],
    ids=["other-boot", "other-namespace", "no-boot", "no-namespace"],
)
def test_a_lock_from_another_boot_or_namespace_has_an_unknown_owner(
    gsd: Path, gone: int, elsewhere: dict[str, object]
) -> None:
    """Fails before the fix: the pid was judged here, found dead and the lock reclaimed."""
    path = write_record(gsd, gone)
    attach(path, details_for(gone, **elsewhere))
    info = locks.inspect(FEATURE, gsd)
    assert (info.state, info.owner) == ("active", "unknown")
    with pytest.raises(locks.LockHeldError):
        locks.acquire(FEATURE, gsd, reclaim_dead=True)
    assert not [entry for entry in locks.clean(gsd, reclaim_dead=True) if entry.removed]
    assert path.read_text().startswith(f"{gone}:")


def test_a_lock_without_details_is_valid_and_only_age_frees_it(gsd: Path, gone: int) -> None:
    """An older writer's lock: active, owner unknown, kept by ``--reclaim-dead``, reclaimed once
    stale. Fails before the fix: ``--reclaim-dead`` took it (its pid was judged anyway)."""
    write_record(gsd, gone)
    checked = _utils.check_feature_lock(FEATURE, str(gsd))
    assert checked is not None and checked["pid"] == gone
    assert locks.inspect(FEATURE, gsd).owner == "unknown"
    with pytest.raises(locks.LockHeldError):
        locks.acquire(FEATURE, gsd, reclaim_dead=True)
    write_record(gsd, gone, time.time() - STALE_AFTER_SECONDS - 1)
    assert _utils.acquire_feature_lock(FEATURE, str(gsd))


def test_our_own_dead_owner_is_judged_and_reclaimed(gsd: Path, gone: int) -> None:
    locks.acquire(FEATURE, gsd, pid=gone)
    assert locks.inspect(FEATURE, gsd).owner == "not-running"
    locks.acquire(FEATURE, gsd, reclaim_dead=True)
    assert lock_file(gsd).read_text().startswith(f"{os.getpid()}:")


def test_a_reused_pid_is_told_by_its_exact_start_time(
    gsd: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """The recorded start time differs from the running process's: another process has the
    pid now (its recorded group is gone too), whatever the timestamp says."""
    path = write_record(gsd, sleeper.pid)
    stat = ownership.proc_stat(sleeper.pid)
    assert stat is not None
    attach(path, details_for(sleeper.pid, start=stat.start - 1, pgid=None, sid=None))
    assert locks.inspect(FEATURE, gsd).owner == "pid-reused"
    attach(path, details_for(sleeper.pid))
    assert locks.inspect(FEATURE, gsd).owner == "running"


@pytest.mark.parametrize(
    "raw",
    [b"short", b"\x02" + bytes(40), b"\x01" + bytes(40) + b"h" * 2000],
    ids=["too-short", "other-version", "oversize"],
)
def test_details_that_are_not_ours_are_unknown(gsd: Path, gone: int, raw: bytes) -> None:
    path = write_record(gsd, gone)
    attach(path, raw)
    assert locks.inspect(FEATURE, gsd).owner == "unknown"
