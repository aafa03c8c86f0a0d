"""A throw-away PostgreSQL server for the tests and the benchmarks.

A copy of a template cluster (``initdb`` and the roles below, made once per process) in a
temporary folder, then the server listens on a Unix socket in that folder and on a loopback
port. PostgreSQL refuses to run as root, so under root (CI) the folder is handed to an
unprivileged user (``postgres`` if the system has one, else ``nobody``) and every server
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
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

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
LOCK_SCHEMA: Final = "mahabharatha"
"""Where the backend keeps its tables (its default schema)."""
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
    settings: dict[str, str] = field(default_factory=dict)
    """Server settings (``-c name=value``) besides the suite's own, e.g. ``max_connections``."""
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
            os.chown(pwfile, entry.pw_uid, entry.pw_gid)
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
        options += "".join(f" -c {name}={value}" for name, value in self.settings.items())
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
            # The tests' own SQL names the lock tables bare; the backend names their schema.
            admin.execute(f"ALTER ROLE {ADMIN_USER} SET search_path = {LOCK_SCHEMA}, public")
            admin.execute(f"ALTER DATABASE {DATABASE} SET search_path = {LOCK_SCHEMA}, public")

    def cleanup(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)


def _literal(text: str) -> str:
    """A SQL string literal (for the fixture's own DDL, which takes no parameters)."""
    return "'" + text.replace("'", "''") + "'"


def start_server(settings: dict[str, str] | None = None) -> PgServer:
    """A copy of the template cluster, started (with ``settings`` besides the suite's own);
    the caller stops and cleans up."""
    bindir = server_bindir()
    if bindir is None:
        raise RuntimeError(INSTALL_HINT)
    user = _server_user()
    template = _template(bindir, user)
    server = _new_server(bindir, user, settings)
    try:
        subprocess.run(["cp", "-a", str(template), str(server.data)], check=True)
        server.start()
    except BaseException:
        server.stop("immediate")
        server.cleanup()
        raise
    return server


def _new_server(bindir: Path, user: str | None, settings: dict[str, str] | None) -> PgServer:
    # Under root: /tmp, where the server's user can reach the folder (TMPDIR may be private).
    base = Path(tempfile.mkdtemp(prefix="mh-pg-", dir="/tmp" if user else None))
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(base, entry.pw_uid, entry.pw_gid)
    return PgServer(bindir, base, _free_port(), user, dict(settings or {}))


_TEMPLATE: dict[str, Path] = {}


def _template(bindir: Path, user: str | None) -> Path:
    """The data folder of a stopped cluster with the suite's roles and database, made on first
    use by this process and removed when it exits: a server copies it (``cp -a`` of a stopped
    cluster) instead of paying ``initdb`` and ``CREATE DATABASE`` each time."""
    if "data" not in _TEMPLATE:
        server = _new_server(bindir, user, None)
        try:
            server.init()
            server.start()
            server.create_roles()
            server.stop()  # a clean shutdown: its copies start without recovery
            if (server.data / "postmaster.pid").exists():  # a copy of a live cluster is no template
                raise RuntimeError(f"the template cluster in {server.data} did not stop")
        except BaseException:
            server.stop("immediate")
            server.cleanup()
            raise
        owner = os.getpid()
        atexit.register(lambda: server.cleanup() if os.getpid() == owner else None)
        _TEMPLATE["data"] = server.data
    return _TEMPLATE["data"]


@contextlib.contextmanager
def private_server(settings: dict[str, str] | None = None) -> Iterator[PgServer]:
    """A server of the test's own, configured with ``settings`` (for faults that would disturb
    the shared one: crash restarts, server-wide settings); stopped and removed after."""
    missing = client_missing()
    if missing is not None:
        import pytest

        pytest.skip(missing)
    server = start_server(settings)
    try:
        yield server
    finally:
        server.stop("immediate")
        server.cleanup()


def crash_restart(server: PgServer) -> None:
    """SIGKILL one server process (the OOM killer's way): the postmaster ends every session,
    drops shared memory (WAL not yet written with it) and recovers from the WAL on disk.
    Returns once the server accepts connections again."""
    import psycopg

    witness = psycopg.connect(server.admin_url(), autocommit=True)
    with psycopg.connect(server.admin_url(), autocommit=True) as victim:
        found = victim.execute("SELECT pg_backend_pid()").fetchone()
        assert found is not None
        os.kill(int(found[0]), signal.SIGKILL)

    def witness_ended() -> bool:  # the reset has begun: every session was ended
        try:
            witness.execute("SELECT 1")
        except psycopg.Error:
            return True
        return False

    try:
        assert wait_until(witness_ended, timeout=START_TIMEOUT_SECONDS), "no crash reset"
    finally:
        witness.close()

    def answers() -> bool:
        try:
            with psycopg.connect(server.admin_url(), autocommit=True, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

    assert wait_until(answers, timeout=START_TIMEOUT_SECONDS), "no crash restart"


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


class FreezingProxy:
    """A TCP relay to a server that freezes a connection for good (forwards nothing more, closes
    nothing) once its client sends a statement holding ``freeze_on``: a link that dies after
    login without a word, as a dead host behind a live route does. ``frozen`` is set then."""

    def __init__(self, target_port: int, freeze_on: bytes = b"LISTEN") -> None:
        import threading

        self.freeze_on = freeze_on
        self.frozen = threading.Event()
        self.answers = 0  # chunks the server sent its clients: a round trip is answered once
        self._target = ("127.0.0.1", target_port)
        self._listening = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listening.getsockname()[1])
        self._sockets: list[socket.socket] = [self._listening]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                client, _ = self._listening.accept()
            except OSError:
                return
            server = socket.create_connection(self._target)
            self._sockets += [client, server]
            stuck = threading.Event()
            for source, sink, watch in ((client, server, True), (server, client, False)):
                threading.Thread(
                    target=self._pump, args=(source, sink, watch, stuck), daemon=True
                ).start()

    def _pump(self, source: socket.socket, sink: socket.socket, watch: bool, stuck: Any) -> None:
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                return
            if not data:
                return
            self.answers += not watch
            if watch and self.freeze_on in data:
                stuck.set()
                self.frozen.set()
            if stuck.is_set():
                continue  # frozen: swallowed, never answered
            with contextlib.suppress(OSError):
                sink.sendall(data)

    def url(self, password: str = APP_PASSWORD, database: str = DATABASE) -> str:
        secret = urllib.parse.quote(password, safe="")
        return f"postgresql://{APP_USER}:{secret}@127.0.0.1:{self.port}/{database}"

    def close(self) -> None:
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()


PGBOUNCER_HINT: Final = (
    "PgBouncer was not found: install it (Debian/Ubuntu: apt-get install pgbouncer)"
)


def pgbouncer_binary() -> str | None:
    found = shutil.which("pgbouncer")
    if found is None and os.access("/usr/sbin/pgbouncer", os.X_OK):
        found = "/usr/sbin/pgbouncer"
    return found


@contextlib.contextmanager
def pgbouncer(
    server: PgServer, pool_mode: str = "transaction", pool_size: int = 2
) -> Iterator[int]:
    """A PgBouncer in front of ``server`` (reaching it over its trusted Unix socket), in
    ``pool_mode`` with ``pool_size`` server connections per database and user; its port."""
    binary = pgbouncer_binary()
    if binary is None:
        import pytest

        pytest.skip(PGBOUNCER_HINT)
    base = Path(tempfile.mkdtemp(prefix="mh-pgb-", dir="/tmp" if server.user else None))
    port = _free_port()
    (base / "users.txt").write_text(f'"{APP_USER}" ""\n"{ADMIN_USER}" ""\n')
    (base / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={server.socket_dir} port={server.port}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {base / 'users.txt'}\n"
        f"pool_mode = {pool_mode}\ndefault_pool_size = {pool_size}\nmax_client_conn = 500\n"
        f"logfile = {base / 'pgbouncer.log'}\npidfile = {base / 'pgbouncer.pid'}\n"
    )
    command = [binary, str(base / "pgbouncer.ini")]
    if server.user is not None:  # PgBouncer refuses to run as root
        entry = pwd.getpwnam(server.user)
        for path in (base, *base.iterdir()):
            os.chown(path, entry.pw_uid, entry.pw_gid)
        command = ["runuser", "-u", server.user, "--", *command]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:

        def accepting() -> bool:
            with socket.socket() as probe:
                return probe.connect_ex(("127.0.0.1", port)) == 0

        assert wait_until(accepting, timeout=30), "PgBouncer did not start"
        yield port
    finally:
        process.terminate()
        try:
            process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def standby_of(primary: PgServer) -> Iterator[PgServer]:
    """A hot standby streaming from ``primary`` (``pg_basebackup -R``), on a port of its own."""
    standby = _new_server(primary.bindir, primary.user, None)
    try:
        standby._run(
            "pg_basebackup", "-D", str(standby.data), "-R", "-X", "stream", "-c", "fast",
            "-h", primary.socket_dir, "-p", str(primary.port), "-U", ADMIN_USER,
        )  # fmt: skip
        standby.start()
        yield standby
    finally:
        standby.stop("immediate")
        standby.cleanup()


# --------------------------------------------------------------------------- the hostile server

HOSTILE_SCHEMA: Final = "hostile"
"""First in the hostile ``search_path``, with tables named like the lock tables (another role's)."""
HOSTILE_SETTINGS: Final = {
    "synchronous_commit": "off",
    "default_transaction_isolation": "serializable",
    "extra_float_digits": "-9",
    "standard_conforming_strings": "off",
    "TimeZone": "Pacific/Chatham",
    "DateStyle": "SQL, DMY",
    "IntervalStyle": "sql_standard",
    "bytea_output": "escape",
    "search_path": f"{HOSTILE_SCHEMA}, public",
    "statement_timeout": "60s",
    "lock_timeout": "60s",
    "idle_in_transaction_session_timeout": "60s",
}
"""Every setting a statement could rely on, flipped as the database's and the app role's
defaults (the timeouts long enough to be harmless)."""
NEIGHBOUR_SETS: Final = (
    "SET synchronous_commit = off",
    "SET default_transaction_isolation = 'repeatable read'",
    "SET extra_float_digits = -15",
    f"SET search_path = {HOSTILE_SCHEMA}, pg_catalog",
    "SET bytea_output = 'escape'",
    "SET IntervalStyle = 'postgres_verbose'",
    "SET standard_conforming_strings = off",
    "SET TimeZone = 'America/St_Johns'",
    "SET default_transaction_isolation = 'serializable'",
)
"""What the neighbour behind the same pooler sets, one statement at a time: each stays on the
server connection it ran on, which the pooler then hands to the next client."""
NEIGHBOUR_PAUSE_SECONDS: Final = 0.02
"""A `SET` stays on its server connection until the next: a few a second keep both changing
(and the fixture costs the session next to nothing)."""


@dataclass
class HostileServer:
    """A server whose database and role defaults flip every setting, PgBouncer in transaction
    mode in front, and a neighbour client of the same pool that keeps running ``SET``."""

    server: PgServer
    pooler_port: int
    stop_neighbour: Any
    neighbour_sets: list[int] = field(default_factory=lambda: [0])

    def url(self) -> str:
        """The app role's URL through the pooler (what the tests use)."""
        return f"postgresql://{APP_USER}@127.0.0.1:{self.pooler_port}/{DATABASE}"


def make_hostile(server: PgServer) -> None:
    """Flip ``HOSTILE_SETTINGS`` on ``server``'s database and app role, and put another role's
    look-alike lock tables first in the ``search_path`` (readable and writable by the app)."""
    statements = [
        f"CREATE SCHEMA {HOSTILE_SCHEMA}",
        f"CREATE TABLE {HOSTILE_SCHEMA}.mahabharatha_locks (namespace text, feature text)",
        f"CREATE TABLE {HOSTILE_SCHEMA}.mahabharatha_schema (version integer)",
        f"INSERT INTO {HOSTILE_SCHEMA}.mahabharatha_schema VALUES (99)",
        f"GRANT USAGE ON SCHEMA {HOSTILE_SCHEMA} TO {APP_USER}",
        f"GRANT ALL ON ALL TABLES IN SCHEMA {HOSTILE_SCHEMA} TO {APP_USER}",
    ]
    for name, value in HOSTILE_SETTINGS.items():
        written = value if name == "search_path" else _literal(value)  # a list, not one name
        statements.append(f"ALTER DATABASE {DATABASE} SET {name} = {written}")
        statements.append(f"ALTER ROLE {APP_USER} SET {name} = {written}")
    for statement in statements:
        admin_execute(server, statement)


def _neighbour(url: str, stop: Any, count: list[int]) -> None:
    """Run ``NEIGHBOUR_SETS`` round and round through the pooler until ``stop`` is set."""
    import psycopg

    while not stop.is_set():
        try:
            with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
                while not stop.wait(NEIGHBOUR_PAUSE_SECONDS):
                    conn.execute(NEIGHBOUR_SETS[count[0] % len(NEIGHBOUR_SETS)])
                    count[0] += 1
        except psycopg.Error:
            stop.wait(0.1)  # the pooler restarting between tests of a module: connect again


def hostile_server() -> HostileServer:
    """The session's hostile server (started on first call, stopped when the session's
    process exits; never by a forked child)."""
    if "hostile" not in _SHARED_HOSTILE:
        import threading

        missing = client_missing() or (None if pgbouncer_binary() else PGBOUNCER_HINT)
        if missing is not None:
            raise RuntimeError(missing)
        stack = contextlib.ExitStack()
        started = start_server()
        stack.callback(started.cleanup)
        stack.callback(started.stop, "immediate")
        make_hostile(started)
        port = stack.enter_context(pgbouncer(started, "transaction", 2))
        stop = threading.Event()
        hostile = HostileServer(started, port, stop)
        url = hostile.url()
        threading.Thread(
            target=_neighbour, args=(url, stop, hostile.neighbour_sets), daemon=True
        ).start()
        stack.callback(stop.set)
        owner = os.getpid()

        def close() -> None:
            if os.getpid() == owner:
                stack.close()

        atexit.register(close)
        _SHARED_HOSTILE["hostile"] = hostile
    return _SHARED_HOSTILE["hostile"]


_SHARED_HOSTILE: dict[str, HostileServer] = {}


class TurnsSeen:
    """Stands in for a backend's ``_one_operation`` lock and tells a test, through
    ``decided``, that a second thread's operation had to wait for the first's (``waited``)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.decided = threading.Event()
        self.waited = False

    def __enter__(self) -> TurnsSeen:
        if not self.lock.acquire(blocking=False):
            self.waited = True
            self.decided.set()
            self.lock.acquire()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.lock.release()
