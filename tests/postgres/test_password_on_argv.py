"""A password on the command line (issue 27 item 11): ``ps`` shows every user a command's
arguments for as long as it runs (``lock run``: as long as CMD runs). A ``--backend`` URL that
holds a password is said once on stderr to be visible, naming the safe ways; a password that
comes through the environment is not (only its own user reads a process's environment)."""

from __future__ import annotations

import subprocess
import urllib.parse
from pathlib import Path

import pytest

from tests.postgres.test_cli import cli
from tests.support.postgres import APP_PASSWORD, PgServer

SAFE_WAYS = ("PGPASSWORD", "~/.pgpass", "PGSERVICE")


def _cli(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return cli(*args, cwd=cwd, env=env, timeout=120)


def _warnings(stderr: str) -> int:
    return stderr.count("visible to other users")


def test_a_password_in_the_backend_option_is_said_once_to_be_visible(
    pg_server: PgServer, namespace: str, tmp_path: Path
) -> None:
    """``lock run`` and a ``lock work`` team of two, each given the password in ``--backend``:
    one warning each, naming the safe ways, never the password; the command works as before.
    Failed before: nothing was said (``_warnings`` was 0)."""
    url = pg_server.url(tcp=True, password=APP_PASSWORD)
    for name in ("a", "b"):
        (tmp_path / ".gsd" / "specs" / name).mkdir(parents=True)
    ran = _cli(
        tmp_path, "lock", "run", "a", "--backend", url, "--namespace", namespace, "--", "true"
    )
    team = _cli(
        tmp_path, "lock", "work", "-j", "2", "--backend", url, "--namespace", namespace,
        "--", "true",
    )  # fmt: skip
    for done in (ran, team):
        assert done.returncode == 0, done.stderr[-400:]
        assert _warnings(done.stderr) == 1, done.stderr[-400:]
        assert all(way in done.stderr for way in SAFE_WAYS), done.stderr[-400:]
        assert APP_PASSWORD not in done.stderr
        assert urllib.parse.quote(APP_PASSWORD, safe="") not in done.stderr


@pytest.mark.parametrize("given", ["environment URL", "PGPASSWORD"])
def test_a_password_from_the_environment_is_not_warned_of(
    pg_server: PgServer, namespace: str, tmp_path: Path, given: str
) -> None:
    """The same password in ``MAHABHARATHA_LOCK_URL``, or in ``PGPASSWORD`` with a URL that
    holds none: nothing to say (the warning would teach people to ignore it)."""
    with_password = pg_server.url(tcp=True, password=APP_PASSWORD)
    if given == "PGPASSWORD":
        env, args = {"PGPASSWORD": APP_PASSWORD}, ["--backend", pg_server.url(tcp=True)]
    else:
        env, args = {"MAHABHARATHA_LOCK_URL": with_password}, []
    ran = _cli(tmp_path, "lock", "run", "a", *args, "--namespace", namespace, "--", "true", env=env)
    assert ran.returncode == 0, ran.stderr[-400:]
    assert _warnings(ran.stderr) == 0, ran.stderr[-400:]
