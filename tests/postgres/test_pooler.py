"""Behind a transaction-mode pooler (issue 17 item 2): PgBouncer 1.18 (Debian's), which keeps no
prepared statements per client. Nothing may run another client's statement: the backend sees
the pooler (the server process answering is not the one the connection's start named) and uses
no named prepared statement there."""

from __future__ import annotations

import datetime
import os
from typing import Any, cast

import pytest

from mahabharatha.backends.base import BackendError, Requester
from mahabharatha.backends.postgres.backend import PostgresBackend
from tests.conformance._procs import CTX, SYNC_TIMEOUT, run_team
from tests.support.postgres import HostileServer, PgServer, admin_execute

WORKERS = 4
FEATURES = 60


def _work_through(url: str, namespace: str) -> tuple[str, list[str], str | None]:
    """Claim, then mark done, every feature of this worker's own list (names shared by every
    worker's list, in its own namespace); report what it was given."""
    names = [f"f{number:03d}" for number in range(FEATURES)]
    backend: Any = PostgresBackend(url, namespace=namespace, gsd_dir="/nonexistent")
    got: list[str] = []
    error = None
    try:
        while (won := backend.try_claim(names, Requester(os.getpid()))) is not None:
            got.append(won.held.feature)
            backend.done(won.held.feature, os.getpid())
    except BackendError as failed:
        error = str(failed)
    finally:
        backend.close()
    return namespace, got, error


def test_a_claim_storm_behind_a_transaction_pooler_gives_each_feature_once(
    pooler: str, pg_server: PgServer, namespace: str
) -> None:
    """Workers of different namespaces claim the same names through PgBouncer at once (a
    barrier). Failed before: psycopg's ``_pg3_N`` statements (and the registered claim) ran on
    server connections another client had prepared them on: errors, or a worker told it held a
    feature of another namespace."""
    _storm(pooler, pg_server, namespace)


def test_a_claim_storm_on_the_hostile_server_gives_each_feature_once(
    hostile_pg: HostileServer, namespace: str
) -> None:
    """The storm on the hostile server (every setting flipped by database and role defaults,
    a neighbour running ``SET`` through the same pool). Failed before (211f242): its
    ``search_path`` led first use to another role's look-alike tables (refused as newer)."""
    _storm(hostile_pg.url(), hostile_pg.server, namespace)


def _storm(pooler: str, pg_server: PgServer, namespace: str) -> None:
    start = CTX.Barrier(WORKERS)
    spaces = [f"{namespace}-{number}" for number in range(WORKERS)]

    def at_once(index: int) -> tuple[str, list[str], str | None]:
        start.wait(SYNC_TIMEOUT)
        return _work_through(pooler, spaces[index])

    results = run_team(WORKERS, at_once)
    expected = [f"f{number:03d}" for number in range(FEATURES)]
    for space, got, error in results:
        assert error is None, error
        assert got == expected, space  # each once, in order, none of another list
    for space in spaces:
        done = admin_execute(
            pg_server,
            "SELECT count(*) FROM mahabharatha_locks WHERE namespace = %s AND done_at IS NOT NULL",
            space,
        )
        assert done == [(FEATURES,)]


def test_the_backend_sees_the_pooler_and_prepares_nothing(pooler: str, pg_server: PgServer) -> None:
    from mahabharatha.backends.postgres.backend import PostgresBackend

    behind: Any = PostgresBackend(pooler, namespace="pooled")
    direct: Any = PostgresBackend(pg_server.url(), namespace="pooled")
    try:
        for _ in range(8):  # past psycopg's threshold for preparing a statement by itself
            behind.release_held(behind.try_acquire("feat", Requester(1)).held)
            behind.inspect("feat")
        assert behind._connection().pooled and not direct._connection().pooled
        prepared = behind._connection().execute("SELECT count(*) FROM pg_prepared_statements")
        assert prepared.fetchone() == (0,)
    finally:
        behind.close()
        direct.close()


def test_a_waiter_behind_the_pooler_never_listens_and_still_acquires(pooler: str) -> None:
    """A transaction-mode pooler keeps no LISTEN: it would stay on a server connection and hand
    releases to whichever client gets it next. The waiter polls instead (and still gets the
    lock once it is released)."""
    from mahabharatha import locks

    holder: Any = PostgresBackend(pooler, namespace="pooled-wait")
    waiter: Any = PostgresBackend(pooler, namespace="pooled-wait")
    try:
        held = holder.try_acquire("feat", Requester(1)).held
        assert waiter.wait_for_release("feat", 0.0)  # the first call would start listening
        assert not waiter.wait_for_release("feat", 0.01)  # and now it polls
        holder.release_held(held)
        assert locks.acquire("feat", backend=waiter, timeout=30, pid=os.getpid())
        assert waiter._listener is None  # failed before: a LISTEN left on a pooled connection
    finally:
        holder.close()
        waiter.close()


def test_an_async_waiter_behind_the_pooler_never_listens_and_still_acquires(pooler: str) -> None:
    """As the blocking waiter: the loop's listener sees the pooler (the server process that
    answers is not the one its connection started) and keeps no LISTEN there, and the waiting
    task polls until the release. The direct case is test_async_lock's shared listener."""
    import asyncio

    from mahabharatha.aio import AsyncFeatureLock
    from mahabharatha.backends.postgres.aio import listener_for

    holder: Any = PostgresBackend(pooler, namespace="pooled-async-wait")
    waiter: Any = PostgresBackend(pooler, namespace="pooled-async-wait")

    async def main(held: Any) -> bool:
        waiting = asyncio.Event()
        lock = AsyncFeatureLock(
            "feat",
            "/nonexistent",
            backend=waiter,
            pid=os.getpid(),
            timeout=SYNC_TIMEOUT,
            heartbeat=None,
            on_wait=lambda *_: waiting.set(),
        )
        entered = asyncio.create_task(lock.__aenter__())
        async with asyncio.timeout(SYNC_TIMEOUT):
            await waiting.wait()  # its first try found the lock held: it waits now
        holder.release_held(held)
        async with asyncio.timeout(SYNC_TIMEOUT):
            await entered
        behind = bool(listener_for(waiter)._behind_pooler)
        await lock.__aexit__(None, None, None)
        return behind

    try:
        held = holder.try_acquire("feat", Requester(1)).held
        assert asyncio.run(main(held))  # it polled: nothing LISTENs on the pooler
    finally:
        holder.close()
        waiter.close()


SHARED_WORKERS = 8
SHARED_FEATURES = 160


def _server_now(pg_server: PgServer) -> datetime.datetime:
    return cast(datetime.datetime, admin_execute(pg_server, "SELECT clock_timestamp()")[0][0])


def _claimed_after(pg_server: PgServer, namespace: str, moment: datetime.datetime) -> int:
    """Rows of ``namespace`` whose claim began after ``moment`` (``acquired_at`` is its
    transaction's start). Race: a claim in flight when a worker heard "nothing left" had locked
    its row before, so it began before; a row left free and unlocked is claimed after."""
    rows = admin_execute(
        pg_server,
        "SELECT count(*) FROM mahabharatha.mahabharatha_locks"
        " WHERE namespace = %s AND acquired_at > %s",
        namespace,
        moment,
    )
    return int(str(rows[0][0]))


def _claim_all_in_one_namespace(
    url: str, pg_server: PgServer, namespace: str, reclaim_dead: bool
) -> tuple[list[str], datetime.datetime]:
    """Claim and mark done until the claim answers nothing; report the features won and the
    server's time just after the claim said nothing was left."""
    names = [f"g{number:03d}" for number in range(SHARED_FEATURES)]
    backend: Any = PostgresBackend(url, namespace=namespace, gsd_dir="/nonexistent")
    got: list[str] = []
    try:
        while (
            won := backend.try_claim(names, Requester(os.getpid()), reclaim_dead=reclaim_dead)
        ) is not None:
            got.append(won.held.feature)
            backend.done(won.held.feature, os.getpid())
        return got, _server_now(pg_server)
    finally:
        backend.close()


@pytest.mark.parametrize("route", ["pooler", "reclaim-dead"])
def test_workers_of_one_namespace_never_claim_a_feature_twice(
    route: str, pooler: str, pg_server: PgServer, namespace: str
) -> None:
    """Issue 31 items 1 and 4: eight workers of ONE namespace race through PgBouncer (a
    barrier) over 160 features, on the sorted claim statement a pooled connection uses.
    Every feature is claimed exactly once (fails without the row lock of the claim, ``FOR
    UPDATE``: two workers take one feature), and no worker is told "nothing left" while a
    free row remains: no claim begins after a worker heard it (a worker ended early would leave
    rows that later claims take; without ``SKIP LOCKED`` PostgreSQL re-checks the waited-for
    row and takes the next, so that mutant is equivalent: tools/mutants.toml). Counting free
    rows instead failed under load: a claim that had locked its row but not yet committed
    showed that row free. ``reclaim-dead``:
    the same race on direct connections, whose ``--reclaim-dead`` claims use that statement."""
    url = pooler if route == "pooler" else pg_server.url()
    start = CTX.Barrier(SHARED_WORKERS)

    def at_once(_index: int) -> tuple[list[str], datetime.datetime]:
        start.wait(SYNC_TIMEOUT)
        return _claim_all_in_one_namespace(url, pg_server, namespace, route == "reclaim-dead")

    results = run_team(SHARED_WORKERS, at_once)
    claimed = sorted(feature for got, _ in results for feature in got)
    assert claimed == [f"g{number:03d}" for number in range(SHARED_FEATURES)], "claimed twice"
    left_free = [_claimed_after(pg_server, namespace, ended) for _, ended in results]
    assert left_free == [0] * SHARED_WORKERS, "a worker was told nothing was left too early"
