"""The locks under test, each behind one small adapter.

Three shapes of adapter, one per kind of scenario:

- ``Cycle``: one uncontended acquire + release in this process (scenario 1);
- ``TryLock``: ``try_acquire() -> bool`` and ``release()`` of one feature, made *inside* a worker
  process after the fork (scenarios 2 and 3);
- ``HandOff``: a holder that acquires without waiting and a waiter that blocks (scenario 6).

Groups: ``ours`` (this package), ``floor`` (the bare system calls a ``pid:timestamp`` lock cannot
do without), ``peer`` (the locks people use today), ``baseline`` (the old check-then-create
design, ``tests/support/old_design.py``). A peer whose module is not importable is skipped with
a reason; ours and the floors always run.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

FEATURE = "bench-feature"
"""The one feature of the single-feature scenarios."""

_EXCL_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC


class BenchError(RuntimeError):
    """A contender misbehaved (an uncontended acquire failed, a record is missing): the run is
    invalid, so the benchmark stops rather than report a number for it."""


def record() -> bytes:
    """A ``pid:timestamp`` record, made fresh like every real writer makes it."""
    return f"{os.getpid()}:{time.time()}".encode("ascii")


def gsd_with_feature(work: Path, feature: str = FEATURE) -> str:
    """A gsd folder under ``work`` whose ``specs/<feature>`` folder exists; its path."""
    gsd = work / "gsd"
    (gsd / "specs" / feature).mkdir(parents=True, exist_ok=True)
    return str(gsd)


def missing_module(module: str | None) -> str | None:
    """``None`` when ``module`` imports, else why not (the row is then skipped)."""
    if module is None:
        return None
    try:
        importlib.import_module(module)
    except ImportError as error:
        return f"{module} not importable ({error})"
    return None


# --------------------------------------------------------------------------- the bare floors


def link_floor_try(folder: str) -> tuple[Callable[[], bool], Callable[[], None]]:
    """Bare ``link()`` lock on ``<folder>/.lock``: private temp file, ``link``, unlink the temp.

    Plain path-based system calls, no checks beyond the ``EEXIST`` of ``link``: the least any
    ``link``-published ``pid:timestamp`` lock must do.
    """
    lock = os.path.join(folder, ".lock")
    temp = os.path.join(folder, f".lock.{os.getpid()}.tmp")

    def try_acquire() -> bool:
        fd = os.open(temp, _EXCL_FLAGS, 0o644)
        try:
            os.write(fd, record())
        finally:
            os.close(fd)
        try:
            os.link(temp, lock)
        except FileExistsError:
            return False
        finally:
            os.unlink(temp)
        return True

    def release() -> None:
        os.unlink(lock)

    return try_acquire, release


def excl_floor_try(folder: str) -> tuple[Callable[[], bool], Callable[[], None]]:
    """Bare ``O_EXCL`` lock: create + write + close; release unlinks (readers may see it empty)."""
    lock = os.path.join(folder, ".lock")

    def try_acquire() -> bool:
        try:
            fd = os.open(lock, _EXCL_FLAGS, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(fd, record())
        finally:
            os.close(fd)
        return True

    def release() -> None:
        os.unlink(lock)

    return try_acquire, release


# --------------------------------------------------------------------------- scenario 1: cycles


@dataclass(frozen=True)
class Cycle:
    """An uncontended acquire + release, as its users write it."""

    key: str
    label: str
    group: str
    make: Callable[[Path], Callable[[], None]]  # work folder -> one cycle
    module: str | None = None  # must import, else the row is skipped


def _checked(try_acquire: Callable[[], bool], release: Callable[[], None]) -> Callable[[], None]:
    def cycle() -> None:
        if not try_acquire():
            raise BenchError("an uncontended acquire failed")
        release()

    return cycle


def _ours_legacy(work: Path) -> Callable[[], None]:
    from mahabharatha.commands._utils import acquire_feature_lock, release_feature_lock

    gsd = gsd_with_feature(work)
    return _checked(
        lambda: acquire_feature_lock(FEATURE, gsd), lambda: release_feature_lock(FEATURE, gsd)
    )


def _ours_context(work: Path) -> Callable[[], None]:
    from mahabharatha.locks import FeatureLock

    lock = FeatureLock(FEATURE, gsd_with_feature(work), heartbeat=None, timeout=0)

    def cycle() -> None:
        with lock:
            pass

    return cycle


def _floor_link(work: Path) -> Callable[[], None]:
    return _checked(*link_floor_try(str(Path(gsd_with_feature(work)) / "specs" / FEATURE)))


def _floor_excl(work: Path) -> Callable[[], None]:
    return _checked(*excl_floor_try(str(Path(gsd_with_feature(work)) / "specs" / FEATURE)))


def _naive(work: Path) -> Callable[[], None]:
    from tests.support import old_design

    gsd = gsd_with_feature(work)
    return _checked(
        lambda: old_design.acquire_feature_lock(FEATURE, gsd),
        lambda: old_design.release_feature_lock(FEATURE, gsd),
    )


def _with_block(lock: object) -> Callable[[], None]:
    def cycle() -> None:
        with lock:  # type: ignore[attr-defined]
            pass

    return cycle


def _filelock(work: Path) -> Callable[[], None]:
    import filelock

    work.mkdir(parents=True, exist_ok=True)
    return _with_block(filelock.FileLock(str(work / "bench.lock")))


def _softfilelock(work: Path) -> Callable[[], None]:
    import filelock

    work.mkdir(parents=True, exist_ok=True)
    return _with_block(filelock.SoftFileLock(str(work / "bench.lock")))


def _fasteners(work: Path) -> Callable[[], None]:
    import fasteners

    work.mkdir(parents=True, exist_ok=True)
    lock = fasteners.InterProcessLock(str(work / "bench.lock"))
    return _checked(lambda: lock.acquire(blocking=False), lock.release)


def _portalocker(work: Path) -> Callable[[], None]:
    import portalocker

    work.mkdir(parents=True, exist_ok=True)
    return _with_block(portalocker.Lock(str(work / "bench.lock"), fail_when_locked=True))


def _flufl(work: Path) -> Callable[[], None]:
    from datetime import timedelta

    from flufl.lock import Lock

    work.mkdir(parents=True, exist_ok=True)
    lock = Lock(str(work / "bench.lock"), lifetime=timedelta(seconds=60))

    def cycle() -> None:
        lock.lock(timeout=timedelta(seconds=1))
        lock.unlock()

    return cycle


CYCLES: tuple[Cycle, ...] = (
    Cycle("ours-legacy", "ours: acquire_feature_lock + release_feature_lock", "ours", _ours_legacy),
    Cycle("ours-context", "ours: with FeatureLock(heartbeat=None)", "ours", _ours_context),
    Cycle("floor-link", "floor: temp file + link() + unlink both", "floor", _floor_link),
    Cycle("floor-excl", "floor: O_EXCL create + write + close + unlink", "floor", _floor_excl),
    Cycle("filelock", "filelock FileLock", "peer", _filelock, "filelock"),
    Cycle("softfilelock", "filelock SoftFileLock", "peer", _softfilelock, "filelock"),
    Cycle("fasteners", "fasteners InterProcessLock", "peer", _fasteners, "fasteners"),
    Cycle("portalocker", "portalocker Lock", "peer", _portalocker, "portalocker"),
    Cycle("flufl", "flufl.lock Lock", "peer", _flufl, "flufl.lock"),
    Cycle(
        "naive",
        "naive: old check-then-create design",
        "baseline",
        _naive,
        "tests.support.old_design",
    ),
)


# --------------------------------------------------------------------------- scenarios 2 and 3


@dataclass(frozen=True)
class TryLock:
    """A try-lock on one feature folder, built inside the worker process (after the fork)."""

    key: str
    label: str
    group: str
    make: Callable[[str, str], tuple[Callable[[], bool], Callable[[], None]]]  # gsd, feature
    module: str | None = None
    blocking: bool = False  # try_acquire waits until it wins (always returns True)


def _ours_legacy_try(gsd: str, feature: str) -> tuple[Callable[[], bool], Callable[[], None]]:
    from mahabharatha.commands._utils import acquire_feature_lock, release_feature_lock

    return (
        lambda: acquire_feature_lock(feature, gsd),
        lambda: release_feature_lock(feature, gsd),
    )


def _ours_waiting_try(gsd: str, feature: str) -> tuple[Callable[[], bool], Callable[[], None]]:
    from mahabharatha import locks

    def acquire() -> bool:
        locks.acquire(feature, gsd, timeout=None)
        return True

    def release() -> None:
        locks.release(feature, gsd)

    return acquire, release


def _floor_link_try(gsd: str, feature: str) -> tuple[Callable[[], bool], Callable[[], None]]:
    return link_floor_try(os.path.join(gsd, "specs", feature))


def _naive_try(gsd: str, feature: str) -> tuple[Callable[[], bool], Callable[[], None]]:
    from tests.support import old_design

    return (
        lambda: old_design.acquire_feature_lock(feature, gsd),
        lambda: old_design.release_feature_lock(feature, gsd),
    )


OURS_TRY = TryLock("ours-legacy", "ours: acquire_feature_lock, retried", "ours", _ours_legacy_try)
FLOOR_TRY = TryLock("floor-link", "floor: temp file + link(), retried", "floor", _floor_link_try)
NAIVE_TRY = TryLock(
    "naive",
    "naive: old check-then-create design, retried",
    "baseline",
    _naive_try,
    "tests.support.old_design",
)
OURS_WAITING = TryLock(
    "ours-waiting",
    "ours: locks.acquire(timeout=None), sleeping backoff",
    "ours",
    _ours_waiting_try,
    blocking=True,
)

CONTENDED: tuple[TryLock, ...] = (OURS_TRY, FLOOR_TRY, OURS_WAITING, NAIVE_TRY)
STORM: tuple[TryLock, ...] = (OURS_TRY, FLOOR_TRY, NAIVE_TRY)


# --------------------------------------------------------------------------- scenario 6


@dataclass(frozen=True)
class HandOffLock:
    """Holder side (acquire without waiting, release) and waiter side (block until acquired).

    ``make(work)`` is called in each process; it returns ``(acquire_now, wait_acquire,
    release)``. ``wait_acquire(on_first_wait)`` must call ``on_first_wait()`` once, as soon as it
    knows it is blocked (or just before it blocks, if the lock cannot tell it).
    """

    key: str
    label: str
    group: str
    make: Callable[
        [Path], tuple[Callable[[], None], Callable[[Callable[[], None]], None], Callable[[], None]]
    ]
    module: str | None = None


WAIT_LIMIT_SECONDS = 10.0
"""A waiter that has not got the lock after this long means a broken hand-off: fail loudly."""


def _ours_handoff(
    work: Path,
) -> tuple[Callable[[], None], Callable[[Callable[[], None]], None], Callable[[], None]]:
    from mahabharatha import locks

    gsd = gsd_with_feature(work)

    def acquire_now() -> None:
        locks.acquire(FEATURE, gsd, timeout=0)

    def wait_acquire(on_first_wait: Callable[[], None]) -> None:
        told = False

        def on_wait(_info: object, _left: float | None) -> None:
            nonlocal told
            if not told:
                told = True
                on_first_wait()

        locks.acquire(FEATURE, gsd, timeout=WAIT_LIMIT_SECONDS, on_wait=on_wait)
        if not told:
            raise BenchError("the waiter got the lock without waiting: the holder let go early")

    def release() -> None:
        locks.release(FEATURE, gsd)

    return acquire_now, wait_acquire, release


def _filelock_handoff(
    work: Path,
) -> tuple[Callable[[], None], Callable[[Callable[[], None]], None], Callable[[], None]]:
    import filelock

    work.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(str(work / "bench.lock"))

    def acquire_now() -> None:
        lock.acquire(timeout=0)

    def wait_acquire(on_first_wait: Callable[[], None]) -> None:
        on_first_wait()  # filelock has no wait callback: say so just before blocking
        lock.acquire(timeout=WAIT_LIMIT_SECONDS)

    return acquire_now, wait_acquire, lock.release


HANDOFFS: tuple[HandOffLock, ...] = (
    HandOffLock("ours", "ours: locks.acquire(timeout=...)", "ours", _ours_handoff),
    HandOffLock(
        "filelock",
        "filelock FileLock(timeout=...), 50 ms polls",
        "peer",
        _filelock_handoff,
        "filelock",
    ),
)
