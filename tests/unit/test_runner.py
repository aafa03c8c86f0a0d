"""``lock run``'s runner: a signal at any moment before, during or after the command starts
leaves no stranded lock and no orphaned command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import types
from contextlib import suppress
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Final

import pytest

from mahabharatha import constants, locks
from mahabharatha.commands._utils import check_feature_lock
from mahabharatha.run import runner, spawn

pytestmark = pytest.mark.timeout(30)

MARKER_CMD = [sys.executable, "-c", "import pathlib, sys; pathlib.Path(sys.argv[1]).touch()"]


@pytest.fixture
def gsd(tmp_path: Path) -> str:
    return str(tmp_path / "gsd")


def lock_file(gsd: str) -> Path:
    return Path(gsd) / "specs" / "feat" / ".lock"


def test_a_signal_while_waiting_ends_the_wait_and_never_runs_the_command(
    gsd: str, tmp_path: Path
) -> None:
    locks.acquire("feat", gsd, pid=1)
    held = lock_file(gsd).read_bytes()
    marker = tmp_path / "ran"

    def on_wait(_info: locks.LockInfo, _left: float | None) -> None:
        signal.raise_signal(signal.SIGTERM)

    holder = locks.FeatureLock("feat", gsd, timeout=None, heartbeat=None, on_wait=on_wait)
    with pytest.raises(runner.Interrupted) as stopped:
        runner.run_locked(holder, [*MARKER_CMD, str(marker)])
    assert stopped.value.exit_code == 128 + signal.SIGTERM
    assert not marker.exists()
    assert lock_file(gsd).read_bytes() == held  # the holder's lock is untouched


def test_a_signal_between_taking_the_lock_and_starting_releases_it(
    gsd: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "ran"
    real_acquire = locks.FeatureLock.acquire

    def acquire_then_signalled(self: locks.FeatureLock, **callbacks: Any) -> locks.FeatureLock:
        taken = real_acquire(self, **callbacks)
        signal.raise_signal(signal.SIGHUP)
        return taken

    monkeypatch.setattr(locks.FeatureLock, "acquire", acquire_then_signalled)
    holder = locks.FeatureLock("feat", gsd, timeout=0, heartbeat=None)
    with pytest.raises(runner.Interrupted):
        runner.run_locked(holder, [*MARKER_CMD, str(marker)])
    assert not marker.exists()
    assert not lock_file(gsd).exists()


def test_a_signal_while_the_command_starts_reaches_the_command(
    gsd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_popen = subprocess.Popen

    def popen_signalled_midway(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        signal.raise_signal(signal.SIGTERM)  # arrives before the child's pid is known
        return real_popen(*args, **kwargs)

    monkeypatch.setattr(runner.subprocess, "Popen", popen_signalled_midway)
    holder = locks.FeatureLock("feat", gsd, timeout=0, heartbeat=None)
    code = runner.run_locked(holder, [sys.executable, "-c", "import time; time.sleep(20)"])
    assert code == 128 + signal.SIGTERM
    assert check_feature_lock("feat", gsd) is None
    assert not lock_file(gsd).exists()


LATE_KILL: Final = """\
import signal, sys
from mahabharatha import locks
from mahabharatha.run import runner, spawn
spawn._in_terminal_job = lambda: True  # CMD shares our group, as a terminal's job does
releasing = runner._Relay.releasing

def killed_first(relay):
    if relay.phase is runner._Phase.RUNNING:  # CMD is reaped, the release not yet begun
        signal.raise_signal(signal.SIGTERM)  # a kill -TERM to lock run lands here
    releasing(relay)

runner._Relay.releasing = killed_first
holder = locks.FeatureLock("feat", sys.argv[1], timeout=0, heartbeat=None)
print(runner.run_locked(holder, sys.argv[2:]), flush=True)
"""
"""``lock run`` as a terminal's job, signalled between CMD's end and the release."""

LEAVES_WORK: Final = (
    "import subprocess, sys\n"
    "work = subprocess.Popen([sys.executable, '-c', *sys.argv[1:]], stdout=subprocess.PIPE)\n"
    "work.stdout.readline()  # its handler is set: CMD ends, its work stays in the group\n"
)

TOLD_WORK: Final = (
    "import os, pathlib, signal, sys\n"
    "def told(*_):\n"
    "    pathlib.Path(sys.argv[1]).write_text(signal.Signals(_[0]).name)\n"
    "    os._exit(0)\n"
    "signal.signal(signal.SIGTERM, told)\n"
    "print('ready', flush=True)\n"
    "while True:\n"
    "    signal.pause()\n"
)


def test_a_signal_just_after_cmd_ends_reaches_the_work_it_left_in_our_group(
    gsd: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fails before the fix: the relay forgot CMD once it was reaped, so a SIGTERM landing
    before the release began went nowhere and the work CMD left in the job's group was
    SIGKILLed after the grace. (A process of its own: CMD's orphans make it a subreaper.)"""
    told = tmp_path / "told"
    monkeypatch.setenv(constants.GRACE_ENV, "10")  # the work ends by the TERM, not the grace
    command = [sys.executable, "-c", LEAVES_WORK, TOLD_WORK, str(told)]
    run = subprocess.run(
        [sys.executable, "-c", LATE_KILL, gsd, *command],
        capture_output=True,
        text=True,
        timeout=25,
    )
    assert (run.returncode, run.stdout) == (0, "0\n"), run.stderr
    assert told.exists(), "the work CMD left was never told of the SIGTERM"
    assert told.read_text() == "SIGTERM"
    assert not lock_file(gsd).exists()


RUN_LOCKED: Final = """\
import sys
from mahabharatha import locks
from mahabharatha.run import runner
holder = locks.FeatureLock("feat", sys.argv[1], timeout=0, heartbeat=None)
print(runner.run_locked(holder, sys.argv[2:]), flush=True)
"""
"""``run_locked`` in a process of its own (it adopts no orphans: the library's rule)."""

STARTS_WORK_THEN_EXITS: Final = (
    "import os, subprocess, sys\n"
    "work = subprocess.Popen([sys.executable, '-c', 'import sys; open(sys.argv[1]).read()',"
    " sys.argv[1]])  # close_fds: no proof; in CMD's group\n"
    "print(os.getpid(), flush=True)\n"
)
"""CMD: starts work that ends when its FIFO (``argv[1]``) is written and closed, says its own
pid, exits."""


def test_run_locked_keeps_the_lock_while_work_left_in_cmds_group_runs(
    gsd: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The library's ``run_locked`` adopts no orphans: only CMD's group says that work CMD
    left without the proof still runs. The lock stays until that work ends."""
    from tests.cli._support import wait_for

    monkeypatch.setenv(constants.GRACE_ENV, "30")  # the work ends by our cue, not the grace
    cue = tmp_path / "cue"
    os.mkfifo(cue)
    command = [sys.executable, "-c", STARTS_WORK_THEN_EXITS, str(cue)]
    with subprocess.Popen(
        [sys.executable, "-c", RUN_LOCKED, gsd, *command], stdout=subprocess.PIPE, text=True
    ) as run:
        cmd = 0
        try:
            assert run.stdout is not None
            cmd = int(run.stdout.readline())
            wait_for(lambda: not os.path.exists(f"/proc/{cmd}"), what="CMD to be reaped")
            assert lock_file(gsd).exists(), "released while the work CMD left in its group ran"
            with open(cue, "w"):
                pass  # the work ends (the open waits until it reads)
            assert run.stdout.readline() == "0\n"
        except BaseException:
            if cmd:  # the work (in CMD's group, which it keeps alive) never outlives the test
                with suppress(ProcessLookupError):
                    os.killpg(cmd, signal.SIGKILL)
            raise
        finally:
            if run.poll() is None:
                run.kill()
    assert not lock_file(gsd).exists()


def test_a_lost_lock_told_without_a_thread_holds_up_no_signal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fails before the fix: with no thread to wait out a lost lock's grace in, the caller's
    callback ran under the relay's mutex, and a signal to forward to CMD waited for it."""
    sent: list[int] = []
    forwarded = threading.Event()
    child: Any = SimpleNamespace(popen=SimpleNamespace(pid=os.getpid()), send=sent.append)

    def forward_a_signal() -> None:
        relay.deliver(signal.SIGINT, from_kernel=False)
        forwarded.set()

    def notify(_error: locks.LockLostError) -> None:  # the signal comes while it runs
        signaller.start()
        in_time.append(forwarded.wait(10))

    def no_thread(_thread: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    signaller, in_time = threading.Thread(target=forward_a_signal), list[bool]()
    monkeypatch.setattr(runner.signals, "start_without_signals", no_thread)
    relay = runner._Relay(runner.OnLost.TERMINATE, notify)
    relay.started(child)
    relay.lost(locks.LockLostError("feat"))
    signaller.join()
    assert in_time == [True], "the signal waited for the lost lock's callback"
    assert sent == [signal.SIGINT, signal.SIGTERM]


def test_a_missing_command_is_reported_and_the_lock_released(gsd: str) -> None:
    holder = locks.FeatureLock("feat", gsd, timeout=0, heartbeat=None)
    with pytest.raises(runner.CommandNotFoundError):
        runner.run_locked(holder, ["/nonexistent/command"])
    assert not lock_file(gsd).exists()


def test_the_lock_records_this_process_while_the_command_runs(gsd: str) -> None:
    show = "import pathlib, sys; sys.stdout.write(pathlib.Path(sys.argv[1]).read_text())"
    read, write = os.pipe()
    with os.fdopen(write, "w") as out:
        holder = locks.FeatureLock("feat", gsd, timeout=0, heartbeat=None)
        code = runner.run_locked(holder, [sys.executable, "-c", show, str(lock_file(gsd))], out)
    with os.fdopen(read) as seen:
        assert seen.read().split(":")[0] == str(os.getpid())
    assert code == 0


needs_setpriv = pytest.mark.skipif(
    spawn._setpriv_with_pdeathsig() is None, reason="no setpriv that sets --pdeathsig"
)


@needs_setpriv
def test_cmd_is_started_through_setpriv_without_a_forking_hook() -> None:
    """Where setpriv sets the parent-death signal, Python may vfork (no ``preexec_fn``): the
    fork of the interpreter was most of a short command's cost in a pool."""
    words, hook = spawn._spawned_words(["true", "x"], None)
    assert hook is None
    assert words[1:] == ["--pdeathsig", "KILL", "--", "true", "x"]


def test_without_setpriv_the_prctl_hook_asks_for_the_signal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(spawn, "_setpriv_with_pdeathsig", lambda: None)
    words, hook = spawn._spawned_words(["true"], None)
    assert words == ["true"]
    assert (hook is None) == (spawn._parent_death_hook() is None)


@needs_setpriv
@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda path: None, FileNotFoundError),
        (lambda path: path.mkdir(), PermissionError),
        (lambda path: path.write_text("#!/bin/sh\n"), PermissionError),  # no execute bit
    ],
    ids=["missing", "a-folder", "not-executable"],
)
def test_a_command_that_cannot_start_is_told_before_setpriv_runs(
    tmp_path: Path, make: Any, error: type[OSError]
) -> None:
    """setpriv would run and fail as the command (a failed attempt, its own message): the
    runner tells what ``Popen`` would have told, by path and by ``PATH``."""
    program = tmp_path / "cmd"
    make(program)
    with pytest.raises(error):
        spawn._spawned_words([str(program)], None)
    with pytest.raises(error):
        spawn._spawned_words(["cmd"], {"PATH": str(tmp_path)})


@needs_setpriv
def test_a_command_found_once_and_gone_since_is_told_as_gone(tmp_path: Path) -> None:
    """The place ``PATH`` gave for a pool's command is remembered (one search per program, not
    one per feature) and checked again at every start: a command removed, or replaced by a
    folder, since the last start is told as ``Popen`` would tell it; one that moved to another
    ``PATH`` entry is found there."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    program = first / "cmd"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    env = {"PATH": f"{first}{os.pathsep}{second}"}
    spawn._spawned_words(["cmd"], env)  # found in first/
    program.unlink()
    with pytest.raises(FileNotFoundError):
        spawn._spawned_words(["cmd"], env)
    program.mkdir()
    with pytest.raises(PermissionError):
        spawn._spawned_words(["cmd"], env)
    moved = second / "cmd"
    moved.write_text("#!/bin/sh\n")
    moved.chmod(0o755)
    words, _ = spawn._spawned_words(["cmd"], env)  # the folder in first/ is passed over
    assert words[-1] == "cmd"


SIGNAL_AT_EVERY_LINE: Final = """
import signal, sys
from mahabharatha import signals
from mahabharatha.run import runner

def wait_signalled_at(at):
    # lock run's handler in place, a signal raised at line event ``at`` of a release's wait
    # (the handler runs right there); the number of line events the wait ran
    relay = runner._Relay(runner.OnLost.TERMINATE, None)
    relay.releasing()
    seen = 0
    def tracer(frame, event, arg):
        nonlocal seen
        if event == "line":
            if seen == at:
                signal.raise_signal(signal.SIGTERM)
            seen += 1
        return tracer
    with signals.Handling(signals.FORWARDED, relay):
        sys.settrace(tracer)
        try:
            got = relay.signalled_within(0.01)
        finally:
            sys.settrace(None)
    assert at is None or got == signal.SIGTERM, (at, got)
    return seen

for at in range(wait_signalled_at(None)):
    wait_signalled_at(at)
"""


def test_a_signal_at_any_line_of_the_release_wait_ends_it() -> None:
    """The handler runs in the main thread wherever it stopped. Fails before the fix (hangs:
    killed by the guard): the wait was an ``Event``, and a signal landing while the main
    thread held its inner lock (inside ``Event.wait``) made the handler's ``set`` wait for
    that lock for ever: ``lock run`` never ended (seen once in CI, SIGTERM during a lease)."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", SIGNAL_AT_EVERY_LINE], capture_output=True, timeout=20
        )
    except subprocess.TimeoutExpired:
        pytest.fail("a signal handled inside the wait hung it")
    assert done.returncode == 0, done.stderr.decode()


def test_a_signal_between_the_commands_end_and_its_release_still_ends_the_release_wait() -> None:
    """``Run.command`` says "releasing" when CMD ends, and the release says it again: a signal
    between the two (during the grace for CMD's leftovers) must still cut a later wait for a
    kernel lease short. Fails before the fix: the second call cleared it (a wait of the whole
    lease-break time, or for ever under a lease that is renewed)."""
    relay = runner._Relay(runner.OnLost.TERMINATE, None)
    relay.releasing()
    relay.deliver(signal.SIGTERM, from_kernel=None)
    relay.releasing()
    assert relay.signalled_within(0) == signal.SIGTERM


def test_the_wait_after_killing_cmds_group_pauses_even_once_a_signal_came(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A signal during the leftovers' grace stays pending (the release's wait needs it): the
    wait for the killed group must still pause between looks. Fails before the fix: it asked
    the relay, which answered at once, and spun (thousands of looks in its 0.2 s here)."""
    monkeypatch.setattr(runner, "work_grace_seconds", lambda: 0.0)
    monkeypatch.setattr(runner, "WORK_KILL_WAIT_SECONDS", 0.2)
    looks = [0]

    def left_running() -> bool:
        looks[0] += 1
        return True

    relay = runner._Relay(runner.OnLost.TERMINATE, None)
    relay.releasing()
    relay.deliver(signal.SIGTERM, from_kernel=None)
    child = types.SimpleNamespace(left_running=left_running, kill_group=lambda: None)
    assert runner._Child.outlast(child, relay)  # type: ignore[arg-type]
    assert looks[0] < 100, f"{looks[0]} looks: a spin"
