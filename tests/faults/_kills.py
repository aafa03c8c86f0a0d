"""Machinery of the kill tests: fork a child, SIGKILL it mid-operation, judge what it left.

The parent plants the entries a scenario starts from, forks a child that runs the operation,
and reaps it. After every kill the parent checks the feature folders against the promises
(:func:`judge_leftovers`), that the kernel let go of the guard, and that the next acquire
(after ``locks.clean`` where the design says so) recovers. Children never return into pytest:
they leave through ``os._exit``.
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Final
from unittest import mock

from mahabharatha import locks
from mahabharatha.backends.files import lockfile
from mahabharatha.backends.files.snapshot import format_record
from mahabharatha.commands import _utils

STALE_AFTER_SECONDS: Final = 7200.0

RECORD_RE: Final = re.compile(rb"[0-9]+:[0-9]+(?:\.[0-9]+)?")
"""A complete record as this module writes it."""

TEMP_GLOB: Final = ".lock.*.tmp"


class HarnessError(RuntimeError):
    """The test machinery failed (a child raised instead of dying): not a verdict on the lock."""


@dataclass(frozen=True)
class Entry:
    """What is at a lock path: bytes (None: nothing there) and inode."""

    content: bytes | None
    inode: int | None = None

    @property
    def missing(self) -> bool:
        return self.content is None


def entry_at(path: Path) -> Entry:
    """The regular file at ``path`` without following a link; a non-file is reported as such."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return Entry(None)
    try:
        return Entry(os.read(fd, 8192), os.fstat(fd).st_ino)
    finally:
        os.close(fd)


def record_pid(content: bytes | None) -> int | None:
    """The pid of a complete, parseable record, else None."""
    if content is None or not RECORD_RE.fullmatch(content.strip()):
        return None
    return int(content.split(b":", 1)[0])


def lock_of(gsd: Path, feature: str) -> Path:
    return gsd / "specs" / feature / ".lock"


def temps(gsd: Path) -> list[Path]:
    specs = gsd / "specs"
    return sorted(specs.glob(f"*/{TEMP_GLOB}")) if specs.is_dir() else []


def plant(gsd: Path, feature: str, content: bytes, *, age: float = 0.0) -> Entry:
    """A foreign entry at the feature's lock path (mtime ``age`` seconds ago)."""
    path = lock_of(gsd, feature)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    if age:
        when = path.stat().st_mtime - age
        os.utime(path, (when, when))
    return entry_at(path)


def stale_record(pid: int = 4242) -> bytes:
    return format_record(pid, _utils.now() - STALE_AFTER_SECONDS - 600)


def live_record(pid: int) -> bytes:
    return format_record(pid, _utils.now())


@contextmanager
def publish_mode(named: bool) -> Iterator[None]:
    """``named``: the fallback publish through a named temp file (no ``O_TMPFILE``)."""
    with mock.patch.object(lockfile.TMPFILE, "usable", lockfile.TMPFILE.usable and not named):
        yield


@contextmanager
def clock_ahead(seconds: float) -> Iterator[None]:
    """The lock code's clock (``_utils.time``) moved ``seconds`` into the future."""
    real = _utils.time.time
    with mock.patch.object(_utils, "time", SimpleNamespace(time=lambda: real() + seconds)):
        yield


# --------------------------------------------------------------------------- children


@dataclass(frozen=True)
class Death:
    """How a child ended: killed by SIGKILL, or finished (``exit_code``), or raised."""

    pid: int
    killed: bool
    exit_code: int | None
    report: str


def run_child(body: Callable[[], None], *, named: bool = False) -> Death:
    """Fork; run ``body`` in the child and ``os._exit`` (0 when it returns); reap the child."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            # A worker in its own process group, as a job-control shell starts one: the owner's
            # group outlives it otherwise (pytest's), and its lock is rightly never "dead".
            os.setpgid(0, 0)
            os.close(read_end)
            if named:
                lockfile.TMPFILE.usable = False
            body()
            code = 0
        except BaseException:
            with_trace = traceback.format_exc().encode()
            os.write(write_end, with_trace[-60000:])
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        report = _read_all(read_end)
    finally:
        os.close(read_end)
        _, status = os.waitpid(pid, 0)
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    exited = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    death = Death(pid, killed, exited, report.decode("utf-8", "replace"))
    if not killed and exited != 0:
        raise HarnessError(f"child {pid} failed (status {status}):\n{death.report}")
    return death


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


# --------------------------------------------------------------------------- verdicts


@dataclass
class Expectation:
    """What may be at each feature's lock path after a kill.

    ``planted``: the entries the parent put there (left unchanged is always fine);
    ``reclaimable``: features whose planted entry is stale or corrupt (the next acquire wins);
    ``live``: features holding a live owner's lock, which must survive untouched;
    ``owner_may_hold``: the killed child may have left its own complete lock;
    ``must_exist``: features where *something* must remain (a refresh never removes).
    """

    planted: dict[str, Entry] = field(default_factory=dict)
    reclaimable: set[str] = field(default_factory=set)
    live: set[str] = field(default_factory=set)
    owner_may_hold: bool = True
    must_exist: set[str] = field(default_factory=set)
    features: tuple[str, ...] = ("feat",)


def judge_leftovers(gsd: Path, expect: Expectation, owner: int) -> list[str]:
    """Every broken promise at the lock paths after ``owner`` was killed (empty: all kept)."""
    problems = []
    for feature in expect.features:
        entry = entry_at(lock_of(gsd, feature))
        planted = expect.planted.get(feature)
        unchanged = planted is not None and entry == planted
        if feature in expect.live:
            if not unchanged:
                problems.append(f"{feature}: a live owner's lock was lost or changed: {entry}")
            continue
        if entry.missing:
            if feature in expect.must_exist:
                problems.append(f"{feature}: the lock vanished")
            continue
        if unchanged:
            continue
        pid = record_pid(entry.content)
        if pid == owner and expect.owner_may_hold:
            continue
        problems.append(
            f"{feature}: {entry.content!r} is neither nothing, the planted entry, "
            f"nor a complete lock of the killed owner {owner}"
        )
    return problems


def guard_is_free(gsd: Path, feature: str) -> bool:
    """The kernel dropped a dead process's ``flock``: a non-blocking attempt succeeds now."""
    folder = gsd / "specs" / feature
    try:
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(dfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    else:
        fcntl.flock(dfd, fcntl.LOCK_UN)
        return True
    finally:
        os.close(dfd)


def recover(gsd: Path, expect: Expectation, owner: int, *, named: bool, turn: int) -> list[str]:
    """The next acquire after a kill: wins exactly where it should; then leaves no debris.

    A complete lock of the killed owner is active (held) until it is stale, or reclaimed at once
    with ``reclaim_dead``: the two ways alternate with ``turn``.
    """
    problems = []
    me = os.getpid()
    with publish_mode(named):
        for feature in expect.features:
            if not guard_is_free(gsd, feature):
                problems.append(f"{feature}: the dead owner's guard is still held")
            if feature in expect.live:
                if _utils.acquire_feature_lock(feature, str(gsd)):
                    problems.append(f"{feature}: acquired over a live owner's lock")
                continue
            entry = entry_at(lock_of(gsd, feature))
            planted = expect.planted.get(feature)
            free = entry.missing or (entry == planted and feature in expect.reclaimable)
            got = _utils.acquire_feature_lock(feature, str(gsd))
            if got != free:
                problems.append(f"{feature}: next acquire returned {got} over {entry}")
                continue
            if not got:  # the killed owner's own complete lock: held until reclaimable
                got = _reclaim_dead_owners_lock(gsd, feature, turn)
                if not got:
                    problems.append(f"{feature}: the dead owner's lock could not be reclaimed")
                    continue
            if record_pid(entry_at(lock_of(gsd, feature)).content) != me:
                problems.append(f"{feature}: after acquiring, the lock is not ours")
            _utils.release_feature_lock(feature, str(gsd))
    problems += [f"temp file left after the next acquire: {t}" for t in temps(gsd)]
    return problems


def _reclaim_dead_owners_lock(gsd: Path, feature: str, turn: int) -> bool:
    if turn % 2:
        with clock_ahead(STALE_AFTER_SECONDS + 1):
            return _utils.acquire_feature_lock(feature, str(gsd))
    try:
        locks.acquire(feature, gsd, reclaim_dead=True)
    except locks.LockHeldError:
        return False
    return True


def final_clean(gsd: Path, expect: Expectation) -> list[str]:
    """After one ``locks.clean`` nothing is left but the live owners' locks."""
    locks.clean(gsd)
    problems = [f"left after clean: {t}" for t in temps(gsd)]
    for feature in expect.features:
        entry = entry_at(lock_of(gsd, feature))
        if feature in expect.live:
            if entry != expect.planted[feature]:
                problems.append(f"{feature}: clean touched a live owner's lock")
        elif not entry.missing:
            problems.append(f"{feature}: left after clean: {entry}")
    return problems


def describe(label: str, problems: list[str], **facts: Any) -> list[str]:
    where = ", ".join(f"{k}={v}" for k, v in facts.items())
    return [f"{label} [{where}]: {p}" for p in problems]
