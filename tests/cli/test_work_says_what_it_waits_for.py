"""``lock work`` whose remaining features are held by others says once, on stderr, which
feature and holder it waits for (as ``lock run`` says "waiting: feature ... is locked by")."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tests.cli._support import cli_argv, run_cli


def test_a_waiting_worker_names_the_feature_and_its_holder_once(tmp_path: Path, spawn: Any) -> None:
    """The holder is this test (an interactive ``acquire`` of a live process): the worker
    says whom it waits for, once, then runs the feature when it is released and exits 0.
    Failed on 211f242: the worker waited in silence (no line on stderr until the end)."""
    (tmp_path / ".gsd" / "specs" / "alpha").mkdir(parents=True)
    me = str(os.getpid())
    assert run_cli("lock", "acquire", "alpha", "--pid", me, cwd=tmp_path).returncode == 0
    worker = spawn(cli_argv("lock", "work", "--", "true"))
    said = worker.next_line("stderr")
    assert said.startswith("mahabharatha: waiting: feature 'alpha' is locked by pid " + me), said
    assert run_cli("lock", "release", "alpha", "--pid", me, cwd=tmp_path).returncode == 0
    assert worker.wait() == 0, worker.stderr
    assert worker.stderr.count("waiting:") == 1, worker.stderr
    assert "alpha: done" in worker.stderr


def test_a_worker_waiting_for_a_resting_feature_says_so(tmp_path: Path) -> None:
    """The only feature failed once and rests (--retry-delay): the worker says it waits for
    it to rest, not that someone holds it."""
    (tmp_path / ".gsd" / "specs" / "alpha").mkdir(parents=True)
    once = tmp_path / "once"
    fails_first = f"mkdir {once} 2>/dev/null && exit 1; exit 0"
    done = run_cli(
        *("lock", "work", "--retry-delay", "0.3", "--", "sh", "-c", fails_first), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "waiting: feature 'alpha' rests after a failed attempt" in done.stderr
    assert done.stderr.count("waiting:") == 1, done.stderr
