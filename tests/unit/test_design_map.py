"""``design/README.md`` opens with the package's map: one line per module, none missing or stale;
and no module is over 900 lines (issue 29 item 1)."""

from __future__ import annotations

import re
from pathlib import Path

import mahabharatha

PACKAGE_DIR = Path(mahabharatha.__file__).parent
MAP = PACKAGE_DIR.parent / "design" / "README.md"
ENTRY = re.compile(r"^\s*- `(mahabharatha/[\w/]+\.py)`", re.M)


def test_the_map_names_every_module_once_and_nothing_else() -> None:
    named = ENTRY.findall(MAP.read_text(encoding="utf-8"))
    modules = sorted(
        str(path.relative_to(PACKAGE_DIR.parent)) for path in PACKAGE_DIR.rglob("*.py")
    )
    assert len(named) == len(set(named)), "a module is named twice in design/README.md"
    assert sorted(named) == modules


MAX_MODULE_LINES = 900
STILL_BEING_SPLIT = frozenset(
    {
        "mahabharatha/locks.py",
        "mahabharatha/run/runner.py",
        "mahabharatha/backends/postgres/backend.py",
    }
)
"""Modules whose split is under way on other branches: drop each one as its split lands."""


def test_no_module_is_over_900_lines() -> None:
    """Fails at d644adc: ``backends/files/lockfile.py`` had 1,297 lines, ``cli/lock.py`` 934."""
    long = {
        str(path.relative_to(PACKAGE_DIR.parent)): len(
            path.read_text(encoding="utf-8").splitlines()
        )
        for path in PACKAGE_DIR.rglob("*.py")
    }
    over = {name: lines for name, lines in long.items() if lines > MAX_MODULE_LINES}
    assert set(over) <= STILL_BEING_SPLIT, f"split these (one job per module): {over}"
