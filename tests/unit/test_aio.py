"""``mahabharatha.aio``: ``AsyncFeatureLock`` drives a ``FeatureLock``'s state (issue 29)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from mahabharatha import aio
from mahabharatha.aio import AsyncFeatureLock
from mahabharatha.feature_lock import FeatureLock


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


def test_every_feature_lock_keyword_is_an_option_and_a_wrong_one_is_refused(
    tmp_path: Path,
) -> None:
    """``_Options`` is ``FeatureLock``'s keywords but ``on_lost`` (mypy checks the types of the
    keys it has, not that a keyword ``FeatureLock`` gains is one of them), and a misspelt one
    fails naming itself and the class the user called. Failed on 96f1493: the error named
    ``FeatureLock.__init__``, which the user never wrote."""
    asked = inspect.signature(FeatureLock).parameters.values()
    keywords = {p.name for p in asked if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert set(aio._Options.__annotations__) == keywords - {"on_lost"}
    said = r"^AsyncFeatureLock\.__init__\(\) got an unexpected keyword argument 'timout'$"
    with pytest.raises(TypeError, match=said):
        AsyncFeatureLock("feat", tmp_path, timout=0)  # type: ignore[call-arg]
