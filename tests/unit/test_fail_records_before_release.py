"""``fail`` records the attempt before it releases the lock, so a claimer that wins the lock
right after the release sees it.

Deterministic form of the race: the release (``lockfile.release_mine``, as ``fail`` calls it)
is wrapped so that, the moment it has let go, another claimer (the test's parent pid) claims
the feature. The attempt that reached the limit must already be on disk: the claim hands out
nothing. Fails with the record written after the release: the claim takes the feature, whose
last allowed attempt has just failed, and it is built once more.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from mahabharatha import locks
from mahabharatha.backends.base import ReleaseWait
from mahabharatha.backends.files import lockfile
from mahabharatha.backends.files.backend import FileBackend
from mahabharatha.backends.files.snapshot import LockBusyError

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


@pytest.mark.parametrize("verb", ["done", "fail"])
def test_a_release_refused_by_a_kernel_lease_is_tried_again_without_a_second_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verb: str
) -> None:
    """The release after the marker or record meets another's lease (its read refused): the
    wait tries the release again, never the record. Fails with the whole call retried (a
    failed attempt counted twice), or with no retry of the release (the busy error raised)."""
    gsd = tmp_path / "gsd"
    (gsd / "specs" / FEATURE).mkdir(parents=True)
    locks.acquire(FEATURE, gsd)
    release, refused = lockfile.release_mine, [errno.EWOULDBLOCK]

    def refused_once(dfd: int, mine: Any) -> bool:
        if refused:
            raise LockBusyError(refused.pop(), "leased")
        return release(dfd, mine)

    monkeypatch.setattr(lockfile, "release_mine", refused_once)
    told: list[float] = []
    wait = ReleaseWait(told.append, lambda seconds: None)
    backend = FileBackend(gsd)
    try:
        if verb == "done":
            backend.done(FEATURE, os.getpid(), wait)
        else:
            assert backend.fail(FEATURE, os.getpid(), "broken", 3, wait).tries == 1
    except LockBusyError as busy:
        raise AssertionError(f"the refused release was not tried again: {busy}") from None
    assert (len(told), refused) == (1, [])
    assert not (gsd / "specs" / FEATURE / ".lock").exists()
