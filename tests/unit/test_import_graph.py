"""The package's import graph keeps its layers, and its folders are the layers.

The layer rule, bottom to top; a folder is one layer (``design/README.md`` maps the modules):

* **neutral**: the root's small modules (clock, names, states, exits, constants, signals,
  waiting) and ``owner/`` (owner details, the proof of life) import only neutral modules.
* **the seam**: ``backends/`` itself (``base.py``, ``liveness.py``, ``open_backend``) imports
  neutral modules and the seam; ``open_backend`` is the one place that names a backend.
* **a backend**: ``backends/files/`` (the ``.lock`` protocol, its release watch) and
  ``backends/postgres/`` import neutral modules, the seam and their own folder, never another
  backend.
* **the lock layer**: ``locks.py``, ``aio.py``, ``pool/`` and ``run/`` talk to the seam only.
* **the faces**: ``cli/``, the Python API at the package root (which every face may import) and
  the legacy face ``commands/`` import everything below them except a backend; nothing but a
  face imports a face. The one exception: the legacy face is the ``.lock`` protocol's own
  contract (its tests patch ``_utils.os`` and ``_utils.time`` around the protocol's steps), so
  it may import ``backends/files/lockfile.py`` and its ``snapshot.py`` and ``folder.py``.

Every static import is read (``ast``), function-local ones and ``importlib.import_module`` of
a literal name included. A module no layer names fails the test: say where it belongs.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

import mahabharatha

PACKAGE_DIR: Final = Path(mahabharatha.__file__).parent

NEUTRAL: Final = "neutral"
SEAM: Final = "seam"
FILES: Final = "backend: files"
POSTGRES: Final = "backend: postgresql"
LOCK_LAYER: Final = "lock layer"
FACE: Final = "face"

LAYERS: Final[dict[str, str]] = {
    "mahabharatha.clock": NEUTRAL,
    "mahabharatha.constants": NEUTRAL,
    "mahabharatha.detect": NEUTRAL,
    "mahabharatha.exits": NEUTRAL,
    "mahabharatha.logs": NEUTRAL,
    "mahabharatha.names": NEUTRAL,
    "mahabharatha.reads": NEUTRAL,
    "mahabharatha.signals": NEUTRAL,
    "mahabharatha.states": NEUTRAL,
    "mahabharatha.waiting": NEUTRAL,
    "mahabharatha.owner": NEUTRAL,
    "mahabharatha.backends": SEAM,
    "mahabharatha.backends.files": FILES,
    "mahabharatha.backends.postgres": POSTGRES,
    "mahabharatha.locks": LOCK_LAYER,  # the lock layer's public names
    "mahabharatha.functional": LOCK_LAYER,  # acquire, release, done, fail, clean: one call each
    "mahabharatha.feature_lock": LOCK_LAYER,  # FeatureLock, its heartbeat, the fork hook
    "mahabharatha.aio": LOCK_LAYER,  # AsyncFeatureLock: the lock layer driven from an event loop
    "mahabharatha.pool": LOCK_LAYER,  # lock work -j: the pool's workers forked from one command
    "mahabharatha.run": LOCK_LAYER,  # lock run: a command and its process tree under a lock
    "mahabharatha": FACE,  # the Python API: the lock layer's public names, imported lazily
    "mahabharatha.__main__": FACE,
    "mahabharatha.commands": FACE,
    "mahabharatha.cli": FACE,
}
"""Every root module's and every folder's layer: a module in a folder takes its folder's."""

ALLOWED: Final[dict[str, frozenset[str]]] = {
    NEUTRAL: frozenset({NEUTRAL}),
    SEAM: frozenset({NEUTRAL, SEAM}),
    FILES: frozenset({NEUTRAL, SEAM, FILES}),
    POSTGRES: frozenset({NEUTRAL, SEAM, POSTGRES}),
    LOCK_LAYER: frozenset({NEUTRAL, SEAM, LOCK_LAYER}),
    FACE: frozenset({NEUTRAL, SEAM, LOCK_LAYER, FACE}),
}
"""Which layers a layer may import."""

EXCEPTIONS: Final[frozenset[tuple[str, str]]] = frozenset(
    {
        # The one place that picks a backend (by the URL's scheme).
        ("mahabharatha.backends", "mahabharatha.backends.files.backend"),
        ("mahabharatha.backends", "mahabharatha.backends.postgres.backend"),
        # The legacy face is the .lock protocol's contract (see the module docstring).
        ("mahabharatha.commands._utils", "mahabharatha.backends.files.lockfile"),
        ("mahabharatha.commands._utils", "mahabharatha.backends.files.snapshot"),
        ("mahabharatha.commands._utils", "mahabharatha.backends.files.folder"),
    }
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: Final[dict[str, Path]] = {
    _module_name(path): path for path in sorted(PACKAGE_DIR.rglob("*.py"))
}


def layer_of(module: str) -> str | None:
    """The layer of ``module``: its own entry, else its nearest folder's (never the root's:
    a new root module must be placed)."""
    name = module
    while name != "mahabharatha":
        if name in LAYERS:
            return LAYERS[name]
        name = name.rpartition(".")[0]
    return LAYERS["mahabharatha"] if module == "mahabharatha" else None


def _resolve(importer: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = importer if MODULES[importer].name == "__init__.py" else importer.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _target(name: str) -> str:
    """The package module an imported name is: the longest prefix that is one of ours."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def imports_of(module: str) -> Iterator[tuple[str, int]]:
    """Every module of the package that ``module`` imports, with the line (static imports
    anywhere in the file, and ``import_module("...")`` of a literal name)."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        for name in _names_imported(module, node):
            if name.split(".")[0] == "mahabharatha":
                target = _target(name)
                if target and target != module:
                    yield target, getattr(node, "lineno", 0)


def _names_imported(module: str, node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = _resolve(module, node)
        return [f"{base}.{alias.name}" for alias in node.names] or [base]
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute | ast.Name)
        and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
        == "import_module"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return [node.args[0].value]
    return []


def forbidden_arrows() -> list[str]:
    found = []
    for module in MODULES:
        source = layer_of(module)
        assert source is not None
        for target, line in sorted(set(imports_of(module))):
            if (module, target) in EXCEPTIONS or _covered(module, target):
                continue
            goal = layer_of(target)
            assert goal is not None
            if goal not in ALLOWED[source]:
                found.append(f"{module} ({source}) -> {target} ({goal}), line {line}")
            elif source == goal == FACE and _face_of(module) != _face_of(target) != "python":
                found.append(f"{module} -> {target}: a face imports another face, line {line}")
    return found


def _covered(module: str, target: str) -> bool:
    """Exceptions name a module; its sub-modules share them (``backends.postgres.*``)."""
    return any(
        module == importer and (target == goal or target.startswith(goal + "."))
        for importer, goal in EXCEPTIONS
    )


def _face_of(module: str) -> str:
    """Which face a module belongs to: the CLI, the legacy face (``commands`` and its server
    answers), or ``python -m`` (which starts the CLI); the root's Python API is its own."""
    if module.startswith("mahabharatha.cli") or module == "mahabharatha.__main__":
        return "cli"
    return "python" if module == "mahabharatha" else "legacy"


def test_every_module_has_a_layer() -> None:
    unplaced = [module for module in MODULES if layer_of(module) is None]
    assert not unplaced, f"say which layer these belong to (LAYERS): {unplaced}"


def test_no_import_breaks_the_layer_rule() -> None:
    """Fails before issue 20: ``locks`` imported ``FileBackend``, ``lockfile`` and ``_utils``
    (the clock); ``runner`` imported ``lockfile.LockBusyError``; ``postgres`` imported
    ``FileBackend``; ``files`` took the clock from ``_utils``; the CLI took the name rules from
    ``_utils``."""
    arrows = forbidden_arrows()
    assert not arrows, "imports that break the layer rule:\n" + "\n".join(arrows)


@pytest.mark.parametrize(
    ("importer", "imported", "broken"),
    [
        ("mahabharatha.locks", "mahabharatha.backends.files.backend", True),
        ("mahabharatha.locks", "mahabharatha.backends.files.lockfile", True),
        ("mahabharatha.run.runner", "mahabharatha.commands._utils", True),
        ("mahabharatha.backends.postgres.backend", "mahabharatha.backends.files.backend", True),
        ("mahabharatha.backends.files.backend", "mahabharatha.commands._utils", True),
        ("mahabharatha.backends.base", "mahabharatha.locks", True),
        ("mahabharatha.clock", "mahabharatha.backends.base", True),
        ("mahabharatha.cli.lock", "mahabharatha.commands._utils", True),
        ("mahabharatha.commands._utils", "mahabharatha.backends.files.backend", True),
        ("mahabharatha.locks", "mahabharatha.backends.base", False),
        ("mahabharatha.backends.files.backend", "mahabharatha.backends.files.lockfile", False),
        ("mahabharatha.cli.lock", "mahabharatha.locks", False),
        ("mahabharatha.commands._utils", "mahabharatha.backends.files.lockfile", False),
        ("mahabharatha.backends", "mahabharatha.backends.postgres.backend", False),
    ],
)
def test_the_rule_itself(importer: str, imported: str, broken: bool) -> None:
    """The rule refuses the arrows the issue named, and allows the ones the map draws (a
    guard against a rule that refuses nothing)."""
    source, goal = layer_of(importer), layer_of(imported)
    assert source is not None and goal is not None
    excepted = (importer, imported) in EXCEPTIONS
    face_to_face = source == FACE == goal and _face_of(importer) != _face_of(imported)
    refused = not excepted and (goal not in ALLOWED[source] or face_to_face)
    assert refused is broken


def test_the_python_api_is_the_package_roots_and_costs_nothing_until_used() -> None:
    """Fails before the fix: ``from mahabharatha import FeatureLock`` raised ImportError (the
    root exported ``__version__`` only)."""
    script = (
        "import sys, mahabharatha\n"
        "assert 'mahabharatha.locks' not in sys.modules\n"
        "from mahabharatha import AsyncFeatureLock, FeatureLock, LockError, acquire, release\n"
        "from mahabharatha import aio, locks\n"
        "assert (FeatureLock, acquire) == (locks.FeatureLock, locks.acquire)\n"
        "assert (AsyncFeatureLock, LockError) == (aio.AsyncFeatureLock, locks.LockError)\n"
        "assert all(getattr(mahabharatha, name) for name in mahabharatha.__all__)\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True)


PUBLIC: Final = frozenset(
    {
        "mahabharatha",  # the Python API
        "mahabharatha.aio",  # AsyncFeatureLock (the README's)
        "mahabharatha.locks",  # the README's imports
        "mahabharatha.commands._utils",  # the legacy functions (the contract's first table)
        "mahabharatha.commands.status",  # re-exports detect_feature (the contract)
        "mahabharatha.cli._click",  # its names are all it is: the click that typer carries
    }
)
"""The modules whose names are imported from outside: the only ones with ``__all__``."""


def test_only_public_modules_declare_their_names() -> None:
    """Fails before the fix: 33 modules declared ``__all__`` (348 entries), private ones too."""
    declaring = {
        module
        for module, path in MODULES.items()
        for node in ast.parse(path.read_text(encoding="utf-8")).body
        if isinstance(node, ast.Assign)
        and any(isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets)
    }
    assert declaring <= PUBLIC


MAX_LINES: Final = 900
BEING_SPLIT: Final[frozenset[str]] = frozenset()
"""Modules over the limit whose split is under way (drop each when it lands)."""


def test_no_module_is_over_900_lines() -> None:
    """Fails before the split of ``locks.py`` (1,990 lines: five jobs in one module)."""
    long = {
        module: lines
        for module, path in MODULES.items()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert set(long) <= BEING_SPLIT, long


def _reachable(module: str, arrows: dict[str, set[str]]) -> set[str]:
    seen: set[str] = set()
    todo = [module]
    while todo:
        for target in arrows[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def import_cycles() -> set[frozenset[str]]:
    """Every group of modules that import each other, function-local imports counted."""
    arrows = {module: {target for target, _line in imports_of(module)} for module in MODULES}
    reach = {module: _reachable(module, arrows) for module in MODULES}
    return {
        frozenset({module} | {other for other in found if module in reach[other]})
        for module, found in reach.items()
        if module in found
    }


def test_no_import_cycle_counting_lazy_imports() -> None:
    """Fails before the split: ``locks`` imported ``aio`` on first use of ``AsyncFeatureLock``
    and ``aio`` imported ``locks``; later ``postgres.aio`` named ``postgres.backend`` for its
    types, and ``cli.lock`` reached ``cli.pool`` for the watch, which imported ``cli.lock``."""
    assert import_cycles() == set()
