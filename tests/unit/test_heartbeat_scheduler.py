"""One heartbeat scheduler (issue 29, item 2): ``locks.Heartbeat`` runs the one rule
(``FeatureLock._beat_once``) for a ``FeatureLock`` and for a pool worker; an event loop's task
is the only other pacing; no subclass of the package switches behaviour off."""

from __future__ import annotations

import ast
import threading
from collections.abc import Iterator
from pathlib import Path

import mahabharatha
from mahabharatha import locks
from mahabharatha.backends import open_backend

PACKAGE_DIR = Path(mahabharatha.__file__).parent


def _classes() -> Iterator[tuple[str, ast.ClassDef]]:
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                yield str(path.relative_to(PACKAGE_DIR)), node


def _methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    return {
        node.name: node
        for node in cls.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }


def _does_nothing(method: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A body of a docstring and ``pass``, ``...`` or a bare ``return None`` at most."""
    body = [
        statement
        for statement in method.body
        if not (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant))
    ]
    return all(
        isinstance(statement, ast.Pass)
        or (
            isinstance(statement, ast.Return)
            and (
                statement.value is None
                or (isinstance(statement.value, ast.Constant) and statement.value.value is None)
            )
        )
        for statement in body
    )


def test_only_the_heartbeat_and_the_loop_task_schedule_the_heartbeat_rule() -> None:
    """Fails before the fix: ``FeatureLock._beat_loop`` (a thread per lock) and
    ``PoolLock.pool_beat`` (for ``PoolHeartbeat``) each ran ``_beat_once`` beside the loop's
    task: three schedulers around one rule."""
    callers = {
        f"{cls.name}.{name}"
        for _path, cls in _classes()
        for name, method in _methods(cls).items()
        for node in ast.walk(method)
        if isinstance(node, ast.Attribute) and node.attr == "_beat_once" and name != "_beat_once"
    }
    assert callers == {"Heartbeat._step", "AsyncFeatureLock._beat"}


def test_no_subclass_in_the_package_overrides_a_method_with_nothing() -> None:
    """Fails before the fix: ``aio._LoopHeldLock`` overrode ``FeatureLock._start_heartbeat``
    and ``_rest_backend`` with bodies that did nothing."""
    classes = dict((cls.name, cls) for _path, cls in _classes())
    empty = sorted(
        f"{path}: {cls.name}.{name}"
        for path, cls in _classes()
        for base in cls.bases
        if isinstance(base, ast.Name) and base.id in classes
        for name, method in _methods(cls).items()
        if name in _methods(classes[base.id]) and _does_nothing(method)
    )
    assert empty == []


def _heartbeat_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("lock-heartbeat")]


def test_a_lock_held_twice_in_turn_gets_its_heartbeat_each_time(tmp_path: Path) -> None:
    """The lock's own :class:`~mahabharatha.locks.Heartbeat` is closed at each release and
    opened again by the next hold: refreshed both times, no thread left after."""
    refreshed = threading.Event()
    lock = locks.FeatureLock("beat", tmp_path, heartbeat=0.01)
    real_refresh = lock.refresh

    def refresh() -> None:
        real_refresh()
        refreshed.set()

    lock.refresh = refresh  # type: ignore[method-assign]
    for _turn in range(2):
        refreshed.clear()
        with lock:
            assert _heartbeat_threads() == ["lock-heartbeat-beat"]
            assert refreshed.wait(10)
        assert _heartbeat_threads() == []


def test_a_pool_lock_is_held_from_its_claim_on(tmp_path: Path) -> None:
    """The pool's hold is adopted as ``FeatureLock``'s (``_adopt``), its deadline with it.
    Fails before the fix: a ``PoolLock`` kept no deadline until its first refresh, so ``held``
    said False, and a first refresh that failed for a passing reason declared it lost."""
    gsd = tmp_path / ".gsd"
    (gsd / "specs" / "a").mkdir(parents=True)
    held = locks.claim_held(["a"], gsd)
    assert held is not None
    store = open_backend(None, gsd)
    lock = locks.PoolLock(held, gsd, backend=store, heartbeat=None, command=None, lease=None)
    lock.acquire()
    try:
        assert lock.held
    finally:
        lock.finish(None, None, 1)
