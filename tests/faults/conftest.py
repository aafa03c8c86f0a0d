"""Fixtures of the fault tests: real mounts (when the machine allows them) and the kill tally."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults._mounts import Mounting, Tmpfs, probe_mounting
from tests.faults._syscalls import TALLY


@pytest.fixture(scope="session")
def mounting() -> Mounting:
    """Probed once per session: may this process mount a tmpfs?"""
    return probe_mounting()


@pytest.fixture
def tmpfs(request: pytest.FixtureRequest, mounting: Mounting) -> Iterator[Tmpfs]:
    """A tmpfs for this test (16 KiB, or the size given by ``@pytest.mark.tmpfs_size``),
    unmounted afterwards; the test is skipped where mounting is forbidden."""
    if not mounting.allowed:
        pytest.skip(f"real-mount variant skipped: {mounting.reason}")
    marker = request.node.get_closest_marker("tmpfs_size")
    fs = Tmpfs(marker.args[0] if marker else "16k")
    try:
        yield fs
    finally:
        fs.unmount()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "tmpfs_size(size): size of the test's tmpfs (e.g. 64k)")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if TALLY.kills or TALLY.violations:
        terminalreporter.write_line(
            f"fault tests: {TALLY.kills} processes SIGKILLed mid-operation, "
            f"{len(TALLY.violations)} invariant violations"
        )
