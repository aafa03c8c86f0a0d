"""The one-feature gsd folder several test files start from, and the path of its lock."""

from __future__ import annotations

from pathlib import Path
from typing import Final

FEATURE: Final = "feat"


def one_feature_gsd(tmp_path: Path) -> Path:
    """A gsd folder under ``tmp_path`` whose ``specs`` holds the folder of :data:`FEATURE`.

    Use it as a test file's ``gsd`` fixture: ``gsd = pytest.fixture(one_feature_gsd, name="gsd")``.
    """
    (tmp_path / "gsd" / "specs" / FEATURE).mkdir(parents=True)
    return tmp_path / "gsd"


def lock_of(gsd: Path) -> Path:
    """The lock path of :data:`FEATURE` in ``gsd``."""
    return gsd / "specs" / FEATURE / ".lock"
