"""Every entry point, one backend: with ``MAHABHARATHA_LOCK_URL`` set, the CLI,
the ``locks`` functions, ``FeatureLock`` and the legacy functions all keep their locks on that
server; ``FeatureLock`` and the ``locks`` functions also take the URL directly."""

from __future__ import annotations

import functools
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mahabharatha import locks
from mahabharatha.commands import _utils
from tests.conformance._procs import SYNC_TIMEOUT, run_team
from tests.support.postgres import PgServer, admin_execute

REPO = Path(__file__).resolve().parents[2]
ENTRY_POINTS = ("cli", "locks", "feature-lock", "legacy")
WORKERS_PER_ENTRY_POINT = 2
JOIN_SECONDS = 60.0


@pytest.fixture
def on_server(pg_server: PgServer, namespace: str, monkeypatch: Any, tmp_path: Path) -> Path:
    """The variables set as a user exports them; the work folder (its .gsd has the feature)."""
    monkeypatch.setenv("MAHABHARATHA_LOCK_URL", pg_server.url())
    monkeypatch.setenv("MAHABHARATHA_LOCK_NAMESPACE", namespace)
    (tmp_path / ".gsd" / "specs" / "feat").mkdir(parents=True)
    return tmp_path / ".gsd"


def _cli_acquire(gsd: str, pid: int) -> subprocess.CompletedProcess[str]:
    command = ["lock", "acquire", "feat", "--gsd-dir", gsd, "--pid", str(pid)]
    return subprocess.run(
        [sys.executable, "-m", "mahabharatha", *command],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=JOIN_SECONDS,
    )


def _take(entry_point: str, gsd: str) -> bool:
    """One try at ``feat`` through ``entry_point``; True when it won (the lock is kept)."""
    if entry_point == "cli":
        done = _cli_acquire(gsd, os.getpid())
        assert done.returncode in (0, 1), done.stderr
        return done.returncode == 0
    if entry_point == "legacy":
        return _utils.acquire_feature_lock("feat", gsd)
    try:
        if entry_point == "locks":
            locks.acquire("feat", gsd, timeout=0)
        else:
            locks.FeatureLock("feat", gsd, timeout=0, heartbeat=None).acquire()
    except locks.LockHeldError:
        return False
    return True


def _take_at_once(chosen: tuple[str, ...], gsd: str, start: Any, index: int) -> tuple[str, bool]:
    start.wait(SYNC_TIMEOUT)
    return chosen[index], _take(chosen[index], gsd)


def test_every_entry_point_racing_for_one_feature_gives_one_holder(on_server: Path) -> None:
    """Workers of every entry point start at once (a barrier) on one feature; exactly one wins,
    and its lock is on the server. Failed before: ``locks``, ``FeatureLock`` and the legacy
    functions used files while the CLI used the server: a holder on each (two or more)."""
    context = multiprocessing.get_context("spawn")  # no connection crosses a fork
    chosen = tuple(kind for kind in ENTRY_POINTS for _ in range(WORKERS_PER_ENTRY_POINT))
    start = context.Barrier(len(chosen))
    work = functools.partial(_take_at_once, chosen, str(on_server), start)
    results = run_team(len(chosen), work, context)
    assert sum(won for _, won in results) == 1, results
    assert not any((on_server / "specs" / "feat").iterdir())  # nothing on files


def test_a_lock_held_through_the_cli_stops_every_python_entry_point(
    on_server: Path, pg_server: PgServer, namespace: str
) -> None:
    """The issue's case: held on the server through the CLI, then ``FeatureLock("f",
    timeout=0)`` succeeded on files. Now each Python entry point sees the holder."""
    gsd = str(on_server)
    held = _cli_acquire(gsd, 1)
    assert held.returncode == 0, held.stderr
    with pytest.raises(locks.LockHeldError):
        locks.FeatureLock("feat", gsd, timeout=0, heartbeat=None).acquire()
    with pytest.raises(locks.LockHeldError):
        locks.acquire("feat", gsd, timeout=0)
    assert locks.inspect("feat", gsd).pid == 1
    assert _utils.acquire_feature_lock("feat", gsd) is False
    checked = _utils.check_feature_lock("feat", gsd)
    assert checked is not None and checked["pid"] == 1 and checked["age_seconds"] >= 0
    _utils.release_feature_lock("feat", gsd)  # another owner's: left as it is
    assert locks.inspect("feat", gsd).pid == 1
    assert _utils.check_feature_lock("free-one", gsd) is None
    assert _utils.acquire_feature_lock("free-one", gsd) is True
    assert _utils.acquire_feature_lock("free-one", gsd) is False  # not reentrant
    _utils.release_feature_lock("free-one", gsd)
    assert _utils.check_feature_lock("free-one", gsd) is None
    with pytest.raises(ValueError, match="Invalid feature name"):
        _utils.acquire_feature_lock("../x", gsd)
    rows = admin_execute(
        pg_server,
        "SELECT feature, pid FROM mahabharatha_locks WHERE namespace = %s AND pid IS NOT NULL",
        namespace,
    )
    assert rows == [("feat", 1)]


def test_feature_lock_and_the_locks_functions_take_the_url(
    pg_server: PgServer, namespace: str, monkeypatch: Any, tmp_path: Path
) -> None:
    """Without the variable: ``FeatureLock(url=...)`` and ``backend=URL`` use the server."""
    monkeypatch.delenv("MAHABHARATHA_LOCK_URL", raising=False)
    monkeypatch.setenv("MAHABHARATHA_LOCK_NAMESPACE", namespace)
    gsd = tmp_path / ".gsd"
    with locks.FeatureLock("feat", gsd, timeout=0, url=pg_server.url()) as holder:
        assert holder.token is not None
        assert locks.inspect("feat", gsd, backend=pg_server.url()).pid == os.getpid()
        assert locks.inspect("feat", gsd).state == "free"  # files: nothing there
    assert locks.inspect("feat", gsd, backend=pg_server.url()).state == "free"
