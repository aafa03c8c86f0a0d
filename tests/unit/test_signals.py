"""``mahabharatha.signals``: the one home of the signal rules (issue 29, item 4)."""

from __future__ import annotations

import ast
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

import mahabharatha
from mahabharatha import signals

PACKAGE_DIR = Path(mahabharatha.__file__).parent
FORWARDED_NAMES = {"SIGINT", "SIGTERM", "SIGHUP"}


def _signal_rules(tree: ast.AST) -> Iterator[str]:
    """What in ``tree`` sets a handler, reads one, or spells the forwarded set out."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if (node.value.id, node.attr) in {("signal", "signal"), ("signal", "getsignal")}:
                yield f"signal.{node.attr}"
            if node.value.id == "_signal":
                yield f"_signal.{node.attr}"
        if isinstance(node, ast.Tuple):
            names = {e.attr for e in node.elts if isinstance(e, ast.Attribute)}
            if names >= FORWARDED_NAMES:
                yield "the forwarded set"


def test_only_the_signals_module_sets_handlers_or_names_the_forwarded_set() -> None:
    """Fails before the fix: ``locks``, ``runner``, ``team`` and ``cli/_output`` each installed
    and restored handlers themselves, and INT/TERM/HUP was spelled out in three of them."""
    found = {
        str(path.relative_to(PACKAGE_DIR)): sorted(set(_signal_rules(ast.parse(path.read_text()))))
        for path in PACKAGE_DIR.rglob("*.py")
        if path.name != "signals.py"
    }
    assert {path: rules for path, rules in found.items() if rules} == {}


@pytest.fixture
def usr1() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGUSR1)
    yield
    signal.signal(signal.SIGUSR1, previous)


def test_an_ignored_signal_stays_ignored_and_the_previous_handler_comes_back(usr1: None) -> None:
    seen: list[int] = []
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    with signals.Handling((signal.SIGUSR1,), lambda signum, _frame: seen.append(signum)):
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
        signal.raise_signal(signal.SIGUSR1)
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    with signals.Handling((signal.SIGUSR1,), lambda signum, _frame: seen.append(signum)):
        signal.raise_signal(signal.SIGUSR1)
    assert seen == [signal.SIGUSR1]
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


def test_a_deferred_signal_reaches_its_handler_after_the_block(usr1: None) -> None:
    seen: list[str] = []
    signal.signal(signal.SIGUSR1, lambda _signum, _frame: seen.append("handled"))
    with signals.Deferred():
        signal.raise_signal(signal.SIGUSR1)
        seen.append("block ended")
    assert seen == ["block ended", "handled"]
