"""The ``mahabharatha`` command line: one Typer app, one file per command group; commands call
:mod:`mahabharatha.locks` and hand the result to :mod:`mahabharatha.cli._output` to print."""

import copy
import gc
import sys
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup
from typer.main import get_command_name

from mahabharatha.cli import feature, lock
from mahabharatha.cli import pool as _pool  # noqa: F401  (registers lock fail, lock work)
from mahabharatha.cli._click import ClickException, Context
from mahabharatha.cli._output import Result, asks_for_json, emit, set_verbosity

# Where the root context keeps the command line: a usage error found deeper asks it for --json.
ARGV_KEY = "mahabharatha.argv"


class JsonUsageGroup(TyperGroup):
    """The root group: with ``--json``, a usage error is one JSON document on stdout (an
    ``"error"`` key) and one sentence on stderr, exit 2; without it, Typer's usual message."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: Context | None = None,
        **extra: Any,
    ) -> Context:
        try:
            ctx = super().make_context(info_name, list(args), parent, **extra)
        except ClickException as error:
            _json_usage_error(args, error)
            raise
        ctx.meta[ARGV_KEY] = list(args)
        return ctx

    def invoke(self, ctx: Context) -> Any:
        try:
            return super().invoke(ctx)
        except ClickException as error:
            _json_usage_error(ctx.meta.get(ARGV_KEY, ()), error)
            raise


def _json_usage_error(args: Sequence[str], error: ClickException) -> None:
    if asks_for_json(args):
        said = " ".join(error.format_message().split())  # one line, whatever click wrapped
        emit(Result(error.exit_code, {"error": said}, message=said), as_json=True)


app = typer.Typer(
    name="mahabharatha",
    cls=JsonUsageGroup,
    help="Work on features without stepping on each other: feature locks and detection.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
)


def _print_version(wanted: bool) -> None:
    if wanted:
        from mahabharatha import __version__

        typer.echo(f"mahabharatha {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    _version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ] = False,
    quiet: Annotated[
        bool,
        typer.Option("--quiet", "-q", help="Say only errors on stderr (no notes, no warnings)."),
    ] = False,
    verbose: Annotated[
        int,
        typer.Option(
            "--verbose",
            "-v",
            count=True,
            help="Also say the library's messages (waits, reclaims, lost locks); -vv: more.",
        ),
    ] = 0,
) -> None:
    set_verbosity(quiet, verbose)


app.add_typer(lock.app, name="lock")
app.add_typer(feature.app, name="feature")


class PlainUsageCommand(TyperCommand):
    """A command whose usage line shows ``FEATURE``, not typer's ``{FEATURE}``."""

    def collect_usage_pieces(self, ctx: Context) -> list[str]:
        pieces = super().collect_usage_pieces(ctx)
        return [p[1:-1] if p.startswith("{") and p.endswith("}") else p for p in pieces]


def _plain_usage_everywhere(root: typer.Typer) -> None:
    for group in root.registered_groups:
        if group.typer_instance is None:
            continue
        for command in group.typer_instance.registered_commands:
            if command.cls in (None, TyperCommand):  # typer's default, not a chosen class
                command.cls = PlainUsageCommand


_plain_usage_everywhere(app)


def app_for(argv: Sequence[str]) -> typer.Typer:
    """The app, cut down to the one command ``argv`` calls (``lock check ...``): typer builds
    every registered command on each call. Anything else (a group's help, a typo, a root
    option, shell completion) gets the whole app."""
    if len(argv) < 2:
        return app
    group = next((g for g in app.registered_groups if g.name == argv[0]), None)
    if group is None or group.typer_instance is None:
        return app
    sub = group.typer_instance
    wanted = [c for c in sub.registered_commands if _command_name(c) == argv[1]]
    if not wanted:
        return app
    only_sub = copy.copy(sub)  # shallow: the settings and the callback are shared, not changed
    only_sub.registered_commands = wanted
    only_group = copy.copy(group)
    only_group.typer_instance = only_sub
    only = copy.copy(app)
    only.registered_groups = [only_group]
    return only


def _command_name(command: typer.models.CommandInfo) -> str:
    assert command.callback is not None
    return command.name or get_command_name(command.callback.__name__)


def main() -> None:
    """Console-script entry point: the command named on the command line, built alone.
    ``gc.freeze`` keeps the start-up's long-lived objects out of every later collection."""
    gc.freeze()
    app_for(sys.argv[1:])()
