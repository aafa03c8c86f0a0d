"""``locks.work``: the Python worker loop, in one process and raced by several.

Three processes start ``locks.work`` at one barrier over twenty features; the task appends the
feature to a shared log (``O_APPEND``: whole lines) and fails every time for one of them. Each
feature must be worked on exactly once, except the failing one, exactly ``attempts`` times;
each process's report must say the pool finished with that one feature failed.
"""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path
from typing import Any, Final

from mahabharatha import locks

FEATURES: Final = [f"feat-{i:02d}" for i in range(20)]
BROKEN: Final = "feat-13"
ATTEMPTS: Final = 2
SYNC_TIMEOUT: Final = 60.0


def _worker(gsd: str, log: str, start: Any, reports: Any) -> None:
    def task(feature: str) -> None:
        with open(log, "a") as out:
            out.write(f"{feature}\n")
        if feature == BROKEN:
            raise RuntimeError("always broken")

    start.wait()
    report = locks.work(task, gsd_dir=gsd, attempts=ATTEMPTS)
    reports.put((report.ended, report.failed, [r.outcome for r in report.results]))


def test_three_processes_work_through_a_pool_once_each(tmp_path: Path) -> None:
    """Fails without the re-check after the lock is won (two workers build one feature) and
    without the failed state (the broken feature is retried by every worker for ever)."""
    gsd = tmp_path / "gsd"
    for name in FEATURES:
        (gsd / "specs" / name).mkdir(parents=True)
    log = tmp_path / "log"
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(3)
    reports = context.Queue()
    team = [
        context.Process(target=_worker, args=(str(gsd), str(log), start, reports)) for _ in range(3)
    ]
    for process in team:
        process.start()
    try:
        found = [reports.get(timeout=SYNC_TIMEOUT) for _ in team]
    finally:
        for process in team:
            process.join(timeout=SYNC_TIMEOUT)
    assert [process.exitcode for process in team] == [0, 0, 0]
    counts: dict[str, int] = {}
    for line in log.read_text().splitlines():
        counts[line] = counts.get(line, 0) + 1
    assert counts == {name: ATTEMPTS if name == BROKEN else 1 for name in FEATURES}
    assert all(ended == "finished" and failed == (BROKEN,) for ended, failed, _ in found)
    outcomes = [outcome for _, _, done in found for outcome in done]
    assert outcomes.count("done") == len(FEATURES) - 1
    assert outcomes.count("failed") == ATTEMPTS
    assert not list(gsd.glob("specs/*/.lock"))
    assert os.path.getsize(gsd / "specs" / BROKEN / ".attempts") > 0


def test_work_releases_unmarked_on_keyboard_interrupt(tmp_path: Path) -> None:
    gsd = tmp_path / "gsd"
    (gsd / "specs" / "alpha").mkdir(parents=True)

    def interrupted(_feature: str) -> None:
        raise KeyboardInterrupt

    try:
        locks.work(interrupted, gsd_dir=gsd)
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("the interrupt must propagate")
    folder = gsd / "specs" / "alpha"
    assert not (folder / ".lock").exists()
    assert not (folder / ".completed").exists() and not (folder / ".attempts").exists()
