"""Starting ``lock run``'s command: its words (through ``setpriv`` where that asks for the
parent-death signal), its environment (the token, the proof's descriptor), its process group,
and that group recorded with the lock before CMD can run anything (:func:`_group_handshake`)."""

from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from functools import cache, lru_cache
from typing import IO, Any, Final

from mahabharatha import signals
from mahabharatha.backends.base import LocalFolder
from mahabharatha.constants import PROOF_FD_ENV, SETPRIV_PROBE_SECONDS, TOKEN_ENV
from mahabharatha.locks import FeatureLock, LockError
from mahabharatha.owner import ownership
from mahabharatha.owner.proof import WorkProof


class CommandStartError(OSError, LockError):
    """The command could not be started; nothing ran (exit 126 or 127, as a shell would)."""


class CommandNotFoundError(CommandStartError, FileNotFoundError):
    """The command to run does not exist (exit 127, like a shell)."""


class CommandNotExecutableError(CommandStartError, PermissionError):
    """The command exists but cannot be executed (exit 126, like a shell)."""


PR_SET_PDEATHSIG, PR_SET_NAME, PR_SET_CHILD_SUBREAPER = 1, 15, 36  # <linux/prctl.h>
PARENT_DEATH_SIGNAL: Final = signal.SIGKILL  # CMD shares the fate of a lock run that dies


def _parent_death_hook(then: Callable[[], None] | None = None) -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux to kill the child when ``lock run`` dies, then calling
    ``then``. Fork safety: all resolved in the parent; the child makes system calls only."""
    prctl = _prctl()
    if prctl is None:
        return then
    parent = os.getpid()
    getpid, getppid, kill, signum = os.getpid, os.getppid, os.kill, int(PARENT_DEATH_SIGNAL)

    def die_with_parent() -> None:
        # It comes when the forking thread ends: run_locked forks from the thread that waits.
        prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
        # Race: lock run died between fork and prctl; we were re-parented and no signal comes.
        if getppid() != parent:
            kill(getpid(), signum)
        if then is not None:
            then()

    return die_with_parent


def _spawned_words(
    command: Sequence[str],
    env: Mapping[str, str] | None,
    handshake: Callable[[], None] | None = None,
) -> tuple[list[str], Callable[[], None] | None]:
    """The words and ``preexec_fn`` giving CMD the parent-death signal (without a handshake:
    ``setpriv --pdeathsig``, so Python may ``vfork``). Race: ``lock run`` killed before
    ``setpriv``'s ``prctl`` leaves CMD running; its proof keeps the lock."""
    wrapper = None if handshake is not None or _prctl() is None else _setpriv_with_pdeathsig()
    if wrapper is None:
        return list(command), _parent_death_hook(handshake)
    _check_can_start(command[0], env)
    return [wrapper, "--pdeathsig", PARENT_DEATH_SIGNAL.name[3:], "--", *command], None  # KILL


@cache
def _setpriv_with_pdeathsig() -> str | None:
    """util-linux's ``setpriv`` when it knows ``--pdeathsig`` (it then becomes CMD); asked once."""
    import shutil

    path = shutil.which("setpriv")
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
    """Raise ``Popen``'s ``FileNotFoundError`` or ``PermissionError`` for ``program``."""
    if os.sep in program:
        return _check_startable(program, program)
    search = (env if env is not None else os.environ).get("PATH", os.defpath)
    try:
        # A pool starts one program for every feature: PATH is searched once, the place rechecked.
        _check_startable(_found_on_path(program, search), program)
    except OSError:
        _found_on_path.cache_clear()  # moved or gone since: search again before saying so
        _check_startable(_found_on_path(program, search), program)


def _check_startable(path: str | None, program: str) -> None:
    try:
        mode = os.stat(path or "").st_mode  # "" (no path): not found
    except OSError:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program) from None
    if stat.S_ISDIR(mode) or not os.access(path or "", os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)


@lru_cache(maxsize=16)
def _found_on_path(program: str, search: str) -> str | None:
    """Where CMD's ``PATH`` ``search`` finds ``program``: an executable first, else the first
    entry of that name (which then fails with ``EACCES``, as ``execvp`` says)."""
    import shutil

    found = shutil.which(program, path=search)
    if found is not None:
        return found
    entries = (os.path.join(folder or os.curdir, program) for folder in search.split(os.pathsep))
    return next((entry for entry in entries if os.path.exists(entry)), None)


def _child_env(
    token: int | None, work: WorkProof | None, extra: Mapping[str, str] | None
) -> dict[str, str] | None:
    """Ours, plus ``extra``, the token and the proof's descriptor (None: nothing to add)."""
    added: dict[str, str] = dict(extra or {})
    if token is not None:
        added[TOKEN_ENV] = str(token)
    if work is not None and work.fd is not None:
        added[PROOF_FD_ENV] = str(work.fd)
    return {**os.environ, **added} if added else None


RecordGroup = Callable[[int, int | None], None]  # FeatureLock.record_work_group


def _group_handshake(record: RecordGroup) -> tuple[Callable[[], None], Callable[[], None]] | None:
    """CMD's group recorded with the lock before anything of CMD runs (the handshake of
    ``design/lockfile-hardening.md``): the child's ``preexec_fn`` and the close for after
    ``Popen``; ``None`` without a thread for ours."""
    (pid_read, pid_write), (go_read, go_write) = os.pipe(), os.pipe()

    def record_then_go() -> None:
        if (prctl := _prctl()) is not None:  # /proc/PID/task/TID/comm tells it from lasting ones
            prctl(PR_SET_NAME, b"lock-run-group", 0, 0, 0)
        said = os.read(pid_read, 4)  # one write of 4 bytes: a pipe gives it whole (PIPE_BUF)
        if len(said) < 4:
            return  # the child never got there (its start failed): nothing waits
        pid = int.from_bytes(said, "little")
        try:
            record(pid, ownership.start_time(pid))
        finally:
            with suppress(OSError):  # EPIPE: the child was killed meanwhile
                os.write(go_write, b"go")

    thread = threading.Thread(target=record_then_go, daemon=True)
    # The child's half, resolved here in the parent (fork safety: system calls only).
    close, write, read, getpid, kill = os.close, os.write, os.read, os.getpid, os.kill

    def wait_until_recorded() -> None:
        # Race: our copy of the writing end would hide lock run's death from the read.
        close(go_write)
        close(pid_read)
        write(pid_write, getpid().to_bytes(4, "little"))
        if not read(go_read, 1):  # lock run died before recording: CMD must never run
            kill(getpid(), signal.SIGKILL)

    def end() -> None:  # after Popen returned or raised: end the thread, close the pipes
        close(pid_write)
        if thread.ident is not None:  # started
            thread.join()
        for fd in (pid_read, go_read, go_write):
            close(fd)

    try:
        signals.start_without_signals(thread)
    except RuntimeError:  # "can't start new thread": the group is recorded late
        end()
        return None
    return wait_until_recorded, end


def start_command(
    lock: FeatureLock,
    command: Sequence[str],
    outputs: tuple[IO[Any] | None, IO[Any] | None],
    work: WorkProof | None,
    extra_env: Mapping[str, str] | None,
) -> tuple[subprocess.Popen[bytes], bool]:
    """Start CMD under ``lock``, its group recorded before it runs anything; CMD and whether it
    leads its own group. ``outputs``: its stdout and stderr (``None``: ours)."""
    env = _child_env(lock.token, work, extra_env)
    # Where CMD's group goes: nowhere for a backend that records none (no handshake then).
    record = lock.record_work_group if isinstance(lock.backend, LocalFolder) else None
    own_group = not _in_terminal_job()
    handshake = _group_handshake(record) if own_group and record is not None else None
    if not own_group:
        adopt_orphans()  # CMD shares our group: its orphans are ours
    if not own_group and record is not None and os.getpgrp() != os.getpid():
        # Race: lock run SIGKILLed leaves proof-less work in a job's group a script leads;
        # recorded first, the judge counts its members started since we did.
        record(os.getpgrp(), ownership.start_time(os.getpgrp(), leading=True))
    passed = () if work is None or work.fd is None else (work.fd,)
    try:
        words, hook = _spawned_words(command, env, None if handshake is None else handshake[0])
        # CMD leads a group of its own (signals reach all of it), except as a terminal's
        # foreground job; its proof of life goes with it and its children (pass_fds).
        child = subprocess.Popen(
            words,
            stdout=outputs[0],
            stderr=outputs[1],
            preexec_fn=hook,
            env=env,
            pass_fds=passed,
            process_group=0 if own_group else None,
        )
    except FileNotFoundError as error:
        raise CommandNotFoundError(error.errno, f"command not found: {command[0]}") from error
    except OSError as error:  # EACCES, EISDIR, ENOEXEC, ...: there, but not something to run
        why = f"cannot execute {command[0]}: {(error.strerror or 'cannot execute').lower()}"
        raise CommandNotExecutableError(error.errno, why) from error
    finally:
        if handshake is not None:
            handshake[1]()
    if own_group and record is not None and handshake is None:
        record(child.pid, ownership.start_time(child.pid))  # no thread for the handshake: late
    if work is not None:
        work.close_ours()  # Race: from now on only CMD's tree holds the work's proof
    return child, own_group


@cache
def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl`` (Linux), looked up once per process; None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


def adopt_orphans() -> None:
    """Become the subreaper of what we start (Linux): CMD's orphans stay our descendants,
    whatever group or session they moved to."""
    if (prctl := _prctl()) is not None:
        prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _in_terminal_job() -> bool:
    """Is ``lock run`` a job of its controlling terminal? CMD then shares its group. Race: CMD
    stopped for ever by a background read in a group of its own, out of reach of ``fg``."""
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        with suppress(OSError, ValueError, AttributeError):  # None, no descriptor, closed
            if os.isatty(fd := stream.fileno()) and os.tcgetpgrp(fd) > 0:  # ENOTTY: not ours
                return True
    return False
