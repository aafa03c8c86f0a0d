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
import os
import random
import stat
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import suppress
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
    "CleanedEntry",
    "FeatureLock",
    "FeatureProblem",
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


class LockLostError(LockError):
    """A holder found its lock gone or replaced (forced release, or it went stale)."""

    def __init__(self, feature: str) -> None:
        self.feature = feature
        super().__init__(f"the lock on {feature!r} is no longer ours")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.feature,))


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


@dataclass(frozen=True)
class FeatureProblem:
    """A feature that ``status``, ``clean`` or ``claim`` had to skip (the others were done).

    ``error`` names the full path it was about (``path``)."""

    feature: str
    path: str
    error: OSError


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
            if stat.S_ISREG(os.fstat(fd).st_mode):  # a log file, not a FIFO or a device
                # O_APPEND: concurrent writers' lines never interleave (one small write each).
                os.write(fd, line)
        finally:
            os.close(fd)


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
) -> LockSnapshot:
    """Make ``pid`` (default: this process) the holder of ``feature``; return its lock.

    ``timeout`` 0 tries once, ``None`` waits for ever, otherwise waits that many seconds.
    Raises :class:`LockHeldError` (``LockTimeoutError`` after a wait) when it stays held.
    """
    _validate_feature_name(feature)
    owner = os.getpid() if pid is None else _valid_pid(pid)
    deadline = None if timeout is None else monotonic() + max(0.0, timeout)
    delays = _backoff_delays()
    while True:
        outcome, now = _try_once(feature, gsd_dir, owner, reclaim_dead)
        if outcome.mine is not None:
            return outcome.mine
        info = _describe(feature, outcome.holder, outcome.state, now, liveness=None)
        left = None if deadline is None else deadline - monotonic()
        if left is not None and left <= 0:
            raise (LockTimeoutError if timeout else LockHeldError)(info)
        if on_wait is not None:
            on_wait(info, left)
        delay = next(delays)
        sleep(delay if left is None else min(delay, left))


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
    problems: list[FeatureProblem] | None = None,
) -> str | None:
    """Acquire the first free feature of ``features`` (default: every feature folder, by name).

    Workers claiming at once never get the same feature: each try is a full acquire. A feature
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
            outcome, _ = _try_once(feature, gsd_dir, owner, reclaim_dead)
        except OSError as error:
            skipped.add(feature, error)
            continue
        if outcome.acquired:
            return feature
    skipped.settle()
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
    refreshes (``None`` for none). If the lock is taken away (``release --force``), the
    heartbeat stops and :attr:`lost` is set; :meth:`refresh` raises :class:`LockLostError`.
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
    ) -> None:
        _validate_feature_name(feature)
        self.feature = feature
        self.gsd_dir = gsd_dir
        self.pid = os.getpid() if pid is None else _valid_pid(pid)
        self.timeout = timeout
        self.reclaim_dead = reclaim_dead
        self.heartbeat = heartbeat
        self.on_wait = on_wait
        self.lost: LockLostError | None = None
        self.heartbeat_error: OSError | None = None
        self._mine: LockSnapshot | None = None
        self._holder_process: int | None = None  # a forked child shares this object, not the lock
        self._mutex = threading.Lock()  # heartbeat thread vs. release in the caller's thread
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

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
        self._mine = acquire(
            self.feature,
            self.gsd_dir,
            pid=self.pid,
            timeout=self.timeout,
            reclaim_dead=self.reclaim_dead,
            on_wait=self.on_wait,
        )
        self._holder_process = os.getpid()
        self.lost = None
        if self.heartbeat:
            self._stop.clear()
            self._beat = threading.Thread(
                target=self._beat_loop, name=f"lock-heartbeat-{self.feature}", daemon=True
            )
            self._beat.start()
        return self

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
                self.lost = error
                return
            except OSError as error:
                # A transient failure (busy guard, full disk): retry sooner, and keep the error
                # where the holder can see it; ``held`` turns False if the lock expires meanwhile.
                self.heartbeat_error = error
                interval = max(self.heartbeat / 4, 0.01)
                continue
            self.heartbeat_error, interval = None, self.heartbeat

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
