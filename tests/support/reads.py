"""Read failures for the tests that specify how the legacy functions survive them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

import pytest


def fail_read_text(monkeypatch: pytest.MonkeyPatch, file_name: str, exc: Exception) -> None:
    """Make ``Path.read_text`` raise ``exc`` for files named ``file_name`` (as the old tests do)."""
    original = Path.read_text

    def read_text(self: Path, *args: Any, **kwargs: Any) -> str:
        if self.name == file_name:
            raise exc
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)


class LockReadFailure(NamedTuple):
    """Where a lock read fails now that lock files are read through ``os.open``/``os.read``
    (``mahabharatha.backends.files.lockfile``), not ``Path.read_text``: the open (``error`` raised
    by the no-follow open of ``.lock``), the read (``error`` raised by ``os.read`` of that
    descriptor), or the bytes (``data`` returned by that read instead of the file's)."""

    at: str  # "open" or "read"
    error: OSError | None = None
    data: bytes | None = None


def fail_lock_reads(monkeypatch: pytest.MonkeyPatch, failure: LockReadFailure) -> list[str]:
    """Make every read of a ``.lock`` fail as ``failure`` says; returns the list of injected
    calls (``"open"``/``"read"``), so a test can check that its injection was reached."""
    from mahabharatha.backends.files import lockfile
    from mahabharatha.reads import NOFOLLOW_READ

    real_open, real_read = os.open, os.read
    lock_fds: set[int] = set()
    answered: set[int] = set()
    hits: list[str] = []

    def is_lock_read(path: Any, flags: int) -> bool:
        return os.fspath(path) == lockfile.LOCK_FILE_NAME and flags == NOFOLLOW_READ

    def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if not is_lock_read(path, flags):
            return real_open(path, flags, *args, **kwargs)
        if failure.at == "open":
            hits.append("open")
            assert failure.error is not None
            raise failure.error
        fd = real_open(path, flags, *args, **kwargs)
        lock_fds.add(fd)
        return fd

    def read(fd: int, size: int) -> bytes:
        if fd not in lock_fds:
            return real_read(fd, size)
        if fd in answered:
            return b""  # the file's whole content was the first answer
        answered.add(fd)
        hits.append("read")
        if failure.error is not None:
            raise failure.error
        assert failure.data is not None
        return failure.data[:size]

    def close(fd: int) -> None:
        lock_fds.discard(fd)  # the number may name another file next
        answered.discard(fd)
        real_close(fd)

    real_close = os.close
    # lockfile calls them through the process-wide os module
    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "read", read)
    monkeypatch.setattr(os, "close", close)
    return hits
