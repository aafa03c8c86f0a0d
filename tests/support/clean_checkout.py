"""A pytest plugin that fails a run which left new files in the checkout.

Every test works in its own temporary folder; a file that appears in the repository during a
run (a FIFO or log written to a relative path, a command run in the wrong working directory)
is a defect that ends up committed. The plugin lists the untracked files that git sees at the
start of the session and again at its end; a path new at the end fails the run and is named.
Outside a git checkout (an unpacked sdist, no git installed) there is nothing to compare and
the check stays silent. Registered by ``tests/conftest.py`` (``pytest_plugins``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support import runs_the_session

GIT_TIMEOUT_SECONDS = 30.0
"""A git status bounded so that a hung git (a locked index on a network disk) never hangs CI."""


def untracked_files(root: Path) -> frozenset[str] | None:
    """Untracked, not ignored paths under ``root``'s checkout; ``None`` outside a checkout."""
    try:
        listed = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=all", "-z", "--", "."],
            cwd=root,
            capture_output=True,
            timeout=GIT_TIMEOUT_SECONDS,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if listed.returncode != 0:
        return None
    entries = listed.stdout.decode(errors="replace").split("\0")
    return frozenset(entry[3:] for entry in entries if entry.startswith("?? "))


class CleanCheckout:
    """The untracked files before the session, and those the session added."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.before: frozenset[str] | None = None
        self.added: list[str] = []

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.before = untracked_files(self.root)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        after = untracked_files(self.root) if self.before is not None else None
        if self.before is None or after is None:
            return
        self.added = sorted(after - self.before)
        if self.added:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.added:
            return
        terminalreporter.section("files the run left in the checkout", sep="!", red=True)
        for path in self.added:
            terminalreporter.write_line(f"LEFT BEHIND {path}")
        terminalreporter.write_line(f"{len(self.added)} new files in {self.root}")


def pytest_configure(config: pytest.Config) -> None:
    if not runs_the_session(config):  # a worker would see its neighbours' files mid-test
        return
    config.pluginmanager.register(CleanCheckout(config.rootpath), "mahabharatha-clean-checkout")
