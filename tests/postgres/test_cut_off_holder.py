"""A cut-off holder stops before its lease can be given away (issue 27 item 3).

``lock run``'s link to the server freezes at its first refresh (no answer, no reset: a proxy
that swallows everything once the refresh is sent). Its CMD ignores SIGTERM (one that finishes
its step first) and appends a tick to an occupancy file every 10 ms. The test is the next
holder: it takes the lock the moment the server lets it (the lease ran out by the server's
clock) and appends ``NEXT``. No tick may follow: CMD must be gone before the lock can be given
away, whatever the network does."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mahabharatha.backends.base import Requester
from mahabharatha.backends.postgres.backend import PostgresBackend
from tests.support.postgres import FreezingProxy, PgServer, wait_until

REPO = Path(__file__).resolve().parents[2]
LEASE_SECONDS = 8
"""``lock run --lease``: refreshed every 2.7 s; cut off 2 s before its end (a quarter)."""
HANG_GUARD_SECONDS = 60.0
TICKING_CMD = 'trap "" TERM; while :; do echo tick >> occupancy; sleep 0.01; done'


@pytest.fixture
def frozen_at_refresh(pg_server: PgServer) -> Iterator[FreezingProxy]:
    """A link that freezes for good once the client sends a refresh."""
    proxy = FreezingProxy(pg_server.port, freeze_on=b"SET refreshed_at = now(), expires_at")
    yield proxy
    proxy.close()


def test_a_holder_whose_link_froze_has_ended_cmd_before_the_next_holder_starts(
    pg_server: PgServer, frozen_at_refresh: FreezingProxy, namespace: str, tmp_path: Path
) -> None:
    """Failed before: the loss was noticed only when a refresh failed after the lease had
    run out, and CMD then had 10 s of grace: the next holder started while CMD kept ticking
    (for 10 s here: it ignores SIGTERM)."""
    occupancy = tmp_path / "occupancy"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen(
        [sys.executable, "-m", "mahabharatha", "lock", "run", "f",
         "--backend", frozen_at_refresh.url(), "--namespace", namespace,
         "--lease", str(LEASE_SECONDS), "--connect-timeout", "1", "--",
         "sh", "-c", TICKING_CMD],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    next_holder = PostgresBackend(pg_server.url(), namespace=namespace)
    try:
        assert wait_until(occupancy.exists, HANG_GUARD_SECONDS)  # CMD runs: the lock is held
        ends = time.monotonic() + HANG_GUARD_SECONDS
        while next_holder.try_acquire("f", Requester(os.getpid())).held is None:
            assert time.monotonic() < ends, "the lease never ran out"
            time.sleep(0.01)
        with occupancy.open("a") as mark:
            mark.write("NEXT\n")  # the next holder starts its work now
        _, stderr = holder.communicate(timeout=HANG_GUARD_SECONDS)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.communicate()
        next_holder.release("f", os.getpid(), force=True)
        next_holder.close()
    assert frozen_at_refresh.frozen.is_set()
    said = stderr.decode(errors="replace")
    lines = occupancy.read_text().splitlines()
    after = lines[lines.index("NEXT") + 1 :]
    assert after == [], f"{len(after)} ticks of the old CMD after the next holder started"
    assert holder.returncode == 76, said[-400:]
