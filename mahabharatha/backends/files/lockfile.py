"""The ``.lock`` file protocol: publish, reclaim, release, refresh and sweep a feature's lock
``<gsd>/specs/F/.lock`` (``"{pid}:{time}"``); reading and judging are in ``snapshot``, the folder
and its guard in ``folder``. The long form: ``design/lockfile-hardening.md``.

A record is written into an unnamed file (``O_TMPFILE``; else a private temp) and ``link()``-ed
to ``.lock``, which fails when ``.lock`` exists: one publisher wins, nobody sees half a lock. An
existing ``.lock`` changes only under the folder's guard, after finding the very entry judged.
Invariants: at most one live lock per feature; nobody removes or replaces a lock other than the
one it judged; every call is bounded in time; no link is followed. ``now`` is the caller's.
"""

from __future__ import annotations

import enum
import errno
import os
import re
import stat
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from time import monotonic
from typing import Final, NamedTuple

from mahabharatha.backends.base import UnsafeLockPathError
from mahabharatha.backends.files.folder import Guard
from mahabharatha.backends.files.snapshot import (
    LOCK_FILE_NAME,
    MISSING,
    RECLAIMABLE,
    EntryKind,
    LockSnapshot,
    _identity,
    _is_busy,
    busy_error,
    format_record,
    judge_lock,
    raise_named,
    read_lock,
)
from mahabharatha.constants import (
    ATTEMPTS_RECORD_NAME,
    COMPLETED_MARKER_NAME,
    GUARD_WAIT_SECONDS,
    LAST_LOG_NAME,
    TEMP_ORPHAN_SECONDS,
)
from mahabharatha.names import MAX_PID
from mahabharatha.owner import ownership, proof
from mahabharatha.reads import close_quietly
from mahabharatha.states import State as LockState

MAX_ROUNDS: Final = 8  # judge-and-retry rounds (each ended by another's change), then "held"
TEMP_ATTEMPTS: Final = 3  # a named temp swept as debris before its link is written anew
LOCK_MODE: Final = 0o644  # readable by all who share the folder: an unreadable lock is reclaimable
# A test's seam: called between a won ``link`` and taking ``LIFE`` (only ``PENDING`` held).
AFTER_LINK: Callable[[], None] | None = None

_TEMP_RE: Final = re.compile(r"\.lock\.([0-9]+)\.[0-9a-f]+\.tmp", re.ASCII)
# publish_file's temps: judged by age alone (their writer holds the guard), only by clean.
_FILE_TEMP_RE: Final = re.compile(
    rf"(?:{re.escape(COMPLETED_MARKER_NAME)}|{re.escape(ATTEMPTS_RECORD_NAME)})"
    r"\.[0-9]+\.[0-9a-f]+\.tmp",
    re.ASCII,
)
# lock work's temp naming a feature's last log: judged as a lock temp (pid, age), only by clean.
_LOG_TEMP_RE: Final = re.compile(rf"{re.escape(LAST_LOG_NAME)}\.([0-9]+)\.tmp", re.ASCII)
_TMPFILE_FLAG: Final = getattr(os, "O_TMPFILE", 0)
# Our descriptors by path (``/proc/self/fd`` is gone once the main thread has exited).
_OWN_FDS: Final = (
    "/proc/thread-self/fd" if os.path.isdir("/proc/thread-self/fd") else "/proc/self/fd"
)
# A rename onto a folder, a non-empty folder or through a file: something is in the way.
_IN_THE_WAY_ERRNOS: Final = frozenset({errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR})
# Kernels or file systems without O_TMPFILE answer with one of these.
_NO_TMPFILE_ERRNOS: Final = frozenset({errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL})


Reclaimable = Callable[[LockSnapshot], bool]  # the caller's judgement, again under the guard


def remove_if_unchanged(
    dfd: int, judged: LockSnapshot, still: Reclaimable, *, life: bool = False
) -> bool:
    """Remove ``.lock`` if it is still ``judged`` and ``still`` removable (under the guard)."""
    # Race: replaced (or, an old writer's, filled in) since the caller's read: judge it again.
    current = read_lock(dfd, life=life)
    if not current.same_entry(judged) or not still(current):
        return False
    # unlinkat removes the entry itself: a symlink goes, its target is never touched.
    with suppress(FileNotFoundError):  # only an old-style writer, unguarded, could beat us here
        os.unlink(LOCK_FILE_NAME, dir_fd=dfd)
    return True


def _still_mine(dfd: int, mine: LockSnapshot) -> bool:
    """Is ``.lock`` still the holder's ``mine`` (under the guard)? Our own inode unreadable just
    now raises its error (a lease: :class:`LockBusyError`) rather than give the lock up."""
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
        os.unlink(LOCK_FILE_NAME, dir_fd=dfd)
        return True


def remove_judged(
    dfd: int, judged: LockSnapshot, still: Reclaimable, *, life: bool = False
) -> bool:
    """Under the guard, remove ``.lock`` if it is still ``judged`` and removable."""
    with Guard(dfd, wait=True):
        if judged.kind is not EntryKind.DIRECTORY:
            return remove_if_unchanged(dfd, judged, still, life=life)
        # Race: replaced since it was judged (a file published after a rmdir elsewhere).
        if not read_lock(dfd).same_entry(judged):
            return False
        try:
            os.rmdir(LOCK_FILE_NAME, dir_fd=dfd)
        except OSError:
            return False
        return True


def is_temp_name(name: str) -> bool:
    return _TEMP_RE.fullmatch(name) is not None


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data``; ``EIO`` when the file system accepts nothing."""
    while data:  # bytes, not a memoryview: a record goes in one write, and a view costs more
        written = os.write(fd, data)
        if written == 0:
            raise OSError(errno.EIO, "the file system accepted no bytes")
        data = data[written:]


def _published(info: os.stat_result, record: bytes, owner: bytes | None) -> LockSnapshot:
    return LockSnapshot(
        EntryKind.FILE, _identity(info), record, info.st_mtime, owner=owner, uid=info.st_uid
    )


def _write_record(
    fd: int, record: bytes, owner: bytes | None, shown: str = LOCK_FILE_NAME
) -> os.stat_result:
    """Write the record and its owner details; the file's facts. Race: readable by all,
    whatever the umask (another user would reclaim a lock it cannot read)."""
    try:
        write_all(fd, record)
        # Race: a reader must never see the record without its details: set them before link.
        ownership.attach(fd, owner)
        info = os.fstat(fd)
        if info.st_mode & LOCK_MODE != LOCK_MODE:
            os.fchmod(fd, LOCK_MODE)
    except OSError as error:
        raise_named(error, shown)  # the lock being written, not yet linked (or the temp)
    return info


def _write_named_temp(
    dfd: int, record: bytes, owner: bytes | None, name: str = LOCK_FILE_NAME
) -> tuple[str, os.stat_result]:
    """Write ``record`` into a new private temp for ``name``, leaving nothing behind on error."""
    temp = f"{name}.{os.getpid()}.{os.urandom(8).hex()}.tmp"
    shown = LOCK_FILE_NAME if name == LOCK_FILE_NAME else temp
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temp, flags, LOCK_MODE, dir_fd=dfd)
    try:
        try:
            info = _write_record(fd, record, owner, shown)
        finally:
            os.close(fd)  # a close error (deferred write error) fails the temp too
    except BaseException as error:
        _unlink_quietly(dfd, temp)
        if isinstance(error, OSError):
            raise_named(error, shown)  # the close of the file being written
        raise
    return temp, info


def publish_file(dfd: int, name: str, text: str) -> None:
    """Make the folder's file ``name`` (a done marker, the attempts) hold ``text`` at once, never
    through a symlink; something in the way is named, never our private temp."""
    temp, _ = _write_named_temp(dfd, text.encode(), None, name)
    try:
        os.rename(temp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException as error:
        _unlink_quietly(dfd, temp)
        if isinstance(error, OSError) and error.errno in _IN_THE_WAY_ERRNOS:
            strerror = f"{error.strerror}: something else is in the way"
            raise type(error)(error.errno, strerror, name) from error
        raise


def _unlink_quietly(dfd: int, name: str) -> None:
    try:  # noqa: SIM105  (suppress() costs a microsecond on every acquire)
        os.unlink(name, dir_fd=dfd)
    except OSError:
        pass


@dataclass(slots=True)
class TmpfileSwitch:
    """Does :func:`publish` make an unnamed file (``O_TMPFILE``)? False once refused (tests)."""

    usable: bool = bool(_TMPFILE_FLAG) and os.path.isdir(_OWN_FDS)


TMPFILE: Final = TmpfileSwitch()


def _publish_unnamed(
    dfd: int, record: bytes, owner: bytes | None, now: float
) -> LockSnapshot | None:
    try:
        fd = os.open(".", _TMPFILE_FLAG | os.O_WRONLY | os.O_CLOEXEC, LOCK_MODE, dir_fd=dfd)
    except OSError as error:
        if error.errno not in _NO_TMPFILE_ERRNOS:
            raise
        TMPFILE.usable = False  # for good: this file system makes no unnamed files
        return _publish_named(dfd, record, owner, now)
    try:
        info = _write_record(fd, record, owner)
        # Race: two publishers at once. link() fails if .lock exists, so one of them wins.
        os.link(f"{_OWN_FDS}/{fd}", LOCK_FILE_NAME, dst_dir_fd=dfd, follow_symlinks=True)
        return _published(info, record, owner)
    except FileExistsError:
        return None
    finally:
        close_quietly(fd)


def _place_temp(dfd: int, record: bytes, owner: bytes | None, *, replace: bool) -> LockSnapshot:
    """Write ``record`` into a named temp and link it to ``.lock`` (``replace``: rename it)."""
    for _ in range(TEMP_ATTEMPTS - 1):
        # Race: a sweeper took our temp for debris (a clock step, another PID namespace): retry.
        with suppress(FileNotFoundError):
            return _place_temp_once(dfd, record, owner, replace)
    return _place_temp_once(dfd, record, owner, replace)


def _place_temp_once(dfd: int, record: bytes, owner: bytes | None, replace: bool) -> LockSnapshot:
    name, info = _write_named_temp(dfd, record, owner)
    try:
        if replace:
            # rename() swaps the whole file at once: readers see the old or the new record.
            os.rename(name, LOCK_FILE_NAME, src_dir_fd=dfd, dst_dir_fd=dfd)
        else:
            # Race: two publishers at once. link() fails if .lock exists, so one of them wins.
            os.link(name, LOCK_FILE_NAME, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
    finally:
        _unlink_quietly(dfd, name)  # after a link the temp name goes; after a rename it is gone
    return _published(info, record, owner)


def _publish_named(dfd: int, record: bytes, owner: bytes | None, now: float) -> LockSnapshot | None:
    sweep_orphan_temps(dfd, now)  # named temps can be orphaned by a crash: keep them few
    try:
        return _place_temp(dfd, record, owner, replace=False)
    except FileExistsError:
        return None


def publish(dfd: int, record: bytes, now: float, owner: bytes | None = None) -> LockSnapshot | None:
    """Make ``.lock`` appear, whole, with ``record`` and ``owner``; ``None``: a lock exists."""
    if TMPFILE.usable:
        return _publish_unnamed(dfd, record, owner, now)
    return _publish_named(dfd, record, owner, now)


def publish_proven(
    dfd: int, record: bytes, now: float, owner: bytes | None, pledge: proof.Pledge | None
) -> LockSnapshot | None:
    """:func:`publish` holding the pledge's proof of life from before the try (if it can be
    taken): the details claim it, and a won publish keeps it."""
    # Race: a judge looking at LIFE an instant before a winner takes it: PENDING comes first.
    if pledge is None or pledge.fd is None or not proof.hold_pending(pledge.fd, pledge.slot):
        return publish(dfd, record, now, owner)
    fd, slot = pledge.fd, pledge.slot
    tag = 0 if pledge.identity is None else ownership.folder_tag(*pledge.identity)
    mine = None
    try:
        mine = publish(dfd, record, now, ownership.with_proof(owner, slot, tag))
    finally:
        if mine is None:  # lost, or failed: our slot's PENDING means nothing to anyone now
            with suppress(OSError):
                proof.drop_pending(fd, slot)
    if mine is None:
        return None
    pledge.keep()
    if AFTER_LINK is not None:  # a test's pause in the PENDING window; None in real use
        AFTER_LINK()
    # A failure here leaves PENDING held, which judges also count as alive.
    with suppress(OSError):
        proof.hold_life(fd, slot)
    return mine


def replace_if_unchanged(
    dfd: int, judged: LockSnapshot, record: bytes, owner: bytes | None = None
) -> LockSnapshot | None:
    """Swap ``.lock`` for ``record`` if it is still the holder's ``judged``; ``None``: not."""
    with Guard(dfd, wait=True):
        # Race: a forced release or a reclaim replaced our lock; never overwrite theirs.
        if not _still_mine(dfd, judged):
            return None
        details = judged.owner if owner is None else owner
        return _place_temp(dfd, record, details, replace=True)


OrphanTemp = tuple[str, tuple[int, int]]  # a temp's name, and the identity it was judged by


def orphan_temps(dfd: int, now: float, *, files: bool = False) -> list[OrphanTemp]:
    """Temp files in the folder whose writer died, or that are too old to be in use; ``files``:
    also :func:`publish_file`'s temps that are too old (a crash between write and rename)."""
    with os.scandir(dfd) as entries:
        judged = [(entry.name, _orphan_info(dfd, entry.name, now, files)) for entry in entries]
    return [(name, _identity(info)) for name, info in judged if info is not None]


def _orphan_info(dfd: int, name: str, now: float, files: bool) -> os.stat_result | None:
    """The facts of a regular file (anything else so named is someone else's) named as a temp,
    if it is too old or, a temp named by its writer's pid, that pid is gone; else ``None``."""
    match = _TEMP_RE.fullmatch(name) or (_LOG_TEMP_RE.fullmatch(name) if files else None)
    if match is None and not (files and _FILE_TEMP_RE.fullmatch(name)):
        return None
    try:
        info = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    if abs(now - info.st_mtime) > TEMP_ORPHAN_SECONDS:
        return info  # too old to be in use
    if match is None:
        return None  # young: a writer in progress, whatever its pid (another PID namespace)
    if not 1 <= int(match[1]) <= MAX_PID:
        return info  # no process can have this pid
    import psutil  # only on this rare path: keeps the CLI's cold start short

    return None if psutil.pid_exists(int(match[1])) else info


def remove_orphan_temp(dfd: int, temp: OrphanTemp, now: float) -> bool:
    """Remove the orphan ``temp`` if it is still the file judged and still an orphan, under the
    guard (which every :func:`publish_file` writer holds); False if it is not."""
    name, judged = temp
    with Guard(dfd, wait=True):
        # Race: renamed by its writer, removed by another clean, or its name taken since judged.
        info = _orphan_info(dfd, name, now, files=True)
        if info is None or _identity(info) != judged:
            return False
        try:
            os.unlink(name, dir_fd=dfd)
        except FileNotFoundError:
            return False  # Race: an unguarded writer of a .lock temp linked and removed it
        return True


def sweep_orphan_temps(dfd: int, now: float) -> None:
    """Remove orphan temp files; never an OS error (left debris goes next time). A live
    writer's temp removed is harmless: its link or rename fails and it retries."""
    with suppress(OSError):
        for name, _ in orphan_temps(dfd, now):
            _unlink_quietly(dfd, name)


class AcquireOutcome(NamedTuple):
    """An attempt's end: ``mine`` (``replaced``: what we reclaimed for it), or ``holder``."""

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
    """One bounded attempt to make ``pid`` the holder of the lock in folder ``dfd``. ``owner``:
    the details (default: ``pid``'s); ``pledge``: the proof of life taken with the lock;
    ``look_first``: answer "held" from a read before publishing."""
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

        def still(entry: LockSnapshot) -> bool:  # the same judgement, again under the guard
            return may_reclaim(entry, judge_lock(entry, now))

        # Race: another process is removing this very lock right now: wait for it, then judge
        # again; only a guard kept past the deadline (a foreign flock) answers "held".
        with Guard(dfd, wait=False, until=deadline) as taken:
            if not taken:
                return AcquireOutcome(None, holder, state)
            sweep_orphan_temps(dfd, now)  # first: debris is never a reason to stop half-way
            if not remove_if_unchanged(dfd, holder, still, life=holder.life is not None):
                continue  # Race: replaced since we read it; judge the new one.
            # Race: a fast-path publisher may slip in between our unlink and link; link fails then.
            won = publish_proven(dfd, record, now, owner, pledge)
        if won is None:
            return AcquireOutcome(None, holder, state)
        return AcquireOutcome(won, replaced=holder, replaced_state=state)
    return AcquireOutcome(None, holder, state)


def _held_now(
    dfd: int, now: float, may_reclaim: MayReclaim, judges_owners: bool
) -> AcquireOutcome | None:
    """ "held" from a read, making no inode in vain; ``None``: publish. Race: released just after
    this read: "held" was true when read, as after a failed publish; the next try takes it."""
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
        os.unlink(LOCK_FILE_NAME, dir_fd=dfd)
        return ReleaseOutcome.RELEASED, snapshot


def owned_by(snapshot: LockSnapshot, pid: int, now: float) -> bool:
    """Does ``snapshot``'s record name ``pid``, with owner details that could be ``pid``'s?"""
    record = snapshot.record_at(now)
    if record is None or record[0] != pid:
        return False
    return ownership.could_own(snapshot.owner_details, pid)
