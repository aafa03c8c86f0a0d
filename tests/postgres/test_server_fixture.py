"""The suite's own PostgreSQL server works (and runs as an unprivileged user under root)."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support import postgres
from tests.unit.test_clean_checkout import NO_HYPOTHESIS


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


def _run_fixture_test(tmp_path: Any, **env: str) -> subprocess.CompletedProcess[str]:
    """Run this file's first test in a child pytest with PostgreSQL made unfindable."""
    target = f"{__file__}::test_server_answers_on_socket_and_port"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", NO_HYPOTHESIS]
    return subprocess.run(
        [*argv, "-rs", target],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, postgres.BINDIR_ENV: str(tmp_path / "no-such-bin"), **env},
        timeout=120,
    )


def test_without_postgresql_the_tests_skip_saying_how_to_install(tmp_path: Any) -> None:
    done = _run_fixture_test(tmp_path, **{postgres.REQUIRE_ENV: "0"})
    assert done.returncode == 0, done.stdout
    assert "1 skipped" in done.stdout and "apt-get install postgresql" in done.stdout


def test_ci_turns_such_a_skip_into_a_failure(tmp_path: Any) -> None:
    """The fixture's skip comes in set-up: it is reported as an error, never as a skip."""
    done = _run_fixture_test(tmp_path, **{postgres.REQUIRE_ENV: "1"})
    assert done.returncode == 1, done.stdout
    assert "1 skipped" not in done.stdout and postgres.REQUIRE_ENV in done.stdout
