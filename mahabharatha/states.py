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


class WorkOutcome(enum.StrEnum):
    """What a pool worker did with one feature it claimed (``WorkResult.outcome``)."""

    DONE = "done"
    FAILED = "failed"
    RELEASED = "released"
    LOST = "lost"
    LEFT = "left"


class WorkEnd(enum.StrEnum):
    """How a pool worker's loop ended (``WorkReport.ended``)."""

    FINISHED = "finished"
    WAITED_OUT = "waited-out"
    ONCE = "once"
    STOPPED = "stopped"
