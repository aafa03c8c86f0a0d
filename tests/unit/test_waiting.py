"""``mahabharatha.waiting``: one deadline and one backoff behind every wait, and one acquire wait
for ``locks.acquire`` and ``AsyncFeatureLock`` (issue 29, item 4)."""

from __future__ import annotations

import ast
import asyncio
import logging
import math
import os
from pathlib import Path
from typing import Final

import pytest

import mahabharatha
from mahabharatha import locks, logs, waiting
from mahabharatha.aio import AsyncFeatureLock

PACKAGE_DIR: Final = Path(mahabharatha.__file__).parent


def _draws_a_pause(tree: ast.AST) -> bool:
    return any(
        isinstance(node, ast.Attribute) and node.attr in {"uniform", "_backoff_delays"}
        for node in ast.walk(tree)
    )


def test_only_the_waiting_module_draws_a_pause() -> None:
    """Fails before the fix: ``locks`` drew its own jittered pauses (the acquire's backoff and
    the pause for a server slot) and ``aio`` borrowed ``locks._backoff_delays``."""
    drawing = {
        name
        for path in PACKAGE_DIR.rglob("*.py")
        if (name := str(path.relative_to(PACKAGE_DIR))) != "waiting.py"
        and _draws_a_pause(ast.parse(path.read_text()))
    }
    assert drawing == set()


def test_an_async_wait_is_logged_once_as_a_sync_one_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Fails before the fix: the async acquire loop, a copy of the sync one, never said that
    it waited (``logs``: a wait for a held lock is said once per wait)."""
    gsd = tmp_path / ".gsd"
    locks.acquire("feat", gsd, pid=os.getppid())  # held by another live process
    caplog.set_level(logging.INFO, logger=logs.LOGGER_NAME)
    with pytest.raises(locks.LockTimeoutError):
        locks.acquire("feat", gsd, timeout=0.05)
    with pytest.raises(locks.LockTimeoutError):
        asyncio.run(AsyncFeatureLock("feat", gsd, timeout=0.05, heartbeat=None).acquire())
    said = [r.getMessage() for r in caplog.records if r.name == logs.LOGGER_NAME]
    assert len(said) == 2 and all(line.startswith("waiting: ") for line in said), said


def test_a_deadline_caps_a_pause_and_none_never_passes() -> None:
    """Failed before the fix: a passed deadline capped a pause below 0, and ``time.sleep`` of
    that raised ValueError (a deadline passing between a check and the pause)."""
    assert waiting.Deadline(None).left() is None and not waiting.Deadline(None).passed()
    assert waiting.Deadline(None).cap(3.0) == 3.0
    assert waiting.Deadline(0.0).passed() and waiting.Deadline(0.0).cap(3.0) == 0.0
    assert waiting.Deadline(-5.0).passed()  # a negative wait is no wait


def test_the_backoff_doubles_its_ceiling_up_to_the_most() -> None:
    pauses = waiting.backoff(0.1, 0.4, math.inf)
    ceilings = [0.1, 0.2, 0.4, 0.4]
    for ceiling in ceilings:
        assert ceiling / 2 <= next(pauses) <= ceiling
