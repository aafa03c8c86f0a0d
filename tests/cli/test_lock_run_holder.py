"""``lock run`` as a holder: the lost-lock rule, ``kill -INT`` to a foreground
``lock run``, nan and inf options, "already held by you", and a heartbeat that cannot start.

Real processes throughout, synchronised on their output lines (never on sleeps). Each test says
in its docstring how it failed on the code before the fix.
"""

from __future__ import annotations

import contextlib
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import pytest

from mahabharatha import locks
from mahabharatha.owner import ownership
from mahabharatha.run import runner
from tests.cli._support import (
    FEATURE,
    RUN_TIMEOUT,
    SYNC_TIMEOUT,
    Child,
    child_env,
    cli_argv,
    invoke,
    lock_path,
    one_document,
    read_record,
    run_cli,
)
from tests.support.marks import needs_prlimit, posix_signals

pytestmark = pytest.mark.timeout(90)

Spawn = Callable[..., Child]

PY: Final = sys.executable

READY_THEN_WAIT_FOR_STDIN: Final = (
    "import sys\nprint('ready', flush=True)\nline = sys.stdin.readline()\n"
    "print('finished', flush=True)\n"
)
"""CMD that says ``ready`` once it runs, then waits on a pipe (its stdin) for the test."""

TRAP: Final = """\
import signal, sys
from pathlib import Path

def on_signal(signum, frame):
    Path(sys.argv[1]).write_text(str(signum))
    sys.exit(42)

signal.signal(signal.SIGINT, on_signal)
print('ready', flush=True)
while True:
    signal.pause()
"""
"""CMD that records the signal it receives in the file named by its argument, then exits 42."""


def lock_run(gsd: Path, *options: object) -> list[str]:
    return cli_argv("lock", "run", "--gsd-dir", gsd, *options, FEATURE, "--")


def take_the_lock_away(gsd: Path, cwd: Path) -> None:
    """What a person does: ``release --force``, then another owner (this test) acquires it."""
    assert run_cli("lock", "release", FEATURE, "--gsd-dir", gsd, "--force", cwd=cwd).returncode == 0
    assert run_cli("lock", "acquire", FEATURE, "--gsd-dir", gsd, cwd=cwd).returncode == 0


# --------------------------------------------------------------------------- item 14: lost lock


def test_a_lock_lost_while_cmd_runs_stops_cmd_and_exits_76(
    tmp_path: Path, gsd: Path, spawn: Spawn
) -> None:
    """Fails before the fix: nothing noticed the loss; CMD went on (here: waiting on its pipe,
    so ``lock run`` never ended) and the run exited 0 with no error in its JSON."""
    run = spawn(
        [*lock_run(gsd, "--heartbeat", 0.05, "--json"), PY, "-c", READY_THEN_WAIT_FOR_STDIN],
        stdin=subprocess.PIPE,
    )
    assert run.next_line("stderr") == "ready"  # with --json, CMD's stdout goes to stderr
    take_the_lock_away(gsd, tmp_path)

    assert run.wait() == 76, run.stderr
    document = one_document(run.stdout)
    assert document["error"] == "lost"
    assert "removed or replaced" in document["reason"]
    assert document["exit_code"] == 128 + signal.SIGTERM, "CMD was stopped with SIGTERM"
    assert "finished" not in run.stderr
    assert "lost" in run.stderr or "no longer ours" in run.stderr
    assert read_record(lock_path(gsd))[0] == os.getpid(), "the new owner's lock stays"


def test_with_on_lost_warn_cmd_keeps_running_and_its_code_is_the_exit_code(
    tmp_path: Path, gsd: Path, spawn: Spawn
) -> None:
    """Fails before the fix: ``--on-lost`` did not exist (exit 2)."""
    run = spawn(
        [
            *lock_run(gsd, "--heartbeat", 0.05, "--json", "--on-lost", "warn"),
            *(PY, "-c", READY_THEN_WAIT_FOR_STDIN),
        ],
        stdin=subprocess.PIPE,
    )
    assert run.next_line("stderr") == "ready"
    take_the_lock_away(gsd, tmp_path)
    warning = run.next_line("stderr")
    assert "CMD keeps running" in warning, warning

    run.send("go on\n")  # CMD is still there to read it
    assert run.wait() == 0, run.stderr
    assert "finished" in run.stderr
    document = one_document(run.stdout)
    assert (document["error"], document["exit_code"]) == ("lost", 0)
    assert document["reason"]
    assert read_record(lock_path(gsd))[0] == os.getpid(), "the new owner's lock stays"


READY_THEN_EXIT_3_ON_STDIN: Final = (
    "import sys\nprint('ready', flush=True)\nsys.stdin.readline()\nsys.exit(3)\n"
)
"""A quick CMD: ``ready``, then it waits on its pipe for the test and exits 3 by itself."""


def _lose_the_lock(gsd: Path, cwd: Path, how: str, run_pid: int) -> None:
    """Take ``lock run``'s lock away from another process: ``lock release --force``, then
    (``taken``) ``lock acquire`` by this test, or (``own``) a ``lock release --pid`` of it."""
    if how == "own":
        let_go = run_cli("lock", "release", FEATURE, "--gsd-dir", gsd, "--pid", run_pid, cwd=cwd)
        assert let_go.returncode == 0, let_go.stderr
    elif how == "taken":
        take_the_lock_away(gsd, cwd)
    else:
        forced = run_cli("lock", "release", FEATURE, "--gsd-dir", gsd, "--force", cwd=cwd)
        assert forced.returncode == 0, forced.stderr


@pytest.mark.parametrize(
    ("how", "on_lost"),
    [("forced", "terminate"), ("taken", "terminate"), ("own", "terminate"), ("forced", "warn")],
)
def test_a_lock_taken_away_while_a_quick_cmd_ran_is_reported_lost(
    tmp_path: Path, gsd: Path, spawn: Spawn, how: str, on_lost: str
) -> None:
    """CMD ends by itself before any refresh (every 60 s) could see its lock go: the release
    finds it gone, so the lost-lock rule holds all the same: exit 76 (``warn``: CMD's code),
    the loss said on stderr without claiming CMD was stopped, ``error: lost`` in --json.
    Failed on c000d56: exit 3, no word on stderr, no error in the document (the release that
    found nothing of ours said nothing)."""
    run = spawn(
        [*lock_run(gsd, "--json", "--on-lost", on_lost), PY, "-c", READY_THEN_EXIT_3_ON_STDIN],
        stdin=subprocess.PIPE,
    )
    assert run.next_line("stderr") == "ready"  # with --json, CMD's stdout goes to stderr
    _lose_the_lock(gsd, tmp_path, how, run.pid)
    run.send("go on\n")  # CMD exits 3 by itself, before a refresh

    assert run.wait() == (76 if on_lost == "terminate" else 3), run.stderr
    document = one_document(run.stdout)
    assert (document["error"], document["exit_code"]) == ("lost", 3), document
    assert "before its release" in document["reason"], document
    said = [line for line in run.stderr.splitlines() if "lost the lock" in line]
    assert len(said) == 1, run.stderr
    assert "had already ended" in said[0], said
    assert "stopping CMD" not in run.stderr and "CMD was stopped" not in run.stderr
    if how == "taken":
        assert read_record(lock_path(gsd))[0] == os.getpid(), "the new owner's lock stays"
    else:
        assert not lock_path(gsd).exists()


IGNORES_SIGTERM: Final = (
    "import signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\ntime.sleep(60)\n"
)


def test_a_cmd_that_ignores_sigterm_is_killed_after_the_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fails before the fix: nothing stopped CMD (the test ran into its timeout)."""
    monkeypatch.setattr(runner, "LOST_KILL_GRACE_SECONDS", 0.2)
    gsd = tmp_path / "gsd"
    holder = locks.FeatureLock(FEATURE, gsd, timeout=0, heartbeat=0.02)
    read, write = os.pipe()

    def take_it_away_once_cmd_runs() -> None:
        with os.fdopen(read) as said:
            assert said.readline() == "ready\n"
            locks.release(FEATURE, gsd, pid=1, force=True)
            locks.acquire(FEATURE, gsd, pid=1)

    taker = threading.Thread(target=take_it_away_once_cmd_runs)
    taker.start()
    with os.fdopen(write, "w") as out:
        code = runner.run_locked(holder, [PY, "-c", IGNORES_SIGTERM], out)
    taker.join(SYNC_TIMEOUT)
    assert code == 128 + signal.SIGKILL
    assert holder.lost is not None
    assert read_record(lock_path(gsd))[0] == 1


# --------------------------------------------------------------------------- item 12: kill -INT


def _foreground_lock_run(tmp_path: Path, argv: list[str]) -> tuple[int, int]:
    """Start ``argv`` as the foreground job of a new terminal (a pty); its pid and the pty."""
    env = {**child_env(), "PYTHONPATH": os.pathsep.join(sys.path)}
    pid, terminal = pty.fork()
    if pid == 0:  # pragma: no cover - the child: session leader, foreground group of the pty
        try:
            os.chdir(tmp_path)
            os.execve(argv[0], argv, env)
        finally:
            os._exit(127)
    return pid, terminal


def _read_until(terminal: int, wanted: bytes) -> bytes:
    seen = b""
    deadline = time.monotonic() + SYNC_TIMEOUT
    while wanted not in seen:
        ready, _, _ = select.select([terminal], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise AssertionError(f"no {wanted!r} on the terminal: {seen!r}")
        try:
            seen += os.read(terminal, 4096)
        except OSError:  # EIO: the other side closed
            raise AssertionError(f"terminal closed before {wanted!r}: {seen!r}") from None
    return seen


def _exit_code_within(pid: int, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)  # a hang guard's poll, not a synchronisation
    return None


@posix_signals
def test_kill_int_to_a_foreground_lock_run_reaches_cmd(tmp_path: Path, gsd: Path) -> None:
    """Fails before the fix: a foreground ``lock run`` took every SIGINT for a Ctrl-C that CMD
    had already got, so a SIGINT sent with ``kill`` to ``lock run`` alone reached nobody."""
    marker = tmp_path / "signal"
    pid, terminal = _foreground_lock_run(tmp_path, [*lock_run(gsd), PY, "-c", TRAP, str(marker)])
    try:
        _read_until(terminal, b"ready")
        assert os.tcgetpgrp(terminal) == os.getpgid(pid), "lock run is the foreground job"
        os.kill(pid, signal.SIGINT)  # kill -INT <lock run>: only lock run gets it
        code = _exit_code_within(pid, RUN_TIMEOUT)
    finally:
        with_reaped(pid)
        os.close(terminal)
    assert code == 42, "CMD never got the SIGINT"
    assert marker.read_text() == str(int(signal.SIGINT))
    assert not lock_path(gsd).exists()


COUNTS_SIGINTS: Final = """\
import signal, sys
got = []
signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
print('ready', flush=True)
while not got:
    signal.pause()
print('interrupted', flush=True)
sys.stdin.readline()
print(f'sigints={len(got)}', flush=True)
"""
"""CMD that counts its SIGINTs: after the first it says so and waits for a line on the
terminal, then reports how many it got (a forwarded duplicate would have arrived by then)."""


@posix_signals
def test_a_ctrl_c_at_the_terminal_reaches_cmd_once(tmp_path: Path, gsd: Path) -> None:
    """Guards the other half of the rule: the terminal's own Ctrl-C is not forwarded again."""
    pid, terminal = _foreground_lock_run(tmp_path, [*lock_run(gsd), PY, "-c", COUNTS_SIGINTS])
    try:
        _read_until(terminal, b"ready")
        os.write(terminal, b"\x03")  # Ctrl-C: the kernel signals the whole foreground group
        _read_until(terminal, b"interrupted")
        os.write(terminal, b"done\n")
        said = _read_until(terminal, b"sigints=")
        while not re.search(rb"sigints=[0-9]+\r?\n", said):
            said += _read_until(terminal, b"\n")
        code = _exit_code_within(pid, RUN_TIMEOUT)
    finally:
        with_reaped(pid)
        os.close(terminal)
    assert b"sigints=1" in said, said
    assert code == 0


def with_reaped(pid: int) -> None:
    """Kill and reap a child the test may have left running."""
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


# --------------------------------------------------------------------------- item 13: nan, inf


@pytest.mark.parametrize(
    "args",
    [
        ("lock", "run", FEATURE, "--heartbeat", "nan"),
        ("lock", "run", FEATURE, "--timeout", "nan"),
        ("lock", "run", FEATURE, "--timeout", "inf"),
        ("lock", "acquire", FEATURE, "--wait", "nan"),
        ("lock", "acquire", FEATURE, "--wait", "inf"),
    ],
    ids=["run-heartbeat-nan", "run-timeout-nan", "run-timeout-inf", "wait-nan", "wait-inf"],
)
def test_numeric_options_refuse_nan_and_inf_as_bad_input(
    tmp_path: Path, gsd: Path, args: tuple[str, ...]
) -> None:
    """Fails before the fix: they passed the range checks; the lock was taken (and
    ``--heartbeat nan`` busy-looped while CMD ran)."""
    marker = tmp_path / "ran"
    cmd = ["--", PY, "-c", f"open({str(marker)!r}, 'w').close()"] if args[1] == "run" else []
    done = run_cli(*args, "--gsd-dir", gsd, *cmd, cwd=tmp_path)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert not marker.exists()
    assert not lock_path(gsd).exists()


# --------------------------------------------------------------------------- item 16: yours


def test_run_after_acquire_in_one_shell_answers_already_held_by_you(
    tmp_path: Path, gsd: Path
) -> None:
    """Fails before the fix: ``lock run`` waited for the shell's own lock until the lease
    ended (here: until the subprocess timeout)."""
    assert run_cli("lock", "acquire", FEATURE, "--gsd-dir", gsd, cwd=tmp_path).returncode == 0
    marker = tmp_path / "ran"
    done = run_cli(
        *("lock", "run", FEATURE, "--gsd-dir", gsd, "--json", "--"),
        *(PY, "-c", f"open({str(marker)!r}, 'w').close()"),
        cwd=tmp_path,
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert f"already held by you (pid {os.getpid()})" in done.stderr
    assert f"already held by you (pid {os.getpid()})" in one_document(done.stdout)["error"]
    assert not marker.exists()
    assert read_record(lock_path(gsd))[0] == os.getpid(), "the shell's lock stays"


def test_a_second_acquire_by_the_same_owner_answers_at_once(tmp_path: Path, gsd: Path) -> None:
    """Fails before the fix: with ``--wait`` the second acquire waited the whole time for its
    own lock, then said it was held (by itself) with advice to wait."""
    assert run_cli("lock", "acquire", FEATURE, "--gsd-dir", gsd, cwd=tmp_path).returncode == 0
    done = run_cli("lock", "acquire", FEATURE, "--gsd-dir", gsd, "--wait", 60, cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"mahabharatha: feature {FEATURE!r} is already held by you (pid {os.getpid()})"
    )


# --------------------------------------------------------------------------- item 9: no threads


def test_a_run_whose_heartbeat_cannot_start_exits_3_and_leaves_no_lock(
    gsd: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fails before the fix: the RuntimeError escaped as a traceback, exit 1, and the lock of
    the (now dead) run stayed on disk."""

    def no_threads(_self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    marker = tmp_path / "ran"
    monkeypatch.setattr(threading.Thread, "start", no_threads)
    result = invoke(
        *("lock", "run", FEATURE, "--gsd-dir", gsd, "--json", "--"),
        *(PY, "-c", f"open({str(marker)!r}, 'w').close()"),
    )
    assert result.exit_code == 3
    assert "can't start new thread" in one_document(result.stdout)["error"]
    assert not marker.exists()
    assert not lock_path(gsd).exists()


@needs_prlimit
def test_under_a_real_process_limit_a_run_exits_3_and_leaves_no_lock(
    gsd: Path, tmp_path: Path
) -> None:
    """The same under ``prlimit --nproc 1`` (no thread can start). Fails before the fix as
    above: traceback, exit 1, a lock of a dead pid left behind."""
    marker = tmp_path / "ran"
    argv = [
        *_one_process_only(),
        *cli_argv("lock", "run", FEATURE, "--gsd-dir", gsd, "--json", "--"),
        *(PY, "-c", f"open({str(marker)!r}, 'w').close()"),
    ]
    done = subprocess.run(
        argv,
        cwd=tmp_path,
        env={**child_env(), "PYTHONPATH": os.pathsep.join(sys.path)},
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert "can't start new thread" in one_document(done.stdout)["error"]
    assert not marker.exists()
    assert not lock_path(gsd).exists()


def _one_process_only() -> list[str]:
    """A prefix that runs a command allowed no second process or thread. Root's own processes
    are never limited, so as root the real uid changes and the capabilities go (files stay
    reachable: the effective uid is still root's)."""
    prlimit = [str(shutil.which("prlimit")), "--nproc=1"]
    if os.geteuid() != 0:
        return prlimit
    return [
        str(shutil.which("setpriv")),
        "--ruid=65534",
        "--securebits=+noroot,+noroot_locked,+no_setuid_fixup,+no_setuid_fixup_locked",
        "--inh-caps=-all",
        "--bounding-set=-all",
        *prlimit,
    ]


FOREGROUND_JOB: Final = (
    "import os, signal, sys\n"
    "signal.signal(signal.SIGINT, signal.SIG_DFL)\n"
    "signal.signal(signal.SIGHUP, signal.SIG_IGN)  # outlives the terminal's hangup\n"
    "print('job', os.getpid(), flush=True)\n"
    "sys.stdin.readline()\n"
)


@posix_signals
def test_a_lost_lock_stops_the_work_of_a_foreground_lock_run_too(tmp_path: Path, gsd: Path) -> None:
    """Fails before the fix (a review's finding): as a terminal's foreground job CMD shares
    ``lock run``'s group, and the lost-lock SIGTERM reached the shell only; its job ran on
    beside the next holder while ``lock run`` exited 76."""
    argv = [
        *lock_run(gsd, "--heartbeat", "0.05"), "sh", "-c", '"$0" -c "$1"; echo after',
        PY, FOREGROUND_JOB,
    ]  # fmt: skip
    pid, terminal = _foreground_lock_run(tmp_path, argv)
    job = 0
    try:
        said = _read_until(terminal, b"job ")
        while b"\n" not in said.split(b"job ", 1)[1]:
            said += _read_until(terminal, b"\n")
        job = int(said.split(b"job ", 1)[1].split()[0])
        forced = subprocess.run(
            [*cli_argv("lock", "release", FEATURE, "--gsd-dir", gsd, "--force")],
            cwd=tmp_path, env=child_env(), capture_output=True, check=False,
        )  # fmt: skip
        assert forced.returncode == 0, forced.stderr
        code = _exit_code_within(pid, RUN_TIMEOUT)
        gone = not ownership.is_alive(ownership.proc_stat(job), job)
    finally:
        with_reaped(pid)
        os.close(terminal)
        if job:
            with contextlib.suppress(ProcessLookupError):
                os.kill(job, signal.SIGKILL)
    assert code == 76
    assert gone, "lock run exited 76 while its command's work still ran"
