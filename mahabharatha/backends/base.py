"""The seam between the lock layer and where locks live: one typed interface, many backends.

:mod:`mahabharatha.locks`, :mod:`mahabharatha.run.runner` and the CLI talk to a :class:`LockBackend`
only. A backend keeps, for each feature, at most one lock held by one owner, and answers the
operations below; waiting, heartbeats, signals and messages are the lock layer's, the same for
every backend. Backends: the folder (``backends/files/backend.py``, the default, nothing to run) and
PostgreSQL (``backends/postgres/backend.py``, for workers on several hosts). What each guarantees,
side by side: ``design/backends.md``.

Also here, because every layer shares them: the facts about a lock (:class:`LockInfo`), the
errors (one base, :class:`LockError`; OS trouble stays ``OSError``) and how a holder is
described to a person.
"""

from __future__ import annotations

import abc
import enum
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from time import sleep
from typing import TYPE_CHECKING, Any, Final, NamedTuple, Protocol, runtime_checkable

from mahabharatha.constants import POLL_SECONDS, RECHECK_SECONDS
from mahabharatha.states import State

if TYPE_CHECKING:
    from mahabharatha.owner.ownership import OwnerDetails
    from mahabharatha.owner.proof import WorkProof


# --------------------------------------------------------------------------- facts about locks


class Owner(enum.StrEnum):
    """What the one owner judgement (``backends/liveness.py: judge``) says of a lock's owner,
    in the word ``status`` and JSON show; :class:`Verdict` is the answer it stands for."""

    RUNNING = "running"
    WORK_RUNNING = "work-running"  # the owner pid is gone; its proof of life or group lives on
    STOPPED = "stopped"  # alive, but the holder (or its command's group) is stopped (SIGSTOP)
    NOT_RUNNING = "not-running"
    PID_REUSED = "pid-reused"
    UNKNOWN = "unknown"


class Verdict(enum.StrEnum):
    """The answer of the one owner judgement: is the owner alive, gone, the caller itself, or
    can it not be told here (then only age decides)?"""

    ALIVE = "alive"
    GONE = "gone"  # provably gone on this host: ``--reclaim-dead`` takes its lock
    CALLER = "caller"  # the caller itself holds it: "already held by you"
    UNKNOWN = "unknown"


VERDICT_OF: Final = {
    Owner.RUNNING: Verdict.ALIVE,
    Owner.WORK_RUNNING: Verdict.ALIVE,
    Owner.STOPPED: Verdict.ALIVE,
    Owner.NOT_RUNNING: Verdict.GONE,
    Owner.PID_REUSED: Verdict.GONE,
    Owner.UNKNOWN: Verdict.UNKNOWN,
}
"""The verdict each owner word stands for (a judgement of liveness is never ``caller``)."""


HELD_STATES: Final = frozenset({State.ACTIVE, State.WRITING, State.BUSY})
"""States in which an acquire would fail: a live lock, one being written, one that cannot be
read just now (a kernel lease on it)."""


@dataclass(frozen=True)
class LockInfo:
    """One feature lock as a person or a JSON reader sees it.

    ``state`` and ``owner`` are :class:`State` and :class:`Owner` (``str`` enums; a plain
    string given by a backend is turned into its member)."""

    feature: str
    state: State
    pid: int | None
    timestamp: float | None
    age_seconds: float | None
    expires_in_seconds: float | None
    owner: Owner
    host: str | None = None
    """The holder's host where the backend records it (PostgreSQL); files: None."""
    token: int | None = None
    """The holder's fencing token where the backend has them (PostgreSQL); files: None."""
    attempts: int = 0
    """Failed attempts recorded for the feature (``lock fail``) since it was last reopened."""
    reason: str | None = None
    """The last failed attempt's reason (``None``: no failed attempt)."""

    def __post_init__(self) -> None:
        # frozen: set through object; a backend may pass "active" or State.ACTIVE alike.
        if self.state.__class__ is not State:  # a member already (status: per lock) is kept
            object.__setattr__(self, "state", State(self.state))
        if self.owner.__class__ is not Owner:
            object.__setattr__(self, "owner", Owner(self.owner))

    @property
    def verdict(self) -> Verdict:
        """The owner judgement's answer that ``owner`` carries (not a JSON key of its own)."""
        return VERDICT_OF[self.owner]

    @property
    def held(self) -> bool:
        """Would an acquire fail on it (someone holds it, or its lock cannot be judged now)?"""
        return self.state in HELD_STATES

    def with_attempts(self, count: int, reason: str | None) -> LockInfo:
        """The same lock, with the feature's failed attempts."""
        return replace(self, attempts=count, reason=reason)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of a lock; ``attempts`` and ``reason`` only for a feature that has
        failed attempts (every other entry keeps the keys it always had)."""
        fields = asdict(self)
        if not self.attempts:
            del fields["attempts"], fields["reason"]
        return fields


DEFAULT_ATTEMPTS: Final = 3
"""A feature whose attempts failed this many times is ``failed`` (``--attempts`` changes it):
a build that fails every time stops being handed out, one that failed once is retried."""


class Attempts(NamedTuple):
    """A feature's record of failed attempts (``lock fail``): how many, the limit of the pool
    that recorded the last one, and the latest few (``time``, ``host``, ``pid``, ``reason``),
    oldest first. ``failed``: the count reached the limit."""

    tries: int
    limit: int
    history: tuple[dict[str, Any], ...] = ()

    @property
    def failed(self) -> bool:
        return self.tries >= self.limit

    @property
    def last_reason(self) -> str | None:
        return str(self.history[-1].get("reason")) if self.history else None


class FeatureProblem(NamedTuple):
    """A feature that ``status``, ``clean`` or ``claim`` had to skip (the others were done).

    ``error`` names the full path it was about (``path``). Plain records are named tuples
    here: a ``@dataclass`` class costs every CLI call half a millisecond to define."""

    feature: str
    path: str
    error: OSError


class CleanedEntry(NamedTuple):
    """Something ``clean`` removed (or, in a dry run, would remove)."""

    feature: str
    path: str
    kind: str  # "lock" or "temp"
    state: str
    removed: bool

    def to_dict(self) -> dict[str, Any]:
        return self._asdict()


_GONE: Final = {
    Owner.NOT_RUNNING: ", which is not running",
    Owner.PID_REUSED: ", which is not running (its pid now belongs to a newer process)",
}
"""How :func:`describe_holder` says that a lock's owner is provably gone on this host."""
_WORKING: Final = ", which is not running, but its work still is"


def owner_is_gone(info: LockInfo) -> bool:
    """Is the lock's owner provably gone on this host (``--reclaim-dead`` would take it)?"""
    return info.verdict is Verdict.GONE


def describe_holder(info: LockInfo) -> str:
    """Who holds a lock, whether it is still running, since when and until when (the caller
    adds what to do about it)."""
    if info.state not in HELD_STATES and info.state is not State.FREE:
        # A stale, corrupt or odd lock that stopped us: its folder's guard stayed busy.
        return (
            f"feature {info.feature!r} has a {info.state} lock that could not be taken: "
            "another process holds its folder's guard (removing that lock, or stuck)"
        )
    if info.pid is None:
        return f"feature {info.feature!r} is locked ({info.state})"
    age = format_duration(info.age_seconds or 0.0)
    expiry = (
        f", expires in {format_duration(info.expires_in_seconds)}"
        if info.expires_in_seconds is not None
        else ""
    )
    gone = _GONE[info.owner] if info.verdict is Verdict.GONE else _working(info)
    return f"feature {info.feature!r} is locked by pid {info.pid}{gone} (since {age} ago{expiry})"


def _working(info: LockInfo) -> str:
    """Said of an alive owner whose own pid is gone (its proof of life or group works on)."""
    return _WORKING if info.owner is Owner.WORK_RUNNING else ""


def format_duration(seconds: float) -> str:
    """A duration as people read it: ``0.4s``, ``42s``, ``3m07s``, ``1h59m``."""
    whole = int(seconds)
    if whole < 60:
        return f"{seconds:.0f}s" if seconds >= 1 else f"{seconds:.1f}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


# --------------------------------------------------------------------------- errors


class LockError(Exception):
    """Base of every error about locks. Those of the system or the place (a path in the way, a
    server down, a busy guard, a command that cannot start) are ``OSError`` too."""


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


class NotHeldError(LockError):
    """``done`` or ``fail`` was asked by a caller that does not hold the feature's lock:
    nothing written. ``what``: what was not written (``marked done``, ``recorded as failed``)."""

    def __init__(self, feature: str, pid: int, what: str = "marked done") -> None:
        self.feature = feature
        self.pid = pid
        self.what = what
        super().__init__(
            f"feature {feature!r} is not locked by pid {pid}: nothing {what} "
            "(claim or acquire it first, or pass the holder's --pid)"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.feature, self.pid, self.what))


class AlreadyHeldError(LockHeldError):
    """The would-be owner already holds the feature (same pid): waiting would wait for itself."""

    def __init__(self, info: LockInfo) -> None:
        super().__init__(info)
        self.args = (f"feature {info.feature!r} is already held by you (pid {info.pid})",)


class LockLostError(LockError):
    """A holder found its lock gone or replaced (forced release, or it went stale)."""

    def __init__(
        self, feature: str, reason: str | None = None, stop_by: float | None = None
    ) -> None:
        self.feature = feature
        self.reason = reason or "it was removed or replaced by another owner"
        self.stop_by = stop_by
        """When the work done under the lock must be gone (monotonic): the holder's lease may
        still run on the server, and can be given away only after; None when it is already
        gone (then the work gets its full grace)."""
        super().__init__(f"lost the lock on {feature!r}: {self.reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.feature, self.reason, self.stop_by))


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


class UnsafeLockPathError(OSError, LockError):
    """Something other than a lock, or a folder we refuse to follow, stands in the lock's way."""


class UnsupportedError(LockError):
    """The backend cannot do what was asked (fencing tokens or a chosen lease on files)."""


class BackendError(OSError, LockError):
    """The place where locks live cannot be reached or used (a server down, a login refused, a
    connection lost). Its message names the place (never a password); the CLI exits 3."""


class ServerFullError(BackendError):
    """The server refused every connection for want of a free slot (``max_connections``) until
    ``--connect-timeout`` ran out: it is there, and busy. A pool's worker waits on for a slot
    (its turn comes when another lets go of one); elsewhere it is a :class:`BackendError`."""


# --------------------------------------------------------------------------- the seam


class Requester(NamedTuple):
    """Who asks for a lock: the owner pid to record, and its owner details (packed by
    :mod:`mahabharatha.owner.ownership`; ``None``: unknown).

    The seam's records (this, :class:`Held`, :class:`AcquireResult`) are named tuples, not
    dataclasses: made on every try, and a ``@dataclass`` class costs the CLI's cold start four
    times as much to define."""

    pid: int
    details: bytes | None = None


class Held(NamedTuple):
    """One acquisition, as its holder keeps it: enough to refresh or release exactly it.

    ``token``: the fencing token (PostgreSQL: larger than every earlier one of the feature;
    files: ``None``). ``expires_at``: epoch seconds by the backend's clock, as last known.
    ``handle``: the backend's own record of the acquisition (files: the lock's snapshot).
    """

    feature: str
    pid: int
    timestamp: float
    expires_at: float
    token: int | None = None
    handle: Any = None
    sent: float | None = None
    """When the statement that set this lease was sent (monotonic): the lease on the server
    runs from no earlier (``locks.acquire`` sets it; a cut-off holder's deadline counts from
    it)."""


class AcquireResult(NamedTuple):
    """How one try ended: ``held`` when it won; otherwise ``holder`` is who stopped it.

    ``replaced`` is what the try reclaimed to win (a stale, corrupt or dead owner's lock), for
    the audit trail: the old holder's facts and why it could be taken (``reason``)."""

    held: Held | None
    holder: LockInfo | None = None
    replaced: LockInfo | None = None
    reason: str | None = None
    holder_details: OwnerDetails | None = None
    """The owner details recorded with ``holder`` (``None``: none, or not our format): the
    lock layer's "already held by you" needs the holder's boot and PID namespace."""
    holder_is_caller: bool = False
    """The backend knows the holder is the caller itself (files: this process holds the
    folder's proof of life and the lock records its pid), details or not."""

    @property
    def verdict(self) -> Verdict | None:
        """The owner judgement's answer about ``holder`` (``None``: no holder): ``caller`` when
        the backend judged it the caller's own, else what ``holder`` carries."""
        if self.holder_is_caller:
            return Verdict.CALLER
        return None if self.holder is None else self.holder.verdict


class ReleaseWait(NamedTuple):
    """How a release that cannot be done at once may wait (files: another process's kernel
    lease on the lock file refuses its read until the kernel breaks the lease).

    ``announce(bound)`` is told once, before the wait, how long it may last (seconds);
    ``pause(seconds)`` sleeps between two tries and may raise to end the wait at once (``lock
    run``: a signal arrived); the lock is then left as it was."""

    announce: Callable[[float], None] | None
    pause: Callable[[float], None]


class ReleaseWatch(Protocol):
    """``with backend.release_watch(features) as watch: ... watch.wait(seconds)``: entered
    *before* the claim that found nothing free, so a release between that claim and the wait
    still ends the wait."""

    def __enter__(self) -> ReleaseWatch: ...

    def __exit__(self, *_exc: object) -> None: ...

    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` (at most :data:`RECHECK_SECONDS`) for a release; True when
        one came (or may have: look again)."""
        ...


class PollingWatch:
    """The :class:`ReleaseWatch` of a backend that hears no releases: a short sleep."""

    def __enter__(self) -> PollingWatch:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None

    def wait(self, seconds: float) -> bool:
        sleep(min(max(0.0, seconds), RECHECK_SECONDS, POLL_SECONDS))
        return True


class LockBackend(abc.ABC):
    """Where locks live: the operations every backend has and every caller needs. Every method
    answers at once (none waits for a busy lock); the lock layer waits, refreshes and reports.
    Feature names are already validated. What only some backends can do is a protocol of its
    own below (:class:`LockServer`, :class:`ClaimsInOneStep`, :class:`WatchesReleases`,
    :class:`HearsReleases`, :class:`LocalFolder`): a caller tests ``isinstance``, never
    ``getattr``. How a backend uses its connections (slots, resting) is its own business."""

    kind: str
    """``"file"`` or ``"postgresql"``: for messages and JSON."""

    local_calls: bool = False
    """Every call is a few system calls on this host (microseconds, never a wait): an event
    loop may make them itself (``AsyncFeatureLock``); otherwise a call is a network round
    trip, made in a worker thread."""

    run_lease: float | None = None
    """The lease of a holder that refreshes (``lock run``, ``FeatureLock``) unless it chose one;
    ``None``: the backend's fixed lease (files: 2 h)."""

    namespace: str | None = None
    """The lock space within :meth:`where` (PostgreSQL's namespace; files: ``None``, the
    folder is the space)."""

    @abc.abstractmethod
    def where(self) -> str:
        """Where the locks are, for people: a folder, or ``host:port/database`` (no password)."""

    def close(self) -> None:
        """Let go of what the backend keeps open (server connections) until its next call: a
        holder between two refreshes keeps none. Default: nothing."""
        return None

    @abc.abstractmethod
    def try_acquire(
        self,
        feature: str,
        requester: Requester,
        *,
        reclaim_dead: bool = False,
        lease: float | None = None,
    ) -> AcquireResult:
        """One attempt: publish the lock, reclaiming a stale or corrupt one (and, with
        ``reclaim_dead``, one whose owner is provably gone). ``lease`` (seconds; ``None``: the
        backend's default, 2 h) raises :class:`UnsupportedError` where it cannot be chosen."""

    @abc.abstractmethod
    def refresh(self, held: Held) -> Held:
        """Renew exactly this acquisition (new timestamp / lease); :class:`LockLostError`
        when it is no longer the holder's."""

    @abc.abstractmethod
    def release_held(self, held: Held, wait: ReleaseWait | None = None) -> bool:
        """Remove exactly this acquisition; False if it was already gone (never another's).
        ``wait``: how to wait where the release cannot be done at once (``None``: raise)."""

    @abc.abstractmethod
    def release(self, feature: str, pid: int, *, force: bool = False) -> bool:
        """Remove ``pid``'s lock on ``feature`` (CLI release): True if removed, False if there
        was none; :class:`NotOwnerError` for another owner's, unless ``force``."""

    @abc.abstractmethod
    def inspect(self, feature: str) -> LockInfo:
        """The lock on ``feature`` (state ``free`` when none)."""

    @abc.abstractmethod
    def status(self, *, problems: list[FeatureProblem] | None = None) -> list[LockInfo]:
        """Every lock, by feature name."""

    @abc.abstractmethod
    def survey(self, *, problems: list[FeatureProblem] | None = None) -> list[LockInfo]:
        """Every feature (``feature_names`` and every lock), free and done ones too."""

    @abc.abstractmethod
    def feature_names(self) -> list[str]:
        """The features a bare ``claim`` offers, by name (the local ``specs`` folders)."""

    @abc.abstractmethod
    def clean(
        self,
        *,
        dry_run: bool = False,
        reclaim_dead: bool = False,
        problems: list[FeatureProblem] | None = None,
        features: Iterable[str] | None = None,
    ) -> list[CleanedEntry]:
        """Remove stale and corrupt locks (and debris); active ones stay. ``features``: only
        these (``None``: every feature)."""

    @abc.abstractmethod
    def is_done(self, feature: str) -> bool: ...

    @abc.abstractmethod
    def done(self, feature: str, pid: int) -> str:
        """Mark ``feature`` done, then release ``pid``'s lock on it; the time written.
        :class:`NotHeldError` (nothing written) when ``pid`` does not hold it."""

    @abc.abstractmethod
    def reopen(self, feature: str) -> bool:
        """Remove the done mark, the failed state and the attempt count; True if there was
        any of them."""

    @abc.abstractmethod
    def fail(self, feature: str, pid: int, reason: str, limit: int) -> Attempts:
        """Record a failed attempt of ``pid``'s (``reason``: why, or the exit code), then
        release its lock, in that order; the record after it. :class:`NotHeldError`
        (nothing written) when ``pid`` does not hold it. ``limit``: the pool's attempts."""

    @abc.abstractmethod
    def attempts(self, feature: str) -> Attempts | None:
        """The feature's failed attempts (``None``: none recorded)."""


# --------------------------------------------------------------------------- optional abilities

_LACKS: dict[tuple[type, type], bool] = {}


def lacks(backend: object, ability: type) -> bool:
    """``not isinstance(backend, ability)``, known per class after the first ask (a backend's
    abilities are its class's): a protocol's own check walks its members every time, tens of
    microseconds, more than a whole try on files. ``lacks(b, P) or not isinstance(b, P)``
    narrows ``b`` for the type checker at the price of the fast answer."""
    key = (type(backend), ability)
    known = _LACKS.get(key)
    if known is None:
        known = _LACKS[key] = not isinstance(backend, ability)
    return known


@runtime_checkable
class LockServer(Protocol):
    """A backend on a server (PostgreSQL): fencing tokens and a lease chosen per lock, tables
    to make, and done markers kept in a local gsd folder as well."""

    gsd_dir: str | os.PathLike[str]
    """The local gsd folder whose ``.completed`` markers count as done too."""

    def init(self) -> int:
        """Create the tables (idempotent); the schema version."""
        ...

    def verify(self, feature: str, token: int) -> bool:
        """Is ``token`` the current holder's?"""
        ...


@runtime_checkable
class ClaimsInOneStep(Protocol):
    """A backend that takes the first free feature of a list in one step (PostgreSQL)."""

    def try_claim(
        self,
        features: Sequence[str],
        requester: Requester,
        *,
        reclaim_dead: bool = False,
        lease: float | None = None,
        include_done: bool = False,
        retry_delay: float = 0.0,
        slot_wait: float | None = 0.0,
    ) -> AcquireResult | None:
        """The first free feature of ``features`` not done (unless ``include_done``) nor
        failed nor resting (``retry_delay`` seconds after a failed attempt, by the backend's
        clock); ``None`` when none is free. ``slot_wait``: how long it may wait for room on
        the server (``None``: for ever)."""
        ...

    def failed_and_retried(self, features: Sequence[str]) -> tuple[set[str], set[str]]:
        """The features whose failed attempts reached their limit (left out of a claim), and
        those of ``features`` free and open after a failed attempt (resting, or just rested)."""
        ...


@runtime_checkable
class WatchesReleases(Protocol):
    """A backend that wakes a pool's waiter on a release (inotify, LISTEN/NOTIFY); without
    it the waiter polls (:class:`PollingWatch`)."""

    def release_watch(self, features: Iterable[str]) -> ReleaseWatch: ...


@runtime_checkable
class HearsReleases(Protocol):
    """A backend whose acquire waits are woken by a release (PostgreSQL's LISTEN/NOTIFY)."""

    def wait_for_release(self, feature: str, timeout: float) -> bool:
        """Between two tries of an acquire: wait up to ``timeout`` seconds for ``feature``'s
        release; True when one came (or may have: look again)."""
        ...

    def async_release_listener(self) -> Any:
        """The running event loop's listener for releases (``AsyncFeatureLock``)."""
        ...


@runtime_checkable
class LocalFolder(Protocol):
    """Locks in a local folder (files): a proof of life the holder's work inherits, the
    work's process group recorded with the lock, and done markers."""

    def work_proof(self, held: Held) -> WorkProof | None:
        """The proof of life for the work ``held``'s holder starts; ``None``: none here."""
        ...

    def record_work_group(self, held: Held, pgid: int, leader_start: int | None) -> Held:
        """Record with ``held`` the process group ``pgid`` made for its holder's command, so
        that a judge counts its members as the owner's work."""
        ...

    def mark_done_holding(self, held: Held) -> str:
        """Mark ``held``'s feature done and keep its lock (work it left still holds it)."""
        ...

    def mark_done_here(self, feature: str, stamp: str) -> bool:
        """Publish the done marker of another backend's ``done``; True if written."""
        ...


STATES: Final[Sequence[str]] = tuple(State)
"""Every ``state`` a :class:`LockInfo` can have (``error`` is the CLI's, for a skipped folder)."""
