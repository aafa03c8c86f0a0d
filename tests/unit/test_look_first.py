"""A held lock costs a read, not an inode: the folder backend looks before it publishes.

A pool's claim walks past every feature the other workers hold, and a waiter tries a held lock
again and again. Each such try used to publish (make an inode, link it in vain, drop it):
contending workers paid for it in the file system's journal (``lock work -j 8`` over 400
features: 2.7 s, 1.6 s with the look first). The look gives the answer a failed publish gives,
one step earlier; a lock that may be reclaimed, or none, still goes through the publish.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from mahabharatha.backends.base import Requester
from mahabharatha.backends.files import lockfile
from mahabharatha.backends.files.backend import FileBackend
from mahabharatha.constants import STALE_AFTER_SECONDS
from mahabharatha.states import State

FEATURE = "feat"


@pytest.fixture
def publishes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the publishes the protocol makes (each one an inode)."""
    made: list[int] = []
    real = lockfile.publish_proven

    def counted(*args: Any, **kwargs: Any) -> Any:
        made.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(lockfile, "publish_proven", counted)
    return made


def _lock(gsd: Path, content: str) -> Path:
    path = gsd / "specs" / FEATURE / ".lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    return path


def _try(gsd: Path, reclaim_dead: bool = False) -> Any:
    requester = Requester(os.getpid(), None)
    return FileBackend(gsd).try_acquire(FEATURE, requester, reclaim_dead=reclaim_dead)


@pytest.mark.parametrize("reclaim_dead", [False, True], ids=["age-only", "reclaim-dead"])
def test_a_try_on_a_held_lock_publishes_nothing(
    tmp_path: Path, publishes: list[int], reclaim_dead: bool
) -> None:
    """Fails without the look first: one publish per try of a held lock."""
    path = _lock(tmp_path, f"1:{time.time()}")  # pid 1 lives: held, whatever the rule
    before = path.read_bytes()
    for _ in range(3):
        outcome = _try(tmp_path, reclaim_dead)
        assert outcome.held is None and outcome.holder.pid == 1
    assert publishes == []
    assert path.read_bytes() == before


def test_a_missing_lock_is_published(tmp_path: Path, publishes: list[int]) -> None:
    (tmp_path / "specs" / FEATURE).mkdir(parents=True)
    assert _try(tmp_path).held is not None
    assert publishes == [1]


def test_a_stale_lock_is_still_reclaimed(tmp_path: Path, publishes: list[int]) -> None:
    """The look answers only "held and not to be reclaimed": a stale lock goes on to the
    publish and the judged reclaim, as before."""
    path = _lock(tmp_path, f"1:{time.time() - STALE_AFTER_SECONDS - 60}")
    outcome = _try(tmp_path)
    assert outcome.held is not None
    assert publishes
    assert path.read_text().startswith(f"{os.getpid()}:")


def test_the_legacy_functions_keep_their_publish_first(tmp_path: Path) -> None:
    """The contract's functions call the protocol without the look (their tests steer
    ``os.open`` around the publish): the default stays publish first."""
    folder = tmp_path / "specs" / FEATURE
    folder.mkdir(parents=True)
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        first = lockfile.publish_or_reclaim(dfd, 1, time.time())
        assert first.mine is not None
        second = lockfile.publish_or_reclaim(dfd, 2, time.time())
        assert second.mine is None and second.state is State.ACTIVE
    finally:
        os.close(dfd)
