"""The project's reference (design/contract.md) names every CLI command and option there is.

A command or an option added without a word in the reference fails here, so the page a user
reads cannot fall behind the program it describes. The behaviours themselves are pinned by the
rest of the suite; this test keeps the page complete.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final

import pytest

from tests.cli._support import every_command

REFERENCE: Final = Path(__file__).resolve().parents[2] / "design" / "contract.md"
COMMON_OPTIONS: Final = frozenset({"--help", "--gsd-dir", "--json"})
"""Said once for every command at the top of the CLI section, not per command."""


COMMANDS: Final = [(" ".join(words), command) for words, command in every_command()]


def _reference_text() -> str:
    return REFERENCE.read_text(encoding="utf-8")


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[path for path, _ in COMMANDS])
def test_every_command_and_its_options_are_in_the_reference(path: str, command: Any) -> None:
    text = _reference_text()
    assert f"`{path}" in text or f"| `{path}" in text, f"design/contract.md never names `{path}`"
    options = {opt for param in command.params for opt in param.opts if opt.startswith("--")}
    missing = sorted(
        opt
        for opt in options - COMMON_OPTIONS
        if re.search(rf"{re.escape(opt)}(?![a-z-])", text) is None
    )
    assert not missing, f"design/contract.md does not mention {missing} of `{path}`"


def test_the_reference_points_nowhere_outside_the_repository() -> None:
    assert "../" not in _reference_text()
