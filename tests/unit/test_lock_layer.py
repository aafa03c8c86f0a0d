"""The lock layer's promises that the CLI tests do not reach: lock modes across users, temp files
swept under a writer, expiry of a holder that cannot refresh, heartbeat failures."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from mahabharatha import locks
from mahabharatha.backends.files import lockfile
from mahabharatha.commands import _utils
from mahabharatha.commands._utils import acquire_feature_lock
from mahabharatha.constants import STALE_AFTER_SECONDS
from mahabharatha.owner import proof
from tests.support.marks import needs_root

pytestmark = pytest.mark.timeout(30)
NOBODY = 65534


@pytest.fixture
def gsd(tmp_path: Path) -> str:
    return str(tmp_path / "gsd")


@pytest.fixture
def private_umask() -> Iterator[None]:
    previous = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.fixture(params=[True, False], ids=["unnamed-temp", "named-temp"])
def publish_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    if request.param and not lockfile.TMPFILE.usable:
        pytest.skip("no O_TMPFILE here")
    monkeypatch.setattr(lockfile.TMPFILE, "usable", request.param)
    return bool(request.param)


def lock_file(gsd: str, feature: str = "feat") -> Path:
    return Path(gsd) / "specs" / feature / ".lock"


def test_a_lock_written_under_a_private_umask_is_readable_by_everyone(
    gsd: str, private_umask: None, publish_path: bool
) -> None:
    assert acquire_feature_lock("feat", gsd)
    assert stat.S_IMODE(lock_file(gsd).stat().st_mode) == lockfile.LOCK_MODE


def test_a_refreshed_lock_stays_readable_by_everyone(gsd: str, private_umask: None) -> None:
    with locks.FeatureLock("feat", gsd, timeout=0, heartbeat=None) as held:
        held.refresh()
        assert stat.S_IMODE(lock_file(gsd).stat().st_mode) == lockfile.LOCK_MODE


def _acquire_as_nobody(gsd: str) -> int:
    """Fork, become uid 65534, try to acquire; the exit status is the answer (0 acquired)."""
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os._exit(0 if acquire_feature_lock("feat", gsd) else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status)


@needs_root
def test_another_user_cannot_take_a_live_lock_written_under_a_private_umask(
    private_umask: None,
) -> None:
    # Race: cross-user reclaim. A lock the umask made private would look unreadable to the
    # other user, and unreadable locks are reclaimed.
    with tempfile.TemporaryDirectory() as shared:
        os.chmod(shared, 0o755)
        gsd = os.path.join(shared, "gsd")
        folder = Path(gsd) / "specs" / "feat"
        folder.mkdir(parents=True)
        for path in (Path(gsd), folder.parent, folder):
            path.chmod(0o777)
        assert acquire_feature_lock("feat", gsd)
        mine = lock_file(gsd).read_bytes()
        assert _acquire_as_nobody(gsd) == 1
        assert lock_file(gsd).read_bytes() == mine


def test_a_temp_swept_before_it_is_linked_is_written_again(
    gsd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lockfile.TMPFILE, "usable", False)
    real_link = os.link
    swept: list[str] = []

    def link_after_a_sweeper(src: Any, dst: Any, **kwargs: Any) -> None:
        if not swept:  # the first temp vanishes under us, as a sweeper would remove it
            os.unlink(src, dir_fd=kwargs["src_dir_fd"])
            swept.append(src)
        real_link(src, dst, **kwargs)

    monkeypatch.setattr(_utils.os, "link", link_after_a_sweeper)
    assert acquire_feature_lock("feat", gsd)
    assert swept
    # Nothing else: no temp left; only the lock and our proof file (made once, reused).
    assert sorted(os.listdir(lock_file(gsd).parent)) == [".lock", proof.proof_name(os.getuid())]


def test_a_holder_that_stops_refreshing_is_no_longer_held_once_stale(
    gsd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = mock.Mock()
    clock.time.return_value = 1_800_000_000.0
    monkeypatch.setattr(_utils, "time", clock)
    holder = locks.FeatureLock("feat", gsd, timeout=0, heartbeat=None).acquire()
    assert holder.held
    assert holder.expires_at == 1_800_000_000.0 + STALE_AFTER_SECONDS
    clock.time.return_value += STALE_AFTER_SECONDS
    assert holder.held  # exactly at the limit: still active
    clock.time.return_value += 0.5
    assert not holder.held
    assert locks.acquire("feat", gsd, pid=1)  # rightly reclaimed by someone else
    with pytest.raises(locks.LockLostError):
        holder.refresh()


def test_a_failing_heartbeat_is_reported_and_retried(
    gsd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_replace = lockfile.replace_if_unchanged
    calls: list[int] = []
    recovered = threading.Event()

    def full_disk_once(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        result = real_replace(*args)
        recovered.set()
        return result

    monkeypatch.setattr(lockfile, "replace_if_unchanged", full_disk_once)
    with locks.FeatureLock("feat", gsd, timeout=0, heartbeat=0.02) as holder:
        assert recovered.wait(10)
        assert holder.held
        assert holder.lost is None
    assert len(calls) >= 2
    assert not lock_file(gsd).exists()
