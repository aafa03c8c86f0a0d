"""Waiting for a release on a PostgreSQL server, blocking: LISTEN for the schema's wake-ups
(on the claims' connection where it can), or poll behind a pooler or on a crowded server."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import Final

import psycopg

from mahabharatha.backends.postgres import statements
from mahabharatha.backends.postgres.session import Session, _Connection
from mahabharatha.constants import RECHECK_SECONDS, WAKE_UP_INTERVAL_SECONDS

NOTIFY_CHANNEL: Final = "mahabharatha_release"
"""The channel of the default schema's wake-ups (one for every release; no payload)."""


def channel_of(schema: str) -> str:
    """The wake-up channel of ``schema``: a channel per schema, so one team's releases never
    wake another's waiters (cut to PostgreSQL's 63-byte names; a shared prefix costs hints)."""
    return f"{schema[:55]}_release"


class ReleaseWaits(Session):
    """A :class:`PostgresBackend`'s blocking waits for a release."""

    def __init__(self, url: str, *, schema: str, connect_timeout: float) -> None:
        super().__init__(url, schema=schema, connect_timeout=connect_timeout)
        self.channel: str = channel_of(schema)
        """The schema's wake-up channel (:func:`channel_of`)."""
        self._behind_pooler = False  # seen by the listener's set-up: waiters poll, never LISTEN
        self._woken = -math.inf  # when a wait last ended woken (monotonic): one per interval

    def release_watch(self, features: Iterable[str]) -> _Listening:
        """A pool's wait for any of ``features`` to be released: LISTEN while it waits, and no
        listening connection kept once it ends (a holder keeps none while it works)."""
        return _Listening(self, list(features))

    def wait_for_release(self, feature: str, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a release of ``feature`` (LISTEN/NOTIFY): True
        when one came (or when this is the first call, which only starts listening: the caller
        tries again, and any release after that wakes it).

        The listening connection is no promise: a server's ``idle_session_timeout``, a
        terminated backend or a frozen link ends it. Then this answers True after what is left
        of ``timeout`` (the caller looks again; a later call listens on a new connection), and
        the caller's own statement says whether the server is reachable at all. Every wait
        here is bounded: the listener's statements by ``--connect-timeout``, notifications by
        ``timeout``."""
        return self.wait_for_any_release((feature,), timeout)

    def wait_for_any_release(self, features: Iterable[str], timeout: float) -> bool:
        """:meth:`wait_for_release` for any of ``features`` (a pool waiting for the next one
        that comes free: a release, a ``done``, a reclaim of one of them)."""
        deadline = time.monotonic() + max(0.0, timeout)
        if self._slots_scarce:
            # A crowded server: a second connection to listen on would take a slot a worker
            # needs to record its done. Poll, once per wait, holding no connection meanwhile.
            self.close()
        if self._behind_pooler or self._slots_scarce:
            # A transaction-mode pooler keeps no LISTEN for us: it would stay on a server
            # connection and deliver releases to whichever client gets it next (psycopg keeps
            # unread notifications without bound). Poll instead, once per wait.
            time.sleep(max(0.0, deadline - time.monotonic()))
            return False
        try:
            if self._listener is None or self._listener.closed:
                listener = self._connect("mahabharatha-wait")
                if listener.pooled:
                    self._behind_pooler = True
                    listener.close()
                    return True
                self._listener = listener
                self._listener.execute(statements.listen(verb="LISTEN", channel=self.channel))
                return True
            return self._heard(self._listener, deadline)
        except psycopg.Error:
            # Race: the listener died (or froze) between two tries; a release sent meanwhile
            # was never heard. Look again, no sooner than a wait would have (no busy loop when
            # listening keeps failing at once, e.g. with every connection slot taken).
            self._drop_listener()
            time.sleep(max(0.0, deadline - time.monotonic()))
            return True

    def _listen_on_claims_connection(self) -> _Connection | None:
        """LISTEN on the connection the claims use, when there is one that can: a pool's
        waiting worker needs no second connection (a server process each). None behind a
        pooler or on a crowded server (both poll), or with no connection kept."""
        conn = self._conn
        if self._behind_pooler or self._slots_scarce or conn is None or conn.closed:
            return None
        if conn.pooled:
            return None
        try:
            conn.execute(statements.listen(verb="LISTEN", channel=self.channel))
        except psycopg.Error:
            self._drop_connection()  # its state is unknown; the next claim connects again
            return None
        return conn

    def _heard(self, conn: _Connection, deadline: float) -> bool:
        """:func:`_notified` on ``conn`` (LISTENing), this backend's waits at most one wake-up
        per :data:`WAKE_UP_INTERVAL_SECONDS` apart."""
        woken = _notified(conn, deadline, self._woken + WAKE_UP_INTERVAL_SECONDS)
        if woken:
            self._woken = time.monotonic()
        return woken

    def _notified_on_claims_connection(self, conn: _Connection, deadline: float) -> bool:
        """:meth:`_heard` on the claims' connection ``conn`` (LISTENing)."""
        try:
            return self._heard(conn, deadline)
        except psycopg.Error:
            # Race: the connection died (or froze) between two tries; a release sent meanwhile
            # was never heard. Look again, no sooner than a wait would have.
            if conn is self._conn:
                self._drop_connection()
            time.sleep(max(0.0, deadline - time.monotonic()))
            return True

    def _stop_listening_on(self, conn: _Connection) -> None:
        """UNLISTEN on the claims' connection, and drop what it heard meanwhile (nobody waits
        for it now: a later wait would wake for a release long past)."""
        if conn is not self._conn or conn.closed:
            return
        try:
            conn.execute(statements.listen(verb="UNLISTEN", channel=self.channel))
            for _ in conn.notifies(timeout=0):
                pass
        except psycopg.Error:
            self._drop_connection()  # its state is unknown; the next claim connects again


class _Listening:
    """The :class:`~mahabharatha.backends.base.ReleaseWatch` of a server: entered, it starts
    listening (a release from then on is heard), on the connection the claims use where it
    can, else on the backend's listening connection; left, it stops listening (that
    connection closed)."""

    def __init__(self, backend: ReleaseWaits, features: list[str]) -> None:
        self.backend = backend
        self.features = features
        self.conn: _Connection | None = None  # the claims' connection, LISTENing

    def __enter__(self) -> _Listening:
        self.conn = self.backend._listen_on_claims_connection()
        if self.conn is None:
            self.backend.wait_for_any_release(self.features, 0.0)  # starts listening
        return self

    def __exit__(self, *_exc: object) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            self.backend._stop_listening_on(conn)
        self.backend._drop_listener()  # a worker that took a feature keeps no second one

    def wait(self, seconds: float) -> bool:
        seconds = max(0.0, min(seconds, RECHECK_SECONDS))  # the protocol's bound: look again
        conn = self.conn
        if conn is not None and conn is self.backend._conn and not conn.closed:
            deadline = time.monotonic() + max(0.0, seconds)
            return self.backend._notified_on_claims_connection(conn, deadline)
        # Race: the claims' connection was let go of or lost since (a refresh's rest in another
        # thread, a server restart): its LISTEN went with it. The backend's listener takes over
        # (its first call only starts listening and says "look again").
        self.conn = None
        heard = self.backend.wait_for_any_release(self.features, seconds)
        # Behind a pooler (or on a crowded server) nothing is heard: that wait was a poll.
        return heard or self.backend._behind_pooler or self.backend._slots_scarce


def _notified(conn: _Connection, deadline: float, not_before: float) -> bool:
    """Did a wake-up come on ``conn`` (LISTENing) before ``deadline``? Wake-ups heard between
    two waits come first (psycopg keeps them). A wake-up is a hint: it names nothing, and the
    caller looks again either way. One heard before ``not_before`` (the last wake was too
    recent) ends the wait only then: the wake-ups meanwhile are read and dropped."""
    for _note in conn.notifies(timeout=max(0.0, deadline - time.monotonic())):
        break
    else:
        return False
    # Race: a flood of wake-ups (anyone who may connect can NOTIFY the channel): each one read,
    # so none piles up, and none looked at before ``not_before``.
    until = min(deadline, not_before)
    while (left := until - time.monotonic()) > 0:
        for _note in conn.notifies(timeout=left):
            pass
    return True
