"""Is a lock's owner alive, gone, or the caller? :func:`judge`, the one owner judgement for every
backend and the CLI: the caller, the proof of life, then the pid, its group and its session."""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Collection
from functools import cache
from typing import Final, NamedTuple

from mahabharatha.backends.base import VERDICT_OF, Owner, Verdict
from mahabharatha.constants import CREATE_TIME_SLACK_SECONDS
from mahabharatha.owner import ownership
from mahabharatha.owner.ownership import OwnerDetails
from mahabharatha.owner.proof import Life

ProcessFacts = tuple[bool, int | None]  # (alive here, start in clock ticks after boot) of a pid
# Judges a lock's owner from its pid, timestamp, owner details and proof of life.
Liveness = Callable[[int | None, float | None, OwnerDetails | None, Life | None], Owner]
FactsOf = Callable[[], ProcessFacts]  # the owner pid's facts, asked only when needed
FactsOfPid = Callable[[int], ProcessFacts]  # process_facts, or per_pid's cache of it


class OwnerFacts(NamedTuple):
    """What a lock says about its owner: the judgement's input."""

    pid: int | None
    timestamp: float | None = None
    details: OwnerDetails | None = None
    life: Life | None = None  # the proof as looked at with the lock (None: not looked at)
    host: str | None = None  # PostgreSQL records the holder's host
    proof_ours: bool = False  # this process holds the proof of life of the lock's folder


class Rule(enum.StrEnum):
    """Which rule decided (the reason word: the unit table pins each one)."""

    NO_PID = "no-pid"  # no record to judge
    OWN_PROOF = "own-proof"  # caller: this process holds the proof of the lock naming its pid
    SAME_PROCESS = "same-process"  # caller: our boot and namespace, the pid's start time
    NOT_ASKED = "not-asked"  # only "is it the caller?" was asked, and it is not
    PROOF_HELD = "proof-held"  # somebody holds the proof: alive
    PROOF_FREE = "proof-free"  # nobody holds it: gone
    OWN_PROCESS = "own-process"  # proof free, but the exact owner process runs on
    OWN_GROUP = "own-group"  # proof free, but the group the owner led lives on
    WORK_GROUP = "work-group"  # proof free, but the group lock run made for CMD lives on
    GROUP_UNSEEN = "group-unseen"  # proof free; the group the owner led is another namespace's
    PROOF_UNSEEN = "proof-unseen"  # a proof claimed but not looked at: never gone
    OTHER_FOLDER = "other-folder"  # the folder at the path is not the proof's: never gone
    ELSEWHERE = "elsewhere"  # no details, or another boot or PID namespace: age decides
    PID = "pid"  # no proof: the recorded pid's own fate
    GROUP = "group"  # no proof, pid gone: its process group lives on
    SESSION = "session"  # no proof, pid and group gone: its session lives on


class Judgement(NamedTuple):
    """The judgement's answer, the ``owner`` word ``status`` shows, and the rule that decided."""

    verdict: Verdict
    owner: Owner
    rule: Rule


_SAID: Final = {
    (owner, rule): Judgement(VERDICT_OF[owner], owner, rule) for owner in Owner for rule in Rule
}  # every answer made once, by its owner word and rule: status judges thousands of locks


def process_facts(pid: int) -> ProcessFacts:
    """Is ``pid`` alive (any of its threads), and when did it start?"""
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


def judge(
    facts: OwnerFacts,
    callers: Collection[int] = (),
    *,
    alive: bool = True,
    facts_of: FactsOfPid = process_facts,
) -> Judgement:
    """Is the owner of the lock ``facts`` describe alive, gone, or the caller (one of
    ``callers``)? ``alive`` False: only whether it is the caller is asked."""
    pid = facts.pid
    if pid is None:
        return _SAID[Owner.UNKNOWN, Rule.NO_PID]
    if pid in callers:
        mine = _as_caller(facts, pid)
        if mine is not None:
            return mine
    if not alive:
        return _SAID[Owner.UNKNOWN, Rule.NOT_ASKED]
    return _liveness(pid, facts.timestamp, facts.details, facts.life, lambda: facts_of(pid))


def _as_caller(facts: OwnerFacts, pid: int) -> Judgement | None:
    """The caller's own lock, by its proof of life or by details showing our boot, namespace
    and the pid's start time. Without them: "not yours" (a wrong "busy" only costs a wait)."""
    if facts.host is not None and facts.host != ownership.host_name():
        return None
    if facts.proof_ours:
        return Judgement(Verdict.CALLER, Owner.RUNNING, Rule.OWN_PROOF)
    if ownership.judgeable(facts.details) and ownership.could_own(facts.details, pid):
        return Judgement(Verdict.CALLER, Owner.RUNNING, Rule.SAME_PROCESS)
    return None


def _liveness(
    pid: int,
    timestamp: float | None,
    details: OwnerDetails | None,
    life: Life | None,
    pid_facts: FactsOf,
) -> Judgement:
    """The proof of life where the lock has one, else the pid, group and session rules."""
    if details is not None and details.proof:
        if life is Life.OTHER_FOLDER:
            # A folder swapped in (copied, restored) holds nobody's proof: the work may run on.
            return _SAID[Owner.UNKNOWN, Rule.OTHER_FOLDER]
        # The kernel's proof of life judges when it was looked at and written on this boot.
        looked_at = life is Life.HELD or life is Life.FREE
        if looked_at and details.boot is not None and details.boot == ownership.this_boot():
            return _by_proof(pid, timestamp, details, life, pid_facts)
    said = _by_pid(pid, timestamp, details, pid_facts)
    if details is not None and details.proof and said.verdict is Verdict.GONE:
        # A proof we could not look at (asked without it, another kernel): never called dead.
        return _SAID[Owner.UNKNOWN, Rule.PROOF_UNSEEN]
    return said


def _by_proof(
    pid: int, timestamp: float | None, details: OwnerDetails, life: Life | None, pid_facts: FactsOf
) -> Judgement:
    """Alive while anyone holds the proof (``life``: held or free)."""
    pid_judgeable = ownership.judgeable(details)  # our PID namespace: the pid means ours
    if life is Life.HELD:
        if not pid_judgeable:
            return _SAID[Owner.RUNNING, Rule.PROOF_HELD]  # its pid is another namespace's
        own = _owner(pid_facts(), timestamp, details)
        return _SAID[Owner.RUNNING if own is Owner.RUNNING else Owner.WORK_RUNNING, Rule.PROOF_HELD]
    if not pid_judgeable:
        if details.pgid == pid or details.work_group:
            return _SAID[Owner.UNKNOWN, Rule.GROUP_UNSEEN]
        return _SAID[Owner.NOT_RUNNING, Rule.PROOF_FREE]
    # A live owner that closed its descriptors (a daemon's closerange) let its proof go but
    # still works: its exact process (same start time) keeps the lock. Never two holders.
    own = _owner(pid_facts(), timestamp, details)
    if own is Owner.RUNNING:
        return _SAID[own, Rule.OWN_PROCESS]
    # A holder that led its own process group (a setsid worker, a shell job): the group counts.
    if details.pgid == pid and ownership.group_has_live_member(pid, details.gstart):
        return _SAID[Owner.WORK_RUNNING, Rule.OWN_GROUP]
    # The group ``lock run`` recorded for its command is the owner's work while a member
    # started since the owner lives (a child may drop the proof but stays there).
    pgid = details.pgid if details.work_group else None
    if pgid is not None and ownership.group_has_live_member(pgid, details.gstart, details.start):
        return _SAID[Owner.WORK_RUNNING, Rule.WORK_GROUP]
    return _SAID[own, Rule.PROOF_FREE]


def _by_pid(
    pid: int, timestamp: float | None, details: OwnerDetails | None, pid_facts: FactsOf
) -> Judgement:
    """Without a proof, on our boot and namespace only: alive while its group or session is."""
    if details is None or not ownership.judgeable(details):
        return _SAID[Owner.UNKNOWN, Rule.ELSEWHERE]  # or an older writer: age decides
    own = _owner(pid_facts(), timestamp, details)
    if own is Owner.RUNNING:
        return _SAID[own, Rule.PID]
    # Race: a SIGKILLed ``lock run`` whose command (or its children) still works: not dead.
    if details.pgid is not None and ownership.group_has_live_member(details.pgid, details.gstart):
        return _SAID[Owner.WORK_RUNNING, Rule.GROUP]
    # Race: work moved to a group of its own (GNU timeout's setpgid) stays in the session.
    if details.sid is not None and ownership.session_has_live_member(details.sid):
        return _SAID[Owner.WORK_RUNNING, Rule.SESSION]
    return _SAID[own, Rule.PID]


_LIVE_WORDS: Final = frozenset({Owner.RUNNING, Owner.WORK_RUNNING})


def per_pid(facts_of: FactsOfPid = process_facts) -> Liveness:
    """:func:`judge`'s owner word for many locks, asking the process table once per pid; a
    live holder that is stopped (or its command's group) shows ``stopped`` (alive all the same)."""
    facts = cache(facts_of)  # this listing's own: a pid's facts asked once

    def liveness(
        pid: int | None,
        timestamp: float | None,
        details: OwnerDetails | None,
        life: Life | None = None,
    ) -> Owner:
        if pid is None:
            return Owner.UNKNOWN
        # judge() of a lock with no caller to ask, entered past its input record: status
        # judges thousands of locks (the unit table checks both give one answer).
        owner = _liveness(pid, timestamp, details, life, lambda: facts(pid)).owner
        if owner in _LIVE_WORDS and ownership.holder_stopped(pid, details):
            return Owner.STOPPED
        return owner

    return liveness


def owner_liveness(
    pid: int | None,
    timestamp: float | None,
    details: OwnerDetails | None = None,
    life: Life | None = None,
) -> Owner:
    """:func:`per_pid`'s owner word for one lock (the :data:`Liveness` of ``inspect``)."""
    return per_pid()(pid, timestamp, details, life)
