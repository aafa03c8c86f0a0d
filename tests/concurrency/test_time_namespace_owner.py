"""A live owner seen from another time namespace is still alive (never "pid reused").

``/proc/<pid>/stat``'s start time is shown shifted by the *reader's* time namespace boot-time
offset (``unshare --time --boottime``, CRIU restores, some containers): the same live process
reads with another start time there. Judged raw, a ``--reclaim-dead`` in another time namespace
(same boot, same PID namespace) called a live holder's pid reused and took its lock: two holders.
Start times are now kept and compared as the initial time namespace sees them.

Fails before the fix: both reclaim tests print ``WON`` (the judge took the live lock), and the
release by pid from the shifted namespace answered "held by another owner".
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

from tests.concurrency._harness import RECLAIM_DEAD_JUDGE
from tests.support.marks import needs_proc, needs_time_namespaces

pytestmark = [needs_proc, needs_time_namespaces]

OFFSET_SECONDS: Final = "100000"
"""A boot-time offset far larger than any start-time slack."""
ANSWER_SECONDS: Final = 30
"""A hang guard only."""

HOLDER: Final = """
import sys
from mahabharatha import locks
locks.acquire("feat", sys.argv[1])
print("held", flush=True)
sys.stdin.readline()
"""


RELEASER: Final = """
import sys
from mahabharatha import locks
print(locks.release("feat", sys.argv[1], pid=int(sys.argv[2])))
"""


def _shifted(argv: list[str]) -> list[str]:
    unshare = shutil.which("unshare")
    assert unshare is not None  # the mark says so
    return [unshare, "--time", "--boottime", OFFSET_SECONDS, *argv]


def _python(script: str, *args: str) -> list[str]:
    return [sys.executable, "-c", script, *args]


def _hold(gsd: Path, argv: list[str]) -> subprocess.Popen[str]:
    holder = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "held"  # synchronised by the pipe
    return holder


def _answer(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=ANSWER_SECONDS)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _end(holder: subprocess.Popen[str]) -> None:
    holder.communicate("\n", timeout=ANSWER_SECONDS)  # reaped


@pytest.mark.parametrize("shifted", ["judge", "holder"])
def test_reclaim_dead_across_time_namespaces_leaves_a_live_lock(
    tmp_path: Path, shifted: str
) -> None:
    holder_argv = _python(HOLDER, str(tmp_path))
    judge_argv = _python(RECLAIM_DEAD_JUDGE, str(tmp_path))
    if shifted == "holder":
        holder_argv = _shifted(holder_argv)
    else:
        judge_argv = _shifted(judge_argv)
    holder = _hold(tmp_path, holder_argv)
    try:
        assert _answer(judge_argv) == "HELD"
    finally:
        _end(holder)


def test_release_by_pid_from_a_shifted_time_namespace(tmp_path: Path) -> None:
    holder = _hold(tmp_path, _python(HOLDER, str(tmp_path)))
    try:
        releaser = _shifted(_python(RELEASER, str(tmp_path), str(holder.pid)))
        assert _answer(releaser) == "True"
    finally:
        _end(holder)
