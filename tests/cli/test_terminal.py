"""What a person sees at a terminal: the waiting line, the status table, completion."""

from __future__ import annotations

import io
import os
import pty
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

from mahabharatha.backends.base import State
from mahabharatha.cli import _render
from mahabharatha.locks import LockInfo, Owner
from tests.cli._support import (
    FEATURE,
    SYNC_TIMEOUT,
    child_env,
    cli_argv,
    invoke,
    write_lock,
)
from tests.support.marks import posix_signals

HOLDER = LockInfo(FEATURE, State.ACTIVE, 4242, time.time(), 1.0, 7199.0, Owner.RUNNING)
ERASE = "\r\x1b[K"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_waiting_line_is_redrawn_at_most_once_a_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Polls come ~50 times a second; the line is drawn once per second of them.
    Fails before the fix: without a time limit every poll redrew the line."""
    clock = [100.0]
    screen = _Terminal()
    monkeypatch.setattr(_render, "monotonic", lambda: clock[0])
    monkeypatch.setattr(_render.sys, "stderr", screen)
    with _render.WaitingLine() as line:
        assert line.callback is not None
        for _ in range(120):  # 2.4 s of polls 20 ms apart, no time limit
            line.callback(HOLDER, None)
            clock[0] += 0.02
    drawn = screen.getvalue().count("\rwaiting: ")
    assert drawn == 3  # at 0 s, 1 s and 2 s
    assert screen.getvalue().endswith(ERASE)


class _Pty:
    """A child whose stderr is a terminal; its output read with a deadline."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        self.main, secondary = pty.openpty()
        self.child = subprocess.Popen(
            argv,
            cwd=cwd,
            env=child_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=secondary,
            start_new_session=True,
        )
        os.close(secondary)
        self.seen = b""

    def read_until(self, wanted: bytes | None) -> None:
        """Read until ``wanted`` has been seen (``None``: until the child closes the pty)."""
        deadline = time.monotonic() + SYNC_TIMEOUT
        while wanted is None or wanted not in self.seen:
            left = deadline - time.monotonic()
            assert left > 0, f"never saw {wanted!r}: {self.seen!r}"
            ready, _, _ = select.select([self.main], [], [], left)
            if not ready:
                continue
            try:
                chunk = os.read(self.main, 4096)
            except OSError:  # EIO: the child closed its end
                chunk = b""
            if not chunk:
                assert wanted is None, f"closed before {wanted!r}: {self.seen!r}"
                return
            self.seen += chunk

    def close(self) -> int:
        try:
            return self.child.wait(timeout=SYNC_TIMEOUT)
        finally:
            os.close(self.main)
            if self.child.poll() is None:
                self.child.kill()
                self.child.wait()


def _error_follows_an_erase(output: str) -> bool:
    before, _, _ = output.rpartition("mahabharatha: ")
    return before.endswith(ERASE)


@pytest.mark.parametrize(
    "argv",
    [
        ["lock", "acquire", FEATURE, "--pid", str(os.getpid()), "--wait", "1.2"],
        ["lock", "run", FEATURE, "--timeout", "1.2", "--", "true"],
    ],
    ids=["acquire", "run"],
)
def test_the_waiting_line_is_erased_before_the_error(
    tmp_path: Path, gsd: Path, argv: list[str]
) -> None:
    """Fails before the fix (run): '...giving up in 0m00smahabharatha: ...' on one line."""
    write_lock(gsd, pid=1, timestamp=time.time())  # not us, not our parent: someone else
    terminal = _Pty(cli_argv(*argv[:3], "--gsd-dir", gsd, *argv[3:]), tmp_path)
    terminal.read_until(None)
    assert terminal.close() in (1, 75)
    output = terminal.seen.decode()
    assert "\rwaiting: " in output
    assert _error_follows_an_erase(output), repr(output)


def test_the_waiting_line_is_gone_before_the_commands_output(tmp_path: Path, gsd: Path) -> None:
    """``lock run`` waits at a terminal, the holder lets go, CMD writes to the same terminal:
    CMD's first words follow an erase, never the waiting line (``lock run`` enters the line
    around the wait only)."""
    lock = write_lock(gsd, pid=1, timestamp=time.time())  # someone else's: lock run waits
    argv = cli_argv("lock", "run", FEATURE, "--gsd-dir", gsd, "--timeout", "20")
    terminal = _Pty([*argv, "--", "sh", "-c", "echo from-cmd >&2"], tmp_path)
    terminal.read_until(b"\rwaiting: ")  # handshake: it is waiting now
    lock.unlink()  # the holder lets go
    terminal.read_until(None)
    assert terminal.close() == 0
    output = terminal.seen.decode()
    before, found, _ = output.partition("from-cmd")
    assert found and before.endswith(ERASE), repr(output)


@posix_signals
@pytest.mark.parametrize(
    "argv",
    [
        ["lock", "acquire", FEATURE, "--pid", str(os.getpid()), "--wait", "60"],
        ["lock", "run", FEATURE, "--", "true"],
    ],
    ids=["acquire", "run"],
)
def test_the_waiting_line_is_erased_on_ctrl_c(tmp_path: Path, gsd: Path, argv: list[str]) -> None:
    """Ctrl-C while waiting: the line goes before 'interrupted' is said.
    Fails before the fix (run): the interruption was glued onto the waiting line."""
    write_lock(gsd, pid=1, timestamp=time.time())  # not us, not our parent: someone else
    terminal = _Pty(cli_argv(*argv[:3], "--gsd-dir", gsd, *argv[3:]), tmp_path)
    terminal.read_until(b"\rwaiting: ")  # handshake: it is waiting now
    terminal.child.send_signal(signal.SIGINT)
    terminal.read_until(None)
    assert terminal.close() == 130
    output = terminal.seen.decode()
    assert "interrupted" in output
    assert _error_follows_an_erase(output), repr(output)


def test_status_off_a_terminal_is_plain_ascii_and_never_cuts_a_pid(gsd: Path) -> None:
    """Fails before the fix: box-drawing characters in a pipe, and long values were cut to
    fit 80 columns."""
    long_name = "a-rather-long-feature-name-that-would-not-fit-in-a-narrow-column-at-all"
    write_lock(gsd, long_name, pid=4_194_304, timestamp=time.time())
    write_lock(gsd, "short", pid=7, timestamp=1000.0)
    shown = invoke("lock", "status", "--gsd-dir", gsd, env={"COLUMNS": "40"}).stdout
    assert shown.isascii()
    rows = shown.splitlines()
    assert any(long_name in row and "4194304" in row for row in rows)
    # No process has pid 4194304: its lock is counted as reclaimable (issue 19, item 12).
    assert rows[-1] == "2 features: 0 done, 0 held, 0 free, 0 failed, 1 stale, 1 reclaimable"


def test_completion_offers_the_feature_folders(gsd: Path) -> None:
    """Fails before the fix: feature arguments completed nothing (or file names)."""
    for name in ("auth-flow", "auth-tokens", "billing"):
        (gsd / "specs" / name).mkdir(parents=True)
    (gsd / "specs" / "auth-notes.txt").write_text("not a folder")
    env = {
        "_MAHABHARATHA_COMPLETE": "complete_bash",
        "COMP_WORDS": f"mahabharatha lock acquire --gsd-dir {gsd} auth",
        "COMP_CWORD": "5",
    }
    from typer.testing import CliRunner

    from mahabharatha.cli import app

    result = CliRunner().invoke(app, [], env=env, prog_name="mahabharatha")
    assert sorted(result.stdout.split()) == ["auth-flow", "auth-tokens"]
