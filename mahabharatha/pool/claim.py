"""The claim engine: the first free feature of a pool (``claim``, ``claim_next``, ``claim_held``),
skipping done and failed ones, and waiting for a release while others hold features."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple, TypedDict, Unpack

from mahabharatha import clock, logs, waiting
from mahabharatha.backends.base import (
    Attempts,
    ClaimsInOneStep,
    FeatureProblem,
    Held,
    LockBackend,
    LockError,
    LockInfo,
    PollingWatch,
    ReleaseWatch,
    Requester,
    WatchesReleases,
    describe_holder,
    lacks,
)
from mahabharatha.constants import GSD_DIR, RECHECK_SECONDS
from mahabharatha.functional import (
    GsdDir,
    _backend,
    _finished_in,
    _held_by,
    _local_markers,
    _owner_pid,
    _said,
    _try_once,
    _valid_attempts,
    _valid_timeout,
)
from mahabharatha.names import validate_feature_name as _validate_feature_name
from mahabharatha.owner import ownership
from mahabharatha.states import State


class ClaimOutcome(NamedTuple):
    """How a claim ended: ``held`` when it took a feature; else what the others are: ``busy``
    (held by others: one may come back), ``done``, ``failed``, ``mine`` (the claimer's own)."""

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
        self.made_with = (self.busy,)
        shown = ", ".join(self.busy[:3]) + (", ..." if len(self.busy) > 3 else "")
        super().__init__(f"no feature came free: {len(self.busy)} held by others ({shown})")


class _ClaimKeywords(TypedDict, total=False):
    """The options :func:`claim` and :func:`claim_held` pass on to :func:`claim_next`."""

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
    """Acquire the first free feature of ``features`` (default: every feature folder) that is
    not done or failed, each try a full acquire; ``None``: nothing left, :class:`NoneFreeError`:
    ``wait`` ran out while others held features. In full: ``design/contract.md``, ``claim``."""
    outcome = claim_next(features, gsd_dir, wait=wait, **options)
    if outcome.held is None and outcome.busy and wait != 0:
        raise NoneFreeError(outcome.busy)
    return None if outcome.held is None else outcome.held.feature


def claim_held(
    features: Sequence[str] | None = None,
    gsd_dir: GsdDir = GSD_DIR,
    **options: Unpack[_ClaimKeywords],
) -> Held | None:
    """One try of :func:`claim`, answering the acquisition (its feature, and its token)."""
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
    features left are; a ``wait`` that runs out lists the busy ones."""
    store = _backend(backend, gsd_dir)
    candidates = list(features) if features else store.feature_names()
    owner = _owner_pid(pid)
    if attempts is not None:
        _valid_attempts(attempts)
    wait = _valid_timeout(wait, "wait")
    found: list[FeatureProblem] = [] if problems is None else problems
    options = _ClaimOptions(reclaim_dead, include_done, attempts, lease)
    outcome = _claim_waiting(_Pool(store, candidates, owner, command, found, options), wait)
    if problems is None and found and outcome.held is None:
        raise found[0].error
    return outcome


def _claim_waiting(pool: _Pool, wait: float | None) -> ClaimOutcome:
    """Claim; while only features held by others are left, wait for a release (``wait``
    seconds; ``None``: for ever) and claim again. The watch exists only while waiting."""
    deadline = pool.deadline = waiting.Deadline(wait)
    outcome = pool.claim()
    if outcome.held is not None or outcome.nothing_left or wait == 0:
        return outcome
    store = pool.store
    watching: ReleaseWatch = PollingWatch()
    if isinstance(store, WatchesReleases):
        watching = store.release_watch(pool.candidates)
    with watching as watch:
        while True:
            # Race: a release between the claim above and the watch's start was not seen by
            # either: this claim, made with the watch in place, sees it.
            outcome = pool.claim()
            if outcome.held is not None or outcome.nothing_left or deadline.passed():
                return outcome
            pool.tell_waiting(outcome.busy)
            watch.wait(deadline.cap(RECHECK_SECONDS))


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
        command: Sequence[str] | None,
        problems: list[FeatureProblem],
        options: _ClaimOptions,
    ) -> None:
        for feature in candidates:  # every claim checks the names before it tries one
            _validate_feature_name(feature)
        self.store, self.candidates, self.owner = store, candidates, owner
        self.requester = Requester(owner, ownership.details_of(owner, command))
        self.problems = problems
        self.reclaim_dead, self.include_done, self.attempts, self.lease = options
        self.local = _local_markers(store)
        self.one_step: ClaimsInOneStep | None = None
        if not lacks(store, ClaimsInOneStep) and isinstance(store, ClaimsInOneStep):
            self.one_step = store
        self.deadline = waiting.Deadline(0.0)  # the claim's wait (also for a server's slot)
        # Features seen done or failed (only ``reopen`` undoes it), and ``mine`` (:meth:`leave`):
        # later rounds skip them unread, past the finished prefix, until one would end the pool.
        self.finished: dict[str, str] = {}
        self.open_from = 0
        self.offered: list[str] | None = None  # one-statement claims: the features offered
        self.here: dict[str, str] = {}  # one-statement claims: done or failed locally
        # --retry-delay: a feature rests this long after a failed attempt (any worker's record,
        # or this worker's ``rest_until``); ``on_waiting`` is told once what the pool waits for.
        self.retry_delay = 0.0
        self.rest_until: dict[str, float] = {}
        self.on_waiting: Callable[[LockInfo], None] | None = None
        self.told_waiting = False

    def tell_waiting(self, busy: Sequence[str]) -> None:
        """Say once (``on_waiting``) what the wait is for: the first feature held by others,
        its holder judged (``free``: it rests after a failed attempt). Not yet when that
        feature is neither held nor resting, or cannot be looked at: a later round looks again."""
        if self.told_waiting or not busy:
            return
        try:
            info = self.store.inspect(busy[0])
            # Race: its holder released it after the round saw it held. Free then means a
            # failed attempt only when the feature rests: never say one that did not happen.
            if info.state is State.FREE and not self._resting(
                info.feature, self.store.attempts(info.feature)
            ):
                return
        except OSError:
            return
        self.told_waiting = True
        if info.state is State.FREE:
            logs.say(logs.INFO, "waiting: feature %r rests after a failed attempt", info.feature)
        else:
            logs.say(logs.INFO, "waiting: %s", describe_holder(info))
        if self.on_waiting is not None:
            self.on_waiting(info)

    def leave(self, feature: str) -> None:
        """``feature``'s lock is left to this worker's own loss: later rounds count it as the
        claimer's own (``mine``) without a look, so the pool ends when the rest is finished."""
        self.finished[feature] = "mine"

    def rest(self, feature: str) -> None:
        """``feature``'s attempt failed here: it is not taken again for ``retry_delay``."""
        if self.retry_delay > 0:
            self.rest_until[feature] = clock.now() + self.retry_delay

    def _resting(self, feature: str, record: Attempts | None = None) -> bool:
        """Is ``feature`` resting after a failed attempt (this worker's, or its ``record``'s
        last)? Then it counts as held by others."""
        now = clock.now()
        ends = self.rest_until.get(feature, 0.0)
        if record is not None and record.history and self.retry_delay > 0:
            at = record.history[-1].get("at")
            if isinstance(at, int | float) and math.isfinite(at):
                # A time ahead of ours (another host's clock, a forged record) rests no longer.
                ends = max(ends, min(float(at), now) + self.retry_delay)
        return now < ends

    def claim(self) -> ClaimOutcome:
        """A round over the features; one that would end the pool first reads again what
        earlier rounds kept finished."""
        kept = self.offered is not None or any(v != "mine" for v in self.finished.values())
        outcome = self._round()
        if outcome.nothing_left and kept and self._forget_finished():
            # Race: a `lock reopen` while the pool ran opened a feature an earlier round found
            # finished (kept so, unread since): one more round reads each again before the end.
            outcome = self._round()
        return outcome

    def _forget_finished(self) -> bool:
        """Forget the features kept as finished (``mine`` stays); ``False``: no round would
        see more (a server's features: no local marker came or went since they were read)."""
        if self.one_step is not None:
            before = self.here
            self._offer()
            return self.here != before
        self.finished = {feature: v for feature, v in self.finished.items() if v == "mine"}
        self.open_from = 0
        return True

    def _round(self) -> ClaimOutcome:
        del self.problems[:]  # each round reports what it could not try
        if self.one_step is not None:
            return self._claim_in_one_step(self.one_step)
        start = self.open_from  # the features before it are finished: what each was is known
        seen = [(f, self.finished[f]) for f in self.candidates[:start]]
        for index in range(start, len(self.candidates)):
            feature = self.candidates[index]
            verdict = self.finished.get(feature)
            if verdict is None:
                tried = self._tried(feature)
                if isinstance(tried, Held):
                    return ClaimOutcome(tried)
                if tried in ("done", "failed"):
                    self.finished[feature] = tried
                verdict = tried
            if verdict in ("done", "failed") and index == self.open_from:
                self.open_from += 1  # a finished feature stays so: later rounds start past it
            if verdict is not None:
                seen.append((feature, verdict))
        return _outcome_of(seen)

    def _tried(self, feature: str) -> Held | str | None:
        """:meth:`_claim_one`, with an OS error kept in ``problems`` (``None``: not tried)."""
        try:
            return self._claim_one(feature)
        except OSError as error:
            where = str(error.filename or self.store.where())
            self.problems.append(FeatureProblem(feature, where, error))
            return None

    def _finished(self, feature: str) -> str | None:
        """``done``, ``failed``, ``busy`` (resting after a failed attempt), else None."""
        state, record = _finished_in(
            self.store, feature, include_done=self.include_done, attempts=self.attempts
        )
        if state is not None:
            return str(state)
        return "busy" if record is not None and self._resting(feature, record) else None

    def _claim_one(self, feature: str) -> Held | str:
        """Take ``feature`` unless it is finished: the acquisition, or why not (``done``,
        ``failed``, ``busy``, ``mine``: held by the claimer itself)."""
        finished = self._finished(feature)
        if finished is not None:
            return finished  # cheap: most finished features are skipped without their lock
        outcome = _try_once(self.store, feature, self.requester, self.reclaim_dead, self.lease)
        if outcome.held is None:  # stopped by the claimer's own lock ("mine"), or another's?
            return "mine" if _held_by(outcome, {self.owner}) else "busy"
        # Race: finished and released (the mark published first) between our look and our
        # acquire: now that we hold the lock the mark is certainly visible: give it back.
        finished = self._finished(feature)
        if finished is None:
            return outcome.held
        self.store.release_held(outcome.held)
        return finished

    def _claim_in_one_step(self, store: ClaimsInOneStep) -> ClaimOutcome:
        """A claim in one statement (PostgreSQL) of the features not finished in their local
        folder, looked at once per pool (the server keeps a prepared claim per list offered)."""
        offered = self._offer() if self.offered is None else self.offered
        while True:
            won = store.try_claim(
                offered,
                self.requester,
                reclaim_dead=self.reclaim_dead,
                lease=self.lease,
                include_done=self.include_done,
                retry_delay=self.retry_delay,  # the statement skips resting rows, by its clock
                slot_wait=self.deadline.left(),  # a claimer holding nothing waits for a slot
            )
            if won is None or won.held is None:
                return self._what_is_left(store, offered)
            _said(won)
            finished = self._finished_here(won.held.feature)
            if finished is None:
                return ClaimOutcome(won.held)
            # Race: its folder got a marker after the pool looked (another checkout's done):
            # done all the same; give the lock back and leave it out from now on.
            self.store.release_held(won.held)
            self.here[won.held.feature] = finished
            offered = self.offered = [f for f in offered if f != won.held.feature]

    def _offer(self) -> list[str]:
        """The features not done or failed in their local folder: those the claim is offered."""
        here = ((f, self._finished_here(f)) for f in self.candidates)
        self.here = {f: finished for f, finished in here if finished is not None}
        self.offered = [f for f in self.candidates if f not in self.here]
        return self.offered

    def _what_is_left(self, store: ClaimsInOneStep, offered: list[str]) -> ClaimOutcome:
        """The claim statement took nothing: what each feature is, as the server says after
        it. Done or failed only where a row or a local marker says so, never from absence.
        Race: a feature let go unfinished after the statement passed it held (a stop, a failed
        attempt) is held by nobody and finished nowhere: one try takes it or says why not."""
        found, done, failed, resting = store.finished_and_resting(
            offered, slot_wait=self.deadline.left()
        )
        held = {info.feature: info for info in found}
        said = dict.fromkeys(() if self.include_done else done, "done")
        said |= dict.fromkeys(failed, "failed")
        # Race: a rest may end between the claim and this look: still counted unfinished.
        said |= dict.fromkeys(resting if self.retry_delay > 0 else (), "busy")
        said |= dict.fromkeys(held, "busy")
        said |= {f: "failed" if f in failed else finished for f, finished in self.here.items()}
        seen: list[tuple[str, str]] = []
        for feature in self.candidates:
            verdict = said.get(feature)
            # The statement skips every held row, the claimer's own too. A row under the
            # claimer's pid on this host may be its own: one try tells (the owner judgement,
            # on the row's details); any other row is someone else's without a round trip.
            if verdict == "busy" and feature in held and self._may_be_mine(held[feature]):
                verdict = None
            if verdict is None:
                tried = self._tried(feature)
                if isinstance(tried, Held):
                    return ClaimOutcome(tried)
                verdict = tried or "busy"
            seen.append((feature, verdict))
        return _outcome_of(seen)

    def _may_be_mine(self, holder: LockInfo) -> bool:
        return holder.pid == self.owner and holder.host in (None, ownership.host_name())

    def _finished_here(self, feature: str) -> str | None:
        """``done`` or ``failed`` when the feature's local folder says so, else None."""
        if self.local is None:
            return None
        try:
            state, _ = _finished_in(
                self.local, feature, include_done=self.include_done, attempts=self.attempts
            )
        except OSError:
            return None
        return None if state is None else str(state)


def _outcome_of(seen: list[tuple[str, str]]) -> ClaimOutcome:
    """A claim round that took nothing: what each feature was (its verdict), in order."""
    kinds = ("busy", "done", "failed", "mine")
    return ClaimOutcome(None, *(tuple(f for f, said in seen if said == kind) for kind in kinds))
