"""The OLD lock design (check-then-create, release by name), kept only as a foil for race tests.

This is the module the hardening replaces, reproduced faithfully so that the multi-process tests
in ``tests/concurrency`` can show they detect the races it has:

- ``acquire_feature_lock`` reads the lock, and when it judges it stale, corrupt or unreadable it
  removes it *by name*, then creates a new one with ``os.open(O_CREAT | O_EXCL)``, writes the
  record into it and closes it. Two reclaimers that both judged the same stale lock can each win
  (the second one unlinks the first one's fresh lock), and between ``os.open`` and ``os.write``
  every reader sees an empty lock, which it judges corrupt and reclaims.
- ``release_feature_lock`` reads the lock, checks the pid and removes it *by name*: a reclaimer
  that replaced the lock between the read and the unlink loses its fresh lock.

The same function signatures as the legacy API of ``mahabharatha.commands._utils``. Never import
this from the package: it is test support only.

``HOOKS`` lets a test widen a race window of this design, and of this design only (the new code
never gets such help): each hook named below, when set, is called at that point of the old
algorithm. Tests install a barrier there so that every racer has read the lock before any of them
acts on what it read, which turns "can break" into "breaks in almost every trial".

- ``"acquire_after_read"``: in ``acquire_feature_lock``, after the lock was read and before the
  verdict is acted on (called whatever was read, so a barrier there never strands a racer);
- ``"acquire_after_create"``: after ``os.open(O_CREAT | O_EXCL)`` and before the record is written;
- ``"release_after_read"``: in ``release_feature_lock``, after the read and before the unlink.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

__all__ = [
    "HOOKS",
    "acquire_feature_lock",
    "check_feature_lock",
    "release_feature_lock",
]

STALE_AFTER_SECONDS: Final = 7200
"""Two hours, as in the legacy module."""

MAX_PID: Final = 4_194_304
"""Linux kernel max PID."""

HOOKS: dict[str, Callable[[], None]] = {}
"""Race-window hooks for tests; see the module docstring. Empty: the plain old algorithm."""

_FEATURE_NAME_RE: Final = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]*$")


def _hook(point: str) -> None:
    hook = HOOKS.get(point)
    if hook is not None:
        hook()


def _validate_feature_name(feature: str) -> None:
    """Raise ValueError if feature name contains path traversal characters."""
    if not feature or ".." in feature or "/" in feature or "\\" in feature:
        raise ValueError(f"Invalid feature name: {feature!r}")
    if not _FEATURE_NAME_RE.match(feature):
        raise ValueError(f"Invalid feature name: {feature!r}")


def _safe_read_text(path: Path) -> str | None:
    """Read text from path, returning None on any OS/encoding error."""
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _parse_lock_content(content: str) -> tuple[int, float] | None:
    """Parse 'pid:timestamp' lock content with bounds checking."""
    try:
        pid_str, ts_str = content.split(":", 1)
        pid = int(pid_str)
        ts = float(ts_str)
    except (ValueError, TypeError):
        return None
    if pid < 1 or pid > MAX_PID:
        return None
    if ts <= 0 or ts > time.time() + 86400:
        return None
    return (pid, ts)


def _lock_path(feature: str, gsd_dir: str) -> Path:
    return Path(gsd_dir) / "specs" / feature / ".lock"


def acquire_feature_lock(feature: str, gsd_dir: str = ".gsd") -> bool:
    """Old acquire: read, remove a stale/corrupt lock by name, O_EXCL create."""
    _validate_feature_name(feature)
    lock_path = _lock_path(feature, gsd_dir)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    if lock_path.exists():
        content = _safe_read_text(lock_path)
        _hook("acquire_after_read")
        parsed = _parse_lock_content(content) if content is not None else None
        if parsed is not None:
            _pid, lock_time = parsed
            if time.time() - lock_time <= STALE_AFTER_SECONDS:
                return False
        # Stale, corrupt or unreadable: remove it (by name -- the race this design has).
        lock_path.unlink(missing_ok=True)
    else:
        _hook("acquire_after_read")
    try:
        fd = os.open(str(lock_path), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    try:
        _hook("acquire_after_create")
        os.write(fd, f"{os.getpid()}:{time.time()}".encode())
    finally:
        os.close(fd)
    return True


def release_feature_lock(feature: str, gsd_dir: str = ".gsd") -> None:
    """Old release: unlink by name when owned, or when unreadable/corrupt."""
    _validate_feature_name(feature)
    lock_path = _lock_path(feature, gsd_dir)
    if not lock_path.exists():
        return
    content = _safe_read_text(lock_path)
    _hook("release_after_read")
    parsed = _parse_lock_content(content) if content is not None else None
    if parsed is None or parsed[0] == os.getpid():
        lock_path.unlink(missing_ok=True)


def check_feature_lock(feature: str, gsd_dir: str = ".gsd") -> dict[str, Any] | None:
    """Old check: the active lock's pid, timestamp and age, else None."""
    _validate_feature_name(feature)
    lock_path = _lock_path(feature, gsd_dir)
    if not lock_path.exists():
        return None
    content = _safe_read_text(lock_path)
    if not content:
        return None
    parsed = _parse_lock_content(content)
    if parsed is None:
        return None
    pid, ts = parsed
    age = time.time() - ts
    if age > STALE_AFTER_SECONDS:
        return None
    return {"pid": pid, "timestamp": ts, "age_seconds": age}
