"""Waiting for a release on PostgreSQL from an event loop: LISTEN on psycopg's AsyncConnection.

:class:`~mahabharatha.aio.AsyncFeatureLock` waits for a busy lock without blocking its loop.
On PostgreSQL a release is followed by a NOTIFY on the schema's channel; this module
hears it on an :class:`psycopg.AsyncConnection`, read by one task, so the loop's other tasks
run while any number of its tasks wait. One listening connection per event loop and backend,
shared by every task of that loop waiting on that backend, open only while one of them waits
(a holder keeps no listening connection while it works: ``max_connections``).

A notification is a hint, never a judgement, exactly as for the blocking waiters of
``postgres.py``: a waiter tries again after it, and at least every slice without it (a lease
that runs out sends nothing). Every wait is bounded: the connection and its ``LISTEN`` by the
backend's connect timeout, a wait for a notification by the caller's slice.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from contextlib import suppress
from typing import Any, Final

import psycopg
from psycopg import sql

from mahabharatha.backends.postgres.release_watch import ReleaseWaits
from mahabharatha.backends.postgres.session import CLIENT_ENCODING
from mahabharatha.constants import WAKE_UP_INTERVAL_SECONDS

LISTENER_NAME: Final = "mahabharatha-wait-async"
"""The ``application_name`` of the listening connection (``pg_stat_activity`` tells it apart)."""

_DIRECT: Final = "SELECT pg_backend_pid() = %(pid)s"
"""Is the server process answering the one the connection's start named? A pooler names its
own (as in ``SESSION_SET_UP``): a transaction-mode pooler keeps no LISTEN for us."""

_LISTENERS: Final[
    weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, AsyncReleaseListener]]
] = weakref.WeakKeyDictionary()
"""Each running loop's listeners, one per backend (by ``id``: the listener keeps its backend)."""


def listener_for(backend: ReleaseWaits) -> AsyncReleaseListener:
    """The running loop's listener for ``backend`` (made on first use, kept with the loop)."""
    per_loop = _LISTENERS.setdefault(asyncio.get_running_loop(), {})
    listener = per_loop.get(id(backend))
    if listener is None:
        listener = per_loop[id(backend)] = AsyncReleaseListener(backend)
    return listener


class AsyncReleaseListener:
    """Releases of one backend's namespace, heard for the tasks of one event loop.

    A waiter calls :meth:`watch` *before* its try and :meth:`wait` after a try that found the
    lock busy (clearing its event before each try), so a release between the try and the wait
    still ends the wait. :meth:`unwatch` when done; the last waiter's closes the connection.
    """

    def __init__(self, backend: ReleaseWaits) -> None:
        self.backend = backend
        self._watchers: dict[str, set[asyncio.Event]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._starting = asyncio.Lock()  # Race: waiters woken by a dead listener each made one
        self._behind_pooler = False
        self._woken = -float("inf")  # when the waiters were last woken (monotonic)
        self._wake_later: asyncio.TimerHandle | None = None  # a wake-up kept for its time

    def watch(self, feature: str) -> asyncio.Event:
        """An event set by every release of ``feature`` from now on (once listening)."""
        seen = asyncio.Event()
        self._watchers.setdefault(feature, set()).add(seen)
        return seen

    def unwatch(self, feature: str, seen: asyncio.Event) -> None:
        watchers = self._watchers.get(feature, set())
        watchers.discard(seen)
        if not watchers:
            self._watchers.pop(feature, None)
        if not self._watchers and self._reader is not None:
            self._reader.cancel()  # its ``finally`` closes the connection
            self._reader = None

    async def wait(self, seen: asyncio.Event, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for ``seen``: True when a release came, or when this
        call only started listening (the caller tries again, and any release after that wakes
        it), or when the listener failed (look again; the caller's own statement says whether
        the server is reachable at all)."""
        timeout = max(0.0, timeout)
        if self._behind_pooler:
            await asyncio.sleep(timeout)  # no LISTEN behind a pooler: poll, once per slice
            return False
        if not self._listening():
            async with self._starting:
                if not self._listening():
                    return await self._start(timeout)
            return True  # another waiter started it meanwhile: look again, then wait
        try:
            async with asyncio.timeout(timeout):
                await seen.wait()
        except TimeoutError:
            return False
        return True

    def _listening(self) -> bool:
        return self._reader is not None and not self._reader.done()

    async def _start(self, timeout: float) -> bool:
        try:
            conn = await self._connect()
        except (psycopg.Error, OSError, TimeoutError):
            # Race: no listener, so a release now is not heard: look again, no sooner than a
            # wait would have (no busy loop while connecting keeps failing, e.g. no slots).
            await asyncio.sleep(timeout)
            return True
        if conn is None:
            return True
        self._reader = asyncio.get_running_loop().create_task(self._read(conn))
        return True

    async def _connect(self) -> psycopg.AsyncConnection[Any] | None:
        """A listening connection, or None behind a pooler (then waiters poll)."""
        backend = self.backend
        async with asyncio.timeout(backend.connect_timeout):
            conn = await psycopg.AsyncConnection.connect(
                backend._url,
                autocommit=True,
                connect_timeout=backend._connect_timeout_arg(),
                application_name=LISTENER_NAME,
                client_encoding=CLIENT_ENCODING,
            )
            try:
                found = await (
                    await conn.execute(_DIRECT, {"pid": conn.info.backend_pid})
                ).fetchone()
                if found is None or not found[0]:
                    self._behind_pooler = True
                    await conn.close()
                    return None
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(backend.channel)))
            except BaseException:
                await conn.close()
                raise
        return conn

    async def _read(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Wake every waiter at each wake-up (it names nothing: a hint to look again), at most
        once per :data:`WAKE_UP_INTERVAL_SECONDS`, until cancelled (the last waiter left) or
        the connection fails (then every waiter looks again at once, and the next wait listens
        on a new connection)."""
        try:
            async for _note in conn.notifies():
                self._wake_in_time()
        except (psycopg.Error, OSError):
            # Race: the listener died (idle_session_timeout, a terminated backend); a release
            # sent meanwhile was never heard: wake every waiter to look again.
            for watchers in list(self._watchers.values()):
                for seen in watchers:
                    seen.set()
        finally:
            if self._wake_later is not None:
                self._wake_later.cancel()
                self._wake_later = None
            with suppress(psycopg.Error, OSError):
                await conn.close()

    def _wake_in_time(self) -> None:
        """Wake the waiters now, or, when they were woken less than an interval ago, once the
        interval is over. Race: a flood of forged wake-ups (anyone who may connect can NOTIFY
        the channel) costs each waiter one look per interval, never one per notification."""
        due = self._woken + WAKE_UP_INTERVAL_SECONDS - time.monotonic()
        if due <= 0:
            self._wake_all()
        elif self._wake_later is None:
            self._wake_later = asyncio.get_running_loop().call_later(due, self._wake_all)

    def _wake_all(self) -> None:
        self._wake_later = None
        self._woken = time.monotonic()
        for watchers in list(self._watchers.values()):
            for seen in watchers:
                seen.set()
