"""The suite's guard (tests/support/tally.py): a collected test that reports no outcome fails
the run, and no ordinary outcome is taken for a missing one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

from tests.unit.test_clean_checkout import NO_HYPOTHESIS

pytestmark = pytest.mark.timeout(60)

REPOSITORY: Final = Path(__file__).resolve().parents[2]
"""The folder that holds the ``tests`` package, so that ``-p tests.support.tally`` imports."""

INNER_RUN_SECONDS: Final = 50.0
"""Hang guard for one inner pytest run (it takes well under a second)."""

SWALLOWS_ONE: Final = """\
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    if item.name == "test_swallowed":
        return True  # the protocol is done: nothing ran, nothing was reported
    return None
"""

EVERY_OUTCOME: Final = """\
import pytest

@pytest.fixture
def skips():
    pytest.skip("in setup")

@pytest.fixture
def breaks():
    raise RuntimeError("setup error")

@pytest.fixture
def breaks_after():
    yield
    raise RuntimeError("teardown error")

def test_passes(): pass
def test_fails(): assert False
def test_skips_in_setup(skips): pass
def test_errors_in_setup(breaks): pass
def test_errors_in_teardown(breaks_after): pass
@pytest.mark.skip(reason="marked")
def test_marked_skip(): pass
@pytest.mark.xfail(reason="known")
def test_xfails(): assert False
@pytest.mark.xfail(reason="known")
def test_xpasses(): pass
def test_swallowed(): pass
"""


def _run_inner(folder: Path, *options: str) -> subprocess.CompletedProcess[str]:
    (folder / "pytest.ini").write_text("[pytest]\n")  # its own root: none of our settings
    (folder / "test_outcomes.py").write_text(EVERY_OUTCOME)
    env = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    argv = [sys.executable, "-m", "pytest", "-p", "tests.support.tally", "-p", "no:cacheprovider"]
    argv += ["-p", NO_HYPOTHESIS]
    return subprocess.run(
        [*argv, "-q", *options, str(folder)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=INNER_RUN_SECONDS,
        check=False,
    )


def _missing(said: str) -> list[str]:
    return [line.split()[-1] for line in said.splitlines() if line.startswith("NO OUTCOME ")]


def test_a_collected_test_without_an_outcome_fails_the_run(tmp_path: Path) -> None:
    """Fails before the fix (no guard): the inner run passed (exit 0), one result short, and
    nothing said so."""
    (tmp_path / "conftest.py").write_text(SWALLOWS_ONE)
    done = _run_inner(tmp_path, "-k", "passes or swallowed")
    assert _missing(done.stdout) == ["test_outcomes.py::test_swallowed"], done.stdout
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout


def test_every_ordinary_outcome_counts_as_reported(tmp_path: Path) -> None:
    """Pass, fail, skips, errors in setup and teardown, xfail and xpass: none is missing."""
    done = _run_inner(tmp_path)
    assert "1 failed, 3 passed, 2 skipped, 1 xfailed, 1 xpassed, 2 errors in" in done.stdout
    assert _missing(done.stdout) == [], done.stdout
    assert "collected but never reported" not in done.stdout


def test_a_run_stopped_early_is_not_checked(tmp_path: Path) -> None:
    """``-x`` leaves the later tests without an outcome on purpose: no NO OUTCOME lines."""
    done = _run_inner(tmp_path, "-x")
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout
    assert "stopping after 1 failures" in done.stdout
    assert _missing(done.stdout) == [], done.stdout


def test_a_test_without_an_outcome_fails_a_run_in_xdist_workers(tmp_path: Path) -> None:
    """The suite runs in pytest-xdist workers (README): the tally counts there too. Fails
    without the guard's xdist hook: the reporting process collects nothing itself, so it found
    nothing missing and the run passed."""
    (tmp_path / "conftest.py").write_text(SWALLOWS_ONE)
    done = _run_inner(tmp_path, "-n", "2", "-k", "passes or swallowed")
    assert _missing(done.stdout) == ["test_outcomes.py::test_swallowed"], done.stdout
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout
