"""The real CLI in a child process, paused at a racy point by a hook (a pipe handshake) so that
a test makes another process act in that window; and what such tests read back. The hook
changes no behaviour, only timing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from tests.cli._support import RUN_TIMEOUT, SYNC_TIMEOUT

CLI = (sys.executable, "-m", "mahabharatha")


@contextmanager
def cli_job(
    args: list[str], cwd: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[str]]:
    """``python -m mahabharatha ARGS`` in a session of its own (a shell job), its three streams
    piped; at the end its whole session is killed if it still runs, and it is reaped."""
    job = subprocess.Popen(
        [*CLI, *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        yield job
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.communicate()


@contextmanager
def hooked_cli(
    hook: str, args: list[str], cwd: Path, env: dict[str, str]
) -> Iterator[tuple[subprocess.Popen[str], IO[bytes], int]]:
    """``python -m mahabharatha ARGS`` with ``hook`` run first; yields the process, the stream
    on which it says ``paused`` and the descriptor on which the test writes ``go``."""
    paused_r, paused_w = os.pipe()
    go_r, go_w = os.pipe()
    (cwd / "cli_hook.py").write_text(hook)
    code = textwrap.dedent(
        """
        import runpy, sys
        sys.path.insert(0, sys.argv.pop(1))
        import cli_hook  # noqa: F401
        runpy.run_module("mahabharatha", run_name="__main__", alter_sys=True)
        """
    )
    child_env = {**env, "HOOK_PAUSED_FD": str(paused_w), "HOOK_GO_FD": str(go_r)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(cwd), *args],
        cwd=cwd,
        env=child_env,
        pass_fds=(paused_w, go_r),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(paused_w)
    os.close(go_r)
    paused = os.fdopen(paused_r, "rb")
    try:
        yield proc, paused, go_w
    finally:
        os.close(go_w)
        paused.close()
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=RUN_TIMEOUT)


def lines_until(stream: IO[str], wanted: str) -> str:
    """What ``stream`` said up to and with the first line holding ``wanted``."""
    seen = ""
    for line in stream:
        seen += line
        if wanted in line:
            return seen
    raise AssertionError(f"never said {wanted!r}: {seen}")


def state_of(feature: str, cwd: Path, env: dict[str, str]) -> Any:
    """``feature``'s state as ``lock status --all --json`` shows it (``None``: not listed)."""
    shown = subprocess.run(
        [*CLI, "lock", "status", "--all", "--json"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    listed = json.loads(shown.stdout)["features"]
    return {entry["feature"]: entry["state"] for entry in listed}.get(feature)


def wait_for_line(path: Path, proc: subprocess.Popen[str]) -> None:
    """Until ``path`` has a line (CMD wrote it and is ending), or ``proc`` ended."""
    deadline = time.monotonic() + SYNC_TIMEOUT
    while not (path.exists() and path.read_text().endswith("\n")):
        assert proc.poll() is None or path.exists(), "the worker ended before CMD wrote"
        assert time.monotonic() < deadline, "CMD never wrote its line"
        time.sleep(0.01)
