"""The legacy functions' answers from a lock server (``MAHABHARATHA_LOCK_URL`` set), so that no
entry point uses files while another uses the server. Same contract; an unreachable server is
an ``OSError``, as a disk error is on files; the lease is 2 hours, as a file lock's.
"""

from __future__ import annotations

import os
import time

from mahabharatha.backends import shared_backend
from mahabharatha.backends.base import NotOwnerError, Requester
from mahabharatha.owner import ownership
from mahabharatha.states import State


def acquire_feature_lock(url: str, feature: str, gsd_dir: str) -> bool:
    """True when this process now holds ``feature`` on the server; False when someone (this
    process too: not reentrant) holds it."""
    me = os.getpid()
    won = shared_backend(url, gsd_dir).try_acquire(feature, Requester(me, ownership.details_of(me)))
    return won.held is not None


def release_feature_lock(url: str, feature: str, gsd_dir: str) -> None:
    """Release this process's lock on ``feature``; another owner's is left as it is."""
    try:
        shared_backend(url, gsd_dir).release(feature, os.getpid())
    except NotOwnerError:
        return


def check_feature_lock(url: str, feature: str, gsd_dir: str) -> dict[str, float | int] | None:
    """``{"pid", "timestamp", "age_seconds"}`` of an active lock (the timestamp on this host's
    clock, the age by the server's), else None."""
    info = shared_backend(url, gsd_dir).inspect(feature)
    if info.state is not State.ACTIVE or info.pid is None or info.age_seconds is None:
        return None
    age = max(0.0, info.age_seconds)
    return {"pid": info.pid, "timestamp": time.time() - age, "age_seconds": age}
