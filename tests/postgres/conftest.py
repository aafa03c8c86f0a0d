"""Backends on the session's PostgreSQL server, one fresh namespace per test."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.postgres import PgServer


@pytest.fixture
def namespace() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def make_backend(
    pg_server: PgServer, namespace: str, tmp_path: Any
) -> Iterator[Callable[..., Any]]:
    """Backends for this test's namespace (closed at the end); keyword arguments override."""
    from mahabharatha.backends.postgres import PostgresBackend

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
