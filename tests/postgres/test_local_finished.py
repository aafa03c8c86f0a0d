"""One meaning of done and failed on both backends: a feature done or failed in its local
folder is shown so by ``status --all`` and skipped by ``claim``, on the folders and on
PostgreSQL alike (the issue: on PostgreSQL ``status`` showed both ``free`` and ``claim``
skipped the done one but handed out the failed one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mahabharatha import locks
from mahabharatha.backends.files.backend import FileBackend
from tests.cli._support import SYNC_TIMEOUT
from tests.support.postgres import PgServer

CLI = (sys.executable, "-m", "mahabharatha")


@pytest.fixture(params=["files", "postgres"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """The environment of a CLI call: the folders only, or a PostgreSQL lock space."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAHABHARATHA_")}
    if request.param == "postgres":
        server: PgServer = request.getfixturevalue("pg_server")
        env["MAHABHARATHA_LOCK_URL"] = server.url()
        env["MAHABHARATHA_LOCK_NAMESPACE"] = request.getfixturevalue("namespace")
    return env


def _cli(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=SYNC_TIMEOUT
    )


def _finished_in_the_folders(tmp_path: Path) -> None:
    """feat-01 done and feat-07 failed (its one allowed attempt), both in the local folders."""
    gsd = tmp_path / ".gsd"
    for name in ("feat-01", "feat-02", "feat-07"):
        (gsd / "specs" / name).mkdir(parents=True)
    folders = FileBackend(gsd)
    for name in ("feat-01", "feat-07"):
        locks.acquire(name, gsd, backend=folders)
    locks.done("feat-01", gsd, backend=folders)
    locks.fail("feat-07", gsd, reason="exit code 2", attempts=1, backend=folders)


def test_status_shows_local_done_and_failed_as_claim_honours_them(
    place: dict[str, str], tmp_path: Path
) -> None:
    """Failed on 211f242 (PostgreSQL): status showed feat-01 and feat-07 free, and claim
    handed out feat-07."""
    _finished_in_the_folders(tmp_path)
    listed = _cli(place, tmp_path, "lock", "status", "--all", "--json")
    states = {entry["feature"]: entry["state"] for entry in json.loads(listed.stdout)["features"]}
    assert states == {"feat-01": "done", "feat-02": "free", "feat-07": "failed"}, listed.stdout
    me = str(os.getpid())
    order = ("feat-01", "feat-07", "feat-02")
    claimed = _cli(place, tmp_path, "lock", "claim", *order, "--pid", me)
    assert (claimed.returncode, claimed.stdout.strip()) == (0, "feat-02"), claimed.stderr
    assert _cli(place, tmp_path, "lock", "done", "feat-02", "--pid", me).returncode == 0
    again = _cli(place, tmp_path, "lock", "claim", *order, "--pid", me)
    assert again.returncode == 1, again.stderr  # nothing left: every one done or failed
    assert "nothing left to claim" in again.stderr
