"""Every exit code the package gives, in one place (the CLI's :func:`exit_code_for` maps errors
to them; :mod:`mahabharatha.run.runner` reports a command's end the way a shell does)."""

from __future__ import annotations

import signal
from typing import Final

EXIT_OK: Final = 0
EXIT_HELD: Final = 1  # held by another / none free / nothing detected
EXIT_BAD_INPUT: Final = 2
EXIT_OS_ERROR: Final = 3
EXIT_TEMPFAIL: Final = 75  # sysexits.h EX_TEMPFAIL: busy, try again later
EXIT_LOST: Final = 76  # lock run: the lock was lost while CMD ran (sysexits.h EX_PROTOCOL)
EXIT_CANNOT_EXECUTE: Final = 126  # the shell's "found, but cannot be executed" (permission, format)
EXIT_NOT_FOUND: Final = 127  # the shell's "command not found"
SIGNAL_EXIT_BASE: Final = 128  # a process killed by signal N exits 128 + N, as shells report it
EXIT_INTERRUPTED: Final = SIGNAL_EXIT_BASE + signal.SIGINT  # 130, as shells report a Ctrl-C


def killed_by(signum: int) -> int:
    """The exit code of a process ended by signal ``signum``, as a shell reports it."""
    return SIGNAL_EXIT_BASE + signum


def shell_status(returncode: int) -> int:
    """A child's ``returncode`` (negative: killed by that signal) as a shell's exit status."""
    return killed_by(-returncode) if returncode < 0 else returncode
