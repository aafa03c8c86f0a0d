"""Which feature is being worked on: ``detect_feature`` and the checked text read it trusts
(re-exported by ``commands/_utils.py`` under the names its callers know)."""

from __future__ import annotations

import io
import os
from contextlib import suppress
from pathlib import Path, PosixPath
from typing import Any, Final

from mahabharatha.constants import FEATURE_ENV_VAR, GSD_DIR, STATE_DIR
from mahabharatha.names import is_valid_feature_name, shown_name
from mahabharatha.reads import MAX_READ_BYTES, read_small_file

CURRENT_FEATURE_FILE: Final = ".current-feature"


class CheckedFile(PosixPath):
    """``path`` whose ``open`` serves the bytes already read through the checked descriptor:
    ``Path.read_text`` (which tests patch) decodes them, and the name is never re-opened."""

    _data: bytes

    # Text mode only, all read_text asks for: encoding, errors (and newline, Python 3.13).
    def open(self, mode: str = "r", buffering: int = -1, **text: Any) -> io.TextIOWrapper:  # type: ignore[override]
        return io.TextIOWrapper(io.BytesIO(self._data), **text)


def safe_read_text(path: Path) -> str | None:
    """Stripped text of a small regular file (``reads.read_small_file``), decoded by
    ``Path.read_text``; ``None`` when it cannot or should not be read. Never a lock file."""
    try:
        data = read_small_file(Path(path))
        if data is None:
            return None
        checked = CheckedFile(path)
        checked._data = data
        return checked.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None


def feature_from_state_files() -> str | None:
    """Stem of the newest ``*.json`` state file with a valid name; files may vanish meanwhile."""
    found: list[tuple[float, str]] = []
    try:
        candidates = list(Path(STATE_DIR).glob("*.json"))
    except OSError:
        return None
    for candidate in candidates:
        if is_valid_feature_name(candidate.stem):
            with suppress(OSError):  # removed between the listing and the stat: skip it
                found.append((candidate.stat().st_mtime, candidate.stem))
    return max(found)[1] if found else None


def detect_feature(gsd_dir: str = GSD_DIR, *, skipped: list[str] | None = None) -> str | None:
    """The feature being worked on: the first valid name of ``MAHABHARATHA_FEATURE``, the
    ``.current-feature`` marker, the newest state file; ``skipped`` learns why the variable or
    the marker was passed over (a source that cannot be read is skipped)."""
    notes: list[str] = [] if skipped is None else skipped
    env = os.environ.get(FEATURE_ENV_VAR, "").strip()
    if env and _valid(env, f"${FEATURE_ENV_VAR}", notes):
        return env
    marker = Path(gsd_dir) / CURRENT_FEATURE_FILE
    text = safe_read_text(marker)
    if text is None and os.path.lexists(marker):
        limit = MAX_READ_BYTES
        notes.append(f"skipped {marker}: not a readable text file of at most {limit} bytes")
    if text and _valid(text, str(marker), notes):
        return text
    return feature_from_state_files()


def _valid(name: str, where: str, notes: list[str]) -> bool:
    if is_valid_feature_name(name):
        return True
    notes.append(f"skipped {where}: {shown_name(name)} is not a valid feature name")
    return False
