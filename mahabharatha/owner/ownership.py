"""Who owns a lock: the owner details published beside the ``pid:timestamp`` record.

The record's bytes are fixed (old and new writers share them), so the rest of what we know about
an owner travels in one extended attribute of the lock file, ``user.mahabharatha.owner``, set on
the file's descriptor *before* the file is linked (or renamed) to ``.lock``: a reader sees the
record and its details together or not at all, and they can never disagree. The value is packed
binary, little-endian (``DETAILS_LAYOUT``), then text::

    version (1 byte, 3) | boot (8 bytes) | ns (u32) | start (u64) | pgid (u32) | gstart (u64)
    | flags (1 byte) | sid (u32) | slot (u32) | folder (u32) | host (UTF-8) [ | NUL | cmd ]

(Versions 1 and 2, still read, lacked the tail and ``folder``; their first bytes are the same.)

Unknown numbers are 0. Small on purpose: ext4 keeps an attribute of up to ``INLINE_BYTES`` in
the inode itself; a larger one costs a disk block per lock, which made an acquire-release
cycle four times slower. So the host name is cut to fit there; only ``lock run``, which holds
its lock for long, adds its command (up to ``MAX_DETAILS_BYTES`` in all).

* ``boot``: the first 8 bytes of ``/proc/sys/kernel/random/boot_id`` (64 bits tell boots
  apart); ``ns``: the inode of our ``/proc/self/ns/pid``, the namespace in which the recorded
  pid number means something;
* ``start``: the owner's start time in clock ticks after boot (``/proc/<pid>/stat`` field 22):
  exact and cheap, where psutil's ``create_time`` is a float rebuilt from it; kept as the
  initial time namespace sees it (``boottime_offset_ticks``), whichever one the writer is in;
* ``pgid`` and ``gstart``: the owner's process group when it took the lock, and the start time of
  that group's leader if it was running (tells a reused group number apart);
* ``flags``: ``PROOF_FLAG`` when the holder holds its proof file's proof of life
  (:mod:`mahabharatha.owner.proof`): then the kernel, not the pid, says whether it is alive;
  ``WORK_GROUP_FLAG`` when ``pgid`` and ``gstart`` are the process group ``lock run`` made for
  its command (recorded once the command started): its members are the owner's work;
* ``sid``: the owner's session when it took the lock. A lock without a proof (a CLI ``acquire``
  on behalf of its shell) stays alive while any process of that session lives: GNU ``timeout``
  moves work to a group of its own, but not out of the session;
* ``folder``: the identity of the file that holds the proof, the owner's own proof file in the
  feature folder (:func:`folder_tag` of its ``st_dev`` and ``st_ino``): a judge that finds
  another file there (the folder copied with ``cp -a`` and swapped in, restored from a backup)
  holds no proof to look at: ``unknown``. (Versions 3 before the proof file recorded the
  folder's own identity: their locks now read as another folder's, never dead);
* ``host`` and, for ``lock run``, ``cmd`` (the command, cut to ``MAX_COMMAND_CHARS``): for people.

Without the attribute (an older writer, a file system without extended attributes) the lock is
valid and its owner details are unknown; nothing here ever makes a lock unreadable or corrupt.
Judging a pid needs the judge's own boot and PID namespace in the details (``judgeable``).
"""

from __future__ import annotations

import enum
import errno
import os
import struct
from collections.abc import Callable, Sequence
from functools import cache
from typing import Final, NamedTuple

XATTR_NAME: Final = "user.mahabharatha.owner"
"""One attribute for everything: set with one system call, in the inode on ext4 (user.*: no
privilege needed)."""
DETAILS_VERSION: Final = 3
"""The first byte of the value: a layout we do not know is treated as no details at all."""
DETAILS_VERSIONS: Final = (1, 2, DETAILS_VERSION)
"""The layouts we read (version 1 lacks the tail; the database's rule reads the head only)."""
_HEAD_FIELDS: Final = (("version", "B"), ("boot", "8s"), ("ns", "I"), ("start", "Q"))
"""The head's first fields, by name: the layout below and the database's copy of ``could_own``
(``could_own_sql``, which reads them by byte offset) are both made from this one list."""
DETAILS_LAYOUT: Final = struct.Struct("<" + "".join(code for _, code in _HEAD_FIELDS) + "IQ")
"""The head every version shares: version, boot id (8 bytes), PID namespace, start ticks,
process group, group leader start."""
DETAILS_TAIL: Final = struct.Struct("<BII")
"""The tail after the head (versions 2 and 3): flags, session id, proof slot."""
FOLDER_FIELD: Final = struct.Struct("<I")
"""Version 3's last number: the proof file's tag (:func:`folder_tag`; 0: unknown). Four
bytes, not the whole identity: the value must stay inside the inode (``INLINE_BYTES``)."""
PROOF_FLAG: Final = 0x01
"""The holder holds the folder's proof of life (published with the lock, never added later)."""
WORK_GROUP_FLAG: Final = 0x02
"""``pgid``/``gstart`` name the group the holder made for its command (``lock run``): work
that left the proof behind but not that group still counts (revision 5)."""
INLINE_BYTES: Final = 52
"""The largest value of this name that ext4 (256-byte inodes) keeps inside the inode."""
MAX_DETAILS_BYTES: Final = 512
"""With ``lock run``'s command; a longer value is not ours and is ignored (bounded reads)."""
MAX_COMMAND_CHARS: Final = 256
"""The command is shown to people, never parsed: a long one is cut to keep the value bounded."""
MAX_STAT_BYTES: Final = 4096
"""``/proc/<pid>/stat`` is one line of about 300 bytes even with a 15-character comm."""

# What a file system without (user) extended attributes, or one that is full, answers.
_NO_XATTR_ERRNOS: Final = frozenset(
    {errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM, errno.E2BIG, errno.ENOSPC, errno.EDQUOT}
)


class OwnerDetails(NamedTuple):
    """What the details say (``None``: unknown); a named tuple, cheaper to define and to make
    than a dataclass (the CLI's cold start defines it on every call)."""

    boot: str | None = None
    ns: int | None = None
    start: int | None = None
    pgid: int | None = None
    gstart: int | None = None
    host: str | None = None
    cmd: str | None = None
    sid: int | None = None
    proof: bool = False
    slot: int | None = None  # the lock's own bytes of the folder's proof (mahabharatha.owner.proof)
    work_group: bool = False  # pgid/gstart: the group lock run made for its command
    folder: int | None = None  # the tag of the proof file (folder_tag)


class ProcStat(NamedTuple):
    """The three fields of ``/proc/<pid>/stat`` the judgements need (a named tuple: a class
    made by ``@dataclass`` costs the CLI's cold start four times as much)."""

    state: str  # R, S, D, Z (zombie), X (dead), ...
    pgrp: int
    start: int  # clock ticks after boot
    session: int = 0


# --------------------------------------------------------------------------- this host, this boot


@cache
def this_boot() -> str | None:
    """This boot's id as recorded (16 hex digits, Linux); ``None`` elsewhere, and then no pid
    is ever judged dead."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as source:
            digits = source.read(64).decode("ascii").strip().replace("-", "")[:16]
        return bytes.fromhex(digits).hex() if len(digits) == 16 else None
    except (OSError, ValueError):
        return None


_OWN_PID_NS: Final = (
    "/proc/thread-self/ns/pid" if os.path.exists("/proc/thread-self") else "/proc/self/ns/pid"
)  # thread-self: works after the main thread exited (pthread_exit) while others run


@cache
def this_pid_namespace() -> int | None:
    """Our PID namespace's inode, or ``None`` when ``/proc`` is not our namespace's.

    ``unshare --pid --fork`` without ``--mount-proc`` leaves the host's ``/proc`` mounted: pid
    numbers there are not ours, so nothing read from it may judge one of our pids.
    """
    try:
        if int(os.readlink("/proc/self")) != os.getpid() or boottime_offset_ticks() is None:
            return None  # the pids, or the start times, read here could not be compared
        return os.stat(_OWN_PID_NS).st_ino
    except (OSError, ValueError):
        return None


_OWN_TIME_NS: Final = _OWN_PID_NS.replace("/pid", "/time")
INITIAL_TIME_NS_INODE: Final = 0xEFFFFFFA
"""The kernel's fixed inode of the initial time namespace (``PROC_TIME_INIT_INO``)."""


@cache
def boottime_offset_ticks() -> int | None:
    """Our time namespace's boot-time offset in clock ticks: what ``/proc/<pid>/stat`` adds to
    every start time we read (0 in the initial one); ``None`` when it cannot be known exactly.

    Race: the same live process reads with another start time from another time namespace
    (``unshare --time --boottime``); raw, a judge there would call a live owner's pid reused.
    """
    try:
        active = os.stat(_OWN_TIME_NS).st_ino
    except FileNotFoundError:
        return 0  # a kernel without time namespaces: every reading is the initial one's
    except OSError:
        return None
    if active == INITIAL_TIME_NS_INODE:
        return 0
    try:  # timens_offsets shows the namespace of our children: it must be ours too
        if os.stat(_OWN_TIME_NS + "_for_children").st_ino != active:
            return None
        with open("/proc/self/timens_offsets", "rb") as source:
            lines = source.read(MAX_STAT_BYTES).decode("ascii").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    return _boottime_ticks(lines)


def _boottime_ticks(lines: list[str]) -> int | None:
    ticks_per_second = os.sysconf("SC_CLK_TCK")
    nanoseconds_per_tick = 1_000_000_000 // ticks_per_second
    for line in lines:
        fields = line.split()
        if len(fields) == 3 and fields[0] in ("boottime", "7"):  # 7: CLOCK_BOOTTIME
            seconds, nanoseconds = int(fields[1]), int(fields[2])
            if nanoseconds % nanoseconds_per_tick:
                return None  # the kernel rounds the sum: a tick either way could not be told
            return seconds * ticks_per_second + nanoseconds // nanoseconds_per_tick
    return None


def _forget_after_fork() -> None:
    this_pid_namespace.cache_clear()  # a child of unshare(CLONE_NEWPID) lives in a new namespace
    boottime_offset_ticks.cache_clear()  # and one of unshare(CLONE_NEWTIME) in a new time one


os.register_at_fork(after_in_child=_forget_after_fork)


@cache
def host_name() -> str:
    """This host's name (what ``socket.gethostname()`` answers), the one every layer compares."""
    # uname's node name is what socket.gethostname() answers on Linux and macOS, without the
    # socket module (2 ms of the CLI's cold start).
    return os.uname().nodename


# --------------------------------------------------------------------------- /proc


def proc_stat(pid: int) -> ProcStat | None:
    """State, process group and start time of ``pid``; ``None`` when there is no such process."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = os.read(fd, MAX_STAT_BYTES)
    except OSError:
        return None  # Race: the process was reaped between open and read
    finally:
        os.close(fd)
    stat = _parse_stat(raw)
    offset = boottime_offset_ticks()
    if stat is None or not offset:
        return stat
    return stat._replace(start=stat.start - offset)  # as the initial time namespace sees it


def _parse_stat(raw: bytes) -> ProcStat | None:
    # The command name (field 2) may hold spaces and parentheses: split after the last ")".
    _, _, rest = raw.rpartition(b")")
    fields = rest.split()
    try:
        return ProcStat(fields[0].decode("ascii"), int(fields[2]), int(fields[19]), int(fields[3]))
    except (IndexError, ValueError, UnicodeDecodeError):
        return None


def has_live_thread(pid: int) -> bool:
    """True when a thread of ``pid`` still runs although its main thread may have exited.

    A process whose main thread called ``pthread_exit`` shows as a zombie while its other threads
    work on: only its tasks tell.
    """
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tasks:
        if not tid.isdigit():
            continue
        task = _task_stat(pid, int(tid))
        if task is not None and task.state not in ("Z", "X"):
            return True
    return False


def _task_stat(pid: int, tid: int) -> ProcStat | None:
    try:
        with open(f"/proc/{pid}/task/{tid}/stat", "rb") as source:
            return _parse_stat(source.read(MAX_STAT_BYTES))
    except OSError:
        return None  # Race: the thread ended since the listing


def is_alive(stat: ProcStat | None, pid: int) -> bool:
    """A process is alive while any of its threads runs (a zombie leader with live threads is)."""
    if stat is None:
        return False
    return stat.state not in ("Z", "X") or has_live_thread(pid)


class _GroupProbe(enum.Enum):
    """What ``killpg(pgid, 0)`` says of a process group."""

    GONE = "gone"  # no process at all is in that group
    CANNOT_TELL = "cannot-tell"  # the look failed: never call an owner dead on it
    MEMBERS = "members"  # members exist, some of them ours: look at them
    OTHERS_ONLY = "others-only"  # members exist, every one another user's: look at them


def _probe_group(pgid: int) -> _GroupProbe:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return _GroupProbe.GONE
    except PermissionError:
        return _GroupProbe.OTHERS_ONLY
    except OSError:
        return _GroupProbe.CANNOT_TELL
    return _GroupProbe.MEMBERS


def group_has_live_member(pgid: int, leader_start: int | None) -> bool:
    """Is any process of the group ``pgid`` (the one whose leader started at ``leader_start``)
    still alive? Zombies waiting to be reaped do not count.

    A group number is a pid: while any member lives the kernel never hands that number to a new
    process, so a leader with another start time means the old group ended and the number was
    reused (then the old group has no member left).
    """
    probe = _probe_group(pgid)
    if probe is not _GroupProbe.MEMBERS and probe is not _GroupProbe.OTHERS_ONLY:
        return probe is _GroupProbe.CANNOT_TELL
    others_only = probe is _GroupProbe.OTHERS_ONLY
    leader = proc_stat(pgid)
    if leader is not None and leader.pgrp == pgid:
        if leader_start is not None and leader.start != leader_start:
            return False  # Race: group ended and its number was reused by a new leader
        if is_alive(leader, pgid):
            return True
    return _scan_for_member(pgid, unseen_alive=others_only)


def group_has_work_since(pgid: int, leader_start: int | None, since: int | None) -> bool:
    """:func:`group_has_live_member`, counting only members that started at or after
    ``since`` (clock ticks after boot; ``None``: all), never the caller itself: the group
    ``lock run`` recorded for its command's work. A command's work started after ``lock run``
    did; a terminal job's group that CMD shares also holds the script that started ``lock
    run`` (older) and maybe its next try (the caller): neither is that work."""
    if since is None:
        return group_has_live_member(pgid, leader_start)
    probe = _probe_group(pgid)
    if probe is not _GroupProbe.MEMBERS and probe is not _GroupProbe.OTHERS_ONLY:
        return probe is _GroupProbe.CANNOT_TELL
    others_only = probe is _GroupProbe.OTHERS_ONLY
    leader = proc_stat(pgid)
    reused = leader is not None and leader.pgrp == pgid and leader_start not in (None, leader.start)
    if reused:
        return False  # Race: group ended and its number was reused by a new leader
    return _scan_for_member(pgid, unseen_alive=others_only, since=since)


_STOPPED_STATES: Final = frozenset({"T", "t"})  # stopped by a signal; stopped by a tracer


def holder_stopped(pid: int, details: OwnerDetails | None) -> bool:
    """Is the holder ``pid`` (the one these details name), or the leader of the group
    ``lock run`` made for its command, stopped (SIGSTOP, Ctrl-Z, a read from the background)?
    Only on our own boot and PID namespace; a process with another start time is not it."""
    if details is None or not judgeable(details):
        return False
    looks = [(pid, details.start)]
    if details.work_group and details.pgid is not None:
        looks.append((details.pgid, details.gstart))
    for each, start in looks:
        stat = proc_stat(each)
        if stat is not None and stat.state in _STOPPED_STATES and start in (None, stat.start):
            return True
    return False


def session_has_live_member(sid: int) -> bool:
    """Is any process of the session ``sid`` still alive (zombies do not count)? Only on the
    rare path where a proof-less lock's owner and its group are gone.

    A session id is a pid: while any member lives the kernel never hands it to a new process.
    A ``/proc`` that cannot be listed, or a look that fails, answers alive.
    """
    if sid <= 0:
        return False
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return True  # cannot tell: alive
    for pid in pids:
        stat = proc_stat(pid)
        if stat is not None and stat.session == sid and is_alive(stat, pid):
            return True
    return False


def _scan_for_member(pgid: int, *, unseen_alive: bool = False, since: int | None = None) -> bool:
    """Look through the process table for a live member of ``pgid`` (only on the rare path
    where the owner itself is gone). ``unseen_alive``: ``killpg`` said members exist; if this
    ``/proc`` shows none of them, not even a zombie, it hides them (``hidepid``): alive.
    ``since``: only members started then or later count, and never the caller."""
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return True  # cannot tell: alive
    seen = False
    for pid in pids:
        stat = proc_stat(pid)
        if stat is None or stat.pgrp != pgid:
            continue
        if since is not None and (stat.start < since or pid == os.getpid()):
            seen = True  # a member, but not the work: not hidden either
            continue
        if is_alive(stat, pid):
            return True
        seen = True
    # Race: /proc mounted hidepid=1/2 hides another user's live members from a judge.
    return unseen_alive and not seen


def pid_exists(pid: int) -> bool:
    """Is there a process ``pid`` (a zombie too), whether or not ``/proc`` shows it? Only
    ``ESRCH`` says no: a failed look never calls an owner dead."""
    if pid <= 0:
        return False  # kill(0) and kill(-1) would ask about groups, not about this pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # EPERM: it exists, another user's
    return True


# --------------------------------------------------------------------------- encoding


def details_of(pid: int, command: Sequence[str] | None = None) -> bytes:
    """The owner details to publish for ``pid`` (a process visible to us, or already gone)."""
    if command is None and pid == os.getpid():
        return _own_details(pid, os.getpgrp())  # the legacy hot path: computed once
    return _encode(_collect(pid, command))


@cache
def _own_details(pid: int, pgrp: int) -> bytes:
    # Keyed by pid and group: a forked child, a setpgid() or a setsid() (which changes the
    # group too) gets its own.
    return _encode(_collect(pid, None))


def command_name_only(raw: bytes | None) -> bytes | None:
    """``raw`` with its command cut to the program's name (``/usr/bin/deploy --token=x`` ->
    ``deploy``): for a store every role may read. Anything not our format is returned as is."""
    details = decode(raw)
    if details is None or details.cmd is None:
        return raw
    program = details.cmd.split(" ", 1)[0].rsplit("/", 1)[-1]
    return _encode(details._replace(cmd=program))


def proof_slot(raw: bytes | None) -> int | None:
    """The slot of the proof of life the packed details ``raw`` claim, ``None`` for none.
    (Read on every judged lock: looks at five bytes instead of decoding.)"""
    if raw is None or len(raw) < _TAIL_END or raw[0] not in _PROOF_VERSIONS:
        return None
    if not raw[_FLAGS_AT] & PROOF_FLAG:
        return None
    return _SLOT_LAYOUT.unpack_from(raw, _SLOT_AT)[0] or None


def proof_folder(raw: bytes | None) -> int | None:
    """The tag of the proof file the packed details ``raw`` say holds their proof (``None``:
    not recorded, an older writer whose proof is on the folder's bytes)."""
    if raw is None or len(raw) < _FOLDER_END or raw[0] != DETAILS_VERSION:
        return None
    return FOLDER_FIELD.unpack_from(raw, _TAIL_END)[0] or None


def folder_tag(dev: int, ino: int) -> int:
    """A proof file's identity in four bytes, never 0 (0 is "not recorded"). Two files of one
    file system differ unless their inode numbers differ by a multiple of 2**32; a copy on
    another device collides once in 2**32."""
    return ((ino ^ (dev * 0x9E3779B1)) & 0xFFFF_FFFF) or 1


def claims_proof(raw: bytes | None) -> bool:
    """Do the packed details ``raw`` say that their holder holds a proof of life?"""
    return proof_slot(raw) is not None


def with_proof(raw: bytes | None, slot: int, folder: int = 0) -> bytes | None:
    """``raw`` (details of the current version) saying that the holder holds the proof of
    life of ``slot`` in the folder tagged ``folder``; anything else is returned as it is (no
    details: no proof is claimed)."""
    if not raw or len(raw) < _FOLDER_END or raw[0] != DETAILS_VERSION:
        return raw
    flags = bytes([raw[_FLAGS_AT] | PROOF_FLAG])
    return (
        raw[:_FLAGS_AT]
        + flags
        + raw[_FLAGS_AT + 1 : _SLOT_AT]
        + _SLOT_LAYOUT.pack(slot)
        + FOLDER_FIELD.pack(folder)
        + raw[_FOLDER_END:]
    )


def _collect(pid: int, command: Sequence[str] | None) -> OwnerDetails:
    cmd = None if command is None else _command_line(command)
    owner = proc_stat(pid) if this_pid_namespace() is not None else None
    if owner is None:  # gone, hidden (hidepid) or /proc is not ours: no start time known
        # Race: a writer that cannot read its short-lived parent (hidepid=2, the CLI run as a
        # service account through sudo or setpriv) still records the group and session the
        # system calls tell: the worker's, which keep the lock alive after that parent exits.
        group, session = _ask_kernel(os.getpgid, pid), _ask_kernel(os.getsid, pid)
        return OwnerDetails(
            this_boot(), this_pid_namespace(), host=host_name(), cmd=cmd, pgid=group, sid=session
        )
    leader = owner if owner.pgrp == pid else proc_stat(owner.pgrp)
    leader_start = leader.start if leader is not None and leader.pgrp == owner.pgrp else None
    return OwnerDetails(
        this_boot(),
        this_pid_namespace(),
        owner.start,
        owner.pgrp,
        leader_start,
        host_name(),
        cmd,
        owner.session or None,
    )


def _ask_kernel(question: Callable[[int], int], pid: int) -> int | None:
    """``getpgid``/``getsid`` of ``pid``; ``None`` when it is gone (or another namespace's)."""
    if this_pid_namespace() is None:
        return None  # the number would be judged against another namespace's /proc
    try:
        return question(pid)
    except OSError:
        return None


def _command_line(command: Sequence[str]) -> str:
    line = " ".join(command)
    return line if len(line) <= MAX_COMMAND_CHARS else line[: MAX_COMMAND_CHARS - 3] + "..."


def _encode(details: OwnerDetails) -> bytes:
    boot = bytes.fromhex((details.boot or "").replace("-", "")[:16].ljust(16, "0"))
    head = DETAILS_LAYOUT.pack(
        DETAILS_VERSION,
        boot,
        details.ns or 0,
        details.start or 0,
        details.pgid or 0,
        details.gstart or 0,
    ) + DETAILS_TAIL.pack(_flags_of(details), details.sid or 0, details.slot or 0)
    head += FOLDER_FIELD.pack(details.folder or 0)
    host = (details.host or "").encode("utf-8", "replace")[: INLINE_BYTES - len(head)]
    host = host.decode("utf-8", "ignore").encode()  # never cut a character in two
    if details.cmd is None:
        return head + host
    return (head + host + b"\0" + details.cmd.encode("utf-8", "replace"))[:MAX_DETAILS_BYTES]


def _flags_of(details: OwnerDetails) -> int:
    return (PROOF_FLAG if details.proof else 0) | (WORK_GROUP_FLAG if details.work_group else 0)


def with_work_group(raw: bytes | None, pgid: int, leader_start: int | None) -> bytes | None:
    """``raw`` (details of the current version) naming ``pgid`` (whose leader started at
    ``leader_start``) as the group made for the holder's command; anything else as it is."""
    details = decode(raw)
    if raw is None or details is None or raw[0] != DETAILS_VERSION:
        return raw
    return _encode(details._replace(pgid=pgid, gstart=leader_start, work_group=True))


def decode(raw: bytes | None) -> OwnerDetails | None:
    """The details in ``raw``; ``None`` for none, or for anything that is not our format."""
    if not raw or len(raw) > MAX_DETAILS_BYTES or len(raw) < DETAILS_LAYOUT.size:
        return None
    version, boot, ns, start, pgid, gstart = DETAILS_LAYOUT.unpack_from(raw)
    if version not in DETAILS_VERSIONS:
        return None
    flags, sid, slot, folder, text_at = 0, 0, 0, 0, DETAILS_LAYOUT.size
    if version in _PROOF_VERSIONS:
        text_at = _TEXT_AT[version]
        if len(raw) < text_at:
            return None
        flags, sid, slot = DETAILS_TAIL.unpack_from(raw, DETAILS_LAYOUT.size)
    if version == DETAILS_VERSION:
        folder = FOLDER_FIELD.unpack_from(raw, _TAIL_END)[0]
    host, separator, cmd = raw[text_at:].partition(b"\0")
    return OwnerDetails(
        boot=boot.hex() if any(boot) else None,
        ns=ns or None,
        start=start or None,
        pgid=pgid or None,
        gstart=gstart or None,
        host=host.decode("utf-8", "replace") or None,
        cmd=cmd.decode("utf-8", "replace") if separator else None,
        sid=sid or None,
        proof=bool(flags & PROOF_FLAG) and slot != 0,
        slot=slot or None,
        work_group=bool(flags & WORK_GROUP_FLAG) and pgid != 0,
        folder=folder or None,
    )


def judgeable(details: OwnerDetails | None) -> bool:
    """May this process judge the recorded pid? Only on its own boot, in its own namespace."""
    if not _records_place(details):
        return False
    assert details is not None  # _records_place says so
    return _same_place(details, this_boot(), this_pid_namespace())


def _same_place(details: OwnerDetails, boot: str | None, ns: int | None) -> bool:
    """Do the details record the boot ``boot`` and the PID namespace ``ns`` (both known)?"""
    return boot is not None and ns is not None and (details.boot, details.ns) == (boot, ns)


def _records_place(details: OwnerDetails | None) -> bool:
    """Do the details record both the owner's boot and its PID namespace?"""
    return details is not None and details.boot is not None and details.ns is not None


def _start_now(pid: int) -> int | None:
    current = proc_stat(pid)
    return None if current is None else current.start


@cache
def _own_start(pid: int) -> int | None:
    # Keyed by pid: our start time never changes, and a forked child asks under its own pid
    # (the legacy release's hot path reads /proc once per process, not once per release).
    return _start_now(pid)


def could_own(details: OwnerDetails | None, pid: int) -> bool:
    """May ``pid`` (a number in our PID namespace) be the owner these details record?

    No when they record a boot and PID namespace that are not shown to be ours (another boot,
    another namespace, or ours cannot be read): that pid number means another process there.
    No when they record our boot and namespace and a start time, and ``pid`` runs now with
    another one (the owner died and its number was reused). Yes otherwise: details missing
    or partial (an older writer, no extended attributes) leave the pid alone to decide.

    The caller rule of the one owner judgement (``backends/liveness.py: judge``), and of a
    release by pid under the folder's guard; the database runs ``could_own_sql``, made from
    the same layout and tested against :func:`could_be_owner` on a real server.
    """
    return could_be_owner(details, this_boot(), this_pid_namespace(), lambda: _start_of(pid))


def could_be_owner(
    details: OwnerDetails | None,
    boot: str | None,
    ns: int | None,
    start_now: Callable[[], int | None],
) -> bool:
    """:func:`could_own` for a judge on ``boot`` in the namespace ``ns`` (``None``: unknown),
    where the pid runs now with the start time ``start_now()`` (asked only when needed;
    ``None``: not running)."""
    if not _records_place(details):
        return True
    assert details is not None  # _records_place says so
    if not _same_place(details, boot, ns):
        return False
    if details.start is None:
        return True
    start = start_now()
    return start is None or start == details.start


def _start_of(pid: int) -> int | None:
    return _own_start(pid) if pid == os.getpid() else _start_now(pid)


def could_own_sql(column: str) -> str:
    """:func:`could_own` as a SQL condition on the packed details in ``column`` (``bytea``),
    with the parameters ``%(place)s`` (:func:`place_key`) and ``%(start)s`` (:func:`start_key`):
    made from ``_HEAD_FIELDS`` and the rules of :func:`decode`, never written out by hand.
    ``column`` is our own column's name, never input."""
    boot, ns, start = (_field_sql(column, name) for name in ("boot", "ns", "start"))
    zero_boot, zero_ns, zero_start = (_zeros(name) for name in ("boot", "ns", "start"))
    version = f"get_byte({column}, 0)"
    old_versions = tuple(v for v in DETAILS_VERSIONS if v not in _TEXT_AT)
    # decode(): a head of a version we read, and the later versions also have their tail.
    tails = "".join(
        f" OR ({version} = {number} AND length({column}) >= {end})"
        for number, end in _TEXT_AT.items()
    )
    ours = (
        f"{column} IS NOT NULL"
        f" AND length({column}) BETWEEN {DETAILS_LAYOUT.size} AND {MAX_DETAILS_BYTES}"
        f" AND ({version} IN {_sql_list(old_versions)}{tails})"
    )
    records_place = f"{ours} AND {boot} <> {zero_boot} AND {ns} <> {zero_ns}"
    place = f"substring({column} FROM {_offset('boot') + 1} FOR {_width('boot', 'ns')})"
    same_start = f"(%(start)s::bytea IS NULL OR {start} IN ({zero_start}, %(start)s::bytea))"
    return f"(NOT ({records_place}) OR ({place} = %(place)s::bytea AND {same_start}))"


def _offset(name: str) -> int:
    """Where the head's field ``name`` starts (bytes from the value's start)."""
    codes = [code for _, code in _HEAD_FIELDS]
    at = [field for field, _ in _HEAD_FIELDS].index(name)
    return struct.calcsize("<" + "".join(codes[:at]))


def _width(first: str, last: str) -> int:
    """Bytes from the start of the field ``first`` to the end of the field ``last``."""
    names = [field for field, _ in _HEAD_FIELDS]
    codes = [code for _, code in _HEAD_FIELDS]
    return struct.calcsize("<" + "".join(codes[names.index(first) : names.index(last) + 1]))


def _field_sql(column: str, name: str) -> str:
    return f"substring({column} FROM {_offset(name) + 1} FOR {_width(name, name)})"


def _zeros(name: str) -> str:
    """The field ``name`` when unknown (all zero bytes), as a ``bytea`` value written with no
    backslash (``standard_conforming_strings = off`` read ``'\\x00'`` as a NUL and refused it)."""
    return f"decode('{'00' * _width(name, name)}', 'hex')"


def _sql_list(values: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(value) for value in values) + ")"


def place_key() -> bytes | None:
    """Our boot and PID namespace packed as in the details (their bytes after the version),
    for a database to compare; ``None`` when either is unknown."""
    boot, ns = this_boot(), this_pid_namespace()
    if boot is None or ns is None:
        return None
    return bytes.fromhex(boot) + _NS_LAYOUT.pack(ns)


def start_key(pid: int) -> bytes | None:
    """``pid``'s start time packed as in the details (for a database to compare); ``None``
    when it is not running or our ``/proc`` is not our namespace's."""
    current = proc_stat(pid) if this_pid_namespace() is not None else None
    return None if current is None else _START_LAYOUT.pack(current.start)


_FLAGS_AT: Final = DETAILS_LAYOUT.size
_SLOT_AT: Final = DETAILS_LAYOUT.size + 5  # after flags (1 byte) and sid (4 bytes)
_SLOT_LAYOUT: Final = struct.Struct("<I")
_TAIL_END: Final = DETAILS_LAYOUT.size + DETAILS_TAIL.size
_FOLDER_END: Final = _TAIL_END + FOLDER_FIELD.size
_TEXT_AT: Final = {2: _TAIL_END, DETAILS_VERSION: _FOLDER_END}
"""Where the host name starts, by the versions that have a tail."""
_PROOF_VERSIONS: Final = tuple(_TEXT_AT)
_NS_LAYOUT: Final = struct.Struct("<" + dict(_HEAD_FIELDS)["ns"])
"""The namespace field of ``DETAILS_LAYOUT``, alone."""
_START_LAYOUT: Final = struct.Struct("<" + dict(_HEAD_FIELDS)["start"])
"""The start-time field of ``DETAILS_LAYOUT``, alone."""


# --------------------------------------------------------------------------- the attribute


def attach(fd: int, raw: bytes | None) -> bytes | None:
    """Set the details on the not-yet-published file ``fd``; what was attached (``None``: this
    file system keeps no extended attributes, so the lock's owner details will be unknown)."""
    if not raw:
        return None
    try:
        os.setxattr(fd, XATTR_NAME, raw)
    except OSError as error:
        if error.errno not in _NO_XATTR_ERRNOS:
            raise
        return None
    return raw


def read_attached(fd: int) -> bytes | None:
    """The details on the file ``fd`` that was just read; ``None`` when there are none."""
    try:
        raw = os.getxattr(fd, XATTR_NAME)
    except OSError:
        return None  # none, no support, or a failed look: unknown details are always safe
    return raw if len(raw) <= MAX_DETAILS_BYTES else None
