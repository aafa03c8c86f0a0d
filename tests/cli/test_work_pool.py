"""``lock work``: a pool of real worker processes that finishes, failures and a kill included.

Four ``lock work`` workers share thirty features. The build step records each start and end in
one log (``O_APPEND`` lines: whole, in order) and a ``mkdir`` occupancy marker catches two
builds of one feature at once. Three features fail the first time, two fail every time: each
feature must end done exactly once or failed after exactly ``--attempts`` attempts, each worker
must exit 1 ("finished, some failed"), and no lock may be left.

The kill variant SIGKILLs a worker while its build runs on in a session of its own: nobody may
build that feature while it runs, and the pool must finish it (again) after it ends. It is
synchronised by a FIFO and a pipe, never by sleeping.
"""

from __future__ import annotations

import os
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

WORKERS: Final = 4
FEATURES: Final = [f"feat-{i:02d}" for i in range(30)]
FLAKY: Final = ("feat-03", "feat-11", "feat-20")  # fail the first time only
BROKEN: Final = ("feat-07", "feat-25")  # fail every time
ATTEMPTS: Final = 3
CLI: Final = (sys.executable, "-m", "mahabharatha")
POOL_TIMEOUT: Final = 120.0
"""Hang guard for a whole pool (it takes a few seconds)."""

BUILD_STEP: Final = r"""#!/bin/sh
# Logs start and end of each run; a second concurrent run of one feature logs "overlap", and
# whether the marker's maker still runs (running: two builds at once; gone: killed mid-build).
feature=$1
[ "$feature" = "$MAHABHARATHA_FEATURE" ] || echo "wrong-env $feature" >> "$POOL/runs.log"
if mkdir "$POOL/running-$feature" 2>/dev/null; then
    echo $$ > "$POOL/running-$feature/by"
else
    by=$(cat "$POOL/running-$feature/by" 2>/dev/null)
    state=gone; kill -0 "$by" 2>/dev/null && state=running
    echo "overlap $feature by $$ beside ${by:-?} ($state)" >> "$POOL/runs.log"
fi
echo "start $feature" >> "$POOL/runs.log"
code=0
case " $FLAKY " in *" $feature "*)
    mkdir "$POOL/tried-$feature" 2>/dev/null && code=1 ;;
esac
case " $BROKEN " in *" $feature "*) code=2 ;; esac
if [ "$feature" = "${VICTIM:-}" ] && mkdir "$POOL/victim" 2>/dev/null; then
    # The victim's first run: its work goes on in a session of its own (it survives its
    # worker's SIGKILL), says which worker runs it, and waits for the test's go.
    setsid sh -c '
        exec 9>"$POOL/exited.fifo"   # held until this process exits: the test sees EOF then
        echo "$1" >&9
        read -r _ < "$POOL/go.fifo"  # blocks until the test opens it and says go
        echo "end-partial $2" >> "$POOL/runs.log"
        rm -r "$POOL/running-$2"
    ' victim "$PPID" "$feature" &
    wait
    exit 1
fi
echo "end $feature $code" >> "$POOL/runs.log"
rm -r "$POOL/running-$feature"
exit $code
"""


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def make_pool(folder: Path) -> Path:
    """The thirty feature folders, the build step and its log, in ``folder``."""
    for name in FEATURES:
        (folder / ".gsd" / "specs" / name).mkdir(parents=True)
    _executable(folder / "build-feature.sh", BUILD_STEP)
    (folder / "runs.log").touch()
    return folder


@pytest.fixture
def pool(tmp_path: Path) -> Path:
    return make_pool(tmp_path)


@contextmanager
def workers(
    pool: Path, extra: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``lock work`` workers, each in a session of its own; all reaped (groups killed) after."""
    full_env = {
        **os.environ,
        "POOL": str(pool),
        "FLAKY": " ".join(FLAKY),
        "BROKEN": " ".join(BROKEN),
        **(env or {}),
    }
    full_env.pop("MAHABHARATHA_FEATURE", None)
    argv = [*CLI, "lock", "work", "--attempts", str(ATTEMPTS)]
    team = [
        subprocess.Popen(
            [*argv, *extra, "--", "./build-feature.sh", "{}"],
            cwd=pool,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
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
            if worker.stderr is not None:
                worker.stderr.close()


def wait_all(team: list[subprocess.Popen[bytes]]) -> list[int | None]:
    deadline = time.monotonic() + POOL_TIMEOUT
    codes: list[int | None] = []
    for worker in team:
        try:
            codes.append(worker.wait(timeout=max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append(None)  # the pool never ended
    return codes


def log(pool: Path) -> list[str]:
    return pool.joinpath("runs.log").read_text().splitlines()


def leftover_locks(pool: Path) -> list[str]:
    return sorted(p.parent.name for p in (pool / ".gsd" / "specs").glob("*/.lock"))


def assert_every_feature_finished_once(lines: list[str], pool: Path, *, files: bool = True) -> None:
    """Done exactly once, or failed after exactly ATTEMPTS attempts; never two builds at once.
    ``files``: the attempts are in the folder (PostgreSQL keeps them in the row)."""
    wrong = [line for line in lines if line.startswith(("overlap", "wrong-env"))]
    named = {line.split()[1] for line in wrong}  # their features' whole history, uncut
    assert not wrong, [line for line in lines if line.split()[1:2] and line.split()[1] in named]
    ends = Counter(line for line in lines if line.startswith("end "))
    for name in FEATURES:
        folder = pool / ".gsd" / "specs" / name
        if name in BROKEN:
            assert ends[f"end {name} 2"] == ATTEMPTS, (name, ends)
            assert not (folder / ".completed").exists()
            if files:
                assert '"count": 3' in (folder / ".attempts").read_text()
        else:
            assert ends[f"end {name} 0"] == 1, (name, ends)
            assert (folder / ".completed").is_file()
        if name in FLAKY:
            assert ends[f"end {name} 1"] == 1, (name, ends)


def test_four_workers_finish_thirty_features_with_failures(pool: Path) -> None:
    """Fails on the old design (the README's claim/build/release loop): a failing build was
    released and stopped its worker, so the pool ended with features never built, and a build
    that always failed was retried by each worker once rather than ``--attempts`` times."""
    with workers(pool) as team:
        codes = wait_all(team)
        errors = [w.stderr.read().decode() if w.stderr else "" for w in team]
    assert codes == [1] * WORKERS, (codes, errors)  # finished, some failed
    assert_every_feature_finished_once(log(pool), pool)
    assert leftover_locks(pool) == []
    assert all("Traceback" not in said for said in errors), errors


def read_with_deadline(fd: int) -> bytes:
    ready, _, _ = select.select([fd], [], [], SYNC_TIMEOUT)
    assert ready, f"nothing to read within {SYNC_TIMEOUT}s"
    return os.read(fd, 4096)


@needs_fifo
@posix_signals
def test_a_killed_workers_feature_is_finished_after_its_build_ends(pool: Path) -> None:
    """Failed before the proof of life (a SIGKILLed worker whose build left its process group
    was judged dead while the build still ran, and another worker built the feature beside
    it). One worker SIGKILLed mid-build; its build runs on in its own session. Nobody builds
    that feature while the orphan runs (no ``overlap``, and the next ``start`` of it comes
    after ``end-partial``), the pool finishes it afterwards, and does not end before: the
    other workers exit 1 (finished, some failed) only once it is done."""
    victim_feature = FEATURES[0]  # claims go by name: the pool's first claim takes it
    os.mkfifo(pool / "exited.fifo")
    os.mkfifo(pool / "go.fifo")  # a FIFO, not a pipe: lock work's CMD inherits no descriptor
    exited = os.open(pool / "exited.fifo", os.O_RDONLY | os.O_NONBLOCK)
    try:
        env = {"VICTIM": victim_feature}
        with workers(pool, ("--reclaim-dead",), env) as team:
            worker_pid = int(read_with_deadline(exited).decode().split()[0])
            victim = next(worker for worker in team if worker.pid == worker_pid)
            victim.send_signal(signal.SIGKILL)
            assert victim.wait(timeout=SYNC_TIMEOUT) == -signal.SIGKILL
            others = [worker for worker in team if worker is not victim]
            assert all(worker.poll() is None for worker in others), "the pool ended early"
            # What every waiting worker asks, asked here at a known moment: with the build
            # still running, its lock must not be taken, even with --reclaim-dead.
            taken = subprocess.run(
                [
                    *CLI,
                    "lock",
                    "claim",
                    victim_feature,
                    "--reclaim-dead",
                    "--pid",
                    str(os.getpid()),
                ],
                cwd=pool,
                capture_output=True,
                text=True,
                timeout=SYNC_TIMEOUT,
            )
            assert taken.returncode == 75, (taken.stdout, taken.stderr)
            go = os.open(pool / "go.fifo", os.O_WRONLY)  # the orphan has it open for reading
            os.write(go, b"go\n")  # the orphaned build may end now
            os.close(go)
            while read_with_deadline(exited):  # EOF: the orphan has exited
                pass
            codes = wait_all(others)
    finally:
        os.close(exited)
    lines = log(pool)
    assert codes == [1] * (WORKERS - 1), codes
    partial = lines.index(f"end-partial {victim_feature}")
    starts = [i for i, line in enumerate(lines) if line == f"start {victim_feature}"]
    assert len(starts) == 2 and starts[1] > partial, lines
    assert_every_feature_finished_once(lines, pool)
    assert leftover_locks(pool) == []
