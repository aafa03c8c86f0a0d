"""``design/README.md`` opens with the package's map: one line per module, none missing, none stale."""

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
