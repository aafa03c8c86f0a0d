"""Releasing by pid removes only a lock that pid can own: never the lock of a holder in another
PID namespace that has the same pid number (a container sharing the gsd folder), never a lock
whose recorded start time is not the one that pid runs with now (a dead owner's, its number
reused). Details missing: the pid alone decides (the legacy rule). ``--force`` removes anything.

Holders are real processes (pid 1 of a PID namespace of their own, ``unshare``); children
synchronise through their output lines and stdin, never by sleeping, and are reaped.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

from mahabharatha.commands._utils import acquire_feature_lock, release_feature_lock
from mahabharatha.owner import ownership
from tests.cli._support import (
    FEATURE,
    HOLD_CMD,
    UNSHARE_PID,
    cli_argv,
    lock_path,
    read_record,
    run_cli,
    run_in_new_pid_namespace,
    write_lock,
)
from tests.support.marks import needs_pid_namespaces, needs_proc
from tests.support.owner_details import details_for

PY: Final = sys.executable
LEGACY_HOLD: Final = (
    "import sys; from mahabharatha.commands._utils import acquire_feature_lock as a; "
    "print(a(sys.argv[1], sys.argv[2]), flush=True); sys.stdin.read(1)"
)
"""The legacy acquire of feature argv[1] in gsd argv[2]; prints its answer, then holds."""
LEGACY_RELEASE: Final = (
    "import os, sys; from mahabharatha.commands._utils import release_feature_lock as r; "
    "print(os.getpid(), r(sys.argv[1], sys.argv[2]), flush=True)"
)
"""The legacy release of feature argv[1] in gsd argv[2]; prints its pid and its answer."""


def _holder_in_new_namespace(spawn: Any, gsd: Path) -> Any:
    """A ``lock run`` that is pid 1 of its own PID namespace, holding FEATURE until told."""
    holder = spawn(
        [
            *UNSHARE_PID,
            *cli_argv("lock", "run", FEATURE, "--gsd-dir", gsd, "--", PY, "-c", HOLD_CMD),
        ],
        stdin=subprocess.PIPE,
    )
    assert holder.next_line() == "ready"
    assert read_record(lock_path(gsd))[0] == 1, "the namespace runner is pid 1 there"
    return holder


# --------------------------------------------------------------------------- another namespace


@needs_proc
@needs_pid_namespaces
def test_release_by_the_same_pid_number_elsewhere_leaves_the_lock(
    tmp_path: Path, gsd: Path, spawn: Any
) -> None:
    """A ``lock run`` is pid 1 of its own PID namespace and holds the lock. On the host,
    ``lock release --pid 1`` and ``lock done --pid 1`` exit 1 ("locked by pid 1") and leave it;
    a third process cannot acquire it while the holder runs; ``--force`` still removes it.

    Fails before the fix: ``release --pid 1`` exited 0 and removed the live lock (the record's
    pid alone decided), and the third acquire then won: two holders."""
    holder = _holder_in_new_namespace(spawn, gsd)
    before = lock_path(gsd).read_bytes()
    try:
        released = run_cli("lock", "release", FEATURE, "--gsd-dir", gsd, "--pid", 1, cwd=tmp_path)
        done = run_cli("lock", "done", FEATURE, "--gsd-dir", gsd, "--pid", 1, cwd=tmp_path)
        third = run_cli("lock", "acquire", FEATURE, "--gsd-dir", gsd, cwd=tmp_path)
        assert released.returncode == 1, released.stderr
        assert "locked by pid 1" in released.stderr, released.stderr
        assert done.returncode == 1 and "locked by pid 1" in done.stderr, done.stderr
        assert not (lock_path(gsd).parent / ".completed").exists(), "nothing marked done"
        assert third.returncode == 1, "a third holder beside the live one"
        assert lock_path(gsd).read_bytes() == before, "the holder's lock is untouched"
        forced = run_cli(
            "lock", "release", FEATURE, "--gsd-dir", gsd, "--pid", 1, "--force", cwd=tmp_path
        )
        assert forced.returncode == 0 and not lock_path(gsd).exists(), forced.stderr
    finally:
        holder.send("x")
        holder.wait()  # its lock was forced away: it may report the loss; it is reaped


@needs_proc
@needs_pid_namespaces
def test_legacy_release_by_pid_1_of_another_namespace_leaves_the_lock(
    tmp_path: Path, gsd: Path, spawn: Any
) -> None:
    """Two PID namespaces, pid 1 in each: the first holds the lock through
    ``acquire_feature_lock``; ``release_feature_lock`` in the second (``os.getpid()`` is 1
    there too) leaves it, and an acquire on the host fails while the holder runs.

    Fails before the fix: the second namespace's release removed the live lock (pid 1 == 1),
    and the host's acquire then won it: two holders."""
    holder = spawn([*UNSHARE_PID, PY, "-c", LEGACY_HOLD, FEATURE, str(gsd)], stdin=subprocess.PIPE)
    try:
        assert holder.next_line() == "True"
        assert read_record(lock_path(gsd))[0] == 1
        other = run_in_new_pid_namespace(PY, "-c", LEGACY_RELEASE, FEATURE, gsd, cwd=tmp_path)
        assert other.returncode == 0 and other.stdout.split() == ["1", "None"], other
        assert lock_path(gsd).exists(), "pid 1 of another namespace released the live lock"
        assert acquire_feature_lock(FEATURE, str(gsd)) is False, "two holders"
        assert read_record(lock_path(gsd))[0] == 1
    finally:
        holder.send("x")
        assert holder.wait() == 0, holder.stderr
    release_feature_lock(FEATURE, str(gsd))  # ours, if the bug let the host acquire it


@needs_proc
def test_details_of_another_namespace_are_not_this_pid(tmp_path: Path, gsd: Path) -> None:
    """A lock of this test's pid whose details name another PID namespace (as a container's
    holder with the same number would write it): ``lock release`` (default owner: its parent,
    this test) exits 1 and leaves it, so does the legacy release; ``--force`` removes it.

    Fails before the fix: both releases removed it (the pid alone decided)."""
    here = ownership.this_pid_namespace()
    assert here is not None
    elsewhere = details_for(os.getpid(), ns=here + 1)
    write_lock(gsd, pid=os.getpid(), timestamp=time.time(), details=elsewhere)
    released = run_cli("lock", "release", FEATURE, "--gsd-dir", gsd, cwd=tmp_path)
    assert released.returncode == 1, released.stderr
    assert f"locked by pid {os.getpid()}" in released.stderr, released.stderr
    release_feature_lock(FEATURE, str(gsd))
    assert lock_path(gsd).exists()
    forced = run_cli("lock", "release", FEATURE, "--gsd-dir", gsd, "--force", cwd=tmp_path)
    assert forced.returncode == 0 and not lock_path(gsd).exists(), forced.stderr


def test_a_lock_without_details_is_released_by_its_pid(tmp_path: Path, gsd: Path) -> None:
    """The legacy rule where nothing else is known (an older writer, no extended attributes):
    the record's pid decides. Passes before and after the fix (it guards the legacy rule)."""
    write_lock(gsd, content=f"{os.getpid()}:{time.time()}")
    released = run_cli("lock", "release", FEATURE, "--gsd-dir", gsd, cwd=tmp_path)
    assert released.returncode == 0 and not lock_path(gsd).exists(), released.stderr
    write_lock(gsd, content=f"{os.getpid()}:{time.time()}")
    release_feature_lock(FEATURE, str(gsd))
    assert not lock_path(gsd).exists()


# --------------------------------------------------------------------------- a reused pid


def _dead_owners_lock(gsd: Path, pid: int) -> None:
    """A lock of ``pid`` written by an earlier process with that number (another start time)."""
    stat = ownership.proc_stat(pid)
    assert stat is not None
    write_lock(gsd, pid=pid, timestamp=time.time(), details=details_for(pid, start=stat.start + 1))


@needs_proc
def test_a_dead_owners_lock_is_not_held_by_you(tmp_path: Path, gsd: Path) -> None:
    """The lock names this test's pid, but its details record another start time: its owner
    died and the number was reused. ``lock acquire`` (default owner: this test) answers busy
    ("locked by pid N"), not "already held by you".

    Fails before the fix: "already held by you" (the start time was not looked at)."""
    _dead_owners_lock(gsd, os.getpid())
    done = run_cli("lock", "acquire", FEATURE, "--gsd-dir", gsd, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "already held by you" not in done.stderr, done.stderr
    assert f"locked by pid {os.getpid()}" in done.stderr, done.stderr


@needs_proc
def test_a_dead_owners_lock_is_not_released_by_the_reused_pid(tmp_path: Path, gsd: Path) -> None:
    """The same dead owner's lock: ``lock release`` and ``lock done`` by the process that now
    has the number exit 1 and leave it; the legacy release leaves it too (it is not this
    process's lock; the contract removes only the caller's own).

    Fails before the fix: the release removed it (the pid alone decided)."""
    _dead_owners_lock(gsd, os.getpid())
    before = lock_path(gsd).read_bytes()
    released = run_cli("lock", "release", FEATURE, "--gsd-dir", gsd, cwd=tmp_path)
    assert released.returncode == 1, released.stderr
    done = run_cli("lock", "done", FEATURE, "--gsd-dir", gsd, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    release_feature_lock(FEATURE, str(gsd))
    assert lock_path(gsd).read_bytes() == before
