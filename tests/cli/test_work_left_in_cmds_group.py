"""Work that drops the proof of life but stays in CMD's group (issue 26, item 1).

A Python CMD that starts a child with ``subprocess.Popen`` (descriptors closed by default), or a
shell script whose ``exec N>>log`` reuses the proof's descriptor, leaves work that holds no
proof but still runs in the process group ``lock run`` made for CMD. That group is the owner's
work too: ``lock run`` releases only once the proof is free *and* the group is empty, and the
group is recorded with the lock so that the judge of a SIGKILLed ``lock run`` counts it. The
invariant: while that work runs nobody else gets the feature (a second ``lock run
--reclaim-dead`` would write a marker). Children synchronise through their output lines, their
stdin and ``/proc``; every process a test starts is ended and reaped.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any, Final

import pytest

from mahabharatha import constants
from mahabharatha.owner import ownership, proof
from tests.cli._support import FEATURE, SYNC_TIMEOUT, cli_argv, lock_path, wait_for
from tests.cli.test_proof_of_life import (
    EX_TEMPFAIL,
    JOB,
    alive,
    assert_nobody_else_gets_it,
    job_pid,
    second_run,
    wait_gone,
)
from tests.support.marks import needs_proc

pytestmark = [
    needs_proc,
    pytest.mark.skipif(not proof.supported(), reason="no open-file-description locks here"),
]

POPEN_THEN_EXIT: Final = (
    "import subprocess, sys\n"
    "subprocess.Popen([sys.executable, '-c', sys.argv[1]])  # close_fds: no proof for it\n"
)
"""CMD: starts the job in its own group without the proof (Python's default), and exits."""

POPEN_THEN_WAIT: Final = POPEN_THEN_EXIT + "sys.stdin.buffer.read()\n"
"""CMD: the same, but stays until ``lock run`` dies (its parent-death signal ends it)."""

SHELL_NUMBERS_THEN_SETSID: Final = (
    'for n in 3 4 5 6 7 8 9; do eval "exec $n>>\\"\\$0\\""; done\nsetsid -f "$1" -c "$2"\n'
)
"""CMD: a shell script that opens its logs on every number from 3 to 9 (closing whatever was
there), then starts the job out of its group and session (``setsid -f``) and ends: only the
proof can vouch for the job."""


@pytest.fixture
def grace(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A grace longer than any test step: ``lock run`` waits for the job, not the clock."""
    monkeypatch.setenv(constants.GRACE_ENV, "60")
    yield


@pytest.fixture
def jobs() -> Iterator[list[int]]:
    """Jobs that may outlive every group the test reaps: killed at the end."""
    started: list[int] = []
    yield started
    for pid in started:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        wait_gone(pid)


def first_run(spawn: Any, gsd: Path, *cmd: str) -> Any:
    return spawn(
        cli_argv("lock", "run", FEATURE, "--gsd-dir", gsd, "--", *cmd), stdin=subprocess.PIPE
    )


def _kill_lock_run_once_recorded(first: Any, gsd: Path, job: int) -> None:
    """SIGKILL ``lock run`` once CMD's group is recorded (or the wait ran out: the test's own
    assertions then tell), leaving the job it started running."""
    with suppress(AssertionError):
        wait_for(lambda: _recorded_group(gsd) is not None, what="CMD's group to be recorded")
    os.kill(first.pid, signal.SIGKILL)
    first.proc.wait(timeout=SYNC_TIMEOUT)
    assert alive(job), "the job was meant to outlive lock run and CMD"


def test_a_subprocess_child_keeps_the_lock_until_it_ends(
    tmp_path: Path, gsd: Path, spawn: Any, jobs: list[int], grace: None
) -> None:
    """Fails on 211f242: ``lock run`` released as soon as CMD had exited (the proof was free),
    and the second ``lock run --reclaim-dead`` ran beside the job (its marker was written)."""
    marker = tmp_path / "second"
    first = first_run(spawn, gsd, sys.executable, "-c", POPEN_THEN_EXIT, JOB)
    job = job_pid(first)
    jobs.append(job)
    # CMD gone: lock run's live children are at most the job (its orphan, adopted).
    wait_for(lambda: set(_cmd_of(first.pid)) <= {job}, what="CMD to exit, leaving the job")

    assert alive(job)
    assert_nobody_else_gets_it(tmp_path, gsd, marker)

    first.send("x")  # the job ends: now lock run releases
    assert first.wait() == 0
    assert not lock_path(gsd).exists()
    assert second_run(tmp_path, gsd, marker).returncode == 0


def test_the_proofs_descriptor_is_above_the_numbers_scripts_use(
    tmp_path: Path, gsd: Path, spawn: Any, jobs: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fails on 211f242: the proof was passed as descriptor 5 (or another below 10); the
    script's ``exec 5>>log`` closed it, the ``setsid`` job held no proof, and ``lock run``
    released under it without a word (the wait for its "stays held" ran out)."""
    monkeypatch.setenv(constants.GRACE_ENV, "0.3")  # the job left the group: no grace ends it
    marker = tmp_path / "second"
    log = tmp_path / "script.log"
    script = ["sh", "-c", SHELL_NUMBERS_THEN_SETSID, str(log), sys.executable, JOB]
    first = first_run(spawn, gsd, *script)
    job = job_pid(first)
    jobs.append(job)
    assert first.proc.wait(timeout=SYNC_TIMEOUT) == 0  # the job keeps its pipes open
    wait_for(lambda: "stays held" in first.stderr, what="lock run to say the lock stays held")
    assert_nobody_else_gets_it(tmp_path, gsd, marker)

    first.send("x")
    wait_gone(job)
    assert second_run(tmp_path, gsd, marker).returncode == 0


def test_a_sigkilled_lock_runs_recorded_group_keeps_the_lock(
    tmp_path: Path, gsd: Path, spawn: Any, jobs: list[int]
) -> None:
    """Fails on 211f242: with ``lock run`` SIGKILLed (CMD dies with it, by the parent-death
    signal) the job that dropped the proof still ran in CMD's group, but the lock recorded
    only ``lock run``'s own group: owner ``not-running``, and ``--reclaim-dead`` ran a second
    holder beside the job. (The look for the recorded group below gives up after a while
    without failing: on the old code it never comes, and the overlap is what fails.)"""
    marker = tmp_path / "second"
    first = first_run(spawn, gsd, sys.executable, "-c", POPEN_THEN_WAIT, JOB)
    job = job_pid(first)
    jobs.append(job)
    _kill_lock_run_once_recorded(first, gsd, job)

    assert_nobody_else_gets_it(tmp_path, gsd, marker)
    blocked = second_run(tmp_path, gsd, marker)
    assert blocked.returncode == EX_TEMPFAIL, blocked.stderr
    assert _recorded_group(gsd) == os.getpgid(job)

    first.send("x")  # the job ends: the group is empty, the owner provably gone
    wait_gone(job)
    assert second_run(tmp_path, gsd, marker).returncode == 0
    assert marker.read_text() == "second ran"


STOPPED_AS_CMD_STARTS: Final = (
    "import os, runpy, signal, subprocess, sys\n"
    "class StopAfterStart(subprocess.Popen):\n"
    "    def __init__(self, args, *rest, **named):\n"
    "        super().__init__(args, *rest, **named)\n"
    "        if sys.argv[-1] in args:  # CMD (not setpriv's probe): Popen has returned\n"
    "            os.kill(os.getpid(), signal.SIGSTOP)\n"
    "subprocess.Popen = StopAfterStart\n"
    "runpy.run_module('mahabharatha', run_name='__main__')\n"
)
"""``lock run`` (the CLI's arguments follow) that stops itself as soon as ``Popen`` returns
CMD: held in the window between CMD's ``exec`` and what ``lock run`` does next."""


def test_lock_run_killed_as_cmd_starts_leaves_cmds_group_recorded(
    tmp_path: Path, gsd: Path, spawn: Any, jobs: list[int]
) -> None:
    """``lock run`` SIGKILLed right after ``Popen`` returned CMD, while CMD starts a job that
    drops the proof and stays in CMD's group; CMD dies by the parent-death signal. Fails on
    a3fbf02: CMD's group was recorded only after ``Popen`` returned, so the lock named
    ``lock run``'s own group: owner ``not-running``, and ``--reclaim-dead`` could run a
    second holder beside the job (``assert_nobody_else_gets_it`` failed on the owner)."""
    marker = tmp_path / "second"
    first = spawn(
        [
            sys.executable, "-c", STOPPED_AS_CMD_STARTS, "lock", "run", FEATURE,
            "--gsd-dir", gsd, "--", sys.executable, "-c", POPEN_THEN_WAIT, JOB,
        ],
        stdin=subprocess.PIPE,
    )  # fmt: skip
    job = job_pid(first)
    jobs.append(job)
    wait_for(lambda: _state(first.pid) == "T", what="lock run to stop once CMD started")
    (cmd,) = _cmd_of(first.pid)
    os.kill(first.pid, signal.SIGKILL)
    first.proc.wait(timeout=SYNC_TIMEOUT)
    wait_gone(cmd)  # the parent-death signal
    assert alive(job), "the job was meant to outlive lock run and CMD"

    assert_nobody_else_gets_it(tmp_path, gsd, marker)
    first.send("x")  # the job ends: the group is empty, the owner provably gone
    wait_gone(job)
    assert second_run(tmp_path, gsd, marker).returncode == 0


def _state(pid: int) -> str:
    stat = ownership.proc_stat(pid)
    return "gone" if stat is None else stat.state


def test_the_recorded_group_survives_the_heartbeats_refreshes(
    tmp_path: Path, gsd: Path, spawn: Any
) -> None:
    """The group is recorded once, and every later refresh (a new ``.lock`` file) carries it
    on. Fails on 211f242: no group of CMD's was ever recorded (the wait for it ran out)."""
    first = spawn(
        cli_argv(
            "lock", "run", FEATURE, "--gsd-dir", gsd, "--heartbeat", "0.05", "--",
            sys.executable, "-c", JOB,
        ),
        stdin=subprocess.PIPE,
    )  # fmt: skip
    cmd = job_pid(first)
    before = _lock_identity(gsd)
    wait_for(lambda: _lock_identity(gsd) not in (before, None), what="a refresh")
    wait_for(lambda: _recorded_group(gsd) is not None, what="CMD's group to be recorded")
    assert _recorded_group(gsd) == cmd
    first.send("x")
    assert first.wait() == 0


def _cmd_of(lock_run: int) -> list[int]:
    """``lock run``'s live children (CMD while it runs; a zombie does not count)."""
    try:
        children = Path(f"/proc/{lock_run}/task/{lock_run}/children").read_text().split()
    except OSError:
        return []
    return [int(pid) for pid in children if alive(int(pid))]


def _lock_identity(gsd: Path) -> tuple[int, int] | None:
    try:
        info = os.stat(lock_path(gsd))
    except FileNotFoundError:
        return None
    return (info.st_dev, info.st_ino)


def _recorded_group(gsd: Path) -> int | None:
    """The group the lock's owner details name as CMD's (``None``: none recorded)."""
    try:
        raw = os.getxattr(lock_path(gsd), ownership.XATTR_NAME)
    except OSError:
        return None
    details = ownership.decode(raw)
    if details is None or not getattr(details, "work_group", False):
        return None
    return details.pgid


def test_the_recorded_group_travels_in_the_owner_details() -> None:
    """Encoded with the lock and decoded by every judge; the rest of the details unchanged."""
    raw = ownership.details_of(os.getpid())
    before = ownership.decode(raw)
    after = ownership.decode(ownership.with_work_group(raw, 4242, 17))
    assert before is not None and after is not None
    assert not before.work_group
    assert after == before._replace(pgid=4242, gstart=17, work_group=True)


def test_a_group_not_recorded_for_a_busy_guard_is_recorded_by_the_next_heartbeat(
    tmp_path: Path, gsd: Path, spawn: Any, jobs: list[int]
) -> None:
    """Another process keeps the feature folder's guard (a reclaim under load, any user's
    ``flock`` on the folder) past the half second the record waits for it. Fails on the
    reviewed merge (f9cad1f): the group was then never recorded (every refresh carried the
    old details), so with ``lock run`` SIGKILLed the job that dropped the proof in CMD's
    group did not count: ``not-running``, and ``--reclaim-dead`` ran a second holder beside
    it. (The look for the recorded group gives up after a while without failing: on the old
    code it never comes, and the overlap is what fails.)"""
    marker = tmp_path / "second"
    folder = lock_path(gsd).parent
    folder.mkdir(parents=True)
    guard = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(guard, fcntl.LOCK_EX)  # taking a free lock needs no guard; recording does
        first = spawn(
            cli_argv(
                "lock", "run", FEATURE, "--gsd-dir", gsd, "--heartbeat", "0.1", "--",
                sys.executable, "-c", POPEN_THEN_WAIT, JOB,
            ),
            stdin=subprocess.PIPE,
        )  # fmt: skip
        job = job_pid(first)
        jobs.append(job)
        # Race: the guard goes only once lock run gave up recording and waits for CMD.
        wait_for(lambda: _waits_for_a_child(first.pid), what="lock run to wait for CMD")
        assert _recorded_group(gsd) is None
    finally:
        os.close(guard)
    _kill_lock_run_once_recorded(first, gsd, job)

    assert_nobody_else_gets_it(tmp_path, gsd, marker)
    first.send("x")  # the job ends
    wait_gone(job)


def _waits_for_a_child(pid: int) -> bool:
    """Is ``pid``'s main thread blocked in ``wait4`` (lock run past its start of CMD)?"""
    try:
        return Path(f"/proc/{pid}/wchan").read_text() == "do_wait"
    except OSError:
        return False
