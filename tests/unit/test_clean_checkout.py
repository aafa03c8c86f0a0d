"""Nothing the tests make is ever committed: the top level holds only the project's own files,
and a run that leaves a new file in the checkout fails (tests/support/clean_checkout.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

REPOSITORY: Final = Path(__file__).resolve().parents[2]
TOP_LEVEL: Final = frozenset(
    {".ci", ".gitignore", "CHANGELOG.md", "LICENSE", "README.md", "bench", "design"}
    | {"mahabharatha", "pyproject.toml", "tests", "tools"}
)
"""The contract's top level: the package, its tests and documents, CI, the benchmark and the
maintainers' tools (the mutation check)."""

LEAVES_A_FILE: Final = """
from pathlib import Path

def test_leaves_a_fifo_behind(request):
    (request.config.rootpath / "go.fifo").write_text("go\\n")
"""

LEAVES_NOTHING: Final = """
def test_leaves_nothing(tmp_path):
    (tmp_path / "go.fifo").write_text("go\\n")
"""

NO_HYPOTHESIS: Final = "no:hypothesispytest"
"""A child pytest without hypothesis's plugin (its import costs a second of CPU, for nothing)."""

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _tracked_top_level() -> set[str] | None:
    listed = subprocess.run(
        ["git", "ls-files"], cwd=REPOSITORY, capture_output=True, text=True, timeout=30
    )
    if listed.returncode != 0:
        return None
    return {line.split("/", 1)[0] for line in listed.stdout.splitlines()}


@needs_git
def test_the_repository_commits_no_test_leftovers_at_its_top_level() -> None:
    """Failed on 211f242: ``go.fifo`` (a regular file holding "go", the name of the FIFO of the
    killed-worker pool tests) was committed at the top level."""
    tracked = _tracked_top_level()
    if tracked is None:
        pytest.skip("not a git checkout")
    assert tracked <= TOP_LEVEL, sorted(tracked - TOP_LEVEL)


def _run_suite(folder: Path, test_text: str) -> subprocess.CompletedProcess[str]:
    """A one-test suite in ``folder`` with the plugin registered, run by a child pytest."""
    (folder / "conftest.py").write_text('pytest_plugins = ("tests.support.clean_checkout",)\n')
    (folder / "test_one.py").write_text(test_text)
    # The ceiling keeps git from finding a checkout around the temporary folder.
    env = {
        **os.environ,
        "PYTHONPATH": str(REPOSITORY),
        "GIT_CEILING_DIRECTORIES": str(folder.parent),
    }
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", NO_HYPOTHESIS]
    return subprocess.run(
        [*argv, str(folder)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _git_checkout(folder: Path) -> Path:
    subprocess.run(["git", "init", "-q", str(folder)], check=True, timeout=30)
    return folder


@needs_git
def test_a_run_that_leaves_a_file_in_the_checkout_fails_and_names_it(tmp_path: Path) -> None:
    """Failed on 211f242: there was no such check (the plugin did not exist), so a test that
    wrote ``go.fifo`` into the checkout passed and the file was committed."""
    result = _run_suite(_git_checkout(tmp_path), LEAVES_A_FILE)
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, result.stdout + result.stderr
    assert "1 passed" in result.stdout
    assert "LEFT BEHIND go.fifo" in result.stdout


@needs_git
def test_a_run_that_works_in_its_own_folders_passes(tmp_path: Path) -> None:
    result = _run_suite(_git_checkout(tmp_path), LEAVES_NOTHING)
    assert result.returncode == pytest.ExitCode.OK, result.stdout + result.stderr
    assert "LEFT BEHIND" not in result.stdout


def test_outside_a_checkout_the_check_stays_silent(tmp_path: Path) -> None:
    """An unpacked sdist has no git: nothing to compare, no failure and no noise."""
    result = _run_suite(tmp_path, LEAVES_A_FILE)
    assert result.returncode == pytest.ExitCode.OK, result.stdout + result.stderr
    assert "LEFT BEHIND" not in result.stdout
