"""Feature locks for long-lived holders, waiters, worker pools and maintenance.

This layer sits on the hardened primitives of :mod:`mahabharatha.commands._utils` and adds what
the legacy functions cannot: an explicit owner pid (a CLI process records the shell that called
it), waiting with backoff, a heartbeat that keeps a long-held lock fresh, owner liveness, a
listing of every lock, a race-free clean-up and an audit trail. It never touches ``.lock``
itself: every read, publish, reclaim, refresh and removal goes through ``_utils``.

Typical use::

    with FeatureLock("auth-flow", timeout=30):
        ...  # exclusive work; the lock is refreshed in the background

Errors derive from :class:`LockError`; OS trouble (permissions, a directory or a symlinked
folder in the way) stays an :class:`OSError`.
"""

from __future__ import annotations

import errno
import json
import math
import os
import random
import signal
import stat
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from time import gmtime, monotonic, sleep, strftime
from types import TracebackType
from typing import Any, Final, Self

from mahabharatha import ownership
from mahabharatha.backends.base import (
    AlreadyHeldError,
    CleanedEntry,
    FeatureProblem,
    HeartbeatStartError,
    LockError,
    LockHeldError,
    LockInfo,
    LockLostError,
    LockTimeoutError,
    NotHeldError,
    NotOwnerError,
    Owner,
    owner_is_gone,
)
from mahabharatha.commands import _utils
from mahabharatha.commands._utils import (
    STALE_AFTER_SECONDS,
    AcquireOutcome,
    EntryKind,
    LockSnapshot,
    LockState,
    ReleaseOutcome,
    UnsafeLockPathError,
    _validate_feature_name,
    age_only,
    feature_dir_path,
    judge_lock,
    open_feature_dir,
    read_lock,
)
from mahabharatha.constants import GSD_DIR

__all__ = [
    "AUDIT_LOG_NAME",
    "COMPLETED_MARKER_NAME",
    "HEARTBEAT_SECONDS",
    "AlreadyHeldError",
    "CleanedEntry",
    "FeatureLock",
    "FeatureProblem",
    "HeartbeatStartError",
    "LockError",
    "LockHeldError",
    "LockInfo",
    "LockLostError",
    "LockTimeoutError",
    "NotHeldError",
    "NotOwnerError",
    "Owner",
    "UnsafeLockPathError",
    "acquire",
    "claim",
    "clean",
    "done",
    "inspect",
    "is_done",
    "owner_is_gone",
    "owner_liveness",
    "release",
    "reopen",
    "status",
    "survey",
]

HEARTBEAT_SECONDS: Final = 30.0
"""How often a holder rewrites its timestamp: far inside the 2-hour stale limit, and at least
every 60 s as the contract asks, so a clock jump of a minute cannot make a live lock stale."""

BACKOFF_FIRST_SECONDS: Final = 0.002
BACKOFF_MAX_SECONDS: Final = 0.025
"""Waiters poll from 2 ms up to 25 ms apart (jittered): a released lock is taken within tens
of milliseconds, and a crowd of waiters does not poll in step."""

PATIENT_AFTER_SECONDS: Final = 10.0
PATIENT_MAX_SECONDS: Final = 0.25
"""After 10 s of waiting, poll at most 4 times a second: a holder that has kept the lock this
long is not about to hand it over, and a waiter left for an hour should cost no CPU."""

CREATE_TIME_SLACK_SECONDS: Final = 1.0
"""Process start times are known to a clock tick; a process that started within a second
before the lock's timestamp may be its writer."""

AUDIT_LOG_NAME: Final = "lock-audit.jsonl"
"""One JSON line per reclaim, forced release and clean, in the gsd folder."""

COMPLETED_MARKER_NAME: Final = ".completed"
"""A finished feature's marker in its folder (an ISO-8601 time, like the repository's other
sentinels ``.started`` and ``.plan-complete``): ``claim`` never hands such a feature out."""

DEFERRED_SIGNALS: Final[tuple[int, ...]] = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGALRM,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
"""Signals whose Python handlers may raise (KeyboardInterrupt, a caller's own exception): held
back while a lock is being published, so an interrupted acquire never strands its lock."""


# --------------------------------------------------------------------------- errors


# --------------------------------------------------------------------------- facts about locks


ProcessFacts = tuple[bool, int | None]
"""(alive here, start time in clock ticks after boot) of a pid, from ``/proc/<pid>/stat``."""

OwnerDetails = ownership.OwnerDetails


def _process_facts(pid: int) -> ProcessFacts:
    """Is ``pid`` alive (any of its threads: a main thread that exited leaves a zombie leader
    whose other threads run on), and when did it start?"""
    stat = ownership.proc_stat(pid)
    if stat is None or not ownership.is_alive(stat, pid):
        return False, None
    return True, stat.start


def _started_after(started: int, timestamp: float) -> bool:
    import psutil  # only on this rare path: keeps the CLI's cold start short

    since_boot = started / os.sysconf("SC_CLK_TCK")
    return psutil.boot_time() + since_boot > timestamp + CREATE_TIME_SLACK_SECONDS


def _owner(facts: ProcessFacts, timestamp: float | None, details: OwnerDetails) -> Owner:
    """The recorded pid's own fate (its group is asked separately)."""
    running, started = facts
    if not running:
        return Owner.NOT_RUNNING
    if started is None:
        return Owner.RUNNING
    if details.start is not None:  # exact: the owner's start time was recorded with the lock
        return Owner.RUNNING if started == details.start else Owner.PID_REUSED
    # The owner was not visible when the lock was written (``--pid`` of a gone process).
    if timestamp is not None and _started_after(started, timestamp):
        return Owner.PID_REUSED  # this pid's process began after the lock was written
    return Owner.RUNNING


def _judge(
    pid: int, timestamp: float | None, details: OwnerDetails | None, facts: ProcessFacts
) -> Owner:
    """The owner judgement of the contract: only on our own boot and PID namespace; alive
    while any process of the group it took the lock in is alive."""
    if details is None or not ownership.judgeable(details):
        return Owner.UNKNOWN  # another boot, namespace or host, or an older writer: age decides
    verdict = _owner(facts, timestamp, details)
    if verdict is Owner.RUNNING or details.pgid is None:
        return verdict
    # Race: a SIGKILLed ``lock run`` whose command (or its children) still works: not dead.
    if ownership.group_has_live_member(details.pgid, details.gstart):
        return Owner.RUNNING
    return verdict


def owner_liveness(
    pid: int | None, timestamp: float | None, details: OwnerDetails | None = None
) -> Owner:
    """Is the lock's owner alive? ``unknown`` unless its ``details`` show our boot and PID
    namespace (a pid means nothing on another host, boot or namespace)."""
    if pid is None or not ownership.judgeable(details):
        return Owner.UNKNOWN
    return _judge(pid, timestamp, details, _process_facts(pid))


def _describe(
    feature: str,
    snapshot: LockSnapshot,
    state: LockState,
    now: float,
    liveness: Callable[[int | None, float | None, OwnerDetails | None], Owner]
    | None = owner_liveness,
) -> LockInfo:
    record = snapshot.record
    pid, timestamp = record if record else (None, None)
    if timestamp is not None:
        age: float | None = max(0.0, now - timestamp)
    elif snapshot.kind is EntryKind.MISSING:
        age = None
    else:
        age = max(0.0, now - snapshot.mtime)
    expires = (
        max(0.0, STALE_AFTER_SECONDS - (now - timestamp))
        if state is LockState.ACTIVE and timestamp is not None
        else None
    )
    owner = (
        liveness(pid, timestamp, snapshot.owner_details)
        if liveness and pid is not None
        else Owner.UNKNOWN
    )
    return LockInfo(feature, state.value, pid, timestamp, age, expires, owner.value)


def inspect(feature: str, gsd_dir: str | os.PathLike[str] = GSD_DIR) -> LockInfo:
    """The lock on ``feature``: state ``free`` when there is none.

    Raises ``UnsafeLockPathError`` when a symlink or a file stands where the feature folder
    should be, or a directory where the lock should be: acquire would fail there too.
    """
    _validate_feature_name(feature)
    with open_feature_dir(gsd_dir, feature, create=False, refuse=True) as dfd:
        snapshot = _utils.MISSING if dfd is None else read_lock(dfd)
    if snapshot.kind is EntryKind.DIRECTORY:
        raise _directory_in_the_way(gsd_dir, feature)
    now = _utils.now()
    return _describe(feature, snapshot, judge_lock(snapshot, now), now)


def _feature_names(gsd_dir: str | os.PathLike[str]) -> list[str]:
    """Names of the real (not symlinked) feature folders under ``<gsd>/specs``, sorted."""
    return [feature for feature, _ in _utils.scan_locks(gsd_dir, read=False)]


class _Problems:
    """Where a maintenance call puts the features it skipped: the caller's list, or (for a
    caller that gave none) its own, whose first problem is raised once the rest is done."""

    def __init__(self, gsd_dir: str | os.PathLike[str], sink: list[FeatureProblem] | None) -> None:
        self.gsd_dir = gsd_dir
        self.raise_first = sink is None
        self.found: list[FeatureProblem] = [] if sink is None else sink

    def add(self, feature: str, error: OSError) -> None:
        path = error.filename or feature_dir_path(self.gsd_dir, feature)
        self.found.append(FeatureProblem(feature, str(path), error))

    def settle(self) -> None:
        if self.raise_first and self.found:
            raise self.found[0].error


def status(
    gsd_dir: str | os.PathLike[str] = GSD_DIR,
    *,
    problems: list[FeatureProblem] | None = None,
) -> list[LockInfo]:
    """Every feature folder under ``<gsd>/specs`` that has a ``.lock`` entry, by name.

    A folder that cannot be looked into is skipped and added to ``problems`` (without that
    list, its error is raised after the scan).
    """
    now = _utils.now()
    liveness = _per_pid(_process_facts)
    skipped = _Problems(gsd_dir, problems)
    infos = [
        _describe(feature, snapshot, judge_lock(snapshot, now), now, liveness)
        for feature, snapshot in _utils.scan_locks(gsd_dir, on_error=skipped.add)
        if snapshot.kind is not EntryKind.MISSING
    ]
    skipped.settle()
    return infos


def _per_pid(
    facts_of: Callable[[int], ProcessFacts],
) -> Callable[[int | None, float | None, OwnerDetails | None], Owner]:
    """Ask the process table once per pid (many locks share few owners), judge each lock's
    details against the answer."""
    seen: dict[int, ProcessFacts] = {}

    def liveness(pid: int | None, timestamp: float | None, details: OwnerDetails | None) -> Owner:
        if pid is None or not ownership.judgeable(details):
            return Owner.UNKNOWN
        if pid not in seen:
            seen[pid] = facts_of(pid)
        return _judge(pid, timestamp, details, seen[pid])

    return liveness


# --------------------------------------------------------------------------- the audit trail


def _audit(gsd_dir: str | os.PathLike[str], action: str, feature: str, **facts: Any) -> None:
    """Append one JSON line; a lock operation never fails because its log could not be written."""
    entry = {
        "time": _utils.now(),
        "feature": feature,
        "action": action,
        "by_pid": os.getpid(),
        **facts,
    }
    line = (json.dumps(entry, sort_keys=True) + "\n").encode()
    # O_NONBLOCK: a FIFO put at the log's path must not hang the open (no reader: ENXIO).
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    with suppress(OSError):
        fd = os.open(Path(gsd_dir) / AUDIT_LOG_NAME, flags, 0o644)
        try:
            if _is_own_log(os.fstat(fd)):
                # O_APPEND: concurrent writers' lines never interleave (one small write each).
                os.write(fd, line)
        finally:
            os.close(fd)


def _is_own_log(info: os.stat_result) -> bool:
    """A log file of its own: not a FIFO or a device, and not a hard link to a file elsewhere
    (``ln outside.txt <gsd>/lock-audit.jsonl`` would make us append to ``outside.txt``)."""
    return stat.S_ISREG(info.st_mode) and info.st_nlink == 1


def _old_record(snapshot: LockSnapshot | None) -> str | None:
    if snapshot is None or snapshot.content is None:
        return None
    return snapshot.content[:200].decode("utf-8", "replace")


# --------------------------------------------------------------------------- acquiring


def _dead_owner_rule(snapshot: LockSnapshot, state: LockState) -> bool:
    """``--reclaim-dead``: also reclaim an active lock whose owner is provably gone here."""
    if age_only(snapshot, state):
        return True
    record = snapshot.record
    if state is not LockState.ACTIVE or record is None:
        return False
    verdict = owner_liveness(*record, snapshot.owner_details)
    return verdict in (Owner.NOT_RUNNING, Owner.PID_REUSED)


def _reclaim_reason(outcome: AcquireOutcome) -> str:
    if outcome.replaced_state is LockState.ACTIVE:
        return "owner-dead"
    return outcome.replaced_state.value if outcome.replaced_state else "unknown"


def _try_once(
    feature: str,
    gsd_dir: str | os.PathLike[str],
    pid: int,
    reclaim_dead: bool,
    details: bytes | None = None,
) -> tuple[AcquireOutcome, float]:
    now = _utils.now()
    rule = _dead_owner_rule if reclaim_dead else age_only
    with open_feature_dir(gsd_dir, feature, create=True) as dfd:
        assert dfd is not None
        outcome = _utils.try_acquire(dfd, pid, now, rule, details)
    if outcome.replaced is not None:
        _audit(
            gsd_dir,
            "reclaim",
            feature,
            old_record=_old_record(outcome.replaced),
            new_owner=pid,
            reason=_reclaim_reason(outcome),
        )
    return outcome, now


def _held_by(outcome: AcquireOutcome, callers: set[int]) -> bool:
    """Is the active lock that stopped us the caller's own (judged by the pid)?"""
    record = outcome.holder.record
    return outcome.state is LockState.ACTIVE and record is not None and record[0] in callers


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold back the Python handlers of :data:`DEFERRED_SIGNALS` for the block, then run them.

    Only the main thread runs Python signal handlers, so only there can a ``KeyboardInterrupt``
    land between the ``link()`` that publishes our lock and the return that hands it over.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []

    def remember(signum: int, _frame: object) -> None:
        caught.append(signum)

    saved: dict[int, Any] = {}
    signum: int
    try:
        for signum in DEFERRED_SIGNALS:
            handler = signal.getsignal(signum)
            if callable(handler):  # SIG_DFL / SIG_IGN raise nothing in Python: leave them be
                saved[signum] = signal.signal(signum, remember)
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
        for signum in caught:
            saved[signum](signum, None)  # may raise: the caller's frame knows what it holds now


def _try_uninterrupted(
    feature: str,
    gsd_dir: str | os.PathLike[str],
    pid: int,
    reclaim_dead: bool,
    details: bytes | None = None,
) -> tuple[AcquireOutcome, float]:
    """One try whose lock, if it took one, is either returned or removed again, even when a
    signal handler raises: it never stays on disk unknown to the caller."""
    outcome: AcquireOutcome | None = None
    try:
        with _signals_deferred():
            # Race: Ctrl-C right after link() published our lock: deferred to the end of this
            # block, by when ``outcome`` knows the exact lock to take back.
            outcome, now = _try_once(feature, gsd_dir, pid, reclaim_dead, details)
    except BaseException:
        if outcome is not None and outcome.mine is not None:
            with _signals_deferred():  # a second Ctrl-C must not cut the take-back short
                _release_exactly(gsd_dir, feature, outcome.mine)
        raise
    return outcome, now


def _release_exactly(gsd_dir: str | os.PathLike[str], feature: str, mine: LockSnapshot) -> None:
    """Remove the very lock ``mine`` if it is still on disk; any other lock stays."""
    with open_feature_dir(gsd_dir, feature, create=False) as dfd:
        if dfd is not None:
            _utils.release_mine(dfd, mine)


def _backoff_delays() -> Iterator[float]:
    """Exponential backoff with jitter: 2 ms, 4 ms, ... 25 ms; 250 ms once the wait is long."""
    started = monotonic()
    ceiling = BACKOFF_FIRST_SECONDS
    while True:
        yield random.uniform(ceiling / 2, ceiling)
        patient = monotonic() - started > PATIENT_AFTER_SECONDS
        ceiling = min(ceiling * 2, PATIENT_MAX_SECONDS if patient else BACKOFF_MAX_SECONDS)


WaitCallback = Callable[[LockInfo, float | None], None]
"""Called while waiting with the holder's info and the seconds left (``None``: no limit)."""


def acquire(
    feature: str,
    gsd_dir: str | os.PathLike[str] = GSD_DIR,
    *,
    pid: int | None = None,
    timeout: float | None = 0.0,
    reclaim_dead: bool = False,
    on_wait: WaitCallback | None = None,
    command: Sequence[str] | None = None,
    caller_pids: Iterable[int] = (),
) -> LockSnapshot:
    """Make ``pid`` (default: this process) the holder of ``feature``; return its lock.

    ``timeout`` 0 tries once, ``None`` waits for ever, otherwise waits that many seconds.
    ``command``: what the owner runs under the lock (``lock run``), kept in its owner details.
    Raises :class:`LockHeldError` (``LockTimeoutError`` after a wait) when it stays held,
    :class:`AlreadyHeldError` at once when ``pid`` itself holds it, or one of ``caller_pids``
    (``lock run`` records itself, but the shell that called it is the caller too): not
    reentrant, and never waiting for itself. ``ValueError`` for a bad name, pid or timeout
    (negative, ``nan`` or ``inf``: unlike filelock, ``-1`` does not mean "for ever" here; pass
    ``None``), and ``OSError`` for trouble on disk. An acquire interrupted by a signal
    (``KeyboardInterrupt``) never leaves its lock behind.
    """
    _validate_feature_name(feature)
    _valid_timeout(timeout)
    owner = os.getpid() if pid is None else _valid_pid(pid)
    timeout = _valid_seconds("timeout", timeout)
    details = ownership.details_of(owner, command)
    callers = {owner, *caller_pids}
    deadline = None if timeout is None else monotonic() + max(0.0, timeout)
    delays = _backoff_delays()
    while True:
        outcome, now = _try_uninterrupted(feature, gsd_dir, owner, reclaim_dead, details)
        if outcome.mine is not None:
            return outcome.mine
        info = _describe(feature, outcome.holder, outcome.state, now, liveness=None)
        if _held_by(outcome, callers):
            raise AlreadyHeldError(info)  # waiting would wait for ourselves
        left = None if deadline is None else deadline - monotonic()
        if left is not None and left <= 0:
            # The answer judges the owner as status and check do (the polls above skip it:
            # asking the process table 50 times a second would cost the waiter its CPU).
            held = _describe(feature, outcome.holder, outcome.state, now)
            raise (LockTimeoutError if timeout else LockHeldError)(held)
        if on_wait is not None:
            on_wait(info, left)
        delay = next(delays)
        sleep(delay if left is None else min(delay, left))


def _valid_timeout(timeout: float | None) -> None:
    # A negative wait is refused rather than guessed at: filelock's users read -1 as "for
    # ever", others as "do not wait"; None (for ever) and 0 (once) say it plainly.
    if timeout is not None and timeout < 0:
        raise ValueError(
            f"Invalid timeout: {timeout} (seconds >= 0; 0 tries once, None waits for ever)"
        )


def _valid_seconds(name: str, value: float | None) -> float | None:
    """A duration given by a caller: ``None`` or a finite number of seconds.

    ``nan`` passes every ``<`` and ``>`` check (a heartbeat of ``nan`` busy-loops) and ``inf``
    means "for ever", which ``None`` already says: both are refused as bad input.
    """
    if value is not None and not math.isfinite(value):
        raise ValueError(f"Invalid {name}: {value!r} (must be a finite number of seconds)")
    return value


def _valid_pid(pid: int) -> int:
    if not 1 <= pid <= _utils.MAX_PID:
        raise ValueError(f"Invalid pid: {pid} (must be 1 to {_utils.MAX_PID})")
    return pid


def claim(
    features: Sequence[str] | None = None,
    gsd_dir: str | os.PathLike[str] = GSD_DIR,
    *,
    pid: int | None = None,
    reclaim_dead: bool = False,
    include_done: bool = False,
    problems: list[FeatureProblem] | None = None,
) -> str | None:
    """Acquire the first free feature of ``features`` (default: every feature folder, by name).

    Workers claiming at once never get the same feature: each try is a full acquire. A feature
    marked done (:func:`done`) is never returned unless ``include_done``: the marker is looked
    for again once the lock is held, and a done feature's lock is given straight back. A feature
    whose try fails with an OS error (a folder we may not enter) is skipped and added to
    ``problems``; without that list, the first such error is raised when nothing was claimed.
    """
    candidates = list(features) if features else _feature_names(gsd_dir)
    for feature in candidates:
        _validate_feature_name(feature)
    owner = os.getpid() if pid is None else _valid_pid(pid)
    skipped = _Problems(gsd_dir, problems)
    for feature in candidates:
        try:
            if _claim_one(feature, gsd_dir, owner, reclaim_dead, include_done):
                return feature
        except OSError as error:
            skipped.add(feature, error)
    skipped.settle()
    return None


def _claim_one(
    feature: str,
    gsd_dir: str | os.PathLike[str],
    owner: int,
    reclaim_dead: bool,
    include_done: bool,
) -> bool:
    """Try to make ``owner`` the holder of ``feature`` unless it is done; True if it now is."""
    if not include_done and is_done(feature, gsd_dir):
        return False  # cheap: most done features are skipped without touching their lock
    outcome, _ = _try_once(feature, gsd_dir, owner, reclaim_dead)
    if outcome.mine is None:
        return False
    return include_done or not _give_back_if_done(feature, gsd_dir, outcome.mine)


# --------------------------------------------------------------------------- done features


def _marker_present(dfd: int) -> bool:
    """Is there a completion marker (a regular file, not followed if a link) in the folder?"""
    try:
        info = os.stat(COMPLETED_MARKER_NAME, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(info.st_mode)


def is_done(feature: str, gsd_dir: str | os.PathLike[str] = GSD_DIR) -> bool:
    """Has ``feature`` been marked done (its folder holds a ``.completed`` marker)?"""
    _validate_feature_name(feature)
    with open_feature_dir(gsd_dir, feature, create=False) as dfd:
        return dfd is not None and _marker_present(dfd)


def _give_back_if_done(feature: str, gsd_dir: str | os.PathLike[str], mine: LockSnapshot) -> bool:
    """After winning ``feature``'s lock: if it is done, release the lock and say so."""
    with open_feature_dir(gsd_dir, feature, create=False) as dfd:
        # Race: a worker marked the feature done and released it between our first look and
        # our acquire. ``done`` publishes the marker before it releases, so now that we hold
        # the lock the marker is certainly visible if the feature was finished.
        if dfd is None or not _marker_present(dfd):
            return False
        _utils.release_mine(dfd, mine)
        return True


def _iso_time(epoch: float) -> str:
    # time.strftime, not datetime: the CLI's cold start pays for every module it imports.
    whole = int(epoch)
    return strftime("%Y-%m-%dT%H:%M:%SZ", gmtime(whole))


def _publish_marker(dfd: int, text: str) -> None:
    """Write ``text`` to a private temp in the folder, then rename it to the marker at once.

    Everything is relative to the folder's descriptor (opened without following a link), the
    temp is created ``O_EXCL | O_NOFOLLOW`` and ``rename`` replaces a link at the marker's name
    rather than following it: nothing is ever written through a symlink. A reader sees no
    marker or a whole one, never a half-written one.
    """
    temp = f"{COMPLETED_MARKER_NAME}.{os.getpid()}.{os.urandom(8).hex()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temp, flags, _utils.LOCK_MODE, dir_fd=dfd)
    try:
        try:
            _utils._write_all(fd, text.encode())
            os.fchmod(fd, _utils.LOCK_MODE)  # readable by every worker, whatever the umask
        finally:
            os.close(fd)
        os.rename(temp, COMPLETED_MARKER_NAME, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        with suppress(OSError):
            os.unlink(temp, dir_fd=dfd)
        raise


def done(
    feature: str,
    gsd_dir: str | os.PathLike[str] = GSD_DIR,
    *,
    pid: int | None = None,
) -> str:
    """Mark ``feature`` done and release ``pid``'s lock on it, in that order; return the time
    written to the marker (ISO-8601, UTC).

    Raises :class:`NotHeldError` (nothing written) when ``pid`` (default: this process) does
    not hold the lock, and :class:`NotOwnerError` when another owner does.
    """
    _validate_feature_name(feature)
    owner = os.getpid() if pid is None else _valid_pid(pid)
    with open_feature_dir(gsd_dir, feature, create=False, refuse=True) as dfd:
        if dfd is None:
            raise NotHeldError(feature, owner)
        now = _utils.now()
        with _utils.guard(dfd, wait=True):
            # Under the guard no reclaim, clean or release can remove the lock: the marker is
            # written only while the caller really holds it.
            mine = read_lock(dfd)
            record = mine.record
            if record is None or record[0] != owner:
                state = judge_lock(mine, now)
                if record is None or state is LockState.FREE:
                    raise NotHeldError(feature, owner)
                raise NotOwnerError(_describe(feature, mine, state, now))
            stamp = _iso_time(now)
            # Race: marker first, release second. A claimer that wins the lock after our
            # release is sure to see the marker, so a finished feature is never built again.
            _publish_marker(dfd, stamp + "\n")
        _utils.release_mine(dfd, mine)
    return stamp


def reopen(feature: str, gsd_dir: str | os.PathLike[str] = GSD_DIR) -> bool:
    """Remove ``feature``'s completion marker so that ``claim`` hands it out again; True if
    there was one. A lock on the feature is left as it is."""
    _validate_feature_name(feature)
    with open_feature_dir(gsd_dir, feature, create=False, refuse=True) as dfd:
        if dfd is None:
            return False
        try:
            os.unlink(COMPLETED_MARKER_NAME, dir_fd=dfd)  # the entry itself, never a target
        except FileNotFoundError:
            return False
    return True


def _unlocked_info(feature: str, gsd_dir: str | os.PathLike[str]) -> LockInfo:
    state = "done" if is_done(feature, gsd_dir) else "free"
    return LockInfo(feature, state, None, None, None, None, Owner.UNKNOWN.value)


def survey(
    gsd_dir: str | os.PathLike[str] = GSD_DIR, *, problems: list[FeatureProblem] | None = None
) -> list[LockInfo]:
    """Every feature folder, by name: its lock as :func:`status` lists it, or state ``done``
    (a completion marker and no lock) or ``free`` (neither). Folders that cannot be looked
    into are skipped and reported as :func:`status` does."""
    skipped = _Problems(gsd_dir, problems)
    locked = {info.feature: info for info in status(gsd_dir, problems=skipped.found)}
    unseen = set(_feature_names(gsd_dir)) - set(locked) - {p.feature for p in skipped.found}
    infos = list(locked.values())
    for name in unseen:
        try:
            infos.append(_unlocked_info(name, gsd_dir))
        except OSError as error:
            skipped.add(name, error)
    skipped.settle()
    return sorted(infos, key=lambda info: info.feature)


# --------------------------------------------------------------------------- releasing


def release(
    feature: str,
    gsd_dir: str | os.PathLike[str] = GSD_DIR,
    *,
    pid: int | None = None,
    force: bool = False,
) -> bool:
    """Remove ``pid``'s lock on ``feature``; True if a lock was removed, False if none.

    Another owner's lock (stale or not) raises :class:`NotOwnerError` and is left intact,
    unless ``force``. A corrupt or non-file entry is removed as clean-up.
    """
    _validate_feature_name(feature)
    owner = os.getpid() if pid is None else _valid_pid(pid)
    with open_feature_dir(gsd_dir, feature, create=False, refuse=True) as dfd:
        if dfd is None:
            return False
        now = _utils.now()
        outcome, snapshot = _utils.release_at(dfd, owner, now, force=force)
    if outcome is ReleaseOutcome.NOTHING:
        return False
    if outcome is ReleaseOutcome.RELEASED:
        record = snapshot.record
        if record is None or record[0] != owner:
            action = "forced-release" if record else "release-cleanup"
            _audit(
                gsd_dir,
                action,
                feature,
                old_record=_old_record(snapshot),
                new_owner=None,
                reason=judge_lock(snapshot, now).value,
            )
        return True
    if snapshot.kind is EntryKind.DIRECTORY:
        raise _directory_in_the_way(gsd_dir, feature)
    raise NotOwnerError(_describe(feature, snapshot, judge_lock(snapshot, now), now))


def _directory_in_the_way(gsd_dir: str | os.PathLike[str], feature: str) -> UnsafeLockPathError:
    path = feature_dir_path(gsd_dir, feature) / _utils.LOCK_FILE_NAME
    return UnsafeLockPathError(
        errno.EISDIR, f"{path}: a directory is in the way, not a lock file", str(path)
    )


# --------------------------------------------------------------------------- holding


class FeatureLock:
    """Hold a feature lock for a block, keeping it fresh with a background heartbeat.

    ``timeout``: seconds to wait for a busy lock; 0 tries once, ``None`` (the default) waits
    for ever; a negative, ``nan`` or infinite value is refused with ``ValueError`` (``-1`` is
    not "for ever"). ``heartbeat``: seconds between refreshes (``None`` for none). ``pid``: the
    owner to record (default: this process). ``reclaim_dead``: also take over a lock whose owner
    is provably gone on this host. ``on_wait(info, seconds_left)`` is called while waiting.
    If the lock is taken away (``release --force``), or refreshes keep failing until it turned
    stale, the heartbeat stops, :attr:`lost` is set and ``on_lost`` is called (from the
    heartbeat thread); :meth:`refresh` raises :class:`LockLostError`.

    Fork-safe: a child forked from the holder forgets the lock (it is the parent's) and gets a
    fresh mutex, so it never waits on one the heartbeat thread held at the fork.

    Attributes:
        lost: ``None`` while the lock is ours; the :class:`LockLostError` once the heartbeat
            found it taken away (``lock release --force``, a reclaim after it went stale).
            Check it after the block if the work must not have run unlocked.
        heartbeat_error: the last ``OSError`` of a refresh that will be retried, else None.
    """

    def __init__(
        self,
        feature: str,
        gsd_dir: str | os.PathLike[str] = GSD_DIR,
        *,
        pid: int | None = None,
        timeout: float | None = None,
        reclaim_dead: bool = False,
        heartbeat: float | None = HEARTBEAT_SECONDS,
        on_wait: WaitCallback | None = None,
        command: Sequence[str] | None = None,
        on_lost: Callable[[LockLostError], None] | None = None,
        caller_pids: Iterable[int] = (),
    ) -> None:
        _validate_feature_name(feature)
        _valid_timeout(timeout)
        self.feature = feature
        self.gsd_dir = gsd_dir
        self.pid = os.getpid() if pid is None else _valid_pid(pid)
        self.timeout = _valid_seconds("timeout", timeout)
        self.reclaim_dead = reclaim_dead
        self.heartbeat = _valid_seconds("heartbeat", heartbeat)
        if self.heartbeat is not None and self.heartbeat < 0:  # it would refresh in a busy loop
            raise ValueError(f"Invalid heartbeat: {heartbeat!r} (must be >= 0; 0 or None: none)")
        self.on_wait = on_wait
        self.command = command  # kept in the lock's owner details (``lock run``)
        self.on_lost = on_lost
        self.caller_pids = tuple(caller_pids)
        self.lost: LockLostError | None = None
        self.heartbeat_error: OSError | None = None
        self._mine: LockSnapshot | None = None
        self._holder_process: int | None = None  # a forked child shares this object, not the lock
        self._mutex = threading.Lock()  # heartbeat thread vs. release in the caller's thread
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        _LIVE_LOCKS.add(self)

    def _forget_after_fork(self) -> None:
        """In a freshly forked child (one thread, run by ``os.register_at_fork``): the mutex
        may have been held by the heartbeat thread, which does not exist here. (The lock itself
        is the parent's: ``_holder_process`` keeps the child's hands off it.)"""
        # Race: fork while the heartbeat held the mutex; the child's copy would stay locked.
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._beat = None

    @property
    def held(self) -> bool:
        """True while our lock is on disk, as far as we know, and not yet stale (and we are the
        process that took it, not a child forked from it)."""
        if self._holder_process != os.getpid():
            return False
        expires = self.expires_at
        return expires is not None and _utils.now() <= expires

    @property
    def expires_at(self) -> float | None:
        """When our lock turns stale unless refreshed (epoch seconds); None when not held.

        Past it, another process may rightly reclaim the lock: a holder whose heartbeat keeps
        failing has lost it even before a refresh tells it so.
        """
        record = None if self._mine is None else self._mine.record
        return None if record is None else record[1] + STALE_AFTER_SECONDS

    def __repr__(self) -> str:
        state = "lost" if self.lost else "held" if self.held else "not held"
        return (
            f"<{type(self).__name__} {self.feature!r} in {os.fspath(self.gsd_dir)!r} "
            f"pid={self.pid} {state}>"
        )

    def acquire(self) -> Self:
        """Take the lock (waiting as ``timeout`` says) and start the heartbeat; return self.

        Raises :class:`LockHeldError` when it is held by someone else (``LockTimeoutError``
        when a wait ran out), :class:`LockError` when this object already holds it,
        ``UnsafeLockPathError`` (an ``OSError``) when a symlink, a file or a directory stands
        where the feature folder or the lock should be, and ``OSError`` for other trouble on
        disk (permissions, a read-only or full file system).
        """
        if self._mine is not None:
            raise LockError(f"this FeatureLock already holds {self.feature!r}")
        self._holder_process = os.getpid()
        self._mine = acquire(
            self.feature,
            self.gsd_dir,
            pid=self.pid,
            timeout=self.timeout,
            reclaim_dead=self.reclaim_dead,
            on_wait=self.on_wait,
            command=self.command,
            caller_pids=self.caller_pids,
        )
        try:
            self.lost = None
            self._start_heartbeat()
        except BaseException:
            # Race: interrupted (or out of threads) with the lock taken: never leave it behind.
            self.release()
            raise
        return self

    def _start_heartbeat(self) -> None:
        if not self.heartbeat:
            return
        self._stop.clear()
        self._beat = threading.Thread(
            target=self._beat_loop, name=f"lock-heartbeat-{self.feature}", daemon=True
        )
        try:
            self._beat.start()
        except RuntimeError as error:  # "can't start new thread": a process or memory limit
            self._beat = None
            raise HeartbeatStartError(self.feature, str(error)) from error

    def _forget_if_forked(self) -> None:
        """In a child forked from the holder, this object's lock is the parent's: never touch it."""
        if self._holder_process != os.getpid():
            self._mine = None

    def refresh(self) -> None:
        """Rewrite our lock's timestamp now, atomically, if it is still ours."""
        with self._mutex:
            self._forget_if_forked()
            if self._mine is None:
                raise LockLostError(self.feature)
            record = _utils.format_record(self.pid, _utils.now())
            with open_feature_dir(self.gsd_dir, self.feature, create=False) as dfd:
                fresh = (
                    None if dfd is None else _utils.replace_if_unchanged(dfd, self._mine, record)
                )
            if fresh is None:
                self._mine = None
                raise LockLostError(self.feature)
            self._mine = fresh

    def _beat_loop(self) -> None:
        assert self.heartbeat is not None
        interval = self.heartbeat
        while not self._stop.wait(interval):
            try:
                self.refresh()
            except LockLostError as error:
                self._declare_lost(error)
                return
            except OSError as error:
                # A transient failure (busy guard, full disk): retry sooner, and keep the error
                # where the holder can see it; ``held`` turns False if the lock expires meanwhile.
                self.heartbeat_error = error
                interval = max(self.heartbeat / 4, 0.01)
                if self._expired():
                    reason = f"refreshes failed until the lock turned stale ({error})"
                    self._declare_lost(LockLostError(self.feature, reason))
                    return
                continue
            self.heartbeat_error, interval = None, self.heartbeat

    def _expired(self) -> bool:
        expires = self.expires_at
        return expires is not None and _utils.now() > expires

    def _declare_lost(self, error: LockLostError) -> None:
        self.lost = error
        if self.on_lost is not None:
            self.on_lost(error)

    def release(self) -> None:
        """Stop the heartbeat and remove our lock (only if it is still exactly ours).

        Does nothing when the lock is not held (never taken, released, lost, or held by the
        process this one was forked from), and never removes another owner's lock. Raises
        ``OSError`` when the lock cannot be removed just now (permissions, an I/O error, the
        folder's guard stayed busy); the lock is then still ours and release can be retried.
        """
        self._stop.set()
        if self._beat is not None and self._beat is not threading.current_thread():
            self._beat.join()
        self._beat = None
        with self._mutex:
            self._forget_if_forked()
            mine = self._mine
            if mine is None:
                return
            # On an error the lock stays ours (``_mine`` kept), so release can be tried again.
            with open_feature_dir(self.gsd_dir, self.feature, create=False) as dfd:
                if dfd is not None:
                    _utils.release_mine(dfd, mine)
            self._mine = None

    def __enter__(self) -> Self:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


_LIVE_LOCKS: Final[weakref.WeakSet[FeatureLock]] = weakref.WeakSet()
"""Every FeatureLock alive in this process, for the fork hook below (weak: no leak)."""


def _forget_locks_after_fork() -> None:
    for lock in list(_LIVE_LOCKS):
        lock._forget_after_fork()


os.register_at_fork(after_in_child=_forget_locks_after_fork)


# --------------------------------------------------------------------------- cleaning


def clean(
    gsd_dir: str | os.PathLike[str] = GSD_DIR,
    *,
    dry_run: bool = False,
    reclaim_dead: bool = False,
    features: Iterable[str] | None = None,
    problems: list[FeatureProblem] | None = None,
) -> list[CleanedEntry]:
    """Remove stale, corrupt and non-file lock entries and orphan temp files; leave live locks.

    Each removal re-checks, under the folder's guard, that the entry is the one judged. A
    feature folder (or an entry in it) that fails with an OS error is skipped and added to
    ``problems``, and the other features are cleaned all the same; without that list, the
    first such error is raised at the end.
    """
    rule = _dead_owner_rule if reclaim_dead else age_only
    cleaned: list[CleanedEntry] = []
    skipped = _Problems(gsd_dir, problems)
    for feature in features if features is not None else _feature_names(gsd_dir):
        try:
            with open_feature_dir(gsd_dir, feature, create=False) as dfd:
                if dfd is not None:
                    _clean_folder(gsd_dir, feature, dfd, rule, dry_run, cleaned, skipped)
        except OSError as error:
            skipped.add(feature, error)
    skipped.settle()
    return cleaned


def _clean_folder(
    gsd_dir: str | os.PathLike[str],
    feature: str,
    dfd: int,
    rule: _utils.MayReclaim,
    dry_run: bool,
    found: list[CleanedEntry],
    skipped: _Problems,
) -> None:
    """Clean one folder, adding to ``found`` as it goes (an error later in the folder must not
    lose what was already removed)."""
    folder = feature_dir_path(gsd_dir, feature)
    now = _utils.now()

    def cleanable(entry: LockSnapshot) -> bool:
        return rule(entry, judge_lock(entry, now))

    snapshot = read_lock(dfd)
    state = judge_lock(snapshot, now)
    if cleanable(snapshot):
        removed = not dry_run and _remove_judged(dfd, snapshot, cleanable)
        lock_path = str(folder / _utils.LOCK_FILE_NAME)
        found.append(CleanedEntry(feature, lock_path, "lock", state.value, removed))
        if removed:
            _audit(
                gsd_dir,
                "clean",
                feature,
                old_record=_old_record(snapshot),
                new_owner=None,
                reason="owner-dead" if state is LockState.ACTIVE else state.value,
            )
    temps = _utils.orphan_temps(dfd, now)
    for name in temps:
        removed = False
        if not dry_run:
            try:
                os.unlink(name, dir_fd=dfd)
                removed = True
            except FileNotFoundError:
                pass  # Race: its writer linked or renamed it, or another clean removed it
            except OSError as error:
                path = str(folder / name)
                skipped.add(feature, type(error)(error.errno, error.strerror, path))
                continue
        found.append(CleanedEntry(feature, str(folder / name), "temp", "orphan", removed))


def _remove_judged(dfd: int, snapshot: LockSnapshot, still: _utils.Reclaimable) -> bool:
    if snapshot.kind is not EntryKind.DIRECTORY:
        return _utils.remove_judged(dfd, snapshot, still)
    with _utils.guard(dfd, wait=True):
        # Only an empty directory goes: clean never deletes what someone put inside one.
        if not read_lock(dfd).same_entry(snapshot):
            return False
        try:
            os.rmdir(_utils.LOCK_FILE_NAME, dir_fd=dfd)
        except OSError:
            return False
        return True
