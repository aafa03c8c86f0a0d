"""Workers as simulated hosts (own UTS and PID namespaces, reaching the server through its Unix
socket): a claim storm hands every feature out once; a mutual-exclusion hammer never overlaps.

Fails before this change: there was no PostgreSQL backend at all."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.support.marks import needs_simulated_hosts
from tests.support.postgres import PgServer

pytestmark = [needs_simulated_hosts, pytest.mark.stress]

WORKERS = 8
STRESS = int(os.environ.get("MAHABHARATHA_STRESS", "1"))
FEATURES = 1000 * STRESS
HAMMER_ROUNDS = 25 * STRESS
REPO = Path(__file__).resolve().parents[2]


def _start_hosts(args: list[str]) -> list[subprocess.Popen[str]]:
    """Start the workers, each on its own simulated host; return once all say ``ready``."""
    unshare = shutil.which("unshare")
    assert unshare is not None
    workers = [
        subprocess.Popen(
            [
                unshare,
                "--uts",
                "--pid",
                "--fork",
                "--mount-proc",
                sys.executable,
                "-m",
                "tests.postgres._host_worker",
                args[0],
                args[1],
                f"host-{index}",
                *args[2:],
            ],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        for index in range(WORKERS)
    ]
    for worker in workers:
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == "ready"
    return workers


def _go_and_collect(workers: list[subprocess.Popen[str]]) -> list[str]:
    for worker in workers:  # the start line: every worker is connected and waiting
        assert worker.stdin is not None
        worker.stdin.write("go\n")
        worker.stdin.flush()
    outputs = []
    try:
        for worker in workers:
            out, _ = worker.communicate(timeout=120)
            assert worker.returncode == 0
            outputs.append(out)
    finally:
        for worker in workers:  # child processes always reaped
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    return outputs


def test_claim_storm_hands_every_feature_out_once(
    pg_server: PgServer, namespace: str, tmp_path: Any
) -> None:
    names = tmp_path / "features"
    features = [f"f{index:05d}" for index in range(FEATURES)]
    names.write_text("\n".join(features))
    workers = _start_hosts([pg_server.url(), namespace, "claim", str(names)])
    claimed = Counter(line for out in _go_and_collect(workers) for line in out.split())
    assert sorted(claimed) == features
    assert max(claimed.values()) == 1


def test_mutual_exclusion_hammer_never_overlaps(
    pg_server: PgServer, namespace: str, tmp_path: Any
) -> None:
    marker = tmp_path / "inside"
    args = [pg_server.url(), namespace, "hammer", "hammered", str(HAMMER_ROUNDS), str(marker)]
    outputs = _go_and_collect(_start_hosts(args))
    assert [out.split() for out in outputs] == [["overlaps", "0"]] * WORKERS
