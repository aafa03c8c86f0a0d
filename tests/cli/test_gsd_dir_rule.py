"""A ``--gsd-dir`` that is given and does not exist is a typo (issue 19, item 7): every command
exits 2 "no such folder" and creates nothing, unless ``--create`` says to make it; the default
``.gsd`` is created as needed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Final

import pytest

from tests.cli._support import FEATURE, every_command, invoke, lock_path, one_document, one_sentence

COMMANDS: Final = every_command()
EXTRA: Final[dict[str, list[str]]] = {
    "run": ["--", sys.executable, "-c", "pass"],
    "verify": ["--token", "1"],
}
"""What a command needs besides FEATURE to get as far as its work (nothing runs here)."""


def _argv(path: tuple[str, ...], command: Any, *options: object) -> list[object]:
    """``path FEATURE options... extra``: the options before any ``--`` of the extra."""
    names = {param.name for param in command.params if param.param_type_name == "argument"}
    feature = [FEATURE] if names & {"feature", "features"} else []
    return [*path, *feature, *options, *EXTRA.get(path[-1], [])]


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_given_gsd_dir_that_does_not_exist_is_exit_2_for_every_command(
    tmp_path: Path, path: tuple[str, ...], command: Any, as_json: bool
) -> None:
    """Fails on the old code: acquire, claim NAME and run made the whole tree; check, release
    and reopen answered "free", "not locked", "not marked done" with exit 0."""
    missing = tmp_path / "typo"
    json_flag = ["--json"] if as_json else []

    result = invoke(*_argv(path, command, "--gsd-dir", missing, *json_flag))

    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert f"no such folder: {missing}" in one_sentence(result.stderr)
    if as_json:
        assert "no such folder" in one_document(result.stdout)["error"]
    assert not missing.exists()


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["acquire", FEATURE, "--pid", "1"], id="acquire"),
        pytest.param(["claim", FEATURE, "--pid", "1"], id="claim"),
        pytest.param(["run", FEATURE], id="run"),
    ],
)
def test_create_makes_the_given_gsd_dir(tmp_path: Path, argv: list[str]) -> None:
    wanted = tmp_path / "new" / "gsd"

    command = ["--", sys.executable, "-c", "pass"] if argv[0] == "run" else []
    result = invoke("lock", *argv, "--gsd-dir", wanted, "--create", *command)

    assert result.exit_code == 0, result.stderr
    assert (wanted / "specs" / FEATURE).is_dir()


def test_the_default_gsd_folder_is_created_as_needed(tmp_path: Path) -> None:
    """The working directory is the test's folder (tests/cli/conftest.py), without a .gsd."""
    assert invoke("lock", "check", FEATURE).exit_code == 0  # nothing there: free
    assert invoke("lock", "acquire", FEATURE, "--pid", "1").exit_code == 0
    assert lock_path(tmp_path / ".gsd").is_file()


@pytest.mark.parametrize("given", ["typo", ""], ids=["missing", "empty"])
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_status_watch_refuses_a_gsd_dir_in_the_words_of_status(
    tmp_path: Path, given: str, as_json: bool
) -> None:
    """Fails before the change: ``status --watch`` skipped the check of a given --gsd-dir and
    said another sentence than ``status`` (an empty one was "no such folder", not "empty")."""
    gsd_dir = str(tmp_path / given) if given else ""
    json_flag = ["--json"] if as_json else []

    plain = invoke("lock", "status", "--gsd-dir", gsd_dir, *json_flag)
    watched = invoke("lock", "status", "--watch", "--gsd-dir", gsd_dir, *json_flag)

    assert plain.exit_code == watched.exit_code == 2
    assert one_sentence(watched.stderr) == one_sentence(plain.stderr)
    if as_json:
        assert one_document(watched.stdout)["error"] == one_document(plain.stdout)["error"]
