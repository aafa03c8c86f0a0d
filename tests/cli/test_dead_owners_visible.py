"""A lock whose owner is not running is visible as such (issue 19, items 12 and 13): ``status``
and its summary show it as reclaimable, ``clean`` names it, and ``lock run`` waiting on it
says once that ``--reclaim-dead`` would take it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Final

import pytest

from tests.cli._support import (
    FEATURE,
    cli_argv,
    invoke,
    lock_of_a_dead_process,
    lock_path,
    one_document,
    run_cli,
)

NOTICE: Final = "--reclaim-dead would take it now"


def test_status_shows_a_dead_owners_lock_as_reclaimable_and_counts_it_so(gsd: Path) -> None:
    """Fails on the old code: shown ``active`` and counted as held."""
    lock_of_a_dead_process(gsd)

    text = invoke("lock", "status", "--gsd-dir", gsd)
    document = one_document(invoke("lock", "status", "--gsd-dir", gsd, "--json").stdout)

    [row] = [line for line in text.stdout.splitlines() if line.startswith(FEATURE)]
    assert row.split()[1] == "reclaimable"
    assert (
        text.stdout.splitlines()[-1]
        == "1 feature: 0 done, 0 held, 0 free, 0 failed, 0 stale, 1 reclaimable"
    )
    [entry] = document["features"]
    assert (entry["state"], entry["owner"], entry["reclaimable"]) == ("active", "not-running", True)
    assert (document["summary"]["held"], document["summary"]["reclaimable"]) == (0, 1)


def test_clean_names_a_dead_owners_lock_and_dry_run_with_reclaim_dead_lists_it(gsd: Path) -> None:
    """Fails on the old code: ``clean --dry-run`` said "nothing to clean"."""
    lock_of_a_dead_process(gsd)

    plain = invoke("lock", "clean", "--dry-run", "--gsd-dir", gsd)
    plain_json = one_document(
        invoke("lock", "clean", "--dry-run", "--gsd-dir", gsd, "--json").stdout
    )
    reclaim = invoke("lock", "clean", "--dry-run", "--reclaim-dead", "--gsd-dir", gsd, "--json")

    assert "nothing to clean" not in plain.stdout
    assert FEATURE in plain.stdout and "lock clean --reclaim-dead" in plain.stdout
    assert (plain_json["entries"], plain_json["reclaimable"]) == ([], [FEATURE])
    listed = one_document(reclaim.stdout)
    assert [(e["feature"], e["removed"]) for e in listed["entries"]] == [(FEATURE, False)]
    assert lock_path(gsd).is_file(), "a dry run removes nothing"


WAITERS: Final = {
    "run": ["run", FEATURE, "--", sys.executable, "-c", "print('ran')"],
    "acquire": ["acquire", FEATURE, "--wait", "600"],
}
"""Commands that wait for a busy lock (options go before ``--``)."""


@pytest.mark.parametrize("command", sorted(WAITERS))
def test_a_command_waiting_on_a_dead_owner_says_once_that_reclaim_dead_would_take_it(
    tmp_path: Path, gsd: Path, spawn: Any, command: str
) -> None:
    """Fails on the old code: nothing was said for up to two hours (the lock's age)."""
    lock_of_a_dead_process(gsd)
    argv = WAITERS[command]
    at = argv.index("--") if "--" in argv else len(argv)
    runner = spawn(cli_argv("lock", *argv[:at], "--gsd-dir", gsd, *argv[at:]))

    said = runner.next_line("stderr")
    assert NOTICE in said and "not running" in said, said
    for _ in range(3):  # more CLI start-ups: the runner keeps polling (and must not repeat it)
        assert run_cli("lock", "check", FEATURE, "--gsd-dir", gsd, cwd=tmp_path).returncode == 1
    assert (
        run_cli("lock", "release", FEATURE, "--force", "--gsd-dir", gsd, cwd=tmp_path).returncode
        == 0
    )

    assert runner.wait() == 0, runner.stderr
    assert runner.stdout.startswith("ran" if command == "run" else "acquired")
    assert runner.stderr.count(NOTICE) == 1, runner.stderr


def test_lock_run_with_reclaim_dead_takes_it_without_a_word(tmp_path: Path, gsd: Path) -> None:
    lock_of_a_dead_process(gsd)

    done = run_cli(
        "lock", "run", FEATURE, "--gsd-dir", gsd, "--reclaim-dead", "--",
        sys.executable, "-c", "pass",
        cwd=tmp_path,
    )  # fmt: skip

    assert done.returncode == 0 and NOTICE not in done.stderr
