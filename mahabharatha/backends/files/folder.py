"""The feature folder: its no-follow descriptor, its guard (the ``flock`` under which an existing
``.lock`` is changed) and the scan of every feature's lock."""

from __future__ import annotations

import errno
import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path
from time import monotonic
from typing import Final

from mahabharatha.backends.base import LockError, UnsafeLockPathError
from mahabharatha.backends.files.snapshot import (
    _SYMLINK_ERRNOS,
    LOCK_FILE_NAME,
    MISSING,
    LockSnapshot,
    raise_named,
    read_lock,
)
from mahabharatha.constants import GUARD_WAIT_SECONDS
from mahabharatha.names import feature_names_in
from mahabharatha.reads import close_quietly

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# A feature folder we cannot enter (or that is not a real folder) holds no lock we can see.
_NO_FOLDER_ERRNOS: Final = frozenset({errno.ENOENT, errno.ENOTDIR, *_SYMLINK_ERRNOS})


class GuardBusyError(OSError, LockError):
    """Another process kept the feature folder's guard longer than ``GUARD_WAIT_SECONDS``."""


def feature_dir_path(gsd_dir: str | os.PathLike[str], feature: str) -> Path:
    return Path(gsd_dir) / "specs" / feature


def folder_path(gsd_dir: str | os.PathLike[str], feature: str) -> str:
    # A plain string: building a Path costs more than the system call it names (hot path).
    # An empty gsd_dir is today's directory, as for pathlib and os.path.join (never "/specs").
    return f"{os.fspath(gsd_dir) or '.'}/specs/{feature}"


def _refuse_folder(folder: str, error: OSError) -> UnsafeLockPathError:
    return UnsafeLockPathError(
        error.errno or errno.ENOTDIR,
        f"feature folder {folder} is a symlink or not a folder; refusing to follow it",
        folder,
    )


class OpenFeatureDir:
    """``with OpenFeatureDir(gsd, feature, create=...) as dfd``: ``specs/<feature>``, no link
    followed (``None``: no usable folder); the block's OS errors name their full path. Race:
    every step works relative to it, so a folder swapped for a link redirects nothing."""

    __slots__ = ("create", "dfd", "folder", "refuse")

    def __init__(
        self,
        gsd_dir: str | os.PathLike[str],
        feature: str,
        *,
        create: bool,
        refuse: bool = False,
    ) -> None:
        self.folder = folder_path(gsd_dir, feature)
        self.create = create
        self.refuse = refuse or create
        self.dfd: int | None = None

    def __enter__(self) -> int | None:
        self.dfd = _open_dir_nofollow(self.folder, create=self.create, refuse=self.refuse)
        return self.dfd

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: object
    ) -> None:
        if self.dfd is not None:
            close_quietly(self.dfd)
            self.dfd = None
        if isinstance(error, OSError):
            named = named_error(error, self.folder)
            if named is not error:
                raise named from error


def named_error(error: OSError, folder: str) -> OSError:
    """The same error, naming the full path of a file it named relative to the folder (``.``
    and ``/proc/self/fd/N``: the unnamed lock being published); others are left as they are."""
    name = None if error.filename is None else str(error.filename)
    if error.errno is None or name is None or (os.sep in name and not name.startswith("/proc/")):
        return error
    bare = name if name != "." and not name.startswith("/proc/") else LOCK_FILE_NAME
    path = os.path.join(folder, bare)
    detail = error.strerror or str(error)
    return type(error)(error.errno, f"{path}: {detail}", path)


def _open_dir_nofollow(folder: str, *, create: bool, refuse: bool) -> int | None:
    try:
        return os.open(folder, _DIR_FLAGS)
    except FileNotFoundError:
        if not create:
            return None
    except OSError as error:
        if error.errno not in _NO_FOLDER_ERRNOS:
            raise
        if refuse:
            raise _refuse_folder(folder, error) from error
        return None
    try:  # the first lock of this feature: make its folder, then open it
        os.makedirs(folder, exist_ok=True)
    except FileExistsError as error:  # a dangling link or a file where the folder should be
        raise _refuse_folder(folder, error) from error
    dfd = _open_dir_nofollow(folder, create=False, refuse=True)
    if dfd is None:  # Race: the folder was removed or swapped for a link just after mkdir.
        raise _refuse_folder(folder, OSError(errno.ENOENT, "vanished"))
    return dfd


FolderError = Callable[[str, OSError], None]  # told of a folder a scan could not look into


def scan_locks(
    gsd_dir: str | os.PathLike[str],
    *,
    on_error: FolderError | None = None,
) -> Iterator[tuple[str, LockSnapshot]]:
    """Every real (not symlinked) feature folder under ``<gsd>/specs`` with a look at its lock and
    its proof of life; one that cannot be looked into raises, or is told to ``on_error``."""
    specs_path = os.path.join(os.fspath(gsd_dir), "specs")
    try:
        specs = os.open(specs_path, os.O_RDONLY | os.O_DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        return
    try:
        for name in feature_names_in(specs):
            try:
                snapshot = _look_in(specs, name, specs_path)
            except OSError as error:
                if on_error is None:
                    raise
                on_error(name, error)
                continue
            yield name, snapshot
    finally:
        os.close(specs)


def _look_in(specs: int, feature: str, specs_path: str) -> LockSnapshot:
    try:
        dfd = os.open(feature, _DIR_FLAGS, dir_fd=specs)
    except OSError as error:
        if error.errno in _NO_FOLDER_ERRNOS:  # Race: removed or swapped for a link since listed
            return MISSING
        folder = os.path.join(specs_path, feature)  # the full path
        raise type(error)(error.errno, error.strerror, folder) from error
    try:
        return read_lock(dfd, life=True)
    except OSError as error:
        named = named_error(error, os.path.join(specs_path, feature))
        if named is error:
            raise
        raise named from error
    finally:
        close_quietly(dfd)


def _try_guard(dfd: int) -> bool:
    try:
        fcntl.flock(dfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as error:  # the guard of .lock could not be taken (ENOLCK, ...)
        raise_named(error, LOCK_FILE_NAME)
    return True


def _let_go(fd: int) -> None:
    """Unlock the guard held through ``fd`` (a forked child may share it) and close it."""
    with suppress(OSError):  # closing the descriptor lets go of it anyway
        fcntl.flock(fd, fcntl.LOCK_UN)
    close_quietly(fd)


def _wait_for_guard(dfd: int, deadline: float) -> int | None:
    """The descriptor holding the guard of ``dfd`` once ours, or None at ``deadline``: a helper
    thread takes a blocking ``flock`` through a description of its own, so the caller waits
    with a deadline; never spinning (that takes the CPU from the holder)."""
    try:
        fd = os.open(".", _DIR_FLAGS, dir_fd=dfd)  # a description of its own: a lock of its own
    except OSError as error:
        raise_named(error, LOCK_FILE_NAME)
    mutex, finished = threading.Lock(), threading.Event()
    errors: list[OSError] = []
    abandoned = False

    def take() -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # blocks until the holder lets go
        except OSError as error:
            errors.append(error)
        with mutex:
            finished.set()
            late = abandoned
        if late:  # Race: the caller's deadline passed just before we got it: let go
            _let_go(fd)

    try:
        threading.Thread(target=take, name="mahabharatha-guard", daemon=True).start()
    except BaseException:
        close_quietly(fd)
        raise
    try:
        finished.wait(max(0.0, deadline - monotonic()))
    finally:
        with mutex:
            # Race: the helper may take the guard right after our wait ended: whoever
            # comes second under the mutex (it or us) lets go of it.
            abandoned = not finished.is_set()
    if abandoned:
        return None
    if errors:
        close_quietly(fd)
        raise_named(errors[0], LOCK_FILE_NAME)
    return fd


class Guard:
    """Hold the folder's ``flock`` (the guard) for a ``with`` block, which gets whether it
    was taken: ``wait``: for ``GUARD_WAIT_SECONDS``, then ``GuardBusyError``; ``until``: until
    that ``monotonic`` time; neither: one try."""

    __slots__ = ("dfd", "held_by", "taken", "until", "wait")

    def __init__(self, dfd: int, *, wait: bool, until: float | None = None) -> None:
        self.dfd = dfd
        self.wait = wait
        self.until = until
        self.taken = False
        self.held_by: int | None = None  # the waiter's descriptor when it took the guard

    def __enter__(self) -> bool:
        dfd = self.dfd
        self.taken = _try_guard(dfd)
        if not self.taken and (self.wait or self.until is not None):
            deadline = monotonic() + GUARD_WAIT_SECONDS if self.until is None else self.until
            # Race: its holder is mid-removal for a few system calls: wait for it to finish.
            self.held_by = _wait_for_guard(dfd, deadline)
            self.taken = self.held_by is not None
            if not self.taken and self.wait:
                raise GuardBusyError(
                    errno.EWOULDBLOCK, "feature folder stayed busy; try again", LOCK_FILE_NAME
                )
        return self.taken

    def __exit__(self, *_exc: object) -> None:
        if self.held_by is not None:
            _let_go(self.held_by)
            self.held_by = None
        elif self.taken:
            try:  # noqa: SIM105  (suppress() costs a microsecond on every release)
                fcntl.flock(self.dfd, fcntl.LOCK_UN)
            except OSError:  # closing the folder's descriptor lets go of it anyway
                pass
