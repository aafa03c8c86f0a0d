"""What every command shares: its options, how a :class:`Result` is printed (one JSON document
with ``--json``, else text), and its exit code (:func:`exit_code_for`, the one mapping)."""

from __future__ import annotations

import functools
import inspect
import itertools
import math
import os
import signal
import stat
import sys
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Annotated, Any, Final, NamedTuple, NoReturn

import typer

from mahabharatha import names, signals
from mahabharatha.backends import lock_url, open_backend, url_holds_password
from mahabharatha.backends.base import LockBackend, UnsupportedError
from mahabharatha.cli._click import ParameterSource, get_current_context
from mahabharatha.cli._render import is_reclaimable
from mahabharatha.constants import CONNECT_TIMEOUT_SECONDS, GSD_DIR, LOCK_URL_ENV, NAMESPACE_ENV
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
    NotHeldError,
)
from mahabharatha.run import runner


@functools.cache  # once per process
def _say_password_on_argv() -> None:
    typer.echo(
        "mahabharatha: the password in --backend is visible to other users of this machine "
        "(ps shows a command's arguments while it runs); give it through PGPASSWORD, ~/.pgpass "
        "or PGSERVICE (pg_service.conf) instead",
        err=True,
    )


def finite_seconds(value: float | None) -> float | None:
    """The check of every numeric option: nan and inf are bad input (exit 2)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number of seconds")
    return value


ACROSS_HOSTS: Final = "Across hosts"  # the help panel of the PostgreSQL-only options


def _namespace_given(value: str | None) -> str | None:
    """An empty ``--namespace`` is a mistake, not "the default" (bad input, exit 2)."""
    if value is not None and not value.strip():
        raise typer.BadParameter(
            "a namespace cannot be empty (leave --namespace out for the default)"
        )
    return value


BackendOption = Annotated[
    str | None,
    typer.Option(
        "--backend",
        metavar="URL",
        show_default=False,
        rich_help_panel=ACROSS_HOSTS,
        help=(
            "Where locks live: a postgresql:// URL (libpq syntax; PGPASSWORD, ~/.pgpass work). "
            f"Default: ${LOCK_URL_ENV}, else the folder --gsd-dir."
        ),
    ),
]
NamespaceOption = Annotated[
    str | None,
    typer.Option(
        "--namespace",
        metavar="NAME",
        callback=_namespace_given,
        rich_help_panel=ACROSS_HOSTS,
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
        rich_help_panel=ACROSS_HOSTS,
        min=0.1,
        callback=finite_seconds,
        help="PostgreSQL: give up on an unreachable or silent server after SECONDS (exit 3).",
    ),
]
LeaseOption = Annotated[
    float | None,
    typer.Option(
        "--lease",
        metavar="SECONDS",
        rich_help_panel=ACROSS_HOSTS,
        min=1,
        callback=finite_seconds,
        help=(
            "PostgreSQL: the lock expires SECONDS after its last refresh by the server's clock "
            "(acquire, claim: 2 h; run: 60 s, refreshed every 20 s). Files: fixed at 2 h."
        ),
    ),
]


_OPENED: Final[list[LockBackend]] = []  # the running command's backends: closed by answer()


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
NonblockOption = Annotated[
    bool,
    typer.Option("--nonblock", "-n", help="Try once, never wait (like flock -n)."),
]


def feature_folders(gsd_dir: str, wanted: Callable[[str], bool]) -> list[str]:
    """The feature folders whose name is ``wanted``, by name (none when the specs folder
    cannot be read: only a hint hangs on them)."""
    try:
        return [name for name in names.feature_folders(gsd_dir) if wanted(name)]
    except OSError:
        return []


def complete_feature(ctx: typer.Context, incomplete: str) -> list[str]:
    """Shell completion: the feature folders under ``<gsd-dir>/specs`` starting so."""
    return feature_folders(ctx.params.get("gsd_dir") or GSD_DIR, lambda n: n.startswith(incomplete))


FeatureArg = Annotated[
    str,
    typer.Argument(
        metavar="FEATURE",
        help="The feature (a folder under <gsd-dir>/specs).",
        autocompletion=complete_feature,
    ),
]
AttemptsOption = Annotated[
    int,
    typer.Option(
        "--attempts",
        metavar="N",
        min=1,
        help="A feature whose attempts failed N times (lock fail) is failed: never claimed.",
    ),
]


class Shared(NamedTuple):
    """The options every lock command takes, gathered by :func:`with_shared_options`. ``url``
    falls back on its environment variable (``namespace`` too, in the backend), read by the
    call, never by typer, so a URL's password never shows in ``--help``."""

    gsd_dir: str
    as_json: bool
    url: str | None  # none: the folder of --gsd-dir
    namespace: str | None  # as given
    connect_timeout: float

    def backend(self, *, needs_folder: bool = False, **server: Any) -> LockBackend:
        """The one place a command gets its backend (closed when the command ends; ``server``:
        more of the server's options); a missing driver or namespace is bad input, and so is a
        missing gsd folder when ``needs_folder`` (a typo must not read as "no locks")."""
        if needs_folder and not os.path.isdir(self.gsd_dir):
            what = "not a folder" if os.path.lexists(self.gsd_dir) else "no such folder"
            hint = f"--gsd-dir names the gsd folder; default {GSD_DIR}"
            raise ValueError(f"{what}: {self.gsd_dir} ({hint})")
        options = {"namespace": self.namespace, "connect_timeout": self.connect_timeout}
        try:
            backend = open_backend(self.url, self.gsd_dir, **options, **server)
        except RuntimeError as missing:  # PostgreSQL support not installed
            raise ValueError(str(missing)) from None
        _OPENED.append(backend)
        return backend


_SHARED_OPTIONS: Final = (
    ("gsd_dir", GsdDirOption, GSD_DIR),
    ("as_json", JsonOption, False),
    ("backend_url", BackendOption, None),
    ("namespace", NamespaceOption, None),
    ("connect_timeout", ConnectTimeoutOption, CONNECT_TIMEOUT_SECONDS),
)  # what Shared gathers, in its order (and --help's): name, typer declaration, default


class _WithSharedOptions:
    """``@with_shared_options``: typer sees the options of :data:`_SHARED_OPTIONS` where the
    command has ``shared``; a call gathers them into one :class:`Shared`. The signature is
    written when first asked for (a call builds only the command it names)."""

    def __init__(self, command: Callable[..., None]) -> None:
        self._command = command
        self.__name__ = command.__name__  # typer names the command after it
        self.__qualname__ = command.__qualname__
        self.__module__ = command.__module__
        self.__doc__ = command.__doc__  # the command's help

    @functools.cached_property
    def __signature__(self) -> inspect.Signature:
        signature = inspect.signature(self._command, eval_str=True)
        mine = signature.parameters["shared"]
        parameters = list(signature.parameters.values())
        at = parameters.index(mine)
        parameters[at : at + 1] = [  # the options in its place
            inspect.Parameter(name, mine.kind, default=default, annotation=declared)
            for name, declared, default in _SHARED_OPTIONS
        ]
        return signature.replace(parameters=parameters)

    @property
    def __annotations__(self) -> dict[str, Any]:  # type: ignore[override]
        return {p.name: p.annotation for p in self.__signature__.parameters.values()}

    def __call__(self, **given: Any) -> None:
        shared = Shared(*(given.pop(name) for name, _, _ in _SHARED_OPTIONS))
        if shared.url and url_holds_password(shared.url):
            _say_password_on_argv()
        self._command(**given, shared=shared._replace(url=shared.url or lock_url()))


with_shared_options: Final = _WithSharedOptions


def wait_seconds(wait: float | None, nonblock: bool, default: float | None) -> float | None:
    """The timeout of a command from ``--wait``/``--timeout`` and ``-n``; both is bad input."""
    if nonblock and wait is not None:
        raise typer.BadParameter("-n (try once) and a wait of SECONDS contradict each other")
    if nonblock:
        return 0.0
    return default if wait is None else wait


# Our parent when the CLI started (or forked): a reaper that adopts us later is not our caller.
_FIRST_PARENT: list[int] = [os.getppid()]


def _note_parent_after_fork() -> None:
    _FIRST_PARENT[0] = os.getppid()  # a forked child (a test's, a pool's) starts here


os.register_at_fork(after_in_child=_note_parent_after_fork)


def default_owner(pid: int | None) -> int:
    """The owner a CLI call records: ``--pid``, else the shell or worker that ran us, refused
    when it is gone: the reaper that adopted us never dies, and recording it would strand the
    feature (the session tells a real pid-1 caller)."""
    if pid is not None:
        return pid
    parent = os.getppid()
    if parent != _FIRST_PARENT[0] or _adopted_by(parent):
        raise typer.BadParameter(
            f"the process that ran mahabharatha has exited (pid {parent} adopted this one and "
            "is not its caller); pass --pid PID to name the owner"
        )
    return parent


def _adopted_by(parent: int) -> bool:
    """Is ``parent`` a reaper rather than our caller? Unless we lead our own session, our
    caller is in ours (a session is inherited at fork); a reaper is in another."""
    ours = os.getsid(0)
    if ours == os.getpid():
        return False  # started with setsid: our caller's session is not ours to compare
    try:
        return os.getsid(parent) != ours
    except OSError:
        return True  # Race: the parent is gone too, or cannot be asked: not a caller we know


class Result(NamedTuple):
    """A command's answer: exit code, JSON document, and what a person reads."""

    code: int
    document: dict[str, Any]
    text: str | None = None  # for stdout
    message: str | None = None  # for stderr (a sentence about a failure)
    show: Callable[[], None] | None = None  # a richer picture for a person (a table)
    warnings: Sequence[str] = ()  # for stderr, whatever the exit code
    give_back: Callable[[], object] | None = None  # undoes what was taken if no answer gets out


def exit_code_for(error: BaseException, *, before_run: bool = False) -> int:
    """The exit code of a failure: the only mapping from errors to codes. ``before_run``: ``lock
    run`` failed before its command started (busy: 75; else what a shell would say)."""
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


def lock_entry(info: LockInfo) -> dict[str, Any]:
    """One lock in JSON: its facts, and whether ``--reclaim-dead`` would take it."""
    return {**info.to_dict(), "reclaimable": is_reclaimable(info)}


Advice = Callable[[LockHeldError], str] | None  # ends a held lock's sentence (cli/lock.py's)


def problem_fields(problem: FeatureProblem) -> dict[str, Any]:
    """A skipped feature in JSON: which, where, and the sentence of what went wrong."""
    return {"feature": problem.feature, "path": problem.path, "error": sentence(problem.error)}


def problem_warnings(problems: list[FeatureProblem]) -> list[str]:
    """One stderr line per skipped feature (the sentence names its full path)."""
    return [f"skipped {p.feature}: {sentence(p.error)}" for p in problems]


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP while a command works: ended like a Ctrl-C, with the signal's code."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _terminate(signum: int, _frame: object) -> NoReturn:
    """TERM and HUP (when not ignored) raise :class:`Terminated`, so a lock operation's
    deferral protects a publish and the answer (or a give-back) always follows."""
    raise Terminated(signum)


def stopped_code(stop: KeyboardInterrupt) -> int:
    """The exit code of a command stopped by Ctrl-C (130) or by TERM or HUP (128 + N)."""
    return killed_by(stop.signum) if isinstance(stop, Terminated) else EXIT_INTERRUPTED


def emit(result: Result, as_json: bool) -> NoReturn:
    """Print ``result`` and exit with its code. An answer that cannot be written gives back a
    lock the command took, and exits 3: never a lock its caller was not told of."""
    # TERM, HUP and INT are ignored while the answer is written: the caller must learn it.
    with signals.Handling(signals.FORWARDED, lambda _signum, _frame: None):
        try:
            _write(result, as_json)
        except OSError as error:
            _answer_lost(result, error)
    raise typer.Exit(result.code)


def _answer_lost(result: Result, error: OSError) -> NoReturn:
    with suppress(OSError, ValueError):  # stdout to /dev/null: no 'Exception ignored' at exit
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    taken_back = ""
    if result.give_back is not None:
        try:
            result.give_back()
            taken_back = "; the lock it took was released"
        except (OSError, LockError) as failed:
            taken_back = f"; the lock it took stays held ({sentence(failed)})"
    with suppress(OSError):
        typer.echo(
            f"mahabharatha: could not write the answer ({sentence(error)}){taken_back}", err=True
        )
    raise typer.Exit(EXIT_OS_ERROR)


def _write(result: Result, as_json: bool) -> None:
    if as_json:
        document = result.document
        # A failure's sentence is its "error", unless the command named it itself ("lost").
        if result.message and result.code != EXIT_OK and "error" not in document:
            document = {**document, "error": result.message}
        import json  # only --json needs it: kept out of every other call's cold start

        typer.echo(json.dumps(document, sort_keys=True))
    elif result.show is not None:
        result.show()
    elif result.text:
        typer.echo(result.text)
    for warning in result.warnings:
        note(warning)
    if result.message:
        typer.echo(f"mahabharatha: {result.message}", err=True)
    sys.stdout.flush()  # a write error (a full disk, a closed pipe) shows here, not at exit


def asks_for_json(args: Sequence[str]) -> bool:
    """Is ``--json`` among a command line's own arguments (those before ``--``; what follows
    is ``lock run``'s command)?"""
    return "--json" in itertools.takewhile(lambda arg: arg != "--", args)


CreateOption = Annotated[
    bool,
    typer.Option(
        "--create",
        help="Create the --gsd-dir folder if it does not exist (without it: exit 2, a typo).",
    ),
]


def given_gsd_dir_exists() -> None:
    """A ``--gsd-dir`` given on the command line must exist unless ``--create`` (bad input):
    a typo must never make a tree nobody looks at, nor answer "free"."""
    ctx = get_current_context(silent=True)
    if ctx is not None and ctx.params.get("gsd_dir", None) == "":
        # `--gsd-dir "$GSD"` with GSD unset: never today's folder by accident (bad input).
        raise ValueError("--gsd-dir is empty (an unset variable?): name the gsd folder")
    if ctx is None or "gsd_dir" not in ctx.params or ctx.params.get("create"):
        return
    if ctx.get_parameter_source("gsd_dir") is not ParameterSource.COMMANDLINE:
        return
    gsd_dir = ctx.params["gsd_dir"]
    try:
        if stat.S_ISDIR(os.stat(gsd_dir).st_mode):
            return
        what = "not a folder"
    except (FileNotFoundError, NotADirectoryError):  # other OS errors (too long...): exit 3
        what = "no such folder"
    create = "; --create makes it" if "create" in ctx.params else ""
    raise ValueError(f"{what}: {gsd_dir} (--gsd-dir names an existing gsd folder{create})")


_QUIET: Final = [False]  # the root's -q: no note, only errors


def set_verbosity(quiet: bool, verbose: int) -> None:
    """The root's ``-q`` and ``-v``/``-vv`` (the library's info/debug messages on stderr), for
    this call only: a program that calls the app again (``CliRunner``) gets one handler a call."""
    _QUIET[0] = quiet
    if verbose and not quiet:
        import logging  # only -v pays for it: kept out of every other call's cold start

        from mahabharatha import logs

        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("mahabharatha: %(message)s"))
        found = logs.logger()
        ctx = get_current_context()
        ctx.call_on_close(functools.partial(found.setLevel, found.level))  # undone at the end
        ctx.call_on_close(functools.partial(found.removeHandler, handler))
        found.addHandler(handler)
        found.setLevel(logs.INFO if verbose == 1 else logs.DEBUG)


def note(text: str) -> None:
    """A line for the person on stderr that is not an error (``-q`` silences it)."""
    if not _QUIET[0]:
        typer.echo(f"mahabharatha: {text}", err=True)


def respond(
    as_json: bool, document: dict[str, Any], action: Callable[[], Result], advice: Advice = None
) -> NoReturn:
    """Print :func:`answer` and exit with its code."""
    emit(answer(document, action, advice), as_json)


def answer(document: dict[str, Any], action: Callable[[], Result], advice: Advice = None) -> Result:
    """Run ``action``; an expected failure becomes one sentence and a code (``document``: the
    JSON then). ``advice`` ends a held lock's sentence. A ``--gsd-dir`` given but missing is bad
    input first."""
    try:
        # TERM and HUP (left at their default) end the action as Ctrl-C does (stopped_code).
        with signals.Handling((signal.SIGTERM, signal.SIGHUP), _terminate, signals.is_default):
            given_gsd_dir_exists()
            result = action()
    except KeyboardInterrupt as stop:  # Ctrl-C, TERM, HUP: still one document, one sentence
        result = Result(stopped_code(stop), document, message="interrupted")
    except (ValueError, LockError, OSError) as error:
        message = sentence(error)
        extra = {}
        if isinstance(error, LockHeldError):
            extra = {"holder": lock_entry(error.info)}
            if advice and not isinstance(error, AlreadyHeldError):  # no one else to wait for
                message = f"{message}; {advice(error)}"
        result = Result(exit_code_for(error), {**document, **extra}, message=message)
    finally:
        while _OPENED:
            _OPENED.pop().close()
    return result
