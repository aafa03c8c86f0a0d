"""The registered claim: a backend that claims again from a list it has claimed from before runs
a statement prepared on its connection with that list written in (``_CLAIM_REGISTERED``), so
the server plans the names once per connection, not once per claim. The promises of a claim must
hold on it exactly as on the statement that sends the list: the first takeable feature in the
caller's order, done features skipped unless asked, one holder, tokens that only grow; also when
the list changes between claims, when the connection is replaced, and across a server restart.

Fails before this change: there was no registered claim (``test_a_pool_claims_by_reference``
finds no prepared claim); the other tests guard the new path and were each seen failing against
a deliberately broken registration (named in each docstring)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from mahabharatha.backends.base import Requester
from mahabharatha.owner import ownership
from tests.conformance._procs import CTX, SYNC_TIMEOUT, run_team, stress
from tests.support.postgres import PgServer, admin_execute, expire


def me() -> Requester:
    return Requester(os.getpid(), ownership.details_of(os.getpid()))


def _claimed(backend: Any, features: Sequence[str], **options: Any) -> str | None:
    won = backend.try_claim(list(features), me(), **options)
    return None if won is None else str(won.held.feature)


def _prepared_claims(backend: Any) -> list[tuple[Any, ...]]:
    """The registered claims prepared on the backend's own connection, with their plan counts."""
    cursor = backend._connection().execute(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
        " WHERE statement LIKE '%FOR UPDATE SKIP LOCKED)%'"
    )
    found: list[tuple[Any, ...]] = cursor.fetchall()
    return found


def test_a_pool_claims_by_reference(backend: Any) -> None:
    """Once the list's rows exist (the first claim creates them), every claim runs one prepared
    statement whose plan the server keeps (generic plans), and still takes the features in
    order. Fails before the change: no claim was ever prepared."""
    names = [f"f{index:03d}" for index in range(30)]
    taken = [_claimed(backend, names) for _ in range(12)]
    assert taken == names[:12]
    prepared = _prepared_claims(backend)
    assert len(prepared) == 1
    generic, custom = prepared[0]
    assert generic + custom == 12 and generic > 0  # every claim once the rows existed


def test_a_list_that_changes_between_claims_is_claimed_by_its_own_order(backend: Any) -> None:
    """Lists A, B (a subset), A again and A with done features included: each claim takes the
    first takeable feature of the list it was given. Seen failing when the registration was
    keyed by the list's first name only (B's claims took A's next feature)."""
    a = [f"a{index:02d}" for index in range(10)]
    b = a[0:1] + a[5:]  # shares A's first name
    assert _claimed(backend, a) == "a00"
    assert _claimed(backend, a) == "a01"
    assert _claimed(backend, b) == "a05"
    assert _claimed(backend, b) == "a06"
    assert _claimed(backend, a) == "a02"
    backend.done("a00", os.getpid())
    backend.done("a01", os.getpid())
    assert _claimed(backend, a) == "a03"
    assert _claimed(backend, a, include_done=True) == "a00"  # done, free: taken when included
    assert _claimed(backend, a, include_done=True) == "a01"
    assert _claimed(backend, a) == "a04"
    assert _claimed(backend, b) == "a07"


def test_a_list_changed_in_place_is_read_again(backend: Any) -> None:
    """A caller that edits its one list object between claims is claimed from by the list's
    new content. Seen failing when the joined names were kept by the list's identity."""
    names = [f"c{index}" for index in range(6)]
    assert backend.try_claim(names, me()).held.feature == "c0"
    del names[:3]
    assert backend.try_claim(names, me()).held.feature == "c3"
    names.insert(0, "c1")
    assert backend.try_claim(names, me()).held.feature == "c1"


def test_a_registered_claim_takes_expired_and_released_features_in_order(
    backend: Any, pg_server: PgServer, namespace: str
) -> None:
    """Free again by expiry or by release, an earlier feature comes first again; a held one is
    never handed out twice. Seen failing when the registered statement dropped its
    ``expires_at < now()`` branch (the expired feature was skipped)."""
    names = ["x1", "x2", "x3", "x4", "x5"]
    first = backend.try_claim(names, me()).held
    second = backend.try_claim(names, me()).held
    assert (first.feature, second.feature) == ("x1", "x2")
    expire(pg_server, namespace, "x1")
    again = backend.try_claim(names, me()).held
    assert again.feature == "x1" and again.token > first.token
    assert backend.release_held(second)
    assert _claimed(backend, names) == "x2"
    assert [_claimed(backend, names) for _ in range(4)] == ["x3", "x4", "x5", None]


def test_odd_names_survive_the_registered_statement(
    make_backend: Callable[..., Any], namespace: str
) -> None:
    """The list and the namespace are written into the registered statement by psycopg's
    quoting: quotes, backslashes, braces, commas, ``%(pid)s`` and ``$1`` stay names. Seen failing
    when they were written in between plain quotes (the statement broke at the first quote)."""
    odd = ["it's", 'say "hi"', "back\\slash", "{brace}", "a,b", "100%(pid)s", "$1", "wé"]
    backend = make_backend(namespace=f"{namespace} 'quoted' \\ $1 %s")
    names = sorted(f"registered {name}" for name in odd)  # names no other test stores
    taken = [_claimed(backend, names) for _ in range(len(names) + 1)]
    assert taken == [*names, None]
    assert len(_prepared_claims(backend)) == 1  # the registered path ran them


def test_a_replaced_connection_claims_by_its_own_registration(
    backend: Any, pg_server: PgServer
) -> None:
    """The backend's connection is killed between claims: the next claim reconnects, retries
    with the statement that sends the list, and the one after registers the list on the new
    connection; the order and single handing-out hold throughout. Guards the reconnect path
    (a prepared statement dies with its connection)."""
    names = [f"r{index}" for index in range(8)]
    assert [_claimed(backend, names) for _ in range(3)] == names[:3]
    old = backend._connection().info.backend_pid
    admin_execute(pg_server, "SELECT pg_terminate_backend(%s)", old)
    assert _claimed(backend, names) == "r3"
    assert backend._connection().info.backend_pid != old
    assert [_claimed(backend, names) for _ in range(5)] == [*names[4:], None]
    assert len(_prepared_claims(backend)) == 1  # registered again on the new connection


def test_tokens_keep_growing_across_a_restart_of_the_server(
    backend: Any, pg_server: PgServer, namespace: str
) -> None:
    """Registered claims before and after a restart (``immediate``: a crash): every later token
    is larger, also for a feature taken again after expiry. Guards the fencing promise on the new
    path (the token is drawn by the same ``nextval`` inside the locked row's update)."""
    names = [f"t{index}" for index in range(6)]
    before = [backend.try_claim(names, me()).held for _ in range(3)]
    pg_server.stop("immediate")
    pg_server.start()
    expire(pg_server, namespace, "t0")
    after = [backend.try_claim(names, me()).held for _ in range(2)]
    assert [held.feature for held in after] == ["t0", "t3"]
    assert min(held.token for held in after) > max(held.token for held in before)


def _claim_until_empty(url: str, namespace: str, lists: list[list[str]], start: Any) -> Any:
    """A worker: claims from its list until nothing is left, marking each feature done; answers
    the features it took and their tokens."""

    def work(index: int) -> tuple[list[str], list[int]]:
        from mahabharatha.backends.postgres.backend import PostgresBackend

        backend = PostgresBackend(url, namespace=namespace)
        mine = lists[index % len(lists)]
        requester = me()
        backend.inspect(mine[0])  # connected before the start
        start.wait(SYNC_TIMEOUT)
        taken: list[str] = []
        tokens: list[int] = []
        while (won := backend.try_claim(mine, requester)) is not None:
            held = won.held
            assert held is not None
            taken.append(held.feature)
            tokens.append(int(held.token or 0))
            backend.done(held.feature, os.getpid())
        backend.close()
        return taken, tokens

    return work


def test_workers_with_different_lists_take_every_feature_once(
    pg_server: PgServer, namespace: str
) -> None:
    """Real processes racing with three lists over one namespace: all features sorted, every
    third feature sorted, and all features in reverse (sent each time: not sorted). Every
    feature is taken exactly once (never two holders: a feature is marked done by its one
    holder before anyone could take it again) and all tokens differ. Seen failing when the
    registered statement dropped its done filter (features taken twice)."""
    count = stress(60)
    features = [f"w{index:04d}" for index in range(count)]
    lists = [features, features[::3], features[::-1]]
    workers = 6
    start = CTX.Barrier(workers)
    answers = run_team(workers, _claim_until_empty(pg_server.url(), namespace, lists, start))
    taken = Counter(feature for feature_list, _ in answers for feature in feature_list)
    assert sorted(taken) == features
    assert max(taken.values()) == 1
    tokens = [token for _, token_list in answers for token in token_list]
    assert len(set(tokens)) == len(tokens) == count
    rows = admin_execute(
        pg_server,
        "SELECT count(*) FROM mahabharatha_locks WHERE namespace = %s AND done_at IS NOT NULL"
        " AND pid IS NULL",
        namespace,
    )
    assert rows == [(count,)]
