"""``lock run FEATURE -- CMD``: hold the lock while CMD runs, keep it fresh, release it whatever
happens, and exit as CMD did.

CMD is a small Python program that prints ``ready`` once it runs (so the lock is held) and then
waits for the test: on stdin, or for a signal. The heartbeat is observed by polling the lock
file with a deadline; the two-hour promise is shown in-process with a fake clock, against a
control that must fail without the refreshes.
"""

from __future__ import annotations

import os
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
from mahabharatha.locks import LockHeldError
from tests.cli._support import (
    FEATURE,
    STALE_AFTER_SECONDS,
    Child,
    cli_argv,
    invoke,
    lock_path,
    one_document,
    one_sentence,
    read_record,
    run_cli,
    wait_for,
)
from tests.support.marks import posix_signals

Spawn = Callable[..., Child]

PY: Final = sys.executable
OTHER: Final = 4_000_000

READY_THEN_WAIT_FOR_STDIN: Final = "import sys\nprint('ready', flush=True)\nsys.stdin.readline()\n"

TRAP: Final = """\
import signal, sys
from pathlib import Path

def on_signal(signum, frame):
    Path(sys.argv[1]).write_text(str(signum))
    sys.exit(42)

signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGINT, on_signal)
print('ready', flush=True)
while True:
    signal.pause()
"""
"""CMD that records the signal it receives in the file named by its argument, then exits 42."""


def touch(marker: Path) -> str:
    return f"open({str(marker)!r}, 'w').close()"


def lock_run(gsd: Path, *options: object) -> list[str]:
    """``python -m mahabharatha lock run --gsd-dir GSD OPTIONS FEATURE --`` (append CMD)."""
    return cli_argv("lock", "run", "--gsd-dir", gsd, *options, FEATURE, "--")


# --------------------------------------------------------------------------- exit codes


@pytest.mark.parametrize("code", [0, 7])
def test_run_exits_with_cmds_code_and_releases_the_lock(
    tmp_path: Path, gsd: Path, code: int
) -> None:
    done = subprocess.run(
        [*lock_run(gsd), PY, "-c", f"import sys; sys.exit({code})"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=20,
    )

    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    assert not lock_path(gsd).exists()


def test_while_cmd_runs_the_lock_records_the_lock_run_process(gsd: Path, spawn: Spawn) -> None:
    show = f"print(open({str(lock_path(gsd))!r}).read())"
    runner = spawn([*lock_run(gsd), PY, "-c", show])

    assert runner.wait() == 0, runner.stderr
    pid, timestamp = map(float, runner.stdout.strip().split(":"))
    assert pid == runner.pid
    assert abs(time.time() - timestamp) < 60
    assert not lock_path(gsd).exists()


def test_with_json_stdout_is_one_document_even_when_cmd_prints(tmp_path: Path, gsd: Path) -> None:
    cmd = "import sys; print('chatter from CMD'); sys.exit(5)"

    done = run_cli(
        "lock", "run", "--gsd-dir", gsd, "--json", FEATURE, "--", PY, "-c", cmd, cwd=tmp_path
    )

    assert done.returncode == 5
    one_document(done.stdout)
    assert not lock_path(gsd).exists()


def test_a_cmd_that_cannot_be_started_fails_in_one_sentence_and_releases(
    tmp_path: Path, gsd: Path
) -> None:
    missing = str(tmp_path / "no-such-program")

    done = run_cli("lock", "run", "--gsd-dir", gsd, FEATURE, "--", missing, cwd=tmp_path)

    assert done.returncode != 0
    one_sentence(done.stderr)
    assert not lock_path(gsd).exists()


# --------------------------------------------------------------------------- a busy lock


@pytest.mark.parametrize("timeout", [0, 0.3])
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_lock_busy_past_the_timeout_exits_75_without_running_cmd(
    tmp_path: Path, gsd: Path, timeout: float, as_json: bool
) -> None:
    locks.acquire(FEATURE, gsd, pid=OTHER)
    before = lock_path(gsd).read_text()
    marker = tmp_path / "ran"
    options = ["--timeout", timeout, *(["--json"] if as_json else [])]
    started = time.monotonic()

    done = run_cli(
        "lock",
        "run",
        "--gsd-dir",
        gsd,
        *options,
        FEATURE,
        "--",
        PY,
        "-c",
        touch(marker),
        cwd=tmp_path,
    )

    assert done.returncode == 75, done.stderr
    assert time.monotonic() - started >= timeout
    assert not marker.exists(), "CMD must not run without the lock"
    assert lock_path(gsd).read_text() == before
    if as_json:
        assert "error" in one_document(done.stdout)


def test_without_timeout_run_waits_for_the_lock_then_runs_cmd(
    tmp_path: Path, gsd: Path, spawn: Spawn
) -> None:
    locks.acquire(FEATURE, gsd, pid=OTHER)
    marker = tmp_path / "ran"
    runner = spawn([*lock_run(gsd), PY, "-c", touch(marker)])
    # One more CLI start-up on the same machine: by its end the runner has tried at least once.
    assert run_cli("lock", "check", "--gsd-dir", gsd, FEATURE, cwd=tmp_path).returncode == 1
    assert runner.proc.poll() is None, runner.stderr
    assert not marker.exists()

    locks.release(FEATURE, gsd, pid=OTHER)

    assert runner.wait() == 0, runner.stderr
    assert marker.exists()
    assert not lock_path(gsd).exists()


# --------------------------------------------------------------------------- signals


@posix_signals
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
@pytest.mark.parametrize("target", ["process", "group"])
def test_a_signal_to_run_reaches_cmd_and_the_lock_is_released(
    tmp_path: Path, gsd: Path, spawn: Spawn, signum: int, target: str
) -> None:
    marker = tmp_path / "signal"
    runner = spawn([*lock_run(gsd), PY, "-c", TRAP, str(marker)])
    assert runner.next_line() == "ready"
    assert read_record(lock_path(gsd))[0] == runner.pid, "held by lock run while CMD runs"

    if target == "process":
        os.kill(runner.pid, signum)  # kill(1), a supervisor: only lock run gets it
    else:
        os.killpg(runner.pid, signum)  # Ctrl-C at a terminal: the whole group gets it

    code = runner.wait()
    assert marker.read_text() == str(int(signum)), "CMD received the signal"
    assert code in (42, 128 + signum), runner.stderr
    assert not lock_path(gsd).exists()


@posix_signals
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGUSR1], ids=["KILL", "USR1"])
def test_cmd_killed_by_signal_n_exits_128_plus_n(tmp_path: Path, gsd: Path, signum: int) -> None:
    die = f"import os; os.kill(os.getpid(), {int(signum)})"

    done = run_cli("lock", "run", "--gsd-dir", gsd, FEATURE, "--", PY, "-c", die, cwd=tmp_path)

    assert done.returncode == 128 + signum
    assert not lock_path(gsd).exists()


# --------------------------------------------------------------------------- heartbeat


def test_heartbeat_keeps_rewriting_the_timestamp_while_cmd_runs(gsd: Path, spawn: Spawn) -> None:
    runner = spawn(
        [
            *cli_argv("lock", "run", "--gsd-dir", gsd, "--heartbeat", 0.05, FEATURE, "--"),
            PY,
            "-c",
            READY_THEN_WAIT_FOR_STDIN,
        ],
        stdin=subprocess.PIPE,
    )
    assert runner.next_line() == "ready"
    path = lock_path(gsd)
    seen = [read_record(path)]

    for _ in range(2):  # two refreshes in a row: a heartbeat, not a one-off rewrite
        last = seen[-1][1]
        wait_for(lambda last=last: read_record(path)[1] > last, timeout=10, what="a refresh")
        seen.append(read_record(path))
    runner.send("done\n")

    assert runner.wait() == 0, runner.stderr
    assert {pid for pid, _ in seen} == {runner.pid}
    assert not path.exists()


class FakeClock:
    """Stands in for the ``time`` module of ``_utils``: the one clock of every lock decision."""

    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now


START: Final = 1_700_000_000.0
STEP: Final = 60
UNTIL: Final = int(STALE_AFTER_SECONDS) + 10 * STEP


def _taken_over_at(gsd: Path, monkeypatch: pytest.MonkeyPatch, *, refresh: bool) -> list[int]:
    """Hold FEATURE while the clock runs past the stale limit; when could another pid take it?"""
    clock = FakeClock(START)
    monkeypatch.setattr("mahabharatha.commands._utils.time", clock)
    holder = locks.FeatureLock(FEATURE, gsd, heartbeat=None, timeout=0)
    holder.acquire()
    taken = []
    try:
        for elapsed in range(STEP, UNTIL + 1, STEP):
            clock.now = START + elapsed
            if refresh:
                holder.refresh()
            try:
                locks.acquire(FEATURE, gsd, pid=OTHER)
            except LockHeldError:
                continue
            taken.append(elapsed)
            break
    finally:
        holder.release()
    return taken


def test_a_refreshed_lock_stays_held_far_past_the_stale_limit(
    gsd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _taken_over_at(gsd, monkeypatch, refresh=True) == []


def test_control_without_refresh_the_lock_is_taken_just_past_the_stale_limit(
    gsd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shows that the test above can fail: the same steps, no refresh, and the lock goes."""
    assert _taken_over_at(gsd, monkeypatch, refresh=False) == [int(STALE_AFTER_SECONDS) + STEP]


WAIT_ON_FIFO: Final = "import sys\nopen(sys.argv[1]).read()\n"
"""CMD that runs until the test opens (and closes) the FIFO named by its argument."""


def _run_past_the_stale_limit(gsd: Path, tmp_path: Path, clock: FakeClock) -> list[float]:
    """Drive the clock past the stale limit while ``lock run`` holds FEATURE; each step waits
    for a heartbeat to write the new time, then another pid tries to take the lock. Returns the
    clock readings at which it got it (to be none)."""
    fifo = tmp_path / "finish"
    os.mkfifo(fifo)
    path = lock_path(gsd, FEATURE)
    taken: list[float] = []
    failures: list[BaseException] = []

    def drive() -> None:
        try:
            wait_for(path.exists, what="lock run to take the lock")
            for elapsed in range(STEP, UNTIL + 1, STEP):
                clock.now = START + elapsed
                wait_for(lambda: read_record(path)[1] == clock.now, what="a heartbeat")
                try:
                    locks.acquire(FEATURE, gsd, pid=OTHER)
                    taken.append(clock.now)
                except LockHeldError:
                    continue
        except BaseException as error:  # reported by the test, not lost with the thread
            failures.append(error)
        finally:
            with open(fifo, "w"):  # lets CMD finish
                pass

    driver = threading.Thread(target=drive)
    driver.start()
    args = ["lock", "run", FEATURE, "--gsd-dir", gsd, "--heartbeat", "0.01", "--"]
    result = invoke(*args, PY, "-c", WAIT_ON_FIFO, fifo)
    driver.join(timeout=60)
    assert not failures, failures
    assert result.exit_code == 0, result.stderr
    return taken


@pytest.mark.timeout(120)
def test_lock_run_keeps_its_lock_far_past_the_stale_limit(
    gsd: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real ``lock run`` (its heartbeat thread, its refresh) under a clock that runs two
    hours and ten minutes while CMD runs: no other pid can take the lock at any step."""
    clock = FakeClock(START)
    monkeypatch.setattr("mahabharatha.commands._utils.time", clock)
    assert _run_past_the_stale_limit(gsd, tmp_path, clock) == []
    assert not lock_path(gsd, FEATURE).exists()
