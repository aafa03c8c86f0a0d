""" "No free connection slot" by SQLSTATE (issue 27 item 8): a server whose ``lc_messages`` is
German refuses for want of a slot in German, for its own ``max_connections``, a role's or a
database's ``CONNECTION LIMIT``. Each is 53300, and each is waited out as a full server is:
``lock acquire`` asks again until a slot comes free, a ``lock work`` holder whose command ended
records its done."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

import psycopg
import pytest

from tests.support.postgres import PgServer, admin_execute, private_server, wait_until

REPO = Path(__file__).resolve().parents[2]
LANGUAGE: Final = "de_DE.UTF-8"
MAX_CONNECTIONS = 10
USABLE_SLOTS = MAX_CONNECTIONS - 3  # superuser_reserved_connections
HANG_GUARD_SECONDS = 120.0
PATIENT_TIMEOUT = "60"
"""``--connect-timeout`` of the commands under test: far longer than the test needs, so a slot
comes free while they still ask."""


@pytest.fixture(scope="module")
def german_server() -> Iterator[PgServer]:
    """A server speaking German (a locale compiled for it with ``localedef``, found through
    ``LOCPATH``), logging each error's SQLSTATE (``log_error_verbosity``)."""
    if shutil.which("localedef") is None:
        pytest.skip("localedef (Debian: the locales package) is needed for a German server")
    folder = tempfile.mkdtemp(prefix="mh-locale-", dir="/tmp")
    os.chmod(folder, 0o755)  # the server's user reads it
    made = subprocess.run(
        ["localedef", "-i", "de_DE", "-f", "UTF-8", os.path.join(folder, LANGUAGE)],
        capture_output=True,
        check=False,
    )
    if made.returncode != 0:
        shutil.rmtree(folder, ignore_errors=True)
        pytest.skip(f"localedef could not make {LANGUAGE}: {made.stderr[-200:]!r}")
    before = os.environ.get("LOCPATH")
    os.environ["LOCPATH"] = folder  # the server (started below) inherits it
    settings = {
        "lc_messages": LANGUAGE,
        "log_error_verbosity": "verbose",
        "max_connections": str(MAX_CONNECTIONS),
    }
    try:
        with private_server(settings) as server:
            os.environ.pop("LOCPATH")
            if before is not None:
                os.environ["LOCPATH"] = before
            yield server
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _refusals(server: PgServer) -> int:
    """Connections the server refused for want of a slot so far (its log, in German, with
    each error's SQLSTATE)."""
    return server.log.read_text(errors="replace").count("FATAL:  53300:")


def _env(url: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run(
        [sys.executable, "-m", "mahabharatha", "lock", "init", "--backend", url],
        env=env,
        check=True,
        capture_output=True,
        timeout=HANG_GUARD_SECONDS,
    )
    return env


@contextmanager
def _no_slot_for_the_app(server: PgServer, limit: str) -> Iterator[None]:
    """No connection slot left for the app role: every one the server has (``server``), or
    the one its role's or its database's ``CONNECTION LIMIT 1`` leaves (taken by the role)."""
    taken: list[psycopg.Connection[tuple[object, ...]]] = []
    undo = None
    if limit == "server":
        taken = [psycopg.connect(server.admin_url()) for _ in range(USABLE_SLOTS)]
    else:
        limited = {"role": "ROLE mh_app", "database": "DATABASE mh"}[limit]
        admin_execute(server, f"ALTER {limited} CONNECTION LIMIT 1")
        undo = f"ALTER {limited} CONNECTION LIMIT -1"
        taken = [_the_one_slot(server.url())]
    try:
        with pytest.raises(psycopg.OperationalError):  # the app role is refused now
            psycopg.connect(server.url()).close()
        yield
    finally:
        for conn in taken:
            conn.close()
        if undo is not None:
            admin_execute(server, undo)


def _the_one_slot(url: str) -> psycopg.Connection[tuple[object, ...]]:
    """The app role's one slot under its limit, once the sessions of the tests before have
    ended on the server too (a backend leaves a moment after its client closed)."""
    got: list[psycopg.Connection[tuple[object, ...]]] = []

    def connected() -> bool:
        try:
            got.append(psycopg.connect(url))
        except psycopg.OperationalError:
            return False
        return True

    assert wait_until(connected, HANG_GUARD_SECONDS), "an earlier session kept the one slot"
    return got[0]


def _refused_twice_and_still_asking(
    server: PgServer, command: subprocess.Popen[bytes], before: int
) -> bool:
    """Was ``command`` refused twice (it asks again) and still running (it did not give up)?"""
    wait_until(
        lambda: _refusals(server) >= before + 2 or command.poll() is not None,
        HANG_GUARD_SECONDS,
    )
    return command.poll() is None


@pytest.mark.parametrize("limit", ["server", "role", "database"])
def test_acquire_waits_for_a_slot_whatever_the_limit_and_the_language(
    german_server: PgServer, tmp_path: Path, limit: str
) -> None:
    """``lock acquire`` refused for want of a slot (in German) asks again until one is free,
    and takes the lock. Failed before: only the English words of the server's own limit were
    recognised, so each of these exited 3 at the first refusal."""
    url = german_server.url()
    env = _env(url)
    with _no_slot_for_the_app(german_server, limit):
        before = _refusals(german_server)
        acquire = subprocess.Popen(
            [sys.executable, "-m", "mahabharatha", "lock", "acquire", f"slot-{limit}",
             "--backend", url, "--namespace", "no-free-slot",
             "--connect-timeout", PATIENT_TIMEOUT],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        waited = _refused_twice_and_still_asking(german_server, acquire, before)
    _, stderr = acquire.communicate(timeout=HANG_GUARD_SECONDS)
    assert waited, stderr.decode(errors="replace")[-400:]
    assert acquire.returncode == 0, stderr.decode(errors="replace")[-400:]


def test_a_holder_whose_command_ended_records_its_done_once_the_role_has_a_slot(
    german_server: PgServer, tmp_path: Path
) -> None:
    """A ``lock work`` holder at rest (no connection); the role's ``CONNECTION LIMIT`` is
    reached meanwhile; its command ends. It asks for a slot while its lease lasts, then marks
    the feature done. Failed before: "zu viele Verbindungen für Rolle" was not recognised: the
    worker exited 3 with its command's success unrecorded and its lock held."""
    url = german_server.url()
    env = _env(url)
    (tmp_path / ".gsd" / "specs" / "long").mkdir(parents=True)
    worker = subprocess.Popen(
        [sys.executable, "-m", "mahabharatha", "lock", "work", "long", "--backend", url,
         "--namespace", "no-free-slot-work", "--connect-timeout", PATIENT_TIMEOUT,
         "--", "head", "-c", "1"],
        cwd=tmp_path, env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    held = (
        "SELECT count(*) FROM mahabharatha_locks WHERE namespace = 'no-free-slot-work'"
        " AND pid IS NOT NULL"
    )
    app_sessions = "SELECT count(*) FROM pg_stat_activity WHERE usename = 'mh_app'"
    try:
        assert wait_until(lambda: admin_execute(german_server, held)[0][0] == 1, 60)
        assert wait_until(lambda: admin_execute(german_server, app_sessions)[0][0] == 0, 60)
        with _no_slot_for_the_app(german_server, "role"):
            before = _refusals(german_server)
            assert worker.stdin is not None
            with worker.stdin:
                worker.stdin.write(b"x")  # the command ends: the worker must record it
            worker.stdin = None
            waited = _refused_twice_and_still_asking(german_server, worker, before)
        _, stderr = worker.communicate(timeout=HANG_GUARD_SECONDS)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    said = stderr.decode(errors="replace")
    assert waited, said[-400:]
    assert worker.returncode == 0, said[-400:]
    done = admin_execute(
        german_server,
        "SELECT count(*) FROM mahabharatha_locks WHERE namespace = 'no-free-slot-work'"
        " AND done_at IS NOT NULL AND pid IS NULL",
    )
    assert done[0][0] == 1
