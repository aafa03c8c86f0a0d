"""The PostgreSQL backend in the conformance suite: one namespace per test's gsd folder, on the
session's throw-away server (``tests/support/postgres.py``), wiped after each test."""

from __future__ import annotations

from pathlib import Path

from mahabharatha.backends.base import LockBackend
from tests.conformance.conftest import BackendKind, register
from tests.support import postgres


def _open(gsd: Path) -> LockBackend:
    from mahabharatha.backends.postgres import PostgresBackend

    # The same gsd gives the same lock space, in this process or a forked child.
    return PostgresBackend(postgres.shared_server().url(), namespace=str(gsd), gsd_dir=gsd)


def _wipe(gsd: Path) -> None:
    server = postgres.shared_server()
    postgres.admin_execute(server, "DELETE FROM mahabharatha_locks WHERE namespace = %s", str(gsd))


register(BackendKind("postgres", _open, _wipe, skip=postgres.client_missing()))
