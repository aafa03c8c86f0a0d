"""The PostgreSQL backend in the conformance suite: one namespace per test's gsd folder, on the
session's throw-away server (``tests/support/postgres.py``), wiped after each test; and the same
on the hostile server (``postgres-hostile``: every setting flipped by database and role defaults,
through PgBouncer in transaction mode with a neighbour running ``SET`` between our statements)."""

from __future__ import annotations

from pathlib import Path

from mahabharatha.backends.base import LockBackend
from tests.conformance.conftest import BackendKind, register
from tests.support import postgres


def _open(gsd: Path) -> LockBackend:
    from mahabharatha.backends.postgres.backend import PostgresBackend

    # The same gsd gives the same lock space, in this process or a forked child.
    return PostgresBackend(postgres.shared_server().url(), namespace=str(gsd), gsd_dir=gsd)


def _wipe(gsd: Path) -> None:
    server = postgres.shared_server()
    postgres.admin_execute(server, _DELETE, str(gsd))


_DELETE = "DELETE FROM mahabharatha.mahabharatha_locks WHERE namespace = %s"


def _open_hostile(gsd: Path) -> LockBackend:
    from mahabharatha.backends.postgres.backend import PostgresBackend

    return PostgresBackend(postgres.hostile_server().url(), namespace=str(gsd), gsd_dir=gsd)


def _wipe_hostile(gsd: Path) -> None:
    postgres.admin_execute(postgres.hostile_server().server, _DELETE, str(gsd))


register(BackendKind("postgres", _open, _wipe, skip=postgres.client_missing()))
register(
    BackendKind(
        "postgres-hostile",
        _open_hostile,
        _wipe_hostile,
        skip=postgres.client_missing()
        or (None if postgres.pgbouncer_binary() else postgres.PGBOUNCER_HINT),
    )
)
