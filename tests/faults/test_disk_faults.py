"""Disk faults: full, read-only, no permission, no descriptors left, name too long.

Each fault is injected at every system call of acquire, reclaim, release, refresh and clean
(``tests/faults/_syscalls.py``; one test per call, named after it), and produced for real
where the machine allows: a 16 KiB tmpfs filled up, the same tmpfs remounted read-only, a
child dropped to uid 65534, a child out of descriptors (``RLIMIT_NOFILE``), a path longer than
``PATH_MAX``. Each must end in a clear ``OSError`` carrying the fault's errno (or, where the
fault only hides a read, the very answer a fault-free call gives), no half-made lock, no temp
file, and the next call after the fault clears must work.

The defects these tests found (D1-D5 in ``design/failure-modes.md``) are fixed; their cases
now pass as plain tests.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import resource
import shutil
import tempfile
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import psutil  # noqa: F401  (loaded before a child drops to a uid that cannot read it)
import pytest

from mahabharatha import locks
from mahabharatha.backends.files.folder import GuardBusyError
from mahabharatha.backends.files.lockfile import is_temp_name
from mahabharatha.backends.files.snapshot import format_record
from mahabharatha.commands import _utils
from mahabharatha.constants import TEMP_ORPHAN_SECONDS
from tests.cli._support import invoke
from tests.faults._kills import (
    Entry,
    clock_ahead,
    entry_at,
    lock_of,
    plant,
    publish_mode,
    record_pid,
    run_child,
    stale_record,
    temps,
)
from tests.faults._mounts import Tmpfs
from tests.faults._syscalls import Call, fail_at, instrumented, trace
from tests.support.marks import needs_root

FEATURE: Final = "feat"

FAULTS: Final = {
    "ENOSPC": errno.ENOSPC,  # disk full
    "EROFS": errno.EROFS,  # read-only file system
    "EACCES": errno.EACCES,  # permission denied
    "EMFILE": errno.EMFILE,  # too many open files
    "ENAMETOOLONG": errno.ENAMETOOLONG,  # name too long
}

bounded = pytest.mark.timeout(30)


# --------------------------------------------------------------------------- operations


@dataclass(frozen=True)
class Op:
    """An operation to fault, the state it starts from and what a fault may leave.

    ``setup(gsd)`` returns a context; ``run(gsd, ctx)`` is the faulted call; ``done(gsd, ctx,
    result)`` checks a call that returned (it must be the fault-free outcome); ``after_error``
    lists the entries allowed at the lock path after an ``OSError``; ``again(gsd, ctx)`` is the
    next call once the fault cleared, and must leave the feature free.
    """

    name: str
    setup: Callable[[Path], Any]
    run: Callable[[Path, Any], object]
    done: Callable[[Path, Any, object], None]
    after_error: Callable[[Path, Any], list[Entry]]
    again: Callable[[Path, Any], None]
    named: bool = False
    commit: str = ""  # the call that makes the change (a later failure is "after the commit")


def _missing() -> Entry:
    return Entry(None)


def _acquire(gsd: Path, _ctx: Any) -> object:
    return _utils.acquire_feature_lock(FEATURE, str(gsd))


def _acquired(gsd: Path, _ctx: Any, result: object) -> None:
    assert result is True, f"acquire returned {result!r}"
    assert record_pid(entry_at(lock_of(gsd, FEATURE)).content) == os.getpid()


def _acquire_again(gsd: Path, _ctx: Any) -> None:
    _utils.release_feature_lock(FEATURE, str(gsd))  # ours, if the faulted call won it
    assert _utils.acquire_feature_lock(FEATURE, str(gsd)) is True, "acquire failed after the fault"
    _utils.release_feature_lock(FEATURE, str(gsd))


def _plant_stale(gsd: Path) -> Entry:
    return plant(gsd, FEATURE, stale_record())


def _plant_live(gsd: Path) -> Entry:
    return plant(gsd, FEATURE, format_record(4242, _utils.now()))


def _not_acquired(gsd: Path, ctx: Entry, result: object) -> None:
    assert result is False, f"acquire over a live lock returned {result!r}"
    assert entry_at(lock_of(gsd, FEATURE)) == ctx, "the live lock changed"


def _still_held(gsd: Path, ctx: Entry) -> None:
    assert _utils.acquire_feature_lock(FEATURE, str(gsd)) is False
    assert entry_at(lock_of(gsd, FEATURE)) == ctx
    os.unlink(lock_of(gsd, FEATURE))


def _own_lock(gsd: Path) -> Entry:
    assert _utils.acquire_feature_lock(FEATURE, str(gsd))
    return entry_at(lock_of(gsd, FEATURE))


def _released(gsd: Path, _ctx: Any, result: object) -> None:
    assert entry_at(lock_of(gsd, FEATURE)).missing, "the lock is still there"


def _release_again(gsd: Path, _ctx: Any) -> None:
    _utils.release_feature_lock(FEATURE, str(gsd))


def _holder(gsd: Path) -> tuple[locks.FeatureLock, Entry]:
    held = locks.FeatureLock(FEATURE, gsd, heartbeat=None, timeout=0).acquire()
    return held, entry_at(lock_of(gsd, FEATURE))


def _refreshed(gsd: Path, ctx: tuple[locks.FeatureLock, Entry], result: object) -> None:
    now = entry_at(lock_of(gsd, FEATURE))
    assert record_pid(now.content) == os.getpid() and now != ctx[1], "no fresh record"


def _refresh_again(gsd: Path, ctx: tuple[locks.FeatureLock, Entry]) -> None:
    ctx[0].refresh()  # must still be ours: a fault is not a loss
    ctx[0].release()
    assert entry_at(lock_of(gsd, FEATURE)).missing, "release after refresh left the lock"


def _holder_release_again(gsd: Path, ctx: tuple[locks.FeatureLock, Entry]) -> None:
    ctx[0].release()
    assert entry_at(lock_of(gsd, FEATURE)).missing, "a second release left the lock behind"


def _debris(gsd: Path) -> Entry:
    planted = _plant_stale(gsd)
    orphan = lock_of(gsd, FEATURE).parent / ".lock.4194000.00000000000000aa.tmp"
    orphan.write_bytes(b"1:2")
    os.utime(orphan, (1e9, 1e9))
    return planted


def _clean_returned(gsd: Path, ctx: Entry, result: object) -> None:
    """A clean that hit a fault on a read may leave what it could not judge (never more)."""
    assert entry_at(lock_of(gsd, FEATURE)) in (Entry(None), ctx), "clean changed the lock"


def _clean_again(gsd: Path, _ctx: Any) -> None:
    locks.clean(gsd)
    assert entry_at(lock_of(gsd, FEATURE)).missing and not temps(gsd), "clean left something"


def _acquire_ops(named: bool) -> list[Op]:
    suffix = "-named" if named else ""
    return [
        Op(
            f"acquire{suffix}",
            lambda gsd: None,
            _acquire,
            _acquired,
            lambda gsd, ctx: [_missing()],
            _acquire_again,
            named,
            "link",
        ),
        Op(
            f"acquire-reclaim{suffix}",
            _plant_stale,
            _acquire,
            _acquired,
            lambda gsd, ctx: [_missing(), ctx],
            _acquire_again,
            named,
            "link",
        ),
        Op(
            f"acquire-over-live{suffix}",
            _plant_live,
            _acquire,
            _not_acquired,
            lambda gsd, ctx: [ctx],
            _still_held,
            named,
        ),
    ]


OPS: Final = [
    *_acquire_ops(named=False),
    *_acquire_ops(named=True),
    Op(
        "release",
        _own_lock,
        lambda gsd, ctx: _utils.release_feature_lock(FEATURE, str(gsd)),
        _released,
        lambda gsd, ctx: [_missing(), ctx],
        _release_again,
    ),
    Op(
        "refresh",
        _holder,
        lambda gsd, ctx: ctx[0].refresh(),
        _refreshed,
        lambda gsd, ctx: [ctx[1]],
        _refresh_again,
        commit="rename",
    ),
    Op(
        "holder-release",
        _holder,
        lambda gsd, ctx: ctx[0].release(),
        _released,
        lambda gsd, ctx: [_missing(), ctx[1]],
        _holder_release_again,
    ),
    Op(
        "clean",
        _debris,
        lambda gsd, ctx: locks.clean(gsd),
        _clean_returned,
        lambda gsd, ctx: [_missing(), ctx],
        _clean_again,
    ),
]


def _steps(op: Op) -> list[Call]:
    """The system calls ``op`` makes from its starting state (traced once, at collection)."""
    root = Path(tempfile.mkdtemp(prefix="mahabharatha-trace-"))
    gsd = root / "gsd"  # as in the test: a gsd folder that does not exist yet
    try:
        with publish_mode(op.named):
            ctx = op.setup(gsd)
            return trace(lambda: op.run(gsd, ctx))
    finally:
        shutil.rmtree(root)


def _is_temp(call: Call) -> bool:
    return bool(call.args) and is_temp_name(str(call.args[0]))


def _cases() -> Iterator[Any]:
    """One case per (operation, system call), with every fault."""
    for op in OPS:
        for call in _steps(op):
            codes = tuple(FAULTS.values())
            yield pytest.param(op, call, codes, id=f"{op.name}-{call.label()}")


# --------------------------------------------------------------------------- injected


@bounded
@pytest.mark.parametrize(("op", "call", "codes"), list(_cases()))
def test_an_injected_fault_is_a_clear_error_and_leaves_nothing_half_made(
    tmp_path: Path, op: Op, call: Call, codes: tuple[int, ...]
) -> None:
    """Disk full, read-only, no permission, no descriptor, name too long: at this call."""
    for code in codes:
        _inject(tmp_path / errno.errorcode[code], op, call, code)


def _inject(gsd: Path, op: Op, call: Call, code: int) -> None:
    fault = errno.errorcode[code]
    with publish_mode(op.named):
        ctx = op.setup(gsd)
        before = set(temps(gsd))
        raised: OSError | None = None
        try:
            with instrumented(fail_at(call.index, code)):
                result = op.run(gsd, ctx)
        except OSError as error:
            raised = error
        if raised is None:
            op.done(gsd, ctx, result)  # the fault only hid a read: the fault-free answer
        else:
            assert raised.errno == code, f"{fault}: {raised!r} does not carry the fault's errno"
            assert str(raised), f"{fault}: an error without a message"
            left = entry_at(lock_of(gsd, FEATURE))
            allowed = op.after_error(gsd, ctx)
            assert left in allowed, f"{fault}: after {raised!r} the lock is {left}, not {allowed}"
        debris = set(temps(gsd)) - before
        if call.name == "unlink" and _is_temp(call):
            # The temp's own removal failed: it stays until it is an orphan (60 s old, or its
            # writer gone), and then any clean or reclaim sweeps it.
            with clock_ahead(TEMP_ORPHAN_SECONDS + 1):
                locks.clean(gsd, features=[FEATURE])
            debris = set(temps(gsd)) - before
        assert not debris, f"{fault}: temp files left: {debris}"
        op.again(gsd, ctx)
        assert not temps(gsd), f"{fault}: {temps(gsd)}"


# --------------------------------------------------------------------------- disk full


def _fill(point: Path) -> Path:
    """Fill the file system at ``point`` to the last byte; the filler's path."""
    filler = point / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for chunk in (4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
    finally:
        os.close(fd)
    return filler


@bounded
@pytest.mark.parametrize("mode", ["tmpfile", "named"])
def test_a_full_disk_makes_acquire_and_refresh_fail_clearly_and_recover(
    tmpfs: Tmpfs, mode: str
) -> None:
    gsd = tmpfs.point / "gsd"
    with publish_mode(mode == "named"):
        held = locks.FeatureLock("held", gsd, heartbeat=None, timeout=0).acquire()
        kept = entry_at(lock_of(gsd, "held"))
        (gsd / "specs" / FEATURE).mkdir()
        filler = _fill(tmpfs.point)
        try:
            for call in (
                lambda: _utils.acquire_feature_lock(FEATURE, str(gsd)),
                lambda: locks.acquire("new-folder", gsd),
                held.refresh,
            ):
                with pytest.raises(OSError) as caught:
                    call()
                assert caught.value.errno == errno.ENOSPC
                assert str(gsd) in str(caught.value), f"which lock? {caught.value}"
            assert entry_at(lock_of(gsd, FEATURE)).missing
            assert entry_at(lock_of(gsd, "new-folder")).missing
            assert entry_at(lock_of(gsd, "held")) == kept, "the failed refresh changed the lock"
            assert not temps(gsd)
            assert held.held, "a failed refresh is not a lost lock"
        finally:
            filler.unlink()
        assert _utils.acquire_feature_lock(FEATURE, str(gsd)) is True
        held.refresh()
        assert entry_at(lock_of(gsd, "held")) != kept
        held.release()
        _utils.release_feature_lock(FEATURE, str(gsd))
        assert not any((gsd / "specs").glob("*/.lock*"))


# --------------------------------------------------------------------------- read-only


@bounded
@pytest.mark.tmpfs_size("256k")
def test_a_read_only_file_system_fails_every_write_clearly_and_reads_still_work(
    tmpfs: Tmpfs,
) -> None:
    gsd = tmpfs.point / "gsd"
    mine = _own_lock_at(gsd, "mine")
    held = locks.FeatureLock("held", gsd, heartbeat=None, timeout=0).acquire()
    kept = entry_at(lock_of(gsd, "held"))
    stale = plant(gsd, "stale", stale_record())
    (gsd / "specs" / "empty").mkdir()
    tmpfs.remount("ro")
    try:
        attempts: dict[str, Callable[[], object]] = {
            "acquire": lambda: _utils.acquire_feature_lock("empty", str(gsd)),
            "acquire in a new folder": lambda: _utils.acquire_feature_lock("new", str(gsd)),
            "reclaim": lambda: _utils.acquire_feature_lock("stale", str(gsd)),
            "release": lambda: _utils.release_feature_lock("mine", str(gsd)),
            "refresh": held.refresh,
        }
        for what, attempt in attempts.items():
            with pytest.raises(OSError) as caught:
                attempt()
            assert caught.value.errno == errno.EROFS, (what, caught.value)
        assert entry_at(lock_of(gsd, "mine")) == mine
        assert entry_at(lock_of(gsd, "held")) == kept
        assert entry_at(lock_of(gsd, "stale")) == stale
        assert held.held
        checked = _utils.check_feature_lock("mine", str(gsd))
        assert checked is not None and checked["pid"] == os.getpid()
        assert locks.inspect("stale", gsd).state == "stale"
    finally:
        tmpfs.remount("rw")
    assert _utils.acquire_feature_lock("empty", str(gsd))
    assert _utils.acquire_feature_lock("stale", str(gsd))
    held.refresh()
    held.release()
    for feature in ("empty", "stale", "mine"):
        _utils.release_feature_lock(feature, str(gsd))
    assert not any((gsd / "specs").glob("*/.lock*"))


def _own_lock_at(gsd: Path, feature: str) -> Entry:
    assert _utils.acquire_feature_lock(feature, str(gsd))
    return entry_at(lock_of(gsd, feature))


@bounded
@pytest.mark.tmpfs_size("256k")
@pytest.mark.parametrize(
    "command",
    [
        pytest.param(("acquire", "free"), id="acquire"),
        pytest.param(("release", "mine"), id="release"),
    ],
)
def test_the_cli_on_a_read_only_disk_exits_3_with_a_sentence_naming_the_lock(
    tmpfs: Tmpfs, command: tuple[str, str]
) -> None:
    gsd = tmpfs.point / "gsd"
    (gsd / "specs" / "free").mkdir(parents=True)
    _own_lock_at(gsd, "mine")
    tmpfs.remount("ro")
    try:
        verb, feature = command
        result = invoke("lock", verb, feature, "--gsd-dir", gsd, "--pid", os.getpid())
    finally:
        tmpfs.remount("rw")
    assert result.exit_code == 3, result.output
    sentence = result.stderr.strip()
    assert len(sentence.splitlines()) == 1 and "Read-only file system" in sentence, sentence
    assert str(gsd / "specs" / feature) in sentence, sentence


# --------------------------------------------------------------------------- permission


def _as_nobody(body: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``body`` in a child that dropped to uid/gid 65534; its JSON-able report."""
    out = Path(tempfile.mkdtemp(prefix="mahabharatha-report-")) / "report.json"
    os.chmod(out.parent, 0o777)

    def child() -> None:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
        try:
            report = body()
        except BaseException:
            report = {"harness": traceback.format_exc()}
        out.write_text(json.dumps(report))

    try:
        run_child(child)
        report: dict[str, Any] = json.loads(out.read_text())
    finally:
        shutil.rmtree(out.parent)
    assert "harness" not in report, report["harness"]
    return report


def _outcome(call: Callable[[], object]) -> dict[str, Any]:
    try:
        value = call()
    except OSError as error:
        return {"raised": type(error).__name__, "errno": error.errno, "message": str(error)}
    return {"returned": repr(value)}


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder every user may traverse (pytest's own tmp folders are private to root)."""
    folder = Path(tempfile.mkdtemp(prefix="mahabharatha-perm-"))
    os.chmod(folder, 0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


@bounded
@needs_root
def test_permission_denied_for_real_is_a_clear_error_and_leaves_every_lock_as_it_was(
    shared_dir: Path,
) -> None:
    gsd = shared_dir / "gsd"
    stale = plant(gsd, "stale", stale_record())
    owned = plant(gsd, "owned", format_record(4242, _utils.now()))
    secret = plant(gsd, "secret", stale_record())
    os.chmod(lock_of(gsd, "secret"), 0o600)  # root's, unreadable for uid 65534
    (gsd / "specs" / "empty").mkdir()
    held = locks.FeatureLock("held", gsd, heartbeat=None, timeout=0).acquire()
    kept = entry_at(lock_of(gsd, "held"))

    def body() -> dict[str, Any]:
        return {
            "acquire": _outcome(lambda: _utils.acquire_feature_lock("empty", str(gsd))),
            "new folder": _outcome(lambda: _utils.acquire_feature_lock("new", str(gsd))),
            "reclaim": _outcome(lambda: _utils.acquire_feature_lock("stale", str(gsd))),
            "reclaim unreadable": _outcome(lambda: _utils.acquire_feature_lock("secret", str(gsd))),
            "release": _outcome(lambda: locks.release("owned", gsd, pid=4242)),
            "refresh": _outcome(_in_child(held).refresh),
            "check": _outcome(lambda: _utils.check_feature_lock("owned", str(gsd)) is not None),
            "check unreadable": _outcome(lambda: _utils.check_feature_lock("secret", str(gsd))),
        }

    report = _as_nobody(body)
    for what in ("acquire", "new folder", "reclaim", "reclaim unreadable", "release", "refresh"):
        assert report[what].get("errno") == errno.EACCES, (what, report[what])
        assert report[what]["raised"] == "PermissionError", (what, report[what])
    assert report["check"] == {"returned": "True"}
    assert report["check unreadable"] == {"returned": "None"}
    assert entry_at(lock_of(gsd, "stale")) == stale
    assert entry_at(lock_of(gsd, "owned")) == owned
    assert entry_at(lock_of(gsd, "secret")) == secret
    assert entry_at(lock_of(gsd, "held")) == kept
    assert not (gsd / "specs" / "new").exists()
    assert not temps(gsd)
    # Root may: the same calls now work.
    assert _utils.acquire_feature_lock("empty", str(gsd))
    assert _utils.acquire_feature_lock("stale", str(gsd))
    assert _utils.acquire_feature_lock("secret", str(gsd))
    assert locks.release("owned", gsd, pid=4242)
    held.refresh()
    held.release()


def _outcome_of_any(call: Callable[[], object]) -> dict[str, Any]:
    try:
        return _outcome(call)
    except Exception as error:  # the library's own errors (LockLostError...) as data
        return {"raised": type(error).__name__, "errno": None, "message": str(error)}


@bounded
@needs_root
def test_a_holder_that_may_not_read_its_own_lock_gets_an_error_not_a_loss(
    shared_dir: Path,
) -> None:
    """uid 65534 holds a lock, then the file is made unreadable (chmod 000): refresh must say
    "permission denied" and keep the lock, so that refresh and release work once it is
    readable again."""
    gsd = shared_dir / "gsd"
    lock = lock_of(gsd, FEATURE)
    lock.parent.mkdir(parents=True)
    os.chmod(lock.parent, 0o777)  # the feature folder is uid 65534's to write in

    def body() -> dict[str, Any]:
        held = locks.FeatureLock(FEATURE, gsd, heartbeat=None, timeout=0).acquire()
        os.chmod(lock, 0)
        denied = _outcome_of_any(held.refresh)
        os.chmod(lock, 0o644)
        again = _outcome_of_any(held.refresh)
        released = _outcome_of_any(held.release)
        return {"denied": denied, "again": again, "released": released}

    report = _as_nobody(body)
    assert report["denied"].get("errno") == errno.EACCES, report
    assert "returned" in report["again"] and "returned" in report["released"], report
    assert entry_at(lock).missing, "the holder could not release its lock"


@bounded
def test_a_holder_release_refused_by_a_busy_guard_can_be_tried_again(tmp_path: Path) -> None:
    """GuardBusyError says "try again": trying again must then remove the lock."""
    gsd = tmp_path / "gsd"
    held = locks.FeatureLock(FEATURE, gsd, heartbeat=None, timeout=0).acquire()
    other = os.open(gsd / "specs" / FEATURE, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(other, fcntl.LOCK_EX)  # a foreign process holding the folder's flock
        with pytest.raises(GuardBusyError):
            held.release()
    finally:
        os.close(other)  # the foreign holder lets go
    held.release()
    assert entry_at(lock_of(gsd, FEATURE)).missing, "the retried release left the lock"


# --------------------------------------------------------------------------- descriptors


def _out_of_descriptors(free: int, call: Callable[[], object]) -> dict[str, Any]:
    """Run ``call`` with exactly ``free`` descriptors left (in a child: the limit is lowered)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    fillers: list[int] = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, highest + 32), hard))
    try:
        try:
            while True:
                fillers.append(os.open(os.devnull, os.O_RDONLY))
        except OSError as error:
            if error.errno != errno.EMFILE:
                raise
        for fd in fillers[len(fillers) - free :] if free else []:
            os.close(fd)
        del fillers[len(fillers) - free :]
        return _outcome(call)
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _in_child(held: locks.FeatureLock) -> locks.FeatureLock:
    """Let a forked child act as the holder of its parent's lock. A FeatureLock refuses to touch
    its lock from a forked child (that lock is the parent's); these tests fork only to change
    the child's uid or descriptor limit, and the parent never uses the lock meanwhile."""
    held._holder_process = os.getpid()
    return held


@dataclass(frozen=True)
class Starved:
    """A call made with too few descriptors: its starting state and its fault-free outcome."""

    setup: Callable[[Path], Any]
    call: Callable[[Path, Any], object]
    succeeded: Callable[[Entry, Entry], bool]  # (before, after) of a call that returned
    may_vanish: bool = True  # an error may leave the lock path empty (never a half-made lock)


def _won(before: Entry, after: Entry) -> bool:
    """A new, complete lock (of the child that made the call)."""
    return record_pid(after.content) is not None and after != before


EMFILE_OPS: Final = {
    "acquire": Starved(lambda gsd: None, _acquire, _won),
    "reclaim": Starved(_plant_stale, _acquire, _won),
    "over-live": Starved(_plant_live, _acquire, lambda b, a: a == b, may_vanish=False),
    "release": Starved(
        _own_lock,
        lambda gsd, ctx: locks.release(FEATURE, gsd, pid=record_pid(ctx.content)),
        lambda b, a: a.missing,
    ),
    "refresh": Starved(
        _holder, lambda gsd, ctx: _in_child(ctx[0]).refresh(), _won, may_vanish=False
    ),
}


@bounded
@pytest.mark.parametrize("name", list(EMFILE_OPS))
def test_running_out_of_descriptors_for_real_is_an_emfile_error_never_a_judgement(
    tmp_path: Path, name: str
) -> None:
    """With 0, 1, 2... descriptors left, the call raises EMFILE until it has enough, and never
    takes "cannot open" for "unreadable" (which would reclaim a live lock)."""
    op = EMFILE_OPS[name]
    outcomes = []
    for free in range(12):
        gsd = tmp_path / f"gsd-{free}"
        ctx = op.setup(gsd)
        before = entry_at(lock_of(gsd, FEATURE))
        report = tmp_path / f"report-{free}.json"

        def child(gsd: Path = gsd, ctx: Any = ctx, report: Path = report, free: int = free) -> None:
            outcome = _out_of_descriptors(free, lambda: op.call(gsd, ctx))
            report.write_text(json.dumps(outcome))

        run_child(child)
        outcome = json.loads(report.read_text())
        outcomes.append(outcome)
        after = entry_at(lock_of(gsd, FEATURE))
        assert not temps(gsd), (free, temps(gsd))
        if "returned" in outcome:
            assert op.succeeded(before, after), (free, outcome, before, after)
            break
        assert outcome["errno"] == errno.EMFILE, (free, outcome)
        allowed = [before, Entry(None)] if op.may_vanish else [before]
        assert after in allowed, (free, outcome, before, after)
    assert "raised" in outcomes[0] and "returned" in outcomes[-1], outcomes


# --------------------------------------------------------------------------- name too long


@bounded
def test_a_path_too_long_is_a_clear_error_and_creates_nothing(tmp_path: Path) -> None:
    too_long = tmp_path / "/".join(["d" * 200] * 25)  # over PATH_MAX (4096 bytes)
    component = tmp_path / ("x" * 300)  # over NAME_MAX (255 bytes)
    for gsd in (too_long, component):
        for call in (
            lambda gsd=gsd: _utils.acquire_feature_lock(FEATURE, str(gsd)),
            lambda gsd=gsd: _utils.release_feature_lock(FEATURE, str(gsd)),
            lambda gsd=gsd: locks.acquire(FEATURE, gsd),
        ):
            with pytest.raises(OSError) as caught:
                call()
            assert caught.value.errno == errno.ENAMETOOLONG
            assert caught.value.filename, "the error names no path"
    assert not any(tmp_path.iterdir()), "a failed call made folders"
    with pytest.raises(ValueError, match="Invalid feature name"):
        _utils.acquire_feature_lock("f" * 256, str(tmp_path))
    result = invoke("lock", "acquire", FEATURE, "--gsd-dir", too_long, "--pid", os.getpid())
    assert result.exit_code == 3 and "too long" in result.stderr, result.stderr
