"""A reclaim re-judges the lock under the guard, and a look at a changing symlink never raises
(found by an adversarial review; each test failed before its fix)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from mahabharatha.backends.files import folder, lockfile
from mahabharatha.backends.files.lockfile import age_only
from mahabharatha.backends.files.snapshot import LockSnapshot, judge_lock, read_lock
from mahabharatha.commands import _utils
from mahabharatha.states import State
from tests.support.folders import FEATURE, lock_of, one_feature_gsd
from tests.support.marks import needs_symlinks

pytestmark = pytest.mark.timeout(30)
gsd = pytest.fixture(one_feature_gsd, name="gsd")


def test_a_reclaim_never_removes_an_old_writers_fresh_empty_lock_in_the_judged_inode(
    gsd: Path,
) -> None:
    lock = lock_of(gsd)
    lock.write_bytes(b"")
    os.utime(lock, (time.time() - 10,) * 2)  # an old writer died before writing, 10 s ago
    with folder.OpenFeatureDir(gsd, FEATURE, create=False) as dfd:
        assert dfd is not None
        judged = read_lock(dfd)
        assert judge_lock(judged, time.time()) is State.CORRUPT
        # Meanwhile a new old-style writer starts in that very inode (or one reused at once):
        # an empty file, just created. Same inode, same (empty) bytes: only its age differs.
        os.utime(lock, None)
        now = time.time()
        assert judge_lock(read_lock(dfd), now) is State.WRITING

        def reclaimable(entry: LockSnapshot) -> bool:
            return age_only(entry, judge_lock(entry, now))

        with folder.Guard(dfd, wait=True):
            assert not lockfile.remove_if_unchanged(dfd, judged, reclaimable)
    assert lock.exists()


def test_a_reclaim_rejudges_under_the_guard_even_when_the_entry_looks_the_same(gsd: Path) -> None:
    lock = lock_of(gsd)
    lock.write_bytes(b"garbage")
    with folder.OpenFeatureDir(gsd, FEATURE, create=False) as dfd:
        assert dfd is not None
        judged = read_lock(dfd)
        with folder.Guard(dfd, wait=True):
            assert not lockfile.remove_if_unchanged(dfd, judged, lambda _entry: False)
            assert lock.exists()
            assert lockfile.remove_if_unchanged(dfd, judged, lambda _entry: True)
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
