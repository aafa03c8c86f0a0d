"""The threads of a ``lock work`` worker while its command runs, and the signals they take.

Off a terminal the sender of a signal cannot matter (CMD leads a group of its own and every
signal is forwarded), so no sender reader is started per command: only the worker's one
heartbeat thread runs beside the main thread. Every thread of ours starts with the signals
blocked, so a signal for the process reaches the main thread, whose wait for CMD it ends."""

from __future__ import annotations

import signal
import subprocess
import threading
from pathlib import Path

from mahabharatha import signals
from tests.cli._support import SYNC_TIMEOUT
from tests.cli.test_work_pool import CLI

OURS_LASTING = "grep -L lock-run-group /proc/$PPID/task/*/comm"  # the worker's threads but one


def test_a_worker_off_a_terminal_runs_its_command_beside_one_thread(tmp_path: Path) -> None:
    """The command counts its worker's threads (``/proc/PID/task``): the main thread and the
    heartbeat. A sender reader per command made three. (The thread that recorded CMD's group
    before letting it run has ended its work by then; its exit may still be under way.)"""
    (tmp_path / ".gsd" / "specs" / "only").mkdir(parents=True)
    counted = tmp_path / "threads"
    done = subprocess.run(
        [*CLI, "lock", "work", "--", "sh", "-c", f'{OURS_LASTING} | wc -l > "{counted}"'],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=SYNC_TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    assert int(counted.read_text()) == 2


def test_our_threads_start_with_the_signals_blocked() -> None:
    seen: list[set[int]] = []
    thread = threading.Thread(
        target=lambda: seen.append(set(signal.pthread_sigmask(signal.SIG_BLOCK, [])))
    )
    signals.start_without_signals(thread)
    thread.join(SYNC_TIMEOUT)
    assert set(signals.DEFERRED) <= seen[0]
    # The starter's own mask is as it was: the main thread still takes them.
    assert not set(signals.DEFERRED) & set(signal.pthread_sigmask(signal.SIG_BLOCK, []))
