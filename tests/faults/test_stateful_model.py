"""A stateful model: several owners and a movable clock against a simple reference model.

Hypothesis drives acquire, release, forced release, check, inspect, hold + heartbeat refresh +
holder release, clean, foreign records and garbage written straight into ``.lock``, and clock
moves (forward past the 2-hour limit, back a little), with owners given to the new API as
``pid=`` and the legacy functions acting for this process. After every step the file on disk
must be exactly what the model predicts, so no lock is ever removed or replaced unless the
model says it was free to go (stale, corrupt, the caller's own, or forced); and check and
inspect must agree with the model.

The model's own rules (``judge``) restate the contract's: a record ``DIGITS:DIGITS[.DIGITS]``
with ``1 <= pid <= 4194304`` and ``0 < ts <= now + 86400`` is active while ``now - ts <= 7200``;
an empty file is being written for 2 s by mtime; undecodable bytes are unreadable.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mahabharatha import locks
from mahabharatha.backends.files.snapshot import format_record
from mahabharatha.commands import _utils
from tests.faults._kills import entry_at

FEATURE: Final = "model-feat"
OWNERS: Final = (101, 202, 303)
"""Owners of the new API (``pid=``); the legacy functions act for ``os.getpid()``."""

STALE_AFTER: Final = 7200.0
GRACE: Final = 2.0
MAX_PID: Final = 4_194_304
RECORD: Final = re.compile(rb"\s*([0-9]{1,10}):([0-9]+(?:\.[0-9]+)?)\s*")

GARBAGE: Final = [
    b"",
    b"garbage",
    b"12:",
    b"\xff\xfe\xfd",
    b"0:1700000000.0",
    b" 7 :1",
    b"+7:1700000000",
    b"7:1e9",
    b"4242:1700000000.0:extra",
    b"x" * 5000,
]
"""What old writers, crashes and people leave in ``.lock``: empty, corrupt, unreadable, huge."""


class Clock:
    """Stands in for ``_utils.time``: the lock code reads the time only as ``time.time()``."""

    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now


@dataclass(frozen=True)
class Lock:
    """The model of ``.lock``: its bytes, its inode (identity) and its mtime."""

    content: bytes
    inode: int
    mtime: float


def judge(lock: Lock | None, now: float) -> str:
    """The reference rules: the state the contract gives this lock at ``now``."""
    if lock is None:
        return "free"
    try:
        lock.content.decode("utf-8")
    except UnicodeDecodeError:
        return "unreadable"
    if not lock.content:
        return "writing" if abs(now - lock.mtime) < GRACE else "corrupt"
    record = parse(lock.content, now)
    if record is None:
        return "corrupt"
    return "stale" if now - record[1] > STALE_AFTER else "active"


def parse(content: bytes, now: float) -> tuple[int, float] | None:
    match = RECORD.fullmatch(content) if len(content) <= 4096 else None
    if match is None:
        return None
    pid, ts = int(match[1]), float(match[2])
    if not 1 <= pid <= MAX_PID or not 0 < ts <= now + 86400:
        return None
    return pid, ts


RECLAIMABLE: Final = frozenset({"stale", "corrupt", "unreadable"})


def same(a: Lock | None, b: Lock | None) -> bool:
    """The library's identity: same inode, same bytes (mtime aside). An inode reused with the
    very same bytes is the same pid and timestamp, so every judgement of it is the same."""
    return a is not None and b is not None and (a.inode, a.content) == (b.inode, b.content)


class LockMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="mahabharatha-model-"))
        self.gsd = self.root / "gsd"
        self.path = self.gsd / "specs" / FEATURE / ".lock"
        self.clock = Clock(time.time())
        self.saved_time = _utils.time
        _utils.time = self.clock  # type: ignore[assignment]
        self.lock: Lock | None = None
        self.holders: dict[int, tuple[locks.FeatureLock, Lock]] = {}

    def teardown(self) -> None:
        _utils.time = self.saved_time
        shutil.rmtree(self.root, ignore_errors=True)

    # ------------------------------------------------------------------ helpers

    @property
    def now(self) -> float:
        return self.clock.now

    @property
    def state(self) -> str:
        return judge(self.lock, self.now)

    def on_disk(self) -> Lock | None:
        entry = entry_at(self.path)
        if entry.content is None:
            return None
        assert entry.inode is not None
        return Lock(entry.content, entry.inode, os.stat(self.path).st_mtime)

    def published(self, pid: int) -> None:
        """The model after ``pid`` won: a record of this instant (its inode read from disk)."""
        lock = self.on_disk()
        assert lock is not None, "acquire said yes but there is no lock"
        assert lock.content == format_record(pid, self.now), lock
        self.lock = lock

    def may_take(self) -> bool:
        return self.state in ("free", *RECLAIMABLE)

    def removed_by_release(self, pid: int, force: bool) -> bool | None:
        """What a release by ``pid`` does: True removes, False finds nothing, None is refused."""
        state = self.state
        if state == "free":
            return False
        if state == "writing":
            return None
        assert self.lock is not None
        record = parse(self.lock.content, self.now) if state in ("active", "stale") else None
        if record is not None and record[0] != pid and not force:
            return None
        return True

    # ------------------------------------------------------------------ rules

    @rule(owner=st.sampled_from(OWNERS))
    def acquire(self, owner: int) -> None:
        expected = self.may_take()
        try:
            locks.acquire(FEATURE, self.gsd, pid=owner, timeout=0)
        except locks.LockHeldError:
            assert not expected, f"refused although the lock was {self.state}"
            return
        assert expected, f"acquired although the lock was {self.state}"
        self.published(owner)

    @rule()
    def legacy_acquire(self) -> None:
        expected = self.may_take()
        got = _utils.acquire_feature_lock(FEATURE, str(self.gsd))
        assert got is expected, f"acquire returned {got} over a {self.state} lock"
        if got:
            self.published(os.getpid())

    @rule(owner=st.sampled_from(OWNERS), force=st.booleans())
    def release(self, owner: int, force: bool) -> None:
        expected = self.removed_by_release(owner, force)
        try:
            removed = locks.release(FEATURE, self.gsd, pid=owner, force=force)
        except locks.NotOwnerError:
            assert expected is None, f"release refused a {self.state} lock"
            return
        assert removed is expected, f"release returned {removed} for a {self.state} lock"
        if removed:
            self.lock = None

    @rule()
    def legacy_release(self) -> None:
        expected = self.removed_by_release(os.getpid(), force=False)
        _utils.release_feature_lock(FEATURE, str(self.gsd))
        if expected:
            self.lock = None

    @rule(owner=st.sampled_from(OWNERS))
    def hold(self, owner: int) -> None:
        """A long-lived holder (its heartbeat driven by the ``refresh`` rule)."""
        expected = self.may_take()
        holder = locks.FeatureLock(FEATURE, self.gsd, pid=owner, heartbeat=None, timeout=0)
        try:
            holder.acquire()
        except locks.LockHeldError:
            assert not expected, f"hold refused although the lock was {self.state}"
            return
        assert expected, f"hold acquired although the lock was {self.state}"
        self.published(owner)
        assert self.lock is not None
        self.holders[owner] = (holder, self.lock)

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def refresh(self, data: st.DataObject) -> None:
        owner = data.draw(st.sampled_from(sorted(self.holders)))
        holder, mine = self.holders[owner]
        if not same(self.lock, mine):  # replaced, removed or rewritten: the holder lost it
            with pytest.raises(locks.LockLostError):
                holder.refresh()
            del self.holders[owner]
            return
        holder.refresh()
        lock = self.on_disk()
        assert lock is not None and lock.content == format_record(owner, self.now)
        self.lock = lock
        self.holders[owner] = (holder, lock)

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def holder_release(self, data: st.DataObject) -> None:
        owner = data.draw(st.sampled_from(sorted(self.holders)))
        holder, mine = self.holders.pop(owner)
        holder.release()
        if same(self.lock, mine):  # only the very lock it holds; anyone else's stays
            self.lock = None

    @rule()
    def clean(self) -> None:
        entries = locks.clean(self.gsd)
        expected = self.state in RECLAIMABLE
        assert [e.removed for e in entries if e.kind == "lock"] == ([True] if expected else [])
        if expected:
            self.lock = None

    @rule(content=st.sampled_from(GARBAGE))
    def write_garbage(self, content: bytes) -> None:
        """Someone writes straight into ``.lock`` (in place: the inode stays if it existed)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_bytes(content)
        self.lock = self.on_disk()

    @rule(age=st.sampled_from([0.0, 1.0, 1.9, 2.1, 3.0, -1.5, -2.5]))
    def old_writer_creates(self, age: float) -> None:
        """An old writer between its create and its write: an empty lock, "writing" while its
        mtime is within 2 s of now (either side), as seen on the model's clock."""
        self.write_garbage(b"")
        os.utime(self.path, (self.now - age, self.now - age))
        self.lock = self.on_disk()

    @rule(
        pid=st.sampled_from([555, os.getpid(), *OWNERS]),
        age=st.sampled_from([0, 60, 7199, 7200, 7201, 90000, -600]),
    )
    def foreign_record(self, pid: int, age: int) -> None:
        """A shell writer: ``echo "$$:$(date +%s)" > .lock`` (whole seconds, maybe skewed)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_bytes(f"{pid}:{int(self.now) - age}".encode())
        self.lock = self.on_disk()

    @rule(
        seconds=st.sampled_from([0.5, 1.5, 1.9, 2.1, 2.5, 60.0, 7199.0, 7200.0, 7200.001, 7201.0])
        | st.floats(min_value=0, max_value=10_000)
    )
    def advance(self, seconds: float) -> None:
        self.clock.now += seconds

    @rule(seconds=st.floats(min_value=0, max_value=120))
    def jump_back(self, seconds: float) -> None:
        self.clock.now -= seconds

    # ------------------------------------------------------------------ invariants

    @invariant()
    def disk_is_what_the_model_says(self) -> None:
        assert self.on_disk() == self.lock if self.lock else self.on_disk() is None, (
            f"on disk {self.on_disk()}, model {self.lock}"
        )

    @invariant()
    def check_and_inspect_agree_with_the_model(self) -> None:
        state = self.state
        checked = _utils.check_feature_lock(FEATURE, str(self.gsd))
        info = locks.inspect(FEATURE, self.gsd)
        expected_state = "free" if self.lock is None else state
        assert info.state == expected_state, (info, self.lock, self.now)
        if state != "active":
            assert checked is None, (checked, state)
            return
        assert self.lock is not None
        record = parse(self.lock.content, self.now)
        assert record is not None and checked is not None, (checked, self.lock)
        assert (checked["pid"], checked["timestamp"]) == record
        assert checked["age_seconds"] == max(0.0, self.now - record[1])
        assert info.pid == record[0] and info.expires_in_seconds is not None

    @invariant()
    def at_most_one_owner_holds(self) -> None:
        owners = {owner for owner, (_, mine) in self.holders.items() if same(mine, self.lock)}
        if self.state == "active" and self.lock is not None:
            record = parse(self.lock.content, self.now)
            assert record is not None
            owners.add(record[0])
        assert len(owners) <= 1, f"two holders: {owners}"


LockMachine.TestCase.settings = settings(
    max_examples=50,
    stateful_step_count=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

TestLocksAgreeWithAReferenceModelAcrossOwnersAndClockJumps = pytest.mark.timeout(120)(
    LockMachine.TestCase
)
