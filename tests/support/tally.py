"""A pytest plugin that fails a finished run in which a collected test reported no outcome.

A test that silently does not run cannot fail. pytest itself counts only the reports it gets,
so a test that produced none (a plugin or hook that swallowed it, a forked child that ended the
run's reporting for it) shows as nothing at all: the summary is simply one result short. This
plugin compares the collected items with the outcomes reported and, when the run was not
stopped early, lists the missing tests and makes the run fail.

An outcome is the ``call`` report, or the ``setup`` report when setup did not pass (an error or
a skip: the test then has no call). Registered by ``tests/conftest.py`` (``pytest_plugins``).
"""

from __future__ import annotations

import pytest

from tests.support import runs_the_session

_FINISHED_RUNS: frozenset[int] = frozenset({pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED})
"""Only a run that went through all its tests is checked: an interrupted, crashed or empty one
legitimately leaves tests without an outcome."""


class OutcomeTally:
    """Collected test ids and the ids that reported an outcome, for one session."""

    def __init__(self) -> None:
        self.collected: list[str] = []
        self.reported: set[str] = set()
        self.missing: list[str] = []

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.collected = [item.nodeid for item in session.items]  # after any deselection

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: object, ids: list[str]) -> None:
        """Under pytest-xdist the reporting process collects nothing: every worker collects
        the same ids, and those are the run's."""
        self.collected = list(ids)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" or (report.when == "setup" and not report.passed):
            self.reported.add(report.nodeid)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if not _ran_to_the_end(session, exitstatus):
            return
        self.missing = [nodeid for nodeid in self.collected if nodeid not in self.reported]
        if self.missing:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.missing:
            return
        terminalreporter.section("collected but never reported", sep="!", red=True, bold=True)
        for nodeid in self.missing:
            terminalreporter.write_line(f"NO OUTCOME {nodeid}")
        terminalreporter.write_line(f"{len(self.missing)} collected tests reported no outcome")


def _ran_to_the_end(session: pytest.Session, exitstatus: int) -> bool:
    """Did every collected test get its turn (no -x, --maxfail, stepwise, Ctrl-C, --co)?"""
    stopped = bool(session.shouldstop) or bool(session.shouldfail)
    return exitstatus in _FINISHED_RUNS and not stopped and not session.config.option.collectonly


def pytest_configure(config: pytest.Config) -> None:
    if runs_the_session(config):  # a worker sees only its share of the outcomes
        config.pluginmanager.register(OutcomeTally(), "mahabharatha-outcome-tally")
