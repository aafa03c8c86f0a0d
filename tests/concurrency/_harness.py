"""Machinery of the multi-process race tests: implementations, forked teams, lock-step rounds.

Every race test runs against two implementations of the legacy lock API:

- ``new``: ``mahabharatha.commands._utils``, the hardened module; the invariant must hold;
- ``old``: ``tests.support.old_design``, the design it replaces; the same assertion must FAIL
  (``xfail(strict=True, raises=AssertionError)``), so a test that stops detecting the race
  it is about turns red instead of passing quietly.

Only the old design may get its race windows widened (``Impl.widen``); for the new one that call
does nothing. Children are forked, synchronised by barriers and events (never by sleeping), and
always reaped. A child that raises writes its traceback to a file and breaks the barriers, and the
parent turns that into a :class:`HarnessError` (not an ``AssertionError``, so a broken harness never
passes for the expected failure of the old design).
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Barrier
from pathlib import Path
from types import ModuleType
from typing import Any, Final, TypeVar

import pytest

from mahabharatha.backends.files.folder import GuardBusyError

CTX: Final = multiprocessing.get_context("fork")
"""Fork: children share the parent's imports and need nothing pickled."""

SYNC_TIMEOUT: Final = 30.0
"""Longest wait at a barrier: a dead or stuck peer breaks it instead of hanging the test."""

REAP_TIMEOUT: Final = 10.0
"""How long a finished team gets to exit before it is terminated."""

DEFAULT_TRIALS: Final = 250
"""Trials per case when MAHABHARATHA_STRESS is unset: the folder runs in about 8 s on two cores.
Run by hand with MAHABHARATHA_STRESS=2000 for the full storm (2000 trials per K)."""

FEATURE: Final = "race-feat"

STALE_AFTER_SECONDS: Final = 7200

RECORD_RE: Final = re.compile(r"[0-9]+:[0-9]+(?:\.[0-9]+)?")
"""A complete lock record, as the writers of both implementations produce it."""

RECLAIM_DEAD_JUDGE: Final = """
import sys
from mahabharatha import locks
try:
    locks.acquire("feat", sys.argv[1], reclaim_dead=True)
    print("WON")
except locks.LockHeldError:
    print("HELD")
"""
"""A script (``python -c``) that tries to take feature ``feat`` of gsd argv[1] with
``reclaim_dead``: prints WON or HELD. Run where a judgement is attacked (another namespace,
another user)."""

MODULES: Final = {"new": "mahabharatha.commands._utils", "old": "tests.support.old_design"}

stress: Final = pytest.mark.stress

GUARD_TRIES: Final = 20
"""Refusals in a row after which a guarded step is called starved (10 s: a guard never let go)."""

T = TypeVar("T")


class HarnessError(RuntimeError):
    """The test machinery failed (a child raised, a barrier broke): not a verdict on the lock."""


def require(condition: bool, message: str) -> None:
    """A sanity check of the test itself (it exercised what it claims to): HarnessError if not."""
    if not condition:
        raise HarnessError(message)


def tried_again(step: Callable[[], T], refused: Any) -> T:
    """``step()``, called again while it raises ``GuardBusyError``: the contract's "try again"
    when the folder guard's holder did not run for ``GUARD_WAIT_SECONDS``, which a parallel run
    gives now and then. Each refusal is counted in ``refused`` (a shared ``Value``); the
    ``GUARD_TRIES``-th in a row is raised (the guard is never let go)."""
    for _ in range(GUARD_TRIES - 1):
        try:
            return step()
        except GuardBusyError:
            refused.value += 1
    return step()


def trials(default: int = DEFAULT_TRIALS) -> int:
    """Trials per case: ``MAHABHARATHA_STRESS`` when set, else ``default``."""
    raw = os.environ.get("MAHABHARATHA_STRESS", "").strip()
    if not raw:
        return default
    value = int(raw)
    if value < 1:
        raise ValueError(f"MAHABHARATHA_STRESS must be a positive integer, not {raw!r}")
    return value


TEST_TIMEOUT: Final = 90.0 + max(0, trials() - DEFAULT_TRIALS) * 0.5
"""pytest-timeout per race test: 90 s at the default size (each takes a few seconds), more for a
storm run by hand."""


@dataclass(frozen=True)
class Impl:
    """One implementation of the legacy API, loaded in the process that uses it."""

    name: str
    module: ModuleType

    def acquire(self, gsd: Path) -> bool:
        return bool(self.module.acquire_feature_lock(FEATURE, str(gsd)))

    def release(self, gsd: Path) -> None:
        self.module.release_feature_lock(FEATURE, str(gsd))

    def widen(self, point: str, hook: Callable[[], None]) -> None:
        """Install a race-window hook in the OLD design; the new code never gets such help."""
        hooks: dict[str, Callable[[], None]] | None = getattr(self.module, "HOOKS", None)
        if self.name == "old" and hooks is not None:
            hooks[point] = hook


def load(name: str) -> Impl:
    return Impl(name, importlib.import_module(MODULES[name]))


def implementations(breaks: str) -> list[Any]:
    """Parameters ``new`` and ``old``; ``old`` must fail the test's assertion (strict xfail)."""
    return [
        pytest.param("new", id="new"),
        pytest.param(
            "old",
            id="old",
            marks=pytest.mark.xfail(
                strict=True, raises=AssertionError, reason=f"old design: {breaks}"
            ),
        ),
    ]


def lock_path(gsd: Path) -> Path:
    return gsd / "specs" / FEATURE / ".lock"


def read_entry(path: Path) -> bytes | None:
    """The bytes of the file at ``path`` (no symlink followed), or None when there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def record_pid(content: bytes | None) -> int | None:
    """The pid of a complete record, else None."""
    if content is None:
        return None
    text = content.decode("ascii", "replace").strip()
    if not RECORD_RE.fullmatch(text):
        return None
    return int(text.split(":", 1)[0])


def plant(path: Path, content: bytes, *, age_seconds: float = 0.0) -> None:
    """Put a lock file with ``content`` (and an mtime ``age_seconds`` old) at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    if age_seconds:
        when = os.stat(path).st_mtime - age_seconds
        os.utime(path, (when, when))


def meet(barrier: Barrier) -> None:
    """Child side of a barrier (a race-window hook of the old design, or a step of a trial)."""
    barrier.wait(SYNC_TIMEOUT)


class WindowHold:
    """For the old design's free-running tests: hold a race window open until another process
    has passed a given point (or until nobody else could pass it: no deadlock at the end).

    ``hold`` is installed inside the window, ``passed`` at the point others must reach, and every
    party calls ``leave`` when it stops looping. Deterministic: no sleeps, no timing.
    """

    def __init__(self, parties: int) -> None:
        self.cond = CTX.Condition()
        self.passes = CTX.Value("q", 0, lock=False)
        self.running = CTX.Value("q", parties, lock=False)
        self.holding = CTX.Value("q", 0, lock=False)

    def passed(self) -> None:
        with self.cond:
            self.passes.value += 1
            self.cond.notify_all()

    def hold(self) -> None:
        with self.cond:
            seen = self.passes.value
            self.holding.value += 1
            self.cond.notify_all()
            try:
                done = self.cond.wait_for(
                    lambda: self.passes.value > seen or self.holding.value >= self.running.value,
                    SYNC_TIMEOUT,
                )
                if not done:
                    raise HarnessError("a held race window was never passed")
            finally:
                self.holding.value -= 1

    def leave(self) -> None:
        with self.cond:
            self.running.value -= 1
            self.cond.notify_all()


def stale_lock(owner_pid: int, trial: int) -> tuple[bytes, float]:
    """A stale record of ``owner_pid`` (unique per trial), and its mtime age (0: now)."""
    stamp = time.time() - STALE_AFTER_SECONDS - 600 - trial * 1e-3
    return f"{owner_pid}:{stamp}".encode(), 0.0


# (content, mtime age): corrupt records, an empty file past the 2 s grace, undecodable bytes.
CORRUPT_LOCKS: list[tuple[bytes, float]] = [
    (b"not-a-lock", 0.0),
    (b"4242:", 0.0),
    (b"", 3600.0),
    (b"\xff\xfe\xfa\xfb", 0.0),
    (b"0:1700000000.0", 0.0),
    (b"4242:1700000000.0:extra", 0.0),
]


def corrupt_lock(owner_pid: int, trial: int) -> tuple[bytes, float]:
    """One of ``CORRUPT_LOCKS``, in turn, and its mtime age."""
    return CORRUPT_LOCKS[trial % len(CORRUPT_LOCKS)]


class Team:
    """Forked children of one test; errors collected; always reaped by :func:`team`."""

    def __init__(self, err_dir: Path) -> None:
        self.err_dir = err_dir
        self.procs: list[BaseProcess] = []
        self.barriers: list[Barrier] = []

    def barrier(self, parties: int) -> Barrier:
        """A barrier that is broken when any child of the team fails (create before spawning)."""
        barrier = CTX.Barrier(parties)
        self.barriers.append(barrier)
        return barrier

    def spawn(self, target: Callable[..., None], *args: Any) -> int:
        """Start ``target(*args)`` in a forked child; its pid."""
        index = len(self.procs)
        err_path = self.err_dir / f"child-{index}.txt"
        proc = CTX.Process(
            target=_child_main, args=(err_path, self.barriers, target, args), daemon=True
        )
        proc.start()
        self.procs.append(proc)
        assert proc.pid is not None
        return proc.pid

    def wait(self, barrier: Barrier) -> None:
        """Parent side of a barrier: a broken barrier becomes a HarnessError with the cause."""
        try:
            barrier.wait(SYNC_TIMEOUT)
        except threading.BrokenBarrierError:
            self.raise_child_errors()
            raise HarnessError("a barrier broke (a child is stuck or died)") from None

    def join(self) -> None:
        """Wait for every child to finish, then raise if any failed."""
        for proc in self.procs:
            proc.join(SYNC_TIMEOUT)
        self.raise_child_errors()
        stuck = [p.pid for p in self.procs if p.is_alive()]
        if stuck:
            raise HarnessError(f"children still running after {SYNC_TIMEOUT} s: {stuck}")

    def raise_child_errors(self) -> None:
        reports = sorted(self.err_dir.glob("child-*.txt"))
        if reports:
            text = "\n".join(f"--- {p.name}\n{p.read_text()}" for p in reports)
            raise HarnessError(f"child process failed:\n{text}")
        bad = {p.pid: p.exitcode for p in self.procs if p.exitcode not in (None, 0)}
        if bad:
            raise HarnessError(f"child processes exited abnormally: {bad}")

    def reap(self) -> None:
        for barrier in self.barriers:
            barrier.abort()
        for proc in self.procs:
            proc.join(REAP_TIMEOUT)
            if proc.is_alive():
                proc.terminate()
                proc.join(REAP_TIMEOUT)
            if proc.is_alive():
                proc.kill()
                proc.join()


@contextmanager
def team(tmp_path: Path) -> Iterator[Team]:
    err_dir = tmp_path / "child-errors"
    err_dir.mkdir()
    crew = Team(err_dir)
    try:
        yield crew
    finally:
        crew.reap()


def _child_main(
    err_path: Path,
    barriers: list[Barrier],
    target: Callable[..., None],
    args: tuple[Any, ...],
) -> None:
    try:
        target(*args)
    except BaseException:
        err_path.write_text(traceback.format_exc())
        for barrier in barriers:
            barrier.abort()
        sys.exit(1)


class Rounds:
    """Lock-step trials: ``workers`` long-lived children and the parent meet twice per trial.

    The parent prepares the trial, then ``run_trial`` releases every worker at once (``go``) and
    returns when each one has finished its step (``done``). Forking per trial would be too slow.
    """

    def __init__(self, crew: Team, workers: int) -> None:
        self.crew = crew
        self.go = crew.barrier(workers + 1)
        self.done = crew.barrier(workers + 1)
        self.stop = CTX.Value("b", 0, lock=False)

    # worker side
    def next_trial(self) -> bool:
        self.go.wait(SYNC_TIMEOUT)
        return not self.stop.value

    def end_trial(self) -> None:
        self.done.wait(SYNC_TIMEOUT)

    # parent side
    def run_trial(self) -> None:
        self.crew.wait(self.go)
        self.crew.wait(self.done)

    def finish(self) -> None:
        self.stop.value = 1
        self.crew.wait(self.go)
        self.crew.join()
