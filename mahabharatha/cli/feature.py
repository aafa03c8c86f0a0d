"""``mahabharatha feature ...``: which feature is this session working on."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from mahabharatha.cli._output import JsonOption, Result, respond
from mahabharatha.constants import FEATURE_ENV_VAR, GSD_DIR, STATE_DIR
from mahabharatha.detect import (
    CURRENT_FEATURE_FILE,
    detect_feature,
    feature_from_env,
    safe_read_text,
)
from mahabharatha.exits import EXIT_HELD, EXIT_OK
from mahabharatha.names import is_valid_feature_name, shown_name
from mahabharatha.reads import MAX_READ_BYTES

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
    if is_valid_feature_name(name):
        return None
    return f"{shown_name(name)} is not a valid feature name"


def _skipped(gsd_dir: str) -> list[str]:
    """Why detection passed over ``$MAHABHARATHA_FEATURE`` or ``<gsd-dir>/.current-feature``
    (only sources it reached: a valid variable ends the search)."""
    notes: list[str] = []
    env = feature_from_env()
    if env:
        why = _invalid_because(env)
        if why is None:
            return notes
        notes.append(f"skipped ${FEATURE_ENV_VAR}: {why}")
    path = Path(gsd_dir) / CURRENT_FEATURE_FILE
    if not os.path.lexists(path):
        return notes
    text = safe_read_text(path)
    if text is None:
        limit = MAX_READ_BYTES
        notes.append(f"skipped {path}: not a readable text file of at most {limit} bytes")
    elif text and (why := _invalid_because(text)) is not None:
        notes.append(f"skipped {path}: {why}")
    return notes


@app.command()
def detect(gsd_dir: MarkerDirOption = GSD_DIR, as_json: JsonOption = False) -> None:
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
            looked = f"${FEATURE_ENV_VAR}, {Path(gsd_dir) / CURRENT_FEATURE_FILE}"
            said = f"no feature detected (looked at {looked}, {STATE_DIR}/*.json)"
            return Result(EXIT_HELD, document, message=f"{said}; {told}" if told else said)
        for why in skipped:  # a skipped source still deserves a word, on stderr
            typer.echo(f"mahabharatha: {why}", err=True)
        return Result(EXIT_OK, document, found)

    respond(as_json, {"feature": None}, action)
