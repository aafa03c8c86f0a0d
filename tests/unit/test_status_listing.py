"""The status listing's fast path answers as the one-lock path does.

``lock status`` reads thousands of locks, so its path skips work the answer does not show
(``bench/PROFILE.md``): a ``LockInfo`` made without its frozen ``__init__``, owner details read
the cheaper way for the locks seen last. These tests pin that nothing shown changes: every
listed lock equals what ``inspect`` says of it alone, the listed objects equal constructed
ones, and the details come back byte for byte whichever way they are read.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mahabharatha import locks
from mahabharatha.backends.base import Attempts, LockInfo, Owner
from mahabharatha.backends.files import backend as files
from mahabharatha.backends.files.snapshot import DetailsReader
from mahabharatha.commands import _utils
from mahabharatha.owner import ownership, proof
from mahabharatha.states import State

OTHER_PID = 1 if os.getpid() != 1 else 2


def _plant(gsd: Path, feature: str, content: bytes, *, age: float = 0.0) -> Path:
    folder = gsd / "specs" / feature
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / ".lock"
    lock.write_bytes(content)
    if age:
        then = time.time() - age
        os.utime(lock, (then, then))
    return lock


@pytest.fixture
def mixed(tmp_path: Path) -> Iterator[Path]:
    """One lock of every kind a listing meets, ours (with details and a proof) among them."""
    gsd = tmp_path / ".gsd"
    now = time.time()
    assert _utils.acquire_feature_lock("ours", str(gsd))  # details and a held proof of life
    _plant(gsd, "older-writer", f"{os.getpid()}:{now}".encode())  # no details
    _plant(gsd, "other-owner", f"{OTHER_PID}:{now - 5}".encode())
    _plant(gsd, "stale", f"{OTHER_PID}:{now - 7300}".encode())
    _plant(gsd, "corrupt", b"garbage", age=10)
    _plant(gsd, "writing", b"")
    _plant(gsd, "not-utf8", b"\xff\xfe:\xfa")
    (gsd / "specs" / "linked").mkdir()
    (gsd / "specs" / "linked" / ".lock").symlink_to(tmp_path / "elsewhere")
    (gsd / "specs" / "no-lock").mkdir()
    yield gsd
    _utils.release_feature_lock("ours", str(gsd))
    proof.let_go_of_all()


def _shown(info: LockInfo) -> dict[str, object]:
    """What a listing shows, but the ages (the clock moves between two looks)."""
    shown = info.to_dict()
    del shown["age_seconds"], shown["expires_in_seconds"]
    return shown


def test_every_listed_lock_is_what_inspect_says_of_it(mixed: Path) -> None:
    listed = locks.status(mixed)
    assert [info.feature for info in listed] == sorted(
        ["ours", "older-writer", "other-owner", "stale", "corrupt", "writing", "not-utf8", "linked"]
    )
    for info in listed:
        alone = locks.inspect(info.feature, mixed)
        assert _shown(info) == _shown(alone)
        assert (info.expires_in_seconds is None) == (alone.expires_in_seconds is None)
    states = {info.feature: info.state for info in listed}
    assert states["ours"] is State.ACTIVE and states["not-utf8"] is State.UNREADABLE
    assert {info.feature: info.owner for info in listed}["ours"] is Owner.RUNNING


@pytest.mark.parametrize(
    "values",
    [
        ("f", State.ACTIVE, 7, 1.5, 2.0, 7198.0, Owner.RUNNING),
        ("g", State.CORRUPT, None, None, 3.0, None, Owner.UNKNOWN),
    ],
)
def test_a_listed_info_is_the_constructed_one(values: tuple[object, ...]) -> None:
    listed = files._listed_info(*values)  # type: ignore[arg-type]
    built = LockInfo(*values)  # type: ignore[arg-type]
    assert listed == built and hash(listed) == hash(built) and repr(listed) == repr(built)
    assert listed.to_dict() == built.to_dict()
    assert pickle.loads(pickle.dumps(listed)) == built
    assert dataclasses.replace(listed, attempts=2) == dataclasses.replace(built, attempts=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        listed.pid = 3  # type: ignore[misc]


def test_an_info_takes_a_record_of_attempts_or_none() -> None:
    """Fails before the merge: ``with_attempts`` took a count and a reason, and each caller
    wrote the ``None`` check around it."""
    info = LockInfo("f", State.FREE, None, None, None, None, Owner.UNKNOWN)
    assert info.with_attempts(None) is info
    record = Attempts(2, 3, ({"reason": "exit code 1"},))
    shown = info.with_attempts(record)
    assert (shown.attempts, shown.reason) == (2, "exit code 1")


@pytest.mark.parametrize("none_last", [False, True], ids=["after-details", "after-none"])
@pytest.mark.parametrize("has_details", [True, False], ids=["details", "none"])
def test_details_are_read_byte_for_byte_whichever_way(
    mixed: Path, none_last: bool, has_details: bool
) -> None:
    feature = "ours" if has_details else "older-writer"
    fd = os.open(mixed / "specs" / feature / ".lock", os.O_RDONLY)
    try:
        expected = ownership.read_attached(fd)
        assert (expected is not None) == has_details
        reader = DetailsReader()
        reader.none_last = none_last
        assert reader.read(fd) == expected
        assert reader.none_last == (not has_details)  # the next lock is asked the cheaper way
    finally:
        os.close(fd)
