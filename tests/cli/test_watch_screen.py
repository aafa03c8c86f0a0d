"""``lock status --watch``: at an 80x24 terminal during a 50-feature pool, the bar, the counts
that are not zero and the estimate are the first three lines, held features lead the list and
the view fits the screen; off a terminal, ``--json`` prints a line when a count or a holder
changes, not when an age ticks."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Final

from mahabharatha import locks
from tests.cli._support import SYNC_TIMEOUT, child_env
from tests.cli.test_pool_commands import read_line

CLI: Final = (sys.executable, "-m", "mahabharatha")
ROWS, COLUMNS = 24, 80
FEATURES: Final = tuple(f"feat-{n:02d}" for n in range(1, 51))
DONE, FAILED, HELD = FEATURES[:10], FEATURES[10:13], FEATURES[40:44]
"""The pool at the moment of the test: 10 done, 3 failed, 4 held (the held ones last by name,
so that only "held first" puts them at the top of the list), 33 free."""
ANSI: Final = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


def _pool(gsd: Path) -> None:
    for name in FEATURES:
        (gsd / "specs" / name).mkdir(parents=True)
    for name in DONE:
        locks.acquire(name, gsd)
        locks.done(name, gsd)
    for name in FAILED:
        locks.acquire(name, gsd)
        locks.fail(name, gsd, reason="exit code 2", attempts=1)
    for name in HELD:
        locks.acquire(name, gsd)  # held by this test while the watch runs


def _first_frame(master: int) -> list[str]:
    """The lines of the watch's first drawing (from rich hiding the cursor to the end of the
    list's last line), without escape sequences."""
    seen = b""
    deadline = time.monotonic() + SYNC_TIMEOUT
    while not re.search(rb"\.\.\. and \d+ more", seen):
        left = deadline - time.monotonic()
        assert left > 0, f"no whole first frame (its list never ended): {seen[-300:]!r}"
        if select.select([master], [], [], left)[0]:
            chunk = os.read(master, 65536)
            assert chunk, f"the watch ended: {seen[-300:]!r}"
            seen += chunk
    frame = seen[seen.index(b"\x1b[?25l") :]
    frame = frame[: re.search(rb"\.\.\. and \d+ more", frame).end()]  # type: ignore[union-attr]
    return [ANSI.sub(b"", line).decode().rstrip("\r") for line in frame.split(b"\n")]


def test_the_watch_fits_80x24_with_the_bar_and_the_failed_count_on_top(gsd: Path) -> None:
    """Failed on 211f242: the table came first (50 rows, cut by the terminal), the bar and the
    summary line (nine counters, most of them 0) below it, off the screen."""
    _pool(gsd)
    pid, master = pty.fork()
    if pid == 0:  # the child: the watch, on a terminal of exactly ROWS x COLUMNS
        fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
        env = {k: v for k, v in child_env().items() if k not in ("COLUMNS", "LINES")}
        os.execve(sys.executable, [*CLI, "lock", "status", "--watch", "--gsd-dir", str(gsd)], env)
    try:
        lines = _first_frame(master)
        os.write(master, b"\x03")  # Ctrl-C
        _, status = os.waitpid(pid, 0)
        pid = 0
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(master)
    assert os.waitstatus_to_exitcode(status) == 130
    assert len(lines) <= ROWS - 1, lines  # the line under it is the cursor's: no scrolling
    assert all(len(line) <= COLUMNS for line in lines), lines
    bar, counts, estimate = lines[:3]
    assert "━" in bar and "10/50 done" in bar, lines
    assert counts == "4 held, 3 failed, 33 free", lines
    assert "/min" in estimate, lines
    rows = [line.split()[0] for line in lines[5:-1]]  # under the header and its rule
    assert rows[: len(HELD)] == list(HELD), lines
    assert rows[len(HELD) : len(HELD) + len(FAILED)] == list(FAILED), lines


def _next_line(fd: int, buffer: bytearray) -> dict[str, object]:
    document: dict[str, object] = json.loads(read_line(fd, buffer))
    return document


AGES_TICK_SECONDS: Final = 2.5
"""Long enough for the watch to look again twice (once a second) while a lock is held: each
look sees the held lock a second older."""


def test_off_a_terminal_a_line_comes_with_a_change_not_with_an_age(gsd: Path) -> None:
    """While a lock is held its age changes every second: no line for that. The next line is
    the release's. Failed on 211f242: every look printed the whole document again (the ages
    had changed), so the second line still showed the lock held."""
    (gsd / "specs" / "alpha").mkdir(parents=True)
    (gsd / "specs" / "bravo").mkdir(parents=True)
    locks.acquire("alpha", gsd)
    watch = subprocess.Popen(
        [*CLI, "lock", "status", "--watch", "--json", "--gsd-dir", str(gsd)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=child_env(),
    )
    assert watch.stdout is not None
    buffer = bytearray()
    try:
        first = _next_line(watch.stdout.fileno(), buffer)
        assert first["summary"] == {**first["summary"], "held": 1}  # type: ignore[dict-item]
        select.select([watch.stdout.fileno()], [], [], AGES_TICK_SECONDS)  # the ages tick
        locks.release("alpha", gsd)
        second = _next_line(watch.stdout.fileno(), buffer)
        assert second["summary"]["held"] == 0, second["summary"]  # type: ignore[index]
    finally:
        watch.send_signal(signal.SIGINT)
        watch.wait(timeout=SYNC_TIMEOUT)
        watch.stdout.close()


def test_a_watch_list_that_fits_the_screen_ends_without_a_more_line(gsd: Path) -> None:
    """Failed before the fix: with fewer features than the screen has lines for, the list
    ended in a line "... and -14 more"."""
    import io

    from rich.console import Console

    from mahabharatha.cli._render import watch_table

    for name in FEATURES[:4]:
        (gsd / "specs" / name).mkdir(parents=True)
    out = io.StringIO()
    Console(file=out, width=COLUMNS).print(*watch_table(locks.survey(gsd), ROWS))
    assert "more" not in out.getvalue()
    assert all(name in out.getvalue() for name in FEATURES[:4])
