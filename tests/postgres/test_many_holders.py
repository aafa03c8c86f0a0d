"""Many workers, few connections (issue 17 item 15, scaled down for a test): more ``lock run``
holders at once than the server has connection slots. None exits 3, none loses its lock.
The full measure (200 holders, ``max_connections = 40``) is ``bench/pg_many_holders.py``."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import psycopg
import pytest

from mahabharatha import locks
from mahabharatha.backends.base import Requester, ServerFullError
from mahabharatha.backends.postgres import session as pg_session
from mahabharatha.backends.postgres import statements
from mahabharatha.backends.postgres.backend import PostgresBackend
from tests.support.marks import needs_proc
from tests.support.postgres import PgServer, admin_execute, private_server, wait_until

REPO = Path(__file__).resolve().parents[2]
MAX_CONNECTIONS = 20
"""17 for the app role: 3 stay reserved for superusers (the test's own inspection)."""
HOLDERS = 20
"""Three more than the slots: holders that kept a connection each could not all connect (the
bug needs one more than the slots; the full measure's 200 is ``bench/pg_many_holders.py``)."""
LEASE_SECONDS = 3
"""``lock run`` refreshes every third of it: each holder connects again every second."""
HANG_GUARD_SECONDS = 120.0


@pytest.fixture(scope="module")
def crowded_server() -> Iterator[PgServer]:
    with private_server({"max_connections": str(MAX_CONNECTIONS)}) as server:
        yield server


def _rows(server: PgServer, query: str) -> int:
    found = admin_execute(server, query)
    count = found[0][0]
    assert isinstance(count, int)
    return count


def _tables_made(url: str) -> dict[str, str]:
    """``lock init`` on the crowded server (before the crowd: it needs a slot of its own); the
    environment the holders run in."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    made = subprocess.run(
        [sys.executable, "-m", "mahabharatha", "lock", "init", "--backend", url],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=HANG_GUARD_SECONDS,
    )
    assert made.returncode == 0, made.stderr
    return env


HOLDER_COMMANDS = {
    "run": ["lock", "run", "{feature}", "--lease", str(LEASE_SECONDS), "--timeout", "0"],
    "work": ["lock", "work", "{feature}"],
}
"""Each holder of its own feature: ``lock run`` refreshes every second (its short lease); a
``lock work`` worker (the run lease: refreshes every 20 s) must let go of its connection long
before its first refresh."""


@pytest.mark.parametrize("command", sorted(HOLDER_COMMANDS))
def test_more_holders_than_connection_slots_all_hold_and_finish(
    crowded_server: PgServer, tmp_path: Path, command: str
) -> None:
    """20 ``lock run`` (or ``lock work``) holders, each of its own feature, against 17
    connection slots; each CMD waits for a byte on its stdin (sent once every holder holds its
    lock, and every ``lock run`` has refreshed it, or every ``lock work`` let go of its server
    connection). Failed before: a holder kept its connection for its whole run, so the 18th
    and later could not connect (exit 3). ``lock work`` holders must let go of theirs before
    their first refresh: with the connection's grace removed (mutant
    ``pool-lock-keeps-its-claims-connection``) those that connected first kept theirs until it,
    20 s later, and the others waited for a slot (all held, all exit 0: only the sessions tell)."""
    url = crowded_server.url()
    env = _tables_made(url)
    opts = ["--backend", url, "--namespace", "crowd"]
    refreshed = " AND refreshed_at > acquired_at" if command == "run" else ""
    holders = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mahabharatha",
                *(word.format(feature=f"f{number:02d}") for word in HOLDER_COMMANDS[command]),
                *opts,
                "--",
                "head",
                "-c",
                "1",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=tmp_path,
            env=env,
        )
        for number in range(HOLDERS)
    ]
    try:

        def all_held_and_refreshed_or_one_ended() -> bool:
            if any(holder.poll() is not None for holder in holders):
                return True
            return (
                _rows(
                    crowded_server,
                    "SELECT count(*) FROM mahabharatha_locks WHERE namespace = 'crowd'"
                    f" AND pid IS NOT NULL{refreshed}",
                )
                == HOLDERS
            )

        assert wait_until(all_held_and_refreshed_or_one_ended, timeout=HANG_GUARD_SECONDS)
        if command == "work":
            _holders_let_go_before_a_refresh(crowded_server)
    finally:
        codes = []
        for holder in holders:
            assert holder.stdin is not None
            try:
                holder.stdin.write(b"x")
                holder.stdin.close()
            except BrokenPipeError:
                pass
        for holder in holders:
            try:
                holder.wait(timeout=HANG_GUARD_SECONDS)
            except subprocess.TimeoutExpired:
                holder.kill()
                holder.wait()
            assert holder.stderr is not None
            with holder.stderr:
                codes.append((holder.returncode, holder.stderr.read().decode(errors="replace")))
    assert all(code == 0 for code, _ in codes), [entry for entry in codes if entry[0] != 0][:3]
    held = _rows(
        crowded_server,
        "SELECT count(*) FROM mahabharatha_locks WHERE namespace = 'crowd' AND pid IS NOT NULL",
    )
    assert held == 0  # every one released


def _holders_let_go_before_a_refresh(server: PgServer) -> None:
    """Once every ``lock work`` holder holds: the holders' server sessions all end before any
    of them refreshes (a grace of a quarter of a second after its claim; its first refresh a
    third of the run lease after it). One look sees both counts at once."""
    look = (
        "SELECT (SELECT count(*) FROM pg_stat_activity WHERE usename = 'mh_app'),"
        " (SELECT count(*) FROM mahabharatha_locks WHERE namespace = 'crowd'"
        " AND refreshed_at > acquired_at)"
    )
    seen: list[tuple[object, ...]] = []

    def none_kept_or_one_refreshed() -> bool:
        seen[:] = admin_execute(server, look)
        return seen[0][0] == 0 or seen[0][1] != 0

    assert wait_until(none_kept_or_one_refreshed, timeout=HANG_GUARD_SECONDS)
    kept, refreshed = seen[0]
    assert refreshed == 0, f"{kept} server sessions kept by holders until they refreshed"


QUICK_FREE_SLOTS = 2
"""Every usable slot but these is taken by the admin role: each worker's first look sees the
server crowded (at most one free, its own session taking one)."""
QUICK_WORKERS = 4
"""More workers than the free slots."""
QUICK_FEATURES = 24
QUICK_COMMAND = 'echo "$1 $(ls -l /proc/$PPID/fd | grep -c socket:)" >> "$2"'
"""A quick command: records its feature and the sockets its worker (its parent) holds as it
runs: the worker's server connection, if it kept one."""


@needs_proc
def test_more_workers_of_quick_commands_than_connection_slots_all_finish(
    crowded_server: PgServer, tmp_path: Path
) -> None:
    """4 ``lock work`` workers of one pool of quick commands against 2 free connection slots:
    the contract's many holders (revision 4) are also workers of quick commands. None may exit
    3, every feature runs once, and a worker that saw the server crowded holds no connection
    while a command runs, so that the others get a slot between its statements. Failed
    before (mutant ``pool-ignores-a-crowded-server``: the workers connected first kept their
    connections between features, their commands being shorter than the connection's grace):
    every command found its worker holding its connection (all exited 0 nonetheless)."""
    url = crowded_server.url()
    env = _tables_made(url)
    for number in range(QUICK_FEATURES):
        (tmp_path / ".gsd" / "specs" / f"q{number:02d}").mkdir(parents=True)
    ran = tmp_path / "ran.log"
    work = [
        "lock", "work", "--backend", url, "--namespace", "crowd-quick",
        "--connect-timeout", "2", "--", "sh", "-c", QUICK_COMMAND, "sh", "{}", str(ran),
    ]  # fmt: skip
    codes = []
    with _every_slot_taken(crowded_server, but=QUICK_FREE_SLOTS):
        workers = [
            subprocess.Popen(
                [sys.executable, "-m", "mahabharatha", *work],
                cwd=tmp_path,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=env,
            )
            for _ in range(QUICK_WORKERS)
        ]
        for worker in workers:
            try:
                _, stderr = worker.communicate(timeout=HANG_GUARD_SECONDS)
            except subprocess.TimeoutExpired:
                worker.kill()
                _, stderr = worker.communicate()
            codes.append((worker.returncode, stderr.decode(errors="replace")[-300:]))
    assert all(code == 0 for code, _ in codes), [entry for entry in codes if entry[0] != 0][:3]
    lines = ran.read_text().splitlines()
    assert sorted(line.split()[0] for line in lines) == [
        f"q{number:02d}" for number in range(QUICK_FEATURES)
    ]
    kept = [line for line in lines if line.split()[1] != "0"]
    assert kept == [], f"{len(kept)} of {len(lines)} commands ran beside a kept connection"


def test_a_server_is_crowded_when_a_tenth_of_its_slots_or_fewer_are_free(
    crowded_server: PgServer,
) -> None:
    """17 slots for the app role: crowded with 1 free, not with 2. The sessions that take the
    others are the admin role's, which the app role may not see the kind of (``NULL``
    ``backend_type``): counting only visible client sessions said "not crowded" with none free.
    A look is asked of the server only when the last is older than ``within``."""
    backend = PostgresBackend(crowded_server.url(), namespace="crowd-look")
    others: list[psycopg.Connection[tuple[object, ...]]] = []
    try:
        backend.status()  # connected: the session's start saw 16 slots free
        assert not backend.crowded(0.0)
        usable = MAX_CONNECTIONS - 3
        others = [psycopg.connect(crowded_server.admin_url()) for _ in range(usable - 3)]
        assert not backend.crowded(0.0)  # 2 free
        others.append(psycopg.connect(crowded_server.admin_url()))
        assert not backend.crowded(60.0)  # seen 2 free just now: not asked again
        assert backend.crowded(0.0)  # 1 free
    finally:
        for conn in others:
            conn.close()
        backend.close()


SESSIONS_LOOK: Final = "pg_catalog.pg_stat_get_activity(integer)"
BACKENDS_COUNT: Final = "pg_catalog.pg_stat_get_db_numbackends(oid)"


@contextmanager
def _revoked(server: PgServer, *functions: str) -> Iterator[None]:
    """``functions`` revoked from every role (as a locked-down server does) while the block
    runs."""
    for function in functions:
        admin_execute(server, f"REVOKE EXECUTE ON FUNCTION {function} FROM PUBLIC")
    try:
        yield
    finally:
        for function in functions:
            admin_execute(server, f"GRANT EXECUTE ON FUNCTION {function} TO PUBLIC")


def test_a_role_that_may_not_look_at_the_sessions_counts_the_databases_backends(
    crowded_server: PgServer,
) -> None:
    """A server that revoked ``pg_stat_get_activity`` from its roles: the look is refused, and
    the backend counts the databases' backends instead: crowded with one slot free, not with
    most free; its connection still works. Failed before: the refused look answered "not
    crowded" for good, so waiters LISTENed on the last slots (a feature could run twice)."""
    backend = PostgresBackend(crowded_server.url(), namespace="crowd-hidden")
    others: list[psycopg.Connection[tuple[object, ...]]] = []
    try:
        with _revoked(crowded_server, SESSIONS_LOOK):
            backend.status()
            assert not backend.crowded(0.0)  # its own session and a few workers at most
            others = _take_every_slot(crowded_server, but=2)  # and its own: one free
            assert backend.crowded(0.0)
            assert backend._slots_look is statements.SLOTS_BY_DATABASE  # never asked again
            assert backend.status() == []  # the same connection, still usable
    finally:
        for conn in others:
            conn.close()
        backend.close()


def test_a_role_that_may_count_no_sessions_is_crowded(crowded_server: PgServer) -> None:
    """A server that revoked both counts: the backend cannot tell whether its waiters would
    take the last slots, so it answers "crowded" (they poll) with most slots free, and its
    connection still works. An answer of "not crowded" would let them LISTEN on the last
    slots (mutant ``waiters-listen-on-a-server-that-hides-every-count``)."""
    backend = PostgresBackend(crowded_server.url(), namespace="crowd-blind")
    try:
        with _revoked(crowded_server, SESSIONS_LOOK, BACKENDS_COUNT):
            backend.status()
            assert backend.crowded(0.0)
            assert backend._slots_look is None  # told twice: never asked again
            assert backend.status() == []  # the same connection, still usable
    finally:
        backend.close()


class _SessionsLookSentByBoth:
    """A backend's connection whose sessions look (``SLOTS``) is held until two threads have
    both sent it, the ``second``'s then until the ``first``'s judgement is made: both read
    which count to run before either was refused it."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.both_sent = threading.Barrier(2, timeout=HANG_GUARD_SECONDS)
        self.first_judged = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)

    def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        if query is statements.SLOTS:
            self.both_sent.wait()
            if threading.current_thread().name == "second":
                assert self.first_judged.wait(HANG_GUARD_SECONDS)
        return self.conn.execute(query, *args, **kwargs)


def test_threads_refused_the_sessions_look_at_once_both_count_the_databases_backends(
    crowded_server: PgServer,
) -> None:
    """Two threads sharing a backend are refused ``pg_stat_get_activity`` at once, on a server
    with most slots free: each goes on to the databases' backend counts, and neither judges it
    crowded. Failed on 7c66ee9: the second took the first's move to that count for a refusal
    of it too, and judged the server crowded for good (every claim then connecting again,
    every waiter polling, woken by no release)."""
    backend = PostgresBackend(crowded_server.url(), namespace="crowd-hidden-twice")
    judged: dict[str, bool] = {}
    try:
        with _revoked(crowded_server, SESSIONS_LOOK):
            backend.status()
            real = backend._conn
            looked = backend._conn = _SessionsLookSentByBoth(real)  # type: ignore[assignment]

            def judge() -> None:
                judged[threading.current_thread().name] = backend.crowded(0.0)
                if threading.current_thread().name == "first":
                    looked.first_judged.set()

            threads = [threading.Thread(target=judge, name=name) for name in ("first", "second")]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(HANG_GUARD_SECONDS)
            backend._conn = real
            assert judged == {"first": False, "second": False}
            assert backend._slots_look is statements.SLOTS_BY_DATABASE
            assert backend.status() == []  # the same connection, still usable
    finally:
        backend.close()


USABLE_SLOTS = MAX_CONNECTIONS - 3
REFUSED_TIMEOUT = 1
"""The workers' ``--connect-timeout`` while every slot is taken: they used to exit 3 after it."""
REFUSED_WINDOW_SECONDS = 3.0 * REFUSED_TIMEOUT
"""How long a refused worker is watched: it must still be waiting for a slot at the end (the
property is a duration: nothing else to synchronise on)."""


def _app_sessions(server: PgServer) -> int:
    return _rows(
        server,
        "SELECT count(*) FROM pg_stat_activity WHERE usename = 'mh_app'",
    )


def _take_every_slot(
    server: PgServer, but: int = 0
) -> list[psycopg.Connection[tuple[object, ...]]]:
    """Every slot the app role may use (``but`` a few), taken by the admin role (which keeps
    the reserved ones for the test's own looks)."""
    return [psycopg.connect(server.admin_url()) for _ in range(USABLE_SLOTS - but)]


@contextmanager
def _every_slot_taken(server: PgServer, but: int = 0) -> Iterator[None]:
    """:func:`_take_every_slot` while the block runs."""
    taken = _take_every_slot(server, but)
    try:
        yield
    finally:
        for conn in taken:
            conn.close()


def _held(namespace: str) -> str:
    """The count of ``namespace``'s held locks."""
    return (
        "SELECT count(*) FROM mahabharatha_locks"
        f" WHERE namespace = '{namespace}' AND pid IS NOT NULL"
    )


def _long_holder_at_rest(
    server: PgServer, cwd: Path, feature: str, namespace: str
) -> subprocess.Popen[bytes]:
    """A ``lock work`` worker of ``feature`` whose command (``head -c 1``) runs until a byte
    comes on the worker's stdin; returned once it holds the lock and, past the connection's
    grace, holds no connection."""
    url = server.url()
    env = _tables_made(url)
    (cwd / ".gsd" / "specs" / feature).mkdir(parents=True)
    worker = _worker(
        env, cwd, feature, "--backend", url, "--namespace", namespace,
        "--connect-timeout", str(REFUSED_TIMEOUT), "--", "head", "-c", "1",
    )  # fmt: skip
    assert wait_until(lambda: _rows(server, _held(namespace)) == 1, HANG_GUARD_SECONDS)
    assert wait_until(lambda: _app_sessions(server) == 0, HANG_GUARD_SECONDS)
    return worker


def _worker(env: dict[str, str], cwd: Path, *words: str) -> subprocess.Popen[bytes]:
    return _process([sys.executable, "-m", "mahabharatha", "lock", "work", *words], env, cwd)


def _process(words: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[bytes]:
    """``words`` run in ``cwd``, stdin a pipe, stderr read by the test."""
    return subprocess.Popen(
        words,
        cwd=cwd,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )


def _still_waiting_after_the_window(worker: subprocess.Popen[bytes]) -> bool:
    """Is ``worker`` still running once the window has passed (False as soon as it ends)?"""
    ends = time.monotonic() + REFUSED_WINDOW_SECONDS
    wait_until(lambda: worker.poll() is not None or time.monotonic() > ends, 60.0)
    return worker.poll() is None


def _said_until(
    worker: subprocess.Popen[bytes], line: bytes = b"waiting for a free connection slot"
) -> bytes:
    """What ``worker`` said on stderr up to ``line`` (by default: it waits for a slot; awaited,
    not timed: on a busy machine the worker may need seconds just to start), or up to its end."""
    assert worker.stderr is not None
    said = b""
    deadline = time.monotonic() + HANG_GUARD_SECONDS
    while line not in said:
        left = max(0.0, deadline - time.monotonic())
        readable, _, _ = select.select([worker.stderr], [], [], left)
        chunk = os.read(worker.stderr.fileno(), 4096) if readable else b""
        if not chunk:  # ended, or the deadline passed
            break
        said += chunk
    return said


def test_a_worker_refused_for_want_of_a_slot_waits_for_one_and_finishes(
    crowded_server: PgServer, tmp_path: Path
) -> None:
    """Every slot taken before a ``lock work`` worker (holding nothing) starts: it keeps
    asking past its ``--connect-timeout``, says so once, and, once slots come free, does the
    whole pool. Failed before: it exited 3 after the timeout (a worker that found no slot
    among many)."""
    url = crowded_server.url()
    env = _tables_made(url)
    names = ["s0", "s1", "s2"]
    for name in names:
        (tmp_path / ".gsd" / "specs" / name).mkdir(parents=True)
    with _every_slot_taken(crowded_server):
        worker = _worker(
            env, tmp_path, "--backend", url, "--namespace", "crowd-wait",
            "--connect-timeout", str(REFUSED_TIMEOUT), "--", "true",
        )  # fmt: skip
        # Race: under load the window could pass before the worker even asked for a slot.
        refused = _said_until(worker)
        assert _still_waiting_after_the_window(worker)
    _, stderr = worker.communicate(timeout=HANG_GUARD_SECONDS)
    said = (refused + stderr).decode(errors="replace")
    assert worker.returncode == 0, said[-300:]
    assert said.count("waiting for a free connection slot") == 1, said  # told, once
    done = _rows(
        crowded_server,
        "SELECT count(*) FROM mahabharatha_locks WHERE namespace = 'crowd-wait'"
        " AND done_at IS NOT NULL AND pid IS NULL",
    )
    assert done == len(names)


def test_a_holder_whose_command_ended_waits_for_a_slot_to_mark_it_done(
    crowded_server: PgServer, tmp_path: Path
) -> None:
    """A ``lock work`` worker's long command runs while it holds no connection; every slot is
    taken meanwhile; the command ends. The worker keeps asking for a slot while its lease
    lasts, then marks the feature done and releases it. Failed before: it exited 3 at its
    ``--connect-timeout`` with the command's success unrecorded and the lock left held until
    its lease ran out (the feature then run again by another worker)."""
    worker = _long_holder_at_rest(crowded_server, tmp_path, "long", "crowd-done")
    held = _held("crowd-done")
    with _every_slot_taken(crowded_server):
        assert worker.stdin is not None
        with worker.stdin:
            worker.stdin.write(b"x")  # the command ends: the worker must record it
        worker.stdin = None
        assert _still_waiting_after_the_window(worker)
        assert _rows(crowded_server, held) == 1  # not released unmarked, not lost
    _, stderr = worker.communicate(timeout=HANG_GUARD_SECONDS)
    said = stderr.decode(errors="replace")
    assert worker.returncode == 0, said[-300:]
    assert said.count("waiting for a free connection slot") == 1, said  # told, once
    assert _rows(crowded_server, held) == 0
    done = _rows(
        crowded_server,
        "SELECT count(*) FROM mahabharatha_locks WHERE namespace = 'crowd-done'"
        " AND done_at IS NOT NULL",
    )
    assert done == 1


def _waiter_of_x(url: str, namespace: str, ran: Path) -> list[str]:
    """``lock work`` words of a worker of ``x`` whose command records in ``ran`` that it ran."""
    return [
        "x", "--backend", url, "--namespace", namespace,
        "--connect-timeout", str(REFUSED_TIMEOUT), "--", "sh", "-c", 'echo "$1" >> "$2"',
        "sh", "{}", str(ran),
    ]  # fmt: skip


def _holders_command_ends(
    holder: subprocess.Popen[bytes], waiters: list[subprocess.Popen[bytes]]
) -> list[bytes]:
    """End the holder's command (a byte on its stdin); what the holder, then each waiter, said
    on stderr until it ended."""
    assert holder.stdin is not None
    with holder.stdin:
        holder.stdin.write(b"x")  # the command ends: the holder must record it
    holder.stdin = None
    return [each.communicate(timeout=HANG_GUARD_SECONDS)[1] for each in [holder, *waiters]]


def _assert_the_holder_alone_marked_x_done(
    holder: subprocess.Popen[bytes],
    waiters: list[subprocess.Popen[bytes]],
    said: list[bytes],
    ends: list[bytes],
    ran: Path,
) -> None:
    """The holder marked ``x`` done; every waiter ended 0 and none ran it again."""
    told = ends[0].decode(errors="replace")
    assert holder.returncode == 0 and "x: done" in told, told[-300:]
    for each, before, after in zip(waiters, said, ends[1:], strict=True):
        assert each.returncode == 0, (before + after).decode(errors="replace")[-300:]
    assert not ran.exists(), ran.read_text()  # no waiter ran the holder's feature again


FEATURE_LOCK_WAITER: Final = (
    "import sys\n"
    "from mahabharatha.backends import open_backend\n"
    "from mahabharatha.locks import FeatureLock\n"
    "told = []\n"
    "def say(info, left):\n"
    "    if not told:\n"
    "        told.append(True)\n"
    "        print('waiting: ', file=sys.stderr, flush=True)\n"
    "store = open_backend(sys.argv[1], namespace=sys.argv[2], connect_timeout=1)\n"
    "with FeatureLock('x', backend=store, timeout=100, on_wait=say):\n"
    "    pass\n"
)
"""A ``FeatureLock`` (as ``lock run --timeout``) waiting for ``x``: says so once on stderr."""


@pytest.mark.parametrize(
    ("waiter", "crowded"),
    [
        ("lock-work", "before-the-wait"),
        ("lock-work", "during-the-wait"),
        ("feature-lock", "during-the-wait"),
    ],
)
def test_workers_waiting_on_a_crowded_server_leave_a_slot_to_the_holder_marking_done(
    crowded_server: PgServer, tmp_path: Path, waiter: str, crowded: str
) -> None:
    """Two waiters (``lock work`` workers that never took a feature, or ``FeatureLock``s with a
    timeout) wait for the feature a ``lock work`` worker holds; the server has two free slots
    (taken before they start, or while they wait). The holder's command ends: it must get a
    slot and mark the feature done while its lease lasts; no ``lock work`` waiter runs it.
    Failed before: a waiter never told the server was crowded LISTENed for its whole wait (a
    worker on its claims' connection, a ``FeatureLock`` on a second one), so two of them kept
    both free slots; the holder waited for one until its lease ran out (60 s), a waiter took
    the feature (a worker ran it again), and the holder's done found it taken: reported lost,
    every process exiting 0."""
    _two_waiters_of_x_and_its_holders_end(
        crowded_server, tmp_path, f"crowd-listen-{waiter}-{crowded}", waiter, crowded
    )


def test_workers_waiting_on_a_server_that_hides_its_sessions_leave_a_slot_to_the_holder(
    crowded_server: PgServer, tmp_path: Path
) -> None:
    """The crowded-waiter test (two ``lock work`` waiters, the server filled to two free slots
    while they wait) on a server that revoked ``pg_stat_get_activity``: the waiters see it
    crowded by the databases' backend counts, poll, and the holder marks its feature done.
    Failed before: a refused look answered "not crowded", the waiters LISTENed on both free
    slots, the holder waited out its lease (60 s) and a waiter ran the feature again."""
    with _revoked(crowded_server, SESSIONS_LOOK):
        _two_waiters_of_x_and_its_holders_end(
            crowded_server, tmp_path, "crowd-listen-hidden", "lock-work", "during-the-wait"
        )


def _two_waiters_of_x_and_its_holders_end(
    crowded_server: PgServer, tmp_path: Path, namespace: str, waiter: str, crowded: str
) -> None:
    """A holder of ``x`` at rest, two waiters of it, the server left two free slots (before
    they start, or while they wait); the holder's command ends: it alone marks ``x`` done."""
    url = crowded_server.url()
    holder = _long_holder_at_rest(crowded_server, tmp_path, "x", namespace)
    env = _tables_made(url)
    ran = tmp_path / "ran.log"
    waiter_words = _waiter_of_x(url, namespace, ran)
    slots = _take_every_slot(crowded_server, but=2) if crowded == "before-the-wait" else []
    try:
        if waiter == "lock-work":
            waiters = [_worker(env, tmp_path, *waiter_words) for _ in range(2)]
        else:
            words = [sys.executable, "-c", FEATURE_LOCK_WAITER, url, namespace]
            waiters = [_process(words, env, tmp_path) for _ in range(2)]
        said = [_said_until(waiter, b"waiting: ") for waiter in waiters]
        if crowded == "during-the-wait":  # both waiters hold their connection now
            slots = _take_every_slot(crowded_server, but=2)
        ends = _holders_command_ends(holder, waiters)
    finally:
        for conn in slots:
            conn.close()
    _assert_the_holder_alone_marked_x_done(holder, waiters, said, ends, ran)


def test_a_waiter_whose_connection_was_lost_still_leaves_a_slot_to_the_holder_marking_done(
    crowded_server: PgServer, tmp_path: Path
) -> None:
    """Two waiting ``lock work`` workers lose their connections (a terminated backend, a
    restart, a network cut): each listens anew on a second connection of its own; then the
    server fills. The holder's command ends: it must get a slot and mark the feature done
    while its lease lasts, no waiter running the feature. Failed before: a waiter that fell
    back to a listener of its own never asked again whether the server was crowded, and kept
    two slots each (the claims' and the listener); the holder waited for one until its lease
    ran out (60 s) and a waiter ran the feature again."""
    url = crowded_server.url()
    namespace = "crowd-relisten"
    holder = _long_holder_at_rest(crowded_server, tmp_path, "x", namespace)
    env = _tables_made(url)
    ran = tmp_path / "ran.log"
    waiter_words = _waiter_of_x(url, namespace, ran)
    waiters = [_worker(env, tmp_path, *waiter_words) for _ in range(2)]
    said = [_said_until(waiter, b"waiting: ") for waiter in waiters]
    ended = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'mh_app'"
    admin_execute(crowded_server, ended)  # the waiters' connections: the holder holds none
    listeners = (
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE usename = 'mh_app' AND application_name = 'mahabharatha-wait'"
    )
    # Each waiter listens on a connection of its own now, beside its claims' one.
    assert wait_until(
        lambda: _rows(crowded_server, listeners) == 2 and _app_sessions(crowded_server) == 4,
        HANG_GUARD_SECONDS,
    )
    slots = _take_every_slot(crowded_server, but=4)  # the waiters' four: none free
    try:
        ends = _holders_command_ends(holder, waiters)
    finally:
        for conn in slots:
            conn.close()
    _assert_the_holder_alone_marked_x_done(holder, waiters, said, ends, ran)


@pytest.mark.parametrize("limited", ["ROLE mh_app", "DATABASE mh"])
def test_a_role_or_database_near_its_own_connection_limit_is_crowded(
    crowded_server: PgServer, limited: str
) -> None:
    """The role's (or the database's) ``CONNECTION LIMIT`` (3) is tighter than the server's
    slots: two of the role's sessions leave one free, crowded; one leaves two, not. A look at
    the server's slots alone said "not crowded" while a fourth session would be refused."""
    admin_execute(crowded_server, f"ALTER {limited} CONNECTION LIMIT 3")
    backend = PostgresBackend(crowded_server.url(), namespace="crowd-role")
    other = None
    try:
        backend.status()
        assert not backend.crowded(0.0)
        other = psycopg.connect(crowded_server.url())
        assert backend.crowded(0.0)
    finally:
        admin_execute(crowded_server, f"ALTER {limited} CONNECTION LIMIT -1")
        if other is not None:
            other.close()
        backend.close()


def test_a_role_near_its_own_connection_limit_is_crowded_on_a_server_that_hides_its_sessions(
    crowded_server: PgServer,
) -> None:
    """A role refused ``pg_stat_get_activity`` counts the databases' backends, each of which
    may be its own, against its ``CONNECTION LIMIT`` (5): its own session leaves most free, not
    crowded; three more of its sessions leave one, crowded. Fails with the role's limit
    counting none of them (mutant ``hidden-sessions-never-count-against-the-roles-limit``):
    the server's slots alone said "not crowded" while a sixth session would be refused."""
    admin_execute(crowded_server, "ALTER ROLE mh_app CONNECTION LIMIT 5")
    backend = PostgresBackend(crowded_server.url(), namespace="crowd-role-hidden")
    others: list[psycopg.Connection[tuple[object, ...]]] = []
    try:
        with _revoked(crowded_server, SESSIONS_LOOK):
            backend.status()
            assert not backend.crowded(0.0)
            others = [psycopg.connect(crowded_server.url()) for _ in range(3)]
            assert backend.crowded(0.0)
            assert backend._slots_look is statements.SLOTS_BY_DATABASE
    finally:
        admin_execute(crowded_server, "ALTER ROLE mh_app CONNECTION LIMIT -1")
        for conn in others:
            conn.close()
        backend.close()


def test_a_done_whose_answer_was_lost_on_a_full_server_is_found_when_asked_again(
    crowded_server: PgServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool worker's done commits on the server, its answer is lost (the connection dies),
    and every slot is taken when it connects again: a ServerFullError. The backend asks again
    while the lease lasts (``_while_full``) and must find its own done mark. Failed before:
    each ``done`` call drew a new attempt id, so the call asked again found the feature done
    by "someone else", unheld, and raised NotHeldError: a done command reported as an error."""
    url = crowded_server.url()
    _tables_made(url)
    backend = PostgresBackend(url, namespace="crowd-lost-done", connect_timeout=REFUSED_TIMEOUT)
    taken: list[psycopg.Connection[tuple[object, ...]]] = []
    real_rows = backend._rows
    lost: list[bool] = []

    def answer_lost_then_full(query: str, params: dict[str, object]) -> list[tuple[object, ...]]:
        if query is not statements.DONE or lost:
            return real_rows(query, params)
        lost.append(True)
        real_rows(query, params)  # committed on the server ...
        taken.extend(_take_every_slot(crowded_server))
        assert backend._conn is not None
        backend._conn.close()  # ... and its answer lost: asked again on a new connection
        return real_rows(query, params)

    def free_the_slots() -> None:
        while taken:
            taken.pop().close()

    monkeypatch.setattr(backend, "_rows", answer_lost_then_full)
    monkeypatch.setattr(pg_session, "_pause_for_a_slot", free_the_slots)
    try:
        claimed = locks.claim_next(["f"], tmp_path / ".gsd", backend=backend)
        assert claimed.held is not None
        lock = locks.PoolLock(
            claimed.held,
            tmp_path / ".gsd",
            backend=backend,
            heartbeat=None,
            command=None,
            lease=backend.run_lease,
        )
        lock.acquire()
        result = lock.finish(0, None, locks.DEFAULT_ATTEMPTS)
        assert lost  # the answer was lost, and the reconnect refused
        assert result.outcome == "done"
        assert backend.is_done("f")
    finally:
        free_the_slots()
        backend.close()


def test_a_claim_whose_answer_was_lost_on_a_full_server_is_taken_up_when_asked_again(
    crowded_server: PgServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool worker's claim takes a feature on the server, its answer is lost, and every slot
    is taken when it connects again: a ServerFullError, and the worker (holding nothing that
    it knows of) claims again once a slot is free. That claim must find its own lost attempt
    and run the feature. Failed before: the new claim drew a new attempt id, saw the feature
    held by the worker itself ("mine", not waited for), and the pool ended "finished" with
    the feature neither run nor done, its lock held until the lease ran out."""
    url = crowded_server.url()
    _tables_made(url)
    backend = PostgresBackend(url, namespace="crowd-lost-claim", connect_timeout=REFUSED_TIMEOUT)
    taken: list[psycopg.Connection[tuple[object, ...]]] = []
    real_statement = backend._claim_statement
    lost: list[bool] = []

    def answer_lost_then_full(params: Any, features: Any, *how: Any) -> Any:
        real = real_statement(params, features, *how)

        def run(conn: Any) -> Any:
            answer = real(conn)
            if answer[1] is not None and not lost:
                lost.append(True)  # committed on the server, and then ...
                taken.extend(_take_every_slot(crowded_server))
                conn.close()
                raise psycopg.OperationalError("server closed the connection unexpectedly")
            return answer

        return run

    def free_the_slots() -> None:
        while taken:
            taken.pop().close()

    monkeypatch.setattr(backend, "_claim_statement", answer_lost_then_full)
    monkeypatch.setattr(pg_session, "_pause_for_a_slot", free_the_slots)
    ran: list[str] = []
    try:
        report = locks.work(ran.append, ["f"], tmp_path / ".gsd", backend=backend, wait=None)
        assert lost  # the answer was lost, and the reconnect refused
        assert ran == ["f"]
        assert [result.outcome for result in report.results] == ["done"]
        assert backend.is_done("f")
        assert [info.feature for info in backend.status() if info.held] == []
    finally:
        free_the_slots()
        backend.close()


STOP_GUARD_SECONDS = 20.0
"""Far more than a connect timeout (1 s) and the pause after it, far less than the lease
(60 s): a worker told to stop must not wait out its lease for a slot to release in."""


def test_a_worker_told_to_stop_on_a_full_server_ends_without_waiting_out_its_lease(
    crowded_server: PgServer, tmp_path: Path
) -> None:
    """SIGTERM (as ``lock work -j`` forwards it) reaches a worker whose command runs while
    every slot is taken: the command ends by the signal, and the lock cannot be released (no
    slot). The worker must end after one round of connecting, exit 3 (the server's error, as
    before slots were waited for), leaving the lock to its lease. Failed before: it asked
    again for a slot to release in, silently, for the whole lease (60 s)."""
    worker = _long_holder_at_rest(crowded_server, tmp_path, "stopped", "crowd-stop")
    try:
        with _every_slot_taken(crowded_server):
            worker.terminate()  # CMD's stdin stays open: it ends by the forwarded signal only
            try:
                worker.wait(timeout=STOP_GUARD_SECONDS)
            except subprocess.TimeoutExpired:
                pytest.fail("a worker told to stop waited for a slot to release its lock in")
    finally:
        if worker.poll() is None:
            worker.kill()
        _, stderr = worker.communicate()
    said = stderr.decode(errors="replace")
    assert worker.returncode == 3, said[-300:]
    assert "connection slots" in said or "too many clients" in said, said[-300:]


def test_another_threads_claim_never_takes_up_a_lost_claim(
    crowded_server: PgServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Threads of one process share a backend (``shared_backend``). Thread A's claim of "f"
    commits, its answer is lost and the reconnect refused (ServerFullError): A keeps its lost
    attempt to take up when it claims again. Thread B's claim, with the same pid, must not take
    it up: it takes "g". Keyed by pid alone, B took "f" (two holders in one process)."""
    url = crowded_server.url()
    _tables_made(url)
    backend = PostgresBackend(url, namespace="crowd-lost-thread", connect_timeout=REFUSED_TIMEOUT)
    requester = Requester(os.getpid(), None)
    taken: list[psycopg.Connection[tuple[object, ...]]] = []
    real_statement = backend._claim_statement
    lost: list[bool] = []

    def answer_lost_then_full(params: Any, features: Any, *how: Any) -> Any:
        real = real_statement(params, features, *how)

        def run(conn: Any) -> Any:
            answer = real(conn)
            if answer[1] is not None and not lost:
                lost.append(True)
                taken.extend(_take_every_slot(crowded_server))
                conn.close()
                raise psycopg.OperationalError("server closed the connection unexpectedly")
            return answer

        return run

    monkeypatch.setattr(backend, "_claim_statement", answer_lost_then_full)
    errors: list[BaseException] = []

    def thread_a() -> None:
        try:
            backend.try_claim(["f", "g"], requester, lease=60.0)
        except BaseException as error:  # the lost answer: ServerFullError
            errors.append(error)

    try:
        first = threading.Thread(target=thread_a)
        first.start()
        first.join()
        assert lost and [type(error) for error in errors] == [ServerFullError]
        while taken:
            taken.pop().close()
        won = backend.try_claim(["f", "g"], requester, lease=60.0)  # thread B: this one
        assert won is not None and won.held is not None
        assert won.held.feature == "g"
    finally:
        while taken:
            taken.pop().close()
        backend.close()


def test_the_login_roles_connection_limit_counts_under_another_current_role(
    crowded_server: PgServer,
) -> None:
    """The app role's sessions start as another role (``ALTER ROLE ... SET role``): the limit
    that refuses a connection is the login role's, and so is the count. Looking up
    ``current_user`` found the other role, unlimited: never crowded."""
    setup = [
        "CREATE ROLE mh_stand_in NOLOGIN",
        "GRANT mh_stand_in TO mh_app",
        "ALTER ROLE mh_app SET role = 'mh_stand_in'",
        "ALTER ROLE mh_app CONNECTION LIMIT 3",
    ]
    undo = [
        "ALTER ROLE mh_app CONNECTION LIMIT -1",
        "ALTER ROLE mh_app RESET role",
        "DROP ROLE IF EXISTS mh_stand_in",
    ]
    for statement in setup:
        admin_execute(crowded_server, statement)
    backend = PostgresBackend(crowded_server.url(), namespace="crowd-stand-in")
    other = None
    try:
        backend._connection()  # a session of the app role, running as mh_stand_in
        assert not backend.crowded(0.0)
        other = psycopg.connect(crowded_server.url())
        assert backend.crowded(0.0)
    finally:
        if other is not None:
            other.close()
        backend.close()
        for statement in undo:
            admin_execute(crowded_server, statement)
