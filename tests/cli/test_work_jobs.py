"""``lock work --jobs N``: one command runs N workers of the pool, and keeps every pool promise.

The same pool as ``test_work_pool`` (thirty features, three flaky, two broken, a ``mkdir``
occupancy marker and one ``O_APPEND`` log), run by one ``lock work -j 4`` instead of four
commands: every feature done exactly once or failed after exactly ``--attempts`` attempts, one
exit code and one JSON document for the pool, no lock left. A worker SIGKILLed mid-build is
replaced by the others once its orphaned build ends; a Ctrl-C at the terminal (INT to the
command's process group) reaches every worker once, through the command. Synchronised by FIFOs
and pipes, never by sleeping.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import signal
import subprocess
import termios
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Final

import psutil
import pytest

from tests.cli._support import SYNC_TIMEOUT, assert_no_traceback, wait_for
from tests.cli.test_work_pool import (
    ATTEMPTS,
    BROKEN,
    CLI,
    FEATURES,
    FLAKY,
    POOL_TIMEOUT,
    assert_every_feature_finished_once,
    leftover_locks,
    log,
    make_pool,
    read_with_deadline,
)
from tests.support.marks import needs_fifo, posix_signals

JOBS: Final = 4


def start_command(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """A ``lock work`` command with its answer and its stderr piped, in a session of its own
    (the terminal's foreground job's place: a signal to its group reaches it alone)."""
    return subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@pytest.fixture
def pool(tmp_path: Path) -> Path:
    return make_pool(tmp_path)


@contextmanager
def team(
    pool: Path, extra: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[str]]:
    """One ``lock work -j 4 --json`` in a session of its own; its whole session killed after."""
    full_env = {
        **os.environ,
        "POOL": str(pool),
        "FLAKY": " ".join(FLAKY),
        "BROKEN": " ".join(BROKEN),
        **(env or {}),
    }
    full_env.pop("MAHABHARATHA_FEATURE", None)
    argv = [*CLI, "lock", "work", "--json", "-j", str(JOBS), "--attempts", str(ATTEMPTS)]
    command = start_command([*argv, *extra, "--", "./build-feature.sh", "{}"], pool, full_env)
    try:
        yield command
    finally:
        _kill_session(command.pid)
        command.communicate()


def _kill_session(sid: int) -> None:
    """Every process of the team's session (the command, its builds' groups) and every one
    of its descendants (its workers lead sessions of their own)."""
    team: list[psutil.Process] = []
    with suppress(psutil.Error):
        team = psutil.Process(sid).children(recursive=True)
    for process in psutil.process_iter():
        with suppress(psutil.Error, ProcessLookupError):  # race: ended since the listing
            if os.getsid(process.pid) == sid:
                team.append(process)
    for process in team:
        with suppress(psutil.Error):
            process.kill()


def test_one_command_of_four_jobs_finishes_thirty_features_with_failures(pool: Path) -> None:
    """Without ``--jobs`` there was no such command (``-j`` was a usage error, exit 2)."""
    with team(pool) as command:
        out, err = command.communicate(timeout=POOL_TIMEOUT)
    assert_no_traceback(out, err)
    assert command.returncode == 1, err  # finished, some failed
    document = json.loads(out)
    assert document["ended"] == "finished"
    assert document["exit_code"] == 1
    assert sorted(document["failed"]) == sorted(BROKEN)
    assert len(document["workers"]) == JOBS
    assert all(worker["exit_code"] == 1 for worker in document["workers"]), document["workers"]
    outcomes = [(r["feature"], r["outcome"]) for r in document["results"]]
    assert sorted(f for f, outcome in outcomes if outcome == "done") == sorted(
        name for name in FEATURES if name not in BROKEN
    )
    assert len([o for o in outcomes if o[1] == "failed"]) == len(FLAKY) + ATTEMPTS * len(BROKEN)
    assert_every_feature_finished_once(log(pool), pool)
    assert leftover_locks(pool) == []


@needs_fifo
@posix_signals
def test_a_killed_job_is_replaced_by_the_others(pool: Path) -> None:
    """One worker of the team SIGKILLed mid-build (its build runs on in a session of its own):
    nobody builds that feature while the orphan runs, the team finishes it afterwards and
    only then ends, saying on stderr that a worker died without an answer. The orphan is let
    go only after the others have claimed several times since the kill (each claim tries that
    feature first): without the orphan's held proof counted alive, one of them takes it while
    the orphan runs (an overlap; a second start before the orphan's end). Before, the orphan
    was let go at once and those claims came after it: the test passed without that rule."""
    a_killed_job_is_replaced(pool, files=True)


def a_killed_job_is_replaced(pool: Path, *, files: bool) -> None:
    """The killed-worker team test; ``files``: the locks and attempts are in the folders."""
    victim_feature = FEATURES[0]
    os.mkfifo(pool / "exited.fifo")
    os.mkfifo(pool / "go.fifo")
    exited = os.open(pool / "exited.fifo", os.O_RDONLY | os.O_NONBLOCK)
    try:
        with team(pool, ("--reclaim-dead",), {"VICTIM": victim_feature}) as command:
            worker_pid = int(read_with_deadline(exited).decode().split()[0])
            assert psutil.Process(worker_pid).ppid() == command.pid  # a worker of the team
            started = _starts(pool)
            os.kill(worker_pid, signal.SIGKILL)
            assert command.poll() is None, "the team ended early"
            # The others claim again while the orphan runs: each claim tries the victim first
            # (sorted, --reclaim-dead) and must find it held by the orphan's proof. A build
            # started after the kill may come from a claim made before it (one per worker at
            # most): wait for twice the team's size of them, so that some claims came after.
            # Files only: a PostgreSQL row has no proof of life, and the orphan left the
            # worker's group and session, so there it is taken (the contract's PG rule).
            if files:
                wait_for(
                    lambda: _starts(pool) >= started + 2 * JOBS,
                    POOL_TIMEOUT,
                    "the other workers to claim while the orphan runs",
                )
            go = os.open(pool / "go.fifo", os.O_WRONLY)
            os.write(go, b"go\n")  # the orphaned build may end now
            os.close(go)
            while read_with_deadline(exited):  # EOF: the orphan has exited
                pass
            assert not _held_by(pool, victim_feature, worker_pid), "its owner is judged alive"
            out, err = command.communicate(timeout=POOL_TIMEOUT)
    finally:
        os.close(exited)
    assert_no_traceback(out, err)
    assert command.returncode == 1, err
    assert f"worker {worker_pid} ended without an answer" in err
    document = json.loads(out)
    assert {"pid": worker_pid, "exit_code": 128 + signal.SIGKILL} in document["workers"]
    lines = log(pool)
    partial = lines.index(f"end-partial {victim_feature}")
    starts = [i for i, line in enumerate(lines) if line == f"start {victim_feature}"]
    assert len(starts) == 2 and starts[1] > partial, lines
    assert_every_feature_finished_once(lines, pool, files=files)
    if files:
        assert leftover_locks(pool) == []


def _starts(pool: Path) -> int:
    """Builds started so far (each one after a claim)."""
    return sum(line.startswith("start ") for line in log(pool))


def _held_by(pool: Path, feature: str, pid: int) -> bool:
    """Does ``lock status`` say ``pid`` holds ``feature``, not reclaimable (judged alive)?"""
    shown = subprocess.run(
        [*CLI, "lock", "status", "--all", "--json"],
        cwd=pool,
        capture_output=True,
        text=True,
        timeout=SYNC_TIMEOUT,
    )
    entries = [e for e in json.loads(shown.stdout)["features"] if e["feature"] == feature]
    return any(e["pid"] == pid and not e["reclaimable"] for e in entries)


WAIT_FOR_SIGNAL: Final = r"""#!/bin/sh
# Says it started (on the FIFO), then waits to be interrupted.
echo "$1" > "$POOL/started.fifo"
exec sleep 600
"""


@needs_fifo
@posix_signals
def test_a_ctrl_c_reaches_every_job_once_and_releases_every_feature(pool: Path) -> None:
    """A terminal's Ctrl-C is SIGINT to the foreground process group: the command's. The
    workers lead groups of their own (so none gets it twice: once from the terminal, once
    forwarded), the command forwards it, every build is interrupted, every feature is given
    back unmarked (no attempt counted), and the team exits 130 with one document."""
    (pool / "wait.sh").write_text(WAIT_FOR_SIGNAL)
    (pool / "wait.sh").chmod(0o755)
    os.mkfifo(pool / "started.fifo")
    started = os.open(pool / "started.fifo", os.O_RDONLY | os.O_NONBLOCK)
    # Race: between two builds' writes the FIFO has no writer (select says readable, EOF) and
    # the second may open it then (read: EAGAIN). A writer of ours keeps it open throughout.
    kept_open = os.open(pool / "started.fifo", os.O_WRONLY | os.O_NONBLOCK)
    env = {**os.environ, "POOL": str(pool)}
    env.pop("MAHABHARATHA_FEATURE", None)
    command = start_command(
        [*CLI, "lock", "work", "--json", "-j", "2", "--", "./wait.sh", "{}"], pool, env
    )
    try:
        said = b""
        while said.count(b"\n") < 2:  # both builds run
            said += read_with_deadline(started)
        workers = psutil.Process(command.pid).children()
        assert len(workers) == 2
        assert all(os.getpgid(w.pid) not in (command.pid, os.getpgid(0)) for w in workers)
        os.killpg(command.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        out, err = command.communicate(timeout=SYNC_TIMEOUT)
    finally:
        os.close(started)
        os.close(kept_open)
        _kill_session(command.pid)
        command.wait()
    assert_no_traceback(out, err)
    assert command.returncode == 128 + signal.SIGINT, err
    document = json.loads(out)
    assert document["ended"] == "stopped"
    assert {r["outcome"] for r in document["results"]} == {"released"}
    assert leftover_locks(pool) == []
    assert not list((pool / ".gsd" / "specs").glob("*/.completed"))
    assert not list((pool / ".gsd" / "specs").glob("*/.attempts"))


@pytest.mark.parametrize("extra", [("--once",), ("-j", "0")], ids=["once", "zero"])
def test_jobs_that_cannot_be_are_bad_input(pool: Path, extra: tuple[str, ...]) -> None:
    jobs = () if extra[0] == "-j" else ("-j", "2")
    done = subprocess.run(
        [*CLI, "lock", "work", "--json", *jobs, *extra, "--", "true"],
        cwd=pool,
        capture_output=True,
        text=True,
        timeout=SYNC_TIMEOUT,
    )
    assert_no_traceback(done.stdout, done.stderr)
    assert done.returncode == 2, done.stderr
    assert "--jobs" in json.loads(done.stdout)["error"]
    assert not list((pool / ".gsd" / "specs").glob("*/.completed"))


HOLD_UNTIL_GO: Final = r"""#!/bin/sh
# Says which worker runs it (on the FIFO), then waits for the test's go.
echo "$PPID" > "$POOL/started.fifo"
read -r _ < "$POOL/go.fifo"
"""


@needs_fifo
def test_a_pool_finished_after_a_worker_waited_out_is_finished(tmp_path: Path) -> None:
    """Failed before the merge ranked finished above waited-out: one worker holds the only
    feature, its teammate's ``--wait 0`` runs out (exit 75, ``busy`` naming it), then the
    holder finishes it. The pool's answer said 75, "1 feature(s) still held by others", and
    listed as busy a feature its own results showed done. A worker that finished saw every
    feature done or failed, later than any wait ran out (a finished feature stays finished):
    the pool is finished, exit 0, nothing busy."""
    (tmp_path / ".gsd" / "specs" / "alpha").mkdir(parents=True)
    (tmp_path / "hold.sh").write_text(HOLD_UNTIL_GO)
    (tmp_path / "hold.sh").chmod(0o755)
    os.mkfifo(tmp_path / "started.fifo")
    os.mkfifo(tmp_path / "go.fifo")
    started = os.open(tmp_path / "started.fifo", os.O_RDONLY | os.O_NONBLOCK)
    env = {**os.environ, "POOL": str(tmp_path)}
    env.pop("MAHABHARATHA_FEATURE", None)
    command = start_command(
        [*CLI, "lock", "work", "--json", "-j", "2", "--wait", "0", "--", "./hold.sh", "{}"],
        tmp_path,
        env,
    )
    try:
        holder = int(read_with_deadline(started).decode().split()[0])
        team_of = psutil.Process(command.pid)
        wait_for(lambda: len(team_of.children()) == 2, what="both workers forked")
        (teammate,) = [w.pid for w in team_of.children() if w.pid != holder]
        exited = os.pidfd_open(teammate)  # readable once it has exited (a zombie till reaped)
        try:
            ready, _, _ = select.select([exited], [], [], SYNC_TIMEOUT)
            assert ready, "the teammate's --wait 0 did not run out"
        finally:
            os.close(exited)
        go = os.open(tmp_path / "go.fifo", os.O_WRONLY)
        os.write(go, b"go\n")  # the holder's command may end now: alpha is done after
        os.close(go)
        out, err = command.communicate(timeout=SYNC_TIMEOUT)
    finally:
        os.close(started)
        _kill_session(command.pid)
        command.wait()
    assert_no_traceback(out, err)
    document = json.loads(out)
    assert sorted(w["exit_code"] for w in document["workers"]) == [0, 75], document
    assert [(r["feature"], r["outcome"]) for r in document["results"]] == [("alpha", "done")]
    assert command.returncode == 0, err
    assert document["ended"] == "finished"
    assert document["busy"] == []
    assert "still held" not in err


SIGNALLED_WHILE_ANSWERING: Final = r"""
# lock work -j 2, whose workers get SIGTERM at the moment each sends its answer (the pool done,
# its report made): as a forwarded Ctrl-C or TERM that comes just as the pool ends.
import os, signal, sys
from mahabharatha.cli import main, pool

TEAM = os.getpid()
made = pool._work_result


class Interrupting(dict):
    def items(self):  # json.dumps calls it while the answer is being written
        if os.getpid() != TEAM:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().items()


def answered_then_signalled(*args, **kwargs):
    result = made(*args, **kwargs)
    return result._replace(document=Interrupting(result.document))


pool._work_result = answered_then_signalled
sys.argv = ["mahabharatha", *sys.argv[1:]]
main()
"""


WORK_TWO_JOBS: Final = ("lock", "work", "--json", "-j", "2")


def _team_under(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``lock work --json -j 2 -- true`` run by ``script`` (which steers the team's moment)."""
    return subprocess.run(
        [CLI[0], "-c", script, *WORK_TWO_JOBS, "--", "true"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=SYNC_TIMEOUT,
    )


def test_a_signal_as_a_worker_answers_does_not_lose_its_results(tmp_path: Path) -> None:
    """Failed before each worker held INT, TERM and HUP back once its pool was over: a signal
    forwarded between its report and the end of its answer ended it with half an answer or
    none (exit 70), and the pool's document lost every result of that worker though each of
    its features was done. The signal comes at that moment (the worker sends it to itself as
    its answer is written); both workers' answers still arrive whole."""
    for name in ("alpha", "beta"):
        (tmp_path / ".gsd" / "specs" / name).mkdir(parents=True)
    done = _team_under(SIGNALLED_WHILE_ANSWERING, tmp_path)
    assert_no_traceback(done.stdout, done.stderr)
    document = json.loads(done.stdout)
    assert "without an answer" not in done.stderr
    assert [w["exit_code"] for w in document["workers"]] == [0, 0], document
    assert sorted(r["feature"] for r in document["results"]) == ["alpha", "beta"]
    assert done.returncode == 0, done.stderr


READS_THE_TERMINAL: Final = r"""
read -r line                      # stdin: the terminal the team was started at
echo "stdin $?" > "out-$1"
read -r line < /dev/tty           # the terminal itself, whatever stdin is
echo "tty $?" >> "out-$1"
"""


def _as_terminal_foreground_job() -> None:
    """In the child, after ``setsid``: the pty on stdin becomes its controlling terminal, and
    its group the terminal's foreground job (as a shell runs a command typed at a prompt)."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


@posix_signals
def test_a_command_that_reads_the_terminal_does_not_stop_the_team(tmp_path: Path) -> None:
    """Failed before each worker left the terminal: run at a terminal, a worker and its
    command are in background groups of the terminal's session, so a command that reads it
    (a prompt, a pager, ``read``) was stopped by SIGTTIN, and nobody ever continued it (the
    groups are not the shell's jobs): the team never ended, its locks held by live owners.
    Now a worker leads a session of its own, with no controlling terminal, and its stdin is
    /dev/null when the team's is a terminal (as ``xargs`` gives its commands): such a read
    ends at once (end of input, or no terminal), never stops."""
    for name in ("alpha", "beta"):
        (tmp_path / ".gsd" / "specs" / name).mkdir(parents=True)
    main, secondary = pty.openpty()
    env = {**os.environ}
    env.pop("MAHABHARATHA_FEATURE", None)
    command = subprocess.Popen(
        [*CLI, "lock", "work", "-j", "2", "--", "sh", "-c", READS_THE_TERMINAL, "sh", "{}"],
        cwd=tmp_path,
        env=env,
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
        start_new_session=True,
        preexec_fn=_as_terminal_foreground_job,
    )
    os.close(secondary)
    try:
        seen = b""
        while True:  # until the team's end closes the terminal (its output drained meanwhile)
            ready, _, _ = select.select([main], [], [], SYNC_TIMEOUT)
            assert ready, f"the team did not end: {seen!r}"
            try:
                chunk = os.read(main, 4096)
            except OSError:  # EIO: every process of the session closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        code = command.wait(timeout=SYNC_TIMEOUT)
    finally:
        os.close(main)
        _kill_session(command.pid)
        command.wait()
    assert code == 0, seen
    for name in ("alpha", "beta"):
        stdin_read, tty_read = (tmp_path / f"out-{name}").read_text().split("\n")[:2]
        assert stdin_read == "stdin 1"  # end of input
        assert tty_read != "tty 0"  # no terminal to read


SIGNALLED_AS_FORKED: Final = r"""
# lock work -j 2, whose workers get SIGTERM before they start (as the command forwards a
# signal that came while it forked them): the signal is pending until the worker unblocks it.
import os, signal, sys
from mahabharatha.pool import team
from mahabharatha.cli import main

leave = team._leave_the_terminal


def signalled_then_leave():
    os.kill(os.getpid(), signal.SIGTERM)  # blocked here: delivered as the worker unblocks
    leave()


team._leave_the_terminal = signalled_then_leave
sys.argv = ["mahabharatha", *sys.argv[1:]]
main()
"""


def test_a_signal_before_the_workers_start_ends_the_team_with_its_code(tmp_path: Path) -> None:
    """Failed before a worker ended by a signal before its job began exited with that signal's
    code: it ended 70 (a software error), and so did the team, with no feature touched. Now
    each ends 143 (TERM), and so does the team, as a lone ``lock work`` would."""
    (tmp_path / ".gsd" / "specs" / "alpha").mkdir(parents=True)
    done = _team_under(SIGNALLED_AS_FORKED, tmp_path)
    assert_no_traceback(done.stdout, done.stderr)
    document = json.loads(done.stdout)
    assert [w["exit_code"] for w in document["workers"]] == [143, 143], document
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert not (tmp_path / ".gsd" / "specs" / "alpha" / ".completed").exists()


def modules_imported_after_the_fork(folder: Path) -> list[str]:
    """The modules ``lock work -j N -- true`` imports in its workers (after the fork). Under
    ``-X importtime`` each process reports every module it imports, on the stderr the workers
    share with the team: a module imported after the fork is reported once more for each more
    worker, so the reports of -j 2 and -j 3 (each over four fresh features, in a namespace
    of its own on a server) differ by exactly those modules."""

    def counts(jobs: int) -> Counter[str]:
        pool = folder / f"pool-of-{jobs}"
        for name in ("a", "b", "c", "d"):
            (pool / ".gsd" / "specs" / name).mkdir(parents=True)
        space = os.environ.get("MAHABHARATHA_LOCK_NAMESPACE", "")
        done = subprocess.run(
            [CLI[0], "-X", "importtime", *CLI[1:], "lock", "work", "-j", str(jobs), "--", "true"],
            cwd=pool,
            env={**os.environ, "MAHABHARATHA_LOCK_NAMESPACE": f"{space}-{jobs}"},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=POOL_TIMEOUT,
        )
        assert done.returncode == 0, done.stderr
        return Counter(
            line.rsplit("|", 1)[1].strip()
            for line in done.stderr.splitlines()
            if line.startswith("import time:") and "|" in line
        )

    two, three = counts(2), counts(3)
    assert two["mahabharatha.cli.pool"] == 1  # the report was read: the test can fail
    return sorted(name for name in two.keys() | three.keys() if two[name] != three[name])


def test_the_workers_import_nothing_after_the_fork(tmp_path: Path) -> None:
    """The team imports what its workers run (the folder backend, the runner's helpers) before
    it forks them: a module imported after the fork is imported once per worker, and a pool
    of 8 paid for it 8 times on two cores (the lock protocol's modules, about 15 ms each)."""
    assert modules_imported_after_the_fork(tmp_path) == []
