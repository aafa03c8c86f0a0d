"""``lock done``, ``lock reopen``, ``claim`` skipping done features, ``status --all``.

The contract's "Worker pools: claim, done": the holder marks its feature done (marker first,
release second), ``claim`` never hands a done feature out (looked for again once it holds the
lock), and ``status --all`` shows free and done folders with a summary line.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from mahabharatha import clock, locks
from mahabharatha.owner import proof
from tests.cli._support import (
    STATUS_KEYS,
    invoke,
    lock_path,
    one_document,
    one_sentence,
    write_lock,
)
from tests.concurrency._harness import CTX, SYNC_TIMEOUT, trials
from tests.support.marks import needs_symlinks

ISO_UTC = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")
ME = os.getpid()


def marker(gsd: Path, feature: str) -> Path:
    return gsd / "specs" / feature / ".completed"


def folders(gsd: Path, *names: str) -> None:
    for name in names:
        (gsd / "specs" / name).mkdir(parents=True, exist_ok=True)


def test_done_writes_an_iso_marker_then_releases(gsd: Path) -> None:
    """Fails before the fix: there was no ``lock done`` command (usage error, exit 2)."""
    assert invoke("lock", "acquire", "f1", "--gsd-dir", gsd, "--pid", ME).exit_code == 0
    result = invoke("lock", "done", "f1", "--gsd-dir", gsd, "--pid", ME, "--json")
    assert result.exit_code == 0, result.output
    document = one_document(result.stdout)
    assert document["done"] is True and document["feature"] == "f1"
    assert ISO_UTC.fullmatch(marker(gsd, "f1").read_text().strip())
    assert not lock_path(gsd, "f1").exists()
    left = sorted(p.name for p in (gsd / "specs" / "f1").iterdir())
    assert left == [".completed", proof.proof_name(os.getuid())]  # no temp; our proof's file


@pytest.mark.parametrize("holder", [None, 1])
def test_done_by_a_non_holder_exits_1_and_writes_nothing(gsd: Path, holder: int | None) -> None:
    """No lock, or another owner's lock: exit 1, no marker, the lock left as it was.
    Fails before the fix: no ``lock done`` command."""
    folders(gsd, "f1")
    if holder is not None:
        write_lock(gsd, "f1", pid=holder, timestamp=clock.now())
    before = lock_path(gsd, "f1").read_text() if holder else None
    result = invoke("lock", "done", "f1", "--gsd-dir", gsd, "--pid", ME)
    assert result.exit_code == 1
    assert "done" in one_sentence(result.stderr) or "locked by pid 1" in result.stderr
    assert not marker(gsd, "f1").exists()
    assert (lock_path(gsd, "f1").read_text() if holder else None) == before
    assert [p.name for p in (gsd / "specs" / "f1").iterdir()] == ([".lock"] if holder else [])


@needs_symlinks
def test_done_replaces_a_symlink_at_the_marker_never_writes_through_it(
    gsd: Path, tmp_path: Path
) -> None:
    """The marker is renamed into place: a link at its name is replaced, its target untouched.
    Fails before the fix: no ``lock done`` command."""
    target = tmp_path / "victim"
    target.write_text("precious")
    folders(gsd, "f1")
    marker(gsd, "f1").symlink_to(target)
    assert invoke("lock", "acquire", "f1", "--gsd-dir", gsd, "--pid", ME).exit_code == 0
    assert invoke("lock", "done", "f1", "--gsd-dir", gsd, "--pid", ME).exit_code == 0
    assert target.read_text() == "precious"
    assert not marker(gsd, "f1").is_symlink()


def test_claim_skips_done_features_and_include_done_turns_that_off(gsd: Path) -> None:
    """Fails before the fix: claim handed a done (or any released) feature out again."""
    folders(gsd, "a", "b")
    assert invoke("lock", "claim", "--gsd-dir", gsd, "--pid", ME).stdout.strip() == "a"
    assert invoke("lock", "done", "a", "--gsd-dir", gsd, "--pid", ME).exit_code == 0
    assert invoke("lock", "claim", "--gsd-dir", gsd, "--pid", ME).stdout.strip() == "b"
    assert invoke("lock", "done", "b", "--gsd-dir", gsd, "--pid", ME).exit_code == 0
    assert invoke("lock", "claim", "--gsd-dir", gsd, "--pid", ME).exit_code == 1
    again = invoke("lock", "claim", "--include-done", "--gsd-dir", gsd, "--pid", ME)
    assert again.stdout.strip() == "a"


def test_claim_looks_for_the_marker_again_once_it_holds_the_lock(
    gsd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The marker may appear between claim's first look and its acquire (a worker finishing
    it just then); the look made under the lock must catch it and give the lock back.
    Fails before the fix: claim returned the done feature."""
    folders(gsd, "a")
    locks.acquire("a", gsd, pid=ME)
    locks.done("a", gsd, pid=ME)
    # The first look misses it:
    monkeypatch.setattr(locks, "is_done", lambda *_args, **_kwargs: False)
    assert locks.claim(None, gsd, pid=ME) is None
    assert not lock_path(gsd, "a").exists()  # the lock taken to look was given back


def test_reopen_removes_the_marker_and_leaves_a_held_lock_held(gsd: Path) -> None:
    """Fails before the fix: no ``lock reopen`` command."""
    folders(gsd, "a")
    locks.acquire("a", gsd, pid=ME)
    locks.done("a", gsd, pid=ME)
    locks.acquire("a", gsd, pid=ME)
    result = invoke("lock", "reopen", "a", "--gsd-dir", gsd, "--json")
    assert result.exit_code == 0 and one_document(result.stdout)["reopened"] is True
    assert not marker(gsd, "a").exists()
    assert locks.inspect("a", gsd).state == "active"
    assert invoke("lock", "reopen", "a", "--gsd-dir", gsd).exit_code == 0  # nothing to do: fine


def test_status_all_lists_free_and_done_folders_with_a_summary(gsd: Path) -> None:
    """Fails before the fix: ``--all`` did not exist and status showed only lock entries."""
    folders(gsd, "done1", "free1", "held1", "stale1")
    locks.acquire("done1", gsd, pid=ME)
    locks.done("done1", gsd, pid=ME)
    locks.acquire("held1", gsd, pid=ME)
    write_lock(gsd, "stale1", pid=ME, timestamp=1000.0)
    document = one_document(invoke("lock", "status", "--all", "--json", "--gsd-dir", gsd).stdout)[
        "features"
    ]
    assert {entry["feature"]: entry["state"] for entry in document} == {
        "done1": "done",
        "free1": "free",
        "held1": "active",
        "stale1": "stale",
    }
    assert all(set(entry) == STATUS_KEYS for entry in document)
    plain = one_document(invoke("lock", "status", "--json", "--gsd-dir", gsd).stdout)["features"]
    assert [entry["feature"] for entry in plain] == ["held1", "stale1"]
    human = invoke("lock", "status", "--all", "--gsd-dir", gsd).stdout.strip().splitlines()
    assert human[-1] == "4 features: 1 done, 1 held, 1 free, 0 failed, 1 stale"


# --------------------------------------------------------------------------- the race


def _worker(gsd: str, log: str, barrier: object) -> None:
    """Claim, record, mark done, until nothing is left (a pool worker without the build)."""
    barrier.wait(SYNC_TIMEOUT)  # type: ignore[attr-defined,unused-ignore]
    me = os.getpid()
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    while (feature := locks.claim(None, gsd, pid=me)) is not None:
        os.write(fd, f"{feature}\n".encode())  # O_APPEND: one small write, never interleaved
        locks.done(feature, gsd, pid=me)
    os.close(fd)


@pytest.mark.parametrize("workers", [2, 4])
def test_a_done_feature_is_never_claimed_again_by_racing_workers(
    tmp_path: Path, workers: int
) -> None:
    """Real processes claim and finish features at once, released features racing fresh
    claims: every feature is claimed exactly once and the pool ends.
    Fails before the fix: a released feature was free again at once and claimed again."""
    for round_ in range(max(1, trials(40) // 10)):
        gsd = tmp_path / f"round-{round_}"
        names = [f"f{i:02d}" for i in range(12)]
        folders(gsd, *names)
        log = tmp_path / f"claims-{round_}.log"
        log.touch()
        barrier = CTX.Barrier(workers)
        team = [
            CTX.Process(target=_worker, args=(str(gsd), str(log), barrier)) for _ in range(workers)
        ]
        for process in team:
            process.start()
        try:
            for process in team:
                process.join(SYNC_TIMEOUT)
                assert process.exitcode == 0, "a worker failed or the pool never ended"
        finally:
            for process in team:
                if process.is_alive():
                    process.kill()
                process.join()
        claimed = log.read_text().split()
        assert sorted(claimed) == names, claimed
        assert not any(lock_path(gsd, name).exists() for name in names)
