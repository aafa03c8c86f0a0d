"""Feature locks for long-lived holders, waiters, worker pools and maintenance.

This layer talks to a :class:`~mahabharatha.backends.base.LockBackend` only (default: the folder
backend of ``gsd_dir``, :mod:`mahabharatha.backends.files.backend`) and adds what is the same for
every backend: an explicit owner pid (a CLI process records the shell that called it), waiting with
backoff, a heartbeat that keeps a long-held lock fresh, signals held back while a lock is being
published, and ``claim`` over many features. Every public function takes ``backend=`` (a
:class:`LockBackend`, or a lock server's URL); without one, it uses the server
``MAHABHARATHA_LOCK_URL`` names, else the folder backend of ``gsd_dir`` (every entry point uses
the same backend as the CLI: never files beside a server, two holders).

Typical use::

    with FeatureLock("auth-flow", timeout=30):
        ...  # exclusive work; the lock is refreshed in the background

Errors derive from :class:`LockError`; OS trouble (permissions, a directory or a symlinked
folder in the way) stays an :class:`OSError`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from time import monotonic, sleep
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, NamedTuple, Self, TypedDict, TypeVar, Unpack

from mahabharatha import clock, logs, signals, waiting
from mahabharatha.backends import lock_url, open_backend, shared_backend
from mahabharatha.backends.base import (
    DEFAULT_ATTEMPTS,
    AcquireResult,
    AlreadyHeldError,
    Attempts,
    Capability,
    CleanedEntry,
    FeatureProblem,
    HeartbeatStartError,
    Held,
    LockBackend,
    LockError,
    LockHeldError,
    LockInfo,
    LockLostError,
    LockTimeoutError,
    NotHeldError,
    NotOwnerError,
    Owner,
    ReleaseWait,
    Requester,
    ServerFullError,
    UnsafeLockPathError,
    UnsupportedError,
    Verdict,
    describe_holder,
    owner_is_gone,
)
from mahabharatha.backends.liveness import (
    CREATE_TIME_SLACK_SECONDS,
    OwnerFacts,
    judge,
    owner_liveness,
)
from mahabharatha.constants import (
    AUDIT_LOG_NAME,
    COMPLETED_MARKER_NAME,
    CUT_OFF_NOTICE_SECONDS,
    GSD_DIR,
    HEARTBEAT_SECONDS,
    LEFT_WORK_POLL_SECONDS,
    POOL_CONNECTION_GRACE_SECONDS,
    POOL_SLOTS_LOOK_SECONDS,
    RECHECK_SECONDS,
    RETRY_DELAY_SECONDS,
    SLOT_PAUSE_SECONDS,
    WAKE_UP_SLICE_SECONDS,
)
from mahabharatha.names import MAX_PID
from mahabharatha.names import validate_feature_name as _validate_feature_name
from mahabharatha.owner import ownership
from mahabharatha.owner.proof import HandedProof, WorkProof
from mahabharatha.states import State, WorkEnd, WorkOutcome

if TYPE_CHECKING:
    from mahabharatha.aio import AsyncFeatureLock

__all__ = [
    "AUDIT_LOG_NAME",
    "COMPLETED_MARKER_NAME",
    "CREATE_TIME_SLACK_SECONDS",
    "DEFAULT_ATTEMPTS",
    "HEARTBEAT_SECONDS",
    "AlreadyHeldError",
    "AsyncFeatureLock",
    "Attempts",
    "ClaimOutcome",
    "CleanedEntry",
    "FeatureLock",
    "FeatureProblem",
    "HeartbeatStartError",
    "Held",
    "LockBackend",
    "LockError",
    "LockHeldError",
    "LockInfo",
    "LockLostError",
    "LockTimeoutError",
    "NoneFreeError",
    "NotHeldError",
    "NotOwnerError",
    "Owner",
    "PoolLock",
    "StopWork",
    "UnsafeLockPathError",
    "WaitCallback",
    "WorkReport",
    "WorkResult",
    "acquire",
    "attempts_of",
    "claim",
    "claim_held",
    "claim_next",
    "clean",
    "done",
    "fail",
    "inspect",
    "is_done",
    "owner_is_gone",
    "owner_liveness",
    "release",
    "reopen",
    "reopen_finished",
    "run_pool",
    "status",
    "survey",
    "work",
]


def __getattr__(name: str) -> Any:
    """``AsyncFeatureLock`` (:mod:`mahabharatha.aio`), imported on first use: asyncio stays out
    of every CLI call's cold start, and ``aio`` (which builds on this module) out of its
    import."""
    if name == "AsyncFeatureLock":
        from mahabharatha.aio import AsyncFeatureLock

        return AsyncFeatureLock
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_T = TypeVar("_T")


GsdDir = str | os.PathLike[str]


def _backend(backend: LockBackend | str | None, gsd_dir: GsdDir) -> LockBackend:
    """The backend to use: the caller's, or the one its URL names, or the server
    ``MAHABHARATHA_LOCK_URL`` names, or the folder backend of ``gsd_dir``. A server's backend
    is kept for the process (``shared_backend``: one warm connection, closed at exit)."""
    if backend is not None and not isinstance(backend, str):
        return backend
    return shared_backend(backend or lock_url(), gsd_dir)


def _owner_pid(pid: int | None) -> int:
    return os.getpid() if pid is None else _valid_pid(pid)


# --------------------------------------------------------------------------- looking


def inspect(
    feature: str, gsd_dir: GsdDir = GSD_DIR, *, backend: LockBackend | str | None = None
) -> LockInfo:
    """The lock on ``feature``: state ``free`` when there is none.

    Raises ``UnsafeLockPathError`` when a symlink or a file stands where the feature folder
    should be, or a directory where the lock should be: acquire would fail there too.
    """
    _validate_feature_name(feature)
    return _backend(backend, gsd_dir).inspect(feature)


def status(
    gsd_dir: GsdDir = GSD_DIR,
    *,
    problems: list[FeatureProblem] | None = None,
    backend: LockBackend | str | None = None,
) -> list[LockInfo]:
    """Every feature that has a lock entry, by name.

    A folder that cannot be looked into is skipped and added to ``problems`` (without that
    list, its error is raised after the scan).
    """
    return _backend(backend, gsd_dir).status(problems=problems)


def survey(
    gsd_dir: GsdDir = GSD_DIR,
    *,
    problems: list[FeatureProblem] | None = None,
    backend: LockBackend | str | None = None,
) -> list[LockInfo]:
    """Every feature, by name: its lock as :func:`status` lists it, or state ``done`` (a
    completion marker and no lock) or ``free`` (neither). Folders that cannot be looked into
    are skipped and reported as :func:`status` does. On a backend that keeps its locks
    elsewhere (PostgreSQL), a feature free there but done or failed in its local folder is
    shown so, exactly as :func:`claim` skips it."""
    store = _backend(backend, gsd_dir)
    infos = store.survey(problems=problems)
    local = _local_markers(store)
    return infos if local is None else [_as_finished_here(local, info) for info in infos]


def _as_finished_here(local: LockBackend, info: LockInfo) -> LockInfo:
    """``info``, shown ``done`` or ``failed`` when it is free but so in its local folder."""
    if info.state is not State.FREE:
        return info
    finished = _finished_in(local, info.feature, include_done=False, attempts=None)
    if finished is None:
        return info
    state, record = finished
    shown = dataclasses.replace(info, state=state)
    return shown if record is None else shown.with_attempts(record.tries, record.last_reason)


def _finished_in(
    local: LockBackend, feature: str, *, include_done: bool, attempts: int | None
) -> tuple[State, Attempts | None] | None:
    """Is ``feature`` done (its marker) or failed (its attempts at the limit: ``attempts``, or
    the one recorded) in the local folders? One answer for claim and status; a folder that
    cannot be looked into says nothing (the server decides alone)."""
    try:
        if not include_done and local.is_done(feature):
            return State.DONE, None
        record = local.attempts(feature)
    except OSError:
        return None
    if record is None:
        return None
    limit = record.limit if attempts is None else attempts
    return (State.FAILED, record) if record.tries >= limit else None


# --------------------------------------------------------------------------- acquiring


def _try_once(
    backend: LockBackend,
    feature: str,
    pid: int,
    reclaim_dead: bool,
    details: bytes | None = None,
    lease: float | None = None,
) -> AcquireResult:
    requester = Requester(pid, details)
    if lease is None:  # the seam's default: a backend that cannot choose a lease never sees one
        return _said(backend.try_acquire(feature, requester, reclaim_dead=reclaim_dead))
    return _said(backend.try_acquire(feature, requester, reclaim_dead=reclaim_dead, lease=lease))


def _said(outcome: AcquireResult) -> AcquireResult:
    """``outcome``, logged when it reclaimed another holder's lock to win (both backends)."""
    if outcome.held is not None and outcome.replaced is not None:
        old = outcome.replaced
        logs.say(
            logs.INFO,
            "reclaimed feature %r from pid %s (%s)",
            old.feature,
            old.pid,
            outcome.reason or old.state,
        )
    return outcome


def _held_by(
    holder: LockInfo | None, details: ownership.OwnerDetails | None, callers: set[int]
) -> bool:
    """Is the active lock that stopped us the caller's own (``caller``, by the one owner
    judgement: one of ``callers``' pids, on our host, with details that prove it)?"""
    if holder is None or holder.state is not State.ACTIVE:
        return False
    facts = OwnerFacts(holder.pid, details=details, host=holder.host)
    return judge(facts, callers, alive=False).verdict is Verdict.CALLER


def _try_uninterrupted(
    backend: LockBackend,
    feature: str,
    pid: int,
    reclaim_dead: bool,
    details: bytes | None = None,
    lease: float | None = None,
) -> AcquireResult:
    """One try whose lock, if it took one, is either returned or removed again, even when a
    signal handler raises: it never stays held unknown to the caller."""
    outcome: AcquireResult | None = None
    try:
        with signals.Deferred():
            # Race: Ctrl-C right after link() published our lock: deferred to the end of this
            # block, by when ``outcome`` knows the exact lock to take back.
            sent = monotonic()  # the lease on the server runs from no earlier than this
            outcome = _try_once(backend, feature, pid, reclaim_dead, details, lease)
            if outcome.held is not None and outcome.held.sent is None:  # else the backend's
                outcome = outcome._replace(held=outcome.held._replace(sent=sent))
    except BaseException:
        if outcome is not None and outcome.held is not None:
            with signals.Deferred():  # a second Ctrl-C must not cut the take-back short
                backend.release_held(outcome.held)
        raise
    return outcome


WaitCallback = Callable[[LockInfo, float | None], None]
"""Called while waiting with the holder's info and the seconds left (``None``: no limit)."""


def _judged(backend: LockBackend, stopped_by: LockInfo) -> LockInfo:
    """The holder that stopped a wait, its owner judged as status and check do (the polls
    skip it: asking the process table 50 times a second would cost the waiter its CPU)."""
    try:
        now = backend.inspect(stopped_by.feature)
    except OSError:
        return stopped_by
    # Race: the holder changed since the try that stopped us: report the one that did.
    same = now.pid == stopped_by.pid and now.timestamp == stopped_by.timestamp
    return now if same else stopped_by


def acquire(
    feature: str,
    gsd_dir: GsdDir = GSD_DIR,
    *,
    pid: int | None = None,
    timeout: float | None = 0.0,
    reclaim_dead: bool = False,
    on_wait: WaitCallback | None = None,
    command: Sequence[str] | None = None,
    caller_pids: Iterable[int] = (),
    backend: LockBackend | str | None = None,
    lease: float | None = None,
) -> Held:
    """Make ``pid`` (default: this process) the holder of ``feature``; return the acquisition.

    ``lease``: seconds the lock lasts unless refreshed, where the backend lets it be chosen
    (PostgreSQL; default 2 h); ``UnsupportedError`` on files, whose lease is fixed.

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
    owner = _owner_pid(pid)
    timeout = _valid_seconds("timeout", timeout)
    store = _backend(backend, gsd_dir)
    details = ownership.details_of(owner, command)
    wait = _Waiting(waiting.Deadline(timeout), {owner, *caller_pids}, on_wait)
    while True:
        outcome = _try_uninterrupted(store, feature, owner, reclaim_dead, details, lease)
        if outcome.held is not None:
            return outcome.held
        holder, left = wait.stopped_by(outcome)
        if left is not None and left <= 0:
            raise (LockTimeoutError if timeout else LockHeldError)(_judged(store, holder))
        _pause(store, feature, wait.pause(holder, left), left)


class _Waiting:
    """One acquire's wait, the same for ``acquire`` and ``AsyncFeatureLock``: its deadline, its
    backoff, and what a try that did not win means."""

    def __init__(
        self, deadline: waiting.Deadline, callers: set[int], on_wait: WaitCallback | None
    ) -> None:
        self.deadline, self.callers, self.on_wait, self.said = deadline, callers, on_wait, False
        self.delays = waiting.backoff()

    def stopped_by(self, outcome: AcquireResult) -> tuple[LockInfo, float | None]:
        """The holder that stopped a try and the seconds left (0 or less: the wait is over);
        :class:`AlreadyHeldError` when it is the caller: waiting would wait for ourselves."""
        holder = outcome.holder
        assert holder is not None  # a try that did not win names who stopped it
        if outcome.verdict is Verdict.CALLER or _held_by(
            holder, outcome.holder_details, self.callers
        ):
            raise AlreadyHeldError(holder)
        return holder, self.deadline.left()

    def pause(self, holder: LockInfo, left: float | None) -> float:
        """Say that we wait (logged once, ``on_wait`` each time); the next pause."""
        if not self.said:
            self.said = True
            logs.say(logs.INFO, "waiting: %s", describe_holder(holder))
        if self.on_wait is not None:
            self.on_wait(holder, left)
        return self.deadline.cap(next(self.delays))


LEASE_REFRESHES: Final = 3
"""A holder with a chosen lease (PostgreSQL) refreshes at least 3 times per lease: two
refreshes may fail (a server restart, a lost connection) before the lock is in danger."""


def cut_off_notice(lease: float) -> float:
    """:data:`CUT_OFF_NOTICE_SECONDS` for a lease of ``lease`` seconds."""
    return min(CUT_OFF_NOTICE_SECONDS, lease / 4)


def _pause(backend: LockBackend, feature: str, delay: float, left: float | None) -> None:
    """Between two tries: sleep ``delay`` (backoff), or, where the backend wakes waiters on a
    release, wait for that (at most a slice, or what is left of the wait)."""
    backend.pause(
        feature, delay, WAKE_UP_SLICE_SECONDS if left is None else min(WAKE_UP_SLICE_SECONDS, left)
    )


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
    if not 1 <= pid <= MAX_PID:
        raise ValueError(f"Invalid pid: {pid} (must be 1 to {MAX_PID})")
    return pid


class ClaimOutcome(NamedTuple):
    """How a claim ended: ``held`` when it took a feature; otherwise what the others are.

    ``busy``: features held by others at the last look (one may come back: its worker fails,
    dies or releases it); ``done`` and ``failed``: finished ones (``failed``: their failed
    attempts reached the limit); ``mine``: features the claimer itself holds (waiting for them
    would wait for itself). Nothing held and nothing busy: nothing is left to claim."""

    held: Held | None
    busy: tuple[str, ...] = ()
    done: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    mine: tuple[str, ...] = ()

    @property
    def nothing_left(self) -> bool:
        """Every feature is done or failed (or there is none): no claim can ever succeed."""
        return self.held is None and not self.busy


class NoneFreeError(LockError):
    """A claim's wait ran out while every feature left was held by others (CLI: exit 75)."""

    def __init__(self, busy: Sequence[str]) -> None:
        self.busy = tuple(busy)
        shown = ", ".join(self.busy[:3]) + (", ..." if len(self.busy) > 3 else "")
        super().__init__(f"no feature came free: {len(self.busy)} held by others ({shown})")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.busy,))


class _ClaimKeywords(TypedDict, total=False):
    """The options :func:`claim`, :func:`claim_held` and :func:`claim_next` share, by name
    (their defaults: :func:`claim_next`'s signature, the one that lists them)."""

    pid: int | None
    reclaim_dead: bool
    include_done: bool
    problems: list[FeatureProblem] | None
    backend: LockBackend | str | None
    lease: float | None
    attempts: int | None


def claim(
    features: Sequence[str] | None = None,
    gsd_dir: GsdDir = GSD_DIR,
    *,
    wait: float | None = 0.0,
    **options: Unpack[_ClaimKeywords],
) -> str | None:
    """Acquire the first free feature of ``features`` (default: every feature folder, by name).

    Workers claiming at once never get the same feature: each try is a full acquire. A feature
    marked done (:func:`done`) is never returned unless ``include_done``, nor one whose failed
    attempts (:func:`fail`) reached ``attempts`` (``None``: the limit recorded with them, that
    of the pool that failed it, 3 by default): both are looked for again once the lock is
    held, and such a feature's lock is given straight back. A feature whose try fails with an
    OS error (a folder we may not enter) is skipped and added to ``problems``; without that
    list, the first such error is raised when nothing was claimed. ``lease`` as for
    :func:`acquire`. :func:`claim_held` returns the acquisition itself, :func:`claim_next`
    also says why nothing was claimed.

    ``wait``: 0 (the default) tries once and answers ``None`` when nothing is free; a number
    of seconds (``None``: for ever) waits, woken by releases, while others hold features: then
    ``None`` means nothing is left (every feature done or failed), and :class:`NoneFreeError`
    that the wait ran out.
    """
    outcome = claim_next(features, gsd_dir, wait=wait, **options)
    if outcome.held is None and outcome.busy and wait != 0:
        raise NoneFreeError(outcome.busy)
    return None if outcome.held is None else outcome.held.feature


def claim_held(
    features: Sequence[str] | None = None,
    gsd_dir: GsdDir = GSD_DIR,
    **options: Unpack[_ClaimKeywords],
) -> Held | None:
    """:func:`claim` (one try), answering the acquisition (its feature, and its token where
    the backend gives tokens)."""
    return claim_next(features, gsd_dir, **options).held


def claim_next(
    features: Sequence[str] | None = None,
    gsd_dir: GsdDir = GSD_DIR,
    *,
    pid: int | None = None,
    reclaim_dead: bool = False,
    include_done: bool = False,
    problems: list[FeatureProblem] | None = None,
    backend: LockBackend | str | None = None,
    lease: float | None = None,
    attempts: int | None = None,
    wait: float | None = 0.0,
    command: Sequence[str] | None = None,
) -> ClaimOutcome:
    """:func:`claim`, answering a :class:`ClaimOutcome`: the acquisition, or what the
    features left are (held by others, done, failed). With ``wait`` (seconds; ``None``: for
    ever) it claims again each time a feature is released, until it takes one, nothing is
    left, or the wait runs out (then the outcome lists the busy features)."""
    store = _backend(backend, gsd_dir)
    candidates = list(features) if features else store.feature_names()
    for feature in candidates:
        _validate_feature_name(feature)
    owner = _owner_pid(pid)
    if attempts is not None:
        _valid_attempts(attempts)
    _valid_timeout(wait)
    wait = _valid_seconds("wait", wait)
    found: list[FeatureProblem] = [] if problems is None else problems
    pool = _Pool(store, candidates, owner, ownership.details_of(owner, command), found)
    options = _ClaimOptions(reclaim_dead, include_done, attempts, lease)
    outcome = _claim_waiting(pool, options, wait)
    if problems is None and found and outcome.held is None:
        raise found[0].error
    return outcome


def _claim_patiently(
    pool: _Pool,
    options: _ClaimOptions,
    wait: float | None,
    on_server_full: Callable[[ServerFullError], None],
) -> ClaimOutcome:
    """:func:`_claim_waiting`, asked again while the server has no free connection slot: the
    worker holds nothing, so it waits for a slot as it would for a feature (at most ``wait``
    seconds; ``None``: for ever), and says so (``on_server_full``). More workers than slots
    all finish: a slot comes free when another worker lets go of it, or ends."""
    deadline = None if wait is None else monotonic() + wait
    left = wait
    while True:
        try:
            return _claim_waiting(pool, options, left)
        except ServerFullError as full:
            if deadline is not None and monotonic() >= deadline:
                raise
            on_server_full(full)
        _pause_for_a_slot()
        # The wait for a slot counts against ``wait``: asked again, the claim waits what is left.
        left = None if deadline is None else max(0.0, deadline - monotonic())


def _once(tell: Callable[[ServerFullError], None] | None) -> Callable[[ServerFullError], None]:
    """``tell``, called the first time only (nothing when ``None``), and logged then."""
    told: list[bool] = []

    def tell_once(error: ServerFullError) -> None:
        if told:
            return
        told.append(True)
        logs.say(logs.WARNING, "%s; waiting for a free connection slot", error)
        if tell is not None:
            tell(error)

    return tell_once


def _claim_waiting(pool: _Pool, options: _ClaimOptions, wait: float | None) -> ClaimOutcome:
    """Claim; while only features held by others are left, wait for a release (at most
    ``wait`` seconds; ``None``: for ever) and claim again. The watch (an inotify descriptor, a
    listening connection) exists only while waiting: a holder keeps none while it works."""
    deadline = waiting.Deadline(wait)
    outcome = pool.claim(options)
    if outcome.held is not None or outcome.nothing_left or wait == 0:
        return outcome
    pool.tell_waiting(outcome.busy)
    with pool.store.release_watch(pool.candidates) as watch:
        while True:
            # Race: a release between the claim above and the watch's start was not seen by
            # either: this claim, made with the watch in place, sees it.
            outcome = pool.claim(options)
            if outcome.held is not None or outcome.nothing_left:
                return outcome
            if deadline.passed():
                return outcome
            watch.wait(deadline.cap(RECHECK_SECONDS))


def _valid_attempts(attempts: int) -> None:
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ValueError(f"Invalid attempts: {attempts!r} (a whole number >= 1)")


class _ClaimOptions(NamedTuple):
    reclaim_dead: bool
    include_done: bool
    attempts: int | None  # None: the limit recorded with the attempts (the failing pool's)
    lease: float | None


class _Pool:
    """One worker's view of the features it claims from: a claim round over all of them."""

    def __init__(
        self,
        store: LockBackend,
        candidates: list[str],
        owner: int,
        details: bytes | None,
        problems: list[FeatureProblem],
    ) -> None:
        self.store = store
        self.candidates = candidates
        self.owner = owner
        self.details = details
        self.problems = problems
        self.local = _local_markers(store)
        # Features seen done or failed: they stay so while the pool runs (only ``reopen``
        # changes that), so later rounds skip them without a look (no system call).
        self.finished: dict[str, str] = {}
        # Candidates before this index are all finished: a round starts after them. Features
        # finish about in order, so a worker's rounds walk O(features) in all, not each (the
        # walk was a tenth of a claim's time in a pool of 400, and grew with the pool).
        self.open_from = 0
        self.offered: list[str] | None = None  # one-statement claims: the features offered
        self.here: dict[str, str] = {}  # one-statement claims: done or failed locally
        # --retry-delay: a feature rests this long after a failed attempt. When a rest ends,
        # by the attempt's record (any worker's; where the claim reads it) or this worker's.
        self.retry_delay = 0.0
        self.rest_until: dict[str, float] = {}
        # Told once per run which feature (and holder) the worker waits for.
        self.on_waiting: Callable[[LockInfo], None] | None = None
        self.told_waiting = False

    def tell_waiting(self, busy: Sequence[str]) -> None:
        """Say once (``on_waiting``) what the first wait is for: the first feature held by
        others, its holder judged (``free``: it rests after a failed attempt)."""
        if self.told_waiting or not busy:
            return
        self.told_waiting = True
        try:
            info = self.store.inspect(busy[0])
        except OSError:
            info = LockInfo(busy[0], State.FREE, None, None, None, None, Owner.UNKNOWN)
        if info.state is State.FREE:
            logs.say(logs.INFO, "waiting: feature %r rests after a failed attempt", info.feature)
        else:
            logs.say(logs.INFO, "waiting: %s", describe_holder(info))
        if self.on_waiting is not None:
            self.on_waiting(info)

    def rest(self, feature: str) -> None:
        """``feature``'s attempt failed here: it is not taken again for ``retry_delay``."""
        if self.retry_delay > 0:
            self.rest_until[feature] = clock.now() + self.retry_delay

    def _resting(self, feature: str, record: Attempts | None = None) -> bool:
        """Is ``feature`` resting after a failed attempt (this worker's, or the one its
        ``record`` names last)? It counts as held by others: the pool waits for it."""
        now = clock.now()
        ends = self.rest_until.get(feature, 0.0)
        if record is not None and record.history and self.retry_delay > 0:
            at = record.history[-1].get("at")
            if isinstance(at, int | float) and math.isfinite(at):
                # A time ahead of ours (another host's clock, a forged record) rests no longer.
                ends = max(ends, min(float(at), now) + self.retry_delay)
        return now < ends

    def claim(self, options: _ClaimOptions) -> ClaimOutcome:
        del self.problems[:]  # each round reports what it could not try
        if Capability.CLAIM_IN_ONE_STEP in self.store.capabilities:
            return self._claim_in_one_step(options)
        seen: dict[str, list[str]] = {"done": [], "failed": [], "busy": [], "mine": []}
        start = self.open_from
        for index in range(start, len(self.candidates)):
            feature = self.candidates[index]
            verdict = self.finished.get(feature)
            if verdict is None:
                tried = self._tried(feature, options)
                if isinstance(tried, Held):
                    return ClaimOutcome(tried)
                if tried in ("done", "failed"):
                    self.finished[feature] = tried
                verdict = tried
            if verdict in ("done", "failed") and index == self.open_from:
                self.open_from += 1  # a finished feature stays so: later rounds start past it
            if verdict is not None:
                seen[verdict].append(feature)
        return _outcome_of(self._passed(start, seen))

    def _passed(self, start: int, seen: dict[str, list[str]]) -> dict[str, list[str]]:
        """``seen`` with the candidates before ``start`` (all finished, what each was is known)
        in front, in the candidates' order."""
        before: dict[str, list[str]] = {"done": [], "failed": []}
        for feature in self.candidates[:start]:
            before[self.finished[feature]].append(feature)
        return {
            **seen,
            "done": before["done"] + seen["done"],
            "failed": before["failed"] + seen["failed"],
        }

    def _tried(self, feature: str, options: _ClaimOptions) -> Held | str | None:
        """:meth:`_claim_one`, with an OS error kept in ``problems`` (``None``: not tried)."""
        try:
            return self._claim_one(feature, options)
        except OSError as error:
            where = str(error.filename or self.store.where())
            self.problems.append(FeatureProblem(feature, where, error))
            return None

    def _finished(self, feature: str, options: _ClaimOptions) -> str | None:
        """``done`` or ``failed`` when the feature is finished, ``busy`` while it rests after
        a failed attempt, else None."""
        if not options.include_done and self.store.is_done(feature):
            return "done"
        record = self.store.attempts(feature)
        if record is None:
            return None
        limit = record.limit if options.attempts is None else options.attempts
        if record.tries >= limit:
            return "failed"
        return "busy" if self._resting(feature, record) else None

    def _claim_one(self, feature: str, options: _ClaimOptions) -> Held | str:
        """Take ``feature`` unless it is finished: the acquisition, or why not (``done``,
        ``failed``, ``busy``, ``mine``: held by the claimer itself)."""
        finished = self._finished(feature, options)
        if finished is not None:
            return finished  # cheap: most finished features are skipped without their lock
        outcome = _try_once(
            self.store, feature, self.owner, options.reclaim_dead, self.details, options.lease
        )
        if outcome.held is None:
            return "mine" if self._holds(outcome) else "busy"
        # Race: a worker marked the feature done (or recorded its last failed attempt) and
        # released it between our first look and our acquire. Both publish before they
        # release, so now that we hold the lock the mark is certainly visible: give it back.
        finished = self._finished(feature, options)
        if finished is None:
            return outcome.held
        self.store.release_held(outcome.held)
        return finished

    def _holds(self, outcome: AcquireResult) -> bool:
        """Is the lock that stopped our try the claimer's own (the one owner judgement)?"""
        if outcome.verdict is Verdict.CALLER:
            return True
        return _held_by(outcome.holder, outcome.holder_details, {self.owner})

    def _claim_in_one_step(self, options: _ClaimOptions) -> ClaimOutcome:
        """A backend that claims in one statement (PostgreSQL): features done or failed in
        their local folder are left out (both backends mean the same by done and failed, and
        :func:`survey` shows them so). The folders are looked at
        once per pool, and the list offered stays the same from claim to claim (the server
        keeps a prepared claim per list)."""
        if self.offered is None:
            here = ((f, self._finished_here(f, options)) for f in self.candidates)
            self.here = {f: finished for f, finished in here if finished is not None}
            self.offered = [f for f in self.candidates if f not in self.here]
        offered = self.offered
        while True:
            won = self.store.try_claim(
                offered,
                Requester(self.owner, self.details),
                reclaim_dead=options.reclaim_dead,
                lease=options.lease,
                include_done=options.include_done,
                retry_delay=self.retry_delay,  # the statement skips resting rows, by its clock
            )
            if won is None or won.held is None:
                break
            _said(won)
            if self._finished_here(won.held.feature, options) is None:
                return ClaimOutcome(won.held)
            # Race: its folder got a marker after the pool looked (another checkout's done):
            # done all the same; give the lock back and leave it out from now on.
            self.store.release_held(won.held)
            self.offered = [f for f in self.offered if f != won.held.feature]
            offered = [f for f in offered if f != won.held.feature]
        held = {info.feature: info for info in self.store.status() if info.held}
        # Race: a rest may end between the claim and this look: still counted unfinished.
        resting = self.store.retried_features(self.offered) if self.retry_delay > 0 else set()
        busy = [f for f in self.offered if f in held or f in resting]
        unfinished = set(busy)
        finished = [f for f in self.candidates if f not in unfinished]
        gave_up = self.store.failed_features() | {
            f for f, finished in self.here.items() if finished == "failed"
        }
        seen = {
            "done": [f for f in finished if f not in gave_up],
            "failed": [f for f in finished if f in gave_up],
            "busy": [],
            "mine": [],
        }
        # The statement skips every held row, the claimer's own too. A row under the
        # claimer's pid on this host may be its own: one try tells (the owner judgement, on
        # the row's details); any other row is someone else's without a round trip. Race: a
        # try may also take one released meanwhile.
        for feature in busy:
            mine = feature in held and self._may_be_mine(held[feature])
            verdict = self._tried(feature, options) if mine else None
            if isinstance(verdict, Held):
                return ClaimOutcome(verdict)
            seen[verdict or "busy"].append(feature)
        return _outcome_of(seen)

    def _may_be_mine(self, holder: LockInfo) -> bool:
        return holder.pid == self.owner and holder.host in (None, ownership.host_name())

    def _finished_here(self, feature: str, options: _ClaimOptions) -> str | None:
        """``done`` or ``failed`` when the feature's local folder says so (both backends mean
        the same by done and failed), else None."""
        if self.local is None:
            return None
        found = _finished_in(
            self.local, feature, include_done=options.include_done, attempts=options.attempts
        )
        return None if found is None else str(found[0])


def _outcome_of(seen: dict[str, list[str]]) -> ClaimOutcome:
    """A claim round that took nothing: what each feature was."""
    return ClaimOutcome(
        None,
        tuple(seen["busy"]),
        tuple(seen["done"]),
        tuple(seen["failed"]),
        tuple(seen["mine"]),
    )


def _local_markers(store: LockBackend) -> LockBackend | None:
    """The local folders of a backend that keeps its locks elsewhere (PostgreSQL): their
    ``.completed`` markers count as done too. ``None`` on files (the store itself)."""
    folder = store.marker_folder()
    return None if folder is None else open_backend(None, folder)


# --------------------------------------------------------------------------- done features


def is_done(
    feature: str, gsd_dir: GsdDir = GSD_DIR, *, backend: LockBackend | str | None = None
) -> bool:
    """Has ``feature`` been marked done (its folder holds a ``.completed`` marker)?"""
    _validate_feature_name(feature)
    return _backend(backend, gsd_dir).is_done(feature)


def done(
    feature: str,
    gsd_dir: GsdDir = GSD_DIR,
    *,
    pid: int | None = None,
    backend: LockBackend | str | None = None,
) -> str:
    """Mark ``feature`` done and release ``pid``'s lock on it, in that order; return the time
    written to the marker (ISO-8601, UTC). A backend that keeps its locks elsewhere
    (PostgreSQL) also writes the marker in the feature's local folder where there is one.

    Raises :class:`NotHeldError` (nothing written) when ``pid`` (default: this process) does
    not hold the lock, and :class:`NotOwnerError` when another owner does.
    """
    _validate_feature_name(feature)
    owner = _owner_pid(pid)
    return _mark_done(_backend(backend, gsd_dir), feature, owner)


def _mark_done(store: LockBackend, feature: str, owner: int) -> str:
    stamp = store.done(feature, owner)
    local = _local_markers(store)
    if local is not None:
        with suppress(OSError):  # done on the server is what counts; the folder is a copy
            local.mark_done_here(feature, stamp)
    return stamp


def fail(
    feature: str,
    gsd_dir: GsdDir = GSD_DIR,
    *,
    pid: int | None = None,
    reason: str = "failed",
    attempts: int = DEFAULT_ATTEMPTS,
    backend: LockBackend | str | None = None,
) -> Attempts:
    """Record a failed attempt of ``pid`` (default: this process) at ``feature`` (the time,
    the host, ``reason``), then release its lock, in that order; return the feature's record.
    Once its attempts reach ``attempts`` (the pool's limit) the feature is ``failed``:
    :func:`claim` skips it until :func:`reopen`. The record keeps the count and the latest
    few attempts, so it stays small however often a feature fails.

    Raises :class:`NotHeldError` (nothing written) when ``pid`` does not hold the lock,
    :class:`NotOwnerError` when another owner does, :class:`UnsupportedError` where the backend
    keeps no attempts.
    """
    _validate_feature_name(feature)
    _valid_attempts(attempts)
    owner = _owner_pid(pid)
    return _backend(backend, gsd_dir).fail(feature, owner, reason, attempts)


def attempts_of(
    feature: str, gsd_dir: GsdDir = GSD_DIR, *, backend: LockBackend | str | None = None
) -> Attempts | None:
    """``feature``'s failed attempts (``None``: none since it was last reopened)."""
    _validate_feature_name(feature)
    return _backend(backend, gsd_dir).attempts(feature)


def reopen(
    feature: str, gsd_dir: GsdDir = GSD_DIR, *, backend: LockBackend | str | None = None
) -> bool:
    """Clear ``feature``'s done mark, failed state and attempt count so that ``claim`` hands
    it out again; True if there was any. A lock on the feature is left as it is."""
    _validate_feature_name(feature)
    store = _backend(backend, gsd_dir)
    reopened = store.reopen(feature)
    local = _local_markers(store)
    if local is not None:
        reopened = local.reopen(feature) or reopened
    return reopened


def reopen_finished(
    gsd_dir: GsdDir = GSD_DIR,
    *,
    failed_only: bool = False,
    backend: LockBackend | str | None = None,
) -> list[str]:
    """:func:`reopen` every feature that is failed (``failed_only``) or also done, or has
    failed attempts; the features reopened, by name. A pool is reset in one call, not one
    process per feature."""
    store = _backend(backend, gsd_dir)
    names = store.feature_names()
    if failed_only:
        names = [name for name in names if _failed_for_good(store, name)]
    return [name for name in names if reopen(name, backend=store)]


def _failed_for_good(store: LockBackend, feature: str) -> bool:
    record = store.attempts(feature)
    return record is not None and record.failed


# --------------------------------------------------------------------------- releasing


def release(
    feature: str,
    gsd_dir: GsdDir = GSD_DIR,
    *,
    pid: int | None = None,
    force: bool = False,
    backend: LockBackend | str | None = None,
) -> bool:
    """Remove ``pid``'s lock on ``feature``; True if a lock was removed, False if none.

    Another owner's lock (stale or not) raises :class:`NotOwnerError` and is left intact,
    unless ``force``. A corrupt or non-file entry is removed as clean-up.
    """
    _validate_feature_name(feature)
    owner = _owner_pid(pid)
    return _backend(backend, gsd_dir).release(feature, owner, force=force)


# --------------------------------------------------------------------------- holding


class FeatureLock:
    """Hold a feature lock for a block, keeping it fresh with a background heartbeat.

    ``timeout``: seconds to wait for a busy lock; 0 tries once, ``None`` (the default) waits
    for ever; a negative, ``nan`` or infinite value is refused with ``ValueError`` (``-1`` is
    not "for ever"). ``heartbeat``: seconds between refreshes (``None`` for none). ``pid``: the
    owner to record (default: this process). ``reclaim_dead``: also take over a lock whose owner
    is provably gone on this host. ``on_wait(info, seconds_left)`` is called while waiting.
    ``url`` (or ``backend``): the lock server; default ``MAHABHARATHA_LOCK_URL``, else files.
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

    _connection_grace: float | None = None  # the claim's connection kept this long (the pool)

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
        backend: LockBackend | str | None = None,
        lease: float | None = None,
        url: str | None = None,
    ) -> None:
        _validate_feature_name(feature)
        _valid_timeout(timeout)
        self.feature = feature
        self.gsd_dir = gsd_dir
        self.backend = _backend(url if backend is None else backend, gsd_dir)
        self.pid = os.getpid() if pid is None else _valid_pid(pid)
        self.timeout = _valid_seconds("timeout", timeout)
        self.reclaim_dead = reclaim_dead
        self.heartbeat = _valid_seconds("heartbeat", heartbeat)
        if self.heartbeat is not None and self.heartbeat < 0:  # it would refresh in a busy loop
            raise ValueError(f"Invalid heartbeat: {heartbeat!r} (must be >= 0; 0 or None: none)")
        self.lease = self._chosen_lease(_valid_seconds("lease", lease))
        if self.lease is not None and self.heartbeat:  # refresh 3 times a lease: 2 may fail
            self.heartbeat = min(self.heartbeat, self.lease / LEASE_REFRESHES)
        self.on_wait = on_wait
        self.command = command  # kept in the lock's owner details (``lock run``)
        self.on_lost = on_lost
        self._lost_override: Callable[[LockLostError], None] | None = None  # this hold's
        self.caller_pids = tuple(caller_pids)
        self.lost: LockLostError | None = None
        self.heartbeat_error: OSError | None = None
        self._mine: Held | None = None
        self._work_group_due: tuple[int, int | None] | None = None  # to record at the next beat
        self._deadline = 0.0  # ``_mine``'s expiry on the monotonic clock (``_with_deadline``)
        self._holder_process: int | None = None  # a forked child shares this object, not the lock
        self._mutex = threading.Lock()  # heartbeat thread vs. release in the caller's thread
        self._stop = threading.Event()  # ends the cut-off
        # Who beats (``_beat_once``): a thread of its own, a pool worker's shared one, or
        # ``None``: an event loop's task, which also rests the backend its locks share.
        self._beats: Heartbeat | None = Heartbeat(feature)
        self._own_beats = True
        self._handed: WorkProof | None = None  # the proof handed on (``proof_fds``), made once
        self._cut_off: threading.Thread | None = None  # ``_cut_off_loop``'s thread
        self._declaring = threading.Lock()  # the cut-off vs. the heartbeat declaring the loss
        _LIVE_LOCKS.add(self)

    def _chosen_lease(self, lease: float | None) -> float | None:
        """The lease of this holder: the one given, else the backend's lease for a holder that
        refreshes (PostgreSQL: ``run_lease``), else none (files: fixed at 2 h)."""
        if lease is not None and lease <= 0:
            raise ValueError(f"Invalid lease: {lease!r} (must be a positive number of seconds)")
        if lease is not None:
            return lease
        return self.backend.run_lease

    @property
    def token(self) -> int | None:
        """The fencing token of our acquisition (None: not held, or files: no tokens)."""
        mine = self._mine
        return None if mine is None else mine.token

    def _forget_after_fork(self) -> None:
        """In a freshly forked child (one thread, run by ``os.register_at_fork``): the mutex
        may have been held by the heartbeat thread, which does not exist here. (The lock itself
        is the parent's: ``_holder_process`` keeps the child's hands off it.)"""
        # Race: fork while the heartbeat held the mutex; the child's copy would stay locked.
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._handed = None  # its descriptors stay open here: this child is the holder's work
        self._cut_off = None
        self._declaring = threading.Lock()

    @property
    def held(self) -> bool:
        """True while our lock is on disk, as far as we know, and not yet stale (and we are the
        process that took it, not a child forked from it)."""
        if self._holder_process != os.getpid() or self.lost is not None:
            return False  # a forked child's, or given up (the cut-off before the lease's end)
        return self.expires_at is not None and not self._expired()

    @property
    def expires_at(self) -> float | None:
        """When our lock turns stale unless refreshed (epoch seconds); None when not held.

        Past it, another process may rightly reclaim the lock: a holder whose heartbeat keeps
        failing has lost it even before a refresh tells it so.
        """
        return None if self._mine is None else self._mine.expires_at

    def __repr__(self) -> str:
        state = "lost" if self.lost else "held" if self.held else "not held"
        return (
            f"<{type(self).__name__} {self.feature!r} in {os.fspath(self.gsd_dir)!r} "
            f"pid={self.pid} {state}>"
        )

    def acquire(
        self,
        *,
        on_wait: WaitCallback | None = None,
        on_lost: Callable[[LockLostError], None] | None = None,
    ) -> Self:
        """Take the lock (waiting as ``timeout`` says) and start the heartbeat; return self.

        ``on_wait`` and ``on_lost``, when given, replace the object's own for this acquisition
        only (a caller such as ``lock run`` adds its own checks without rewriting the object).

        Raises :class:`LockHeldError` when it is held by someone else (``LockTimeoutError``
        when a wait ran out), :class:`LockError` when this object already holds it,
        ``UnsafeLockPathError`` (an ``OSError``) when a symlink, a file or a directory stands
        where the feature folder or the lock should be, and ``OSError`` for other trouble on
        disk (permissions, a read-only or full file system).
        """
        if self._mine is not None:
            raise LockError(f"this FeatureLock already holds {self.feature!r}")
        self._adopt(
            acquire(
                self.feature,
                self.gsd_dir,
                pid=self.pid,
                timeout=self.timeout,
                reclaim_dead=self.reclaim_dead,
                on_wait=self.on_wait if on_wait is None else on_wait,
                command=self.command,
                caller_pids=self.caller_pids,
                backend=self.backend,
                lease=self.lease,
            ),
            on_lost,
        )
        self._rest_backend()
        try:
            self._start_heartbeat()
        except BaseException:
            # Race: interrupted (or out of threads) with the lock taken: never leave it behind.
            self.release()
            raise
        return self

    def _adopt(self, held: Held, on_lost: Callable[[LockLostError], None] | None) -> None:
        """Make ``held`` this object's acquisition, in this process, ``on_lost`` its own."""
        self._holder_process = os.getpid()
        self._lost_override = on_lost
        self.lost = None
        self._mine = self._with_deadline(held)

    def _start_heartbeat(self) -> None:
        """Hand the hold to its heartbeat (:class:`HeartbeatStartError`: out of threads); a
        lock with its own heartbeat and a lease on a server also gets the cut-off."""
        if not self.heartbeat or self._beats is None:
            return
        self._stop.clear()
        self._beats.hold(self)
        if self.lease is None or not self._own_beats:
            return
        self._cut_off = threading.Thread(
            target=self._cut_off_loop, name=f"lock-cut-off-{self.feature}", daemon=True
        )
        try:
            signals.start_without_signals(self._cut_off)
        except RuntimeError as error:  # "can't start new thread": a process or memory limit
            self._stop_heartbeat()
            raise HeartbeatStartError(self.feature, str(error)) from error

    def _cut_off_loop(self) -> None:
        """Declare the lock lost :func:`cut_off_notice` before its lease can end on the server,
        unless a refresh got through meanwhile (it moves ``_deadline``). The heartbeat alone
        cannot: a refresh on a frozen link blocks it for ``--connect-timeout`` at a time."""
        assert self.lease is not None
        notice = cut_off_notice(self.lease)
        while (left := self._deadline - notice - monotonic()) > 0:
            if self._stop.wait(left):
                return  # released (or lost by the heartbeat's own finding)
        reason = f"no refresh got through, and its lease can run out in {notice:g} s"
        self._declare_lost(LockLostError(self.feature, reason, self._deadline - notice / 5))

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
            sent = monotonic()  # the new lease runs from no earlier than this
            try:
                refreshed = self._refreshed(self._mine)
                if refreshed.sent is None:  # else the backend's, once connected
                    refreshed = refreshed._replace(sent=sent)
                self._mine = self._with_deadline(refreshed)
            except LockLostError:
                self._mine = None
                raise
            self._rest_backend()

    def _refreshed(self, mine: Held) -> Held:
        """``mine`` refreshed; with a command's group still to record, recorded in the same
        write (then no longer due)."""
        due = self._work_group_due
        if due is None:
            return self.backend.refresh(mine)
        fresh = self.backend.record_work_group(mine, *due)
        self._work_group_due = None
        return fresh if fresh is not mine else self.backend.refresh(mine)

    def _rest_backend(self) -> None:
        """Between refreshes a holder keeps no server connection (a backend that has them:
        PostgreSQL's ``rest``): 200 holders against a server of 40 connection slots. An
        event loop's locks (no ``_beats``) are rested by the loop, never under a call."""
        if self.heartbeat and self._beats is not None:
            self.backend.rest()

    def _beat_once(self, first: bool = False) -> float | None:
        """One heartbeat: refresh, and say when the next is due (seconds), or ``None`` once
        the lock is lost (:attr:`lost` set, ``on_lost`` told). The rule of every heartbeat:
        :class:`Heartbeat`'s thread and ``AsyncFeatureLock``'s task. The ``first`` step of a
        hold that keeps its claim's connection for a grace (:class:`PoolLock`) lets it go."""
        assert self.heartbeat is not None
        if self.lost is not None:
            return None  # declared by the cut-off: given up
        if first and self._connection_grace is not None:
            with self._mutex:
                self._rest_backend()
            return self.heartbeat
        try:
            self.refresh()
        except LockLostError as error:
            self._declare_lost(error)
            return None
        except OSError as error:
            # A transient failure (busy guard, full disk): retry sooner, and keep the error
            # where the holder can see it; ``held`` turns False if the lock expires meanwhile.
            self.heartbeat_error = error
            if self._expired():
                reason = f"refreshes failed until the lock turned stale ({error})"
                self._declare_lost(LockLostError(self.feature, reason))
                return None
            return max(self.heartbeat / 4, 0.01)
        self.heartbeat_error = None
        return self.heartbeat

    def _with_deadline(self, mine: Held) -> Held:
        """Keep ``mine``'s expiry also as a deadline on the monotonic clock: its lease from
        when the statement that set it was sent (the server's lease cannot end sooner),
        else from now."""
        if mine.sent is None:
            self._deadline = monotonic() + (mine.expires_at - clock.now())
        else:
            self._deadline = mine.sent + (mine.expires_at - mine.timestamp)
        return mine

    def _expired(self) -> bool:
        """Past the lease by the wall clock (what other holders judge by on files) or by the
        monotonic clock. Race: a wall-clock step back during a partition kept the wall-clock
        rule alone satisfied while the server had already given the lock to another holder
        (CMD ran on beside it for as long as the step)."""
        expires = self.expires_at
        if expires is None:
            return False
        return clock.now() > expires or monotonic() > self._deadline

    def _declare_lost(self, error: LockLostError) -> None:
        with self._declaring:
            # Race: the cut-off and the heartbeat finding the loss at once: told once.
            if self.lost is not None:
                return
            self.lost = error
        logs.say(logs.WARNING, "%s", error)
        tell = self.on_lost if self._lost_override is None else self._lost_override
        if tell is not None:
            tell(error)

    def release(self, wait: ReleaseWait | None = None) -> None:
        """Stop the heartbeat and remove our lock (only if it is still exactly ours).

        Does nothing when the lock is not held (never taken, released, lost, or held by the
        process this one was forked from), and never removes another owner's lock. Raises
        ``OSError`` when the lock cannot be removed just now (permissions, an I/O error, the
        folder's guard stayed busy); the lock is then still ours and release can be retried.
        ``wait``: how to wait where the backend cannot release at once (files: another
        process's kernel lease on the lock file), as :class:`ReleaseWait` says.
        """
        self._stop_heartbeat()
        with self._mutex:
            self._forget_if_forked()
            mine = self._mine
            if mine is None:
                return
            if self.lost is not None:
                # Lost already (its lease ran out while the backend was unreachable): taking
                # back what may be left is best effort, and a failure to reach the backend is
                # not this release's news (the loss was reported).
                with suppress(OSError):
                    self.backend.release_held(mine)
                self._mine = None
                self._close_handed()
                return
            # On an error the lock stays ours (``_mine`` kept), so release can be tried again.
            self.backend.release_held(mine, wait)
            self._mine = None
            self._close_handed()

    def work_proof(self) -> WorkProof | None:
        """A proof of life for work this holder starts (``lock run``'s command): pass its
        ``fd`` to the child (``pass_fds``), then ``close_ours()``; the lock's owner then stays
        alive while any process of that work holds it, even after this one died. ``None`` when
        the lock carries no proof (not held here, another owner pid, a backend or file system
        without one). Python's ``subprocess`` closes descriptors by default: work started
        without it does not count."""
        mine = self._mine
        if mine is None or self._holder_process != os.getpid():
            return None
        return self.backend.work_proof(mine)

    def record_work_group(self, pgid: int, leader_start: int | None) -> None:
        """Record with the lock the process group ``pgid`` (leader started at
        ``leader_start``) that ``lock run`` made for its command: its members count as the
        owner's work, also after this process died (proof or no proof). A lock found lost is
        declared so (as the heartbeat would); a failed write (a busy guard, a full disk) is
        tried again by each heartbeat until one succeeds."""
        with self._mutex:
            self._forget_if_forked()
            if self._mine is None:
                return
            try:
                fresh = self.backend.record_work_group(self._mine, pgid, leader_start)
                if fresh is not self._mine:  # rewritten (files): a refresh, a new deadline
                    self._mine = self._with_deadline(fresh)
            except LockLostError as error:
                self._mine, lost = None, error
            except OSError as error:
                # Race: a guard kept past its wait (another process's reclaim under load, a
                # foreign flock) left the group unrecorded for good: a SIGKILL from then on
                # let a second holder in beside work that dropped the proof in that group.
                self.heartbeat_error = error
                self._work_group_due = (pgid, leader_start)
                return
            else:
                return
        self._declare_lost(lost)

    @property
    def proof_fds(self) -> tuple[int, ...]:
        """The descriptors that carry this lock's proof of life to a child that does not
        inherit ours: ``subprocess.Popen(..., pass_fds=lock.proof_fds)``. The owner then stays
        alive while any such child runs, even after this process died. Empty when the lock is
        not held here or carries no proof (a lock server, a file system without one). Valid
        until the lock is let go; children started without them are not the lock's work."""
        handed = self._handed_proof()
        return () if handed is None or handed.fd is None else (handed.fd,)

    def proof_for_workers(self) -> HandedProof:
        """This lock's proof of life for ``multiprocessing`` workers started with ``spawn`` or
        ``forkserver`` (which inherit no descriptors): pass it as the pool's ``initializer``
        (``Pool(initializer=lock.proof_for_workers())``), or call it in your own initializer
        or worker. Workers started while the lock is held then keep its owner alive while they
        work, even after this process died; start them inside the ``with`` block."""
        return HandedProof(self._handed_proof())

    def _handed_proof(self) -> WorkProof | None:
        """The one work proof this hold hands on, made at the first request (off the
        acquire-release cycle) and closed when the lock is let go."""
        with self._mutex:
            if self._handed is None or self._handed.fd is None:
                self._handed = self.work_proof()
            return self._handed

    def _close_handed(self) -> None:
        """Our copy of the handed proof goes; children and workers keep theirs (they held an
        old lock's slot once it is let go, which vouches for no later lock)."""
        handed, self._handed = self._handed, None
        if handed is not None:
            handed.close()

    def abandon(self) -> None:
        """Stop the heartbeat and forget the lock without removing it: work that escaped us
        still holds its proof of life, so the lock must stay held (it ages out after 2 h)."""
        self._stop_heartbeat()
        with self._mutex:
            self._mine = None
            self._close_handed()

    def _stop_heartbeat(self) -> None:
        self._stop.set()
        if self._beats is not None:
            self._beats.let_go(self)
            if self._own_beats:
                self._beats.close()
        cut_off, self._cut_off = self._cut_off, None
        if cut_off is not None and cut_off.ident and cut_off is not threading.current_thread():
            cut_off.join()

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

_LIVE_HEARTBEATS: Final[weakref.WeakSet[Heartbeat]] = weakref.WeakSet()
"""Every :class:`Heartbeat` alive in this process, for the same hook."""


def _forget_locks_after_fork() -> None:
    for lock in list(_LIVE_LOCKS):
        lock._forget_after_fork()
    for beats in list(_LIVE_HEARTBEATS):
        beats._forget_after_fork()


os.register_at_fork(after_in_child=_forget_locks_after_fork)


# --------------------------------------------------------------------------- cleaning


def clean(
    gsd_dir: GsdDir = GSD_DIR,
    *,
    dry_run: bool = False,
    reclaim_dead: bool = False,
    features: Iterable[str] | None = None,
    problems: list[FeatureProblem] | None = None,
    backend: LockBackend | str | None = None,
) -> list[CleanedEntry]:
    """Remove stale, corrupt and non-file lock entries and orphan temp files; leave live locks.

    Each removal re-checks that the entry is the one judged. A feature (or an entry of it)
    that fails with an OS error is skipped and added to ``problems``, and the other features
    are cleaned all the same; without that list, the first such error is raised at the end.
    ``features``: only these (default: every feature).
    """
    return _backend(backend, gsd_dir).clean(
        dry_run=dry_run, reclaim_dead=reclaim_dead, problems=problems, features=features
    )


# --------------------------------------------------------------------------- the worker loop


class WorkResult(NamedTuple):
    """What a worker did with one feature it claimed.

    ``outcome``: ``done`` (marked done), ``failed`` (a failed attempt recorded; ``attempts``
    counts them, and the feature is failed for good once they reach the limit), ``released``
    (given back unmarked: the work was interrupted, or the backend keeps no attempts), ``lost``
    (the lock was taken away while the work ran: nothing marked), ``left`` (CMD failed and
    work it started still holds the lock: nothing recorded, the lock stays until that work
    ends). A ``done`` whose work still runs keeps its lock too; ``reason`` says so."""

    feature: str
    outcome: WorkOutcome
    exit_code: int | None
    attempts: int = 0
    reason: str | None = None
    log: str | None = None
    """The file the attempt's output went to (``lock work --log-dir``)."""

    def to_dict(self) -> dict[str, Any]:
        return self._asdict()


class WorkReport(NamedTuple):
    """How a worker's loop ended: ``finished`` (nothing left: every feature done or failed),
    ``waited-out`` (its wait ran out while others held features), ``once`` (``once``: it took
    one feature), ``stopped`` (a step raised :class:`StopWork`).
    ``failed``: the features failed for good at the end."""

    ended: WorkEnd
    results: tuple[WorkResult, ...]
    failed: tuple[str, ...] = ()
    busy: tuple[str, ...] = ()
    exit_code: int | None = None
    """``stopped``: the exit code the step asked for (a signal's)."""


class Heartbeat:
    """The heartbeat thread: runs ``_beat_once`` of the one lock it holds at a time, when due.
    A ``FeatureLock`` has one of its own; a pool worker one for its whole run (a thread per
    feature made it wait twice per feature for the thread to be scheduled). A lock let go of is
    never touched again: :meth:`let_go` returns once no step of it runs, and none starts
    after."""

    def __init__(self, name: str = "pool") -> None:
        self._name = f"lock-heartbeat-{name}"
        self._changed = threading.Condition()
        self._held: FeatureLock | None = None
        self._busy: FeatureLock | None = None  # whose step runs now, outside the condition
        self._first = True  # the held lock's next step is its first (the connection's grace)
        self._due = 0.0
        self._closed = False
        self._thread: threading.Thread | None = None
        _LIVE_HEARTBEATS.add(self)

    def _forget_after_fork(self) -> None:
        """In a freshly forked child (one thread): the heartbeat thread is the parent's."""
        # Race: fork while the thread held the condition or stepped a lock: the child's copy
        # would stay locked, or say for ever that a step runs (a release there waited on it).
        self._changed = threading.Condition()
        self._held = self._busy = None
        self._thread = None

    def hold(self, lock: FeatureLock) -> None:
        """Keep ``lock`` fresh from now on; :class:`HeartbeatStartError` when the thread cannot
        start (out of threads)."""
        assert lock.heartbeat is not None
        with self._changed:
            self._held, self._first, self._closed = lock, True, False
            self._due = monotonic() + min(lock._connection_grace or math.inf, lock.heartbeat)
            self._changed.notify()
        if self._thread is None or not self._thread.is_alive():
            self._start(lock)

    def let_go(self, lock: FeatureLock) -> None:
        """Stop keeping ``lock`` fresh; returns once no step of it runs (at once when called
        from that step: ``on_lost``, told by it, may release the lock)."""
        with self._changed:
            if self._held is lock:
                self._held = None
            # Race: its step started before we let go: wait it out (never from inside that
            # step, the heartbeat thread itself: it would wait for itself for ever).
            while self._busy is lock and self._thread is not threading.current_thread():
                self._changed.wait()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None

    def _start(self, lock: FeatureLock) -> None:
        self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
        try:
            signals.start_without_signals(self._thread)
        except RuntimeError as error:  # "can't start new thread": a process or memory limit
            self._thread = None
            self.let_go(lock)
            raise HeartbeatStartError(lock.feature, str(error)) from error

    def _loop(self) -> None:
        with self._changed:
            # Race: closed from its own step (``on_lost`` released), then held again: a new
            # thread took over; this one must not step beside it.
            while not self._closed and self._thread is threading.current_thread():
                lock = self._held
                left = None if lock is None else self._due - monotonic()
                if lock is None or (left is not None and left > 0):
                    self._changed.wait(left)
                    continue
                self._step(lock)

    def _step(self, lock: FeatureLock) -> None:
        """Run ``lock``'s due step outside the condition (a refresh may wait on the server),
        marked busy so that :meth:`let_go` waits for it. Called holding the condition."""
        self._busy, first = lock, self._first
        self._changed.release()
        try:
            after = lock._beat_once(first)
        finally:
            self._changed.acquire()
            self._busy = None
            self._changed.notify_all()
        if self._held is lock:
            self._first = False
            if after is None:
                self._held = None  # lost: its holder was told
            else:
                self._due = monotonic() + after


class PoolLock(FeatureLock):
    """A :class:`FeatureLock` over a feature the pool just claimed: ``acquire`` adopts that
    acquisition (and starts the heartbeat), ``release`` only stops the heartbeat, and
    :meth:`finish` ends the hold as the work's outcome says: done, a failed attempt, or a plain
    release. So whoever runs the work (``run_locked`` for ``lock work``) releases nothing
    itself: the mark and the release are one step of the backend's, never a release first."""

    _connection_grace = POOL_CONNECTION_GRACE_SECONDS  # a quick command's end reuses it

    def __init__(
        self,
        held: Held,
        gsd_dir: GsdDir,
        *,
        backend: LockBackend,
        heartbeat: float | None,
        command: Sequence[str] | None,
        lease: float | None,
        beats: Heartbeat | None = None,
        on_server_full: Callable[[ServerFullError], None] | None = None,
    ) -> None:
        super().__init__(
            held.feature,
            gsd_dir,
            pid=held.pid,
            timeout=0.0,
            backend=backend,
            heartbeat=heartbeat,
            command=command,
            lease=lease,
        )
        self._claimed: Held | None = held
        self._left: Held | None = None  # abandoned to work that still holds its proof
        # A failed command's leftover work: asked until it ends (then the attempt is recorded).
        self.left_running: Callable[[], bool] | None = None
        self._left_code = 1
        if beats is not None:  # the worker's, for its whole run
            self._beats, self._own_beats = beats, False
        # Told when the server turns away the end of this hold for want of a slot (run_pool's).
        self.on_server_full = on_server_full

    def acquire(
        self,
        *,
        on_wait: WaitCallback | None = None,
        on_lost: Callable[[LockLostError], None] | None = None,
    ) -> Self:
        claimed, self._claimed = self._claimed, None
        if claimed is None:
            raise LockError(f"the claim of {self.feature!r} was used already")
        self._adopt(claimed, on_lost)
        try:
            self._start_heartbeat()
        except BaseException:
            # Race: interrupted (or out of threads) with the lock taken: never leave it behind.
            self.finish(None, None, DEFAULT_ATTEMPTS)
            raise
        return self

    def release(self, wait: ReleaseWait | None = None) -> None:
        """Keep the lock: :meth:`finish` marks and releases it in one step."""
        self._stop_heartbeat()

    def abandon(self) -> None:
        """Leave the lock held for work that still holds its proof of life; kept aside for
        :meth:`finish_leaving_work`, which records the outcome without a release."""
        with self._mutex:
            self._left = self._mine
        super().abandon()

    def finish_leaving_work(
        self, exit_code: int, limit: int, still_running: Callable[[], bool] | None = None
    ) -> WorkResult:
        """End a hold that :meth:`abandon` left to work still running: exit code 0 marks the
        feature done and the lock stays until that work ends; another records nothing yet (a
        failed attempt would release the lock under the running work): once
        ``still_running`` answers no, :meth:`finish_left_work` records it and releases."""
        self._stop_heartbeat()
        with self._mutex:
            left, self._left = self._left, None
        feature = self.feature
        if left is None or self.lost is not None:
            return WorkResult(feature, WorkOutcome.LOST, exit_code)
        if exit_code != 0:
            if still_running is not None:
                with self._mutex:
                    self._left, self.left_running = left, still_running
                self._left_code = exit_code
            return WorkResult(
                feature, WorkOutcome.LEFT, exit_code, 0, f"exit code {exit_code}; {WORK_LEFT}"
            )
        try:
            _while_leased(left, lambda: self.backend.mark_done_holding(left), self.on_server_full)
        except UnsupportedError:  # no proof of life here: the release cannot let a holder in
            _while_leased(
                left, lambda: _mark_done(self.backend, feature, left.pid), self.on_server_full
            )
            return WorkResult(feature, WorkOutcome.DONE, 0)
        return WorkResult(feature, WorkOutcome.DONE, 0, 0, WORK_LEFT)

    def finish_left_work(self, limit: int) -> WorkResult:
        """The work a failed command left (:meth:`finish_leaving_work`) has ended: its failed
        attempt is recorded and the lock released, so that the feature can be built again."""
        with self._mutex:
            self._mine, self._left, self.left_running = self._left, None, None
        return self.finish(self._left_code, None, limit)

    def finish(self, exit_code: int | None, reason: str | None, limit: int) -> WorkResult:
        """End the hold: exit code 0 marks the feature done, another records a failed attempt
        (``reason``), ``None`` releases it unmarked; each releases the lock."""
        self._stop_heartbeat()
        with self._mutex:
            self._forget_if_forked()
            mine, self._mine = self._mine, None
        feature = self.feature
        if mine is None or self.lost is not None:
            if mine is not None:
                with suppress(OSError):  # lost already: taking back what is left is best effort
                    self.backend.release_held(mine)
            return WorkResult(feature, WorkOutcome.LOST, exit_code)
        if exit_code == 0:
            _while_leased(
                mine, lambda: _mark_done(self.backend, feature, mine.pid), self.on_server_full
            )
            return WorkResult(feature, WorkOutcome.DONE, 0)
        if exit_code is None:
            # A stop (a signal, CMD not started, an interrupted task): one try, never a wait
            # for a slot as long as the lease; the lock would come free at its end anyway.
            self.backend.release_held(mine)
            return WorkResult(feature, WorkOutcome.RELEASED, None, 0, reason)
        why = reason or f"exit code {exit_code}"
        try:
            record = _while_leased(
                mine, lambda: self.backend.fail(feature, mine.pid, why, limit), self.on_server_full
            )
        except UnsupportedError:
            _while_leased(mine, lambda: self.backend.release_held(mine), self.on_server_full)
            return WorkResult(feature, WorkOutcome.RELEASED, exit_code, 0, why)
        return WorkResult(feature, WorkOutcome.FAILED, exit_code, record.tries, why)


WORK_LEFT: Final = (
    "its work still runs outside its process group; the lock stays held until it ends"
)
"""What a result says of work that CMD left running, holding the lock's proof of life."""


def _while_leased(
    mine: Held,
    operation: Callable[[], _T],
    on_server_full: Callable[[ServerFullError], None] | None = None,
) -> _T:
    """``operation`` (the end of a hold: done, a failed attempt), asked again while
    the server has no free connection slot and ``mine``'s lease lasts, saying so
    (``on_server_full``). The lock is still ours till then; giving up at ``--connect-timeout``
    left it held till the lease ran out, and a done command's outcome lost (its feature run
    again)."""
    ends = monotonic() + (mine.expires_at - clock.now())
    while True:
        try:
            return operation()
        except ServerFullError as full:
            if monotonic() >= ends:
                raise
            if on_server_full is not None:
                on_server_full(full)
        _pause_for_a_slot()


def _pause_for_a_slot() -> None:
    """Between two rounds of connecting refused for want of a slot (each round retries for
    ``--connect-timeout``): a jittered pause, so that refused workers do not come back at once
    (each refused connection costs the server a process)."""
    sleep(waiting.jittered(SLOT_PAUSE_SECONDS))


class StopWork(Exception):
    """Raised by a step whose work was interrupted (a signal): the loop ends with ``result``,
    and the worker exits ``exit_code``."""

    def __init__(self, result: WorkResult, exit_code: int) -> None:
        super().__init__(result.feature)
        self.result = result
        self.exit_code = exit_code


WorkStep = Callable[[PoolLock], WorkResult]
"""One feature's work, given the claimed lock (held when it is entered): its result."""


def run_pool(
    step: WorkStep,
    features: Sequence[str] | None = None,
    gsd_dir: GsdDir = GSD_DIR,
    *,
    attempts: int = DEFAULT_ATTEMPTS,
    wait: float | None = None,
    reclaim_dead: bool = False,
    once: bool = False,
    backend: LockBackend | str | None = None,
    heartbeat: float | None = HEARTBEAT_SECONDS,
    command: Sequence[str] | None = None,
    on_result: Callable[[WorkResult], None] | None = None,
    problems: list[FeatureProblem] | None = None,
    on_server_full: Callable[[ServerFullError], None] | None = None,
    retry_delay: float = RETRY_DELAY_SECONDS,
    on_waiting: Callable[[LockInfo], None] | None = None,
) -> WorkReport:
    """The worker loop under :func:`work` and ``lock work``: claim (as :func:`claim_next`,
    owner this process), run ``step`` with the lock held, again; while nothing is free but
    others hold features, wait for a release (``wait`` seconds at most each time; ``None``:
    for ever). Ends when nothing is left, when the wait ran out, after one feature with
    ``once``, or when a step raises :class:`StopWork`. ``on_server_full`` is told, once per
    run, that the server turned the worker away for want of a connection slot (it waits on
    for one, to claim or to record a command's outcome); ``on_waiting``, once per run, which
    feature (and holder) the worker waits for when only features held by others are left.
    A feature whose attempt failed rests ``retry_delay`` seconds before it is claimed again
    (meanwhile it counts as held)."""
    store = _backend(backend, gsd_dir)
    candidates = list(features) if features else store.feature_names()
    _valid_attempts(attempts)
    _valid_timeout(wait)
    wait = _valid_seconds("wait", wait)
    owner = os.getpid()
    found: list[FeatureProblem] = [] if problems is None else problems
    pool = _Pool(store, candidates, owner, ownership.details_of(owner, command), found)
    pool.retry_delay = _valid_seconds("retry_delay", retry_delay) or 0.0
    pool.on_waiting = on_waiting
    lease = _valid_seconds("lease", store.run_lease)
    options = _ClaimOptions(reclaim_dead, False, attempts, lease)
    results: list[WorkResult] = []
    beats = Heartbeat()  # one thread for the worker's whole run, not one per feature
    leaving: list[PoolLock] = []  # held for work a failed command left running
    try:
        crowded = False
        told = _once(on_server_full)
        while True:
            outcome = _claim_patiently(pool, options, wait, told)
            if outcome.held is None and outcome.nothing_left and leaving:
                # Race: only features whose failed command left work are ours still; the
                # other workers wait for them (their owner, us, lives): wait for that work
                # to end, record the attempt, release, and claim again.
                over = _left_work_ended(leaving, wait)
                for each in over:
                    leaving.remove(each)
                    result = each.finish_left_work(attempts)
                    results.append(result)
                    if on_result is not None:
                        on_result(result)
                if over:
                    continue
            if outcome.held is None:
                if found and problems is None:
                    raise found[0].error
                ended = WorkEnd.FINISHED if outcome.nothing_left else WorkEnd.WAITED_OUT
                return WorkReport(ended, tuple(results), outcome.failed, outcome.busy)
            lock = PoolLock(
                outcome.held,
                gsd_dir,
                backend=store,
                heartbeat=heartbeat,
                command=command,
                lease=lease,
                beats=beats,
                on_server_full=told,
            )
            crowded = crowded or store.crowded(POOL_SLOTS_LOOK_SECONDS)
            if crowded:
                store.rest()  # others wait for a slot: CMD runs holding none
            try:
                result = step(lock)
            except StopWork as stop:
                results.append(stop.result)
                if on_result is not None:
                    on_result(stop.result)
                return WorkReport(WorkEnd.STOPPED, tuple(results), exit_code=stop.exit_code)
            results.append(result)
            if result.outcome == WorkOutcome.FAILED:
                pool.rest(result.feature)
            if on_result is not None:
                on_result(result)
            if lock.left_running is not None:
                leaving.append(lock)
            if once:
                return WorkReport(WorkEnd.ONCE, tuple(results))
    finally:
        beats.close()


def _left_work_ended(leaving: list[PoolLock], wait: float | None) -> list[PoolLock]:
    """The locks of ``leaving`` whose command's leftover work has ended, once one has (at
    most ``wait`` seconds; ``None``: for ever); none when the wait ran out."""
    deadline = waiting.Deadline(wait)
    while True:
        ended = [lock for lock in leaving if not _still_running(lock)]
        if ended or deadline.passed():
            return ended
        sleep(LEFT_WORK_POLL_SECONDS)


def _still_running(lock: PoolLock) -> bool:
    return lock.left_running is not None and lock.left_running()


def work(
    task: Callable[[str], object],
    features: Sequence[str] | None = None,
    gsd_dir: GsdDir = GSD_DIR,
    *,
    attempts: int = DEFAULT_ATTEMPTS,
    wait: float | None = None,
    reclaim_dead: bool = False,
    once: bool = False,
    backend: LockBackend | str | None = None,
    heartbeat: float | None = HEARTBEAT_SECONDS,
    on_result: Callable[[WorkResult], None] | None = None,
    retry_delay: float = RETRY_DELAY_SECONDS,
) -> WorkReport:
    """Work through a pool of features in this process: claim one, call ``task(feature)``
    holding its lock (refreshed in the background), mark it done when ``task`` returns, or
    record a failed attempt when it raises an ``Exception`` (its text is the reason) or
    returns ``False``; then the next. While nothing is free but other workers hold features,
    it waits for one to come back (``wait`` seconds at most; ``None``: for ever). A feature
    that failed ``attempts`` times is skipped until :func:`reopen`; one that failed fewer
    times rests ``retry_delay`` seconds before its next attempt.

    Returns a :class:`WorkReport` (``ended`` ``finished`` once every feature is done or
    failed). A ``KeyboardInterrupt`` (or any other ``BaseException``) releases the feature
    unmarked and propagates."""

    def step(lock: PoolLock) -> WorkResult:
        code, reason = 1, None
        try:
            with lock:
                answer = task(lock.feature)
            code = 1 if answer is False else 0
        except Exception as error:  # the task's failure: recorded as the attempt's reason
            reason = f"{type(error).__name__}: {error}"
        except BaseException:
            lock.finish(None, None, attempts)
            raise
        return lock.finish(code, reason, attempts)

    return run_pool(
        step,
        features,
        gsd_dir,
        attempts=attempts,
        wait=wait,
        reclaim_dead=reclaim_dead,
        once=once,
        backend=backend,
        heartbeat=heartbeat,
        on_result=on_result,
        retry_delay=retry_delay,
    )
