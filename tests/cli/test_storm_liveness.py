"""Liveness answers the judgement storm found wrong (never two holders, but a wrong answer or a
lock left behind), with real processes.

* "already held by you" is said only of a lock whose owner details show the caller's boot and
  PID namespace: the same pid number in another namespace (a container) is someone else.

Children synchronise through their output lines and stdin, never by sleeping, and are reaped.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

from mahabharatha.exits import EXIT_TEMPFAIL
from tests.cli._support import (
    FEATURE,
    RUN_TIMEOUT,
    assert_no_traceback,
    child_env,
    cli_argv,
    lock_path,
    read_record,
    run_cli,
    write_lock,
)
from tests.support.marks import needs_pid_namespaces, needs_proc

PY: Final = sys.executable
HOLD_CMD: Final = "import sys; print('ready', flush=True); sys.stdin.read(1)"
"""A command that says it runs, then holds on until a byte arrives on its stdin."""


def _in_new_pid_namespace(*args: object, cwd: Path) -> subprocess.CompletedProcess[str]:
    """One CLI call as pid 1 of a PID namespace of its own."""
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", *cli_argv(*args)],
        cwd=cwd,
        env=child_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    assert_no_traceback(done.stdout, done.stderr)
    return done


# --------------------------------------------------------------------------- held by you


@needs_proc
@needs_pid_namespaces
def test_pid_1_of_another_namespace_is_not_you(tmp_path: Path, gsd: Path, spawn: Any) -> None:
    """A ``lock run`` in one PID namespace (pid 1 there) holds the lock; a ``lock run`` in
    another namespace (pid 1 there too) and an ``acquire --pid 1`` on the host (the host's
    init) get the ordinary busy answer, not "already held by you".

    Fails before the fix: both were told "already held by you (pid 1)" (exit 1 at once; the
    runner did not even wait), because the caller check compared bare pids."""
    holder = spawn(
        ["unshare", "--pid", "--fork", "--mount-proc",
         *cli_argv("lock", "run", FEATURE, "--gsd-dir", gsd, "--", PY, "-c", HOLD_CMD)],
        stdin=subprocess.PIPE,
    )  # fmt: skip
    assert holder.next_line() == "ready"
    assert read_record(lock_path(gsd))[0] == 1, "the namespace runner is pid 1 there"
    try:
        runner = _in_new_pid_namespace(
            *("lock", "run", FEATURE, "--gsd-dir", gsd, "--timeout", "0"),
            *("--", PY, "-c", "print('ran')"),
            cwd=tmp_path,
        )
        host = run_cli("lock", "acquire", FEATURE, "--gsd-dir", gsd, "--pid", "1", cwd=tmp_path)
    finally:
        holder.send("x")
        assert holder.wait() == 0, holder.stderr
    assert "already held by you" not in runner.stderr + host.stderr, (runner, host)
    assert runner.returncode == EXIT_TEMPFAIL, runner.stderr  # busy: "try again later"
    assert "locked by pid 1" in runner.stderr and "not run" in runner.stderr, runner.stderr
    assert "ran" not in runner.stdout
    assert host.returncode == 1 and "locked by pid 1" in host.stderr, host.stderr
    assert not lock_path(gsd).exists(), "the holder released its lock"


def test_a_lock_without_owner_details_is_never_called_yours(tmp_path: Path, gsd: Path) -> None:
    """A lock with the caller's pid but no owner details (an older writer, a shell, a file
    system without extended attributes) may be another namespace's: the usual busy answer.

    Fails before the fix: "already held by you" (the pid alone decided)."""
    write_lock(gsd, content=f"{os.getpid()}:{time.time()}")  # content: no details
    done = run_cli("lock", "acquire", FEATURE, "--gsd-dir", gsd, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "already held by you" not in done.stderr
    assert f"locked by pid {os.getpid()}" in done.stderr, done.stderr
