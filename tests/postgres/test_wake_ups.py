"""Wake-ups after the commit, naming nothing, at most one look per interval (issue 27 item 7).

A full notification queue used to stop every release: the ``pg_notify`` was in the release's
own statement, and a notification that cannot be queued fails the commit. Filling the real
queue is no test for the suite: it is one per cluster and 8 GB on PostgreSQL 15
(``max_notify_queue_pages`` came in 17), about 50 s of writing and 8 GB of disk. What the
release must survive is *any* failure of its wake-up, so the tests make it fail for real, in
seconds: the link freezes once the client sends ``pg_notify`` (no answer, no reset), or the
server refuses the notification (a payload over its limit, in place of the full queue's
refusal). The release, done and failed attempt commit first, either way.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from mahabharatha import locks
from mahabharatha.backends.base import Requester
from mahabharatha.backends.postgres import backend as postgres
from mahabharatha.backends.postgres import statements
from mahabharatha.backends.postgres.release_watch import NOTIFY_CHANNEL
from mahabharatha.constants import WAKE_UP_INTERVAL_SECONDS
from tests.support.postgres import FreezingProxy, PgServer, admin_execute

LINK_TIMEOUT = 1.0
"""``--connect-timeout`` through the freezing link: how long a frozen wake-up is waited for."""
FLOOD_WINDOW_SECONDS = 1.5
"""How long a waiter waits for a held lock while wake-ups are forged as fast as can be."""


@pytest.fixture
def frozen_at_wake_up(pg_server: PgServer) -> Iterator[FreezingProxy]:
    """A link that freezes for good once the client sends ``pg_notify``."""
    proxy = FreezingProxy(pg_server.port, freeze_on=b"pg_notify")
    yield proxy
    proxy.close()


def _holder_row(server: PgServer, namespace: str, feature: str) -> tuple[object, ...]:
    """(pid, done, failures) of the row, read by the superuser on the server itself."""
    found = admin_execute(
        server,
        "SELECT pid, done_at IS NOT NULL, failures FROM mahabharatha_locks"
        " WHERE namespace = %s AND feature = %s",
        namespace,
        feature,
    )
    return found[0]


ENDINGS: dict[str, Callable[[Any, Any], object]] = {
    "release_held": lambda backend, held: backend.release_held(held),
    "release": lambda backend, held: backend.release(held.feature, held.pid),
    "done": lambda backend, held: backend.done(held.feature, held.pid),
    "fail": lambda backend, held: backend.fail(held.feature, held.pid, "broke", 3),
}
EXPECTED: dict[str, tuple[object, ...]] = {
    "release_held": (None, False, 0),
    "release": (None, False, 0),
    "done": (None, True, 0),
    "fail": (None, False, 1),
}


@pytest.mark.parametrize("ending", sorted(set(ENDINGS) - {"release_held"}))
def test_an_ending_whose_wake_up_freezes_the_link_is_committed(
    pg_server: PgServer, frozen_at_wake_up: FreezingProxy, namespace: str, ending: str
) -> None:
    """The link freezes as the wake-up is sent: the release (done, failed attempt) stands and
    answers as such. Failed before: the ``pg_notify`` was in the release's own statement, which
    froze with it: a BackendError after the timeout, the lock still held."""
    backend = postgres.PostgresBackend(
        frozen_at_wake_up.url(), namespace=namespace, connect_timeout=LINK_TIMEOUT
    )
    try:
        me = Requester(os.getpid())
        held = backend.try_acquire("f", me).held
        assert held is not None
        ENDINGS[ending](backend, held)
        assert frozen_at_wake_up.frozen.is_set()  # the wake-up was sent, and froze
        assert _holder_row(pg_server, namespace, "f") == EXPECTED[ending]
        assert backend.try_acquire("f", me).held is not None  # free again
    finally:
        backend.close()


def test_a_release_whose_wake_up_the_server_refuses_is_committed(
    make_backend: Callable[..., Any], pg_server: PgServer, namespace: str, monkeypatch: Any
) -> None:
    """The server refuses the notification (as it refuses one when its queue is full): the
    release stands, and the connection, which answered, is kept."""
    monkeypatch.setattr(statements, "WAKE", "SELECT pg_notify(%(channel)s, repeat('x', 9000))")
    backend = make_backend()
    held = backend.try_acquire("f", Requester(1)).held
    kept = backend._conn
    assert backend.release_held(held)
    assert _holder_row(pg_server, namespace, "f")[0] is None
    assert backend._conn is kept


def test_a_release_and_its_wake_up_are_one_round_trip(pg_server: PgServer, namespace: str) -> None:
    """The hot path's release and its wake-up are sent with no wait between (one pipeline)
    and answered together: one round trip (a link frozen there freezes the release itself,
    hence no ``release_held`` above). Failed before: two answers, the wake-up sent only once
    the release had answered."""
    proxy = FreezingProxy(pg_server.port, freeze_on=b"\x00never sent\x00")
    backend = postgres.PostgresBackend(proxy.url(), namespace=namespace)
    try:
        held = backend.try_acquire("f", Requester(1)).held
        assert held is not None
        with psycopg.connect(pg_server.admin_url(), autocommit=True) as listener:
            listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
            before = proxy.answers
            assert backend.release_held(held)
            answers = proxy.answers - before
            assert list(listener.notifies(timeout=10.0, stop_after=1))  # woken all the same
        assert answers == 1
        assert _holder_row(pg_server, namespace, "f")[0] is None
    finally:
        backend.close()
        proxy.close()


def test_a_wake_up_names_no_feature_and_no_namespace(
    make_backend: Callable[..., Any], pg_server: PgServer
) -> None:
    """Any role that may connect may LISTEN: the wake-up's payload tells it nothing. Failed
    before: it carried ``["<namespace>", "<feature>"]`` of every release."""
    backend = make_backend(namespace="team-secret-space")
    with psycopg.connect(pg_server.admin_url(), autocommit=True) as listener:
        listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
        held = backend.try_acquire("secret-feature", Requester(1)).held
        assert backend.release_held(held)
        heard = [note.payload for note in listener.notifies(timeout=10.0, stop_after=1)]
    assert heard  # the release woke the channel
    assert all("secret" not in payload for payload in heard), heard


def test_a_wake_up_is_sent_on_its_schemas_own_channel(
    make_backend: Callable[..., Any], pg_server: PgServer
) -> None:
    """Each schema wakes its own waiters only (the contract: a channel of the schema). Failed
    before: every schema's releases were sent on the one ``mahabharatha_release``."""
    other = make_backend(schema="other_team")
    assert other.channel == "other_team_release"  # not NOTIFY_CHANNEL, the default's
    with psycopg.connect(pg_server.admin_url(), autocommit=True) as listener:
        listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
        listener.execute(f"LISTEN {other.channel}")
        held = other.try_acquire("f", Requester(1)).held
        assert other.release_held(held)
        heard = [note.channel for note in listener.notifies(timeout=10.0, stop_after=1)]
    assert heard == [other.channel]


def _flood(url: str, started: threading.Event, stop: threading.Event, payload: str) -> None:
    """Forge wake-ups as fast as one connection can until ``stop``."""
    with psycopg.connect(url, autocommit=True) as forger:
        while not stop.is_set():
            forger.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, payload))
            started.set()


def test_a_flood_of_forged_wake_ups_costs_a_waiter_one_look_per_interval(
    make_backend: Callable[..., Any], pg_server: PgServer, namespace: str
) -> None:
    """A waiter for a held lock while another client NOTIFYs the channel without pause, with
    the payload the old wake-ups had for exactly this feature: the waiter looks at most once
    per interval (plus its first two tries: the first wait only starts listening). Failed
    before: every forged wake-up was a look (hundreds in the window)."""
    holder, waiter = make_backend(), make_backend()
    assert holder.try_acquire("f", Requester(1)).held is not None
    looks = 0
    real_try = waiter.try_acquire

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal looks
        looks += 1
        return real_try(*args, **kwargs)

    waiter.try_acquire = counted
    started, stop = threading.Event(), threading.Event()
    payload = f'["{namespace}", "f"]'
    forger = threading.Thread(target=_flood, args=(pg_server.url(), started, stop, payload))
    forger.start()
    try:
        assert started.wait(30.0)
        began = time.monotonic()
        with pytest.raises(locks.LockTimeoutError):
            locks.acquire("f", timeout=FLOOD_WINDOW_SECONDS, backend=waiter, pid=2)
        elapsed = time.monotonic() - began
    finally:
        stop.set()
        forger.join()
    assert looks <= elapsed / WAKE_UP_INTERVAL_SECONDS + 3, (looks, elapsed)
