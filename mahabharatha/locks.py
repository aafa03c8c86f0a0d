"""The lock layer's public names over any backend (``backend=``: one, or a server's URL; default
``MAHABHARATHA_LOCK_URL``'s, else ``gsd_dir``'s folders). Errors derive from :class:`LockError`;
OS trouble stays an :class:`OSError`."""

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
from mahabharatha.backends.liveness import owner_liveness
from mahabharatha.constants import (
    AUDIT_LOG_NAME,
    COMPLETED_MARKER_NAME,
    CREATE_TIME_SLACK_SECONDS,
    HEARTBEAT_SECONDS,
)
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
    """``AsyncFeatureLock``, imported on first use (asyncio stays out of the CLI's cold start)."""
    if name == "AsyncFeatureLock":
        from mahabharatha.aio import AsyncFeatureLock

        return AsyncFeatureLock
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
