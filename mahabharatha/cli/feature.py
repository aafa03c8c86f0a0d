"""``mahabharatha feature ...``: which feature is this session working on."""

from __future__ import annotations

from typing import Any

import typer

from mahabharatha.cli._output import (
    DEFAULT_GSD_DIR,
    EXIT_HELD,
    EXIT_OK,
    GsdDirOption,
    JsonOption,
    Result,
    respond,
)
from mahabharatha.commands._utils import detect_feature

app = typer.Typer(help="The feature being worked on.", no_args_is_help=True)


@app.command()
def detect(gsd_dir: GsdDirOption = DEFAULT_GSD_DIR, as_json: JsonOption = False) -> None:
    """Print the detected feature: $MAHABHARATHA_FEATURE, <gsd-dir>/.current-feature, or the
    newest .mahabharatha/state/*.json. Exit 1 when none is found."""

    def action() -> Result:
        found = detect_feature(gsd_dir)
        document: dict[str, Any] = {"feature": found}
        if found is None:
            return Result(EXIT_HELD, document, message="no feature detected")
        return Result(EXIT_OK, document, found)

    respond(as_json, {"feature": None}, action)
