"""An owner this judge cannot see in ``/proc`` is not a dead one.

With ``/proc`` mounted ``hidepid=2`` (``invisible``), another user's processes have no entry a
judge can read: ``/proc/<pid>/stat`` of a live owner answered "no such process", the owner was
called not running, ``killpg``'s ``EPERM`` ("members exist, not ours") led to a scan that saw
none of them, and ``--reclaim-dead`` took the live lock: two holders. Now a pid ``/proc`` does
not show is asked with ``kill(pid, 0)`` (only ``ESRCH`` is "gone"), and a group that ``killpg``
says has members none of which this ``/proc`` shows is alive.

Fails before the fix: the judge (``nobody`` under ``hidepid=2``) prints ``WON`` in both tests.

Each runs twice: with the holder's proof of life, and with it switched off (the holder's
``proof.supported`` says no, as on a file system without open-file-description locks, or for an
older writer). With the proof the kernel answers alive before the pid rules are asked; only
the ``no-proof`` runs hold the pid rules themselves: they fail when ``kill``'s or ``killpg``'s
``EPERM`` is read as "gone", or when a group ``/proc`` hides is called empty.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Final

import pytest

from tests.concurrency._harness import RECLAIM_DEAD_JUDGE
from tests.support.marks import needs_hidepid, needs_proc

pytestmark = [needs_proc, needs_hidepid]

ANSWER_SECONDS: Final = 30
"""A hang guard only."""
NOBODY: Final = "65534"

HOLDER: Final = """
import os, sys
from mahabharatha import locks
from mahabharatha.owner import proof
if sys.argv[3] == "no-proof":  # a lock without a proof of life: the pid rules judge it
    proof.supported = lambda: False
if sys.argv[2] == "no-group":  # details naming no group or session: the pid alone speaks
    from mahabharatha.owner import ownership
    collect = ownership._collect
    bare = dict(gstart=None, pgid=None, sid=None)
    ownership._collect = lambda pid, cmd: collect(pid, cmd)._replace(**bare)
    ownership._own_details = lambda pid, pgrp: ownership._encode(ownership._collect(pid, None))
locks.acquire("feat", sys.argv[1])
if sys.argv[2] == "orphan":  # the owner ends, its group's other member (the child) works on
    if os.fork() == 0:
        sys.stdin.readline()
        os._exit(0)
    print("held", flush=True)
    os._exit(0)
print("held", flush=True)
sys.stdin.readline()
"""


def _hidden_judge(gsd: Path) -> list[str]:
    unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
    assert unshare is not None and setpriv is not None  # the mark says so
    judge = f"{setpriv} --reuid {NOBODY} --regid {NOBODY} --clear-groups"
    script = f'mount -t proc -o hidepid=2 proc /proc && exec {judge} "$0" -c "$1" "$2"'
    return [unshare, "--mount", "sh", "-c", script, sys.executable, RECLAIM_DEAD_JUDGE, str(gsd)]


PROOF = pytest.mark.parametrize("proof", ["proof", "no-proof"])


def _judged_by_a_hidden_judge(mode: str, proof: str = "proof") -> str:
    gsd = Path(tempfile.mkdtemp(prefix="mahabharatha-hidden-"))  # pytest's tmp_path is 0700
    try:
        return _judged_in(gsd, mode, proof)
    finally:
        shutil.rmtree(gsd)


def _judged_in(gsd: Path, mode: str, proof: str) -> str:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(gsd), mode, proof],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group: the judge's group is not the owner's
    )
    assert holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "held"  # synchronised by the pipe
        if mode == "orphan":
            holder.wait(timeout=ANSWER_SECONDS)  # the owner is gone; its child holds stdin
        subprocess.run(["chmod", "-R", "a+rwX", str(gsd)], check=True)
        done = subprocess.run(
            _hidden_judge(gsd), capture_output=True, text=True, timeout=ANSWER_SECONDS
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()
    finally:
        holder.communicate("\n", timeout=ANSWER_SECONDS)  # the child reads it and exits


@PROOF
def test_a_live_owner_hidden_by_hidepid_keeps_its_lock(proof: str) -> None:
    """The owner runs, hidden: ``kill(pid, 0)``'s ``EPERM`` says it exists."""
    assert _judged_by_a_hidden_judge("owner", proof) == "HELD"


def test_a_live_owner_whose_lock_names_no_group_keeps_it_when_hidden() -> None:
    """No proof and no group or session in the details (as an older writer's): the owner's
    own pid is all the judge has, and ``kill(pid, 0)``'s ``EPERM`` must say it exists. The
    other tests cannot tell that rule apart: the owner leads its group, whose ``killpg``
    ``EPERM`` keeps the lock alive on its own."""
    assert _judged_by_a_hidden_judge("no-group", "no-proof") == "HELD"


@PROOF
def test_a_group_member_hidden_by_hidepid_keeps_the_lock(proof: str) -> None:
    """The owner is gone, a hidden member of its group works on: ``killpg``'s ``EPERM`` with
    no member in view is a live group."""
    assert _judged_by_a_hidden_judge("orphan", proof) == "HELD"


def test_a_writer_that_cannot_see_its_short_lived_parent_records_the_workers_group() -> None:
    """Issue 16, item 5. Fails before the fix: a root worker ran the CLI as ``nobody`` through
    a short-lived parent; under ``hidepid=2`` the CLI could not read that parent's ``/proc``,
    so the owner details carried no group and no session; the parent exited, the owner was
    ``not-running``, and ``--reclaim-dead`` took the lock while the worker still worked.
    Now the group and session come from ``getpgid``/``getsid``, which ``hidepid`` does not hide."""
    from mahabharatha import locks

    unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
    assert unshare is not None and setpriv is not None  # the mark says so
    gsd = Path(tempfile.mkdtemp(prefix="mahabharatha-hidden-"))
    subprocess.run(["chmod", "a+rwx", str(gsd)], check=True)
    as_nobody = f"{setpriv} --reuid {NOBODY} --regid {NOBODY} --clear-groups"
    cli = f"{as_nobody} {sys.executable} -m mahabharatha lock acquire feat --gsd-dir {gsd}"
    # The worker (this shell, root) runs the CLI through a parent that exits right after it.
    script = f"mount -t proc -o hidepid=2 proc /proc && sh -c '{cli}; true' && echo held && read x"
    worker = subprocess.Popen(
        [unshare, "--mount", "sh", "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the worker's own group and session, not the test's
    )
    assert worker.stdout is not None
    try:
        assert worker.stdout.readline().startswith("acquired feat")  # the CLI's answer
        assert worker.stdout.readline().strip() == "held"  # the short-lived parent is gone
        assert locks.inspect("feat", gsd).owner == "work-running"
        try:
            locks.acquire("feat", gsd, reclaim_dead=True)
        except locks.LockHeldError:
            pass
        else:
            raise AssertionError("--reclaim-dead took the lock while the worker still worked")
    finally:
        worker.communicate("\n", timeout=ANSWER_SECONDS)
        shutil.rmtree(gsd)
