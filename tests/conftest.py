"""Suite-wide fixtures: the PostgreSQL server that the PostgreSQL tests share.

Any test that uses ``pg_server`` is marked ``postgres``. Without PostgreSQL (or psycopg) those
tests skip with a reason saying what to install; with ``MAHABHARATHA_REQUIRE_POSTGRES=1`` (CI) a
skipped ``postgres`` test is a failure instead, so CI can never pass without having run them.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator

import pytest

from tests.support import postgres


def _required() -> bool:
    return os.environ.get(postgres.REQUIRE_ENV) == "1"


@pytest.fixture(scope="session")
def pg_server() -> Iterator[postgres.PgServer]:
    """One PostgreSQL server for the whole session (started on first use, stopped at the end)."""
    missing = postgres.client_missing()
    if missing is not None:
        pytest.skip(missing)
    yield postgres.shared_server()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        kind = callspec.params.get("kind") if callspec is not None else None
        on_postgres = getattr(kind, "id", None) == "postgres"  # the conformance suite's
        if on_postgres or "pg_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.skipped and _required() and item.get_closest_marker("postgres") is not None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"{postgres.REQUIRE_ENV}=1 but this PostgreSQL test skipped: {reason}"
    return report
