"""Only the owner's user holds, or sees, a lock's proof of life (issue 26, item 4).

The proof used to be a read lock on bytes of the feature folder: any local user who could open
the folder (mode 755) could take one over all of its bytes, and every dead owner there then
read ``work-running`` (``--reclaim-dead`` refused until the lock was two hours old). It is now
on the owner's own proof file (``.proof-<uid>``, mode 0600). These tests attack that with a
second user (``nobody``) and with everything else that can stand where the proof file should
be: a judge that cannot look answers ``unknown``, never "dead", and a publisher never holds its
proof on a file someone else could open.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

import pytest

from mahabharatha import locks
from mahabharatha.backends.base import LockHeldError
from mahabharatha.owner import proof
from tests.support.marks import needs_fifo, needs_proc, needs_root, needs_symlinks

pytestmark = [
    needs_proc,
    pytest.mark.skipif(not proof.supported(), reason="no open-file-description locks here"),
]

ANSWER_SECONDS: Final = 30
"""A hang guard only."""
NOBODY: Final = 65534
FEATURE: Final = "feat"

HOLDER: Final = """
import os, signal, sys
from mahabharatha import locks
locks.acquire("feat", sys.argv[1])
work = os.fork() if len(sys.argv) > 2 else None  # work that keeps the proof, outlives us
if work == 0:
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # not the pipe the test reads to its end
    signal.pause()
print("held", work or "", flush=True)
signal.pause()
"""

PINNER: Final = """
import fcntl, os, struct, sys
folder = sys.argv[1]
whole = struct.pack("hhqqi4x", fcntl.F_RDLCK, os.SEEK_SET, 0, 0, 0)  # every byte
pinned = []
for name in [".", *sorted(os.listdir(folder))]:  # everything this user may open, pinned
    try:
        fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NONBLOCK)
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, whole)
    except OSError:
        continue
    pinned.append(name)
print(" ".join(pinned), flush=True)
sys.stdin.readline()
"""


@pytest.fixture
def gsd() -> Iterator[Path]:
    """A folder tree another user may read (pytest's ``tmp_path`` is 0700)."""
    top = Path(tempfile.mkdtemp(prefix="mahabharatha-pin-"))
    try:
        top.chmod(0o755)
        yield top
    finally:
        shutil.rmtree(top)


def _started(argv: list[str]) -> tuple[subprocess.Popen[str], list[str]]:
    """``argv`` started, and the first line it printed (synchronised by the pipe)."""
    child = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert child.stdout is not None
    return child, child.stdout.readline().split()


def _dead_holder(gsd: Path, *, escaped_work: bool = False) -> int | None:
    """A holder of ``feat`` SIGKILLed; with ``escaped_work``, the pid of the work it forked
    (still holding the proof), which the caller must end."""
    argv = [sys.executable, "-c", HOLDER, str(gsd), *(["work"] if escaped_work else [])]
    holder, said = _started(argv)
    assert said[0] == "held"
    holder.send_signal(signal.SIGKILL)
    holder.communicate(timeout=ANSWER_SECONDS)
    return int(said[1]) if escaped_work else None


def _as_nobody(task: Callable[[], str]) -> str:
    """``task()``'s answer, run in a forked child that became ``nobody`` (as another user)."""
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.write(writer, task().encode())
        except BaseException as error:
            os.write(writer, f"error: {error!r}".encode())
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as answer:
        said = answer.read()
    os.waitpid(child, 0)
    return said


@needs_root
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="no setpriv here")
def test_another_users_read_lock_never_keeps_a_dead_owner_alive(gsd: Path) -> None:
    """Fails on f9d8c69: with ``nobody`` holding a read lock over the folder's bytes, the
    SIGKILLed owner read ``work-running`` and ``--reclaim-dead`` refused."""
    _dead_holder(gsd)
    folder = gsd / "specs" / FEATURE
    as_nobody = ["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups"]
    pinner, pinned = _started([*as_nobody, sys.executable, "-c", PINNER, str(folder)])
    try:
        assert "." in pinned  # the attack was made: the folder's bytes are pinned
        assert not [n for n in pinned if n.startswith(".proof-")]  # nor the owner's proof file
        assert locks.inspect(FEATURE, gsd).owner != "work-running"
        locks.acquire(FEATURE, gsd, reclaim_dead=True)
        locks.release(FEATURE, gsd)
    finally:
        pinner.communicate("\n", timeout=ANSWER_SECONDS)


@needs_root
def test_a_judge_that_may_not_open_the_proof_says_unknown_never_dead(gsd: Path) -> None:
    """Fails on f9d8c69: ``nobody`` looked at the folder's bytes, found them free and judged
    the SIGKILLed owner ``not-running``; the proof it cannot open is now ``unknown`` to it
    (while root, who may open it, sees the owner dead)."""
    _dead_holder(gsd)
    assert locks.inspect(FEATURE, gsd).owner == "not-running"  # (imports what nobody can't)
    assert _as_nobody(lambda: str(locks.inspect(FEATURE, gsd).owner)) == "unknown"


@needs_root
def test_users_sharing_a_folder_each_hold_their_own_proof(gsd: Path) -> None:
    """Two users take one feature in turn in a folder they share (mode 777): each holds its
    proof on a file of its own that nobody else may open, and the other user, who may look
    (root), judges a SIGKILLed holder by it. (New: on f9d8c69 there was no proof file.)"""
    folder = gsd / "specs" / FEATURE
    folder.mkdir(parents=True)
    for path in (gsd / "specs", folder):
        path.chmod(0o777)

    def hold_and_die() -> str:
        locks.acquire(FEATURE, gsd)
        os._exit(0)  # the holder dies without releasing: only its proof file says so

    _as_nobody(hold_and_die)
    theirs = folder / proof.proof_name(NOBODY)
    assert (theirs.stat().st_uid, theirs.stat().st_mode & 0o777) == (NOBODY, 0o600)
    assert locks.inspect(FEATURE, gsd).owner == "not-running"
    locks.acquire(FEATURE, gsd, reclaim_dead=True)
    ours = folder / proof.proof_name(0)
    assert (ours.stat().st_uid, ours.stat().st_mode & 0o777) == (0, 0o600)
    locks.release(FEATURE, gsd)


def _removed(path: Path) -> None:
    path.unlink()


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path, 0o600)


def _symlink(path: Path) -> None:
    spare = path.with_name("spare")
    spare.touch(0o600)
    path.unlink()
    path.symlink_to(spare)


def _copied(path: Path) -> None:
    copy = path.with_name("copy")
    shutil.copy2(path, copy)
    copy.replace(path)


REPLACED: Final = {
    "removed": _removed,
    "fifo": pytest.param(_fifo, marks=needs_fifo),
    "symlink": pytest.param(_symlink, marks=needs_symlinks),
    "copied-over": _copied,
}


@pytest.mark.parametrize("replace", REPLACED.values(), ids=REPLACED.keys())
def test_a_proof_file_replaced_while_work_holds_it_is_never_judged_free(
    gsd: Path, replace: Callable[[Path], None]
) -> None:
    """The holder is SIGKILLed while its work still holds the proof; then its proof file is
    removed, or replaced by a FIFO, a symlink or a copy of itself. The judge cannot look at
    the file the work holds: never ``not-running`` (``unknown``, or ``work-running`` by the
    holder's group, which the work is still in), and ``--reclaim-dead`` leaves the lock (held;
    or refused outright where no private proof file can be had). (New: on f9d8c69 there was no
    proof file; the step that replaces it failed.)"""
    work = _dead_holder(gsd, escaped_work=True)
    assert work is not None
    lock = gsd / "specs" / FEATURE / ".lock"
    try:
        replace(lock.with_name(proof.proof_name(os.geteuid())))
        before = lock.read_bytes()
        assert locks.inspect(FEATURE, gsd).owner in ("unknown", "work-running")
        with pytest.raises((LockHeldError, OSError)):
            locks.acquire(FEATURE, gsd, reclaim_dead=True)
        assert lock.read_bytes() == before
    finally:
        os.kill(work, signal.SIGKILL)


def _open_to_others(path: Path) -> None:
    path.chmod(0o644)


def _anothers(path: Path) -> None:
    os.chown(path, NOBODY, NOBODY)


PLANTED: Final = {
    "readable-by-others": _open_to_others,
    "another-users": pytest.param(_anothers, marks=needs_root),
    "fifo": pytest.param(_fifo, marks=needs_fifo),
    "symlink": pytest.param(_symlink, marks=needs_symlinks),
}


@pytest.mark.parametrize("plant", PLANTED.values(), ids=PLANTED.keys())
def test_a_proof_file_others_could_open_is_refused_with_a_clear_error(
    gsd: Path, plant: Callable[[Path], None]
) -> None:
    """What stands at this user's proof name is not a private file of its own (opened to
    others, another user's, a FIFO, a symlink): acquire refuses with a clear ``OSError`` and
    leaves no lock, rather than hold a proof someone else could hold too. (New: on f9d8c69
    there was no proof file; the step that plants one failed.)"""
    locks.acquire(FEATURE, gsd)
    locks.release(FEATURE, gsd)
    folder = gsd / "specs" / FEATURE
    plant(folder / proof.proof_name(os.geteuid()))
    with pytest.raises(OSError, match=r"\.proof-"):
        locks.acquire(FEATURE, gsd)
    assert not (folder / ".lock").exists()
