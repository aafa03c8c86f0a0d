"""What the CLI tests share: an in-process runner, real child processes, lock files on disk.

In-process tests drive ``mahabharatha.cli.app`` through Typer's ``CliRunner``; process tests run
``python -m mahabharatha`` with the test's temporary folder as working directory. Either way no
output may ever contain a traceback. Children are synchronised through their output lines (read
with a deadline, never by sleeping) and always reaped, their whole process group included.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, Final

from typer.main import get_command
from typer.testing import CliRunner, Result

from mahabharatha.cli import app
from tests.support.owner_details import attach, details_for

FEATURE: Final = "auth-flow"

SYNC_TIMEOUT: Final = 15.0
"""Longest wait for a child's handshake line: a stuck child fails the test instead of hanging it."""

RUN_TIMEOUT: Final = 20.0
"""Longest a single CLI subprocess may take."""

STATUS_KEYS: Final = frozenset(
    {
        "feature",
        "state",
        "pid",
        "timestamp",
        "age_seconds",
        "expires_in_seconds",
        "owner",
        "host",  # the holder's host and fencing token: null on files (PostgreSQL has them)
        "token",
        "reclaimable",  # held, but its owner is provably gone here: --reclaim-dead takes it
    }
)
"""The keys of one lock as ``lock status --json`` and ``lock check --json`` print it."""

STALE_AFTER_SECONDS: Final = 7200.0


# --------------------------------------------------------------------------- lock files


def lock_path(gsd: Path, feature: str = FEATURE) -> Path:
    return gsd / "specs" / feature / ".lock"


def write_lock(
    gsd: Path,
    feature: str = FEATURE,
    content: str | None = None,
    *,
    details: bytes | None = None,
    **record: Any,
) -> Path:
    """Put ``content`` (or the record ``pid:timestamp``) at the feature's lock path.

    A record gets the owner details this package would publish for its pid (or ``details``),
    as a lock of this package has them; ``content`` is an older writer's and has none.
    """
    path = lock_path(gsd, feature)
    path.parent.mkdir(parents=True, exist_ok=True)
    if content is None:
        path.write_text(f"{record['pid']}:{record['timestamp']}")
        attach(path, details or details_for(record["pid"]))
    else:
        path.write_text(content)
    return path


def read_record(path: Path) -> tuple[int, float]:
    pid, timestamp = path.read_text().strip().split(":")
    return int(pid), float(timestamp)


def audit_lines(gsd: Path) -> list[dict[str, Any]]:
    """The audit log, each line parsed (a line that is not one JSON object fails the test)."""
    log = gsd / "lock-audit.jsonl"
    if not log.exists():
        return []
    lines = log.read_text().splitlines()
    parsed = [json.loads(line) for line in lines]
    assert all(isinstance(entry, dict) for entry in parsed), lines
    return parsed


def dead_pid() -> int:
    """The pid of a child that has exited and been reaped: no process has it (for a while)."""
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=True,
    )
    return int(child.stdout)


def lock_of_a_dead_process(gsd: Path, feature: str = FEATURE) -> None:
    """A fresh lock taken through the package by a process (in a group of its own) that has
    then exited: provably gone on this host, whatever owner details the lock carries."""
    code = f"from mahabharatha import locks; locks.acquire({feature!r}, {str(gsd)!r})"
    subprocess.run(
        [sys.executable, "-c", code], check=True, timeout=RUN_TIMEOUT, start_new_session=True
    )


# --------------------------------------------------------------------------- in process


def assert_no_traceback(*outputs: str | None) -> None:
    for output in outputs:
        assert "Traceback" not in (output or ""), output


def invoke(*args: object, env: dict[str, str] | None = None) -> Result:
    """Run the app in-process; an exception escaping a command fails the test."""
    result = CliRunner().invoke(app, [str(arg) for arg in args], env=env)
    assert_no_traceback(result.stdout, result.stderr)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"the command raised {result.exception!r}") from result.exception
    return result


def one_document(output: str) -> Any:
    """stdout with ``--json``: exactly one JSON document (``json.loads`` refuses extra data)."""
    return json.loads(output)


def one_sentence(stderr: str) -> str:
    """An error is one clear line on stderr."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got: {stderr!r}"
    return lines[0]


# --------------------------------------------------------------------------- real processes


def cli_argv(*args: object) -> list[str]:
    return [sys.executable, "-m", "mahabharatha", *(str(arg) for arg in args)]


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MAHABHARATHA_FEATURE", None)
    return env


def run_cli(
    *args: object, cwd: Path, timeout: float = RUN_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    """One CLI call as its own process (its parent, the default owner, is this test)."""
    done = subprocess.run(
        cli_argv(*args),
        cwd=cwd,
        env=child_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,  # subprocess.run kills and reaps the child when it runs over
    )
    assert_no_traceback(done.stdout, done.stderr)
    return done


UNSHARE_PID: Final = ("unshare", "--pid", "--fork", "--mount-proc")
"""Run a command as pid 1 of a new PID namespace (with its own ``/proc``)."""

HOLD_CMD: Final = "import sys; print('ready', flush=True); sys.stdin.read(1)"
"""A command that says it runs, then holds on until a byte arrives on its stdin."""


def run_in_new_pid_namespace(*argv: object, cwd: Path) -> subprocess.CompletedProcess[str]:
    """One command as pid 1 of a PID namespace of its own, run to its end."""
    done = subprocess.run(
        [*UNSHARE_PID, *(str(arg) for arg in argv)],
        cwd=cwd,
        env=child_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,  # subprocess.run kills and reaps the child when it runs over
        check=False,
    )
    assert_no_traceback(done.stdout, done.stderr)
    return done


def run_cli_in_new_pid_namespace(*args: object, cwd: Path) -> subprocess.CompletedProcess[str]:
    """One CLI call as pid 1 of a PID namespace of its own."""
    return run_in_new_pid_namespace(*cli_argv(*args), cwd=cwd)


_EOF: Final = object()


class Child:
    """A running child whose stdout and stderr lines can be awaited with a deadline."""

    def __init__(self, argv: Sequence[str], cwd: Path, *, stdin: int = subprocess.DEVNULL) -> None:
        self.proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=child_env(),
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own group: teardown can reap what it started too
        )
        self.pid = self.proc.pid
        self._lines: dict[str, queue.Queue[object]] = {}
        self._seen: dict[str, list[str]] = {}
        self._readers = [self._reader("stdout"), self._reader("stderr")]

    def _reader(self, name: str) -> threading.Thread:
        stream = getattr(self.proc, name)
        lines: queue.Queue[object] = queue.Queue()
        seen: list[str] = []
        self._lines[name], self._seen[name] = lines, seen

        def pump() -> None:
            for raw in stream:
                line = raw.decode("utf-8", "replace")
                seen.append(line)
                lines.put(line)
            lines.put(_EOF)

        thread = threading.Thread(target=pump, daemon=True)
        thread.start()
        return thread

    def next_line(self, stream: str = "stdout", timeout: float = SYNC_TIMEOUT) -> str:
        """The next line the child prints (the handshake); fails rather than waits for ever."""
        try:
            line = self._lines[stream].get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line on {stream} within {timeout}s: {self._seen}") from None
        if line is _EOF:
            raise AssertionError(f"{stream} closed before the expected line: {self._seen}")
        assert isinstance(line, str)
        return line.rstrip("\n")

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode())
        self.proc.stdin.flush()

    def wait(self, timeout: float = RUN_TIMEOUT) -> int:
        code = self.proc.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(timeout=SYNC_TIMEOUT)
        assert_no_traceback(self.stdout, self.stderr)
        return code

    @property
    def stdout(self) -> str:
        return "".join(self._seen["stdout"])

    @property
    def stderr(self) -> str:
        return "".join(self._seen["stderr"])

    def reap(self) -> None:
        """Kill the child's whole group if anything is left of it, wait, close the pipes."""
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=SYNC_TIMEOUT)
        for reader in self._readers:
            reader.join(timeout=SYNC_TIMEOUT)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def wait_for(predicate: Any, timeout: float = SYNC_TIMEOUT, what: str = "condition") -> None:
    """Poll ``predicate`` until true; for observing a change that has no handshake of its own."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.005)


def every_command() -> list[tuple[tuple[str, ...], Any]]:
    """Every command of the CLI as (its words, its click command), in name order: a command
    added later is walked too."""

    def walk(group: Any, prefix: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
        for name, command in sorted(group.commands.items()):
            if hasattr(command, "commands"):
                yield from walk(command, (*prefix, name))
            else:
                yield (*prefix, name), command

    return list(walk(get_command(app), ()))
