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

import enum
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
from dataclasses import asdict, dataclass
from pathlib import Path
from time import monotonic, sleep
from types import TracebackType
from typing import Any, Final, Self

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
    "HEARTBEAT_SECONDS",
    "AlreadyHeldError",
    "CleanedEntry",
    "FeatureLock",
    "HeartbeatStartError",
    "LockError",
    "LockHeldError",
    "LockInfo",
    "LockLostError",
    "LockTimeoutError",
    "NotOwnerError",
    "Owner",
    "UnsafeLockPathError",
    "acquire",
    "claim",
    "clean",
    "inspect",
    "owner_liveness",
    "release",
    "status",
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


class LockError(Exception):
    """Base of the errors this layer raises about locks (OS errors stay ``OSError``)."""


class LockHeldError(LockError):
    """Someone else holds the feature; carries what is known about the holder."""

    def __init__(self, info: LockInfo) -> None:
        self.info = info
        super().__init__(describe_holder(info))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.info,))


class LockTimeoutError(LockHeldError, TimeoutError):
    """The feature stayed held for the whole wait."""


class NotOwnerError(LockHeldError):
    """Release was asked for a lock another owner holds; it was left intact."""


class AlreadyHeldError(LockHeldError):
    """The would-be owner already holds the feature (same pid): waiting would wait for itself."""

    def __init__(self, info: LockInfo) -> None:
        super().__init__(info)
        self.args = (f"feature {info.feature!r} is already held by you (pid {info.pid})",)


class LockLostError(LockError):
    """A holder found its lock gone or replaced (forced release, or it went stale)."""

    def __init__(self, feature: str, reason: str | None = None) -> None:
        self.feature = feature
        self.reason = reason or "it was removed or replaced by another owner"
        super().__init__(f"lost the lock on {feature!r}: {self.reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.feature, self.reason))


class HeartbeatStartError(LockError):
    """The heartbeat thread could not start (no threads left); the lock just taken was released."""

    def __init__(self, feature: str, cause: str) -> None:
        self.feature = feature
        self.cause = cause
        super().__init__(
            f"could not start the heartbeat that keeps the lock on {feature!r} fresh ({cause}); "
            "the lock was released"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.feature, self.cause))


# --------------------------------------------------------------------------- facts about locks


class Owner(enum.StrEnum):
    RUNNING = "running"
    NOT_RUNNING = "not-running"
    PID_REUSED = "pid-reused"
    UNKNOWN = "unknown"


ProcessFacts = tuple[bool, float | None]
"""(running here, start time if known) of a pid."""


def _process_facts(pid: int) -> ProcessFacts:
    import psutil  # imported here: most commands never ask, and the CLI starts faster

    try:
        process = psutil.Process(pid)
        with process.oneshot():
            if process.status() == psutil.STATUS_ZOMBIE:
                return False, None
            return True, process.create_time()
    except psutil.NoSuchProcess:
        return False, None
    except psutil.AccessDenied:
        return True, None


def _owner(facts: ProcessFacts, timestamp: float | None) -> Owner:
    running, started = facts
    if not running:
        return Owner.NOT_RUNNING
    if started is None or timestamp is None:
        return Owner.RUNNING
    if started > timestamp + CREATE_TIME_SLACK_SECONDS:
        return Owner.PID_REUSED  # this pid's process began after the lock was written
    return Owner.RUNNING


def owner_liveness(pid: int | None, timestamp: float | None) -> Owner:
    """Is the lock's owner alive on this host? Meaningless for locks from other hosts."""
    return Owner.UNKNOWN if pid is None else _owner(_process_facts(pid), timestamp)


@dataclass(frozen=True)
class LockInfo:
    """One feature lock as a person or a JSON reader sees it."""

    feature: str
    state: str
    pid: int | None
    timestamp: float | None
    age_seconds: float | None
    expires_in_seconds: float | None
    owner: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _describe(
    feature: str,
    snapshot: LockSnapshot,
    state: LockState,
    now: float,
    liveness: Callable[[int | None, float | None], Owner] | None = owner_liveness,
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
    owner = liveness(pid, timestamp) if liveness and pid is not None else Owner.UNKNOWN
    return LockInfo(feature, state.value, pid, timestamp, age, expires, owner.value)


def describe_holder(info: LockInfo) -> str:
    """Who holds a lock, since when and until when (the caller adds what to do about it)."""
    if info.pid is None:
        return f"feature {info.feature!r} is locked ({info.state})"
    age = _duration(info.age_seconds or 0.0)
    expiry = (
        f", expires in {_duration(info.expires_in_seconds)}"
        if info.expires_in_seconds is not None
        else ""
    )
    return f"feature {info.feature!r} is locked by pid {info.pid} (since {age} ago{expiry})"


def _duration(seconds: float) -> str:
    whole = int(seconds)
    if whole < 60:
        return f"{seconds:.0f}s" if seconds >= 1 else f"{seconds:.1f}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


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


def status(gsd_dir: str | os.PathLike[str] = GSD_DIR) -> list[LockInfo]:
    """Every feature folder under ``<gsd>/specs`` that has a ``.lock`` entry, by name."""
    now = _utils.now()
    liveness = _per_pid(_process_facts)
    return [
        _describe(feature, snapshot, judge_lock(snapshot, now), now, liveness)
        for feature, snapshot in _utils.scan_locks(gsd_dir)
        if snapshot.kind is not EntryKind.MISSING
    ]


def _per_pid(
    facts_of: Callable[[int], ProcessFacts],
) -> Callable[[int | None, float | None], Owner]:
    """Ask the process table once per pid (many locks share few owners), judge each lock's
    timestamp against the answer."""
    seen: dict[int, ProcessFacts] = {}

    def liveness(pid: int | None, timestamp: float | None) -> Owner:
        if pid is None:
            return Owner.UNKNOWN
        if pid not in seen:
            seen[pid] = facts_of(pid)
        return _owner(seen[pid], timestamp)

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
    return owner_liveness(*record) in (Owner.NOT_RUNNING, Owner.PID_REUSED)


def _reclaim_reason(outcome: AcquireOutcome) -> str:
    if outcome.replaced_state is LockState.ACTIVE:
        return "owner-dead"
    return outcome.replaced_state.value if outcome.replaced_state else "unknown"


def _try_once(
    feature: str, gsd_dir: str | os.PathLike[str], pid: int, reclaim_dead: bool
) -> tuple[AcquireOutcome, float]:
    now = _utils.now()
    with open_feature_dir(gsd_dir, feature, create=True) as dfd:
        assert dfd is not None
        outcome = _utils.try_acquire(dfd, pid, now, _dead_owner_rule if reclaim_dead else age_only)
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
    feature: str, gsd_dir: str | os.PathLike[str], pid: int, reclaim_dead: bool
) -> tuple[AcquireOutcome, float]:
    """One try whose lock, if it took one, is either returned or removed again, even when a
    signal handler raises: it never stays on disk unknown to the caller."""
    outcome: AcquireOutcome | None = None
    try:
        with _signals_deferred():
            # Race: Ctrl-C right after link() published our lock: deferred to the end of this
            # block, by when ``outcome`` knows the exact lock to take back.
            outcome, now = _try_once(feature, gsd_dir, pid, reclaim_dead)
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
    caller_pids: Iterable[int] = (),
) -> LockSnapshot:
    """Make ``pid`` (default: this process) the holder of ``feature``; return its lock.

    ``timeout`` 0 tries once, ``None`` waits for ever, otherwise waits that many seconds.
    Raises :class:`LockHeldError` (``LockTimeoutError`` after a wait) when it stays held, and
    :class:`AlreadyHeldError` at once when ``pid`` itself holds it, or one of ``caller_pids``
    (``lock run`` records itself, but the shell that called it is the caller too): not
    reentrant, and never waiting for itself.
    An acquire interrupted by a signal (``KeyboardInterrupt``) never leaves its lock behind.
    """
    _validate_feature_name(feature)
    owner = os.getpid() if pid is None else _valid_pid(pid)
    timeout = _valid_seconds("timeout", timeout)
    callers = {owner, *caller_pids}
    deadline = None if timeout is None else monotonic() + max(0.0, timeout)
    delays = _backoff_delays()
    while True:
        outcome, now = _try_uninterrupted(feature, gsd_dir, owner, reclaim_dead)
        if outcome.mine is not None:
            return outcome.mine
        info = _describe(feature, outcome.holder, outcome.state, now, liveness=None)
        if _held_by(outcome, callers):
            raise AlreadyHeldError(info)  # waiting would wait for ourselves
        left = None if deadline is None else deadline - monotonic()
        if left is not None and left <= 0:
            raise (LockTimeoutError if timeout else LockHeldError)(info)
        if on_wait is not None:
            on_wait(info, left)
        delay = next(delays)
        sleep(delay if left is None else min(delay, left))


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
) -> str | None:
    """Acquire the first free feature of ``features`` (default: every feature folder, by name).

    Workers claiming at once never get the same feature: each try is a full acquire.
    """
    candidates = list(features) if features else _feature_names(gsd_dir)
    for feature in candidates:
        _validate_feature_name(feature)
    owner = os.getpid() if pid is None else _valid_pid(pid)
    for feature in candidates:
        outcome, _ = _try_once(feature, gsd_dir, owner, reclaim_dead)
        if outcome.acquired:
            return feature
    return None


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

    ``timeout``: 0 tries once, ``None`` waits for ever. ``heartbeat``: seconds between
    refreshes (``None`` for none). If the lock is taken away (``release --force``), or refreshes
    keep failing until it turned stale, the heartbeat stops, :attr:`lost` is set and ``on_lost``
    is called (from the heartbeat thread); :meth:`refresh` raises :class:`LockLostError`.

    Fork-safe: a child forked from the holder forgets the lock (it is the parent's) and gets a
    fresh mutex, so it never waits on one the heartbeat thread held at the fork.
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
        on_lost: Callable[[LockLostError], None] | None = None,
        caller_pids: Iterable[int] = (),
    ) -> None:
        _validate_feature_name(feature)
        self.feature = feature
        self.gsd_dir = gsd_dir
        self.pid = os.getpid() if pid is None else _valid_pid(pid)
        self.timeout = _valid_seconds("timeout", timeout)
        self.reclaim_dead = reclaim_dead
        self.heartbeat = _valid_seconds("heartbeat", heartbeat)
        if self.heartbeat is not None and self.heartbeat < 0:  # it would refresh in a busy loop
            raise ValueError(f"Invalid heartbeat: {heartbeat!r} (must be >= 0; 0 or None: none)")
        self.on_wait = on_wait
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

    def acquire(self) -> Self:
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
        """Stop the heartbeat and remove our lock (only if it is still exactly ours)."""
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


@dataclass(frozen=True)
class CleanedEntry:
    """Something ``clean`` removed (or, in a dry run, would remove)."""

    feature: str
    path: str
    kind: str  # "lock" or "temp"
    state: str
    removed: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def clean(
    gsd_dir: str | os.PathLike[str] = GSD_DIR,
    *,
    dry_run: bool = False,
    reclaim_dead: bool = False,
    features: Iterable[str] | None = None,
) -> list[CleanedEntry]:
    """Remove stale, corrupt and non-file lock entries and orphan temp files; leave live locks.

    Each removal re-checks, under the folder's guard, that the entry is the one judged.
    """
    rule = _dead_owner_rule if reclaim_dead else age_only
    cleaned: list[CleanedEntry] = []
    for feature in features if features is not None else _feature_names(gsd_dir):
        with open_feature_dir(gsd_dir, feature, create=False) as dfd:
            if dfd is not None:
                cleaned += _clean_folder(gsd_dir, feature, dfd, rule, dry_run)
    return cleaned


def _clean_folder(
    gsd_dir: str | os.PathLike[str],
    feature: str,
    dfd: int,
    rule: _utils.MayReclaim,
    dry_run: bool,
) -> list[CleanedEntry]:
    folder = feature_dir_path(gsd_dir, feature)
    now = _utils.now()
    found: list[CleanedEntry] = []

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
            with suppress(FileNotFoundError):
                os.unlink(name, dir_fd=dfd)
                removed = True
        found.append(CleanedEntry(feature, str(folder / name), "temp", "orphan", removed))
    return found


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
