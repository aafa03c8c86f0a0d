"""``bench/run.py --only 1`` measures scenario (1) on the work folder's file system and on a
tmpfs it mounts itself, side by side, and leaves no mount behind on any way out."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import machine, scenarios
from bench import run as bench_run
from bench.contenders import BenchError

ROOT = Path(__file__).resolve().parents[2]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="only root can mount a tmpfs")


def _run_one(tmp_path: Path) -> tuple[dict[str, Any], Path]:
    out, work = tmp_path / "out", tmp_path / "work"
    return bench_run.main(["--tiny", "--only", "1", "--out", str(out), "--workdir", str(work)]), out


@needs_root
def test_scenario_1_runs_on_the_disk_and_on_its_own_tmpfs(tmp_path: Path) -> None:
    """Before issue 30 the run measured one file system: ``KeyError: 'uncontended-tmpfs'``."""
    results, out = _run_one(tmp_path)
    if "second_filesystem" in results:
        pytest.skip(results["second_filesystem"])
    disk, tmpfs = results["scenarios"]["uncontended"], results["scenarios"]["uncontended-tmpfs"]
    assert tmpfs["filesystem"]["type"] == "tmpfs"
    assert disk["filesystem"] == machine.filesystem_of(tmp_path / "work")
    for scenario in (disk, tmpfs):
        rows = {row["key"]: row for row in scenario["rows"]}
        assert rows["ours-legacy"]["value"] > 0 and rows["ours-context"]["value"] > 0
        assert rows["floor-link"]["ratio"] == 1.0
    texts = [t["target"] for t in results["targets"]]
    # Per file system vs flufl.lock and filelock; vs the floor on the faster one only.
    assert sum(t.startswith("(1, tmpfs") for t in texts) in (4, 6)
    assert sum(t.startswith("(1, ") and "the faster" in t for t in texts) == 2
    assert "on a tmpfs the run mounted" in (out / "results.md").read_text(encoding="utf-8")
    assert machine.mounted_below(tmp_path) == []
    assert list((tmp_path / "work").iterdir()) == []


@needs_root
def test_the_tmpfs_is_unmounted_when_the_scenario_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mount is let go on an exception too. Before issue 30: ``AttributeError`` (no
    ``scenarios.uncontended_on``: one file system, nothing mounted)."""
    seen: list[list[str]] = []

    def broken(places: dict[str, Path], **_sizes: Any) -> None:
        seen.append(machine.mounted_below(tmp_path))
        raise BenchError("a contender misbehaved")

    monkeypatch.setattr(scenarios, "uncontended_on", broken)
    with pytest.raises(BenchError):
        _run_one(tmp_path)
    if seen[0] == []:
        pytest.skip("this machine refused the mount")
    assert len(seen[0]) == 1
    assert machine.mounted_below(tmp_path) == []


def test_without_a_second_file_system_the_run_measures_one_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not root (or a refused mount): the disk alone, and the results say why. Before issue
    30: ``KeyError: 'second_filesystem'``."""
    monkeypatch.setattr(machine, "is_root", lambda: False)
    results, out = _run_one(tmp_path)
    assert set(results["scenarios"]) == {"uncontended"}
    assert results["second_filesystem"].startswith("not root")
    assert "not root" in (out / "results.md").read_text(encoding="utf-8")
    # Ours x the two peers and ours x the floor, on the one file system (a missing peer's
    # target is there too, "not measured").
    assert sum(t["target"].startswith("(1, ") for t in results["targets"]) == 2 * 2 + 2


@needs_root
def test_the_tmpfs_is_unmounted_when_the_run_is_terminated(tmp_path: Path) -> None:
    """SIGTERM while the run measures on its tmpfs: the run exits 143 and the mount is gone.
    Without the SIGTERM handler the run died by the signal (-15) and left its mount behind;
    before issue 30 there was no tmpfs at all (skipped: the run never says it mounted one)."""
    # --quick: seconds of cycles after the mount, so the signal lands inside the measurement.
    command = [sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--only", "1"]
    command += ["--out", str(tmp_path / "out"), "--workdir", str(tmp_path / "work")]
    with subprocess.Popen(command, stderr=subprocess.PIPE, text=True) as run:
        assert run.stderr is not None
        for line in iter(run.stderr.readline, ""):
            if "mounted a tmpfs" in line:
                break
        else:  # the run ended without mounting: it said why (not root, mount refused)
            pytest.skip("this machine refused the mount")
        assert len(machine.mounted_below(tmp_path)) == 1
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=60) == 128 + signal.SIGTERM
    assert machine.mounted_below(tmp_path) == []
