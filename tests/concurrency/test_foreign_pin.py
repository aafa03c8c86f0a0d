"""Another user must not pin a dead owner "alive" (issue 26, item 4: NOT DONE YET).

The proof of life is a shared open-file-description lock on bytes of the feature folder; any
local user who can open the folder (mode 755) can take a read lock over all of its bytes, and
every dead owner there then reads ``work-running``: ``--reclaim-dead`` refuses until the lock is
two hours old. This test shows the hole with a second user (``nobody``); it is marked as an
expected failure (strict) until the proof moves where only the owner's user can hold it, and
must then pass unmarked.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Final

import pytest

from mahabharatha import locks, proof
from tests.support.marks import needs_proc, needs_root

pytestmark = [
    needs_proc,
    needs_root,
    pytest.mark.skipif(not proof.supported(), reason="no open-file-description locks here"),
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="no setpriv here"),
]

ANSWER_SECONDS: Final = 30
"""A hang guard only."""
NOBODY: Final = "65534"
FEATURE: Final = "feat"

HOLDER: Final = """
import signal, sys
from mahabharatha import locks
locks.acquire("feat", sys.argv[1])
print("held", flush=True)
signal.pause()
"""

PINNER: Final = """
import fcntl, os, struct, sys
folder = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
whole = struct.pack("hhqqi4x", fcntl.F_RDLCK, os.SEEK_SET, 0, 0, 0)  # every byte
fcntl.fcntl(folder, fcntl.F_OFD_SETLK, whole)
print("pinned", flush=True)
sys.stdin.readline()
"""


def _started(argv: list[str], word: str) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == word  # synchronised by the pipe
    return child


@pytest.mark.xfail(strict=True, reason="issue 26 item 4: the proof is not yet the owner's own")
def test_another_users_read_lock_never_keeps_a_dead_owner_alive() -> None:
    """Fails on 211f242 (and still): with ``nobody`` holding a read lock over the folder's
    bytes, the SIGKILLed owner reads ``work-running`` and ``--reclaim-dead`` refuses."""
    gsd = Path(tempfile.mkdtemp(prefix="mahabharatha-pin-"))  # pytest's tmp_path is 0700
    try:
        gsd.chmod(0o755)
        holder = _started([sys.executable, "-c", HOLDER, str(gsd)], "held")
        holder.send_signal(signal.SIGKILL)
        holder.communicate(timeout=ANSWER_SECONDS)
        folder = gsd / "specs" / FEATURE
        as_nobody = ["setpriv", "--reuid", NOBODY, "--regid", NOBODY, "--clear-groups"]
        pinner = _started([*as_nobody, sys.executable, "-c", PINNER, str(folder)], "pinned")
        try:
            assert locks.inspect(FEATURE, gsd).owner != "work-running"
            locks.acquire(FEATURE, gsd, reclaim_dead=True)
            locks.release(FEATURE, gsd)
        finally:
            pinner.communicate("\n", timeout=ANSWER_SECONDS)
    finally:
        shutil.rmtree(gsd)
