"""The README's shell worker loop, taken from README.md and run as written by real bash workers.

Four workers share eight features; a build step records every run. The loop must end, build
every feature exactly once and leave no lock; a build that always fails is tried exactly
``--attempts`` times (``lock fail``) and is left failed. In the second test one
worker's shell is killed with SIGKILL in the middle of a build: the others wait for it
(``claim --wait``), finish the batch with ``claim --reclaim-dead``, and that feature is built
again exactly once (plus the killed, partial run).

Synchronisation is by pipes, a FIFO and a ``flock`` gate, never by sleeping: the victim's build
step tells the test which shell runs it through the FIFO, then blocks reading a pipe; the other
build steps wait on the gate, which the test holds until the victim's shell is dead and its
build step has exited (a SIGKILLed shell leaves its build step running; until that ends, the
worker's process group, and so its lock's owner, is still alive).
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import signal
import stat
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Final

import pytest

from tests.cli._support import SYNC_TIMEOUT
from tests.support.marks import needs_fifo, posix_signals

README: Final = Path(__file__).resolve().parents[2] / "README.md"
WORKERS: Final = 4
FEATURES: Final = [f"feat-{i:02d}" for i in range(1, 9)]
"""Two features for each worker: enough for every worker to claim after another's
done or fail (a feature built twice, or a loop that never ends, shows at any size)."""
VICTIM: Final = FEATURES[0]  # claim goes by name: the first claim of the pool takes it
POOL_TIMEOUT: Final = 60.0
"""Hang guard for the whole pool (it takes a few seconds)."""

BUILD_STEP: Final = r"""#!/usr/bin/env bash
# Records each run in runs.log. The victim's first run reports its worker shell, then blocks.
set -u
feature=$1
if [ "$feature" = "${VICTIM:-}" ] && mkdir "$POOL/victim" 2>/dev/null; then
    echo "partial $feature" >> "$POOL/runs.log"
    exec 9>"$POOL/exited.fifo"       # held until this process exits: the test sees EOF then
    echo "$PPID" >&9                 # the worker shell that runs us
    read -r _ <&"$GO_FD"             # blocks until the test has killed that shell
    exit 1
fi
if [ -n "${GATE:-}" ]; then flock -s "$GATE" true; fi
if [ "$feature" = "${BROKEN:-}" ]; then
    echo "broken $feature" >> "$POOL/runs.log"
    exit 2
fi
echo "built $feature" >> "$POOL/runs.log"
"""


def readme_worker_loop() -> str:
    """The first bash block of the README's "In a pool of workers" section, as written."""
    text = README.read_text()
    section = text[text.index("## In a pool of workers") :]
    match = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert match is not None, "the README lost its worker loop"
    loop = match.group(1)
    assert "lock claim" in loop and "lock done" in loop and "lock fail" in loop
    assert "--wait" in loop, "the loop waits for held features instead of leaving"
    return loop


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@pytest.fixture
def pool(tmp_path: Path) -> Path:
    """A working folder with the feature folders, the build step, the README's worker script
    and a ``mahabharatha`` on PATH that runs this checkout."""
    for name in FEATURES:
        (tmp_path / ".gsd" / "specs" / name).mkdir(parents=True)
    _executable(tmp_path / "build-feature.sh", BUILD_STEP)
    _executable(tmp_path / "worker.sh", readme_worker_loop())
    (tmp_path / "bin").mkdir()
    # exec: the shim becomes the CLI, so the CLI's parent is still the worker's shell.
    _executable(
        tmp_path / "bin" / "mahabharatha",
        f'#!/bin/sh\nexec "{sys.executable}" -m mahabharatha "$@"\n',
    )
    (tmp_path / "runs.log").touch()
    return tmp_path


@contextmanager
def workers(
    pool: Path, env: dict[str, str], pass_fds: tuple[int, ...] = ()
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Start the workers, each in its own session (``setsid``, as the README says); on the way
    out kill and reap whatever is left of their groups."""
    full_env = {
        **os.environ,
        "PATH": f"{pool / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "POOL": str(pool),
        **env,
    }
    full_env.pop("MAHABHARATHA_FEATURE", None)
    team = [
        subprocess.Popen(
            ["bash", str(pool / "worker.sh")],
            cwd=pool,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            pass_fds=pass_fds,
        )
        for _ in range(WORKERS)
    ]
    try:
        yield team
    finally:
        for worker in team:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()


def wait_all(team: list[subprocess.Popen[bytes]]) -> list[int | None]:
    deadline = time.monotonic() + POOL_TIMEOUT
    codes: list[int | None] = []
    for worker in team:
        try:
            codes.append(worker.wait(timeout=max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append(None)  # the loop never ended
    return codes


def runs(pool: Path) -> Counter[str]:
    return Counter(pool.joinpath("runs.log").read_text().splitlines())


def leftover_locks(pool: Path) -> list[str]:
    return sorted(p.parent.name for p in (pool / ".gsd" / "specs").glob("*/.lock"))


def read_with_deadline(fd: int) -> bytes:
    """One read from a FIFO or pipe, failing the test rather than hanging it."""
    ready, _, _ = select.select([fd], [], [], SYNC_TIMEOUT)
    assert ready, f"nothing to read within {SYNC_TIMEOUT}s"
    return os.read(fd, 4096)


def test_readme_loop_builds_every_feature_once_and_ends(pool: Path) -> None:
    """Fails before the fix: the README's loop (claim, build, release) never ended, building
    the first features hundreds of times and never reaching the others."""
    with workers(pool, {}) as team:
        codes = wait_all(team)
    assert codes == [0] * WORKERS, codes
    assert runs(pool) == Counter(f"built {name}" for name in FEATURES)
    assert leftover_locks(pool) == []
    assert all((pool / ".gsd" / "specs" / name / ".completed").is_file() for name in FEATURES)


@needs_fifo
@posix_signals
def test_readme_loop_rebuilds_a_killed_workers_feature_once(pool: Path) -> None:
    """A worker shell SIGKILLed mid-build: the others take its feature over with
    ``claim --reclaim-dead`` and build it once; everything else is built once; the loop ends.
    Fails before the fix: the README's loop did not reclaim a dead worker's feature (its lock
    stayed for two hours) and never ended anyway."""
    os.mkfifo(pool / "exited.fifo")
    # Opened before any writer, non-blocking: the victim's open for writing never blocks.
    exited = os.open(pool / "exited.fifo", os.O_RDONLY | os.O_NONBLOCK)
    go_read, go_write = os.pipe()
    gate = os.open(pool / "gate", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(gate, fcntl.LOCK_EX)  # every other build step waits here
    try:
        env = {"VICTIM": VICTIM, "GO_FD": str(go_read), "GATE": str(pool / "gate")}
        with workers(pool, env, pass_fds=(go_read,)) as team:
            os.close(go_read)
            shell = int(read_with_deadline(exited).decode().split()[0])
            victim = next(worker for worker in team if worker.pid == shell)
            victim.send_signal(signal.SIGKILL)
            assert victim.wait(timeout=SYNC_TIMEOUT) == -signal.SIGKILL
            os.write(go_write, b"go\n")  # the orphaned build step may end now
            while read_with_deadline(exited):  # EOF: the victim's build step has exited
                pass
            fcntl.flock(gate, fcntl.LOCK_UN)  # let the others go on
            others = [worker for worker in team if worker is not victim]
            codes = wait_all(others)
    finally:
        for fd in (exited, go_write, gate):
            os.close(fd)
    assert codes == [0] * (WORKERS - 1), codes
    expected = Counter(f"built {name}" for name in FEATURES)
    expected[f"partial {VICTIM}"] = 1
    assert runs(pool) == expected
    assert leftover_locks(pool) == []


def test_readme_loop_records_a_failing_build_and_ends_with_it_failed(pool: Path) -> None:
    """A build that always fails: it is tried exactly three times (``lock fail`` each time,
    the default --attempts), then left as failed; every other feature is built once; every
    worker leaves (exit 0: nothing left to claim; ``status`` tells done from failed). Fails on
    the old loop, which released
    the feature and stopped the worker whose build failed (the others built it again, once
    each, and the pool ended without saying anything had failed)."""
    broken = FEATURES[5]
    with workers(pool, {"BROKEN": broken}) as team:
        codes = wait_all(team)
    assert codes == [0] * WORKERS, codes
    expected = Counter(f"built {name}" for name in FEATURES if name != broken)
    expected[f"broken {broken}"] = 3
    assert runs(pool) == expected
    assert leftover_locks(pool) == []
    assert '"count": 3' in (pool / ".gsd" / "specs" / broken / ".attempts").read_text()
