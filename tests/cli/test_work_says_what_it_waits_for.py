"""``lock work`` whose remaining features are held by others says once, on stderr, which
feature and holder it waits for (as ``lock run`` says "waiting: feature ... is locked by")."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mahabharatha.backends.base import LockInfo
from mahabharatha.backends.files.backend import FileBackend
from mahabharatha.constants import RETRY_DELAY_SECONDS
from mahabharatha.pool.claim import _ClaimOptions, _Pool
from tests.cli._support import HOLD_CMD, cli_argv, run_cli


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


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_while_waiting_keeps_what_the_worker_did_in_its_document(
    tmp_path: Path, spawn: Any, signum: signal.Signals
) -> None:
    """alpha done, then a wait for beta (held by this test) is stopped: exit 128+N, and the
    one document says what the worker did (alpha done, ended ``stopped``). Failed on
    96f1493: ``"ended": null, "results": []`` (the stop's answer had only the first fields)."""
    for feature in ("alpha", "beta"):
        (tmp_path / ".gsd" / "specs" / feature).mkdir(parents=True)
    me = str(os.getpid())
    assert run_cli("lock", "acquire", "beta", "--pid", me, cwd=tmp_path).returncode == 0
    worker = spawn(cli_argv("lock", "work", "--json", "--", "true"))
    assert worker.next_line("stderr") == "mahabharatha: alpha: done"
    assert "waiting: feature 'beta' is locked by" in worker.next_line("stderr")
    os.kill(worker.pid, signum)
    code = worker.wait()
    assert code == 128 + signum, worker.stderr
    document = json.loads(worker.stdout)
    results = [(r["feature"], r["outcome"]) for r in document["results"]]
    assert (document["ended"], results) == ("stopped", [("alpha", "done")]), document
    assert document["error"] == "interrupted"
    assert worker.stderr.strip().splitlines()[-1] == "mahabharatha: interrupted"


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


def test_a_feature_released_before_the_line_looks_is_not_said_to_rest(
    tmp_path: Path, spawn: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A claim round saw q21 held by a ``lock run``; that holder released it before the waiting
    line looked at it: free, yet no attempt failed, so nothing is said yet (the next round takes
    it). Failed on f9b5570: "waiting: feature 'q21' rests after a failed attempt" (seen in a
    4-worker PostgreSQL run while q21 was held by another worker, then done)."""
    gsd = tmp_path / "gsd"
    (gsd / "specs" / "q21").mkdir(parents=True)
    holder = spawn(
        cli_argv("lock", "run", "q21", "--gsd-dir", gsd, "--", sys.executable, "-c", HOLD_CMD),
        stdin=subprocess.PIPE,
    )
    assert holder.next_line() == "ready"
    told: list[LockInfo] = []
    options = _ClaimOptions(False, False, 3, None)
    pool = _Pool(FileBackend(gsd), ["q21"], os.getpid(), None, [], options)
    pool.retry_delay, pool.on_waiting = RETRY_DELAY_SECONDS, told.append
    seen = pool.claim()
    assert seen.busy == ("q21",), seen
    holder.send("x")  # the holder's command ends: lock run releases q21
    assert holder.wait() == 0, holder.stderr
    with caplog.at_level(logging.INFO, logger="mahabharatha"):
        pool.tell_waiting(seen.busy)
    assert told == [] and "rests after" not in caplog.text, (told, caplog.text)
    taken = pool.claim().held  # the next round: the feature is taken, not waited for
    assert taken is not None and taken.feature == "q21"
    assert pool.store.release_held(taken)
