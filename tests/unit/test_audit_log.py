"""The audit log: a FIFO at its path never hangs an operation (failed before its fix)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mahabharatha import locks
from tests.support.folders import FEATURE, lock_of, one_feature_gsd
from tests.support.marks import needs_fifo

pytestmark = pytest.mark.timeout(30)
gsd = pytest.fixture(one_feature_gsd, name="gsd")


@needs_fifo
def test_a_fifo_at_the_audit_log_never_hangs_a_clean_or_a_reclaim(gsd: Path) -> None:
    os.mkfifo(gsd / locks.AUDIT_LOG_NAME)
    lock_of(gsd).write_text("5:1000")  # stale: cleaning it writes an audit line
    assert [e.state for e in locks.clean(gsd)] == ["stale"]
    lock_of(gsd).write_text("5:1000")
    locks.acquire(FEATURE, gsd, pid=7)  # reclaims: writes an audit line
    assert lock_of(gsd).read_text().startswith("7:")
