"""Waiting for a release on PostgreSQL from an event loop: LISTEN on an AsyncConnection read
by one task, one per loop and backend, open only while a task waits (none on a crowded server:
its waiters poll). A notification is a hint: the waiter tries again after it, and every slice
without it (``design/async.md``)."""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Any, Final

import psycopg

from mahabharatha.backends.postgres import statements
from mahabharatha.backends.postgres.release_watch import ReleaseWaits
from mahabharatha.constants import SLOTS_LOOK_SECONDS, WAKE_UP_INTERVAL_SECONDS

LISTENER_NAME: Final = "mahabharatha-wait-async"  # its application_name
# No pooler in between (as in SESSION_SET_UP): a transaction-mode pooler keeps no LISTEN for us.
# Named with its schema: this connection runs no pin, so its role's search_path is in force.
_DIRECT: Final = "SELECT pg_catalog.pg_backend_pid() = %(pid)s"

_LISTENERS: Final[
    weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, AsyncReleaseListener]]
] = weakref.WeakKeyDictionary()  # per loop, by backend ``id`` (the listener keeps its backend)


def listener_for(backend: ReleaseWaits) -> AsyncReleaseListener:
    """The running loop's listener for ``backend`` (made on first use, kept with the loop)."""
    per_loop = _LISTENERS.setdefault(asyncio.get_running_loop(), {})
    listener = per_loop.get(id(backend))
    if listener is None:
        listener = per_loop[id(backend)] = AsyncReleaseListener(backend)
    return listener


class AsyncReleaseListener:
    """Releases of one backend's namespace, heard for the tasks of one event loop. Race: a
    waiter calls :meth:`watch` *before* its try, so a release before :meth:`wait` still ends
    it; the last :meth:`unwatch` closes the connection."""

    def __init__(self, backend: ReleaseWaits) -> None:
        self.backend = backend
        self._watchers: set[asyncio.Event] = set()  # one channel: any release wakes them all
        self._reader: asyncio.Task[None] | None = None
        self._starting = asyncio.Lock()  # Race: waiters woken by a dead listener each made one
        self._behind_pooler = False
        self._woken = -float("inf")  # when the waiters were last woken (monotonic)
        self._wake_later: asyncio.TimerHandle | None = None  # a wake-up kept for its time

    def watch(self, feature: str) -> asyncio.Event:
        """An event set by every release from now on (once listening): of ``feature`` too."""
        seen = asyncio.Event()
        self._watchers.add(seen)
        return seen

    def unwatch(self, feature: str, seen: asyncio.Event) -> None:
        self._watchers.discard(seen)
        if not self._watchers:
            self._stop_reading()

    def _stop_reading(self) -> None:
        if self._reader is not None:
            self._reader.cancel()  # its ``finally`` closes the connection
            self._reader = None

    async def wait(
        self,
        seen: asyncio.Event,
        timeout: float,
        call: Callable[[Callable[[], bool]], Awaitable[bool]],
    ) -> bool:
        """Wait up to ``timeout`` for ``seen``: True when a release came, when this call only
        started listening, or when the listener failed (look again). ``call`` runs a blocking
        backend call off the loop (the lock's own way: counted, waited for if cancelled)."""
        timeout = max(0.0, timeout)
        # Behind a pooler, or on a crowded server (asked at each look): poll once per slice,
        # holding no connection. Race: waiters listening for their whole wait kept the slots a
        # holder needed to mark its done until its lease ran out.
        if self._behind_pooler or await call(self._crowded):
            self._stop_reading()  # every waiter of the loop polls now: none hears it
            await asyncio.sleep(timeout)
            return False
        if not self._listening():
            async with self._starting:
                if not self._listening():  # else another waiter started it: look again
                    await self._start(timeout)
            return True
        with suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await seen.wait()
        return seen.is_set()

    def _crowded(self) -> bool:
        """The sync waits' rule (``crowded`` on the claims' connection, then let go of), in a
        worker thread, between two of the loop's other statements on it, never under one."""
        backend = self.backend
        with backend._one_operation:
            if not backend.crowded(SLOTS_LOOK_SECONDS):
                return False
            backend.close()
        return True

    def _listening(self) -> bool:
        return self._reader is not None and not self._reader.done()

    async def _start(self, timeout: float) -> None:
        """A listening connection of our own, read by a task; behind a pooler: waiters poll."""
        backend = self.backend
        try:
            async with asyncio.timeout(backend.connect_timeout):
                conn = await psycopg.AsyncConnection.connect(
                    backend._url, **backend._connect_args(LISTENER_NAME)
                )
                try:
                    direct = await conn.execute(_DIRECT, {"pid": conn.info.backend_pid})
                    if await direct.fetchone() != (True,):
                        self._behind_pooler = True
                        await conn.close()
                        return
                    await conn.execute(statements.listen(verb="LISTEN", channel=backend.channel))
                except BaseException:
                    await conn.close()
                    raise
        except (psycopg.Error, OSError, TimeoutError):
            # Race: no listener, so a release now is not heard: look again, no sooner than a
            # wait would have (no busy loop while connecting keeps failing, e.g. no slots).
            await asyncio.sleep(timeout)
            return
        self._reader = asyncio.get_running_loop().create_task(self._read(conn))

    async def _read(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Wake every waiter at each wake-up (throttled), until cancelled or the connection
        fails (then every waiter looks again at once)."""
        try:
            async for _note in conn.notifies():
                self._wake_in_time()
        except (psycopg.Error, OSError):
            # Race: the listener died (idle_session_timeout, a terminated backend); a release
            # sent meanwhile was never heard: wake every waiter to look again.
            self._set_every_event()
        finally:
            if self._wake_later is not None:
                self._wake_later.cancel()
                self._wake_later = None
            with suppress(psycopg.Error, OSError):
                await conn.close()

    def _wake_in_time(self) -> None:
        """Wake the waiters now, or once an interval since the last wake is over. Race: forged
        wake-ups (anyone may NOTIFY) cost a waiter one look per interval, not one each."""
        due = self._woken + WAKE_UP_INTERVAL_SECONDS - time.monotonic()
        if due <= 0:
            self._wake_all()
        elif self._wake_later is None:
            self._wake_later = asyncio.get_running_loop().call_later(due, self._wake_all)

    def _wake_all(self) -> None:
        self._wake_later = None
        self._woken = time.monotonic()
        self._set_every_event()

    def _set_every_event(self) -> None:
        for seen in self._watchers:
            seen.set()  # schedules the waiter: never changes the set meanwhile
