"""The benchmark still runs: every scenario at tiny sizes, checked for correctness, never timed.

A peer that is not installed skips only its own rows (``pytest.importorskip``); ours, the bare
floors and the naive baseline always run. No assertion here is about speed.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from bench import run as bench_run
from bench import scenarios

SCENARIOS = {"uncontended", "contended", "storm", "status", "cli", "handoff"}
PG_SCENARIOS = {"pg-uncontended", "pg-storm", "pg-handoff", "pg-cli"}
"""Run when PostgreSQL is installed (the benchmark starts its own server)."""
SECOND_FILESYSTEM = {"uncontended-tmpfs"}
"""Run when the benchmark can mount its own tmpfs (root)."""

PEER_CYCLES = {
    "filelock": ["filelock", "softfilelock"],
    "fasteners": ["fasteners"],
    "portalocker": ["portalocker"],
    "flufl.lock": ["flufl"],
}


def _rows(results: dict[str, Any], scenario: str) -> dict[str, dict[str, Any]]:
    return {row["key"]: row for row in results["scenarios"][scenario]["rows"]}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, Path]:
    base = tmp_path_factory.mktemp("bench")
    out, work = base / "out", base / "work"
    results = bench_run.main(["--tiny", "--out", str(out), "--workdir", str(work)])
    return results, out, work


def test_run_writes_the_results_files(tiny_run: tuple[dict[str, Any], Path, Path]) -> None:
    results, out, work = tiny_run
    markdown = (out / "results.md").read_text(encoding="utf-8")
    assert "## Targets (issue 4)" in markdown and "## Machine" in markdown
    assert json.loads((out / "results.json").read_text(encoding="utf-8"))["mode"] == "tiny"
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(results["scenarios"]) - PG_SCENARIOS - SECOND_FILESYSTEM == SCENARIOS
    assert list(work.iterdir()) == []  # the run's lock folders are gone
    assert all(target["met"] in (True, False, None) for target in results["targets"])


def test_uncontended_runs_ours_and_the_floors(tiny_run: tuple[dict[str, Any], Path, Path]) -> None:
    rows = _rows(tiny_run[0], "uncontended")
    for key in ("ours-legacy", "ours-context", "floor-link", "floor-excl", "naive"):
        assert rows[key]["value"] > 0


def test_contended_ours_and_floor_never_overlap(
    tiny_run: tuple[dict[str, Any], Path, Path],
) -> None:
    rows = _rows(tiny_run[0], "contended")
    for key in ("ours-legacy", "floor-link", "ours-waiting"):
        assert rows[key]["overlaps"] == 0
        assert rows[key]["acquisitions"] > 0


def test_claim_storm_claims_every_feature_once(tiny_run: tuple[dict[str, Any], Path, Path]) -> None:
    rows = _rows(tiny_run[0], "storm")
    for key in ("ours-legacy", "floor-link"):
        assert rows[key]["duplicate_claims"] == 0
        assert rows[key]["unclaimed"] == 0
        assert rows[key]["missing_lock_files"] == 0


def test_status_cli_and_handoff_report_ours(tiny_run: tuple[dict[str, Any], Path, Path]) -> None:
    results = tiny_run[0]
    assert {"ours-status", "ours-status-shared", "floor-loop"} <= set(_rows(results, "status"))
    assert {"ours-module", "floor-typer"} <= set(_rows(results, "cli"))
    assert _rows(results, "handoff")["ours"]["handoffs"] == bench_run.SIZES["tiny"].handoffs


@pytest.mark.parametrize("module", sorted(PEER_CYCLES))
def test_peer_rows_run(module: str, tmp_path: Path) -> None:
    pytest.importorskip(module)
    keys = PEER_CYCLES[module]
    result = scenarios.uncontended(tmp_path, rounds=1, cycles=5, only=keys)
    assert [row["key"] for row in result["rows"]] == keys
    assert result["skipped"] == []


def test_filelock_hands_off(tmp_path: Path) -> None:
    pytest.importorskip("filelock")
    result = scenarios.handoff(tmp_path, handoffs=2, only=["filelock"])
    assert result["rows"][0]["handoffs"] == 2


def test_percentile_interpolates() -> None:
    assert scenarios.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert scenarios.percentile([5.0], 99) == 5.0
