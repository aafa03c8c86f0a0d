"""SIGKILL at every step: no crash lets two holders in, loses a live lock or leaves debris.

A forked child runs one operation with every system call of the lock code counted
(``tests/faults/_syscalls.py``) and SIGKILLs itself just before, or just after, the N-th call;
N runs over every step of the operation. After each kill the parent checks that each lock path
holds nothing, the entry that was planted there, or a complete lock of the killed owner (never
an empty or partial lock, never a lost live lock), that the kernel dropped the guard, that the
next acquire wins exactly where it should (at once over a stale or corrupt lock; over the dead
owner's own lock once stale or with ``reclaim_dead``) and leaves no temp file, and that one
``locks.clean`` leaves nothing behind. Random-time kills of a child looping through the whole
API, and of ``lock run`` processes, complete the count.

``MAHABHARATHA_STRESS`` sets the total number of kills this file makes: the random test, which
runs last, tops the count up to it. Unset: every step once in each phase (about 460 kills), 80
random kills and 5 of ``lock run``, a few seconds. ``MAHABHARATHA_STRESS=1000``: at least 1000.
The terminal summary prints the count and the number of invariant violations.
"""

from __future__ import annotations

import contextlib
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import psutil  # noqa: F401  (imported before forking: children must not import it mid-count)
import pytest

from mahabharatha import locks
from mahabharatha.backends.files import lockfile, snapshot
from mahabharatha.backends.files.snapshot import LOCK_FILE_NAME
from mahabharatha.commands import _utils
from mahabharatha.owner import ownership, proof
from tests.faults._kills import (
    Expectation,
    HarnessError,
    describe,
    entry_at,
    final_clean,
    judge_leftovers,
    live_record,
    lock_of,
    plant,
    recover,
    run_child,
    stale_record,
)
from tests.faults._syscalls import TALLY, instrumented, kill_at

FEATURE: Final = "feat"
MAX_STEPS: Final = 400
"""No operation here makes this many system calls: reaching it means the child never died."""

DEFAULT_RANDOM_KILLS: Final = 80
"""Random-time kills when MAHABHARATHA_STRESS is unset (about a second on an idle machine)."""

LOCK_RUN_KILLS: Final = 5
"""Kills of real ``lock run`` processes (each costs an interpreter start)."""


def stress() -> int | None:
    raw = os.environ.get("MAHABHARATHA_STRESS", "").strip()
    if not raw:
        return None
    value = int(raw)
    if value < 1:
        raise ValueError(f"MAHABHARATHA_STRESS must be a positive integer, not {raw!r}")
    return value


TIMEOUT: Final = 120.0 + 0.2 * (stress() or 0)


# --------------------------------------------------------------------------- scenarios


@dataclass(frozen=True)
class Scenario:
    """One operation to kill at every step.

    ``prepare(gsd, n)`` plants the starting entries (parent) and returns what may be left;
    ``warmup(gsd)`` runs in the child before counting starts (to take the lock a release or
    refresh then works on); ``operation(gsd, state)`` is the counted, killed part.
    """

    name: str
    prepare: Callable[[Path, int], Expectation]
    operation: Callable[[Path, Any], object]
    warmup: Callable[[Path], Any] = lambda gsd: None
    clean_first: bool = False  # recovery is "locks.clean then acquire" (the design's promise)
    modes: tuple[str, ...] = ("tmpfile",)


def _nothing(gsd: Path, n: int) -> Expectation:
    return Expectation()


def _stale(gsd: Path, n: int) -> Expectation:
    return Expectation(
        planted={FEATURE: plant(gsd, FEATURE, stale_record())}, reclaimable={FEATURE}
    )


CORRUPT: Final = [
    (b"not a lock", 0.0),
    (b"", 3600.0),  # an older writer's empty lock, long past its 2 s grace
    (b"\xff\xfe\xfd", 0.0),
    (b"7:1e9", 0.0),
    (b"12:", 0.0),
]


def _corrupt(gsd: Path, n: int) -> Expectation:
    content, age = CORRUPT[n % len(CORRUPT)]
    planted = plant(gsd, FEATURE, content, age=age)
    return Expectation(planted={FEATURE: planted}, reclaimable={FEATURE})


def _held_by_live_owner(gsd: Path, n: int) -> Expectation:
    planted = plant(gsd, FEATURE, live_record(os.getpid()))
    return Expectation(planted={FEATURE: planted}, live={FEATURE}, owner_may_hold=False)


def _acquire(gsd: Path, _state: Any) -> object:
    return _utils.acquire_feature_lock(FEATURE, str(gsd))


def _legacy_acquire(gsd: Path) -> None:
    if not _utils.acquire_feature_lock(FEATURE, str(gsd)):
        raise HarnessError("warm-up acquire failed")


def _holder(gsd: Path) -> locks.FeatureLock:
    return locks.FeatureLock(FEATURE, gsd, heartbeat=None, timeout=0).acquire()


CLEAN_FEATURES: Final = ("live", "stale", "corrupt", "debris")


def _clean_set(gsd: Path, n: int) -> Expectation:
    """A live lock (must stay), a stale and a corrupt one, and an orphan temp with no lock."""
    planted = {
        "live": plant(gsd, "live", live_record(os.getpid())),
        "stale": plant(gsd, "stale", stale_record()),
        "corrupt": plant(gsd, "corrupt", b"garbage"),
    }
    debris = gsd / "specs" / "debris"
    debris.mkdir(parents=True)
    orphan = debris / f".lock.{4_194_000 + n % 300}.{n:016x}.tmp"
    orphan.write_bytes(b"1:2")
    os.utime(orphan, (time.time() - 600, time.time() - 600))
    return Expectation(
        planted=planted,
        reclaimable={"stale", "corrupt"},
        live={"live"},
        owner_may_hold=False,
        features=CLEAN_FEATURES,
    )


def _must_stay(prepare: Callable[[Path, int], Expectation]) -> Callable[[Path, int], Expectation]:
    def prepared(gsd: Path, n: int) -> Expectation:
        expect = prepare(gsd, n)
        expect.must_exist.add(FEATURE)
        return expect

    return prepared


SCENARIOS: Final = [
    Scenario("acquire-fresh", _nothing, _acquire, modes=("tmpfile", "named")),
    Scenario("acquire-reclaim-stale", _stale, _acquire, modes=("tmpfile", "named")),
    Scenario("acquire-reclaim-corrupt", _corrupt, _acquire, modes=("tmpfile", "named")),
    Scenario("acquire-over-live-lock", _held_by_live_owner, _acquire, modes=("tmpfile", "named")),
    Scenario(
        "release",
        _nothing,
        lambda gsd, _: _utils.release_feature_lock(FEATURE, str(gsd)),
        warmup=_legacy_acquire,
    ),
    Scenario("holder-release", _nothing, lambda gsd, held: held.release(), warmup=_holder),
    Scenario("refresh", _must_stay(_nothing), lambda gsd, held: held.refresh(), warmup=_holder),
    Scenario("clean", _clean_set, lambda gsd, _: locks.clean(gsd), clean_first=True),
]

CASES: Final = [
    pytest.param(scenario, phase, mode, id=f"{scenario.name}-{mode}-kill-{phase}")
    for scenario in SCENARIOS
    for mode in scenario.modes
    for phase in ("before", "after")
]


@dataclass
class Run:
    kills: int = 0
    problems: list[str] = field(default_factory=list)


def _fresh(gsd: Path) -> Path:
    shutil.rmtree(gsd, ignore_errors=True)
    gsd.mkdir()
    return gsd


def _one_kill(
    gsd: Path,
    scenario: Scenario,
    step: int,
    phase: str,
    named: bool,
    sabotage: Callable[[], None] | None = None,
) -> tuple[bool, list[str]]:
    """Kill the child at ``step``; False when it finished first (no such step)."""
    expect = scenario.prepare(_fresh(gsd), step)

    def body() -> None:
        if sabotage is not None:
            sabotage()
        state = scenario.warmup(gsd)
        with instrumented(kill_at(step, phase)):
            scenario.operation(gsd, state)

    death = run_child(body, named=named)
    if not death.killed:
        return False, []
    if sabotage is None:
        TALLY.kills += 1
    problems = judge_leftovers(gsd, expect, death.pid)
    if scenario.clean_first:
        locks.clean(gsd)
    problems += recover(gsd, expect, death.pid, named=named, turn=step)
    problems += final_clean(gsd, expect)
    return True, problems


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize(("scenario", "phase", "mode"), CASES)
def test_a_kill_at_any_step_leaves_no_lock_or_a_whole_one_and_the_next_acquire_recovers(
    tmp_path: Path, scenario: Scenario, phase: str, mode: str
) -> None:
    run = Run()
    gsd = tmp_path / "gsd"
    for step in range(1, MAX_STEPS):
        killed, problems = _one_kill(gsd, scenario, step, phase, mode == "named")
        if not killed:
            break
        run.kills += 1
        run.problems += describe(scenario.name, problems, step=step, phase=phase, mode=mode)
    else:
        raise HarnessError(f"{scenario.name} still running after {MAX_STEPS} steps")
    TALLY.violations += run.problems
    assert run.kills >= 5, f"{scenario.name}: only {run.kills} steps were killed"
    assert not run.problems, "\n".join(run.problems[:20])


def _create_then_write(
    dfd: int, record: bytes, now: float, owner: bytes | None = None
) -> snapshot.LockSnapshot | None:
    """The old publish (``O_CREAT | O_EXCL``, then write): the lock has a name while empty."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    try:
        fd = os.open(LOCK_FILE_NAME, flags, 0o644, dir_fd=dfd)
    except FileExistsError:
        return None
    try:
        os.write(fd, record)
        info = os.fstat(fd)
        identity = (info.st_dev, info.st_ino)
        return snapshot.LockSnapshot(
            snapshot.EntryKind.FILE, identity, record, info.st_mtime, owner=owner
        )
    finally:
        os.close(fd)


def _sabotage_publish() -> None:
    lockfile.publish = _create_then_write  # in the forked child only


@pytest.mark.timeout(TIMEOUT)
def test_the_kill_check_catches_a_publisher_that_names_the_lock_before_writing_it(
    tmp_path: Path,
) -> None:
    """The checks can fail: the old create-then-write publish leaves an empty lock when killed
    between its create and its write, and this file's verdict must say so."""
    fresh = SCENARIOS[0]
    caught: list[str] = []
    for step in range(1, MAX_STEPS):
        killed, problems = _one_kill(
            tmp_path / "gsd", fresh, step, "after", False, sabotage=_sabotage_publish
        )
        if not killed:
            break
        caught += problems
    assert any("neither nothing" in problem for problem in caught), caught


# --------------------------------------------------------------------------- lock run


def _lock_run(gsd: Path) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable, "-m", "mahabharatha", "lock", "run", FEATURE, "--gsd-dir", str(gsd),
        "--heartbeat", "0.01", "--", "sh", "-c", "echo ready; exec sleep 60",
    ]  # fmt: skip
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True
    )


def _await_line(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> bytes:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise HarnessError("lock run printed nothing in time")
    return proc.stdout.readline()


def _reap_group(proc: subprocess.Popen[bytes], gsd: Path) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
    # Race: SIGKILL is delivered asynchronously; CMD (not our child) may still be exiting, and
    # while it lives the lock's owner group is rightly alive. Wait for the group to end.
    deadline = time.monotonic() + 10.0  # a hang guard, not a speed limit
    while ownership.group_has_live_member(proc.pid, None):
        if time.monotonic() > deadline:
            raise HarnessError("lock run's process group outlived SIGKILL")
        os.sched_yield()
    # Race: CMD leads a group of its own and gets the parent-death signal asynchronously;
    # while it lives its proof of life keeps the lock rightly alive. Wait for the proof.
    while _proof_held(gsd):
        if time.monotonic() > deadline:
            raise HarnessError("lock run's command outlived its parent-death signal")
        os.sched_yield()


def _proof_held(gsd: Path) -> bool:
    try:
        folder = os.open(gsd / "specs" / FEATURE, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return False
    try:
        return snapshot.read_lock(folder, life=True).life is proof.Life.HELD
    finally:
        os.close(folder)


@pytest.mark.timeout(TIMEOUT)
def test_lock_run_killed_mid_heartbeat_leaves_its_whole_lock_which_is_reclaimed(
    tmp_path: Path,
) -> None:
    """``lock run`` killed while CMD runs (refreshing every 10 ms): its lock stays whole."""
    count = max(LOCK_RUN_KILLS, min(20, (stress() or 0) // 100))
    problems: list[str] = []
    gsd = tmp_path / "gsd"
    for turn in range(count):
        _fresh(gsd)
        proc = _lock_run(gsd)
        try:
            if turn == 0:
                # Random time from the start: during start-up, the acquire, or the first beats.
                time.sleep(random.uniform(0.0, 0.4))  # randomness, not synchronisation
            else:
                if _await_line(proc) != b"ready\n":
                    raise HarnessError("lock run's CMD did not start")
                time.sleep(random.uniform(0.0, 0.05))  # land anywhere among the heartbeats
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        finally:
            _reap_group(proc, gsd)
        TALLY.kills += 1
        expect = Expectation()
        if turn:
            expect.must_exist.add(FEATURE)  # held while CMD ran: killed, never released
        found = judge_leftovers(gsd, expect, proc.pid)
        found += recover(gsd, expect, proc.pid, named=False, turn=turn)
        found += final_clean(gsd, expect)
        problems += describe("lock run", found, turn=turn)
    TALLY.violations += problems
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- random kills


def _looping(gsd: Path, progress: int) -> None:
    """Child: the whole API in a loop over planted stale and corrupt locks, one byte per lap."""
    lock = lock_of(gsd, FEATURE)
    stale, corrupt = gsd / "stale.src", gsd / "corrupt.src"
    while True:
        _link_quietly(stale, lock)  # a stale lock to reclaim, appearing whole (link)
        if not _utils.acquire_feature_lock(FEATURE, str(gsd)):
            raise HarnessError("could not reclaim the stale lock")
        os.write(progress, b".")
        _utils.release_feature_lock(FEATURE, str(gsd))
        _link_quietly(corrupt, lock)
        with locks.FeatureLock(FEATURE, gsd, heartbeat=None, timeout=0) as held:
            held.refresh()
        _link_quietly(stale, lock)
        locks.clean(gsd)
        locks.acquire(FEATURE, gsd, pid=os.getpid())
        locks.release(FEATURE, gsd, pid=os.getpid())


def _link_quietly(source: Path, lock: Path) -> None:
    with contextlib.suppress(FileExistsError):
        os.link(source, lock)


def _random_kill(gsd: Path, turn: int, rng: random.Random) -> tuple[list[str], str]:
    """One random-time kill; its problems and what it left (``free``, ``planted``, ``owner``)."""
    _fresh(gsd)
    (gsd / "specs" / FEATURE).mkdir(parents=True)
    (gsd / "stale.src").write_bytes(stale_record())
    (gsd / "corrupt.src").write_bytes(b"corrupt")
    planted = {"stale": entry_at(gsd / "stale.src"), "corrupt": entry_at(gsd / "corrupt.src")}
    named = rng.random() < 0.5
    laps = rng.randint(1, 4)
    delay = rng.uniform(0.0, 0.0006)
    read_end, write_end = os.pipe()

    def body() -> None:
        os.close(read_end)
        _looping(gsd, write_end)

    pid = os.fork()
    if pid == 0:
        try:
            os.setpgid(0, 0)  # its own group, as a job-control shell starts a worker
            if named:
                lockfile.TMPFILE.usable = False
            body()
        finally:
            os._exit(1)
    os.close(write_end)
    try:
        for _ in range(laps):
            ready, _, _ = select.select([read_end], [], [], 20.0)
            if not ready or not os.read(read_end, 1):
                raise HarnessError("the looping child stopped before it was killed")
        deadline = time.perf_counter() + delay
        while time.perf_counter() < deadline:  # a random point in the next lap
            pass
        os.kill(pid, signal.SIGKILL)
    finally:
        os.close(read_end)
        _, status = os.waitpid(pid, 0)
    if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
        raise HarnessError(f"the looping child ended on its own (status {status})")
    TALLY.kills += 1
    entry = entry_at(lock_of(gsd, FEATURE))
    expect = Expectation()
    for source in planted.values():
        if entry == source:  # a linked planted lock: the very file, unchanged
            expect.planted[FEATURE] = source
            expect.reclaimable.add(FEATURE)
    left = "free" if entry.missing else "planted" if expect.planted else "owner"
    found = judge_leftovers(gsd, expect, pid)
    found += recover(gsd, expect, pid, named=named, turn=turn)
    found += final_clean(gsd, expect)
    return describe("random kill", found, turn=turn, named=named, laps=laps), left


@pytest.mark.timeout(TIMEOUT)
def test_random_time_kills_of_a_looping_child_break_no_promise(tmp_path: Path) -> None:
    """Runs last: tops the file's kill count up to ``MAHABHARATHA_STRESS`` (if set)."""
    wanted = stress()
    count = max(DEFAULT_RANDOM_KILLS, (wanted or 0) - TALLY.kills)
    rng = random.Random(os.environ.get("MAHABHARATHA_SEED", "faults"))
    problems: list[str] = []
    seen: set[str] = set()
    for turn in range(count):
        found, left = _random_kill(tmp_path / "gsd", turn, rng)
        problems += found
        seen.add(left)
    TALLY.violations += problems
    assert not problems, "\n".join(problems[:20])
    assert len(seen) >= 2, f"every kill landed in the same state ({seen}): not random enough"
    if wanted is not None:
        assert TALLY.kills >= wanted, f"only {TALLY.kills} kills of the {wanted} asked for"
