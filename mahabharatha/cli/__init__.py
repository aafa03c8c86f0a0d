"""The ``mahabharatha`` command line: one Typer app, one file per command group.

Commands parse their arguments, call :mod:`mahabharatha.locks`, and hand the result to
:mod:`mahabharatha.cli._output`, which prints it and picks the exit code.
"""

import typer

from mahabharatha.cli import feature, lock

app = typer.Typer(
    name="mahabharatha",
    help="Work on features without stepping on each other: feature locks and detection.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
)
app.add_typer(lock.app, name="lock")
app.add_typer(feature.app, name="feature")


def main() -> None:
    """Console-script entry point."""
    app()


__all__ = ["app", "main"]
