"""The legacy feature-lock functions: acquire, release and check, as the contract states them.

A lock is ``<gsd_dir>/specs/<feature>/.lock`` holding ``"{pid}:{time.time()}"``. These tests drive
the module clock through its one seam (``mahabharatha.commands._utils.time``), age files with
``os.utime`` instead of sleeping, and never depend on more than one process (the real races live in
``tests/concurrency``).
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mahabharatha.commands._utils import (
    _validate_feature_name,
    acquire_feature_lock,
    check_feature_lock,
    release_feature_lock,
)
from mahabharatha.owner import proof
from tests.support.marks import needs_fifo, needs_symlinks, not_root
from tests.support.reads import LockReadFailure, fail_lock_reads, fail_read_text
from tests.unit.conftest import NOW, UTILS

"""The fixed value the mocked module clock returns."""
STALE_AFTER = 7200.0
MAX_PID = 4_194_304
ONE_DAY = 86400.0
INVALID_NAME = r"^Invalid feature name"
"""How every rejection of a feature name starts."""
MY_PID = os.getpid()
OTHER_PID = 1 if MY_PID != 1 else 2
"""A pid that is never the test process's own."""

bounded = pytest.mark.timeout(10)
"""For tests that put a FIFO where a file is expected: a blocking open would hang forever."""


@pytest.fixture
def gsd(tmp_path: Path) -> str:
    return str(tmp_path / ".gsd")


def lock_of(gsd: str, feature: str = "feat") -> Path:
    return Path(gsd) / "specs" / feature / ".lock"


def put_lock(gsd: str, content: str | bytes, feature: str = "feat") -> Path:
    path = lock_of(gsd, feature)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def record(pid: int, ts: float) -> str:
    return f"{pid}:{ts}"


def age_file(path: Path, seconds: float) -> None:
    """Set the mtime of ``path`` to ``seconds`` ago on the real clock."""
    then = time.time() - seconds
    os.utime(path, (then, then))


CORRUPT_CONTENTS = [
    pytest.param(b"garbage", id="garbage"),
    pytest.param(b"abc:def", id="letters"),
    pytest.param(b"123", id="no-colon"),
    pytest.param(b"123:", id="no-timestamp"),
    pytest.param(f":{NOW}".encode(), id="no-pid"),
    pytest.param(f"1:2:{NOW}".encode(), id="extra-field"),
    pytest.param(f"0:{NOW}".encode(), id="pid-zero"),
    pytest.param(f"-5:{NOW}".encode(), id="pid-negative"),
    pytest.param(f"{MAX_PID + 1}:{NOW}".encode(), id="pid-too-big"),
    pytest.param(f"+7:{NOW}".encode(), id="pid-plus-sign"),
    pytest.param(f"\u0663:{NOW}".encode(), id="pid-arabic-indic-digit"),
    pytest.param(f"{'9' * 400}:{NOW}".encode(), id="pid-400-digits"),
    pytest.param(b"1:0", id="ts-zero"),
    pytest.param(b"1:nan", id="ts-nan"),
    pytest.param(b"1:inf", id="ts-inf"),
    pytest.param(b"1:1e9", id="ts-exponent"),
    pytest.param(f"{OTHER_PID}:{NOW + ONE_DAY + 1}".encode(), id="ts-beyond-a-day-ahead"),
    pytest.param(b"\xff\xfe\xfa", id="not-utf8"),
    pytest.param(b"x" * 5000, id="oversize"),
]


# --- the old module's unit cases -------------------------------------------------------------


def test_atomic_acquire_race_simulation(mocker: Any, gsd: str) -> None:
    # The contract's seam, kept as the old tests wrote it: a patched os.open that raises
    # FileExistsError answers False. It no longer reaches a publish (the first os.open is the
    # folder's); the lost creation race itself is the next test's.
    mocker.patch(f"{UTILS}.os.open", side_effect=FileExistsError)
    assert acquire_feature_lock("feat", gsd_dir=gsd) is False
    assert not lock_of(gsd).exists()


def _legacy_acquire(gsd: str) -> bool:
    return acquire_feature_lock("feat", gsd_dir=gsd)


def _layer_acquire(gsd: str) -> bool:
    """The lock layer's acquire: no ``except FileExistsError`` above the publish, so a lost
    race that leaked out of :func:`lockfile.publish` would raise here instead of "held"."""
    from mahabharatha import locks

    try:
        locks.acquire("feat", gsd)
    except locks.LockHeldError:
        return False
    return True


@pytest.mark.parametrize("unnamed", [True, False], ids=["O_TMPFILE", "named-temp"])
@pytest.mark.parametrize("acquire", [_legacy_acquire, _layer_acquire], ids=["legacy", "locks"])
def test_a_publish_that_loses_the_link_race_leaves_the_winners_lock(
    mocker: Any, gsd: str, unnamed: bool, acquire: Callable[[str], bool]
) -> None:
    """The old case above patches ``os.open``, whose first call is now the folder's open, so
    no publish runs there. Here the race is lost at the publish itself: another process's
    lock appears between our write and our ``link``. The acquire answers "held", the winner's
    lock is left byte for byte, and this process keeps no proof of life for it."""
    from mahabharatha.backends.files import lockfile
    from mahabharatha.owner import proof

    mocker.patch.object(lockfile.TMPFILE, "usable", unnamed)
    theirs = record(OTHER_PID, time.time())
    real_link = os.link

    def beaten_to_it(*args: Any, **kwargs: Any) -> None:
        put_lock(gsd, theirs)  # the winner's link lands first
        real_link(*args, **kwargs)  # ours then fails with FileExistsError, as it would

    link = mocker.patch("os.link", side_effect=beaten_to_it)
    assert acquire(gsd) is False
    assert link.call_count == 1  # the publish ran, and lost
    assert lock_of(gsd).read_text() == theirs
    folder = os.open(Path(gsd) / "specs" / "feat", os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert proof.kept_slot(folder) is None
    finally:
        os.close(folder)


def test_acquire_rejects_path_traversal(gsd: str) -> None:
    with pytest.raises(ValueError, match=INVALID_NAME):
        acquire_feature_lock("../etc", gsd_dir=gsd)


def test_acquire_rejects_slash_in_name(gsd: str) -> None:
    with pytest.raises(ValueError, match=INVALID_NAME):
        acquire_feature_lock("foo/bar", gsd_dir=gsd)


def test_acquire_rejects_backslash_in_name(gsd: str) -> None:
    with pytest.raises(ValueError, match=INVALID_NAME):
        acquire_feature_lock("foo\\bar", gsd_dir=gsd)


def test_release_only_deletes_owned_lock(clock: Any, gsd: str) -> None:
    path = put_lock(gsd, record(OTHER_PID, NOW - 10))
    release_feature_lock("feat", gsd_dir=gsd)
    assert path.read_text() == record(OTHER_PID, NOW - 10)


def test_release_deletes_own_lock(clock: Any, gsd: str) -> None:
    assert acquire_feature_lock("feat", gsd_dir=gsd) is True
    release_feature_lock("feat", gsd_dir=gsd)
    assert not os.path.lexists(lock_of(gsd))


def test_release_deletes_corrupt_lock(gsd: str) -> None:
    path = put_lock(gsd, "not-a-lock")
    release_feature_lock("feat", gsd_dir=gsd)
    assert not os.path.lexists(path)


def test_release_rejects_path_traversal(gsd: str) -> None:
    with pytest.raises(ValueError, match=INVALID_NAME):
        release_feature_lock("../etc", gsd_dir=gsd)


def test_check_rejects_path_traversal(gsd: str) -> None:
    with pytest.raises(ValueError, match=INVALID_NAME):
        check_feature_lock("../etc", gsd_dir=gsd)


def test_acquire_handles_read_error(clock: Any, gsd: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Corrupt content: unreadable or corrupt, the lock is reclaimed either way.
    path = put_lock(gsd, "not-a-lock")
    fail_read_text(monkeypatch, ".lock", OSError("simulated read failure"))
    assert acquire_feature_lock("feat", gsd_dir=gsd) is True
    monkeypatch.undo()
    assert path.read_text() == record(MY_PID, NOW)


def test_check_handles_read_error(clock: Any, gsd: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Stale content: unreadable or stale, check reports no lock either way.
    put_lock(gsd, record(OTHER_PID, NOW - STALE_AFTER - 1))
    fail_read_text(monkeypatch, ".lock", OSError("simulated read failure"))
    assert check_feature_lock("feat", gsd_dir=gsd) is None


def test_pid_out_of_bounds_treated_as_corrupt(clock: Any, gsd: str) -> None:
    put_lock(gsd, record(MAX_PID + 1, NOW))
    assert check_feature_lock("feat", gsd_dir=gsd) is None
    assert acquire_feature_lock("feat", gsd_dir=gsd) is True


def test_negative_pid_treated_as_corrupt(clock: Any, gsd: str) -> None:
    put_lock(gsd, record(-1, NOW))
    assert check_feature_lock("feat", gsd_dir=gsd) is None
    assert acquire_feature_lock("feat", gsd_dir=gsd) is True


def test_future_timestamp_treated_as_corrupt(clock: Any, gsd: str) -> None:
    put_lock(gsd, record(OTHER_PID, NOW + ONE_DAY + 1))
    assert check_feature_lock("feat", gsd_dir=gsd) is None
    assert acquire_feature_lock("feat", gsd_dir=gsd) is True


# --- acquire ----------------------------------------------------------------------------------


def test_acquire_writes_pid_colon_module_clock_and_nothing_else(clock: Any, gsd: str) -> None:
    assert acquire_feature_lock("feat", gsd_dir=gsd) is True
    assert lock_of(gsd).read_text() == f"{MY_PID}:{NOW}"
    # Beside it only our proof of life's file (made once, reused: issue 26 item 4).
    assert sorted(os.listdir(lock_of(gsd).parent)) == [".lock", proof.proof_name(os.getuid())]


def test_acquire_creates_missing_parent_folders(clock: Any, tmp_path: Path) -> None:
    gsd = str(tmp_path / "not" / "yet" / ".gsd")
    assert acquire_feature_lock("feat", gsd_dir=gsd) is True
    assert lock_of(gsd).is_file()


def test_default_gsd_dir_is_dot_gsd_in_working_directory(
    clock: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert acquire_feature_lock("feat") is True
    assert (tmp_path / ".gsd" / "specs" / "feat" / ".lock").read_text() == record(MY_PID, NOW)
    assert check_feature_lock("feat") is not None
    release_feature_lock("feat")
    assert not (tmp_path / ".gsd" / "specs" / "feat" / ".lock").exists()


@pytest.mark.parametrize("holder", [OTHER_PID, MY_PID], ids=["other-pid", "own-pid-not-reentrant"])
def test_acquire_returns_false_and_leaves_an_active_lock_alone(
    clock: Any, gsd: str, holder: int
) -> None:
    path = put_lock(gsd, record(holder, NOW - 60))
    assert acquire_feature_lock("feat", gsd_dir=gsd) is False
    assert path.read_text() == record(holder, NOW - 60)


def test_second_acquire_by_the_same_process_fails(clock: Any, gsd: str) -> None:
    assert acquire_feature_lock("feat", gsd_dir=gsd) is True
    assert acquire_feature_lock("feat", gsd_dir=gsd) is False


def test_locks_on_different_features_are_independent(clock: Any, gsd: str) -> None:
    assert acquire_feature_lock("one", gsd_dir=gsd) is True
    assert acquire_feature_lock("two", gsd_dir=gsd) is True


STALENESS = [
    pytest.param(0.0, False, id="fresh"),
    pytest.param(STALE_AFTER - 0.5, False, id="7199.5s"),
    pytest.param(STALE_AFTER, False, id="exactly-7200s-is-active"),
    pytest.param(STALE_AFTER + 0.001, True, id="7200.001s-is-stale"),
    pytest.param(STALE_AFTER + 1, True, id="7201s"),
    pytest.param(NOW - 1, True, id="epoch-second-1"),
]


@pytest.mark.parametrize(("age", "stale"), STALENESS)
def test_acquire_reclaims_a_lock_only_when_strictly_older_than_7200_seconds(
    clock: Any, gsd: str, age: float, stale: bool
) -> None:
    content = record(OTHER_PID, NOW - age)
    path = put_lock(gsd, content)
    assert acquire_feature_lock("feat", gsd_dir=gsd) is stale
    assert path.read_text() == (record(MY_PID, NOW) if stale else content)


@pytest.mark.parametrize("content", CORRUPT_CONTENTS)
def test_acquire_reclaims_a_corrupt_lock(clock: Any, gsd: str, content: bytes) -> None:
    path = put_lock(gsd, content)
    assert acquire_feature_lock("feat", gsd_dir=gsd) is True
    assert path.read_text() == record(MY_PID, NOW)


@pytest.mark.parametrize(
    "ahead", [1.0, 3600.0, ONE_DAY], ids=["1s-ahead", "1h-ahead", "exactly-a-day-ahead"]
)
def test_a_future_timestamp_within_a_day_is_an_active_lock(
    clock: Any, gsd: str, ahead: float
) -> None:
    path = put_lock(gsd, record(OTHER_PID, NOW + ahead))
    assert acquire_feature_lock("feat", gsd_dir=gsd) is False
    assert path.read_text() == record(OTHER_PID, NOW + ahead)
    assert check_feature_lock("feat", gsd_dir=gsd) == {
        "pid": OTHER_PID,
        "timestamp": NOW + ahead,
        "age_seconds": 0,
    }


def test_acquire_raises_oserror_when_gsd_dir_is_a_regular_file(tmp_path: Path) -> None:
    blocker = tmp_path / ".gsd"
    blocker.write_text("not a folder")
    with pytest.raises(OSError):
        acquire_feature_lock("feat", gsd_dir=str(blocker))
    assert blocker.read_text() == "not a folder"


@not_root
def test_acquire_in_a_read_only_folder_raises_and_leaves_no_lock(gsd: str) -> None:
    folder = lock_of(gsd).parent
    folder.mkdir(parents=True)
    folder.chmod(0o500)
    try:
        with pytest.raises(PermissionError):
            acquire_feature_lock("feat", gsd_dir=gsd)
        assert os.listdir(folder) == []
    finally:
        folder.chmod(0o700)


@not_root
def test_an_unreadable_lock_is_reclaimed_released_and_reported_as_none(gsd: str) -> None:
    path = put_lock(gsd, record(OTHER_PID, time.time()))
    path.chmod(0o000)
    assert check_feature_lock("feat", gsd_dir=gsd) is None
    assert acquire_feature_lock("feat", gsd_dir=gsd) is True
    path.chmod(0o000)
    release_feature_lock("feat", gsd_dir=gsd)
    assert not os.path.lexists(path)


# --- the empty lock of a writer from the old module -------------------------------------------


def test_a_fresh_empty_lock_is_held_left_in_place_and_reported_as_none(gsd: str) -> None:
    path = put_lock(gsd, b"")
    assert acquire_feature_lock("feat", gsd_dir=gsd) is False
    assert path.exists()
    assert path.read_bytes() == b""
    release_feature_lock("feat", gsd_dir=gsd)
    assert path.exists()
    assert path.read_bytes() == b""
    assert check_feature_lock("feat", gsd_dir=gsd) is None


def test_an_empty_lock_past_the_grace_is_reclaimed(gsd: str) -> None:
    path = put_lock(gsd, b"")
    age_file(path, 10)
    assert check_feature_lock("feat", gsd_dir=gsd) is None
    assert acquire_feature_lock("feat", gsd_dir=gsd) is True
    pid, _, ts = path.read_text().partition(":")
    assert int(pid) == MY_PID
    assert float(ts) == pytest.approx(time.time(), abs=60)


def test_an_empty_lock_past_the_grace_is_removed_by_release(gsd: str) -> None:
    path = put_lock(gsd, b"")
    age_file(path, 10)
    release_feature_lock("feat", gsd_dir=gsd)
    assert not os.path.lexists(path)


# --- release ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "age", [10.0, STALE_AFTER + 1], ids=["active", "stale-is-still-someone-elses"]
)
def test_release_leaves_another_owners_valid_lock_untouched(
    clock: Any, gsd: str, age: float
) -> None:
    path = put_lock(gsd, record(OTHER_PID, NOW - age))
    before = os.stat(path)
    assert release_feature_lock("feat", gsd_dir=gsd) is None
    after = os.stat(path)
    assert path.read_text() == record(OTHER_PID, NOW - age)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


@pytest.mark.parametrize("age", [10.0, STALE_AFTER + 1], ids=["active", "stale"])
def test_release_removes_a_lock_carrying_our_pid(clock: Any, gsd: str, age: float) -> None:
    path = put_lock(gsd, record(MY_PID, NOW - age))
    assert release_feature_lock("feat", gsd_dir=gsd) is None
    assert not os.path.lexists(path)


@pytest.mark.parametrize("content", CORRUPT_CONTENTS)
def test_release_removes_a_corrupt_lock(clock: Any, gsd: str, content: bytes) -> None:
    path = put_lock(gsd, content)
    release_feature_lock("feat", gsd_dir=gsd)
    assert not os.path.lexists(path)


def test_release_without_a_lock_is_a_quiet_no_op(gsd: str) -> None:
    lock_of(gsd).parent.mkdir(parents=True)
    assert release_feature_lock("feat", gsd_dir=gsd) is None
    assert os.listdir(lock_of(gsd).parent) == []


def test_release_without_any_folder_is_a_quiet_no_op(gsd: str) -> None:
    assert release_feature_lock("feat", gsd_dir=gsd) is None
    assert not Path(gsd).exists()


def test_release_then_acquire_again(clock: Any, gsd: str) -> None:
    assert acquire_feature_lock("feat", gsd_dir=gsd) is True
    release_feature_lock("feat", gsd_dir=gsd)
    assert acquire_feature_lock("feat", gsd_dir=gsd) is True


# --- check ------------------------------------------------------------------------------------


def test_check_reports_pid_timestamp_and_age_of_an_active_lock(clock: Any, gsd: str) -> None:
    put_lock(gsd, record(OTHER_PID, NOW - 100.25))
    info = check_feature_lock("feat", gsd_dir=gsd)
    assert info == {"pid": OTHER_PID, "timestamp": NOW - 100.25, "age_seconds": 100.25}
    assert info is not None
    assert type(info["pid"]) is int
    assert isinstance(info["timestamp"], float)
    assert isinstance(info["age_seconds"], float)


def test_check_reports_our_own_freshly_acquired_lock(clock: Any, gsd: str) -> None:
    assert acquire_feature_lock("feat", gsd_dir=gsd) is True
    assert check_feature_lock("feat", gsd_dir=gsd) == {
        "pid": MY_PID,
        "timestamp": NOW,
        "age_seconds": 0,
    }


@pytest.mark.parametrize(("age", "stale"), STALENESS)
def test_check_reports_none_only_once_strictly_older_than_7200_seconds(
    clock: Any, gsd: str, age: float, stale: bool
) -> None:
    put_lock(gsd, record(OTHER_PID, NOW - age))
    info = check_feature_lock("feat", gsd_dir=gsd)
    if stale:
        assert info is None
    else:
        assert info is not None
        assert info["age_seconds"] == pytest.approx(age)


@pytest.mark.parametrize("content", CORRUPT_CONTENTS)
def test_check_reports_none_for_a_corrupt_lock(clock: Any, gsd: str, content: bytes) -> None:
    put_lock(gsd, content)
    assert check_feature_lock("feat", gsd_dir=gsd) is None


def test_check_reports_none_without_a_lock(gsd: str) -> None:
    assert check_feature_lock("feat", gsd_dir=gsd) is None
    assert not Path(gsd).exists()


# --- a lock whose read fails: one answer per failure -------------------------------------------
# Lock files are read through one no-follow open and a bounded os.read (lockfile.read_lock),
# not Path.read_text: the failures are injected there, and each test checks it was reached.
# (The old module's two cases above keep the Path.read_text seam the contract names.)

DENIED = PermissionError(errno.EACCES, "simulated")
UNREADABLE_FAILURES = [
    pytest.param(LockReadFailure("open", error=DENIED), id="open-EACCES"),
    pytest.param(LockReadFailure("read", error=DENIED), id="read-EACCES"),
    pytest.param(LockReadFailure("read", data=b"\xff\xfe:\xfa"), id="read-not-UTF-8"),
]
"""Lasting reasons: the lock is unreadable, so it is reclaimed like a corrupt one."""
IO_ERROR = LockReadFailure("read", error=OSError(errno.EIO, "simulated"))
"""Not a judgement of the lock: the caller gets the error, and the lock is left alone."""


@pytest.mark.parametrize("failure", UNREADABLE_FAILURES)
def test_an_active_lock_that_cannot_be_read_is_unreadable_and_reclaimed(
    clock: Any, gsd: str, monkeypatch: pytest.MonkeyPatch, failure: LockReadFailure
) -> None:
    put_lock(gsd, record(OTHER_PID, NOW - 60))
    hits = fail_lock_reads(monkeypatch, failure)
    assert check_feature_lock("feat", gsd_dir=gsd) is None
    assert hits, "the injected read failure was never reached"
    assert acquire_feature_lock("feat", gsd_dir=gsd) is True
    monkeypatch.undo()
    assert lock_of(gsd).read_text() == record(MY_PID, NOW)


def test_an_io_error_reading_an_active_lock_is_an_error_and_leaves_it(
    clock: Any, gsd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = put_lock(gsd, record(OTHER_PID, NOW - 60))
    before = os.lstat(path)
    hits = fail_lock_reads(monkeypatch, IO_ERROR)
    for call in (check_feature_lock, acquire_feature_lock, release_feature_lock):
        with pytest.raises(OSError) as raised:
            call("feat", gsd_dir=gsd)
        assert raised.value.errno == errno.EIO
    assert hits.count("read") >= 3, "the injected read failure was not reached by every call"
    monkeypatch.undo()
    assert path.read_text() == record(OTHER_PID, NOW - 60)
    assert os.lstat(path).st_ino == before.st_ino


@pytest.mark.parametrize("failure", UNREADABLE_FAILURES)
@pytest.mark.parametrize(
    "content",
    [
        pytest.param(record(OTHER_PID, NOW - STALE_AFTER - 1), id="stale"),
        pytest.param("garbage", id="corrupt"),
    ],
)
def test_a_stale_or_corrupt_lock_that_cannot_be_read_is_still_reclaimed(
    clock: Any, gsd: str, monkeypatch: pytest.MonkeyPatch, failure: LockReadFailure, content: str
) -> None:
    path = put_lock(gsd, content)
    hits = fail_lock_reads(monkeypatch, failure)
    assert check_feature_lock("feat", gsd_dir=gsd) is None
    assert acquire_feature_lock("feat", gsd_dir=gsd) is True
    assert hits, "the injected read failure was never reached"
    monkeypatch.undo()
    assert path.read_text() == record(MY_PID, NOW)


@pytest.mark.parametrize("failure", UNREADABLE_FAILURES)
@pytest.mark.parametrize(
    "content",
    [
        pytest.param(record(OTHER_PID, NOW - 60), id="active"),
        pytest.param("garbage", id="corrupt"),
    ],
)
def test_a_lock_that_cannot_be_read_is_removed_by_release(
    clock: Any, gsd: str, monkeypatch: pytest.MonkeyPatch, failure: LockReadFailure, content: str
) -> None:
    path = put_lock(gsd, content)
    hits = fail_lock_reads(monkeypatch, failure)
    release_feature_lock("feat", gsd_dir=gsd)
    assert hits, "the injected read failure was never reached"
    assert not os.path.lexists(path)


# --- what is at the lock path -----------------------------------------------------------------


@needs_symlinks
@pytest.mark.parametrize("target_content", [None, "active-other", "ours"])
def test_a_symlink_at_the_lock_path_is_not_followed(
    clock: Any, gsd: str, tmp_path: Path, target_content: str | None
) -> None:
    target = tmp_path / "target"
    contents = {"active-other": record(OTHER_PID, NOW - 1), "ours": record(MY_PID, NOW - 1)}
    if target_content is not None:
        target.write_text(contents[target_content])
    path = lock_of(gsd)
    path.parent.mkdir(parents=True)
    path.symlink_to(target)

    assert check_feature_lock("feat", gsd_dir=gsd) is None
    assert acquire_feature_lock("feat", gsd_dir=gsd) is True
    assert not path.is_symlink()
    assert path.read_text() == record(MY_PID, NOW)
    if target_content is None:
        assert not os.path.lexists(target)
    else:
        assert target.read_text() == contents[target_content]

    os.remove(path)
    path.symlink_to(target)
    release_feature_lock("feat", gsd_dir=gsd)
    assert not os.path.lexists(path)
    if target_content is not None:
        assert target.read_text() == contents[target_content]


@needs_fifo
@bounded
def test_a_fifo_at_the_lock_path_never_hangs_and_is_replaced(clock: Any, gsd: str) -> None:
    path = lock_of(gsd)
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    assert check_feature_lock("feat", gsd_dir=gsd) is None
    assert acquire_feature_lock("feat", gsd_dir=gsd) is True
    assert path.read_text() == record(MY_PID, NOW)
    os.remove(path)
    os.mkfifo(path)
    release_feature_lock("feat", gsd_dir=gsd)
    assert not os.path.lexists(path)


def test_a_directory_at_the_lock_path_is_an_error_for_acquire_only(clock: Any, gsd: str) -> None:
    path = lock_of(gsd)
    path.mkdir(parents=True)
    with pytest.raises(OSError) as raised:
        acquire_feature_lock("feat", gsd_dir=gsd)
    assert str(path) in str(raised.value)
    assert check_feature_lock("feat", gsd_dir=gsd) is None
    release_feature_lock("feat", gsd_dir=gsd)
    assert path.is_dir()


@needs_symlinks
def test_a_symlinked_feature_folder_is_refused_and_never_written_through(
    clock: Any, gsd: str, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / ".lock").write_text(record(MY_PID, NOW - 1))
    (Path(gsd) / "specs").mkdir(parents=True)
    (Path(gsd) / "specs" / "feat").symlink_to(elsewhere, target_is_directory=True)

    with pytest.raises(OSError):
        acquire_feature_lock("feat", gsd_dir=gsd)
    assert check_feature_lock("feat", gsd_dir=gsd) is None
    release_feature_lock("feat", gsd_dir=gsd)
    assert os.listdir(elsewhere) == [".lock"]
    assert (elsewhere / ".lock").read_text() == record(MY_PID, NOW - 1)


@needs_symlinks
@pytest.mark.parametrize("linked", [".gsd", "specs"])
def test_symlinked_gsd_and_specs_folders_are_followed(
    clock: Any, tmp_path: Path, linked: str
) -> None:
    real = tmp_path / "real"
    gsd = tmp_path / ".gsd"
    if linked == ".gsd":
        real.mkdir()
        gsd.symlink_to(real, target_is_directory=True)
        lock_in_real = real / "specs" / "feat" / ".lock"
    else:
        real.mkdir()
        gsd.mkdir()
        (gsd / "specs").symlink_to(real, target_is_directory=True)
        lock_in_real = real / "feat" / ".lock"
    assert acquire_feature_lock("feat", gsd_dir=str(gsd)) is True
    assert lock_in_real.read_text() == record(MY_PID, NOW)
    assert check_feature_lock("feat", gsd_dir=str(gsd)) is not None
    release_feature_lock("feat", gsd_dir=str(gsd))
    assert not lock_in_real.exists()


# --- names ------------------------------------------------------------------------------------

INVALID_NAMES = [
    pytest.param("", id="empty"),
    pytest.param("..", id="dotdot"),
    pytest.param("../etc", id="traversal"),
    pytest.param("a..b", id="inner-dotdot"),
    pytest.param("feat..", id="trailing-dotdot"),
    pytest.param("foo/bar", id="slash"),
    pytest.param("/abs", id="absolute"),
    pytest.param("foo\\bar", id="backslash"),
    pytest.param("feat\n", id="trailing-newline"),
    pytest.param("fe\x00at", id="nul"),
    pytest.param(".hidden", id="leading-dot"),
    pytest.param("-flag", id="leading-dash"),
    pytest.param("_under", id="leading-underscore"),
    pytest.param("with space", id="space"),
    pytest.param("caf\u00e9", id="non-ascii"),
    pytest.param("a" * 256, id="256-bytes"),
]
VALID_NAMES = [
    pytest.param("a", id="one-char"),
    pytest.param("Feat_1.2-x", id="all-classes"),
    pytest.param("0", id="digit"),
    pytest.param("a.b", id="single-dot"),
    pytest.param("a" * 255, id="255-bytes"),
]
PUBLIC: list[Any] = [
    pytest.param(lambda name, gsd: _validate_feature_name(name), id="validate"),
    pytest.param(lambda name, gsd: acquire_feature_lock(name, gsd_dir=gsd), id="acquire"),
    pytest.param(lambda name, gsd: release_feature_lock(name, gsd_dir=gsd), id="release"),
    pytest.param(lambda name, gsd: check_feature_lock(name, gsd_dir=gsd), id="check"),
]


@pytest.mark.parametrize("call", PUBLIC)
@pytest.mark.parametrize("name", INVALID_NAMES)
def test_invalid_names_raise_value_error_before_touching_disk(
    gsd: str, call: Callable[[str, str], object], name: str
) -> None:
    with pytest.raises(ValueError, match=INVALID_NAME):
        call(name, gsd)
    assert not Path(gsd).exists()


@pytest.mark.parametrize("name", VALID_NAMES)
def test_valid_names_can_be_locked_checked_and_released(clock: Any, gsd: str, name: str) -> None:
    assert _validate_feature_name(name) is None
    assert acquire_feature_lock(name, gsd_dir=gsd) is True
    assert lock_of(gsd, name).read_text() == record(MY_PID, NOW)
    info = check_feature_lock(name, gsd_dir=gsd)
    assert info is not None
    assert info["pid"] == MY_PID
    release_feature_lock(name, gsd_dir=gsd)
    assert not lock_of(gsd, name).exists()


def test_a_pledge_interrupted_while_kept_never_closes_the_proof_it_records_as_held(
    tmp_path: Path,
) -> None:
    """Failed before the fix: an interrupt in ``Pledge.keep`` after the proof was recorded as
    held but before the pledge forgot its descriptor let the block close that descriptor, so a
    later let-go would close whatever file reused its number."""
    import sys

    keep = proof.Pledge.keep.__code__
    lines = sorted({line for _, _, line in keep.co_lines() if line is not None})
    folder = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    interrupted = 0
    try:
        for at in lines:

            def interrupt_at(frame: Any, event: str, _arg: Any, at: int = at) -> Any:
                if frame.f_code is not keep:
                    return None
                if event == "line" and frame.f_lineno == at:
                    raise KeyboardInterrupt
                return interrupt_at

            try:
                with proof.Pledge(folder, True) as pledge:
                    sys.settrace(interrupt_at)
                    try:
                        pledge.keep()
                    finally:
                        sys.settrace(None)
            except KeyboardInterrupt:
                interrupted += 1
            for fd, _slot in proof._HELD.values():
                os.fstat(fd)  # EBADF: the block closed a descriptor still recorded as held
            proof.let_go_of_all()
    finally:
        os.close(folder)
    assert interrupted >= 3, "the trace never reached keep's lines"


def test_a_work_proof_that_cannot_open_its_watch_leaves_no_descriptor_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Failed before the fix: when the second open of the proof file failed (EMFILE), the
    first descriptor stayed open."""
    folder = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    real, opened = proof.open_proof, []

    def second_open_fails(folder_fd: int) -> tuple[int, tuple[int, int]]:
        opened.append(folder_fd)
        if len(opened) == 2:
            raise OSError(errno.EMFILE, "Too many open files")
        return real(folder_fd)

    monkeypatch.setattr(proof, "open_proof", second_open_fails)
    before = sorted(os.listdir("/proc/self/fd"))
    try:
        with pytest.raises(OSError, match="Too many open files"):
            proof.WorkProof(folder, 1)
        assert sorted(os.listdir("/proc/self/fd")) == before
    finally:
        os.close(folder)
