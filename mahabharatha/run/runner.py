"""Hold a feature lock while a command (CMD) runs: ``mahabharatha lock run``; signals are relayed
to CMD's group from before the lock is taken. The long form, each signal's fate at every moment:
``design/lockfile-hardening.md`` section 6."""

from __future__ import annotations

import enum
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, nullcontext, suppress
from time import monotonic
from types import FrameType
from typing import IO, Any, Final, Self

from mahabharatha import signals, waiting
from mahabharatha.backends.base import ReleaseWait
from mahabharatha.constants import (
    GRACE_ENV,
    LOST_KILL_GRACE_SECONDS,
    WORK_GRACE_SECONDS,
    WORK_KILL_WAIT_SECONDS,
    WORK_POLL_SECONDS,
)
from mahabharatha.exits import killed_by, shell_status
from mahabharatha.locks import FeatureLock, LockError, LockInfo, LockLostError
from mahabharatha.owner import ownership
from mahabharatha.owner.proof import WorkProof
from mahabharatha.run import spawn
from mahabharatha.run.spawn import CommandNotExecutableError as CommandNotExecutableError
from mahabharatha.run.spawn import CommandNotFoundError as CommandNotFoundError
from mahabharatha.run.spawn import CommandStartError as CommandStartError

SI_KERNEL: Final = 0x80  # si_code of a signal the kernel sent: a terminal's Ctrl-C
# Can we learn who sent a signal (not on macOS)?
_READ_SENDERS: Final = hasattr(signal, "sigwaitinfo") and hasattr(signal, "pthread_sigmask")


class OnLost(enum.StrEnum):
    """What ``lock run`` does to CMD when its lock is lost while CMD runs."""

    TERMINATE = "terminate"  # SIGTERM, then SIGKILL after the grace; exit 76
    WARN = "warn"  # keep CMD running, warn; exit with CMD's code


class Interrupted(Exception):
    """A signal arrived before the command started; nothing was run."""

    def __init__(self, signum: int) -> None:
        self.signum, self.exit_code = signum, killed_by(signum)  # exit_code: as a shell says
        super().__init__(f"interrupted by {signal.Signals(signum).name} before the command ran")


class ReleaseInterrupted(Exception):
    """A signal ended the wait for a kernel lease on the lock file (``server``: for the lock
    server, restarting or full): the lock was left behind."""

    def __init__(self, signum: int, feature: str, status: int | None, server: bool = False) -> None:
        self.signum, self.exit_code = signum, killed_by(signum)  # exit_code: as a shell says
        self.feature = feature
        self.status = status  # the command's exit status, when it ran
        awaited = f"a kernel lease on the lock of {feature!r} to be broken"
        if server:
            awaited = f"the lock server to take the end of {feature!r}"
        super().__init__(
            f"interrupted by {signal.Signals(signum).name} while waiting for {awaited}: the "
            "lock stays until it is stale, or until --reclaim-dead takes it"
        )


class WorkLeftError(LockError):
    """CMD has ended but work it started outside its group holds its proof: the lock stays held.
    ``status``: CMD's code; ``still_running()``: True while that work runs (always, unpickled)."""

    def __init__(
        self, feature: str, status: int, still_running: Callable[[], bool] = lambda: True
    ) -> None:
        super().__init__(
            f"the command's work left its process group and still runs; lock {feature!r} "
            "stays held (its owner judged alive) until that work ends"
        )
        self.feature, self.status, self.still_running = feature, status, still_running
        self.made_with = (feature, status)

    def __reduce__(self) -> tuple[Any, ...]:
        # The watch on this process's descriptors cannot travel: the copy gets the default.
        made, facts, state = super().__reduce__()
        return made, facts, {k: v for k, v in state.items() if k != "still_running"}


class _Phase(enum.Enum):
    PREPARING = "preparing"  # waiting for the lock, or starting the command (pid not yet known)
    RUNNING = "running"
    RELEASING = "releasing"  # the command is over: a signal ends a wait for the release


# Signals a stopped process needs no SIGCONT for (SIGKILL ends it stopped).
_NEEDS_NO_CONT: Final = frozenset({signal.SIGKILL, signal.SIGCONT, signal.SIGSTOP, 0})


class _Child:
    """The running command, signalled through a pidfd; with ``own_group``, its whole group."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        own_group: bool,
        work: WorkProof | None,
        older: set[int] | None = None,
    ) -> None:
        self.popen, self.own_group, self.work = popen, own_group, work
        self.older = older  # adopting CMD's orphans: our descendants from before CMD, not its
        self.start = ownership.start_time(popen.pid) if own_group else None
        self._pidfd: int | None = None
        with suppress(AttributeError, OSError):  # no pidfd (old kernel, not Linux): by pid
            # Race: a reused pid: only our wait() reaps CMD, and it has not run yet.
            self._pidfd = os.pidfd_open(popen.pid)

    def send(self, signum: int) -> None:
        """Signal CMD's group (as a terminal's job: CMD and its work still in our group), then
        SIGCONT, since a stopped process keeps a signal pending until continued."""
        follow = (signum,) if signum in _NEEDS_NO_CONT else (signum, signal.SIGCONT)
        for each in follow:
            if not self.own_group:
                self._send_to_command(each)
                _signal_our_work(each, but=self.popen.pid)
            # Race: a reused group number: CMD is not reaped (its pidfd said so), so it is CMD's.
            elif self._send_to_command(0):
                with suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, each)

    def _send_to_command(self, signum: int) -> bool:
        """Signal CMD itself (0: only ask); False once it has exited."""
        if self._pidfd is None:
            if self.popen.poll() is not None:
                return False
            self.popen.send_signal(signum)
            return True
        try:
            signal.pidfd_send_signal(self._pidfd, signum)
        except ProcessLookupError:  # it exited (maybe not yet reaped)
            return False
        return True

    def group_lives(self) -> bool:
        """After CMD was reaped: is anything left of its group (or of its work in ours)?"""
        if not self.own_group:
            return bool(_our_work())
        return ownership.group_has_live_member(self.popen.pid, self.start)

    def kill_group(self) -> None:
        """After CMD was reaped: SIGKILL what is left of its group."""
        if not self.own_group:
            _signal_our_work(signal.SIGKILL)
        # Race: the group ended and its number went to a new leader: never signal that one.
        elif self.group_lives():
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGKILL)

    def close(self) -> None:
        # Race: a signal handler run between the two steps must never see a closed pidfd.
        pidfd, self._pidfd = self._pidfd, None
        if pidfd is not None:
            os.close(pidfd)

    def left_running(self) -> bool:
        """After CMD was reaped: does work it left hold its proof, or live in its group?"""
        work = self.work
        # Race: work that dropped the proof but stays in CMD's group (closed descriptors):
        # a free proof alone would let a second holder in beside it.
        if (work is not None and work.running()) or self.group_lives():
            return True
        # Race: work that dropped the proof and left CMD's group (a Python child of GNU
        # `timeout`, a job of `set -m`): orphaned, it is still our descendant.
        return self.older is not None and bool(_descendants() - self.older)

    def outlast(self, relay: _Relay) -> bool:
        """Wait (a grace, then SIGKILL to CMD's group) until nothing holds the work's proof
        and the group is empty; True when something still runs after that."""
        if not self.left_running():
            return False
        grace = waiting.Deadline(work_grace_seconds())
        # A signal (Ctrl-C, kill) during the grace cuts it short: the user wants out now.
        while self.left_running() and not grace.passed():
            if relay.signalled_within(WORK_POLL_SECONDS) is not None:
                break
        if not self.left_running():
            return False
        self.kill_group()
        killed = waiting.Deadline(WORK_KILL_WAIT_SECONDS)
        while self.left_running() and not killed.passed():
            # Not the relay's wait: a signal of the grace stays pending there (a spin).
            time.sleep(WORK_POLL_SECONDS)
        return self.left_running()

    def still_running(self) -> bool:
        """:meth:`left_running` for :class:`WorkLeftError`; the proof's watch closes at no."""
        if self.left_running():
            return True
        if self.work is not None:
            self.work.close()
            self.work = None
        return False


class _Relay:
    """What a signal does to CMD in each phase, and what a lost lock does (in a thread of its
    own: the grace holds up no one)."""

    def __init__(self, policy: OnLost, notify: Callable[[LockLostError], None] | None) -> None:
        self.phase = _Phase.PREPARING
        self.child: _Child | None = None
        self.pending: int | None = None
        self.received: int | None = None  # the first signal that came once CMD was started
        # Freed with ``pending``: ends a wait at once. Race: not an Event, whose ``set`` in the
        # handler, run while the main thread held its inner lock (in ``wait``), hung for ever.
        self.woken = threading.Lock()
        self.woken.acquire()
        # Reentrant: the Python handler may run in the main thread while it holds this lock.
        self._mutex = threading.RLock()
        self.policy, self.notify = policy, notify or (lambda _error: None)
        self._lost: LockLostError | None = None
        self._ended = threading.Event()
        self._acting: threading.Thread | None = None

    def __call__(self, signum: int, _frame: FrameType | None) -> None:
        """The Python handler: it does not know who sent the signal."""
        self.deliver(signum, from_kernel=None)

    def deliver(self, signum: int, *, from_kernel: bool | None) -> None:
        """Act on a signal; ``from_kernel``: sent by the kernel (None: not known)."""
        with self._mutex:
            if self.phase is not _Phase.PREPARING and self.received is None:
                self.received = signum  # lock work stops on it, whatever CMD made of it
            child = self.child  # set with RUNNING, under this mutex
            if self.phase is _Phase.RUNNING and child is not None:
                if not _child_got_it_too(signum, from_kernel, child.popen.pid):
                    child.send(signum)
            else:
                # Race: a signal before the child exists; acted on at the next safe point.
                self.pending = signum
                with suppress(RuntimeError):  # freed already by an earlier signal
                    self.woken.release()

    def raise_if_pending(self) -> None:
        self._take_own()
        if self.pending is not None:
            raise Interrupted(self.pending)

    def _take_own(self) -> None:
        if _READ_SENDERS:
            # Blocked signals meant for this thread (raise(), a pthread_kill) wait here.
            while (info := signal.sigtimedwait(signals.FORWARDED, 0)) is not None:
                self.deliver(info.si_signo, from_kernel=info.si_code == SI_KERNEL)

    def releasing(self) -> None:
        """The command is over: from now on a signal (a new one) ends the release's wait."""
        with self._mutex:
            if self.phase is _Phase.RELEASING:
                return  # Race: a signal since CMD's end (its leftovers' grace) still counts
            self.phase, self.pending = _Phase.RELEASING, None
            self.woken.acquire(blocking=False)

    def signalled_within(self, seconds: float) -> int | None:
        """Wait up to ``seconds`` for a signal; the one that came, if any."""
        if self.pending is None:
            self.woken.acquire(timeout=max(0.0, seconds))
        self._take_own()
        return self.pending

    def started(self, child: _Child) -> None:
        with self._mutex:
            self.child, self.phase = child, _Phase.RUNNING
            if self.pending is not None:
                self.received = self.pending
                child.send(self.pending)  # it did not exist when the signal came: send it now
            error = self._lost
            if error is None or self._act_on(child, error):
                return
        self._act_without_thread(child, error)

    def lost(self, error: LockLostError) -> None:
        """``FeatureLock.on_lost``: runs in the heartbeat thread."""
        with self._mutex:
            # Race: lost before CMD started: ``started`` acts on it instead.
            self._lost, child = error, self.child
            # Race: a loss found after CMD ended must not signal it (its pidfd is closed next).
            if child is None or self._ended.is_set() or self._act_on(child, error):
                return
        self._act_without_thread(child, error)

    def _act_on(self, child: _Child, error: LockLostError) -> bool:
        """Under the mutex: the lost-lock rule in a thread of its own; False if none starts."""
        acting = threading.Thread(
            target=self._act, args=(child, error), name="lock-run-lost", daemon=True
        )
        try:
            signals.start_without_signals(acting)
        except RuntimeError:
            return False
        self._acting = acting
        return True

    def _act_without_thread(self, child: _Child, error: LockLostError) -> None:
        """No thread to wait out the grace in: SIGTERM at least, now. The callback runs outside
        the mutex: a signal to forward never waits for it."""
        self.notify(error)
        with self._mutex:
            if self.policy is OnLost.TERMINATE:
                child.send(signal.SIGTERM)

    def _act(self, child: _Child, error: LockLostError) -> None:
        self.notify(error)
        if self.policy is OnLost.WARN:
            return
        child.send(signal.SIGTERM)
        grace = LOST_KILL_GRACE_SECONDS
        if error.stop_by is not None:  # a cut-off holder's CMD is gone before its lease ends
            grace = max(0.0, min(grace, error.stop_by - monotonic()))
        if not self._ended.wait(grace):
            child.send(signal.SIGKILL)

    def ended(self, child: _Child) -> None:
        """CMD has exited (and been reaped): stop waiting out a lost lock's grace and close
        its pidfd. Signals still reach the work it left in our group until :meth:`releasing`."""
        self._ended.set()
        with self._mutex:
            acting = self._acting
        if acting is not None:
            acting.join()
        with self._mutex:
            child.close()  # Race: the signal reader sending through the pidfd as it closes


def _child_got_it_too(signum: int, from_kernel: bool | None, child_pid: int) -> bool:
    """Did the kernel send this signal to our whole group, the child included (a Ctrl-C, a
    hang-up)? Then forwarding would deliver it twice. Without the sender (``None``), a SIGINT
    in the foreground is taken for a Ctrl-C."""
    if from_kernel is False or (from_kernel is None and signum != signal.SIGINT):
        return False
    try:
        shares = os.getpgid(child_pid) == os.getpgrp()
        if from_kernel:
            return shares  # the kernel signals groups, never one member of ours alone
        return shares and os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, ValueError):
        return False


@contextmanager
def _senders_known(relay: _Relay) -> Iterator[None]:
    """With stdin a terminal, hand the forwarded signals to ``relay`` with their senders, read
    by a thread with ``sigwaitinfo`` (elsewhere CMD leads its group: every one is forwarded)."""
    try:
        terminal = sys.stdin is not None and os.isatty(sys.stdin.fileno())
    except (OSError, ValueError):  # closed, or not a real file
        terminal = False
    if not _READ_SENDERS or not terminal:
        yield
        return
    stopping = False

    def read() -> None:
        while True:
            info = signal.sigwaitinfo(signals.FORWARDED)
            if stopping:
                return
            relay.deliver(info.si_signo, from_kernel=info.si_code == SI_KERNEL)

    reader = threading.Thread(target=read, name="lock-run-signals", daemon=True)
    with signals.masked(signal.SIG_BLOCK, signals.FORWARDED) as previous:
        try:
            reader.start()
        except RuntimeError:  # "can't start new thread": on without senders (nor the block)
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        try:
            yield
        finally:
            stopping = True
            if reader.ident is not None:
                # Wakes the reader (a signal for its thread alone); it sees ``stopping``, ends.
                signal.pthread_kill(reader.ident, signal.SIGHUP)
                reader.join()


def _our_work() -> list[int]:
    """As a terminal's job CMD shares our group: our live descendants still in it (not the
    job's other members, such as a ``| tee`` beside us)."""
    import psutil  # only on this path: a foreground lock run that signals its command's work

    ours = os.getpgrp()
    found = []
    with suppress(psutil.Error):
        for process in psutil.Process().children(recursive=True):
            with suppress(psutil.Error, OSError):
                if os.getpgid(process.pid) == ours and process.status() != psutil.STATUS_ZOMBIE:
                    found.append(process.pid)
    return found


def _descendants() -> set[int]:
    """Our live descendants (Linux's ``children`` lists); our ended children are reaped:
    asked only between CMDs, by a process that starts nothing else (it adopts CMD's orphans)."""
    me, found, parents = os.getpid(), set(), [os.getpid()]
    while parents:
        parent = parents.pop()
        for pid in _children_of(parent):
            if parent == me:
                with suppress(ChildProcessError):
                    if os.waitpid(pid, os.WNOHANG)[0]:  # an adopted orphan has ended
                        continue
            if ownership.is_alive(ownership.proc_stat(pid), pid) and pid not in found:
                found.add(pid)
                parents.append(pid)
    return found


def _children_of(pid: int) -> list[int]:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:  # ended, or no /proc: no children seen
        return []
    children: list[int] = []
    for task in tasks:
        with suppress(OSError, ValueError), open(f"/proc/{pid}/task/{task}/children", "rb") as f:
            children.extend(int(word) for word in f.read().split())
    return children


def _signal_our_work(signum: int, but: int | None = None) -> None:
    import psutil

    for pid in _our_work():
        if pid == but:
            continue  # CMD itself: signalled through its pidfd
        with suppress(psutil.Error):
            psutil.Process(pid).send_signal(signum)  # checks it is still that process


def work_grace_seconds() -> float:
    """The grace of CMD's leftovers: ``MAHABHARATHA_RUN_GRACE`` when a finite number of seconds
    (at least 0), else :data:`WORK_GRACE_SECONDS`."""
    try:
        seconds = float(os.environ.get(GRACE_ENV, ""))
    except ValueError:
        return WORK_GRACE_SECONDS
    return seconds if math.isfinite(seconds) and seconds >= 0 else WORK_GRACE_SECONDS


class Run:
    """``lock run`` in two steps: ``with Run(lock, ...) as run: run.acquire(); run.command(cmd)``;
    the signals are ours inside, and once acquired the lock is released whatever happens.
    ``adopt_orphans`` (a process that starts nothing but CMD: the CLI): CMD's orphans, in any
    group, count as its work."""

    def __init__(
        self,
        lock: FeatureLock,
        *,
        on_lost: OnLost = OnLost.TERMINATE,
        notify_lost: Callable[[LockLostError], None] | None = None,
        on_release_wait: Callable[[float], None] | None = None,
        adopt_orphans: bool = False,
    ) -> None:
        self.lock = lock
        self._adopts = adopt_orphans  # a process that starts nothing but CMD (the CLI)
        self._relay = _Relay(on_lost, notify_lost)
        self._on_release_wait = on_release_wait
        self._held = False  # acquired, and not yet given to a release
        self._signals = ExitStack()

    def __enter__(self) -> Self:
        with ExitStack() as entering:  # a failed enter gives back what it took
            entering.enter_context(signals.Handling(signals.FORWARDED, self._relay))
            entering.enter_context(_senders_known(self._relay))
            self._signals = entering.pop_all()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._signals:
            if self._held:  # an error between acquire and command: never leave it held
                self._release(None)

    def acquire(self) -> None:
        """Take the lock (:class:`Interrupted` when a signal ends the wait)."""
        on_wait, on_lost = self.lock.on_wait, self.lock.on_lost

        def check_then_report(info: LockInfo, left: float | None) -> None:
            self._relay.raise_if_pending()  # a signal that came ends the wait
            if on_wait is not None:
                on_wait(info, left)

        def lost(error: LockLostError) -> None:  # the caller's own callback, then the relay
            if on_lost is not None:
                on_lost(error)
            self._relay.lost(error)

        self.lock.acquire(on_wait=check_then_report, on_lost=lost)
        self._held = True

    def command(
        self,
        command: Sequence[str],
        stdout: IO[Any] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        stderr: IO[Any] | None = None,
    ) -> int:
        """Run ``command`` under the acquired lock, then release it; its shell exit code."""
        if not self._held:
            raise RuntimeError("Run.command needs the lock: call Run.acquire first")
        lock, relay = self.lock, self._relay
        returncode: int | None = None
        work: WorkProof | None = None
        try:
            relay.raise_if_pending()
            if lock.lost is not None:
                raise lock.lost  # Race: lost between the acquire and now: CMD never starts
            work = lock.work_proof()
            older = None
            if self._adopts:
                spawn.adopt_orphans()
                older = _descendants()
            # The block lifted while CMD starts (a child inherits the mask): the handler takes over.
            unmasked = signals.masked(signal.SIG_UNBLOCK, signals.FORWARDED)
            with unmasked if _READ_SENDERS else nullcontext():
                popen, own_group = spawn.start_command(lock, command, (stdout, stderr), work, env)
                child = _Child(popen, own_group, work, older)
                relay.started(child)
            try:
                returncode = child.popen.wait()
            finally:
                relay.ended(child)
            relay.releasing()  # from here a signal cuts the wait for CMD's leftovers short
            if child.outlast(relay):
                # Race: work that left CMD's group still runs: a release would let a second
                # holder in beside it. Its proof keeps the lock held until it ends.
                lock.abandon()
                work = None  # its watch goes with the error: asked until the work ends
                raise WorkLeftError(lock.feature, shell_status(returncode), child.still_running)
        finally:
            if work is not None:
                work.close()
            self._release(returncode)
        return shell_status(returncode)

    @property
    def signalled(self) -> int | None:
        """The first signal (INT, TERM, HUP) received once the command started (``None``:
        none): it tells ``lock work`` to stop, whatever CMD made of it."""
        return self._relay.received

    def _release(self, status: int | None) -> None:
        """``lock.release()``, waiting as long as the backend must (a kernel lease), unless a
        signal ends the wait first: then :class:`ReleaseInterrupted`, and the lock stays."""
        self._held = False  # one release only, whether it succeeds or raises
        relay = self._relay
        relay.releasing()

        def pause(seconds: float) -> None:
            signum = relay.signalled_within(seconds)
            if signum is not None:
                code = None if status is None else shell_status(status)
                server = self.lock.backend.kind != "file"
                raise ReleaseInterrupted(signum, self.lock.feature, code, server)

        self.lock.release(ReleaseWait(self._on_release_wait, pause))


def run_locked(
    lock: FeatureLock,
    command: Sequence[str],
    stdout: IO[Any] | None = None,
    on_acquired: Callable[[], None] | None = None,
) -> int:
    """Take ``lock`` (waiting as it was configured), run ``command``, release; return its code
    (:class:`Run` in one call). What it raises: ``design/lockfile-hardening.md`` section 6."""
    with Run(lock) as run:
        run.acquire()
        if on_acquired is not None:
            on_acquired()
        return run.command(command, stdout)
