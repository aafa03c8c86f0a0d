"""Fixtures of the CLI tests; the helpers they use live in ``tests/cli/_support.py``."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.cli._support import Child


@pytest.fixture
def gsd(tmp_path: Path) -> Path:
    """An absolute gsd folder that is not the default ``.gsd``: the CLI must be told where it is.
    It exists, as a given ``--gsd-dir`` must (a missing one is a typo: exit 2)."""
    folder = tmp_path / "gsd-root"
    folder.mkdir()
    return folder


@pytest.fixture(autouse=True)
def _no_feature_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Neither the developer's env var nor the repository's folders leak into a test."""
    monkeypatch.delenv("MAHABHARATHA_FEATURE", raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Any]:
    """Start children (cwd: the test's folder); every one is reaped when the test ends."""
    children: list[Child] = []

    def start(argv: Sequence[str], *, stdin: int = subprocess.DEVNULL) -> Child:
        child = Child(argv, tmp_path, stdin=stdin)
        children.append(child)
        return child

    yield start
    for child in children:
        child.reap()
