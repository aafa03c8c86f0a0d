"""The seam between the lock layer and where locks live: :class:`LockBackend`, its optional
abilities, and what every layer shares: :class:`LockInfo`, the errors (:class:`LockError`) and
how a holder is described (``design/backends.md``)."""

from __future__ import annotations

import abc
import enum
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from time import sleep
from typing import TYPE_CHECKING, Any, Final, NamedTuple, Protocol, runtime_checkable

from mahabharatha.constants import DEFAULT_ATTEMPTS as DEFAULT_ATTEMPTS  # its old home's name
from mahabharatha.constants import POLL_SECONDS, RECHECK_SECONDS
from mahabharatha.states import State

if TYPE_CHECKING:
    from mahabharatha.owner.ownership import OwnerDetails
    from mahabharatha.owner.proof import WorkProof


# --------------------------------------------------------------------------- facts about locks


class Owner(enum.StrEnum):
    """The owner judgement's word for a lock's owner (``status``, JSON); see :class:`Verdict`."""

    RUNNING = "running"
    WORK_RUNNING = "work-running"  # the owner pid is gone; its proof of life or group lives on
    STOPPED = "stopped"  # alive, but the holder (or its command's group) is stopped (SIGSTOP)
    NOT_RUNNING = "not-running"
    PID_REUSED = "pid-reused"
    UNKNOWN = "unknown"


class Verdict(enum.StrEnum):
    """Is the owner alive, gone, the caller itself, or unknown here (then age alone decides)?"""

    ALIVE = "alive"
    GONE = "gone"  # provably gone on this host: ``--reclaim-dead`` takes its lock
    CALLER = "caller"  # the caller itself holds it: "already held by you"
    UNKNOWN = "unknown"


VERDICT_OF: Final = {  # a judgement of liveness is never ``caller``
    Owner.RUNNING: Verdict.ALIVE,
    Owner.WORK_RUNNING: Verdict.ALIVE,
    Owner.STOPPED: Verdict.ALIVE,
    Owner.NOT_RUNNING: Verdict.GONE,
    Owner.PID_REUSED: Verdict.GONE,
    Owner.UNKNOWN: Verdict.UNKNOWN,
}


# An acquire fails on these: a live lock, one being written, one unreadable just now (a lease).
HELD_STATES: Final = frozenset({State.ACTIVE, State.WRITING, State.BUSY})


@dataclass(frozen=True)
class LockInfo:
    """One feature lock as a person or a JSON reader sees it (a plain string given for
    ``state`` or ``owner`` becomes its member)."""

    feature: str
    state: State
    pid: int | None
    timestamp: float | None
    age_seconds: float | None
    expires_in_seconds: float | None
    owner: Owner
    host: str | None = None  # PostgreSQL records the holder's host and fencing token
    token: int | None = None
    attempts: int = 0  # failed attempts (``lock fail``) since the feature was last reopened
    reason: str | None = None  # the last failed attempt's

    def __post_init__(self) -> None:
        if self.state.__class__ is not State:  # frozen: set through object
            object.__setattr__(self, "state", State(self.state))
        if self.owner.__class__ is not Owner:
            object.__setattr__(self, "owner", Owner(self.owner))

    @property
    def verdict(self) -> Verdict:
        """The verdict ``owner`` stands for (not a JSON key)."""
        return VERDICT_OF[self.owner]

    @property
    def held(self) -> bool:
        """Would an acquire fail on it?"""
        return self.state in HELD_STATES

    def with_attempts(self, record: Attempts | None) -> LockInfo:
        """This info with ``record``'s failed attempts (itself when there are none)."""
        if record is None:
            return self
        return replace(self, attempts=record.tries, reason=record.last_reason)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object; ``attempts`` and ``reason`` only for a feature with failed attempts."""
        fields = asdict(self)
        if not self.attempts:
            del fields["attempts"], fields["reason"]
        return fields


class Attempts(NamedTuple):
    """A feature's failed attempts (``lock fail``): how many, the pool's limit, the latest few."""

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
    """A feature that ``status``, ``clean`` or ``claim`` had to skip, and why."""

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


_OWNER_NOTE: Final = {  # what describe_holder adds about an owner that is not running
    Owner.NOT_RUNNING: ", which is not running",
    Owner.PID_REUSED: ", which is not running (its pid now belongs to a newer process)",
    Owner.WORK_RUNNING: ", which is not running, but its work still is",
}


def owner_is_gone(info: LockInfo) -> bool:
    """Is the owner provably gone here (``--reclaim-dead`` would take the lock)?"""
    return info.verdict is Verdict.GONE


def describe_holder(info: LockInfo) -> str:
    """Who holds a lock, whether it still runs, since and until when."""
    if info.state not in HELD_STATES and info.state is not State.FREE:
        # A stale, corrupt or odd lock that stopped us: its folder's guard stayed busy.
        return (
            f"feature {info.feature!r} has a {info.state} lock that could not be taken: "
            "another process holds its folder's guard (removing that lock, or stuck)"
        )
    if info.pid is None:
        return f"feature {info.feature!r} is locked ({info.state})"
    age = format_duration(info.age_seconds or 0.0)
    expires = info.expires_in_seconds
    expiry = "" if expires is None else f", expires in {format_duration(expires)}"
    note = _OWNER_NOTE.get(info.owner, "")
    return f"feature {info.feature!r} is locked by pid {info.pid}{note} (since {age} ago{expiry})"


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
    """Base of every error about locks; those of the system or the place are ``OSError`` too."""

    made_with: tuple[Any, ...] = ()  # the arguments of an error that carries facts

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (a pool worker's error for its parent): made anew from its facts.
        return (type(self), self.made_with or self.args, vars(self))


class LockHeldError(LockError):
    """Someone else holds the feature; carries what is known about the holder."""

    def __init__(self, info: LockInfo) -> None:
        self.info = info
        self.made_with = (info,)
        super().__init__(describe_holder(info))


class LockTimeoutError(LockHeldError, TimeoutError):
    """The feature stayed held for the whole wait."""


class NotOwnerError(LockHeldError):
    """Release was asked for a lock another owner holds; it was left intact."""


class NotHeldError(LockError):
    """``done`` or ``fail`` by a caller that does not hold the lock: nothing ``what``."""

    def __init__(self, feature: str, pid: int, what: str = "marked done") -> None:
        self.feature = feature
        self.pid = pid
        self.what = what
        self.made_with = (feature, pid, what)
        super().__init__(
            f"feature {feature!r} is not locked by pid {pid}: nothing {what} "
            "(claim or acquire it first, or pass the holder's --pid)"
        )


class AlreadyHeldError(LockHeldError):
    """The would-be owner already holds the feature: waiting would wait for itself."""

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
        # When the lock's work must be gone (monotonic), before the server's lease runs out and
        # the lock is given away; None: it is gone already (the work gets its full grace).
        self.stop_by = stop_by
        self.made_with = (feature, self.reason, stop_by)
        super().__init__(f"lost the lock on {feature!r}: {self.reason}")


class HeartbeatStartError(LockError):
    """The heartbeat thread could not start; the lock just taken was released."""

    def __init__(self, feature: str, cause: str) -> None:
        self.feature = feature
        self.cause = cause
        self.made_with = (feature, cause)
        super().__init__(
            f"could not start the heartbeat that keeps the lock on {feature!r} fresh ({cause}); "
            "the lock was released"
        )


class LockBusyError(OSError, LockError):
    """The lock could not be read just now (a kernel lease): neither judged nor touched."""

    def __str__(self) -> str:
        """One sentence (a pool result's reason), not ``[Errno N] text: 'file'``."""
        text, name = self.strerror, self.filename
        if text is None:
            return super().__str__()
        return f"{text}: {name}" if name and str(name) not in text else text


class UnsafeLockPathError(OSError, LockError):
    """Something other than a lock, or a folder we refuse to follow, is in the lock's way."""


class UnsupportedError(LockError):
    """The backend cannot do what was asked (fencing tokens or a chosen lease on files)."""


class BackendError(OSError, LockError):
    """Where locks live cannot be reached or used; the message names it (never a password)."""


class ServerFullError(BackendError):
    """Every connection was refused for want of a free slot until ``--connect-timeout``."""


# --------------------------------------------------------------------------- the seam


class Requester(NamedTuple):
    """Who asks for a lock: the owner pid to record, and its packed owner details."""

    pid: int
    details: bytes | None = None


class Held(NamedTuple):
    """One acquisition, as its holder keeps it: enough to refresh or release exactly it."""

    feature: str
    pid: int
    timestamp: float
    expires_at: float  # epoch seconds by the backend's clock, as last known
    token: int | None = None  # the fencing token (PostgreSQL; files: None)
    handle: Any = None  # the backend's own record (files: the lock's snapshot)
    sent: float | None = None  # when the statement setting the lease was sent (monotonic)


class AcquireResult(NamedTuple):
    """How one try ended: ``held`` when it won, else ``holder`` stopped it; ``replaced`` and
    ``reason``: the lock it reclaimed to win, and why (the audit trail)."""

    held: Held | None
    holder: LockInfo | None = None
    replaced: LockInfo | None = None
    reason: str | None = None
    holder_details: OwnerDetails | None = None  # for the lock layer's "already held by you"
    holder_is_caller: bool = False  # the backend knows (files: by its proof of life)

    @property
    def verdict(self) -> Verdict | None:
        """The judgement about ``holder`` (``None``: no holder)."""
        if self.holder_is_caller:
            return Verdict.CALLER
        return None if self.holder is None else self.holder.verdict


class ReleaseWait(NamedTuple):
    """How a release refused for now (files: another's kernel lease) may wait: ``announce`` is
    told the bound once; ``pause`` sleeps between tries, and may raise to end the wait."""

    announce: Callable[[float], None] | None
    pause: Callable[[float], None]


class ReleaseWatch(Protocol):
    """Entered *before* the claim that found nothing free. Race: a release between that claim
    and the wait still ends the wait."""

    def __enter__(self) -> ReleaseWatch: ...
    def __exit__(self, *_exc: object) -> None: ...

    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` (at most ``RECHECK_SECONDS``); True: a release may have come."""


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
    """Where locks live: the operations every backend has. Every method answers at once (none
    waits for a busy lock); names are validated. What only some backends can do is a protocol
    below: callers test ``isinstance``, never ``getattr``."""

    kind: str  # "file" or "postgresql"
    local_calls: bool = False  # a few local system calls: an event loop may make them itself
    run_lease: float | None = None  # a refreshing holder's lease (None: the fixed lease)
    namespace: str | None = None  # the lock space within where() (files: the folder is)

    @abc.abstractmethod
    def where(self) -> str:
        """Where the locks are, for people (never a password)."""

    def close(self) -> None:
        """Let go of what the backend keeps open (connections) until its next call."""
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
        """One attempt, reclaiming a stale or corrupt lock (``reclaim_dead``: or a gone owner's)."""

    @abc.abstractmethod
    def refresh(self, held: Held) -> Held:
        """Renew exactly this acquisition; :class:`LockLostError` when it is no longer ours."""

    @abc.abstractmethod
    def release_held(self, held: Held, wait: ReleaseWait | None = None) -> bool:
        """Remove exactly this acquisition; False if already gone. ``wait``: see ReleaseWait."""

    @abc.abstractmethod
    def release(self, feature: str, pid: int, *, force: bool = False) -> bool:
        """Remove ``pid``'s lock (False: none); :class:`NotOwnerError` for another's, unforced."""

    @abc.abstractmethod
    def inspect(self, feature: str) -> LockInfo:
        """The lock on ``feature`` (state ``free`` when none)."""

    @abc.abstractmethod
    def status(self, *, problems: list[FeatureProblem] | None = None) -> list[LockInfo]:
        """Every lock, by feature name."""

    @abc.abstractmethod
    def survey(self, *, problems: list[FeatureProblem] | None = None) -> list[LockInfo]:
        """Every feature (``feature_names`` and every lock), free and done too."""

    @abc.abstractmethod
    def feature_names(self) -> list[str]:
        """The features a bare ``claim`` offers, by name."""

    @abc.abstractmethod
    def clean(
        self,
        *,
        dry_run: bool = False,
        reclaim_dead: bool = False,
        problems: list[FeatureProblem] | None = None,
        features: Iterable[str] | None = None,
    ) -> list[CleanedEntry]:
        """Remove stale and corrupt locks and debris (``features``: only these)."""

    @abc.abstractmethod
    def is_done(self, feature: str) -> bool: ...

    @abc.abstractmethod
    def done(self, feature: str, pid: int, wait: ReleaseWait | None = None) -> str:
        """Mark done, then release ``pid``'s lock; the time written (or :class:`NotHeldError`).
        ``wait``: as :meth:`release_held`'s."""

    @abc.abstractmethod
    def reopen(self, feature: str) -> bool:
        """Remove the done mark and the failed attempts; True if there was any."""

    @abc.abstractmethod
    def fail(
        self, feature: str, pid: int, reason: str, limit: int, wait: ReleaseWait | None = None
    ) -> Attempts:
        """Record ``pid``'s failed attempt, then release its lock; the record after it."""

    @abc.abstractmethod
    def attempts(self, feature: str) -> Attempts | None:
        """The feature's failed attempts (``None``: none)."""


# --------------------------------------------------------------------------- optional abilities

_LACKS: dict[tuple[type, type], bool] = {}


def lacks(backend: object, ability: type) -> bool:
    """``not isinstance(backend, ability)``, cached per class (a protocol's check is slow); write
    ``lacks(b, P) or not isinstance(b, P)`` to narrow ``b`` for the type checker."""
    key = (type(backend), ability)
    known = _LACKS.get(key)
    if known is None:
        known = _LACKS[key] = not isinstance(backend, ability)
    return known


@runtime_checkable
class LockServer(Protocol):
    """A backend on a server: fencing tokens, a lease per lock, tables to make."""

    gsd_dir: str | os.PathLike[str]  # the local folder whose done markers count too

    def init(self) -> int:
        """Create the tables (idempotent); the schema version."""

    def verify(self, feature: str, token: int) -> bool:
        """Is ``token`` the current holder's?"""


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
        """The first free feature not done (unless ``include_done``), failed nor resting
        (``retry_delay`` after a failed attempt); ``None``: none. ``slot_wait``: how long to
        wait for room on the server (``None``: for ever)."""

    def finished_and_resting(
        self, features: Sequence[str], *, slot_wait: float | None = 0.0
    ) -> tuple[list[LockInfo], set[str], set[str], set[str]]:
        """The locks held (any feature); of ``features`` held by nobody: those done, those failed
        for good (any feature), and those free and open after a failed attempt. ``slot_wait``:
        as :meth:`try_claim`'s (the look after a claim waits as the claim did)."""


@runtime_checkable
class WatchesReleases(Protocol):
    """Wakes a pool's waiter on a release (else it polls: :class:`PollingWatch`)."""

    def release_watch(self, features: Iterable[str]) -> ReleaseWatch: ...


@runtime_checkable
class HearsReleases(Protocol):
    """Acquire waits are woken by a release (LISTEN/NOTIFY)."""

    def wait_for_release(self, feature: str, timeout: float) -> bool:
        """Wait up to ``timeout`` for ``feature``'s release; True: one may have come."""

    def async_release_listener(self) -> Any:
        """The running event loop's listener for releases."""


@runtime_checkable
class LocalFolder(Protocol):
    """Locks in a local folder: a proof of life the work inherits, its group, done markers."""

    def work_proof(self, held: Held) -> WorkProof | None:
        """The proof of life for ``held``'s work; ``None``: none here."""

    def record_work_group(self, held: Held, pgid: int, leader_start: int | None) -> Held:
        """Record ``held``'s command's group: a judge counts its members as the owner's work."""

    def mark_done_holding(self, held: Held, wait: ReleaseWait | None = None) -> str:
        """Mark done and keep the lock (work the command left still holds it)."""

    def mark_done_here(self, feature: str, stamp: str) -> bool:
        """Publish another backend's done marker here; True if written."""
