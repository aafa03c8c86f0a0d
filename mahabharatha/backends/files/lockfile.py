"""The ``.lock`` file protocol: every step that reads, writes or removes a feature's lock.

A feature ``F`` is claimed by the file ``<gsd>/specs/F/.lock`` holding ``"{pid}:{time}"``. Only
this module touches ``.lock``; the legacy functions (:mod:`mahabharatha.commands._utils`) and
the folder backend (:mod:`mahabharatha.backends.files.backend`) call it. The long form, with the
reasoning and the rejected options, is ``design/lockfile-hardening.md``.

Protocol:

* **publish**: the record is written into a file that has no name yet (``O_TMPFILE``; elsewhere a
  private temp file) and then ``link()``-ed to ``.lock``. ``link`` fails when ``.lock`` exists, so
  exactly one publisher wins and nobody ever sees an empty or half-written lock.
* **judge**: a lock is read through one no-follow, non-blocking open of at most ``MAX_READ_BYTES``;
  its *identity* is its inode and its bytes (an inode reused with the very same bytes is the
  same lock for every judgement we make).
* **reclaim / release / refresh** change or remove an existing ``.lock`` only while holding the
  *guard*, an ``flock`` on the feature folder itself, and only after re-reading the lock under
  the guard and finding the very entry they judged. ``publish`` needs no guard (``link`` cannot
  replace anything), so the only way ``.lock`` ever changes is under the guard.

Invariants: at most one live lock per feature; no process removes or replaces a lock other than
the one it judged; every call answers within a bounded time; nothing is followed through a link.

Clock-free: every judgement takes ``now`` (epoch seconds) from its caller, which reads its own
clock once per operation; ``time.monotonic`` only bounds the waits (guard, busy reads).

Where each operation is: parse (:func:`parse_record`), snapshot and judge (:func:`read_lock`,
:func:`judge_lock`), the folder descriptor (:class:`OpenFeatureDir`), the guard
(:class:`Guard`), publish (:func:`publish`), reclaim (:func:`publish_or_reclaim`), release
(:func:`release_at`, :func:`release_mine`), refresh (:func:`replace_if_unchanged`),
remove-if-unchanged (:func:`remove_if_unchanged`), sweep (:func:`sweep_orphan_temps`), scan
(:func:`scan_locks`).
"""

from __future__ import annotations

import enum
import errno
import fcntl
import math
import os
import re
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path
from time import monotonic
from typing import Final, NamedTuple

from mahabharatha.backends.base import LockError, UnsafeLockPathError
from mahabharatha.names import (
    MAX_PID,
    feature_names_in,
)
from mahabharatha.owner import ownership, proof
from mahabharatha.reads import MAX_READ_BYTES, NOFOLLOW_READ, close_quietly, read_bounded
from mahabharatha.states import State as LockState

STALE_AFTER_SECONDS: Final = 7200.0
"""A lock older than this (strictly) is stale: its holder is presumed gone."""

FUTURE_SKEW_SECONDS: Final = 86400.0
"""A timestamp up to a day ahead is clock skew between hosts; beyond that it is garbage."""

EMPTY_LOCK_GRACE_SECONDS: Final = 2.0
"""Old writers create ``.lock`` empty and fill it a moment later: an empty lock this young is
being written, not corrupt."""

GUARD_WAIT_SECONDS: Final = 0.5
"""How long a release or refresh waits for the guard. Holders keep it for a few system calls;
only a foreign process that ``flock``s our folder could keep it longer, and then we give up."""

MAX_ROUNDS: Final = 8
"""Bound on judge-and-retry rounds: each round ends because another process changed the lock,
so a storm of changes makes us answer "held" rather than spin."""

TEMP_ORPHAN_SECONDS: Final = 60.0
"""A named temp file lives for microseconds; one this old (or whose writer is dead) is debris."""

READ_WAIT_SECONDS: Final = 0.5
"""How long a look at a lock retries a read that failed for a passing reason (a kernel lease or
mandatory lock on the file, a signal) before it answers "busy": as long as a guard wait."""

READ_ATTEMPTS: Final = 3
"""Looks at an entry that keeps changing between open, lstat and readlink before we give up."""

TEMP_ATTEMPTS: Final = 3
"""A named temp can be swept as debris before we link it; we write a new one this often."""

LOCK_MODE: Final = 0o644
"""Locks are readable by everyone who shares the folder: an unreadable lock is reclaimable."""

LOCK_FILE_NAME: Final = ".lock"

AFTER_LINK: Callable[[], None] | None = None
"""A test's seam: called by a publisher between its won ``link`` and its ``LIFE`` (only
``PENDING`` held), so that tests can judge the lock inside that window on purpose."""

_TEMP_RE: Final = re.compile(r"\.lock\.([0-9]+)\.[0-9a-f]+\.tmp", re.ASCII)
_RECORD_RE: Final = re.compile(r"([0-9]+):([0-9]+(?:\.[0-9]+)?)", re.ASCII)

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_TMPFILE_FLAG: Final = getattr(os, "O_TMPFILE", 0)
_OWN_FDS: Final = (
    "/proc/thread-self/fd" if os.path.isdir("/proc/thread-self/fd") else "/proc/self/fd"
)
"""Our descriptors by path. ``self`` is the main thread: once it has exited (``pthread_exit``)
while other threads run, ``/proc/self/fd`` is gone and an unnamed lock could not be linked."""
# O_NOFOLLOW reports a symlink as ELOOP on Linux and macOS, EMLINK on FreeBSD.
_SYMLINK_ERRNOS: Final = frozenset({errno.ELOOP, errno.EMLINK})
# Running out of descriptors or memory says nothing about the lock: surface it, never reclaim.
_RESOURCE_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})
# A read refused for a moment (a kernel lease or a mandatory lock on the file, a signal) says
# nothing about the lock either: retry, then call it busy (held), never unreadable.
_BUSY_ERRNOS: Final = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR})
# The only lasting reasons a regular file cannot be read by us: it is unreadable (reclaimable).
_DENIED_ERRNOS: Final = frozenset({errno.EACCES, errno.EPERM})
# A feature folder we cannot enter (or that is not a real folder) holds no lock we can see.
_NO_FOLDER_ERRNOS: Final = frozenset({errno.ENOENT, errno.ENOTDIR, *_SYMLINK_ERRNOS})
# Kernels or file systems without O_TMPFILE answer with one of these.
_NO_TMPFILE_ERRNOS: Final = frozenset({errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL})


# --------------------------------------------------------------------------- records


def _parse_syntax(text: str) -> tuple[int, float] | None:
    """``pid:timestamp`` as written (a pid no process can have, or a timestamp that is not a
    positive finite number, is no record); how far in the future it lies is the caller's."""
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
    """``record``, unless its timestamp lies beyond the clock skew we accept (then garbage)."""
    if record is None or record[1] > now + FUTURE_SKEW_SECONDS:
        return None
    return record


def parse_record(text: str, now: float) -> tuple[int, float] | None:
    """Parse ``pid:timestamp``; ``None`` unless well formed and within bounds at ``now``."""
    return _within_skew(_parse_syntax(text), now)


def format_record(pid: int, timestamp: float) -> bytes:
    """The bytes of a lock record, as every writer of this module writes them."""
    return f"{pid}:{timestamp}".encode("ascii")


# --------------------------------------------------------------------------- lock entries


class GuardBusyError(OSError, LockError):
    """Another process kept the feature folder's guard longer than ``GUARD_WAIT_SECONDS``."""


class LockBusyError(OSError, LockError):
    """The lock could not be read just now (a kernel lease or a mandatory lock on it): it was
    neither judged nor touched. Try again."""


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


# Members bound once for the per-lock path (judge, read): on Python 3.11 every ``EntryKind.X``
# is a descriptor call, and ``status`` judges each of thousands of locks.
_FILE: Final = EntryKind.FILE
_ACTIVE: Final = LockState.ACTIVE
_STALE: Final = LockState.STALE

RECLAIMABLE: Final = frozenset(
    {LockState.STALE, LockState.CORRUPT, LockState.UNREADABLE, LockState.NOT_A_FILE}
)


class _Unparsed(enum.Enum):
    UNPARSED = "unparsed"


_UNPARSED: Final = _Unparsed.UNPARSED
"""A snapshot's record before anyone asked for it (parsed at most once)."""


class LockSnapshot:
    """What one read of ``.lock`` saw. Two snapshots of one unchanged entry compare equal.

    Read-only by convention (never changed after it is made). A plain class with slots, not a
    frozen dataclass: one is made on every read, and the dataclass costs every CLI call half a
    millisecond to define and every read six ``object.__setattr__`` calls to fill."""

    __slots__ = (
        "_record",
        "content",
        "identity",
        "kind",
        "life",
        "mtime",
        "owner",
        "read_errno",
        "uid",
    )

    kind: EntryKind
    identity: tuple[int, int] | None  # (st_dev, st_ino): with kind and content, the entry
    content: bytes | None  # None: not readable (or not a file); a symlink holds its target
    mtime: float
    read_errno: int | None  # why a regular file's bytes could not be read
    owner: bytes | None  # the owner details published with the record; not its identity
    life: proof.Life | None  # the lock's proof of life, when asked and the lock claims one
    uid: int  # the file's owner: whose proof file the proof is in

    def __init__(
        self,
        kind: EntryKind,
        identity: tuple[int, int] | None,
        content: bytes | None,
        mtime: float = 0.0,
        read_errno: int | None = None,
        owner: bytes | None = None,
        uid: int = -1,
    ) -> None:
        self.kind = kind
        self.identity = identity
        self.content = content
        self.mtime = mtime
        self.read_errno = read_errno
        self.owner = owner
        self.uid = uid
        self.life = None
        self._record: tuple[int, float] | _Unparsed | None = _UNPARSED

    def _key(self) -> tuple[object, ...]:
        return (self.kind, self.identity, self.content, self.mtime, self.read_errno)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, LockSnapshot)
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        fields = ", ".join(
            f"{name}={getattr(self, name)!r}"
            for name in ("kind", "identity", "content", "mtime", "read_errno", "owner")
        )
        return f"LockSnapshot({fields})"

    @property
    def owner_details(self) -> ownership.OwnerDetails | None:
        """The decoded owner details, ``None`` when unknown (no attribute, or not ours)."""
        return ownership.decode(self.owner)

    @property
    def record(self) -> tuple[int, float] | None:
        """The record as written, parsed once per snapshot (judging and describing both ask):
        its syntax only. A timestamp too far ahead makes the lock corrupt: ask
        :meth:`record_at` (or :func:`judge_lock`) with the caller's ``now``."""
        record = self._record
        if record is _UNPARSED:
            text = self.text
            record = self._record = None if text is None else _parse_syntax(text)
        return record

    def record_at(self, now: float) -> tuple[int, float] | None:
        """The record if it is one at ``now`` (``None`` too when its timestamp lies beyond the
        clock skew we accept)."""
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
        """The very entry ``other`` saw: same kind, inode and bytes. Where the bytes say nothing
        (an empty or unreadable file, a FIFO), the mtime must match too: an inode number is
        reused at once, and an old writer's new empty lock must not pass for the one judged."""
        if (self.kind, self.identity, self.content) != (other.kind, other.identity, other.content):
            return False
        return bool(self.content) or self.mtime == other.mtime


MISSING: Final = LockSnapshot(EntryKind.MISSING, None, None)


def _identity(info: os.stat_result) -> tuple[int, int]:
    return (info.st_dev, info.st_ino)


def _snapshot_without_opening(dfd: int, why: int | None) -> LockSnapshot | None:
    """Describe ``.lock`` by ``lstat`` when it cannot be opened (a link, a socket, no access).

    ``None``: the entry changed under us (race: removed or replaced between two looks).
    """
    try:
        info = os.stat(LOCK_FILE_NAME, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return MISSING
    if stat.S_ISLNK(info.st_mode):
        try:
            target = os.readlink(LOCK_FILE_NAME, dir_fd=dfd)
        except (FileNotFoundError, OSError) as error:
            if error.errno not in (errno.ENOENT, errno.EINVAL):
                raise
            return None  # Race: the link was removed, or replaced by something else
        raw = target.encode("utf-8", "surrogateescape")
        return LockSnapshot(EntryKind.SYMLINK, _identity(info), raw, info.st_mtime)
    if stat.S_ISREG(info.st_mode):
        return _unopened_file(info, why)
    return LockSnapshot(EntryKind.SPECIAL, _identity(info), None, info.st_mtime)


def _unopened_file(info: os.stat_result, why: int | None) -> LockSnapshot | None:
    """A regular file whose open failed with ``why``: unreadable only for a lasting reason."""
    if why in _DENIED_ERRNOS or why in _BUSY_ERRNOS:  # unreadable for good, or busy for now
        return LockSnapshot(EntryKind.FILE, _identity(info), None, info.st_mtime, why)
    if why in _SYMLINK_ERRNOS or why == errno.ENXIO:
        return None  # Race: the link or socket we failed to open was replaced by a file
    code = why or errno.EIO  # anything else (an I/O error) is an error, never a judgement
    raise OSError(code, os.strerror(code), LOCK_FILE_NAME)


def read_lock(dfd: int, *, life: bool = False, details: bool = True) -> LockSnapshot:
    """One bounded, no-follow, non-blocking look at ``.lock`` in the folder ``dfd``.

    A read refused for a passing reason (a kernel lease, a mandatory lock, a signal) is tried
    again, yielding the CPU (never sleeping), for at most ``READ_WAIT_SECONDS``; if it is still
    refused the snapshot says so (``read_errno``) and ``judge_lock`` calls it busy.
    With ``life``, a lock whose details claim a proof of life gets its proof file's answer
    (``snapshot.life``), looked at *after* the lock was read (see :mod:`mahabharatha.owner.proof`).
    Without ``details`` the owner details are not read (``owner`` None): for a caller that
    compares entries (:meth:`LockSnapshot.same_entry`), which the details are no part of.
    """
    snapshot = _read_lock_once(dfd, details) or _look(dfd, READ_ATTEMPTS - 1, details)
    if snapshot.content is None and _is_busy(snapshot):
        deadline = monotonic() + READ_WAIT_SECONDS
        while _is_busy(snapshot) and monotonic() < deadline:
            os.sched_yield()  # Race: a lease holder is giving its lease up; look again
            snapshot = _look(dfd, READ_ATTEMPTS, details)
    slot = ownership.proof_slot(snapshot.owner) if life and snapshot.owner else None
    if slot is not None:
        # Race: the proof is looked at after the read, and it is this lock's own slot: a
        # proof of an earlier lock (kept by a forked child, escaped work) says nothing here.
        tag = ownership.proof_folder(snapshot.owner)
        snapshot.life = proof.life_of(dfd, slot, tag, snapshot.uid)
    return snapshot


def _is_busy(snapshot: LockSnapshot) -> bool:
    return snapshot.content is None and snapshot.read_errno in _BUSY_ERRNOS


def _look(dfd: int, attempts: int = READ_ATTEMPTS, details: bool = True) -> LockSnapshot:
    for _ in range(attempts - 1):
        snapshot = _read_lock_once(dfd, details)
        if snapshot is not None:
            return snapshot
    # Race: the entry keeps changing under us; report what cannot be read rather than spin.
    return _read_lock_once(dfd, details) or LockSnapshot(EntryKind.SPECIAL, None, None)


class DetailsReader:
    """Reads a lock's owner details (:func:`ownership.read_attached`) the cheaper way for the
    locks seen last. A lock without details (an older writer's) makes ``getxattr`` fail, and
    Python turns that into an exception that costs more than the call; ``listxattr`` answers
    "none" without one. So after a lock without details the next is asked with ``listxattr``
    first (``status`` of 10,000 older locks: 2 us a lock, ``bench/PROFILE.md``), after one
    with details straight away (ours: one call). Either way the same bytes come back: a
    lock's details are set before it is published and never after. The hint is only a cost:
    threads that race on it still read correctly."""

    __slots__ = ("none_last",)

    def __init__(self) -> None:
        self.none_last = False

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


DETAILS: Final = DetailsReader()
"""The one reader of owner details for every lock read of this process."""


def _read_lock_once(dfd: int, details: bool = True) -> LockSnapshot | None:
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
            if error.errno not in _DENIED_ERRNOS and error.errno not in _BUSY_ERRNOS:
                raise  # out of memory, an I/O error: an error, never a judgement of the lock
            return LockSnapshot(EntryKind.FILE, _identity(info), None, info.st_mtime, error.errno)
        # The details of the very inode read, one more system call (ownership).
        owner = DETAILS.read(fd) if content and details else None
        identity = (info.st_dev, info.st_ino)
        return LockSnapshot(_FILE, identity, content, info.st_mtime, None, owner, info.st_uid)
    except OSError as error:
        named = with_name(error, LOCK_FILE_NAME)  # fstat or read of the lock's descriptor
        if named is error:
            raise
        raise named from error
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


# --------------------------------------------------------------------------- the feature folder
def feature_dir_path(gsd_dir: str | os.PathLike[str], feature: str) -> Path:
    return Path(gsd_dir) / "specs" / feature


def folder_path(gsd_dir: str | os.PathLike[str], feature: str) -> str:
    # A plain string: building a Path costs more than the system call it names (hot path).
    # An empty gsd_dir is today's directory, as for pathlib and os.path.join (never "/specs").
    return f"{os.fspath(gsd_dir) or '.'}/specs/{feature}"


def _refuse_folder(folder: str, error: OSError) -> UnsafeLockPathError:
    return UnsafeLockPathError(
        error.errno or errno.ENOTDIR,
        f"feature folder {folder} is a symlink or not a folder; refusing to follow it",
        folder,
    )


def _make_feature_dir(folder: str) -> None:
    try:
        os.makedirs(folder, exist_ok=True)
    except FileExistsError as error:  # a dangling link or a file where the folder should be
        raise _refuse_folder(folder, error) from error


class OpenFeatureDir:
    """``with OpenFeatureDir(gsd, feature, create=...) as dfd``: a descriptor of
    ``specs/<feature>`` opened without following a link, or ``None`` when there is no usable
    folder (with ``create`` a missing folder is made and a refused one raises instead).

    Every later step works relative to this descriptor, so swapping the folder for a symlink
    mid-call (race: folder replaced by a link) cannot redirect a write. OS errors raised inside
    the block that name a file relative to it are re-raised naming its full path
    (:func:`named_error`). The folder is opened on entering
    the block (never in the constructor: an object made without ``with`` holds nothing).
    """

    __slots__ = ("create", "dfd", "folder", "refuse")

    def __init__(
        self,
        gsd_dir: str | os.PathLike[str],
        feature: str,
        *,
        create: bool,
        refuse: bool = False,
    ) -> None:
        self.folder = folder_path(gsd_dir, feature)
        self.create = create
        self.refuse = refuse or create
        self.dfd: int | None = None

    def __enter__(self) -> int | None:
        self.dfd = _open_dir_nofollow(self.folder, create=self.create, refuse=self.refuse)
        return self.dfd

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: object
    ) -> None:
        if self.dfd is not None:
            close_quietly(self.dfd)
            self.dfd = None
        if isinstance(error, OSError):
            named = named_error(error, self.folder)
            if named is not error:
                raise named from error


def with_name(error: OSError, name: str) -> OSError:
    """``error`` naming ``name`` (relative to the folder) if it named no file: a call on a
    file descriptor (``write``, ``fstat``, ``flock``) reports none, so the step that made it
    says which file it was about, where it raises."""
    if error.filename is not None or error.errno is None:
        return error
    return type(error)(error.errno, error.strerror, name)


def named_error(error: OSError, folder: str) -> OSError:
    """The same error, naming the full path of the file it was about. Only an error that names
    a file relative to the folder's descriptor is rewritten: a bare name (``.lock``, a temp),
    ``.`` or ``/proc/self/fd/N`` (both: the unnamed lock being published). An error that names
    no file is left as it is, never guessed at (the protocol names its own: :func:`with_name`)."""
    name = None if error.filename is None else str(error.filename)
    if error.errno is None or name is None or (os.sep in name and not name.startswith("/proc/")):
        return error
    bare = name if name != "." and not name.startswith("/proc/") else LOCK_FILE_NAME
    path = os.path.join(folder, bare)
    detail = error.strerror or str(error)
    return type(error)(error.errno, f"{path}: {detail}", path)


def _open_dir_nofollow(folder: str, *, create: bool, refuse: bool) -> int | None:
    try:
        return os.open(folder, _DIR_FLAGS)
    except FileNotFoundError:
        if not create:
            return None
    except OSError as error:
        if error.errno not in _NO_FOLDER_ERRNOS:
            raise
        if refuse:
            raise _refuse_folder(folder, error) from error
        return None
    _make_feature_dir(folder)  # first lock of this feature: make its folder, then open it
    dfd = _open_dir_nofollow(folder, create=False, refuse=True)
    if dfd is None:  # Race: the folder was removed or swapped for a link just after mkdir.
        raise _refuse_folder(folder, OSError(errno.ENOENT, "vanished"))
    return dfd


FolderError = Callable[[str, OSError], None]
"""Told of a feature folder a scan could not look into (the error names its full path)."""


def scan_locks(
    gsd_dir: str | os.PathLike[str],
    *,
    read: bool = True,
    on_error: FolderError | None = None,
    life: bool = False,
) -> Iterator[tuple[str, LockSnapshot]]:
    """Every real feature folder under ``<gsd>/specs`` (by name) with a look at its lock.

    One descriptor of ``specs`` serves the whole scan; each feature folder is opened relative
    to it without following a link (a symlinked feature folder is skipped, as it is refused
    everywhere). With ``read=False`` only the names are listed (snapshots are ``MISSING``).
    A folder that cannot be looked into (no permission) raises, or with ``on_error`` is
    reported to it and skipped: one odd folder does not hide the others.
    """
    specs_path = os.path.join(os.fspath(gsd_dir), "specs")
    try:
        specs = os.open(specs_path, os.O_RDONLY | os.O_DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        return
    try:
        for name in feature_names_in(specs):
            if not read:
                yield name, MISSING
                continue
            try:
                snapshot = _look_in(specs, name, specs_path, life)
            except OSError as error:
                if on_error is None:
                    raise
                on_error(name, error)
                continue
            yield name, snapshot
    finally:
        os.close(specs)


def _look_in(specs: int, feature: str, specs_path: str, life: bool) -> LockSnapshot:
    try:
        dfd = os.open(feature, _DIR_FLAGS, dir_fd=specs)
    except OSError as error:
        if error.errno in _NO_FOLDER_ERRNOS:  # Race: removed or swapped for a link since listed
            return MISSING
        folder = os.path.join(specs_path, feature)  # the full path
        raise type(error)(error.errno, error.strerror, folder) from error
    try:
        return read_lock(dfd, life=life)
    except OSError as error:
        named = named_error(error, os.path.join(specs_path, feature))
        if named is error:
            raise
        raise named from error
    finally:
        close_quietly(dfd)


# --------------------------------------------------------------------------- the guard


def _try_guard(dfd: int) -> bool:
    try:
        fcntl.flock(dfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as error:  # the guard of .lock could not be taken (ENOLCK, ...)
        raise with_name(error, LOCK_FILE_NAME) from error
    return True


def _let_go(fd: int) -> None:
    """Unlock the guard held through ``fd`` (a child forked meanwhile may share it) and close."""
    with suppress(OSError):  # closing the descriptor lets go of it anyway
        fcntl.flock(fd, fcntl.LOCK_UN)
    close_quietly(fd)


class _GuardWaiter:
    """A blocking ``flock`` of the folder, taken by a helper thread through a descriptor (an
    open file description) of its own, so that the caller can wait for it with a deadline:
    the kernel's ``flock`` wait has none, and bounding it with a timer signal is not a
    library's to do. Waiting blocks (no spinning): under load a spinning contender takes the
    CPU from the descheduled holder it waits for."""

    __slots__ = ("abandoned", "error", "fd", "finished", "mutex", "ready")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.mutex = threading.Lock()
        self.ready = threading.Event()
        self.finished = False
        self.abandoned = False
        self.error: OSError | None = None

    def run(self) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)  # blocks until the holder lets go
        except OSError as error:
            self.error = error
        with self.mutex:
            self.finished = True
            abandoned = self.abandoned
        if abandoned:  # Race: the caller's deadline passed just before we got it: let go
            _let_go(self.fd)
        self.ready.set()

    def result(self, deadline: float) -> int | None:
        """The descriptor through which the guard is now held, or None at the deadline."""
        try:
            self.ready.wait(max(0.0, deadline - monotonic()))
        finally:
            with self.mutex:
                # Race: the helper may take the guard right after our wait ended: whoever
                # comes second under the mutex (it or us) lets go of it.
                if not self.finished:
                    self.abandoned = True
        if self.abandoned:
            return None
        if self.error is not None:
            close_quietly(self.fd)
            raise with_name(self.error, LOCK_FILE_NAME) from self.error
        return self.fd


def _wait_for_guard(dfd: int, deadline: float) -> int | None:
    """Wait (blocked, not spinning) until the guard of folder ``dfd`` is ours or ``deadline``
    (``monotonic``) passes: the descriptor that holds it, or None."""
    try:
        fd = os.open(".", _DIR_FLAGS, dir_fd=dfd)  # a description of its own: a lock of its own
    except OSError as error:
        raise with_name(error, LOCK_FILE_NAME) from error
    waiter = _GuardWaiter(fd)
    try:
        threading.Thread(target=waiter.run, name="mahabharatha-guard", daemon=True).start()
    except BaseException:
        close_quietly(fd)
        raise
    return waiter.result(deadline)


class Guard:
    """Hold the feature folder's ``flock`` (the guard) for a ``with`` block, which gets True,
    or False if it was busy. Taken on entering the block, never in the constructor.

    With ``wait`` we wait (blocked in the kernel, never spinning or sleeping) for at most
    ``GUARD_WAIT_SECONDS`` and then raise ``GuardBusyError``. With ``until`` (a ``monotonic``
    time) we wait until then and the block learns whether we got it. With neither we try once.
    """

    __slots__ = ("dfd", "held_by", "taken", "until", "wait")

    def __init__(self, dfd: int, *, wait: bool, until: float | None = None) -> None:
        self.dfd = dfd
        self.wait = wait
        self.until = until
        self.taken = False
        self.held_by: int | None = None  # the waiter's descriptor when it took the guard

    def __enter__(self) -> bool:
        dfd = self.dfd
        self.taken = _try_guard(dfd)
        if not self.taken and (self.wait or self.until is not None):
            deadline = monotonic() + GUARD_WAIT_SECONDS if self.until is None else self.until
            # Race: its holder is mid-removal for a few system calls: wait for it to finish.
            self.held_by = _wait_for_guard(dfd, deadline)
            self.taken = self.held_by is not None
            if not self.taken and self.wait:
                raise GuardBusyError(
                    errno.EWOULDBLOCK, "feature folder stayed busy; try again", LOCK_FILE_NAME
                )
        return self.taken

    def __exit__(self, *_exc: object) -> None:
        if self.held_by is not None:
            _let_go(self.held_by)
            self.held_by = None
        elif self.taken:
            try:  # noqa: SIM105  (suppress() costs a microsecond on every release)
                fcntl.flock(self.dfd, fcntl.LOCK_UN)
            except OSError:  # closing the folder's descriptor lets go of it anyway
                pass


def _unlink_lock(dfd: int) -> None:
    # unlinkat removes the entry itself: a symlink goes, its target is never touched.
    os.unlink(LOCK_FILE_NAME, dir_fd=dfd)


Reclaimable = Callable[[LockSnapshot], bool]
"""Whether an entry, read under the guard, may be removed (the caller's judgement, again)."""


def remove_if_unchanged(
    dfd: int, judged: LockSnapshot, still: Reclaimable, *, life: bool = False
) -> bool:
    """Remove ``.lock`` if it is still the entry ``judged`` and ``still`` judges it removable;
    the caller holds the guard. ``life``: the judgement needs the proof of life (looked at
    again too: its holder may have taken it since)."""
    # Race: the lock was replaced (or, being an old writer's, filled in) between the caller's
    # read and now: re-read and judge it again under the guard.
    current = read_lock(dfd, life=life)
    if not current.same_entry(judged) or not still(current):
        return False
    with suppress(FileNotFoundError):  # only an old-style writer, unguarded, could beat us here
        _unlink_lock(dfd)
    return True


def _still_mine(dfd: int, mine: LockSnapshot) -> bool:
    """Is ``.lock`` still the holder's own lock ``mine``? The caller holds the guard.

    Raises the read error when our own inode cannot be read just now (a ``chmod``, an I/O
    error): we cannot tell, so we say why instead of giving the lock up. A read refused for a
    passing reason (a kernel lease) is :class:`LockBusyError`: a caller may wait it out.
    """
    current = read_lock(dfd, details=False)  # same_entry compares no owner details
    if current.same_entry(mine):
        return True
    if (
        current.kind is EntryKind.FILE
        and current.content is None
        and current.identity == mine.identity
    ):
        if _is_busy(current):
            raise busy_error(current)
        code = current.read_errno or errno.EIO
        raise OSError(code, os.strerror(code), LOCK_FILE_NAME)
    return False


def release_mine(dfd: int, mine: LockSnapshot) -> bool:
    """Remove the holder's own lock ``mine`` if it is still there; False if it is not."""
    with Guard(dfd, wait=True):
        # Race: forced release + new owner since our last refresh: never remove theirs.
        if not _still_mine(dfd, mine):
            return False
        _unlink_lock(dfd)
        return True


def remove_judged(
    dfd: int, judged: LockSnapshot, still: Reclaimable, *, life: bool = False
) -> bool:
    """Take the guard and remove ``.lock`` if it is still exactly ``judged`` and removable."""
    with Guard(dfd, wait=True):
        return remove_if_unchanged(dfd, judged, still, life=life)


def remove_judged_dir(dfd: int, judged: LockSnapshot) -> bool:
    """Take the guard and remove a directory standing at ``.lock`` if it is still exactly
    ``judged`` and empty (clean never deletes what someone put inside one)."""
    with Guard(dfd, wait=True):
        # Race: replaced since it was judged (a file published after a rmdir elsewhere).
        if not read_lock(dfd).same_entry(judged):
            return False
        try:
            os.rmdir(LOCK_FILE_NAME, dir_fd=dfd)
        except OSError:
            return False
        return True


def remove_orphan_temp(dfd: int, name: str) -> bool:
    """Remove the temp file ``name`` (listed by :func:`orphan_temps`); False if it is gone
    already. Other OS errors are raised (the caller names the path)."""
    try:
        os.unlink(name, dir_fd=dfd)
    except FileNotFoundError:
        return False  # Race: its writer linked or renamed it, or another clean removed it
    return True


# --------------------------------------------------------------------------- publishing


def _temp_name() -> str:
    return f".lock.{os.getpid()}.{os.urandom(8).hex()}.tmp"


def is_temp_name(name: str) -> bool:
    return _TEMP_RE.fullmatch(name) is not None


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data``; ``EIO`` when the file system accepts nothing (a write of 0 bytes
    would otherwise be retried for ever)."""
    while data:  # bytes, not a memoryview: a record goes in one write, and a view costs more
        written = os.write(fd, data)
        if written == 0:
            raise OSError(errno.EIO, "the file system accepted no bytes")
        data = data[written:]


def _published(info: os.stat_result, record: bytes, owner: bytes | None) -> LockSnapshot:
    """The snapshot a reader will see of the lock we just wrote (same inode, same bytes)."""
    return LockSnapshot(
        EntryKind.FILE, _identity(info), record, info.st_mtime, owner=owner, uid=info.st_uid
    )


def _write_record(fd: int, record: bytes, owner: bytes | None) -> os.stat_result:
    """Write the record and its owner details; return the file's facts; make it readable by
    all, whatever the umask.

    Another user who cannot read a lock must call it unreadable and may reclaim it, so a lock
    that the umask made private would be stolen from its live owner (race: cross-user reclaim).
    """
    try:
        write_all(fd, record)
        # Race: a reader must never see the record without its details: set them before link.
        ownership.attach(fd, owner)
        info = os.fstat(fd)
        if info.st_mode & LOCK_MODE != LOCK_MODE:
            os.fchmod(fd, LOCK_MODE)
    except OSError as error:
        named = with_name(error, LOCK_FILE_NAME)  # the lock being written, not yet linked
        if named is error:
            raise
        raise named from error
    return info


def _write_named_temp(dfd: int, record: bytes, owner: bytes | None) -> tuple[str, os.stat_result]:
    """Write ``record`` into a new private temp file. Leaves nothing behind on error."""
    name = _temp_name()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, LOCK_MODE, dir_fd=dfd)
    try:
        try:
            info = _write_record(fd, record, owner)
        finally:
            os.close(fd)  # a close error (deferred write error) fails the temp too
    except BaseException as error:
        _unlink_quietly(dfd, name)
        if not isinstance(error, OSError) or with_name(error, LOCK_FILE_NAME) is error:
            raise
        raise with_name(error, LOCK_FILE_NAME) from error  # the close of the lock being written
    return name, info


def _unlink_quietly(dfd: int, name: str) -> None:
    """Remove a temp name as clean-up. Failing to is not the caller's failure: the lock is
    already published (or the real error is being raised), and debris is swept later."""
    try:  # noqa: SIM105  (suppress() costs a microsecond on every acquire)
        os.unlink(name, dir_fd=dfd)
    except OSError:
        pass


class TmpfileSwitch:
    """Whether :func:`publish` makes the lock as an unnamed file (``O_TMPFILE`` + ``linkat``
    through ``/proc/self/fd``): learned once, set False for good when the file system refuses.
    Tests and the benchmark set ``TMPFILE.usable = False`` to take the named-temp path."""

    __slots__ = ("usable",)

    def __init__(self) -> None:
        self.usable: bool = bool(_TMPFILE_FLAG) and os.path.isdir(_OWN_FDS)


TMPFILE: Final = TmpfileSwitch()
"""The one switch between the unnamed-file and the named-temp ways to publish."""


class _NoTmpfileError(Exception):
    """This file system cannot make unnamed files."""


def _publish_unnamed(dfd: int, record: bytes, owner: bytes | None) -> LockSnapshot | None:
    """Publish through a file with no name: a crash at any step leaves nothing behind."""
    try:
        fd = os.open(".", _TMPFILE_FLAG | os.O_WRONLY | os.O_CLOEXEC, LOCK_MODE, dir_fd=dfd)
    except OSError as error:
        if error.errno not in _NO_TMPFILE_ERRNOS:
            raise
        raise _NoTmpfileError from error
    try:
        info = _write_record(fd, record, owner)
        # Race: two publishers at once. link() fails if .lock exists, so one of them wins.
        os.link(f"{_OWN_FDS}/{fd}", LOCK_FILE_NAME, dst_dir_fd=dfd, follow_symlinks=True)
        return _published(info, record, owner)
    except FileExistsError:
        return None
    finally:
        close_quietly(fd)


def _place_temp(
    dfd: int, record: bytes, owner: bytes | None, place: Callable[[str], None]
) -> os.stat_result:
    """Write ``record`` into a named temp and ``place`` it (link or rename it to ``.lock``)."""
    for _ in range(TEMP_ATTEMPTS - 1):
        # Race: a sweeper took our temp for debris (a clock step, another PID namespace)
        # before we placed it: write a new one.
        with suppress(FileNotFoundError):
            return _place_temp_once(dfd, record, owner, place)
    return _place_temp_once(dfd, record, owner, place)


def _place_temp_once(
    dfd: int, record: bytes, owner: bytes | None, place: Callable[[str], None]
) -> os.stat_result:
    name, info = _write_named_temp(dfd, record, owner)
    try:
        place(name)
    finally:
        _unlink_quietly(dfd, name)  # after a link the temp name goes; after a rename it is gone
    return info


def _publish_named(dfd: int, record: bytes, owner: bytes | None, now: float) -> LockSnapshot | None:
    def link(name: str) -> None:
        # Race: two publishers at once. link() fails if .lock exists, so one of them wins.
        os.link(name, LOCK_FILE_NAME, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)

    sweep_orphan_temps(dfd, now)  # named temps can be orphaned by a crash: keep them few
    try:
        return _published(_place_temp(dfd, record, owner, link), record, owner)
    except FileExistsError:
        return None


def publish(dfd: int, record: bytes, now: float, owner: bytes | None = None) -> LockSnapshot | None:
    """Make ``.lock`` appear holding ``record`` and its ``owner`` details, whole; ``None`` when
    a lock already exists. ``now``: the caller's clock, to tell debris from live temp files."""
    if TMPFILE.usable:
        try:
            return _publish_unnamed(dfd, record, owner)
        except _NoTmpfileError:
            TMPFILE.usable = False
    return _publish_named(dfd, record, owner, now)


def publish_proven(
    dfd: int, record: bytes, now: float, owner: bytes | None, pledge: proof.Pledge | None
) -> LockSnapshot | None:
    """:func:`publish`, the publisher holding the proof of life of the pledge's slot on its
    descriptor (of its proof file, kept for as long as it holds the lock) from before
    the try; the details claim the proof, in the proof file the pledge opened (its tag), and
    the pledge is ``proven``, only when it could be taken. ``pledge`` None: no proof."""
    # Race: a judge looking at LIFE an instant before a winner takes it: PENDING comes first.
    if pledge is None or pledge.fd is None or not proof.hold_pending(pledge.fd, pledge.slot):
        return publish(dfd, record, now, owner)
    fd, slot = pledge.fd, pledge.slot
    tag = 0 if pledge.identity is None else ownership.folder_tag(*pledge.identity)
    try:
        mine = publish(dfd, record, now, ownership.with_proof(owner, slot, tag))
    except BaseException:
        with suppress(OSError):
            proof.drop_pending(fd, slot)
        raise
    if mine is None:
        with suppress(OSError):  # lost: our slot's PENDING means nothing to anyone now
            proof.drop_pending(fd, slot)
        return None
    pledge.proven = True
    if AFTER_LINK is not None:  # a test's pause in the PENDING window; None in real use
        AFTER_LINK()
    # A failure here leaves PENDING held, which judges also count as alive.
    with suppress(OSError):
        proof.hold_life(fd, slot)
    return mine


def replace_if_unchanged(
    dfd: int, judged: LockSnapshot, record: bytes, owner: bytes | None = None
) -> LockSnapshot | None:
    """Atomically swap ``.lock`` for ``record`` if it is still the holder's ``judged`` lock.

    Returns the new lock's snapshot, or ``None`` if the lock is no longer the one judged.
    The owner details of ``judged`` are carried forward (the owner and its group are the ones
    that took the lock), unless ``owner`` gives new ones (``lock run``: its command's group).
    """
    with Guard(dfd, wait=True):
        # Race: a forced release or a reclaim replaced our lock; never overwrite theirs.
        if not _still_mine(dfd, judged):
            return None

        def rename(name: str) -> None:
            # rename() swaps the whole file at once: readers see the old or the new record.
            os.rename(name, LOCK_FILE_NAME, src_dir_fd=dfd, dst_dir_fd=dfd)

        details = judged.owner if owner is None else owner
        return _published(_place_temp(dfd, record, details, rename), record, details)


def orphan_temps(dfd: int, now: float) -> list[str]:
    """Temp files in the folder whose writer died, or that are too old to be in use."""
    with os.scandir(dfd) as entries:
        names = [entry.name for entry in entries if _TEMP_RE.fullmatch(entry.name)]
    return [name for name in names if _temp_is_orphan(dfd, name, now)]


def _temp_is_orphan(dfd: int, name: str, now: float) -> bool:
    """A regular file (we never make anything else under a temp name: a folder, link or FIFO
    so named is someone else's, left alone) whose writer is gone or that is too old."""
    try:
        info = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(info.st_mode):
        return False
    if abs(now - info.st_mtime) > TEMP_ORPHAN_SECONDS:
        return True
    match = _TEMP_RE.fullmatch(name)
    if match is None:
        return False
    pid = int(match[1])
    if not 1 <= pid <= MAX_PID:
        return True  # no process can have this pid, so no writer is behind this name
    import psutil  # only on this rare path: keeps the CLI's cold start short

    return not psutil.pid_exists(pid)


def sweep_orphan_temps(dfd: int, now: float) -> list[str]:
    """Remove orphan temp files and return their names; best effort, never raises an OS error
    (debris left now is swept next time; the caller's own work must not fail for it).

    Removing a live writer's temp is harmless too: its link or rename then fails and it retries.
    """
    try:
        removed = orphan_temps(dfd, now)
    except OSError:
        return []
    for name in removed:
        _unlink_quietly(dfd, name)
    return removed


# --------------------------------------------------------------------------- acquire and release


class AcquireOutcome(NamedTuple):
    """How an attempt ended: ``mine`` is our new lock; otherwise ``holder`` stopped us (a named
    tuple: cheaper to define and to make than a dataclass, on every acquire).

    ``replaced`` is the stale, corrupt or foreign entry we reclaimed to get it, if any.
    """

    mine: LockSnapshot | None
    holder: LockSnapshot = MISSING
    state: LockState = LockState.FREE
    replaced: LockSnapshot | None = None
    replaced_state: LockState | None = None

    @property
    def acquired(self) -> bool:
        return self.mine is not None


MayReclaim = Callable[[LockSnapshot, LockState], bool]


def age_only(_snapshot: LockSnapshot, state: LockState) -> bool:
    """The default reclaim rule: only age, corruption or a non-lock entry frees a lock."""
    return state in RECLAIMABLE


class _JudgedLockChangedError(Exception):
    """The lock is no longer the one judged: judge the new one."""


def _reclaim(
    dfd: int,
    judged: LockSnapshot,
    record: bytes,
    still: Reclaimable,
    owner: bytes | None,
    deadline: float,
    now: float,
    pledge: proof.Pledge | None = None,
) -> LockSnapshot | None:
    """Replace the judged lock by ours: our snapshot, or ``None`` when we lost the race."""
    # Race: another process is removing this very lock right now (its owner's release, a
    # clean, another reclaim): wait for it to finish, as a release would, then judge again.
    # Only a guard kept past the deadline (a foreign flock on our folder) answers "held".
    with Guard(dfd, wait=False, until=deadline) as taken:
        if not taken:
            return None
        sweep_orphan_temps(dfd, now)  # first: debris is never a reason to stop half-way
        if not remove_if_unchanged(dfd, judged, still, life=judged.life is not None):
            raise _JudgedLockChangedError
        # Race: a fast-path publisher may slip in between our unlink and link; link() fails then.
        return publish_proven(dfd, record, now, owner, pledge)


def publish_or_reclaim(
    dfd: int,
    pid: int,
    now: float,
    may_reclaim: MayReclaim = age_only,
    owner: bytes | None = None,
    pledge: proof.Pledge | None = None,
    *,
    look_first: bool = False,
) -> AcquireOutcome:
    """One bounded attempt to make ``pid`` the holder of the lock in folder ``dfd``.

    ``owner``: the owner details to publish with the record (default: those of ``pid``).
    ``pledge``: the proof of life the holder (this process) takes with the lock and keeps
    while it holds it (``None``: the lock carries no proof). A rule other
    than :func:`age_only` judges owners, so it is given each lock's proof (``snapshot.life``).
    ``look_first``: read the lock before publishing, and answer at once when it is held and
    may not be reclaimed (a held lock then costs a read, not an inode; see :func:`_held_now`).
    """
    record = format_record(pid, now)
    if owner is None:
        owner = ownership.details_of(pid)
    judges_owners = may_reclaim is not age_only
    if look_first:
        busy = _held_now(dfd, now, may_reclaim, judges_owners)
        if busy is not None:
            return busy
    holder, state = MISSING, LockState.FREE
    deadline: float | None = None  # one guard wait per call, however many rounds
    for _ in range(MAX_ROUNDS):
        mine = publish_proven(dfd, record, now, owner, pledge)
        if mine is not None:
            return AcquireOutcome(mine)
        holder = read_lock(dfd, life=judges_owners)
        state = judge_lock(holder, now)
        if state is LockState.FREE:
            continue  # Race: released between our link and our read; publish again.
        if holder.kind is EntryKind.DIRECTORY:
            raise UnsafeLockPathError(
                errno.EISDIR, "a directory is in the way, not a lock file", LOCK_FILE_NAME
            )
        if not may_reclaim(holder, state):
            return AcquireOutcome(None, holder, state)
        if deadline is None:
            deadline = monotonic() + GUARD_WAIT_SECONDS
        try:
            won = _reclaim(
                dfd,
                holder,
                record,
                lambda entry: may_reclaim(entry, judge_lock(entry, now)),
                owner,
                deadline,
                now,
                pledge,
            )
        except _JudgedLockChangedError:
            continue  # Race: replaced since we read it; judge the new one.
        if won is None:
            return AcquireOutcome(None, holder, state)
        return AcquireOutcome(won, replaced=holder, replaced_state=state)
    return AcquireOutcome(None, holder, state)


def _held_now(
    dfd: int, now: float, may_reclaim: MayReclaim, judges_owners: bool
) -> AcquireOutcome | None:
    """The answer "held" when the lock in ``dfd`` is held and may not be reclaimed, read
    without publishing anything; ``None``: try to publish (no lock, or one to reclaim).

    It is the answer a failed publish gives (the same read, the same judgement), one step
    earlier: a pool's claim walks past every feature the other workers hold, and a waiter
    tries a held lock again and again; each such try made an inode, linked it in vain and
    dropped it, which contending workers pay for in the file system's journal. Race: the
    lock is released just after this read: "held" was true when read, as it is when a
    publish fails and the read after it sees the lock; the next try takes it."""
    holder = read_lock(dfd, life=judges_owners)
    if holder.kind is EntryKind.MISSING or holder.kind is EntryKind.DIRECTORY:
        return None  # free, or in the way: the publish below says which
    state = judge_lock(holder, now)
    if state is LockState.FREE or may_reclaim(holder, state):
        return None
    return AcquireOutcome(None, holder, state)


class ReleaseOutcome(enum.Enum):
    RELEASED = "released"
    NOTHING = "nothing to release"
    NOT_OWNER = "held by another owner"
    LEFT = "not a lock this call may remove"


def release_at(
    dfd: int, pid: int, now: float, *, force: bool = False
) -> tuple[ReleaseOutcome, LockSnapshot]:
    """Remove the lock if ``pid`` owns it (or it is corrupt, or ``force``), under the guard."""
    with Guard(dfd, wait=True):
        # Under the guard nobody else can remove or replace .lock: judge and unlink are one step.
        snapshot = read_lock(dfd)
        state = judge_lock(snapshot, now)
        if state is LockState.FREE:
            return ReleaseOutcome.NOTHING, snapshot
        if state is LockState.BUSY:
            raise busy_error(snapshot)  # whose it is cannot be told now: never removed
        if snapshot.kind is EntryKind.DIRECTORY or state is LockState.WRITING:
            return ReleaseOutcome.LEFT, snapshot
        # Another PID namespace (a container sharing the folder) may hold it under our owner's
        # pid number: the owner details decide, judged here under the guard with the unlink.
        if snapshot.record_at(now) is not None and not owned_by(snapshot, pid, now) and not force:
            return ReleaseOutcome.NOT_OWNER, snapshot
        _unlink_lock(dfd)
        return ReleaseOutcome.RELEASED, snapshot


def owned_by(snapshot: LockSnapshot, pid: int, now: float) -> bool:
    """Is ``snapshot`` a lock of ``pid``: its record names that pid, and its owner details
    (when they record a boot and PID namespace) show ours and, when they record a start time,
    the one ``pid`` runs with now? A lock without details is judged by its pid alone.
    (The release rule of the one owner judgement, ``ownership.could_own``: this module sits
    below ``backends/liveness.py``; PostgreSQL runs the same rule as generated SQL.)"""
    record = snapshot.record_at(now)
    if record is None or record[0] != pid:
        return False
    return ownership.could_own(snapshot.owner_details, pid)
