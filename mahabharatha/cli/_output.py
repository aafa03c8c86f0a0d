"""What every command shares: its options, how a result is printed, which exit code it gets.

A command returns a :class:`Result` (or raises); :func:`run` prints it, as one JSON document on
stdout with ``--json`` or as text for a person, and exits through ``typer.Exit`` with the code
from :func:`exit_code_for`, the one place errors become exit codes.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Final, NamedTuple, NoReturn

import typer

from mahabharatha import runner
from mahabharatha.backends import open_backend
from mahabharatha.backends.base import LockBackend, UnsupportedError
from mahabharatha.constants import GSD_DIR
from mahabharatha.exits import (
    EXIT_BAD_INPUT,
    EXIT_CANNOT_EXECUTE,
    EXIT_HELD,
    EXIT_INTERRUPTED,
    EXIT_LOST,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_OS_ERROR,
    EXIT_TEMPFAIL,
    killed_by,
)
from mahabharatha.locks import (
    AlreadyHeldError,
    FeatureProblem,
    LockError,
    LockHeldError,
    LockInfo,
    LockLostError,
    LockTimeoutError,
    NotHeldError,
    owner_is_gone,
)

__all__ = [
    "DEFAULT_GSD_DIR",
    "RECLAIM_DEAD_ADVICE",
    "GsdDirOption",
    "JsonOption",
    "NonblockOption",
    "PidOption",
    "ReclaimDeadOption",
    "Result",
    "WaitOption",
    "backend_for",
    "default_owner",
    "exit_code_for",
    "problem_fields",
    "problem_warnings",
    "respond",
    "sentence",
    "wait_seconds",
    "what_to_do",
]

URL_ENV: Final = "MAHABHARATHA_LOCK_URL"
NAMESPACE_ENV: Final = "MAHABHARATHA_LOCK_NAMESPACE"
CONNECT_TIMEOUT_SECONDS: Final = 5.0
"""How long a command waits for a lock server (the PostgreSQL backend's own default too)."""


class Place(NamedTuple):
    """Where a command's locks live: ``--backend`` (or ``MAHABHARATHA_LOCK_URL``; none: the
    folder of ``--gsd-dir``), ``--namespace`` (or ``MAHABHARATHA_LOCK_NAMESPACE``) and
    ``--connect-timeout``. Read from the environment here, never by typer: a URL's password
    must never be shown in ``--help``. (A NamedTuple, as is ``Result``: a
    ``@dataclass`` costs each cold start about half a millisecond to define.)"""

    url: str | None = None
    namespace: str | None = None
    connect_timeout: float = CONNECT_TIMEOUT_SECONDS

    @classmethod
    def of(cls, url: str | None, namespace: str | None, connect_timeout: float) -> Place:
        chosen = url or os.environ.get(URL_ENV) or None
        named = namespace or os.environ.get(NAMESPACE_ENV) or None
        return cls(chosen, named, connect_timeout)


FILES: Final = Place()
"""The folder backend of ``--gsd-dir`` (no URL)."""


def backend_for(gsd_dir: str, place: Place = FILES) -> LockBackend:
    """The one place a command gets the backend its locks live in: the folder of ``--gsd-dir``,
    or the server ``place`` names. It is closed when the command ends. A missing driver or
    namespace is bad input (exit 2, saying what to do)."""
    if place.url is None:
        backend = open_backend(None, gsd_dir)
    else:
        try:
            backend = open_backend(
                place.url,
                gsd_dir,
                namespace=place.namespace,
                connect_timeout=place.connect_timeout,
            )
        except RuntimeError as missing:  # PostgreSQL support not installed
            raise ValueError(str(missing)) from None
    _OPENED.append(backend)
    return backend


def _finite_seconds(value: float | None) -> float | None:
    """Every numeric option refuses nan and inf (bad input, exit 2)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number of seconds")
    return value


finite_seconds: Final = _finite_seconds
"""The check of every numeric option (nan and inf are bad input), for the commands' modules."""


BackendOption = Annotated[
    str | None,
    typer.Option(
        "--backend",
        metavar="URL",
        show_default=False,
        help=(
            "Where locks live: a postgresql:// URL (libpq syntax; PGPASSWORD, ~/.pgpass work). "
            f"Default: ${URL_ENV}, else the folder --gsd-dir."
        ),
    ),
]
NamespaceOption = Annotated[
    str | None,
    typer.Option(
        "--namespace",
        metavar="NAME",
        help=(
            f"PostgreSQL: whose locks these are (default: ${NAMESPACE_ENV}, else the "
            "repository's origin remote)."
        ),
    ),
]
ConnectTimeoutOption = Annotated[
    float,
    typer.Option(
        "--connect-timeout",
        metavar="SECONDS",
        min=0.1,
        callback=_finite_seconds,
        help="PostgreSQL: give up on an unreachable or silent server after SECONDS (exit 3).",
    ),
]
LeaseOption = Annotated[
    float | None,
    typer.Option(
        "--lease",
        metavar="SECONDS",
        min=1,
        callback=_finite_seconds,
        help=(
            "PostgreSQL: the lock expires SECONDS after its last refresh by the server's clock "
            "(acquire, claim: 2 h; run: 60 s, refreshed every 20 s). Files: fixed at 2 h."
        ),
    ),
]


_OPENED: Final[list[LockBackend]] = []
"""The backends opened by the running command: :func:`respond` closes them when it is done."""


def close_opened() -> None:
    """Close the backends the command opened (:func:`respond` does it for every command)."""
    _close_opened()


def _close_opened() -> None:
    while _OPENED:
        _OPENED.pop().close()


GsdDirOption = Annotated[
    str,
    typer.Option(
        "--gsd-dir",
        metavar="DIR",
        help="The gsd folder holding specs/<feature>/.lock.",
    ),
]
JsonOption = Annotated[
    bool, typer.Option("--json", help="Print exactly one JSON document on stdout.")
]
PidOption = Annotated[
    int | None,
    typer.Option(
        "--pid",
        metavar="PID",
        help="Owner pid to record or match (default: the process that called this command).",
    ),
]
ReclaimDeadOption = Annotated[
    bool,
    typer.Option(
        "--reclaim-dead",
        help=(
            "Also reclaim a lock whose owner is provably gone on this host. Off by default: "
            "a pid means nothing on another host or in another PID namespace (containers)."
        ),
    ),
]
WaitOption = Annotated[
    float | None,
    typer.Option(
        "--wait",
        "--timeout",
        "-w",
        min=0,
        metavar="SECONDS",
        help="Wait up to SECONDS for a busy lock (with backoff); 0 tries once.",
    ),
]
"""How long to wait: one option with both common names, in every command that waits."""
NonblockOption = Annotated[
    bool,
    typer.Option("--nonblock", "-n", help="Try once, never wait (like flock -n)."),
]
DEFAULT_GSD_DIR: Final = GSD_DIR


def wait_seconds(wait: float | None, nonblock: bool, default: float | None) -> float | None:
    """The timeout of a command from ``--wait``/``--timeout`` and ``-n``; both is bad input."""
    if nonblock and wait is not None:
        raise typer.BadParameter("-n (try once) and a wait of SECONDS contradict each other")
    if nonblock:
        return 0.0
    return default if wait is None else wait


def default_owner(pid: int | None) -> int:
    """The owner a CLI call records: ``--pid``, else the shell or worker that ran us."""
    return os.getppid() if pid is None else pid


class Result(NamedTuple):
    """A command's answer: exit code, JSON document, and what a person reads."""

    code: int
    document: Any
    text: str | None = None  # for stdout
    message: str | None = None  # for stderr (a sentence about a failure)
    show: Callable[[], None] | None = None  # a richer picture for a person (a table)
    warnings: Sequence[str] = ()  # for stderr, whatever the exit code


def exit_code_for(error: BaseException, *, before_run: bool = False) -> int:
    """The exit code of a failure: the only mapping from errors to codes.

    ``before_run``: ``lock run`` failed before its command started; a busy lock is then "try
    again later" (75), an interrupt or a command that cannot start is what a shell would say.
    """
    if before_run:
        if isinstance(error, runner.Interrupted):
            return killed_by(error.signum)
        if isinstance(error, runner.CommandNotFoundError):
            return EXIT_NOT_FOUND
        if isinstance(error, runner.CommandStartError):
            return EXIT_CANNOT_EXECUTE
        if isinstance(error, LockHeldError) and not isinstance(error, AlreadyHeldError):
            return EXIT_TEMPFAIL
    if isinstance(error, LockHeldError | NotHeldError):
        return EXIT_HELD
    if isinstance(error, LockLostError):
        return EXIT_LOST
    if isinstance(error, ValueError | UnsupportedError):
        return EXIT_BAD_INPUT  # a lease or token asked of a backend that has none: bad input
    if isinstance(error, OSError | LockError):
        return EXIT_OS_ERROR
    raise error


def sentence(error: BaseException) -> str:
    """One sentence for a person: no traceback, no errno noise."""
    if isinstance(error, OSError) and error.strerror:
        where = (
            f": {error.filename}" if error.filename and error.filename not in error.strerror else ""
        )
        return f"{error.strerror}{where}"
    return str(error)


def holder_fields(info: LockInfo) -> dict[str, Any]:
    return {"holder": info.to_dict()}


RECLAIM_DEAD_ADVICE: Final = "its owner is gone: --reclaim-dead takes the lock over"


def what_to_do(busy: LockHeldError) -> str:
    """What a person can do about a lock that stayed held: take it over when its owner is gone,
    otherwise wait (never advised again once a wait has run out) or ask its owner."""
    if owner_is_gone(busy.info):
        return RECLAIM_DEAD_ADVICE
    if isinstance(busy, LockTimeoutError):
        return "still held after the wait; ask its owner to release it, or try again later"
    return "wait for it with --wait SECONDS, or ask its owner"


Advice = str | Callable[[LockHeldError], str | None] | None
"""What ends the sentence about a held lock: fixed text, or chosen from the error."""


def problem_fields(problem: FeatureProblem) -> dict[str, Any]:
    """A skipped feature in JSON: which, where, and the sentence of what went wrong."""
    return {"feature": problem.feature, "path": problem.path, "error": sentence(problem.error)}


def problem_warnings(problems: list[FeatureProblem]) -> list[str]:
    """One stderr line per skipped feature (the sentence names its full path)."""
    return [f"skipped {p.feature}: {sentence(p.error)}" for p in problems]


def emit(result: Result, as_json: bool) -> NoReturn:
    if as_json:
        document = result.document
        if (
            result.message
            and isinstance(document, dict)
            and result.code != EXIT_OK
            and "error" not in document  # a command may name its error itself ("lost")
        ):
            document = {**document, "error": result.message}
        import json  # only --json needs it: kept out of every other call's cold start

        typer.echo(json.dumps(document, sort_keys=True))
    elif result.show is not None:
        result.show()
    elif result.text:
        typer.echo(result.text)
    for warning in result.warnings:
        typer.echo(f"mahabharatha: {warning}", err=True)
    if result.message:
        typer.echo(f"mahabharatha: {result.message}", err=True)
    raise typer.Exit(result.code)


def respond(
    as_json: bool,
    document: dict[str, Any],
    action: Callable[[], Result],
    advice: Advice = None,
) -> NoReturn:
    """Run ``action`` and print its result; an expected failure becomes one sentence and a code.

    ``advice`` (what to do about a held lock, or a function of the error choosing it) ends the
    sentence of a ``LockHeldError``.
    """
    try:
        result = action()
    except KeyboardInterrupt:  # Ctrl-C while waiting: still one document, still one sentence
        result = Result(EXIT_INTERRUPTED, document, message="interrupted")
    except (ValueError, LockError, OSError) as error:
        message = sentence(error)
        extra = {}
        if isinstance(error, LockHeldError):
            extra = holder_fields(error.info)
            told = advice(error) if callable(advice) else advice
            if told and not isinstance(error, AlreadyHeldError):  # no one else to wait for
                message = f"{message}; {told}"
        result = Result(exit_code_for(error), {**document, **extra}, message=message)
    finally:
        _close_opened()
    emit(result, as_json)
