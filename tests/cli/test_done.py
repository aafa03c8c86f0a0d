"""``lock done``, ``lock reopen``, ``claim`` skipping done features, ``status --all``.

The contract's "Worker pools: claim, done": the holder marks its feature done (marker first,
release second), ``claim`` never hands a done feature out (looked for again once it holds the
lock), and ``status --all`` shows free and done folders with a summary line.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from mahabharatha import clock, locks
from mahabharatha.owner import proof
from tests.cli import _hooked
from tests.cli._support import (
    RUN_TIMEOUT,
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


HOOK_FIRST_FILES_RELEASE = """
import os
from mahabharatha.backends.files import lockfile

_release_mine = lockfile.release_mine


def release_mine(*args, **kwargs):
    # The done's second step (the release), its marker published: say so, then wait to die.
    os.write(int(os.environ["HOOK_PAUSED_FD"]), b"paused\\n")
    os.read(int(os.environ["HOOK_GO_FD"]), 1)
    return _release_mine(*args, **kwargs)


lockfile.release_mine = release_mine
"""


def test_files_a_worker_killed_between_its_done_marker_and_release_is_not_run_again(
    tmp_path: Path,
) -> None:
    """Sound (a regression test, not a finding): the done's two steps on files, crossed by a
    `--reclaim-dead` worker. W's CMD succeeded and W published `.completed`; W is SIGKILLed
    before its release. The next worker (--reclaim-dead) sees the marker before it tries the
    dead holder's lock (pool/claim.py _Pool._finished): CMD is not run again, the pool ends 0.
    Fails if the done released before publishing its marker (the hook's look at .completed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAHABHARATHA_LOCK")}
    (tmp_path / ".gsd" / "specs" / "A").mkdir(parents=True)
    step = ["sh", "-c", 'echo "$0" >> runs.log', "{}"]
    with _hooked.hooked_cli(
        HOOK_FIRST_FILES_RELEASE, ["lock", "work", "A", "--", *step], tmp_path, env
    ) as (
        worker,
        paused,
        _go,
    ):
        assert paused.readline() == b"paused\n"
        assert (tmp_path / ".gsd" / "specs" / "A" / ".completed").exists()
        worker.kill()
        worker.communicate(timeout=RUN_TIMEOUT)
    again = subprocess.run(
        [*_hooked.CLI, "lock", "work", "A", "--reclaim-dead", "--", *step],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "runs.log").read_text().split() == ["A"]
    # Still marked done (its dead worker's lock is left for `lock clean`: status shows it
    # reclaimable, not done, until then).
    assert (tmp_path / ".gsd" / "specs" / "A" / ".completed").exists()
