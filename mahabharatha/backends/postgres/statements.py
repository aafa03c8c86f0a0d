"""The PostgreSQL backend's tables and every SQL text it sends. Every value is a parameter,
except a registered claim's namespace and names, which psycopg quotes (``sql.Literal``); no
input is ever spliced into SQL text by hand. Another schema than ``mahabharatha``: ``_sql``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from psycopg import sql

from mahabharatha.owner import ownership

SCHEMA_VERSION: Final = 2
"""The tables' layout; ``mahabharatha_schema`` records it (a newer one is refused, never
rewritten)."""

NAMED_BY_SCHEMA: Final = "mahabharatha locks, named with their schema"
"""The lock table's comment: tables without it elsewhere are an older mahabharatha's."""
CREATE_SCHEMA: Final = "CREATE SCHEMA IF NOT EXISTS mahabharatha"
"""Only when the schema is missing: even with ``IF NOT EXISTS`` the server asks for CREATE on
the database, which the tables' owner may lack."""
SCHEMA_MISSING: Final = "SELECT pg_catalog.to_regnamespace(%(schema)s) IS NULL"

SCHEMA_DDL: Final = (
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
"""Times as epoch seconds: ``date_part`` answers a float8 directly (``extract`` computes a
``numeric`` first), the same value."""

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
    server's since ``FAIL`` writes it; an older client's own, which counts no later than now)."""
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
"""The names travel as one text joined by newlines (no valid feature name has one): far
cheaper for psycopg to adapt than a list."""

CLAIM_CHECKED: Final = f"""
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
taken and the caller creates them (``ENSURE_ROWS``), once. Our own earlier attempt (an answer
lost with its connection) comes first: a retry never takes a second feature."""

CLAIM_SORTED: Final = f"""
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

REGISTERED_PARAMS: Final = ("pid", "details", "host", "attempt", "lease", "rest")
"""The parameters of a registered claim, in their ``$n`` order."""


def _numbered(text: str, names: Sequence[str]) -> str:
    """``text`` with its ``%(name)s`` parameters written ``$1``, ``$2``... in ``names``' order."""
    for number, name in enumerate(names, start=1):
        text = text.replace(f"%({name})s", f"${number}")
    return text


CLAIM_REGISTERED: Final = _numbered(
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
    REGISTERED_PARAMS,
)
"""The claim of a registered list: ``CLAIM_SORTED`` with the namespace and the names written
into the statement (quoted by psycopg's ``sql.Literal``) and prepared on the connection, so the
server parses and plans the names once per connection, not once per claim. Every value that
changes between claims (holder, attempt, lease, rest) is a ``$n`` parameter no plan depends on,
so the server keeps one generic plan. It runs on a ``RawCursor``: psycopg passes the text as it
is (it caches its parse of a ``%(name)s`` query only up to 4 kB). Takeable is free or expired:
no judged tokens (a ``--reclaim-dead`` claim sends its list) and no earlier attempt (a retry
uses ``CLAIM_CHECKED``, which puts it first). An empty answer: nothing takeable among the rows
that exist; the caller then asks ``CLAIM_CHECKED``, which also counts names without a row."""

ENSURE_ROWS: Final = """
INSERT INTO mahabharatha.mahabharatha_locks (namespace, feature)
SELECT %(ns)s, w.feature FROM unnest(string_to_array(%(names)s, pg_catalog.chr(10))) AS w(feature)
ORDER BY w.feature
ON CONFLICT DO NOTHING"""
"""Rows with no holder for features never locked before (sorted: concurrent claimers insert in
one order and cannot deadlock)."""

WAKE: Final = "SELECT pg_catalog.pg_notify(%(channel)s, '')"
"""The wake-up sent after a release, a done, a failed attempt or a clean has committed, in a
transaction of its own (:meth:`PostgresBackend._wake_waiters`; a release of a held lock sends
both in one pipeline: :meth:`PostgresBackend._release_then_wake`): a notification that cannot be
queued (the cluster's queue full: one listener in an open transaction anywhere holds its tail)
never undoes or stops the release. No payload: any role that may connect to any database may
LISTEN, and a name in it would tell every team's feature names."""


def listen(verb: str, channel: str) -> sql.Composed:
    """``LISTEN``/``UNLISTEN`` of ``channel``, quoted as an identifier (it takes no parameter)."""
    return sql.SQL("{} {}").format(sql.SQL(verb), sql.Identifier(channel))


_LET_GO: Final = "pid = NULL, details = NULL, host = NULL, attempt = NULL"

_RELEASE_HELD: Final = f"""
UPDATE mahabharatha.mahabharatha_locks SET {_LET_GO}
WHERE namespace = %(ns)s AND feature = %(feature)s AND token = %(token)s AND pid IS NOT NULL
RETURNING 1"""

ACQUIRE_PARAMS: Final = ("ns", "feature", "pid", "details", "host", "attempt", "lease", "judged")
"""The parameters of ``_ACQUIRE`` (and of a take's parameter dict), in their ``$n`` order."""
ACQUIRE_NUMBERED: Final = _numbered(_ACQUIRE, ACQUIRE_PARAMS)
RELEASE_HELD_NUMBERED: Final = _numbered(_RELEASE_HELD, ("ns", "feature", "token"))
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

RELEASE_PID: Final = f"""
UPDATE mahabharatha.mahabharatha_locks SET {_LET_GO}
WHERE namespace = %(ns)s AND feature = %(feature)s AND pid IS NOT NULL
    AND (%(force)s OR (pid = %(pid)s AND host IS NOT DISTINCT FROM %(host)s
        AND {_OWNER_COULD_BE}))
RETURNING 1"""

REFRESH: Final = f"""
UPDATE mahabharatha.mahabharatha_locks SET refreshed_at = now(), expires_at = now() + lease
WHERE namespace = %(ns)s AND feature = %(feature)s AND token = %(token)s AND pid IS NOT NULL
    AND expires_at >= now()
RETURNING {_EPOCHS}"""
"""Only an unexpired lock is renewed: once its lease has run out by the server's clock it is
lost, even if nobody took it yet (the lost-lock rule)."""

DONE: Final = f"""
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

SELECT_ONE: Final = _SELECT_ROWS + " AND feature = %(feature)s"
SELECT_HELD: Final = _SELECT_ROWS + ' AND pid IS NOT NULL ORDER BY feature COLLATE "C"'
SELECT_WANTED: Final = _SELECT_ROWS + " AND pid IS NOT NULL AND feature = ANY(%(features)s::text[])"
SELECT_ALL: Final = _SELECT_ROWS + ' ORDER BY feature COLLATE "C"'

VERIFY: Final = """
SELECT EXISTS (SELECT FROM mahabharatha.mahabharatha_locks
    WHERE namespace = %(ns)s AND feature = %(feature)s
    AND token = %(token)s AND pid IS NOT NULL AND expires_at >= now())"""

IS_DONE: Final = """
SELECT EXISTS (SELECT FROM mahabharatha.mahabharatha_locks
    WHERE namespace = %(ns)s AND feature = %(feature)s
    AND done_at IS NOT NULL)"""

REOPEN: Final = """
UPDATE mahabharatha.mahabharatha_locks
SET done_at = NULL, failures = 0, failed = false, last_failure = NULL
WHERE namespace = %(ns)s AND feature = %(feature)s AND (done_at IS NOT NULL OR failures > 0)
RETURNING 1"""

FAIL: Final = f"""
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

FAILED_AND_RETRIED: Final = """
SELECT feature, failed FROM mahabharatha.mahabharatha_locks
WHERE namespace = %(ns)s AND failures > 0 AND (failed OR (feature = ANY(%(features)s::text[])
    AND pid IS NULL AND done_at IS NULL))"""

ATTEMPTS: Final = """
SELECT feature, failures, failed, last_failure FROM mahabharatha.mahabharatha_locks
WHERE namespace = %(ns)s AND failures > 0"""

CLEAN: Final = f"""
UPDATE mahabharatha.mahabharatha_locks SET {_LET_GO}
WHERE namespace = %(ns)s AND pid IS NOT NULL AND feature = ANY(%(features)s::text[])
    AND (expires_at < now() OR token = ANY(%(judged)s::bigint[]))
RETURNING feature"""

SCHEMA_VERSION_QUERY: Final = "SELECT max(version) FROM mahabharatha.mahabharatha_schema"

SEQUENCE_MISSING: Final = "SELECT to_regclass('mahabharatha.mahabharatha_lock_token') IS NULL"
TABLE_EXISTS: Final = "SELECT to_regclass('mahabharatha.mahabharatha_locks') IS NOT NULL"
ROWS_EXIST: Final = "SELECT EXISTS (SELECT FROM mahabharatha.mahabharatha_locks)"
SEQUENCE_ABOVE_ROWS: Final = """
SELECT setval('mahabharatha.mahabharatha_lock_token', greatest(
    (SELECT max(token) FROM mahabharatha.mahabharatha_locks),
    (SELECT last_value FROM mahabharatha.mahabharatha_lock_token)))"""
"""``lock init`` puts a sequence made again (dropped, or a table restored without it) above every
token the rows hold."""

SLOTS: Final = """
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
database (the server's own processes lack one or both); a parallel or replication worker is
counted too, the error on the side of "taken". The function under ``pg_stat_activity``, without
the view's joins."""

SESSION_SET_UP: Final = """
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
(``direct``) is pinned for its life: ``synchronous_commit`` ``on`` (durable locks and tokens),
read committed (no serialization failures in a claim storm), ``search_path`` only the
system's. A standby, or a read-only session (``default_transaction_read_only``), is refused: it
would answer ``verify`` and ``check`` from a copy that may be behind the primary. The last
column: the lock table exists in an older layout (no ``last_failure``): brought up to date now.

``direct``: the server process answering is the one the connection's start named (its
``BackendKeyData``). A pooler (PgBouncer) names a process of its own: then the session is not
ours (a transaction-mode pooler runs each transaction on any server connection, where another
client's ``SET`` stays), so nothing is set here: every transaction pins its own
(``PIN_SETTINGS``), and no named prepared statement is used (another client's would run)."""

BEGIN: Final = "BEGIN ISOLATION LEVEL READ COMMITTED"
"""An explicit transaction, ended by its own COMMIT before what follows in a pipeline."""

PIN_SETTINGS: Final = """
SELECT pg_catalog.set_config('synchronous_commit', 'on', true),
    pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true)"""
"""Behind a pooler, first in every transaction (``BEGIN ISOLATION LEVEL READ COMMITTED``, sent
in the same pipeline): what another client of the pool may have ``SET`` on the server
connection cannot reach the statement that follows (durability at its commit, names parsed
after it). Times and bytes are read in binary, so ``extra_float_digits``, ``DateStyle``,
``TimeZone``, ``IntervalStyle`` and ``bytea_output`` decide nothing."""

OLD_TABLES: Final = """
SELECT n.nspname FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relname = 'mahabharatha_locks' AND c.relkind IN ('r', 'p')
    AND n.nspname <> %(schema)s AND pg_catalog.pg_has_role(c.relowner, 'USAGE')
    AND pg_catalog.obj_description(c.oid, 'pg_class') IS DISTINCT FROM %(mark)s
ORDER BY 1"""
"""Lock tables this role owns in other schemas: an older mahabharatha made them in the first
schema of its ``search_path``. Another role's tables are never ours (a role with CREATE on the
database could make a schema named like ours, with tables to shadow them)."""
