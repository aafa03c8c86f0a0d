"""The states a feature lock can be in: one set for the file protocol and every backend.

A module of its own, importing nothing of the package, so that the protocol (``lockfile``,
under the legacy functions) and the seam (``backends.base``) share it without either importing
the other.
"""

from __future__ import annotations

import enum


class State(enum.StrEnum):
    """A lock's state: what the file protocol's judgement (``lockfile.judge_lock``, which never
    answers ``done`` or ``failed``, the pool's marks) and every backend's ``LockInfo`` report.
    A ``str``: JSON and text show the value."""

    FREE = "free"
    ACTIVE = "active"
    STALE = "stale"
    CORRUPT = "corrupt"
    WRITING = "writing"
    UNREADABLE = "unreadable"
    NOT_A_FILE = "not-a-file"
    BUSY = "busy"  # a file whose read failed for a passing reason: held, never judged
    DONE = "done"
    FAILED = "failed"
