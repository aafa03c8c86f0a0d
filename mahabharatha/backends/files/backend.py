"""The folder backend (the default): each feature's lock is ``<gsd>/specs/<feature>/.lock``,
changed only through :mod:`~mahabharatha.backends.files.lockfile`'s protocol; here: owners,
``--reclaim-dead``, the audit trail, listings, clean-up, done markers and failed attempts."""

from __future__ import annotations

import errno
import math
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from functools import cache, partial
from pathlib import Path
from time import gmtime, monotonic, strftime
from typing import Final, TypeVar

from mahabharatha import clock, reads, waiting
from mahabharatha.backends.base import (
    AcquireResult,
    Attempts,
    CleanedEntry,
    FeatureProblem,
    Held,
    LockBackend,
    LockInfo,
    LockLostError,
    NotHeldError,
    NotOwnerError,
    Owner,
    ReleaseWait,
    Requester,
    UnsafeLockPathError,
    UnsupportedError,
    Verdict,
    format_duration,
)
from mahabharatha.backends.files import lockfile
from mahabharatha.backends.files.folder import (
    Guard,
    OpenFeatureDir,
    feature_dir_path,
    folder_path,
    scan_locks,
)
from mahabharatha.backends.files.lockfile import ReleaseOutcome, age_only
from mahabharatha.backends.files.release_watch import ReleaseWatch
from mahabharatha.backends.files.snapshot import (
    _SYMLINK_ERRNOS,
    LOCK_FILE_NAME,
    MISSING,
    EntryKind,
    LockBusyError,
    LockSnapshot,
    _is_busy,
    busy_error,
    format_record,
    judge_lock,
    raise_named,
    read_lock,
)
from mahabharatha.backends.liveness import Liveness, OwnerFacts, judge, owner_liveness, per_pid
from mahabharatha.constants import ATTEMPTS_RECORD_NAME as ATTEMPTS_RECORD_NAME  # its old home
from mahabharatha.constants import (
    AUDIT_LOG_NAME,
    COMPLETED_MARKER_NAME,
    DEFAULT_LEASE_BREAK_SECONDS,
    GSD_DIR,
    LEASE_BREAK_MARGIN_SECONDS,
    RELEASE_RETRY_FIRST_SECONDS,
    RELEASE_RETRY_MAX_SECONDS,
    STALE_AFTER_SECONDS,
)
from mahabharatha.names import feature_folders
from mahabharatha.owner import ownership, proof
from mahabharatha.states import State

KEPT_ATTEMPTS: Final = 5  # the latest attempts kept (the count goes on)
MAX_REASON_CHARS: Final = 200  # an exit code or one line of a message, never a whole log
MAX_ATTEMPTS_BYTES: Final = 3072  # oldest attempts dropped first: within bounded reads' 4 KiB
LEASE_BREAK_SETTING: Final = "/proc/sys/fs/lease-break-time"
_T = TypeVar("_T")
# None there, a link (O_NOFOLLOW) or a FIFO without a writer (O_NONBLOCK): no record of ours.
_NO_RECORD_ERRNOS: Final = frozenset({errno.ENOENT, errno.ENXIO, *_SYMLINK_ERRNOS})


# Members bound once: on Python 3.11 each ``Enum.X`` look-up is a descriptor call.
_ACTIVE: Final = State.ACTIVE
_UNKNOWN: Final = Owner.UNKNOWN


def _listed_info(
    feature: str,
    state: State,
    pid: int | None,
    timestamp: float | None,
    age: float | None,
    expires: float | None,
    owner: Owner,
) -> LockInfo:
    """``LockInfo(...)`` for members already, without the frozen dataclass's costly
    ``__init__`` (``bench/PROFILE.md``); ``tests/unit/test_status_listing.py`` compares them."""
    info = object.__new__(LockInfo)
    fields = {  # every field; a default changed in LockInfo fails the test named above
        "feature": feature,
        "state": state,
        "pid": pid,
        "timestamp": timestamp,
        "age_seconds": age,
        "expires_in_seconds": expires,
        "owner": owner,
        "host": None,
        "token": None,
        "attempts": 0,
        "reason": None,
    }
    object.__setattr__(info, "__dict__", fields)
    return info


def describe_snapshot(
    feature: str,
    snapshot: LockSnapshot,
    state: State,
    now: float,
    liveness: Liveness | None = owner_liveness,
) -> LockInfo:
    """A lock as :class:`LockInfo` says it (``liveness`` None: owner ``unknown``, unasked)."""
    record = snapshot.record_at(now)
    if record is None:
        age = None if snapshot.kind is EntryKind.MISSING else max(0.0, now - snapshot.mtime)
        return _listed_info(feature, state, None, None, age, None, _UNKNOWN)
    pid, timestamp = record
    held_for = now - timestamp
    expires = max(0.0, STALE_AFTER_SECONDS - held_for) if state is _ACTIVE else None
    owner = (
        liveness(pid, timestamp, snapshot.owner_details, snapshot.life) if liveness else _UNKNOWN
    )
    return _listed_info(feature, state, pid, timestamp, max(0.0, held_for), expires, owner)


class _Problems:
    """The features a call skipped: the caller's list, or its own (the first raised at the end)."""

    def __init__(self, gsd_dir: str | os.PathLike[str], sink: list[FeatureProblem] | None) -> None:
        self.gsd_dir = gsd_dir
        self.raise_first = sink is None
        self.found: list[FeatureProblem] = [] if sink is None else sink

    def add(self, feature: str, error: OSError) -> None:
        path = error.filename or feature_dir_path(self.gsd_dir, feature)
        self.found.append(FeatureProblem(feature, str(path), error))

    def settle(self) -> None:
        if self.raise_first and self.found:
            raise self.found[0].error


def _audit(
    gsd_dir: str | os.PathLike[str],
    action: str,
    feature: str,
    old: LockSnapshot,
    reason: str,
    new_owner: int | None = None,
) -> None:
    """Append one JSON line about the lock ``old`` that ``action`` removed (never an error)."""
    entry = {
        "time": clock.now(),
        "feature": feature,
        "action": action,
        "by_pid": os.getpid(),
        "old_record": None if old.content is None else old.content[:200].decode("utf-8", "replace"),
        "new_owner": new_owner,
        "reason": reason,
    }
    import json  # only a reclaim, forced release or clean writes a line: not every cold start

    line = (json.dumps(entry, sort_keys=True) + "\n").encode()
    # O_NONBLOCK: a FIFO put at the log's path must not hang the open (no reader: ENXIO).
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    with suppress(OSError):
        fd = os.open(Path(gsd_dir) / AUDIT_LOG_NAME, flags, 0o644)
        try:
            # A log of its own: no FIFO or device, no hard link to a file elsewhere
            # (``ln outside.txt <gsd>/lock-audit.jsonl`` would make us append to outside.txt).
            info = os.fstat(fd)
            if stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
                # O_APPEND: concurrent writers' lines never interleave (one small write each).
                os.write(fd, line)
        finally:
            os.close(fd)


def _dead_owner_rule(snapshot: LockSnapshot, state: State) -> bool:
    """``--reclaim-dead``: also reclaim an active lock whose owner is provably gone here."""
    if age_only(snapshot, state):
        return True
    record = snapshot.record
    if state is not State.ACTIVE or record is None:
        return False
    facts = OwnerFacts(*record, snapshot.owner_details, snapshot.life)
    return judge(facts).verdict is Verdict.GONE


def _reclaim_reason(state: State | None) -> str:
    if state is State.ACTIVE:
        return "owner-dead"
    return state.value if state else "unknown"


def _directory_in_the_way(gsd_dir: str | os.PathLike[str], feature: str) -> UnsafeLockPathError:
    path = feature_dir_path(gsd_dir, feature) / LOCK_FILE_NAME
    return UnsafeLockPathError(
        errno.EISDIR, f"{path}: a directory is in the way, not a lock file", str(path)
    )


def _marker_present(dfd: int, odd: Path | None = None) -> bool:
    """Is there a done marker (a regular file, not followed if a link) in the folder? ``odd``:
    its path, where anything else there (neither done nor free) is an error."""
    try:
        info = os.stat(COMPLETED_MARKER_NAME, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if odd is not None and not stat.S_ISREG(info.st_mode):
        raise UnsafeLockPathError(
            errno.EEXIST,
            f"{odd}: something other than a done marker (a regular file) is in the way",
            str(odd),
        )
    return stat.S_ISREG(info.st_mode)


# What a done marker or a failed attempt writes: the answer to give, and the file's text.
_Make = Callable[[int, float], tuple[_T, str]]


def _publish_holding(
    dfd: int, feature: str, pid: int, what: str, name: str, make: _Make[_T]
) -> tuple[_T, LockSnapshot]:
    """Publish ``make``'s file ``name`` while ``pid`` holds the lock: its answer, and the lock."""
    now = clock.now()
    with Guard(dfd, wait=True):
        # Race: under the guard no reclaim, clean or release can remove the lock, so the
        # file is written only while the caller really holds it.
        mine = _own_lock(dfd, feature, pid, now, what)
        answer, text = make(dfd, now)
        lockfile.publish_file(dfd, name, text)
    return answer, mine


def _done_stamp(_dfd: int, now: float) -> tuple[str, str]:
    stamp = _iso_time(now)
    return stamp, stamp + "\n"


def _own_lock(dfd: int, feature: str, pid: int, now: float, what: str) -> LockSnapshot:
    """The lock ``pid`` holds; :class:`NotHeldError` / :class:`NotOwnerError` (nothing
    ``what``) when it does not. Another PID namespace's holder of the same pid is not it."""
    mine = read_lock(dfd)
    if _is_busy(mine):
        raise busy_error(mine)  # Race: another's kernel lease hides whose it is: wait, never judge
    if not lockfile.owned_by(mine, pid, now):
        state = judge_lock(mine, now)
        if mine.record_at(now) is None or state is State.FREE:
            raise NotHeldError(feature, pid, what)
        raise NotOwnerError(describe_snapshot(feature, mine, state, now))
    return mine


def _iso_time(epoch: float) -> str:
    # time.strftime, not datetime: the CLI's cold start pays for every module it imports.
    return strftime("%Y-%m-%dT%H:%M:%SZ", gmtime(int(epoch)))


def _read_attempts(dfd: int) -> Attempts | None:
    """The folder's attempts record; ``None`` when there is none or it is not ours (a link,
    not a regular file, too big, not our JSON): the next ``fail`` replaces it."""
    import json  # only a pool with failures reads one: not every cold start

    try:
        data = reads.read_small_file(ATTEMPTS_RECORD_NAME, dfd)
    except OSError as error:
        if error.errno in _NO_RECORD_ERRNOS:
            return None
        raise_named(error, ATTEMPTS_RECORD_NAME)
    try:
        found = json.loads(data or b"")
        count, limit, history = int(found["count"]), int(found["limit"]), found["attempts"]
    except (ValueError, KeyError, TypeError, OverflowError):  # OverflowError: int(Infinity)
        return None
    if count < 1 or limit < 1 or not isinstance(history, list):
        return None
    return Attempts(count, limit, tuple(h for h in history if isinstance(h, dict)))


def _next_attempts(pid: int, reason: str, limit: int, dfd: int, now: float) -> tuple[Attempts, str]:
    """The record with ``pid``'s failed attempt added, and its JSON (oldest dropped to fit)."""
    import json

    previous = _read_attempts(dfd)
    attempt = {
        "time": _iso_time(now),
        "at": now,  # the epoch seconds a --retry-delay rest is counted from
        "host": ownership.host_name(),
        "pid": pid,
        "reason": reason[:MAX_REASON_CHARS],
    }
    count = 1 if previous is None else previous.tries + 1
    history = [*(() if previous is None else previous.history), attempt][-KEPT_ATTEMPTS:]
    record = Attempts(count, limit, tuple(history))
    while True:
        text = json.dumps({"count": count, "limit": limit, "attempts": history}, sort_keys=True)
        if len(text.encode()) <= MAX_ATTEMPTS_BYTES or len(history) <= 1:
            return record, text + "\n"
        history.pop(0)


class FileBackend(LockBackend):
    """The :class:`LockBackend` of one gsd folder."""

    kind = "file"
    local_calls = True

    def __init__(self, gsd_dir: str | os.PathLike[str] = GSD_DIR) -> None:
        self.gsd_dir = gsd_dir

    def __repr__(self) -> str:
        return f"FileBackend({os.fspath(self.gsd_dir)!r})"

    def where(self) -> str:
        return os.fspath(self.gsd_dir)

    def try_acquire(
        self,
        feature: str,
        requester: Requester,
        *,
        reclaim_dead: bool = False,
        lease: float | None = None,
    ) -> AcquireResult:
        if lease is not None:
            raise UnsupportedError(
                "the file backend has a fixed lease of 2 hours; a lease cannot be chosen"
            )
        now = clock.now()
        rule = _dead_owner_rule if reclaim_dead else age_only
        with OpenFeatureDir(self.gsd_dir, feature, create=True) as dfd:
            assert dfd is not None
            # A lock taken for another pid (the CLI's caller) carries no proof: it would die
            # with us. Ours does: a descriptor of the folder holds it while we hold the lock.
            wanted = requester.pid == os.getpid()
            with proof.Pledge(dfd, wanted, folder_path(self.gsd_dir, feature)) as pledge:
                outcome = lockfile.publish_or_reclaim(
                    dfd, requester.pid, now, rule, requester.details, pledge, look_first=True
                )
            mine_already = outcome.mine is None and proof.kept_slot(dfd) is not None
        if outcome.mine is None:
            holder = describe_snapshot(feature, outcome.holder, outcome.state, now, None)
            # Ours by this process's proof of life? (The lock layer judges the details: it
            # knows every pid that counts as the caller.)
            facts = OwnerFacts(holder.pid, proof_ours=mine_already)
            caller = judge(facts, (requester.pid,), alive=False).verdict is Verdict.CALLER
            return AcquireResult(
                None, holder, holder_details=outcome.holder.owner_details, holder_is_caller=caller
            )
        reason = None
        replaced = None
        if outcome.replaced is not None:
            reason = _reclaim_reason(outcome.replaced_state)
            state = outcome.replaced_state or State.CORRUPT
            replaced = describe_snapshot(feature, outcome.replaced, state, now, None)
            _audit(self.gsd_dir, "reclaim", feature, outcome.replaced, reason, requester.pid)
        held = Held(feature, requester.pid, now, now + STALE_AFTER_SECONDS, None, outcome.mine)
        return AcquireResult(held, None, replaced, reason)

    def refresh(self, held: Held) -> Held:
        return self._rewrite(held, None)

    def record_work_group(self, held: Held, pgid: int, leader_start: int | None) -> Held:
        details = ownership.with_work_group(held.handle.owner, pgid, leader_start)
        return self._rewrite(held, details)

    def _rewrite(self, held: Held, owner: bytes | None) -> Held:
        """A refresh; ``owner``: new owner details (``None``: the lock's own, carried on)."""
        now = clock.now()
        record = format_record(held.pid, now)
        with OpenFeatureDir(self.gsd_dir, held.feature, create=False) as dfd:
            if dfd is None:
                raise LockLostError(held.feature)
            fresh = lockfile.replace_if_unchanged(dfd, held.handle, record, owner)
            if fresh is None:
                # Not ours any more: our proof must not keep theirs alive.
                proof.forget(dfd, folder_path(self.gsd_dir, held.feature))
                raise LockLostError(held.feature)
        return Held(held.feature, held.pid, now, now + STALE_AFTER_SECONDS, None, fresh)

    def release_held(self, held: Held, wait: ReleaseWait | None = None) -> bool:
        with OpenFeatureDir(self.gsd_dir, held.feature, create=False) as dfd:
            if dfd is None:
                return False
            released = _PastLeases(wait)(partial(lockfile.release_mine, dfd, held.handle))
            proof.forget(dfd, folder_path(self.gsd_dir, held.feature))
            return released

    def work_proof(self, held: Held) -> proof.WorkProof | None:
        with OpenFeatureDir(self.gsd_dir, held.feature, create=False) as dfd:
            return None if dfd is None else proof.WorkProof.made(dfd)

    def release(self, feature: str, pid: int, *, force: bool = False) -> bool:
        with OpenFeatureDir(self.gsd_dir, feature, create=False, refuse=True) as dfd:
            if dfd is None:
                return False
            now = clock.now()
            outcome, snapshot = lockfile.release_at(dfd, pid, now, force=force)
            if pid == os.getpid():
                proof.forget(dfd, folder_path(self.gsd_dir, feature))
        if outcome is ReleaseOutcome.NOTHING:
            return False
        if outcome is ReleaseOutcome.RELEASED:
            if not lockfile.owned_by(snapshot, pid, now):
                action = "forced-release" if snapshot.record_at(now) else "release-cleanup"
                _audit(self.gsd_dir, action, feature, snapshot, judge_lock(snapshot, now).value)
            return True
        if snapshot.kind is EntryKind.DIRECTORY:
            raise _directory_in_the_way(self.gsd_dir, feature)
        raise NotOwnerError(describe_snapshot(feature, snapshot, judge_lock(snapshot, now), now))

    def inspect(self, feature: str) -> LockInfo:
        """``UnsafeLockPathError`` where acquire would fail too (something in the way)."""
        with OpenFeatureDir(self.gsd_dir, feature, create=False, refuse=True) as dfd:
            snapshot = MISSING if dfd is None else read_lock(dfd, life=True)
        if snapshot.kind is EntryKind.DIRECTORY:
            raise _directory_in_the_way(self.gsd_dir, feature)
        now = clock.now()
        return describe_snapshot(feature, snapshot, judge_lock(snapshot, now), now)

    def feature_names(self) -> list[str]:
        return feature_folders(self.gsd_dir)

    def status(self, *, problems: list[FeatureProblem] | None = None) -> list[LockInfo]:
        now = clock.now()
        liveness = per_pid()
        skipped = _Problems(self.gsd_dir, problems)
        missing = EntryKind.MISSING  # bound once: an Enum look-up per lock costs (3.11)
        infos = [
            describe_snapshot(feature, snapshot, judge_lock(snapshot, now), now, liveness)
            for feature, snapshot in scan_locks(self.gsd_dir, on_error=skipped.add)
            if snapshot.kind is not missing
        ]
        skipped.settle()
        return infos

    def _unlocked_info(self, feature: str) -> LockInfo:
        marker = feature_dir_path(self.gsd_dir, feature) / COMPLETED_MARKER_NAME
        with OpenFeatureDir(self.gsd_dir, feature, create=False) as dfd:
            done = dfd is not None and _marker_present(dfd, marker)
        record = self.attempts(feature)
        state = State.DONE if done else State.FAILED if record and record.failed else State.FREE
        return LockInfo(feature, state, None, None, None, None, Owner.UNKNOWN).with_attempts(record)

    def survey(self, *, problems: list[FeatureProblem] | None = None) -> list[LockInfo]:
        skipped = _Problems(self.gsd_dir, problems)
        locked = {info.feature: info for info in self.status(problems=skipped.found)}
        unseen = set(self.feature_names()) - set(locked) - {p.feature for p in skipped.found}
        infos = []
        for name in sorted([*locked, *unseen]):
            info = locked.get(name)
            try:
                info = (
                    info.with_attempts(self.attempts(name)) if info else self._unlocked_info(name)
                )
            except OSError as error:
                skipped.add(name, error)
            if info is not None:
                infos.append(info)
        skipped.settle()
        return infos

    def release_watch(self, features: Iterable[str]) -> ReleaseWatch:
        return ReleaseWatch(self.gsd_dir, features)

    def is_done(self, feature: str) -> bool:
        return bool(self._look(feature, COMPLETED_MARKER_NAME, _marker_present))

    def _look(self, feature: str, name: str, read: Callable[[int], _T]) -> _T | None:
        """``read`` of the opened folder; None without it, or when its file ``name`` is surely
        absent: one ``lstat`` by path, cheaper than the careful look ``read`` makes."""
        try:
            os.lstat(f"{folder_path(self.gsd_dir, feature)}/{name}")
        except FileNotFoundError:
            return None
        except OSError:
            pass  # the careful look says what is wrong
        with OpenFeatureDir(self.gsd_dir, feature, create=False) as dfd:
            return None if dfd is None else read(dfd)

    def mark_done_here(self, feature: str, stamp: str) -> bool:
        with OpenFeatureDir(self.gsd_dir, feature, create=False) as dfd:
            if dfd is None:
                return False
            # Race: clean sweeps a marker's temp by age alone, under the guard: a writer
            # descheduled between write and rename without it lost its temp, and the marker.
            with Guard(dfd, wait=True):
                lockfile.publish_file(dfd, COMPLETED_MARKER_NAME, stamp + "\n")
        return True

    def done(self, feature: str, pid: int, wait: ReleaseWait | None = None) -> str:
        return self._finish(feature, pid, "marked done", COMPLETED_MARKER_NAME, _done_stamp, wait)

    def mark_done_holding(self, held: Held, wait: ReleaseWait | None = None) -> str:
        feature, pid = held.feature, held.pid
        marker = COMPLETED_MARKER_NAME
        return self._finish(feature, pid, "marked done", marker, _done_stamp, wait, release=False)

    def _finish(
        self,
        feature: str,
        pid: int,
        what: str,
        name: str,
        make: _Make[_T],
        wait: ReleaseWait | None,
        release: bool = True,
    ) -> _T:
        """Publish ``name`` while ``pid`` holds the lock, then (``release``) release it."""
        past = _PastLeases(wait)
        with OpenFeatureDir(self.gsd_dir, feature, create=False, refuse=True) as dfd:
            if dfd is None:
                raise NotHeldError(feature, pid, what)
            # Race: the file first, the release second. A claimer that wins the lock after our
            # release is sure to see the done marker (a finished feature is never built again)
            # or the failed attempt (a feature at its limit is not handed out).
            answer, mine = past(partial(_publish_holding, dfd, feature, pid, what, name, make))
            if release:
                past(partial(lockfile.release_mine, dfd, mine))
                if pid == os.getpid():  # the released lock's proof goes with it
                    proof.forget(dfd, folder_path(self.gsd_dir, feature))
        return answer

    def reopen(self, feature: str) -> bool:
        with OpenFeatureDir(self.gsd_dir, feature, create=False, refuse=True) as dfd:
            if dfd is None:
                return False
            removed = False
            for name in (COMPLETED_MARKER_NAME, ATTEMPTS_RECORD_NAME):
                with suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=dfd)  # the entry itself, never a target
                    removed = True
        return removed

    def attempts(self, feature: str) -> Attempts | None:
        return self._look(feature, ATTEMPTS_RECORD_NAME, _read_attempts)

    def fail(
        self, feature: str, pid: int, reason: str, limit: int, wait: ReleaseWait | None = None
    ) -> Attempts:
        make = partial(_next_attempts, pid, reason, limit)
        return self._finish(feature, pid, "recorded as failed", ATTEMPTS_RECORD_NAME, make, wait)

    def clean(
        self,
        *,
        dry_run: bool = False,
        reclaim_dead: bool = False,
        problems: list[FeatureProblem] | None = None,
        features: Iterable[str] | None = None,
    ) -> list[CleanedEntry]:
        """Each removal re-checks, under the folder's guard, that the entry is the one judged."""
        rule = _dead_owner_rule if reclaim_dead else age_only
        cleaned: list[CleanedEntry] = []
        skipped = _Problems(self.gsd_dir, problems)
        for feature in features if features is not None else self.feature_names():
            try:
                with OpenFeatureDir(self.gsd_dir, feature, create=False) as dfd:
                    if dfd is not None:
                        self._clean_folder(feature, dfd, rule, dry_run, cleaned, skipped)
            except OSError as error:
                skipped.add(feature, error)
        skipped.settle()
        return cleaned

    def _clean_folder(
        self,
        feature: str,
        dfd: int,
        rule: lockfile.MayReclaim,
        dry_run: bool,
        found: list[CleanedEntry],
        skipped: _Problems,
    ) -> None:
        """Clean one folder, adding to ``found`` as it goes (a later error loses nothing)."""
        folder = feature_dir_path(self.gsd_dir, feature)
        now = clock.now()
        life = rule is not age_only
        snapshot = read_lock(dfd, life=life)
        state = judge_lock(snapshot, now)
        if rule(snapshot, state):
            removed = not dry_run and lockfile.remove_judged(
                dfd, snapshot, lambda entry: rule(entry, judge_lock(entry, now)), life=life
            )
            lock_path = str(folder / LOCK_FILE_NAME)
            found.append(CleanedEntry(feature, lock_path, "lock", state.value, removed))
            if removed:
                _audit(self.gsd_dir, "clean", feature, snapshot, _reclaim_reason(state))
        for temp in lockfile.orphan_temps(dfd, now, files=True):
            path = str(folder / temp[0])
            try:
                removed = not dry_run and lockfile.remove_orphan_temp(dfd, temp, now)
            except OSError as error:
                skipped.add(feature, type(error)(error.errno, error.strerror, path))
                continue
            found.append(CleanedEntry(feature, path, "temp", "orphan", removed))


@cache
def lease_break_seconds() -> float:
    """How long the kernel lets a lease holder keep a file from others (read once)."""
    try:
        with open(LEASE_BREAK_SETTING, "rb") as setting:
            return max(0.0, float(int(setting.read(32))))
    except (OSError, ValueError):
        return DEFAULT_LEASE_BREAK_SECONDS


class _PastLeases:
    """Runs each step, again while another's kernel lease (Samba, a backup tool) refuses the lock's
    read: ``wait`` (none: raise at once) waits out lease-break-time once for all the steps."""

    def __init__(self, wait: ReleaseWait | None) -> None:
        self.wait, self.deadline, self.bound = wait, 0.0, 0.0
        self.pauses: Iterator[float] | None = None  # made at the first refusal: none, mostly

    def __call__(self, step: Callable[[], _T]) -> _T:
        while True:
            try:
                return step()
            except LockBusyError as busy:
                wait, now = self.wait, monotonic()
                if wait is None:
                    raise
                if self.pauses is None:
                    self.bound = lease_break_seconds() + LEASE_BREAK_MARGIN_SECONDS
                    self.deadline = now + self.bound
                    first, most = RELEASE_RETRY_FIRST_SECONDS, RELEASE_RETRY_MAX_SECONDS
                    self.pauses = waiting.backoff(first, most, math.inf)
                    if wait.announce is not None:
                        wait.announce(self.bound)
                if now >= self.deadline:
                    # A bare name (the step ran in its folder) is named by the folder's
                    # ``named_error``, which puts the full path first: never name it twice.
                    where = f"{busy.filename}: " if os.sep in str(busy.filename) else ""
                    waited = format_duration(self.bound)
                    raise LockBusyError(
                        busy.errno,
                        f"{where}still under another process's kernel lease after {waited}; "
                        "the lock stays until it is stale, or until --reclaim-dead takes it",
                        busy.filename,
                    ) from None
                wait.pause(min(next(self.pauses), self.deadline - now))
