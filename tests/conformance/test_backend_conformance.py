"""What every lock backend must show: the specification the PostgreSQL backend runs too.

Each test takes ``backend`` (a fresh lock space of one backend, see ``conftest.py``); the
tests that race real processes open the same space in each child (``kind.open``). Owners are
live processes of this test (this one and its parent), so no owner judgement interferes,
except in the ``reclaim_dead`` test, whose owner is a process that has exited.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from multiprocessing.synchronize import Barrier
from pathlib import Path

import pytest

from mahabharatha import locks
from mahabharatha.backends.base import (
    ClaimsInOneStep,
    LocalFolder,
    LockBackend,
    LockInfo,
    LockLostError,
    LockServer,
    NotHeldError,
    NotOwnerError,
    Requester,
    UnsupportedError,
    WatchesReleases,
)
from mahabharatha.owner import ownership
from tests.conformance._procs import CTX, SYNC_TIMEOUT, run_team, stress
from tests.conformance.conftest import BackendKind, add_features
from tests.support.marks import needs_proc

ME = os.getpid()
OTHER = os.getppid()  # alive for the whole test, and not us
FEATURE = "conf-feat"


def _win(backend: LockBackend, feature: str = FEATURE, pid: int = ME) -> locks.Held:
    outcome = backend.try_acquire(feature, Requester(pid))
    assert outcome.held is not None, f"{feature} was not free: {outcome.holder}"
    return outcome.held


# --------------------------------------------------------------------------- one holder


def test_a_free_feature_is_won_then_held_then_free_again(backend: LockBackend) -> None:
    assert backend.inspect(FEATURE).state == "free"
    held = _win(backend)
    assert (held.feature, held.pid) == (FEATURE, ME)
    assert held.expires_at > time.time()
    info = backend.inspect(FEATURE)
    assert (info.state, info.pid) == ("active", ME)
    assert backend.release_held(held) is True
    assert backend.inspect(FEATURE).state == "free"
    assert backend.release_held(held) is False  # already gone: nothing else is touched


def test_a_held_feature_stops_everyone_else_and_names_its_holder(backend: LockBackend) -> None:
    _win(backend)
    outcome = backend.try_acquire(FEATURE, Requester(OTHER))
    assert outcome.held is None
    assert isinstance(outcome.holder, LockInfo)
    assert (outcome.holder.state, outcome.holder.pid) == ("active", ME)


def test_release_removes_only_the_owners_lock(backend: LockBackend) -> None:
    _win(backend)
    with pytest.raises(NotOwnerError):
        backend.release(FEATURE, OTHER)
    assert backend.inspect(FEATURE).pid == ME  # left intact
    assert backend.release(FEATURE, ME) is True
    assert backend.release(FEATURE, ME) is False  # nothing left to release


def test_a_forced_release_removes_another_owners_lock(backend: LockBackend) -> None:
    _win(backend)
    assert backend.release(FEATURE, OTHER, force=True) is True
    assert backend.inspect(FEATURE).state == "free"


def test_refresh_keeps_the_lock_and_moves_its_expiry(backend: LockBackend) -> None:
    held = _win(backend)
    fresh = backend.refresh(held)
    assert (fresh.feature, fresh.pid) == (FEATURE, ME)
    assert fresh.expires_at >= held.expires_at
    assert backend.inspect(FEATURE).pid == ME
    assert backend.release_held(fresh) is True


def test_refresh_detects_a_lost_lock_and_release_never_removes_the_new_holders(
    backend: LockBackend,
) -> None:
    held = _win(backend)
    backend.release(FEATURE, OTHER, force=True)
    theirs = _win(backend, pid=OTHER)
    with pytest.raises(LockLostError):
        backend.refresh(held)
    assert backend.release_held(held) is False
    assert backend.inspect(FEATURE).pid == OTHER  # the new holder's lock stays
    assert backend.release_held(theirs) is True


def test_tokens_and_leases_are_answered_as_the_backend_says(backend: LockBackend) -> None:
    held = _win(backend)
    if isinstance(backend, LockServer):
        assert held.token is not None
        assert backend.verify(FEATURE, held.token) is True
        backend.release_held(held)
        return
    assert held.token is None
    with pytest.raises(UnsupportedError):
        backend.try_acquire("other-feat", Requester(ME), lease=60.0)


def test_declared_abilities_are_what_the_backend_does(backend: LockBackend) -> None:
    """Issues 20 and 29: an optional ability is a protocol of its own (``isinstance``, never
    ``getattr``). Fails if a backend declares what it does not do."""
    names = ["cap-a", "cap-b"]
    if isinstance(backend, ClaimsInOneStep):
        won = backend.try_claim(names, Requester(ME))
        assert won is not None and won.held is not None and won.held.feature == "cap-a"
        holders, *finished = backend.finished_and_resting(names)
        assert [info.feature for info in holders] == ["cap-a"] and finished == [set()] * 3
        assert backend.release_held(won.held) is True
    held = _win(backend)
    if isinstance(backend, LocalFolder):
        work = backend.work_proof(held)
        assert work is not None
        work.close()
    assert isinstance(backend, WatchesReleases)
    with backend.release_watch([FEATURE]) as watch:
        backend.release_held(held)
        assert watch.wait(SYNC_TIMEOUT)  # woken by the release, or a poll: look again


# --------------------------------------------------------------------------- done features


def test_done_needs_the_holder_then_marks_and_releases(backend: LockBackend) -> None:
    with pytest.raises(NotHeldError):
        backend.done(FEATURE, ME)  # nothing held: nothing written
    assert not backend.is_done(FEATURE)
    _win(backend)
    with pytest.raises(NotOwnerError):
        backend.done(FEATURE, OTHER)
    assert not backend.is_done(FEATURE)
    stamp = backend.done(FEATURE, ME)
    assert stamp.endswith("Z")
    assert backend.is_done(FEATURE)
    assert backend.inspect(FEATURE).state == "free"  # released
    assert backend.reopen(FEATURE) is True
    assert not backend.is_done(FEATURE)
    assert backend.reopen(FEATURE) is False


def test_claim_takes_features_in_order_and_skips_done_ones(backend: LockBackend, gsd: Path) -> None:
    add_features(gsd, "a", "b", "c")
    _win(backend, "a")
    backend.done("a", ME)
    assert backend.feature_names() == ["a", "b", "c"]
    assert locks.claim(backend=backend, pid=ME) == "b"
    assert locks.claim(backend=backend, pid=OTHER) == "c"
    assert locks.claim(backend=backend, pid=ME) is None
    assert locks.claim(backend=backend, pid=ME, include_done=True) == "a"


def test_include_done_never_claims_a_failed_feature(backend: LockBackend, gsd: Path) -> None:
    """``--include-done`` turns the done check off, not the failed one: a failed feature is
    never claimed again until ``reopen``. Failed before on PostgreSQL: a failed row is closed
    as a done one (``done_at`` set) and the claim statement's ``include_done`` let it in."""
    add_features(gsd, "a")
    _win(backend, "a")
    backend.fail("a", ME, "exit code 1", 1)
    for _statement in ("first claim of a list", "the list's rows seen: its lean claim"):
        assert locks.claim(backend=backend, pid=ME, include_done=True) is None
    assert backend.reopen("a")
    assert locks.claim(backend=backend, pid=ME, include_done=True) == "a"


def test_a_claims_attempts_below_the_recorded_limit_counts_the_feature_failed(
    backend: LockBackend, gsd: Path, request: pytest.FixtureRequest
) -> None:
    """``--attempts N``: a feature whose failed attempts reached N counts as failed, whatever
    limit its attempts were recorded with (the contract). Open on PostgreSQL: the claim
    statement knows only the row's ``failed`` flag (set at the recorded limit) and takes it."""
    if isinstance(backend, ClaimsInOneStep):
        request.applymarker(
            pytest.mark.xfail(strict=True, reason="open: the claim statement has no --attempts")
        )
    add_features(gsd, "a")
    _win(backend, "a")
    backend.fail("a", ME, "exit code 1", 3)
    assert locks.claim(backend=backend, pid=ME, attempts=1) is None


# --------------------------------------------------------------------------- listings


def test_status_lists_locks_and_survey_every_feature(backend: LockBackend, gsd: Path) -> None:
    add_features(gsd, "a", "b", "c")
    _win(backend, "b")
    _win(backend, "c")
    backend.done("c", ME)
    listed = backend.status()
    assert [(i.feature, i.state, i.pid) for i in listed] == [("b", "active", ME)]
    assert set(listed[0].to_dict()) == {
        "feature",
        "state",
        "pid",
        "timestamp",
        "age_seconds",
        "expires_in_seconds",
        "owner",
        "host",
        "token",
    }
    surveyed = backend.survey()
    assert [(i.feature, i.state) for i in surveyed] == [
        ("a", "free"),
        ("b", "active"),
        ("c", "done"),
    ]


def test_clean_leaves_active_locks(backend: LockBackend, gsd: Path) -> None:
    add_features(gsd, FEATURE)
    held = _win(backend)
    removed = [e for e in backend.clean() if e.removed and e.feature == FEATURE]
    assert removed == []
    assert backend.inspect(FEATURE).pid == ME
    assert backend.release_held(held) is True


# --------------------------------------------------------------------------- owner judgement


def _gone_owner() -> tuple[int, bytes]:
    """A pid and owner details of a process (in its own group) that has exited and is reaped."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        start_new_session=True,  # its own group: no live member of ours keeps it "running"
    )
    try:
        details = ownership.details_of(child.pid)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(SYNC_TIMEOUT)
    return child.pid, details


@needs_proc
def test_reclaim_dead_takes_a_lock_whose_owner_is_gone(backend: LockBackend) -> None:
    dead, details = _gone_owner()
    won = backend.try_acquire(FEATURE, Requester(dead, details))
    assert won.held is not None
    refused = backend.try_acquire(FEATURE, Requester(ME))
    assert refused.held is None  # without reclaim_dead, a fresh lock stays, dead owner or not
    taken = backend.try_acquire(FEATURE, Requester(ME), reclaim_dead=True)
    assert taken.held is not None and taken.held.pid == ME
    assert taken.replaced is not None and taken.replaced.pid == dead
    assert backend.inspect(FEATURE).pid == ME


@needs_proc
def test_reclaim_dead_leaves_a_live_owners_lock(backend: LockBackend) -> None:
    _win(backend, pid=OTHER)
    refused = backend.try_acquire(FEATURE, Requester(ME), reclaim_dead=True)
    assert refused.held is None
    assert backend.inspect(FEATURE).pid == OTHER


# --------------------------------------------------------------------------- real processes


def test_claim_hands_each_feature_to_one_worker_across_processes(
    kind: BackendKind, backend: LockBackend, gsd: Path
) -> None:
    """Workers claiming at the same moment (a barrier) never get the same feature."""
    workers = 4
    names = [f"f{n}" for n in range(workers + 2)]
    add_features(gsd, *names)
    for _ in range(stress(3)):
        start = CTX.Barrier(workers)

        def claim_once(_index: int, start: Barrier = start) -> str | None:
            own = kind.open(gsd)
            try:
                start.wait(SYNC_TIMEOUT)
                return locks.claim(backend=own)
            finally:
                own.close()

        won = run_team(workers, claim_once)
        assert None not in won
        assert len(set(won)) == workers, f"a feature was claimed twice: {won}"
        for feature in names:
            backend.release(feature, 1, force=True)


def test_one_holder_at_a_time_across_processes(
    kind: BackendKind, backend: LockBackend, gsd: Path
) -> None:
    """Processes started at once take and give back the lock in a loop; inside it, each checks
    that it is alone (a shared occupancy counter), and the total of passes adds up."""
    workers, rounds = 3, stress(40)
    occupancy = CTX.Value("i", 0)
    overlaps = CTX.Value("i", 0)
    passes = CTX.Value("i", 0)
    start = CTX.Barrier(workers)

    def take_turns(_index: int) -> int:
        own = kind.open(gsd)
        try:
            start.wait(SYNC_TIMEOUT)
            for _ in range(rounds):
                held = locks.acquire(FEATURE, timeout=SYNC_TIMEOUT, backend=own)
                with occupancy.get_lock():
                    occupancy.value += 1
                    if occupancy.value != 1:
                        overlaps.value += 1
                os.sched_yield()  # let a rival try while we hold it
                with occupancy.get_lock():
                    occupancy.value -= 1
                    passes.value += 1
                assert own.release_held(held)
            return rounds
        finally:
            own.close()

    assert sum(run_team(workers, take_turns)) == workers * rounds
    assert overlaps.value == 0, f"{overlaps.value} passes overlapped another holder"
    assert passes.value == workers * rounds
    assert backend.inspect(FEATURE).state == "free"
