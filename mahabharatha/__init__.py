"""mahabharatha: feature commands and the advisory locks that keep two sessions off one feature.

The Python API (``from mahabharatha import FeatureLock, acquire, LockHeldError``) is imported
on first use, so that a CLI call pays for none of it."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mahabharatha.aio import AsyncFeatureLock
    from mahabharatha.locks import (
        AlreadyHeldError,
        FeatureLock,
        HeartbeatStartError,
        LockError,
        LockHeldError,
        LockInfo,
        LockLostError,
        LockTimeoutError,
        NoneFreeError,
        NotHeldError,
        NotOwnerError,
        StopWork,
        UnsafeLockPathError,
        WorkReport,
        WorkResult,
        acquire,
        claim,
        clean,
        done,
        fail,
        inspect,
        release,
        reopen,
        status,
        work,
    )

    __version__: str

__all__ = [
    "AlreadyHeldError",
    "AsyncFeatureLock",
    "FeatureLock",
    "HeartbeatStartError",
    "LockError",
    "LockHeldError",
    "LockInfo",
    "LockLostError",
    "LockTimeoutError",
    "NoneFreeError",
    "NotHeldError",
    "NotOwnerError",
    "StopWork",
    "UnsafeLockPathError",
    "WorkReport",
    "WorkResult",
    "acquire",
    "claim",
    "clean",
    "done",
    "fail",
    "inspect",
    "release",
    "reopen",
    "status",
    "work",
]


def __getattr__(name: str) -> Any:
    """A name of :data:`__all__` or ``__version__`` (the installed distribution's), read on
    first use and kept."""
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            found: Any = version("mahabharatha")
        except PackageNotFoundError:  # run from a source tree that was never installed
            found = "0+unknown"
    elif name == "AsyncFeatureLock":
        from mahabharatha.aio import AsyncFeatureLock as found
    elif name in __all__:
        from mahabharatha import locks

        found = vars(locks)[name]
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = found
    return found
