"""Owner details as this package publishes them, for locks that tests write by hand."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mahabharatha.owner import ownership


def details_for(pid: int, **overrides: Any) -> bytes:
    """The details this package would publish for ``pid``, with ``overrides`` (``boot``,
    ``ns``, ``start``, ``pgid``, ...) replaced."""
    collected = ownership._collect(pid, None)
    return ownership._encode(collected._replace(**overrides))


def attach(path: Path, raw: bytes) -> None:
    """Set ``raw`` as the owner details of the file at ``path`` (a hand-written lock)."""
    os.setxattr(path, ownership.XATTR_NAME, raw, follow_symlinks=False)


def attached(path: Path) -> bytes | None:
    try:
        return os.getxattr(path, ownership.XATTR_NAME, follow_symlinks=False)
    except OSError:
        return None
