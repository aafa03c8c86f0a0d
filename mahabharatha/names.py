"""Feature names: the one rule every entry point checks (one safe path component: a folder and
a database row alike), how a refused name is shown, a gsd folder's features, :data:`MAX_PID`."""

from __future__ import annotations

import os
import re
from typing import Final

MAX_NAME_BYTES: Final = 255  # NAME_MAX on Linux and macOS: a longer name cannot be a folder
MAX_PID: Final = 4_194_304  # Linux's PID_MAX_LIMIT: no process can have a larger pid
NAME_RULE: Final = (  # what a refused name is told it may be
    "a feature name is a letter or digit, then letters, digits, '.', '_' or '-' "
    "(no '..'), at most 255 bytes"
)
SHOWN_NAME_CHARS: Final = 40  # a refused name is echoed this far: enough to spot, never a wall

_FEATURE_NAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*", re.ASCII)


def validate_feature_name(feature: str) -> None:
    """Raise ``ValueError`` unless ``feature`` is a safe single path component."""
    if not is_valid_feature_name(feature):
        raise ValueError(f"Invalid feature name: {shown_name(feature)}: {NAME_RULE}")


def shown_name(feature: object) -> str:
    if not isinstance(feature, str):
        return f"{type(feature).__name__} {repr(feature)[:SHOWN_NAME_CHARS]}"
    if len(feature) <= SHOWN_NAME_CHARS:
        return repr(feature)
    return f"{feature[:SHOWN_NAME_CHARS]!r}... ({len(feature)} characters)"


def is_valid_feature_name(feature: str) -> bool:
    """Is ``feature`` a safe single path component? (Asked of every folder a scan lists.)"""
    # The pattern allows no "/" or "\\"; ".." is the one bad name it lets through.
    return (
        isinstance(feature, str)
        and _FEATURE_NAME_RE.fullmatch(feature) is not None
        and ".." not in feature
        and len(feature.encode()) <= MAX_NAME_BYTES
    )


def feature_folders(gsd_dir: str | os.PathLike[str]) -> list[str]:
    """Names of the real (not symlinked) feature folders under ``<gsd>/specs``, sorted."""
    try:
        return feature_names_in(os.path.join(os.fspath(gsd_dir), "specs"))
    except (FileNotFoundError, NotADirectoryError):
        return []


def feature_names_in(specs: int | str) -> list[str]:
    """The valid names of the real (not symlinked) folders in ``specs`` (an open folder or its
    path), sorted."""
    with os.scandir(specs) as entries:
        return sorted(
            entry.name
            for entry in entries
            if entry.is_dir(follow_symlinks=False) and is_valid_feature_name(entry.name)
        )
