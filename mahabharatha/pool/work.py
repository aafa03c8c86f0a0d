"""The worker loop: claim, run one feature's work holding its lock (``PoolLock``), mark it done or
record a failed attempt, again (``run_pool`` under ``lock work``, ``work`` for a callable)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from contextlib import suppress
from time import sleep
from typing import Any, Final, NamedTuple

from mahabharatha import waiting
from mahabharatha.backends.base import (
    DEFAULT_ATTEMPTS,
    FeatureProblem,
    Held,
    LocalFolder,
    LockBackend,
    LockBusyError,
    LockInfo,
    NotHeldError,
    NotOwnerError,
    UnsupportedError,
)
from mahabharatha.constants import (
    GSD_DIR,
    HEARTBEAT_SECONDS,
    LEFT_WORK_POLL_SECONDS,
    POOL_CONNECTION_GRACE_SECONDS,
    RETRY_DELAY_SECONDS,
)
from mahabharatha.feature_lock import FeatureLock, Heartbeat
from mahabharatha.functional import (
    GsdDir,
    _backend,
    _mark_done,
    _valid_attempts,
    _valid_seconds,
    _valid_timeout,
)
from mahabharatha.pool.claim import _claim_waiting, _ClaimOptions, _Pool
from mahabharatha.states import WorkEnd, WorkOutcome


class WorkResult(NamedTuple):
    """What a worker did with one feature it claimed: ``done``, ``failed`` (``attempts`` counts
    them), ``released`` (unmarked), ``lost`` (taken away while the work ran: nothing marked) or
    ``left`` (CMD failed, and work it started holds the lock until it ends)."""

    feature: str
    outcome: WorkOutcome
    exit_code: int | None
    attempts: int = 0
    reason: str | None = None
    log: str | None = None  # the file the attempt's output went to (lock work --log-dir)
    lost_while_running: bool = False  # lost, found while CMD ran (not once it had ended)

    def to_dict(self) -> dict[str, Any]:
        return self._asdict()


class WorkReport(NamedTuple):
    """How a worker's loop ended: ``finished`` (every feature done or failed), ``waited-out``,
    ``once`` or ``stopped`` (a step raised :class:`StopWork`); ``failed``: those failed for good;
    ``busy``: held by others, or by work a failed command left (``left``), when the wait ran
    out; or (``finished``) left held by this worker."""

    ended: WorkEnd
    results: tuple[WorkResult, ...]
    failed: tuple[str, ...] = ()
    busy: tuple[str, ...] = ()
    exit_code: int | None = None  # ``stopped``: the exit code the step asked for (a signal's)


class PoolLock(FeatureLock):
    """A :class:`FeatureLock` built from the pool's claim: ``acquire`` adopts it, :meth:`finish`
    marks and releases it in one step; until then ``release`` only stops the heartbeat."""

    _connection_grace = POOL_CONNECTION_GRACE_SECONDS  # a quick command's end reuses it
    _ends_by_outcome = True  # :meth:`finish` marks and releases it in one step

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
        self._claimed = held
        self._left: Held | None = None  # abandoned to work that still holds its proof
        # A failed command's leftover work: asked until it ends (then the attempt is recorded).
        self.left_running: Callable[[], bool] | None = None
        self._left_code = 1
        self.left_leased = False  # lost to another's kernel lease: the lock stays, unread
        if beats is not None:  # the worker's, for its whole run
            self._beats, self._own_beats = beats, False

    def abandon(self) -> None:
        """As :meth:`FeatureLock.abandon`, the lock kept aside for :meth:`finish_leaving_work`."""
        with self._mutex:
            self._left = self._mine
        super().abandon()

    def finish_leaving_work(
        self, exit_code: int, still_running: Callable[[], bool] | None = None
    ) -> WorkResult:
        """End a hold :meth:`abandon` left to running work: exit code 0 marks it done, another
        records nothing yet; lock and proof stay until ``still_running()`` says no."""
        self._stop_heartbeat()
        with self._mutex:
            left, self._left = self._left, None
        feature, store = self.feature, self.backend
        try:
            if left is None or self.lost is not None:
                result = self._lost(None, exit_code, self.lost)
            elif exit_code != 0:
                reason = f"exit code {exit_code}; {WORK_LEFT}"
                result = WorkResult(feature, WorkOutcome.LEFT, exit_code, 0, reason)
            elif isinstance(store, LocalFolder):
                store.mark_done_holding(left, self._release_wait)
                result = WorkResult(feature, WorkOutcome.DONE, 0, 0, WORK_LEFT)
            else:
                # No proof of life here: the release cannot let a holder in beside the left work.
                _mark_done(store, feature, left.pid, self._release_wait)
                return WorkResult(feature, WorkOutcome.DONE, 0)
        except (NotHeldError, NotOwnerError, LockBusyError) as gone:
            # Race: taken away after the last heartbeat, as in :meth:`finish`: nothing marked
            # (what is left of it goes once the work ends); or unreadable, as there.
            result = self._lost(None, exit_code, gone)
        if left is not None and still_running is not None:
            with self._mutex:
                self._left, self.left_running = left, still_running
            self._left_code = exit_code
        return result

    def finish_left_work(self, limit: int) -> WorkResult:
        """The work a command left has ended: record a failed one's attempt and release (a
        done one's marker is written: it is only released; a lost one, taken back if left)."""
        with self._mutex:
            self._mine, self._left, self.left_running = self._left, None, None
        return self.finish(self._left_code or None, None, limit)

    def finish(self, exit_code: int | None, reason: str | None, limit: int) -> WorkResult:
        """End the hold: exit code 0 marks the feature done, another records a failed attempt
        (``reason``), ``None`` releases it unmarked; each releases the lock."""
        self._stop_heartbeat()
        with self._mutex:
            self._forget_if_forked()
            # A claim its step never adopted (it failed before ``acquire``) is ended too.
            mine, self._mine, self._claimed = self._mine or self._claimed, None, None
            self._close_handed()  # our copy: the children it was handed to keep theirs
        feature = self.feature
        if mine is None or self.lost is not None:
            return self._lost(mine, exit_code, self.lost)
        why = reason or f"exit code {exit_code}"
        try:
            if exit_code is None:
                # A stop (a signal, CMD not started, an interrupted task): one try (a release
                # never waits for a slot); the lock would come free at its lease's end anyway.
                self.backend.release_held(mine)
                return WorkResult(feature, WorkOutcome.RELEASED, None, 0, reason)
            if exit_code == 0:
                _mark_done(self.backend, feature, mine.pid, self._release_wait)
                return WorkResult(feature, WorkOutcome.DONE, 0)
            record = self.backend.fail(feature, mine.pid, why, limit, self._release_wait)
        except UnsupportedError:
            self.backend.release_held(mine)
            return WorkResult(feature, WorkOutcome.RELEASED, exit_code, 0, why)
        except (NotHeldError, NotOwnerError) as gone:
            # Race: taken away (a forced release, a reclaim) after the last heartbeat, so a
            # quick work ended before the loss was seen: nothing was marked, it was lost.
            return self._lost(mine, exit_code, gone)
        except LockBusyError as busy:
            # Another's kernel lease outlasted the wait (``work()``: no wait): the lock stays,
            # unread, lost to this worker, which goes on; the reason says how the lock goes.
            self.left_leased = True
            return self._lost(None, exit_code, busy)
        return WorkResult(feature, WorkOutcome.FAILED, exit_code, record.tries, why)

    def _lost(self, mine: Held | None, exit_code: int | None, why: Exception | None) -> WorkResult:
        """Outcome lost, with the loss's sentence (what took it, when it is known) as reason;
        what is left of ``mine`` (its proof, a lock still exactly ours) goes."""
        if mine is not None:
            with suppress(OSError):  # lost already: taking back what is left is best effort
                self.backend.release_held(mine)
        reason = None if why is None else str(why)
        return WorkResult(self.feature, WorkOutcome.LOST, exit_code, 0, reason)


WORK_LEFT: Final = (
    "its work still runs outside its process group; the lock stays held until it ends"
)
"""What a result says of work that CMD left running, holding the lock's proof of life."""


class StopWork(Exception):
    """A signal interrupted a step's work: the loop ends with ``result``, exit ``exit_code``."""

    def __init__(self, result: WorkResult, exit_code: int) -> None:
        super().__init__(result.feature)
        self.result, self.exit_code = result, exit_code


WorkStep = Callable[[PoolLock], WorkResult]  # one feature's work on its claimed lock: its result


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
    retry_delay: float = RETRY_DELAY_SECONDS,
    on_waiting: Callable[[LockInfo], None] | None = None,
) -> WorkReport:
    """The worker loop under :func:`work` and ``lock work``: claim, run ``step`` with the lock
    held, again, waiting for a release (``wait`` seconds each time) while others hold what is
    left; ends when nothing is left, the wait ran out, after ``once``, or on :class:`StopWork`."""
    store = _backend(backend, gsd_dir)
    candidates = list(features) if features else store.feature_names()
    _valid_attempts(attempts)
    wait = _valid_timeout(wait, "wait")
    owner = os.getpid()
    found: list[FeatureProblem] = [] if problems is None else problems
    lease = _valid_seconds("lease", store.run_lease)
    options = _ClaimOptions(reclaim_dead, False, attempts, lease)
    pool = _Pool(store, candidates, owner, command, found, options)
    pool.retry_delay = _valid_seconds("retry_delay", retry_delay) or 0.0
    pool.on_waiting = on_waiting
    results: list[WorkResult] = []

    def record(result: WorkResult) -> None:
        results.append(result)
        if on_result is not None:
            on_result(result)

    beats = Heartbeat()  # one thread for the worker's whole run, not one per feature
    leaving: list[PoolLock] = []  # held for work a failed command left running
    kept: list[PoolLock] = []  # held for work a done (or lost) one left: never waited for
    try:
        while True:
            for each in _left_work_ended(kept, 0.0):  # its lock and proof go once it ends
                kept.remove(each)
                with suppress(OSError):  # a done feature's lock left behind only ages out
                    each.finish_left_work(attempts)
            outcome = _claim_waiting(pool, wait)
            if outcome.held is None and outcome.nothing_left and leaving:
                # Race: only features our failed commands left work on are left, and others
                # wait for them (their owner lives): wait for that work, record, claim again.
                over = _left_work_ended(leaving, wait)
                for each in over:
                    leaving.remove(each)
                    record(each.finish_left_work(attempts))
                if over:
                    continue
            if outcome.held is None:
                if found and problems is None:
                    raise found[0].error
                # The wait ran out on work a failed command left: neither done nor failed,
                # its lock kept for that work (its attempt is recorded by no one).
                running = tuple(each.feature for each in leaving)
                if not outcome.nothing_left or running:
                    busy = outcome.busy + running
                    return WorkReport(WorkEnd.WAITED_OUT, tuple(results), outcome.failed, busy)
                # Finished: the locks this worker left held (``leave``, below), not finished;
                # not every ``mine`` (another thread of this process may be working on one).
                left = [f for f in outcome.mine if pool.finished.get(f) == "mine"]
                return WorkReport(WorkEnd.FINISHED, tuple(results), outcome.failed, tuple(left))
            lock = PoolLock(
                outcome.held,
                gsd_dir,
                backend=store,
                heartbeat=heartbeat,
                command=command,
                lease=lease,
                beats=beats,
            )
            try:
                result = step(lock)
            except StopWork as stop:
                record(stop.result)
                return WorkReport(WorkEnd.STOPPED, tuple(results), exit_code=stop.exit_code)
            if result.outcome == WorkOutcome.FAILED:
                pool.rest(result.feature)
            if lock.left_leased:
                # Its lock (ours, unreadable) stays under another's lease: waiting for it would
                # wait for ourselves, so this worker never claims it again; others still may.
                pool.leave(result.feature)
            record(result)
            if lock.left_running is not None:
                (leaving if result.outcome == WorkOutcome.LEFT else kept).append(lock)
            if once:
                return WorkReport(WorkEnd.ONCE, tuple(results))
    finally:
        beats.close()


def _left_work_ended(leaving: list[PoolLock], wait: float | None) -> list[PoolLock]:
    """The locks of ``leaving`` whose command's leftover work has ended, once one has (at
    most ``wait`` seconds; ``None``: for ever); none when the wait ran out."""
    deadline = waiting.Deadline(wait)
    while True:
        ended = [lock for lock in leaving if not (lock.left_running and lock.left_running())]
        if ended or deadline.passed():
            return ended
        sleep(LEFT_WORK_POLL_SECONDS)


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
    """The worker loop over a callable: ``task(feature)`` holding its lock; a return marks it
    done, an ``Exception`` or ``False`` records a failed attempt, a ``BaseException`` releases
    it unmarked and propagates. In full: ``design/contract.md``, ``work``."""

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
