"""Every lock error crosses a process boundary whole (a pool's worker raises it to its parent):
pickled and loaded, it is the same class with the same message and facts."""

from __future__ import annotations

import errno
import pickle
import threading

import pytest

from mahabharatha.backends.base import (
    AlreadyHeldError,
    BackendError,
    HeartbeatStartError,
    LockError,
    LockHeldError,
    LockInfo,
    LockLostError,
    LockTimeoutError,
    NotHeldError,
    NotOwnerError,
    Owner,
    ServerFullError,
    UnsafeLockPathError,
    UnsupportedError,
)
from mahabharatha.pool.claim import NoneFreeError
from mahabharatha.run.runner import WorkLeftError
from mahabharatha.states import State

INFO = LockInfo("feat", State.ACTIVE, 4242, 1.0e9, 3.0, 7197.0, Owner.RUNNING)

ERRORS = [
    LockHeldError(INFO),
    LockTimeoutError(INFO),
    NotOwnerError(INFO),
    AlreadyHeldError(INFO),
    NotHeldError("feat", 4242, "recorded as failed"),
    LockLostError("feat", "the server gave it away", 12.5),
    LockLostError("feat"),
    HeartbeatStartError("feat", "can't start new thread"),
    UnsupportedError("no fencing tokens on files"),
    UnsafeLockPathError(errno.ELOOP, "a symlink is in the way", "/x/.lock"),
    BackendError(errno.ECONNREFUSED, "cannot reach the server"),
    ServerFullError(errno.EAGAIN, "no free slot"),
    NoneFreeError(["a", "b", "c", "d"]),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_a_lock_error_pickles_with_its_message_and_facts(error: LockError) -> None:
    loaded = pickle.loads(pickle.dumps(error))
    assert type(loaded) is type(error)
    assert str(loaded) == str(error)
    facts = ("info", "feature", "pid", "what", "reason", "stop_by", "cause", "errno", "filename")
    for name in (*facts, "busy"):
        assert getattr(loaded, name, None) == getattr(error, name, None), name


def test_work_left_error_pickles_its_facts_and_answers_still_running_in_the_copy() -> None:
    watch = threading.Event()  # stands for the proof's watch: it cannot cross a process
    for error in (WorkLeftError("feat", 3), WorkLeftError("feat", 3, watch.is_set)):
        loaded = pickle.loads(pickle.dumps(error))
        assert type(loaded) is WorkLeftError
        assert (str(loaded), loaded.feature, loaded.status) == (str(error), "feat", 3)
        # Another process cannot see that work end: "still running", as the lock still reads.
        assert loaded.still_running() is True
