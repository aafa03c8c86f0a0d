"""Waiting for a release on a PostgreSQL server, blocking: LISTEN for the schema's wake-ups
(on the claims' connection where it can), or poll behind a pooler or on a crowded server."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from functools import cached_property
from typing import Final

import psycopg

from mahabharatha.backends.postgres import statements
from mahabharatha.backends.postgres.session import Session, _Connection
from mahabharatha.constants import RECHECK_SECONDS, SLOTS_LOOK_SECONDS, WAKE_UP_INTERVAL_SECONDS

NOTIFY_CHANNEL: Final = "mahabharatha_release"  # the default schema's wake-ups (no payload)


class ReleaseWaits(Session):
    """A :class:`PostgresBackend`'s blocking waits for a release."""

    _behind_pooler = False  # seen by the listener's set-up: waiters poll, never LISTEN
    _woken = -math.inf  # when a wait last ended woken (monotonic): one per interval

    @cached_property
    def channel(self) -> str:
        """The schema's wake-up channel: one team's releases never wake another's waiters (cut
        to PostgreSQL's 63-byte names)."""
        return f"{self.schema[:55]}_release"

    def release_watch(self, features: Iterable[str]) -> _Listening:
        """LISTEN while a pool waits; no listening connection kept once it ends."""
        return _Listening(self)

    def wait_for_release(self, feature: str | None, timeout: float) -> bool:
        """Any release (one channel for all); True too on the first call (it only starts
        listening) and after ``timeout`` when the listener failed (a later call listens anew)."""
        deadline = time.monotonic() + max(0.0, timeout)
        if self.crowded(SLOTS_LOOK_SECONDS):
            # Asked at each look: a listening connection takes a slot a worker needs to record
            # its done. Race: a waiter listening on a connection of its own, never asking,
            # kept two slots until the holder's lease ran out.
            self.close()
        if self._behind_pooler or self._slots_scarce:
            # A pooler's LISTEN would hand releases to whichever client gets its server
            # connection next; a crowded server has no slot to spare. Poll, once per wait.
            time.sleep(max(0.0, deadline - time.monotonic()))
            return False
        try:
            if self._listener is not None and not self._listener.closed:
                return self._heard(self._listener, deadline)
            self._listener = self._connect("mahabharatha-wait")
            if self._listener.pooled:
                self._behind_pooler = True
                self._drop_listener()
            else:
                self._listener.execute(statements.listen(verb="LISTEN", channel=self.channel))
            return True  # it only started listening: look again
        except psycopg.Error:
            # Race: the listener died between two tries, so a release may not have been heard:
            # look again, no sooner than a wait would have (no busy loop while it fails).
            self._drop_listener()
            time.sleep(max(0.0, deadline - time.monotonic()))
            return True

    def _heard(self, conn: _Connection, deadline: float) -> bool:
        """Did a wake-up (a hint) come on ``conn`` before ``deadline``? At most one wait ends
        per ``WAKE_UP_INTERVAL_SECONDS``: one heard sooner ends it only then."""
        for _note in conn.notifies(timeout=max(0.0, deadline - time.monotonic())):
            break
        else:
            return False
        # Race: a flood of wake-ups (anyone who may connect can NOTIFY the channel): each one read,
        # so none piles up, and none looked at before the interval is over.
        until = min(deadline, self._woken + WAKE_UP_INTERVAL_SECONDS)
        while (left := until - time.monotonic()) > 0:
            for _note in conn.notifies(timeout=left):
                pass
        self._woken = time.monotonic()
        return True


class _Listening:
    """The server's :class:`~mahabharatha.backends.base.ReleaseWatch`: LISTEN on the claims'
    connection (no second one) where it can, else on the backend's listener."""

    def __init__(self, backend: ReleaseWaits) -> None:
        self.backend = backend
        self.conn: _Connection | None = None  # the claims' connection, LISTENing

    def __enter__(self) -> _Listening:
        backend, conn = self.backend, self.backend._conn
        if not self._polls() and conn is not None and not conn.closed and not conn.pooled:
            self.conn = conn if self._on_claims_connection(conn, "LISTEN") else None
        if self.conn is None:
            backend.wait_for_release(None, 0.0)  # starts listening
        return self

    def __exit__(self, *_exc: object) -> None:
        conn, self.conn = self.conn, None
        if conn is not None and conn is self.backend._conn and not conn.closed:
            self._on_claims_connection(conn, "UNLISTEN")
        self.backend._drop_listener()  # a worker that took a feature keeps no second one

    def _polls(self) -> bool:
        """Behind a pooler, or on a crowded server (asked at most every ``SLOTS_LOOK_SECONDS``):
        poll, holding no connection. Race: a waiter never told of it LISTENed on a slot a holder
        needed to mark its done, until its lease ran out and the feature ran again."""
        return self.backend._behind_pooler or self.backend.crowded(SLOTS_LOOK_SECONDS)

    def _on_claims_connection(self, conn: _Connection, verb: str) -> bool:
        """LISTEN, or UNLISTEN and drop what was heard (releases long past); False: failed."""
        try:
            conn.execute(statements.listen(verb=verb, channel=self.backend.channel))
            if verb == "UNLISTEN":
                for _ in conn.notifies(timeout=0):
                    pass
        except psycopg.Error:
            self.backend._drop_connection()  # its state is unknown; the next claim connects again
            return False
        return True

    def wait(self, seconds: float) -> bool:
        seconds = max(0.0, min(seconds, RECHECK_SECONDS))  # the protocol's bound: look again
        conn, backend = self.conn, self.backend
        if conn is not None and conn is backend._conn and not conn.closed and not self._polls():
            deadline = time.monotonic() + seconds
            try:
                return backend._heard(conn, deadline)
            except psycopg.Error:
                # Race: the connection died (or froze) between two tries; a release sent
                # meanwhile was never heard. Look again, no sooner than a wait would have.
                if conn is backend._conn:
                    backend._drop_connection()
                time.sleep(max(0.0, deadline - time.monotonic()))
                return True
        # Race: the claims' connection was let go of or lost since, and its LISTEN with it: the
        # backend's listener takes over (its first call only starts listening: "look again").
        self.conn = None
        heard = backend.wait_for_release(None, seconds)
        # Behind a pooler (or on a crowded server) nothing is heard: that wait was a poll.
        return heard or backend._behind_pooler or backend._slots_scarce
