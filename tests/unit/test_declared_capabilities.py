"""Issue 20: optional capabilities are declared on the seam and called, never probed.

The lock layer, the runner and the CLI once asked ``getattr(backend, "wait_for_release",
None)`` and ten other such questions: a backend that misspelt a method silently lost the
capability. Now each optional ability is a protocol of its own in
:mod:`~mahabharatha.backends.base` (issue 29), tested with ``isinstance``, and no ``getattr``
in the package looks at anything but a module's constants, an object's own attributes
(``self``) or an exception.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Final

import pytest

import mahabharatha
from mahabharatha.backends.base import (
    ClaimsInOneStep,
    HearsReleases,
    LocalFolder,
    LockBackend,
    LockServer,
    WatchesReleases,
)
from mahabharatha.backends.files.backend import FileBackend

PACKAGE_DIR: Final = Path(mahabharatha.__file__).parent


def _modules_imported(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def _exception_names(tree: ast.Module) -> set[str]:
    return {
        node.name for node in ast.walk(tree) if isinstance(node, ast.ExceptHandler) and node.name
    }


def probes_in(source: str) -> list[str]:
    """Every ``getattr(x, ...)`` whose ``x`` is not a module of the file, ``self`` or a caught
    exception: a probe of another object's capabilities."""
    tree = ast.parse(source)
    allowed = _modules_imported(tree) | _exception_names(tree) | {"self"}
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"getattr", "hasattr"}
            and node.args
            and not (isinstance(node.args[0], ast.Name) and node.args[0].id in allowed)
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_probes_a_backend_with_getattr() -> None:
    found = {
        str(path.relative_to(PACKAGE_DIR)): probes
        for path in sorted(PACKAGE_DIR.rglob("*.py"))
        if (probes := probes_in(path.read_text(encoding="utf-8")))
    }
    assert not found, f"capability probes (declare them on LockBackend instead): {found}"


@pytest.mark.parametrize(
    ("source", "probed"),
    [
        ('rest = getattr(self.backend, "rest", None)', True),
        ('listen = getattr(store, "wait_for_any_release", None)', True),
        ('if hasattr(store, "init"): pass', True),
        ('import fcntl\nX = getattr(fcntl, "F_OFD_GETLK", None)', False),
        ('try:\n    pass\nexcept OSError as error:\n    getattr(error, "sqlstate", None)', False),
    ],
)
def test_the_probe_finder_finds_probes(source: str, probed: bool) -> None:
    """A guard against a check that finds nothing: the probes this issue removed are found."""
    assert bool(probes_in(source)) is probed


def test_the_folder_backend_declares_what_it_has(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path / "gsd")
    assert isinstance(backend, LockBackend)
    assert isinstance(backend, LocalFolder)
    assert isinstance(backend, WatchesReleases)
    for lacking in (LockServer, ClaimsInOneStep, HearsReleases):
        assert not isinstance(backend, lacking)
    assert backend.local_calls
    assert backend.run_lease is None  # the fixed 2 h
    backend.close()  # no connection to let go of


SEAM_MOST_METHODS: Final = 16
"""Issue 29: the operations every backend has and every caller needs."""


def test_the_seam_keeps_only_what_every_backend_has() -> None:
    """``LockBackend`` has at most 16 public methods; the rest are protocols of their own.
    Failed before (issue 29): 32 methods, 16 of them with one implementation or one caller."""
    methods = [
        name
        for name, value in vars(LockBackend).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    ]
    assert len(methods) <= SEAM_MOST_METHODS, methods


LOCK_LAYER: Final = ("pool", "run", "aio.py", "feature_lock.py", "functional.py", "locks.py")
"""The lock layer's modules and folders: they talk to the seam only."""
CONNECTION_POLICY: Final = frozenset(
    {"ServerFullError", "SLOT_PAUSE_SECONDS", "POOL_SLOTS_LOOK_SECONDS", "_pause_for_a_slot"}
)
"""A server backend's connection policy: waiting for a free slot, looking whether it is
crowded. The PostgreSQL backend decides it; the lock layer never names it."""


def connection_policy_in(source: str) -> list[str]:
    """The connection-policy names ``source`` imports, and its calls of ``crowded(...)`` or
    of a bare ``rest()`` (a backend's connection let go)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            found += [alias.name for alias in node.names if alias.name in CONNECTION_POLICY]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = node.func.attr
            if name == "crowded" or (name == "rest" and not node.args):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_lock_layer_leaves_connection_policy_to_the_backend() -> None:
    """Issue 29: slot waits, crowded servers and resting connections are the PostgreSQL
    backend's own. Failed before: ``pool/`` imported ``ServerFullError``, ``SLOT_PAUSE_SECONDS``,
    ``POOL_SLOTS_LOOK_SECONDS`` and ``_pause_for_a_slot`` and called ``crowded()`` and
    ``rest()``; ``aio.py`` and ``feature_lock.py`` called ``rest()``."""
    paths = [PACKAGE_DIR / name for name in LOCK_LAYER]
    files = [p for path in paths for p in (sorted(path.rglob("*.py")) if path.is_dir() else [path])]
    found = {
        str(path.relative_to(PACKAGE_DIR)): names
        for path in files
        if (names := connection_policy_in(path.read_text(encoding="utf-8")))
    }
    assert not found, found


def test_the_policy_finder_finds_policy() -> None:
    """A guard against a check that finds nothing."""
    assert connection_policy_in("from x import ServerFullError")
    assert connection_policy_in("store.crowded(0.5)")
    assert connection_policy_in("self.backend.rest()")
    assert not connection_policy_in("pool.rest(feature)")  # a feature's rest after a failure
