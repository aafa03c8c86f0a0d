"""Locks across hosts: a lease table in PostgreSQL (psycopg 3), behind :class:`LockBackend`.

Imported only for a ``postgresql://`` or ``postgres://`` URL: nothing else in the package imports
psycopg. One row per (namespace, feature) in ``mahabharatha_locks`` is that feature's lock, its
done mark and its token history (a released row stays, with no holder: its next holder's token is
drawn while the row is locked, so tokens of a feature only ever grow). Every operation is one
statement (claim: two when it first meets features the table has no row for; a list claimed from
again is registered: prepared on the connection with the names written in, planned once); every
expiry is judged by the server's clock (``now()``), never the client's. The design, the
statements and what a network partition does: ``design/postgres.md``.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Final, TypeVar

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg import pq, sql
except ImportError as missing:  # pragma: no cover - exercised by the CLI's own test
    raise ImportError("a postgresql:// lock URL needs psycopg 3, the postgres extra") from missing

from mahabharatha.backends.base import (
    AcquireResult,
    Attempts,
    BackendError,
    Capability,
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
from mahabharatha.backends.postgres.connection import (
    SLOTS_TAKEN_SQLSTATE,
    Connection,
    first_line,
    password_of,
    server_of,
)
from mahabharatha.backends.postgres.namespace import derive_namespace
from mahabharatha.constants import (
    CONNECT_TIMEOUT_SECONDS,
    NAMESPACE_ENV,
    RECHECK_SECONDS,
    SCHEMA_ENV,
)
from mahabharatha.names import feature_folders
from mahabharatha.owner import ownership
from mahabharatha.states import State

SCHEMA_VERSION: Final = 2
"""The tables' layout; ``mahabharatha_schema`` records it (a newer one is refused, never
rewritten)."""
DEFAULT_LEASE_SECONDS: Final = 7200.0
"""acquire and claim: their owner (a shell, a worker script) cannot refresh, so the 2 hours of
the file backend."""
RUN_LEASE_SECONDS: Final = 60.0
"""``lock run`` and ``FeatureLock`` refresh every third of it: a dead host's lock is free again
within a minute, and a heartbeat may miss twice (a server restart, a lost connection) first."""
CLIENT_ENCODING: Final = "UTF8"
"""Always the package's choice: on a ``SQL_ASCII`` database (initdb's default under the C locale)
the database's own makes psycopg answer ``bytes`` for text (a refresh that never matched its
feature, ``check`` naming ``b'G-0'``)."""
MAX_NAMESPACE_BYTES: Final = 200
"""A namespace travels in every release's NOTIFY payload, which the server caps at 8,000 bytes
(``payload string too long``: release, ``--force`` and ``done`` failed); 200 is plenty for a
repository's ``host/org/repo``."""
MIN_CONNECT_TIMEOUT_SECONDS: Final = 2
"""libpq (and psycopg) round connect_timeout below 2 s up to 2 s."""
DEFAULT_SCHEMA: Final = "mahabharatha"
"""The schema of the lock tables unless ``MAHABHARATHA_LOCK_SCHEMA`` (or ``schema=``) names
another: every statement names it, so no ``search_path`` decides where the tables are."""
_SCHEMA_NAME: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")
"""A schema name needing no quotes (it is written into statements and into regclass text)."""
_NAMED_SCHEMA: Final = re.compile(
    r"(\bSCHEMA (?:IF NOT EXISTS )?)mahabharatha()\b|()\bmahabharatha(\.mahabharatha_)"
)
"""Where a statement names the default schema (never a value: those are parameters)."""
SERIALIZATION_FIRST_PAUSE_SECONDS: Final = 0.01
SERIALIZATION_MAX_PAUSE_SECONDS: Final = 0.2
"""Between two runs of a statement the server rolled back as a serialization failure or a
deadlock (SQLSTATE 40001, 40P01): from 10 ms, doubling, jittered, until ``--connect-timeout``."""
NOTIFY_CHANNEL: Final = "mahabharatha_release"
"""The channel of the default schema's wake-ups (one for every release; no payload)."""


def channel_of(schema: str) -> str:
    """The wake-up channel of ``schema``: a channel per schema, so one team's releases never
    wake another's waiters (cut to PostgreSQL's 63-byte names; a shared prefix costs hints)."""
    return f"{schema[:55]}_release"


WAKE_UP_INTERVAL_SECONDS: Final = 0.25
"""A waiter looks at most once per this long however many wake-ups come (anyone who may connect
may NOTIFY the channel: a flood of forged ones drove one waiter to 1,271 statements in 3 s); the
slice of an acquire's wait (``locks.WAKE_UP_SLICE_SECONDS``)."""
SLOTS_FIRST_PAUSE_SECONDS: Final = 0.02
SLOTS_MAX_PAUSE_SECONDS: Final = 0.5
"""Between two connection attempts refused for want of a slot: from 20 ms, doubling, to 0.5 s
(jittered: a crowd of holders starting at once does not knock in step)."""
MAX_LOST_ANSWERS: Final = 2
"""A statement whose connection was lost under it is run again at most twice: a warm connection
found closed (an idle timeout, a restart), then a fresh one whose answer a reset cut off."""
MAX_REASON_CHARS: Final = 200
"""A failed attempt's reason is cut to this (as on files): one line, never a whole log."""
MAX_CLAIM_ROUNDS: Final = 4
"""A claim statement finds rows missing at most once per new feature list; a few rounds bound it."""
MAX_REGISTERED_LISTS: Final = 8
"""Feature lists a connection keeps a registered claim for: a pool claims from one list, and a
list that changes often falls back to the statement that sends it (never more than this many
statements of a list's size are built per connection)."""

_T = TypeVar("_T")

# --------------------------------------------------------------------------- the statements
# Every value is a parameter, except a registered claim's namespace and names, which psycopg
# quotes (``sql.Literal``); no input is ever spliced into SQL text by hand.

NAMED_BY_SCHEMA: Final = "mahabharatha locks, named with their schema"
"""The lock table's comment, set by every creation and upgrade since issue 27: tables without
it in another schema were made by an older mahabharatha through its ``search_path``."""
_CREATE_SCHEMA: Final = "CREATE SCHEMA IF NOT EXISTS mahabharatha"
"""Only when the schema is missing: even with ``IF NOT EXISTS`` the server asks for CREATE on
the database, which the tables' owner may lack."""
_SCHEMA_MISSING: Final = "SELECT pg_catalog.to_regnamespace(%(schema)s) IS NULL"

_SCHEMA_DDL: Final = (
    # Race: two first uses creating the tables at once
    "SELECT pg_catalog.pg_advisory_xact_lock(7243016210)",
    # As ``public`` was: the tables' own grants say who may use them.
    "GRANT USAGE ON SCHEMA mahabharatha TO PUBLIC",
    "CREATE TABLE IF NOT EXISTS mahabharatha.mahabharatha_schema (version integer PRIMARY KEY)",
    "CREATE SEQUENCE IF NOT EXISTS mahabharatha.mahabharatha_lock_token AS bigint",
    """CREATE TABLE IF NOT EXISTS mahabharatha.mahabharatha_locks (
        namespace text NOT NULL,
        feature text COLLATE "C" NOT NULL,
        pid integer,
        details bytea,
        host text,
        attempt bytea,
        lease interval,
        acquired_at timestamptz,
        refreshed_at timestamptz,
        expires_at timestamptz,
        token bigint,
        done_at timestamptz,
        prev_pid integer,
        prev_details bytea,
        prev_refreshed_at timestamptz,
        prev_expires_at timestamptz,
        PRIMARY KEY (namespace, feature)
    )""",
    "INSERT INTO mahabharatha.mahabharatha_schema (version) VALUES (1) ON CONFLICT DO NOTHING",
    # Version 2: a pool's failed attempts (``lock fail``), in the row.
    """ALTER TABLE mahabharatha.mahabharatha_locks
        ADD COLUMN IF NOT EXISTS failures integer NOT NULL DEFAULT 0,
        ADD COLUMN IF NOT EXISTS failed boolean NOT NULL DEFAULT false,
        ADD COLUMN IF NOT EXISTS last_failure text""",
    "INSERT INTO mahabharatha.mahabharatha_schema (version) VALUES (2) ON CONFLICT DO NOTHING",
    f"COMMENT ON TABLE mahabharatha.mahabharatha_locks IS '{NAMED_BY_SCHEMA}'",
)

_EPOCHS: Final = """date_part('epoch', refreshed_at), date_part('epoch', expires_at),
    date_part('epoch', now())"""
"""Times as epoch seconds. ``date_part`` answers a float8 directly, the same value as
``extract(epoch FROM t)::float8`` (microseconds are exact in a float8 and both round once),
which since PostgreSQL 14 computes a ``numeric`` first: about 7 µs of server time per acquire."""

_TAKE_SET: Final = """pid = %(pid)s, details = %(details)s, host = %(host)s, attempt = %(attempt)s,
    lease = make_interval(secs => %(lease)s), acquired_at = now(), refreshed_at = now(),
    expires_at = now() + make_interval(secs => %(lease)s),
    token = greatest(nextval('mahabharatha.mahabharatha_lock_token'), l.token + 1),
    prev_pid = l.pid, prev_details = l.details, prev_refreshed_at = l.refreshed_at,
    prev_expires_at = l.expires_at"""
"""Taking a row: the new holder, a token drawn while the row is locked and never below the
row's last one plus one (a sequence reset, or restored behind the table, would otherwise hand
out a token a still-working old holder has: its ``verify`` passed), and the old holder kept for
the audit trail (``replaced``)."""

_TAKEABLE: Final = """(l.pid IS NULL OR l.expires_at < now() OR l.token = ANY(%(judged)s::bigint[])
    OR l.attempt = %(attempt)s)"""
"""Free, expired by the server's clock, judged dead by the client (exactly that token), or our
own attempt whose answer a lost connection swallowed."""


def _rested(row: str) -> str:
    """The row's rest after its last failed attempt (``--retry-delay``: ``rest`` seconds) is
    over by the server's clock. The attempt's time is the one its record keeps (``at``: the
    server's since ``_FAIL`` writes it; an older client's own, which counts no later than now)."""
    return f"""({row}.last_failure IS NULL OR date_part('epoch', now()) >= %(rest)s
        + least(coalesce(({row}.last_failure::jsonb ->> 'at')::float8, 0),
            date_part('epoch', now())))"""


_RETURNING: Final = f"""l.feature, l.token, {_EPOCHS}, prev_pid, prev_details,
    date_part('epoch', prev_refreshed_at), date_part('epoch', prev_expires_at)"""

_ACQUIRE: Final = f"""
INSERT INTO mahabharatha.mahabharatha_locks AS l
    (namespace, feature, pid, details, host, attempt, lease, acquired_at, refreshed_at,
     expires_at, token)
VALUES (%(ns)s, %(feature)s, %(pid)s, %(details)s, %(host)s, %(attempt)s,
    make_interval(secs => %(lease)s), now(), now(), now() + make_interval(secs => %(lease)s),
    nextval('mahabharatha.mahabharatha_lock_token'))
ON CONFLICT (namespace, feature) DO UPDATE SET {_TAKE_SET}
WHERE {_TAKEABLE}
RETURNING {_RETURNING}"""

_WANTED: Final = """wanted AS (
    SELECT w.feature, w.ord
    FROM unnest(string_to_array(%(names)s, pg_catalog.chr(10))) WITH ORDINALITY AS w(feature, ord)
)"""
"""The names travel as one text joined by newlines (no valid feature name has one): psycopg
adapts a 1,000-element list parameter in over a millisecond, a text in microseconds."""

_CLAIM_CHECKED: Final = f"""
WITH {_WANTED}, missing AS (
    SELECT count(*) AS n FROM wanted w WHERE NOT EXISTS (
        SELECT FROM mahabharatha.mahabharatha_locks m
        WHERE m.namespace = %(ns)s AND m.feature = w.feature)
), pick AS (
    SELECT l.namespace, l.feature
    FROM mahabharatha.mahabharatha_locks l JOIN wanted w USING (feature)
    WHERE l.namespace = %(ns)s AND (SELECT n FROM missing) = 0 AND {_TAKEABLE}
        AND (%(include_done)s OR l.done_at IS NULL OR l.attempt = %(attempt)s) AND {_rested("l")}
    ORDER BY l.attempt IS NOT DISTINCT FROM %(attempt)s DESC, w.ord
    LIMIT 1
    FOR UPDATE OF l SKIP LOCKED
), taken AS (
    UPDATE mahabharatha.mahabharatha_locks l SET {_TAKE_SET}
    FROM pick WHERE l.namespace = pick.namespace AND l.feature = pick.feature
    RETURNING {_RETURNING}
)
SELECT (SELECT n FROM missing), taken.* FROM (VALUES (1)) AS one LEFT JOIN taken ON true"""
"""The first takeable feature in the given order, in one statement. ``FOR UPDATE SKIP LOCKED``:
a row another claimer is taking at this moment is passed over, not waited for; the row's
conditions are checked again on its latest version once locked (a feature just marked done by
its holder is never handed out). Rows must exist for that: when some are missing nothing is
taken and the caller creates them (``_ENSURE_ROWS``), once. Our own earlier attempt (an answer
lost with its connection) comes first: a retry never takes a second feature."""

_CLAIM_SORTED: Final = f"""
WITH pick AS (
    SELECT l.namespace, l.feature FROM mahabharatha.mahabharatha_locks l
    WHERE l.namespace = %(ns)s AND l.feature = ANY(string_to_array(%(names)s, pg_catalog.chr(10)))
        AND {_TAKEABLE} AND (%(include_done)s OR l.done_at IS NULL) AND {_rested("l")}
    ORDER BY l.feature
    LIMIT 1
    FOR UPDATE OF l SKIP LOCKED
), taken AS (
    UPDATE mahabharatha.mahabharatha_locks l SET {_TAKE_SET}
    FROM pick WHERE l.namespace = pick.namespace AND l.feature = pick.feature
    RETURNING {_RETURNING}
)
SELECT 0, taken.* FROM (VALUES (1)) AS one LEFT JOIN taken ON true"""
"""The hot path of a worker pool: names in sorted order (a bare ``claim``: every feature folder
by name) whose rows this process has seen exist. The primary key's order is the names' (the
column is ``COLLATE "C"``), so the scan walks the index and stops at the first takeable row."""

_REGISTERED_PARAMS: Final = ("pid", "details", "host", "attempt", "lease", "rest")
"""The parameters of a registered claim, in their ``$n`` order."""


def _numbered(text: str, names: Sequence[str]) -> str:
    """``text`` with its ``%(name)s`` parameters written ``$1``, ``$2``... in ``names``' order."""
    for number, name in enumerate(names, start=1):
        text = text.replace(f"%({name})s", f"${number}")
    return text


_CLAIM_REGISTERED: Final = _numbered(
    f"""
UPDATE mahabharatha.mahabharatha_locks l SET {_TAKE_SET}
WHERE l.namespace = {{ns}} AND l.feature = (
    SELECT p.feature FROM mahabharatha.mahabharatha_locks p
    WHERE p.namespace = {{ns}} AND p.feature = ANY({{names}})
        AND (p.pid IS NULL OR p.expires_at < now()){{not_done}} AND {_rested("p")}
    ORDER BY p.feature
    LIMIT 1
    FOR UPDATE SKIP LOCKED)
RETURNING {_RETURNING}""",
    _REGISTERED_PARAMS,
)
"""The claim of a registered list: ``_CLAIM_SORTED`` with the namespace and the names written
into the statement (quoted by psycopg's ``sql.Literal``) and prepared on the connection, so the
server parses and plans the 1,000 names once per connection, not once per claim. Every value
that changes between claims (holder, attempt, lease) is a ``$n`` parameter of the SET list, and
the rest (``--retry-delay``) one of a row filter after the index scan: no plan depends on them,
so the server's plan cache keeps one generic plan (its cost equals the custom plans' and saves
their planning). It runs on a ``RawCursor``: psycopg passes the text
as it is, where a ``%(name)s`` query of this size would be parsed again on every claim (psycopg
caches that parse only for texts up to 4 kB). Takeable is free or expired: no judged tokens (a
``--reclaim-dead`` claim sends its list) and no earlier attempt (a retry uses
``_CLAIM_CHECKED``, which puts it first). An empty answer: nothing takeable among the rows
that exist; the caller then asks ``_CLAIM_CHECKED``, which also counts names without a row (the
list is registered only after a claim saw them all, but rows can be deleted behind it)."""

_ENSURE_ROWS: Final = """
INSERT INTO mahabharatha.mahabharatha_locks (namespace, feature)
SELECT %(ns)s, w.feature FROM unnest(string_to_array(%(names)s, pg_catalog.chr(10))) AS w(feature)
ORDER BY w.feature
ON CONFLICT DO NOTHING"""
"""Rows with no holder for features never locked before (sorted: concurrent claimers insert in
one order and cannot deadlock)."""

_WAKE: Final = "SELECT pg_catalog.pg_notify(%(channel)s, '')"
"""The wake-up sent after a release, a done, a failed attempt or a clean has committed, in a
transaction of its own (:meth:`PostgresBackend._wake_waiters`; a release of a held lock sends
both in one pipeline: :meth:`PostgresBackend._release_then_wake`): a notification that cannot be
queued (the cluster's queue full: one listener in an open transaction anywhere holds its tail)
never undoes or stops the release. No payload: any role that may connect to any database may
LISTEN, and a name in it would tell every team's feature names."""


def _listen(verb: str, channel: str) -> sql.Composed:
    """``LISTEN``/``UNLISTEN`` of ``channel``, quoted as an identifier (it takes no parameter)."""
    return sql.SQL("{} {}").format(sql.SQL(verb), sql.Identifier(channel))


_LET_GO: Final = "pid = NULL, details = NULL, host = NULL, attempt = NULL"

_RELEASE_HELD: Final = f"""
UPDATE mahabharatha.mahabharatha_locks SET {_LET_GO}
WHERE namespace = %(ns)s AND feature = %(feature)s AND token = %(token)s AND pid IS NOT NULL
RETURNING 1"""

_ACQUIRE_PARAMS: Final = ("ns", "feature", "pid", "details", "host", "attempt", "lease", "judged")
"""The parameters of ``_ACQUIRE`` (and of a take's parameter dict), in their ``$n`` order."""
_ACQUIRE_NUMBERED: Final = _numbered(_ACQUIRE, _ACQUIRE_PARAMS)
_RELEASE_HELD_NUMBERED: Final = _numbered(_RELEASE_HELD, ("ns", "feature", "token"))
"""The hot path's two statements with ``$n`` parameters, for a kept ``RawCursor``
(``PostgresBackend._hot``): no per-call parse of ``%(name)s`` nor reordering of a dict."""

_OWNER_COULD_BE: Final = ownership.could_own_sql("details")
"""``ownership.could_own`` on the row's details, in the statement that removes the lock (judged
and removed in one step), generated from the details' layout: details of our format that record
a boot and a PID namespace must record ours (``place``: ``ownership.place_key``; NULL when ours
is unknown, and then they never match) and, when they record a start time, the one the pid runs
with now (``start``: ``ownership.start_key``; NULL when it is not running). Rows without such
details keep the pid and host rule. ``tests/postgres/test_owner_rule_sql.py`` checks it
against the Python rule on many details."""

_RELEASE_PID: Final = f"""
UPDATE mahabharatha.mahabharatha_locks SET {_LET_GO}
WHERE namespace = %(ns)s AND feature = %(feature)s AND pid IS NOT NULL
    AND (%(force)s OR (pid = %(pid)s AND host IS NOT DISTINCT FROM %(host)s
        AND {_OWNER_COULD_BE}))
RETURNING 1"""

_REFRESH: Final = f"""
UPDATE mahabharatha.mahabharatha_locks SET refreshed_at = now(), expires_at = now() + lease
WHERE namespace = %(ns)s AND feature = %(feature)s AND token = %(token)s AND pid IS NOT NULL
    AND expires_at >= now()
RETURNING {_EPOCHS}"""
"""Only an unexpired lock is renewed: once its lease has run out by the server's clock it is
lost, even if nobody took it yet (the lost-lock rule)."""

_DONE: Final = f"""
UPDATE mahabharatha.mahabharatha_locks
SET pid = NULL, details = NULL, host = NULL, attempt = %(attempt)s,
    done_at = CASE WHEN pid IS NULL THEN done_at ELSE now() END
WHERE namespace = %(ns)s AND feature = %(feature)s AND (
    (pid = %(pid)s AND host IS NOT DISTINCT FROM %(host)s AND {_OWNER_COULD_BE})
    OR (pid IS NULL AND done_at IS NOT NULL AND attempt = %(attempt)s))
RETURNING date_part('epoch', done_at)"""
"""Mark done and release in one statement: both or neither. The row keeps the call's attempt
id: a retry after a lost answer finds its own done mark (and answers it), never "not held"."""

_SELECT_ROWS: Final = f"""
SELECT feature, pid, details, host, token, done_at IS NOT NULL, {_EPOCHS}
FROM mahabharatha.mahabharatha_locks WHERE namespace = %(ns)s"""

_SELECT_ONE: Final = _SELECT_ROWS + " AND feature = %(feature)s"
_SELECT_HELD: Final = _SELECT_ROWS + ' AND pid IS NOT NULL ORDER BY feature COLLATE "C"'
_SELECT_WANTED: Final = (
    _SELECT_ROWS + " AND pid IS NOT NULL AND feature = ANY(%(features)s::text[])"
)
_SELECT_ALL: Final = _SELECT_ROWS + ' ORDER BY feature COLLATE "C"'

_VERIFY: Final = """
SELECT EXISTS (SELECT FROM mahabharatha.mahabharatha_locks
    WHERE namespace = %(ns)s AND feature = %(feature)s
    AND token = %(token)s AND pid IS NOT NULL AND expires_at >= now())"""

_IS_DONE: Final = """
SELECT EXISTS (SELECT FROM mahabharatha.mahabharatha_locks
    WHERE namespace = %(ns)s AND feature = %(feature)s
    AND done_at IS NOT NULL)"""

_REOPEN: Final = """
UPDATE mahabharatha.mahabharatha_locks
SET done_at = NULL, failures = 0, failed = false, last_failure = NULL
WHERE namespace = %(ns)s AND feature = %(feature)s AND (done_at IS NOT NULL OR failures > 0)
RETURNING 1"""

_FAIL: Final = f"""
UPDATE mahabharatha.mahabharatha_locks
SET {_LET_GO}, failures = failures + 1,
    last_failure = (%(entry)s::jsonb
        || jsonb_build_object('at', extract(epoch FROM now())::numeric))::text,
    failed = failures + 1 >= %(limit)s,
    done_at = CASE WHEN failures + 1 >= %(limit)s THEN now() ELSE done_at END
WHERE namespace = %(ns)s AND feature = %(feature)s AND pid = %(pid)s
    AND host IS NOT DISTINCT FROM %(host)s AND {_OWNER_COULD_BE}
RETURNING failures"""
"""Record a failed attempt and release in one statement: both or neither. A feature whose
attempts reach the pool's limit is closed the way a done one is (``done_at``: every claim
statement already skips it) and flagged ``failed``, which tells the two apart. The record's
``at`` is the server's clock (the rest a claim judges, :func:`_rested`): hosts' clocks differ."""

_RETRIED: Final = """
SELECT feature FROM mahabharatha.mahabharatha_locks
WHERE namespace = %(ns)s AND feature = ANY(%(features)s::text[]) AND pid IS NULL
    AND done_at IS NULL AND failures > 0"""

_ATTEMPTS: Final = """
SELECT feature, failures, failed, last_failure FROM mahabharatha.mahabharatha_locks
WHERE namespace = %(ns)s AND failures > 0"""

_CLEAN: Final = f"""
UPDATE mahabharatha.mahabharatha_locks SET {_LET_GO}
WHERE namespace = %(ns)s AND pid IS NOT NULL AND feature = ANY(%(features)s::text[])
    AND (expires_at < now() OR token = ANY(%(judged)s::bigint[]))
RETURNING feature"""

_SCHEMA_VERSION_QUERY: Final = "SELECT max(version) FROM mahabharatha.mahabharatha_schema"

_SEQUENCE_MISSING: Final = "SELECT to_regclass('mahabharatha.mahabharatha_lock_token') IS NULL"
_TABLE_EXISTS: Final = "SELECT to_regclass('mahabharatha.mahabharatha_locks') IS NOT NULL"
_ROWS_EXIST: Final = "SELECT EXISTS (SELECT FROM mahabharatha.mahabharatha_locks)"
_SEQUENCE_ABOVE_ROWS: Final = """
SELECT setval('mahabharatha.mahabharatha_lock_token', greatest(
    (SELECT max(token) FROM mahabharatha.mahabharatha_locks),
    (SELECT last_value FROM mahabharatha.mahabharatha_lock_token)))"""
"""``lock init`` puts a sequence made again (dropped, or a table restored without it) above every
token the rows hold."""

_SLOTS: Final = """
WITH sessions AS (
    SELECT a.usesysid, a.datid FROM pg_stat_get_activity(NULL) AS a
    WHERE a.backend_type = 'client backend'
        OR (a.backend_type IS NULL AND a.usesysid IS NOT NULL AND a.datid IS NOT NULL)
), limits AS (
    SELECT current_setting('max_connections')::int
        - current_setting('superuser_reserved_connections')::int
        - coalesce(current_setting('reserved_connections', true)::int, 0) AS usable,
        (SELECT count(*) FROM sessions)::int AS taken
    UNION ALL
    SELECT r.rolconnlimit, (SELECT count(*) FROM sessions WHERE usesysid = r.oid)::int
    FROM pg_roles AS r WHERE r.rolname = session_user AND r.rolconnlimit >= 0
    UNION ALL
    SELECT d.datconnlimit, (SELECT count(*) FROM sessions WHERE datid = d.oid)::int
    FROM pg_database AS d WHERE d.datname = current_database() AND d.datconnlimit >= 0
)
SELECT usable, taken FROM limits ORDER BY usable - taken, usable LIMIT 1"""
"""The tightest of the limits on this role's connections, as (slots, taken): the server's
slots an ordinary role may use, the login role's ``CONNECTION LIMIT`` (``session_user``: a
``SET ROLE`` does not move the count) and the database's, each with
the client sessions that count against it. Another role's session shows a ``NULL``
``backend_type`` to a role that may not see it, and is counted when it has a user and a
database (the server's own processes lack one or both: the logical replication launcher has a
user, no database); a parallel or replication worker is counted too, the error on the side of
"taken". The function under ``pg_stat_activity``, without the view's joins: a third of its
time."""

_SESSION_SET_UP: Final = """
SELECT pg_catalog.pg_is_in_recovery(), pg_catalog.current_setting('transaction_read_only'),
    d.direct,
    CASE WHEN d.direct THEN pg_catalog.concat(
        pg_catalog.set_config('synchronous_commit', 'on', false),
        pg_catalog.set_config('default_transaction_isolation', 'read committed', false),
        pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', false)) END,
    pg_catalog.to_regclass(%(locks)s) IS NOT NULL AND NOT EXISTS (
        SELECT FROM pg_catalog.pg_attribute
        WHERE attrelid = pg_catalog.to_regclass(%(locks)s) AND attname = 'last_failure'
            AND NOT attisdropped)
FROM (SELECT pg_catalog.pg_backend_pid() = %(pid)s AS direct) AS d"""
"""Run once per connection; every function named with its schema. A session of our own
(``direct``) is pinned for its life: ``synchronous_commit`` ``on`` (with ``off`` a crash forgot
acknowledged locks and rewound the token sequence), read committed (serializable made claim
storms fail with 40001), ``search_path`` only the system's (statements name their schema
anyway). A standby, or a read-only session (``default_transaction_read_only``), is refused: it
would answer ``verify`` and ``check`` from a copy that may be behind the primary. The last
column: the lock table exists in an older layout (no ``last_failure``): brought up to date now.

``direct``: the server process answering is the one the connection's start named (its
``BackendKeyData``). A pooler (PgBouncer) names a process of its own: then the session is not
ours (a transaction-mode pooler runs each transaction on any server connection, where another
client's ``SET`` stays), so nothing is set here: every transaction pins its own
(``_PIN_SETTINGS``), and no named prepared statement is used (another client's ``_pg3_0`` ran
in ours)."""

_BEGIN: Final = "BEGIN ISOLATION LEVEL READ COMMITTED"
"""An explicit transaction, ended by its own COMMIT before what follows in a pipeline."""

_PIN_SETTINGS: Final = """
SELECT pg_catalog.set_config('synchronous_commit', 'on', true),
    pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true)"""
"""Behind a pooler, first in every transaction (``BEGIN ISOLATION LEVEL READ COMMITTED``, sent
in the same pipeline): what another client of the pool may have ``SET`` on the server
connection cannot reach the statement that follows (durability at its commit, names parsed
after it). Times and bytes are read in binary, so ``extra_float_digits``, ``DateStyle``,
``TimeZone``, ``IntervalStyle`` and ``bytea_output`` decide nothing."""

_OLD_TABLES: Final = """
SELECT n.nspname FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relname = 'mahabharatha_locks' AND c.relkind IN ('r', 'p')
    AND n.nspname <> %(schema)s AND pg_catalog.pg_has_role(c.relowner, 'USAGE')
    AND pg_catalog.obj_description(c.oid, 'pg_class') IS DISTINCT FROM %(mark)s
ORDER BY 1"""
"""Lock tables this role owns in other schemas: an older mahabharatha made them in the first
schema of its ``search_path``. Another role's tables are never ours (a role with CREATE on the
database could make a schema named like ours, with tables to shadow them)."""


_Connection = Connection  # the name the tests patch statements on


# --------------------------------------------------------------------------- the backend


@dataclass(frozen=True)
class _Row:
    feature: str
    pid: int | None
    details: bytes | None
    host: str | None
    token: int | None
    done: bool
    refreshed: float | None
    expires: float | None
    now: float


class PostgresBackend(LockBackend):
    """Locks in PostgreSQL, keyed by (namespace, feature); see the module's docstring."""

    kind = "postgresql"
    capabilities = frozenset(
        {Capability.TOKENS, Capability.CLAIM_IN_ONE_STEP, Capability.RELEASE_NOTICE}
    )
    run_lease = RUN_LEASE_SECONDS
    """The lease of a holder that refreshes (``lock run``, ``FeatureLock``) unless given."""

    def __init__(
        self,
        url: str,
        *,
        namespace: str,
        gsd_dir: str | os.PathLike[str] = ".gsd",
        connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
        schema: str | None = None,
    ) -> None:
        chosen_schema = schema or os.environ.get(SCHEMA_ENV) or DEFAULT_SCHEMA
        if not _SCHEMA_NAME.fullmatch(chosen_schema):
            raise ValueError(
                f"not a usable lock schema name: {chosen_schema!r} (lower-case letters, digits "
                "and _, at most 63, not starting with a digit)"
            )
        if not namespace:
            raise ValueError("the lock namespace must not be empty")
        if len(namespace.encode("utf-8", "surrogatepass")) > MAX_NAMESPACE_BYTES:
            raise ValueError(
                f"the lock namespace is {len(namespace.encode('utf-8', 'surrogatepass'))} bytes "
                f"long; at most {MAX_NAMESPACE_BYTES} are allowed: pass a shorter --namespace"
            )
        if not math.isfinite(connect_timeout) or connect_timeout <= 0:
            raise ValueError(
                f"connect timeout must be a positive number of seconds, not {connect_timeout}"
            )
        self._url = url
        self._server = server_of(url)
        self._password = password_of(url)
        self.namespace: str = namespace
        self.schema: str = chosen_schema
        """The schema of the lock tables, named in every statement (never ``search_path``)."""
        self._in_schema: dict[str, str] = {}  # statement -> its text in another schema
        self.channel: str = channel_of(chosen_schema)
        """The schema's wake-up channel (:func:`channel_of`)."""
        self.gsd_dir = gsd_dir
        self.connect_timeout = connect_timeout
        self._conn: _Connection | None = None
        self._listener: _Connection | None = None
        self._behind_pooler = False  # seen by the listener's set-up: waiters poll, never LISTEN
        self._slots_scarce = False  # were the server's connection slots nearly all taken?
        self._slots_seen = -math.inf  # when that was seen (monotonic)
        self._slots_hidden = False  # the role may not look at the server's sessions
        self._woken = -math.inf  # when a wait last ended woken (monotonic): one per interval
        self._host = socket.gethostname()
        # Feature lists whose rows exist (rows are never deleted): are they in sorted order?
        self._ensured: dict[str, bool] = {}
        # (feature, pid, thread) -> the attempt id of a done whose answer never came (:meth:`done`)
        self._unanswered_done: dict[tuple[str, int, int], bytes] = {}
        # (pid, thread) -> the attempt id of a claim whose answer never came (:meth:`try_claim`)
        self._unanswered_claims: dict[tuple[int, int], bytes] = {}
        # (names, include_done) -> the registered claim for it, built for the current connection
        self._registered: dict[tuple[str, bool], bytes] = {}
        self._last_list: tuple[list[str], str] = ([], "")  # the last list claimed from, joined
        # Runs acquire, release_held and registered claims (:meth:`_on_kept_cursor`).
        self._kept_cursor: psycopg.RawCursor[Any] | None = None
        self._kept_busy = threading.Lock()  # held from a statement on the kept cursor to its read
        self._connecting = threading.Lock()  # one thread makes the shared connection

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        gsd_dir: str | os.PathLike[str] = ".gsd",
        namespace: str | None = None,
        connect_timeout: float | None = None,
        schema: str | None = None,
    ) -> PostgresBackend:
        """The backend for ``url``; the namespace from ``namespace``, else
        ``MAHABHARATHA_LOCK_NAMESPACE``, else the repository's ``origin`` remote (ValueError
        when there is none: the caller says to pass ``--namespace``)."""
        chosen = namespace or os.environ.get(NAMESPACE_ENV) or None
        if chosen is None:
            chosen = derive_namespace(gsd_dir)
        if chosen is None:
            raise ValueError(
                "no lock namespace: pass --namespace NAME (or set MAHABHARATHA_LOCK_NAMESPACE); "
                "none could be derived: the --gsd-dir folder is in no git repository with an "
                "'origin' remote that names one repository stably (a relative path such as "
                "../up.git names another one from each folder)"
            )
        timeout = CONNECT_TIMEOUT_SECONDS if connect_timeout is None else connect_timeout
        return cls(url, namespace=chosen, gsd_dir=gsd_dir, connect_timeout=timeout, schema=schema)

    # ------------------------------------------------------------------ people

    def where(self) -> str:
        return str(self._server)

    def __repr__(self) -> str:
        return f"PostgresBackend({self.where()!r}, namespace={self.namespace!r})"

    # ------------------------------------------------------------------ connection

    def _connect_timeout_arg(self) -> int:
        return max(MIN_CONNECT_TIMEOUT_SECONDS, math.ceil(self.connect_timeout))

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
        """A new autocommit connection, its statements bounded by ``--connect-timeout``, set
        up by :meth:`_set_up_session` (durable commits, a primary's, text as ``str``). A server
        whose connection slots are all taken (``max_connections``: many holders starting at
        once, each connecting only briefly) is asked again, with jitter, until the timeout."""
        deadline = time.monotonic() + self.connect_timeout
        pause = SLOTS_FIRST_PAUSE_SECONDS
        while True:
            try:
                conn = _Connection.connect(
                    self._url,
                    autocommit=True,
                    connect_timeout=self._connect_timeout_arg(),
                    application_name=application_name,
                    client_encoding=CLIENT_ENCODING,
                )
                break
            except psycopg.OperationalError as error:
                left = deadline - time.monotonic()
                if not _out_of_slots(error) or left <= 0:
                    raise
                time.sleep(min(left, random.uniform(pause / 2, pause)))
                pause = min(pause * 2, SLOTS_MAX_PAUSE_SECONDS)
        conn.deadline = self.connect_timeout
        try:
            self._set_up_session(conn)
        except BaseException:
            with suppress(psycopg.Error, OSError):
                conn.close()
            raise
        return conn

    def _set_up_session(self, conn: _Connection) -> None:
        """Pin what the server's, database's or role's settings may not decide for us, and
        refuse a session that cannot keep a lock: one round trip per connection."""
        values = {"pid": conn.info.backend_pid, "locks": f"{self.schema}.mahabharatha_locks"}
        found = conn.execute(_SESSION_SET_UP, values, prepare=False, binary=True).fetchone()
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
        if old_layout:
            self._bring_up_to_date(conn)

    def _bring_up_to_date(self, conn: _Connection) -> None:
        """The tables are of an older schema version: add what it lacks now, before any
        statement needs it (a worker whose ``fail`` met no ``failures`` column died holding its
        feature), or refuse naming ``lock init`` when this role may not."""
        try:
            self._create_schema_on(conn)
        except (pg_errors.InsufficientPrivilege, pg_errors.ReadOnlySqlTransaction) as error:
            raise BackendError(
                f"lock server {self._server} (PostgreSQL): its lock tables in schema "
                f"{self.schema} are of an older mahabharatha and this role may not bring them up "
                f"to date ({first_line(error)}): run 'mahabharatha lock init' as the tables' owner"
            ) from None

    def crowded(self, within: float) -> bool:
        """Are the server's connection slots nearly all taken (:func:`_few_slots`)? Asked on
        the connection kept (one round trip) when the last look is older than ``within``
        seconds; never by connecting: with no connection, the last look's answer. Never behind
        a pooler (whose own client slots cannot be seen), nor where the role may not look
        (``pg_stat_get_activity`` revoked): not crowded, as before there was a look."""
        conn = self._conn
        if self._slots_hidden or conn is None or conn.closed or conn.pooled:
            return self._slots_scarce
        if time.monotonic() - self._slots_seen < within:
            return self._slots_scarce
        try:
            found = conn.execute(_SLOTS, prepare=False).fetchone()
        except pg_errors.InsufficientPrivilege:
            self._slots_hidden = True  # the role's setting: never asked again
            return self._slots_scarce
        except psycopg.Error:
            # A lost or frozen connection: the caller's next statement connects again (and
            # says what is wrong, if anything).
            self._drop_connection()
            return self._slots_scarce
        assert found is not None
        usable, taken = found
        self._slots_seen = time.monotonic()
        self._slots_scarce = usable - taken <= _few_slots(usable)
        return self._slots_scarce

    def rest(self) -> None:
        """Let go of this backend's server connections until its next call: a holder between
        two refreshes (``lock run``, ``FeatureLock``) keeps none, so many holders fit in a
        server's ``max_connections`` (a refresh every third of the lease connects again)."""
        with self._connecting:  # Race: a thread making the shared connection at this moment
            self._drop_connection()
        self._drop_listener()

    def close(self) -> None:
        for conn in (self._conn, self._listener):
            if conn is not None:
                with suppress(psycopg.Error, OSError):
                    conn.close()
        self._conn = self._listener = None

    def _drop_connection(self) -> None:
        if self._conn is not None:
            with suppress(psycopg.Error, OSError):
                self._conn.close()
        self._conn = None

    def _error(self, error: BaseException) -> BackendError:
        """One sentence naming the server (never the password) for what went wrong."""
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
        return BackendError(said)

    def _run(
        self,
        operation: Callable[[_Connection], _T],
        *,
        retry: bool = True,
        pins_itself: bool = False,
    ) -> _T:
        """Run ``operation`` on the warm connection. A connection lost under it (a server
        restart, ``pg_terminate_backend``, ``idle_session_timeout``, a reset after the server
        committed) is replaced and the operation run again, also when the connection was a
        fresh one, up to ``MAX_LOST_ANSWERS`` times (``retry``: every statement here is safe to
        repeat, by token or by attempt id). A connection that cannot be made is an error at
        once (nothing was sent); a missing table is created (first use); anything else is a
        :class:`BackendError`. Behind a pooler ``operation`` runs :meth:`_pinned` unless it
        ``pins_itself``."""
        lost = 0
        created = False
        rolled_back: _Pauses | None = None  # made at the first rollback: none on the hot path
        while True:
            try:
                conn = self._connection()
            except psycopg.Error as error:  # nothing was sent: no answer to look for
                raise self._error(error) from None
            try:
                if conn.pooled and not pins_itself:
                    return self._pinned(conn, operation)
                return operation(conn)
            except (pg_errors.SerializationFailure, pg_errors.DeadlockDetected) as error:
                # Race: a concurrent transaction (or a session default of serializable that
                # pinning missed) made the server roll the statement back: nothing was done
                # and the connection is sound. Run it again on it, after a pause.
                rolled_back = rolled_back or _Pauses(self.connect_timeout)
                if not rolled_back.pause():
                    raise self._error(error) from None
            except pg_errors.UndefinedTable as error:
                if created:
                    raise self._error(error) from None
                created = True
                if conn.pooled:
                    # Race: a pooler may keep the failed transaction's server connection
                    # assigned to this client a while (seen: a pool of one never freed for the
                    # schema's own connection): let go of it first.
                    self._drop_connection()
                try:
                    self._create_schema()
                except psycopg.Error as cause:
                    raise self._error(cause) from None
            except pg_errors._WaitTimeout as error:
                self._drop_connection()  # Race: an answer may still come; the state is unknown
                raise self._error(error) from None
            except (psycopg.OperationalError, psycopg.InterfaceError) as error:
                self._drop_connection()
                lost += 1
                # Race: the server may have committed before the answer was lost: the retry
                # carries the same attempt id (or token) and finds its own work, never a second.
                if not retry or lost > MAX_LOST_ANSWERS:
                    raise self._error(error) from None
            except psycopg.Error as error:
                raise self._error(error) from None

    @staticmethod
    def _pinned(conn: _Connection, operation: Callable[[_Connection], _T]) -> _T:
        """``operation`` in a transaction of its own that first pins what it relies on
        (``_PIN_SETTINGS``; begun READ COMMITTED), sent in one pipeline: behind a
        transaction-mode pooler another client's ``SET`` may be on the server connection."""
        with conn.pipeline(), conn.transaction():
            conn.execute(_PIN_SETTINGS, prepare=False)
            return operation(conn)

    def _rows(self, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        statement = self._sql(query)

        def run(conn: _Connection) -> list[tuple[Any, ...]]:
            return conn.execute(statement, params, binary=True).fetchall()

        return self._run(run)

    def _hot(
        self, statement: str, values: Sequence[Any], sent: list[float] | None = None
    ) -> list[tuple[Any, ...]]:
        """Run an acquire or a release of a held lock (``_ACQUIRE_NUMBERED``,
        ``_RELEASE_HELD_NUMBERED``), the uncontended cycle's two statements: on one cursor kept
        per connection (``conn.execute`` builds a cursor per call), prepared on first use
        (psycopg would send it unprepared five times first), answered in binary (no float or
        integer text to print on the server and parse here). Same retries as :meth:`_run`."""

        text = self._sql(statement)

        def run(conn: _Connection) -> list[tuple[Any, ...]]:
            if sent is not None:
                sent.append(time.monotonic())  # connected: a lease it sets runs from no earlier
            return self._on_kept_cursor(conn, text, values, binary=True)

        return self._run(run)

    def _on_kept_cursor(
        self, conn: _Connection, statement: str | bytes, values: Sequence[Any], *, binary: bool
    ) -> list[tuple[Any, ...]]:
        """Run a prepared ``$n`` statement on the cursor kept per connection and read its rows
        (a cursor made per call costs its result loaders again: ~8 % of a claim storm)."""
        # Race: two threads on one backend: a statement on a cursor replaces the answer the
        # other has not read yet (it would read nothing, or the other's row). The kept cursor
        # is one thread's from its statement to its read; others never wait for it.
        prepare = not conn.pooled  # Race: a pooler runs another client's same-named statement
        if not self._kept_busy.acquire(blocking=False):
            with psycopg.RawCursor(conn) as own:
                return own.execute(statement, values, prepare=prepare, binary=binary).fetchall()
        try:
            cursor = self._kept_cursor
            if cursor is None or cursor.connection is not conn:
                cursor = self._kept_cursor = psycopg.RawCursor(conn)
            return cursor.execute(statement, values, prepare=prepare, binary=binary).fetchall()
        finally:
            self._kept_busy.release()

    def _params(self, **values: Any) -> dict[str, Any]:
        return {"ns": self.namespace, **values}

    def _schema_named(self, found: re.Match[str]) -> str:
        before, after = found[1] or found[3] or "", found[2] or found[4] or ""
        return f"{before}{self.schema}{after}"

    def _sql(self, statement: str) -> str:
        """``statement`` naming this backend's schema (the statements name ``mahabharatha``)."""
        if self.schema == DEFAULT_SCHEMA:
            return statement
        found = self._in_schema.get(statement)
        if found is None:
            found = _NAMED_SCHEMA.sub(self._schema_named, statement)
            self._in_schema[statement] = found
        return found

    # ------------------------------------------------------------------ schema

    def init(self) -> int:
        """Create the tables (idempotent), or make the token sequence again when it was lost
        (above every token in the rows); the schema version. Needs DDL rights then; otherwise
        it runs no DDL, and the role that uses the tables needs only SELECT, INSERT, UPDATE,
        DELETE (and USAGE on the token sequence)."""
        version = self._rows(_SCHEMA_VERSION_QUERY, {})[0][0]  # first use creates the tables
        if version is not None and version > SCHEMA_VERSION:
            raise self._newer_schema(int(version))
        if version is None or version < SCHEMA_VERSION or self._rows(_SEQUENCE_MISSING, {})[0][0]:
            try:
                self._create_schema(repair=True)
            except psycopg.Error as cause:
                raise self._error(cause) from None
            version = self._rows(_SCHEMA_VERSION_QUERY, {})[0][0]
        return int(version)

    def _newer_schema(self, version: int) -> BackendError:
        return BackendError(
            f"lock server {self._server} (PostgreSQL): its lock tables have schema version "
            f"{version}, newer than this mahabharatha knows ({SCHEMA_VERSION}): upgrade it"
        )

    def _create_schema(self, *, repair: bool = False) -> None:
        # Race: other threads' statements on the shared connection would run inside this
        # transaction (psycopg nests a second creation as a savepoint): a thread told "held"
        # whose row is never committed. The tables are made on a connection of their own.
        with self._connect() as conn:
            self._create_schema_on(conn, repair=repair)

    def _create_schema_on(self, conn: _Connection, *, repair: bool = False) -> None:
        """First use (or ``lock init``: ``repair``) makes what is missing. A token sequence
        missing next to rows is never made again silently at 1 (a reset sequence handed a new
        holder an old holder's token): only ``lock init`` does, above the rows' tokens."""
        advisory, *statements = (self._sql(statement) for statement in _SCHEMA_DDL)
        with conn.transaction():
            if conn.pooled:
                conn.execute(_PIN_SETTINGS, prepare=False)
            conn.execute(advisory)  # Race: two first uses creating the tables at once
            self._refuse_old_tables_elsewhere(conn)
            if not repair and self._sequence_lost(conn):
                raise BackendError(
                    f"lock server {self._server} (PostgreSQL): the token sequence "
                    "mahabharatha_lock_token is missing next to existing locks (dropped, or the "
                    "table restored without it): run 'mahabharatha lock init' to make it again "
                    "above every token given out"
                )
            if conn.execute(_SCHEMA_MISSING, {"schema": self.schema}).fetchone() == (True,):
                conn.execute(self._sql(_CREATE_SCHEMA))
            for statement in statements:
                conn.execute(statement)
            if repair:
                conn.execute(self._sql(_SEQUENCE_ABOVE_ROWS))
            found = conn.execute(self._sql(_SCHEMA_VERSION_QUERY)).fetchone()
        version = found[0] if found else None
        if version is not None and version > SCHEMA_VERSION:
            raise self._newer_schema(int(version))

    def _refuse_old_tables_elsewhere(self, conn: _Connection) -> None:
        """Before the tables are made in our schema: none of this role's own made by an older
        mahabharatha elsewhere (in its ``search_path``'s first schema), or holders on the old
        tables and on the new would hold one feature at once."""
        if conn.execute(self._sql(_TABLE_EXISTS)).fetchone() == (True,):
            return
        marked = {"schema": self.schema, "mark": NAMED_BY_SCHEMA}
        found = conn.execute(_OLD_TABLES, marked).fetchall()
        if found:
            old = found[0][0]
            raise BackendError(
                f"lock server {self._server} (PostgreSQL): this role's lock tables of an older "
                f"mahabharatha are in schema {old}: set {SCHEMA_ENV}={old} to keep them there, "
                f"or move them (ALTER TABLE/SEQUENCE ... SET SCHEMA {self.schema}) and run "
                "'mahabharatha lock init'"
            )

    def _sequence_lost(self, conn: _Connection) -> bool:
        for query in (_SEQUENCE_MISSING, _TABLE_EXISTS, _ROWS_EXIST):
            found = conn.execute(self._sql(query)).fetchone()
            if not (found and found[0]):
                return False
        return True

    # ------------------------------------------------------------------ taking

    def _take_params(
        self, feature: str | None, requester: Requester, lease: float | None
    ) -> dict[str, Any]:
        seconds = DEFAULT_LEASE_SECONDS if lease is None else lease
        if not math.isfinite(seconds) or seconds <= 0:
            raise ValueError(f"a lease must be a positive number of seconds, not {seconds}")
        return self._params(
            feature=feature,
            pid=requester.pid,
            details=_command_name_only(requester.details),
            host=self._host,  # the requester runs here (details keep only a cut host name)
            attempt=secrets.token_bytes(16),
            lease=float(seconds),
            judged=[],
            rest=0.0,
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
        holder: _Row | None = None
        sent: list[float] = []
        for _ in range(MAX_CLAIM_ROUNDS):
            taken = self._hot(_ACQUIRE_NUMBERED, _acquire_values(params), sent)
            if taken:
                return self._won(taken[0], requester, params, reason="expired", sent=sent[-1])
            holder = self._row(feature)
            if holder is not None and holder.pid is not None:
                break  # Race: otherwise it was released between the two statements: try again
        if holder is None or holder.pid is None:
            return AcquireResult(None, holder=self.inspect(feature))
        info = self._info(holder)
        if reclaim_dead and info.verdict is Verdict.GONE:
            params["judged"] = [holder.token]
            taken = self._hot(_ACQUIRE_NUMBERED, _acquire_values(params), sent)
            if taken:
                reason = f"owner {info.owner}"
                return self._won(taken[0], requester, params, reason=reason, sent=sent[-1])
            again = self._row(feature)
            if again is not None and again.pid is not None:
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
    ) -> AcquireResult | None:
        """Take the first takeable of ``features`` in their order (one statement); None when
        every one is held, resting ``retry_delay`` seconds after a failed attempt by the
        server's clock, or done (unless ``include_done``)."""
        if not features:
            return None
        names = self._joined(features)
        params = self._take_params(None, requester, lease)
        params["rest"] = float(retry_delay)
        # Race: a claim committed, its answer lost, and no connection to ask again on (every
        # slot taken: ServerFullError); a pool's worker claims again once a slot is free. A new
        # attempt id would see the feature held by the worker itself and pass it over (left
        # held, never run, till the lease ran out): the unanswered one takes it up.
        # Race: threads of one process share a backend: each its own lost attempt, or one
        # thread's claim would take up the feature another just took (two holders).
        lost_key = (requester.pid, threading.get_ident())
        attempt = self._unanswered_claims.setdefault(lost_key, params["attempt"])
        lost_before = attempt is not params["attempt"]
        params.update(names=names, include_done=include_done, attempt=attempt)
        if reclaim_dead:
            params["judged"] = self._judged_dead(features)
        answer = self._claim_rounds(params, features, requester, checked=lost_before)
        self._unanswered_claims.pop(lost_key, None)  # answered: the next claim is new
        return answer

    def _claim_rounds(
        self,
        params: dict[str, Any],
        features: Sequence[str],
        requester: Requester,
        *,
        checked: bool,
    ) -> AcquireResult | None:
        """:meth:`try_claim`'s statement, again while rows are missing (made between)."""
        names = params["names"]
        for _ in range(MAX_CLAIM_ROUNDS):
            missing, taken = self._run(self._claim_statement(params, features, checked=checked))
            if taken is not None:
                self._remember_rows(names, features)
                reason = "owner judged gone" if params["judged"] else "expired"
                return self._won(taken, requester, params, reason=reason)
            if not missing:
                if self._ensured.get(names):  # a lean claim, which cannot see missing rows
                    # Race: rows deleted since seen (a reset): the checked claim counts them;
                    # pop, not del: another thread's claim may have dropped the entry already.
                    self._ensured.pop(names, None)
                    continue
                self._remember_rows(names, features)
                return None
            self._rows_ensured(params)
            self._remember_rows(names, features)  # every name has a row now: claim by reference
        return None

    def _joined(self, features: Sequence[str]) -> str:
        """The names as one text; a pool's loop passes the same list every time, and then the
        same text object comes back (its hash, a dictionary key below, is computed once)."""
        last_features, last_names = self._last_list
        if features == last_features:  # names compared by identity first: no copy, no join
            return last_names
        names = "\n".join(features)
        if names.count("\n") != len(features) - 1:  # one pass in C, not a loop over names
            raise ValueError("a feature name cannot hold a line break")
        self._last_list = (list(features), names)  # a copy: the caller may change its list
        return names

    def _remember_rows(self, names: str, features: Sequence[str]) -> None:
        if names not in self._ensured:
            pairs = itertools.pairwise(features)
            ascending = all(before < after for before, after in pairs)
            self._ensured[names] = ascending and self._server_orders_like_python(features)

    def _server_orders_like_python(self, features: Sequence[str]) -> bool:
        """Does ``COLLATE "C"`` (bytes in the database's encoding) order ``features`` as Python
        does (code points)? In UTF-8 always, and ASCII names are the same bytes in every server
        encoding; in another (WIN1251: "€" is byte 88, "Б" is C1) the orders differ, and a list
        sorted for Python must be claimed in its given order, not by ``ORDER BY feature``."""
        conn = self._conn
        encoding = None if conn is None else conn.info.parameter_status("server_encoding")
        return encoding == "UTF8" or all(name.isascii() for name in features)

    # A claim that sends its list is never prepared: PostgreSQL's generic plan for it cannot
    # see the feature list and was 30x slower over 1,000 features. A registered list is
    # written into its statement instead, which is then prepared (``_CLAIM_REGISTERED``).
    def _claim_statement(
        self, params: dict[str, Any], features: Sequence[str], *, checked: bool = False
    ) -> Callable[[_Connection], tuple[int, Sequence[Any] | None]]:
        """The claim to run, answering (names without a row, the taken row or None): the
        registered one for a sorted list whose rows this backend has seen, else the one that
        sends the list (lean when sorted and seen); always the checked one on a retry, or when
        ``checked`` (an earlier call's answer was lost: it puts our own lost attempt first)."""
        lean = self._ensured.get(params["names"], False)
        registered = lean and not params["judged"]
        first = _CLAIM_SORTED if lean else _CLAIM_CHECKED
        calls = itertools.count(1 if checked else 0)

        def run(conn: _Connection) -> tuple[int, Sequence[Any] | None]:
            retry = next(calls) > 0
            if registered and not retry and not conn.pooled:  # a registered claim is prepared
                statement = self._registered_claim(conn, params["names"], params["include_done"])
                values = [params[name] for name in _REGISTERED_PARAMS]
                found = self._on_kept_cursor(conn, statement, values, binary=True)
                return 0, (found[0] if found else None)
            chosen = self._sql(first if not retry else _CLAIM_CHECKED)
            row = conn.execute(chosen, params, prepare=False, binary=True)
            missing, *taken = row.fetchall()[0]
            return missing, (taken if taken[0] is not None else None)

        return run

    def _registered_claim(self, conn: _Connection, names: str, include_done: bool) -> bytes:
        """The claim statement of this (sorted, rows seen) list on ``conn``, built once per
        connection and list: psycopg prepares it on its first run, the server plans it once."""
        key = (names, include_done)
        statement = self._registered.get(key)
        if statement is None:
            if len(self._registered) >= MAX_REGISTERED_LISTS:
                del self._registered[next(iter(self._registered))]  # the oldest list
            text = self._sql(_CLAIM_REGISTERED).format(
                ns=sql.Literal(self.namespace).as_string(conn),
                names=sql.Literal(names.split("\n")).as_string(conn),
                not_done="" if include_done else " AND p.done_at IS NULL",
            )
            statement = self._registered[key] = text.encode(conn.info.encoding)
        return statement

    def _rows_ensured(self, params: dict[str, Any]) -> None:
        statement = self._sql(_ENSURE_ROWS)

        def run(conn: _Connection) -> None:
            conn.execute(statement, params)

        self._run(run)

    def _judged_dead(self, features: Sequence[str]) -> list[int]:
        """Tokens of the held locks among ``features`` whose owner is provably gone here."""
        rows = [
            _Row(*row) for row in self._rows(_SELECT_WANTED, self._params(features=list(features)))
        ]
        return [
            row.token
            for row in rows
            if row.token is not None and self._info(row).verdict is Verdict.GONE
        ]

    def _won(
        self,
        row: Sequence[Any],
        requester: Requester,
        params: dict[str, Any],
        *,
        reason: str,
        sent: float | None = None,
    ) -> AcquireResult:
        feature, token, refreshed, expires, now, prev_pid, prev_details, prev_ts, prev_exp = row
        shift = _clock_shift(now)
        held = Held(
            feature=feature,
            pid=requester.pid,
            timestamp=refreshed + shift,
            expires_at=expires + shift,
            token=int(token),
            handle=_Handle(params["lease"], params["attempt"]),
            sent=sent,
        )
        replaced = None
        if prev_pid is not None and prev_ts is not None:
            state = "stale" if prev_exp is not None and prev_exp < now else "active"
            old = _Row(feature, prev_pid, prev_details, None, None, False, prev_ts, prev_exp, now)
            replaced = self._info(old, state=state)
            if replaced.owner != Owner.UNKNOWN.value and state == "active":
                reason = f"owner {replaced.owner}"
        return AcquireResult(held, replaced=replaced, reason=reason if replaced else None)

    # ------------------------------------------------------------------ holding

    def refresh(self, held: Held) -> Held:
        params = self._params(feature=held.feature, token=held.token)
        statement = self._sql(_REFRESH)
        sent: list[float] = []

        def run(conn: _Connection) -> list[tuple[Any, ...]]:
            sent.append(time.monotonic())  # connected: the new lease runs from no earlier
            return conn.execute(statement, params, binary=True).fetchall()

        found = self._run(run)
        if not found:
            raise LockLostError(held.feature, "its lease ran out, or it was released or taken over")
        refreshed, expires, now = found[0]
        shift = _clock_shift(now)
        return Held(
            held.feature,
            held.pid,
            refreshed + shift,
            expires + shift,
            held.token,
            held.handle,
            sent[-1],
        )

    def release_held(self, held: Held, wait: ReleaseWait | None = None) -> bool:
        """Remove exactly ``held`` and wake the waiters, in one round trip (``wait`` is unused:
        nothing on a server refuses a release for a while, and a lost answer is retried by
        :meth:`_run`)."""
        text = self._sql(_RELEASE_HELD_NUMBERED)
        values = (self.namespace, held.feature, held.token)

        def run(conn: _Connection) -> list[tuple[Any, ...]]:
            return self._release_then_wake(conn, text, values)

        return bool(self._run(run, pins_itself=True))

    def _release_then_wake(
        self, conn: _Connection, text: str, values: Sequence[Any]
    ) -> list[tuple[Any, ...]]:
        """The release in a transaction of its own (pinned first behind a pooler), then the
        wake-up in another, sent in one pipeline: one flush, one Sync, one round trip. A
        wake-up the server refuses (its notification queue full) fails only its own
        transaction, after the release's COMMIT: the release stands, the error is dropped."""
        released = psycopg.RawCursor(conn)
        commit = conn.cursor()
        try:
            with conn.pipeline():
                conn.execute(_BEGIN, prepare=False)
                if conn.pooled:
                    conn.execute(_PIN_SETTINGS, prepare=False)
                # Race: a pooler runs another client's same-named prepared statement
                released.execute(text, values, prepare=not conn.pooled, binary=True)
                commit.execute("COMMIT", prepare=False)
                conn.execute(_WAKE, {"channel": self.channel}, prepare=False)
        except psycopg.Error:
            if commit.statusmessage != "COMMIT":
                if conn.info.transaction_status == pq.TransactionStatus.INERROR:
                    conn.rollback()  # the release failed inside its BEGIN: end that first
                raise
        _hand_on_buffered_notifies(conn)
        return released.fetchall()

    def release(self, feature: str, pid: int, *, force: bool = False) -> bool:
        params = self._params(
            feature=feature, pid=pid, host=self._host, force=force, **_owner_keys(pid)
        )
        if self._rows(_RELEASE_PID, params):
            self._wake_waiters()
            return True
        holder = self._row(feature)
        if holder is None or holder.pid is None:
            return False
        raise NotOwnerError(self._info(holder))

    def verify(self, feature: str, token: int) -> bool:
        return bool(self._rows(_VERIFY, self._params(feature=feature, token=token))[0][0])

    # ------------------------------------------------------------------ looking

    def _row(self, feature: str) -> _Row | None:
        found = self._rows(_SELECT_ONE, self._params(feature=feature))
        return _Row(*found[0]) if found else None

    def _info(self, row: _Row, *, state: str | None = None) -> LockInfo:
        if row.pid is None:
            return _unlocked(row.feature, state or ("done" if row.done else "free"))
        assert row.refreshed is not None and row.expires is not None
        active = row.expires >= row.now
        state = state or ("active" if active else "stale")
        return LockInfo(
            feature=row.feature,
            state=State(state),
            pid=row.pid,
            timestamp=row.refreshed,
            age_seconds=max(0.0, row.now - row.refreshed),
            expires_in_seconds=max(0.0, row.expires - row.now) if state == "active" else None,
            owner=self._judge(row),
            host=row.host,
            token=row.token,
        )

    def _judge(self, row: _Row) -> Owner:
        """The one owner judgement (``liveness.judge``, as on files), with the lock's time
        moved onto this host's clock."""
        from mahabharatha.backends.liveness import OwnerFacts, judge

        if row.pid is None or row.refreshed is None:
            return Owner.UNKNOWN
        details = ownership.decode(row.details)
        return judge(OwnerFacts(row.pid, row.refreshed + _clock_shift(row.now), details)).owner

    def inspect(self, feature: str) -> LockInfo:
        row = self._row(feature)
        if row is None:
            return _unlocked(feature, "free")
        info = self._info(row)
        return info if info.state != "done" else _unlocked(feature, "free")

    def status(self, *, problems: list[FeatureProblem] | None = None) -> list[LockInfo]:
        return [self._info(_Row(*row)) for row in self._rows(_SELECT_HELD, self._params())]

    def survey(self, *, problems: list[FeatureProblem] | None = None) -> list[LockInfo]:
        names = self.feature_names()
        local = set(names)
        infos = {
            row.feature: self._info(row)
            for row in (_Row(*found) for found in self._rows(_SELECT_ALL, self._params()))
            if row.pid is not None or row.done or row.feature in local  # not a bare old row
        }
        for name in names:
            infos.setdefault(name, _unlocked(name, "free"))
        for name, record in self._all_attempts().items():
            if name in infos:
                info = infos[name]
                if record.failed and info.state == "done":
                    info = _unlocked(name, "failed")
                infos[name] = info.with_attempts(record.tries, record.last_reason)
        return [infos[name] for name in sorted(infos)]

    def feature_names(self) -> list[str]:
        """The local ``specs`` folders, as on files (a bare ``claim`` offers the same)."""
        return feature_folders(self.gsd_dir)

    # ------------------------------------------------------------------ maintenance

    def clean(
        self,
        *,
        dry_run: bool = False,
        reclaim_dead: bool = False,
        problems: list[FeatureProblem] | None = None,
        features: Iterable[str] | None = None,
    ) -> list[CleanedEntry]:
        rows = [_Row(*row) for row in self._rows(_SELECT_HELD, self._params())]
        if features is not None:
            wanted = set(features)
            rows = [row for row in rows if row.feature in wanted]
        judged = [
            row.token
            for row in rows
            if reclaim_dead
            and row.token is not None
            and self._info(row).state == "active"
            and self._info(row).verdict is Verdict.GONE
        ]
        if dry_run:
            return [
                CleanedEntry(
                    row.feature, self._path(row.feature), "lock", self._info(row).state, False
                )
                for row in rows
                if self._info(row).state == "stale" or row.token in judged
            ]
        removed = self._rows(
            _CLEAN, self._params(judged=judged, features=[row.feature for row in rows])
        )
        if removed:
            self._wake_waiters()
        states = {row.feature: self._info(row).state for row in rows}
        return [
            CleanedEntry(feature, self._path(feature), "lock", states.get(feature, "stale"), True)
            for (feature,) in sorted(removed)
        ]

    def _path(self, feature: str) -> str:
        return f"{self._server}#{self.namespace}/{feature}"

    def is_done(self, feature: str) -> bool:
        return bool(self._rows(_IS_DONE, self._params(feature=feature))[0][0])

    def done(self, feature: str, pid: int) -> str:
        # Race: a done committed, its answer lost, and no connection to ask again on (every
        # slot taken: ServerFullError); a pool's worker calls again. A new attempt id would
        # find the feature done by "someone else" (NotHeldError): the unanswered one finds it.
        lost_key = (feature, pid, threading.get_ident())
        attempt = self._unanswered_done.setdefault(lost_key, secrets.token_bytes(16))
        params = self._params(
            feature=feature,
            pid=pid,
            host=self._host,
            attempt=attempt,  # a retry after a lost answer finds its own mark
            **_owner_keys(pid),
        )
        found = self._rows(_DONE, params)
        self._unanswered_done.pop(lost_key, None)  # answered: the next done is new
        if not found:
            holder = self._row(feature)
            if holder is not None and holder.pid is not None:
                raise NotOwnerError(self._info(holder))
            raise NotHeldError(feature, pid)
        self._wake_waiters()
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(found[0][0]))

    def _wake_waiters(self) -> None:
        """Wake every waiter on this schema's channel (:data:`_WAKE`), after a release, a done,
        a failed attempt or a clean has committed: best effort. A wake-up not sent costs a
        waiter the rest of its slice, never the release its success."""
        conn = self._conn
        if conn is None or conn.closed:
            return
        try:
            conn.execute(_WAKE, {"channel": self.channel}, prepare=False)
        except psycopg.Error as error:
            if error.sqlstate is None:
                # The link was lost or froze after the release's answer: its state is unknown;
                # the next call connects again. (The server's own refusal, e.g. its
                # notification queue full, leaves the connection as it was.)
                self._drop_connection()

    def reopen(self, feature: str) -> bool:
        return bool(self._rows(_REOPEN, self._params(feature=feature)))

    # ------------------------------------------------------------------ failed attempts

    def _all_attempts(self) -> dict[str, Attempts]:
        found = {}
        for feature, failures, failed, last in self._rows(_ATTEMPTS, self._params()):
            entry = json.loads(last) if last else {}
            # The row keeps the count, whether it failed for good and the last attempt; the
            # limit is not kept (it closed the row when reached): the count stands for it.
            limit = int(failures) if failed else int(failures) + 1
            found[feature] = Attempts(int(failures), limit, (entry,) if entry else ())
        return found

    def attempts(self, feature: str) -> Attempts | None:
        return self._all_attempts().get(feature)

    def fail(self, feature: str, pid: int, reason: str, limit: int) -> Attempts:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "at": time.time(),  # the epoch seconds a --retry-delay rest is counted from
            "host": self._host,
            "pid": pid,
            "reason": reason[:MAX_REASON_CHARS],
        }
        params = self._params(
            feature=feature,
            pid=pid,
            host=self._host,
            entry=json.dumps(entry, sort_keys=True),
            limit=limit,
            **_owner_keys(pid),
        )

        statement = self._sql(_FAIL)

        def run(conn: _Connection) -> list[tuple[Any, ...]]:
            return conn.execute(statement, params, binary=True).fetchall()

        found = self._run(run, retry=False)  # repeated after a lost answer: "not held"
        if not found:
            holder = self._row(feature)
            if holder is not None and holder.pid is not None:
                raise NotOwnerError(self._info(holder))
            raise NotHeldError(feature, pid, "recorded as failed")
        self._wake_waiters()
        tries = int(found[0][0])
        return Attempts(tries, limit, (entry,))

    def failed_features(self) -> set[str]:
        """The features whose attempts reached their limit (closed like done ones)."""
        return {name for name, record in self._all_attempts().items() if record.failed}

    def retried_features(self, features: Sequence[str]) -> set[str]:
        """Those of ``features`` free and open after a failed attempt: resting, or just
        rested (a claim passed them over; a pool waits for them, never counts them finished)."""
        return {name for (name,) in self._rows(_RETRIED, self._params(features=list(features)))}

    # ------------------------------------------------------------------ waiting

    def pause(self, feature: str, backoff: float, most: float) -> None:
        """Between two tries of an acquire: wait for ``feature``'s release (LISTEN/NOTIFY),
        ``most`` seconds at most (the backoff is the poll a missed notification falls to)."""
        self.wait_for_release(feature, most)

    def release_watch(self, features: Iterable[str]) -> _Listening:
        """A pool's wait for any of ``features`` to be released: LISTEN while it waits, and no
        listening connection kept once it ends (a holder keeps none while it works)."""
        return _Listening(self, list(features))

    def marker_folder(self) -> str | os.PathLike[str]:
        """The local gsd folder: its ``.completed`` markers count as done here too."""
        return self.gsd_dir

    def wait_for_release(self, feature: str, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a release of ``feature`` (LISTEN/NOTIFY): True
        when one came (or when this is the first call, which only starts listening: the caller
        tries again, and any release after that wakes it).

        The listening connection is no promise: a server's ``idle_session_timeout``, a
        terminated backend or a frozen link ends it. Then this answers True after what is left
        of ``timeout`` (the caller looks again; a later call listens on a new connection), and
        the caller's own statement says whether the server is reachable at all. Every wait
        here is bounded: the listener's statements by ``--connect-timeout``, notifications by
        ``timeout``."""
        return self.wait_for_any_release((feature,), timeout)

    def async_release_listener(self) -> Any:
        """The running event loop's listener for releases of this backend's locks
        (:class:`~mahabharatha.backends.postgres.aio.AsyncReleaseListener`): what
        ``AsyncFeatureLock`` waits on, without blocking its loop."""
        from mahabharatha.backends.postgres.aio import listener_for

        return listener_for(self)

    def stop_listening(self) -> None:
        """Close the listening connection (a pool's worker that took a feature: many workers
        must not keep a connection each while they work)."""
        self._drop_listener()

    def wait_for_any_release(self, features: Iterable[str], timeout: float) -> bool:
        """:meth:`wait_for_release` for any of ``features`` (a pool waiting for the next one
        that comes free: a release, a ``done``, a reclaim of one of them)."""
        deadline = time.monotonic() + max(0.0, timeout)
        if self._slots_scarce:
            # A crowded server: a second connection to listen on would take a slot a worker
            # needs to record its done. Poll, once per wait, holding no connection meanwhile.
            self.rest()
        if self._behind_pooler or self._slots_scarce:
            # A transaction-mode pooler keeps no LISTEN for us: it would stay on a server
            # connection and deliver releases to whichever client gets it next (psycopg keeps
            # unread notifications without bound). Poll instead, once per wait.
            time.sleep(max(0.0, deadline - time.monotonic()))
            return False
        try:
            if self._listener is None or self._listener.closed:
                listener = self._connect("mahabharatha-wait")
                if listener.pooled:
                    self._behind_pooler = True
                    listener.close()
                    return True
                self._listener = listener
                self._listener.execute(_listen(verb="LISTEN", channel=self.channel))
                return True
            return self._heard(self._listener, deadline)
        except psycopg.Error:
            # Race: the listener died (or froze) between two tries; a release sent meanwhile
            # was never heard. Look again, no sooner than a wait would have (no busy loop when
            # listening keeps failing at once, e.g. with every connection slot taken).
            self._drop_listener()
            time.sleep(max(0.0, deadline - time.monotonic()))
            return True

    def _listen_on_claims_connection(self) -> _Connection | None:
        """LISTEN on the connection the claims use, when there is one that can: a pool's
        waiting worker needs no second connection (at a pool's end every waiting worker
        opened one, a server process each: 20-40 ms of the last 65 ms of a pool of 8). None
        behind a pooler or on a crowded server (both poll), or with no connection kept."""
        conn = self._conn
        if self._behind_pooler or self._slots_scarce or conn is None or conn.closed:
            return None
        if conn.pooled:
            return None
        try:
            conn.execute(_listen(verb="LISTEN", channel=self.channel))
        except psycopg.Error:
            self._drop_connection()  # its state is unknown; the next claim connects again
            return None
        return conn

    def _heard(self, conn: _Connection, deadline: float) -> bool:
        """:func:`_notified` on ``conn`` (LISTENing), this backend's waits at most one wake-up
        per :data:`WAKE_UP_INTERVAL_SECONDS` apart."""
        woken = _notified(conn, deadline, self._woken + WAKE_UP_INTERVAL_SECONDS)
        if woken:
            self._woken = time.monotonic()
        return woken

    def _notified_on_claims_connection(self, conn: _Connection, deadline: float) -> bool:
        """:meth:`_heard` on the claims' connection ``conn`` (LISTENing)."""
        try:
            return self._heard(conn, deadline)
        except psycopg.Error:
            # Race: the connection died (or froze) between two tries; a release sent meanwhile
            # was never heard. Look again, no sooner than a wait would have.
            if conn is self._conn:
                self._drop_connection()
            time.sleep(max(0.0, deadline - time.monotonic()))
            return True

    def _stop_listening_on(self, conn: _Connection) -> None:
        """UNLISTEN on the claims' connection, and drop what it heard meanwhile (nobody waits
        for it now: a later wait would wake for a release long past)."""
        if conn is not self._conn or conn.closed:
            return
        try:
            conn.execute(_listen(verb="UNLISTEN", channel=self.channel))
            for _ in conn.notifies(timeout=0):
                pass
        except psycopg.Error:
            self._drop_connection()  # its state is unknown; the next claim connects again

    def _drop_listener(self) -> None:
        if self._listener is not None:
            with suppress(psycopg.Error, OSError):
                self._listener.close()
        self._listener = None


class _Pauses:
    """Jittered, doubling pauses between runs of a statement the server rolled back, for
    ``seconds`` at most: :meth:`pause` answers False once they are spent."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.next = SERIALIZATION_FIRST_PAUSE_SECONDS

    def pause(self) -> bool:
        left = self.deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(left, random.uniform(self.next / 2, self.next)))
        self.next = min(self.next * 2, SERIALIZATION_MAX_PAUSE_SECONDS)
        return True


def _hand_on_buffered_notifies(conn: _Connection) -> None:
    """Give psycopg the notifications libpq read with a pipeline's last answer (our own
    wake-up, heard by a LISTEN on this connection): psycopg leaves them in libpq's buffer, where
    ``notifies()``, which waits for the socket, never looks. Handed on as psycopg itself does."""
    pgconn = conn.pgconn
    while (note := pgconn.notifies()) is not None:
        if pgconn.notify_handler is not None:
            pgconn.notify_handler(note)


def _few_slots(usable: int) -> int:
    """How few free connection slots make a server crowded: a tenth of them, at least one
    (a worker that cannot connect finds none free)."""
    return max(1, usable // 10)


def _out_of_slots(error: psycopg.OperationalError) -> bool:
    """The server refused a connection because no slot is free for it: SQLSTATE 53300
    (``too_many_connections``), whatever the limit (the server's, the role's or the database's
    ``CONNECTION LIMIT``) and whatever the language of its message (``lc_messages``). The
    English text counts only for a refusal that came without a SQLSTATE (libpq not found to
    make its errors verbose: :func:`~mahabharatha.backends.postgres.connection._verbose_errors`)."""
    sqlstate = getattr(error, "sqlstate", None)
    if sqlstate is not None:
        return bool(sqlstate == SLOTS_TAKEN_SQLSTATE)
    text = str(error)
    return "too many clients" in text or "remaining connection slots are reserved" in text


def _clock_shift(server_now: float) -> float:
    """What to add to a server time to read it on this host's clock: ``Held`` times are
    compared with ``time.time()`` by the lock layer, and a client clock hours wrong must judge
    nothing differently (only durations measured by the server count)."""
    return time.time() - server_now


def _acquire_values(params: dict[str, Any]) -> list[Any]:
    """``_ACQUIRE_NUMBERED``'s parameters from a take's dict. No judged token is sent as NULL,
    not as an empty array (psycopg adapts a list in about 1 µs, None in 0.1): ``token = ANY(NULL)``
    is NULL, which in ``_TAKEABLE``'s OR decides nothing, exactly as the empty array's false."""
    values = [params[name] for name in _ACQUIRE_PARAMS]
    values[-1] = values[-1] or None  # "judged", the last of _ACQUIRE_PARAMS
    return values


def _command_name_only(details: bytes | None) -> bytes | None:
    """Owner details with ``lock run``'s command cut to its program's name: every role that
    may use the table reads every namespace's rows (namespaces are not a security boundary),
    and a command line may carry a secret (``deploy --token=...``)."""
    return ownership.command_name_only(details)


def _owner_keys(pid: int) -> dict[str, bytes | None]:
    """The parameters of ``_OWNER_COULD_BE`` for an owner named by ``pid`` on this host."""
    return {"place": ownership.place_key(), "start": ownership.start_key(pid)}


def _unlocked(feature: str, state: str) -> LockInfo:
    return LockInfo(feature, State(state), None, None, None, None, Owner.UNKNOWN)


@dataclass(frozen=True)
class _Handle:
    """What a PostgreSQL acquisition keeps besides its token."""

    lease: float
    attempt: bytes


class _Listening:
    """The :class:`~mahabharatha.backends.base.ReleaseWatch` of a server: entered, it starts
    listening (a release from then on is heard), on the connection the claims use where it
    can, else on the backend's listening connection; left, it stops listening (that
    connection closed)."""

    def __init__(self, backend: PostgresBackend, features: list[str]) -> None:
        self.backend = backend
        self.features = features
        self.conn: _Connection | None = None  # the claims' connection, LISTENing

    def __enter__(self) -> _Listening:
        self.conn = self.backend._listen_on_claims_connection()
        if self.conn is None:
            self.backend.wait_for_any_release(self.features, 0.0)  # starts listening
        return self

    def __exit__(self, *_exc: object) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            self.backend._stop_listening_on(conn)
        self.backend.stop_listening()

    def wait(self, seconds: float) -> bool:
        seconds = max(0.0, min(seconds, RECHECK_SECONDS))  # the protocol's bound: look again
        conn = self.conn
        if conn is not None and conn is self.backend._conn and not conn.closed:
            deadline = time.monotonic() + max(0.0, seconds)
            return self.backend._notified_on_claims_connection(conn, deadline)
        # Race: the claims' connection was let go of or lost since (a refresh's rest in another
        # thread, a server restart): its LISTEN went with it. The backend's listener takes over
        # (its first call only starts listening and says "look again").
        self.conn = None
        heard = self.backend.wait_for_any_release(self.features, seconds)
        # Behind a pooler (or on a crowded server) nothing is heard: that wait was a poll.
        return heard or self.backend._behind_pooler or self.backend._slots_scarce


def _notified(conn: _Connection, deadline: float, not_before: float) -> bool:
    """Did a wake-up come on ``conn`` (LISTENing) before ``deadline``? Wake-ups heard between
    two waits come first (psycopg keeps them). A wake-up is a hint: it names nothing, and the
    caller looks again either way. One heard before ``not_before`` (the last wake was too
    recent) ends the wait only then: the wake-ups meanwhile are read and dropped."""
    for _note in conn.notifies(timeout=max(0.0, deadline - time.monotonic())):
        break
    else:
        return False
    # Race: a flood of wake-ups (anyone who may connect can NOTIFY the channel): each one read,
    # so none piles up, and none looked at before ``not_before``.
    until = min(deadline, not_before)
    while (left := until - time.monotonic()) > 0:
        for _note in conn.notifies(timeout=left):
            pass
    return True
