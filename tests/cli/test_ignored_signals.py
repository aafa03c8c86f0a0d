"""A signal someone set to be ignored stays ignored: for ``lock run``, ``lock work`` and CMD.

``nohup`` ignores HUP, and a non-interactive shell starts a background job (``worker &``) with
INT and QUIT ignored. ``lock run`` handles the signals it forwards, and a handled signal is
reset to its default in CMD at ``exec`` (an ignored one would be inherited): so a ``nohup lock
run ... -- build`` used to run its build with HUP at its default, and a hang-up (forwarded by
``lock run``, or sent by the terminal) ended it. Each case runs the real CLI with the signals
ignored as those tools leave them, and CMD reports what it inherited.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

from tests.cli._support import RUN_TIMEOUT, assert_no_traceback, child_env

IGNORED: Final = (signal.SIGHUP, signal.SIGINT)
REPORT: Final = (
    "import signal; "
    "print(*(signal.getsignal(s) is signal.SIG_IGN for s in (signal.SIGHUP, signal.SIGINT)))"
)


def _ignoring() -> None:
    """In the child, before ``exec``: what ``nohup`` and a script's ``&`` leave behind."""
    for signum in IGNORED:
        signal.signal(signum, signal.SIG_IGN)


@pytest.mark.parametrize(
    "words",
    [
        ("lock", "run", "feat"),
        ("lock", "work", "feat", "--once"),
        ("lock", "work", "feat", "-j", "2"),
    ],
    ids=["run", "work", "work-jobs"],
)
def test_cmd_inherits_the_signals_its_caller_ignored(
    tmp_path: Path, words: tuple[str, ...]
) -> None:
    """Fails before the fix: CMD printed ``False False`` (HUP and INT at their defaults)."""
    (tmp_path / ".gsd" / "specs" / "feat").mkdir(parents=True)
    done = subprocess.run(
        [sys.executable, "-m", "mahabharatha", *words, "--", sys.executable, "-c", REPORT],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        preexec_fn=_ignoring,
    )
    assert_no_traceback(done.stdout, done.stderr)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"], (done.stdout, done.stderr)
