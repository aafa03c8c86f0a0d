"""The ``mahabharatha`` command line: one Typer app, one file per command group.

Commands parse their arguments, call :mod:`mahabharatha.locks`, and hand the result to
:mod:`mahabharatha.cli._output`, which prints it and picks the exit code.
"""

from typing import Annotated

import typer

from mahabharatha.cli import feature, lock

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


def main() -> None:
    """Console-script entry point."""
    app()


__all__ = ["app", "main"]
