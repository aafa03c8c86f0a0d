"""The PostgreSQL backend's tables and every SQL text it sends. Every value is a parameter,
except a registered claim's namespace and names, which psycopg quotes (``sql.Literal``); no
input is ever spliced into SQL text by hand. Another schema than ``mahabharatha``: ``_sql``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from psycopg import sql

from mahabharatha.owner import ownership

SCHEMA_VERSION: Final = 2  # the tables' layout (a newer one is refused, never rewritten)
# The lock table's comment: tables without it elsewhere are an older mahabharatha's.
NAMED_BY_SCHEMA: Final = "mahabharatha locks, named with their schema"
# Only when missing: even IF NOT EXISTS needs CREATE on the database, which the owner may lack.
CREATE_SCHEMA: Final = "CREATE SCHEMA IF NOT EXISTS mahabharatha"
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

# Times as epoch seconds (``date_part``: a float8 at once, where ``extract`` makes a numeric).
_EPOCHS: Final = """date_part('epoch', refreshed_at), date_part('epoch', expires_at),
    date_part('epoch', now())"""

_TAKE_SET: Final = """pid = %(pid)s, details = %(details)s, host = %(host)s, attempt = %(attempt)s,
    lease = make_interval(secs => %(lease)s), acquired_at = now(), refreshed_at = now(),
    expires_at = now() + make_interval(secs => %(lease)s),
    token = greatest(nextval('mahabharatha.mahabharatha_lock_token'), l.token + 1),
    prev_pid = l.pid, prev_details = l.details, prev_refreshed_at = l.refreshed_at,
    prev_expires_at = l.expires_at"""
"""Taking a row: the new holder, the old one kept for the audit trail, and a token drawn while
the row is locked, above the row's last (a reset sequence cannot hand out an old holder's)."""

_TAKEABLE: Final = """(l.pid IS NULL OR l.expires_at < now() OR l.token = ANY(%(judged)s::bigint[])
    OR l.attempt = %(attempt)s)"""
"""Free, expired by the server's clock, judged dead (that token), or our own lost attempt."""


def _rested(row: str) -> str:
    """The row's rest (``--retry-delay``) after its last failed attempt is over, by the
    server's clock (an older client's ``at`` counts no later than now)."""
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

_TAKEN: Final = f"""taken AS (
    UPDATE mahabharatha.mahabharatha_locks l SET {_TAKE_SET}
    FROM pick WHERE l.namespace = pick.namespace AND l.feature = pick.feature
    RETURNING {_RETURNING}
)"""  # the row ``pick`` chose, taken

# The names travel as one text joined by newlines: cheaper for psycopg than a list.
CLAIM_CHECKED: Final = f"""
WITH wanted AS (
    SELECT w.feature, w.ord
    FROM unnest(string_to_array(%(names)s, pg_catalog.chr(10))) WITH ORDINALITY AS w(feature, ord)
), missing AS (
    SELECT count(*) AS n FROM wanted w WHERE NOT EXISTS (
        SELECT FROM mahabharatha.mahabharatha_locks m
        WHERE m.namespace = %(ns)s AND m.feature = w.feature)
), pick AS (
    SELECT l.namespace, l.feature
    FROM mahabharatha.mahabharatha_locks l JOIN wanted w USING (feature)
    WHERE l.namespace = %(ns)s AND (SELECT n FROM missing) = 0 AND {_TAKEABLE}
        AND ((%(include_done)s AND NOT l.failed) OR l.done_at IS NULL OR l.attempt = %(attempt)s)
        AND {_rested("l")}
    ORDER BY l.attempt IS NOT DISTINCT FROM %(attempt)s DESC, w.ord
    LIMIT 1
    FOR UPDATE OF l SKIP LOCKED
), {_TAKEN}
SELECT (SELECT n FROM missing), taken.* FROM (VALUES (1)) AS one LEFT JOIN taken ON true"""
"""The first takeable feature in the given order. Race: ``SKIP LOCKED`` passes over a row being
taken, and the conditions are checked again on its latest version once locked. With rows
missing nothing is taken (``ENSURE_ROWS`` first). Our own lost attempt comes first."""

CLAIM_SORTED: Final = f"""
WITH pick AS (
    SELECT l.namespace, l.feature FROM mahabharatha.mahabharatha_locks l
    WHERE l.namespace = %(ns)s AND l.feature = ANY(string_to_array(%(names)s, pg_catalog.chr(10)))
        AND {_TAKEABLE} AND ((%(include_done)s AND NOT l.failed) OR l.done_at IS NULL)
        AND {_rested("l")}
    ORDER BY l.feature
    LIMIT 1
    FOR UPDATE OF l SKIP LOCKED
), {_TAKEN}
SELECT 0, taken.* FROM (VALUES (1)) AS one LEFT JOIN taken ON true"""
"""A pool's hot path: sorted names whose rows were seen; the scan walks the primary key
(``COLLATE "C"``) and stops at the first takeable row."""

REGISTERED_PARAMS: Final = ("pid", "details", "host", "attempt", "lease", "rest")  # $n order


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
"""``CLAIM_SORTED`` with the namespace and names written in (``sql.Literal``), prepared (planned)
once per connection. Takeable: free or expired only (``--reclaim-dead``, retries: the others)."""

ENSURE_ROWS: Final = """
INSERT INTO mahabharatha.mahabharatha_locks (namespace, feature)
SELECT %(ns)s, w.feature FROM unnest(string_to_array(%(names)s, pg_catalog.chr(10))) AS w(feature)
ORDER BY w.feature
ON CONFLICT DO NOTHING"""
"""Rows for features never locked before (sorted: concurrent claimers cannot deadlock)."""

WAKE: Final = "SELECT pg_catalog.pg_notify(%(channel)s, '')"
"""The wake-up after a committed change, in a transaction of its own: one that cannot be queued
never undoes the release. No payload: any role may LISTEN, and would learn feature names."""


def listen(verb: str, channel: str) -> sql.Composed:
    """``LISTEN``/``UNLISTEN`` of ``channel``, quoted as an identifier (it takes no parameter)."""
    return sql.SQL("{} {}").format(sql.SQL(verb), sql.Identifier(channel))


_LET_GO: Final = "pid = NULL, details = NULL, host = NULL, attempt = NULL"

_RELEASE_HELD: Final = f"""
UPDATE mahabharatha.mahabharatha_locks SET {_LET_GO}
WHERE namespace = %(ns)s AND feature = %(feature)s AND token = %(token)s AND pid IS NOT NULL
RETURNING 1"""

ACQUIRE_PARAMS: Final = ("ns", "feature", "pid", "details", "host", "attempt", "lease", "judged")
# The hot path's two statements with ``$n`` parameters, for the kept ``RawCursor``.
ACQUIRE_NUMBERED: Final = _numbered(_ACQUIRE, ACQUIRE_PARAMS)
RELEASE_HELD_NUMBERED: Final = _numbered(_RELEASE_HELD, ("ns", "feature", "token"))

_OWNER_COULD_BE: Final = ownership.could_own_sql("details")
"""``ownership.could_own`` on the row's details, generated, so judged and removed in one step
(``place``, ``start``: ``_owner_params``); ``tests/postgres/test_owner_rule_sql.py`` pins it."""

RELEASE_PID: Final = f"""
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
"""Only an unexpired lock is renewed: a lease run out is lost, taken or not."""
REFRESH_NUMBERED: Final = _numbered(_REFRESH, ("ns", "feature", "token"))  # the kept cursor's

DONE: Final = f"""
UPDATE mahabharatha.mahabharatha_locks
SET pid = NULL, details = NULL, host = NULL, attempt = %(attempt)s,
    done_at = CASE WHEN pid IS NULL THEN done_at ELSE now() END
WHERE namespace = %(ns)s AND feature = %(feature)s AND (
    (pid = %(pid)s AND host IS NOT DISTINCT FROM %(host)s AND {_OWNER_COULD_BE})
    OR (pid IS NULL AND done_at IS NOT NULL AND attempt = %(attempt)s))
RETURNING date_part('epoch', done_at)"""
"""Mark done and release: both or neither. A retry after a lost answer finds its own mark by
the attempt id, never "not held"."""

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
"""Record a failed attempt and release: both or neither. At the limit the feature is closed as
a done one is, flagged ``failed``; ``at`` is the server's clock (hosts' clocks differ)."""

FINISHED_AND_RESTING: Final = """
SELECT feature, failed, done_at IS NOT NULL FROM mahabharatha.mahabharatha_locks
WHERE namespace = %(ns)s AND (failed OR (feature = ANY(%(features)s::text[]) AND pid IS NULL
    AND (done_at IS NOT NULL OR failures > 0)))"""
"""Why a pool's claim took none of ``features`` that nobody holds: done, failed (any feature of
the namespace), or open after a failed attempt (resting, if a ``--retry-delay`` says so)."""

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
"""``lock init`` puts a sequence made again above every token the rows hold."""

_TIGHTEST_LIMIT: Final = """
WITH counted AS ({counted}), limits AS (
    SELECT pg_catalog.current_setting('max_connections')::int
        - pg_catalog.current_setting('superuser_reserved_connections')::int
        - coalesce(pg_catalog.current_setting('reserved_connections', true)::int, 0) AS usable,
        (SELECT coalesce(pg_catalog.sum(n), 0) FROM counted)::int AS taken
    UNION ALL
    SELECT r.rolconnlimit,
        (SELECT coalesce(pg_catalog.sum(n), 0) FROM counted WHERE {of_role})::int
    FROM pg_catalog.pg_roles AS r WHERE r.rolname = session_user AND r.rolconnlimit >= 0
    UNION ALL
    SELECT d.datconnlimit,
        (SELECT coalesce(pg_catalog.sum(n), 0) FROM counted WHERE datid = d.oid)::int
    FROM pg_catalog.pg_database AS d
    WHERE d.datname = pg_catalog.current_database() AND d.datconnlimit >= 0
)
SELECT usable, taken FROM limits ORDER BY usable - taken, usable LIMIT 1"""

SLOTS: Final = _TIGHTEST_LIMIT.format(
    counted="""
    SELECT a.usesysid, a.datid, 1 AS n FROM pg_catalog.pg_stat_get_activity(NULL) AS a
    WHERE a.backend_type = 'client backend'
        OR (a.backend_type IS NULL AND a.usesysid IS NOT NULL AND a.datid IS NOT NULL)""",
    of_role="usesysid = r.oid",
)
"""The tightest limit on this role's connections as (slots, taken): the server's, the login
role's and the database's, against the client sessions that count (unseen ones as taken)."""

SLOTS_BY_DATABASE: Final = _TIGHTEST_LIMIT.format(
    counted="""
    SELECT d.oid AS datid, pg_catalog.pg_stat_get_db_numbackends(d.oid) AS n
    FROM pg_catalog.pg_database AS d""",
    of_role="true",
)
""":data:`SLOTS` for a role that may not see the sessions: every database's backends, any of
them the login role's (workers that take no client slot too: too many rather than too few)."""

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
"""Once per connection: a standby's or read-only session is refused; a session of our own
(``direct``: no pooler in between) is pinned for its life (durable commits, read committed,
the system's ``search_path``); the last column: older tables to bring up to date."""

BEGIN: Final = "BEGIN ISOLATION LEVEL READ COMMITTED"

PIN_SETTINGS: Final = """
SELECT pg_catalog.set_config('synchronous_commit', 'on', true),
    pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true)"""
"""Behind a pooler, first in every transaction: another client's ``SET`` on the server
connection cannot reach what follows (times and bytes are read in binary)."""

OLD_TABLES: Final = """
SELECT n.nspname FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relname = 'mahabharatha_locks' AND c.relkind IN ('r', 'p')
    AND n.nspname <> %(schema)s AND pg_catalog.pg_has_role(c.relowner, 'USAGE')
    AND pg_catalog.obj_description(c.oid, 'pg_class') IS DISTINCT FROM %(mark)s
ORDER BY 1"""
"""Lock tables an older mahabharatha made for this role in other schemas (never another
role's: they could shadow ours)."""
