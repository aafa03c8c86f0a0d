"""The ``mahabharatha`` command line: one Typer app, one file per command group.

Commands parse their arguments, call :mod:`mahabharatha.locks`, and hand the result to
:mod:`mahabharatha.cli._output`, which prints it and picks the exit code.
"""

import copy
import gc
import sys
from collections.abc import Sequence
from typing import Annotated

import typer
from typer.main import get_command_name

from mahabharatha.cli import feature, lock
from mahabharatha.cli import pool as _pool  # noqa: F401  (registers lock fail, lock work)

app = typer.Typer(
    name="mahabharatha",
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
) -> None:
    """Work on features without stepping on each other: feature locks and detection."""


app.add_typer(lock.app, name="lock")
app.add_typer(feature.app, name="feature")


def app_for(argv: Sequence[str]) -> typer.Typer:
    """The app, cut down to the one command ``argv`` calls (``lock check ...``).

    Typer turns every registered command into a click command on each call (signatures,
    annotations, converters): about 10 ms for our fifteen, most of a cold start's own cost. A
    call names one command, so only that one is built. Everything else gets the whole app: a
    group's help, a typo (its "did you mean" needs every name), a root option, and shell
    completion (which calls with no arguments; the words come in the environment).
    """
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
    """The name typer gives a registered command (its own rule when none is given)."""
    if command.name:
        return command.name
    assert command.callback is not None
    return get_command_name(command.callback.__name__)


def main() -> None:
    """Console-script entry point: the command named on the command line, built alone.

    Start-up leaves some 10^5 objects that live until the process ends (modules, classes,
    typer's and click's objects). ``gc.freeze`` moves them out of the collector's sight, so
    neither a later collection nor the final one at exit walks them again: about 10 ms of a
    cold call, more than all of our own imports. What the command makes afterwards is
    collected as usual (``lock run`` may run for hours).
    """
    gc.freeze()
    app_for(sys.argv[1:])()


__all__ = ["app", "app_for", "main"]
