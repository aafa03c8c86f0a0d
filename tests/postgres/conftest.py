"""Backends on the session's PostgreSQL server, one fresh namespace per test."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.postgres import APP_USER, PgServer, pgbouncer

POOL_SIZE = 2
"""Fewer server connections than workers: every server connection serves several clients."""


@pytest.fixture(scope="session")
def pooler(pg_server: PgServer) -> Iterator[str]:
    """PgBouncer in transaction mode in front of the suite's server: the app role's URL (one
    for the session: the pooler tests and the hosts' storm share it, each in its namespace)."""
    with pgbouncer(pg_server, "transaction", POOL_SIZE) as port:
        yield f"postgresql://{APP_USER}@127.0.0.1:{port}/mh"


@pytest.fixture
def namespace() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def make_backend(
    pg_server: PgServer, namespace: str, tmp_path: Any
) -> Iterator[Callable[..., Any]]:
    """Backends for this test's namespace (closed at the end); keyword arguments override."""
    from mahabharatha.backends.postgres.backend import PostgresBackend

    made: list[PostgresBackend] = []

    def make(**options: Any) -> PostgresBackend:
        url = options.pop("url", pg_server.url())
        options.setdefault("namespace", namespace)
        options.setdefault("gsd_dir", str(tmp_path / ".gsd"))
        backend = PostgresBackend(url, **options)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


@pytest.fixture
def backend(make_backend: Callable[..., Any]) -> Any:
    return make_backend()
