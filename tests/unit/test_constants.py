"""``mahabharatha.constants``: the configuration home (issue 29, item 4)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Final

import mahabharatha

PACKAGE_DIR: Final = Path(mahabharatha.__file__).parent
NOT_YET_MOVED: Final = frozenset(
    {
        "backends/files/lockfile.py",
        "owner/proof.py",
        "backends/postgres/backend.py",
        "backends/liveness.py",
    }
)
"""Modules whose own limits move once their open work (issues 26, 27, 28, 30) has landed."""


def _configuration(tree: ast.Module, limits_too: bool) -> set[str]:
    """Module-level environment names (and, with ``limits_too``, ``*_SECONDS`` limits) that
    ``tree`` defines, and environment names it reads by their literal text."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and str(node.value).startswith("MAHABHARATHA_"):
            found.add(str(node.value))
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if limits_too and isinstance(target, ast.Name) and target.id.endswith("_SECONDS"):
            found.add(target.id)
    return found


def test_environment_names_and_time_limits_are_defined_only_in_constants() -> None:
    """Fails before the fix: the environment names were spelled in six modules (the URL and the
    namespace in three each) and these limits defined in nine."""
    found = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        name = str(path.relative_to(PACKAGE_DIR))
        if name != "constants.py":
            tree = ast.parse(path.read_text())
            found[name] = sorted(_configuration(tree, limits_too=name not in NOT_YET_MOVED))
    assert {name: names for name, names in found.items() if names} == {}
