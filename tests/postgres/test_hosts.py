"""Workers as simulated hosts (own UTS and PID namespaces, reaching the server through its Unix
socket, or through PgBouncer on the loopback): a claim storm over one namespace hands every
feature out once, on each claim statement; a mutual-exclusion hammer never overlaps.

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
FEATURES = 200 * STRESS
"""Per storm: enough that without the sorted claim's row lock two hosts win one feature in
every run of the pooler route (``tools/mutants.toml``)."""
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


@pytest.mark.parametrize("route", ["direct", "pooler"])
def test_claim_storm_hands_every_feature_out_once(
    route: str, pooler: str, pg_server: PgServer, namespace: str, tmp_path: Any
) -> None:
    """Eight hosts (each its own host name and pid numbers) claim from ONE namespace's list at
    once, each marking what it won done: every feature is won by exactly one host (the
    occupancy invariant), and every mark finds its lock still the host's. ``direct`` runs the
    registered claim; ``pooler`` (PgBouncer, transaction mode) runs the sorted claim statement.
    Issue 31 items 1 and 9: before the route was a parameter no host ever ran that statement;
    without its ``FOR UPDATE ... SKIP LOCKED`` two hosts win one feature (``pooler`` fails)."""
    names = tmp_path / "features"
    features = [f"f{index:05d}" for index in range(FEATURES)]
    names.write_text("\n".join(features))
    url = pooler if route == "pooler" else pg_server.url()
    workers = _start_hosts([url, namespace, "claim", str(names)])
    lines = [line.split() for out in _go_and_collect(workers) for line in out.splitlines()]
    claimed = Counter(words[0] for words in lines if len(words) == 1)
    twice = sorted(feature for feature, times in claimed.items() if times > 1)
    assert twice == [], f"won by two hosts at once: {twice}"
    assert sorted(claimed) == features
    assert [words for words in lines if len(words) != 1] == [], "a mark found its lock taken"


def test_mutual_exclusion_hammer_never_overlaps(
    pg_server: PgServer, namespace: str, tmp_path: Any
) -> None:
    marker = tmp_path / "inside"
    args = [pg_server.url(), namespace, "hammer", "hammered", str(HAMMER_ROUNDS), str(marker)]
    outputs = _go_and_collect(_start_hosts(args))
    assert [out.split() for out in outputs] == [["overlaps", "0"]] * WORKERS
