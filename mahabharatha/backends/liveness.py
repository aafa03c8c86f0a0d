"""Is a lock's owner still running? The owner judgement of the contract, for every backend.

Where the lock carries a proof of life (:mod:`mahabharatha.proof`), the kernel answers: alive
while any process holds it (``work-running`` when the owner pid itself is gone), gone when
nobody does, unless the owner led its own process group and that group lives on, or the exact
owner process still runs. Without a proof, a pid means something only on the boot and PID
namespace it was recorded in (its owner details say which, :mod:`mahabharatha.ownership`);
elsewhere the answer is ``unknown`` and age decides; on ours the owner is alive while it, its
process group or its session has a live process.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Final

from mahabharatha import ownership
from mahabharatha.backends.base import Owner
from mahabharatha.proof import Life

__all__ = [
    "CREATE_TIME_SLACK_SECONDS",
    "Liveness",
    "owner_liveness",
    "per_pid",
    "proof_decides",
]

CREATE_TIME_SLACK_SECONDS: Final = 1.0
"""Process start times are known to a clock tick; a process that started within a second
before the lock's timestamp may be its writer."""

ProcessFacts = tuple[bool, int | None]
"""(alive here, start time in clock ticks after boot) of a pid, from ``/proc/<pid>/stat``."""

OwnerDetails = ownership.OwnerDetails

Liveness = Callable[[int | None, float | None, OwnerDetails | None, Life | None], Owner]
"""Judges a lock's owner from its pid, timestamp, owner details and proof of life."""
FactsOf = Callable[[], ProcessFacts]
"""The owner pid's facts, asked only when a judgement needs them."""


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


def proof_decides(details: OwnerDetails | None, life: Life | None) -> bool:
    """Does the kernel's proof of life judge this owner? Only for a lock whose details claim
    one, written on this very kernel (same boot: a folder shared with containers counts), and
    whose proof could be looked at."""
    return (
        details is not None
        and details.proof
        and life in (Life.HELD, Life.FREE)
        and details.boot is not None
        and details.boot == ownership.this_boot()
    )


def _by_proof(
    pid: int, timestamp: float | None, details: OwnerDetails, life: Life, facts: FactsOf
) -> Owner:
    """The owner judgement for a lock with a proof of life: alive while anyone holds it."""
    pid_judgeable = ownership.judgeable(details)  # our PID namespace: the pid means ours
    if life is Life.HELD:
        if not pid_judgeable:
            return Owner.RUNNING  # alive by the kernel's word; its pid is another namespace's
        own = _owner(facts(), timestamp, details)
        return Owner.RUNNING if own is Owner.RUNNING else Owner.WORK_RUNNING
    if not pid_judgeable:
        return Owner.NOT_RUNNING if details.pgid != pid else Owner.UNKNOWN
    # A live owner that closed its descriptors (a daemon's closerange) let its proof go but
    # still works: its exact process (same start time) keeps the lock. Never two holders.
    own = _owner(facts(), timestamp, details)
    if own is Owner.RUNNING:
        return own
    # A holder that led its own process group (a setsid worker, a shell job): the group counts.
    if details.pgid == pid and ownership.group_has_live_member(pid, details.gstart):
        return Owner.WORK_RUNNING
    return own


def _by_pid(
    pid: int, timestamp: float | None, details: OwnerDetails | None, facts: FactsOf
) -> Owner:
    """The owner judgement without a proof: only on our own boot and PID namespace; alive
    while any process of the group, or of the session, it took the lock in is alive."""
    if details is None or not ownership.judgeable(details):
        return Owner.UNKNOWN  # another boot, namespace or host, or an older writer: age decides
    verdict = _owner(facts(), timestamp, details)
    if verdict is Owner.RUNNING:
        return verdict
    # Race: a SIGKILLed ``lock run`` whose command (or its children) still works: not dead.
    if details.pgid is not None and ownership.group_has_live_member(details.pgid, details.gstart):
        return Owner.WORK_RUNNING
    # Race: work moved to a group of its own (GNU timeout's setpgid) stays in the session.
    if details.sid is not None and ownership.session_has_live_member(details.sid):
        return Owner.WORK_RUNNING
    return verdict


def _judge(
    pid: int,
    timestamp: float | None,
    details: OwnerDetails | None,
    life: Life | None,
    facts: FactsOf,
) -> Owner:
    """The one owner judgement of the contract: the proof of life where the lock has one, the
    pid, group and session rules where it has none."""
    if details is not None and life is not None and proof_decides(details, life):
        return _by_proof(pid, timestamp, details, life, facts)
    if details is not None and details.proof:
        # A proof we could not look at (asked without it, another kernel): never called dead.
        verdict = _by_pid(pid, timestamp, details, facts)
        return Owner.UNKNOWN if verdict in (Owner.NOT_RUNNING, Owner.PID_REUSED) else verdict
    return _by_pid(pid, timestamp, details, facts)


def owner_liveness(
    pid: int | None,
    timestamp: float | None,
    details: OwnerDetails | None = None,
    life: Life | None = None,
) -> Owner:
    """Is the lock's owner alive? By its proof of life where it has one (``life``, looked at by
    the caller with the lock); otherwise ``unknown`` unless its ``details`` show our boot and
    PID namespace (a pid means nothing on another host, boot or namespace)."""
    if pid is None:
        return Owner.UNKNOWN
    return _judge(pid, timestamp, details, life, lambda: process_facts(pid))


def per_pid(facts_of: Callable[[int], ProcessFacts] = process_facts) -> Liveness:
    """Ask the process table once per pid (many locks share few owners), judge each lock's
    details against the answer."""
    seen: dict[int, ProcessFacts] = {}

    def facts(pid: int) -> ProcessFacts:
        if pid not in seen:
            seen[pid] = facts_of(pid)
        return seen[pid]

    def liveness(
        pid: int | None,
        timestamp: float | None,
        details: OwnerDetails | None,
        life: Life | None = None,
    ) -> Owner:
        if pid is None:
            return Owner.UNKNOWN
        return _judge(pid, timestamp, details, life, lambda: facts(pid))

    return liveness
