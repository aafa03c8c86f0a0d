"""Options that fit people's habits, exit codes like a shell's, typos that are visible."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mahabharatha import __version__
from mahabharatha.commands._utils import now
from tests.cli._support import FEATURE, invoke, lock_path, one_document, one_sentence, write_lock

ME = os.getpid()


@pytest.fixture
def holder() -> Iterator[int]:
    """A live process that is neither this test process nor its parent (an in-process ``lock run``
    counts its parent as "you": "already held by you"), killed and reaped after the test.

    Fails before the fix: the holder was pid 1, but a suite started as ``(pytest &)`` outlives
    the shell that started it and is adopted by pid 1: its parent *is* pid 1, and the four
    ``lock run`` cases below failed with "already held by you (pid 1)", in background runs only."""
    waits_for_eof = [sys.executable, "-c", "import sys; sys.stdin.read()"]  # ends with us, too
    with subprocess.Popen(waits_for_eof, stdin=subprocess.PIPE) as child:  # exit: close, reap
        try:
            yield child.pid
        finally:
            child.kill()


@pytest.fixture
def held(gsd: Path, holder: int) -> Path:
    """FEATURE held by another live process."""
    return write_lock(gsd, pid=holder, timestamp=now())


@pytest.mark.parametrize("spelling", ["--wait", "--timeout", "-w"])
def test_acquire_takes_every_name_of_the_wait(gsd: Path, held: Path, spelling: str) -> None:
    """Fails before the fix: acquire knew only --wait (--timeout and -w were usage errors)."""
    result = invoke("lock", "acquire", FEATURE, "--gsd-dir", gsd, "--pid", ME, spelling, "0.05")
    assert result.exit_code == 1
    assert "still held after the wait" in one_sentence(result.stderr)


@pytest.mark.parametrize("spelling", ["--wait", "--timeout", "-w"])
def test_run_takes_every_name_of_the_wait(gsd: Path, held: Path, spelling: str) -> None:
    """Fails before the fix: run knew only --timeout."""
    result = invoke("lock", "run", FEATURE, "--gsd-dir", gsd, spelling, "0.05", "--", "true")
    assert result.exit_code == 75
    assert "still held when --timeout ran out" in one_sentence(result.stderr)


@pytest.mark.parametrize(
    ("argv", "code"),
    [(["acquire", FEATURE, "--pid", str(ME)], 1), (["run", FEATURE], 75)],
    ids=["acquire", "run"],
)
def test_n_tries_once_like_flock(gsd: Path, held: Path, argv: list[str], code: int) -> None:
    """Fails before the fix: no -n (and run without a timeout would have waited for ever)."""
    tail = ["--", "true"] if argv[0] == "run" else []
    result = invoke("lock", *argv, "--gsd-dir", gsd, "-n", *tail)
    assert result.exit_code == code
    assert "still held" not in result.stderr  # it never waited


def test_n_and_a_wait_together_are_bad_input(gsd: Path) -> None:
    result = invoke("lock", "acquire", FEATURE, "--gsd-dir", gsd, "-n", "-w", "3")
    assert result.exit_code == 2
    assert not lock_path(gsd).exists()


def test_version() -> None:
    """Fails before the fix: no --version."""
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"mahabharatha {__version__}"


@pytest.mark.parametrize("command", ["acquire", "run", "check", "done"])
def test_help_names_feature_and_seconds(command: str) -> None:
    """Fails before the fix: help said `{feature}` and `<float range>`."""
    shown = invoke("lock", command, "--help", env={"COLUMNS": "200"}).stdout
    assert "FEATURE" in shown and "{feature}" not in shown
    assert "float range" not in shown
    if command in ("acquire", "run"):
        assert "SECONDS" in shown


def test_feature_detect_help_describes_its_own_gsd_dir() -> None:
    """Fails before the fix: it said the folder holds specs/<feature>/.lock."""
    shown = invoke("feature", "detect", "--help", env={"COLUMNS": "200"}).stdout
    assert ".current-feature names the feature" in shown
    assert "specs/<feature>/.lock" not in shown


@pytest.mark.parametrize(
    ("make", "code", "said"),
    [
        (lambda path: path.write_text("#!/bin/sh\n"), 126, "permission denied"),  # no x bit
        (lambda path: path.mkdir(), 126, "permission denied"),
        (lambda path: None, 127, "command not found"),
    ],
    ids=["not-executable", "a-folder", "missing"],
)
def test_run_exits_like_a_shell_when_the_command_cannot_start(
    gsd: Path, tmp_path: Path, make: object, code: int, said: str
) -> None:
    """Fails before the fix: a command that exists but cannot run was 127 'not found'."""
    command = tmp_path / "cmd"
    make(command)  # type: ignore[operator]
    result = invoke("lock", "run", FEATURE, "--gsd-dir", gsd, "--", command)
    assert result.exit_code == code
    assert said in one_sentence(result.stderr)
    assert not lock_path(gsd).exists()


@pytest.mark.parametrize("argv", [["status"], ["status", "--all"], ["clean"], ["claim"]])
def test_a_missing_gsd_folder_is_said_not_taken_for_no_locks(
    tmp_path: Path, argv: list[str]
) -> None:
    """Fails before the fix: `lock status --gsd-dir /nonexistent` said 'no feature locks'."""
    missing = tmp_path / "nonexistent"
    result = invoke("lock", *argv, "--gsd-dir", missing)
    assert result.exit_code == 2
    create = "; --create makes it" if argv == ["claim"] else ""
    assert one_sentence(result.stderr) == (
        f"mahabharatha: no such folder: {missing} (--gsd-dir names an existing gsd folder{create})"
    )
    as_json = invoke("lock", *argv, "--gsd-dir", missing, "--json")
    assert as_json.exit_code == 2 and "no such folder" in json.dumps(one_document(as_json.stdout))
    default = invoke("lock", *argv)  # the default .gsd is missing too: still not "no locks"
    assert default.exit_code == 2
    assert one_sentence(default.stderr) == (
        "mahabharatha: no such folder: .gsd (--gsd-dir names the gsd folder; default .gsd)"
    )


def test_feature_detect_says_where_it_looked(gsd: Path) -> None:
    """Fails before the fix: only 'no feature detected'."""
    result = invoke("feature", "detect", "--gsd-dir", gsd)
    assert result.exit_code == 1
    said = one_sentence(result.stderr)
    assert "$MAHABHARATHA_FEATURE" in said and str(gsd / ".current-feature") in said
    assert ".mahabharatha/state/*.json" in said


def test_feature_detect_says_why_it_skipped_invalid_sources(gsd: Path) -> None:
    """Fails before the fix: invalid sources were passed over in silence."""
    (gsd / ".current-feature").write_text("../escape\n")
    result = invoke("feature", "detect", "--gsd-dir", gsd, env={"MAHABHARATHA_FEATURE": "a/b"})
    assert result.exit_code == 1
    said = one_sentence(result.stderr)
    assert "skipped $MAHABHARATHA_FEATURE: 'a/b' is not a valid feature name" in said
    assert f"skipped {gsd / '.current-feature'}: '../escape' is not a valid feature name" in said

    (gsd / ".current-feature").write_text("good-one\n")
    found = invoke("feature", "detect", "--gsd-dir", gsd, env={"MAHABHARATHA_FEATURE": "a/b"})
    assert found.exit_code == 0 and found.stdout.strip() == "good-one"
    assert "skipped $MAHABHARATHA_FEATURE" in one_sentence(found.stderr)


def test_feature_detect_keeps_its_skipped_sources_to_itself_under_quiet(gsd: Path) -> None:
    """Fails before the change: a skipped source was echoed past the root's -q (no warnings)."""
    (gsd / ".current-feature").write_text("good-one\n")
    env = {"MAHABHARATHA_FEATURE": "a/b"}
    found = invoke("-q", "feature", "detect", "--gsd-dir", gsd, env=env)
    assert found.exit_code == 0 and found.stdout.strip() == "good-one"
    assert found.stderr == ""
