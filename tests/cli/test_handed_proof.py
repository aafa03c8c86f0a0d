"""Work a ``FeatureLock`` holder starts without its descriptors (issue 26, item 2).

``multiprocessing`` workers of the ``spawn`` and ``forkserver`` start methods and ``subprocess``
children inherit no descriptor, so they did not hold the lock's proof of life: with the holder
SIGKILLed, its owner was judged dead while they still worked. Handed the proof
(``FeatureLock.proof_for_workers``, ``FeatureLock.proof_fds``), they keep the owner alive, and
once they end the lock is taken at once. The holder never leads its process group here (as in
the issue's runs): its group says nothing about it.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from pathlib import Path
from typing import Any, Final

import pytest

from mahabharatha import locks
from mahabharatha.owner import ownership, proof
from tests.cli._support import FEATURE, lock_path, read_record, run_cli, wait_for
from tests.support.marks import needs_proc

pytestmark = [
    needs_proc,
    pytest.mark.skipif(not proof.supported(), reason="no open-file-description locks here"),
]

EX_TEMPFAIL: Final = 75
ROOT: Final = Path(__file__).resolve().parents[2]


def holder(spawn: Any, gsd: Path, how: str) -> Any:
    """``tests.cli._handing_holder`` as a member (not the leader) of a group of its own."""
    return spawn(
        [
            "env", f"PYTHONPATH={ROOT}", "sh", "-c", '"$@" & wait', "sh",
            sys.executable, "-m", "tests.cli._handing_holder", str(gsd), how,
        ]
    )  # fmt: skip


def holder_pid(gsd: Path) -> int:
    return read_record(lock_path(gsd))[0]


def alive(pid: int) -> bool:
    return ownership.is_alive(ownership.proc_stat(pid), pid)


def reclaim(tmp_path: Path, gsd: Path) -> Any:
    return run_cli(
        "lock", "acquire", FEATURE, "--gsd-dir", gsd, "--reclaim-dead", "--pid", os.getpid(),
        cwd=tmp_path,
    )  # fmt: skip


@pytest.mark.parametrize("how", ["spawn", "forkserver", "pass-fds"])
def test_work_handed_the_proof_keeps_a_killed_holders_lock_until_it_ends(
    tmp_path: Path, gsd: Path, spawn: Any, how: str
) -> None:
    """Fails on 211f242: ``FeatureLock`` had no ``proof_for_workers``/``proof_fds``, and work
    started without descriptors held nothing: with the holder SIGKILLed the owner read
    ``not-running`` and ``--reclaim-dead`` took the feature while the workers ran."""
    first = holder(spawn, gsd, how)
    word, *work = first.next_line().split()
    assert word == "work" and work
    owner = holder_pid(gsd)
    assert owner != first.pid and os.getpgid(owner) == first.pid  # not its group's leader
    os.kill(owner, signal.SIGKILL)
    wait_for(lambda: not alive(owner), what="the holder to die")

    info = locks.inspect(FEATURE, gsd)
    assert (info.state, info.owner) == ("active", "work-running"), info
    refused = reclaim(tmp_path, gsd)
    assert refused.returncode != 0, refused.stdout
    assert holder_pid(gsd) == owner

    for pid in map(int, work):
        os.kill(pid, signal.SIGKILL)
    for pid in map(int, work):
        wait_for(lambda pid=pid: not alive(pid), what=f"worker {pid} to end")
    taken = reclaim(tmp_path, gsd)
    assert taken.returncode == 0, taken.stderr
    assert holder_pid(gsd) == os.getpid()


def test_the_handed_proof_is_one_per_hold_and_let_go_with_the_lock(gsd: Path) -> None:
    """A worker started after the release gets nothing to hold: there is no lock to vouch for
    (and a closed descriptor's number is never sent on)."""
    lock = locks.FeatureLock(FEATURE, gsd, heartbeat=None)
    assert len(lock.proof_fds) == 0
    with lock:
        held = lock.proof_fds
        assert len(held) == 1 and lock.proof_fds == held
        handed = lock.proof_for_workers()
    assert len(lock.proof_fds) == 0
    assert pickle.loads(pickle.dumps(handed)).fd is None
