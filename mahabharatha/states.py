"""A lock's states and a pool worker's outcomes, as enums: a module importing nothing of the
package, so that the file protocol and the seam share them without importing each other."""

from __future__ import annotations

import enum


class State(enum.StrEnum):
    """What ``lockfile.judge_lock`` (never ``done`` or ``failed``: the pool's marks) and every
    backend's ``LockInfo`` report; a ``str``: JSON and text show the value."""

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
