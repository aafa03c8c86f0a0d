"""Findings of the hostile hunt for a pool feature run twice or a pool that ends too early
(brief wt-hunt). Each test states the promise (contract, "Worker pools"), fails today, and is
marked ``xfail(strict=True)`` with the cause, so that the fix turns it into an XPASS: then drop
the mark.

Races are hit deterministically: the worker under test runs the real CLI in a child process
whose ``python`` loads a hook that pauses it at the racy point (a pipe handshake), and the test
makes the other process act in that window. The hook changes no behaviour, only timing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pytest

from tests.cli._support import RUN_TIMEOUT, SYNC_TIMEOUT
from tests.support.postgres import PgServer

CLI = (sys.executable, "-m", "mahabharatha")


@contextmanager
def hooked_cli(
    hook: str, args: list[str], cwd: Path, env: dict[str, str]
) -> Iterator[tuple[subprocess.Popen[str], IO[bytes], int]]:
    """``python -m mahabharatha ARGS`` with ``hook`` run first; yields the process, the stream
    on which it says ``paused`` and the descriptor on which the test writes ``go``."""
    paused_r, paused_w = os.pipe()
    go_r, go_w = os.pipe()
    (cwd / "hunt_hook.py").write_text(hook)
    code = textwrap.dedent(
        """
        import runpy, sys
        sys.path.insert(0, sys.argv.pop(1))
        import hunt_hook  # noqa: F401
        runpy.run_module("mahabharatha", run_name="__main__", alter_sys=True)
        """
    )
    child_env = {**env, "HUNT_PAUSED_FD": str(paused_w), "HUNT_GO_FD": str(go_r)}
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


def _lines_until(stream: IO[str], wanted: str) -> str:
    seen = ""
    for line in stream:
        seen += line
        if wanted in line:
            return seen
    raise AssertionError(f"never said {wanted!r}: {seen}")


@pytest.fixture
def pg_env(pg_server: PgServer, namespace: str) -> dict[str, str]:
    return {
        **os.environ,
        "MAHABHARATHA_LOCK_URL": pg_server.url(),
        "MAHABHARATHA_LOCK_NAMESPACE": namespace,
    }


@pytest.fixture
def namespace() -> str:
    import uuid

    return f"hunt-{uuid.uuid4().hex[:12]}"


def _state_of(feature: str, cwd: Path, env: dict[str, str]) -> Any:
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


def _wait_for_line(path: Path, proc: subprocess.Popen[str]) -> None:
    """Until ``path`` has a line (CMD wrote it and is ending), or ``proc`` ended."""
    import time

    deadline = time.monotonic() + SYNC_TIMEOUT
    while not (path.exists() and path.read_text().endswith("\n")):
        assert proc.poll() is None or path.exists(), "the worker ended before CMD wrote"
        assert time.monotonic() < deadline, "CMD never wrote its line"
        time.sleep(0.01)


HOOK_FIRST_FILES_RELEASE = """
import os
from mahabharatha.backends.files import lockfile

_release_mine = lockfile.release_mine


def release_mine(*args, **kwargs):
    # The done's second step (the release), its marker published: say so, then wait to die.
    os.write(int(os.environ["HUNT_PAUSED_FD"]), b"paused\\n")
    os.read(int(os.environ["HUNT_GO_FD"]), 1)
    return _release_mine(*args, **kwargs)


lockfile.release_mine = release_mine
"""


def test_files_a_worker_killed_between_its_done_marker_and_release_is_not_run_again(
    tmp_path: Path,
) -> None:
    """Sound (a regression test, not a finding): the done's two steps on files, crossed by a
    `--reclaim-dead` worker. W's CMD succeeded and W published `.completed`; W is SIGKILLed
    before its release. The next worker (--reclaim-dead) sees the marker before it tries the
    dead holder's lock (pool/claim.py _Pool._finished): CMD is not run again, the pool ends 0.
    Fails if the done released before publishing its marker (the hook's look at .completed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAHABHARATHA_LOCK")}
    (tmp_path / ".gsd" / "specs" / "A").mkdir(parents=True)
    step = ["sh", "-c", 'echo "$0" >> runs.log', "{}"]
    with hooked_cli(
        HOOK_FIRST_FILES_RELEASE, ["lock", "work", "A", "--", *step], tmp_path, env
    ) as (
        worker,
        paused,
        _go,
    ):
        assert paused.readline() == b"paused\n"
        assert (tmp_path / ".gsd" / "specs" / "A" / ".completed").exists()
        worker.kill()
        worker.communicate(timeout=RUN_TIMEOUT)
    again = subprocess.run(
        [*CLI, "lock", "work", "A", "--reclaim-dead", "--", *step],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "runs.log").read_text().split() == ["A"]
    # Still marked done (its dead worker's lock is left for `lock clean`: status shows it
    # reclaimable, not done, until then).
    assert (tmp_path / ".gsd" / "specs" / "A" / ".completed").exists()


ESCAPING_STEP = (
    "setsid sh -c 'echo in >> occupancy; read line < gate; echo out >> occupancy' "
    "</dev/null >/dev/null 2>&1 & "
    "echo started; wait"
)
"""CMD starts work in a session of its own (``setsid``: one of the ways work leaves CMD that the
contract lists) and ends when that work does: the work stays until the test opens the gate."""


SECOND_STEP = ("sh", "-c", "echo in2 >> occupancy; echo out2 >> occupancy")


@pytest.mark.parametrize(
    "backend",
    [
        "files",
        pytest.param(
            "postgresql",
            marks=[
                pytest.mark.postgres,
                pytest.mark.xfail(
                    strict=True,
                    reason=(
                        "PostgreSQL records no proof of life (design/lockfile-hardening.md "
                        "'PostgreSQL records none'): --reclaim-dead judges only the SIGKILLed "
                        "lock work's own group and session, so work CMD started with setsid "
                        "(still running) is not seen and a second worker runs the feature "
                        "beside it; files wait for it (the proof). The contract's PostgreSQL "
                        "--reclaim-dead sentence (owner gone) allows it by the letter, and the "
                        "60 s lease would give it away anyway: a gap to decide, not a slip"
                    ),
                ),
            ],
        ),
    ],
)
def test_a_killed_workers_escaped_work_keeps_its_feature_from_a_reclaim_dead_worker(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> None:
    """Never two workers on one feature: worker W (its own session, as a shell job) runs CMD,
    whose work left with ``setsid``; W is SIGKILLed (CMD dies with it, the work does not). A
    ``--reclaim-dead --wait 3`` worker must not run the feature while that work runs (75, the
    occupancy file holding only the work's ``in``)."""
    if backend == "files":
        env = {k: v for k, v in os.environ.items() if not k.startswith("MAHABHARATHA_LOCK")}
    else:
        env = request.getfixturevalue("pg_env")
    (tmp_path / ".gsd" / "specs" / "A").mkdir(parents=True)
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    occupancy = tmp_path / "occupancy"
    worker = subprocess.Popen(
        [*CLI, "lock", "work", "A", "--", "sh", "-c", ESCAPING_STEP],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert worker.stdout is not None
        _lines_until(worker.stdout, "started")
        _wait_for_line(occupancy, worker)  # the escaped work runs
        worker.kill()
        worker.communicate(timeout=RUN_TIMEOUT)
        second = subprocess.run(
            [*CLI, "lock", "work", "A", "--reclaim-dead", "--wait", "3", "--", *SECOND_STEP],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
        )
        seen = occupancy.read_text().split()
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.communicate()
        try:  # let the escaped work end (ENXIO: it is gone already)
            opened = os.open(gate, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            pass
        else:
            os.write(opened, b"go\n")
            os.close(opened)
    assert (second.returncode, seen) == (75, ["in"]), (second.returncode, seen, second.stderr)
