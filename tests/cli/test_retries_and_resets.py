"""``lock work --retry-delay``: a failed feature rests before its next attempt, whichever
worker makes it; ``lock reopen`` takes several features, ``--failed`` and ``--all``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final

import pytest

from mahabharatha.backends.files.backend import FileBackend
from tests.cli._support import invoke, one_document, run_cli

RETRY_DELAY: Final = 0.6
"""The rest asked for: short, as the test's own run time."""

FAILS_AND_LOGS: Final = (
    "import sys, time; open(sys.argv[1], 'a').write(f'{time.time()!r}\\n'); sys.exit(3)"
)
"""CMD: writes the time it started to the log it is given, then fails."""


def _features(tmp_path: Path, *names: str) -> Path:
    gsd = tmp_path / ".gsd"
    for name in names:
        (gsd / "specs" / name).mkdir(parents=True)
    return gsd


@pytest.mark.parametrize("jobs", [1, 2], ids=["one-worker", "two-workers"])
def test_a_failed_features_next_attempt_comes_after_the_retry_delay(
    tmp_path: Path, jobs: int
) -> None:
    """Each attempt after a failed one starts at least --retry-delay after that failure was
    recorded, by the same worker or another (two workers: the idle one waits too).
    Failed on 211f242: no such option (usage error, exit 2); attempts followed at once."""
    _features(tmp_path, "alpha")
    log = tmp_path / "starts.log"
    done = run_cli(
        *("lock", "work", "--attempts", "3", "--retry-delay", RETRY_DELAY, "-j", jobs),
        *("--", "python3", "-c", FAILS_AND_LOGS, log),
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stderr
    starts = [float(line) for line in log.read_text().split()]
    record = FileBackend(tmp_path / ".gsd").attempts("alpha")
    assert record is not None and record.tries == 3 and len(starts) == 3
    failed_at = [float(attempt["at"]) for attempt in record.history]
    assert starts[1] >= failed_at[0] + RETRY_DELAY, (starts, failed_at)
    assert starts[2] >= failed_at[1] + RETRY_DELAY, (starts, failed_at)


def test_a_retry_delay_that_is_not_a_number_of_seconds_is_bad_input(tmp_path: Path) -> None:
    gsd = _features(tmp_path, "alpha")
    for bad in ("-1", "nan", "soon"):
        result = invoke("lock", "work", "--gsd-dir", gsd, "--retry-delay", bad, "--", "true")
        assert result.exit_code == 2, result.stderr


def _finish(gsd: Path, done: tuple[str, ...], failed: tuple[str, ...], tried: str) -> None:
    """``done`` marked done, ``failed`` failed for good, ``tried`` failed once of three."""
    for name in (*done, *failed, tried):
        assert invoke("lock", "claim", name, "--gsd-dir", gsd, "--pid", "1").exit_code == 0
    for name in done:
        assert invoke("lock", "done", name, "--gsd-dir", gsd, "--pid", "1").exit_code == 0
    for name, limit in [*((name, "1") for name in failed), (tried, "3")]:
        failing = ("lock", "fail", name, "--gsd-dir", gsd, "--pid", "1", "--attempts", limit)
        assert invoke(*failing).exit_code == 0


def _states(gsd: Path) -> dict[str, str]:
    listed = invoke("lock", "status", "--all", "--gsd-dir", gsd, "--json")
    return {entry["feature"]: entry["state"] for entry in one_document(listed.stdout)["features"]}


def test_reopen_takes_several_features(tmp_path: Path) -> None:
    """Failed on 211f242: ``lock reopen a b`` was a usage error ("unexpected extra
    argument"): a pool took one process per feature to reset."""
    gsd = _features(tmp_path, "a", "b", "c", "d")
    _finish(gsd, done=("a",), failed=("b", "c"), tried="d")
    result = invoke("lock", "reopen", "a", "b", "--gsd-dir", gsd, "--json")
    assert result.exit_code == 0, result.stderr
    assert one_document(result.stdout)["reopened"] == ["a", "b"]
    assert _states(gsd)["a"] == "free" and _states(gsd)["b"] == "free"
    assert _states(gsd)["c"] == "failed"


def test_reopen_failed_reopens_every_failed_feature_and_only_those(tmp_path: Path) -> None:
    """Failed on 211f242: no ``--failed`` option."""
    gsd = _features(tmp_path, "a", "b", "c", "d")
    _finish(gsd, done=("a",), failed=("b", "c"), tried="d")
    result = invoke("lock", "reopen", "--failed", "--gsd-dir", gsd, "--json")
    assert result.exit_code == 0, result.stderr
    assert one_document(result.stdout)["reopened"] == ["b", "c"]
    states = _states(gsd)
    assert (states["a"], states["b"], states["c"]) == ("done", "free", "free")
    assert FileBackend(gsd).attempts("d") is not None  # not failed: its attempts are kept


def test_reopen_all_resets_the_pool(tmp_path: Path) -> None:
    """Failed on 211f242: no ``--all`` option."""
    gsd = _features(tmp_path, "a", "b", "c", "d")
    _finish(gsd, done=("a",), failed=("b", "c"), tried="d")
    result = invoke("lock", "reopen", "--all", "--gsd-dir", gsd, "--json")
    assert result.exit_code == 0, result.stderr
    assert one_document(result.stdout)["reopened"] == ["a", "b", "c", "d"]
    assert set(_states(gsd).values()) == {"free"}
    assert all(FileBackend(gsd).attempts(name) is None for name in "abcd")


@pytest.mark.parametrize(
    "args",
    [(), ("a", "--all"), ("--failed", "--all")],
    ids=["nothing", "names-and-all", "failed-and-all"],
)
def test_reopen_says_what_is_wrong_with_its_choice(tmp_path: Path, args: tuple[str, ...]) -> None:
    gsd = _features(tmp_path, "a")
    result = invoke("lock", "reopen", *args, "--gsd-dir", gsd, "--json")
    assert result.exit_code == 2
    assert "error" in json.loads(result.stdout)
