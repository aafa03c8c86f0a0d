"""Feature locks for long-lived holders, waiters, worker pools and maintenance.

This layer talks to a :class:`~mahabharatha.backends.base.LockBackend` only (default: the folder
backend of ``gsd_dir``, :mod:`mahabharatha.backends.files.backend`) and adds what is the same for
every backend: an explicit owner pid (a CLI process records the shell that called it), waiting with
backoff, a heartbeat that keeps a long-held lock fresh, signals held back while a lock is being
published, and ``claim`` over many features. Every public function takes ``backend=`` (a
:class:`LockBackend`, or a lock server's URL); without one, it uses the server
``MAHABHARATHA_LOCK_URL`` names, else the folder backend of ``gsd_dir`` (every entry point uses
the same backend as the CLI: never files beside a server, two holders).

Typical use::

    with FeatureLock("auth-flow", timeout=30):
        ...  # exclusive work; the lock is refreshed in the background

Errors derive from :class:`LockError`; OS trouble (permissions, a directory or a symlinked
folder in the way) stays an :class:`OSError`.

This module is the lock layer's public names; the code lives in :mod:`mahabharatha.functional`
(the calls), :mod:`mahabharatha.feature_lock` (``FeatureLock``, the heartbeat),
:mod:`mahabharatha.pool.claim` (the claim engine) and :mod:`mahabharatha.pool.work` (the worker
loop).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mahabharatha.backends.base import (
    DEFAULT_ATTEMPTS,
    AlreadyHeldError,
    Attempts,
    CleanedEntry,
    FeatureProblem,
    HeartbeatStartError,
    Held,
    LockBackend,
    LockError,
    LockHeldError,
    LockInfo,
    LockLostError,
    LockTimeoutError,
    NotHeldError,
    NotOwnerError,
    Owner,
    UnsafeLockPathError,
    owner_is_gone,
)
from mahabharatha.backends.liveness import CREATE_TIME_SLACK_SECONDS, owner_liveness
from mahabharatha.constants import AUDIT_LOG_NAME, COMPLETED_MARKER_NAME, HEARTBEAT_SECONDS
from mahabharatha.feature_lock import FeatureLock
from mahabharatha.functional import (
    WaitCallback,
    acquire,
    attempts_of,
    clean,
    done,
    fail,
    inspect,
    is_done,
    release,
    reopen,
    reopen_finished,
    status,
    survey,
)
from mahabharatha.pool.claim import ClaimOutcome, NoneFreeError, claim, claim_held, claim_next
from mahabharatha.pool.work import PoolLock, StopWork, WorkReport, WorkResult, run_pool, work

if TYPE_CHECKING:
    from mahabharatha.aio import AsyncFeatureLock

__all__ = [
    "AUDIT_LOG_NAME",
    "COMPLETED_MARKER_NAME",
    "CREATE_TIME_SLACK_SECONDS",
    "DEFAULT_ATTEMPTS",
    "HEARTBEAT_SECONDS",
    "AlreadyHeldError",
    "AsyncFeatureLock",
    "Attempts",
    "ClaimOutcome",
    "CleanedEntry",
    "FeatureLock",
    "FeatureProblem",
    "HeartbeatStartError",
    "Held",
    "LockBackend",
    "LockError",
    "LockHeldError",
    "LockInfo",
    "LockLostError",
    "LockTimeoutError",
    "NoneFreeError",
    "NotHeldError",
    "NotOwnerError",
    "Owner",
    "PoolLock",
    "StopWork",
    "UnsafeLockPathError",
    "WaitCallback",
    "WorkReport",
    "WorkResult",
    "acquire",
    "attempts_of",
    "claim",
    "claim_held",
    "claim_next",
    "clean",
    "done",
    "fail",
    "inspect",
    "is_done",
    "owner_is_gone",
    "owner_liveness",
    "release",
    "reopen",
    "reopen_finished",
    "run_pool",
    "status",
    "survey",
    "work",
]


def __getattr__(name: str) -> Any:
    """``AsyncFeatureLock`` (:mod:`mahabharatha.aio`), imported on first use: asyncio stays out
    of every CLI call's cold start."""
    if name == "AsyncFeatureLock":
        from mahabharatha.aio import AsyncFeatureLock

        return AsyncFeatureLock
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
