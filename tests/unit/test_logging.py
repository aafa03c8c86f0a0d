"""The library speaks through the ``mahabharatha`` logger (a reclaim, a wait, a lost lock), and
says nothing by itself; the CLI's ``-v`` shows those messages and ``-q`` silences its notes."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mahabharatha import locks, logs

FEATURE = "alpha"
HANG_GUARD_SECONDS = 15.0


@pytest.fixture
def gsd(tmp_path: Path) -> Path:
    folder = tmp_path / ".gsd"
    (folder / "specs" / FEATURE).mkdir(parents=True)
    return folder


def _stale_lock(gsd: Path) -> None:
    (gsd / "specs" / FEATURE / ".lock").write_text(f"1:{time.time() - 3 * 7200}")


def _said(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == logs.LOGGER_NAME and record.levelno == level
    ]


def test_a_reclaim_is_logged(gsd: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Failed on 211f242: nothing went through ``logging`` (no record at all)."""
    _stale_lock(gsd)
    with caplog.at_level(logging.INFO, logger=logs.LOGGER_NAME):
        locks.acquire(FEATURE, gsd)
    locks.release(FEATURE, gsd)
    assert _said(caplog, logging.INFO) == ["reclaimed feature 'alpha' from pid 1 (stale)"]


def test_a_wait_is_logged_once(gsd: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A wait of many polls is one message naming the holder. Failed on 211f242: none."""
    locks.acquire(FEATURE, gsd, pid=os.getppid())  # a running process that is not us
    with caplog.at_level(logging.INFO, logger=logs.LOGGER_NAME), pytest.raises(locks.LockError):
        locks.acquire(FEATURE, gsd, timeout=0.2)
    said = _said(caplog, logging.INFO)
    assert len(said) == 1 and said[0].startswith("waiting: feature 'alpha' is locked by pid")


def test_a_lost_lock_is_a_warning(gsd: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Failed on 211f242: the loss reached ``on_lost`` only."""
    reported = threading.Event()
    holder = locks.FeatureLock(
        FEATURE, gsd, timeout=0, heartbeat=0.01, on_lost=lambda _: reported.set()
    )
    with caplog.at_level(logging.INFO, logger=logs.LOGGER_NAME), holder:
        locks.release(FEATURE, gsd, pid=1, force=True)
        locks.acquire(FEATURE, gsd, pid=1)
        assert reported.wait(HANG_GUARD_SECONDS)
    assert _said(caplog, logging.WARNING) == [str(holder.lost)]


LOST_IN_A_LIBRARY_USER = """
import sys, threading
from mahabharatha import locks
reported = threading.Event()
holder = locks.FeatureLock("alpha", sys.argv[1], timeout=0, heartbeat=0.01,
                           on_lost=lambda _: reported.set())
with holder:
    locks.release("alpha", sys.argv[1], pid=1, force=True)
    locks.acquire("alpha", sys.argv[1], pid=1)
    assert reported.wait(15)
"""


def test_an_application_that_configures_no_logging_sees_nothing(gsd: Path) -> None:
    """The logger's ``NullHandler`` keeps even a warning off an unconfigured application's
    stderr (``logging``'s last-resort handler would print it)."""
    done = subprocess.run(
        [sys.executable, "-c", LOST_IN_A_LIBRARY_USER, str(gsd)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "MAHABHARATHA_FEATURE"}
    return subprocess.run(
        [sys.executable, "-m", "mahabharatha", *args],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_verbose_shows_the_librarys_messages(gsd: Path) -> None:
    """Failed on 211f242: ``-v`` was no option (usage error, exit 2)."""
    _stale_lock(gsd)
    quiet = _cli(gsd.parent, "lock", "acquire", FEATURE, "--pid", "1")
    assert quiet.returncode == 0 and "reclaimed" not in quiet.stderr, quiet.stderr
    _stale_lock(gsd)
    told = _cli(gsd.parent, "-v", "lock", "acquire", FEATURE, "--pid", "1")
    assert told.returncode == 0, told.stderr
    assert "mahabharatha: reclaimed feature 'alpha' from pid 1 (stale)" in told.stderr


def test_quiet_says_only_errors(gsd: Path) -> None:
    """``lock work`` with -q: no line per feature, no waiting line; the error stays.
    Failed on 211f242: ``-q`` was no option (usage error, exit 2)."""
    args = ("lock", "work", "--attempts", "2", "--retry-delay", "0", "--", "false")
    loud = _cli(gsd.parent, *args)
    assert "alpha: attempt 1 of 2 failed" in loud.stderr
    _cli(gsd.parent, "lock", "reopen", "--all")
    quiet = _cli(gsd.parent, "-q", *args)
    assert quiet.returncode == 1
    assert quiet.stderr.splitlines() == ["mahabharatha: every feature is finished; 1 failed: alpha"]


def test_verbose_in_process_twice_says_each_message_once(gsd: Path) -> None:
    """A program that calls the app twice (typer's ``CliRunner``) with ``-v``: the second call
    prints each library message once, and no logging traceback. Failed on 328df3d: every call
    added a stderr handler and none removed it, so the first call's handler, writing to its
    runner's closed stream, put a ``--- Logging error ---`` traceback on the second's stderr
    (with one stream for both: the line twice)."""
    from typer.testing import CliRunner

    from mahabharatha.cli import app

    args = ["-v", "lock", "acquire", FEATURE, "--pid", "1", "--gsd-dir", str(gsd)]
    said = []
    try:
        for _ in range(2):
            _stale_lock(gsd)
            result = CliRunner().invoke(app, args)
            assert result.exit_code == 0, result.output
            said.append(result.stderr)
    finally:
        logs.logger().handlers[:] = [logging.NullHandler()]  # no handler left for other tests
        logs.logger().setLevel(logging.NOTSET)
    reclaimed = "mahabharatha: reclaimed feature 'alpha' from pid 1 (stale)\n"
    assert [text.count(reclaimed) for text in said] == [1, 1], said
    assert "Logging error" not in said[1]
