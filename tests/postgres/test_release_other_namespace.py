"""PostgreSQL: release and done by pid leave a lock whose owner details show another PID
namespace (the same pid number in a container on this host) or another start time (a dead
owner's, its number reused); rows without details keep the pid and host rule; ``--force``
removes anything. The judgement is part of the statement that removes the lock.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mahabharatha.backends.base import NotOwnerError, Requester
from mahabharatha.owner import ownership
from tests.support.marks import needs_pid_namespaces, needs_proc
from tests.support.owner_details import details_for
from tests.support.postgres import PgServer

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT = 60.0


def _cli(*args: object, cwd: Path, unshare: bool = False) -> subprocess.CompletedProcess[str]:
    """One CLI call (as pid 1 of a new PID namespace with ``unshare``), run to its end."""
    prefix = ["unshare", "--pid", "--fork", "--mount-proc"] if unshare else []
    done = subprocess.run(
        [*prefix, sys.executable, "-m", "mahabharatha", *(str(arg) for arg in args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.DEVNULL,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    assert "Traceback" not in done.stdout + done.stderr, done
    return done


@needs_proc
@needs_pid_namespaces
def test_release_by_the_same_pid_number_elsewhere_leaves_the_row(
    pg_server: PgServer, namespace: str, tmp_path: Path
) -> None:
    """``lock acquire --pid 1`` as pid 1 of its own PID namespace; on the host (same host
    name) ``release --pid 1`` and ``done --pid 1`` exit 1 and the lock stays held; a third
    acquire fails; ``--force`` removes it.

    Fails before the fix: ``release --pid 1`` exited 0 (pid and host matched) and the third
    acquire won."""
    opts = ("--backend", pg_server.url(), "--namespace", namespace)
    taken = _cli("lock", "acquire", "feat", "--pid", 1, *opts, cwd=tmp_path, unshare=True)
    assert taken.returncode == 0, taken.stderr
    released = _cli("lock", "release", "feat", "--pid", 1, *opts, cwd=tmp_path)
    assert released.returncode == 1 and "locked by pid 1" in released.stderr, released.stderr
    done = _cli("lock", "done", "feat", "--pid", 1, *opts, cwd=tmp_path)
    assert done.returncode == 1 and "locked by pid 1" in done.stderr, done.stderr
    third = _cli("lock", "acquire", "feat", *opts, cwd=tmp_path)
    assert third.returncode == 1, "a second holder"
    forced = _cli("lock", "release", "feat", "--pid", 1, "--force", *opts, cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert _cli("lock", "check", "feat", *opts, cwd=tmp_path).returncode == 0  # free


@needs_proc
@pytest.mark.parametrize("other", ["namespace", "start"])
def test_details_that_are_not_this_pid_keep_the_row(backend: Any, other: str) -> None:
    """A row of this process's pid whose details name another PID namespace, or another start
    time: release and done by this pid raise ``NotOwnerError`` and the row stays held.

    Fails before the fix: both removed it (pid and host matched)."""
    pid = os.getpid()
    here, stat = ownership.this_pid_namespace(), ownership.proc_stat(pid)
    assert here is not None and stat is not None
    change = {"ns": here + 1} if other == "namespace" else {"start": stat.start + 1}
    assert backend.try_acquire("feat", Requester(pid, details_for(pid, **change))).held
    with pytest.raises(NotOwnerError):
        backend.release("feat", pid)
    with pytest.raises(NotOwnerError):
        backend.done("feat", pid)
    assert backend.inspect("feat").pid == pid
    assert not backend.is_done("feat")


def test_rows_without_details_keep_the_pid_rule(backend: Any) -> None:
    """No details (an older client): the pid and the host decide, as before the fix; this
    process's own details match. Passes before and after the fix (it guards the old rule)."""
    pid = os.getpid()
    assert backend.try_acquire("feat", Requester(pid)).held
    assert backend.release("feat", pid) is True
    assert backend.try_acquire("feat", Requester(pid, ownership.details_of(pid))).held
    assert backend.done("feat", pid)
