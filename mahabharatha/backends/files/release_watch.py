"""The folder backend's wait for a release: inotify tells of ``.lock`` unlinked, elsewhere a short
sleep. A wake-up is a hint: the waiter claims again at least every ``RECHECK_SECONDS`` anyway."""

from __future__ import annotations

import ctypes
import errno
import os
import select
import struct
import sys
from collections.abc import Iterable
from time import monotonic
from typing import Final, Self

from mahabharatha.backends.base import PollingWatch
from mahabharatha.backends.files.folder import _NO_FOLDER_ERRNOS, folder_path
from mahabharatha.backends.files.snapshot import LOCK_FILE_NAME
from mahabharatha.constants import RECHECK_SECONDS

IN_DELETE: Final = 0x00000200  # <sys/inotify.h>: a file was removed from a watched folder
IN_MOVED_FROM: Final = 0x00000040  # <sys/inotify.h>: a file was renamed away from it
IN_Q_OVERFLOW: Final = 0x00004000  # events were lost: wake, to be safe
IN_ONLYDIR: Final = 0x01000000  # <sys/inotify.h>: refuse anything but a folder
IN_DONT_FOLLOW: Final = 0x02000000  # <sys/inotify.h>: never follow a symlink
# What each folder's watch asks for: .lock removed or renamed away, on a real folder only.
_WATCH_MASK: Final = IN_DELETE | IN_MOVED_FROM | IN_ONLYDIR | IN_DONT_FOLLOW
# A folder not there yet, not a real folder or unreadable is not watched (the claim still looks).
SKIPPED_FOLDER_ERRNOS: Final = _NO_FOLDER_ERRNOS | {errno.EACCES}
_EVENT: Final = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then name
_READ_BYTES: Final = 64 * 1024


class ReleaseWatch(PollingWatch):
    """The folder's :class:`~mahabharatha.backends.base.ReleaseWatch`. Race: a release between
    the claim and the wait is queued on the inotify descriptor and ends the wait at once."""

    def __init__(self, gsd_dir: str | os.PathLike[str], features: Iterable[str]) -> None:
        self.gsd_dir = gsd_dir
        self.features = list(features)
        self._fd: int | None = None

    @property
    def kernel_events(self) -> bool:
        """Does this watch get the kernel's events (else it polls)?"""
        return self._fd is not None

    def __enter__(self) -> Self:
        self._fd = self._open()
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _open(self) -> int | None:
        if not sys.platform.startswith("linux"):
            return None
        try:  # libc's inotify functions
            libc = ctypes.CDLL(None, use_errno=True)
            libc.inotify_init1.argtypes = [ctypes.c_int]
            libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        except (OSError, AttributeError):
            return None
        fd = int(libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC))
        if fd < 0:  # EMFILE: the user's inotify instances are used up: poll instead
            return None
        for feature in self.features:
            path = os.fsencode(folder_path(self.gsd_dir, feature))
            if libc.inotify_add_watch(fd, path, _WATCH_MASK) < 0:
                if ctypes.get_errno() in SKIPPED_FOLDER_ERRNOS:
                    continue
                os.close(fd)  # ENOSPC: the watches are used up; a poll sees every folder
                return None
        return fd

    def wait(self, seconds: float) -> bool:
        if self._fd is None:
            return super().wait(seconds)
        deadline = monotonic() + max(0.0, min(seconds, RECHECK_SECONDS))
        while (left := deadline - monotonic()) > 0:
            ready, _, _ = select.select([self._fd], [], [], left)
            if ready and self._released():
                return True
        return False

    def _released(self) -> bool:
        """Read the queued events: was ``.lock`` unlinked or renamed away anywhere?"""
        assert self._fd is not None
        try:
            data = os.read(self._fd, _READ_BYTES)
        except BlockingIOError:
            return False
        offset = 0
        while offset + _EVENT.size <= len(data):
            _wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
            offset += _EVENT.size + length
            name = data[offset - length : offset].rstrip(b"\0")
            if mask & IN_Q_OVERFLOW or name == LOCK_FILE_NAME.encode():
                return True  # the one read above drained every queued event
        return False
