"""``mahabharatha feature ...``: which feature is this session working on."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from mahabharatha.cli._output import JsonOption, Result, respond
from mahabharatha.constants import FEATURE_ENV_VAR, GSD_DIR, STATE_DIR
from mahabharatha.detect import CURRENT_FEATURE_FILE, detect_feature
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


@app.command()
def detect(gsd_dir: MarkerDirOption = GSD_DIR, as_json: JsonOption = False) -> None:
    """Print the detected feature: $MAHABHARATHA_FEATURE, <gsd-dir>/.current-feature, or the
    newest .mahabharatha/state/*.json. Exit 1 when none is found, saying where it looked.

    A source naming an invalid feature is skipped, and the reason is printed on stderr.
    """

    def action() -> Result:
        skipped: list[str] = []
        found = detect_feature(gsd_dir, skipped=skipped)
        document: dict[str, Any] = {"feature": found, "skipped": skipped}
        if found is None:
            told = "; ".join(skipped)
            looked = f"${FEATURE_ENV_VAR}, {Path(gsd_dir) / CURRENT_FEATURE_FILE}"
            said = f"no feature detected (looked at {looked}, {STATE_DIR}/*.json)"
            return Result(EXIT_HELD, document, message=f"{said}; {told}" if told else said)
        return Result(EXIT_OK, document, found, warnings=skipped)  # a skipped source: a word

    respond(as_json, {"feature": None}, action)
