"""Locks across hosts: a lease table in PostgreSQL, one row per (namespace, feature), one statement
per operation, every expiry judged by the server's clock (``design/postgres.md``)."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, Final, NamedTuple

try:
    import psycopg
    from psycopg import pq, sql
except ImportError as missing:  # pragma: no cover - exercised by the CLI's own test
    raise ImportError("a postgresql:// lock URL needs psycopg 3, the postgres extra") from missing

from mahabharatha.backends.base import (
    AcquireResult,
    Attempts,
    CleanedEntry,
    FeatureProblem,
    Held,
    LockBackend,
    LockInfo,
    LockLostError,
    NotHeldError,
    NotOwnerError,
    Owner,
    ReleaseWait,
    Requester,
    ServerFullError,
    Verdict,
)
from mahabharatha.backends.postgres import statements
from mahabharatha.backends.postgres.namespace import derive_namespace
from mahabharatha.backends.postgres.release_watch import ReleaseWaits
from mahabharatha.backends.postgres.session import DEFAULT_SCHEMA, _Connection
from mahabharatha.constants import (
    CONNECT_TIMEOUT_SECONDS,
    DEFAULT_LEASE_SECONDS,
    NAMESPACE_ENV,
    RUN_LEASE_SECONDS,
    SCHEMA_ENV,
)
from mahabharatha.names import feature_folders
from mahabharatha.owner import ownership
from mahabharatha.states import State

MAX_NAMESPACE_BYTES: Final = 200  # plenty for ``host/org/repo``; every row carries it
_SCHEMA_NAME: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")  # written into statements unquoted
MAX_REASON_CHARS: Final = 200  # a failed attempt's reason, as on files
MAX_CLAIM_ROUNDS: Final = 4  # a claim finds rows missing at most once per new feature list
MAX_REGISTERED_LISTS: Final = 8  # lists a connection keeps a prepared claim for (a pool: one)


class _Row(NamedTuple):
    feature: str
    pid: int | None
    details: bytes | None
    host: str | None
    token: int | None
    done: bool
    refreshed: float | None
    expires: float | None
    now: float


class PostgresBackend(ReleaseWaits, LockBackend):
    """Locks in PostgreSQL, keyed by (namespace, feature); see the module's docstring."""

    kind = "postgresql"
    run_lease = RUN_LEASE_SECONDS

    def __init__(
        self,
        url: str,
        *,
        gsd_dir: str | os.PathLike[str] = ".gsd",
        namespace: str | None = None,
        connect_timeout: float | None = None,
        schema: str | None = None,
        on_slot_wait: Callable[[ServerFullError], None] | None = None,
    ) -> None:
        """The backend for ``url``; the namespace given, else the environment's, else origin's."""
        chosen_schema = schema or os.environ.get(SCHEMA_ENV) or DEFAULT_SCHEMA
        if not _SCHEMA_NAME.fullmatch(chosen_schema):
            raise ValueError(
                f"not a usable lock schema name: {chosen_schema!r} (lower-case letters, digits "
                "and _, at most 63, not starting with a digit)"
            )
        namespace = namespace or os.environ.get(NAMESPACE_ENV) or derive_namespace(gsd_dir)
        if not namespace:
            raise ValueError(
                "no lock namespace: pass --namespace NAME (or set MAHABHARATHA_LOCK_NAMESPACE); "
                "none could be derived: the --gsd-dir folder is in no git repository with an "
                "'origin' remote that names one repository stably (a relative path such as "
                "../up.git names another one from each folder)"
            )
        if (size := len(namespace.encode("utf-8", "surrogatepass"))) > MAX_NAMESPACE_BYTES:
            raise ValueError(
                f"the lock namespace is {size} bytes long; at most {MAX_NAMESPACE_BYTES} are "
                "allowed: pass a shorter --namespace"
            )
        timeout = CONNECT_TIMEOUT_SECONDS if connect_timeout is None else connect_timeout
        if not math.isfinite(timeout) or timeout <= 0:
            raise ValueError(f"connect timeout must be a positive number of seconds, not {timeout}")
        super().__init__(url, schema=chosen_schema, connect_timeout=timeout)
        self.namespace: str = namespace
        self.gsd_dir: str | os.PathLike[str] = gsd_dir
        self.on_slot_wait = on_slot_wait
        self._host = socket.gethostname()
        # Feature lists whose rows exist (rows are never deleted): are they in sorted order?
        self._ensured: dict[str, bool] = {}
        # (feature, or None for a claim; pid; thread) -> the attempt id of an unanswered done/claim
        self._unanswered: dict[tuple[str | None, int, int], bytes] = {}
        self._last_list: tuple[list[str], str] = ([], "")  # the last list claimed from, joined
        # (feature, pid) -> when the lease of a lock taken here ends (monotonic): its done, fail
        # or waited release waits out a full or restarting server until then
        self._leases: dict[tuple[str, int], float] = {}

    def where(self) -> str:
        return str(self._server)

    def __repr__(self) -> str:
        return f"PostgresBackend({self.where()!r}, namespace={self.namespace!r})"

    def _params(self, **values: Any) -> dict[str, Any]:
        return {"ns": self.namespace, **values}

    def init(self) -> int:
        """Create the tables, or the lost token sequence (above every token); the schema
        version. DDL runs only then: a role using the tables needs no DDL rights."""
        version = self._rows(statements.SCHEMA_VERSION_QUERY, {})[0][0]  # first use creates
        if version is not None and version > statements.SCHEMA_VERSION:
            raise self._newer_schema(int(version))
        if (
            version is None
            or version < statements.SCHEMA_VERSION
            or self._rows(statements.SEQUENCE_MISSING, {})[0][0]
        ):
            version = self._create_schema(repair=True)
        return int(version)

    def _take_params(
        self, feature: str | None, requester: Requester, lease: float | None
    ) -> dict[str, Any]:
        seconds = DEFAULT_LEASE_SECONDS if lease is None else lease
        if not math.isfinite(seconds) or seconds <= 0:
            raise ValueError(f"a lease must be a positive number of seconds, not {seconds}")
        return self._params(
            feature=feature,
            pid=requester.pid,
            # Every role using the table reads every row; a command line may hold a secret.
            details=ownership.command_name_only(requester.details),
            host=self._host,  # the requester runs here (details keep only a cut host name)
            attempt=secrets.token_bytes(16),
            lease=float(seconds),
        )

    def try_acquire(
        self,
        feature: str,
        requester: Requester,
        *,
        reclaim_dead: bool = False,
        lease: float | None = None,
    ) -> AcquireResult:
        params = self._take_params(feature, requester, lease)
        # ACQUIRE_NUMBERED's parameters, "judged" the last: none is sent as NULL (cheaper than an
        # empty array, and ``token = ANY(NULL)`` decides nothing in the takeable test's OR)
        values = [params[name] for name in statements.ACQUIRE_PARAMS[:-1]] + [None]
        holder: _Row | None = None
        sent: list[float] = []
        for _ in range(MAX_CLAIM_ROUNDS):
            taken = self._hot(statements.ACQUIRE_NUMBERED, values, sent)
            if taken:
                return self._won(taken[0], requester.pid, reason="expired", sent=sent[-1])
            holder = self._holder(feature)
            if holder is not None:
                break  # Race: otherwise it was released between the two statements: try again
        if holder is None:
            return AcquireResult(None, holder=self.inspect(feature))
        info = self._info(holder)
        if reclaim_dead and info.verdict is Verdict.GONE:
            values[-1] = [holder.token]
            taken = self._hot(statements.ACQUIRE_NUMBERED, values, sent)
            if taken:
                reason = f"owner {info.owner}"
                return self._won(taken[0], requester.pid, reason=reason, sent=sent[-1])
            again = self._holder(feature)
            if again is not None:
                holder, info = again, self._info(again)
        return AcquireResult(None, holder=info, holder_details=ownership.decode(holder.details))

    def try_claim(
        self,
        features: Sequence[str],
        requester: Requester,
        *,
        reclaim_dead: bool = False,
        lease: float | None = None,
        include_done: bool = False,
        retry_delay: float = 0.0,
        slot_wait: float | None = 0.0,
    ) -> AcquireResult | None:
        """One statement; holding no connection once the server was seen crowded."""
        if not features:
            return None
        until = None if slot_wait is None else time.monotonic() + slot_wait
        claim = partial(
            self._claim, features, requester, reclaim_dead, lease, include_done, retry_delay
        )
        # A server restarting is waited for as long as a connection's own timeout, no longer.
        answer = self._while_full(claim, until, time.monotonic() + self.connect_timeout)
        if answer is not None:
            self._let_go_if_crowded()
        return answer

    def _claim(
        self,
        features: Sequence[str],
        requester: Requester,
        reclaim_dead: bool,
        lease: float | None,
        include_done: bool,
        retry_delay: float,
    ) -> AcquireResult | None:
        names = self._joined(features)
        params = self._take_params(None, requester, lease)
        params["rest"] = float(retry_delay)
        # Race: a claim committed, its answer lost on a full server: asked again, a new attempt
        # id would pass over the feature the worker itself holds; the unanswered id takes it up.
        # Race: threads sharing a backend: one's lost attempt must not take up another's feature.
        lost_key = (None, requester.pid, threading.get_ident())
        attempt = self._unanswered.setdefault(lost_key, params["attempt"])
        lost_before = attempt is not params["attempt"]
        params.update(names=names, include_done=include_done, attempt=attempt, judged=[])
        if reclaim_dead:  # the tokens of held locks among them whose owner is provably gone here
            params["judged"] = [
                row.token
                for row in self._select(statements.SELECT_WANTED, features=list(features))
                if row.token is not None and self._info(row).verdict is Verdict.GONE
            ]
        sent: list[float] = []
        answer = None
        for _ in range(MAX_CLAIM_ROUNDS):  # again while rows are missing (made between)
            missing, taken = self._run(self._claim_statement(params, features, sent, lost_before))
            if taken is None and not missing and self._ensured.get(names):
                # A lean claim cannot see missing rows. Race: rows deleted since seen (a reset):
                # the checked claim counts them; pop, not del: another thread's claim may have
                # dropped the entry already.
                self._ensured.pop(names, None)
                continue
            if taken is None and missing:
                self._run(lambda conn: conn.execute(self._sql(statements.ENSURE_ROWS), params))
            self._remember_rows(names, features)  # every name has a row now: claim by reference
            if taken is not None:
                reason = "owner judged gone" if params["judged"] else "expired"
                answer = self._won(taken, requester.pid, reason=reason, sent=sent[-1])
            if taken is not None or not missing:
                break
        self._unanswered.pop(lost_key, None)  # answered: the next claim is new
        return answer

    def _joined(self, features: Sequence[str]) -> str:
        """The names as one text, the same object for the same list (its hash computed once)."""
        last_features, last_names = self._last_list
        if features == last_features:  # names compared by identity first: no copy, no join
            return last_names
        names = "\n".join(features)
        if names.count("\n") != len(features) - 1:  # one pass in C, not a loop over names
            raise ValueError("a feature name cannot hold a line break")
        self._last_list = (list(features), names)  # a copy: the caller may change its list
        return names

    def _remember_rows(self, names: str, features: Sequence[str]) -> None:
        """Rows of ``names`` exist; claimed by ``ORDER BY feature`` if ``COLLATE "C"`` orders
        them as given (sorted, in UTF-8 or ASCII), else in their given order."""
        if names not in self._ensured:
            ascending = all(before < after for before, after in itertools.pairwise(features))
            conn = self._conn  # asked only when its answer matters (a sorted list)
            self._ensured[names] = ascending and (
                all(name.isascii() for name in features)
                or (conn is not None and conn.info.parameter_status("server_encoding") == "UTF8")
            )

    # A claim that sends its list is never prepared (a generic plan cannot see the list); a
    # registered list is written into its statement, which is prepared (design/postgres.md).
    def _claim_statement(
        self, params: dict[str, Any], features: Sequence[str], sent: list[float], checked: bool
    ) -> Callable[[_Connection], tuple[int, Sequence[Any] | None]]:
        """The claim to run: registered for a sorted list with rows seen, else sent (lean when
        sorted and seen), checked on a retry or ``checked``; ``sent`` gets each send's time."""
        lean = self._ensured.get(params["names"], False)
        registered = lean and not params["judged"]
        first = statements.CLAIM_SORTED if lean else statements.CLAIM_CHECKED
        calls = itertools.count(1 if checked else 0)

        def run(conn: _Connection) -> tuple[int, Sequence[Any] | None]:
            # Race: an answer slow to come back (a commit's fsync, a descheduled client) moved
            # the holder's cut-off past the server's expiry: the lease runs from the send.
            sent.append(time.monotonic())
            retry = next(calls) > 0
            if registered and not retry and not conn.pooled:  # a registered claim is prepared
                statement = self._registered_claim(conn, params["names"], params["include_done"])
                values = [params[name] for name in statements.REGISTERED_PARAMS]
                found = self._on_kept_cursor(conn, statement, values)
                return 0, (found[0] if found else None)
            chosen = self._sql(first if not retry else statements.CLAIM_CHECKED)
            row = conn.execute(chosen, params, prepare=False, binary=True)
            missing, *taken = row.fetchall()[0]
            return missing, (taken if taken[0] is not None else None)

        return run

    def _registered_claim(self, conn: _Connection, names: str, include_done: bool) -> bytes:
        """The claim of this list on ``conn``, built once per connection (planned once)."""
        key = (names, include_done)
        statement = self._registered.get(key)
        if statement is None:
            if len(self._registered) >= MAX_REGISTERED_LISTS:
                del self._registered[next(iter(self._registered))]  # the oldest list
            text = self._sql(statements.CLAIM_REGISTERED).format(
                ns=sql.Literal(self.namespace).as_string(conn),
                names=sql.Literal(names.split("\n")).as_string(conn),
                not_done=" AND NOT p.failed" if include_done else " AND p.done_at IS NULL",
            )
            statement = self._registered[key] = text.encode(conn.info.encoding)
        return statement

    def _won(self, row: Sequence[Any], pid: int, *, reason: str, sent: float) -> AcquireResult:
        """The lock ``row`` says ``pid`` took, and the lock it replaced, if any."""
        feature, token, refreshed, expires, now, prev_pid, prev_details, prev_ts, prev_exp = row
        shift = time.time() - now  # server times on this host's clock (see _info)
        self._leases[(feature, pid)] = time.monotonic() + (expires - now)
        held = Held(feature, pid, refreshed + shift, expires + shift, int(token), sent=sent)
        replaced = None
        if prev_pid is not None and prev_ts is not None:
            state = "stale" if prev_exp is not None and prev_exp < now else "active"
            old = _Row(feature, prev_pid, prev_details, None, None, False, prev_ts, prev_exp, now)
            replaced = self._info(old, state=state)
            if replaced.owner != Owner.UNKNOWN.value and state == "active":
                reason = f"owner {replaced.owner}"
        return AcquireResult(held, replaced=replaced, reason=reason if replaced else None)

    def refresh(self, held: Held) -> Held:
        sent: list[float] = []  # when it was sent: the new lease runs from no earlier
        found = self._hot(
            statements.REFRESH_NUMBERED, (self.namespace, held.feature, held.token), sent
        )
        if not found:
            raise LockLostError(held.feature, "its lease ran out, or it was released or taken over")
        refreshed, expires, now = found[0]
        shift = time.time() - now
        self._leases[(held.feature, held.pid)] = time.monotonic() + (expires - now)
        return held._replace(timestamp=refreshed + shift, expires_at=expires + shift, sent=sent[-1])

    def release_held(self, held: Held, wait: ReleaseWait | None = None) -> bool:
        """Release and wake the waiters in one round trip; with ``wait``, waiting out a full
        or restarting server (a refused connect) as :meth:`done` does, else one try."""
        text = self._sql(statements.RELEASE_HELD_NUMBERED)
        values = (self.namespace, held.feature, held.token)
        release = partial(
            self._run, partial(self._release_then_wake, text, values), pins_itself=True
        )
        until = -math.inf if wait is None else self._lease_end(held.feature, held.pid)
        released = bool(self._while_full(release, until, wait=wait))
        self._leases.pop((held.feature, held.pid), None)
        return released

    def _release_then_wake(
        self, text: str, values: Sequence[Any], conn: _Connection
    ) -> list[tuple[Any, ...]]:
        """The release, then the wake-up, each its own transaction in one pipeline (a refused
        wake-up fails after the release's COMMIT); behind a pooler: pinned, no pipeline."""
        released = psycopg.RawCursor(conn)
        if conn.pooled:
            # Race: a pooler runs another client's same-named prepared statement: unprepared
            self._pinned(conn, lambda _: released.execute(text, values, prepare=False, binary=True))
            self._wake_waiters()
            return released.fetchall()
        commit = conn.cursor()
        try:
            with conn.pipeline():
                conn.execute(statements.BEGIN, prepare=False)
                released.execute(text, values, prepare=True, binary=True)
                commit.execute("COMMIT", prepare=False)
                conn.execute(statements.WAKE, {"channel": self.channel}, prepare=False)
        except psycopg.Error:
            if commit.statusmessage != "COMMIT":
                if conn.info.transaction_status == pq.TransactionStatus.INERROR:
                    conn.rollback()  # the release failed inside its BEGIN: end that first
                raise
        # Hand psycopg the notifications libpq read with the pipeline's last answer: psycopg
        # leaves them in libpq's buffer, where ``notifies()`` (waiting on the socket) never looks.
        while (note := conn.pgconn.notifies()) is not None:
            if conn.pgconn.notify_handler is not None:
                conn.pgconn.notify_handler(note)
        return released.fetchall()

    def release(self, feature: str, pid: int, *, force: bool = False) -> bool:
        found = self._rows(statements.RELEASE_PID, self._owner_params(feature, pid, force=force))
        return self._let_go(feature, pid, found, None)

    def verify(self, feature: str, token: int) -> bool:
        return bool(self._rows(statements.VERIFY, self._params(feature=feature, token=token))[0][0])

    def _select(self, query: str, **values: Any) -> list[_Row]:
        return [_Row(*found) for found in self._rows(query, self._params(**values))]

    def _holder(self, feature: str) -> _Row | None:
        """The row of ``feature`` while someone holds it."""
        found = self._select(statements.SELECT_ONE, feature=feature)
        return found[0] if found and found[0].pid is not None else None

    def _info(self, row: _Row, *, state: str | None = None) -> LockInfo:
        """The row as a lock, its owner judged once, the lock's time on this host's clock (only
        the server's durations count: a client clock hours wrong judges nothing differently)."""
        from mahabharatha.backends.liveness import OwnerFacts, judge

        if row.pid is None:
            return _unlocked(row.feature, state or ("done" if row.done else "free"))
        assert row.refreshed is not None and row.expires is not None
        state = state or ("active" if row.expires >= row.now else "stale")
        here = row.refreshed + (time.time() - row.now)
        owner = judge(OwnerFacts(row.pid, here, ownership.decode(row.details))).owner
        return LockInfo(
            feature=row.feature,
            state=State(state),
            pid=row.pid,
            timestamp=row.refreshed,
            age_seconds=max(0.0, row.now - row.refreshed),
            expires_in_seconds=max(0.0, row.expires - row.now) if state == "active" else None,
            owner=owner,
            host=row.host,
            token=row.token,
        )

    def inspect(self, feature: str) -> LockInfo:
        holder = self._holder(feature)  # a done or free row reads as free
        return _unlocked(feature, "free") if holder is None else self._info(holder)

    def status(self, *, problems: list[FeatureProblem] | None = None) -> list[LockInfo]:
        return [self._info(row) for row in self._select(statements.SELECT_HELD)]

    def survey(self, *, problems: list[FeatureProblem] | None = None) -> list[LockInfo]:
        names = self.feature_names()
        local = set(names)
        infos = {
            row.feature: self._info(row)
            for row in self._select(statements.SELECT_ALL)
            if row.pid is not None or row.done or row.feature in local  # not a bare old row
        }
        for name in names:
            infos.setdefault(name, _unlocked(name, "free"))
        for name, record in self._all_attempts().items():
            if name in infos:
                info = infos[name]
                if record.failed and info.state == "done":
                    info = _unlocked(name, "failed")
                infos[name] = info.with_attempts(record)
        return [infos[name] for name in sorted(infos)]

    def feature_names(self) -> list[str]:
        return feature_folders(self.gsd_dir)

    def clean(
        self,
        *,
        dry_run: bool = False,
        reclaim_dead: bool = False,
        problems: list[FeatureProblem] | None = None,
        features: Iterable[str] | None = None,
    ) -> list[CleanedEntry]:
        rows = self._select(statements.SELECT_HELD)
        if features is not None:
            wanted = set(features)
            rows = [row for row in rows if row.feature in wanted]
        infos = {row.feature: self._info(row) for row in rows}  # each judged once
        judged = [
            row.token
            for row in rows
            if reclaim_dead
            and row.token is not None
            and infos[row.feature].state == "active"
            and infos[row.feature].verdict is Verdict.GONE
        ]
        if dry_run:
            return [
                CleanedEntry(row.feature, self._path(row.feature), "lock", state, False)
                for row in rows
                if (state := infos[row.feature].state) == "stale" or row.token in judged
            ]
        removed = self._rows(
            statements.CLEAN, self._params(judged=judged, features=[row.feature for row in rows])
        )
        if removed:
            self._wake_waiters()
        return [  # the statement removes only rows of ``infos``
            CleanedEntry(feature, self._path(feature), "lock", infos[feature].state, True)
            for (feature,) in sorted(removed)
        ]

    def _path(self, feature: str) -> str:
        return f"{self._server}#{self.namespace}/{feature}"

    def is_done(self, feature: str) -> bool:
        return bool(self._rows(statements.IS_DONE, self._params(feature=feature))[0][0])

    def done(self, feature: str, pid: int, wait: ReleaseWait | None = None) -> str:
        """Waits for a connection slot, or a server restarting, while the lease of a lock this
        backend took lasts (``wait``: nothing refuses a done)."""
        done = partial(self._done, feature, pid)
        return self._while_full(done, self._lease_end(feature, pid), wait=wait)

    def _lease_end(self, feature: str, pid: int) -> float:
        """When ``pid``'s lease on ``feature`` ends if this backend took it (monotonic)."""
        return self._leases.get((feature, pid), -math.inf)

    def _done(self, feature: str, pid: int) -> str:
        # Race: a done committed, its answer lost on a full server: asked again, a new attempt id
        # would find it done by "someone else"; the unanswered id finds its own mark.
        lost_key = (feature, pid, threading.get_ident())
        attempt = self._unanswered.setdefault(lost_key, secrets.token_bytes(16))
        found = self._rows(statements.DONE, self._owner_params(feature, pid, attempt=attempt))
        self._unanswered.pop(lost_key, None)  # answered: the next done is new
        self._let_go(feature, pid, found, "marked done")
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(found[0][0]))

    def _owner_params(self, feature: str, pid: int, **values: Any) -> dict[str, Any]:
        """The parameters of a statement ``pid`` here may run as the holder."""
        place, start = ownership.place_key(), ownership.start_key(pid)
        owner = {"pid": pid, "host": self._host, "place": place, "start": start}
        return self._params(feature=feature, **owner, **values)

    def _let_go(self, feature: str, pid: int, found: list[Any], what: str | None) -> bool:
        """After ``pid``'s release, done or fail: the lease forgotten, waiters woken; if it wrote
        nothing (``found`` empty), why: another holds it, or nobody (a release: False)."""
        self._leases.pop((feature, pid), None)
        if found:
            self._wake_waiters()
            return True
        holder = self._holder(feature)
        if holder is not None:
            raise NotOwnerError(self._info(holder))
        if what is None:
            return False
        raise NotHeldError(feature, pid, what)

    def _wake_waiters(self) -> None:
        """Wake this schema's waiters after a committed change (best effort: they poll anyway)."""
        conn = self._conn
        if conn is None or conn.closed:
            return
        try:
            conn.execute(statements.WAKE, {"channel": self.channel}, prepare=False)
        except psycopg.Error as error:
            if error.sqlstate is None:
                # Lost or frozen (a server's refusal has one, and leaves it sound): reconnect.
                self._drop_connection()

    def reopen(self, feature: str) -> bool:
        return bool(self._rows(statements.REOPEN, self._params(feature=feature)))

    def _all_attempts(self) -> dict[str, Attempts]:
        found = {}
        for feature, failures, failed, last in self._rows(statements.ATTEMPTS, self._params()):
            entry = json.loads(last) if last else {}
            # The row keeps the count, whether it failed for good and the last attempt; the
            # limit is not kept (it closed the row when reached): the count stands for it.
            limit = int(failures) if failed else int(failures) + 1
            found[feature] = Attempts(int(failures), limit, (entry,) if entry else ())
        return found

    def attempts(self, feature: str) -> Attempts | None:
        return self._all_attempts().get(feature)

    def fail(
        self, feature: str, pid: int, reason: str, limit: int, wait: ReleaseWait | None = None
    ) -> Attempts:
        """Waits for a slot or a restart as :meth:`done` does."""
        failing = partial(self._fail, feature, pid, reason, limit)
        return self._while_full(failing, self._lease_end(feature, pid), wait=wait)

    def _fail(self, feature: str, pid: int, reason: str, limit: int) -> Attempts:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "at": time.time(),  # the epoch seconds a --retry-delay rest is counted from
            "host": self._host,
            "pid": pid,
            "reason": reason[:MAX_REASON_CHARS],
        }
        params = self._owner_params(
            feature, pid, entry=json.dumps(entry, sort_keys=True), limit=limit
        )
        # Run again after a lost answer (a restart ends the warm connection): it changes only
        # the holder's row, so one committed before is never counted twice; it says "not held".
        found = self._rows(statements.FAIL, params)
        self._let_go(feature, pid, found, "recorded as failed")
        return Attempts(int(found[0][0]), limit, (entry,))

    def finished_and_resting(
        self, features: Sequence[str], *, slot_wait: float | None = 0.0
    ) -> tuple[list[LockInfo], set[str], set[str], set[str]]:
        """As the protocol says; a restart is waited for as :meth:`try_claim` waits."""
        until = None if slot_wait is None else time.monotonic() + slot_wait
        look = partial(self._held_and_finished, features)
        return self._while_full(look, until, time.monotonic() + self.connect_timeout)

    def _held_and_finished(
        self, features: Sequence[str]
    ) -> tuple[list[LockInfo], set[str], set[str], set[str]]:
        held = [info for info in self.status() if info.held]
        rows = self._rows(statements.FINISHED_AND_RESTING, self._params(features=list(features)))
        failed = {name for name, flagged, _ in rows if flagged}
        done = {name for name, _, closed in rows if closed} - failed  # failed: ``done_at`` set
        return held, done, failed, {name for name, _, _ in rows} - failed - done

    def async_release_listener(self) -> Any:
        from mahabharatha.backends.postgres.aio import listener_for

        return listener_for(self)


def _unlocked(feature: str, state: str) -> LockInfo:
    return LockInfo(feature, State(state), None, None, None, None, Owner.UNKNOWN)
