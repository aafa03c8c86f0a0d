"""A cut-off holder stops before its lease can be given away (issue 27 item 3).

``lock run``'s (and ``lock work``'s) link to the server freezes at its first refresh (no
answer, no reset: a proxy that swallows everything once the refresh is sent). Its CMD ignores
SIGTERM (one that finishes its step first) and appends a tick to an occupancy file every 10 ms.
The test is the next holder: it takes the lock the moment the server lets it (the lease ran out
by the server's clock) and appends ``NEXT``. No tick may follow: CMD must be gone before the
lock can be given away, whatever the network does. An ``AsyncFeatureLock`` on such a link is
told of the loss before its lease ends too (its heartbeat is a task, not a thread)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mahabharatha import locks
from mahabharatha.aio import AsyncFeatureLock
from mahabharatha.backends.base import Requester
from mahabharatha.backends.postgres.backend import PostgresBackend
from tests.support.postgres import FreezingProxy, PgServer, wait_until

REPO = Path(__file__).resolve().parents[2]
LEASE_SECONDS = 8
"""``lock run --lease``: refreshed every 2.7 s; cut off 2 s before its end (a quarter)."""
HANG_GUARD_SECONDS = 60.0
ASYNC_LEASE_SECONDS = 3.0
"""The async holder's lease: refreshed every second, cut off 0.75 s before its end."""
FROZEN_REFRESH_SECONDS = 3.0
"""``connect_timeout``: a refresh frozen at 1 s gives up past the lease's end (3 s)."""
TICKING_CMD = 'trap "" TERM; while :; do echo tick >> occupancy; sleep 0.01; done'
WORK_WITH_LEASE = (
    "import sys; from mahabharatha.backends.postgres.backend import PostgresBackend; "
    f"PostgresBackend.run_lease = {LEASE_SECONDS}.0; from mahabharatha.cli import main; main()"
)
"""``lock work``, whose lease is the backend's ``run_lease`` (no ``--lease``), at the test's."""
HOLDERS = {
    "run": ("-m", "mahabharatha", "lock", "run", "f", "--lease", str(LEASE_SECONDS)),
    "work": ("-c", WORK_WITH_LEASE, "lock", "work", "f", "--once"),
}


@pytest.fixture
def frozen_at_refresh(pg_server: PgServer) -> Iterator[FreezingProxy]:
    """A link that freezes for good once the client sends a refresh."""
    proxy = FreezingProxy(pg_server.port, freeze_on=b"SET refreshed_at = now(), expires_at")
    yield proxy
    proxy.close()


@pytest.mark.parametrize("command", HOLDERS)
def test_a_holder_whose_link_froze_has_ended_cmd_before_the_next_holder_starts(
    command: str,
    pg_server: PgServer,
    frozen_at_refresh: FreezingProxy,
    namespace: str,
    tmp_path: Path,
) -> None:
    """Failed before: the loss was noticed only when a refresh failed after the lease had
    run out, and CMD then had 10 s of grace: the next holder started while CMD kept ticking
    (for 10 s here: it ignores SIGTERM). ``work`` failed so until d644adc: a pool worker's
    lock (its heartbeat the worker's, shared) got no cut-off at all."""
    occupancy = tmp_path / "occupancy"
    (tmp_path / ".gsd" / "specs" / "f").mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen(
        [sys.executable, *HOLDERS[command],
         "--backend", frozen_at_refresh.url(), "--namespace", namespace,
         "--connect-timeout", "1", "--", "sh", "-c", TICKING_CMD],
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
    assert "lost" in said, said[-400:]
    if command == "run":  # lock work --once exits with CMD's code (KILLed here: 137)
        assert holder.returncode == 76, said[-400:]


def test_a_pool_claims_deadline_runs_from_when_its_claim_was_sent(
    pg_server: PgServer, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claimed lock's cut-off counts its lease from the claim's send, not from its answer,
    which comes after the server's ``now()`` by a commit's fsync and a descheduled client:
    later than the SIGKILL's 2.2 s margin under load, and the cut-off then fell after the
    server's expiry. Failed before: a claim's ``Held.sent`` was None (the deadline ran from
    the answer's arrival), so ``PoolLock``'s deadline was past ``sent + lease``."""
    answered: list[float] = []
    won = PostgresBackend._won

    def noted(self: PostgresBackend, *args: object, **kwargs: object) -> object:
        answered.append(time.monotonic())  # the answer is in: later than the server's now()
        return won(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(PostgresBackend, "_won", noted)
    store = PostgresBackend(pg_server.url(), namespace=namespace)
    asked = time.monotonic()
    held = locks.claim_held(["f"], tmp_path / ".gsd", backend=store, lease=LEASE_SECONDS)
    assert held is not None
    lock = locks.PoolLock(
        held, tmp_path / ".gsd", backend=store, heartbeat=None, command=None, lease=None
    )
    lock.acquire()
    try:
        assert held.sent is not None and asked <= held.sent <= answered[-1]
        assert lock._deadline == pytest.approx(held.sent + LEASE_SECONDS, abs=1e-3)
    finally:
        lock.finish(None, None, 1)
        store.close()


def test_an_async_holder_whose_link_froze_is_told_before_its_lease_ends(
    frozen_at_refresh: FreezingProxy, namespace: str, tmp_path: Path
) -> None:
    """``AsyncFeatureLock`` keeps ``FeatureLock``'s cut-off: with its first refresh frozen,
    ``on_lost`` is called while the lease still runs, and ``held`` turns False because the
    lock was declared lost (never by the lease running out unannounced). Failed before:
    ``held`` turned False at the lease's end with ``lost`` unset, the loss told only once the
    frozen refresh gave up (``connect_timeout`` later)."""
    events: list[tuple[str, bool]] = []

    async def main() -> None:
        store = PostgresBackend(
            frozen_at_refresh.url(), namespace=namespace, connect_timeout=FROZEN_REFRESH_SECONDS
        )
        lock = AsyncFeatureLock(
            "f",
            tmp_path,
            backend=store,
            timeout=0,
            lease=ASYNC_LEASE_SECONDS,
            on_lost=lambda _error: events.append(("told, lease running", lease_running())),
        )

        def lease_running() -> bool:
            return lock.expires_at is not None and time.time() < lock.expires_at

        try:
            async with lock:
                async with asyncio.timeout(HANG_GUARD_SECONDS):
                    while lock.held:
                        await asyncio.sleep(0.005)
                events.append(("not held, lost", lock.lost is not None))
        finally:
            store.close()

    asyncio.run(main())
    assert frozen_at_refresh.frozen.is_set()
    assert events == [("told, lease running", True), ("not held, lost", True)]
