"""The PostgreSQL backend's connection policy: one warm connection, made again when lost, let
go of between refreshes; slot waits; a crowded server; pinned transactions behind a pooler;
retries; the tables made on first use; one sentence per error."""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress
from functools import cache
from typing import Any, Final, TypeVar

import psycopg
from psycopg import errors as pg_errors

from mahabharatha import logs
from mahabharatha.backends.base import BackendError, ReleaseWait, ServerFullError
from mahabharatha.backends.postgres import statements
from mahabharatha.backends.postgres.connection import (
    SLOTS_TAKEN_SQLSTATE,
    Connection,
    first_line,
    password_of,
    server_of,
)
from mahabharatha.constants import (
    MIN_CONNECT_TIMEOUT_SECONDS,
    SCHEMA_ENV,
    SERIALIZATION_FIRST_PAUSE_SECONDS,
    SERIALIZATION_MAX_PAUSE_SECONDS,
    SLOT_PAUSE_SECONDS,
    SLOTS_FIRST_PAUSE_SECONDS,
    SLOTS_LOOK_SECONDS,
    SLOTS_MAX_PAUSE_SECONDS,
)
from mahabharatha.waiting import Deadline, backoff, jittered

CLIENT_ENCODING: Final = "UTF8"  # a SQL_ASCII database's own would make text come as bytes
# The lock tables' schema unless SCHEMA_ENV names another; every statement names it.
DEFAULT_SCHEMA: Final = "mahabharatha"
_NAMED_SCHEMA: Final = re.compile(  # where a statement names the default schema
    r"(?<=\bSCHEMA )mahabharatha\b|(?<=\bSCHEMA IF NOT EXISTS )mahabharatha\b"
    r"|\bmahabharatha(?=\.mahabharatha_)"
)
# A statement whose connection was lost is run again at most twice: a warm connection found
# closed, then a fresh one whose answer a reset cut off.
MAX_LOST_ANSWERS: Final = 2
# Refused for now by a server restarting, starting or shutting down; with no SQLSTATE, no
# server answered (unless libpq refused what it asked: a password not given, SSL it lacks).
_DOWN_SQLSTATES: Final = frozenset({"57P03", "57P01", "57P02"})
_LIBPQ_REFUSALS: Final = ("fe_sendauth:", "does not support SSL")

_T = TypeVar("_T")

_Connection = Connection  # the name the tests patch statements on
_BEGIN_PINNED: Final = f"{statements.BEGIN}; {statements.PIN_SETTINGS}"  # one round trip


class ServerDownError(BackendError):
    """No connection made, nothing sent: no server answering (stopped, restarting)."""


class Session:
    """A :class:`PostgresBackend`'s server connections and what it does with them."""

    def __init__(self, url: str, *, schema: str, connect_timeout: float) -> None:
        self._url = url
        self._server = server_of(url)
        self._password = password_of(url)
        self.schema: str = schema  # named in every statement (never ``search_path``)
        self.connect_timeout = connect_timeout
        self._conn: _Connection | None = None
        self._listener: _Connection | None = None
        self._slots_scarce = False  # were the server's connection slots nearly all taken?
        self._slots_seen = -math.inf  # when that was seen (monotonic)
        # How the slots taken are counted: the sessions; the role may not look at them: the
        # databases' backends; nor at those: None, and the server is crowded for all we know.
        self._slots_look: str | None = statements.SLOTS
        self._crowded_once = False  # seen crowded after a claim: claims let go from then on
        self.on_slot_wait: Callable[[ServerFullError], None] | None = None  # told once per wait
        self._told_slot_wait = False
        # (names, include_done) -> the registered claim for it, built for the current connection
        self._registered: dict[tuple[str, bool], bytes] = {}
        # Runs acquire, refresh, release_held and registered claims (:meth:`_on_kept_cursor`).
        self._kept_cursor: psycopg.RawCursor[Any] | None = None
        self._connecting = threading.Lock()  # one thread makes the shared connection
        # Race: threads sharing this backend: no transaction of several statements takes in
        # another thread's statement, no kept-cursor statement replaces an unread answer.
        self._one_operation = threading.RLock()

    def _connect_args(self, application_name: str) -> dict[str, Any]:
        """What every connection of this backend is made with (libpq's timeout: whole seconds)."""
        return {
            "autocommit": True,
            "connect_timeout": max(MIN_CONNECT_TIMEOUT_SECONDS, math.ceil(self.connect_timeout)),
            "application_name": application_name,
            "client_encoding": CLIENT_ENCODING,
        }

    def _connection(self) -> _Connection:
        conn = self._conn
        if conn is not None and not conn.closed:
            return conn
        # Race: threads on one backend finding no connection at once each made one; all but
        # the last stored were left open (a ResourceWarning, a server slot until collected).
        with self._connecting:
            if self._conn is None or self._conn.closed:
                self._conn = self._connect()
                self._registered.clear()  # prepared statements live and die with their connection
            return self._conn

    def _connect(self, application_name: str = "mahabharatha") -> _Connection:
        """A new autocommit connection, bounded by ``--connect-timeout`` and set up; a server
        with every slot taken is asked again, jittered, until the timeout."""
        pauses = _pauses(
            Deadline(self.connect_timeout), SLOTS_FIRST_PAUSE_SECONDS, SLOTS_MAX_PAUSE_SECONDS
        )
        while True:
            try:
                conn = _Connection.connect(self._url, **self._connect_args(application_name))
                break
            except psycopg.OperationalError as error:
                if not _out_of_slots(error) or not next(pauses, False):
                    raise
        conn.deadline = self.connect_timeout
        try:
            self._set_up_session(conn)
        except BaseException:
            _close(conn)
            raise
        return conn

    def _set_up_session(self, conn: _Connection) -> None:
        """Pin what settings may not decide for us; refuse a session that cannot keep a lock."""
        values = {"pid": conn.info.backend_pid, "locks": f"{self.schema}.mahabharatha_locks"}
        found = conn.execute(
            statements.SESSION_SET_UP, values, prepare=False, binary=True
        ).fetchone()
        assert found is not None
        in_recovery, read_only, direct, _pinned, old_layout = found
        if not direct:
            conn.pooled = True
            conn.prepare_threshold = None  # psycopg would prepare a statement from its 6th run
            # Every transaction begins READ COMMITTED (``_pinned``): a pooled server
            # connection may carry another client's default_transaction_isolation.
            conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
        if in_recovery:
            raise BackendError(
                f"lock server {self._server} (PostgreSQL): it is a standby (in recovery), which "
                "cannot keep locks: point the lock URL at the primary"
            )
        if read_only == "on":
            raise BackendError(
                f"lock server {self._server} (PostgreSQL): its sessions are read-only "
                "(default_transaction_read_only is on for this server, database or role), "
                "which cannot keep locks: point the lock URL at the primary, or turn it off"
            )
        if not old_layout:
            return
        try:  # older tables brought up to date, or ``lock init`` named if this role may not
            self._create_schema_on(conn)
        except (pg_errors.InsufficientPrivilege, pg_errors.ReadOnlySqlTransaction) as error:
            raise BackendError(
                f"lock server {self._server} (PostgreSQL): its lock tables in schema "
                f"{self.schema} are of an older mahabharatha and this role may not bring them up "
                f"to date ({first_line(error)}): run 'mahabharatha lock init' as the tables' owner"
            ) from None

    def crowded(self, within: float) -> bool:
        """Are the server's slots nearly all taken? Asked on the kept connection at most every
        ``within`` (never by connecting, nor behind a pooler); yes if the role may count none."""
        conn, look = self._conn, self._slots_look
        if look is None or conn is None or conn.closed or conn.pooled:
            return self._slots_scarce
        if time.monotonic() - self._slots_seen < within:
            return self._slots_scarce
        try:
            found = conn.execute(look, prepare=False).fetchone()
        except pg_errors.InsufficientPrivilege:
            return self._count_refused(look)
        except psycopg.Error:
            # Lost or frozen: the caller's next statement connects again (and says what is wrong).
            self._drop_connection()
            return self._slots_scarce
        assert found is not None
        usable, taken = found
        self._slots_seen = time.monotonic()
        self._slots_scarce = usable - taken <= max(1, usable // 10)  # a tenth free, at least one
        return self._slots_scarce

    def _count_refused(self, refused: str) -> bool:
        """The role may not run ``refused`` (its setting: never asked again): the next count now;
        none left: crowded from now on (a waiter that LISTENs may hold the last free slots)."""
        # Race: threads sharing the backend refused the first count at once: the later one took
        # the earlier one's move to the next for a refusal of it (crowded for good).
        if refused is statements.SLOTS:
            self._slots_look = statements.SLOTS_BY_DATABASE
            return self.crowded(0.0)
        self._slots_look = None
        self._slots_scarce = True
        return self._slots_scarce

    def _while_full(
        self,
        operation: Callable[[], _T],
        until: float | None,
        down_until: float = math.inf,
        *,
        wait: ReleaseWait | None = None,
    ) -> _T:
        """``operation``, again while the server has no free slot, until ``until`` (monotonic;
        ``None``: for ever), or is down (a restart: nothing sent) until ``down_until`` too;
        the first wait is logged and told once. ``wait``'s pause may raise to end it."""
        while True:
            try:
                return operation()
            except (ServerFullError, ServerDownError) as refused:
                full = isinstance(refused, ServerFullError)
                ends = min(math.inf if until is None else until, math.inf if full else down_until)
                if time.monotonic() >= ends:
                    raise
                if not self._told_slot_wait:
                    self._told_slot_wait = True
                    awaited = "a free connection slot" if full else "the server to answer"
                    logs.say(logs.WARNING, "%s; waiting for %s", refused, awaited)
                    if self.on_slot_wait is not None and isinstance(refused, ServerFullError):
                        self.on_slot_wait(refused)
            if wait is None:
                _pause_for_a_slot()
            else:
                wait.pause(jittered(SLOT_PAUSE_SECONDS))  # a signal to ``run``/``work`` ends it

    def _let_go_if_crowded(self) -> None:
        """After a claim won on a server once seen crowded: hold no connection while working."""
        self._crowded_once = self._crowded_once or self.crowded(SLOTS_LOOK_SECONDS)
        if self._crowded_once:
            self.close()

    def close(self) -> None:
        with self._connecting:  # Race: a thread making the shared connection at this moment
            self._drop_connection()
        self._drop_listener()

    def _drop_connection(self) -> None:
        _close(self._conn)
        self._conn = None

    def _error(self, error: BaseException, *, unsent: bool = False) -> BackendError:
        """One sentence naming the server (never the password) for what went wrong (``unsent``:
        while connecting, nothing of the operation sent)."""
        if isinstance(error, pg_errors._WaitTimeout) or "timeout expired" in str(error):
            reason = f"no answer within {self.connect_timeout:g} s"
        elif isinstance(error, pg_errors.InsufficientPrivilege):
            reason = (
                f"permission denied ({first_line(error)}); run 'mahabharatha lock init' as the "
                f"tables' owner and grant this role USAGE on schema {self.schema} and SELECT, "
                "INSERT, UPDATE, DELETE on its tables"
            )
        else:
            reason = first_line(error)
        if self._password:
            reason = reason.replace(self._password, "***")
        said = f"lock server {self._server} (PostgreSQL): {reason}"
        if isinstance(error, psycopg.OperationalError) and _out_of_slots(error):
            return ServerFullError(said)
        if unsent and isinstance(error, psycopg.OperationalError) and _server_down(error):
            return ServerDownError(said)
        return BackendError(said)

    def _run(
        self,
        operation: Callable[[_Connection], _T],
        *,
        pins_itself: bool = False,
    ) -> _T:
        """Run ``operation`` on the warm connection: a lost one replaced and the operation run
        again, a missing table created; anything else a :class:`BackendError`."""
        lost = 0
        created = False
        rolled_back: Iterator[bool] | None = None  # made at the first rollback: not on the hot path
        while True:
            try:
                conn = self._connection()
            except psycopg.Error as error:  # nothing was sent: no answer to look for
                raise self._error(error, unsent=True) from None
            try:
                with self._one_operation:
                    if conn.closed:
                        # Race: let go of by another thread in its turn after we took it (an
                        # async waiter's look on a crowded server): nothing was sent, connect
                        # again. Sent, it was a lost answer; three failed the call.
                        continue
                    if conn.pooled and not pins_itself:
                        return self._pinned(conn, operation)
                    return operation(conn)
            except (pg_errors.SerializationFailure, pg_errors.DeadlockDetected) as error:
                # Race: a concurrent transaction made the server roll the statement back: nothing
                # was done and the connection is sound; run it again after a pause.
                rolled_back = rolled_back or _pauses(
                    Deadline(self.connect_timeout),
                    SERIALIZATION_FIRST_PAUSE_SECONDS,
                    SERIALIZATION_MAX_PAUSE_SECONDS,
                )
                if not next(rolled_back, False):
                    raise self._error(error) from None
            except pg_errors.UndefinedTable as error:
                if created:
                    raise self._error(error) from None
                created = True
                if conn.pooled:
                    # Race: a pooler may keep the failed transaction's server connection for this
                    # client a while (a pool of one: for ever): let go of it first.
                    self._drop_connection()
                self._create_schema()
            except pg_errors._WaitTimeout as error:
                self._drop_connection()  # Race: an answer may still come; the state is unknown
                raise self._error(error) from None
            except (psycopg.OperationalError, psycopg.InterfaceError) as error:
                self._drop_connection()
                lost += 1
                # Race: the server may have committed before the answer was lost: the retry
                # carries the same attempt id (or token) and finds its own work, never a second.
                if lost > MAX_LOST_ANSWERS:
                    raise self._error(error) from None
            except psycopg.Error as error:
                raise self._error(error) from None

    @staticmethod
    def _pinned(conn: _Connection, operation: Callable[[_Connection], _T]) -> _T:
        """``operation`` in a transaction that first pins its settings (a pooled connection may
        carry another client's ``SET``). Race: no pipeline, whose trailing Flush would take the
        server connection again after COMMIT and starve the pool's other clients."""
        try:
            conn.execute(_BEGIN_PINNED, prepare=False)
            answer = operation(conn)
            conn.execute("COMMIT", prepare=False)
        except BaseException:
            # Race: a pooler keeps the server connection of a client inside a transaction:
            # a failed one is ended now, never left open until our next operation.
            with suppress(psycopg.Error, OSError):
                conn.rollback()
            raise
        return answer

    def _rows(self, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        statement = self._sql(query)
        return self._run(lambda conn: conn.execute(statement, params, binary=True).fetchall())

    def _hot(
        self, statement: str, values: Sequence[Any], sent: list[float]
    ) -> list[tuple[Any, ...]]:
        """The acquire or refresh on the kept cursor, prepared, in binary, as :meth:`_run`."""
        text = self._sql(statement)

        def run(conn: _Connection) -> list[tuple[Any, ...]]:
            sent.append(time.monotonic())  # connected: a lease it sets runs from no earlier
            return self._on_kept_cursor(conn, text, values)

        return self._run(run)

    def _on_kept_cursor(
        self, conn: _Connection, statement: str | bytes, values: Sequence[Any]
    ) -> list[tuple[Any, ...]]:
        """Run a prepared ``$n`` statement on the cursor kept per connection, read its rows in
        binary (inside :meth:`_run`: one thread from statement to read)."""
        prepare = not conn.pooled  # Race: a pooler runs another client's same-named statement
        cursor = self._kept_cursor
        if cursor is None or cursor.connection is not conn:
            cursor = self._kept_cursor = psycopg.RawCursor(conn)
        return cursor.execute(statement, values, prepare=prepare, binary=True).fetchall()

    def _sql(self, statement: str) -> str:
        """``statement`` naming this backend's schema (the statements name ``mahabharatha``)."""
        return statement if self.schema == DEFAULT_SCHEMA else _in_schema(statement, self.schema)

    def _newer_schema(self, version: int) -> BackendError:
        return BackendError(
            f"lock server {self._server} (PostgreSQL): its lock tables have schema version "
            f"{version}, newer than this mahabharatha knows ({statements.SCHEMA_VERSION}): "
            "upgrade it"
        )

    def _create_schema(self, *, repair: bool = False) -> int | None:
        """The tables made (:meth:`_create_schema_on`), any failure one sentence; their version."""
        # Race: other threads' statements on the shared connection would run inside this
        # transaction (never committed): the tables are made on a connection of their own.
        try:
            with self._connect() as conn:
                return self._create_schema_on(conn, repair=repair)
        except psycopg.Error as cause:
            raise self._error(cause) from None

    def _create_schema_on(self, conn: _Connection, *, repair: bool = False) -> int | None:
        """Make what is missing; a lost token sequence only with ``repair`` (``lock init``),
        above the rows' tokens: never silently at 1 (an old holder's token again)."""
        advisory, *ddl = (self._sql(statement) for statement in statements.SCHEMA_DDL)
        with conn.transaction():
            if conn.pooled:
                conn.execute(statements.PIN_SETTINGS, prepare=False)
            conn.execute(advisory)  # Race: two first uses creating the tables at once
            exists = conn.execute(self._sql(statements.TABLE_EXISTS)).fetchone() == (True,)
            marked = {"schema": self.schema, "mark": statements.NAMED_BY_SCHEMA}
            # Refused while this role's older tables are elsewhere (two holders of one feature).
            if not exists and (old := conn.execute(statements.OLD_TABLES, marked).fetchone()):
                raise BackendError(
                    f"lock server {self._server} (PostgreSQL): this role's lock tables of an "
                    f"older mahabharatha are in schema {old[0]}: set {SCHEMA_ENV}={old[0]} to "
                    "keep them there, or move them (ALTER TABLE/SEQUENCE ... SET SCHEMA "
                    f"{self.schema}) and run 'mahabharatha lock init'"
                )
            lost = (statements.SEQUENCE_MISSING, statements.ROWS_EXIST)
            if (
                not repair
                and exists
                and all(conn.execute(self._sql(query)).fetchone() == (True,) for query in lost)
            ):
                raise BackendError(
                    f"lock server {self._server} (PostgreSQL): the token sequence "
                    "mahabharatha_lock_token is missing next to existing locks (dropped, or the "
                    "table restored without it): run 'mahabharatha lock init' to make it again "
                    "above every token given out"
                )
            missing = conn.execute(statements.SCHEMA_MISSING, {"schema": self.schema})
            if missing.fetchone() == (True,):
                conn.execute(self._sql(statements.CREATE_SCHEMA))
            for statement in ddl:
                conn.execute(statement)
            if repair:
                conn.execute(self._sql(statements.SEQUENCE_ABOVE_ROWS))
            found = conn.execute(self._sql(statements.SCHEMA_VERSION_QUERY)).fetchone()
        version = found[0] if found else None
        if version is not None and version > statements.SCHEMA_VERSION:
            raise self._newer_schema(int(version))
        return version

    def _drop_listener(self) -> None:
        _close(self._listener)
        self._listener = None


@cache
def _in_schema(statement: str, schema: str) -> str:
    return _NAMED_SCHEMA.sub(schema, statement)  # a schema name has no backslash


def _pauses(deadline: Deadline, first: float, most: float) -> Iterator[bool]:
    """Each ``next`` pauses (backing off, ending at ``deadline``) and is True; then ends."""
    for pause in backoff(first, most, math.inf):
        if deadline.passed():
            return
        time.sleep(deadline.cap(pause))
        yield True


def _close(conn: _Connection | None) -> None:
    if conn is not None:
        with suppress(psycopg.Error, OSError):
            conn.close()


def _pause_for_a_slot() -> None:
    time.sleep(jittered(SLOT_PAUSE_SECONDS))


def _out_of_slots(error: psycopg.OperationalError) -> bool:
    """Refused for want of a free slot: SQLSTATE 53300, whatever the limit or the message's
    language (the English text only for a refusal without a SQLSTATE)."""
    sqlstate = getattr(error, "sqlstate", None)
    if sqlstate is not None:
        return bool(sqlstate == SLOTS_TAKEN_SQLSTATE)
    text = str(error)
    return "too many clients" in text or "remaining connection slots are reserved" in text


def _server_down(error: psycopg.OperationalError) -> bool:
    """Refused for now by a server restarting, or answered by none (:data:`_DOWN_SQLSTATES`)."""
    sqlstate = getattr(error, "sqlstate", None)
    if sqlstate is None:
        return not any(refusal in str(error) for refusal in _LIBPQ_REFUSALS)
    return sqlstate in _DOWN_SQLSTATES
