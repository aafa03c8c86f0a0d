"""A throw-away PostgreSQL server for the tests and the benchmarks.

``initdb`` into a temporary folder, then the server listens on a Unix socket in that folder and
on a loopback port. PostgreSQL refuses to run as root, so under root (CI) the folder is handed to
an unprivileged user (``postgres`` if the system has one, else ``nobody``) and every server
program runs as that user through ``runuser``.

Two roles: the superuser ``mh_admin`` (password ``ADMIN_PASSWORD``; trusted on the socket) for
the tests' own inspection and faults, and ``mh_app`` (password ``APP_PASSWORD``), which owns the
database ``mh`` where the lock tables live.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

REQUIRE_ENV: Final = "MAHABHARATHA_REQUIRE_POSTGRES"
"""Set to 1 (CI does): a PostgreSQL test that would skip fails instead."""
INSTALL_HINT: Final = (
    "PostgreSQL server binaries (initdb, pg_ctl, postgres) were not found: install them "
    "(Debian/Ubuntu: apt-get install postgresql) and the client (in the checkout: pip "
    "install '.[postgres]') to run these tests"
)
ADMIN_USER: Final = "mh_admin"
ADMIN_PASSWORD: Final = "adm1n-S3cret-pw"
APP_USER: Final = "mh_app"
APP_PASSWORD: Final = "app-Pa55-'quoted\"-secret"
"""With quotes in it: the URL must carry it percent-encoded, and it must never be shown."""
DATABASE: Final = "mh"
START_TIMEOUT_SECONDS: Final = 60
"""pg_ctl -w waits this long for the server to accept connections (a busy 2-core machine)."""


BINDIR_ENV: Final = "MAHABHARATHA_PG_BINDIR"
"""Where the server binaries are, when not on PATH or in Debian's /usr/lib/postgresql/*/bin."""


def server_bindir() -> Path | None:
    """The folder with initdb, pg_ctl and postgres, or None when PostgreSQL is not installed."""
    chosen = os.environ.get(BINDIR_ENV)
    if chosen is not None:
        candidates = [chosen]
    else:
        found = shutil.which("pg_ctl")
        candidates = [str(Path(found).resolve().parent)] if found else []
        candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for folder in candidates:
        if all(os.access(Path(folder, tool), os.X_OK) for tool in ("initdb", "pg_ctl", "postgres")):
            return Path(folder)
    return None


def client_missing() -> str | None:
    """Why the PostgreSQL tests cannot run here, or None when they can."""
    if server_bindir() is None:
        return INSTALL_HINT
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed: pip install '.[postgres]' in the checkout"
    return None


def _server_user() -> str | None:
    """The unprivileged user to run the server as (None: we are not root, run as ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise RuntimeError("running as root and no unprivileged user (postgres, nobody) to run as")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class PgServer:
    """One running server; ``url()`` gives libpq URLs for it."""

    bindir: Path
    base: Path
    port: int
    user: str | None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.base / "server.log"

    @property
    def data(self) -> Path:
        return self.base / "data"

    @property
    def socket_dir(self) -> str:
        return str(self.base)

    # ------------------------------------------------------------------ URLs

    def url(
        self,
        *,
        tcp: bool = False,
        role: str = APP_USER,
        password: str | None = None,
        database: str = DATABASE,
    ) -> str:
        """A URL for ``role``: over the Unix socket (trusted, no password) or TCP."""
        who = urllib.parse.quote(role, safe="")
        if password is not None:
            who += ":" + urllib.parse.quote(password, safe="")
        if tcp:
            return f"postgresql://{who}@127.0.0.1:{self.port}/{database}"
        host = urllib.parse.quote(self.socket_dir, safe="")
        return f"postgresql://{who}@{host}:{self.port}/{database}"

    def admin_url(self) -> str:
        return self.url(role=ADMIN_USER)

    # ------------------------------------------------------------------ life cycle

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(self.bindir / argv[0]), *argv[1:]]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        return subprocess.run(
            command, capture_output=True, text=True, check=check, timeout=START_TIMEOUT_SECONDS + 30
        )

    def init(self) -> None:
        pwfile = self.base / "pw"
        pwfile.write_text(ADMIN_PASSWORD + "\n")
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            for path in (self.base, pwfile):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            ADMIN_USER,
            f"--pwfile={pwfile}",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "-E",
            "UTF8",
            "--no-sync",
        )
        pwfile.unlink()

    def start(self) -> None:
        options = (
            f"-k {self.socket_dir} -p {self.port} -h 127.0.0.1 -c fsync=off "
            "-c full_page_writes=off -c max_connections=200 -c shared_buffers=32MB"
        )
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-o",
            options,
            "-w",
            "-t",
            str(START_TIMEOUT_SECONDS),
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self.resume()  # a frozen postmaster cannot stop
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def restart(self) -> None:
        self.stop()
        self.start()

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def freeze(self) -> None:
        """SIGSTOP the postmaster: new connections are accepted by the kernel, never answered."""
        os.kill(self.postmaster_pid(), signal.SIGSTOP)

    def resume(self) -> None:
        with contextlib.suppress(OSError, ValueError, IndexError):  # not running
            os.kill(self.postmaster_pid(), signal.SIGCONT)

    def create_roles(self) -> None:
        import psycopg

        maintenance = self.url(role=ADMIN_USER, database="postgres")
        with psycopg.connect(maintenance, autocommit=True) as admin:
            admin.execute(f"CREATE ROLE {APP_USER} LOGIN PASSWORD {_literal(APP_PASSWORD)}")
            admin.execute(f"CREATE DATABASE {DATABASE} OWNER {APP_USER}")

    def cleanup(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)


def _literal(text: str) -> str:
    """A SQL string literal (for the fixture's own DDL, which takes no parameters)."""
    return "'" + text.replace("'", "''") + "'"


def start_server() -> PgServer:
    """initdb, start, create the roles; the caller stops and cleans up."""
    bindir = server_bindir()
    if bindir is None:
        raise RuntimeError(INSTALL_HINT)
    user = _server_user()
    # Under root: /tmp, where the server's user can reach the folder (TMPDIR may be private).
    base = Path(tempfile.mkdtemp(prefix="mh-pg-", dir="/tmp" if user else None))
    server = PgServer(bindir, base, _free_port(), user)
    try:
        server.init()
        server.start()
        server.create_roles()
    except BaseException:
        server.stop("immediate")
        server.cleanup()
        raise
    return server


def wait_until(predicate: object, timeout: float = 10.0) -> bool:
    """Poll ``predicate()`` (a condition on the server, which offers no event to wait on)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


def admin_execute(server: PgServer, query: str, *params: object) -> list[tuple[object, ...]]:
    """Run one statement as the superuser in the locks' database (inspection and faults)."""
    import psycopg

    with psycopg.connect(server.admin_url(), autocommit=True) as admin:
        cursor = admin.execute(query, params or None)
        return cursor.fetchall() if cursor.description else []


def expire(server: PgServer, namespace: str, feature: str) -> None:
    """Make a lock's lease run out now, by the server's clock (no waiting in the test)."""
    admin_execute(
        server,
        "UPDATE mahabharatha_locks SET expires_at = now() - interval '1 second'"
        " WHERE namespace = %s AND feature = %s",
        namespace,
        feature,
    )


_SHARED: dict[str, PgServer] = {}
"""The session's one server, started on first use by any test (fixture or conformance kind)."""


def shared_server() -> PgServer:
    """The test session's server: started on first call, stopped when the session's process
    exits (never by a forked child, which shares the object)."""
    if "server" not in _SHARED:
        missing = client_missing()
        if missing is not None:
            raise RuntimeError(missing)
        started = start_server()
        owner = os.getpid()

        def stop() -> None:
            if os.getpid() == owner:
                started.stop("immediate")
                started.cleanup()

        atexit.register(stop)
        _SHARED["server"] = started
    return _SHARED["server"]
