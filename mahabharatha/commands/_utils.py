"""The legacy face: the contract's lock functions and feature detection, over the ``.lock``
protocol, or the server ``MAHABHARATHA_LOCK_URL`` names. The contract's clock seam: replacing
``time`` (or ``now``) here replaces :mod:`mahabharatha.clock`'s, which every layer reads."""

from __future__ import annotations

import contextlib
import os
import sys
import time
import types
from typing import Any

from mahabharatha import clock, detect
from mahabharatha.backends import lock_url, shared_backend
from mahabharatha.backends.base import NotOwnerError, Requester
from mahabharatha.backends.files.folder import OpenFeatureDir, folder_path, named_error
from mahabharatha.backends.files.lockfile import publish_or_reclaim, release_at
from mahabharatha.backends.files.snapshot import (
    MISSING,
    busy_error,
    judge_lock,
    parse_record,
    read_lock,
)
from mahabharatha.clock import now
from mahabharatha.constants import GSD_DIR
from mahabharatha.constants import STALE_AFTER_SECONDS as STALE_AFTER_SECONDS  # the old module's
from mahabharatha.detect import detect_feature
from mahabharatha.names import MAX_PID as MAX_PID  # the old module's limit, importable here still
from mahabharatha.names import validate_feature_name
from mahabharatha.owner import ownership, proof
from mahabharatha.states import State

# The contract's public names, and the clock its tests replace (``now``, as ``time``).
__all__ = [
    "acquire_feature_lock",
    "check_feature_lock",
    "detect_feature",
    "now",
    "release_feature_lock",
]

# The contract's names (the modules above have their homes).
_validate_feature_name = validate_feature_name
_safe_read_text = detect.safe_read_text


class _ClockSeam(types.ModuleType):
    """This module's type: setting ``time`` or ``now`` on it sets them on the clock too."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("time", "now"):  # replaced here: replaced in mahabharatha.clock
            setattr(clock, name, value)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _ClockSeam


def _parse_lock_content(content: str) -> tuple[int, float] | None:
    """Parse ``pid:timestamp``; ``None`` unless well formed and within bounds."""
    if not isinstance(content, str):
        return None
    return parse_record(content, time.time())


def acquire_feature_lock(feature: str, gsd_dir: str = GSD_DIR) -> bool:
    """Claim ``feature`` for this process. False when someone else holds it (or just won it;
    on a server, this process too: not reentrant)."""
    _validate_feature_name(feature)
    if (server := lock_url()) is not None:
        me = os.getpid()
        requester = Requester(me, ownership.details_of(me))
        return shared_backend(server, gsd_dir).try_acquire(feature, requester).held is not None
    try:
        opened = OpenFeatureDir(gsd_dir, feature, create=True)
        with opened as dfd:
            assert dfd is not None
            # A descriptor of the folder holds our proof of life while we hold the lock.
            with proof.Pledge(dfd, True, opened.folder) as pledge:
                return publish_or_reclaim(dfd, os.getpid(), time.time(), pledge=pledge).acquired
    except FileExistsError:
        return False  # Race: another process created the name first.


def release_feature_lock(feature: str, gsd_dir: str = GSD_DIR) -> None:
    """Remove this process's lock on ``feature`` (and a corrupt one); leave anyone else's."""
    _validate_feature_name(feature)
    if (server := lock_url()) is not None:
        with contextlib.suppress(NotOwnerError):  # another owner's lock is left as it is
            shared_backend(server, gsd_dir).release(feature, os.getpid())
        return
    opened = OpenFeatureDir(gsd_dir, feature, create=False)
    with opened as dfd:
        if dfd is not None:
            release_at(dfd, os.getpid(), time.time())
            # Ours or not, this process holds the lock no more.
            proof.forget(dfd, opened.folder)


def check_feature_lock(feature: str, gsd_dir: str = GSD_DIR) -> dict[str, float | int] | None:
    """``{"pid", "timestamp", "age_seconds"}`` of an active lock on ``feature``, else ``None``
    (on a server: the age by the server's clock, the timestamp on this host's)."""
    _validate_feature_name(feature)
    if (server := lock_url()) is not None:
        info = shared_backend(server, gsd_dir).inspect(feature)
        if info.state is not State.ACTIVE or info.pid is None or info.age_seconds is None:
            return None
        age = max(0.0, info.age_seconds)
        return {"pid": info.pid, "timestamp": time.time() - age, "age_seconds": age}
    try:
        with OpenFeatureDir(gsd_dir, feature, create=False) as dfd:
            snapshot = MISSING if dfd is None else read_lock(dfd)
    except PermissionError:
        return None
    now = time.time()
    state = judge_lock(snapshot, now)
    record = snapshot.record_at(now)
    if state is State.BUSY:
        # Not free, and whose it is cannot be told: an error, never None (which says "free").
        raise named_error(busy_error(snapshot), folder_path(gsd_dir, feature))
    if state is not State.ACTIVE or record is None:
        return None
    pid, timestamp = record
    return {"pid": pid, "timestamp": timestamp, "age_seconds": max(0.0, now - timestamp)}
