"""``fail`` records the attempt before it releases the lock, so a claimer that wins the lock
right after the release sees it.

Deterministic form of the race: the release (``lockfile.release_mine``, as ``fail`` calls it)
is wrapped so that, the moment it has let go, another claimer (the test's parent pid) claims
the feature. The attempt that reached the limit must already be on disk: the claim hands out
nothing. Fails with the record written after the release: the claim takes the feature, whose
last allowed attempt has just failed, and it is built once more.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from mahabharatha import locks
from mahabharatha.backends.files import lockfile

FEATURE = "feat"


def test_a_claim_right_after_the_release_sees_the_failed_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gsd = tmp_path / "gsd"
    (gsd / "specs" / FEATURE).mkdir(parents=True)
    locks.acquire(FEATURE, gsd)
    claimed: list[str | None] = []
    release = lockfile.release_mine

    def release_then_claim(dfd: int, mine: Any) -> bool:
        released = release(dfd, mine)
        claimed.append(locks.claim([FEATURE], gsd, pid=os.getppid()))
        return released

    monkeypatch.setattr(lockfile, "release_mine", release_then_claim)
    locks.fail(FEATURE, gsd, reason="broken", attempts=1)
    assert claimed == [None], "a feature at its attempts limit was handed out again"
