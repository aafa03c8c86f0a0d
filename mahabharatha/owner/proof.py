"""Proof of life: a holder (and all that inherit its descriptor) holds an OFD lock on its bytes of
the folder's private ``.proof-<uid>``; a judge asks ``F_OFD_GETLK`` whether anyone holds them
(cannot look: ``UNKNOWN``, never "free"). Long form: ``design/lockfile-hardening.md`` 13."""

from __future__ import annotations

import enum
import errno
import fcntl
import os
import stat
import struct
import threading
from time import monotonic
from typing import Final, Protocol

from mahabharatha.constants import PENDING_WAIT_SECONDS
from mahabharatha.owner import ownership
from mahabharatha.reads import NOFOLLOW_READ, close_quietly

# A lock's bytes are SLOT_BYTES * its (random) slot plus these.
LIFE_BYTE: Final = 0  # every holder and its work
# Held from before a publish is tried. Race: a judge looking at LIFE just before the winner
# takes it; seen alone, the judge looks again briefly, then says alive.
PENDING_BYTE: Final = 1
WORK_BYTE: Final = 2  # lock run's command only
SLOT_BYTES: Final = 4

_OFD_GETLK: Final = getattr(fcntl, "F_OFD_GETLK", None)
_OFD_SETLK: Final = getattr(fcntl, "F_OFD_SETLK", None)
_FLOCK: Final = struct.Struct("hhqqi4x")  # struct flock: type, whence, start, len, pid
# What a file system (or kernel) without open-file-description locks answers.
_UNSUPPORTED_ERRNOS: Final = frozenset(
    {errno.EINVAL, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EBADF, errno.ENOSYS}
)
PROOF_PREFIX: Final = ".proof-"  # and the uid: users never hold one another's proofs
_PRIVATE: Final = 0o600
_OWN_FLAGS: Final = NOFOLLOW_READ | os.O_CREAT  # no link followed, no FIFO waited on


class Life(enum.Enum):
    """What the lock's proof says: someone holds it, nobody does, or it cannot be told."""

    HELD = "held"
    FREE = "free"
    UNKNOWN = "unknown"
    OTHER_FOLDER = "other-folder"  # the proof file at the path is not the one the lock recorded


def _set(fd: int, kind: int, start: int, length: int = 1) -> None:
    assert _OFD_SETLK is not None
    fcntl.fcntl(fd, _OFD_SETLK, _FLOCK.pack(kind, os.SEEK_SET, start, length, 0))


def _someone_holds(fd: int, start: int) -> bool:
    """Does another open file description hold a lock on this byte of ``fd``'s file?"""
    assert _OFD_GETLK is not None
    asked = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, start, 1, 0)
    return bool(_FLOCK.unpack(fcntl.fcntl(fd, _OFD_GETLK, asked))[0] != fcntl.F_UNLCK)


def supported() -> bool:
    """Does this kernel have open-file-description locks at all?"""
    return _OFD_SETLK is not None and _OFD_GETLK is not None


def _byte(slot: int, which: int) -> int:
    return SLOT_BYTES * slot + which


def hold_pending(fd: int, slot: int) -> bool:
    """Before a publish: hold ``PENDING`` of ``slot`` on ``fd``; False without OFD locks."""
    if not supported():
        return False
    try:
        _set(fd, fcntl.F_RDLCK, _byte(slot, PENDING_BYTE))
    except OSError as error:
        if error.errno in _UNSUPPORTED_ERRNOS:
            return False
        raise
    return True


def hold_life(fd: int, slot: int) -> None:
    """After a won publish: hold ``LIFE`` too (``PENDING`` stays held until the lock goes)."""
    # Race: a judge that saw LIFE free before this call sees PENDING held after it (see module).
    _set(fd, fcntl.F_RDLCK, _byte(slot, LIFE_BYTE), 2)


def drop_pending(fd: int, slot: int) -> None:
    """After a lost publish: let ``PENDING`` go at once."""
    _set(fd, fcntl.F_UNLCK, _byte(slot, PENDING_BYTE))


def life_of(folder_fd: int, slot: int, tag: int | None, uid: int) -> Life:
    """Does anyone hold ``slot`` of ``uid``'s proof file tagged ``tag`` (``None``: the folder's
    own bytes, an older writer's)? Unopenable: ``UNKNOWN``; another file: ``OTHER_FOLDER``."""
    if not supported():
        return Life.UNKNOWN
    if tag is None:
        return _life_on(folder_fd, slot)
    try:
        fd = os.open(proof_name(uid), NOFOLLOW_READ, dir_fd=folder_fd)
    except OSError:
        return Life.UNKNOWN  # EACCES: only its user may look; ENOENT, ELOOP: not the file
    try:
        info = os.fstat(fd)
        if tag != ownership.folder_tag(info.st_dev, info.st_ino):
            return Life.OTHER_FOLDER  # Race: the folder or its file was swapped since
        return _life_on(fd, slot)
    finally:
        close_quietly(fd)


def _life_on(fd: int, slot: int) -> Life:
    """``slot``'s proof on ``fd``'s file; ``PENDING`` alone: look again for a short while."""
    deadline: float | None = None
    try:
        while True:
            # Race: LIFE first, PENDING second. A winner takes LIFE before it could ever drop
            # PENDING, so "both free" cannot hide a lock published before this look.
            if _someone_holds(fd, _byte(slot, LIFE_BYTE)):
                return Life.HELD
            if not _someone_holds(fd, _byte(slot, PENDING_BYTE)):
                return Life.FREE
            if deadline is None:
                deadline = monotonic() + PENDING_WAIT_SECONDS
            elif monotonic() >= deadline:
                return Life.HELD  # a publisher stopped mid-publish: never judged dead
            os.sched_yield()
    except OSError as error:
        if error.errno in _UNSUPPORTED_ERRNOS:
            return Life.UNKNOWN
        raise


FIRST_FREE_FD: Final = 10  # shell scripts use 3-9 freely (exec 5>>log closes number 5)


def _above_shell_numbers(fd: int) -> int:
    """``fd`` moved to at least :data:`FIRST_FREE_FD`, close-on-exec (``pass_fds`` clears it)."""
    if fd >= FIRST_FREE_FD:
        return fd
    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, FIRST_FREE_FD)
    finally:
        os.close(fd)


class WorkProof:
    """The proof a holder hands to its work: a new open file description holding ``LIFE``,
    ``PENDING`` and ``WORK``. Pass :attr:`fd` to the child (``pass_fds``), then
    :meth:`close_ours`; :meth:`running` says whether any of the child's tree still holds it."""

    __slots__ = ("_watch", "fd", "slot")

    def __init__(self, folder_fd: int, slot: int) -> None:
        # A new open of the proof file: its own open file description (dup would share ours).
        self.slot = slot
        self.fd: int | None = _above_shell_numbers(open_proof(folder_fd)[0])
        self._watch = -1
        try:  # EMFILE at the second open: the first is not left open
            self._watch = open_proof(folder_fd)[0]
            _set(self.fd, fcntl.F_RDLCK, _byte(slot, LIFE_BYTE), 3)
        except OSError:
            self.close()
            raise

    @classmethod
    def made(cls, folder_fd: int) -> WorkProof | None:
        """A work proof of our lock in ``folder_fd``; ``None``: none held, or no OFD locks."""
        slot = kept_slot(folder_fd)
        try:
            return None if slot is None else cls(folder_fd, slot)
        except OSError as error:
            if error.errno in _UNSUPPORTED_ERRNOS:
                return None
            raise

    def close_ours(self) -> None:
        """Our copy goes; the child's copies keep the proof held while they run."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def running(self) -> bool:
        """Does any process still hold the work's ``WORK`` byte (the command's copy)?"""
        try:
            return _someone_holds(self._watch, _byte(self.slot, WORK_BYTE))
        except OSError as error:
            if error.errno in _UNSUPPORTED_ERRNOS:
                return False
            raise

    def close(self) -> None:
        self.close_ours()
        if self._watch >= 0:
            os.close(self._watch)
            self._watch = -1


class HandedProof:
    """A work proof for ``spawn``/``forkserver`` workers: pickled, it sends the descriptor along
    (``DupFd``; nothing under ``fork`` or once the lock is gone); call it in the worker."""

    __slots__ = ("_source", "fd")

    def __init__(self, source: WorkProof | None = None, fd: int | None = None) -> None:
        self._source = source
        self.fd = fd  # in a worker: the descriptor that arrived with it

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        fd = None if self._source is None else self._source.fd
        if fd is None:
            return (HandedProof, ())
        from multiprocessing import reduction  # only when a worker is started: cold start

        # Race: a proof closed since (lock released) must not be handed on as a reused number.
        return (_arrived, (reduction.DupFd(fd),))

    def __call__(self) -> None:
        """In the worker: nothing to do; the descriptor arrived and stays open while it runs."""


class _Detachable(Protocol):
    def detach(self) -> int: ...


def _arrived(passed: _Detachable) -> HandedProof:
    return HandedProof(fd=passed.detach())


# This process's proofs: proof file identity -> (descriptor holding LIFE and PENDING, slot).
_HELD: dict[tuple[int, int], tuple[int, int]] = {}
_HELD_MUTEX: Final = threading.Lock()
_PATHS: dict[str, tuple[int, int]] = {}  # folder path -> identity: a release skips an fstat


def _forget_after_fork() -> None:
    _HELD.clear()  # the child's copies stay open (it is the holder's work) but are not its own
    _PATHS.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


def proof_name(uid: int) -> str:
    return f"{PROOF_PREFIX}{uid}"


def open_proof(folder_fd: int) -> tuple[int, tuple[int, int]]:
    """A new open of this user's proof file (made 0600 on first use) and its identity;
    ``PermissionError`` unless it is a regular file of this user's alone."""
    uid = os.geteuid()  # the owner of what we make; asked each time: a process may setuid
    name = proof_name(uid)
    try:  # made once: every later open writes no metadata (no O_CREAT)
        fd = os.open(name, NOFOLLOW_READ, dir_fd=folder_fd)
    except FileNotFoundError:
        fd = os.open(name, _OWN_FLAGS, _PRIVATE, dir_fd=folder_fd)
    try:
        info = os.fstat(fd)
        mode = info.st_mode
        if not stat.S_ISREG(mode) or info.st_uid != uid or mode & ~_PRIVATE & 0o777:
            why = "not a proof of life file of this user's alone (mode 0600): remove it"
            raise PermissionError(errno.EPERM, why, name)
    except BaseException:
        close_quietly(fd)
        raise
    return fd, (info.st_dev, info.st_ino)


def _identity(folder_fd: int) -> tuple[int, int] | None:
    try:
        info = os.stat(proof_name(os.geteuid()), dir_fd=folder_fd, follow_symlinks=False)
    except OSError:
        return None
    return (info.st_dev, info.st_ino)


class Pledge:
    """``with Pledge(folder_fd, wanted) as pledge``: a proof to publish with (no descriptor
    when not ``wanted``); a publish that won with it :meth:`keep`-s it, else the block closes it."""

    __slots__ = ("fd", "identity", "path", "slot")

    def __init__(self, folder_fd: int, wanted: bool, path: str | None = None) -> None:
        self.fd: int | None = None
        self.identity: tuple[int, int] | None = None
        self.path = path
        self.slot = (int.from_bytes(os.urandom(4), "little") or 1) if wanted else 0  # never 0
        if wanted and supported():  # no file made where no proof can be taken
            # Before the publish: a failure here leaves nothing behind.
            self.fd, self.identity = open_proof(folder_fd)

    def __enter__(self) -> Pledge:
        return self

    def keep(self) -> None:
        """Our lock claims the proof: hold it until we let go (closing any earlier one there)."""
        fd = self.fd
        if fd is None or self.identity is None:
            return
        with _HELD_MUTEX:
            earlier = _HELD.get(self.identity)
            # Race: an interrupt between these two stores would let ``__exit__`` close what
            # ``_HELD`` keeps (a later let-go then closes a reused number): no call between.
            _HELD[self.identity], self.fd = (fd, self.slot), None
            if self.path is not None:
                _PATHS[self.path] = self.identity
        if earlier is not None and earlier[0] != fd:
            close_quietly(earlier[0])

    def __exit__(self, *_exc: object) -> None:
        if self.fd is not None:
            close_quietly(self.fd)
            self.fd = None


def forget(folder_fd: int, path: str | None = None) -> None:
    """Let go of this process's proof in ``folder_fd`` (opened as ``path``), if any."""
    if not _HELD:
        return
    known = None if path is None else _PATHS.pop(path, None)
    # The path shortcut only where it cannot name another folder: with one proof held and
    # that path taken for it (a folder reached by two spellings, or replaced: fstat).
    if known is None or len(_HELD) != 1 or known not in _HELD:
        known = _identity(folder_fd)
    with _HELD_MUTEX:
        held = None if known is None else _HELD.pop(known, None)
    if held is not None:
        close_quietly(held[0])


def let_go_of_all() -> None:
    """Close every proof this process holds (test isolation; only when done with its locks)."""
    with _HELD_MUTEX:
        held = list(_HELD.values())
        _HELD.clear()
        _PATHS.clear()
    for fd, _slot in held:
        close_quietly(fd)


def kept_slot(folder_fd: int) -> int | None:
    """The slot of the lock whose proof this process holds in the folder ``folder_fd``."""
    if not _HELD:
        return None
    known = _identity(folder_fd)
    held = None if known is None else _HELD.get(known)
    return None if held is None else held[1]
