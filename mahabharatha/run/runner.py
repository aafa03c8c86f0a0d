"""Hold a feature lock while a command runs: ``mahabharatha lock run``.

The lock is held by this process (it lives as long as the command), refreshed by the
:class:`~mahabharatha.locks.FeatureLock` heartbeat, and released when the command ends, also
when we are interrupted. SIGINT, SIGTERM and SIGHUP are handled from *before* the lock is taken:

* while waiting for the lock, a signal ends the wait at the next poll (never in the middle of a
  lock operation, so it cannot strand a half-taken lock); one that arrives after the lock is
  taken but before the command starts releases the lock, and the command never starts;
* while the command starts, a signal is remembered and sent to it as soon as it exists;
* while it runs, a signal is forwarded to it (then SIGCONT, so a stopped CMD ends too), except
  one the kernel sent to our whole process group (a Ctrl-C at the terminal, a hang-up): that
  one reached it already, and a second SIGINT would hurt many programs. To tell the two apart,
  the signals are kept blocked and taken with ``sigwaitinfo`` by a reader thread, which sees
  who sent each (``si_code``): ``kill`` sends ``SI_USER``, a terminal ``SI_KERNEL``. The
  Python handlers stay installed for the moment the command is being started (the mask is
  lifted then, so the command does not inherit it). With stdin not a terminal the command
  leads a group of its own and every signal is forwarded: no reader is needed, and the Python
  handlers forward them.

When the command has ended, the lock is released; a backend may be unable to do that at once
(files: another process's kernel lease on the lock file, ``F_SETLEASE``). The backend then waits
(files: until the kernel breaks the lease), this module says so on stderr, and a signal during
that wait ends it at once, leaving the lock (:class:`ReleaseInterrupted`).

If the lock is lost while the command runs (the heartbeat finds it removed or replaced, or
refreshes failed until it turned stale), the command gets SIGTERM, then SIGKILL after
:data:`LOST_KILL_GRACE_SECONDS` (``OnLost.TERMINATE``), or keeps running (``OnLost.WARN``).

**The command's tree.** CMD runs in a process group of its own (unless ``lock run`` is a job
of its terminal, in the foreground or started with ``&``: then CMD shares its group, so that
the terminal's Ctrl-C, Ctrl-Z and reads, ``fg``, ``bg`` and a hang-up reach both as one job),
and every signal forwarded to it goes to that whole group; that group is recorded with the
lock, and counts as the owner's work until it is empty. CMD
inherits a proof of life of its own (:class:`~mahabharatha.owner.proof.WorkProof`), which its
children inherit in turn. When CMD has ended, ``lock run`` releases only once no process holds
that proof: it waits :data:`WORK_GRACE_SECONDS`, then SIGKILLs CMD's group, and if something
that left the group (``setsid``, a daemon) still holds the proof, the lock is left held (its
owner judged alive by that proof) and :class:`WorkLeftError` says so.
"""

from __future__ import annotations

import enum
import errno
import math
import os
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from functools import cache, lru_cache
from time import monotonic
from types import FrameType, TracebackType
from typing import IO, Any, Final, Self

from mahabharatha import signals, waiting
from mahabharatha.backends.base import Capability, ReleaseWait
from mahabharatha.constants import (
    GRACE_ENV,
    LOST_KILL_GRACE_SECONDS,
    PROOF_FD_ENV,
    SETPRIV_PROBE_SECONDS,
    TOKEN_ENV,
    WORK_GRACE_SECONDS,
    WORK_KILL_WAIT_SECONDS,
    WORK_POLL_SECONDS,
)
from mahabharatha.exits import killed_by, shell_status
from mahabharatha.locks import FeatureLock, LockError, LockInfo, LockLostError, WaitCallback
from mahabharatha.owner import ownership
from mahabharatha.owner.proof import WorkProof

SI_KERNEL: Final = 0x80
"""``si_code`` of a signal the kernel sent (<asm-generic/siginfo.h>): a terminal's Ctrl-C."""
_READ_SENDERS: Final = hasattr(signal, "sigwaitinfo") and hasattr(signal, "pthread_sigmask")
"""Can we learn who sent a signal (Linux and most POSIX systems; not macOS)?"""


class OnLost(enum.StrEnum):
    """What ``lock run`` does to CMD when its lock is lost while CMD runs."""

    TERMINATE = "terminate"  # SIGTERM, then SIGKILL after the grace; exit 76
    WARN = "warn"  # keep CMD running, warn; exit with CMD's code


class Interrupted(Exception):
    """A signal arrived before the command started; nothing was run."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name} before the command ran")

    @property
    def exit_code(self) -> int:
        """What a shell would report (the CLI's ``exit_code_for`` says the same)."""
        return killed_by(self.signum)


class ReleaseInterrupted(Exception):
    """A signal ended the wait for a kernel lease on the lock file: the lock was left behind
    (stale after 2 hours; ``--reclaim-dead`` takes it sooner once this process has exited)."""

    def __init__(self, signum: int, feature: str, status: int | None) -> None:
        self.signum = signum
        self.feature = feature
        self.status = status  # the command's exit status, when it ran
        super().__init__(
            f"interrupted by {signal.Signals(signum).name} while waiting for a kernel lease on "
            f"the lock of {feature!r} to be broken: the lock stays until it is stale, or until "
            "--reclaim-dead takes it"
        )

    @property
    def exit_code(self) -> int:
        """What a shell would report for a process ended by this signal."""
        return killed_by(self.signum)


class WorkLeftError(LockError):
    """CMD has ended, but processes it started outside its process group still hold its proof
    of life: the lock was left held (judged alive) until they end. ``status``: CMD's exit
    code, as ``lock run`` reports it."""

    def __init__(
        self, feature: str, status: int, still_running: Callable[[], bool] | None = None
    ) -> None:
        super().__init__(
            f"the command's work left its process group and still runs; lock {feature!r} "
            "stays held (its owner judged alive) until that work ends"
        )
        self.feature = feature
        self.status = status
        self._still_running = still_running

    def still_running(self) -> bool:
        """Does that work still run (its proof held, or CMD's group not empty)? Asked by a
        holder that waits for it to end before it gives the lock back (``lock work``)."""
        return self._still_running is None or self._still_running()


class CommandStartError(OSError, LockError):
    """The command could not be started; nothing ran (exit 126 or 127, as a shell would)."""


class CommandNotFoundError(CommandStartError, FileNotFoundError):
    """The command to run does not exist (exit 127, like a shell)."""


class CommandNotExecutableError(CommandStartError, PermissionError):
    """The command exists but cannot be executed: no permission, a folder, not a program
    (exit 126, like a shell)."""


class _Phase(enum.Enum):
    PREPARING = "preparing"  # waiting for the lock, or starting the command (pid not yet known)
    RUNNING = "running"
    RELEASING = "releasing"  # the command is over: a signal ends a wait for the release


_NEEDS_NO_CONT: Final = frozenset({signal.SIGKILL, signal.SIGCONT, signal.SIGSTOP, 0})
"""Signals that a stopped process does not need continuing for (SIGKILL ends it stopped)."""


class _Child:
    """The running command, signalled through a pidfd where there is one; with ``own_group``
    it leads a process group of its own, and signals go to that whole group."""

    def __init__(self, popen: subprocess.Popen[bytes], *, own_group: bool = False) -> None:
        self.popen = popen
        self.own_group = own_group
        self.start = _start_of(popen.pid) if own_group else None
        self._pidfd: int | None = None
        with suppress(AttributeError, OSError):  # no pidfd (old kernel, not Linux): by pid
            # Race: only our wait() reaps CMD, and it has not run yet, so this is CMD's pidfd;
            # later signals through it can never reach a process that reused CMD's pid.
            self._pidfd = os.pidfd_open(popen.pid)

    def send(self, signum: int) -> None:
        """Signal the command's whole group when it leads one; as a job of a terminal
        (it shares ours), the command and what it started that is still in our group. A
        signal that asks to end (not SIGKILL) is followed by SIGCONT: a stopped process
        (SIGSTOP, Ctrl-Z, a read from the background) keeps it pending until continued."""
        follow = (signum,) if signum in _NEEDS_NO_CONT else (signum, signal.SIGCONT)
        for each in follow:
            self._send_once(each)

    def _send_once(self, signum: int) -> None:
        if not self.own_group:
            self._send_to_command(signum)
            _signal_our_work(signum, but=self.popen.pid)
            return
        # Race: CMD is not reaped (its pidfd said so), so its group's number is still CMD's
        # and cannot belong to anyone else.
        if self._send_to_command(0):
            with suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signum)

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
        """After CMD was reaped: is anything left of its group (or, as a terminal's foreground
        job, of what it started in ours)?"""
        if not self.own_group:
            return bool(_our_work())
        return ownership.group_has_live_member(self.popen.pid, self.start)

    def kill_group(self) -> None:
        """After CMD was reaped: SIGKILL what is left of its group (its work). The group's
        number is checked against CMD's start time first: a group that ended and whose number
        was reused is someone else's."""
        if not self.own_group:
            _signal_our_work(signal.SIGKILL)
            return
        pgid = self.popen.pid
        # Race: the group ended and its number went to a new leader: never signal that one.
        if ownership.group_has_live_member(pgid, self.start):
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)

    def close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


class _SignalRelay:
    """Decides what a signal does in each phase (see the module docstring)."""

    def __init__(self) -> None:
        self.phase = _Phase.PREPARING
        self.child: _Child | None = None
        self.pending: int | None = None
        self.received: int | None = None  # the first signal that came once CMD was started
        self.woken = threading.Event()  # set with ``pending``: ends a wait at once
        # Reentrant: the Python handler may run in the main thread while it holds this lock.
        self._mutex = threading.RLock()

    def __call__(self, signum: int, _frame: FrameType | None) -> None:
        """The Python handler: it does not know who sent the signal."""
        self.deliver(signum, from_kernel=None)

    def deliver(self, signum: int, *, from_kernel: bool | None) -> None:
        """Act on a signal; ``from_kernel``: sent by the kernel (None: not known)."""
        with self._mutex:
            if self.phase is not _Phase.PREPARING and self.received is None:
                self.received = signum  # lock work stops on it, whatever CMD made of it
            if self.phase is _Phase.RUNNING:
                self._forward(signum, from_kernel)
            else:
                # Race: a signal before the child exists; acted on at the next safe point.
                self.pending = signum
                self.woken.set()

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
            self.phase, self.pending = _Phase.RELEASING, None
            self.woken.clear()

    def signalled_within(self, seconds: float) -> int | None:
        """Wait up to ``seconds`` for a signal; the one that came, if any."""
        self.woken.wait(max(0.0, seconds))
        self._take_own()
        return self.pending

    def waiting(self, on_wait: WaitCallback | None) -> WaitCallback:
        """The lock's wait callback, made to end the wait once a signal has arrived."""

        def check_then_report(info: LockInfo, left: float | None) -> None:
            self.raise_if_pending()
            if on_wait is not None:
                on_wait(info, left)

        return check_then_report

    def started(self, child: _Child) -> None:
        with self._mutex:
            self.child, self.phase = child, _Phase.RUNNING
            if self.pending is not None:
                self.received = self.pending
                child.send(self.pending)  # it did not exist when the signal came: send it now

    def _forward(self, signum: int, from_kernel: bool | None) -> None:
        if self.child is None:
            return
        if _child_got_it_too(signum, from_kernel, self.child.popen.pid):
            return
        self.child.send(signum)


def _child_got_it_too(signum: int, from_kernel: bool | None, child_pid: int) -> bool:
    """Did the kernel send this signal to our whole group, the child included (a Ctrl-C at the
    terminal; a hang-up, or an orphaned stopped job's SIGHUP)? Then forwarding it would deliver
    it twice. ``kill`` reaches only us.

    Without the sender (``from_kernel`` None), a SIGINT in the foreground is taken for a Ctrl-C.
    """
    if from_kernel is False or (from_kernel is None and signum != signal.SIGINT):
        return False
    try:
        shares = os.getpgid(child_pid) == os.getpgrp()
        if from_kernel:
            return shares  # the kernel signals groups, never one member of ours alone
        return shares and os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, ValueError):
        return False


class _SenderReader:
    """Takes the blocked forwarded signals with ``sigwaitinfo`` (which tells who sent each) in
    a thread of its own, and hands them to the relay."""

    def __init__(self, relay: _SignalRelay) -> None:
        self._relay = relay
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="lock-run-signals", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            info = signal.sigwaitinfo(signals.FORWARDED)
            if self._stopping:
                return
            self._relay.deliver(info.si_signo, from_kernel=info.si_code == SI_KERNEL)

    def stop(self) -> None:
        self._stopping = True
        if self._thread.ident is not None:
            # Wakes the reader (a signal for its thread alone); it sees ``_stopping`` and ends.
            signal.pthread_kill(self._thread.ident, signal.SIGHUP)
        self._thread.join()


@contextmanager
def _senders_known(relay: _SignalRelay) -> Iterator[None]:
    """Block the forwarded signals in this thread (and in the threads it starts from now on:
    the heartbeat, the loss watch) and read them with their senders. On leaving, signals that
    came meanwhile reach the Python handler when the mask is lifted.

    Only where the sender can matter: with stdin a terminal (a Ctrl-C there reaches CMD in our
    foreground group from the kernel too, and is not forwarded again). Otherwise every signal
    is forwarded whoever sent it (CMD leads a group of its own), the Python handler does that,
    and a reader started and stopped for every command (a pool's worker, whose stdin is never
    a terminal) was a thread for nothing: two waits per feature for it to be scheduled. Our
    other threads start with the signals blocked (``signals.start_without_signals``), so the
    handler runs in the main thread at once."""
    if not _READ_SENDERS or not _stdin_is_a_terminal():
        yield
        return
    with signals.masked(signal.SIG_BLOCK, signals.FORWARDED) as previous:
        try:
            reader = _SenderReader(relay)
        except RuntimeError:  # "can't start new thread": on without senders (nor the block)
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
            yield
            return
        try:
            yield
        finally:
            reader.stop()


def _stdin_is_a_terminal() -> bool:
    try:
        return sys.stdin is not None and os.isatty(sys.stdin.fileno())
    except (OSError, ValueError):  # closed, or not a real file
        return False


def _unmasked() -> AbstractContextManager[object]:
    """Lift the block while CMD is started: a child inherits the signal mask across exec, and
    CMD must get its signals. Meanwhile a signal reaches the Python handler (the relay)."""
    if not _READ_SENDERS:
        return nullcontext()
    return signals.masked(signal.SIG_UNBLOCK, signals.FORWARDED)


def _grace_before(stop_by: float | None) -> float:
    """CMD's grace after SIGTERM for a lost lock: :data:`LOST_KILL_GRACE_SECONDS`, cut short
    to end by ``stop_by`` (monotonic), when the lease may still run on the server (a cut-off
    holder: CMD must be gone before the lock can be given away)."""
    if stop_by is None:
        return LOST_KILL_GRACE_SECONDS
    return max(0.0, min(LOST_KILL_GRACE_SECONDS, stop_by - monotonic()))


class _LossWatch:
    """Applies the lost-lock rule to the command: called by the heartbeat when the lock is lost,
    it acts in a thread of its own (the grace must not hold up anyone)."""

    def __init__(self, policy: OnLost, notify: Callable[[LockLostError], None] | None) -> None:
        self.policy = policy
        self.notify = notify
        self._mutex = threading.Lock()
        self._child: _Child | None = None
        self._lost: LockLostError | None = None
        self._ended = threading.Event()
        self._acting: threading.Thread | None = None

    def also_telling(
        self, caller: Callable[[LockLostError], None] | None
    ) -> Callable[[LockLostError], None]:
        """``FeatureLock.on_lost`` for the run: the caller's own callback, then this watch."""

        def lost(error: LockLostError) -> None:
            if caller is not None:
                caller(error)
            self.lost(error)

        return lost

    def lost(self, error: LockLostError) -> None:
        """``FeatureLock.on_lost``: runs in the heartbeat thread."""
        with self._mutex:
            # Race: lost before CMD started: ``started`` acts on it instead.
            self._lost, child = error, self._child
            if child is not None:
                self._act_on(child, error)

    def started(self, child: _Child) -> None:
        with self._mutex:
            self._child, error = child, self._lost
            if error is not None:
                self._act_on(child, error)

    def _act_on(self, child: _Child, error: LockLostError) -> None:
        acting = threading.Thread(
            target=self._act, args=(child, error), name="lock-run-lost", daemon=True
        )
        try:
            signals.start_without_signals(acting)
        except RuntimeError:  # no thread to wait out the grace in: SIGTERM at least, now
            self._notify(error)
            if self.policy is OnLost.TERMINATE:
                child.send(signal.SIGTERM)
            return
        self._acting = acting

    def _notify(self, error: LockLostError) -> None:
        if self.notify is not None:
            self.notify(error)

    def _act(self, child: _Child, error: LockLostError) -> None:
        self._notify(error)
        if self.policy is OnLost.WARN:
            return
        child.send(signal.SIGTERM)
        if not self._ended.wait(_grace_before(error.stop_by)):
            child.send(signal.SIGKILL)

    def ended(self) -> None:
        """CMD has exited (and been reaped): stop waiting out the grace."""
        self._ended.set()
        with self._mutex:
            # Race: a loss found after CMD ended must not signal it (its pidfd is closed next).
            self._child = None
            acting = self._acting
        if acting is not None:
            acting.join()


def _our_work() -> list[int]:
    """As a terminal's foreground job CMD shares our group: what it started that is still in
    our group (our descendants: we are their subreaper, so orphans among them stay ours), not
    the job's other members (a ``| tee`` beside us) and not what left the group (``setsid``)."""
    import psutil  # only on this path: a foreground lock run that signals its command's work

    ours = os.getpgrp()
    found = []
    try:
        for process in psutil.Process().children(recursive=True):
            with suppress(psutil.Error, OSError):
                if os.getpgid(process.pid) == ours and process.status() != psutil.STATUS_ZOMBIE:
                    found.append(process.pid)
    except psutil.Error:
        return found
    return found


def _signal_our_work(signum: int, but: int | None = None) -> None:
    import psutil

    for pid in _our_work():
        if pid == but:
            continue  # CMD itself: signalled through its pidfd
        with suppress(psutil.Error):
            psutil.Process(pid).send_signal(signum)  # checks it is still that process


PR_SET_CHILD_SUBREAPER: Final = 36  # <linux/prctl.h>


def _become_subreaper() -> None:
    """Orphans of CMD's tree become our children (not init's), so we can find them (Linux)."""
    prctl = _prctl()
    if prctl is not None:
        prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


@cache
def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl`` (Linux), looked up once per process (a ``dlopen`` and a symbol lookup
    per command were, with the ``PATH`` search below, a tenth of a quick command's cost in a
    pool's worker); None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


def _leader_start(pgid: int) -> int | None:
    """The start time of the group ``pgid``'s leader, ``None`` when it is gone."""
    stat = ownership.proc_stat(pgid)
    return stat.start if stat is not None and stat.pgrp == pgid else None


def _start_of(pid: int) -> int | None:
    stat = ownership.proc_stat(pid)
    return None if stat is None else stat.start


def _in_terminal_job() -> bool:
    """Is ``lock run`` a job of its terminal (stdin, stdout or stderr is its controlling
    terminal), in the foreground or in the background (``lock run F -- CMD &``)? CMD then
    shares its group. Any of the three: ``lock run F -- CMD <file`` or ``echo y | lock run``
    typed at a shell is a job all the same (Ctrl-Z stopped ``lock run`` alone, CMD ran on).

    Race: CMD in a group of its own while ``lock run`` was a background job was no job of the
    shell's: its read of the terminal stopped it alone (SIGTTIN goes to the reader's group),
    ``jobs`` said Running, ``fg`` continued and gave the terminal to ``lock run``'s group only,
    so CMD stayed stopped for ever and Ctrl-C never reached it. In the job's group the kernel
    and the shell treat both as one job: a read stops both, ``fg``/``bg`` continue both,
    Ctrl-C and Ctrl-Z reach both, a hang-up ends both."""
    return any(_our_terminal(stream) for stream in (sys.stdin, sys.stdout, sys.stderr))


def _our_terminal(stream: IO[str] | None) -> bool:
    """Is ``stream`` our controlling terminal?"""
    try:
        fd = stream.fileno() if stream is not None else -1
        return fd >= 0 and os.isatty(fd) and os.tcgetpgrp(fd) > 0  # ENOTTY: not our terminal
    except (OSError, ValueError, AttributeError):
        return False


def work_grace_seconds() -> float:
    """The grace of CMD's leftovers: ``MAHABHARATHA_RUN_GRACE`` when it is a finite number of
    seconds (at least 0), else :data:`WORK_GRACE_SECONDS`."""
    raw = os.environ.get(GRACE_ENV, "")
    try:
        seconds = float(raw)
    except ValueError:
        return WORK_GRACE_SECONDS
    return seconds if math.isfinite(seconds) and seconds >= 0 else WORK_GRACE_SECONDS


def _still_running(work: WorkProof | None, child: _Child) -> Callable[[], bool]:
    """Does CMD's leftover work still run? Its proof's watch closes once it answers no."""

    def running() -> bool:
        nonlocal work
        if (work is not None and work.running()) or child.group_lives():
            return True
        if work is not None:
            work.close()
            work = None
        return False

    return running


def _work_still_held(work: WorkProof | None, child: _Child, relay: _SignalRelay) -> bool:
    """After CMD ended: wait (a grace, then SIGKILL to CMD's group) until nothing holds the
    work's proof *and* CMD's group is empty; True when something still runs after that (work
    that left the group holding the proof, or a member the SIGKILL did not take down)."""

    def running() -> bool:
        # Race: work can drop the proof and stay in CMD's group (a Python subprocess child,
        # closed descriptors; a shell's ``exec 5>>log`` over the proof's number): a free
        # proof alone would let a second holder in beside it.
        return (work is not None and work.running()) or child.group_lives()

    if not running():
        return False
    grace = waiting.Deadline(work_grace_seconds())
    # A signal (Ctrl-C, kill) during the grace cuts it short: the user wants out now.
    while running() and not grace.passed():
        if relay.signalled_within(WORK_POLL_SECONDS) is not None:
            break
    if not running():
        return False
    child.kill_group()
    killed = waiting.Deadline(WORK_KILL_WAIT_SECONDS)
    while running() and not killed.passed():
        relay.signalled_within(WORK_POLL_SECONDS)
    return running()


class Run:
    """``lock run`` in two steps, so that its caller can act between them (the CLI enters its
    waiting line around :meth:`acquire` and notes the holder before :meth:`command`; nothing
    here calls back up into it)::

        with Run(lock, on_lost=..., notify_lost=..., on_release_wait=...) as run:
            run.acquire()  # waiting as ``lock`` was configured
            ...  # the lock is held
            code = run.command(command, stdout)

    Entering hands the forwarded signals to the run's relay (see the module docstring), from
    before the lock is taken; leaving gives them back. Once :meth:`acquire` has returned, the
    lock is released whatever happens: by :meth:`command` when it ends, else (an error between
    the two steps) on leaving the block. :func:`run_locked` documents the arguments and what
    each step raises.
    """

    def __init__(
        self,
        lock: FeatureLock,
        *,
        on_lost: OnLost = OnLost.TERMINATE,
        notify_lost: Callable[[LockLostError], None] | None = None,
        on_release_wait: Callable[[float], None] | None = None,
    ) -> None:
        self.lock = lock
        self._relay = _SignalRelay()
        self._watch = _LossWatch(on_lost, notify_lost)
        self._on_release_wait = on_release_wait
        self._held = False  # acquired, and not yet given to a release
        self._block: AbstractContextManager[None] | None = None

    def __enter__(self) -> Self:
        block = self._signals_then_release()
        block.__enter__()
        self._block = block
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> bool | None:
        block, self._block = self._block, None
        if block is None:
            raise RuntimeError("Run left without being entered")
        return block.__exit__(kind, error, trace)

    @contextmanager
    def _signals_then_release(self) -> Iterator[None]:
        with signals.Handling(signals.FORWARDED, self._relay), _senders_known(self._relay):
            try:
                yield
            finally:
                if self._held:  # an error between acquire and command: never leave it held
                    self._release(None)

    def acquire(self) -> None:
        """Take the lock (raises what ``lock.acquire`` raises, and :class:`Interrupted` when a
        signal ends the wait)."""
        self.lock.acquire(
            on_wait=self._relay.waiting(self.lock.on_wait),
            on_lost=self._watch.also_telling(self.lock.on_lost),
        )
        self._held = True

    def command(
        self,
        command: Sequence[str],
        stdout: IO[Any] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        stderr: IO[Any] | None = None,
    ) -> int:
        """Run ``command`` under the lock taken by :meth:`acquire`, then release it; return
        the command's exit code as a shell reports it. ``stdout``/``stderr``: where its
        output goes (``None``: ours)."""
        if not self._held:
            raise RuntimeError("Run.command needs the lock: call Run.acquire first")
        lock, relay, watch = self.lock, self._relay, self._watch
        returncode: int | None = None
        work: WorkProof | None = None
        try:
            relay.raise_if_pending()
            if lock.lost is not None:
                raise lock.lost  # Race: lost between the acquire and now: CMD never starts
            work = lock.work_proof()
            with _unmasked():
                child = _start(
                    relay, command, stdout, _child_env(lock.token, work, env), work, stderr,
                    _group_recorder(lock),
                )  # fmt: skip
            watch.started(child)
            try:
                returncode = child.popen.wait()
            finally:
                watch.ended()
                child.close()
            relay.releasing()  # from here a signal cuts the wait for CMD's leftovers short
            if _work_still_held(work, child, relay):
                # Race: work that left CMD's group still runs: releasing now would let a
                # second holder in beside it. Its proof keeps the lock held until it ends.
                lock.abandon()
                left = _still_running(work, child)
                work = None  # its watch goes with the error: asked until the work ends
                raise WorkLeftError(lock.feature, shell_status(returncode), left)
        finally:
            if work is not None:
                work.close()
            self._release(returncode)
        return shell_status(returncode)

    @property
    def signalled(self) -> int | None:
        """The first signal (INT, TERM, HUP) this process received once the command was
        started, ``None`` for none: what tells ``lock work`` to stop, whatever CMD made of it
        (a CMD that catches TERM and exits 1 was still told to stop)."""
        return self._relay.received

    def _release(self, status: int | None) -> None:
        self._held = False  # one release only, whether it succeeds or raises
        _release_after_leases(self.lock, self._relay, self._on_release_wait, status)


def run_locked(
    lock: FeatureLock,
    command: Sequence[str],
    stdout: IO[Any] | None = None,
    on_acquired: Callable[[], None] | None = None,
    *,
    waiting: AbstractContextManager[object] | None = None,
    on_lost: OnLost = OnLost.TERMINATE,
    notify_lost: Callable[[LockLostError], None] | None = None,
    on_release_wait: Callable[[float], None] | None = None,
    env: Mapping[str, str] | None = None,
    stderr: IO[Any] | None = None,
) -> int:
    """Take ``lock`` (waiting as it was configured), run ``command``, release; return its code.
    One call for the two steps of :class:`Run`.

    ``env``: variables added to the command's environment (``lock work``: the feature);
    ``stdout``/``stderr``: where its output goes (``None``: ours).

    ``waiting`` (a terminal's waiting line) is entered around the wait for the lock only, so it
    is gone before the command's output or any error. ``on_acquired`` is called once the lock
    is ours, before the command starts. When the lock
    is lost while the command runs, ``lock.lost`` says why afterwards, ``notify_lost`` is called
    at once, and ``on_lost`` says what happens to the command. When a kernel lease keeps the
    lock file from being read at the release, ``on_release_wait(seconds)`` is called once and
    the release waits for the kernel to break the lease, at most that long.

    Raises :class:`~mahabharatha.locks.LockHeldError` when the lock stays busy,
    :class:`Interrupted` when a signal arrives before the command started, and
    :class:`CommandNotFoundError` or :class:`CommandNotExecutableError` (both
    :class:`CommandStartError`) when the command cannot be started (lock released),
    :class:`ReleaseInterrupted` when a signal ended the wait for a lease at the release,
    an ``OSError`` (files: ``LockBusyError``) when a kernel lease outlasted that wait,
    :class:`~mahabharatha.locks.LockLostError` when the lock was lost before the command could
    start (it never starts), and :class:`WorkLeftError` when the command ended but work it
    started outside its group still holds its proof of life (the lock is left held).
    """
    with Run(
        lock, on_lost=on_lost, notify_lost=notify_lost, on_release_wait=on_release_wait
    ) as run:
        with waiting if waiting is not None else nullcontext():
            run.acquire()
        if on_acquired is not None:
            on_acquired()
        return run.command(command, stdout, env=env, stderr=stderr)


def _release_after_leases(
    lock: FeatureLock,
    relay: _SignalRelay,
    on_release_wait: Callable[[float], None] | None,
    status: int | None,
) -> None:
    """``lock.release()``, waiting as long as the backend must (files: until the kernel breaks
    another process's lease on the lock file, bounded), unless a signal ends the wait first:
    then :class:`ReleaseInterrupted`, and the lock stays."""
    relay.releasing()

    def pause(seconds: float) -> None:
        signum = relay.signalled_within(seconds)
        if signum is not None:
            code = None if status is None else shell_status(status)
            raise ReleaseInterrupted(signum, lock.feature, code)

    lock.release(ReleaseWait(on_release_wait, pause))


PR_SET_PDEATHSIG: Final = 1  # <linux/prctl.h>
PARENT_DEATH_SIGNAL: Final = signal.SIGKILL
"""What CMD gets when ``lock run`` dies without ending it (SIGKILL, a crash): the same fate.
A signal that ``lock run`` can handle is forwarded to CMD instead (see the module docstring)."""


def _parent_death_hook(then: Callable[[], None] | None = None) -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks Linux to kill the child when ``lock run`` dies, then calls
    ``then`` (the group handshake); ``then`` alone where there is no ``prctl`` (CMD then
    outlives a SIGKILLed ``lock run``, and its process group, recorded with the lock, keeps
    the lock alive meanwhile).

    Fork safety: everything is resolved here, in the parent; the child only calls one C
    function and two system calls, touching no Python lock (the import lock is held across the
    fork by ``subprocess`` itself, and glibc's ``fork`` leaves ``malloc`` usable).
    """
    prctl = _prctl()
    if prctl is None:
        return then
    parent = os.getpid()
    getpid, getppid, kill, signum = os.getpid, os.getppid, os.kill, int(PARENT_DEATH_SIGNAL)

    def die_with_parent() -> None:
        # The signal comes when the thread that forked us ends: run_locked starts CMD from the
        # thread that waits for it.
        prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
        # Race: lock run died between fork and prctl; we were re-parented and no signal comes.
        if getppid() != parent:
            kill(getpid(), signum)
        if then is not None:
            then()

    return die_with_parent


SETPRIV: Final = "setpriv"
"""util-linux's ``setpriv``: ``setpriv --pdeathsig KILL -- CMD`` asks for the parent-death
signal and then becomes CMD (one process, CMD's pid)."""


def _spawned_words(
    command: Sequence[str],
    env: Mapping[str, str] | None,
    handshake: Callable[[], None] | None = None,
) -> tuple[list[str], Callable[[], None] | None]:
    """The words to start and the ``preexec_fn`` that give CMD the parent-death signal (and
    run ``handshake`` in the child before its ``exec``: then never through ``setpriv``).

    A ``preexec_fn`` makes Python fork this interpreter (it cannot ``vfork`` with one): about
    1.5 ms of CPU per command in page faults, most of a short command's cost in a pool. Where
    util-linux's ``setpriv`` can set the signal and no handshake is needed (CMD shares a
    terminal job's group), CMD is started through it instead, and Python uses ``vfork``.
    ``setpriv`` then runs CMD, so a command that cannot be started must be told here, as
    ``Popen`` would tell it (its own message would be a "failed attempt").
    Race: ``lock run`` killed between the start and ``setpriv``'s ``prctl`` (microseconds)
    leaves CMD running; its proof of life keeps the lock held until it ends (safe, as for a
    command that changed its credentials, section 13 of the design)."""
    wrapper = None if handshake is not None or _prctl() is None else _setpriv_with_pdeathsig()
    if wrapper is None:
        return list(command), _parent_death_hook(handshake)
    _check_can_start(command[0], env)
    return [
        wrapper,
        "--pdeathsig",
        PARENT_DEATH_SIGNAL.name.removeprefix("SIG"),
        "--",
        *command,
    ], None


@cache
def _setpriv_with_pdeathsig() -> str | None:
    """``setpriv``'s path when it can set the parent-death signal (asked once per process:
    an older or a busybox ``setpriv`` may not know ``--pdeathsig``)."""
    import shutil

    path = shutil.which(SETPRIV)
    if path is None:
        return None
    try:
        done = subprocess.run(
            [path, "--pdeathsig", "KILL", "--", "true"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=SETPRIV_PROBE_SECONDS,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return path if done.returncode == 0 else None


def _check_can_start(program: str, env: Mapping[str, str] | None) -> None:
    """Raise what ``Popen`` raises for a command that cannot be started: ``FileNotFoundError``
    (no such command on ``PATH``), ``PermissionError`` (a folder, or no execute permission)."""
    if os.sep in program:
        _check_startable(program, program)
        return
    search = (env if env is not None else os.environ).get("PATH", os.defpath)
    try:
        # A pool starts the same program for every feature: PATH is searched once, and the
        # place found is checked again each time (two system calls, not one per PATH entry).
        _check_startable(_found_on_path(program, search), program)
    except OSError:
        _found_on_path.cache_clear()  # moved or gone since: search again before saying so
        _check_startable(_found_on_path(program, search), program)


def _check_startable(path: str | None, program: str) -> None:
    try:
        found = None if path is None else os.stat(path)
    except OSError:
        found = None
    if path is None or found is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
    if stat.S_ISDIR(found.st_mode) or not os.access(path, os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)


@lru_cache(maxsize=16)
def _found_on_path(program: str, search: str) -> str | None:
    """Where the ``PATH`` ``search`` (CMD's own) finds ``program``: an executable first, else
    the first entry of that name (a folder, a file without execute permission: it then cannot
    be executed, ``EACCES``, as ``execvp`` says)."""
    import shutil

    found = shutil.which(program, path=search)
    if found is not None:
        return found
    entries = (os.path.join(folder or os.curdir, program) for folder in search.split(os.pathsep))
    return next((entry for entry in entries if os.path.exists(entry)), None)


def _child_env(
    token: int | None, work: WorkProof | None, extra: Mapping[str, str] | None = None
) -> dict[str, str] | None:
    """CMD's environment: ours, plus ``extra``, plus the token and the proof's descriptor when
    there are any (None: inherit ours)."""
    added: dict[str, str] = dict(extra or {})
    if token is not None:
        added[TOKEN_ENV] = str(token)
    if work is not None and work.fd is not None:
        added[PROOF_FD_ENV] = str(work.fd)
    return {**os.environ, **added} if added else None


RecordGroup = Callable[[int, int | None], None]
"""``FeatureLock.record_work_group``: CMD's process group and its leader's start time."""


def _group_recorder(lock: FeatureLock) -> RecordGroup | None:
    """Where CMD's group goes: ``None`` for a backend that records none (a lock server judges
    by the holder's session), whose CMD needs no handshake (nor its fork)."""
    return lock.record_work_group if Capability.PROOF_OF_LIFE in lock.backend.capabilities else None


class _GroupHandshake:
    """CMD's group recorded with the lock before anything of CMD runs. The child, between its
    ``setpgid`` and its ``exec``, writes its pid to one pipe and blocks reading another; a
    thread of ours (the main one waits in ``Popen``) records the group (the pid; its start
    time from ``/proc``, unchanged by ``exec``) and then lets the child go on. A ``lock run``
    killed before that takes the still-blocked child along (the parent-death signal, and the
    end of the second pipe), so nothing of CMD ran. A busy guard holds CMD back for at most
    the record's bounded wait for it; then CMD goes on unrecorded and the heartbeat records
    the group (the window stays open that long, for that run only)."""

    def __init__(self, record: RecordGroup) -> None:
        self._pid_read, self._pid_write = os.pipe()
        self._go_read, self._go_write = os.pipe()
        self._thread = threading.Thread(
            target=self._record_then_release, args=(record,), name="lock-run-group", daemon=True
        )

    @classmethod
    def begun(cls, record: RecordGroup) -> _GroupHandshake | None:
        """A handshake whose thread waits for the child; ``None`` without a thread for it."""
        handshake = cls(record)
        try:
            signals.start_without_signals(handshake._thread)
        except RuntimeError:  # "can't start new thread": the group is recorded late
            handshake.close()
            return None
        return handshake

    def in_child(self) -> Callable[[], None]:
        """The child's half, resolved here in the parent (fork safety: system calls only)."""
        pid_read, pid_write, go_read, go_write = (
            self._pid_read, self._pid_write, self._go_read, self._go_write,
        )  # fmt: skip
        close, write, read, getpid, kill = os.close, os.write, os.read, os.getpid, os.kill

        def wait_until_recorded() -> None:
            # Race: our copy of the writing end would hide lock run's death from the read.
            close(go_write)
            close(pid_read)
            write(pid_write, getpid().to_bytes(4, "little"))
            if not read(go_read, 1):  # lock run died before recording: CMD must never run
                kill(getpid(), signal.SIGKILL)

        return wait_until_recorded

    def _record_then_release(self, record: RecordGroup) -> None:
        said = b""
        while len(said) < 4 and (more := os.read(self._pid_read, 4 - len(said))):
            said += more
        if len(said) < 4:
            return  # the child never got there (its start failed): nothing waits
        pid = int.from_bytes(said, "little")
        try:
            record(pid, _start_of(pid))
        finally:
            with suppress(OSError):  # EPIPE: the child was killed meanwhile
                os.write(self._go_write, b"go")

    def close(self) -> None:
        """After ``Popen`` returned or raised: the thread ends (a child that never wrote
        leaves it the end of the pipe), and the pipes are closed."""
        os.close(self._pid_write)
        if self._thread.ident is not None:  # started
            self._thread.join()
        for fd in (self._pid_read, self._go_read, self._go_write):
            os.close(fd)


def _start(
    relay: _SignalRelay,
    command: Sequence[str],
    stdout: IO[Any] | None,
    env: dict[str, str] | None,
    work: WorkProof | None,
    stderr: IO[Any] | None,
    record: RecordGroup | None,
) -> _Child:
    """Start CMD, its group recorded with ``record`` (if any) before it can run anything."""
    own_group = not _in_terminal_job()
    handshake = _GroupHandshake.begun(record) if own_group and record is not None else None
    if not own_group:
        _become_subreaper()  # CMD shares our group: its orphans must stay findable
        if record is not None and os.getpgrp() != os.getpid():
            # Race: lock run SIGKILLed once CMD runs leaves work that dropped the proof in
            # the terminal job's group, which a script (not we) leads: the judge's own-group
            # rule never sees it, so it is recorded first. Members older than us are not
            # CMD's work: the judge counts only those started since we did.
            record(os.getpgrp(), _leader_start(os.getpgrp()))
    passed = () if work is None or work.fd is None else (work.fd,)
    try:
        words, hook = _spawned_words(
            command, env, None if handshake is None else handshake.in_child()
        )
        # CMD leads a group of its own (signals reach all of it), except as a terminal's
        # foreground job; its proof of life goes with it and its children (pass_fds).
        child = subprocess.Popen(
            words,
            stdout=stdout,
            stderr=stderr,
            preexec_fn=hook,
            env=env,
            pass_fds=passed,
            process_group=0 if own_group else None,
        )
    except FileNotFoundError as error:
        raise CommandNotFoundError(error.errno, f"command not found: {command[0]}") from error
    except OSError as error:  # EACCES, EISDIR, ENOEXEC, ...: there, but not something to run
        why = (error.strerror or "cannot execute").lower()
        raise CommandNotExecutableError(
            error.errno, f"cannot execute {command[0]}: {why}"
        ) from error
    finally:
        if handshake is not None:
            handshake.close()
    if own_group and record is not None and handshake is None:
        record(child.pid, _start_of(child.pid))  # no thread for the handshake: late, as before
    if work is not None:
        work.close_ours()  # Race: from now on only CMD's tree holds the work's proof
    started = _Child(child, own_group=own_group)
    relay.started(started)
    return started
