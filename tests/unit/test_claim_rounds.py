"""A pool's claim rounds (``claim._Pool``): a round starts past the features known finished, a
round that takes nothing still names every feature, in the candidates' order, and one that
would end the pool reads again what earlier rounds kept finished."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from mahabharatha import clock
from mahabharatha.backends.base import Requester, ServerFullError
from mahabharatha.backends.files.backend import FileBackend
from mahabharatha.constants import COMPLETED_MARKER_NAME
from mahabharatha.pool import claim
from tests.cli._support import write_lock


def _pool(gsd: Path, names: list[str]) -> claim._Pool:
    me = os.getpid()
    options = claim._ClaimOptions(False, False, None, None)
    return claim._Pool(FileBackend(gsd), names, me, None, [], options)


def test_a_round_that_takes_nothing_names_every_feature_in_order(tmp_path: Path) -> None:
    gsd = tmp_path / ".gsd"
    names = ["a", "b", "c", "d"]
    for name in names:
        (gsd / "specs" / name).mkdir(parents=True)
    for name in ("a", "c", "d"):
        (gsd / "specs" / name / COMPLETED_MARKER_NAME).write_text("2026-11-26T00:00:00Z\n")
    write_lock(gsd, "b", pid=1, timestamp=clock.now())  # held by a live process (init)
    pool = _pool(gsd, names)
    first = pool.claim()
    assert (first.held, first.busy, first.done) == (None, ("b",), ("a", "c", "d"))
    assert pool.open_from == 1  # "a" is behind every later round
    second = pool.claim()
    assert (second.held, second.busy, second.done) == (None, ("b",), ("a", "c", "d"))
    (gsd / "specs" / "b" / ".lock").unlink()
    third = pool.claim()
    assert third.held is not None and third.held.feature == "b"


def test_a_wait_for_a_slot_counts_against_the_wait_for_a_feature(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``lock work --wait 10``: each claim is refused for want of a connection slot after its
    connect timeout (4 s on a fake clock); the claim waits for a slot only the 10 s, then the
    server's error goes on (told once). The PostgreSQL backend's own policy (issue 29: it was
    the pool's); before issue 27 a worker waited the whole ``--wait`` again after a refusal."""
    pg_session = pytest.importorskip("mahabharatha.backends.postgres.session")
    pg_backend = pytest.importorskip("mahabharatha.backends.postgres.backend")

    now = [100.0]
    clock_of = SimpleNamespace(monotonic=lambda: now[0])
    monkeypatch.setattr(pg_session, "time", clock_of)
    monkeypatch.setattr(pg_session, "_pause_for_a_slot", lambda: None)
    backend = pg_backend.PostgresBackend("postgresql://app@db.invalid/locks", namespace="slots")
    monkeypatch.setattr(pg_backend, "time", clock_of)
    tries: list[float] = []

    def refused(*_args: object) -> None:
        tries.append(now[0])
        now[0] += 4.0  # the connect timeout, spent refused
        raise ServerFullError("lock server x (PostgreSQL): sorry, too many clients already")

    monkeypatch.setattr(backend, "_claim", refused)
    told: list[ServerFullError] = []
    backend.on_slot_wait = told.append
    with pytest.raises(ServerFullError):
        backend.try_claim(["b"], Requester(os.getpid()), slot_wait=10.0)
    assert tries == [100.0, 104.0, 108.0] and len(told) == 1  # 112: past the 10 s
    tries.clear()
    with pytest.raises(ServerFullError):
        backend.try_claim(["b"], Requester(os.getpid()))  # no wait: one try
    assert len(tries) == 1


def test_a_round_that_would_end_the_pool_looks_again_at_what_it_kept(tmp_path: Path) -> None:
    """Feature a was seen done and kept so; it is reopened while b is held. When b is done the
    round that would end the pool reads a again and takes it. Failed before (hunt F4): the
    kept verdict stood for the pool's whole run, and the round answered nothing left."""
    gsd = tmp_path / ".gsd"
    for name in ("a", "b"):
        (gsd / "specs" / name).mkdir(parents=True)
    (gsd / "specs" / "a" / COMPLETED_MARKER_NAME).write_text("2026-11-26T00:00:00Z\n")
    write_lock(gsd, "b", pid=1, timestamp=clock.now())  # held by a live process (init)
    pool = _pool(gsd, ["a", "b"])
    assert (pool.claim().busy, pool.open_from) == (("b",), 1)  # "a" kept done
    assert FileBackend(gsd).reopen("a")
    (gsd / "specs" / "b" / COMPLETED_MARKER_NAME).write_text("2026-11-26T00:00:00Z\n")
    (gsd / "specs" / "b" / ".lock").unlink()
    again = pool.claim()
    assert again.held is not None and again.held.feature == "a"


def _done_looks_counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The features ``FileBackend.is_done`` is asked about from now on, in order."""
    looked: list[str] = []
    is_done = FileBackend.is_done

    def counted(store: FileBackend, feature: str) -> bool:
        looked.append(feature)
        return is_done(store, feature)

    monkeypatch.setattr(FileBackend, "is_done", counted)
    return looked


def test_a_first_round_that_finds_nothing_left_looks_at_each_feature_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The look again is for what earlier rounds kept: a pool's first round (a ``lock claim``)
    that finds every feature done answers at once, one look per feature."""
    gsd = tmp_path / ".gsd"
    for name in ("a", "b", "c"):
        (gsd / "specs" / name).mkdir(parents=True)
        (gsd / "specs" / name / COMPLETED_MARKER_NAME).write_text("2026-11-26T00:00:00Z\n")
    looked = _done_looks_counted(monkeypatch)
    outcome = _pool(gsd, ["a", "b", "c"]).claim()
    assert outcome.nothing_left and outcome.done == ("a", "b", "c")
    assert looked == ["a", "b", "c"]


def test_a_waiting_workers_rounds_look_only_at_what_is_not_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large pool, mostly done, one feature in the middle held by another: every round after
    the first (each wake-up of a waiting worker) looks at that one feature only; the read again
    of the kept ones is for a round that would end the pool, never for one that waits."""
    gsd = tmp_path / ".gsd"
    names = [f"f{index:03}" for index in range(200)]
    for name in names:
        (gsd / "specs" / name).mkdir(parents=True)
        if name != "f100":
            (gsd / "specs" / name / COMPLETED_MARKER_NAME).write_text("2026-11-26T00:00:00Z\n")
    write_lock(gsd, "f100", pid=1, timestamp=clock.now())  # held by a live process (init)
    looked = _done_looks_counted(monkeypatch)
    pool = _pool(gsd, names)
    assert pool.claim().busy == ("f100",) and len(looked) == len(names)
    for _wake_up in range(3):
        looked.clear()
        assert pool.claim().busy == ("f100",)
        assert looked == ["f100"]
