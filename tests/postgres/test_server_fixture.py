"""The suite's own PostgreSQL server works (and runs as an unprivileged user under root)."""

from __future__ import annotations

import os
import pwd

from tests.support import postgres


def test_server_answers_on_socket_and_port(pg_server: postgres.PgServer) -> None:
    import psycopg

    with psycopg.connect(pg_server.url(), autocommit=True) as over_socket:
        assert over_socket.execute("SELECT current_user").fetchone() == (postgres.APP_USER,)
    tcp = pg_server.url(tcp=True, password=postgres.APP_PASSWORD)
    with psycopg.connect(tcp, autocommit=True) as over_tcp:
        assert over_tcp.execute("SELECT 1").fetchone() == (1,)


def test_server_runs_unprivileged(pg_server: postgres.PgServer) -> None:
    owner = os.stat(f"/proc/{pg_server.postmaster_pid()}").st_uid
    assert owner != 0
    if os.geteuid() == 0:
        assert pwd.getpwuid(owner).pw_name == pg_server.user
