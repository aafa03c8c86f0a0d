"""The lost-lock rule runs on a monotonic clock (issue 17 item 5): a wall-clock step back during
a partition never keeps a holder believing in a lease the server has let run out."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from mahabharatha import locks
from mahabharatha.backends.base import BackendError, Requester
from mahabharatha.commands import _utils
from tests.support.postgres import wait_until

LEASE_SECONDS = 2.0
LOST_WITHIN_SECONDS = LEASE_SECONDS + 3.0
"""A bound on the wait for the loss (the lease, then a few heartbeat retries), never a time
asserted: the old rule never reported it."""
STEP_BACK_SECONDS = 60.0


def test_a_wall_clock_step_back_during_a_partition_does_not_extend_the_lease(
    make_backend: Callable[..., Any], monkeypatch: Any
) -> None:
    """The server becomes unreachable (every refresh fails) and the wall clock steps back 60 s.
    Failed before: the rule compared ``time.time()`` with the expiry, so the holder believed in
    its lock 60 s past its lease (``lock run``'s CMD ran on beside the next holder)."""
    backend = make_backend()
    told = threading.Event()
    holder = locks.FeatureLock(
        "feat", timeout=0, backend=backend, lease=LEASE_SECONDS, on_lost=lambda _e: told.set()
    )
    holder.acquire()
    try:
        assert holder.held

        def partitioned(_held: Any) -> Any:
            raise BackendError("lock server (PostgreSQL): no answer within 5 s")

        real_now = _utils.now
        monkeypatch.setattr(backend, "refresh", partitioned)
        monkeypatch.setattr(_utils, "now", lambda: real_now() - STEP_BACK_SECONDS)
        assert told.wait(LOST_WITHIN_SECONDS), "the lease ran out and the holder was never told"
        assert holder.lost is not None
        # Told by the cut-off before the lease's end (issue 27), or by a failed refresh after.
        assert any(why in holder.lost.reason for why in ("turned stale", "no refresh got"))
        assert not holder.held
        # Truly free once the server's lease ends (the cut-off tells the holder before it).
        assert wait_until(
            lambda: backend.try_acquire("feat", Requester(1)).held is not None,
            LOST_WITHIN_SECONDS,
        )
    finally:
        monkeypatch.undo()
        holder.release()
