"""Where a PostgreSQL lock server is, and a connection that never waits past its deadline.

The server's address as messages show it (host, port, database; never the password), the URL
checks that keep a password out of every error, and :class:`Connection`, whose every wait for
the server is bounded. Imported only for a ``postgresql://`` URL (it needs psycopg).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Final

import psycopg
from psycopg.conninfo import conninfo_to_dict

__all__ = [
    "CONNECT_TIMEOUT_SECONDS",
    "Connection",
    "Server",
    "first_line",
    "password_of",
    "server_of",
]

CONNECT_TIMEOUT_SECONDS: Final = 5.0
"""How long a command waits for the server (to connect, and for any one answer)."""


class Connection(psycopg.Connection[Any]):
    """A connection whose every wait for the server ends within ``deadline`` seconds: a server
    that accepted the connection and then froze (SIGSTOP, a dead host behind a live link)
    answers nothing, and TCP alone would wait for minutes."""

    deadline: float = CONNECT_TIMEOUT_SECONDS
    pooled: bool = False
    """Behind a connection pooler (seen when the session is set up): no named prepared
    statements on it."""

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        # A caller's own timeout (notifies: what is left of a wait, possibly 0) stands as given.
        chosen = self.deadline if timeout is None else timeout
        return super().wait(gen, interval=interval, timeout=chosen)


@dataclass(frozen=True)
class Server:
    """Where the server is, for messages: never the password."""

    host: str
    port: str
    database: str

    def __str__(self) -> str:
        return f"{self.host}:{self.port}/{self.database}"


_MUST_BE_ENCODED: Final = re.compile(r"[@/?#\[\] ]|%(?![0-9A-Fa-f]{2})")
"""What a URL's user name and password may not hold as it is (RFC 3986 userinfo): an ``@`` made
libpq read the password's end as the host (and print it), a ``%``, space or ``[`` made its
parse error quote the password."""
_QUOTED: Final = re.compile(r'".*"', re.S)


def server_of(url: str) -> Server:
    """host, port and database of ``url`` as libpq would use them (its defaults and PG*
    variables), for messages only. A URL that libpq cannot parse, or whose password libpq would
    misread, is refused without a word of it (libpq's own error quotes the part it choked on)."""
    refuse_unencoded_userinfo(url)
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
    return Server(host, port, database)


def refuse_unencoded_userinfo(url: str) -> None:
    """ValueError (never quoting the URL) when its user name or password holds a character
    that must be percent-encoded there."""
    rest = url.partition("://")[2]
    before_query = rest.partition("?")[0]
    userinfo = before_query.rpartition("@")[0]
    if _MUST_BE_ENCODED.search(userinfo):
        raise ValueError(
            "not a valid PostgreSQL URL: its user name or password holds a character that must "
            "be percent-encoded there (@ as %40, / as %2F, % as %25, a space as %20, [ as %5B)"
        )


def login_name() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return "postgres"


def password_of(url: str) -> str | None:
    try:
        value = conninfo_to_dict(url).get("password")
    except psycopg.Error:
        return None
    return str(value) if value else os.environ.get("PGPASSWORD") or None


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0].strip() if text else type(error).__name__
