"""``bench/syscalls.py`` counts only the calls between its markers, per cycle, and tells a
metadata write (a create, link, unlink, xattr, fsync; only when it succeeded) from a plain call."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench import syscalls
from bench.contenders import CYCLES

TRACE = f"""\
4242  openat(AT_FDCWD, "/usr/lib/python3.11", O_RDONLY|O_CLOEXEC) = 3
4242  write(-1, "{syscalls.BEGIN}", 27) = -1 EBADF (Bad file descriptor)
4242  openat(AT_FDCWD, "/w/specs/f", O_WRONLY|O_CLOEXEC|O_TMPFILE, 0644) = 3
4242  fsetxattr(3, "user.mahabharatha", "x", 1, 0) = 0
4242  linkat(AT_FDCWD, "/proc/self/fd/3", AT_FDCWD, "/w/specs/f/.lock", AT_SYMLINK_FOLLOW) = 0
4242  mkdir("/w/specs", 0777) = -1 EEXIST (File exists)
4242  openat(AT_FDCWD, "/w/specs/f/.lock", O_RDONLY|O_NOFOLLOW|O_CLOEXEC) = 4
4242  unlinkat(AT_FDCWD, "/w/specs/f/.lock", 0) = 0
4242  write(-1, "{syscalls.END}", 25) = -1 EBADF (Bad file descriptor)
4242  unlink("/w/after") = 0
"""


def test_only_the_calls_between_the_markers_count_per_cycle() -> None:
    per_cycle, total, metadata = syscalls.count(TRACE, cycles=2)
    assert total == 3.0  # six calls in two cycles; the open before and the unlink after are out
    assert per_cycle["openat"] == 1.0
    # The O_TMPFILE open, the xattr, the link and the unlink; not the failed mkdir, not the read.
    assert metadata == 2.0


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_the_counter_runs_our_cycles_under_strace(tmp_path: Path) -> None:
    out = tmp_path / "syscalls.md"
    assert syscalls.main(["--cycles", "3", "--workdir", str(tmp_path), "--out", str(out)]) == 0
    rows = {line.split(" | ")[0].lstrip("| "): line for line in out.read_text().splitlines()}
    legacy = rows["ours: acquire_feature_lock + release_feature_lock"]
    assert "linkat" in legacy and "unlinkat" in legacy  # the publish and the release were seen


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_featurelock_release_reads_no_owner_details(tmp_path: Path) -> None:
    """Releasing the lock it published, a holder compares inode and bytes: the owner details
    are no part of that, so no ``fgetxattr`` (issue 30). Before: one ``fgetxattr`` a cycle
    (``per_cycle["fgetxattr"] == 1.0``); the acquire's look finds no lock and reads none."""
    cycle = next(c for c in CYCLES if c.key == "ours-context")
    per_cycle, _total, metadata = syscalls.count(syscalls.trace_cycle(cycle, tmp_path, 3), 3)
    assert per_cycle["linkat"] == 1.0 and per_cycle["unlinkat"] == 1.0  # a whole cycle was seen
    assert "fgetxattr" not in per_cycle and "getxattr" not in per_cycle
    assert metadata == 4.0  # the unnamed create, its details, the publish, the release
