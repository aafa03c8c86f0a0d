"""``lock run -E/--conflict-exit-code N`` (issue 19, item 11): run's own "could not get the
lock" is told apart from CMD's code, by the exit code N and by ``--json`` (``acquired``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cli._support import (
    FEATURE,
    HOLD_CMD,
    cli_argv,
    invoke,
    one_document,
    run_cli,
    write_lock,
)

PY = sys.executable


def _touch(marker: Path) -> list[str]:
    return [PY, "-c", f"open({str(marker)!r}, 'w').close()"]


@pytest.mark.parametrize("how", ["-n", "--timeout=0"], ids=["nonblock", "timeout-0"])
def test_a_lock_held_by_another_process_exits_with_the_chosen_code_and_cmd_never_runs(
    tmp_path: Path, gsd: Path, spawn: Any, how: str
) -> None:
    """A real holder (another ``lock run``); the second one asks -E 9. Fails on the old code:
    no -E option (exit 2), so a busy lock (75) could not be told from a CMD exiting 75."""
    holder = spawn(
        [*cli_argv("lock", "run", FEATURE, "--gsd-dir", gsd, "--"), PY, "-c", HOLD_CMD],
        stdin=subprocess.PIPE,
    )
    assert holder.next_line() == "ready"
    marker = tmp_path / "ran"

    busy = run_cli(
        "lock", "run", FEATURE, "--gsd-dir", gsd, how, "-E", "9", "--json", "--", *_touch(marker),
        cwd=tmp_path,
    )  # fmt: skip

    assert busy.returncode == 9, busy.stderr
    document = one_document(busy.stdout)
    assert (document["acquired"], document["exit_code"]) == (False, None)
    assert document["holder"]["pid"] == holder.pid and "error" in document
    assert not marker.exists()
    holder.send("x")
    assert holder.wait() == 0


def test_cmds_own_code_is_told_apart_by_json(tmp_path: Path, gsd: Path) -> None:
    ran = run_cli(
        "lock", "run", FEATURE, "--gsd-dir", gsd, "-E", "9", "--json", "--",
        PY, "-c", "raise SystemExit(9)",
        cwd=tmp_path,
    )  # fmt: skip

    assert ran.returncode == 9, ran.stderr
    document = one_document(ran.stdout)
    assert (document["acquired"], document["exit_code"]) == (True, 9)
    assert "error" not in document


def test_a_lock_already_held_by_the_caller_exits_with_the_chosen_code(
    tmp_path: Path, gsd: Path
) -> None:
    """In-process, the caller of ``lock run`` is this test's parent: a lock of that pid is
    "already held by you", which is also "could not get the lock"."""
    write_lock(gsd, pid=os.getppid(), timestamp=time.time())
    marker = tmp_path / "ran"

    mine = invoke(
        "lock", "run", FEATURE, "--gsd-dir", gsd, "-E", "9", "--json", "--", *_touch(marker)
    )

    assert mine.exit_code == 9, mine.stderr
    assert one_document(mine.stdout)["acquired"] is False
    assert not marker.exists()


def test_without_e_the_codes_stay_75_for_busy_and_1_for_yours(gsd: Path) -> None:
    write_lock(gsd, pid=1, timestamp=time.time())
    write_lock(gsd, "mine", pid=os.getppid(), timestamp=time.time())

    busy = invoke("lock", "run", FEATURE, "--gsd-dir", gsd, "-n", "--", PY, "-c", "pass")
    mine = invoke("lock", "run", "mine", "--gsd-dir", gsd, "--", PY, "-c", "pass")

    assert (busy.exit_code, mine.exit_code) == (75, 1)


@pytest.mark.parametrize("value", ["-1", "256", "abc"])
def test_a_conflict_exit_code_outside_0_to_255_is_bad_input(gsd: Path, value: str) -> None:
    result = invoke("lock", "run", FEATURE, "--gsd-dir", gsd, "-E", value, "--", PY, "-c", "pass")

    assert result.exit_code == 2
