"""Is a lock's owner alive, gone, or the caller itself? The one owner judgement, for every
backend and for the CLI's messages: :func:`judge`.

Its inputs are the facts of one lock (:class:`OwnerFacts`: the recorded pid and timestamp, the
owner details, what the lock's proof of life said) and, for "already held by you", the pids
that count as the caller. Its answer (:class:`Judgement`) is a :class:`Verdict` (alive, gone,
caller, unknown), the :class:`Owner` word ``status`` shows, and the :class:`Rule` that decided.

The caller first: the lock names one of the caller's pids and this process holds the lock's
proof of life, or the owner details show our boot, our PID namespace and the start time that pid
runs with now. Then liveness. Where the lock carries a proof of life
(:mod:`mahabharatha.owner.proof`), the kernel answers: alive while any process holds it
(``work-running`` when the owner pid itself is gone), gone when nobody does, unless the owner led
its own process group and that group lives on, or the exact owner process still runs. Without a
proof, a pid means something only on the boot and PID namespace it was recorded in (its owner
details say which, :mod:`mahabharatha.owner.ownership`); elsewhere the answer is ``unknown`` and
age decides; on ours the owner is alive while it, its process group or its session has a live
process. A proof that was claimed but not looked at, or recorded in another folder than the one at
the path now (a copy swapped in), is never called gone. The long form, with who calls it:
``design/lockfile-hardening.md``, "One judgement".
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Collection
from typing import Final, NamedTuple

from mahabharatha.backends.base import VERDICT_OF, Owner, Verdict
from mahabharatha.constants import CREATE_TIME_SLACK_SECONDS
from mahabharatha.owner import ownership
from mahabharatha.owner.proof import Life

ProcessFacts = tuple[bool, int | None]
"""(alive here, start time in clock ticks after boot) of a pid, from ``/proc/<pid>/stat``."""

OwnerDetails = ownership.OwnerDetails

Liveness = Callable[[int | None, float | None, OwnerDetails | None, Life | None], Owner]
"""Judges a lock's owner from its pid, timestamp, owner details and proof of life."""
FactsOf = Callable[[], ProcessFacts]
"""The owner pid's facts, asked only when a judgement needs them."""
FactsOfPid = Callable[[int], ProcessFacts]
"""How a judge looks at a pid (``process_facts``, or ``per_pid``'s cache of it)."""


class OwnerFacts(NamedTuple):
    """What a lock says about its owner: the judgement's input.

    ``life``: the lock's proof as looked at with the lock (``None``: not looked at).
    ``host``: the holder's host where the backend records one (PostgreSQL; files: ``None``).
    ``proof_ours``: this process holds the proof of life of the folder the lock is in."""

    pid: int | None
    timestamp: float | None = None
    details: OwnerDetails | None = None
    life: Life | None = None
    host: str | None = None
    proof_ours: bool = False


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
    """The one owner judgement's answer: ``verdict``, the ``owner`` word ``status`` shows for
    it (``running`` for the caller), and the ``rule`` that decided."""

    verdict: Verdict
    owner: Owner
    rule: Rule


_JUDGEMENTS: Final = {
    (owner, rule): Judgement(VERDICT_OF[owner], owner, rule) for owner in Owner for rule in Rule
}
"""Every liveness answer, made once: ``status`` judges thousands of locks."""


def _said(owner: Owner, rule: Rule) -> Judgement:
    return _JUDGEMENTS[owner, rule]


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


def judge(
    facts: OwnerFacts,
    callers: Collection[int] = (),
    *,
    alive: bool = True,
    facts_of: FactsOfPid = process_facts,
) -> Judgement:
    """Is the owner of the lock these ``facts`` describe alive, gone, or the caller (one of
    ``callers``)? ``alive`` False: only the caller is asked (no look at the process table; the
    answer is ``caller`` or ``unknown``). ``facts_of``: how a pid is looked at (``per_pid``
    asks once per pid)."""
    pid = facts.pid
    if pid is None:
        return _said(Owner.UNKNOWN, Rule.NO_PID)
    if pid in callers:
        mine = _as_caller(facts, pid)
        if mine is not None:
            return mine
    if not alive:
        return _said(Owner.UNKNOWN, Rule.NOT_ASKED)
    return _liveness(pid, facts.timestamp, facts.details, facts.life, lambda: facts_of(pid))


def _as_caller(facts: OwnerFacts, pid: int) -> Judgement | None:
    """The caller's own lock (its pid is the lock's): by its proof of life, or by details that
    show our boot, our PID namespace and the pid's start time. Without readable details we
    cannot tell, and say "not yours": a wrong "busy" costs a wait, a wrong "yours" tells a
    caller it holds someone else's lock (the same pid number in a container's namespace, or
    before a reboot, is someone else; so is a reused pid)."""
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
    """The proof of life where the lock has one, the pid, group and session rules where it has
    none."""
    if details is not None and details.proof and life is Life.OTHER_FOLDER:
        # A folder copied and swapped in (or restored) holds nobody's proof: the owner's
        # work may run on in the old one, so nothing here may call it dead.
        return _said(Owner.UNKNOWN, Rule.OTHER_FOLDER)
    if details is not None and life is not None and proof_decides(details, life):
        return _by_proof(pid, timestamp, details, life, pid_facts)
    said = _by_pid(pid, timestamp, details, pid_facts)
    if details is not None and details.proof and said.verdict is Verdict.GONE:
        # A proof we could not look at (asked without it, another kernel): never called dead.
        return _said(Owner.UNKNOWN, Rule.PROOF_UNSEEN)
    return said


def _by_proof(
    pid: int, timestamp: float | None, details: OwnerDetails, life: Life, pid_facts: FactsOf
) -> Judgement:
    """The owner judgement for a lock with a proof of life: alive while anyone holds it."""
    pid_judgeable = ownership.judgeable(details)  # our PID namespace: the pid means ours
    if life is Life.HELD:
        if not pid_judgeable:
            return _said(Owner.RUNNING, Rule.PROOF_HELD)  # its pid is another namespace's
        own = _owner(pid_facts(), timestamp, details)
        return _said(Owner.RUNNING if own is Owner.RUNNING else Owner.WORK_RUNNING, Rule.PROOF_HELD)
    if not pid_judgeable:
        if details.pgid == pid or details.work_group:
            return _said(Owner.UNKNOWN, Rule.GROUP_UNSEEN)
        return _said(Owner.NOT_RUNNING, Rule.PROOF_FREE)
    # A live owner that closed its descriptors (a daemon's closerange) let its proof go but
    # still works: its exact process (same start time) keeps the lock. Never two holders.
    own = _owner(pid_facts(), timestamp, details)
    if own is Owner.RUNNING:
        return _said(own, Rule.OWN_PROCESS)
    # A holder that led its own process group (a setsid worker, a shell job): the group counts.
    if details.pgid == pid and ownership.group_has_live_member(pid, details.gstart):
        return _said(Owner.WORK_RUNNING, Rule.OWN_GROUP)
    if _work_group_lives(details):
        return _said(Owner.WORK_RUNNING, Rule.WORK_GROUP)
    return _said(own, Rule.PROOF_FREE)


def _work_group_lives(details: OwnerDetails) -> bool:
    """Revision 5: the group ``lock run`` made for its command (recorded with the lock) counts
    as the owner's work while any member lives: a Python ``subprocess`` child or a shell's
    ``exec 5>>log`` drops the proof but stays there. Only a group so recorded: the group a
    ``multiprocessing`` worker shares is its parent's, never its work. Only members started
    since the owner did: a terminal job's group that CMD shares holds older processes too."""
    return (
        details.work_group
        and details.pgid is not None
        and ownership.group_has_live_member(details.pgid, details.gstart, details.start)
    )


def _by_pid(
    pid: int, timestamp: float | None, details: OwnerDetails | None, pid_facts: FactsOf
) -> Judgement:
    """The owner judgement without a proof: only on our own boot and PID namespace; alive
    while any process of the group, or of the session, it took the lock in is alive."""
    if details is None or not ownership.judgeable(details):
        return _said(Owner.UNKNOWN, Rule.ELSEWHERE)  # or an older writer: age decides
    own = _owner(pid_facts(), timestamp, details)
    if own is Owner.RUNNING:
        return _said(own, Rule.PID)
    # Race: a SIGKILLed ``lock run`` whose command (or its children) still works: not dead.
    if details.pgid is not None and ownership.group_has_live_member(details.pgid, details.gstart):
        return _said(Owner.WORK_RUNNING, Rule.GROUP)
    # Race: work moved to a group of its own (GNU timeout's setpgid) stays in the session.
    if details.sid is not None and ownership.session_has_live_member(details.sid):
        return _said(Owner.WORK_RUNNING, Rule.SESSION)
    return _said(own, Rule.PID)


def owner_liveness(
    pid: int | None,
    timestamp: float | None,
    details: OwnerDetails | None = None,
    life: Life | None = None,
) -> Owner:
    """:func:`judge`'s owner word for one lock (the :data:`Liveness` of ``inspect``)."""
    owner = judge(OwnerFacts(pid, timestamp, details, life)).owner
    return owner if pid is None else _as_shown(owner, pid, details)


def _as_shown(owner: Owner, pid: int, details: OwnerDetails | None) -> Owner:
    """The word ``status`` shows: a live holder that is stopped (itself, or the group
    ``lock run`` made for its command) shows as ``stopped``: it keeps its lock but does no
    work until it is continued. Never a verdict of its own (alive all the same)."""
    if owner in _LIVE_WORDS and ownership.holder_stopped(pid, details):
        return Owner.STOPPED
    return owner


_LIVE_WORDS: Final = frozenset({Owner.RUNNING, Owner.WORK_RUNNING})


def per_pid(facts_of: FactsOfPid = process_facts) -> Liveness:
    """:func:`judge`'s owner word for many locks, asking the process table once per pid (many
    locks share few owners)."""
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
        # judge() of a lock with no caller to ask, entered past its input record: status
        # judges thousands of locks (the unit table checks both give one answer).
        owner = _liveness(pid, timestamp, details, life, lambda: facts(pid)).owner
        return _as_shown(owner, pid, details)

    return liveness
