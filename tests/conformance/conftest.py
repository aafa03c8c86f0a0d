"""The backends the conformance suite runs against, and the ``backend`` fixture.

Every test in this folder takes ``backend`` (a fresh, empty lock space) and, for tests that race
real processes, ``kind`` (how a child process opens the same lock space). A new backend joins
the suite by adding one :class:`BackendKind` to :data:`BACKENDS` (``register``), e.g. from a
module imported here that skips itself when its server is not configured.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mahabharatha.backends.base import LockBackend
from mahabharatha.backends.files.backend import FileBackend


@dataclass(frozen=True)
class BackendKind:
    """How to open one backend on a test's lock space.

    ``open(gsd)`` must give the SAME lock space whenever it is called with the same ``gsd``,
    in this process or in a forked child (children open their own backend: connections are
    not shared across a fork). ``wipe(gsd)`` removes what the test left (after every test).
    ``skip``: a reason to skip every test of this kind (a server that is not configured).
    """

    id: str
    open: Callable[[Path], LockBackend]
    wipe: Callable[[Path], None] = lambda _gsd: None
    skip: str | None = None


BACKENDS: list[BackendKind] = [BackendKind("files", FileBackend)]
"""Every backend the suite runs against, in order."""


def register(kind: BackendKind) -> None:
    """Add a backend to the suite (call at import time of a conftest or plugin)."""
    BACKENDS.append(kind)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test that uses a backend runs once per :data:`BACKENDS` entry (read at collection,
    so a kind registered by any module imported before then takes part)."""
    if "kind" in metafunc.fixturenames:
        metafunc.parametrize("kind", BACKENDS, ids=[k.id for k in BACKENDS], indirect=True)


@pytest.fixture
def kind(request: pytest.FixtureRequest) -> BackendKind:
    chosen: BackendKind = request.param
    if chosen.skip:
        pytest.skip(chosen.skip)
    return chosen


@pytest.fixture
def gsd(tmp_path: Path) -> Path:
    """A gsd folder with its ``specs`` folder, and no feature yet."""
    root = tmp_path / "gsd"
    (root / "specs").mkdir(parents=True)
    return root


@pytest.fixture
def backend(kind: BackendKind, gsd: Path) -> Iterator[LockBackend]:
    """A fresh, empty lock space of the backend under test, closed and wiped afterwards."""
    opened = kind.open(gsd)
    try:
        yield opened
    finally:
        opened.close()
        kind.wipe(gsd)


def add_features(gsd: Path, *names: str) -> None:
    """The feature folders a bare ``claim`` and ``survey`` offer (``specs/<name>``)."""
    for name in names:
        os.makedirs(gsd / "specs" / name, exist_ok=True)


from tests.conformance import postgres_kind  # noqa: E402, F401  (registers PostgreSQL)
