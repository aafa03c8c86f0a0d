"""The Python API reads like its peers: stated timeouts, a useful repr, documented errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from mahabharatha import locks


@pytest.mark.parametrize("timeout", [-1, -0.5])
def test_a_negative_timeout_is_refused_not_guessed(tmp_path: Path, timeout: float) -> None:
    """filelock reads -1 as "wait for ever"; we refuse it rather than surprise.
    Fails before the fix: -1 was taken as "try once" without a word."""
    with pytest.raises(ValueError, match="None waits for ever"):
        locks.FeatureLock("feat", tmp_path, timeout=timeout)
    with pytest.raises(ValueError, match="None waits for ever"):
        locks.acquire("feat", tmp_path, timeout=timeout)
    assert not (tmp_path / "specs").exists()


def test_the_repr_names_the_feature_the_folder_the_owner_and_the_state(tmp_path: Path) -> None:
    """Fails before the fix: the default <...FeatureLock object at 0x...>."""
    lock = locks.FeatureLock("feat", tmp_path, pid=4242, heartbeat=None)
    assert repr(lock) == f"<FeatureLock 'feat' in {str(tmp_path)!r} pid=4242 not held>"
    with lock:
        assert repr(lock).endswith("pid=4242 held>")
    assert repr(lock).endswith("not held>")


def test_acquire_release_and_lost_are_documented() -> None:
    """Fails before the fix: acquire had no docstring; release and lost did not say enough."""
    assert "LockHeldError" in (locks.FeatureLock.acquire.__doc__ or "")
    assert "OSError" in (locks.FeatureLock.acquire.__doc__ or "")
    assert "OSError" in (locks.FeatureLock.release.__doc__ or "")
    assert "lost:" in (locks.FeatureLock.__doc__ or "")
