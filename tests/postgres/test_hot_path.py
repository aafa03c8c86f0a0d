"""The uncontended cycle's two statements (acquire, release of a held lock): ``$n`` parameters on
a cursor kept per connection, prepared on their first use, answered in binary, times read with
``date_part`` (benchmark 7). What must hold on that path exactly as before: the statements
follow a replaced connection, the times are the row's own to the microsecond, tokens of a
feature only grow while real processes take turns, and a release still wakes a waiter.

Fails before this change: psycopg prepared a statement only at its sixth run
(``test_acquire_and_release_are_prepared_on_their_first_use``); the other tests guard the new
path and were each seen failing against a deliberately broken version (named in each
docstring)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, cast

import pytest

from mahabharatha import locks
from mahabharatha.backends.base import BackendError, Requester
from mahabharatha.backends.postgres.session import MAX_LOST_ANSWERS
from mahabharatha.owner import ownership
from tests.conformance._procs import CTX, SYNC_TIMEOUT, run_team, stress
from tests.support.postgres import PgServer, TurnsSeen, admin_execute

_ACQUIRE_LIKE = "%INSERT INTO mahabharatha.mahabharatha_locks AS l%ON CONFLICT%"
_RELEASE_LIKE = "%token = $3 AND pid IS NOT NULL%RETURNING 1%"


def me() -> Requester:
    return Requester(os.getpid(), ownership.details_of(os.getpid()))


def _prepared(backend: Any, like: str) -> int:
    """How many statements like ``like`` are prepared on the backend's own connection."""
    found = backend._connection().execute(
        "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", (like,)
    )
    return int(found.fetchone()[0])


def test_acquire_and_release_are_prepared_on_their_first_use(backend: Any) -> None:
    """One acquire and one release: both are prepared statements of the connection already.
    Fails before the change: psycopg prepared a statement only once it had run five times."""
    held = backend.try_acquire("hot", me()).held
    assert held is not None
    assert backend.release_held(held)
    assert _prepared(backend, _ACQUIRE_LIKE) == 1
    assert _prepared(backend, _RELEASE_LIKE) == 1


def test_a_replaced_connection_runs_them_on_a_cursor_of_its_own(
    backend: Any, pg_server: PgServer
) -> None:
    """The backend's connection is killed between cycles: the next acquire reconnects by itself,
    and acquire and release run (prepared again) on the new connection. Seen failing when the
    kept cursor was not renewed with its connection (every later call: "the connection is
    closed")."""
    first = backend.try_acquire("hot", me()).held
    assert backend.release_held(first)
    old = backend._connection().info.backend_pid
    admin_execute(pg_server, "SELECT pg_terminate_backend(%s)", old)
    second = backend.try_acquire("hot", me()).held
    assert second is not None and second.token > first.token
    assert backend._connection().info.backend_pid != old
    assert backend.release_held(second)
    assert not backend.release_held(second)  # exactly once
    assert _prepared(backend, _ACQUIRE_LIKE) == 1
    assert _prepared(backend, _RELEASE_LIKE) == 1


def test_times_are_the_rows_own_to_the_microsecond(
    backend: Any, pg_server: PgServer, namespace: str
) -> None:
    """The times read back (``date_part``, a float8 at once) equal ``extract(epoch ...)`` of the
    stored row exactly, the reading used before. Seen failing with the times read as
    ``float4`` (``date_part(...)::float4``: off by minutes)."""
    held = backend.try_acquire("hot", me(), lease=123.0).held
    info = backend.inspect("hot")
    row = admin_execute(
        pg_server,
        "SELECT extract(epoch FROM refreshed_at)::float8, extract(epoch FROM expires_at)::float8"
        " FROM mahabharatha_locks WHERE namespace = %s AND feature = 'hot'",
        namespace,
    )[0]
    refreshed, expires = cast(float, row[0]), cast(float, row[1])
    assert info.timestamp == refreshed
    assert abs((expires - refreshed) - 123.0) < 1e-6  # the lease, by the server's clock
    assert abs((held.expires_at - held.timestamp) - 123.0) < 1e-6
    assert backend.release_held(held)


def test_tokens_only_grow_while_processes_take_turns(
    make_backend: Callable[..., Any], namespace: str
) -> None:
    """Processes started at once take and give back one feature in a loop; each holder checks,
    while it holds the lock, that its token is larger than every earlier holder's (a shared
    last-token value) and that it is alone. Seen failing with the token drawn in the statement's
    ``VALUES`` only (a retaken row kept its first token: every later holder's equal)."""
    workers, rounds = 3, stress(30)
    last = CTX.Value("q", 0)
    occupancy = CTX.Value("i", 0)
    problems = CTX.Value("i", 0)
    start = CTX.Barrier(workers)
    url = make_backend()._url

    def take_turns(_index: int) -> int:
        from mahabharatha.backends.postgres.backend import PostgresBackend

        own = PostgresBackend(url, namespace=namespace)
        try:
            start.wait(SYNC_TIMEOUT)
            for _ in range(rounds):
                held = locks.acquire("turns", timeout=SYNC_TIMEOUT, backend=own)
                with last.get_lock():
                    occupancy.value += 1
                    if occupancy.value != 1 or held.token <= last.value:
                        problems.value += 1
                    last.value = max(last.value, held.token)
                os.sched_yield()  # let a rival try while we hold it
                with last.get_lock():
                    occupancy.value -= 1
                assert own.release_held(held)
            return rounds
        finally:
            own.close()

    assert sum(run_team(workers, take_turns)) == workers * rounds
    assert problems.value == 0, f"{problems.value} holders overlapped or saw no larger token"


def test_a_release_on_the_kept_cursor_still_wakes_a_waiter(
    make_backend: Callable[..., Any],
) -> None:
    """A waiter on its own connection is woken by a release that runs prepared on the kept
    cursor (its ``pg_notify`` is part of the statement). Seen failing with the release's
    ``RETURNING pg_notify(...)`` replaced by ``RETURNING 1``."""
    holder, waiter = make_backend(), make_backend()
    for _ in range(6):  # past psycopg's own preparing threshold too
        held = holder.try_acquire("wake", me()).held
        assert held is not None and holder.release_held(held)
    held = holder.try_acquire("wake", me()).held
    assert waiter.wait_for_release("wake", 1.0)  # first call: starts listening
    assert not waiter.wait_for_release("wake", 0.05)  # nothing released yet
    assert holder.release_held(held)
    assert waiter.wait_for_release("wake", SYNC_TIMEOUT)


def test_two_threads_acquiring_on_one_backend_take_turns_and_read_their_own_answers(
    backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thread A's acquire is held between its statement's answer and its read of that answer
    (``RawCursor.fetchall``) while thread B acquires another feature on the same backend: B's
    operation waits for A's to end, and each is handed its own feature, both held in the
    database. Failed before one operation at a time: both ran on the one cursor kept per
    connection; B's acquire replaced the answer A had not read, and A read nothing or B's row.
    With the turns removed (mutant ``shared-connection-transactions-interleave``) B never waits."""
    import psycopg

    answered, go_on = threading.Event(), threading.Event()
    real_fetchall = psycopg.RawCursor.fetchall
    first: list[threading.Thread] = []

    def fetchall_held_for_a(cursor: Any) -> Any:
        if threading.current_thread() in first and not answered.is_set():
            answered.set()  # A's statement has run; its answer is not read yet
            go_on.wait(SYNC_TIMEOUT)
        return real_fetchall(cursor)

    backend.release_held(backend.try_acquire("warm", me()).held)  # the kept cursor exists
    turns = TurnsSeen()
    monkeypatch.setattr(backend, "_one_operation", turns)
    monkeypatch.setattr(psycopg.RawCursor, "fetchall", fetchall_held_for_a)
    got: dict[str, Any] = {}

    def acquire(feature: str) -> None:
        got[feature] = backend.try_acquire(feature, me())
        turns.decided.set()

    a = threading.Thread(target=acquire, args=("alpha",))
    b = threading.Thread(target=acquire, args=("beta",))
    first.append(a)
    a.start()
    try:
        assert answered.wait(SYNC_TIMEOUT)
        b.start()
        assert turns.decided.wait(SYNC_TIMEOUT)
    finally:
        go_on.set()
        a.join(SYNC_TIMEOUT)
        if b.ident is not None:
            b.join(SYNC_TIMEOUT)
    assert turns.waited, "a second thread's statement ran inside the first's operation"
    assert got["beta"].held is not None and got["beta"].held.feature == "beta"
    assert got["alpha"].held is not None and got["alpha"].held.feature == "alpha"
    assert sorted(row.feature for row in backend.status()) == ["alpha", "beta"]


class _LetGoBeforeEachTurn:
    """Stands in for a backend's ``_one_operation`` lock: before each of the first ``times``
    turns, another thread's turn came first and let go of the shared connection (as an
    ``AsyncFeatureLock`` waiter does at each look on a crowded server)."""

    def __init__(self, backend: Any, times: int) -> None:
        self.backend, self.left = backend, times

    def __enter__(self) -> None:
        if self.left and self.backend._conn is not None:
            self.left -= 1
            self.backend._conn.close()

    def __exit__(self, *_exc: object) -> None:
        return None


def test_a_call_whose_connection_was_let_go_of_before_its_turn_runs_on_a_fresh_one(
    backend: Any,
) -> None:
    """A call took the shared connection, and before its turn came another thread let it go,
    three times in a row. Nothing was sent on it: the call connects again each time and runs
    its statement (here a ``fail``), once. Failed on 7c66ee9: the call sent on the closed
    connection, a lost answer; three in a row failed it (eight asyncio waiters of one backend
    on a crowded server raised ``BackendError: the connection is closed`` from ``acquire``)."""
    held = backend.try_acquire("failing", me()).held
    assert held is not None
    backend._one_operation = _LetGoBeforeEachTurn(backend, MAX_LOST_ANSWERS + 1)
    try:
        attempts: object = backend.fail("failing", held.pid, "the command failed", 3).tries
    except BackendError as error:  # the finding, told by the assertion below
        attempts = error
    assert backend._one_operation.left == 0  # each of the turns found its connection gone
    recorded = backend.attempts("failing")
    assert (attempts, recorded and recorded.tries) == (1, 1)
