"""What ``--help`` and the usage line tell a new user (issue 19, items 3, 4 and 5)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final

import pytest

from tests.cli._support import FEATURE, every_command, invoke, one_document, one_sentence

ACROSS_HOSTS: Final = {"--backend", "--namespace", "--connect-timeout", "--lease"}
"""The options that mean something only with a PostgreSQL backend."""


COMMANDS: Final = every_command()
IDS: Final = [" ".join(path) for path, _ in COMMANDS]


def _help(*path: str) -> str:
    return invoke(*path, "--help", env={"COLUMNS": "200"}).stdout


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=IDS)
def test_the_usage_line_shows_arguments_without_braces(path: tuple[str, ...], command: Any) -> None:
    """Fails on the old code: ``lock acquire [OPTIONS] {FEATURE}``."""
    [usage] = [line for line in _help(*path).splitlines() if "Usage:" in line]
    assert "{" not in usage and "}" not in usage, usage
    if any(param.name == "feature" for param in command.params):
        assert re.search(r"\] FEATURE\b", usage), usage


def test_a_missing_feature_error_shows_the_plain_usage_too() -> None:
    result = invoke("lock", "acquire")
    assert result.exit_code == 2
    assert "lock acquire [OPTIONS] FEATURE" in result.stderr and "{" not in result.stderr


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=IDS)
def test_postgresql_only_options_sit_in_an_across_hosts_panel(
    path: tuple[str, ...], command: Any
) -> None:
    """Fails on the old code: they were listed among every command's own options."""
    panels = {opt: param.rich_help_panel for param in command.params for opt in param.opts}
    for option, panel in panels.items():
        assert (panel == "Across hosts") == (option in ACROSS_HOSTS), (option, panel)
    if ACROSS_HOSTS & set(panels):
        assert "Across hosts" in _help(*path)


def test_check_help_says_an_unknown_feature_is_free() -> None:
    """Fails on the old code: nothing said that a feature with no folder counts as free."""
    shown = " ".join(_help("lock", "check").split())
    assert "also one with no folder at all" in shown


def test_claim_help_says_what_each_exit_code_means() -> None:
    """Fails on the old code: only "exit 1 if none is"."""
    shown = " ".join(_help("lock", "claim").split())
    for code in ("0 claimed", "1 nothing left", "75 none free now", "2 bad input", "3 an OS error"):
        assert code in shown, code


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_an_empty_namespace_is_bad_input(gsd: Path, as_json: bool) -> None:
    """Fails on the old code: ``--namespace ''`` was taken as "no namespace given" (exit 0)."""
    json_flag = ["--json"] if as_json else []
    result = invoke("lock", "check", FEATURE, "--gsd-dir", gsd, "--namespace", "", *json_flag)

    assert result.exit_code == 2
    if as_json:
        assert "namespace cannot be empty" in one_document(result.stdout)["error"]
    else:
        assert "namespace cannot be empty" in result.stderr


def test_outside_a_git_repository_the_namespace_error_does_not_speak_of_its_repository(
    gsd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fails on the old code: "this folder's repository has no 'origin' remote" where there
    is no repository at all. (No server is reached: the namespace is decided first.)"""
    pytest.importorskip("psycopg")
    monkeypatch.delenv("MAHABHARATHA_LOCK_NAMESPACE", raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(gsd.parent))  # no repository above it

    result = invoke("lock", "check", FEATURE, "--gsd-dir", gsd, "--backend", "postgresql://h/db")

    assert result.exit_code == 2
    said = one_sentence(result.stderr)
    assert "--namespace" in said and "in no git repository with an 'origin' remote" in said
    assert "this folder's repository" not in said
