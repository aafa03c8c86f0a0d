"""Every rule of the one owner judgement (``liveness.judge``), one row each.

The judge's world (this boot and PID namespace, the process table, groups, sessions, the host)
is set by the row; the answer must be the row's verdict, owner word and deciding rule. A later
edit that changes any rule of ``design/lockfile-hardening.md`` sections 12 and 13 ("One
judgement") changes a row's answer and fails here. The races behind the rules are shown with
real processes in ``tests/cli/test_owner_judgement.py``, ``tests/cli/test_proof_of_life.py``
and ``tests/faults/test_judgement_storm.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from mahabharatha.backends import liveness
from mahabharatha.backends.base import VERDICT_OF, Owner, Verdict
from mahabharatha.backends.liveness import OwnerFacts, Rule, judge
from mahabharatha.owner import ownership
from mahabharatha.owner.ownership import OwnerDetails
from mahabharatha.owner.proof import Life

BOOT = "0123456789abcdef"
OTHER_BOOT = "fedcba9876543210"
NS = 4026531836
OTHER_NS = 4026532001
PID = 4242
START = 1000
LATER_START = 2000
GROUP = 4100
SESSION = 4000
LOCKED_AT = 1_700_000_000.0
HOST = "here"


@dataclass(frozen=True)
class World:
    """What the judge sees: the owner pid now, and which groups and sessions have members."""

    pid_running: bool = False
    pid_start: int | None = START  # the start time the pid runs with now (None: unknown)
    live_groups: frozenset[int] = frozenset()
    live_sessions: frozenset[int] = frozenset()
    started_after_lock: bool = False  # a process at the pid began after the lock was written
    host: str = HOST
    stopped: bool = False  # the holder, or its command's recorded group, is stopped (SIGSTOP)
    asked: list[int] = field(default_factory=list)  # pids whose facts were asked


def _details(**fields: object) -> OwnerDetails:
    """Details as this package writes them on this boot, in this namespace, without a proof."""
    base: dict[str, object] = {
        "boot": BOOT,
        "ns": NS,
        "start": START,
        "pgid": GROUP,
        "gstart": 7,
        "sid": SESSION,
    }
    return OwnerDetails(**{**base, **fields})  # type: ignore[arg-type]


def _proof(**fields: object) -> OwnerDetails:
    return _details(proof=True, slot=3, **fields)


def _judged(
    monkeypatch: pytest.MonkeyPatch,
    here: World,
    facts: OwnerFacts,
    callers: tuple[int, ...] = (),
    alive: bool = True,
) -> liveness.Judgement:
    return judge(facts, callers, alive=alive, facts_of=_enter(monkeypatch, here))


def _enter(monkeypatch: pytest.MonkeyPatch, here: World) -> liveness.FactsOfPid:
    """Make ``here`` the judge's world; how it looks at a pid."""
    monkeypatch.setattr(ownership, "this_boot", lambda: BOOT)
    monkeypatch.setattr(ownership, "this_pid_namespace", lambda: NS)
    monkeypatch.setattr(ownership, "host_name", lambda: here.host)
    monkeypatch.setattr(
        ownership, "_start_of", lambda pid: here.pid_start if here.pid_running else None
    )
    monkeypatch.setattr(
        ownership,
        "group_has_live_member",
        lambda pgid, _start, _since=None: pgid in here.live_groups,
    )
    monkeypatch.setattr(ownership, "session_has_live_member", lambda sid: sid in here.live_sessions)
    monkeypatch.setattr(ownership, "holder_stopped", lambda _pid, _details: here.stopped)
    monkeypatch.setattr(liveness, "_started_after", lambda _s, _t: here.started_after_lock)

    def facts_of(pid: int) -> liveness.ProcessFacts:
        here.asked.append(pid)
        return (here.pid_running, here.pid_start if here.pid_running else None)

    return facts_of


ALIVE, GONE, CALLER, UNKNOWN = Verdict.ALIVE, Verdict.GONE, Verdict.CALLER, Verdict.UNKNOWN

ROWS = {
    # ---- no record
    "no pid": (World(), OwnerFacts(None), (UNKNOWN, Owner.UNKNOWN, Rule.NO_PID)),
    # ---- proof of life: the kernel's word first
    "proof held, owner runs": (
        World(pid_running=True),
        OwnerFacts(PID, LOCKED_AT, _proof(), Life.HELD),
        (ALIVE, Owner.RUNNING, Rule.PROOF_HELD),
    ),
    "proof held, owner pid dead": (
        World(),
        OwnerFacts(PID, LOCKED_AT, _proof(), Life.HELD),
        (ALIVE, Owner.WORK_RUNNING, Rule.PROOF_HELD),
    ),
    "proof held, owner pid recycled": (
        World(pid_running=True, pid_start=LATER_START),
        OwnerFacts(PID, LOCKED_AT, _proof(), Life.HELD),
        (ALIVE, Owner.WORK_RUNNING, Rule.PROOF_HELD),
    ),
    "proof held, owner of another PID namespace": (
        World(),
        OwnerFacts(PID, LOCKED_AT, _proof(ns=OTHER_NS), Life.HELD),
        (ALIVE, Owner.RUNNING, Rule.PROOF_HELD),
    ),
    "proof free, owner pid dead": (
        World(),
        OwnerFacts(PID, LOCKED_AT, _proof(), Life.FREE),
        (GONE, Owner.NOT_RUNNING, Rule.PROOF_FREE),
    ),
    "proof free, owner pid recycled": (
        World(pid_running=True, pid_start=LATER_START),
        OwnerFacts(PID, LOCKED_AT, _proof(), Life.FREE),
        (GONE, Owner.PID_REUSED, Rule.PROOF_FREE),
    ),
    "proof free, the exact owner runs (closed its descriptors)": (
        World(pid_running=True),
        OwnerFacts(PID, LOCKED_AT, _proof(), Life.FREE),
        (ALIVE, Owner.RUNNING, Rule.OWN_PROCESS),
    ),
    "proof free, owner led its group, the group lives": (
        World(live_groups=frozenset({PID})),
        OwnerFacts(PID, LOCKED_AT, _proof(pgid=PID), Life.FREE),
        (ALIVE, Owner.WORK_RUNNING, Rule.OWN_GROUP),
    ),
    "proof free, owner led its group, the group ended": (
        World(),
        OwnerFacts(PID, LOCKED_AT, _proof(pgid=PID), Life.FREE),
        (GONE, Owner.NOT_RUNNING, Rule.PROOF_FREE),
    ),
    "proof free, a group the owner did not lead lives (multiprocessing worker)": (
        World(live_groups=frozenset({GROUP}), live_sessions=frozenset({SESSION})),
        OwnerFacts(PID, LOCKED_AT, _proof(), Life.FREE),
        (GONE, Owner.NOT_RUNNING, Rule.PROOF_FREE),
    ),
    # ---- issue 26 item 1: the group lock run made for its command (recorded with the lock)
    "proof free, recorded group alive (CMD's work dropped the proof)": (
        World(live_groups=frozenset({GROUP})),
        OwnerFacts(PID, LOCKED_AT, _proof(work_group=True), Life.FREE),
        (ALIVE, Owner.WORK_RUNNING, Rule.WORK_GROUP),
    ),
    "proof free, recorded group ended": (
        World(live_sessions=frozenset({SESSION})),
        OwnerFacts(PID, LOCKED_AT, _proof(work_group=True), Life.FREE),
        (GONE, Owner.NOT_RUNNING, Rule.PROOF_FREE),
    ),
    "proof free, parent's group alive (a multiprocessing worker: not recorded as its work)": (
        World(live_groups=frozenset({GROUP})),
        OwnerFacts(PID, LOCKED_AT, _proof(work_group=False), Life.FREE),
        (GONE, Owner.NOT_RUNNING, Rule.PROOF_FREE),
    ),
    "proof free, recorded group of another PID namespace": (
        World(),
        OwnerFacts(PID, LOCKED_AT, _proof(ns=OTHER_NS, work_group=True), Life.FREE),
        (UNKNOWN, Owner.UNKNOWN, Rule.GROUP_UNSEEN),
    ),
    "no proof, owner dead, its recorded group lives": (
        World(live_groups=frozenset({GROUP})),
        OwnerFacts(PID, LOCKED_AT, _details(work_group=True)),
        (ALIVE, Owner.WORK_RUNNING, Rule.GROUP),
    ),
    "proof free, owner of another PID namespace": (
        World(pid_running=True),
        OwnerFacts(PID, LOCKED_AT, _proof(ns=OTHER_NS), Life.FREE),
        (GONE, Owner.NOT_RUNNING, Rule.PROOF_FREE),
    ),
    "proof free, owner of another PID namespace led its group": (
        World(),
        OwnerFacts(PID, LOCKED_AT, _proof(ns=OTHER_NS, pgid=PID), Life.FREE),
        (UNKNOWN, Owner.UNKNOWN, Rule.GROUP_UNSEEN),
    ),
    "proof unreadable, owner pid dead": (
        World(),
        OwnerFacts(PID, LOCKED_AT, _proof(), Life.UNKNOWN),
        (UNKNOWN, Owner.UNKNOWN, Rule.PROOF_UNSEEN),
    ),
    "proof not lookable by this judge (another user's, issue 26 item 4), owner pid dead": (
        World(),
        OwnerFacts(PID, LOCKED_AT, _proof(), Life.UNKNOWN),
        (UNKNOWN, Owner.UNKNOWN, Rule.PROOF_UNSEEN),
    ),
    "proof not looked at, owner pid dead": (
        World(),
        OwnerFacts(PID, LOCKED_AT, _proof(), None),
        (UNKNOWN, Owner.UNKNOWN, Rule.PROOF_UNSEEN),
    ),
    "proof not looked at, owner runs": (
        World(pid_running=True),
        OwnerFacts(PID, LOCKED_AT, _proof(), None),
        (ALIVE, Owner.RUNNING, Rule.PID),
    ),
    "proof free but of another boot": (
        World(),
        OwnerFacts(PID, LOCKED_AT, _proof(boot=OTHER_BOOT), Life.FREE),
        (UNKNOWN, Owner.UNKNOWN, Rule.ELSEWHERE),
    ),
    # ---- issue 26, item 3: the proof's folder (its identity is recorded with the lock)
    "proof recorded in another folder than the one at the path (a copy swapped in)": (
        World(),
        OwnerFacts(PID, LOCKED_AT, _proof(), Life.OTHER_FOLDER),
        (UNKNOWN, Owner.UNKNOWN, Rule.OTHER_FOLDER),
    ),
    "proof recorded in another folder, a group the owner did not lead lives": (
        World(live_groups=frozenset({GROUP})),
        OwnerFacts(PID, LOCKED_AT, _proof(), Life.OTHER_FOLDER),
        (UNKNOWN, Owner.UNKNOWN, Rule.OTHER_FOLDER),
    ),
    # ---- no proof: pid, then its group, then its session, only on our boot and namespace
    "no proof, no details (older writer)": (
        World(),
        OwnerFacts(PID, LOCKED_AT, None),
        (UNKNOWN, Owner.UNKNOWN, Rule.ELSEWHERE),
    ),
    "no proof, another boot": (
        World(),
        OwnerFacts(PID, LOCKED_AT, _details(boot=OTHER_BOOT)),
        (UNKNOWN, Owner.UNKNOWN, Rule.ELSEWHERE),
    ),
    "no proof, another PID namespace": (
        World(),
        OwnerFacts(PID, LOCKED_AT, _details(ns=OTHER_NS)),
        (UNKNOWN, Owner.UNKNOWN, Rule.ELSEWHERE),
    ),
    "no proof, details without a namespace": (
        World(),
        OwnerFacts(PID, LOCKED_AT, _details(ns=None)),
        (UNKNOWN, Owner.UNKNOWN, Rule.ELSEWHERE),
    ),
    "no proof, owner runs": (
        World(pid_running=True),
        OwnerFacts(PID, LOCKED_AT, _details()),
        (ALIVE, Owner.RUNNING, Rule.PID),
    ),
    "no proof, owner runs with a start time /proc hides": (
        World(pid_running=True, pid_start=None),
        OwnerFacts(PID, LOCKED_AT, _details()),
        (ALIVE, Owner.RUNNING, Rule.PID),
    ),
    "no proof, owner dead, its group lives": (
        World(live_groups=frozenset({GROUP})),
        OwnerFacts(PID, LOCKED_AT, _details()),
        (ALIVE, Owner.WORK_RUNNING, Rule.GROUP),
    ),
    "no proof, owner and group dead, its session lives": (
        World(live_sessions=frozenset({SESSION})),
        OwnerFacts(PID, LOCKED_AT, _details()),
        (ALIVE, Owner.WORK_RUNNING, Rule.SESSION),
    ),
    "no proof, owner, group and session dead": (
        World(),
        OwnerFacts(PID, LOCKED_AT, _details()),
        (GONE, Owner.NOT_RUNNING, Rule.PID),
    ),
    "no proof, owner pid recycled": (
        World(pid_running=True, pid_start=LATER_START),
        OwnerFacts(PID, LOCKED_AT, _details()),
        (GONE, Owner.PID_REUSED, Rule.PID),
    ),
    "no proof, owner pid recycled, its group lives": (
        World(pid_running=True, pid_start=LATER_START, live_groups=frozenset({GROUP})),
        OwnerFacts(PID, LOCKED_AT, _details()),
        (ALIVE, Owner.WORK_RUNNING, Rule.GROUP),
    ),
    "no proof, no start recorded, a process began after the lock": (
        World(pid_running=True, started_after_lock=True),
        OwnerFacts(PID, LOCKED_AT, _details(start=None)),
        (GONE, Owner.PID_REUSED, Rule.PID),
    ),
    "no proof, no start recorded, the process began before the lock": (
        World(pid_running=True),
        OwnerFacts(PID, LOCKED_AT, _details(start=None)),
        (ALIVE, Owner.RUNNING, Rule.PID),
    ),
}


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_each_rule_of_the_one_owner_judgement(
    monkeypatch: pytest.MonkeyPatch, row: tuple[World, OwnerFacts, tuple[Verdict, Owner, Rule]]
) -> None:
    here, facts, answer = row
    assert tuple(_judged(monkeypatch, here, facts)) == answer


CALLER_ROWS = {
    "the caller holds the lock's proof of life": (
        World(),
        OwnerFacts(PID, proof_ours=True),
        (CALLER, Owner.RUNNING, Rule.OWN_PROOF),
    ),
    "details prove the caller (boot, namespace, start time)": (
        World(pid_running=True),
        OwnerFacts(PID, LOCKED_AT, _details()),
        (CALLER, Owner.RUNNING, Rule.SAME_PROCESS),
    ),
    "details of our place, no start recorded": (
        World(pid_running=True),
        OwnerFacts(PID, LOCKED_AT, _details(start=None)),
        (CALLER, Owner.RUNNING, Rule.SAME_PROCESS),
    ),
    "the caller's pid number, recycled since the lock": (
        World(pid_running=True, pid_start=LATER_START),
        OwnerFacts(PID, LOCKED_AT, _details()),
        (UNKNOWN, Owner.UNKNOWN, Rule.NOT_ASKED),
    ),
    "the caller's pid number in another PID namespace": (
        World(pid_running=True),
        OwnerFacts(PID, LOCKED_AT, _details(ns=OTHER_NS)),
        (UNKNOWN, Owner.UNKNOWN, Rule.NOT_ASKED),
    ),
    "the caller's pid number before a reboot": (
        World(pid_running=True),
        OwnerFacts(PID, LOCKED_AT, _details(boot=OTHER_BOOT)),
        (UNKNOWN, Owner.UNKNOWN, Rule.NOT_ASKED),
    ),
    "the caller's pid without details: cannot tell, not yours": (
        World(pid_running=True),
        OwnerFacts(PID, LOCKED_AT, None),
        (UNKNOWN, Owner.UNKNOWN, Rule.NOT_ASKED),
    ),
    "the caller's pid on another host": (
        World(pid_running=True),
        OwnerFacts(PID, LOCKED_AT, _details(), host="elsewhere"),
        (UNKNOWN, Owner.UNKNOWN, Rule.NOT_ASKED),
    ),
    "the caller's pid and host": (
        World(pid_running=True),
        OwnerFacts(PID, LOCKED_AT, _details(), host=HOST),
        (CALLER, Owner.RUNNING, Rule.SAME_PROCESS),
    ),
    "another pid's lock, even with our proof": (
        World(pid_running=True),
        OwnerFacts(PID + 1, LOCKED_AT, _details(), proof_ours=True),
        (UNKNOWN, Owner.UNKNOWN, Rule.NOT_ASKED),
    ),
}


@pytest.mark.parametrize("row", CALLER_ROWS.values(), ids=CALLER_ROWS.keys())
def test_each_rule_of_the_caller_answer(
    monkeypatch: pytest.MonkeyPatch, row: tuple[World, OwnerFacts, tuple[Verdict, Owner, Rule]]
) -> None:
    here, facts, answer = row
    assert tuple(_judged(monkeypatch, here, facts, (PID,), alive=False)) == answer
    assert here.asked == []  # "is it the caller?" never looks at the process table


def test_a_caller_that_is_not_the_owner_gets_the_owners_liveness(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recycled = World(pid_running=True, pid_start=LATER_START)
    facts = OwnerFacts(PID, LOCKED_AT, _details())
    assert tuple(_judged(monkeypatch, recycled, facts, (PID,))) == (
        GONE,
        Owner.PID_REUSED,
        Rule.PID,
    )


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_status_many_locks_judge_gives_the_one_judgements_answer(
    monkeypatch: pytest.MonkeyPatch, row: tuple[World, OwnerFacts, tuple[Verdict, Owner, Rule]]
) -> None:
    here, facts, (_verdict, owner, _rule) = row
    many = liveness.per_pid(_enter(monkeypatch, here))
    assert many(facts.pid, facts.timestamp, facts.details, facts.life) is owner


@pytest.mark.parametrize(
    ("row", "shown"),
    [
        ("proof held, owner runs", Owner.STOPPED),
        ("proof free, recorded group alive (CMD's work dropped the proof)", Owner.STOPPED),
        ("proof free, owner pid dead", Owner.NOT_RUNNING),
        ("no proof, another boot", Owner.UNKNOWN),
    ],
)
def test_status_shows_a_stopped_live_holder_as_stopped_and_judges_it_alive(
    monkeypatch: pytest.MonkeyPatch, row: str, shown: Owner
) -> None:
    """Issue 26 item 5: the word ``status`` shows; the verdict (what a reclaim acts on) is
    the one judgement's, untouched by the holder being stopped."""
    here, facts, answer = ROWS[row]
    stopped = World(**{**here.__dict__, "stopped": True, "asked": []})
    many = liveness.per_pid(_enter(monkeypatch, stopped))
    assert many(facts.pid, facts.timestamp, facts.details, facts.life) is shown
    assert tuple(_judged(monkeypatch, stopped, facts)) == answer
    assert VERDICT_OF[shown] is answer[0]


def test_every_rule_has_a_row() -> None:
    rows = [*ROWS.values(), *CALLER_ROWS.values()]
    assert {answer[2] for _, _, answer in rows} == set(Rule)


def test_the_owner_word_and_the_verdict_agree_with_what_lock_info_carries() -> None:
    for _, _, (verdict, owner, _rule) in ROWS.values():
        assert VERDICT_OF[owner] is verdict
