"""Bounded reads of any small file we judge (a lock, a marker): one no-follow, non-blocking open
(a link, FIFO or device can neither fool nor hang us), then ``MAX_READ_BYTES`` + 1 bytes at most."""

from __future__ import annotations

import os
import stat
from typing import Final

MAX_READ_BYTES: Final = 4096  # a record is about 30 bytes: never more from a file we judge

NOFOLLOW_READ: Final = (
    os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
)  # O_NONBLOCK: a FIFO or device at the path must not hang the open


def read_bounded(fd: int, size: int) -> bytes:
    """Read at most ``MAX_READ_BYTES + 1`` bytes (one more than allowed tells "too big" apart);
    ``size`` from ``fstat`` lets a lock be read with one system call."""
    want = MAX_READ_BYTES + 1
    data = os.read(fd, want)
    if len(data) >= size:  # the whole file in one call (the common case)
        return data
    while data and len(data) < min(size, want):  # a short read before the end: read on
        more = os.read(fd, want - len(data))
        if not more:
            break
        data += more
    return data


def close_quietly(fd: int) -> None:
    """Close after the work is done; on Linux the descriptor is gone even when close fails."""
    try:  # noqa: SIM105  (suppress() costs a microsecond on every acquire)
        os.close(fd)
    except OSError:
        pass


def read_small_file(path: str | os.PathLike[str], dir_fd: int | None = None) -> bytes | None:
    """The bytes of ``path`` itself (not a link's target) if it is a regular file of at most
    ``MAX_READ_BYTES``, read through the very descriptor that was checked; else ``None``."""
    fd = os.open(path, NOFOLLOW_READ, dir_fd=dir_fd)  # a link or FIFO cannot fool us
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_READ_BYTES:
            return None
        # Race: the entry may be swapped for a FIFO or a link right now, or the file may grow;
        # we read this descriptor, never the name again, and at most one byte too many.
        data = read_bounded(fd, info.st_size)
    finally:
        close_quietly(fd)
    return None if len(data) > MAX_READ_BYTES else data
