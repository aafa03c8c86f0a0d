"""A worker pool on PostgreSQL: ``lock work`` workers, ``lock fail`` in the row, ``claim``'s
exit codes and ``--wait`` woken by NOTIFY, and local ``.completed`` markers honoured.

Fails before issue 18: there was no ``lock work`` nor ``lock fail``, ``claim`` exited 1 for
"held by others", and a feature with a ``.completed`` marker on disk was handed out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from mahabharatha import locks
from mahabharatha.pool import claim
from tests.cli import _hooked
from tests.cli import test_work_jobs as jobs_test
from tests.cli import test_work_pool as pool_test
from tests.cli._support import RUN_TIMEOUT, SYNC_TIMEOUT
from tests.support.marks import needs_fifo, posix_signals
from tests.support.postgres import HostileServer, PgServer, admin_execute

CLI = (sys.executable, "-m", "mahabharatha")


@pytest.fixture(params=["plain", "hostile"])
def lock_server(request: pytest.FixtureRequest, pg_server: PgServer) -> tuple[PgServer, str]:
    """Every test twice: on the plain server, and on the hostile one through its pooler (issue
    27: every setting flipped by role and database defaults, a neighbour's ``SET``); the
    server and the URL the test's commands use."""
    if request.param == "plain":
        return pg_server, pg_server.url()
    hostile: HostileServer = request.getfixturevalue("hostile_pg")
    return hostile.server, hostile.url()


@pytest.fixture
def on_server(
    lock_server: tuple[PgServer, str], namespace: str, monkeypatch: pytest.MonkeyPatch
) -> str:
    """This test's lock space, chosen through the environment as a user would."""
    monkeypatch.setenv("MAHABHARATHA_LOCK_URL", lock_server[1])
    monkeypatch.setenv("MAHABHARATHA_LOCK_NAMESPACE", namespace)
    return namespace


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, cwd=cwd, timeout=SYNC_TIMEOUT
    )


def test_four_workers_finish_thirty_features_on_postgresql(on_server: str, tmp_path: Path) -> None:
    """The files pool test, on the server: done once or failed after exactly --attempts, each
    worker exits 1 (finished, some failed), no lock left; done features get their local
    marker too."""
    for name in pool_test.FEATURES:
        (tmp_path / ".gsd" / "specs" / name).mkdir(parents=True)
    pool_test._executable(tmp_path / "build-feature.sh", pool_test.BUILD_STEP)
    (tmp_path / "runs.log").touch()
    with pool_test.workers(tmp_path) as team:
        codes = pool_test.wait_all(team)
        errors = [w.stderr.read().decode() if w.stderr else "" for w in team]
    assert codes == [1] * pool_test.WORKERS, (codes, errors)
    pool_test.assert_every_feature_finished_once(pool_test.log(tmp_path), tmp_path, files=False)
    listed = json.loads(cli("lock", "status", "--all", "--json", cwd=tmp_path).stdout)["features"]
    states = {entry["feature"]: (entry["state"], entry.get("attempts")) for entry in listed}
    for name in pool_test.BROKEN:
        assert states[name] == ("failed", pool_test.ATTEMPTS)
    assert not [name for name, (state, _) in states.items() if state not in ("done", "failed")]


def test_one_command_of_four_jobs_finishes_thirty_features_on_postgresql(
    on_server: str, tmp_path: Path
) -> None:
    """``lock work -j 4`` on the server: each forked worker opens a connection of its own
    (one shared across the fork would interleave the workers' statements), and the pool ends
    as the four separate workers do."""
    pool_test.make_pool(tmp_path)
    with jobs_test.team(tmp_path) as command:
        out, err = command.communicate(timeout=pool_test.POOL_TIMEOUT)
    assert command.returncode == 1, err  # finished, some failed
    assert "Traceback" not in err
    document = json.loads(out)
    assert document["ended"] == "finished" and len(document["workers"]) == jobs_test.JOBS
    assert sorted(document["failed"]) == sorted(pool_test.BROKEN)
    pool_test.assert_every_feature_finished_once(pool_test.log(tmp_path), tmp_path, files=False)


def test_a_claimer_holding_the_rest_never_waits_for_itself_on_postgresql(
    on_server: str, tmp_path: Path
) -> None:
    """The one-statement claim skips every held row, the claimer's own too: before the fix a
    claimer holding the rest got 75, and with ``--wait`` waited for itself."""
    for name in ("alpha", "beta"):
        (tmp_path / ".gsd" / "specs" / name).mkdir(parents=True)
    me = str(os.getpid())
    for _ in range(2):
        assert cli("lock", "claim", "--pid", me, cwd=tmp_path).returncode == 0
    again = cli("lock", "claim", "--pid", me, "--wait", "--json", cwd=tmp_path)
    assert again.returncode == 1, again.stderr
    assert json.loads(again.stdout)["mine"] == ["alpha", "beta"]
    assert cli("lock", "claim", "--pid", "1", cwd=tmp_path).returncode == 75


@needs_fifo
@posix_signals
def test_a_killed_job_of_a_team_is_replaced_on_postgresql(on_server: str, tmp_path: Path) -> None:
    """``lock work -j 4 --reclaim-dead`` on the server, one worker SIGKILLed mid-build: its
    feature is built again once its orphaned build ends, and the team then finishes."""
    jobs_test.a_killed_job_is_replaced(pool_test.make_pool(tmp_path), files=False)


def test_claim_exit_codes_fail_and_reopen_on_postgresql(on_server: str, tmp_path: Path) -> None:
    (tmp_path / ".gsd" / "specs" / "alpha").mkdir(parents=True)
    me = str(os.getpid())
    assert cli("lock", "claim", "--pid", me, cwd=tmp_path).returncode == 0
    assert cli("lock", "claim", "--pid", "1", cwd=tmp_path).returncode == 75
    failed = cli("lock", "fail", "alpha", "--pid", me, "--attempts", "1", "--json", cwd=tmp_path)
    assert failed.returncode == 0, failed.stderr
    assert json.loads(failed.stdout)["failed"] is True
    assert cli("lock", "claim", "--pid", me, cwd=tmp_path).returncode == 1
    assert cli("lock", "reopen", "alpha", cwd=tmp_path).returncode == 0
    assert cli("lock", "claim", "--pid", me, cwd=tmp_path).returncode == 0
    assert cli("lock", "fail", "alpha", "--pid", "1", cwd=tmp_path).returncode == 1


def test_a_local_completed_marker_means_done_on_postgresql(on_server: str, tmp_path: Path) -> None:
    for name in ("alpha", "beta"):
        (tmp_path / ".gsd" / "specs" / name).mkdir(parents=True)
    (tmp_path / ".gsd" / "specs" / "alpha" / ".completed").write_text("2026-01-01T00:00:00Z\n")
    claimed = cli("lock", "claim", "--pid", str(os.getpid()), cwd=tmp_path)
    assert (claimed.returncode, claimed.stdout.strip()) == (0, "beta")
    assert cli("lock", "done", "beta", "--pid", str(os.getpid()), cwd=tmp_path).returncode == 0
    assert (tmp_path / ".gsd" / "specs" / "beta" / ".completed").is_file()
    assert cli("lock", "claim", "--pid", str(os.getpid()), cwd=tmp_path).returncode == 1


@pytest.mark.parametrize("lock_server", ["plain"], indirect=True)  # a pooler: nothing LISTENs
def test_claim_wait_is_woken_by_notify_on_postgresql(
    on_server: str,
    lock_server: tuple[PgServer, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The recheck is pushed past the deadline: only the release's NOTIFY can end the wait.
    It is heard on the connection the claims use: the waiter opens no second, listening one
    (failed before: at a pool's end every waiting worker opened one, a server process each)."""
    (tmp_path / ".gsd" / "specs" / "alpha").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert cli("lock", "acquire", "alpha", "--pid", "1", cwd=tmp_path).returncode == 0
    monkeypatch.setattr(claim, "RECHECK_SECONDS", 3600.0)
    from mahabharatha.backends import open_backend

    store: Any = open_backend(os.environ["MAHABHARATHA_LOCK_URL"], ".gsd", namespace=on_server)
    waiting = threading.Event()
    heard_on: list[bool] = []  # per wait: was it on the claims' connection (not a listener)?
    original = store._heard  # the wait on the claims' connection (and on a listener)

    def noted(conn: Any, deadline: float) -> bool:
        heard_on.append(conn is store._conn)
        waiting.set()
        return bool(original(conn, deadline))

    store._heard = noted
    answer: list[str | None] = []
    claimer = threading.Thread(
        target=lambda: answer.append(locks.claim(["alpha"], backend=store, wait=SYNC_TIMEOUT)),
        daemon=True,
    )
    claimer.start()
    assert waiting.wait(SYNC_TIMEOUT)
    assert cli("lock", "release", "alpha", "--pid", "1", cwd=tmp_path).returncode == 0
    claimer.join(SYNC_TIMEOUT)
    assert answer == ["alpha"]
    assert heard_on and all(heard_on)  # no second connection was opened to listen
    locks.release("alpha", backend=store)
    store.close()


RETRY_DELAY = 1.0
"""The rest asked for: short, as the test's own run time."""

ALPHA_FAILS_ONCE = """
import os, pathlib, sys, time
log, beta_done = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
feature = os.environ["MAHABHARATHA_FEATURE"]
first = feature == "alpha" and "alpha" not in log.read_text()
with log.open("a") as out:
    out.write(f"{feature} {time.time()!r}\\n")
deadline = time.monotonic() + 30
while first and not beta_done.exists() and time.monotonic() < deadline:
    time.sleep(0.01)  # the other worker is free (and claims at once) when alpha fails
sys.exit(3 if first else 0)
"""
"""CMD of ``lock work -j 2`` over alpha and beta: logs each start; alpha's first attempt
fails once beta is done (so the other worker is idle, claiming), every other attempt passes."""


def rests_on_the_server(tmp_path: Path, server: PgServer, namespace: str) -> None:
    """``lock work -j 2 --retry-delay``: alpha's second attempt is taken no earlier than the
    delay after its failure, by the times the server recorded, whichever worker takes it."""
    for name in ("alpha", "beta"):
        (tmp_path / ".gsd" / "specs" / name).mkdir(parents=True)
    log = tmp_path / "starts.log"
    log.touch()
    beta_done = tmp_path / ".gsd" / "specs" / "beta" / ".completed"
    work = cli(
        *("lock", "work", "-j", "2", "--attempts", "3", "--retry-delay", str(RETRY_DELAY)),
        *("--", sys.executable, "-c", ALPHA_FAILS_ONCE, str(log), str(beta_done)),
        cwd=tmp_path,
    )
    assert work.returncode == 0, work.stderr
    starts = [line.split()[0] for line in log.read_text().splitlines()]
    assert sorted(starts) == ["alpha", "alpha", "beta"], starts  # nobody took alpha between
    (taken, record), *_ = admin_execute(
        server,
        "SELECT extract(epoch FROM acquired_at), last_failure"  # numeric: no float digits cut
        " FROM mahabharatha.mahabharatha_locks WHERE namespace = %s AND feature = 'alpha'",
        namespace,
    )
    failed_at = json.loads(str(record))["at"]
    assert float(str(taken)) >= failed_at + RETRY_DELAY, (taken, failed_at)


def test_a_failed_feature_rests_for_every_worker_on_postgresql(
    on_server: str, lock_server: tuple[PgServer, str], tmp_path: Path
) -> None:
    """Failed before: the claim statement read no failure time, so the other worker (idle,
    woken by the failure's release) took alpha again at once (0.0-0.1 s after it failed)."""
    rests_on_the_server(tmp_path, lock_server[0], on_server)


def test_the_workers_import_no_driver_after_the_fork(on_server: str, tmp_path: Path) -> None:
    """On PostgreSQL the team imports the driver (psycopg, about 90 ms) before it forks its
    workers, not once in each of them."""
    assert jobs_test.modules_imported_after_the_fork(tmp_path) == []


@pytest.mark.parametrize("lock_server", ["plain"], indirect=True)  # the server itself restarts
def test_a_server_restart_as_cmd_ends_does_not_lose_its_success(
    on_server: str, lock_server: tuple[PgServer, str], tmp_path: Path
) -> None:
    """Contract: done once, never a lost success; "done, fail and release are retried when
    their statement provably was not sent"; the holder's lease (60 s) still runs. The server
    is down just as CMD succeeds: the done waits for it (a refused connect sends nothing) and
    is recorded once it is back; the next worker does not run CMD again. Failed before (the
    hunt, F2): the refused connect raised at once, ``lock work`` exited 3 with its lock left
    under a live lease, and a --reclaim-dead worker ran CMD again: (3, 0, 'done', ['A', 'A'])."""
    server = lock_server[0]
    (tmp_path / ".gsd" / "specs" / "A").mkdir(parents=True)
    runs = tmp_path / "runs.log"
    script = 'echo started; read line; echo "$MAHABHARATHA_FEATURE" >> runs.log'
    with _hooked.cli_job(["lock", "work", "A", "--", "sh", "-c", script], tmp_path) as worker:
        assert worker.stdout is not None and worker.stdin is not None
        _hooked.lines_until(worker.stdout, "started")
        server.stop()
        try:
            worker.stdin.write("go\n")
            worker.stdin.flush()
            _hooked.wait_for_line(runs, worker)  # CMD succeeded; its done meets a stopped server
        finally:
            server.start()
        _, err = worker.communicate(timeout=RUN_TIMEOUT)
        first = worker.returncode
    # The next worker of the pool: it must find A done (or wait for it), never run it again.
    again = subprocess.run(
        [*CLI, "lock", "work", "A", "--reclaim-dead", "--wait", "5", "--", "sh", "-c", script],
        cwd=tmp_path,
        input="go\n",
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    state = _hooked.state_of("A", tmp_path, dict(os.environ))
    ran = runs.read_text().split()
    assert (first, again.returncode, state, ran) == (0, 0, "done", ["A"]), (err, again.stderr)


@pytest.mark.parametrize("lock_server", ["plain"], indirect=True)  # the server itself stops
def test_a_signal_ends_a_done_waiting_for_a_stopped_server(
    on_server: str, lock_server: tuple[PgServer, str], tmp_path: Path
) -> None:
    """CMD succeeded, the server is down, the done waits for it: SIGINT ends that wait at once
    (the relay's pause, as for a kernel lease on files): the feature is lost, its lock left
    to its lease, the worker stopped with 130. Failed before: the done waited, deaf to the
    signal, until the lease ended (60 s; on main: exit 3 at once, never waiting)."""
    server = lock_server[0]
    (tmp_path / ".gsd" / "specs" / "A").mkdir(parents=True)
    args = ["-v", "lock", "work", "A", "--json", "--", "sh", "-c", "echo started; read line"]
    with _hooked.cli_job(args, tmp_path) as worker:
        assert worker.stdout is not None and worker.stdin is not None
        assert worker.stderr is not None
        _hooked.lines_until(worker.stderr, "started")  # CMD's output: on stderr with --json
        server.stop()
        try:
            worker.stdin.write("go\n")
            worker.stdin.flush()
            _hooked.lines_until(worker.stderr, "waiting for the server to answer")
            worker.send_signal(signal.SIGINT)
            out, err = worker.communicate(timeout=RUN_TIMEOUT)
        finally:
            server.start()
    assert worker.returncode == 130, err
    (result,) = json.loads(out)["results"]
    assert result["outcome"] == "lost", (out, err)
    assert "while waiting for the lock server to take the end of 'A'" in result["reason"]
    assert _hooked.state_of("A", tmp_path, dict(os.environ)) == "active"  # left to its lease


HOOK_STATUS_AFTER_EMPTY_CLAIM = """
import os
from mahabharatha.backends.postgres.backend import PostgresBackend

_status = PostgresBackend.status
_paused = False


def status(self, *args, **kwargs):
    # The pool's one-statement round calls status() right after try_claim() found nothing
    # takeable: pause there once, until the test says go.
    global _paused
    if not _paused:
        _paused = True
        os.write(int(os.environ["HOOK_PAUSED_FD"]), b"paused\\n")
        os.read(int(os.environ["HOOK_GO_FD"]), 1)
    return _status(self, *args, **kwargs)


PostgresBackend.status = status
"""
"""Pauses a CLI between its claim statement (nothing taken: the feature held) and the round's
look at what each feature is: the window where a holder lets a feature go unfinished."""

HOLDER_ENDS = {
    # TERM to its lock work: the feature released unmarked, no attempt counted, exit 143.
    "stopped": ([], "exec sleep 600", 128 + signal.SIGTERM),
    # --once, CMD exit 1 with --retry-delay 0: one failed attempt of 3 recorded, released.
    "failed-attempt": (["--once", "--retry-delay", "0"], "read line; exit 1", 1),
}


@posix_signals
@pytest.mark.parametrize("lock_server", ["plain"], indirect=True)  # the hook's pipes, once
@pytest.mark.parametrize("holder_end", sorted(HOLDER_ENDS))
def test_a_waiter_does_not_finish_when_a_feature_is_let_go_unfinished_mid_round(
    on_server: str, tmp_path: Path, holder_end: str
) -> None:
    """The last worker leaves only when every feature is done or failed. Worker B holds A (its
    CMD runs); worker W waits for it. B lets A go unfinished (told to stop, or one failed
    attempt of three) while W's round is between its claim statement and its look at the rows:
    W takes A and does it (exit 0, A done). Failed before (hunt F1): the look counted a feature
    held by nobody and not resting as done, and W ended "finished" (exit 0) with A never run.
    Without the hook: 5 of 20 pools of ``python -m tools.stress_pools retry-delay-zero``."""
    options, holder_script, holder_code = HOLDER_ENDS[holder_end]
    (tmp_path / ".gsd" / "specs" / "A").mkdir(parents=True)
    env = dict(os.environ)
    holding = ["lock", "work", "A", *options, "--", "sh", "-c", f"echo started; {holder_script}"]
    with _hooked.cli_job(holding, tmp_path) as holder:
        assert holder.stdout is not None and holder.stdin is not None
        _hooked.lines_until(holder.stdout, "started")
        waiter_cmd = ["sh", "-c", "echo ran >> ran-by-waiter"]
        args = ["lock", "work", "A", "--wait", "30", "--retry-delay", "0", "--", *waiter_cmd]
        with _hooked.hooked_cli(HOOK_STATUS_AFTER_EMPTY_CLAIM, args, tmp_path, env) as hooked:
            waiter, paused, go = hooked
            assert paused.readline() == b"paused\n"  # W: try_claim found A held
            if holder_end == "stopped":
                holder.send_signal(signal.SIGTERM)
            else:
                holder.stdin.write("fail\n")
                holder.stdin.flush()
            assert holder.wait(timeout=SYNC_TIMEOUT) == holder_code
            os.write(go, b"g")
            out, err = waiter.communicate(timeout=RUN_TIMEOUT)
            code = waiter.returncode
        state = _hooked.state_of("A", tmp_path, env)
        ran = (tmp_path / "ran-by-waiter").exists()
        assert (code, state, ran) == (0, "done", True), (code, state, ran, out, err)


@posix_signals
@pytest.mark.parametrize("lock_server", ["plain"], indirect=True)  # the hook's pipes, once
def test_claim_wait_does_not_answer_nothing_left_when_a_feature_is_released_mid_round(
    on_server: str, tmp_path: Path
) -> None:
    """``claim --wait`` exits 1 only when every feature is done or failed. B holds A and is
    told to stop (A released unmarked) while the waiting claim's round is between its claim
    statement and its look at the rows: the claim takes A (exit 0, "A"). Failed before (hunt
    F1): exit 1, nothing left, with A free: the README's shell loop ended."""
    (tmp_path / ".gsd" / "specs" / "A").mkdir(parents=True)
    holding = ["lock", "work", "A", "--", "sh", "-c", "echo started; exec sleep 600"]
    with _hooked.cli_job(holding, tmp_path) as holder:
        assert holder.stdout is not None
        _hooked.lines_until(holder.stdout, "started")
        args = ["lock", "claim", "A", "--wait", "30", "--pid", str(os.getpid())]
        env = dict(os.environ)
        with _hooked.hooked_cli(HOOK_STATUS_AFTER_EMPTY_CLAIM, args, tmp_path, env) as hooked:
            claimer, paused, go = hooked
            assert paused.readline() == b"paused\n"  # the claim found A held
            holder.send_signal(signal.SIGTERM)
            assert holder.wait(timeout=SYNC_TIMEOUT) == 128 + signal.SIGTERM
            os.write(go, b"g")
            out, err = claimer.communicate(timeout=RUN_TIMEOUT)
        assert (claimer.returncode, out.strip()) == (0, "A"), (claimer.returncode, out, err)
