"""Proof of life (issue 16): a lock's owner is alive exactly while its work runs.

Each test races real processes: a ``lock run`` whose command's work leaves its process group,
signals and lost locks that used to stop CMD but not its work, a relay of short-lived
processes, a SIGKILLed ``multiprocessing`` worker. The invariant is always the same: while the
first holder's work runs, nobody else gets the feature (checked by trying, with
``--reclaim-dead``, and by a marker the second command would write), and once it has ended the
feature is free (or reclaimable) at once. Children synchronise through their output lines and
stdin; every process a test starts is ended and reaped.
"""

from __future__ import annotations

import errno
import fcntl
import json
import multiprocessing
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from mahabharatha import constants, locks
from mahabharatha.owner import ownership, proof
from mahabharatha.run import runner
from tests.cli._support import (
    FEATURE,
    SYNC_TIMEOUT,
    cli_argv,
    lock_path,
    read_record,
    run_cli,
    wait_for,
)
from tests.support.marks import needs_proc, needs_root

pytestmark = [
    needs_proc,
    pytest.mark.skipif(not proof.supported(), reason="no open-file-description locks here"),
]

EX_TEMPFAIL: Final = 75
EX_LOST: Final = 76

JOB: Final = (
    "import os, signal, sys\n"
    "signal.signal(signal.SIGINT, signal.SIG_DFL)  # no KeyboardInterrupt traceback\n"
    "print('job', os.getpid(), flush=True)\n"
    "sys.stdin.buffer.read(1)\n"
)
"""The work: says its pid, then runs until a byte arrives on its stdin (the test's pipe)."""

STUBBORN_JOB: Final = (
    "import os, signal, sys\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
    "print('job', os.getpid(), flush=True)\n"
    "sys.stdin.buffer.read(1)\n"
)
"""The work, deaf to SIGTERM and SIGHUP: only the SIGKILL after the grace ends it. (A job deaf
to SIGINT keeps its shell waiting too: CMD goes on, and so does ``lock run``, as it should.)"""

SECOND: Final = "import sys; open(sys.argv[1], 'w').write('second ran')"


@pytest.fixture(autouse=True)
def short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """``lock run`` waits this long for CMD's leftovers before SIGKILLing its group."""
    monkeypatch.setenv(constants.GRACE_ENV, "0.3")


@pytest.fixture
def jobs() -> Iterator[list[int]]:
    """Pids of work a test started outside every group the test reaps: killed at the end."""
    started: list[int] = []
    yield started
    for pid in started:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        wait_gone(pid)


def wait_gone(pid: int, timeout: float = SYNC_TIMEOUT) -> None:
    """Wait until ``pid`` has ended (it need not be our child)."""
    wait_for(lambda: not alive(pid), timeout, what=f"process {pid} to end")


def alive(pid: int) -> bool:
    return ownership.is_alive(ownership.proc_stat(pid), pid)


def second_run(tmp_path: Path, gsd: Path, marker: Path) -> subprocess.CompletedProcess[str]:
    """Another worker tries the feature once, taking a dead owner's lock if it may."""
    return run_cli(
        "lock", "run", FEATURE, "--gsd-dir", gsd, "--reclaim-dead", "--timeout", "0",
        "--", sys.executable, "-c", SECOND, marker,
        cwd=tmp_path,
    )  # fmt: skip


def first_run(spawn: Any, gsd: Path, *cmd: str) -> Any:
    return spawn(
        cli_argv("lock", "run", FEATURE, "--gsd-dir", gsd, "--", *cmd), stdin=subprocess.PIPE
    )


def job_pid(child: Any) -> int:
    word, pid = child.next_line().split()
    assert word == "job"
    return int(pid)


def assert_nobody_else_gets_it(tmp_path: Path, gsd: Path, marker: Path) -> None:
    info = locks.inspect(FEATURE, gsd)
    assert info.state == "active", info
    assert info.owner in ("running", "work-running"), info
    blocked = second_run(tmp_path, gsd, marker)
    assert blocked.returncode == EX_TEMPFAIL, blocked.stderr
    assert not marker.exists(), "a second holder ran beside the first one's work"


# --------------------------------------------------------------------------- item 1


WRAPPERS: Final = [
    pytest.param(("timeout", "600"), id="timeout"),
    pytest.param(("setsid",), id="setsid"),
    pytest.param(
        ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"),
        id="setpriv",
        marks=needs_root,
    ),
]


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_work_that_leaves_the_group_keeps_the_lock_when_lock_run_is_killed(
    tmp_path: Path, gsd: Path, spawn: Any, jobs: list[int], wrapper: tuple[str, ...]
) -> None:
    """Fails before the proof of life: GNU ``timeout`` (``setpgid``), ``setsid`` and a
    credential change (``setpriv``, which also clears the parent-death signal) move the job out
    of the recorded group; with ``lock run`` SIGKILLed the owner was judged ``not-running`` and
    ``lock run --reclaim-dead`` ran a second command beside the job."""
    marker = tmp_path / "second"
    first = first_run(spawn, gsd, *wrapper, sys.executable, "-c", JOB)
    job = job_pid(first)
    jobs.append(job)
    os.kill(first.pid, signal.SIGKILL)
    first.proc.wait(timeout=SYNC_TIMEOUT)

    assert alive(job), "the job was meant to outlive lock run"
    assert_nobody_else_gets_it(tmp_path, gsd, marker)
    assert locks.inspect(FEATURE, gsd).owner == "work-running"

    first.send("x")  # the job ends
    wait_gone(job)
    taken = second_run(tmp_path, gsd, marker)
    assert taken.returncode == 0, taken.stderr
    assert marker.read_text() == "second ran"


def test_work_that_escaped_keeps_the_lock_after_lock_run_ends(
    tmp_path: Path, gsd: Path, spawn: Any, jobs: list[int]
) -> None:
    """``setsid`` forks when CMD leads its group: CMD ends at once while the job runs on in a
    session of its own, out of reach of the group SIGKILL. ``lock run`` must say so and leave
    the lock held (fails before: it released at once and the next holder overlapped)."""
    marker = tmp_path / "second"
    first = first_run(spawn, gsd, "setsid", sys.executable, "-c", JOB)
    job = job_pid(first)
    jobs.append(job)
    assert first.proc.wait(timeout=SYNC_TIMEOUT) == 0  # (its pipes stay open: the job has them)
    wait_for(lambda: "stays held" in first.stderr, what="lock run to say the lock stays held")
    assert lock_path(gsd).exists()
    assert_nobody_else_gets_it(tmp_path, gsd, marker)

    first.send("x")
    wait_gone(job)
    assert second_run(tmp_path, gsd, marker).returncode == 0


# --------------------------------------------------------------------------- items 2 and 3


@pytest.mark.parametrize(
    ("signum", "job_code"),
    [
        pytest.param(signal.SIGTERM, JOB, id="term"),
        pytest.param(signal.SIGINT, JOB, id="int"),
        pytest.param(signal.SIGHUP, JOB, id="hup"),
        pytest.param(signal.SIGTERM, STUBBORN_JOB, id="term-deaf-job"),
        pytest.param(signal.SIGHUP, STUBBORN_JOB, id="hup-deaf-job"),
    ],
)
def test_a_signal_to_lock_run_ends_cmds_whole_group_before_the_release(
    tmp_path: Path, gsd: Path, spawn: Any, jobs: list[int], signum: int, job_code: str
) -> None:
    """Fails before the fix: the signal reached only the shell; the job worked on while
    ``lock run`` released at once, and the next holder overlapped it."""
    first = first_run(spawn, gsd, "sh", "-c", '"$0" -c "$1"; echo after', sys.executable, job_code)
    job = job_pid(first)
    jobs.append(job)
    os.kill(first.pid, signum)
    first.wait()
    # The invariant: by the time lock run has let go, nothing of its command runs.
    assert not alive(job), "lock run released while its command's work still ran"
    assert not lock_path(gsd).exists()


def test_a_lost_lock_stops_cmds_whole_group_before_lock_run_exits(
    tmp_path: Path, gsd: Path, spawn: Any, jobs: list[int]
) -> None:
    """Fails before the fix: SIGTERM for a lost lock reached only the shell; ``lock run``
    exited 76 while the job still worked beside the next holder."""
    first = spawn(
        cli_argv(
            "lock", "run", FEATURE, "--gsd-dir", gsd, "--heartbeat", "0.05", "--",
            "sh", "-c", '"$0" -c "$1"; echo after', sys.executable, JOB,
        ),
        stdin=subprocess.PIPE,
    )  # fmt: skip
    job = job_pid(first)
    jobs.append(job)
    forced = run_cli("lock", "release", FEATURE, "--gsd-dir", gsd, "--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert first.wait() == EX_LOST
    assert not alive(job), "lock run exited 76 while its command's work still ran"


# --------------------------------------------------------------------------- item 4


RELAY: Final = (
    "import os, sys\n"
    "stop = sys.argv[1]\n"
    "if os.fork():\n"
    "    os._exit(0)  # CMD itself ends at once: the relay is all in the background\n"
    "print('job', os.getpid(), flush=True)\n"
    "while not os.path.exists(stop):\n"
    "    if os.fork():\n"
    "        os._exit(0)  # this stage ends; its child carries on (and the proof with it)\n"
    "open(stop + '.done', 'w').close()\n"
)
"""A build whose every stage starts the next in the background and exits, until told to stop."""


def test_a_relay_of_short_lived_processes_keeps_the_lock(
    tmp_path: Path, gsd: Path, spawn: Any
) -> None:
    """Fails before the fix: the relay's stages each live a moment, so a look at the group
    could find none alive, and a waiting ``--reclaim-dead`` took the feature mid-relay."""
    stop = tmp_path / "stop"
    first = first_run(spawn, gsd, sys.executable, "-c", RELAY, str(stop))
    job_pid(first)
    os.kill(first.pid, signal.SIGKILL)
    first.proc.wait(timeout=SYNC_TIMEOUT)
    tries = int(os.environ.get("MAHABHARATHA_STRESS", "1")) * 50
    try:
        for _ in range(tries):
            with pytest.raises(locks.LockHeldError):
                locks.acquire(FEATURE, gsd, reclaim_dead=True)
    finally:
        stop.touch()
    wait_for(lambda: Path(str(stop) + ".done").exists(), what="the relay to stop")
    # The last stage lets go of the proof a moment before it leaves CMD's group, which keeps
    # the owner alive too: once it is gone the lock is free to take.
    wait_for(lambda: _reclaimed(gsd), what="the relay's last stage to end, the lock taken")
    assert read_record(lock_path(gsd))[0] == os.getpid()


def _reclaimed(gsd: Path) -> bool:
    try:
        locks.acquire(FEATURE, gsd, reclaim_dead=True)
    except locks.LockHeldError:
        return False
    return True


# --------------------------------------------------------------------------- item 6


def _hold_in_worker(gsd: str, ready: Any) -> None:
    locks.FeatureLock(FEATURE, gsd, heartbeat=None).acquire()
    ready.set()
    ready.wait()  # set already: returns; the worker then waits to be killed
    signal.pause()


def test_a_sigkilled_multiprocessing_worker_frees_its_lock_at_once(
    tmp_path: Path, gsd: Path
) -> None:
    """Fails before the fix: the worker shares its parent's process group (this test's), so
    its lock stayed ``active ... running`` under a dead pid and ``--reclaim-dead`` refused it
    for two hours."""
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    worker = context.Process(target=_hold_in_worker, args=(str(gsd), ready))
    worker.start()
    try:
        assert ready.wait(SYNC_TIMEOUT)
        assert locks.inspect(FEATURE, gsd).owner == "running"
    finally:
        os.kill(worker.pid or 0, signal.SIGKILL)
        worker.join(SYNC_TIMEOUT)
    info = locks.inspect(FEATURE, gsd)
    assert (info.state, info.owner) == ("active", "not-running"), info
    status = run_cli("lock", "status", "--gsd-dir", gsd, cwd=tmp_path)
    assert " running" not in status.stdout.replace("not-running", ""), status.stdout
    taken = run_cli("lock", "acquire", FEATURE, "--gsd-dir", gsd, "--reclaim-dead", cwd=tmp_path)
    assert taken.returncode == 0, taken.stderr


# --------------------------------------------------------------------------- item 15


def test_without_extended_attributes_a_second_lock_in_one_process_is_already_yours(
    gsd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fails before the fix: without owner details "already held by you" never fired, and a
    second ``FeatureLock`` of the same feature in one process waited until its timeout (for
    ever with ``timeout=None``). The proof this process holds answers it."""

    def no_xattrs(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.ENOTSUP, "no extended attributes here")

    monkeypatch.setattr(os, "setxattr", no_xattrs)
    first = locks.FeatureLock(FEATURE, gsd, heartbeat=None).acquire()
    try:
        with pytest.raises(locks.AlreadyHeldError):
            locks.FeatureLock(FEATURE, gsd, heartbeat=None, timeout=5).acquire()
    finally:
        first.release()


# --------------------------------------------------------------------------- item 16


def test_a_lock_lost_before_cmd_starts_never_starts_it(tmp_path: Path, gsd: Path) -> None:
    """The path where the heartbeat finds the lock lost between the acquire and the start of
    CMD had no test (it could be removed unnoticed): CMD must not start, and the loss is
    raised (the CLI exits 76)."""
    marker = tmp_path / "ran"
    holder = locks.FeatureLock(FEATURE, gsd, heartbeat=0.01)

    def lose_it() -> None:
        locks.release(FEATURE, gsd, pid=os.getpid(), force=True)
        wait_for(lambda: holder.lost is not None, what="the heartbeat to notice the loss")

    command = [sys.executable, "-c", SECOND, str(marker)]
    with pytest.raises(locks.LockLostError):
        runner.run_locked(holder, command, on_acquired=lose_it)
    assert not marker.exists(), "CMD started although the lock was already lost"


# --------------------------------------------------------------------------- item 7


ADOPTED: Final = """\
import os, sys
gone_first = sys.argv[1] == 'before-start'
os.setsid()  # our session: the reaper that adopts the grandchild is in another one
reader, writer = os.pipe()
grandchild = os.fork()
if grandchild:
    os.read(reader, 1)  # the grandchild is ready for its parent (us) to go
    os._exit(0)
os.close(reader)
caller = os.getppid()
if not gone_first:
    from mahabharatha.cli import _output  # the CLI starts while its caller still lives
os.write(writer, b'x')
while os.getppid() == caller:
    os.sched_yield()  # until adopted by a reaper
from mahabharatha.cli import _output
try:
    owner = _output.default_owner(None)
except Exception as refusal:
    print('refused', refusal, flush=True)
else:
    print('owner', owner, flush=True)
"""
"""A CLI whose caller dies (before it starts, or while it runs) and is adopted by a reaper."""


@pytest.mark.parametrize("when", ["before-start", "while-running"])
def test_a_cli_adopted_by_a_reaper_never_records_it_as_the_owner(tmp_path: Path, when: str) -> None:
    """Fails before the fix: the CLI recorded its new parent (pid 1 or a subreaper, which
    never dies) as the owner, and the feature stayed held for two hours."""
    child = subprocess.Popen(
        [sys.executable, "-c", ADOPTED, when],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = child.communicate(timeout=SYNC_TIMEOUT)  # EOF: the grandchild has ended too
    assert out.startswith("refused "), out
    assert "--pid" in out


# --------------------------------------------------------------------------- item 13


def test_a_stale_lock_under_a_busy_guard_is_not_called_held_by_its_owner(
    tmp_path: Path, gsd: Path
) -> None:
    """Fails before the fix: while another process kept the folder's guard, ``acquire`` said
    "locked by pid N ... ask its owner" about a stale lock that ``check`` called free."""
    folder = gsd / "specs" / FEATURE
    folder.mkdir(parents=True)
    (folder / ".lock").write_text("4242:1000.5")  # stale for decades
    guard = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(guard, fcntl.LOCK_EX)  # another process mid-removal, or stuck
        refused = run_cli("lock", "acquire", FEATURE, "--gsd-dir", gsd, cwd=tmp_path)
        checked = run_cli("lock", "check", FEATURE, "--gsd-dir", gsd, cwd=tmp_path)
    finally:
        os.close(guard)
    assert refused.returncode == 1, refused.stderr
    assert "stale lock that could not be taken" in refused.stderr, refused.stderr
    assert "ask its owner" not in refused.stderr
    assert checked.returncode == 0, checked.stderr


# --------------------------------------------------------------------------- a review's findings


FORKED_HOLDER_CHILD: Final = "import sys; sys.stdin.buffer.read(1)"


def test_a_proof_left_in_a_forked_child_never_vouches_for_a_later_lock(
    tmp_path: Path, gsd: Path, spawn: Any
) -> None:
    """Fails with one proof per folder: a holder forked a child (a pool, a prefork server)
    that kept the proof's descriptor, then released; a later holder was SIGKILLed, and its
    lock stayed ``work-running`` (stranded) while the forked child lived. Each lock has its
    own slot of the folder's proof now."""
    first = locks.FeatureLock(FEATURE, gsd, heartbeat=None).acquire()
    reader, writer = os.pipe()
    keeper = os.fork()
    if keeper == 0:  # keeps every descriptor of the holder, the proof's too
        os.close(writer)
        os.read(reader, 1)
        os._exit(0)
    os.close(reader)
    try:
        first.release()
        later = spawn(
            [sys.executable, "-c", HOLDS_UNTIL_KILLED, FEATURE, str(gsd)], stdin=subprocess.PIPE
        )
        assert later.next_line() == "held"
        os.kill(later.pid, signal.SIGKILL)
        later.proc.wait(timeout=SYNC_TIMEOUT)
        assert locks.inspect(FEATURE, gsd).owner == "not-running"
        locks.acquire(FEATURE, gsd, reclaim_dead=True)
    finally:
        os.write(writer, b"x")
        os.close(writer)
        os.waitpid(keeper, 0)


HOLDS_UNTIL_KILLED: Final = (
    "import sys\n"
    "from mahabharatha import locks\n"
    "locks.FeatureLock(sys.argv[1], sys.argv[2], heartbeat=None).acquire()\n"
    "print('held', flush=True)\n"
    "sys.stdin.buffer.read(1)\n"
)


@pytest.mark.parametrize("refusal", ["no-ofd-locks", "einval"])
def test_lock_run_works_where_no_proof_can_be_taken(
    tmp_path: Path, gsd: Path, monkeypatch: pytest.MonkeyPatch, refusal: str
) -> None:
    """Fails before the fix: where the kernel or file system has no open-file-description
    locks (macOS; ``EINVAL`` on a folder of some network file systems) the lock was kept as
    proven anyway, and ``lock run`` failed making CMD's proof: CMD never ran."""
    if refusal == "no-ofd-locks":
        monkeypatch.setattr(proof, "_OFD_SETLK", None)
    else:

        def refused(*_args: object) -> None:
            raise OSError(errno.EINVAL, "Invalid argument")

        monkeypatch.setattr(proof, "_set", refused)
    marker = tmp_path / "ran"
    holder = locks.FeatureLock(FEATURE, gsd, heartbeat=None)
    code = runner.run_locked(holder, [sys.executable, "-c", SECOND, str(marker)])
    assert code == 0
    assert marker.read_text() == "second ran"
    assert not lock_path(gsd).exists()


def test_a_directory_at_the_done_marker_is_named_by_done_and_status_alike(
    tmp_path: Path, gsd: Path
) -> None:
    """Fails before the fix: ``done`` named its private temp file instead of the marker in
    the way, and ``status --all`` called the feature free."""
    (gsd / "specs" / FEATURE / ".completed").mkdir(parents=True)
    me = str(os.getpid())
    assert (
        run_cli("lock", "acquire", FEATURE, "--gsd-dir", gsd, "--pid", me, cwd=tmp_path).returncode
        == 0
    )
    done = run_cli("lock", "done", FEATURE, "--gsd-dir", gsd, "--pid", me, cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    assert ".completed:" in done.stderr and ".tmp" not in done.stderr, done.stderr
    released = run_cli("lock", "release", FEATURE, "--gsd-dir", gsd, "--pid", me, cwd=tmp_path)
    assert released.returncode == 0, released.stderr
    status = run_cli("lock", "status", "--all", "--gsd-dir", gsd, "--json", cwd=tmp_path)
    [entry] = json.loads(status.stdout)["features"]
    assert entry["state"] != "free", entry
    assert ".completed" in entry["error"]
