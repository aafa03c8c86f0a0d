"""A pool's claim rounds (``locks._Pool``): a round starts past the features known finished, and
a round that takes nothing still names every feature, in the candidates' order."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mahabharatha import clock, locks
from mahabharatha.backends.base import ServerFullError
from mahabharatha.backends.files.backend import FileBackend
from mahabharatha.constants import COMPLETED_MARKER_NAME
from mahabharatha.owner import ownership
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


def test_a_wait_for_a_slot_counts_against_the_wait_for_a_feature(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``lock work --wait 10``: the first claim is refused for want of a connection slot after
    its connect timeout (4 s on a fake clock); the claim asked again may wait for a feature
    only what is left of the 10 s. Failed before: it was given the whole ``--wait`` again, so a
    worker could wait twice as long as asked (and more, a connect timeout on top)."""
    now = [100.0]
    given: list[float | None] = []

    def claim_refused_then_busy(
        pool: locks._Pool, options: locks._ClaimOptions, wait: float | None
    ) -> locks.ClaimOutcome:
        given.append(wait)
        if len(given) == 1:
            now[0] += 4.0  # the connect timeout, spent refused
            raise ServerFullError("lock server x (PostgreSQL): sorry, too many clients already")
        return locks.ClaimOutcome(None, busy=("b",))

    monkeypatch.setattr(locks, "monotonic", lambda: now[0])
    monkeypatch.setattr(locks, "_claim_waiting", claim_refused_then_busy)
    monkeypatch.setattr(locks, "_pause_for_a_slot", lambda: None)
    pool = _pool(tmp_path / ".gsd", ["b"])
    options = locks._ClaimOptions(False, False, None, None)
    told: list[ServerFullError] = []
    outcome = locks._claim_patiently(pool, options, 10.0, told.append)
    assert outcome.busy == ("b",) and len(told) == 1
    assert given[0] == 10.0
    assert given[1] is not None and given[1] <= 10.0 - 4.0
