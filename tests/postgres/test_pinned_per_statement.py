"""Pinned per statement (issue 27 items 1, 4, 5, 6, 9, 10): no role or database default, no other
client of a transaction-mode pooler, no ``search_path`` and no older table layout changes what
a statement does. Each test flips one thing on a real server and says how it failed before
(on 211f242)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Final

import pytest

from mahabharatha.backends.base import BackendError, Requester
from mahabharatha.owner import ownership
from tests.postgres.test_server_settings import database  # noqa: F401  (a fixture)
from tests.support.postgres import (
    APP_USER,
    HostileServer,
    PgServer,
    admin_execute,
    crash_restart,
    pgbouncer,
    private_server,
)

WAL_WRITER_DELAY: Final = "10s"
"""An asynchronous commit's WAL stays in shared memory (lost in a crash) until the WAL writer's
next round: the longest the server allows, so the acquire-then-crash window never meets one."""


LOADED_MACHINE_TIMEOUT: Final = 30.0
"""One server connection behind the pooler, shared with the neighbour: on a machine with a load
average of 40 (CI next to other work) an answer took over the default 5 s."""


def me() -> Requester:
    return Requester(os.getpid(), ownership.details_of(os.getpid()))


def _backend(url: str, tmp_path: Any, **options: Any) -> Any:
    from mahabharatha.backends.postgres.backend import PostgresBackend

    options.setdefault("namespace", f"ns-{uuid.uuid4().hex[:8]}")
    return PostgresBackend(url, gsd_dir=str(tmp_path), **options)


# --------------------------------------------------------------------------- item 1: durability


@pytest.fixture(scope="module")
def lazy_server() -> Iterator[PgServer]:
    """A private server (it is crashed) whose WAL writer rarely runs."""
    with private_server({"wal_writer_delay": WAL_WRITER_DELAY}) as server:
        yield server


def test_a_pooler_neighbours_synchronous_commit_off_never_loses_an_acknowledged_acquire(
    lazy_server: PgServer, tmp_path: Any
) -> None:
    """PgBouncer in transaction mode with one server connection; a neighbour client of the same
    pool runs ``SET synchronous_commit = off`` (it stays on that connection), we acquire, a
    server process is SIGKILLed. Failed before: durability was read once per connection, so
    the acquire committed asynchronously and the crash forgot it: a second caller got it."""
    import psycopg

    with pgbouncer(lazy_server, "transaction", 1) as port:
        pooled = f"postgresql://{APP_USER}@127.0.0.1:{port}/mh"
        holder = _backend(pooled, tmp_path, connect_timeout=LOADED_MACHINE_TIMEOUT)
        try:
            holder.init()
            with psycopg.connect(pooled, autocommit=True, prepare_threshold=None) as neighbour:
                neighbour.execute("SET synchronous_commit = off")
                held = holder.try_acquire("feat", me()).held
                assert held is not None
            holder.close()
            crash_restart(lazy_server)
            second = _backend(lazy_server.url(), tmp_path, namespace=holder.namespace)
            try:
                assert second.try_acquire("feat", me()).held is None
                assert second.verify("feat", held.token)
            finally:
                second.close()
        finally:
            holder.close()


def test_a_pooled_operation_sends_nothing_after_its_commit(
    database: Callable[..., str],  # noqa: F811
    pg_server: PgServer,
    tmp_path: Any,
) -> None:
    """Behind PgBouncer in transaction mode, an acquire, a refresh, a status, a claim and a
    release each end with their COMMIT's answer: no Flush follows it, which would make the
    pooler hand the server connection to us again (a pooled client never keeps it between
    its operations). Failed before: psycopg's pipeline sent a Flush after each operation's
    last Sync; when PgBouncer had freed the server connection at the COMMIT's answer, the
    Flush took it again, unanswered, and a neighbour of a pool of one waited for it: the
    test above hung so until pytest's timeout, about 1 run in 10 under load."""
    from psycopg import pq

    url = database()
    maker = _backend(url, tmp_path)
    try:
        maker.init()  # the tables, made before the pooler's pool of one
    finally:
        maker.close()
    with pgbouncer(pg_server, "transaction", 1) as port:
        pooled = f"postgresql://{APP_USER}@127.0.0.1:{port}/{url.rsplit('/', 1)[1]}"
        backend = _backend(pooled, tmp_path, connect_timeout=LOADED_MACHINE_TIMEOUT)
        trace = tmp_path / "sent.trace"
        try:
            backend.status()  # connected: its messages from here on are traced
            conn = backend._conn
            with trace.open("w") as out:
                conn.pgconn.trace(out.fileno())
                conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
                held = backend.try_acquire("feat", me()).held
                assert held is not None
                backend.refresh(held)
                backend.status()
                claimed = backend.try_claim(["other"], me())
                assert claimed is not None and claimed.held is not None
                for each in (held, claimed.held):
                    assert backend.release_held(each)
                assert backend._conn is conn  # one connection: all of it traced
                conn.pgconn.untrace()  # flushes libpq's buffer
        finally:
            backend.close()
    sent = [line.split("\t")[2] for line in trace.read_text().splitlines() if line[:2] == "F\t"]
    assert sent.count("Sync") + sent.count("Query") >= 5
    assert "Flush" not in sent, f"{sent.count('Flush')} Flush messages sent: {sent}"


# --------------------------------------------------------------------------- item 4: times


def test_times_are_read_exactly_whatever_extra_float_digits_says(
    database: Callable[..., str],  # noqa: F811
    pg_server: PgServer,
    tmp_path: Any,
) -> None:
    """The database's ``extra_float_digits = -9``. Failed before: times were read as text,
    rounded to six digits (about 1,000 s of an epoch): a lock that expired five minutes ago
    was ``active``."""
    url = database(settings={"extra_float_digits": "-9"})
    backend = _backend(url, tmp_path)
    try:
        held = backend.try_acquire("feat", me()).held
        name = url.rsplit("/", 1)[1]
        _in_database(
            pg_server,
            name,
            "UPDATE mahabharatha_locks SET refreshed_at = now() - interval '6 min',"
            " expires_at = now() - interval '5 min'",
        )
        info = backend.inspect("feat")
        assert info.state == "stale"
        assert info.age_seconds is not None and 355 < info.age_seconds < 400
        assert not backend.verify("feat", held.token)
    finally:
        backend.close()


def _in_database(pg_server: PgServer, name: str, statement: str) -> None:
    import psycopg

    with psycopg.connect(pg_server.url(role="mh_admin", database=name), autocommit=True) as conn:
        psycopg.ClientCursor(conn).execute(statement)  # the simple protocol: several statements


# --------------------------------------------------------------------------- item 6: literals


def test_done_fail_and_release_by_pid_work_with_standard_conforming_strings_off(
    database: Callable[..., str],  # noqa: F811
    tmp_path: Any,
) -> None:
    """The database's ``standard_conforming_strings = off``. Failed before: the owner rule's
    ``'\\x00..'::bytea`` literals were read as NUL bytes and refused (``invalid byte
    sequence``): done, fail and release by pid were errors, no outcome was ever recorded."""
    url = database(settings={"standard_conforming_strings": "off"})
    backend = _backend(url, tmp_path)
    pid = os.getpid()
    try:
        assert backend.try_acquire("done-one", me()).held is not None
        backend.done("done-one", pid)
        assert backend.is_done("done-one")
        assert backend.try_acquire("failed-one", me()).held is not None
        assert backend.fail("failed-one", pid, "boom", 3).tries == 1
        assert backend.try_acquire("released-one", me()).held is not None
        assert backend.release("released-one", pid)
    finally:
        backend.close()


# --------------------------------------------------------------------------- item 9: isolation


def test_statements_run_read_committed_whatever_the_default_isolation(
    database: Callable[..., str],  # noqa: F811
    tmp_path: Any,
) -> None:
    """The database's ``default_transaction_isolation = serializable``. Failed before: our
    statements ran serializable (claim storms met 40001, taken for a lost connection)."""
    url = database(settings={"default_transaction_isolation": "serializable"})
    backend = _backend(url, tmp_path)
    try:
        found = backend._rows("SELECT current_setting('transaction_isolation')", {})
        assert found == [("read committed",)]
    finally:
        backend.close()


SERIALIZATION_FAILURES: Final = 3
"""More than the lost-connection retries (two) the old code gave a statement."""


def test_a_serialization_failure_is_run_again_on_the_same_connection(
    database: Callable[..., str],  # noqa: F811
    pg_server: PgServer,
    tmp_path: Any,
) -> None:
    """A trigger makes the server roll back the first three acquires with SQLSTATE 40001.
    Failed before: 40001 was taken for a lost connection (a new one each time, twice), and the
    acquire was an error; now it is run again, after a pause, on the same connection."""
    url = database()
    backend = _backend(url, tmp_path)
    try:
        backend.init()
        name = url.rsplit("/", 1)[1]
        _in_database(pg_server, name, _FAILING_TRIGGER.format(times=SERIALIZATION_FAILURES))
        before = backend._connection().info.backend_pid
        held = backend.try_acquire("feat", me()).held
        assert held is not None
        assert backend._connection().info.backend_pid == before
        left = _in_rows(pg_server, name, "SELECT nextval('failures_left')")
        assert left == [(-1,)]  # every failure was met, and the fourth run took it
    finally:
        backend.close()


_FAILING_TRIGGER: Final = """
CREATE SEQUENCE public.failures_left MINVALUE -1000 MAXVALUE 1000 START {times} INCREMENT -1;
GRANT USAGE ON SEQUENCE public.failures_left TO mh_app;
CREATE FUNCTION public.fail_serialization() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF nextval('public.failures_left') > 0 THEN
        RAISE EXCEPTION 'could not serialize access' USING ERRCODE = '40001';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER fail_serialization BEFORE INSERT OR UPDATE ON mahabharatha_locks
    FOR EACH ROW EXECUTE FUNCTION public.fail_serialization()"""
"""Raises 40001 the first ``times`` times a row is written (a sequence counts them down, and
its draws are never rolled back). The table named bare: the admin's ``search_path`` finds it
where the code under test made it."""


def _in_rows(pg_server: PgServer, name: str, query: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(pg_server.url(role="mh_admin", database=name), autocommit=True) as conn:
        return conn.execute(query).fetchall()


# --------------------------------------------------------------------------- item 5: schema


def test_two_roles_whose_search_paths_differ_share_one_set_of_tables(
    database: Callable[..., str],  # noqa: F811
    pg_server: PgServer,
    tmp_path: Any,
) -> None:
    """Role A owns a schema of its own name (first in the default ``"$user", public``) and
    makes the tables; role B has none. Failed before: the tables were made in the first
    schema of each caller's ``search_path`` (A's in its own schema, B's would be in
    ``public``, where both held one feature at once): no schema ``mahabharatha`` to grant on."""
    url = database()
    name = url.rsplit("/", 1)[1]
    tag = uuid.uuid4().hex[:6]
    first, second = f"role_a_{tag}", f"role_b_{tag}"
    for role in (first, second):
        admin_execute(pg_server, f"CREATE ROLE {role} LOGIN")
    _in_database(
        pg_server,
        name,
        f"GRANT CREATE ON DATABASE {name} TO {first};"
        f" CREATE SCHEMA {first} AUTHORIZATION {first};"
        f" GRANT CREATE, USAGE ON SCHEMA public TO {first}, {second}",
    )
    space = f"ns-{tag}"
    a = _backend(pg_server.url(role=first, database=name), tmp_path, namespace=space)
    b = _backend(pg_server.url(role=second, database=name), tmp_path, namespace=space)
    try:
        a.init()
        _in_database(
            pg_server,
            name,
            f"GRANT USAGE ON SCHEMA mahabharatha TO {second};"
            f" GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA mahabharatha"
            f" TO {second}; GRANT USAGE ON ALL SEQUENCES IN SCHEMA mahabharatha TO {second}",
        )
        assert a.try_acquire("auth-flow", me()).held is not None
        assert b.try_acquire("auth-flow", me()).held is None  # one set of tables: A holds it
    finally:
        a.close()
        b.close()


def test_another_roles_look_alike_tables_first_in_the_search_path_are_never_used(
    hostile_pg: HostileServer, tmp_path: Any
) -> None:
    """The hostile server: the database's and role's ``search_path`` starts with a schema of
    another role holding tables named like ours (version 99). Failed before: the tables were
    looked for through ``search_path``: those were found, and refused as newer."""
    backend = _backend(hostile_pg.server.url(), tmp_path)
    try:
        assert backend.init() >= 2
        held = backend.try_acquire("feat", me()).held
        assert held is not None and backend.verify("feat", held.token)
        shadow = admin_execute(hostile_pg.server, "SELECT count(*) FROM hostile.mahabharatha_locks")
        assert shadow == [(0,)]
    finally:
        backend.close()


# --------------------------------------------------------------------------- item 10: version 1

_VERSION_1: Final = """
CREATE TABLE public.mahabharatha_schema (version integer PRIMARY KEY);
CREATE SEQUENCE public.mahabharatha_lock_token AS bigint;
CREATE TABLE public.mahabharatha_locks (
    namespace text NOT NULL, feature text COLLATE "C" NOT NULL, pid integer, details bytea,
    host text, attempt bytea, lease interval, acquired_at timestamptz,
    refreshed_at timestamptz, expires_at timestamptz, token bigint, done_at timestamptz,
    prev_pid integer, prev_details bytea, prev_refreshed_at timestamptz,
    prev_expires_at timestamptz, PRIMARY KEY (namespace, feature));
INSERT INTO public.mahabharatha_schema VALUES (1)"""
"""The tables as version 1 made them (no ``failures``, ``failed``, ``last_failure``), where it
made them: in ``public``, the first schema of the usual ``search_path`` (the tests then name
that schema with ``MAHABHARATHA_LOCK_SCHEMA``, which 211f242 ignored: it found them there)."""


def _version_1_database(
    make_database: Callable[..., str], pg_server: PgServer, owner: str, monkeypatch: Any
) -> tuple[str, str]:
    monkeypatch.setenv("MAHABHARATHA_LOCK_SCHEMA", "public")
    url = make_database()
    name = url.rsplit("/", 1)[1]
    _in_database(pg_server, name, f"SET ROLE {owner}; {_VERSION_1}")
    return url, name


def test_first_use_brings_a_version_1_database_up_to_date(
    database: Callable[..., str],  # noqa: F811
    pg_server: PgServer,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Failed before: first use added no column: ``fail`` (and reopen, status --all) was an
    error, ``column "failures" does not exist``, and a worker died holding its feature."""
    url, _name = _version_1_database(database, pg_server, APP_USER, monkeypatch)
    backend = _backend(url, tmp_path)
    try:
        assert backend.try_acquire("feat", me()).held is not None
        assert backend.fail("feat", os.getpid(), "boom", 3).tries == 1
        assert backend.init() == 2
    finally:
        backend.close()


def test_a_version_1_database_this_role_may_not_change_is_refused_before_taking_anything(
    database: Callable[..., str],  # noqa: F811
    pg_server: PgServer,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tables belong to another role; this one may only read and write them. Failed
    before: it took the feature, and its ``fail`` then died on the missing column, holding it.
    Now its first statement is refused with a sentence naming ``lock init``, nothing taken."""
    url, name = _version_1_database(database, pg_server, "mh_admin", monkeypatch)
    _in_database(
        pg_server,
        name,
        "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO mh_app;"
        " GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO mh_app",
    )
    backend = _backend(url, tmp_path)
    try:
        with pytest.raises(BackendError) as refused:
            backend.try_acquire("feat", me())
        assert "lock init" in str(refused.value) and backend.where() in str(refused.value)
        assert _in_rows(pg_server, name, "SELECT count(*) FROM public.mahabharatha_locks") == [(0,)]
    finally:
        backend.close()


# --------------------------------------------------------------------------- the neighbour


def test_the_hostile_servers_neighbour_is_busy_while_we_work(
    hostile_pg: HostileServer, tmp_path: Any
) -> None:
    """The fixture's own check: the neighbour's ``SET`` statements run between ours (a test
    that cannot fail is a defect: without them the hostile runs prove nothing)."""
    backend = _backend(hostile_pg.url(), tmp_path)
    try:
        start = hostile_pg.neighbour_sets[0]
        for _ in range(5000):  # far more than the neighbour's pace needs
            backend.release_held(backend.try_acquire("feat", me()).held)
            if hostile_pg.neighbour_sets[0] > start + 3:
                break
        assert hostile_pg.neighbour_sets[0] > start + 3
    finally:
        backend.close()


def test_this_roles_tables_of_an_older_layout_elsewhere_are_named_not_left_behind(
    database: Callable[..., str],  # noqa: F811
    pg_server: PgServer,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Tables an older mahabharatha made in ``public`` (its ``search_path``'s first schema):
    first use in the schema ``mahabharatha`` would make a second set beside them (holders on
    each, one feature held twice while old and new versions run). It is refused, naming the
    schema and the ways on; with ``MAHABHARATHA_LOCK_SCHEMA=public`` they are used in place."""
    url, _name = _version_1_database(database, pg_server, APP_USER, monkeypatch)
    monkeypatch.delenv("MAHABHARATHA_LOCK_SCHEMA")
    backend = _backend(url, tmp_path)
    try:
        with pytest.raises(BackendError) as refused:
            backend.try_acquire("feat", me())
        said = str(refused.value)
        assert "schema public" in said and "MAHABHARATHA_LOCK_SCHEMA=public" in said
    finally:
        backend.close()
    in_place = _backend(url, tmp_path, schema="public")
    try:
        assert in_place.try_acquire("feat", me()).held is not None
    finally:
        in_place.close()


def test_a_schema_named_by_the_environment_keeps_its_own_tables(
    database: Callable[..., str],  # noqa: F811
    pg_server: PgServer,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``MAHABHARATHA_LOCK_SCHEMA`` (a team's own schema): every statement names it (DDL,
    sequence, registered claim); the default schema's tables are another lock space. A name
    that would need quoting is bad input."""
    url = database()
    name = url.rsplit("/", 1)[1]
    monkeypatch.setenv("MAHABHARATHA_LOCK_SCHEMA", "team_x")
    team = _backend(url, tmp_path, namespace="shared")
    monkeypatch.delenv("MAHABHARATHA_LOCK_SCHEMA")
    default = _backend(url, tmp_path, namespace="shared")
    try:
        assert team.init() == 2
        claimed = []
        for _ in range(2):  # the second claim of a list is the registered one
            won = team.try_claim(["a", "b"], me())
            assert won is not None and won.held is not None
            claimed.append(won.held)
        # A holder's refresh names the team's schema too (it once named the default's).
        assert team.refresh(claimed[0]).expires_at >= claimed[0].expires_at
        assert default.try_acquire("a", me()).held is not None  # not the team's lock space
        rows = _in_rows(pg_server, name, "SELECT feature FROM team_x.mahabharatha_locks")
        assert sorted(rows) == [("a",), ("b",)]
    finally:
        team.close()
        default.close()
    with pytest.raises(ValueError, match="schema"):
        _backend(url, tmp_path, schema='Team"; DROP')
