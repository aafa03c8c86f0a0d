"""No entry name and no odd folder breaks anything beyond itself (issue items 6 and 10).

* A temp-like name whose pid no process can have (``.lock.2147483648.0.tmp``) beside a stale
  lock: psutil's ``pid_exists`` overflowed on it, half-way through a reclaim.
* A directory named like a temp file: ``lock clean`` failed on it for ever.
* A feature folder the caller may not read: ``status``, ``clean`` and ``claim`` failed for every
  feature. Now each skips that folder, reports it (full path) on stderr and in the JSON, and does
  the rest; ``status`` and ``clean`` exit 0.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any, Final

import psutil  # noqa: F401  (imported before a child drops to uid 65534, who may not read it)
import pytest

from mahabharatha import locks
from mahabharatha.backends.files import lockfile
from mahabharatha.backends.files.backend import FileBackend
from mahabharatha.commands import _utils
from tests.cli._support import SYNC_TIMEOUT, invoke, lock_path, one_document, write_lock
from tests.faults._kills import run_child

HUGE_PID_TEMP: Final = ".lock.2147483648.0.tmp"
STALE: Final = 7200.0 + 600
ORPHAN_AGE: Final = 600.0  # past TEMP_ORPHAN_SECONDS


def _stale_lock(gsd: Path, feature: str) -> Path:
    return write_lock(gsd, feature, pid=4242, timestamp=_utils.now() - STALE)


@pytest.fixture(params=["unnamed", "named"])
def publish_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways of publishing: ``O_TMPFILE``, and the named-temp fallback that sweeps first."""
    if request.param == "named":
        monkeypatch.setattr(lockfile.TMPFILE, "usable", False)
    return str(request.param)


@pytest.mark.parametrize("name", [HUGE_PID_TEMP, ".lock." + "9" * 200 + ".0.tmp"])
def test_a_temp_name_no_pid_can_have_never_crashes_a_reclaim(
    gsd: Path, publish_path: str, name: str
) -> None:
    """Fails before the fix: ``acquire_feature_lock`` raised ``OverflowError`` after removing the
    stale lock, leaving no lock at all."""
    lock = _stale_lock(gsd, "feat")
    (lock.parent / name).write_text("debris")

    assert _utils.acquire_feature_lock("feat", str(gsd)) is True

    assert lock.read_text().startswith(f"{os.getpid()}:")
    assert not (lock.parent / name).exists(), "no writer can have that pid: it is debris"


def test_lock_acquire_json_over_a_stale_lock_beside_a_huge_pid_temp(gsd: Path) -> None:
    """Fails before the fix: a 75-line traceback, exit 1, no JSON, and no lock."""
    lock = _stale_lock(gsd, "feat")
    (lock.parent / HUGE_PID_TEMP).write_text("debris")

    result = invoke("lock", "acquire", "feat", "--gsd-dir", gsd, "--json", "--pid", 777)

    assert result.exit_code == 0, result.output
    assert one_document(result.stdout)["acquired"] is True
    assert lock.read_text().startswith("777:")


def test_lock_clean_beside_a_huge_pid_temp(gsd: Path) -> None:
    """Fails before the fix: ``OverflowError`` (exit 3 or a traceback), nothing cleaned."""
    lock = _stale_lock(gsd, "feat")
    (lock.parent / HUGE_PID_TEMP).write_text("debris")

    result = invoke("lock", "clean", "--gsd-dir", gsd, "--json")

    assert result.exit_code == 0, result.output
    paths = {entry["path"] for entry in one_document(result.stdout)["entries"]}
    assert paths == {str(lock), str(lock.parent / HUGE_PID_TEMP)}
    assert os.listdir(lock.parent) == []


def test_a_directory_named_like_a_temp_does_not_stop_clean(gsd: Path) -> None:
    """Fails before the fix: clean removed A's stale lock, then failed to unlink the directory
    (exit 3, its JSON without the entry it had removed), and B was never cleaned."""
    stale_a = _stale_lock(gsd, "A")
    odd = stale_a.parent / ".lock.999999.ab.tmp"
    odd.mkdir()
    (odd / "inside").write_text("someone's file")
    stale_b = _stale_lock(gsd, "B")

    result = invoke("lock", "clean", "--gsd-dir", gsd, "--json")

    assert result.exit_code == 0, result.output
    entries = one_document(result.stdout)["entries"]
    assert {(e["path"], e["removed"]) for e in entries} == {
        (str(stale_a), True),
        (str(stale_b), True),
    }
    assert (odd / "inside").read_text() == "someone's file", "not ours: left alone"
    assert invoke("lock", "clean", "--gsd-dir", gsd).exit_code == 0, "and again: still fine"


def _plant_temp(folder: Path, name: str, age: float) -> Path:
    temp = folder / name
    temp.write_text("2026-11-27T00:00:00Z\n")
    os.utime(temp, (time.time() - age, time.time() - age))
    return temp


@pytest.mark.parametrize("dry_run", [False, True], ids=["clean", "dry-run"])
def test_clean_sweeps_aged_orphan_temps_of_the_done_marker_and_attempts_record(
    gsd: Path, dry_run: bool
) -> None:
    """A crash between writing and renaming a done marker or an attempts record leaves its temp.
    Fails before the fix: clean swept only ``.lock`` temps and listed none of these."""
    folder = gsd / "specs" / "feat"
    folder.mkdir(parents=True)
    aged = [
        _plant_temp(folder, f"{name}.4194000.00000000000000aa.tmp", ORPHAN_AGE)
        for name in (".completed", ".attempts", ".lock")
    ]
    # Young: a writer in progress, whatever its pid (one in another PID namespace looks dead).
    young = _plant_temp(folder, ".attempts.2147483648.00000000000000bb.tmp", 0.0)

    result = invoke("lock", "clean", "--gsd-dir", gsd, "--json", *(["--dry-run"] * dry_run))

    assert result.exit_code == 0, result.output
    entries = one_document(result.stdout)["entries"]
    assert sorted((e["path"], e["kind"], e["state"], e["removed"]) for e in entries) == sorted(
        (str(temp), "temp", "orphan", not dry_run) for temp in aged
    )
    assert young.exists(), "a young temp is a writer's, in progress"
    assert all(temp.exists() == dry_run for temp in aged)


def test_clean_sweeps_the_last_log_temp_of_a_dead_writer_and_keeps_a_live_ones(
    gsd: Path,
) -> None:
    """``lock work --log-dir`` names a feature's last log through ``.last-log.<pid>.tmp``: a
    worker killed between its write and its rename leaves it. Judged as a lock temp is (its
    writer's pid gone, or too old); a young temp of a live pid is a writer's in progress.
    Fails before the fix: clean listed none, so "after one clean only live locks are left"
    did not hold."""
    folder = gsd / "specs" / "feat"
    folder.mkdir(parents=True)
    dead = _plant_temp(folder, ".last-log.4194000.tmp", 0.0)  # above pid_max: nobody's
    aged = _plant_temp(folder, f".last-log.{os.getppid()}.tmp", ORPHAN_AGE)
    live = _plant_temp(folder, f".last-log.{os.getpid()}.tmp", 0.0)

    result = invoke("lock", "clean", "--gsd-dir", gsd, "--json")

    assert result.exit_code == 0, result.output
    entries = one_document(result.stdout)["entries"]
    assert sorted((e["path"], e["kind"], e["state"], e["removed"]) for e in entries) == sorted(
        (str(temp), "temp", "orphan", True) for temp in (dead, aged)
    )
    assert live.exists(), "a young temp of a live writer is in progress"


def test_a_done_marker_temp_replaced_after_its_judgement_is_not_removed(gsd: Path) -> None:
    """Race: the orphan judged is gone and another file has its name by the removal: it stays."""
    folder = gsd / "specs" / "feat"
    folder.mkdir(parents=True)
    temp = _plant_temp(folder, ".completed.4194000.00000000000000aa.tmp", ORPHAN_AGE)
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        [judged] = lockfile.orphan_temps(dfd, time.time(), files=True)
        _plant_temp(folder, "other", ORPHAN_AGE).rename(temp)  # a new inode under its name

        assert not lockfile.remove_orphan_temp(dfd, judged, time.time())
    finally:
        os.close(dfd)
    assert temp.exists()


def _write_local_marker_paused(gsd: Path, written: Any, go: Any, told: Any) -> None:
    """A fork's child: ``mark_done_here`` (a server's local copy of the done marker, the last
    step of ``lock done``/``lock work`` on PostgreSQL), held between its temp's write and its
    rename (a writer descheduled there) until ``go``; ``told`` gets what it raised, if anything."""
    real = os.rename

    def paused(src: Any, dst: Any, **where: Any) -> None:
        if str(src).startswith(".completed."):
            written.set()
            go.wait(SYNC_TIMEOUT)
        real(src, dst, **where)

    os.rename = paused  # this child only
    try:
        FileBackend(gsd).mark_done_here("feat", "2026-11-27T00:00:00Z")
        told.put(None)
    except OSError as error:
        told.put(repr(error))


def test_clean_never_removes_the_temp_of_a_local_done_marker_still_being_written(
    gsd: Path,
) -> None:
    """Race: ``mark_done_here`` wrote its temp without the folder's guard, so a writer
    descheduled past ``TEMP_ORPHAN_SECONDS`` between write and rename lost its temp to ``lock
    clean`` (judged by age alone, "their writer holds the guard"): the rename failed and the
    local ``.completed`` copy was never written (the error is suppressed by ``_mark_done``).
    Fails on c000d56: the marker is missing."""
    folder = gsd / "specs" / "feat"
    folder.mkdir(parents=True)
    context = multiprocessing.get_context("fork")
    written, go, told = context.Event(), context.Event(), context.SimpleQueue()
    writer = context.Process(target=_write_local_marker_paused, args=(gsd, written, go, told))
    writer.start()
    try:
        assert written.wait(SYNC_TIMEOUT), "the writer wrote its temp"
        [temp] = folder.glob(".completed.*.tmp")
        old = time.time() - ORPHAN_AGE  # the writer descheduled that long: the temp looks old
        os.utime(temp, (old, old))
        problems: list[locks.FeatureProblem] = []
        locks.clean(gsd, problems=problems)
    finally:
        go.set()
        writer.join(SYNC_TIMEOUT)
    assert told.get() is None, "the local marker's rename found its temp gone"
    assert (folder / ".completed").read_text() == "2026-11-27T00:00:00Z\n"


# ------------------------------------------------------------------- a folder we may not read


@pytest.fixture
def shared_gsd() -> Iterator[Path]:
    """A gsd folder every user may use: A is closed to everyone but root, B has a stale lock,
    C is free."""
    top = Path(tempfile.mkdtemp(prefix="mahabharatha-odd-"))
    os.chmod(top, 0o755)
    gsd = top / "gsd"
    try:
        for name in ("A", "B", "C"):
            (gsd / "specs" / name).mkdir(parents=True)
        _stale_lock(gsd, "B")
        for folder in (gsd, gsd / "specs", gsd / "specs" / "B", gsd / "specs" / "C"):
            os.chmod(folder, 0o777)
        os.chmod(gsd / "specs" / "A", 0)  # no one but root may read or enter it
        yield gsd
    finally:
        with suppress(FileNotFoundError):
            os.chmod(gsd / "specs" / "A", 0o755)  # an owner who is not root must open it up
        shutil.rmtree(top)


def _unprivileged(body: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``body`` in a child that may not read folder A: uid 65534 when we are root (root
    ignores permissions), else ourselves (the mode-0 folder is closed to its owner too)."""
    out = Path(tempfile.mkdtemp(prefix="mahabharatha-report-"))
    os.chmod(out, 0o777)

    def child() -> None:
        if os.geteuid() == 0:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
        try:
            report = body()
        except BaseException:
            report = {"harness": traceback.format_exc()}
        (out / "report.json").write_text(json.dumps(report))

    try:
        run_child(child)
        report: dict[str, Any] = json.loads((out / "report.json").read_text())
    finally:
        shutil.rmtree(out)
    assert "harness" not in report, report["harness"]
    return report


def _cli(*args: object) -> dict[str, Any]:
    result = invoke(*args)
    return {"code": result.exit_code, "stdout": result.stdout, "stderr": result.stderr}


@pytest.mark.parametrize("command", ["status", "clean", "claim"])
def test_a_folder_the_caller_may_not_read_is_reported_and_the_rest_is_done(
    shared_gsd: Path, command: str
) -> None:
    """Fails before the fix: each command exited 3 with ``Permission denied: A``."""
    folder_a = str(shared_gsd / "specs" / "A")
    lock_b = lock_path(shared_gsd, "B")
    report = _unprivileged(
        lambda: (
            _cli("lock", command, "--gsd-dir", shared_gsd, "--json", "--pid", 777)
            if command == "claim"
            else _cli("lock", command, "--gsd-dir", shared_gsd, "--json")
        )
    )
    document = json.loads(report["stdout"])
    assert folder_a in report["stderr"] and "Permission denied" in report["stderr"], report
    assert report["code"] == 0, report
    if command == "status":
        by_feature = {entry["feature"]: entry for entry in document["features"]}
        assert by_feature["B"]["state"] == "stale"
        assert by_feature["A"]["state"] == "error" and folder_a in by_feature["A"]["error"]
    elif command == "clean":
        assert [(e["path"], e["removed"]) for e in document["entries"]] == [(str(lock_b), True)]
        assert [p["path"] for p in document["problems"]] == [folder_a]
        assert not lock_b.exists()
    else:
        assert (document["feature"], document["claimed"]) == ("B", True)
        assert [p["path"] for p in document["problems"]] == [folder_a]
        assert lock_b.read_text().startswith("777:")


def test_claim_exits_3_when_nothing_was_claimed_and_a_folder_could_not_be_tried(
    shared_gsd: Path,
) -> None:
    """B and C are held; A cannot be tried: "none free" would be a guess, so: an error, with
    every skipped folder in ``problems``. Fails before the fix: no ``problems`` in the JSON."""
    for name in ("B", "C"):
        lock_path(shared_gsd, name).unlink(missing_ok=True)
        locks.acquire(name, shared_gsd, pid=os.getpid())
    report = _unprivileged(lambda: _cli("lock", "claim", "--gsd-dir", shared_gsd, "--json"))
    document = json.loads(report["stdout"])
    assert report["code"] == 3, report
    assert document["claimed"] is False and "error" in document
    assert [p["path"] for p in document["problems"]] == [str(shared_gsd / "specs" / "A")]
