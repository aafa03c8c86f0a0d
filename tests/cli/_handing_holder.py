"""A ``FeatureLock`` holder whose work runs in children that inherit none of its descriptors.

Run as ``python -m tests.cli._handing_holder GSD HOW``: ``HOW`` is a ``multiprocessing`` start
method (its workers get the proof through the pool's initializer) or ``pass-fds`` (a
``subprocess`` child gets it through ``pass_fds``). It prints ``work PID...`` once every piece
of work holds the proof, then waits to be killed; the work waits to be killed too.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from typing import Any

from mahabharatha import locks
from mahabharatha.owner.proof import HandedProof
from tests.cli._support import FEATURE

WORKERS = 2


_started: Any = None


def _start_worker(handed: HandedProof, started: Any) -> None:
    """The pool's initializer: hold the lock's proof (and keep the queue to report on)."""
    global _started
    handed()
    _started = started


def _work(_: int) -> None:
    """A task that works until killed (a pool worker without a task ends with its parent)."""
    _started.put(os.getpid())
    signal.pause()


def _in_pool(lock: locks.FeatureLock, method: str) -> None:
    context = multiprocessing.get_context(method)
    started = context.SimpleQueue()
    pool = context.Pool(WORKERS, _start_worker, (lock.proof_for_workers(), started))
    pool.map_async(_work, range(WORKERS), chunksize=1)  # each task keeps its worker busy
    print("work", *(started.get() for _ in range(WORKERS)), flush=True)
    signal.pause()


def _in_subprocess(lock: locks.FeatureLock) -> None:
    code = "import os, signal; print('work', os.getpid(), flush=True); signal.pause()"
    subprocess.Popen([sys.executable, "-c", code], pass_fds=lock.proof_fds)
    signal.pause()


def main(gsd: str, how: str) -> None:
    with locks.FeatureLock(FEATURE, gsd, heartbeat=None) as lock:
        if how == "pass-fds":
            _in_subprocess(lock)
        else:
            _in_pool(lock, how)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
