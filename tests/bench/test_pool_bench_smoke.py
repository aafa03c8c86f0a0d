"""Benchmark (11) still runs: a tiny pool against xargs, checked for correctness, never timed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench import pool_work


@pytest.mark.skipif(shutil.which("xargs") is None, reason="needs xargs")
def test_the_pool_benchmark_runs_and_every_feature_is_done_once() -> None:
    rows = pool_work.measure(features=12, workers=2, rounds=1, use_postgres=False)
    assert [(row["backend"], row["command"], row["form"]) for row in rows] == [
        ("files", "sleep 0.05", "2 processes"),
        ("files", "sleep 0.05", "-j 2"),
        ("files", "true", "2 processes"),
        ("files", "true", "-j 2"),
    ]  # measure() itself raises unless every feature ended done
    text = pool_work.section(rows, 12, 2, 1)
    assert text.startswith(pool_work.BEGIN) and text.rstrip().endswith(pool_work.END)


def test_run_py_keeps_the_pool_section_of_the_page(tmp_path: Path) -> None:
    old = tmp_path / "results.md"
    old.write_text(f"# old\n\n{pool_work.BEGIN}\nkept\n{pool_work.END}\n")
    page = pool_work.with_kept_section("# new results\n", old)
    assert page.startswith("# new results") and "kept" in page and "# old" not in page
