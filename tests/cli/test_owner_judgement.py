"""Who owns a lock, and when its owner is dead (issue 9, items 1, 3 and 4), with real processes.

A pid is judged dead only on the judge's own boot and PID namespace, as the owner details
published with the lock show; an owner lives while any process of its recorded process group
lives, and while any of its threads runs; ``lock run`` takes its command with it when it dies.
Children synchronise through their output lines and stdin, never by sleeping, and are reaped.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

import pytest

from mahabharatha import locks
from mahabharatha.owner import ownership
from tests.cli._support import (
    FEATURE,
    SYNC_TIMEOUT,
    Child,
    cli_argv,
    lock_path,
    one_document,
    read_record,
    run_cli,
    run_cli_in_new_pid_namespace,
    wait_for,
)
from tests.support.marks import needs_pid_namespaces, needs_proc

pytestmark = needs_proc

EX_TEMPFAIL: Final = 75


def wait_gone(pid: int, timeout: float = SYNC_TIMEOUT) -> None:
    """Wait until ``pid`` has ended (it need not be our child): a pidfd turns readable then."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        ready, _, _ = select.select([pidfd], [], [], timeout)
        assert ready, f"process {pid} still runs after {timeout}s"
    finally:
        os.close(pidfd)


def alive(pid: int) -> bool:
    return ownership.is_alive(ownership.proc_stat(pid), pid)


# --------------------------------------------------------------------------- item 1


FIRST_CMD: Final = (
    "import os, sys\n"
    "worker = os.fork()\n"
    "if worker == 0:  # CMD's own child: not killed with lock run, still in its group\n"
    "    sys.stdin.buffer.read(1)\n"
    "    with open(sys.argv[1], 'a') as out: out.write('first\\n')\n"
    "    os._exit(0)\n"
    "print(os.getpid(), worker, flush=True)\n"
    "sys.stdin.buffer.read(1)\n"
)
"""``lock run``'s first command: it and its child wait on stdin; the child then writes."""

SECOND_CMD: Final = "import sys\nwith open(sys.argv[1], 'a') as out: out.write('second\\n')\n"


def _second_lock_run(tmp_path: Path, gsd: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(
        "lock", "run", FEATURE, "--gsd-dir", gsd, "--reclaim-dead", "--timeout", "0",
        "--", sys.executable, "-c", SECOND_CMD, out,
        cwd=tmp_path,
    )  # fmt: skip


def test_a_sigkilled_lock_run_takes_its_command_along_and_its_group_keeps_the_lock(
    tmp_path: Path, gsd: Path, spawn: Any
) -> None:
    """Fails before the fix: CMD outlived the SIGKILLed ``lock run`` (no parent-death signal),
    and ``lock run --reclaim-dead`` started its command at once because the recorded pid was
    dead, while the first command's child was still going to write. Since the proof of life
    the owner is ``work-running`` (its pid is gone, the child holds the command's proof)."""
    out = tmp_path / "out.txt"
    first = spawn(
        cli_argv(
            "lock",
            "run",
            FEATURE,
            "--gsd-dir",
            gsd,
            "--",
            sys.executable,
            "-c",
            FIRST_CMD,
            out,
        ),
        stdin=subprocess.PIPE,
    )  # fmt: skip  (its own session: lock run leads the group CMD stays in)
    cmd_pid, worker_pid = map(int, first.next_line().split())
    os.kill(first.pid, signal.SIGKILL)
    first.proc.wait(timeout=SYNC_TIMEOUT)

    wait_gone(cmd_pid)  # the parent-death signal ended CMD with lock run
    assert alive(worker_pid), "the command's own child was not meant to be killed"
    info = locks.inspect(FEATURE, gsd)
    assert (info.state, info.owner) == ("active", "work-running"), info
    blocked = _second_lock_run(tmp_path, gsd, out)
    assert blocked.returncode == EX_TEMPFAIL, blocked.stderr
    assert not out.exists(), "the second command ran while the first one's group worked"

    first.send("x")  # the first command's child writes and ends
    wait_gone(worker_pid)
    wait_for(lambda: not ownership.group_has_live_member(first.pid, None), what="group end")
    taken = _second_lock_run(tmp_path, gsd, out)
    assert taken.returncode == 0, taken.stderr
    assert out.read_text() == "first\nsecond\n"


HOLDS_THEN_DIES: Final = (
    "import os, sys\n"
    "from mahabharatha import locks\n"
    "sibling = os.fork()\n"
    "if sibling == 0:  # same process group, outlives the owner\n"
    "    sys.stdin.buffer.read(1)\n"
    "    os._exit(0)\n"
    "locks.acquire(sys.argv[1], sys.argv[2])\n"
    "print(sibling, flush=True)\n"
    "os._exit(0)  # the owner dies holding the lock\n"
)


def test_an_owner_whose_process_group_lives_on_is_not_dead(
    tmp_path: Path, gsd: Path, spawn: Any
) -> None:
    """Fails before the fix: only the recorded pid was asked, so the lock of an owner that died
    while a process of its group still ran was judged ``not-running`` and reclaimed. The owner
    led its group (``spawn`` starts it in a session of its own), so with the proof of life the
    group still counts: ``work-running`` (never ``running`` for a dead pid)."""
    owner = spawn([sys.executable, "-c", HOLDS_THEN_DIES, FEATURE, gsd], stdin=subprocess.PIPE)
    sibling = int(owner.next_line())
    owner.proc.wait(timeout=SYNC_TIMEOUT)
    assert read_record(lock_path(gsd))[0] == owner.pid

    assert locks.inspect(FEATURE, gsd).owner == "work-running"
    refused = run_cli("lock", "acquire", FEATURE, "--gsd-dir", gsd, "--reclaim-dead", cwd=tmp_path)
    assert refused.returncode == 1, refused.stderr
    with pytest.raises(locks.LockHeldError):
        locks.acquire(FEATURE, gsd, reclaim_dead=True)

    owner.send("x")
    wait_gone(sibling)
    wait_for(lambda: not ownership.group_has_live_member(owner.pid, None), what="group end")
    assert locks.inspect(FEATURE, gsd).owner == "not-running"
    taken = run_cli("lock", "acquire", FEATURE, "--gsd-dir", gsd, "--reclaim-dead", cwd=tmp_path)
    assert taken.returncode == 0, taken.stderr


# --------------------------------------------------------------------------- item 3


MAIN_THREAD_EXITS: Final = (
    "import ctypes, os, sys, threading\n"
    "from mahabharatha import locks\n"
    "taken = threading.Event()\n"
    "def work():\n"
    "    held = locks.FeatureLock(sys.argv[1], sys.argv[2], heartbeat=None, timeout=0)\n"
    "    held.acquire()\n"
    "    taken.set()\n"
    "    print('held', flush=True)\n"
    "    sys.stdin.buffer.read(1)\n"
    "    other = locks.FeatureLock('other', sys.argv[2], heartbeat=None, timeout=0)\n"
    "    other.acquire()  # published by a thread of a process whose main thread is gone\n"
    "    other.release()\n"
    "    held.release()\n"
    "    print('released', flush=True)\n"
    "    os._exit(0)\n"
    "threading.Thread(target=work).start()\n"
    "taken.wait()\n"
    "ctypes.CDLL(None).pthread_exit(None)  # the main thread ends; the worker runs on\n"
)


def test_a_process_whose_main_thread_exited_still_owns_its_lock(
    tmp_path: Path, gsd: Path, spawn: Any
) -> None:
    """Fails before the fix: psutil shows the thread-group leader as a zombie, so ``status``
    said ``not-running`` and ``acquire --reclaim-dead`` took the lock of a live worker thread;
    and a lock taken after the main thread exited failed (``/proc/self/fd`` is gone then)."""
    holder = spawn([sys.executable, "-c", MAIN_THREAD_EXITS, FEATURE, gsd], stdin=subprocess.PIPE)
    assert holder.next_line() == "held"
    wait_for(lambda: _leader_state(holder.pid) == "Z", what="the main thread to exit")

    status = run_cli("lock", "status", "--gsd-dir", gsd, "--json", cwd=tmp_path)
    [document] = one_document(status.stdout)["features"]
    assert (document["pid"], document["owner"]) == (holder.pid, "running")
    refused = run_cli("lock", "acquire", FEATURE, "--gsd-dir", gsd, "--reclaim-dead", cwd=tmp_path)
    assert refused.returncode == 1, refused.stderr
    assert read_record(lock_path(gsd))[0] == holder.pid

    holder.send("x")
    assert holder.next_line() == "released"
    assert holder.wait() == 0
    assert not lock_path(gsd).exists()


def _leader_state(pid: int) -> str | None:
    stat = ownership.proc_stat(pid)
    return None if stat is None else stat.state


# --------------------------------------------------------------------------- item 4


@needs_pid_namespaces
@pytest.mark.parametrize("how", ["feature-lock", "lock-run"])
def test_a_judge_in_another_pid_namespace_never_takes_a_live_hosts_lock(
    tmp_path: Path, gsd: Path, spawn: Any, how: str
) -> None:
    """Fails before the fix: inside a new PID namespace the host's pid does not exist, so it
    was judged ``not-running`` and ``acquire --reclaim-dead`` took the live host's lock. With
    the proof of life the kernel answers across namespaces: ``running``, never taken."""
    if how == "feature-lock":
        holder = locks.FeatureLock(FEATURE, gsd, heartbeat=None)
        held: Child | locks.FeatureLock = holder.acquire()
        owner = os.getpid()
    else:
        child: Child = spawn(
            cli_argv(
                "lock", "run", FEATURE, "--gsd-dir", gsd, "--",
                sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read(1)",
            ),
            stdin=subprocess.PIPE,
        )  # fmt: skip
        assert child.next_line() == "ready"
        owner, held = child.pid, child
    try:
        status = run_cli_in_new_pid_namespace(
            "lock", "status", "--gsd-dir", gsd, "--json", cwd=tmp_path
        )
        [document] = one_document(status.stdout)["features"]
        assert (document["pid"], document["owner"]) == (owner, "running"), status.stderr
        taken = run_cli_in_new_pid_namespace(  # --pid 1: our parent is outside the namespace
            "lock",
            "acquire",
            FEATURE,
            "--gsd-dir",
            gsd,
            "--reclaim-dead",
            "--pid",
            "1",
            cwd=tmp_path,
        )
        assert taken.returncode == 1, taken.stderr
        assert read_record(lock_path(gsd))[0] == owner
    finally:
        if isinstance(held, locks.FeatureLock):
            held.release()
