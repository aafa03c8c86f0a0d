"""The folder backend's "is it done?" and "what attempts failed?" asked of every feature a claim
passes: a missing marker or record is answered by one ``lstat`` of its path, and anything found
there is judged by the careful look (the folder opened without following a link), so the quick
answer never says more than the careful one did: a marker reached through a link is no mark."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mahabharatha.backends.files.backend import ATTEMPTS_RECORD_NAME, FileBackend
from mahabharatha.constants import COMPLETED_MARKER_NAME
from tests.support.marks import needs_symlinks, not_root

FAILED_RECORD = b'{"count": 3, "limit": 3, "attempts": [{"host": "h", "reason": "r"}]}\n'
"""An attempts record as ``lock fail`` writes it (the one a real folder's look reads back)."""


@pytest.fixture
def gsd(tmp_path: Path) -> Path:
    (tmp_path / ".gsd" / "specs" / "plain").mkdir(parents=True)
    return tmp_path / ".gsd"


def test_a_plain_folder_says_done_only_with_its_marker(gsd: Path) -> None:
    backend = FileBackend(gsd)
    assert not backend.is_done("plain")
    assert not backend.is_done("no-such-folder")
    (gsd / "specs" / "plain" / COMPLETED_MARKER_NAME).write_text("2026-11-26T00:00:00Z\n")
    assert backend.is_done("plain")


@needs_symlinks
def test_a_marker_behind_a_linked_folder_is_no_mark(gsd: Path, tmp_path: Path) -> None:
    """The path finds the marker (the link is followed); the careful look refuses the link."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / COMPLETED_MARKER_NAME).write_text("2026-11-26T00:00:00Z\n")
    (elsewhere / ATTEMPTS_RECORD_NAME).write_bytes(FAILED_RECORD)
    (gsd / "specs" / "linked").symlink_to(elsewhere)
    (gsd / "specs" / "real").mkdir()
    for name in (COMPLETED_MARKER_NAME, ATTEMPTS_RECORD_NAME):
        os.link(elsewhere / name, gsd / "specs" / "real" / name)  # the same files, no link
    backend = FileBackend(gsd)
    assert backend.is_done("real")
    assert backend.attempts("real") is not None
    assert not backend.is_done("linked")
    assert backend.attempts("linked") is None


@needs_symlinks
def test_a_marker_that_is_a_link_is_no_mark(gsd: Path, tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("2026-11-26T00:00:00Z\n")
    (gsd / "specs" / "plain" / COMPLETED_MARKER_NAME).symlink_to(target)
    assert not FileBackend(gsd).is_done("plain")


def test_a_failed_record_is_read_when_there(gsd: Path) -> None:
    backend = FileBackend(gsd)
    assert backend.attempts("plain") is None
    (gsd / "specs" / "plain" / ATTEMPTS_RECORD_NAME).write_bytes(FAILED_RECORD)
    found = backend.attempts("plain")
    assert found is not None
    assert found.tries == 3


@pytest.mark.parametrize(
    "text",
    [
        b'{"count": Infinity, "limit": 3, "attempts": []}',
        b'{"count": 3, "limit": -Infinity, "attempts": []}',
        b'{"count": NaN, "limit": 3, "attempts": []}',
        b'{"count": 1e400, "limit": 3, "attempts": []}',
    ],
)
def test_a_record_with_a_count_no_integer_holds_is_no_record(gsd: Path, text: bytes) -> None:
    """Failed before the fix (Infinity): ``int()`` of it raised OverflowError, which no reader
    expected, instead of the record being read as not ours (the next ``fail`` replaces it)."""
    backend = FileBackend(gsd)
    without = [(info.attempts, info.state) for info in backend.survey()]
    (gsd / "specs" / "plain" / ATTEMPTS_RECORD_NAME).write_bytes(text)
    assert backend.attempts("plain") is None
    assert [(info.attempts, info.state) for info in backend.survey()] == without


@not_root
def test_a_folder_that_cannot_be_entered_is_still_an_error(gsd: Path) -> None:
    """``lstat`` fails with EACCES there, not ENOENT: the careful look raises, as before."""
    folder = gsd / "specs" / "plain"
    os.chmod(folder, 0)
    try:
        with pytest.raises(PermissionError):
            FileBackend(gsd).is_done("plain")
    finally:
        os.chmod(folder, 0o755)
