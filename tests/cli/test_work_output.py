"""``lock work --tag`` prefixes each line of CMD's output with its feature; ``--log-dir DIR``
keeps one file per feature attempt, named in the JSON and in ``status --all``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Final

import pytest

from mahabharatha.cli._work_output import _remember, last_log
from tests.cli._support import run_cli

FEATURES: Final = ("f01", "f02", "f03", "f04")
SAYS: Final = "echo out {}; echo more {}; echo err {} >&2"
"""CMD: two lines on stdout and one on stderr, each naming its feature."""


def _pool(tmp_path: Path) -> Path:
    for name in FEATURES:
        (tmp_path / ".gsd" / "specs" / name).mkdir(parents=True)
    return tmp_path


def test_tag_prefixes_every_line_of_cmd_with_its_feature(tmp_path: Path) -> None:
    """Two workers at once: every line CMD wrote comes out whole, prefixed by the feature it
    names, on the stream CMD wrote it to. Failed on 211f242: no ``--tag`` (exit 2)."""
    done = run_cli(
        *("lock", "work", "-j", "2", "--tag", "--", "sh", "-c", SAYS), cwd=_pool(tmp_path)
    )
    assert done.returncode == 0, done.stderr
    out = sorted(done.stdout.splitlines())
    assert out == sorted(f"[{n}] {w} {n}" for n in FEATURES for w in ("out", "more")), out
    err = [line for line in done.stderr.splitlines() if not line.startswith("mahabharatha:")]
    assert sorted(err) == sorted(f"[{n}] err {n}" for n in FEATURES), done.stderr


FLAKY: Final = "echo try {}; mkdir tried-{} 2>/dev/null && exit 1; exit 0"
"""CMD: fails at its first attempt at each feature, succeeds at the second."""


def test_log_dir_keeps_one_file_per_attempt_named_in_the_json_and_status(tmp_path: Path) -> None:
    """Each feature is tried twice: two files each, each holding one attempt's output (both
    streams); the JSON names each attempt's file; ``status --all`` (JSON and table) names
    the last. Failed on 211f242: no ``--log-dir`` (exit 2)."""
    pool = _pool(tmp_path)
    done = run_cli(
        *("lock", "work", "--log-dir", "logs", "--retry-delay", "0", "--json"),
        *("--", "sh", "-c", FLAKY + " >&2"),
        cwd=pool,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)["results"]
    assert len(results) == 2 * len(FEATURES)
    for result in results:
        log = Path(result["log"])
        assert log.parent == pool / "logs" and log.name.startswith(result["feature"] + ".")
        assert log.read_text() == f"try {result['feature']}\n"
    assert len({result["log"] for result in results}) == len(results)  # one file per attempt
    last = {result["feature"]: result["log"] for result in results}
    listed = run_cli("lock", "status", "--all", "--json", cwd=pool)
    entries = json.loads(listed.stdout)["features"]
    assert {entry["feature"]: entry["log"] for entry in entries} == last
    table = run_cli("lock", "status", "--all", cwd=pool).stdout
    assert all(f"last log of {name}: {path}" in table for name, path in last.items()), table


def test_status_names_no_last_log_for_a_fifo_a_link_or_a_huge_file_at_its_name(
    tmp_path: Path,
) -> None:
    """``status --all`` reads ``.last-log`` without following, blocking or reading it whole:
    f01's FIFO, f02's link and f03's 1 MB file name no log, f04's own does. Fails on 0b2d23a:
    ``Path.read_text`` opened f01's FIFO and waited for a writer (``status`` hung)."""
    pool = _pool(tmp_path)
    specs = pool / ".gsd" / "specs"
    os.mkfifo(specs / "f01" / ".last-log")
    (tmp_path / "elsewhere").write_text("/etc/passwd\n")
    (specs / "f02" / ".last-log").symlink_to(tmp_path / "elsewhere")
    (specs / "f03" / ".last-log").write_text("/x" * 500_000)
    _remember(pool / ".gsd", "f04", "/logs/f04.log")
    listed = run_cli("lock", "status", "--all", "--json", cwd=pool, timeout=30)
    entries = json.loads(listed.stdout)["features"]
    logs = {entry["feature"]: entry.get("log") for entry in entries}
    assert logs == {"f01": None, "f02": None, "f03": None, "f04": "/logs/f04.log"}


def test_a_last_log_temp_swept_before_its_rename_is_written_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Race: ``lock clean`` sweeps ``.last-log.<pid>.tmp`` by its pid or its age, without the
    writer holding anything (a pid of another PID namespace, a writer stopped for 60 s): the
    rename then finds no temp. The log is named all the same. Failed on 2e566e5:
    FileNotFoundError, and ``lock work`` stopped with exit 3 and its claimed lock unfinished."""
    folder = tmp_path / "specs" / "feat"
    folder.mkdir(parents=True)
    rename = os.replace
    swept: list[str] = []

    def swept_once(source: Any, target: Any) -> None:
        if not swept and ".last-log." in str(source):
            swept.append(str(source))
            os.unlink(source)  # what clean's removal does between the write and the rename
        rename(source, target)

    monkeypatch.setattr(os, "replace", swept_once)
    _remember(tmp_path, "feat", "/logs/feat.1.log")
    assert swept, "the sweep was not run"
    assert last_log(tmp_path, "feat") == "/logs/feat.1.log"
    assert sorted(path.name for path in folder.iterdir()) == [".last-log"]


def test_a_log_dir_that_cannot_be_made_leaves_no_lock_behind(tmp_path: Path) -> None:
    """``--log-dir`` under a file: the worker stops with one sentence, and the feature it had
    claimed is released, not left to the exited worker. Failed on 2e566e5: exit 3 with its
    ``.lock`` left (a dead pid's, for two hours: the next ``lock work`` waited for it)."""
    pool = _pool(tmp_path)
    (pool / "a-file").write_text("not a folder\n")
    done = run_cli("lock", "work", "--log-dir", "a-file/logs", "--", "true", cwd=pool)
    assert done.returncode == 3, done.stderr
    assert done.stderr.strip().splitlines() == ["mahabharatha: Not a directory: a-file/logs"]
    left = [name for name in FEATURES if (pool / ".gsd" / "specs" / name / ".lock").exists()]
    assert left == [], "a claimed feature left locked"
