"""The CLI on PostgreSQL: the same commands, plus --backend, --namespace, --connect-timeout,
--lease, lock init, lock verify, host and token in JSON, MAHABHARATHA_LOCK_TOKEN for lock run;
an unreachable server answers exit 3 in time, naming it and never its password.

Fails before this change: the CLI had no --backend (every call here would exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cli import _hooked
from tests.support.postgres import APP_PASSWORD, PgServer

REPO = Path(__file__).resolve().parents[2]
HANG_GUARD_SECONDS = 1.0


def cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mahabharatha", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        timeout=timeout,
    )


@pytest.fixture
def where(pg_server: PgServer, namespace: str, tmp_path: Path) -> dict[str, Any]:
    """A work folder with two feature folders, and the options naming the test's lock space."""
    for name in ("alpha", "beta"):
        (tmp_path / ".gsd" / "specs" / name).mkdir(parents=True)
    return {"cwd": tmp_path, "opts": ["--backend", pg_server.url(), "--namespace", namespace]}


def test_commands_answer_with_host_and_token(where: dict[str, Any]) -> None:
    cwd, opts = where["cwd"], where["opts"]
    assert cli("lock", "init", *opts, cwd=cwd).returncode == 0
    before = time.monotonic()
    got = cli("lock", "acquire", "alpha", *opts, "--json", "--lease", "600", cwd=cwd)
    assert got.returncode == 0, got.stderr
    acquired = json.loads(got.stdout)
    assert acquired["acquired"] and isinstance(acquired["token"], int) and acquired["host"]
    assert cli("lock", "acquire", "alpha", *opts, "--pid", "1", cwd=cwd).returncode == 1
    checked = cli("lock", "check", "alpha", *opts, "--json", cwd=cwd)
    info = json.loads(checked.stdout)
    assert checked.returncode == 1 and info["token"] == acquired["token"]
    # The lease counts down from the acquire: by no more than the time these calls took.
    assert 600 - (time.monotonic() - before) - 1 < info["expires_in_seconds"] <= 600
    token = str(acquired["token"])
    assert cli("lock", "verify", "alpha", "--token", token, *opts, cwd=cwd).returncode == 0
    wrong = str(acquired["token"] + 1000)
    assert cli("lock", "verify", "alpha", "--token", wrong, *opts, cwd=cwd).returncode == 1
    claimed = json.loads(cli("lock", "claim", *opts, "--json", cwd=cwd).stdout)
    assert claimed["feature"] == "beta" and claimed["token"] > acquired["token"]
    # None free: for another owner they are held by others (wait), for this caller its own
    # (exit 1 at once: a claim never waits for itself).
    assert cli("lock", "claim", *opts, "--pid", "1", cwd=cwd).returncode == 75
    assert cli("lock", "claim", *opts, cwd=cwd).returncode == 1
    assert cli("lock", "done", "beta", *opts, cwd=cwd).returncode == 0
    assert cli("lock", "release", "alpha", *opts, cwd=cwd).returncode == 0
    listed = json.loads(cli("lock", "status", "--all", *opts, "--json", cwd=cwd).stdout)["features"]
    assert {entry["feature"]: entry["state"] for entry in listed} == {
        "alpha": "free",
        "beta": "done",
    }
    assert cli("lock", "verify", "alpha", "--token", token, *opts, cwd=cwd).returncode == 1


def test_files_have_no_tokens_and_no_lease(where: dict[str, Any]) -> None:
    cwd = where["cwd"]
    assert cli("lock", "verify", "alpha", "--token", "1", cwd=cwd).returncode == 2
    assert cli("lock", "acquire", "alpha", "--lease", "60", cwd=cwd).returncode == 2
    plain = json.loads(cli("lock", "acquire", "alpha", "--json", cwd=cwd).stdout)
    assert plain["token"] is None and plain["acquired"]


def test_environment_chooses_the_backend_and_lock_run_passes_its_token(
    where: dict[str, Any], pg_server: PgServer, namespace: str
) -> None:
    env = {"MAHABHARATHA_LOCK_URL": pg_server.url(), "MAHABHARATHA_LOCK_NAMESPACE": namespace}
    check = "mahabharatha lock verify alpha --token $MAHABHARATHA_LOCK_TOKEN"
    script = f"{sys.executable} -m {check.replace('mahabharatha ', 'mahabharatha ', 1)}"
    ran = cli("lock", "run", "alpha", "--json", "--", "sh", "-c", script, cwd=where["cwd"], env=env)
    assert ran.returncode == 0, ran.stderr  # CMD's own verify of its token: current
    document = json.loads(ran.stdout)
    assert isinstance(document["token"], int) and document["exit_code"] == 0


def test_without_a_namespace_it_says_to_pass_one(pg_server: PgServer, tmp_path: Path) -> None:
    bare = cli(
        "lock",
        "check",
        "alpha",
        "--backend",
        pg_server.url(),
        cwd=tmp_path,
        env={"MAHABHARATHA_LOCK_NAMESPACE": "", "GIT_CEILING_DIRECTORIES": str(tmp_path.parent)},
    )
    assert bare.returncode == 2 and "--namespace" in bare.stderr


def test_without_psycopg_a_url_names_the_install_command(tmp_path: Path) -> None:
    hide = (
        "import sys; sys.modules['psycopg'] = None; sys.argv = ['mahabharatha', 'lock', "
        "'check', 'x', '--backend', 'postgresql:///db', '--namespace', 'n']; "
        "from mahabharatha.cli import main; main()"
    )
    done = subprocess.run(
        [sys.executable, "-c", hide],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert done.returncode == 2 and "pip install '.[postgres]' in the mahabharatha checkout" in (
        done.stderr
    )


def test_the_cli_never_imports_psycopg_for_files(tmp_path: Path) -> None:
    probe = (
        "import sys; from mahabharatha.cli import lock, main; "
        "assert 'psycopg' not in sys.modules, 'psycopg imported at start'"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


COMMANDS = [
    ["lock", "acquire", "alpha"],
    ["lock", "release", "alpha"],
    ["lock", "check", "alpha"],
    ["lock", "claim"],
    ["lock", "status"],
    ["lock", "clean"],
    ["lock", "done", "alpha"],
    ["lock", "reopen", "alpha"],
    ["lock", "verify", "alpha", "--token", "1"],
    ["lock", "run", "alpha", "--", "true"],
]


@pytest.mark.parametrize("fault", ["stopped", "frozen"])
def test_every_command_answers_exit_3_in_time_naming_the_server(
    where: dict[str, Any], pg_server: PgServer, fault: str
) -> None:
    secret_url = pg_server.url(tcp=True, password=APP_PASSWORD)
    opts = ["--backend", secret_url, "--namespace", "n", "--connect-timeout", "2", "--json"]
    if fault == "stopped":
        pg_server.stop()
    else:
        pg_server.freeze()
    # A frozen server costs the whole timeout per command: a sample of them (time budget).
    commands = COMMANDS if fault == "stopped" else [COMMANDS[0], COMMANDS[4], COMMANDS[-1]]
    try:
        start_cost = 0.0
        for command in commands:
            if fault == "frozen" or not start_cost:  # the interpreter's start, at this load
                start = time.monotonic()
                cli(*command[:2], "--help", cwd=where["cwd"], timeout=30)
                start_cost = time.monotonic() - start
            start = time.monotonic()
            cut = command.index("--") if "--" in command else len(command)  # options before CMD
            done = cli(*command[:cut], *opts, *command[cut:], cwd=where["cwd"], timeout=30)
            took = time.monotonic() - start
            assert done.returncode == 3, (command, done.stdout, done.stderr)
            assert f"127.0.0.1:{pg_server.port}/mh" in done.stderr
            assert APP_PASSWORD not in done.stdout + done.stderr
            assert "error" in json.loads(done.stdout)
            # The interpreter's own start is not the server's wait: measured just before.
            assert took < 2 + HANG_GUARD_SECONDS + 2 * start_cost, (command, took, start_cost)
    finally:
        if fault == "stopped":
            pg_server.start()
        else:
            pg_server.resume()


def test_lock_run_loses_its_lock_when_the_lease_runs_out_unreachable(
    where: dict[str, Any], pg_server: PgServer
) -> None:
    """The server goes away while CMD runs: the heartbeat keeps retrying; when the lease has
    run out, the lock is lost, CMD is stopped and lock run exits 76 ("lost"). Failed before
    the fix: the final release could not reach the server either and turned 76 into exit 3."""
    cwd, opts = where["cwd"], where["opts"]
    marker = cwd / "started"
    script = f"touch {marker}; exec sleep 60"
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mahabharatha",
            "lock",
            "run",
            "alpha",
            *opts,
            "--lease",
            "2",
            "--connect-timeout",
            "1",
            "--json",
            "--",
            "sh",
            "-c",
            script,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        deadline = time.monotonic() + 30
        while not marker.exists():  # CMD runs: the lock is held (no event to wait on here)
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()
            time.sleep(0.05)
        pg_server.stop()
        try:
            out, err = run.communicate(timeout=30)
        finally:
            pg_server.start()
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 76, err
    assert json.loads(out)["error"] == "lost"


STARTS = "echo started; read line"  # CMD: says it runs, ends at the test's word


def test_lock_run_releases_after_a_server_restart_while_its_lease_lasts(
    where: dict[str, Any], pg_server: PgServer
) -> None:
    """The server is down when CMD ends: the release (a refused connect: nothing sent) waits
    for it while the lease lasts, then releases; lock run exits with CMD's code. Failed
    before: exit 3 at the refused connect, the lock left held for the rest of its lease."""
    cwd, opts = where["cwd"], where["opts"]
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            *("mahabharatha", "-v", "lock", "run", "alpha"),
            *opts,
            "--",
            "sh",
            "-c",
            STARTS,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert run.stdout is not None and run.stdin is not None and run.stderr is not None
        _hooked.lines_until(run.stdout, "started")
        pg_server.stop()
        try:
            run.stdin.write("go\n")
            run.stdin.flush()
            _hooked.lines_until(run.stderr, "waiting for the server to answer")
        finally:
            pg_server.start()
        _, err = run.communicate(timeout=30)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 0, err
    assert cli("lock", "check", "alpha", *opts, cwd=cwd).returncode == 0  # free


def test_a_taken_over_holders_token_no_longer_verifies(
    where: dict[str, Any], pg_server: PgServer, namespace: str
) -> None:
    from tests.support.postgres import expire

    cwd, opts = where["cwd"], where["opts"]
    old = json.loads(cli("lock", "acquire", "alpha", *opts, "--json", cwd=cwd).stdout)["token"]
    expire(pg_server, namespace, "alpha")  # its lease ran out, by the server's clock
    new = cli("lock", "acquire", "alpha", *opts, "--pid", "1", "--json", cwd=cwd)
    assert new.returncode == 0 and json.loads(new.stdout)["token"] > old
    assert cli("lock", "verify", "alpha", "--token", str(old), *opts, cwd=cwd).returncode == 1


def test_a_password_in_the_url_is_never_printed(
    where: dict[str, Any], pg_server: PgServer, namespace: str
) -> None:
    url = pg_server.url(tcp=True, password=APP_PASSWORD)
    opts = ["--backend", url, "--namespace", namespace]
    cwd = where["cwd"]
    outputs = [
        cli("lock", "acquire", "alpha", *opts, "--json", cwd=cwd),
        cli("lock", "acquire", "alpha", *opts, "--pid", "1", cwd=cwd),  # held: names holder
        cli("lock", "check", "alpha", *opts, "--json", cwd=cwd),
        cli("lock", "status", "--all", *opts, cwd=cwd),
        cli("lock", "init", *opts, "--json", cwd=cwd),
        cli("lock", "acquire", "--help", cwd=cwd, env={"MAHABHARATHA_LOCK_URL": url}),
    ]
    assert [done.returncode for done in outputs] == [0, 1, 1, 0, 0, 0]
    for done in outputs:
        assert APP_PASSWORD not in done.stdout + done.stderr


def test_a_namespace_over_200_bytes_is_bad_input(where: dict[str, Any]) -> None:
    """Failed before: an ~8,000-byte namespace was taken, then release, ``--force`` and ``done``
    failed ("payload string too long": the release's NOTIFY carries it) and clean skipped it."""
    cwd, opts = where["cwd"], where["opts"][:2]
    longest = "n" * 198 + "é"  # 200 bytes: allowed
    taken, forced, done_ = ["acquire", "alpha"], ["release", "alpha", "--force"], ["done", "alpha"]
    for command in (taken, forced, taken, done_):
        done = cli("lock", *command, *opts, "--namespace", longest, cwd=cwd)
        assert done.returncode == 0, done.stderr
    too_long = "ü" * 101  # 202 bytes, 101 characters
    for command in (["acquire", "alpha"], ["check", "alpha"], ["clean"]):
        refused = cli("lock", *command, *opts, "--namespace", too_long, "--json", cwd=cwd)
        assert refused.returncode == 2, refused.stderr
        assert "at most 200" in json.loads(refused.stdout)["error"]
        assert "Traceback" not in refused.stderr


def test_lock_init_serves_every_namespace_not_the_environments(
    pg_server: PgServer, tmp_path: Path
) -> None:
    """``lock init`` makes the tables of every namespace: a ``MAHABHARATHA_LOCK_NAMESPACE`` that
    other commands refuse (over 200 bytes) does not stop it. Fails on a rewrite of the CLI's
    shared options that gave init the environment's namespace (it takes only one given to it)."""
    env = {"MAHABHARATHA_LOCK_NAMESPACE": "ü" * 101}  # 202 bytes
    url = pg_server.url()
    made = cli("lock", "init", "--backend", url, cwd=tmp_path, env=env)
    assert made.returncode == 0, made.stderr
    refused = cli("lock", "check", "alpha", "--backend", url, "--json", cwd=tmp_path, env=env)
    assert refused.returncode == 2, refused.stderr
    assert "at most 200" in json.loads(refused.stdout)["error"]
