"""``FeatureLock`` (held for a block, refreshed in the background), its ``Heartbeat`` thread
(one per lock, or per pool worker), and the fork hook: a forked child forgets its parent's locks."""

from __future__ import annotations

import math
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext, suppress
from time import monotonic
from types import TracebackType
from typing import Final, Self

from mahabharatha import clock, logs, signals
from mahabharatha.backends.base import (
    HeartbeatStartError,
    Held,
    LocalFolder,
    LockBackend,
    LockError,
    LockLostError,
    ReleaseWait,
)
from mahabharatha.constants import CUT_OFF_NOTICE_SECONDS, GSD_DIR, HEARTBEAT_SECONDS
from mahabharatha.functional import (
    WaitCallback,
    _Acquiring,
    _backend,
    _owner_pid,
    _valid_seconds,
    _valid_timeout,
)
from mahabharatha.names import validate_feature_name as _validate_feature_name
from mahabharatha.owner.proof import HandedProof, WorkProof

# A holder with a chosen lease refreshes 3 times a lease: 2 may fail (a server restart, a lost
# link) before the lock is in danger.
LEASE_REFRESHES: Final = 3


class FeatureLock:
    """Hold a feature lock for a block, kept fresh by a background heartbeat. lost: ``None``
    while ours, the :class:`LockLostError` once taken away (``on_lost`` told). Parameters and
    attributes: ``design/reference.md`` (FeatureLock)."""

    _connection_grace: float | None = None  # the claim's connection kept this long (the pool)
    _ends_by_outcome = False  # a pool's hold outlives ``release`` until ``PoolLock.finish``
    _release_wait: ReleaseWait | None = None  # a pool hold's wait for its outcome's release

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
        self.timeout = _valid_timeout(timeout)
        self.feature = feature
        self.gsd_dir = gsd_dir
        self.backend = _backend(url if backend is None else backend, gsd_dir)
        self.pid = _owner_pid(pid)
        self.reclaim_dead = reclaim_dead
        self.heartbeat = _valid_seconds("heartbeat", heartbeat)
        if self.heartbeat is not None and self.heartbeat < 0:  # it would refresh in a busy loop
            raise ValueError(f"Invalid heartbeat: {heartbeat!r} (must be >= 0; 0 or None: none)")
        if lease is not None and (_valid_seconds("lease", lease) or 0) <= 0:
            raise ValueError(f"Invalid lease: {lease!r} (must be a positive number of seconds)")
        # Files: none (fixed at 2 h); a server: the lease of a holder that refreshes.
        self.lease = self.backend.run_lease if lease is None else lease
        if self.lease is not None and self.heartbeat:
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
        # Who beats (``_beat_once``): a thread of its own, a pool worker's shared one, or
        # ``None``: an event loop's task, which also rests the backend its locks share.
        self._beats: Heartbeat | None = Heartbeat(feature)
        self._own_beats = True
        self._claimed: Held | None = None  # a pool's claim, adopted by ``acquire``
        self._forget_after_fork()
        _FORGET_AFTER_FORK.add(self)

    @property
    def token(self) -> int | None:
        """The fencing token of our acquisition (None: not held, or files: no tokens)."""
        mine = self._mine
        return None if mine is None else mine.token

    def _forget_after_fork(self) -> None:
        """The state no process inherits, made new (also in ``__init__``)."""
        # Race: fork while the heartbeat held the mutex; the child's copy would stay locked.
        self._mutex = threading.Lock()  # heartbeat thread vs. release in the caller's thread
        self._stop = threading.Event()  # ends the cut-off
        self._handed: WorkProof | None = None  # the proof handed on (``proof_fds``), made once
        self._cut_off: threading.Thread | None = None  # ``_cut_off_loop``'s thread
        self._declaring = threading.Lock()  # the cut-off vs. the heartbeat declaring the loss

    @property
    def held(self) -> bool:
        """Is our lock there, as far as we know, and not stale (in the process that took it)?"""
        if self._holder_process != os.getpid() or self.lost is not None:
            return False  # a forked child's, or given up (the cut-off before the lease's end)
        return self.expires_at is not None and not self._expired()

    @property
    def expires_at(self) -> float | None:
        """When our lock turns stale unless refreshed (epoch seconds; None: not held)."""
        mine = self._mine  # race: the heartbeat may declare it lost (None) between two reads
        return None if mine is None else mine.expires_at

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
        """Take the lock (waiting as ``timeout`` says) and start the heartbeat; ``on_wait`` and
        ``on_lost`` replace the object's own for this acquisition. Raises
        :class:`LockHeldError` (``LockTimeoutError`` after a wait), :class:`LockError`, OSError."""
        claimed, self._claimed = self._claimed, None
        if self._ends_by_outcome and claimed is None:
            raise LockError(f"the claim of {self.feature!r} was used already")
        if self._mine is not None:
            raise LockError(f"this FeatureLock already holds {self.feature!r}")
        held = claimed or self._acquiring(on_wait).run()
        try:
            self._adopt(held, on_lost)
            if claimed is None:  # a claim keeps its connection for a grace: its first beat rests it
                self._rest_backend()
            self._start_heartbeat()
        except BaseException:
            # Race: interrupted (a signal handler runs at each call here) or out of threads
            # with the lock taken, adopted or not yet: never leave it behind.
            with signals.Deferred():  # a second Ctrl-C must not cut the take-back short
                self._stop_heartbeat()
                if self._mine is None:
                    self.backend.release_held(held)
                self._give_back()
            raise
        return self

    def _acquiring(self, on_wait: WaitCallback | None) -> _Acquiring:
        return _Acquiring(
            self.feature,
            self.gsd_dir,
            self.pid,
            self.timeout,
            self.reclaim_dead,
            self.lease,
            self.command,
            self.caller_pids,
            self.backend,
            self.on_wait if on_wait is None else on_wait,
        )

    def _adopt(self, held: Held, on_lost: Callable[[LockLostError], None] | None) -> None:
        self._holder_process = os.getpid()
        self._lost_override = on_lost
        self.lost = None
        self._mine = self._with_deadline(held)

    def _start_heartbeat(self) -> None:
        """Hand the hold to its heartbeat, and a lock with a lease also to the cut-off."""
        if not self.heartbeat or self._beats is None:
            return
        self._stop.clear()
        self._beats.hold(self)
        # Race: a worker's shared heartbeat stuck in a refresh (a frozen link) let the lease
        # run out under CMD, and another worker built the feature beside it (two holders).
        if self.lease is None:
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
        """The cut-off's thread (a refresh on a frozen link blocks the heartbeat itself)."""
        while (left := self._cut_off_in()) > 0:
            if self._stop.wait(left):
                return  # released (or lost by the heartbeat's own finding)

    def _cut_off_in(self) -> float:
        """The one cut-off rule (thread and async task): seconds until the lock is given up,
        shortly before its lease can end unless a refresh moved ``_deadline``; at 0, lost."""
        if self.lease is None:
            return math.inf
        notice = min(CUT_OFF_NOTICE_SECONDS, self.lease / 4)
        left = self._deadline - notice - monotonic()
        if left > 0:
            return left
        reason = f"no refresh got through, and its lease can run out in {notice:g} s"
        self._declare_lost(LockLostError(self.feature, reason, self._deadline - notice / 5))
        return 0.0

    def _forget_if_forked(self) -> None:
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
        """``mine`` refreshed, recording a command's group still due in the same write."""
        due, store = self._work_group_due, self.backend
        if due is None or not isinstance(store, LocalFolder):
            return store.refresh(mine)
        fresh = store.record_work_group(mine, *due)
        self._work_group_due = None
        return fresh if fresh is not mine else store.refresh(mine)

    def _rest_backend(self) -> None:
        """Keep no server connection between refreshes (many holders, few slots)."""
        if self.heartbeat and self._beats is not None:
            self.backend.close()

    def _beat_once(self, first: bool = False) -> float | None:
        """One heartbeat: the seconds to the next, ``None`` once lost. A claim's ``first`` step
        only lets its connection go (the pool's grace)."""
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
        """``mine``, its expiry kept on the monotonic clock too (from when it was sent)."""
        if mine.sent is None:
            self._deadline = monotonic() + (mine.expires_at - clock.now())
        else:
            self._deadline = mine.sent + (mine.expires_at - mine.timestamp)
        return mine

    def _expired(self) -> bool:
        """Past the lease by the wall clock or the monotonic one. Race: a wall-clock step back
        during a partition hid an expiry while the server gave the lock to another holder."""
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
        """Stop the heartbeat and remove our lock if it is still exactly ours; on ``OSError`` it
        stays ours (retry); found gone, it is declared lost (``on_lost``), never raised. A
        claimed hold (``PoolLock``) keeps it for its outcome."""
        self._stop_heartbeat()
        if self._ends_by_outcome:
            self._release_wait = wait  # the outcome's mark and release wait as this one would
        else:
            self._give_back(wait)

    def _give_back(self, wait: ReleaseWait | None = None) -> None:
        with self._mutex:
            self._forget_if_forked()
            mine = self._mine
            if mine is None:
                return
            lost = self.lost is not None
            # Lost already: taking back what may be left is best effort (the loss was told).
            # Else on an error the lock stays ours (``_mine`` kept): release can be retried.
            found = True
            with suppress(OSError) if lost else nullcontext():
                found = self.backend.release_held(mine, None if lost else wait)
            self._mine = None
            self._close_handed()
        if not found and self.lost is None:
            # Race: taken away (a forced release, a reclaim) after the last refresh, so work
            # that ended first would pass for done under the lock. Told outside the mutex.
            reason = "it was removed or replaced before its release (no refresh had seen it go)"
            self._declare_lost(LockLostError(self.feature, reason))

    def work_proof(self) -> WorkProof | None:
        """A proof of life for work this holder starts (pass its ``fd``, then ``close_ours()``);
        ``None`` when the lock carries none."""
        mine, store = self._mine, self.backend
        if mine is None or self._holder_process != os.getpid():
            return None
        return store.work_proof(mine) if isinstance(store, LocalFolder) else None

    def record_work_group(self, pgid: int, leader_start: int | None) -> None:
        """Record ``lock run``'s process group ``pgid`` with the lock: its members count as the
        owner's work. A failed write is retried by each heartbeat."""
        with self._mutex:
            self._forget_if_forked()
            store = self.backend
            if self._mine is None or not isinstance(store, LocalFolder):
                return
            try:
                fresh = store.record_work_group(self._mine, pgid, leader_start)
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
        """Descriptors carrying this lock's proof of life to a child (``pass_fds=``): the owner
        stays alive while it runs. Empty when there is none; valid until the lock is let go."""
        handed = self._handed_proof()
        return () if handed is None or handed.fd is None else (handed.fd,)

    def proof_for_workers(self) -> HandedProof:
        """This lock's proof of life for ``spawn``/``forkserver`` workers:
        ``Pool(initializer=lock.proof_for_workers())`` keeps the owner alive while they work."""
        return HandedProof(self._handed_proof())

    def _handed_proof(self) -> WorkProof | None:
        with self._mutex:
            if self._handed is None or self._handed.fd is None:
                self._handed = self.work_proof()
            return self._handed

    def _close_handed(self) -> None:
        """Our copy of the handed proof goes; children keep theirs (vouching for no later lock)."""
        handed, self._handed = self._handed, None
        if handed is not None:
            handed.close()

    def abandon(self) -> None:
        """Forget the lock without removing it: escaped work still holds its proof of life."""
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


class Heartbeat:
    """The heartbeat thread: the due ``_beat_once`` of the one lock it holds at a time (a
    ``FeatureLock``'s, or a pool worker's); a lock let go of is never touched again."""

    def __init__(self, name: str = "pool") -> None:
        self._name = f"lock-heartbeat-{name}"
        self._forget_after_fork()
        self._first = True  # the held lock's next step is its first (the connection's grace)
        self._due = 0.0
        self._closed = False
        _FORGET_AFTER_FORK.add(self)

    def _forget_after_fork(self) -> None:
        # Race: fork while the thread held the condition or stepped a lock: the child's copy
        # would stay locked, or say for ever that a step runs (a release there waited on it).
        self._changed = threading.Condition()
        self._held: FeatureLock | None = None
        self._busy: FeatureLock | None = None  # whose step runs now, outside the condition
        self._thread: threading.Thread | None = None

    def hold(self, lock: FeatureLock) -> None:
        """Keep ``lock`` fresh from now on (:class:`HeartbeatStartError`: out of threads)."""
        assert lock.heartbeat is not None
        with self._changed:
            self._held, self._first, self._closed = lock, True, False
            self._due = monotonic() + min(lock._connection_grace or math.inf, lock.heartbeat)
            self._changed.notify()
        if self._thread is not None and self._thread.is_alive():
            return
        self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
        try:
            signals.start_without_signals(self._thread)
        except RuntimeError as error:  # "can't start new thread": a process or memory limit
            self._thread = None
            self.let_go(lock)
            raise HeartbeatStartError(lock.feature, str(error)) from error

    def let_go(self, lock: FeatureLock) -> None:
        """Stop keeping ``lock`` fresh; returns once no step of it runs (but from that step)."""
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
        """Run ``lock``'s due step outside the condition (held on entry), marked busy."""
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


# Every FeatureLock and Heartbeat alive in this process, for the fork hook (weak: no leak).
_FORGET_AFTER_FORK: Final[weakref.WeakSet[FeatureLock | Heartbeat]] = weakref.WeakSet()


def _forget_locks_after_fork() -> None:
    for each in list(_FORGET_AFTER_FORK):
        each._forget_after_fork()


os.register_at_fork(after_in_child=_forget_locks_after_fork)
