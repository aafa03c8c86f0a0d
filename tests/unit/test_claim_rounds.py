"""A pool's claim rounds (``locks._Pool``): a round starts past the features known finished, and
a round that takes nothing still names every feature, in the candidates' order."""

from __future__ import annotations

import os
from pathlib import Path

from mahabharatha import clock, locks, ownership
from mahabharatha.backends.files import FileBackend
from mahabharatha.constants import COMPLETED_MARKER_NAME
from tests.cli._support import write_lock


def _pool(gsd: Path, names: list[str]) -> locks._Pool:
    me = os.getpid()
    return locks._Pool(FileBackend(gsd), names, me, ownership.details_of(me), [])


def test_a_round_that_takes_nothing_names_every_feature_in_order(tmp_path: Path) -> None:
    gsd = tmp_path / ".gsd"
    names = ["a", "b", "c", "d"]
    for name in names:
        (gsd / "specs" / name).mkdir(parents=True)
    for name in ("a", "c", "d"):
        (gsd / "specs" / name / COMPLETED_MARKER_NAME).write_text("2026-11-26T00:00:00Z\n")
    write_lock(gsd, "b", pid=1, timestamp=clock.now())  # held by a live process (init)
    pool = _pool(gsd, names)
    options = locks._ClaimOptions(False, False, None, None)
    first = pool.claim(options)
    assert (first.held, first.busy, first.done) == (None, ("b",), ("a", "c", "d"))
    assert pool.open_from == 1  # "a" is behind every later round
    second = pool.claim(options)
    assert (second.held, second.busy, second.done) == (None, ("b",), ("a", "c", "d"))
    (gsd / "specs" / "b" / ".lock").unlink()
    third = pool.claim(options)
    assert third.held is not None and third.held.feature == "b"
