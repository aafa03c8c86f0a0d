"""The read side of the ``.lock`` protocol: the record, the snapshot, the bounded no-follow read
and the judgement (``now`` is the caller's)."""

from __future__ import annotations

import enum
import errno
import math
import os
import re
import stat
from dataclasses import dataclass, field
from time import monotonic
from typing import Final, NoReturn

from mahabharatha.backends.base import LockBusyError as LockBusyError  # its old home
from mahabharatha.constants import (
    EMPTY_LOCK_GRACE_SECONDS,
    FUTURE_SKEW_SECONDS,
    READ_WAIT_SECONDS,
    STALE_AFTER_SECONDS,
)
from mahabharatha.names import MAX_PID
from mahabharatha.owner import ownership, proof
from mahabharatha.reads import MAX_READ_BYTES, NOFOLLOW_READ, close_quietly, read_bounded
from mahabharatha.states import State as LockState

READ_ATTEMPTS: Final = 3  # looks at an entry that keeps changing under us, then we give up
LOCK_FILE_NAME: Final = ".lock"

_RECORD_RE: Final = re.compile(r"([0-9]+):([0-9]+(?:\.[0-9]+)?)", re.ASCII)

# O_NOFOLLOW reports a symlink as ELOOP on Linux and macOS, EMLINK on FreeBSD.
_SYMLINK_ERRNOS: Final = frozenset({errno.ELOOP, errno.EMLINK})
# Running out of descriptors or memory says nothing about the lock: surface it, never reclaim.
_RESOURCE_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})
# A read refused for a moment (a kernel lease or a mandatory lock on the file, a signal) says
# nothing about the lock either: retry, then call it busy (held), never unreadable.
_BUSY_ERRNOS: Final = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR})
# A file judged without its bytes: busy, or denied (the only lasting reasons: unreadable).
_UNREAD_ERRNOS: Final = frozenset({errno.EACCES, errno.EPERM}) | _BUSY_ERRNOS


def _parse_syntax(text: str) -> tuple[int, float] | None:
    """``pid:timestamp`` as written, with a possible pid and a positive finite timestamp."""
    if len(text) > MAX_READ_BYTES:
        return None
    match = _RECORD_RE.fullmatch(text.strip())
    if match is None:
        return None
    pid, ts = int(match[1]), float(match[2])
    if not 1 <= pid <= MAX_PID or not math.isfinite(ts) or ts <= 0:
        return None
    return pid, ts


def _within_skew(record: tuple[int, float] | None, now: float) -> tuple[int, float] | None:
    if record is None or record[1] > now + FUTURE_SKEW_SECONDS:
        return None
    return record


def parse_record(text: str, now: float) -> tuple[int, float] | None:
    """Parse ``pid:timestamp``; ``None`` unless well formed and within bounds at ``now``."""
    return _within_skew(_parse_syntax(text), now)


def format_record(pid: int, timestamp: float) -> bytes:
    return f"{pid}:{timestamp}".encode("ascii")


def busy_error(snapshot: LockSnapshot) -> LockBusyError:
    code = snapshot.read_errno or errno.EWOULDBLOCK
    return LockBusyError(
        code, f"the lock cannot be read just now ({os.strerror(code)}); try again", LOCK_FILE_NAME
    )


class EntryKind(enum.Enum):
    MISSING = "missing"
    FILE = "file"
    SYMLINK = "symlink"
    SPECIAL = "special"  # FIFO, socket or device
    DIRECTORY = "directory"


# Members bound once for the per-lock path (judge, read): ``EntryKind.X`` is a descriptor call.
_FILE: Final = EntryKind.FILE
_ACTIVE: Final = LockState.ACTIVE
_STALE: Final = LockState.STALE

RECLAIMABLE: Final = frozenset(
    {LockState.STALE, LockState.CORRUPT, LockState.UNREADABLE, LockState.NOT_A_FILE}
)


class _Unparsed(enum.Enum):
    UNPARSED = "unparsed"


_UNPARSED: Final = _Unparsed.UNPARSED  # a snapshot's record before anyone asked for it


@dataclass(slots=True, unsafe_hash=True)
class LockSnapshot:
    """What one read of ``.lock`` saw; snapshots of one unchanged entry compare equal (kind,
    identity, bytes, mtime, read error). Read-only by convention (slots: one per read)."""

    kind: EntryKind
    identity: tuple[int, int] | None  # (st_dev, st_ino): with kind and content, the entry
    content: bytes | None  # None: not readable (or not a file); a symlink: its target
    mtime: float = 0.0
    read_errno: int | None = None  # why a regular file's bytes could not be read
    owner: bytes | None = field(default=None, compare=False)  # details published with the record
    uid: int = field(default=-1, compare=False, repr=False)  # whose proof file the proof is in
    # The proof of life, when asked and claimed.
    life: proof.Life | None = field(default=None, init=False, compare=False, repr=False)
    _record: tuple[int, float] | _Unparsed | None = field(
        default=_UNPARSED, init=False, compare=False, repr=False
    )

    @property
    def owner_details(self) -> ownership.OwnerDetails | None:
        """The decoded owner details (``None``: none, or not ours)."""
        return ownership.decode(self.owner)

    @property
    def record(self) -> tuple[int, float] | None:
        """The record's syntax, parsed once (the skew is :meth:`record_at`'s)."""
        record = self._record
        if record is _UNPARSED:
            text = self.text
            record = self._record = None if text is None else _parse_syntax(text)
        return record

    def record_at(self, now: float) -> tuple[int, float] | None:
        """The record if it is one at ``now`` (not beyond the clock skew we accept)."""
        return _within_skew(self.record, now)

    @property
    def text(self) -> str | None:
        if self.kind is not _FILE or self.content is None:
            return None
        try:
            return self.content.decode("utf-8")
        except UnicodeDecodeError:
            return None

    def same_entry(self, other: LockSnapshot) -> bool:
        """The very entry ``other`` saw: same kind, inode and bytes. Race: where the bytes say
        nothing, the mtime must match too (an inode number is reused at once)."""
        if (self.kind, self.identity, self.content) != (other.kind, other.identity, other.content):
            return False
        return bool(self.content) or self.mtime == other.mtime


MISSING: Final = LockSnapshot(EntryKind.MISSING, None, None)


def _identity(info: os.stat_result) -> tuple[int, int]:
    return (info.st_dev, info.st_ino)


def _snapshot_without_opening(dfd: int, why: int | None) -> LockSnapshot | None:
    """Describe ``.lock`` by ``lstat`` when it cannot be opened (a link, a socket, no access);
    ``None``: the entry changed under us (race: removed or replaced between two looks)."""
    try:
        info = os.stat(LOCK_FILE_NAME, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return MISSING
    if stat.S_ISLNK(info.st_mode):
        try:
            target = os.readlink(LOCK_FILE_NAME, dir_fd=dfd)
        except OSError as error:
            if error.errno not in (errno.ENOENT, errno.EINVAL):
                raise
            return None  # Race: the link was removed, or replaced by something else
        raw = target.encode("utf-8", "surrogateescape")
        return LockSnapshot(EntryKind.SYMLINK, _identity(info), raw, info.st_mtime)
    if not stat.S_ISREG(info.st_mode):
        return LockSnapshot(EntryKind.SPECIAL, _identity(info), None, info.st_mtime)
    # A regular file whose open failed with ``why``: unreadable only for a lasting reason.
    if why in _UNREAD_ERRNOS:
        return LockSnapshot(EntryKind.FILE, _identity(info), None, info.st_mtime, why)
    if why in _SYMLINK_ERRNOS or why == errno.ENXIO:
        return None  # Race: the link or socket we failed to open was replaced by a file
    code = why or errno.EIO  # anything else (an I/O error) is an error, never a judgement
    raise OSError(code, os.strerror(code), LOCK_FILE_NAME)


def read_lock(dfd: int, *, life: bool = False, details: bool = True) -> LockSnapshot:
    """One bounded, no-follow, non-blocking look at ``.lock`` in the folder ``dfd``; a read
    refused for a passing reason is retried for ``READ_WAIT_SECONDS`` (then busy). ``life``:
    also the proof of life the details claim; ``details``: False skips reading them."""
    snapshot = _read_lock_once(dfd, details) or _look(dfd, READ_ATTEMPTS - 1, details)
    if snapshot.content is None and _is_busy(snapshot):
        deadline = monotonic() + READ_WAIT_SECONDS
        while _is_busy(snapshot) and monotonic() < deadline:
            os.sched_yield()  # Race: a lease holder is giving its lease up; look again
            snapshot = _look(dfd, READ_ATTEMPTS, details)
    claimed = ownership.claimed_proof(snapshot.owner) if life and snapshot.owner else None
    if claimed is not None:
        # Race: the proof is looked at after the read, and it is this lock's own slot: a
        # proof of an earlier lock (kept by a forked child, escaped work) says nothing here.
        snapshot.life = proof.life_of(dfd, *claimed, snapshot.uid)
    return snapshot


def _is_busy(snapshot: LockSnapshot) -> bool:
    return snapshot.content is None and snapshot.read_errno in _BUSY_ERRNOS


def _look(dfd: int, attempts: int, details: bool) -> LockSnapshot:
    for _ in range(attempts):
        snapshot = _read_lock_once(dfd, details)
        if snapshot is not None:
            return snapshot
    # Race: the entry keeps changing under us; report what cannot be read rather than spin.
    return LockSnapshot(EntryKind.SPECIAL, None, None)


@dataclass(slots=True)
class DetailsReader:
    """Reads a lock's owner details the cheaper way for the locks seen last (after one without,
    ``listxattr`` first). Race: threads racing on the hint read the same bytes either way."""

    none_last: bool = False

    def read(self, fd: int) -> bytes | None:
        if self.none_last:
            try:
                if ownership.XATTR_NAME not in os.listxattr(fd):
                    return None
            except OSError:
                return None  # none, no support, or a failed look: as read_attached says
        raw = ownership.read_attached(fd)
        self.none_last = raw is None
        return raw


DETAILS: Final = DetailsReader()  # the process's one reader of owner details


def _read_lock_once(dfd: int, details: bool) -> LockSnapshot | None:
    try:
        fd = os.open(LOCK_FILE_NAME, NOFOLLOW_READ, dir_fd=dfd)
    except FileNotFoundError:
        return MISSING
    except OSError as error:
        if error.errno in _RESOURCE_ERRNOS:
            raise
        # A link (ELOOP), a socket (ENXIO), no access (EACCES): described by lstat instead.
        return _snapshot_without_opening(dfd, error.errno)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # a directory, a FIFO or a device: never read it
            kind = EntryKind.DIRECTORY if stat.S_ISDIR(info.st_mode) else EntryKind.SPECIAL
            return LockSnapshot(kind, _identity(info), None, info.st_mtime)
        try:
            content = read_bounded(fd, info.st_size)
        except OSError as error:
            if error.errno not in _UNREAD_ERRNOS:
                raise  # out of memory, an I/O error: an error, never a judgement of the lock
            return LockSnapshot(EntryKind.FILE, _identity(info), None, info.st_mtime, error.errno)
        # The details of the very inode read, one more system call (ownership).
        owner = DETAILS.read(fd) if content and details else None
        identity = (info.st_dev, info.st_ino)
        return LockSnapshot(_FILE, identity, content, info.st_mtime, None, owner, info.st_uid)
    except OSError as error:
        raise_named(error, LOCK_FILE_NAME)  # fstat or read of the lock's descriptor
    finally:
        close_quietly(fd)


def judge_lock(snapshot: LockSnapshot, now: float) -> LockState:
    """The state of a lock as seen in ``snapshot`` at time ``now`` (age decides, nothing else)."""
    if snapshot.kind is not _FILE:
        return LockState.FREE if snapshot.kind is EntryKind.MISSING else LockState.NOT_A_FILE
    content = snapshot.content
    if content is None:
        # Busy: refused for a passing reason, which says nothing about the lock.
        return LockState.BUSY if snapshot.read_errno in _BUSY_ERRNOS else LockState.UNREADABLE
    if not content:
        # An old writer's lock between its create and its write (race: create-then-write).
        fresh = abs(now - snapshot.mtime) < EMPTY_LOCK_GRACE_SECONDS
        return LockState.WRITING if fresh else LockState.CORRUPT
    record = snapshot.record_at(now)  # decodes the bytes once: text that is no record is
    if record is None:  # corrupt, bytes that are no text (not UTF-8) unreadable
        return LockState.UNREADABLE if snapshot.text is None else LockState.CORRUPT
    return _STALE if now - record[1] > STALE_AFTER_SECONDS else _ACTIVE


def raise_named(error: OSError, name: str) -> NoReturn:
    """Raise ``error``, naming ``name`` if it named no file (a call on a descriptor names none)."""
    if error.filename is not None or error.errno is None:
        raise error
    raise type(error)(error.errno, error.strerror, name) from error
