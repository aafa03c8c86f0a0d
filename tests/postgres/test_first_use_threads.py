"""Threads making the first use of a backend, on a database without the lock tables yet.

Every thread's first statement fails with "no such table" and creates the tables. Schema
creation ran in a transaction on the backend's one shared connection, so two threads' creations
nested (psycopg made the second a savepoint of the first), broke each other ("savepoint does not
exist", "another command is already in progress") and left the shared connection *inside an open
transaction*: a third thread's acquire answered "held" while its row was never committed,
invisible to every other connection, which then took the same feature: two holders (and every
later statement of that backend stayed uncommitted too). Schema creation now runs on a
connection of its own.

Fails before the fix: round 0 already ended with the shared connection in a transaction
(``INTRANS``), the held feature missing from a second backend's ``status()``, and BackendErrors
naming psycopg objects.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, Final

from mahabharatha.backends.base import Requester
from mahabharatha.owner import ownership
from tests.conformance._procs import SYNC_TIMEOUT
from tests.support.postgres import PgServer, admin_execute

THREADS: Final = 4
ROUNDS: Final = 5
"""Round 0 failed every time it was run before the fix; a few more make it sure."""


def me() -> Requester:
    return Requester(os.getpid(), ownership.details_of(os.getpid()))


def _drop_tables(pg_server: PgServer) -> None:
    admin_execute(pg_server, "DROP TABLE IF EXISTS mahabharatha_locks, mahabharatha_schema")
    admin_execute(pg_server, "DROP SEQUENCE IF EXISTS mahabharatha_lock_token")


def _first_uses(backend: Any) -> dict[str, Any]:
    """Each thread acquires its own feature at once; what each got (an exception, or a result)."""
    start = threading.Barrier(THREADS)
    got: dict[str, Any] = {}

    def acquire(feature: str) -> None:
        start.wait(SYNC_TIMEOUT)
        try:
            got[feature] = backend.try_acquire(feature, me())
        except Exception as error:  # reported by the assertion below
            got[feature] = error

    threads = [threading.Thread(target=acquire, args=(f"f{n}",)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(SYNC_TIMEOUT)
    assert not any(thread.is_alive() for thread in threads)
    return got


def test_threads_first_use_commits_every_lock_they_are_told_they_hold(
    make_backend: Callable[..., Any], pg_server: PgServer
) -> None:
    import psycopg

    for _ in range(ROUNDS):
        _drop_tables(pg_server)
        backend, other = make_backend(), make_backend()
        try:
            got = _first_uses(backend)
            assert backend._conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            errors = {feature: r for feature, r in got.items() if isinstance(r, Exception)}
            assert errors == {}
            assert all(result.held is not None for result in got.values())
            assert sorted(info.feature for info in other.status()) == sorted(got)
        finally:
            backend.close()  # ends a transaction left open, so that the next DROP can run
            other.close()
