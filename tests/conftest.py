"""Suite-wide set-up: the PostgreSQL server that the PostgreSQL tests share, a SIGINT that
reaches the CLI processes the tests start, a run that fails when it leaves files behind, and
what keeps the run quick (one byte code cache for its processes, xdist workers that steal
work).

Any test that uses ``pg_server`` is marked ``postgres``. Without PostgreSQL (or psycopg) those
tests skip with a reason saying what to install; with ``MAHABHARATHA_REQUIRE_POSTGRES=1`` (CI) a
skipped ``postgres`` test is a failure instead, so CI can never pass without having run them.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from mahabharatha.owner import proof
from tests.support import load, postgres, runs_the_session

pytest_plugins = (
    "tests.support.tally",  # a collected test that reports no outcome fails the run
    "tests.support.clean_checkout",  # so does a run that leaves new files in the checkout
)


def pytest_configure(config: pytest.Config) -> None:
    """A shell without job control starts background commands with SIGINT and SIGQUIT ignored,
    ``nohup`` ignores SIGHUP, and every child inherits that: the CLI processes of the Ctrl-C and
    hang-up tests would ignore what the tests send them (seen when the suite ran as
    ``nohup script &``). Give the suite the defaults; its children then start as from a
    terminal."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGHUP, signal.SIGQUIT, signal.SIGTERM):
        if signal.getsignal(signum) == signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)
    _start_machine_load(config)
    _share_byte_code(config)
    _steal_work(config)


@pytest.fixture(autouse=True)
def _no_proof_outlives_its_test() -> Iterator[None]:
    """A lock a test took in this process and never released keeps a descriptor of its
    folder open (its proof of life): close them all after each test, so that a test's tmpfs
    can be unmounted and the next test starts with no proof held."""
    yield
    proof.let_go_of_all()


_LOAD: pytest.StashKey[contextlib.ExitStack] = pytest.StashKey()


def _start_machine_load(config: pytest.Config) -> None:
    """With ``MAHABHARATHA_LOAD=1``, three busy loops and a disk writer run beside the whole
    run (``tests/support/load.py``), once however many xdist workers it has: a guarantee must
    hold on a busy machine too."""
    if not load.wanted() or not runs_the_session(config):
        return
    stack = config.stash[_LOAD] = contextlib.ExitStack()
    scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="mahabharatha-load-"))
    stack.enter_context(load.machine_load(Path(scratch)))


_BYTE_CODE: pytest.StashKey[contextlib.ExitStack] = pytest.StashKey()


def _share_byte_code(config: pytest.Config) -> None:
    """The run starts about a thousand interpreters (the CLI, workers, spawned children). Where the
    environment forbids writing byte code (``PYTHONDONTWRITEBYTECODE``, as some container
    images set it), each would compile the package from source again, most of a CLI call's CPU:
    the run's processes share a private byte code cache instead (``PYTHONPYCACHEPREFIX``, as
    the benchmark does), new for each run so that no edit is ever older than its cache, and
    removed at the end, so the checkout stays clean."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or not runs_the_session(config):
        return
    stack = config.stash[_BYTE_CODE] = contextlib.ExitStack()
    cache = stack.enter_context(
        tempfile.TemporaryDirectory(prefix="mahabharatha-pycache-", ignore_cleanup_errors=True)
    )
    os.chmod(cache, 0o755)  # the tests that run the CLI as nobody read it too
    environment = stack.enter_context(pytest.MonkeyPatch.context())
    environment.delenv("PYTHONDONTWRITEBYTECODE")
    environment.setenv("PYTHONPYCACHEPREFIX", cache)


def _steal_work(config: pytest.Config) -> None:
    """With ``-n N``, xdist hands tests out in chunks (``--dist load``), so near the end of a
    run one worker can be left alone with a chunk of slow tests while the others idle. Work
    stealing lets an idle worker take half of a busy one's queue. A ``--dist`` that the command
    line or ``PYTEST_ADDOPTS`` names is kept, and so is ``-d`` (xdist's ``--dist load``)."""
    words = [*config.invocation_params.args, *shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))]
    named = getattr(config.option, "distload", False) or any(
        str(word).startswith("--dist") for word in words
    )
    if getattr(config.option, "dist", "no") == "load" and not named:
        config.option.dist = "worksteal"


def pytest_unconfigure(config: pytest.Config) -> None:
    for key in (_BYTE_CODE, _LOAD):
        if key in config.stash:
            config.stash[key].close()


def _required() -> bool:
    return os.environ.get(postgres.REQUIRE_ENV) == "1"


@pytest.fixture(scope="session")
def pg_server() -> Iterator[postgres.PgServer]:
    """One PostgreSQL server for the whole session (started on first use, stopped at the end)."""
    missing = postgres.client_missing()
    if missing is not None:
        pytest.skip(missing)
    yield postgres.shared_server()


@pytest.fixture(scope="session")
def hostile_pg() -> postgres.HostileServer:
    """The hostile server (every setting flipped by database and role defaults, PgBouncer in
    transaction mode in front, a neighbour running ``SET`` through the same pool)."""
    missing = postgres.client_missing() or (
        None if postgres.pgbouncer_binary() else postgres.PGBOUNCER_HINT
    )
    if missing is not None:
        pytest.skip(missing)
    return postgres.hostile_server()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        kind = callspec.params.get("kind") if callspec is not None else None
        on_postgres = str(getattr(kind, "id", "")).startswith("postgres")  # conformance's
        fixtures = getattr(item, "fixturenames", ())
        if on_postgres or "pg_server" in fixtures or "hostile_pg" in fixtures:
            item.add_marker(pytest.mark.postgres)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    expected = hasattr(report, "wasxfail")  # an expected failure (xfail) ran: not a skip
    postgres_test = item.get_closest_marker("postgres") is not None
    if report.skipped and not expected and _required() and postgres_test:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"{postgres.REQUIRE_ENV}=1 but this PostgreSQL test skipped: {reason}"
    return report
