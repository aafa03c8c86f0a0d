"""A claim that wins a feature's lock looks again whether the feature was finished meanwhile.

Deterministic form of the race: between the claimer's first look ("not done, not failed") and
its acquire, another worker (this process, for another pid) marks the feature done, or records
its last failed attempt, and releases it. The claimer's first look is the backend's
``is_done`` (or ``attempts``) call, patched to run that other worker right after it answered.
The claim must hand out nothing. Fails without the re-check after the lock is won: the claim
returns the feature, finished, and it is built again.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mahabharatha import locks
from mahabharatha.backends.files.backend import FileBackend

FEATURE = "feat"


def _after_first(original: Callable[..., Any], meanwhile: Callable[[], None]) -> Any:
    """``original``, running ``meanwhile`` once, right after its first answer."""
    calls = 0

    def patched(self: FileBackend, feature: str) -> Any:
        nonlocal calls
        answer = original(self, feature)
        calls += 1
        if calls == 1:
            meanwhile()
        return answer

    return patched


@pytest.fixture
def gsd(tmp_path: Path) -> Path:
    folder = tmp_path / "gsd"
    (folder / "specs" / FEATURE).mkdir(parents=True)
    return folder


def _claimer_pid() -> int:
    """The claimer: this test's parent process (alive, not this process)."""
    return os.getppid()


def test_a_feature_marked_done_after_the_first_look_is_not_handed_out(
    gsd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    locks.acquire(FEATURE, gsd)  # the other worker holds it, building

    def other_worker_finishes() -> None:
        locks.done(FEATURE, gsd)

    monkeypatch.setattr(
        FileBackend, "is_done", _after_first(FileBackend.is_done, other_worker_finishes)
    )
    assert locks.claim([FEATURE], gsd, pid=_claimer_pid()) is None
    assert not (gsd / "specs" / FEATURE / ".lock").exists()


def test_a_feature_failed_for_good_after_the_first_look_is_not_handed_out(
    gsd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    locks.acquire(FEATURE, gsd)  # the other worker holds it, building

    def other_worker_gives_up() -> None:
        locks.fail(FEATURE, gsd, reason="broken", attempts=1)

    monkeypatch.setattr(
        FileBackend, "attempts", _after_first(FileBackend.attempts, other_worker_gives_up)
    )
    assert locks.claim([FEATURE], gsd, pid=_claimer_pid()) is None
    assert not (gsd / "specs" / FEATURE / ".lock").exists()
