"""``mahabharatha feature ...``: which feature is this session working on."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from mahabharatha.cli._output import (
    DEFAULT_GSD_DIR,
    JsonOption,
    Result,
    respond,
)
from mahabharatha.commands import _utils
from mahabharatha.commands._utils import detect_feature
from mahabharatha.constants import STATE_DIR
from mahabharatha.exits import EXIT_HELD, EXIT_OK

app = typer.Typer(help="The feature being worked on.", no_args_is_help=True)

MarkerDirOption = Annotated[
    str,
    typer.Option(
        "--gsd-dir",
        metavar="DIR",
        help="The gsd folder whose .current-feature names the feature.",
    ),
]


def _invalid_because(name: str) -> str | None:
    if _utils.is_valid_feature_name(name):
        return None
    return f"{_utils._shown_name(name)} is not a valid feature name"


def _skipped(gsd_dir: str) -> list[str]:
    """Why detection passed over ``$MAHABHARATHA_FEATURE`` or ``<gsd-dir>/.current-feature``
    (only sources it reached: a valid variable ends the search)."""
    notes: list[str] = []
    env = _utils._feature_from_env()
    if env:
        why = _invalid_because(env)
        if why is None:
            return notes
        notes.append(f"skipped ${_utils.FEATURE_ENV_VAR}: {why}")
    path = Path(gsd_dir) / _utils.CURRENT_FEATURE_FILE
    if not os.path.lexists(path):
        return notes
    text = _utils._safe_read_text(path)
    if text is None:
        limit = _utils.MAX_READ_BYTES
        notes.append(f"skipped {path}: not a readable text file of at most {limit} bytes")
    elif text and (why := _invalid_because(text)) is not None:
        notes.append(f"skipped {path}: {why}")
    return notes


def _looked_at(gsd_dir: str) -> str:
    marker = Path(gsd_dir) / _utils.CURRENT_FEATURE_FILE
    return f"${_utils.FEATURE_ENV_VAR}, {marker}, {STATE_DIR}/*.json"


@app.command()
def detect(gsd_dir: MarkerDirOption = DEFAULT_GSD_DIR, as_json: JsonOption = False) -> None:
    """Print the detected feature: $MAHABHARATHA_FEATURE, <gsd-dir>/.current-feature, or the
    newest .mahabharatha/state/*.json. Exit 1 when none is found, saying where it looked.

    A source naming an invalid feature is skipped, and the reason is printed on stderr.
    """

    def action() -> Result:
        found = detect_feature(gsd_dir)
        skipped = _skipped(gsd_dir)
        document: dict[str, Any] = {"feature": found, "skipped": skipped}
        if found is None:
            told = "; ".join(skipped)
            said = f"no feature detected (looked at {_looked_at(gsd_dir)})"
            return Result(EXIT_HELD, document, message=f"{said}; {told}" if told else said)
        for why in skipped:  # a skipped source still deserves a word, on stderr
            typer.echo(f"mahabharatha: {why}", err=True)
        return Result(EXIT_OK, document, found)

    respond(as_json, {"feature": None}, action)
