"""The suite's own rules (tests/conftest.py): xdist workers share out the run by work
stealing; in CI a PostgreSQL test that ran and failed as expected (xfail) is no skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Final

from tests.unit.test_clean_checkout import NO_HYPOTHESIS

REPOSITORY: Final = Path(__file__).resolve().parents[2]
QUICK_TEST: Final = "tests/unit/test_constants.py"
INNER_RUN_SECONDS: Final = 60.0
"""Hang guard for the inner run (one worker, one quick file: a few seconds)."""


def _scheduler_line(*options: str, addopts: str = "") -> str:
    argv = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", NO_HYPOTHESIS]
    done = subprocess.run(
        [*argv, "-n", "1", *options, QUICK_TEST],
        cwd=REPOSITORY,
        env={**os.environ, "PYTEST_ADDOPTS": addopts},
        capture_output=True,
        text=True,
        timeout=INNER_RUN_SECONDS,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return next(line for line in done.stdout.splitlines() if "scheduling tests via" in line)


def test_a_run_in_workers_hands_out_tests_by_work_stealing() -> None:
    """Fails on f9b5570 (``LoadScheduling``, xdist's chunks): near the end of a whole run one
    worker still had a chunk of slow PostgreSQL tests, about 35 s alone, while three idled."""
    assert _scheduler_line().endswith("WorkStealingScheduling")


def test_a_dist_mode_named_on_the_command_line_is_kept() -> None:
    assert _scheduler_line("--dist", "loadfile").endswith("LoadFileScheduling")


def test_a_dist_mode_named_by_its_shortcut_or_in_pytest_addopts_is_kept() -> None:
    """``-d`` is xdist's shortcut for ``--dist load``, and ``PYTEST_ADDOPTS`` names options as
    the command line does. Failed before (review 8): only words of the command line starting
    with ``--dist`` counted, so both were turned into work stealing."""
    assert _scheduler_line("-d").endswith(" LoadScheduling")
    assert _scheduler_line(addopts="--dist load").endswith(" LoadScheduling")


def test_an_expected_failure_on_postgresql_passes_where_postgresql_is_required() -> None:
    """Fails on 1d237ab: ``MAHABHARATHA_REQUIRE_POSTGRES=1`` (CI) turns a skipped PostgreSQL test
    into a failure, and pytest reports an xfail as skipped: CI failed every strict xfail that
    records a known PostgreSQL limit, although each ran and failed as expected."""
    known_limit = (
        "tests/conformance/test_backend_conformance.py::"
        "test_a_claims_attempts_below_the_recorded_limit_counts_the_feature_failed[postgres]"
    )
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", NO_HYPOTHESIS]
    done = subprocess.run(
        [*argv, "-p", "no:xdist", known_limit],
        cwd=REPOSITORY,
        env={**os.environ, "MAHABHARATHA_REQUIRE_POSTGRES": "1", "PYTEST_ADDOPTS": ""},
        capture_output=True,
        text=True,
        timeout=INNER_RUN_SECONDS,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 xfailed" in done.stdout, done.stdout
