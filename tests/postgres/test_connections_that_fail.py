"""Connections that fail (issue 17 items 6-9): every wait has a deadline whatever the link does,
a waiter whose listener is closed connects again and looks again, ``done`` is retried, and a
lost answer is retried with the same attempt id also on a fresh connection."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mahabharatha.backends.base import Requester
from mahabharatha.owner import ownership
from tests.support.postgres import (
    APP_PASSWORD,
    FreezingProxy,
    PgServer,
    admin_execute,
    wait_until,
)

REPO = Path(__file__).resolve().parents[2]
HANG_GUARD_SECONDS = 60.0
"""How long a command may take before the test calls it hung (the old code never returned)."""


def me() -> Requester:
    return Requester(os.getpid(), ownership.details_of(os.getpid()))


def start_cli(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "mahabharatha", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    """The process's exit code and output; a hung one is killed and fails the test."""
    try:
        out, err = process.communicate(timeout=HANG_GUARD_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"hung: {err}")
    return process.returncode, out, err


def listeners(pg_server: PgServer, database: str = "mh") -> list[int]:
    rows = admin_execute(
        pg_server,
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'mahabharatha-wait'"
        " AND datname = %s AND query LIKE 'LISTEN%%'",
        database,
    )
    return [int(row[0]) for row in rows]  # type: ignore[call-overload]


@pytest.fixture
def held_elsewhere(make_backend: Callable[..., Any]) -> Any:
    """``feat`` held by another owner (pid 1: alive, never ours); the backend that holds it."""
    holder = make_backend()
    assert holder.try_acquire("feat", Requester(1)).held is not None
    return holder


# --------------------------------------------------------------------------- 7: a closed listener


def test_a_waiter_whose_listener_is_terminated_listens_again_and_acquires(
    pg_server: PgServer, namespace: str, held_elsewhere: Any, tmp_path: Path
) -> None:
    """The listener's backend is terminated while ``lock acquire --wait`` waits; the holder then
    releases. Failed before: the waiter exited 3 at once, blaming a healthy server."""
    opts = ["--backend", pg_server.url(), "--namespace", namespace, "--json"]
    waiter = start_cli("lock", "acquire", "feat", "--wait", "50", *opts, cwd=tmp_path)
    try:
        assert wait_until(lambda: bool(listeners(pg_server)), timeout=HANG_GUARD_SECONDS)
        first = listeners(pg_server)[0]
        admin_execute(pg_server, "SELECT pg_terminate_backend(%s)", first)

        def listening_again_or_gone() -> bool:
            return waiter.poll() is not None or any(pid != first for pid in listeners(pg_server))

        assert wait_until(listening_again_or_gone, timeout=HANG_GUARD_SECONDS)
        held_elsewhere.release("feat", 1, force=True)
    finally:
        code, out, err = finish(waiter)
    assert code == 0, err
    assert json.loads(out)["acquired"]


def claimers(pg_server: PgServer) -> list[int]:
    """The sessions a pool's claims use (a waiting claimer LISTENs on its own), idle."""
    rows = admin_execute(
        pg_server,
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'mahabharatha'"
        " AND datname = 'mh' AND state = 'idle'",
    )
    return [int(row[0]) for row in rows]  # type: ignore[call-overload]


def test_a_pool_waiter_whose_connection_is_terminated_listens_again_and_claims(
    pg_server: PgServer, namespace: str, held_elsewhere: Any, tmp_path: Path
) -> None:
    """``lock claim --wait`` listens on the connection its claims use; that session is
    terminated while it waits, then the holder releases: the claimer connects again, hears
    the release (or finds it at its next look) and claims, never exit 3 for a healthy
    server."""
    (tmp_path / ".gsd" / "specs" / "feat").mkdir(parents=True)
    opts = ["--backend", pg_server.url(), "--namespace", namespace, "--json"]
    waiter = start_cli(
        "lock", "claim", "feat", "--wait", "50", "--pid", str(os.getpid()), *opts, cwd=tmp_path
    )
    try:
        assert wait_until(lambda: bool(claimers(pg_server)), timeout=HANG_GUARD_SECONDS)
        admin_execute(pg_server, "SELECT pg_terminate_backend(%s)", claimers(pg_server)[0])
        held_elsewhere.release("feat", 1, force=True)
    finally:
        code, out, err = finish(waiter)
    assert code == 0, err
    assert json.loads(out)["feature"] == "feat"


@pytest.fixture
def impatient_database(pg_server: PgServer) -> Iterator[str]:
    """A database whose idle sessions the server ends after 300 ms (``idle_session_timeout``,
    set on the database as an operator would); its name."""
    name = f"mh_idle_{uuid.uuid4().hex[:8]}"
    admin_execute(pg_server, f"CREATE DATABASE {name} OWNER mh_app")
    admin_execute(pg_server, f"ALTER DATABASE {name} SET idle_session_timeout = '300ms'")
    yield name
    admin_execute(pg_server, f"DROP DATABASE {name} WITH (FORCE)")


def test_a_waiter_outliving_idle_session_timeout_acquires_after_the_release(
    pg_server: PgServer, impatient_database: str, tmp_path: Path
) -> None:
    """Failed before: ``lock acquire --wait`` exited 3 once the server ended its idle
    listener (and ``lock run``, which waits as long as it takes, too)."""
    from mahabharatha.backends.postgres.backend import PostgresBackend

    url = pg_server.url(database=impatient_database)
    holder = PostgresBackend(url, namespace="ns", gsd_dir=str(tmp_path))
    assert holder.try_acquire("feat", Requester(1)).held is not None
    opts = ["--backend", url, "--namespace", "ns", "--json"]
    waiter = start_cli("lock", "run", "feat", *opts, "--", "true", cwd=tmp_path)
    try:
        assert wait_until(lambda: bool(listeners(pg_server, impatient_database)), timeout=30)
        first = listeners(pg_server, impatient_database)[0]

        def ended_and_listening_again() -> bool:
            now = listeners(pg_server, impatient_database)
            return waiter.poll() is not None or (bool(now) and first not in now)

        assert wait_until(ended_and_listening_again, timeout=HANG_GUARD_SECONDS)
        holder.release("feat", 1, force=True)
    finally:
        holder.close()
        code, _out, err = finish(waiter)
    assert code == 0, err


# --------------------------------------------------------------------------- 6: a frozen link


@pytest.fixture
def frozen_listener(pg_server: PgServer) -> Iterator[FreezingProxy]:
    """A route to the server whose connections freeze once they send ``LISTEN``."""
    proxy = FreezingProxy(pg_server.port)
    yield proxy
    proxy.close()


def test_a_frozen_listening_link_never_outlasts_the_wait(
    frozen_listener: FreezingProxy, namespace: str, held_elsewhere: Any, tmp_path: Path
) -> None:
    """``lock acquire F --wait 3 --connect-timeout 2`` while the listener's link froze after
    login (the server itself answers). Failed before: exit 3, blaming the server, here (the
    issue saw the command never return: the listener had no deadline of its own); now the wait
    runs out as a wait does (the LISTEN is bounded, then the waiter looks again)."""
    opts = ["--backend", frozen_listener.url(), "--namespace", namespace]
    waiter = start_cli(
        "lock", "acquire", "feat", "--wait", "3", "--connect-timeout", "2", *opts, cwd=tmp_path
    )
    code, _out, err = finish(waiter)
    assert frozen_listener.frozen.is_set()
    assert code in (1, 75), err  # still held when its wait ran out
    assert "Traceback" not in err and APP_PASSWORD not in err


def test_lock_run_waiting_on_a_frozen_link_ends_on_sigterm(
    frozen_listener: FreezingProxy, namespace: str, held_elsewhere: Any, tmp_path: Path
) -> None:
    """The signal ends it as any signal ends ``lock run`` (128 + 15). Failed before: exit 3
    once the frozen LISTEN timed out (the issue saw it hang, ignoring SIGTERM and SIGINT)."""
    opts = ["--backend", frozen_listener.url(), "--namespace", namespace]
    waiter = start_cli(
        "lock", "run", "feat", "--connect-timeout", "2", *opts, "--", "true", cwd=tmp_path
    )
    try:
        assert frozen_listener.frozen.wait(HANG_GUARD_SECONDS)
        waiter.send_signal(signal.SIGTERM)
    finally:
        code, _out, err = finish(waiter)
    assert code == 128 + signal.SIGTERM, err
    assert "Traceback" not in err


# --------------------------------------------------------------------------- 8: done retried


def test_done_after_the_server_ended_the_idle_connection_is_retried(
    pg_server: PgServer, impatient_database: str, tmp_path: Path
) -> None:
    """A pool's ``done`` after a build longer than the server's idle timeout. Failed before:
    ``done`` was never retried: BackendError, the feature still held and not done."""
    from mahabharatha.backends.postgres.backend import PostgresBackend

    backend: Any = PostgresBackend(
        pg_server.url(database=impatient_database), namespace="ns", gsd_dir=str(tmp_path)
    )
    try:
        assert backend.try_acquire("feat", me()).held is not None
        session = backend._conn.info.backend_pid

        def ended() -> bool:
            rows = admin_execute(
                pg_server, "SELECT 1 FROM pg_stat_activity WHERE pid = %s", session
            )
            return not rows

        assert wait_until(ended, timeout=HANG_GUARD_SECONDS)
        assert backend.done("feat", os.getpid())
        assert backend.inspect("feat").state == "free" and backend.is_done("feat")
    finally:
        backend.close()


def _losing_first_answer(marker: str) -> Callable[..., Any]:
    """A wrapper of an ``execute`` that runs the statement holding ``marker`` (the server
    commits it), then cuts the connection before the answer is read, once."""
    import psycopg

    cut: list[str] = []

    def wrap(real: Callable[..., Any]) -> Callable[..., Any]:
        def execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            answer = real(self, query, *args, **kwargs)
            text = query.decode() if isinstance(query, bytes) else str(query)
            if marker in text and not cut:
                cut.append(text)
                connection = getattr(self, "connection", self)
                connection.close()
                raise psycopg.OperationalError("server closed the connection unexpectedly")
            return answer

        return execute

    return wrap


@pytest.mark.parametrize(
    ("operation", "marker"),
    [
        ("acquire", "INSERT INTO mahabharatha_locks AS l"),
        ("claim", "WITH wanted"),
        ("done", "date_part('epoch', done_at)"),
    ],
)
def test_a_lost_answer_on_a_fresh_connection_is_retried_with_the_same_attempt(
    make_backend: Callable[..., Any],
    pg_server: PgServer,
    namespace: str,
    monkeypatch: Any,
    operation: str,
    marker: str,
) -> None:
    """Each CLI command opens one connection: the answer of its first statement is lost after
    the server committed. Failed before: the retry skipped a fresh connection (exit 3 while the
    row said the caller held the lock; ``done`` was never retried)."""
    import psycopg

    from mahabharatha.backends.postgres import backend as postgres

    setup = make_backend()
    setup.try_acquire("feat", me())  # the tables and rows exist; ours for ``done``
    setup.try_claim(["a", "b"], Requester(1))
    setup.release("a", 1, force=True)
    setup.close()
    fresh = make_backend()  # no connection yet: its first statement is the one cut
    wrap = _losing_first_answer(marker)
    monkeypatch.setattr(postgres._Connection, "execute", wrap(postgres._Connection.execute))
    monkeypatch.setattr(psycopg.RawCursor, "execute", wrap(psycopg.RawCursor.execute))
    if operation == "acquire":
        setup_free = make_backend()
        setup_free.release("feat", os.getpid())
        assert fresh.try_acquire("feat", me()).held is not None
    elif operation == "claim":
        assert fresh.try_claim(["a", "b"], me()).held.feature == "a"
    else:
        assert fresh.done("feat", os.getpid())
    monkeypatch.undo()
    mine = admin_execute(
        pg_server,
        "SELECT feature FROM mahabharatha_locks WHERE namespace = %s AND pid = %s ORDER BY feature",
        namespace,
        os.getpid(),
    )
    expected = {"acquire": ["feat"], "claim": ["a", "feat"], "done": []}[operation]
    assert [row[0] for row in mine] == expected
