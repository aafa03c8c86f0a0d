"""Load beside the suite: with ``MAHABHARATHA_LOAD=1`` the session runs next to three busy
loops and a disk writer (started before the first test, stopped after the last), so that a
guarantee that holds only on a quiet machine fails here as it would on a user's busy one.

Run it so: ``MAHABHARATHA_LOAD=1 python -m pytest -q``. ``busy_loops`` serves the tests that
bring their own contenders (the guard under load).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

LOAD_ENV: Final = "MAHABHARATHA_LOAD"
BUSY_LOOPS: Final = 3

# Each ends once its parent (the suite) is gone, even if the suite is killed before its
# teardown: a load left spinning would slow every later run on the machine.
_BUSY: Final = """
import os, sys
parent = int(sys.argv[1])
while os.getppid() == parent:
    pass
"""
_WRITER: Final = """
import os, sys
parent, path = int(sys.argv[1]), sys.argv[2]
block = os.urandom(1 << 20)
while os.getppid() == parent:
    with open(path, "wb") as out:
        for _ in range(32):
            out.write(block)
            os.fsync(out.fileno())
"""


def wanted() -> bool:
    """Did the caller ask for the suite to run under load?"""
    return os.environ.get(LOAD_ENV) == "1"


def _start(code: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", code, str(os.getpid()), *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C of the suite's terminal is the suite's, not theirs
    )


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
    for proc in procs:
        proc.wait()


@contextmanager
def busy_loops(count: int = BUSY_LOOPS) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` processes that spin on the CPU for as long as the block runs."""
    procs = [_start(_BUSY) for _ in range(count)]
    try:
        yield procs
    finally:
        _stop(procs)


@contextmanager
def machine_load(scratch: Path) -> Iterator[None]:
    """Three busy loops and a disk writer (``fsync`` after every MiB, in ``scratch``)."""
    with busy_loops():
        writer = _start(_WRITER, str(scratch / "load-writer.bin"))
        try:
            yield
        finally:
            _stop([writer])
