"""The legacy face: the contract's feature-lock functions and feature detection.

``acquire_feature_lock``, ``release_feature_lock`` and ``check_feature_lock`` keep the
contract's signatures and answers (bools, ``None``, ``ValueError``); ``detect_feature`` finds the
feature being worked on. The lock protocol itself (publish, judge, reclaim, release, refresh)
is :mod:`mahabharatha.lockfile`, which reads no clock: each function here reads
``time.time()`` of this module once and passes it down, and :func:`now` is the clock of the lock
layer too (tests replace ``time`` here, the contract's one clock seam).

The protocol's names are re-exported here for the callers that know them by this module.
"""

from __future__ import annotations

import io
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path, PosixPath
from typing import Final

from mahabharatha import proof
from mahabharatha.constants import GSD_DIR, STATE_DIR
from mahabharatha.lockfile import (
    LOCK_FILE_NAME,
    MAX_PID,
    MAX_READ_BYTES,
    MISSING,
    NOFOLLOW_READ,
    STALE_AFTER_SECONDS,
    AcquireOutcome,
    EntryKind,
    Guard,
    GuardBusyError,
    LockSnapshot,
    LockState,
    OpenFeatureDir,
    age_only,
    busy_error,
    close_quietly,
    feature_dir_path,
    folder_path,
    format_record,
    is_temp_name,
    is_valid_feature_name,
    judge_lock,
    named_error,
    parse_record,
    read_bounded,
    read_lock,
    release_at,
    shown_name,
    try_acquire,
    validate_feature_name,
)

__all__ = [
    "CURRENT_FEATURE_FILE",
    "FEATURE_ENV_VAR",
    "LOCK_FILE_NAME",
    "MAX_PID",
    "MAX_READ_BYTES",
    "STALE_AFTER_SECONDS",
    "AcquireOutcome",
    "EntryKind",
    "Guard",
    "GuardBusyError",
    "LockSnapshot",
    "LockState",
    "OpenFeatureDir",
    "acquire_feature_lock",
    "age_only",
    "check_feature_lock",
    "detect_feature",
    "feature_dir_path",
    "format_record",
    "is_temp_name",
    "is_valid_feature_name",
    "judge_lock",
    "now",
    "read_lock",
    "release_at",
    "release_feature_lock",
    "try_acquire",
]

CURRENT_FEATURE_FILE: Final = ".current-feature"
FEATURE_ENV_VAR: Final = "MAHABHARATHA_FEATURE"

_validate_feature_name = validate_feature_name  # the contract tests' name for it
_shown_name = shown_name


# --------------------------------------------------------------------------- the clock


def now() -> float:
    """The clock of every lock decision (``time.time()`` of this module, which tests replace)."""
    return float(time.time())


def _parse_lock_content(content: str) -> tuple[int, float] | None:
    """Parse ``pid:timestamp``; ``None`` unless well formed and within bounds (by this
    module's clock)."""
    if not isinstance(content, str):
        return None
    return parse_record(content, time.time())


# --------------------------------------------------------------------------- bounded reads


def _read_small_regular_file(path: Path) -> bytes | None:
    """The bytes of ``path`` itself (not a link's target) if it is a regular file of at most
    ``MAX_READ_BYTES``, read through the very descriptor that was checked; else ``None``."""
    fd = os.open(path, NOFOLLOW_READ)  # no-follow, non-blocking: a link or FIFO cannot fool us
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_READ_BYTES:
            return None
        # Race: the entry may be swapped for a FIFO or a link right now, or the file may grow;
        # we read this descriptor, never the name again, and at most one byte too many.
        data = read_bounded(fd, info.st_size)
    finally:
        close_quietly(fd)
    return None if len(data) > MAX_READ_BYTES else data


class _CheckedFile(PosixPath):
    """``path`` as ``Path.read_text`` sees it, its ``open`` serving the bytes already read
    through the checked descriptor: the decoding (and any test that patches ``read_text``)
    goes through ``Path.read_text`` as the old module did, while the name is never re-opened."""

    _data: bytes

    def open(  # type: ignore[override]  # (text mode only: all read_text asks for)
        self,
        mode: str = "r",
        buffering: int = -1,
        encoding: str | None = None,
        errors: str | None = None,
        newline: str | None = None,
    ) -> io.TextIOWrapper:
        raw = io.BytesIO(self._data)
        return io.TextIOWrapper(raw, encoding=encoding, errors=errors, newline=newline)


def _safe_read_text(path: Path) -> str | None:
    """Stripped text of a small regular file, or ``None`` when it cannot or should not be read.

    Links, FIFOs, devices, folders and files over ``MAX_READ_BYTES`` are refused through one
    no-follow, non-blocking descriptor, and what is read is read through that descriptor
    (bounded), whatever another process does to the name meanwhile; ``Path.read_text`` then
    decodes it, as the existing callers and tests expect. Lock files are never read this way.
    """
    try:
        data = _read_small_regular_file(Path(path))
        if data is None:
            return None
        checked = _CheckedFile(path)
        checked._data = data
        return checked.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None


# --------------------------------------------------------------------------- feature detection


def _feature_from_env() -> str | None:
    return os.environ.get(FEATURE_ENV_VAR, "").strip() or None


def _feature_from_marker(gsd_dir: str = GSD_DIR) -> str | None:
    return _safe_read_text(Path(gsd_dir) / CURRENT_FEATURE_FILE)


def _feature_from_state_files() -> str | None:
    """Stem of the newest ``*.json`` state file with a valid name; files may vanish meanwhile."""
    newest: tuple[float, str] | None = None
    try:
        candidates = list(Path(STATE_DIR).glob("*.json"))
    except OSError:
        return None
    for candidate in candidates:
        if not is_valid_feature_name(candidate.stem):
            continue
        try:
            mtime = candidate.stat().st_mtime
        except OSError:  # removed between the listing and the stat: skip it
            continue
        if newest is None or mtime > newest[0]:
            newest = (mtime, candidate.stem)
    return newest[1] if newest else None


def detect_feature(gsd_dir: str = GSD_DIR) -> str | None:
    """The feature being worked on: env var, then ``.current-feature``, then newest state file.

    A source that cannot be read, or that names an invalid feature, is skipped.
    """
    sources: tuple[Callable[[], str | None], ...] = (
        _feature_from_env,
        lambda: _feature_from_marker(gsd_dir),
        _feature_from_state_files,
    )
    for source in sources:
        name = source()
        if name and is_valid_feature_name(name):
            return name
    return None


# --------------------------------------------------------------------------- the legacy functions


def _lock_server() -> str | None:
    """The lock server ``MAHABHARATHA_LOCK_URL`` names: then the legacy functions answer from
    it (``mahabharatha.backends.legacy_server``, imported only then), never from files."""
    return os.environ.get("MAHABHARATHA_LOCK_URL") or None


def acquire_feature_lock(feature: str, gsd_dir: str = GSD_DIR) -> bool:
    """Claim ``feature`` for this process. False when someone else holds it (or just won it)."""
    _validate_feature_name(feature)
    if (server := _lock_server()) is not None:
        from mahabharatha.backends import legacy_server

        return legacy_server.acquire_feature_lock(server, feature, gsd_dir)
    try:
        with OpenFeatureDir(gsd_dir, feature, create=True) as dfd:
            assert dfd is not None
            # A descriptor of the folder holds our proof of life while we hold the lock.
            pledge = proof.Pledge(dfd, True, folder_path(gsd_dir, feature))
            with pledge as proven:
                won = try_acquire(dfd, os.getpid(), time.time(), pledge=proven).acquired
                if won:
                    pledge.keep()
            return won
    except FileExistsError:
        return False  # Race: another process created the name first.


def release_feature_lock(feature: str, gsd_dir: str = GSD_DIR) -> None:
    """Remove this process's lock on ``feature`` (and a corrupt one); leave anyone else's."""
    _validate_feature_name(feature)
    if (server := _lock_server()) is not None:
        from mahabharatha.backends import legacy_server

        return legacy_server.release_feature_lock(server, feature, gsd_dir)
    with OpenFeatureDir(gsd_dir, feature, create=False) as dfd:
        if dfd is not None:
            release_at(dfd, os.getpid(), time.time())
            # Ours or not, this process holds the lock no more.
            proof.forget(dfd, folder_path(gsd_dir, feature))


def check_feature_lock(feature: str, gsd_dir: str = GSD_DIR) -> dict[str, float | int] | None:
    """``{"pid", "timestamp", "age_seconds"}`` of an active lock on ``feature``, else ``None``."""
    _validate_feature_name(feature)
    if (server := _lock_server()) is not None:
        from mahabharatha.backends import legacy_server

        return legacy_server.check_feature_lock(server, feature, gsd_dir)
    try:
        with OpenFeatureDir(gsd_dir, feature, create=False) as dfd:
            snapshot = MISSING if dfd is None else read_lock(dfd)
    except PermissionError:
        return None
    now = time.time()
    state = judge_lock(snapshot, now)
    record = snapshot.record_at(now)
    if state is LockState.BUSY:
        # Not free, and whose it is cannot be told: an error, never None (which says "free").
        raise named_error(busy_error(snapshot), folder_path(gsd_dir, feature))
    if state is not LockState.ACTIVE or record is None:
        return None
    pid, timestamp = record
    return {"pid": pid, "timestamp": timestamp, "age_seconds": max(0.0, now - timestamp)}
