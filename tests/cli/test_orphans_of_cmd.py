"""Work that escapes by composing two cases each covered alone (design/lockfile-hardening.md,
"What each way of holding proves"): GNU ``timeout`` moves its child to a group of its own but
keeps the proof; a Python ``subprocess`` child drops the proof (``close_fds``) but stays in its
parent's group. ``timeout`` around a Python program that starts a child gives a grandchild with
neither. ``lock run`` and ``lock work`` adopt CMD's orphans (a child subreaper), so that
grandchild is still their work: the lock stays held. Once they have ended, the judge cannot see
it (a known limit). Children synchronise through their output lines and stdin, never by sleeping.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

import pytest

from mahabharatha.owner import proof
from tests.cli._support import FEATURE, SYNC_TIMEOUT, cli_argv, lock_path, run_cli
from tests.cli.test_proof_of_life import (
    EX_TEMPFAIL,
    JOB,
    SECOND,
    alive,
    assert_nobody_else_gets_it,
    first_run,
    job_pid,
    jobs,  # noqa: F401  (a fixture)
    short_grace,  # noqa: F401  (a fixture)
    wait_gone,
)
from tests.cli.test_work_left_in_cmds_group import POPEN_THEN_EXIT
from tests.support.marks import needs_proc

pytestmark = [
    needs_proc,
    pytest.mark.skipif(not proof.supported(), reason="no open-file-description locks here"),
]

COMPOSED: Final = ('timeout 600 "$0" -c "$1" "$2"', sys.executable, POPEN_THEN_EXIT, JOB)
"""CMD: a shell running ``timeout`` (a group of its own) around the Python starter."""


def test_lock_run_keeps_the_lock_while_a_timeout_wrapped_python_child_works(
    tmp_path: Path,
    gsd: Path,
    spawn: Any,
    jobs: list[int],  # noqa: F811
) -> None:
    marker = tmp_path / "second"
    first = first_run(spawn, gsd, "sh", "-c", *COMPOSED)
    job = job_pid(first)
    jobs.append(job)
    assert os.getpgid(job) != first.pid  # it left every group lock run looks at
    assert first.proc.wait(timeout=SYNC_TIMEOUT) == 0
    assert alive(job), "the work was meant to outlive CMD"

    # The invariant: lock run never lets go while CMD's work still runs (its orphan is ours).
    # Failed on b3054c7: released at once, and this second run ran beside the work.
    assert "still runs" in first.stderr, first.stderr
    assert lock_path(gsd).exists(), "lock run released while its command's work still ran"
    blocked = run_cli(
        "lock", "run", FEATURE, "--gsd-dir", gsd, "--timeout", "0",
        "--", sys.executable, "-c", SECOND, marker,
        cwd=tmp_path,
    )  # fmt: skip
    assert blocked.returncode == EX_TEMPFAIL, blocked.stderr
    assert not marker.exists(), "a second holder ran beside the first one's work"


@pytest.mark.xfail(
    strict=True,
    reason="known limit (design/lockfile-hardening.md): once lock run has ended (SIGKILLed, "
    "or gone with its work left), a proof-less orphan outside CMD's group is no evidence the "
    "judge can see: --reclaim-dead runs a second holder beside it",
)
def test_a_killed_lock_run_is_not_dead_while_a_timeout_wrapped_python_child_works(
    tmp_path: Path,
    gsd: Path,
    spawn: Any,
    jobs: list[int],  # noqa: F811
) -> None:
    marker = tmp_path / "second"
    script = f"echo cmd $$; {COMPOSED[0]}; exec sleep 600"  # CMD lives on: lock run too
    first = first_run(spawn, gsd, "sh", "-c", script, *COMPOSED[1:])
    word, cmd = first.next_line().split()
    assert word == "cmd"
    job = job_pid(first)
    jobs.append(job)
    os.kill(first.pid, signal.SIGKILL)
    first.proc.wait(timeout=SYNC_TIMEOUT)
    wait_gone(int(cmd))  # CMD itself dies with lock run (the parent-death signal)
    assert alive(job)
    assert_nobody_else_gets_it(tmp_path, gsd, marker)


def test_lock_work_keeps_the_lock_while_a_timeout_wrapped_python_child_works(
    tmp_path: Path,
    gsd: Path,
    spawn: Any,
    jobs: list[int],  # noqa: F811
) -> None:
    (gsd / "specs" / FEATURE).mkdir(parents=True)
    worker = spawn(
        cli_argv("lock", "work", FEATURE, "--once", "--gsd-dir", gsd, "--", "sh", "-c", *COMPOSED),
        stdin=subprocess.PIPE,
    )
    job = job_pid(worker)
    jobs.append(job)
    worker.proc.wait(timeout=SYNC_TIMEOUT)
    assert alive(job), "the work was meant to outlive CMD"
    # Failed on b3054c7: marked done and released at once.
    assert lock_path(gsd).exists(), "lock work let go of the feature while its CMD's work ran"


def test_lock_work_counts_an_orphan_as_the_work_of_the_cmd_that_left_it_only(
    tmp_path: Path,
    gsd: Path,
    spawn: Any,
    jobs: list[int],  # noqa: F811
) -> None:
    """alpha's CMD leaves the composed work running, beta's leaves nothing: alpha is done with
    its lock kept for that work, beta is plainly done (the orphan alpha left, adopted before
    beta's CMD started, is none of beta's)."""
    for feature in ("alpha", "beta"):
        (gsd / "specs" / feature).mkdir(parents=True)
    only_alpha = f'case "$3" in alpha) {COMPOSED[0]};; esac'
    worker = spawn(
        cli_argv(
            *("lock", "work", "alpha", "beta", "--gsd-dir", gsd, "--"),
            *("sh", "-c", only_alpha, *COMPOSED[1:], "{}"),
        ),
        stdin=subprocess.PIPE,
    )
    jobs.append(job_pid(worker))
    assert worker.proc.wait(timeout=SYNC_TIMEOUT) == 0, worker.stderr
    said = worker.stderr
    assert "alpha: done (its work still runs outside its process group" in said, said
    assert "beta: done\n" in said, said
