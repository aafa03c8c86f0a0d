"""Passwords never shown; names stored verbatim (no SQL is built from input); a role with only
SELECT, INSERT, UPDATE and DELETE works once the tables exist.

Fails before this change: there was no PostgreSQL backend at all."""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from mahabharatha.backends.base import BackendError, Requester
from tests.support.postgres import APP_PASSWORD, PgServer, admin_execute


def _shown(error: BaseException) -> str:
    return f"{error} {error!r} {error.args!r} {error.__cause__!r} {error.__context__!r}"


def test_password_never_appears_in_errors(
    make_backend: Callable[..., Any], pg_server: PgServer
) -> None:
    right = pg_server.url(tcp=True, password=APP_PASSWORD)
    wrong_password = "Wr0ng-'pass\"word"
    wrong = pg_server.url(tcp=True, password=wrong_password)
    good = make_backend(url=right)
    assert good.try_acquire("feat", Requester(1)).held is not None
    assert APP_PASSWORD not in f"{good!r} {good.where()}"
    refused = make_backend(url=wrong)
    with pytest.raises(BackendError) as login:
        refused.inspect("feat")
    assert wrong_password not in _shown(login.value)
    assert f"127.0.0.1:{pg_server.port}/mh" in str(login.value)
    pg_server.stop()
    try:
        down = make_backend(url=right)
        with pytest.raises(BackendError) as unreachable:
            down.inspect("feat")
    finally:
        pg_server.start()
    assert APP_PASSWORD not in _shown(unreachable.value)
    assert APP_PASSWORD not in pg_server.log.read_text(errors="replace")


def test_a_password_the_server_quotes_back_is_redacted(
    make_backend: Callable[..., Any], pg_server: PgServer
) -> None:
    """The server's own message can hold the password: here the role is named like it, and
    the refusal says 'password authentication failed for user "<it>"'. The error must show
    it as *** (fails with the redaction removed from the error path: the other password
    tests provoke no message that holds the password). The driver's own error stays
    reachable as ``__context__`` (suppressed: never printed); what is shown is checked."""
    secret = "Quoted-back-pw-7"
    refused = make_backend(url=pg_server.url(tcp=True, role=secret, password=secret))
    with pytest.raises(BackendError) as login:
        refused.inspect("feat")
    assert "***" in str(login.value)  # the server did quote it: the case is exercised
    printed = "".join(traceback.format_exception(login.value))  # what a traceback shows
    assert secret not in f"{login.value} {login.value!r} {login.value.args!r} {printed}"


def test_password_from_pgpassword_is_never_shown(
    make_backend: Callable[..., Any], pg_server: PgServer, monkeypatch: Any
) -> None:
    monkeypatch.setenv("PGPASSWORD", "env-Secret-pw")
    backend = make_backend(url=pg_server.url(tcp=True))
    with pytest.raises(BackendError) as refused:
        backend.inspect("feat")
    assert "env-Secret-pw" not in _shown(refused.value)
    monkeypatch.setenv("PGPASSWORD", APP_PASSWORD)
    assert make_backend(url=pg_server.url(tcp=True)).inspect("feat").state == "free"


ODD = [
    "it's",
    'say "hi"',
    "back\\slash\\\\",
    "x'); DROP TABLE mahabharatha_locks; --",
    "%(ns)s %s {}",
    "ünïcødé ✓",
]


@pytest.mark.parametrize("name", ODD)
def test_odd_names_are_stored_and_shown_verbatim(
    make_backend: Callable[..., Any], pg_server: PgServer, name: str
) -> None:
    backend = make_backend(namespace=name)
    held = backend.try_acquire(name, Requester(1)).held
    assert [info.feature for info in backend.status()] == [name]
    assert backend.inspect(name).pid == 1 and backend.verify(name, held.token)
    assert backend.try_claim([name, "plain"], Requester(2)).held.feature == "plain"
    stored = admin_execute(
        pg_server, "SELECT namespace FROM mahabharatha_locks WHERE feature = %s", name
    )
    assert stored == [(name,)]


@pytest.fixture
def dml_only(pg_server: PgServer) -> Iterator[str]:
    """A database whose tables were made by ``init`` as their owner, and a role that may only
    read and write rows there (no CREATE anywhere): its URL."""
    from mahabharatha.backends.postgres.backend import PostgresBackend

    admin_execute(pg_server, "CREATE DATABASE mh_dml_db")
    admin_execute(pg_server, "CREATE ROLE mh_dml LOGIN")
    owner = PostgresBackend(pg_server.url(role="mh_admin", database="mh_dml_db"), namespace="n")
    assert owner.init() == 2  # schema 2: failed attempts in the row (issue 18)
    owner.close()
    import psycopg

    with psycopg.connect(
        pg_server.url(role="mh_admin", database="mh_dml_db"), autocommit=True
    ) as admin:
        admin.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        admin.execute(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON mahabharatha_locks, mahabharatha_schema"
            " TO mh_dml"
        )
        admin.execute("GRANT USAGE ON SEQUENCE mahabharatha_lock_token TO mh_dml")
    try:
        yield pg_server.url(role="mh_dml", database="mh_dml_db")
    finally:
        admin_execute(pg_server, "DROP DATABASE mh_dml_db WITH (FORCE)")
        admin_execute(pg_server, "DROP ROLE mh_dml")


def test_a_role_with_only_dml_works_after_init(
    make_backend: Callable[..., Any], dml_only: str
) -> None:
    backend = make_backend(url=dml_only)
    mine = Requester(os.getpid())
    held = backend.try_acquire("feat", mine, lease=60).held
    backend.refresh(held)
    assert backend.verify("feat", held.token)
    claimed = backend.try_claim(["a", "b"], mine).held
    backend.done(claimed.feature, os.getpid())
    assert backend.reopen(claimed.feature)
    assert [info.feature for info in backend.status()] == ["feat"]
    backend.clean()
    assert backend.release_held(held)
    assert backend.init() == 2  # nothing to create: no DDL right needed


def test_without_the_tables_a_dml_role_is_told_what_to_do(
    make_backend: Callable[..., Any], pg_server: PgServer
) -> None:
    admin_execute(pg_server, "CREATE DATABASE mh_empty_db")
    admin_execute(pg_server, "CREATE ROLE mh_reader LOGIN")
    try:
        backend = make_backend(url=pg_server.url(role="mh_reader", database="mh_empty_db"))
        with pytest.raises(BackendError, match="lock init"):
            backend.inspect("feat")
        backend.close()
    finally:
        admin_execute(pg_server, "DROP DATABASE mh_empty_db WITH (FORCE)")
        admin_execute(pg_server, "DROP ROLE mh_reader")


URL_FORMS = {
    "raw percent": ("postgresql://mh_app:pa%ss-Hidden1@127.0.0.1:{port}/mh", ["pa%ss-Hidden1"]),
    "raw space": ("postgresql://mh_app:pa ss-Hidden1@127.0.0.1:{port}/mh", ["ss-Hidden1"]),
    "unclosed bracket": ("postgresql://mh_app:Hidden1-pw@[::1/mh", ["Hidden1"]),
    "key=value string": ("host=127.0.0.1 port={port} password=Hidden1-pw", ["Hidden1"]),
    "unescaped at": ("postgresql://mh_app:Sec@Hidden1-pw@127.0.0.1:{port}/mh", ["Hidden1", "Sec"]),
    "raw slash": ("postgresql://mh_app:Sec/Hidden1-pw@127.0.0.1:{port}/mh", ["Hidden1", "Sec"]),
    "query password": ("postgresql://127.0.0.1:{port}/mh?password=pa%zzHidden1", ["Hidden1"]),
}


@pytest.mark.parametrize("form", sorted(URL_FORMS))
@pytest.mark.parametrize("via", ["--backend", "MAHABHARATHA_LOCK_URL"])
def test_a_password_in_any_url_form_is_never_printed(
    pg_server: PgServer, tmp_path: Any, form: str, via: str
) -> None:
    """Every way to write a password wrongly, on stderr and in ``--json``. Failed before: libpq's
    parse error quoted the password ("invalid percent-encoded token", "unexpected spaces", the
    whole URI for an unclosed ``[``), an unknown URL was echoed whole (a key=value string is
    all secret), and an unescaped ``@`` made the password's end the host named in the error."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    template, secrets_ = URL_FORMS[form]
    url = template.format(port=pg_server.port)
    args = ["--backend", url] if via == "--backend" else []
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    if via != "--backend":
        env["MAHABHARATHA_LOCK_URL"] = url
    options = [*args, "--namespace", "n", "--json", "--connect-timeout", "2"]
    commands = (["check", "f"], ["acquire", "f"], ["status"])
    with contextlib.ExitStack() as reaped:  # every one waited for, whatever fails
        started = [  # side by side: each waits on its own failed connection
            reaped.enter_context(
                subprocess.Popen(
                    [sys.executable, "-m", "mahabharatha", "lock", *command, *options],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    cwd=tmp_path,
                    env=env,
                )
            )
            for command in commands
        ]
        for command, proc in zip(commands, started, strict=True):
            stdout, stderr = proc.communicate(timeout=60)
            shown = stdout + stderr
            assert proc.returncode in (2, 3), shown
            assert "error" in json.loads(stdout), stdout
            assert "Traceback" not in stderr
            for secret in secrets_:
                assert secret not in shown, (command, shown)


def test_only_the_commands_name_is_stored(
    make_backend: Callable[..., Any], pg_server: PgServer
) -> None:
    """Namespaces are not a security boundary: any role of the table reads every row. Failed
    before: ``lock run``'s whole command line was stored, a secret argument with it."""
    from mahabharatha.owner import ownership

    backend = make_backend()
    command = ["/usr/local/bin/deploy", "--token=Hidden-Arg-1", "prod"]
    details = ownership.details_of(os.getpid(), command)
    assert b"Hidden-Arg-1" in details  # the file backend keeps it (on this host, 0600)
    held = backend.try_acquire("feat", Requester(os.getpid(), details)).held
    claimed = backend.try_claim(["c"], Requester(os.getpid(), details)).held
    assert held is not None and claimed is not None
    stored = admin_execute(
        pg_server, "SELECT details FROM mahabharatha_locks WHERE namespace = %s", backend.namespace
    )
    assert len(stored) == 2
    original = ownership.decode(details)
    assert original is not None
    for (raw,) in stored:
        assert isinstance(raw, bytes)
        decoded = ownership.decode(raw)
        assert decoded is not None and decoded.cmd == "deploy"
        assert decoded._replace(cmd=None) == original._replace(cmd=None)  # the rest is kept
