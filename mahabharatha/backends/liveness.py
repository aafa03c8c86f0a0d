"""Is a lock's owner still running? The owner judgement of the contract, for every backend.

A pid means something only on the boot and PID namespace it was recorded in (its owner details
say which, :mod:`mahabharatha.ownership`); elsewhere the answer is ``unknown`` and age decides.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Final

from mahabharatha import ownership
from mahabharatha.backends.base import Owner

__all__ = [
    "CREATE_TIME_SLACK_SECONDS",
    "Liveness",
    "owner_liveness",
    "per_pid",
]

CREATE_TIME_SLACK_SECONDS: Final = 1.0
"""Process start times are known to a clock tick; a process that started within a second
before the lock's timestamp may be its writer."""

ProcessFacts = tuple[bool, int | None]
"""(alive here, start time in clock ticks after boot) of a pid, from ``/proc/<pid>/stat``."""

OwnerDetails = ownership.OwnerDetails

Liveness = Callable[[int | None, float | None, OwnerDetails | None], Owner]
"""Judges a lock's owner from its pid, timestamp and owner details."""


def process_facts(pid: int) -> ProcessFacts:
    """Is ``pid`` alive (any of its threads: a main thread that exited leaves a zombie leader
    whose other threads run on), and when did it start?"""
    stat = ownership.proc_stat(pid)
    if stat is None:
        # Race: /proc hides another user's process (hidepid), or a read failed in passing:
        # only "no such process" is gone; running with an unknown start time otherwise.
        return ownership.pid_exists(pid), None
    if not ownership.is_alive(stat, pid):
        return False, None
    return True, stat.start


def _started_after(started: int, timestamp: float) -> bool:
    import psutil  # only on this rare path: keeps the CLI's cold start short

    # btime is shifted by our time namespace's offset like /proc's raw readings: add it back.
    since_boot = (started + (ownership.boottime_offset_ticks() or 0)) / os.sysconf("SC_CLK_TCK")
    return psutil.boot_time() + since_boot > timestamp + CREATE_TIME_SLACK_SECONDS


def _owner(facts: ProcessFacts, timestamp: float | None, details: OwnerDetails) -> Owner:
    """The recorded pid's own fate (its group is asked separately)."""
    running, started = facts
    if not running:
        return Owner.NOT_RUNNING
    if started is None:
        return Owner.RUNNING
    if details.start is not None:  # exact: the owner's start time was recorded with the lock
        return Owner.RUNNING if started == details.start else Owner.PID_REUSED
    # The owner was not visible when the lock was written (``--pid`` of a gone process).
    if timestamp is not None and _started_after(started, timestamp):
        return Owner.PID_REUSED  # this pid's process began after the lock was written
    return Owner.RUNNING


def _judge(
    pid: int, timestamp: float | None, details: OwnerDetails | None, facts: ProcessFacts
) -> Owner:
    """The owner judgement of the contract: only on our own boot and PID namespace; alive
    while any process of the group it took the lock in is alive."""
    if details is None or not ownership.judgeable(details):
        return Owner.UNKNOWN  # another boot, namespace or host, or an older writer: age decides
    verdict = _owner(facts, timestamp, details)
    if verdict is Owner.RUNNING or details.pgid is None:
        return verdict
    # Race: a SIGKILLed ``lock run`` whose command (or its children) still works: not dead.
    if ownership.group_has_live_member(details.pgid, details.gstart):
        return Owner.RUNNING
    return verdict


def owner_liveness(
    pid: int | None, timestamp: float | None, details: OwnerDetails | None = None
) -> Owner:
    """Is the lock's owner alive? ``unknown`` unless its ``details`` show our boot and PID
    namespace (a pid means nothing on another host, boot or namespace)."""
    if pid is None or not ownership.judgeable(details):
        return Owner.UNKNOWN
    return _judge(pid, timestamp, details, process_facts(pid))


def per_pid(facts_of: Callable[[int], ProcessFacts] = process_facts) -> Liveness:
    """Ask the process table once per pid (many locks share few owners), judge each lock's
    details against the answer."""
    seen: dict[int, ProcessFacts] = {}

    def liveness(pid: int | None, timestamp: float | None, details: OwnerDetails | None) -> Owner:
        if pid is None or not ownership.judgeable(details):
            return Owner.UNKNOWN
        if pid not in seen:
            seen[pid] = facts_of(pid)
        return _judge(pid, timestamp, details, seen[pid])

    return liveness
