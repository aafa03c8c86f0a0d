"""Where a PostgreSQL lock server is (for messages: never the password), and
:class:`Connection`, whose every wait for the server is bounded."""

from __future__ import annotations

import ctypes
import os
import re
import sys
from functools import cache
from typing import Any, Final

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict
from psycopg.waiting import Wait

from mahabharatha.constants import CONNECT_TIMEOUT_SECONDS

SLOTS_TAKEN_SQLSTATE: Final = "53300"  # too_many_connections: any limit, any language
PQERRORS_VERBOSE: Final = 2  # libpq's PGVerbosity whose error text carries the SQLSTATE
_SQLSTATE_IN_TEXT: Final = re.compile(r"(\S+:  )([0-9A-Z]{5}): ")  # FATAL:  53300: ...
_LOCATION_LINE: Final = re.compile(r"^LOCATION: .*\n?", re.M)


class Connection(psycopg.Connection[Any]):
    """A connection whose every wait ends within ``deadline`` seconds: a frozen server answers
    nothing, and TCP alone would wait for minutes."""

    deadline: float = CONNECT_TIMEOUT_SECONDS
    pooled: bool = False  # behind a pooler (seen at set-up): no named prepared statements

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        # A caller's own timeout (notifies: what is left of a wait, possibly 0) stands as given.
        chosen = self.deadline if timeout is None else timeout
        return super().wait(gen, interval=interval, timeout=chosen)

    @classmethod
    def _connect_gen(cls, conninfo: str = "") -> Any:
        """``psycopg.generators.connect`` with libpq's verbose errors: a refusal carries the
        server's ``sqlstate`` (libpq keeps only the text of a failed connection)."""
        pgconn: Any = pq.PGconn.connect_start(conninfo.encode())
        libpq = _loaded_libpq()
        if libpq is not None:
            libpq.PQsetErrorVerbosity(ctypes.c_void_p(pgconn.pgconn_ptr), PQERRORS_VERBOSE)
        while True:
            if pgconn.status == pq.ConnStatus.BAD:
                raise _refusal(pgconn, "connection is bad")
            status = pgconn.connect_poll()
            if status == pq.PollingStatus.OK:
                break
            if status == pq.PollingStatus.READING or status == pq.PollingStatus.WRITING:
                wait = Wait.R if status == pq.PollingStatus.READING else Wait.W
                while not (yield pgconn.socket, wait):
                    pass
            elif status == pq.PollingStatus.FAILED:
                raise _refusal(pgconn, "connection failed")
            else:
                pgconn.finish()
                raise psycopg.InternalError(f"unexpected poll status: {status}")
        pgconn.nonblocking = 1
        return cls(pgconn)


def _refusal(pgconn: Any, what: str) -> psycopg.OperationalError:
    """A connection not made: libpq's default text, and the server's SQLSTATE if it sent one."""
    said = pgconn.get_error_message()
    pgconn.finish()
    found = _SQLSTATE_IN_TEXT.search(said)
    text = _LOCATION_LINE.sub("", _SQLSTATE_IN_TEXT.sub(r"\1", said))
    error = psycopg.OperationalError(f"{what}: {text}")
    error.sqlstate = found.group(2) if found else None
    return error


@cache
def _loaded_libpq() -> ctypes.CDLL | None:
    """The libpq psycopg runs on (psycopg-binary's own too), found in ``/proc/self/maps``."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = {line.split()[-1] for line in maps if "/libpq" in line}
    except OSError:
        return None
    for path in sorted(paths, key=lambda found: "psycopg" not in found):
        try:
            libpq = ctypes.CDLL(path)
            libpq.PQsetErrorVerbosity.argtypes = [ctypes.c_void_p, ctypes.c_int]
        except (OSError, AttributeError):
            continue
        return libpq
    return None


# What a URL's userinfo may not hold unencoded: libpq would print part of the password.
_MUST_BE_ENCODED: Final = re.compile(r"[@/?#\[\] ]|%(?![0-9A-Fa-f]{2})")
_QUOTED: Final = re.compile(r'".*"', re.S)


def server_of(url: str) -> str:
    """``host:port/database`` of ``url`` as libpq would use them, for messages (never the
    password); a URL libpq cannot parse, or would misread, is refused without quoting it."""
    userinfo = url.partition("://")[2].partition("?")[0].rpartition("@")[0]
    if _MUST_BE_ENCODED.search(userinfo):
        raise ValueError(
            "not a valid PostgreSQL URL: its user name or password holds a character that must "
            "be percent-encoded there (@ as %40, / as %2F, % as %25, a space as %20, [ as %5B)"
        )
    try:
        given = conninfo_to_dict(url)
    except psycopg.Error as error:
        reason = _QUOTED.sub("(not shown)", first_line(error))
        raise ValueError(f"not a valid PostgreSQL URL: {reason}") from None
    env = os.environ
    host = str(given.get("host") or env.get("PGHOST") or "localhost")
    port = str(given.get("port") or env.get("PGPORT") or "5432")
    user = str(given.get("user") or env.get("PGUSER") or login_name())
    database = str(given.get("dbname") or env.get("PGDATABASE") or user)
    return f"{host}:{port}/{database}"


def login_name() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return "postgres"


def password_of(url: str) -> str | None:
    """The password ``url`` (already read by :func:`server_of`) or ``PGPASSWORD`` gives."""
    value = conninfo_to_dict(url).get("password")
    return str(value) if value else os.environ.get("PGPASSWORD") or None


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0].strip() if text else type(error).__name__
