"""The helpers of ``mahabharatha.commands._utils`` that are not locks.

``detect_feature`` (also re-exported by ``mahabharatha.commands.status``), ``_safe_read_text`` and
``_parse_lock_content``, each against the contract's table and precise rules.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mahabharatha.commands._utils import _parse_lock_content, _safe_read_text
from tests.support.marks import needs_fifo, needs_symlinks
from tests.support.reads import fail_read_text
from tests.unit.conftest import NOW

"""The fixed value the mocked module clock returns."""
MAX_PID = 4_194_304
ONE_DAY = 86400.0
READ_LIMIT = 4096
"""``_safe_read_text`` refuses files over 4 KiB."""
ENV = "MAHABHARATHA_FEATURE"

bounded = pytest.mark.timeout(10)
"""For tests that put a FIFO where a file is expected: a blocking open would hang forever."""


@pytest.fixture(params=["mahabharatha.commands._utils", "mahabharatha.commands.status"])
def detect_feature(request: pytest.FixtureRequest) -> Callable[[], str | None]:
    """``detect_feature`` as imported from either module that offers it."""
    found: Callable[[], str | None] = importlib.import_module(request.param).detect_feature
    return found


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory with no feature set in the environment."""
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def set_current_feature(root: Path, content: str | bytes) -> Path:
    path = root / ".gsd" / ".current-feature"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def add_state_files(root: Path, stems: list[str]) -> None:
    """Create ``.mahabharatha/state/<stem>.json`` files, oldest first, a minute apart."""
    state = root / ".mahabharatha" / "state"
    state.mkdir(parents=True, exist_ok=True)
    start = time.time() - 3600
    for index, stem in enumerate(stems):
        path = state / stem
        path.write_text("{}")
        os.utime(path, (start + 60 * index, start + 60 * index))


def json_files(*stems: str) -> list[str]:
    return [f"{stem}.json" for stem in stems]


UNICODE_ERROR = UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")


# --- detect_feature ---------------------------------------------------------------------------


def test_status_re_exports_detect_feature() -> None:
    utils = importlib.import_module("mahabharatha.commands._utils")
    status = importlib.import_module("mahabharatha.commands.status")
    assert status.detect_feature is utils.detect_feature


SOURCES = [
    # (env, .current-feature, state files oldest first, expected)
    pytest.param(None, None, [], None, id="nothing-set"),
    pytest.param("env-feat", "file-feat", json_files("state-feat"), "env-feat", id="env-first"),
    pytest.param("  env-feat \n", None, [], "env-feat", id="env-stripped"),
    pytest.param("", "file-feat", [], "file-feat", id="empty-env-falls-through"),
    pytest.param("  \n", "file-feat", [], "file-feat", id="blank-env-falls-through"),
    pytest.param("../etc", "file-feat", [], "file-feat", id="invalid-env-falls-through"),
    pytest.param("a..b", None, json_files("state-feat"), "state-feat", id="invalid-env-to-state"),
    pytest.param(None, "file-feat", json_files("state-feat"), "file-feat", id="file-before-state"),
    pytest.param(None, "\n  file-feat  \n", [], "file-feat", id="file-stripped"),
    pytest.param(None, "", json_files("state-feat"), "state-feat", id="empty-file-falls-through"),
    pytest.param(None, "a/../b", json_files("state-feat"), "state-feat", id="invalid-file"),
    pytest.param(None, "one\ntwo", json_files("state-feat"), "state-feat", id="two-line-file"),
    pytest.param(None, None, json_files("old", "new"), "new", id="newest-state-file"),
    pytest.param(None, None, json_files("z-old", "a-new"), "a-new", id="mtime-not-name-order"),
    pytest.param(None, None, ["old.json", "newer.txt"], "old", id="only-json-counts"),
    pytest.param(
        None, None, json_files("valid", "-dash", "a..b", "sp ace", ".hidden"), "valid",
        id="newest-valid-state-stem-wins",
    ),
    pytest.param(None, None, json_files("-dash", "a..b"), None, id="no-valid-state-stem"),
    pytest.param("-x", "..", json_files("a..b"), None, id="all-invalid"),
]  # fmt: skip


@pytest.mark.parametrize(("env", "current", "states", "expected"), SOURCES)
def test_detect_feature_returns_the_first_valid_source(
    detect_feature: Callable[[], str | None],
    project: Path,
    monkeypatch: pytest.MonkeyPatch,
    env: str | None,
    current: str | None,
    states: list[str],
    expected: str | None,
) -> None:
    if env is not None:
        monkeypatch.setenv(ENV, env)
    if current is not None:
        set_current_feature(project, current)
    add_state_files(project, states)
    assert detect_feature() == expected


def test_current_feature_is_read_relative_to_the_working_directory(
    detect_feature: Callable[[], str | None], project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = project / "other"
    set_current_feature(other, "other-feat")
    assert detect_feature() is None
    monkeypatch.chdir(other)
    assert detect_feature() == "other-feat"


def test_state_files_are_found_relative_to_the_working_directory(
    detect_feature: Callable[[], str | None], project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = project / "other"
    add_state_files(other, json_files("state-feat"))
    assert detect_feature() is None
    monkeypatch.chdir(other)
    assert detect_feature() == "state-feat"


@pytest.mark.parametrize(
    "exc",
    [
        pytest.param(OSError("simulated"), id="OSError"),
        pytest.param(PermissionError("simulated"), id="PermissionError"),
    ],
)
def test_detect_feature_handles_read_error(
    detect_feature: Callable[[], str | None],
    project: Path,
    monkeypatch: pytest.MonkeyPatch,
    exc: Exception,
) -> None:
    set_current_feature(project, "file-feat")
    add_state_files(project, json_files("state-feat"))
    fail_read_text(monkeypatch, ".current-feature", exc)
    assert detect_feature() == "state-feat"


def test_detect_feature_handles_unicode_error(
    detect_feature: Callable[[], str | None], project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_current_feature(project, "file-feat")
    add_state_files(project, json_files("state-feat"))
    fail_read_text(monkeypatch, ".current-feature", UNICODE_ERROR)
    assert detect_feature() == "state-feat"


def test_detect_feature_says_why_it_skipped_the_variable_and_the_marker(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mahabharatha.detect import detect_feature as detect

    monkeypatch.setenv(ENV, "a/b")
    set_current_feature(project, "file-feat")
    fail_read_text(monkeypatch, ".current-feature", UNICODE_ERROR)
    add_state_files(project, json_files("state-feat"))
    skipped: list[str] = []
    assert detect(".gsd", skipped=skipped) == "state-feat"
    assert skipped[0] == f"skipped ${ENV}: 'a/b' is not a valid feature name"
    assert skipped[1].startswith("skipped .gsd/.current-feature: not a readable text file")
    assert len(skipped) == 2


def make_symlink(path: Path) -> None:
    target = path.parent / "target"
    target.write_text("file-feat")
    path.symlink_to(target)


def make_fifo(path: Path) -> None:
    os.mkfifo(path)


def make_directory(path: Path) -> None:
    path.mkdir()


def make_oversize(path: Path) -> None:
    # Valid once stripped: only the size rule refuses it.
    path.write_text("file-feat" + " " * READ_LIMIT)


def make_undecodable(path: Path) -> None:
    path.write_bytes(b"file-feat\xff\xfe")


REFUSED_FILES = [
    pytest.param(make_symlink, marks=needs_symlinks, id="symlink"),
    pytest.param(make_fifo, marks=needs_fifo, id="fifo"),
    pytest.param(make_directory, id="directory"),
    pytest.param(make_oversize, id="over-4KiB"),
    pytest.param(make_undecodable, id="invalid-utf8"),
]


@bounded
@pytest.mark.parametrize("make", REFUSED_FILES)
def test_an_unsafe_current_feature_file_is_refused_and_falls_through(
    detect_feature: Callable[[], str | None], project: Path, make: Callable[[Path], None]
) -> None:
    path = project / ".gsd" / ".current-feature"
    path.parent.mkdir()
    make(path)
    add_state_files(project, json_files("state-feat"))
    assert detect_feature() == "state-feat"


@pytest.mark.parametrize(
    ("stems", "expected"),
    [
        pytest.param(["gone", "kept"], "kept", id="newest-vanishes"),
        pytest.param(["kept", "gone"], "kept", id="older-vanishes"),
        pytest.param(["gone"], None, id="only-file-vanishes"),
    ],
)
def test_a_state_file_vanishing_mid_scan_never_raises(
    detect_feature: Callable[[], str | None],
    project: Path,
    monkeypatch: pytest.MonkeyPatch,
    stems: list[str],
    expected: str | None,
) -> None:
    # `stems` lists newest first; add_state_files wants oldest first.
    add_state_files(project, json_files(*reversed(stems)))
    original = Path.stat

    def stat(self: Path, *args: Any, **kwargs: Any) -> os.stat_result:
        if self.name == "gone.json":
            self.unlink(missing_ok=True)
            raise FileNotFoundError(2, "No such file or directory", str(self))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Path, "stat", stat)
    assert detect_feature() == expected


# --- _safe_read_text --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(b"  feat \n", "feat", id="stripped"),
        pytest.param(b"", "", id="empty"),
        pytest.param("caf\u00e9\n".encode(), "caf\u00e9", id="utf8"),
        pytest.param(b"x" * READ_LIMIT, "x" * READ_LIMIT, id="exactly-4KiB"),
    ],
)
def test_safe_read_text_returns_the_stripped_text_of_a_small_regular_file(
    tmp_path: Path, content: bytes, expected: str
) -> None:
    path = tmp_path / "file"
    path.write_bytes(content)
    assert _safe_read_text(path) == expected


def make_dangling_symlink(path: Path) -> None:
    path.symlink_to(path.parent / "missing")


def make_oversize_by_one(path: Path) -> None:
    path.write_bytes(b"x" * (READ_LIMIT + 1))


@bounded
@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda path: None, id="missing"),
        pytest.param(make_symlink, marks=needs_symlinks, id="symlink-to-regular-file"),
        pytest.param(make_dangling_symlink, marks=needs_symlinks, id="dangling-symlink"),
        pytest.param(make_fifo, marks=needs_fifo, id="fifo"),
        pytest.param(make_directory, id="directory"),
        pytest.param(make_oversize, id="over-4KiB"),
        pytest.param(make_oversize_by_one, id="4KiB-plus-one-byte"),
        pytest.param(make_undecodable, id="invalid-utf8"),
    ],
)
def test_safe_read_text_refuses_what_is_not_a_small_readable_regular_file(
    tmp_path: Path, make: Callable[[Path], None]
) -> None:
    path = tmp_path / "file"
    make(path)
    assert _safe_read_text(path) is None


@pytest.mark.parametrize(
    "exc",
    [
        pytest.param(OSError("simulated"), id="OSError"),
        pytest.param(PermissionError("simulated"), id="PermissionError"),
        pytest.param(UNICODE_ERROR, id="UnicodeDecodeError"),
    ],
)
def test_safe_read_text_turns_read_errors_into_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc: Exception
) -> None:
    path = tmp_path / "file"
    path.write_text("feat")
    fail_read_text(monkeypatch, "file", exc)
    assert _safe_read_text(path) is None


# --- _parse_lock_content ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param("123:1700000000.5", (123, 1_700_000_000.5), id="fractional"),
        pytest.param("123:1700000000", (123, 1_700_000_000.0), id="whole-seconds"),
        pytest.param(" 123:1700000000.5\n", (123, 1_700_000_000.5), id="surrounding-space"),
        pytest.param("\t123:1700000000.5\r\n", (123, 1_700_000_000.5), id="tab-crlf"),
        pytest.param("1:0.5", (1, 0.5), id="smallest-pid-tiny-ts"),
        pytest.param(f"{MAX_PID}:{NOW}", (MAX_PID, NOW), id="largest-pid"),
        pytest.param(f"7:{NOW + ONE_DAY}", (7, NOW + ONE_DAY), id="exactly-a-day-ahead"),
        pytest.param(f"7:{NOW + 60}", (7, NOW + 60), id="a-minute-ahead"),
    ],
)
def test_parse_lock_content_accepts_valid_records(
    clock: Any, content: str, expected: tuple[int, float]
) -> None:
    result = _parse_lock_content(content)
    assert result == expected
    assert result is not None
    assert type(result[0]) is int
    assert type(result[1]) is float


@pytest.mark.parametrize(
    "content",
    [
        pytest.param("", id="empty"),
        pytest.param("   \n", id="blank"),
        pytest.param(":", id="colon-only"),
        pytest.param("123", id="no-colon"),
        pytest.param("123:", id="no-timestamp"),
        pytest.param(":1700000000", id="no-pid"),
        pytest.param("+7:1e9", id="plus-sign-and-exponent"),
        pytest.param("7:1e9", id="exponent"),
        pytest.param("7:1_000", id="underscore"),
        pytest.param(" 7 :1", id="inner-space"),
        pytest.param("7: 1", id="space-after-colon"),
        pytest.param("1:2:3", id="extra-field"),
        pytest.param("\u0663:1700000000", id="arabic-indic-pid"),
        pytest.param("7:\u0661\u0667\u0660\u0660", id="arabic-indic-ts"),
        pytest.param("\uff17:1700000000", id="fullwidth-digit"),
        pytest.param("0x10:1700000000", id="hex-pid"),
        pytest.param("7.0:1700000000", id="fractional-pid"),
        pytest.param("-1:1700000000", id="negative-pid"),
        pytest.param("0:1", id="pid-zero"),
        pytest.param(f"{MAX_PID + 1}:1", id="pid-over-max"),
        pytest.param("1:0", id="ts-zero"),
        pytest.param("1:0.0", id="ts-zero-point-zero"),
        pytest.param("1:-5", id="ts-negative"),
        pytest.param("1:.5", id="ts-no-integer-part"),
        pytest.param("1:5.", id="ts-no-fraction-digits"),
        pytest.param("1:nan", id="ts-nan"),
        pytest.param("1:inf", id="ts-inf"),
        pytest.param("1:Infinity", id="ts-infinity"),
        pytest.param(f"1:{NOW + ONE_DAY + 0.001}", id="ts-just-past-a-day-ahead"),
        pytest.param(f"1:{'9' * 400}", id="ts-400-digits-overflows-to-inf"),
        pytest.param(f"{'9' * 400}:1700000000", id="pid-400-digits"),
        pytest.param("1" * 5000, id="5000-digits"),
        pytest.param("7:1" + "0" * 4997, id="5000-chars"),
        pytest.param("7:1700000000\x00", id="trailing-nul"),
        pytest.param("7:1700000000\nextra", id="second-line"),
    ],
)
def test_parse_lock_content_rejects_corrupt_records(clock: Any, content: str) -> None:
    assert _parse_lock_content(content) is None


def test_parse_lock_content_accepts_the_largest_pid_at_the_real_time() -> None:
    now = time.time()
    assert _parse_lock_content(f"{MAX_PID}:{now}") == (MAX_PID, now)


def test_parse_lock_content_bounds_follow_the_module_clock(clock: Any) -> None:
    ahead = f"7:{NOW + 2 * ONE_DAY}"
    assert _parse_lock_content(ahead) is None
    clock.time.return_value = NOW + ONE_DAY
    assert _parse_lock_content(ahead) == (7, NOW + 2 * ONE_DAY)


def test_the_old_modules_limits_still_import_from_it() -> None:
    """Callers of the old module read its stale limit and pid bound from it (the old design
    had both); the module's trim of issue 29 had dropped them."""
    from mahabharatha.commands import _utils as legacy

    assert (legacy.STALE_AFTER_SECONDS, legacy.MAX_PID) == (7200.0, MAX_PID)
