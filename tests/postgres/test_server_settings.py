"""Any server configuration (issue 17): what the server's, a database's or a role's settings
would let the server forget or answer wrongly, the backend pins or refuses.

Each test configures a real server as the item needs (the shared one where a database or role
setting is enough, a private one for a crash restart) and says how it failed before."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, Final

import pytest

from mahabharatha.backends.base import BackendError, Requester
from mahabharatha.owner import ownership
from tests.support.postgres import (
    PgServer,
    admin_execute,
    crash_restart,
    private_server,
)


def me() -> Requester:
    return Requester(os.getpid(), ownership.details_of(os.getpid()))


# --------------------------------------------------------------------------- durability

WAL_WRITER_DELAY: Final = "10s"
"""The longest the server allows: an asynchronous commit's WAL stays in shared memory (lost in
a crash restart) until the WAL writer's next round, so the test's acquire-then-crash window
(well under a second) almost never straddles one."""


@pytest.fixture(scope="module")
def lazy_server() -> Iterator[PgServer]:
    """A private server where commits are not durable unless a session asks: the database's
    ``synchronous_commit`` is off (a common tuning), and the WAL writer rarely runs."""
    with private_server({"wal_writer_delay": WAL_WRITER_DELAY}) as server:
        admin_execute(server, "ALTER DATABASE mh SET synchronous_commit = off")
        yield server


def _backend_on(server: PgServer, tmp_path: Any) -> Any:
    from mahabharatha.backends.postgres.backend import PostgresBackend

    return PostgresBackend(
        server.url(), namespace=f"ns-{uuid.uuid4().hex[:8]}", gsd_dir=str(tmp_path)
    )


def test_sessions_pin_synchronous_commit_whatever_the_database_says(
    lazy_server: PgServer, tmp_path: Any
) -> None:
    """Failed before: the session kept the database's ``off``."""
    backend = _backend_on(lazy_server, tmp_path)
    try:
        backend.inspect("feat")
        setting = backend._connection().execute("SHOW synchronous_commit").fetchone()
        assert setting == ("on",)
    finally:
        backend.close()


def test_an_acknowledged_lock_and_its_token_survive_a_crash_restart(
    lazy_server: PgServer, tmp_path: Any
) -> None:
    """Acquire (acknowledged), then a server process is SIGKILLed and the server recovers from
    its WAL. Failed before: the row and the sequence's advance were gone; a second caller got
    the lock, with a token not larger than the first's."""
    first = _backend_on(lazy_server, tmp_path)
    try:
        first.init()
        before = first.try_acquire("old", me()).held
        assert first.release_held(before)
        held = first.try_acquire("feat", me()).held
        assert held is not None and held.token > before.token
        crash_restart(lazy_server)
        assert first.inspect("feat").pid == os.getpid()
        assert first.verify("feat", held.token)
        assert first.try_acquire("feat", Requester(1)).held is None
        after = first.try_acquire("other", Requester(1)).held
        assert after is not None and after.token > held.token
    finally:
        first.close()


# --------------------------------------------------------------------------- a database of its own


@pytest.fixture
def database(pg_server: PgServer) -> Iterator[Callable[..., str]]:
    """Make a throw-away database on the shared server (owned by the app role, with the given
    ``CREATE DATABASE`` options and ``ALTER DATABASE ... SET`` settings); its URL."""
    made: list[str] = []

    def make(*, options: str = "", settings: dict[str, str] | None = None) -> str:
        name = f"mh_{uuid.uuid4().hex[:10]}"
        admin_execute(pg_server, f"CREATE DATABASE {name} OWNER mh_app {options}")
        made.append(name)
        for setting, value in (settings or {}).items():
            admin_execute(pg_server, f"ALTER DATABASE {name} SET {setting} = {value}")
        return pg_server.url(database=name)

    yield make
    for name in made:
        admin_execute(pg_server, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_a_sql_ascii_database_answers_text(database: Callable[..., str], tmp_path: Any) -> None:
    """initdb's default under the C locale. Failed before: psycopg answered ``bytes`` for text:
    the refresh matched nothing (lost lock), status and check named ``b'feat'``."""
    from mahabharatha.backends.postgres.backend import PostgresBackend

    url = database(options="ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
    backend: Any = PostgresBackend(url, namespace="ns-ascii", gsd_dir=str(tmp_path))
    try:
        held = backend.try_acquire("feat", me(), lease=60).held
        assert held is not None and held.feature == "feat"
        assert backend.refresh(held).token == held.token
        assert [info.feature for info in backend.status()] == ["feat"]
        assert backend.inspect("feat").host == backend._host
        claimed = backend.try_claim(["a", "b"], me()).held
        assert claimed is not None and claimed.feature == "a"
        assert backend.try_claim(["a", "b"], me()).held.feature == "b"  # the registered claim
    finally:
        backend.close()


def test_a_read_only_database_is_refused_for_reads_too(
    database: Callable[..., str], pg_server: PgServer, tmp_path: Any
) -> None:
    """Every session of the database is read-only (``default_transaction_read_only``, as on a
    standby; a real hot standby is not started here: the same refusal answers it, by
    ``pg_is_in_recovery()``). Failed before: ``verify`` of a token answered from it (exit 0) and
    ``inspect`` named the holder; now every call is a BackendError naming the server."""
    from mahabharatha.backends.postgres.backend import PostgresBackend

    url = database()
    writer: Any = PostgresBackend(url, namespace="ns-ro", gsd_dir=str(tmp_path))
    held = writer.try_acquire("feat", me()).held
    writer.close()
    name = url.rsplit("/", 1)[1]
    admin_execute(pg_server, f"ALTER DATABASE {name} SET default_transaction_read_only = on")
    reader = PostgresBackend(url, namespace="ns-ro", gsd_dir=str(tmp_path))
    try:
        for call in (
            lambda: reader.verify("feat", held.token),
            lambda: reader.inspect("feat"),
            lambda: reader.status(),
            lambda: reader.try_acquire("other", me()),
        ):
            with pytest.raises(BackendError) as refused:
                call()
            assert reader.where() in str(refused.value)
            assert "read-only" in str(refused.value) and "primary" in str(refused.value)
    finally:
        reader.close()


# --------------------------------------------------------------------------- the token sequence


@pytest.fixture
def own_tables(database: Callable[..., str], tmp_path: Any) -> Iterator[tuple[Any, str]]:
    """A backend on a database of its own (its sequence can be reset without touching the
    shared server's tokens), and that database's name."""
    from mahabharatha.backends.postgres.backend import PostgresBackend

    url = database()
    backend = PostgresBackend(url, namespace="ns-seq", gsd_dir=str(tmp_path))
    yield backend, url.rsplit("/", 1)[1]
    backend.close()


def _in(pg_server: PgServer, name: str, statement: str) -> None:
    import psycopg

    with psycopg.connect(pg_server.url(role="mh_admin", database=name), autocommit=True) as conn:
        conn.execute(statement)


def test_a_features_tokens_grow_after_the_sequence_is_reset(
    own_tables: tuple[Any, str], pg_server: PgServer
) -> None:
    """Failed before: after ``ALTER SEQUENCE ... RESTART`` the next holder got token 1 (an old
    holder's, whose ``verify`` then passed), by acquire and by claim."""
    backend, name = own_tables
    for _ in range(5):
        backend.release_held(backend.try_acquire("feat", me()).held)
    last = backend.try_acquire("feat", me()).held
    backend.release_held(last)
    _in(pg_server, name, "ALTER SEQUENCE mahabharatha_lock_token RESTART WITH 1")
    acquired = backend.try_acquire("feat", me()).held
    assert acquired.token > last.token
    backend.release_held(acquired)
    _in(pg_server, name, "ALTER SEQUENCE mahabharatha_lock_token RESTART WITH 1")
    claimed = backend.try_claim(["feat"], me()).held
    assert claimed.feature == "feat" and claimed.token > acquired.token
    backend.release_held(claimed)
    _in(pg_server, name, "ALTER SEQUENCE mahabharatha_lock_token RESTART WITH 1")
    registered = backend.try_claim(["feat"], me()).held  # the list's registered statement
    assert registered.token > claimed.token


def test_a_dropped_sequence_is_an_error_naming_lock_init_until_init_makes_it_again(
    own_tables: tuple[Any, str], pg_server: PgServer
) -> None:
    """A dropped sequence (or ``pg_dump -t mahabharatha_locks`` restored without it). Failed
    before: first use made it again at 1, silently, and handed out an old holder's token."""
    backend, name = own_tables
    old = backend.try_acquire("old", me()).held
    for _ in range(3):
        backend.release_held(backend.try_acquire("feat", me()).held)
    _in(pg_server, name, "DROP SEQUENCE mahabharatha_lock_token")
    with pytest.raises(BackendError) as refused:
        backend.try_acquire("new", me())
    assert "lock init" in str(refused.value) and backend.where() in str(refused.value)
    assert admin_rows(pg_server, name, "SELECT to_regclass('mahabharatha_lock_token')") == [(None,)]
    backend.init()
    taken = backend.try_acquire("new", me()).held
    assert taken.token > old.token  # above every token given out, not only the row's own
    assert not backend.verify("old", taken.token)


def admin_rows(pg_server: PgServer, name: str, query: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(pg_server.url(role="mh_admin", database=name), autocommit=True) as conn:
        return conn.execute(query).fetchall()


def test_a_hot_standby_is_refused_and_a_multi_host_url_finds_the_primary(
    lazy_server: PgServer, tmp_path: Any
) -> None:
    """A real hot standby of a private primary. Failed before: it answered ``verify`` and
    ``inspect`` from its copy. A multi-host URL whose first host is the standby is refused too,
    unless it asks libpq for the primary (``target_session_attrs=read-write``). The refusal
    must say why (a standby, in recovery): matching "standby" anywhere also matched the
    standby's own folder in the address, and passed with the recovery check removed."""
    from mahabharatha.backends.postgres.backend import PostgresBackend
    from tests.support.postgres import standby_of

    primary: Any = _backend_on(lazy_server, tmp_path)
    held = primary.try_acquire("feat", me()).held
    primary.close()
    with standby_of(lazy_server) as standby:
        both = (
            f"postgresql://mh_app@/mh?host={standby.socket_dir},{lazy_server.socket_dir}"
            f"&port={standby.port},{lazy_server.port}"
        )
        for url in (standby.url(), both):
            reader: Any = PostgresBackend(url, namespace=primary.namespace, gsd_dir=str(tmp_path))
            try:
                for call in (partial(reader.verify, "feat", held.token), reader.status):
                    # The reason, not the address (the standby's folder has "standby" in its name).
                    with pytest.raises(BackendError, match=r"it is a standby \(in recovery\)"):
                        call()
            finally:
                reader.close()
        chosen: Any = PostgresBackend(
            both + "&target_session_attrs=read-write",
            namespace=primary.namespace,
            gsd_dir=str(tmp_path),
        )
        try:
            assert chosen.verify("feat", held.token)
        finally:
            chosen.close()
