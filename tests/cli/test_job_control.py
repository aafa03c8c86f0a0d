"""Job control at an interactive shell (issue 26, item 6): ``lock run`` is one job with CMD.

An interactive ``bash`` runs in a pseudo-terminal; the test types at it as a user would.
``lock run F -- CMD &``, then ``fg``: CMD's read of the terminal must stop the job and ``fg``
must continue it (a CMD in a group of its own was no job of the shell's: it stayed stopped for
ever). Ctrl-Z, ``bg``, ``fg`` and Ctrl-C reach it as any command; a hang-up (the terminal
closed) ends both processes and frees the lock. The test waits on what the terminal, ``/proc``
and the lock show (with a deadline), never on time; the shell's whole session is killed at the
end.
"""

from __future__ import annotations

import os
import pty
import select
import shlex
import sys
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Final

import psutil
import pytest

from mahabharatha.owner import ownership, proof
from tests.cli._support import FEATURE, SYNC_TIMEOUT, cli_argv, lock_path, wait_for
from tests.cli.test_proof_of_life import assert_nobody_else_gets_it, second_run
from tests.support.marks import needs_proc, posix_signals

pytestmark = [
    needs_proc,
    posix_signals,
    pytest.mark.skipif(not os.path.exists("/bin/bash"), reason="needs bash"),
]

READ_A_LINE: Final = (
    "import sys\n"
    "line = sys.stdin.readline()  # the terminal: stopped (SIGTTIN) while in the background\n"
    "open(sys.argv[1], 'w').write(line)\n"
)

WAIT_FOR_CTRL_C: Final = (
    "import signal, sys\n"
    "signal.signal(signal.SIGINT, signal.SIG_DFL)  # no KeyboardInterrupt traceback\n"
    "print('cmd' + '-ready', flush=True)  # (the terminal's echo of this line says no such)\n"
    "signal.pause()\n"
)


class Terminal:
    """An interactive bash in a pseudo-terminal, its output gathered as it comes."""

    def __init__(self, cwd: Path) -> None:
        env = {**os.environ, "PS1": "$ ", "TERM": "dumb", "HISTFILE": "/dev/null"}
        env.pop("MAHABHARATHA_FEATURE", None)
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the shell: a session leader whose controlling terminal is the pty
            os.chdir(cwd)
            os.execve("/bin/bash", ["bash", "--norc", "--noprofile", "-i"], env)
        self.seen = ""

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def run(self, argv: list[str], suffix: str = "") -> None:
        self.type(shlex.join(argv) + suffix + "\n")

    def read_until(self, wanted: str, timeout: float = SYNC_TIMEOUT) -> str:
        deadline = time.monotonic() + timeout
        while wanted not in self.seen:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.fd], [], [], max(0.0, left))
            if not ready:
                raise AssertionError(f"{wanted!r} never shown; the terminal said: {self.seen!r}")
            try:
                self.seen += os.read(self.fd, 4096).decode("utf-8", "replace")
            except OSError as gone:  # EIO: the shell is gone
                raise AssertionError(f"closed before {wanted!r}: {self.seen!r}") from gone
        return self.seen

    def foreground(self) -> int:
        return os.tcgetpgrp(self.fd)

    def close(self) -> None:
        """Hang up: the terminal goes away, as when its window is closed."""
        with suppress(OSError):
            os.close(self.fd)
        self.fd = -1


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    shell = Terminal(tmp_path)
    shell.read_until("$ ")
    yield shell
    session = [p for p in psutil.process_iter() if _session_of(p.pid) == shell.pid]
    for process in session:
        with suppress(psutil.Error):
            process.kill()
    if shell.fd >= 0:
        shell.close()
    with suppress(ChildProcessError):
        os.waitpid(shell.pid, 0)


def _session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def _state(pid: int) -> str:
    stat = ownership.proc_stat(pid)
    return "gone" if stat is None else stat.state


def _lock_run(shell: Terminal) -> tuple[psutil.Process, psutil.Process]:
    """The ``lock run`` the shell started (its child), and CMD once it runs (a Python ``-c``:
    not the one-off ``setpriv ... true`` probe ``lock run`` may start first)."""
    found: list[psutil.Process] = []

    def started() -> bool:
        with suppress(psutil.Error):
            for run in psutil.Process(shell.pid).children():
                for cmd in run.children():
                    if cmd.cmdline()[1:2] == ["-c"]:
                        found[:] = [run, cmd]
                        return True
        return False

    try:
        wait_for(started, what="lock run and its command")
    except AssertionError as timed_out:  # say what the shell and its children were doing
        with suppress(AssertionError):
            shell.read_until("\0", timeout=0.5)  # gathers what the terminal showed so far
        said = f"{timed_out}; {_family(shell.pid)}; terminal: {shell.seen!r}"
        raise AssertionError(said) from None
    return found[0], found[1]


def _family(pid: int) -> str:
    """The shell's descendants, each with its state and command line (for a failure)."""
    with suppress(psutil.Error):
        return ", ".join(
            f"{each.pid} {each.status()} {each.cmdline()[:4]}"
            for each in psutil.Process(pid).children(recursive=True)
        )
    return "(the shell is gone)"


def test_a_background_lock_run_whose_command_reads_the_terminal_is_resumed_by_fg(
    terminal: Terminal, tmp_path: Path, gsd: Path
) -> None:
    """Fails on 211f242: CMD led a group of its own, so its read stopped it alone: the job
    (``lock run``) never showed stopped (that wait ran out), ``jobs`` said Running, and ``fg``
    gave the terminal to ``lock run``'s group only, so CMD could never read the line."""
    got = tmp_path / "got"
    argv = cli_argv("lock", "run", FEATURE, "--gsd-dir", gsd, "--")
    terminal.run([*argv, sys.executable, "-c", READ_A_LINE, str(got)], " &")
    run, cmd = _lock_run(terminal)
    wait_for(lambda: _state(cmd.pid) == "T", what="CMD's read to stop it")
    wait_for(lambda: _state(run.pid) == "T", what="the whole job to stop, as the shell sees it")

    terminal.type("fg\n")
    wait_for(lambda: terminal.foreground() == os.getpgid(cmd.pid), what="CMD in the foreground")
    terminal.type("hello\n")
    wait_for(got.exists, what="CMD to read the line typed")
    terminal.type("echo rc=$?\n")
    terminal.read_until("rc=0")
    assert got.read_text() == "hello\n"
    assert not lock_path(gsd).exists()


@pytest.mark.parametrize("redirect", ["", " </dev/null"], ids=["stdin-terminal", "stdin-file"])
def test_ctrl_z_bg_fg_and_ctrl_c_reach_lock_run_and_its_command_as_one_job(
    terminal: Terminal, gsd: Path, redirect: str
) -> None:
    """Ctrl-Z stops the job (both processes), ``bg`` and ``fg`` continue it, Ctrl-C ends it
    once (exit 130) and the lock is freed; also with stdin redirected (``< file``, ``echo y
    |``): still a job of the terminal. Fails on the reviewed merge (f9cad1f) with stdin a
    file: CMD led a group of its own, so Ctrl-Z stopped ``lock run`` alone while CMD ran on
    (the wait for the job to stop ran out)."""
    argv = cli_argv("lock", "run", FEATURE, "--gsd-dir", gsd, "--")
    terminal.run([*argv, sys.executable, "-c", WAIT_FOR_CTRL_C], redirect)
    terminal.read_until("cmd-ready")
    run, cmd = _lock_run(terminal)

    terminal.type("\x1a")  # Ctrl-Z
    wait_for(lambda: _state(run.pid) == _state(cmd.pid) == "T", what="the job to stop")
    terminal.read_until("Stopped")
    terminal.type("bg\n")
    wait_for(lambda: "T" not in (_state(run.pid), _state(cmd.pid)), what="the job to go on")
    terminal.type("fg\n")
    wait_for(lambda: terminal.foreground() == os.getpgid(run.pid), what="the job in front")
    terminal.type("\x03")  # Ctrl-C
    terminal.type("echo rc=$?\n")
    terminal.read_until("rc=130")
    assert not lock_path(gsd).exists()


def test_a_hang_up_ends_a_background_lock_run_and_its_stopped_command(
    terminal: Terminal, tmp_path: Path, gsd: Path
) -> None:
    """Fails on 211f242: the shell's SIGHUP reached ``lock run``'s group; forwarded to CMD
    (stopped by its read, in a group of its own) it stayed pending, so both processes and the
    lock outlived the terminal (the wait below ran out)."""
    argv = cli_argv("lock", "run", FEATURE, "--gsd-dir", gsd, "--")
    terminal.run([*argv, sys.executable, "-c", READ_A_LINE, str(tmp_path / "got")], " &")
    run, cmd = _lock_run(terminal)
    wait_for(lambda: _state(cmd.pid) == "T", what="CMD's read to stop it")

    terminal.close()
    wait_for(lambda: _state(run.pid) in ("gone", "Z"), what="lock run to end")
    wait_for(lambda: _state(cmd.pid) in ("gone", "Z"), what="CMD to end")
    assert not lock_path(gsd).exists()


DROP_THE_PROOF: Final = (
    "import subprocess, signal, sys\n"
    "subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]])  # close_fds: no proof\n"
    "signal.pause()  # until lock run dies (its parent-death signal)\n"
)
"""CMD: starts the job without the proof (Python's default), in the group it shares."""

JOB_SAYS_ITS_PID: Final = (
    "import os, signal, sys, time\n"
    "open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid()))\n"
    "os.rename(sys.argv[1] + '.tmp', sys.argv[1])\n"
    "time.sleep(600)  # the work; the fixture kills the shell's whole session at the end\n"
)


@pytest.mark.skipif(not proof.supported(), reason="no open-file-description locks here")
def test_a_sigkilled_lock_run_in_a_scripts_terminal_job_keeps_the_lock_for_its_work(
    terminal: Terminal, tmp_path: Path, gsd: Path
) -> None:
    """A script typed at the terminal runs ``lock run`` (the job's group is the script's, not
    ``lock run``'s own), whose CMD starts work that drops the proof and stays in that group;
    ``lock run`` is SIGKILLed (CMD dies with it). Fails on the reviewed merge (f9cad1f): CMD
    shared the job's group and nothing recorded it, so the owner was judged ``not-running``
    and ``--reclaim-dead`` ran a second holder beside the work (the owner word below)."""
    job_file = tmp_path / "job.pid"
    marker = tmp_path / "second"
    argv = cli_argv("lock", "run", FEATURE, "--gsd-dir", gsd, "--")
    cmd = [*argv, sys.executable, "-c", DROP_THE_PROOF, JOB_SAYS_ITS_PID, str(job_file)]
    terminal.run(["sh", "-c", shlex.join(cmd) + "; echo script-over"])
    wait_for(job_file.exists, what="the job to start")
    job = psutil.Process(int(job_file.read_text()))
    run = psutil.Process(job.ppid()).parent()
    assert run is not None and os.getpgid(run.pid) != run.pid  # the script leads the job
    assert os.getpgid(job.pid) == os.getpgid(run.pid)  # CMD shared the job's group

    run.kill()
    terminal.read_until("script-over")
    assert job.is_running(), "the work was meant to outlive lock run and CMD"
    assert_nobody_else_gets_it(tmp_path, gsd, marker)

    job.kill()
    job.wait(timeout=SYNC_TIMEOUT)
    assert second_run(tmp_path, gsd, marker).returncode == 0
