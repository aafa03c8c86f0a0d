"""Fault points: every system call the lock protocol (``mahabharatha.backends.files.lockfile``)
makes, counted and hookable.

``instrumented(hook)`` replaces the listed functions on the module objects the protocol calls them
through (the process-wide ``os`` and ``fcntl`` modules, which
``mahabharatha.backends.files.lockfile`` uses), so the N-th system call of an operation can be
traced, failed with an injected ``OSError`` or turned into a SIGKILL of the calling process. The
functions are restored when the block ends. Kill hooks are only ever installed in a forked child
(the parent must never kill itself); fault hooks run in-process for the length of one library call.
"""

from __future__ import annotations

import fcntl
import gc
import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Final

SYSCALLS: Final = (
    (os, "open"),
    (os, "read"),
    (os, "write"),
    (os, "close"),
    (os, "fstat"),
    (os, "stat"),
    (os, "link"),
    (os, "unlink"),
    (os, "rename"),
    (os, "mkdir"),
    (os, "scandir"),
    (os, "readlink"),
    (fcntl, "flock"),
)
"""What the lock code asks of the kernel: the brief's list (open, write, link, unlink, rename,
close, flock, read, fstat) plus the stat, mkdir, scandir and readlink of its slower paths."""

_PATH_ARGS: Final = {"link": 2, "rename": 2}
"""Calls that name two paths: a real failure reports both (``filename`` and ``filename2``)."""

_FD_ONLY: Final = frozenset({"read", "write", "close", "fstat", "flock"})
"""Calls on a descriptor: a real failure names no file."""


@dataclass(frozen=True)
class Call:
    """One system call as the hook sees it: its rank in the operation, name and arguments."""

    index: int
    name: str
    args: tuple[Any, ...]

    def label(self) -> str:
        return f"{self.index:02d}-{self.name}"


Hook = Callable[[Call, str], None]
"""``hook(call, phase)`` with phase ``"before"`` or ``"after"`` (also after a call that raised)."""


def _is_multiprocessing_cleanup(frame: FrameType) -> bool:
    return str(frame.f_globals.get("__name__", "")).startswith("multiprocessing")


@contextmanager
def instrumented(hook: Hook) -> Iterator[None]:
    """Route every call of :data:`SYSCALLS` through ``hook`` for the length of the block."""
    counter = [0]
    saved = [(module, name, getattr(module, name)) for module, name in SYSCALLS]

    def wrap(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if _is_multiprocessing_cleanup(sys._getframe(1)):
                # An earlier test's Process finalised in the middle of the block (it closes its
                # pipes): the patched functions are process-wide, but the fault is not for it.
                return real(*args, **kwargs)
            counter[0] += 1
            call = Call(counter[0], name, args)
            hook(call, "before")
            try:
                return real(*args, **kwargs)
            finally:
                hook(call, "after")

        return wrapper

    for module, name, real in saved:
        setattr(module, name, wrap(name, real))
    # The patched functions are process-wide: a multiprocessing finaliser run by the garbage
    # collector in the middle of the block would meet the injected fault. No collection then.
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
        for module, name, real in saved:
            setattr(module, name, real)


def trace(operation: Callable[[], object]) -> list[Call]:
    """The system calls ``operation`` makes, in order (run it once, fault-free)."""
    calls: list[Call] = []

    def record(call: Call, phase: str) -> None:
        if phase == "before":
            calls.append(call)

    with instrumented(record):
        operation()
    return calls


def injected_error(call: Call, code: int) -> OSError:
    """The ``OSError`` the real call would raise with ``code``, naming what it would name."""
    message = os.strerror(code)
    if call.name in _FD_ONLY or not call.args:
        return OSError(code, message)
    paths = call.args[: _PATH_ARGS.get(call.name, 1)]
    if len(paths) == 2:
        return OSError(code, message, paths[0], None, paths[1])
    return OSError(code, message, paths[0])


def fail_at(index: int, code: int) -> Hook:
    """A hook that fails the ``index``-th call with ``code`` before it reaches the kernel."""

    def hook(call: Call, phase: str) -> None:
        if phase == "before" and call.index == index:
            raise injected_error(call, code)

    return hook


def kill_at(index: int, phase: str) -> Hook:
    """A hook that SIGKILLs this process just before or just after the ``index``-th call."""

    def hook(call: Call, when: str) -> None:
        if call.index == index and when == phase:
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


@dataclass
class Tally:
    """Counts shared by the tests of this folder (printed in pytest's terminal summary)."""

    kills: int = 0
    violations: list[str] = field(default_factory=list)


TALLY: Final = Tally()
