"""The functional lock API: look (inspect, status, survey), acquire and its wait, release,
done/fail/reopen and their attempts, clean. Each call opens (or is given) a backend and does one
thing; ``FeatureLock``, the claim engine and the worker loop build on these."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from time import monotonic, sleep

from mahabharatha import logs, signals, waiting
from mahabharatha.backends import lock_url, open_backend, shared_backend
from mahabharatha.backends.base import (
    DEFAULT_ATTEMPTS,
    AcquireResult,
    AlreadyHeldError,
    Attempts,
    CleanedEntry,
    FeatureProblem,
    HearsReleases,
    Held,
    LocalFolder,
    LockBackend,
    LockHeldError,
    LockInfo,
    LockServer,
    LockTimeoutError,
    ReleaseWait,
    Requester,
    Verdict,
    describe_holder,
    lacks,
)
from mahabharatha.backends.liveness import OwnerFacts, judge
from mahabharatha.constants import GSD_DIR, WAKE_UP_SLICE_SECONDS
from mahabharatha.names import MAX_PID
from mahabharatha.names import validate_feature_name as _validate_feature_name
from mahabharatha.owner import ownership
from mahabharatha.states import State

GsdDir = str | os.PathLike[str]


def _backend(backend: LockBackend | str | None, gsd_dir: GsdDir) -> LockBackend:
    """The caller's backend, else its URL's or ``MAHABHARATHA_LOCK_URL``'s, else ``gsd_dir``'s."""
    if backend is not None and not isinstance(backend, str):
        return backend
    return shared_backend(backend or lock_url(), gsd_dir)


def _owner_pid(pid: int | None) -> int:
    if pid is not None and not 1 <= pid <= MAX_PID:
        raise ValueError(f"Invalid pid: {pid} (must be 1 to {MAX_PID})")
    return os.getpid() if pid is None else pid


# --------------------------------------------------------------------------- looking


def inspect(
    feature: str, gsd_dir: GsdDir = GSD_DIR, *, backend: LockBackend | str | None = None
) -> LockInfo:
    """The lock on ``feature`` (state ``free``: none); ``UnsafeLockPathError``: something in the
    way of its folder or lock."""
    _validate_feature_name(feature)
    return _backend(backend, gsd_dir).inspect(feature)


def status(
    gsd_dir: GsdDir = GSD_DIR,
    *,
    problems: list[FeatureProblem] | None = None,
    backend: LockBackend | str | None = None,
) -> list[LockInfo]:
    """Every feature that has a lock entry, by name; a folder that cannot be looked into is
    added to ``problems`` (without it: its error is raised after the scan)."""
    return _backend(backend, gsd_dir).status(problems=problems)


def survey(
    gsd_dir: GsdDir = GSD_DIR,
    *,
    problems: list[FeatureProblem] | None = None,
    backend: LockBackend | str | None = None,
) -> list[LockInfo]:
    """Every feature, by name: its lock as :func:`status` lists it, else ``done``, ``failed``
    (a server's: as its local folder says) or ``free``."""
    store = _backend(backend, gsd_dir)
    infos = store.survey(problems=problems)
    local = _local_markers(store)
    return infos if local is None else [_as_finished_here(local, info) for info in infos]


def _as_finished_here(local: LockBackend, info: LockInfo) -> LockInfo:
    if info.state is not State.FREE:
        return info
    try:
        state, record = _finished_in(local, info.feature, include_done=False, attempts=None)
    except OSError:
        return info
    return info if state is None else dataclasses.replace(info, state=state).with_attempts(record)


def _finished_in(
    store: LockBackend, feature: str, *, include_done: bool, attempts: int | None
) -> tuple[State | None, Attempts | None]:
    """``feature``'s state if done or failed (at ``attempts``, or the recorded limit), and its
    attempts."""
    if not include_done and store.is_done(feature):
        return State.DONE, None
    record = store.attempts(feature)
    if record is None or record.tries < (record.limit if attempts is None else attempts):
        return None, record
    return State.FAILED, record


# --------------------------------------------------------------------------- acquiring


def _try_once(
    backend: LockBackend,
    feature: str,
    requester: Requester,
    reclaim_dead: bool,
    lease: float | None,
) -> AcquireResult:
    chosen = {} if lease is None else {"lease": lease}  # a backend without leases sees none
    return _said(backend.try_acquire(feature, requester, reclaim_dead=reclaim_dead, **chosen))


def _said(outcome: AcquireResult) -> AcquireResult:
    """``outcome``, logged when it reclaimed another holder's lock to win."""
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


def _held_by(outcome: AcquireResult, callers: set[int]) -> bool:
    """Is the lock that stopped a lost try held by one of ``callers`` (the one judgement)?"""
    holder = outcome.holder
    if outcome.verdict is Verdict.CALLER:
        return True
    if holder is None or holder.state is not State.ACTIVE:
        return False
    facts = OwnerFacts(holder.pid, details=outcome.holder_details, host=holder.host)
    return judge(facts, callers, alive=False).verdict is Verdict.CALLER


WaitCallback = Callable[[LockInfo, float | None], None]
"""Called while waiting with the holder's info and the seconds left (``None``: no limit)."""


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
    """Make ``pid`` (default: this process) the holder of ``feature``; never left held when
    interrupted. ``timeout`` 0 tries once, ``None`` waits for ever. Arguments and errors:
    ``design/reference.md`` (acquire)."""
    return _Acquiring(
        feature, gsd_dir, pid, timeout, reclaim_dead, lease, command, caller_pids, backend, on_wait
    ).run()


class _Acquiring:
    """One acquire's loop: try, judge who stopped us, pause (:meth:`run` sleeps; the async
    driver awaits). Made per acquire: a ``FeatureLock``'s arguments may have changed."""

    def __init__(
        self,
        feature: str,
        gsd_dir: GsdDir,
        pid: int | None,
        timeout: float | None,
        reclaim_dead: bool,
        lease: float | None,
        command: Sequence[str] | None,
        caller_pids: Iterable[int],
        backend: LockBackend | str | None,
        on_wait: WaitCallback | None,
    ) -> None:
        _validate_feature_name(feature)
        self.timeout = self.left = _valid_timeout(timeout)
        self.owner = _owner_pid(pid)
        self.store = _backend(backend, gsd_dir)
        self.feature, self.reclaim_dead, self.lease = feature, reclaim_dead, lease
        self.on_wait, self.said = on_wait, False
        self.requester = Requester(self.owner, ownership.details_of(self.owner, command))
        self.callers = {self.owner, *caller_pids}
        self.deadline = waiting.Deadline(self.timeout)
        self.delays = waiting.backoff()

    def run(self) -> Held:
        while True:
            outcome = self.try_once()
            if outcome.held is not None:
                # Race: a signal handler runs at a call; one between the try and this return
                # would leave the lock held unknown to the caller: there is none.
                return outcome.held
            pause = self.after(outcome)
            if isinstance(pause, LockInfo):
                raise self.judged_error(pause)
            store = self.store
            if lacks(store, HearsReleases) or not isinstance(store, HearsReleases):
                sleep(pause)
            else:
                store.wait_for_release(self.feature, self.slice())

    def try_once(self) -> AcquireResult:
        """One try whose lock is returned or, when a signal handler raises, removed again."""
        outcome = None
        try:
            with signals.Deferred():
                # Race: Ctrl-C right after link() published our lock: deferred to the end of
                # this block, by when ``outcome`` knows the exact lock to take back.
                sent = monotonic()  # the lease on the server runs from no earlier than this
                outcome = _try_once(
                    self.store, self.feature, self.requester, self.reclaim_dead, self.lease
                )
                if outcome.held is not None and outcome.held.sent is None:  # else the backend's
                    outcome = outcome._replace(held=outcome.held._replace(sent=sent))
        except BaseException:
            if outcome is not None and outcome.held is not None:
                with signals.Deferred():  # a second Ctrl-C must not cut the take-back short
                    self.store.release_held(outcome.held)
            raise
        return outcome

    def after(self, outcome: AcquireResult) -> LockInfo | float:
        """After a lost try: the holder a wait ran out on, or the seconds to pause (``on_wait``
        told); :class:`AlreadyHeldError` when the holder is the caller."""
        holder = outcome.holder
        assert holder is not None  # a try that did not win names who stopped it
        if _held_by(outcome, self.callers):
            raise AlreadyHeldError(holder)
        self.left = self.deadline.left()
        if self.left is not None and self.left <= 0:
            return holder
        if not self.said:
            self.said = True
            logs.say(logs.INFO, "waiting: %s", describe_holder(holder))
        if self.on_wait is not None:
            self.on_wait(holder, self.left)
        return self.deadline.cap(next(self.delays))

    def slice(self) -> float:
        """The longest wait for a release heard: a stale or dead lock wakes no one."""
        return WAKE_UP_SLICE_SECONDS if self.left is None else min(WAKE_UP_SLICE_SECONDS, self.left)

    def judged_error(self, holder: LockInfo) -> LockHeldError:
        """The error of a wait that ran out on ``holder``, judged as status does."""
        try:
            now = self.store.inspect(holder.feature)
        except OSError:
            now = holder
        # Race: the holder changed since the try that stopped us: report the one that did.
        same = now.pid == holder.pid and now.timestamp == holder.timestamp
        return self.busy(now if same else holder)

    def busy(self, holder: LockInfo) -> LockHeldError:
        return (LockTimeoutError if self.timeout else LockHeldError)(holder)


def _valid_timeout(timeout: float | None, name: str = "timeout") -> float | None:
    # A negative wait is refused, not guessed at (-1: "for ever" to some, "once" to others).
    if timeout is not None and timeout < 0:
        raise ValueError(
            f"Invalid {name}: {timeout} (seconds >= 0; 0 tries once, None waits for ever)"
        )
    return _valid_seconds(name, timeout)


def _valid_seconds(name: str, value: float | None) -> float | None:
    """``None`` or finite seconds (``nan`` passes every comparison, ``inf`` is ``None``'s)."""
    if value is not None and not math.isfinite(value):
        raise ValueError(f"Invalid {name}: {value!r} (must be a finite number of seconds)")
    return value


def _valid_attempts(attempts: int) -> None:
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ValueError(f"Invalid attempts: {attempts!r} (a whole number >= 1)")


def _local_markers(store: LockBackend) -> LockBackend | None:
    """A server backend's local folders (their markers count too); ``None`` on files."""
    if lacks(store, LockServer) or not isinstance(store, LockServer):
        return None
    return open_backend(None, store.gsd_dir)


# ------------------------------------------------------------------ marking and letting go


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
    """Mark ``feature`` done, then release ``pid``'s lock; the marker's time (ISO-8601, UTC).
    :class:`NotHeldError` (nothing written) or :class:`NotOwnerError` when ``pid`` (default:
    this process) does not hold it."""
    _validate_feature_name(feature)
    owner = _owner_pid(pid)
    return _mark_done(_backend(backend, gsd_dir), feature, owner)


def _mark_done(
    store: LockBackend, feature: str, owner: int, wait: ReleaseWait | None = None
) -> str:
    stamp = store.done(feature, owner, wait)
    local = _local_markers(store)
    if isinstance(local, LocalFolder):
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
    """Record ``pid``'s failed attempt at ``feature``, then release its lock; the record. At
    ``attempts`` the feature is ``failed`` (claim skips it until :func:`reopen`). Errors as
    :func:`done`'s, and :class:`UnsupportedError` where no attempts are kept."""
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
    """Clear ``feature``'s done mark and attempts so that ``claim`` hands it out again (its lock
    stays); True if there was any."""
    _validate_feature_name(feature)
    store = _backend(backend, gsd_dir)
    reopened = store.reopen(feature)
    local = _local_markers(store)  # a server's features are reopened in their folders too
    return (local is not None and local.reopen(feature)) or reopened


def reopen_finished(
    gsd_dir: GsdDir = GSD_DIR,
    *,
    failed_only: bool = False,
    backend: LockBackend | str | None = None,
) -> list[str]:
    """:func:`reopen` every failed feature (and, unless ``failed_only``, done or tried); their
    names."""
    store = _backend(backend, gsd_dir)
    names = store.feature_names()
    if failed_only:
        names = [name for name in names if (tried := store.attempts(name)) and tried.failed]
    return [name for name in names if reopen(name, backend=store)]


def release(
    feature: str,
    gsd_dir: GsdDir = GSD_DIR,
    *,
    pid: int | None = None,
    force: bool = False,
    backend: LockBackend | str | None = None,
) -> bool:
    """Remove ``pid``'s (or a corrupt) lock on ``feature``; True if one was removed. Another
    owner's raises :class:`NotOwnerError` and stays, unless ``force``."""
    _validate_feature_name(feature)
    owner = _owner_pid(pid)
    return _backend(backend, gsd_dir).release(feature, owner, force=force)


def clean(
    gsd_dir: GsdDir = GSD_DIR,
    *,
    dry_run: bool = False,
    reclaim_dead: bool = False,
    features: Iterable[str] | None = None,
    problems: list[FeatureProblem] | None = None,
    backend: LockBackend | str | None = None,
) -> list[CleanedEntry]:
    """Remove stale, corrupt and non-file lock entries and orphan temps, each judged again;
    ``features``: only these. An OS error goes to ``problems`` (without it: raised at the end)."""
    return _backend(backend, gsd_dir).clean(
        dry_run=dry_run, reclaim_dead=reclaim_dead, problems=problems, features=features
    )
