"""``mahabharatha.aio``: ``AsyncFeatureLock`` drives a ``FeatureLock``'s state (issue 29)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mahabharatha import aio
from mahabharatha.aio import AsyncFeatureLock


def _hand_forwarded(source: str) -> list[str]:
    """The properties of ``AsyncFeatureLock`` whose whole body is ``return self._state.X``."""
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any(
            isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list
        ):
            body = [n for n in node.body if not isinstance(n, ast.Expr)]  # past a docstring
            if len(body) == 1 and "self._state." in ast.unparse(body[0]):
                found.append(node.name)
    return found


def test_no_property_is_forwarded_by_hand() -> None:
    """Fails before the fix: 12 properties each returned ``self._state.<name>``."""
    assert _hand_forwarded(Path(aio.__file__).read_text()) == []


def test_the_state_answers_and_cannot_be_written_through(tmp_path: Path) -> None:
    lock = AsyncFeatureLock("feat", tmp_path, timeout=0, heartbeat=None)
    assert (lock.feature, lock.held, lock.token, lock.lost) == ("feat", False, None, None)
    assert lock.backend is lock._state.backend and lock.heartbeat is None
    with pytest.raises(AttributeError):
        lock.feature = "other"
