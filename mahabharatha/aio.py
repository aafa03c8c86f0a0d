"""``AsyncFeatureLock``: ``FeatureLock`` held from an event loop (``async with``); only the
scheduling is this module's (awaits, a heartbeat task, cancellation). Long form: design/async.md."""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from functools import partial
from operator import attrgetter
from types import TracebackType
from typing import Any, Final, Generic, Self, TypedDict, TypeVar, Unpack, cast

from mahabharatha.backends.base import (
    AcquireResult,
    AlreadyHeldError,
    HearsReleases,
    Held,
    LockBackend,
    LockError,
    LockInfo,
    LockLostError,
    lacks,
)
from mahabharatha.constants import GSD_DIR
from mahabharatha.feature_lock import FeatureLock
from mahabharatha.functional import WaitCallback, _Acquiring
from mahabharatha.owner.proof import WorkProof

__all__ = ["AsyncFeatureLock"]

_T = TypeVar("_T")


class _Calls:
    """The backend calls of one backend in flight in worker threads, counted: the loop rests
    the backend (lets its connection go) only when none is, never under a call."""

    def __init__(self) -> None:
        self.count = 0
        self.guard = threading.Lock()  # loops of several threads may share one backend

    def start(self, call: Callable[[], _T]) -> asyncio.Future[_T]:
        with self.guard:
            self.count += 1
        future = asyncio.get_running_loop().run_in_executor(None, call)
        future.add_done_callback(self._ended)  # counted until the thread ends, cancelled or not
        return future

    def _ended(self, _future: object) -> None:
        with self.guard:
            self.count -= 1

    def idle(self) -> bool:
        with self.guard:
            return self.count == 0


_IN_FLIGHT: Final[weakref.WeakKeyDictionary[Any, _Calls]] = weakref.WeakKeyDictionary()
_IN_FLIGHT_GUARD: Final = threading.Lock()  # Race: two loops' first locks on one backend


def _calls_of(store: LockBackend) -> _Calls:
    """The count of ``store``'s calls in flight, one per backend object (kept with it)."""
    with _IN_FLIGHT_GUARD:
        try:
            return _IN_FLIGHT.setdefault(store, _Calls())
        except TypeError:  # a backend that cannot be weakly referenced: counted per lock
            return _Calls()


class _Gate:
    """A loop's tasks wanting one feature for one owner pid, queued (FIFO): only the front one
    contends with other processes (the backend would tell the next "already held by you")."""

    def __init__(self) -> None:
        self.turn = asyncio.Lock()
        self.owner: asyncio.Task[Any] | None = None

    async def enter(self, left: float | None) -> bool:
        """Wait for our turn (``left`` seconds at most; ``None``: for ever); False when the
        wait ran out (or, with nothing left, when another task has the turn)."""
        if left is not None and left <= 0 and self.turn.locked():
            return False
        try:
            async with asyncio.timeout(left):
                await self.turn.acquire()
        except TimeoutError:
            return False
        self.owner = asyncio.current_task()
        return True

    def leave(self) -> None:
        self.owner = None
        self.turn.release()


_Gates = dict[tuple[Any, ...], _Gate]  # a loop's gates by (backend place, feature, owner pid)
_GATES: Final[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Gates]] = (
    weakref.WeakKeyDictionary()
)
_GATES_GUARD: Final = threading.Lock()  # Race: loops in two threads adding their first gates


async def _settled(future: asyncio.Future[Any]) -> bool:
    """Wait until ``future`` is done, also when this task is cancelled meanwhile; True when it
    was (the caller then raises ``CancelledError`` once it has put things right)."""
    task = asyncio.current_task()
    assert task is not None
    before = task.cancelling()
    while not future.done():
        # A cancellation of ours is counted by ``cancelling``; the future's own outcome (an
        # error, its cancellation) is the caller's to read: either way, wait on.
        with suppress(asyncio.CancelledError, Exception):
            await asyncio.shield(future)
    return task.cancelling() > before


class _Forwarded(Generic[_T]):
    """An attribute of an ``AsyncFeatureLock``: the same-named one of the ``FeatureLock`` state
    it drives, read only."""

    def __set_name__(self, _owner: type, name: str) -> None:
        self.name, self.read = name, attrgetter(name)

    def __get__(self, lock: AsyncFeatureLock | None, _owner: type | None = None) -> _T:
        return cast(_T, self if lock is None else self.read(lock._state))

    def __set__(self, _lock: AsyncFeatureLock, _value: object) -> None:
        raise AttributeError(f"property {self.name!r} of 'AsyncFeatureLock' object has no setter")


class _Options(TypedDict, total=False):
    """``FeatureLock``'s keyword arguments but ``on_lost`` (told on the loop, never in a thread)."""

    pid: int | None
    timeout: float | None
    reclaim_dead: bool
    heartbeat: float | None
    on_wait: WaitCallback | None
    command: Sequence[str] | None
    caller_pids: Iterable[int]
    backend: LockBackend | str | None
    lease: float | None
    url: str | None


class AsyncFeatureLock:
    """Hold a feature lock for a block of an asyncio program, refreshed by a task of the loop:
    :class:`~mahabharatha.locks.FeatureLock`'s arguments, attributes and errors, its callbacks
    called on the loop; a cancelled task leaves no lock behind. Not reentrant."""

    def __init__(
        self,
        feature: str,
        gsd_dir: str | os.PathLike[str] = GSD_DIR,
        *,
        on_lost: Callable[[LockLostError], None] | None = None,
        **options: Unpack[_Options],
    ) -> None:
        if unknown := sorted(options.keys() - _Options.__annotations__):
            # As Python says it, naming the class the user called (``FeatureLock`` named its own).
            said = f"got an unexpected keyword argument {unknown[0]!r}"
            raise TypeError(f"AsyncFeatureLock.__init__() {said}")
        self._state = FeatureLock(feature, gsd_dir, **options)
        self._state._beats = None  # this loop's task beats; the loop rests the backend
        self.on_lost = on_lost
        self._on_loop = self._state.backend.local_calls
        self._calls = _calls_of(self._state.backend)
        self._beating: asyncio.Task[None] | None = None
        self._gate: _Gate | None = None  # our turn among this loop's tasks, while we hold
        self._lost_override: Callable[[LockLostError], None] | None = None  # this hold's
        self._told: LockLostError | None = None  # the loss ``on_lost`` was told of

    # ------------------------------------------------------------------ what FeatureLock says

    feature = _Forwarded[str]()
    gsd_dir = _Forwarded[str | os.PathLike[str]]()
    backend = _Forwarded[LockBackend]()
    pid = _Forwarded[int]()
    timeout = _Forwarded[float | None]()
    heartbeat = _Forwarded[float | None]()
    lease = _Forwarded[float | None]()
    lost = _Forwarded[LockLostError | None]()
    heartbeat_error = _Forwarded[OSError | None]()
    # As ``FeatureLock``'s: ours and not yet stale; its end (epoch seconds); its fencing token.
    held = _Forwarded[bool]()
    expires_at = _Forwarded[float | None]()
    token = _Forwarded[int | None]()

    def work_proof(self) -> WorkProof | None:
        """As :meth:`FeatureLock.work_proof`: a proof of life to pass to a child."""
        return self._state.work_proof()

    def __repr__(self) -> str:
        return repr(self._state).replace(type(self._state).__name__, type(self).__name__, 1)

    # ------------------------------------------------------------------ backend calls

    async def _call(self, call: Callable[[], _T]) -> _T:
        """Run one backend call: on the loop for files, else in a worker thread, whose end a
        cancelled task waits for (deadlines bound it) before it raises ``CancelledError``."""
        if self._on_loop:
            return call()
        future = self._calls.start(call)
        if await _settled(future):
            if not future.cancelled() and future.exception() is None:
                await self._give_back(future.result())
            raise asyncio.CancelledError
        return future.result()

    async def _give_back(self, outcome: object) -> None:
        """Release a lock a cancelled try took (waited for, even if cancelled again). Race:
        cancelled while the try ran in its thread: the lock is taken, unknown to anyone."""
        if not isinstance(outcome, AcquireResult) or outcome.held is None:
            return
        future = self._calls.start(partial(self.backend.release_held, outcome.held))
        await _settled(future)
        if not future.cancelled():
            future.exception()  # read: a failed give-back leaves a lock that ages out (lease)

    def _rest(self) -> None:
        """Let the backend's connection go (as ``FeatureLock`` does) when no call is in flight."""
        if self.heartbeat and self._calls.idle():
            self.backend.close()

    # ------------------------------------------------------------------ acquiring

    async def acquire(
        self,
        *,
        on_wait: WaitCallback | None = None,
        on_lost: Callable[[LockLostError], None] | None = None,
    ) -> Self:
        """As :meth:`FeatureLock.acquire` (same errors, and :class:`AlreadyHeldError` when the
        owner pid holds it), waiting without blocking the loop; cancelled while it waits, it
        leaves no lock behind."""
        state = self._state
        if state._mine is not None or self._gate is not None:
            raise LockError(f"this AsyncFeatureLock already holds {self.feature!r}")
        acquiring = state._acquiring(on_wait)
        gate = await self._turn(acquiring)
        try:
            held = await self._wait_for_lock(acquiring)
        except BaseException:
            gate.leave()
            raise
        self._gate = gate
        state._adopt(held, None)  # ``on_lost`` is told by the loop, never by a thread
        self._lost_override = on_lost
        self._rest()
        if self.heartbeat:
            # No await between the lock taken and its heartbeat started: nothing can cancel
            # this task in between (a cancellation lands at an await).
            self._beating = asyncio.get_running_loop().create_task(
                self._beat(), name=f"lock-heartbeat-{self.feature}"
            )
        return self

    async def _turn(self, acquiring: _Acquiring) -> _Gate:
        """This task's turn among the loop's tasks asking for the feature for the same owner;
        the errors of a busy lock when the wait for it runs out."""
        store = self.backend
        place = (store.kind, store.where(), store.namespace, self.feature, self.pid)
        with _GATES_GUARD:
            gates = _GATES.setdefault(asyncio.get_running_loop(), {})
            gate = gates.setdefault(place, _Gate())
        # Not reentrant: waiting for our own turn would wait for ever.
        ours = gate.owner is not None and gate.owner is asyncio.current_task()
        if ours or not await gate.enter(acquiring.deadline.left()):
            holder = await self._call(partial(self.backend.inspect, self.feature))
            raise AlreadyHeldError(holder) if ours else acquiring.busy(holder)
        return gate

    async def _wait_for_lock(self, acquiring: _Acquiring) -> Held:
        """The acquire's loop: each try a backend call, each pause an await for a release heard
        (PostgreSQL's NOTIFY), else the backoff's sleep (files: a try costs microseconds)."""
        store, feature = self.backend, self.feature
        listener: Any = None
        if not lacks(store, HearsReleases) and isinstance(store, HearsReleases):
            listener = store.async_release_listener()
        seen: asyncio.Event | None = None if listener is None else listener.watch(feature)
        try:
            while True:
                # Race: a release between this try and the wait below: the event, cleared
                # before the try, is set by it and the wait ends at once.
                if seen is not None:
                    seen.clear()
                outcome = await self._call(acquiring.try_once)
                if outcome.held is not None:
                    return outcome.held
                pause = acquiring.after(outcome)
                if isinstance(pause, LockInfo):
                    raise await self._call(partial(acquiring.judged_error, pause))
                if seen is None:
                    await asyncio.sleep(pause)
                else:
                    await listener.wait(seen, acquiring.slice(), self._call)
        finally:
            if seen is not None:
                listener.unwatch(feature, seen)

    # ------------------------------------------------------------------ holding

    async def _beat(self) -> None:
        """``FeatureLock``'s heartbeat step (``_beat_once``) paced by ``asyncio.sleep``, and
        its cut-off (``_cut_off_in``), which no pause and no refresh outlasts."""
        state, interval = self._state, self.heartbeat
        step: asyncio.Task[float | None] | None = None
        while interval:
            await asyncio.sleep(min(interval, state._cut_off_in()))
            step = asyncio.create_task(self._call(state._beat_once))
            if await self._cut_off_first(step):
                break  # lost: told at once, the refresh waited out after
            interval = step.result()
            self._rest()
        self._tell_lost()
        if step is not None:
            await step  # a refresh cut off ends before the heartbeat does, as ``_call`` waits

    async def _cut_off_first(self, step: asyncio.Task[Any]) -> bool:
        """Wait for ``step`` until the cut-off; True when that came first (the loss declared,
        ``step`` runs on). Race: a refresh stuck on a frozen link kept the loss untold past the
        lease's end, while the holder worked on beside the next one."""
        try:
            while not step.done():
                if (left := self._state._cut_off_in()) <= 0:
                    return True
                await asyncio.wait({step}, timeout=left)
        except asyncio.CancelledError:
            step.cancel()  # it ends its refresh first (``_call``): never under the release
            await _settled(step)
            raise
        return False

    def _tell_lost(self) -> None:
        """Tell ``on_lost`` (this hold's, else the lock's) the loss, if any, once, on the loop."""
        lost = self._state.lost
        if lost is None or lost is self._told:
            return
        self._told = lost
        tell = self.on_lost if self._lost_override is None else self._lost_override
        if tell is not None:
            tell(lost)

    async def refresh(self) -> None:
        """Renew our lock now; :class:`LockLostError` when it is no longer ours."""
        await self._call(self._state.refresh)
        self._rest()

    async def _stop_beat(self) -> None:
        beating, self._beating = self._beating, None
        if beating is None or beating is asyncio.current_task():
            return
        beating.cancel()
        # A refresh in a thread runs to its end before the release below: never under it.
        interrupted = await _settled(beating)
        if not beating.cancelled() and (error := beating.exception()) is not None:
            # The heartbeat ended on an error outside its rule (``on_lost`` raised): told as a
            # thread's is, by the loop's exception handler, never lost in silence.
            self._report("the heartbeat", error)
        if interrupted:
            raise asyncio.CancelledError

    def _report(self, what: str, error: BaseException) -> None:
        asyncio.get_running_loop().call_exception_handler(
            {"message": f"{what} of {self!r} failed", "exception": error}
        )

    async def release(self) -> None:
        """Stop the heartbeat and remove our lock (only if it is still exactly ours), as
        :meth:`FeatureLock.release`; cancelled meanwhile, it still releases (and tells a loss)
        first."""
        try:
            try:
                await self._stop_beat()
            finally:
                try:
                    await self._call(self._state.release)
                finally:
                    # The next task of this loop may try once the lock is gone (or, if the
                    # release failed, once it knows: its own try then says who holds it).
                    gate = self._gate
                    if gate is not None and self._state._mine is None:  # else a retry lets it in
                        self._gate = None
                        gate.leave()
                self._rest()
        except BaseException:
            # Race: cancelled (once or again) while it released: the release ran to its end,
            # and a loss it found went untold. Told now; an ``on_lost`` that raises goes to the
            # loop's handler, never in place of the ``CancelledError``.
            try:
                self._tell_lost()
            except Exception as error:
                self._report("on_lost", error)
            raise
        # Race: found by the release (taken away after the last refresh), or by a refresh the
        # release cut the heartbeat off in (cancelled before it could tell): told here, once.
        self._tell_lost()

    async def __aenter__(self) -> Self:
        return await self.acquire()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.release()
