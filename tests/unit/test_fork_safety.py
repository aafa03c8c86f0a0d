"""A child forked from a holder never releases or refreshes its parent's lock (failed before
its fix)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mahabharatha import locks
from tests.support.folders import FEATURE, lock_of, one_feature_gsd

pytestmark = pytest.mark.timeout(30)
gsd = pytest.fixture(one_feature_gsd, name="gsd")


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
