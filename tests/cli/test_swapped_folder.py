"""A feature folder swapped for a copy (issue 26, item 3): the lock records which folder holds
its proof of life, and a judge that finds another folder at the path answers ``unknown``.

``cp -a`` keeps the lock file and its owner details (extended attributes) but not the kernel's
proof, which stays on the old folder held by the owner's work; judged in the copy, that owner
used to read ``not-running``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from mahabharatha import locks
from mahabharatha.owner import ownership, proof
from tests.cli._support import FEATURE, cli_argv, lock_path, read_record, run_cli, wait_for
from tests.support.marks import needs_proc

pytestmark = [
    needs_proc,
    pytest.mark.skipif(not proof.supported(), reason="no open-file-description locks here"),
    pytest.mark.skipif(shutil.which("cp") is None, reason="no cp here"),
]

JOB: Final = "import os, signal; print('job', os.getpid(), flush=True); signal.pause()"
"""Work that escapes ``lock run``'s group (started through ``setsid``) and runs until killed."""


@pytest.fixture
def escaped() -> Iterator[list[int]]:
    """Pids of escaped work, killed when the test ends."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        wait_for(lambda pid=pid: not alive(pid), what=f"job {pid} to end")


def alive(pid: int) -> bool:
    return ownership.is_alive(ownership.proc_stat(pid), pid)


def swap_in_a_copy(folder: Path) -> None:
    """``cp -a`` the folder, then put the copy in its place (two renames)."""
    copy, old = folder.with_name(folder.name + ".copy"), folder.with_name(folder.name + ".old")
    subprocess.run(["cp", "-a", str(folder), str(copy)], check=True)
    os.rename(folder, old)
    os.rename(copy, folder)


def test_a_folder_swapped_for_its_copy_never_makes_a_working_owner_dead(
    tmp_path: Path, gsd: Path, spawn: Any, escaped: list[int]
) -> None:
    """Fails on 211f242: the copy holds no proof, so the owner of the SIGKILLed ``lock run``
    read ``not-running`` and ``--reclaim-dead`` took the feature while its work ran."""
    first = spawn(
        cli_argv(
            "lock", "run", FEATURE, "--gsd-dir", gsd, "--", "setsid", sys.executable, "-c", JOB
        )
    )
    word, job = first.next_line().split()
    assert word == "job"
    escaped.append(int(job))
    owner = read_record(lock_path(gsd))[0]
    os.kill(owner, signal.SIGKILL)
    first.proc.wait(timeout=15)
    assert locks.inspect(FEATURE, gsd).owner == "work-running"

    swap_in_a_copy(gsd / "specs" / FEATURE)
    assert alive(int(job))
    refused = run_cli("lock", "acquire", FEATURE, "--gsd-dir", gsd, "--reclaim-dead", cwd=tmp_path)
    assert refused.returncode != 0, refused.stdout
    assert read_record(lock_path(gsd))[0] == owner
    assert locks.inspect(FEATURE, gsd).owner == "unknown"
