"""Feature locks for long-lived holders, waiters, worker pools and maintenance.

This layer talks to a :class:`~mahabharatha.backends.base.LockBackend` only (default: the folder
backend of ``gsd_dir``, :mod:`mahabharatha.backends.files`) and adds what is the same for every
backend: an explicit owner pid (a CLI process records the shell that called it), waiting with
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

import _signal  # type: ignore[import-not-found]  # (no stub: the C half of ``signal``)
import math
import os
import signal
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import suppress
from time import monotonic, sleep
from types import TracebackType
from typing import Any, Final, Self

from mahabharatha import ownership
from mahabharatha.backends import lock_url, shared_backend
from mahabharatha.backends.base import (
    AcquireResult,
    AlreadyHeldError,
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
    Requester,
    State,
    owner_is_gone,
)
from mahabharatha.backends.files import AUDIT_LOG_NAME, COMPLETED_MARKER_NAME, FileBackend
from mahabharatha.backends.liveness import CREATE_TIME_SLACK_SECONDS, owner_liveness
from mahabharatha.commands import _utils
from mahabharatha.constants import GSD_DIR
from mahabharatha.lockfile import MAX_PID, UnsafeLockPathError
from mahabharatha.lockfile import validate_feature_name as _validate_feature_name
from mahabharatha.proof import WorkProof

__all__ = [
    "AUDIT_LOG_NAME",
    "COMPLETED_MARKER_NAME",
    "CREATE_TIME_SLACK_SECONDS",
    "HEARTBEAT_SECONDS",
    "AlreadyHeldError",
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
    "NotHeldError",
    "NotOwnerError",
    "Owner",
    "UnsafeLockPathError",
    "WaitCallback",
    "acquire",
    "claim",
    "claim_held",
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

# The C functions under ``signal``: its wrappers turn every answer into an enum, nine enum
# lookups per acquire (one raising and catching ValueError), a quarter of an uncontended cycle.
_get_handler: Final[Callable[[int], Any]] = _signal.getsignal
_set_handler: Final[Callable[[int, Any], Any]] = _signal.signal

GsdDir = str | os.PathLike[str]


def _backend(backend: LockBackend | str | None, gsd_dir: GsdDir) -> LockBackend:
    """The backend to use: the caller's, or the one its URL names, or the server
    ``MAHABHARATHA_LOCK_URL`` names, or the folder backend of ``gsd_dir``. A server's backend
    is kept for the process (``shared_backend``: one warm connection, closed at exit)."""
    if backend is not None and not isinstance(backend, str):
        return backend
    url = backend or lock_url()
    return FileBackend(gsd_dir) if url is None else shared_backend(url, gsd_dir)


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
    are skipped and reported as :func:`status` does."""
    return _backend(backend, gsd_dir).survey(problems=problems)


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
        return backend.try_acquire(feature, requester, reclaim_dead=reclaim_dead)
    return backend.try_acquire(feature, requester, reclaim_dead=reclaim_dead, lease=lease)


def _held_by(
    holder: LockInfo | None, details: ownership.OwnerDetails | None, callers: set[int]
) -> bool:
    """Is the active lock that stopped us the caller's own? Its pid must be a caller's, its
    host (where the backend records one) ours, and its owner details must show our boot and
    our PID namespace: the same pid number in a container's namespace, or before a reboot,
    is someone else. Without readable details we cannot tell, and say "not yours": a wrong
    "busy" costs a wait, a wrong "yours" tells a caller it holds someone else's lock. Details
    with a start time other than the one the caller's pid runs with now are a dead owner's
    whose pid number was reused."""
    if holder is None or holder.state is not State.ACTIVE or holder.pid not in callers:
        return False
    if holder.host is not None and holder.host != ownership.host_name():
        return False
    return ownership.judgeable(details) and ownership.could_own(details, holder.pid)


class _SignalsDeferred:
    """``with _SignalsDeferred():`` holds back the Python handlers of :data:`DEFERRED_SIGNALS`
    for the block, then runs them (a class, not a ``@contextmanager``: it wraps every try).

    Only the main thread runs Python signal handlers, so only there can a ``KeyboardInterrupt``
    land between the ``link()`` that publishes our lock and the return that hands it over.
    """

    __slots__ = ("caught", "saved")

    def __init__(self) -> None:
        self.caught: list[int] = []
        self.saved: dict[int, Any] = {}

    def __enter__(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        caught = self.caught

        def remember(signum: int, _frame: object) -> None:
            caught.append(signum)

        try:
            for signum in DEFERRED_SIGNALS:
                handler = _get_handler(signum)
                if callable(handler):  # SIG_DFL / SIG_IGN raise nothing in Python: leave them
                    self.saved[signum] = _set_handler(signum, remember)
        except BaseException:
            self.__exit__()  # put back the handlers already replaced
            raise

    def __exit__(self, *_exc: object) -> None:
        for signum, handler in self.saved.items():
            _set_handler(signum, handler)
        for signum in self.caught:
            self.saved[signum](signum, None)  # may raise: the caller's frame knows what it holds


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
        with _SignalsDeferred():
            # Race: Ctrl-C right after link() published our lock: deferred to the end of this
            # block, by when ``outcome`` knows the exact lock to take back.
            outcome = _try_once(backend, feature, pid, reclaim_dead, details, lease)
    except BaseException:
        if outcome is not None and outcome.held is not None:
            with _SignalsDeferred():  # a second Ctrl-C must not cut the take-back short
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
    callers = {owner, *caller_pids}
    deadline = None if timeout is None else monotonic() + max(0.0, timeout)
    delays = _backoff_delays()
    while True:
        outcome = _try_uninterrupted(store, feature, owner, reclaim_dead, details, lease)
        if outcome.held is not None:
            return outcome.held
        info = outcome.holder
        assert info is not None  # a try that did not win names who stopped it
        if outcome.holder_is_caller or _held_by(info, outcome.holder_details, callers):
            raise AlreadyHeldError(info)  # waiting would wait for ourselves
        left = None if deadline is None else deadline - monotonic()
        if left is not None and left <= 0:
            raise (LockTimeoutError if timeout else LockHeldError)(_judged(store, info))
        if on_wait is not None:
            on_wait(info, left)
        delay = next(delays)
        _pause(store, feature, delay if left is None else min(delay, left), left)


LEASE_REFRESHES: Final = 3
"""A holder with a chosen lease (PostgreSQL) refreshes at least 3 times per lease: two
refreshes may fail (a server restart, a lost connection) before the lock is in danger."""

WAKE_UP_SLICE_SECONDS: Final = 0.25
"""A backend that wakes waiters on release (PostgreSQL's LISTEN/NOTIFY) is waited on for at most
this long between tries: the poll rate when a wake-up is missed, never faster."""


def _pause(backend: LockBackend, feature: str, delay: float, left: float | None) -> None:
    """Between two tries: sleep ``delay`` (backoff), or, where the backend wakes waiters on a
    release, wait for that (at most a slice, or what is left of the wait)."""
    wait_for_release = getattr(backend, "wait_for_release", None)
    if wait_for_release is None:
        sleep(delay)
        return
    wait_for_release(
        feature, WAKE_UP_SLICE_SECONDS if left is None else min(WAKE_UP_SLICE_SECONDS, left)
    )


def _backoff_delays() -> Iterator[float]:
    """Exponential backoff with jitter: 2 ms, 4 ms, ... 25 ms; 250 ms once the wait is long."""
    import random  # only a waiter needs it: keeps it out of every CLI call's cold start

    started = monotonic()
    ceiling = BACKOFF_FIRST_SECONDS
    while True:
        yield random.uniform(ceiling / 2, ceiling)
        patient = monotonic() - started > PATIENT_AFTER_SECONDS
        ceiling = min(ceiling * 2, PATIENT_MAX_SECONDS if patient else BACKOFF_MAX_SECONDS)


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


def claim(
    features: Sequence[str] | None = None,
    gsd_dir: GsdDir = GSD_DIR,
    *,
    pid: int | None = None,
    reclaim_dead: bool = False,
    include_done: bool = False,
    problems: list[FeatureProblem] | None = None,
    backend: LockBackend | str | None = None,
    lease: float | None = None,
) -> str | None:
    """Acquire the first free feature of ``features`` (default: every feature folder, by name).

    Workers claiming at once never get the same feature: each try is a full acquire. A feature
    marked done (:func:`done`) is never returned unless ``include_done``: the marker is looked
    for again once the lock is held, and a done feature's lock is given straight back. A feature
    whose try fails with an OS error (a folder we may not enter) is skipped and added to
    ``problems``; without that list, the first such error is raised when nothing was claimed.
    ``lease`` as for :func:`acquire`. :func:`claim_held` returns the acquisition itself.
    """
    held = claim_held(
        features,
        gsd_dir,
        pid=pid,
        reclaim_dead=reclaim_dead,
        include_done=include_done,
        problems=problems,
        backend=backend,
        lease=lease,
    )
    return None if held is None else held.feature


def claim_held(
    features: Sequence[str] | None = None,
    gsd_dir: GsdDir = GSD_DIR,
    *,
    pid: int | None = None,
    reclaim_dead: bool = False,
    include_done: bool = False,
    problems: list[FeatureProblem] | None = None,
    backend: LockBackend | str | None = None,
    lease: float | None = None,
) -> Held | None:
    """:func:`claim`, answering the acquisition (its feature, and its token where the backend
    gives tokens). A backend that claims in one step (``try_claim``: PostgreSQL, one statement)
    is asked once; otherwise each candidate is tried in turn."""
    store = _backend(backend, gsd_dir)
    candidates = list(features) if features else store.feature_names()
    for feature in candidates:
        _validate_feature_name(feature)
    owner = _owner_pid(pid)
    try_claim = getattr(store, "try_claim", None)
    if try_claim is not None:
        details = ownership.details_of(owner)
        won: AcquireResult | None = try_claim(
            candidates,
            Requester(owner, details),
            reclaim_dead=reclaim_dead,
            lease=lease,
            include_done=include_done,
        )
        return None if won is None else won.held
    found: list[FeatureProblem] = [] if problems is None else problems
    for feature in candidates:
        try:
            held = _claim_one(store, feature, gsd_dir, owner, reclaim_dead, include_done, lease)
            if held is not None:
                return held
        except OSError as error:
            found.append(FeatureProblem(feature, str(error.filename or store.where()), error))
    if problems is None and found:
        raise found[0].error
    return None


def _claim_one(
    backend: LockBackend,
    feature: str,
    gsd_dir: GsdDir,
    owner: int,
    reclaim_dead: bool,
    include_done: bool,
    lease: float | None = None,
) -> Held | None:
    """Try to make ``owner`` the holder of ``feature`` unless it is done; the acquisition."""
    if not include_done and is_done(feature, gsd_dir, backend=backend):
        return None  # cheap: most done features are skipped without touching their lock
    outcome = _try_once(backend, feature, owner, reclaim_dead, lease=lease)
    if outcome.held is None:
        return None
    # Race: a worker marked the feature done and released it between our first look and our
    # acquire. ``done`` publishes the marker before it releases, so now that we hold the lock
    # the marker is certainly visible if the feature was finished: give the lock back.
    if include_done or not backend.is_done(feature):
        return outcome.held
    backend.release_held(outcome.held)
    return None


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
    written to the marker (ISO-8601, UTC).

    Raises :class:`NotHeldError` (nothing written) when ``pid`` (default: this process) does
    not hold the lock, and :class:`NotOwnerError` when another owner does.
    """
    _validate_feature_name(feature)
    owner = _owner_pid(pid)
    return _backend(backend, gsd_dir).done(feature, owner)


def reopen(
    feature: str, gsd_dir: GsdDir = GSD_DIR, *, backend: LockBackend | str | None = None
) -> bool:
    """Remove ``feature``'s completion marker so that ``claim`` hands it out again; True if
    there was one. A lock on the feature is left as it is."""
    _validate_feature_name(feature)
    return _backend(backend, gsd_dir).reopen(feature)


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
        self._deadline = 0.0  # ``_mine``'s expiry on the monotonic clock (``_with_deadline``)
        self._holder_process: int | None = None  # a forked child shares this object, not the lock
        self._mutex = threading.Lock()  # heartbeat thread vs. release in the caller's thread
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        _LIVE_LOCKS.add(self)

    def _chosen_lease(self, lease: float | None) -> float | None:
        """The lease of this holder: the one given, else the backend's lease for a holder that
        refreshes (PostgreSQL: ``run_lease``), else none (files: fixed at 2 h)."""
        if lease is not None and lease <= 0:
            raise ValueError(f"Invalid lease: {lease!r} (must be a positive number of seconds)")
        if lease is not None:
            return lease
        default: float | None = getattr(self.backend, "run_lease", None)
        return default

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
        self._beat = None

    @property
    def held(self) -> bool:
        """True while our lock is on disk, as far as we know, and not yet stale (and we are the
        process that took it, not a child forked from it)."""
        if self._holder_process != os.getpid():
            return False
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
        self._holder_process = os.getpid()
        self._lost_override = on_lost
        self._mine = self._with_deadline(
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
            )
        )
        self._rest_backend()
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
            try:
                self._mine = self._with_deadline(self.backend.refresh(self._mine))
            except LockLostError:
                self._mine = None
                raise
            self._rest_backend()

    def _rest_backend(self) -> None:
        """Between refreshes a holder keeps no server connection (a backend that has them:
        PostgreSQL's ``rest``): 200 holders against a server of 40 connection slots."""
        rest = getattr(self.backend, "rest", None)
        if rest is not None and self.heartbeat:
            rest()

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

    def _with_deadline(self, mine: Held) -> Held:
        """Keep ``mine``'s expiry also as a deadline on the monotonic clock, measured now."""
        self._deadline = monotonic() + (mine.expires_at - _utils.now())
        return mine

    def _expired(self) -> bool:
        """Past the lease by the wall clock (what other holders judge by on files) or by the
        monotonic clock. Race: a wall-clock step back during a partition kept the wall-clock
        rule alone satisfied while the server had already given the lock to another holder
        (CMD ran on beside it for as long as the step)."""
        expires = self.expires_at
        if expires is None:
            return False
        return _utils.now() > expires or monotonic() > self._deadline

    def _declare_lost(self, error: LockLostError) -> None:
        self.lost = error
        tell = self.on_lost if self._lost_override is None else self._lost_override
        if tell is not None:
            tell(error)

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
            if self.lost is not None:
                # Lost already (its lease ran out while the backend was unreachable): taking
                # back what may be left is best effort, and a failure to reach the backend is
                # not this release's news (the loss was reported).
                with suppress(OSError):
                    self.backend.release_held(mine)
                self._mine = None
                return
            # On an error the lock stays ours (``_mine`` kept), so release can be tried again.
            self.backend.release_held(mine)
            self._mine = None

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
        make: Callable[[Held], WorkProof | None] | None = getattr(self.backend, "work_proof", None)
        return None if make is None else make(mine)

    def abandon(self) -> None:
        """Stop the heartbeat and forget the lock without removing it: work that escaped us
        still holds its proof of life, so the lock must stay held (it ages out after 2 h)."""
        self._stop.set()
        if self._beat is not None and self._beat is not threading.current_thread():
            self._beat.join()
        self._beat = None
        with self._mutex:
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
