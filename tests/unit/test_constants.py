"""``mahabharatha.constants``: the configuration home (issue 29, item 4)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Final

import mahabharatha

PACKAGE_DIR: Final = Path(mahabharatha.__file__).parent


def _configuration(tree: ast.Module) -> set[str]:
    """Module-level environment names and ``*_SECONDS`` limits that ``tree`` defines, and
    environment names it reads by their literal text."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and str(node.value).startswith("MAHABHARATHA_"):
            found.add(str(node.value))
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and target.id.endswith("_SECONDS"):
            found.add(target.id)
    return found


def test_environment_names_and_time_limits_are_defined_only_in_constants() -> None:
    """Fails before the fix: the environment names were spelled in six modules (the URL and the
    namespace in three each) and these limits defined in nine; on 9564651 in the eight modules
    that test let off (the folder's, PostgreSQL's, liveness's and the proof's limits)."""
    found = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        name = str(path.relative_to(PACKAGE_DIR))
        if name != "constants.py":
            tree = ast.parse(path.read_text())
            found[name] = sorted(_configuration(tree))
    assert {name: names for name, names in found.items() if names} == {}
