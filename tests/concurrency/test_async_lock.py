"""``AsyncFeatureLock`` against real processes, on files and on PostgreSQL.

Each test names the promise it checks: tasks of several processes, each process one event loop,
never hold a feature together; a task waiting for a held lock lets the loop's other tasks run; a
task cancelled while it waits, while its try runs in a thread, or inside the block, leaves no
lock (and no turn) behind; the heartbeat keeps a lock past its lease without a thread per lock;
a lost lock is reported on the loop. Processes are forked and synchronised by events and
barriers; a hang guard bounds every wait, and no test asserts a time.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Final, cast

import pytest

from mahabharatha import locks
from mahabharatha.backends.base import Held, LockBackend, Requester
from mahabharatha.backends.files.backend import FileBackend
from mahabharatha.commands import _utils
from mahabharatha.constants import STALE_AFTER_SECONDS
from mahabharatha.locks import AsyncFeatureLock
from mahabharatha.states import State
from tests.conformance._procs import CTX, SYNC_TIMEOUT, run_team, stress

FEATURE: Final = "feat"
HANG_GUARD_SECONDS: Final = 30.0
"""Bounds every wait of a test (a broken lock fails it, never hangs it); no time is asserted."""
PROCESSES: Final = 3
TASKS_PER_PROCESS: Final = 6
CONTENDED: Final = ("alpha", "beta")
INSIDE_SECONDS: Final = 0.002
"""How long a holder stays inside (a widened window, never a synchronisation)."""


@dataclass(frozen=True)
class Place:
    """Where the test's locks live: a folder, or a fresh namespace on the session's server."""

    gsd: Path
    url: str | None = None
    namespace: str | None = None

    def open(self) -> LockBackend:
        """A backend on this place (each process opens its own)."""
        if self.url is None:
            return FileBackend(self.gsd)
        from mahabharatha.backends.postgres.backend import PostgresBackend

        assert self.namespace is not None
        return PostgresBackend(self.url, namespace=self.namespace, gsd_dir=self.gsd)


@pytest.fixture(params=["files", pytest.param("postgres", marks=pytest.mark.postgres)])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    gsd = tmp_path / "gsd"
    (gsd / "specs").mkdir(parents=True)
    if request.param == "files":
        return Place(gsd)
    server = request.getfixturevalue("pg_server")
    return Place(gsd, server.url(), f"async-{uuid.uuid4().hex[:12]}")


@contextmanager
def held_elsewhere(place: Place, feature: str = FEATURE) -> Iterator[Any]:
    """Another process holds ``feature`` until the event it yields is set (or the block ends)."""
    held, let_go = CTX.Event(), CTX.Event()

    def hold() -> None:
        backend = place.open()
        with locks.FeatureLock(feature, place.gsd, backend=backend, timeout=0, heartbeat=None):
            held.set()
            let_go.wait(SYNC_TIMEOUT)
        backend.close()

    holder = CTX.Process(target=hold)
    holder.start()
    try:
        assert held.wait(SYNC_TIMEOUT), "the holder never took the lock"
        yield let_go
    finally:
        let_go.set()
        holder.join(SYNC_TIMEOUT)
        if holder.is_alive():
            holder.kill()
            holder.join()
    assert holder.exitcode == 0, f"the holder failed (exit code {holder.exitcode})"


def state_of(place: Place, feature: str = FEATURE) -> State:
    backend = place.open()
    try:
        return backend.inspect(feature).state
    finally:
        backend.close()


async def waiting_for(lock: AsyncFeatureLock) -> asyncio.Task[AsyncFeatureLock]:
    """A task acquiring ``lock``, returned once it has found the lock busy and waits."""
    busy = asyncio.Event()
    task = asyncio.create_task(lock.acquire(on_wait=lambda _info, _left: busy.set()))
    async with asyncio.timeout(HANG_GUARD_SECONDS):
        await busy.wait()
    return task


# --------------------------------------------------------------------------- exclusion


async def _contend(place: Place, process: int, rounds: int) -> tuple[list[str], int]:
    """Every task of this loop takes the contended features in turn; inside, it claims an
    occupancy marker with O_EXCL (a second holder finds it there) and yields to the others."""
    backend = place.open()
    clashes: list[str] = []
    entries = 0

    async def task(index: int) -> None:
        nonlocal entries
        for round_ in range(rounds):
            feature = CONTENDED[(index + round_) % len(CONTENDED)]
            marker = place.gsd / f"inside-{feature}"
            async with AsyncFeatureLock(feature, place.gsd, backend=backend, heartbeat=None):
                try:
                    fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    clashes.append(f"process {process} task {index} entered {feature} held")
                    continue
                os.close(fd)
                # The loop's other tasks, and the other processes, try meanwhile: a stay long
                # enough for a server round trip widens the window a second holder would use.
                await asyncio.sleep(INSIDE_SECONDS)
                entries += 1
                os.unlink(marker)

    try:
        async with asyncio.timeout(HANG_GUARD_SECONDS * 2):
            await asyncio.gather(*(task(index) for index in range(TASKS_PER_PROCESS)))
    finally:
        backend.close()
    return clashes, entries


def test_tasks_of_many_processes_never_hold_a_feature_together(place: Place) -> None:
    """Several processes, each an event loop of several tasks, take two features again and
    again: nobody ever enters a feature another holder is in. Fails on a lock given back as
    soon as it is taken (tried: the occupancy marker is found)."""
    rounds = stress(4)
    start = CTX.Barrier(PROCESSES)

    def work(process: int) -> tuple[list[str], int]:
        start.wait(SYNC_TIMEOUT)
        return asyncio.run(_contend(place, process, rounds))

    answers = run_team(PROCESSES, work)
    clashes = [clash for found, _ in answers for clash in found]
    assert clashes == []
    assert sum(entries for _, entries in answers) == PROCESSES * TASKS_PER_PROCESS * rounds


def test_a_task_asking_again_for_its_own_lock_is_told_so_not_left_waiting(place: Place) -> None:
    """Not reentrant, as ``FeatureLock``: the holding task's second ask raises at once.
    Fails when the task waits for its own turn (tried: the hang guard ended the wait)."""

    async def main() -> None:
        backend = place.open()
        try:
            async with AsyncFeatureLock(FEATURE, place.gsd, backend=backend, heartbeat=None):
                with pytest.raises(locks.AlreadyHeldError):
                    async with asyncio.timeout(HANG_GUARD_SECONDS):
                        await AsyncFeatureLock(FEATURE, place.gsd, backend=backend).acquire()
        finally:
            backend.close()

    asyncio.run(main())


@pytest.mark.parametrize("timeout", [0.0, 0.2])
def test_a_held_lock_raises_what_feature_lock_raises_naming_the_holder(
    place: Place, timeout: float
) -> None:
    """``timeout=0`` tries once (``LockHeldError``), a wait that runs out is
    ``LockTimeoutError`` (also a ``TimeoutError``), each naming the holder's pid, as
    ``FeatureLock``; the same for a task whose turn behind another task of its loop never
    came. Fails when every busy lock is a plain ``LockHeldError`` (tried)."""
    expected = locks.LockTimeoutError if timeout else locks.LockHeldError

    async def main(holder_pid: int) -> None:
        backend = place.open()
        try:
            with pytest.raises(expected) as raised:
                await AsyncFeatureLock(
                    FEATURE, place.gsd, backend=backend, timeout=timeout
                ).acquire()
            assert raised.value.info.pid == holder_pid
            assert (timeout > 0) == isinstance(raised.value, TimeoutError)
        finally:
            backend.close()

    async def behind_a_task_of_ours() -> None:
        backend = place.open()
        try:
            async with AsyncFeatureLock(FEATURE, place.gsd, backend=backend, heartbeat=None):
                other = asyncio.create_task(
                    AsyncFeatureLock(FEATURE, place.gsd, backend=backend, timeout=timeout).acquire()
                )
                with pytest.raises(expected) as raised:
                    await other
                assert raised.value.info.pid == os.getpid()
        finally:
            backend.close()

    with held_elsewhere(place):
        holder = place.open()
        try:
            holder_pid = holder.inspect(FEATURE).pid
        finally:
            holder.close()
        assert holder_pid is not None and holder_pid != os.getpid()
        asyncio.run(main(holder_pid))
    asyncio.run(behind_a_task_of_ours())


# --------------------------------------------------------------------------- the loop runs on


async def _ping_pong(rounds: int) -> int:
    """Two tasks hand an event back and forth ``rounds`` times: only a running loop does it."""
    ping, pong = asyncio.Event(), asyncio.Event()
    done = 0

    async def answer() -> None:
        for _ in range(rounds):
            await ping.wait()
            ping.clear()
            pong.set()

    other = asyncio.create_task(answer())
    for _ in range(rounds):
        ping.set()
        await pong.wait()
        pong.clear()
        done += 1
    await other
    return done


def test_a_task_waiting_for_a_held_lock_lets_the_other_tasks_run(place: Place) -> None:
    """While one task waits for a lock another process holds, two others play 100 rounds of
    ping-pong; only then is the holder told to let go, and the waiter gets the lock. Fails on
    a wait that blocks the loop (tried on both backends: the blocking ``locks.acquire`` called
    from the task; on files also ``time.sleep`` between tries: the waiter got the lock only
    after the holder's hang guard, before the rounds were played)."""

    async def main(let_go: Any) -> None:
        backend = place.open()
        try:
            waiter = await waiting_for(
                AsyncFeatureLock(FEATURE, place.gsd, backend=backend, heartbeat=None)
            )
            async with asyncio.timeout(HANG_GUARD_SECONDS):
                assert await _ping_pong(100) == 100
            assert not waiter.done(), "the waiter got a lock that was still held"
            let_go.set()
            async with asyncio.timeout(HANG_GUARD_SECONDS):
                lock = await waiter
            assert lock.held
            await lock.release()
        finally:
            backend.close()

    with held_elsewhere(place) as let_go:
        asyncio.run(main(let_go))


# --------------------------------------------------------------------------- cancellation


def test_a_task_cancelled_while_it_waits_leaves_no_lock_and_no_turn(place: Place) -> None:
    """A waiter is cancelled; after the holder lets go the feature is free, and the next task
    of the same loop takes it at once. Fails when a cancelled waiter keeps its turn among the
    loop's tasks (tried: the next ``timeout=0`` acquire was told it is held)."""

    async def main(let_go: Any) -> None:
        backend = place.open()
        try:
            waiter = await waiting_for(AsyncFeatureLock(FEATURE, place.gsd, backend=backend))
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            let_go.set()
            async with asyncio.timeout(HANG_GUARD_SECONDS):
                while state_of(place) is not State.FREE:  # the holder's process ends
                    await asyncio.sleep(0.01)
            lock = AsyncFeatureLock(FEATURE, place.gsd, backend=backend, timeout=0, heartbeat=None)
            async with lock:
                assert lock.held
        finally:
            backend.close()

    with held_elsewhere(place) as let_go:
        asyncio.run(main(let_go))
    assert state_of(place) is State.FREE


class _PausedInAThread:
    """A backend whose calls are network calls (so made in a worker thread); its ``paused``
    call waits until the test lets it go: the task, or a release, cuts in while it runs."""

    kind = "remote"

    def __init__(self, real: LockBackend, paused: str) -> None:
        self.real, self.paused = real, paused
        self.local_calls = False  # its calls are made in a thread
        self.entered = threading.Event()
        self.go_on = threading.Event()

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.real, name)
        if name != self.paused:
            return found

        def held_up(*args: Any, **options: Any) -> Any:
            self.entered.set()
            assert self.go_on.wait(HANG_GUARD_SECONDS)
            return found(*args, **options)

        return held_up


def test_a_task_cancelled_while_its_try_runs_in_a_thread_gives_back_what_it_took(
    place: Place,
) -> None:
    """The race of a backend call in a thread: the task is cancelled, the try goes on and
    takes the lock. The task waits for it and releases it before ``CancelledError`` goes on.
    Fails when the thread's outcome is dropped (tried: the lock stayed held by us)."""

    async def main() -> None:
        slow = _PausedInAThread(place.open(), "try_acquire")
        try:
            lock = AsyncFeatureLock(
                FEATURE, place.gsd, backend=cast(LockBackend, slow), heartbeat=None
            )
            task = asyncio.create_task(lock.acquire())
            loop = asyncio.get_running_loop()
            assert await loop.run_in_executor(None, slow.entered.wait, HANG_GUARD_SECONDS)
            task.cancel()
            await asyncio.sleep(0)  # the cancellation reaches the task while the try runs
            slow.go_on.set()
            with pytest.raises(asyncio.CancelledError):
                async with asyncio.timeout(HANG_GUARD_SECONDS):
                    await task
            assert not lock.held
        finally:
            slow.real.close()

    asyncio.run(main())
    assert state_of(place) is State.FREE


def test_a_task_cancelled_inside_the_block_releases_the_lock(place: Place) -> None:
    """Fails when the exit releases only on success (tried: the lock stayed held)."""

    async def main() -> None:
        backend = place.open()
        inside = asyncio.Event()

        async def hold() -> None:
            async with AsyncFeatureLock(FEATURE, place.gsd, backend=backend, heartbeat=None):
                inside.set()
                await asyncio.Event().wait()  # until cancelled

        try:
            task = asyncio.create_task(hold())
            async with asyncio.timeout(HANG_GUARD_SECONDS):
                await inside.wait()
            assert state_of(place) is State.ACTIVE
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            backend.close()

    asyncio.run(main())
    assert state_of(place) is State.FREE


# --------------------------------------------------------------------------- heartbeat


LEASE_SECONDS: Final = 1.0
"""A PostgreSQL lease short enough to pass several times in a test (refreshed every third)."""
CLOCK_SPEED: Final = 20_000.0
"""On files the stale limit is fixed (2 h): the lock code's clock (``_utils.time``, the
contract's seam) runs this much faster, so 2 h pass in well under a second."""
HELD_AT_ONCE: Final = 8


@pytest.fixture
def fast_clock(place: Place, monkeypatch: pytest.MonkeyPatch) -> float:
    """The lease a lock must outlive: PostgreSQL's short one, or files' 2 h on a fast clock."""
    if place.url is not None:
        return LEASE_SECONDS
    started = time.time()

    def fast() -> float:
        return started + (time.time() - started) * CLOCK_SPEED

    monkeypatch.setattr(_utils, "time", SimpleNamespace(time=fast))
    return STALE_AFTER_SECONDS


def test_the_heartbeat_keeps_locks_past_their_lease_without_a_thread_per_lock(
    place: Place, fast_clock: float
) -> None:
    """Eight locks held by one loop are each refreshed until they have outlived their first
    lease, and another holder still finds them held; no thread was started per lock (files:
    none at all). Fails without the heartbeat task (tried: the hang guard ended the wait) and
    with a heartbeat thread per lock (tried: eight more threads)."""
    lease = fast_clock
    features = [f"hb-{index}" for index in range(HELD_AT_ONCE)]
    before = threading.active_count()

    async def main() -> int:
        backend = place.open()
        holders = [
            AsyncFeatureLock(
                feature, place.gsd, backend=backend, timeout=0, heartbeat=0.02, lease=None
            )
            if place.url is None
            else AsyncFeatureLock(feature, place.gsd, backend=backend, timeout=0, lease=lease)
            for feature in features
        ]
        try:
            for holder in holders:
                await holder.acquire()
            first = [holder.expires_at for holder in holders]
            most_threads = threading.active_count()
            async with asyncio.timeout(HANG_GUARD_SECONDS):
                for holder, expiry in zip(holders, first, strict=True):
                    assert expiry is not None
                    while (holder.expires_at or 0.0) <= expiry + lease:
                        most_threads = max(most_threads, threading.active_count())
                        await asyncio.sleep(0.01)
            other = place.open()
            try:
                for feature in features:
                    assert other.inspect(feature).state is State.ACTIVE, feature
                    assert other.try_acquire(feature, Requester(1)).held is None, feature
            finally:
                other.close()
            assert all(holder.lost is None for holder in holders)
            return most_threads
        finally:
            for holder in holders:
                await holder.release()
            backend.close()

    most_threads = asyncio.run(main())
    if place.url is None:
        assert most_threads == before, "a thread was started to keep a file lock fresh"
    else:
        assert most_threads - before < HELD_AT_ONCE, "a thread per lock keeps them fresh"


# --------------------------------------------------------------------------- lost


def _take_over(place: Place, feature: str, owner: int) -> Held | None:
    """What ``lock release --force`` then another owner's acquire do (a forced take-over)."""
    other = place.open()
    try:
        other.release(feature, owner, force=True)
        return other.try_acquire(feature, Requester(1)).held
    finally:
        other.close()


def test_a_lost_lock_is_reported_on_the_loop_and_the_new_owners_lock_is_left(
    place: Place,
) -> None:
    """Another owner forces the lock away: the heartbeat finds it gone, ``lost`` says so and
    ``on_lost`` is called on the loop's thread; the exit leaves the new owner's lock. Fails
    when the heartbeat task does not report it (tried: the hang guard ended the wait)."""

    async def main() -> None:
        backend = place.open()
        told: list[tuple[locks.LockLostError, int]] = []
        reported = asyncio.Event()

        def on_lost(error: locks.LockLostError) -> None:
            told.append((error, threading.get_ident()))
            reported.set()

        heartbeat = 0.01 if place.url is None else locks.HEARTBEAT_SECONDS  # PG: lease / 3
        lock = AsyncFeatureLock(
            FEATURE,
            place.gsd,
            backend=backend,
            timeout=0,
            heartbeat=heartbeat,
            lease=None if place.url is None else LEASE_SECONDS,
            on_lost=on_lost,
        )
        try:
            async with lock:
                assert _take_over(place, FEATURE, os.getpid()) is not None
                async with asyncio.timeout(HANG_GUARD_SECONDS):
                    await reported.wait()
                assert not lock.held
                with pytest.raises(locks.LockLostError):
                    await lock.refresh()
        finally:
            backend.close()
        assert told == [(lock.lost, threading.get_ident())]

    asyncio.run(main())
    backend = place.open()
    try:
        assert backend.inspect(FEATURE).pid == 1, "the new owner's lock was removed"
    finally:
        backend.close()


def test_a_lock_taken_away_unseen_is_reported_lost_by_its_release(place: Place) -> None:
    """Forced away before any refresh could see it (the next is 20 s off): the release finds
    nothing of ours, so ``lost`` is set and ``on_lost`` told once, on the loop's thread.
    Failed on c000d56: the release said nothing (``lost`` None, nobody told)."""

    async def main() -> None:
        backend = place.open()
        told: list[tuple[locks.LockLostError, int]] = []
        lock = AsyncFeatureLock(
            FEATURE,
            place.gsd,
            backend=backend,
            timeout=0,
            heartbeat=20.0,
            lease=None if place.url is None else 60.0,
            on_lost=lambda error: told.append((error, threading.get_ident())),
        )
        try:
            async with lock:
                assert _take_over(place, FEATURE, os.getpid()) is not None
        finally:
            backend.close()
        assert lock.lost is not None and "before its release" in lock.lost.reason
        assert told == [(lock.lost, threading.get_ident())]

    asyncio.run(main())


# --------------------------------------------------------------------------- one backend


@pytest.mark.postgres
def test_with_the_url_in_the_environment_the_async_lock_is_on_the_server(
    pg_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every entry point, one backend: ``MAHABHARATHA_LOCK_URL`` set, no ``url=`` given, the
    lock is on the server (never the files beside it). Fails when the default ignores the
    variable (tried: the lock was a file)."""
    namespace = f"async-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("MAHABHARATHA_LOCK_URL", pg_server.url())
    monkeypatch.setenv("MAHABHARATHA_LOCK_NAMESPACE", namespace)
    server = Place(tmp_path, pg_server.url(), namespace)

    async def main() -> None:
        async with AsyncFeatureLock(FEATURE, tmp_path, timeout=0, heartbeat=None) as lock:
            assert lock.backend.kind == "postgresql"
            assert state_of(server) is State.ACTIVE
            assert lock.token is not None
            assert not (tmp_path / "specs" / FEATURE / ".lock").exists()

    asyncio.run(main())
    assert state_of(server) is State.FREE


@pytest.mark.postgres
def test_the_waiting_tasks_of_a_loop_share_one_listening_connection_closed_after_them(
    pg_server: Any, tmp_path: Path
) -> None:
    """Ten tasks wait for one held feature on one listening connection (the server's slots:
    ``max_connections``), and once nobody waits it is closed. Fails with a listener per
    waiter (tried: ten connections)."""
    from tests.support.postgres import admin_execute

    place = Place(tmp_path, pg_server.url(), f"async-{uuid.uuid4().hex[:12]}")
    count = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"

    def listeners() -> int:
        found = admin_execute(pg_server, count, "mahabharatha-wait-async")
        return int(str(found[0][0]))

    async def take_and_give_back(backend: LockBackend, pid: int, busy: asyncio.Event) -> None:
        told = busy.set
        async with AsyncFeatureLock(
            FEATURE, tmp_path, backend=backend, pid=pid, on_wait=lambda *_: told()
        ):
            pass

    async def main(let_go: Any) -> None:
        backend = place.open()
        try:
            # Owners of their own (pids of their own): each task contends on the server, none
            # queues behind another task of this loop.
            told = [asyncio.Event() for _ in range(10)]
            waiters = [
                asyncio.create_task(take_and_give_back(backend, 100 + index, told[index]))
                for index in range(10)
            ]
            async with asyncio.timeout(HANG_GUARD_SECONDS):
                for busy in told:
                    await busy.wait()
                while listeners() == 0:
                    await asyncio.sleep(0.01)
            assert listeners() == 1
            let_go.set()
            async with asyncio.timeout(HANG_GUARD_SECONDS):
                await asyncio.gather(*waiters)
            async with asyncio.timeout(HANG_GUARD_SECONDS):
                while listeners() != 0:  # nobody waits: the connection is let go
                    await asyncio.sleep(0.01)
        finally:
            backend.close()

    with held_elsewhere(place) as let_go:
        asyncio.run(main(let_go))


def test_a_loss_found_by_a_refresh_the_release_cut_off_is_told(place: Place) -> None:
    """The lock is forced away while a refresh runs in its thread; the release cancels the
    heartbeat, which waits that refresh out: the refresh finds the loss (``lost`` set), and
    the heartbeat, cancelled, never tells it. The release must: ``on_lost`` once, on the loop.
    Failed on 28320c8: ``lost`` set, ``on_lost`` never called (the release took a loss merely
    declared for one told)."""

    async def main() -> None:
        slow = _PausedInAThread(place.open(), "refresh")
        told: list[tuple[locks.LockLostError, int]] = []
        lock = AsyncFeatureLock(
            FEATURE,
            place.gsd,
            backend=cast(LockBackend, slow),
            timeout=0,
            heartbeat=0.01,
            on_lost=lambda error: told.append((error, threading.get_ident())),
        )
        try:
            await lock.acquire()
            loop = asyncio.get_running_loop()
            assert await loop.run_in_executor(None, slow.entered.wait, HANG_GUARD_SECONDS)
            assert _take_over(place, FEATURE, os.getpid()) is not None
            # Let the refresh go on only once the release has cancelled the heartbeat.
            loop.call_soon(slow.go_on.set)
            async with asyncio.timeout(HANG_GUARD_SECONDS):
                await lock.release()
        finally:
            slow.real.close()
        assert lock.lost is not None
        assert told == [(lock.lost, threading.get_ident())]

    asyncio.run(main())


@pytest.mark.parametrize("cancels", [1, 2])
def test_a_release_cancelled_while_it_runs_ends_and_tells_the_loss_it_found(
    place: Place, cancels: int
) -> None:
    """The lock is forced away unseen; the task releasing it is cancelled (once, or again)
    while the release runs in its thread. The release goes on to its end, the loss it finds is
    told once, on the loop, and the task still ends cancelled: an ``on_lost`` that raises then
    goes to the loop's exception handler, never in place of ``CancelledError``. Failed on
    96f1493: ``lost`` set, ``on_lost`` never called (the cancelled release ended untold)."""

    async def main() -> None:
        slow = _PausedInAThread(place.open(), "release_held")
        told: list[tuple[locks.LockLostError, int]] = []
        handled: list[BaseException] = []
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: handled.append(context["exception"]))

        def on_lost(error: locks.LockLostError) -> None:
            told.append((error, threading.get_ident()))
            raise RuntimeError("on_lost failed")

        lock = AsyncFeatureLock(
            FEATURE,
            place.gsd,
            backend=cast(LockBackend, slow),
            timeout=0,
            heartbeat=None,
            on_lost=on_lost,
        )
        try:
            await lock.acquire()
            assert _take_over(place, FEATURE, os.getpid()) is not None
            releasing = asyncio.create_task(lock.release())
            assert await loop.run_in_executor(None, slow.entered.wait, HANG_GUARD_SECONDS)
            for _ in range(cancels):
                releasing.cancel()
                await asyncio.sleep(0)  # each cancellation reaches the task as the release runs
            slow.go_on.set()
            with pytest.raises(asyncio.CancelledError):
                async with asyncio.timeout(HANG_GUARD_SECONDS):
                    await releasing
        finally:
            slow.real.close()
        assert lock.lost is not None and "before its release" in lock.lost.reason
        assert told == [(lock.lost, threading.get_ident())]
        assert [str(error) for error in handled] == ["on_lost failed"]

    asyncio.run(main())
    backend = place.open()
    try:
        assert backend.inspect(FEATURE).pid == 1, "the new owner's lock was removed"
    finally:
        backend.close()


CROWDED_ROLE_SLOTS: Final = 2
"""The waiter's role's ``CONNECTION LIMIT``: its claims' connection leaves one slot, so the
server is crowded to it (``crowded``: a tenth free, at least one), as a full server is."""
LOOKS: Final = 4
"""Looks a waiter makes on the crowded server before the holder lets go."""


@pytest.mark.postgres
def test_an_async_waiter_on_a_crowded_server_listens_on_no_connection_and_still_gets_the_lock(
    pg_server: Any, tmp_path: Path
) -> None:
    """A task waits for a held feature as a role with two slots: crowded, as the sync waits
    judge it (``crowded``, asked at each look). At each of its looks it holds no listening
    connection, and between two looks none at all (a holder needing a slot to mark its done
    gets one); once the holder lets go, its next look takes the lock. Failed on 96f1493: it
    listened on the second slot from its first look to the end of its wait (one listening
    session at every later look), its claims' connection kept beside it."""
    from tests.support.postgres import admin_execute

    place = Place(tmp_path, pg_server.url(), f"async-{uuid.uuid4().hex[:12]}")
    role = f"mh_crowd_{uuid.uuid4().hex[:8]}"
    listening = (
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE usename = %s AND application_name = 'mahabharatha-wait-async'"
    )
    claims = (
        "SELECT pid FROM pg_stat_activity WHERE usename = %s AND application_name = 'mahabharatha'"
    )
    seen: list[int] = []
    connections: list[object] = []  # the claims' connection's server process at each look

    async def main(let_go: Any) -> None:
        from mahabharatha.backends.postgres.backend import PostgresBackend

        backend = PostgresBackend(
            pg_server.url(role=role), namespace=place.namespace, gsd_dir=place.gsd
        )
        looked = asyncio.Event()

        def look(_info: object, _left: object) -> None:
            seen.append(int(str(admin_execute(pg_server, listening, role)[0][0])))
            connections.extend(row[0] for row in admin_execute(pg_server, claims, role))
            if len(seen) == LOOKS:
                looked.set()

        lock = AsyncFeatureLock(FEATURE, place.gsd, backend=backend, heartbeat=None, on_wait=look)
        try:
            waiter = asyncio.create_task(lock.acquire())
            async with asyncio.timeout(HANG_GUARD_SECONDS):
                await looked.wait()
            assert set(seen) == {0}, "the waiter listened on a crowded server"
            # One claims' connection at each look, a new one each time: none kept between two.
            assert len(set(connections)) == len(connections) == LOOKS, connections
            let_go.set()
            async with asyncio.timeout(HANG_GUARD_SECONDS):
                assert (await waiter).held
            await lock.release()
        finally:
            backend.close()

    # The holder (the app role) made the tables.
    with held_elsewhere(place) as let_go, _role_with_slots(pg_server, role, CROWDED_ROLE_SLOTS):
        asyncio.run(main(let_go))


@contextmanager
def _role_with_slots(pg_server: Any, role: str, slots: int) -> Iterator[None]:
    """``role``, one of the app role's, with ``slots`` connections (``CONNECTION LIMIT``)."""
    from tests.support.postgres import APP_USER, admin_execute

    admin_execute(
        pg_server, f"CREATE ROLE {role} LOGIN CONNECTION LIMIT {slots} IN ROLE {APP_USER}"
    )
    try:
        yield
    finally:
        admin_execute(
            pg_server,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
            role,
        )
        admin_execute(pg_server, f"DROP ROLE {role}")


ROOMY_ROLE_SLOTS: Final = 4
"""A waiter's role's slots: its claims' connection and its listener leave two (not crowded);
two more sessions of the role take them (crowded, and still so once it lets go of both)."""


@pytest.mark.postgres
def test_an_async_waiter_stops_listening_once_the_server_turns_crowded(
    pg_server: Any, tmp_path: Path
) -> None:
    """A task waits as a role with four slots: not crowded, it listens. Two more sessions of the
    role then take the rest: at a later look (the server is asked at most every
    ``SLOTS_LOOK_SECONDS``, a look lasts a slice) its listener is closed, and it still gets the
    lock once the holder lets go. Fails with the listener left open on a crowded server (mutant
    ``async-waiters-keep-listening-once-the-server-turns-crowded``): the other tests start
    crowded, where no listener was ever made."""
    from tests.support.postgres import admin_execute

    place = Place(tmp_path, pg_server.url(), f"async-{uuid.uuid4().hex[:12]}")
    role = f"mh_roomy_{uuid.uuid4().hex[:8]}"
    listening = (
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE usename = %s AND application_name = 'mahabharatha-wait-async'"
    )
    after: list[int] = []  # listening sessions at each look once the server turned crowded
    crowd: list[Any] = []

    async def main(let_go: Any) -> None:
        import psycopg

        from mahabharatha.backends.postgres.backend import PostgresBackend

        backend = PostgresBackend(
            pg_server.url(role=role), namespace=place.namespace, gsd_dir=place.gsd
        )
        listened, looked = asyncio.Event(), asyncio.Event()

        def look(_info: object, _left: object) -> None:
            count = int(str(admin_execute(pg_server, listening, role)[0][0]))
            if crowd:
                after.append(count)
                if len(after) == LOOKS:
                    looked.set()
            elif count:
                listened.set()

        lock = AsyncFeatureLock(FEATURE, place.gsd, backend=backend, heartbeat=None, on_wait=look)
        try:
            waiter = asyncio.create_task(lock.acquire())
            async with asyncio.timeout(HANG_GUARD_SECONDS):
                await listened.wait()
                crowd.extend(psycopg.connect(pg_server.url(role=role)) for _ in range(2))
                await looked.wait()
            assert after[-1] == 0, f"listening at each look on a crowded server: {after}"
            let_go.set()
            async with asyncio.timeout(HANG_GUARD_SECONDS):
                assert (await waiter).held
            await lock.release()
        finally:
            for conn in crowd:
                conn.close()
            backend.close()

    # The holder (the app role) made the tables.
    with held_elsewhere(place) as let_go, _role_with_slots(pg_server, role, ROOMY_ROLE_SLOTS):
        asyncio.run(main(let_go))
