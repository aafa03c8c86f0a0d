"""The registered claim (``_CLAIM_REGISTERED``) at its edges: three defects it had, each proven
here by a test that failed on the code as merged (c89040d, 11c9cdc) and passes with the fix.

- Threads sharing one backend shared one ``RawCursor``: a claim's answer could be read by
  another thread's claim, or be wiped by it ("no result available"), and a feature taken in the
  database was handed to nobody (or to two threads).
- A list ascending by Python's order (code points) was taken as ascending by the server's
  ``COLLATE "C"`` (bytes in the database's encoding). In a database that is not UTF-8 the two
  differ, and the sorted and registered claims took the features out of the caller's order.
- The lean claims trusted that rows once seen still exist: after the namespace's rows were
  deleted, free features were answered "nothing takeable".
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from mahabharatha.backends.base import Requester
from mahabharatha.owner import ownership
from tests.support.postgres import ADMIN_USER, APP_USER, PgServer, TurnsSeen, admin_execute

SYNC_SECONDS = 30.0
"""A hang-guard for the events the two claimers wait on (never a timing of the test)."""


def me() -> Requester:
    return Requester(os.getpid(), ownership.details_of(os.getpid()))


def test_two_threads_claiming_on_one_backend_take_turns_and_read_their_own_answers(
    backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thread A's registered claim is held between its statement's answer and its read of that
    answer (``RawCursor.fetchall``) while thread B claims from the same backend: B's claim waits
    for A's to end, each is handed the feature it took, and the two features held in the
    database are exactly the two handed out. Failed before one operation at a time: the
    registered claims ran on one ``RawCursor`` kept per connection; B's claim reset and read
    that cursor, and A read nothing (its feature taken by no one for the lease's 2 hours) or
    B's row (two holders of one feature)."""
    import psycopg

    names = [f"shared{index}" for index in range(6)]
    assert backend.try_claim(names, me()).held.feature == "shared0"  # rows exist: registered now
    answered, go_on = threading.Event(), threading.Event()
    real_fetchall = psycopg.RawCursor.fetchall
    first: list[threading.Thread] = []

    def fetchall_held_for_a(cursor: Any) -> Any:
        if threading.current_thread() in first and not answered.is_set():
            answered.set()  # A's statement has run; its answer is not read yet
            go_on.wait(SYNC_SECONDS)
        return real_fetchall(cursor)

    turns = TurnsSeen()
    monkeypatch.setattr(backend, "_one_operation", turns)
    monkeypatch.setattr(psycopg.RawCursor, "fetchall", fetchall_held_for_a)
    got: list[Any] = []

    def claim() -> None:
        got.append(backend.try_claim(names, me()))
        turns.decided.set()

    a, b = threading.Thread(target=claim), threading.Thread(target=claim)
    first.append(a)
    a.start()
    try:
        assert answered.wait(SYNC_SECONDS)
        b.start()
        assert turns.decided.wait(SYNC_SECONDS)
    finally:
        go_on.set()
        a.join(SYNC_SECONDS)
        if b.ident is not None:
            b.join(SYNC_SECONDS)
    assert turns.waited, "a second thread's claim ran inside the first's operation"
    handed_out = sorted(answer.held.feature for answer in got)
    assert handed_out == ["shared1", "shared2"]
    held = sorted(row.feature for row in backend.status())
    assert held == ["shared0", *handed_out]


@pytest.fixture
def win1251_url(pg_server: PgServer) -> Iterator[str]:
    """A database of the test server in the WIN1251 encoding (its own, dropped at the end)."""
    import psycopg
    from psycopg import sql

    name = f"mh_win1251_{uuid.uuid4().hex[:8]}"
    maintenance = pg_server.url(role=ADMIN_USER, database="postgres")
    create = sql.SQL(
        "CREATE DATABASE {} OWNER {} ENCODING 'WIN1251' LC_COLLATE 'C' LC_CTYPE 'C'"
        " TEMPLATE template0"
    ).format(sql.Identifier(name), sql.Identifier(APP_USER))
    with psycopg.connect(maintenance, autocommit=True) as admin:
        admin.execute(create)
    try:
        yield pg_server.url(database=name)
    finally:
        drop = sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name))
        with psycopg.connect(maintenance, autocommit=True) as admin:
            admin.execute(drop)


def test_a_database_not_in_utf8_claims_in_the_callers_order(
    make_backend: Any, win1251_url: str
) -> None:
    """In a WIN1251 database, ``["Б", "€"]`` (U+0411 before U+20AC: ascending for Python) is
    stored as bytes C1 and 88, and ``COLLATE "C"`` orders "€" first. Every claim must still
    take the first takeable feature in the caller's order, also once the list is registered;
    an ASCII list (the same order in every server encoding) is still registered there.
    Fails before the fix: the list was taken as sorted, and the sorted and registered claims
    (``ORDER BY feature``) took "€" first, from the first claim on."""
    backend = make_backend(url=win1251_url)
    names = ["Б", "€"]
    assert names == sorted(names)
    first = backend.try_claim(names, me()).held
    second = backend.try_claim(names, me()).held
    assert [first.feature, second.feature] == names
    for _ in range(2):  # the second time round, a registered claim would run if any
        assert backend.release_held(first) and backend.release_held(second)
        first = backend.try_claim(names, me()).held
        second = backend.try_claim(names, me()).held
        assert [first.feature, second.feature] == names
    plain = ["plain-a", "plain-b", "plain-c"]
    assert [backend.try_claim(plain, me()).held.feature for _ in plain] == plain
    assert backend._ensured["\n".join(plain)] is True  # ASCII names keep the fast path


def test_rows_deleted_behind_a_registered_list_are_claimed_again(
    backend: Any, pg_server: PgServer, namespace: str
) -> None:
    """The namespace's rows are deleted after the list was registered (an operator's reset, the
    conformance suite's wipe; the role holds DELETE): its features are free, and the next claims
    take them in order, not "nothing takeable". Fails before the fix: the registered (and the
    sorted) claim trusted that the rows this backend once saw still exist and answered None
    for a list of free features, so a pool's loop ended with all of them undone."""
    names = ["gone-a", "gone-b", "gone-c"]
    assert [backend.try_claim(names, me()).held.feature for _ in range(2)] == names[:2]
    admin_execute(pg_server, "DELETE FROM mahabharatha_locks WHERE namespace = %s", namespace)
    taken = [backend.try_claim(names, me()) for _ in range(len(names) + 1)]
    assert [won and won.held.feature for won in taken] == [*names, None]
