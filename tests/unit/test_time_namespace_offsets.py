"""Reading a time namespace's boot-time offset (``ownership._boottime_ticks``).

Fails before the fix: the function did not exist (start times were compared raw, see
``tests/concurrency/test_time_namespace_owner.py``).
"""

from __future__ import annotations

import os

from mahabharatha.owner import ownership


def test_whole_seconds_are_ticks() -> None:
    lines = ["monotonic 0 0", "boottime 100000 0"]
    assert ownership._boottime_ticks(lines) == 100000 * os.sysconf("SC_CLK_TCK")


def test_the_clock_may_be_named_by_number() -> None:
    ticks = ownership._boottime_ticks(["1 0 0", "7 -5 0"])  # 7: CLOCK_BOOTTIME
    assert ticks == -5 * os.sysconf("SC_CLK_TCK")


def test_an_offset_between_ticks_cannot_be_compared() -> None:
    """The kernel rounds start + offset as one sum: our reading could be a tick off either way."""
    assert ownership._boottime_ticks(["boottime 3 1"]) is None


def test_no_boottime_line_is_unknown() -> None:
    assert ownership._boottime_ticks(["monotonic 0 0"]) is None
