"""Who owns a lock: owner details packed in the extended attribute ``user.mahabharatha.owner``,
set before the file is linked to ``.lock``, so a reader sees record and details together or not
at all. Layout and judgement: ``design/lockfile-hardening.md`` sections 12-14."""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Callable, Iterator, Sequence
from functools import cache
from typing import Final, NamedTuple, TypeGuard

XATTR_NAME: Final = "user.mahabharatha.owner"  # user.*: no privilege needed
DETAILS_VERSION: Final = 3  # an unknown first byte reads as no details at all
DETAILS_VERSIONS: Final = (1, 2, DETAILS_VERSION)
# The head's first fields by name: DETAILS_LAYOUT and could_own_sql are both made from it.
_HEAD_FIELDS: Final = (("version", "B"), ("boot", "8s"), ("ns", "I"), ("start", "Q"))
# The head every version shares: the fields above, process group, group leader start.
DETAILS_LAYOUT: Final = struct.Struct("<" + "".join(code for _, code in _HEAD_FIELDS) + "IQ")
DETAILS_TAIL: Final = struct.Struct("<BII")  # versions 2 and 3: flags, session id, proof slot
FOLDER_FIELD: Final = struct.Struct("<I")  # version 3: the proof file's tag (folder_tag)
PROOF_FLAG: Final = 0x01  # the holder holds its proof of life (published with the lock)
WORK_GROUP_FLAG: Final = 0x02  # pgid/gstart: the group lock run made for its command
INLINE_BYTES: Final = 52  # the largest value ext4 (256-byte inodes) keeps inside the inode
MAX_DETAILS_BYTES: Final = 512  # with lock run's command; longer is not ours (bounded reads)
MAX_COMMAND_CHARS: Final = 256  # shown to people, never parsed
MAX_STAT_BYTES: Final = 4096  # /proc/<pid>/stat is one line of about 300 bytes

# What a file system without (user) extended attributes, or one that is full, answers.
_NO_XATTR_ERRNOS: Final = frozenset(
    {errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM, errno.E2BIG, errno.ENOSPC, errno.EDQUOT}
)


class OwnerDetails(NamedTuple):
    """What the details say (``None``: unknown); a named tuple, cheap for the CLI's cold start."""

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
    """The fields of ``/proc/<pid>/stat`` the judgements need."""

    state: str  # R, S, D, Z (zombie), X (dead), ...
    pgrp: int
    start: int  # clock ticks after boot
    session: int = 0


@cache
def this_boot() -> str | None:
    """This boot's id (16 hex digits); ``None`` off Linux, and then no pid is judged dead."""
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
    """Our PID namespace's inode; ``None``: ``/proc`` is another namespace's (not to judge by)."""
    try:
        if int(os.readlink("/proc/self")) != os.getpid() or boottime_offset_ticks() is None:
            return None  # the pids, or the start times, read here could not be compared
        return os.stat(_OWN_PID_NS).st_ino
    except (OSError, ValueError):
        return None


_OWN_TIME_NS: Final = _OWN_PID_NS.replace("/pid", "/time")
INITIAL_TIME_NS_INODE: Final = 0xEFFFFFFA  # the kernel's PROC_TIME_INIT_INO


@cache
def boottime_offset_ticks() -> int | None:
    """Our time namespace's boot-time offset in clock ticks (0 in the initial one; ``None``:
    not known exactly). Race: another time namespace reads a live owner's start time shifted."""
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
    """This host's name (``socket.gethostname()``'s answer, without importing ``socket``)."""
    return os.uname().nodename


def proc_stat(pid: int) -> ProcStat | None:
    """State, process group and start time of ``pid``; ``None`` when there is no such process."""
    stat = _read_stat(f"/proc/{pid}/stat")
    offset = boottime_offset_ticks()
    if stat is None or not offset:
        return stat
    return stat._replace(start=stat.start - offset)  # as the initial time namespace sees it


def _read_stat(path: str) -> ProcStat | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            raw = os.read(fd, MAX_STAT_BYTES)
        finally:
            os.close(fd)
    except OSError:
        return None  # none; Race: the process (or thread) was reaped between open and read
    # The command name (field 2) may hold spaces and parentheses: split after the last ")".
    fields = raw.rpartition(b")")[2].split()
    try:
        return ProcStat(fields[0].decode("ascii"), int(fields[2]), int(fields[19]), int(fields[3]))
    except (IndexError, ValueError, UnicodeDecodeError):
        return None


def is_alive(stat: ProcStat | None, pid: int) -> bool:
    """Alive while any of its threads runs (a leader after ``pthread_exit`` shows as a zombie)."""
    if stat is None or stat.state not in ("Z", "X"):
        return stat is not None
    try:
        tasks = [tid for tid in os.listdir(f"/proc/{pid}/task") if tid.isdigit()]
    except OSError:
        return False
    # Race: a thread that ended since the listing reads as None.
    threads = (_read_stat(f"/proc/{pid}/task/{tid}/stat") for tid in tasks)
    return any(task is not None and task.state not in ("Z", "X") for task in threads)


def group_has_live_member(pgid: int, leader_start: int | None, since: int | None = None) -> bool:
    """Is a process of group ``pgid`` (leader started at ``leader_start``: else it ended) alive,
    zombies aside? ``since``: only members started then or later, never the caller (the
    command's work, not an older script sharing a terminal job's group)."""
    try:
        os.killpg(pgid, 0)
        others_only = False
    except ProcessLookupError:
        return False  # no process at all is in that group
    except PermissionError:
        others_only = True  # members exist, every one another user's: look at them
    except OSError:
        return True  # the look failed: never call an owner dead on it
    leader = proc_stat(pgid)
    if leader is not None and leader.pgrp == pgid:
        if leader_start not in (None, leader.start):
            return False  # Race: group ended and its number was reused by a new leader
        if since is None and is_alive(leader, pgid):
            return True
    return _scan_for_member(pgid, unseen_alive=others_only, since=since)


_STOPPED_STATES: Final = frozenset({"T", "t"})  # stopped by a signal; stopped by a tracer


def holder_stopped(pid: int, details: OwnerDetails | None) -> bool:
    """Is the holder ``pid`` or its command group's leader, as recorded, stopped (SIGSTOP, ^Z)?"""
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
    """Is a process of session ``sid`` alive (zombies aside; a failed look: alive)?"""
    try:
        return sid > 0 and any(s.session == sid and is_alive(s, pid) for pid, s in _processes())
    except OSError:
        return True  # cannot tell: alive


def _processes() -> Iterator[tuple[int, ProcStat]]:
    for pid in [int(name) for name in os.listdir("/proc") if name.isdigit()]:
        if (stat := proc_stat(pid)) is not None:
            yield pid, stat


def _scan_for_member(pgid: int, *, unseen_alive: bool, since: int | None) -> bool:
    """A live member of ``pgid`` in ``/proc``? ``unseen_alive``: none seen means hidden: alive."""
    seen = False
    try:
        for pid, stat in _processes():
            if stat.pgrp != pgid:
                continue
            seen = True
            if since is not None and (stat.start < since or pid == os.getpid()):
                continue  # a member, but not the work: not hidden either
            if is_alive(stat, pid):
                return True
    except OSError:
        return True  # cannot tell: alive
    # Race: /proc mounted hidepid=1/2 hides another user's live members from a judge.
    return unseen_alive and not seen


def pid_exists(pid: int) -> bool:
    """Is there a process ``pid`` (a zombie too)? Only ``ESRCH`` says no."""
    if pid <= 0:
        return False  # kill(0) and kill(-1) would ask about groups, not about this pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # EPERM: it exists, another user's
    return True


def details_of(pid: int, command: Sequence[str] | None = None) -> bytes:
    """The owner details to publish for ``pid`` (a process visible to us, or already gone)."""
    if command is None and pid == os.getpid():
        return _own_details(pid, os.getpgrp())  # the legacy hot path: computed once
    return _encode(_collect(pid, command))


@cache
def _own_details(pid: int, pgrp: int) -> bytes:
    return _encode(_collect(pid, None))  # keyed by pid and group: a fork or setsid gets its own


def command_name_only(raw: bytes | None) -> bytes | None:
    """``raw`` with its command cut to the program's name (no arguments where all may read)."""
    details = decode(raw)
    if details is None or details.cmd is None:
        return raw
    program = details.cmd.split(" ", 1)[0].rsplit("/", 1)[-1]
    return _encode(details._replace(cmd=program))


def claimed_proof(raw: bytes | None) -> tuple[int, int | None] | None:
    """The proof slot ``raw`` claims and its proof file's tag, without decoding; ``None``: none."""
    if raw is None or len(raw) < _TAIL_END or raw[0] not in _PROOF_VERSIONS:
        return None
    slot = _SLOT_LAYOUT.unpack_from(raw, _SLOT_AT)[0] if raw[_FLAGS_AT] & PROOF_FLAG else 0
    if not slot:
        return None
    tagged = len(raw) >= _FOLDER_END and raw[0] == DETAILS_VERSION
    tag = FOLDER_FIELD.unpack_from(raw, _TAIL_END)[0] if tagged else 0
    return slot, tag or None


def folder_tag(dev: int, ino: int) -> int:
    """A proof file's identity in four bytes, never 0 ("not recorded")."""
    return ((ino ^ (dev * 0x9E3779B1)) & 0xFFFF_FFFF) or 1


def with_proof(raw: bytes | None, slot: int, folder: int = 0) -> bytes | None:
    """``raw`` (current version) claiming ``slot`` of the proof file tagged ``folder``."""
    if not raw or len(raw) < _FOLDER_END or raw[0] != DETAILS_VERSION:
        return raw
    flags = bytes([raw[_FLAGS_AT] | PROOF_FLAG])
    proof = _SLOT_LAYOUT.pack(slot) + FOLDER_FIELD.pack(folder)
    return raw[:_FLAGS_AT] + flags + raw[_FLAGS_AT + 1 : _SLOT_AT] + proof + raw[_FOLDER_END:]


def _collect(pid: int, command: Sequence[str] | None) -> OwnerDetails:
    cmd = None if command is None else _command_line(command)
    place = (this_boot(), this_pid_namespace())
    owner = proc_stat(pid) if place[1] is not None else None
    if owner is None:  # gone, hidden (hidepid) or /proc is not ours: no start time known
        # Race: a writer that cannot read its short-lived parent (hidepid=2, sudo to a service
        # account) records the group and session the kernel tells: they outlive that parent.
        group, session = _ask_kernel(os.getpgid, pid), _ask_kernel(os.getsid, pid)
        return OwnerDetails(*place, host=host_name(), cmd=cmd, pgid=group, sid=session)
    leader = owner if owner.pgrp == pid else proc_stat(owner.pgrp)
    leader_start = leader.start if leader is not None and leader.pgrp == owner.pgrp else None
    sid = owner.session or None
    return OwnerDetails(*place, owner.start, owner.pgrp, leader_start, host_name(), cmd, sid)


def _ask_kernel(question: Callable[[int], int], pid: int) -> int | None:
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
    flags = (PROOF_FLAG if details.proof else 0) | (WORK_GROUP_FLAG if details.work_group else 0)
    boot = bytes.fromhex((details.boot or "").replace("-", "")[:16].ljust(16, "0"))
    numbers = (details.ns, details.start, details.pgid, details.gstart)
    head = DETAILS_LAYOUT.pack(DETAILS_VERSION, boot, *(number or 0 for number in numbers))
    head += DETAILS_TAIL.pack(flags, details.sid or 0, details.slot or 0)
    head += FOLDER_FIELD.pack(details.folder or 0)
    host = (details.host or "").encode("utf-8", "replace")[: INLINE_BYTES - len(head)]
    host = host.decode("utf-8", "ignore").encode()  # never cut a character in two
    if details.cmd is None:
        return head + host
    return (head + host + b"\0" + details.cmd.encode("utf-8", "replace"))[:MAX_DETAILS_BYTES]


def with_work_group(raw: bytes | None, pgid: int, leader_start: int | None) -> bytes | None:
    """``raw`` (current version) naming ``pgid`` as the holder's command group; else as is."""
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
        return False  # asks nothing of /proc: no place recorded
    return (details.boot, details.ns) == (this_boot(), this_pid_namespace())


def _records_place(details: OwnerDetails | None) -> TypeGuard[OwnerDetails]:
    return details is not None and details.boot is not None and details.ns is not None


def start_time(pid: int, *, leading: bool = False) -> int | None:
    """``pid``'s start time; with ``leading``, only while it leads its group (``None``: gone)."""
    stat = proc_stat(pid)
    return None if stat is None or (leading and stat.pgrp != pid) else stat.start


_own_start: Final = cache(start_time)  # keyed by pid: a forked child asks under its own


def _start_of(pid: int) -> int | None:
    return _own_start(pid) if pid == os.getpid() else start_time(pid)


def could_own(details: OwnerDetails | None, pid: int) -> bool:
    """May ``pid`` be the owner these details record? No for another boot or namespace or a reused
    pid (another start time); without details the pid decides (SQL: :func:`could_own_sql`)."""
    return could_be_owner(details, this_boot(), this_pid_namespace(), lambda: _start_of(pid))


def could_be_owner(
    details: OwnerDetails | None,
    boot: str | None,
    ns: int | None,
    start_now: Callable[[], int | None],
) -> bool:
    """:func:`could_own` judged on ``boot`` and namespace ``ns``, the pid's start time now being
    ``start_now()`` (asked only when needed; ``None``: not running)."""
    if not _records_place(details):
        return True
    if (details.boot, details.ns) != (boot, ns):  # recorded, so neither is None when equal
        return False
    start = None if details.start is None else start_now()
    return start is None or start == details.start


def could_own_sql(column: str) -> str:
    """:func:`could_own` as SQL on ``column`` (our name, never input) with ``%(place)s`` and
    ``%(start)s``; made from ``_HEAD_FIELDS``, never written by hand."""
    boot, ns, start = (_field_sql(column, name) for name in ("boot", "ns", "start"))
    version = f"get_byte({column}, 0)"
    old_versions = ", ".join(str(v) for v in DETAILS_VERSIONS if v not in _TEXT_AT)
    # decode(): a head of a version we read, and the later versions also have their tail.
    tails = "".join(
        f" OR ({version} = {number} AND length({column}) >= {end})"
        for number, end in _TEXT_AT.items()
    )
    ours = (
        f"{column} IS NOT NULL"
        f" AND length({column}) BETWEEN {DETAILS_LAYOUT.size} AND {MAX_DETAILS_BYTES}"
        f" AND ({version} IN ({old_versions}){tails})"
    )
    records_place = f"{ours} AND {boot} <> {_zeros('boot')} AND {ns} <> {_zeros('ns')}"
    place = _field_sql(column, "boot", "ns")
    same_start = f"(%(start)s::bytea IS NULL OR {start} IN ({_zeros('start')}, %(start)s::bytea))"
    return f"(NOT ({records_place}) OR ({place} = %(place)s::bytea AND {same_start}))"


def _span(first: str, last: str) -> tuple[int, int]:
    names, codes = zip(*_HEAD_FIELDS, strict=True)
    at, end = names.index(first), names.index(last) + 1
    return struct.calcsize("<" + "".join(codes[:at])), struct.calcsize("<" + "".join(codes[at:end]))


def _field_sql(column: str, first: str, last: str | None = None) -> str:
    offset, width = _span(first, last or first)
    return f"substring({column} FROM {offset + 1} FOR {width})"


def _zeros(name: str) -> str:
    """Field ``name`` as zero bytes in ``bytea``, no backslash (``standard_conforming_strings``)."""
    return f"decode('{'00' * _span(name, name)[1]}', 'hex')"


def place_key() -> bytes | None:
    """Our boot and PID namespace packed as in the details; ``None`` when either is unknown."""
    boot, ns = this_boot(), this_pid_namespace()
    return None if boot is None or ns is None else bytes.fromhex(boot) + _NS_LAYOUT.pack(ns)


def start_key(pid: int) -> bytes | None:
    """``pid``'s start time packed as in the details; ``None`` when it cannot be read."""
    start = start_time(pid) if this_pid_namespace() is not None else None
    return None if start is None else _START_LAYOUT.pack(start)


_FLAGS_AT: Final = DETAILS_LAYOUT.size
_SLOT_AT: Final = DETAILS_LAYOUT.size + 5  # after flags (1 byte) and sid (4 bytes)
_SLOT_LAYOUT: Final = struct.Struct("<I")
_TAIL_END: Final = DETAILS_LAYOUT.size + DETAILS_TAIL.size
_FOLDER_END: Final = _TAIL_END + FOLDER_FIELD.size
_TEXT_AT: Final = {2: _TAIL_END, DETAILS_VERSION: _FOLDER_END}  # where the host name starts
_PROOF_VERSIONS: Final = tuple(_TEXT_AT)
_NS_LAYOUT: Final = struct.Struct("<" + dict(_HEAD_FIELDS)["ns"])
_START_LAYOUT: Final = struct.Struct("<" + dict(_HEAD_FIELDS)["start"])


def attach(fd: int, raw: bytes | None) -> bytes | None:
    """Set the details on the unpublished file ``fd``; what was attached (``None``: none)."""
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
    """The details on the file ``fd``; ``None`` when there are none."""
    try:
        raw = os.getxattr(fd, XATTR_NAME)
    except OSError:
        return None  # none, no support, or a failed look: unknown details are always safe
    return raw if len(raw) <= MAX_DETAILS_BYTES else None
