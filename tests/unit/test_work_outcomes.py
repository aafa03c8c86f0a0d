"""Issue 29, item 5: a worker's outcomes are enums (its JSON keeps the same strings); one
error tree under ``LockError``."""

from __future__ import annotations

import importlib
import json
import pkgutil
import threading
from pathlib import Path
from typing import Final

import pytest

import mahabharatha
from mahabharatha import locks
from mahabharatha.pool import team
from mahabharatha.states import WorkEnd, WorkOutcome


def test_a_workers_outcomes_are_enums_and_read_back_as_enums(tmp_path: Path) -> None:
    """Fails before the fix: ``mahabharatha.states`` had no ``WorkOutcome``/``WorkEnd``;
    ``WorkResult.outcome`` and ``WorkReport.ended`` were plain strings."""
    gsd = tmp_path / ".gsd"
    for name in ("a", "b"):
        (gsd / "specs" / name).mkdir(parents=True)

    def task(feature: str) -> None:
        if feature == "b":
            raise RuntimeError("b fails")

    report = locks.work(task, ["a", "b"], gsd, attempts=1, heartbeat=None)
    assert report.ended is WorkEnd.FINISHED
    assert [(r.feature, r.outcome) for r in report.results] == [
        ("a", WorkOutcome.DONE),
        ("b", WorkOutcome.FAILED),
    ]
    assert all(type(result.outcome) is WorkOutcome for result in report.results)
    document = json.loads(
        json.dumps({"ended": report.ended, "results": [r.to_dict() for r in report.results]})
    )
    assert document["ended"] == "finished"
    assert [r["outcome"] for r in document["results"]] == ["done", "failed"]
    again = team.report_from_document(document)
    assert again is not None and again.ended is WorkEnd.FINISHED
    assert [r.outcome for r in again.results] == [WorkOutcome.DONE, WorkOutcome.FAILED]
    assert all(type(result.outcome) is WorkOutcome for result in again.results)


CONTROL_FLOW: Final = frozenset(
    {"StopWork", "Interrupted", "ReleaseInterrupted", "Terminated"}  # stops, not failures
)


def test_every_error_the_package_raises_is_a_lock_error() -> None:
    """One error tree: ``except mahabharatha.LockError`` catches every failure the package
    defines (those of the system stay ``OSError`` too). Fails before the fix:
    ``UnsafeLockPathError``, ``BackendError``, ``ServerFullError``, ``GuardBusyError``,
    ``LockBusyError``, ``WorkLeftError`` and the ``CommandStartError`` family were not."""
    outside = sorted(
        f"{module.name}.{value.__name__}"
        for module in pkgutil.walk_packages(mahabharatha.__path__, "mahabharatha.")
        for value in vars(importlib.import_module(module.name)).values()
        if isinstance(value, type)
        and issubclass(value, BaseException)
        and value.__module__ == module.name
        and not value.__name__.startswith("_")
        and value.__name__ not in CONTROL_FLOW
        and not issubclass(value, mahabharatha.LockError)
    )
    assert outside == []


def test_no_feature_lock_subclass_overrides_acquire_or_release() -> None:
    """Issue 29, item 2: one hold, no subclass that turns its behaviour off. Fails before the
    fix: ``PoolLock`` overrode ``acquire`` (to adopt its claim) and ``release`` (to keep the
    lock: it only stopped the heartbeat)."""
    from mahabharatha.feature_lock import FeatureLock

    for module in pkgutil.walk_packages(mahabharatha.__path__, "mahabharatha."):
        importlib.import_module(module.name)
    pending, overriding = list(FeatureLock.__subclasses__()), []
    while pending:
        kind = pending.pop()
        pending.extend(kind.__subclasses__())
        if kind.__module__.startswith("mahabharatha."):
            overriding += [
                f"{kind.__name__}.{name}" for name in ("acquire", "release") if name in vars(kind)
            ]
    assert overriding == []


def test_a_pool_lock_is_kept_past_its_block_until_finish_ends_it(tmp_path: Path) -> None:
    """The block of a claimed lock stops its heartbeat only: ``finish`` marks and releases."""
    gsd = tmp_path / ".gsd"
    (gsd / "specs" / "a").mkdir(parents=True)
    seen: list[tuple[bool, locks.LockInfo]] = []

    def step(lock: locks.PoolLock) -> locks.WorkResult:
        with lock:
            pass
        seen.append((lock.held, locks.inspect("a", gsd)))
        with pytest.raises(locks.LockError, match="used already"):
            lock.acquire()
        return lock.finish(0, None, 3)

    report = locks.run_pool(step, ["a"], gsd, heartbeat=None)
    [(held, info)] = seen
    assert held and info.held
    assert [r.outcome for r in report.results] == [WorkOutcome.DONE]
    assert locks.is_done("a", gsd) and not locks.inspect("a", gsd).held


def _tree(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


@pytest.mark.parametrize("bad", ["../../escaped", "..", "a/b", "x" * 256, "ok\n"])
def test_a_pool_refuses_a_bad_name_as_claim_does_before_any_work(tmp_path: Path, bad: str) -> None:
    """Fails before the fix: ``run_pool`` did not check its names, so it claimed ``good``
    and ran the step, then took ``<gsd>/specs/../../escaped/.lock`` outside the gsd folder
    (``..`` took ``<gsd>/.lock``; 256 bytes raised ``OSError``), before a ``ValueError``."""
    gsd = tmp_path / "box" / ".gsd"
    (gsd / "specs" / "good").mkdir(parents=True)
    before = _tree(tmp_path)
    with pytest.raises(ValueError) as claimed:
        locks.claim_next(["good", bad], gsd)
    ran: list[str] = []

    def step(lock: locks.PoolLock) -> locks.WorkResult:
        ran.append(lock.feature)
        return lock.finish(None, None, 1)  # released unmarked: a clean tree again

    with pytest.raises(ValueError) as pooled:
        locks.run_pool(step, ["good", bad], gsd, heartbeat=None)
    assert str(pooled.value) == str(claimed.value)
    assert str(pooled.value).startswith("Invalid feature name")
    assert _tree(tmp_path) == before  # nothing written, inside the gsd folder or outside
    assert ran == []


def test_a_pool_whose_left_feature_another_worker_finished_does_not_list_it_busy() -> None:
    """``lock work -j 2``: worker A lost ``alpha`` to another's kernel lease and left its lock
    (its report: finished, ``alpha`` in busy); once A ended and the lease went, worker B took
    ``alpha`` (``--reclaim-dead``) and did it. The pool's report must not list ``alpha`` as
    left in place: every feature is done (exit 0). Failed before (review 8): the merge took
    A's busy as is, so the pool said "nothing else to take; 1 left with its lock in place:
    alpha" and exited 1 with ``alpha`` done; a feature B failed for good stayed busy too."""
    left = locks.WorkResult("alpha", WorkOutcome.LOST, 0, 0, "still under another's lease")
    a = locks.WorkReport(WorkEnd.FINISHED, (left,), (), ("alpha", "bravo"), 1)
    did = locks.WorkResult("alpha", WorkOutcome.DONE, 0)
    failed = locks.WorkResult("bravo", WorkOutcome.FAILED, 1, 3, "exit code 1")
    b = locks.WorkReport(WorkEnd.FINISHED, (did, failed), ("bravo",), (), 1)
    merged = team.merge_reports([a, b])
    assert (merged.ended, merged.failed, merged.busy) == (WorkEnd.FINISHED, ("bravo",), ())


def test_a_worker_thread_does_not_report_busy_what_another_thread_of_its_process_holds(
    tmp_path: Path,
) -> None:
    """Two threads of one process run :func:`locks.work` on one pool (one owner pid): the
    second finishes ``b`` while the first still works on ``a``, which it counts as its own
    and never waits for. Its report must not list ``a`` in ``busy`` (a lock it left held,
    exit 1 for ``lock work``): it left none. Failed on the lease fix (review 8): every
    feature the round counted as the claimer's own became ``busy`` at a finish."""
    gsd = tmp_path / ".gsd"
    for name in ("a", "b"):
        (gsd / "specs" / name).mkdir(parents=True)
    a_taken, b_finished = threading.Event(), threading.Event()
    reports: dict[str, locks.WorkReport] = {}

    def first(feature: str) -> None:
        a_taken.set()
        assert b_finished.wait(timeout=60), "the second worker never finished"

    def first_worker() -> None:
        reports["first"] = locks.work(first, ["a"], gsd, heartbeat=None)

    thread = threading.Thread(target=first_worker)
    thread.start()
    try:
        assert a_taken.wait(timeout=60)
        reports["second"] = locks.work(lambda feature: None, ["a", "b"], gsd, heartbeat=None)
    finally:
        b_finished.set()
        thread.join(timeout=60)
    second = reports["second"]
    assert [(r.feature, r.outcome) for r in second.results] == [("b", WorkOutcome.DONE)]
    assert (second.ended, second.busy) == (WorkEnd.FINISHED, ())
    assert [r.outcome for r in reports["first"].results] == [WorkOutcome.DONE]
