"""Hold a feature lock while a command runs: ``mahabharatha lock run``.

The lock is held by this process (it lives as long as the command), refreshed by the
:class:`~mahabharatha.locks.FeatureLock` heartbeat, and released when the command ends, also
when we are interrupted. SIGINT, SIGTERM and SIGHUP are handled from *before* the lock is taken:

* while waiting for the lock, a signal ends the wait at the next poll (never in the middle of a
  lock operation, so it cannot strand a half-taken lock); one that arrives after the lock is
  taken but before the command starts releases the lock, and the command never starts;
* while the command starts, a signal is remembered and sent to it as soon as it exists;
* while it runs, a signal is forwarded to it (a Ctrl-C at a terminal already reached it,
  since it shares our foreground process group, so it is not sent twice).
"""

from __future__ import annotations

import enum
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import IO, Final

from mahabharatha.locks import FeatureLock, LockInfo, WaitCallback

FORWARDED_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
SIGNAL_EXIT_BASE: Final = 128  # a process killed by signal N exits 128 + N, as shells report it
EXIT_NOT_FOUND: Final = 127  # the shell's "command not found"
EXIT_CANNOT_EXECUTE: Final = 126  # the shell's "found, but cannot be executed" (permission, format)


class Interrupted(Exception):
    """A signal arrived before the command started; nothing was run."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name} before the command ran")

    @property
    def exit_code(self) -> int:
        return SIGNAL_EXIT_BASE + self.signum


class CommandStartError(OSError):
    """The command could not be started; nothing ran. ``exit_code`` is what a shell would say."""

    exit_code: int = EXIT_CANNOT_EXECUTE


class CommandNotFoundError(CommandStartError, FileNotFoundError):
    """The command to run does not exist (exit 127, like a shell)."""

    exit_code = EXIT_NOT_FOUND


class CommandNotExecutableError(CommandStartError, PermissionError):
    """The command exists but cannot be executed: no permission, a folder, not a program
    (exit 126, like a shell)."""


class _Phase(enum.Enum):
    PREPARING = "preparing"  # waiting for the lock, or starting the command (pid not yet known)
    RUNNING = "running"


class _SignalRelay:
    """Decides what a signal does in each phase (see the module docstring)."""

    def __init__(self) -> None:
        self.phase = _Phase.PREPARING
        self.child: subprocess.Popen[bytes] | None = None
        self.pending: int | None = None

    def __call__(self, signum: int, _frame: FrameType | None) -> None:
        if self.phase is _Phase.RUNNING:
            self._forward(signum)
        else:
            # Race: a signal before the child exists; acted on at the next safe point.
            self.pending = signum

    def raise_if_pending(self) -> None:
        if self.pending is not None:
            raise Interrupted(self.pending)

    def waiting(self, on_wait: WaitCallback | None) -> WaitCallback:
        """The lock's wait callback, made to end the wait once a signal has arrived."""

        def check_then_report(info: LockInfo, left: float | None) -> None:
            self.raise_if_pending()
            if on_wait is not None:
                on_wait(info, left)

        return check_then_report

    def started(self, child: subprocess.Popen[bytes]) -> None:
        self.child, self.phase = child, _Phase.RUNNING
        if self.pending is not None:
            self._forward(self.pending)

    def _forward(self, signum: int) -> None:
        if signum == signal.SIGINT and _child_got_it_from_terminal():
            return
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)


def _child_got_it_from_terminal() -> bool:
    """Ctrl-C at a terminal reaches the whole foreground group, the child included."""
    try:
        return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, ValueError):
        return False


@contextmanager
def _relaying(relay: _SignalRelay) -> Iterator[None]:
    previous = {sig: signal.signal(sig, relay) for sig in FORWARDED_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_locked(
    lock: FeatureLock,
    command: Sequence[str],
    stdout: IO[str] | None = None,
    on_acquired: Callable[[], None] | None = None,
) -> int:
    """Take ``lock`` (waiting as it was configured), run ``command``, release; return its code.

    ``on_acquired`` is called once the lock is ours, before the command starts.

    Raises :class:`~mahabharatha.locks.LockHeldError` when the lock stays busy,
    :class:`Interrupted` when a signal arrives before the command started, and
    :class:`CommandNotFoundError` or :class:`CommandNotExecutableError` (both
    :class:`CommandStartError`) when the command cannot be started (lock released).
    """
    relay = _SignalRelay()
    with _relaying(relay):
        lock.on_wait, on_wait = relay.waiting(lock.on_wait), lock.on_wait
        try:
            lock.acquire()
        finally:
            lock.on_wait = on_wait
        try:
            if on_acquired is not None:
                on_acquired()
            relay.raise_if_pending()
            child = _start(relay, command, stdout)
            returncode = child.wait()
        finally:
            lock.release()
    return SIGNAL_EXIT_BASE - returncode if returncode < 0 else returncode


PR_SET_PDEATHSIG: Final = 1  # <linux/prctl.h>
PARENT_DEATH_SIGNAL: Final = signal.SIGKILL
"""What CMD gets when ``lock run`` dies without ending it (SIGKILL, a crash): the same fate.
A signal that ``lock run`` can handle is forwarded to CMD instead (see the module docstring)."""


def _parent_death_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks Linux to kill the child when ``lock run`` dies; ``None``
    where there is no ``prctl`` (CMD then outlives a SIGKILLed ``lock run``, and its process
    group, recorded with the lock, keeps the lock alive meanwhile).

    Fork safety: everything is resolved here, in the parent; the child only calls one C
    function and two system calls, touching no Python lock (the import lock is held across the
    fork by ``subprocess`` itself, and glibc's ``fork`` leaves ``malloc`` usable).
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    getpid, getppid, kill, signum = os.getpid, os.getppid, os.kill, int(PARENT_DEATH_SIGNAL)

    def die_with_parent() -> None:
        # The signal comes when the thread that forked us ends: run_locked starts CMD from the
        # thread that waits for it.
        prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
        # Race: lock run died between fork and prctl; we were re-parented and no signal comes.
        if getppid() != parent:
            kill(getpid(), signum)

    return die_with_parent


def _start(
    relay: _SignalRelay, command: Sequence[str], stdout: IO[str] | None
) -> subprocess.Popen[bytes]:
    try:
        # CMD stays in our process group (the group recorded with the lock): while any of it
        # runs, the lock's owner is alive, even if ``lock run`` itself was SIGKILLed.
        child = subprocess.Popen(
            list(command),
            stdout=stdout,
            preexec_fn=_parent_death_hook(),
        )
    except FileNotFoundError as error:
        raise CommandNotFoundError(error.errno, f"command not found: {command[0]}") from error
    except OSError as error:  # EACCES, EISDIR, ENOEXEC, ...: there, but not something to run
        why = (error.strerror or "cannot execute").lower()
        raise CommandNotExecutableError(
            error.errno, f"cannot execute {command[0]}: {why}"
        ) from error
    relay.started(child)
    return child
