"""The CLI as separate processes: who owns a lock, waiting for one, and workers claiming at once.

Every call is ``python -m mahabharatha ...`` with the test's folder as working directory, so the
process that called the CLI, the default owner, is this test process. Children synchronise
through their output lines or stdin, never by sleeping, and are always reaped.
"""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import pytest

from mahabharatha import locks
from tests.cli._support import (
    FEATURE,
    Child,
    cli_argv,
    lock_path,
    one_document,
    read_record,
    run_cli,
    write_lock,
)

Spawn = Callable[..., Child]

GATED: Final = (
    "import runpy, sys\n"
    "import mahabharatha.cli\n"
    "print('ready', file=sys.stderr, flush=True)\n"
    "sys.stdin.readline()\n"
    "sys.argv = ['mahabharatha', *sys.argv[1:]]\n"
    "runpy.run_module('mahabharatha', run_name='__main__', alter_sys=True)\n"
)
"""``python -m mahabharatha ARGS`` that imports everything, says ``ready`` and waits for a line
on stdin: the test opens the gate for all workers at once, so their claims truly race."""

FIRST_WORKER_PID: Final = 3_000_001
"""Distinct owner pids for workers, recorded with --pid (no liveness is asked for)."""


@pytest.fixture
def holder(spawn: Spawn) -> Child:
    """Another live process, to stand as the owner of a lock (it waits on stdin until reaped)."""
    return spawn([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)


def test_acquire_then_release_from_one_caller_pair_up(tmp_path: Path, gsd: Path) -> None:
    acquired = run_cli("lock", "acquire", FEATURE, "--gsd-dir", gsd, cwd=tmp_path)

    assert acquired.returncode == 0, acquired.stderr
    assert read_record(lock_path(gsd))[0] == os.getpid(), "the owner is the CLI's caller"

    released = run_cli("lock", "release", FEATURE, "--gsd-dir", gsd, cwd=tmp_path)

    assert released.returncode == 0, released.stderr
    assert not lock_path(gsd).exists()


def test_pid_option_records_the_given_owner(tmp_path: Path, gsd: Path, holder: Child) -> None:
    done = run_cli(
        "lock", "acquire", FEATURE, "--gsd-dir", gsd, "--pid", holder.pid, "--json", cwd=tmp_path
    )

    assert done.returncode == 0, done.stderr
    one_document(done.stdout)
    assert read_record(lock_path(gsd))[0] == holder.pid


def test_acquire_held_by_another_live_process_exits_1_naming_its_pid(
    tmp_path: Path, gsd: Path, holder: Child
) -> None:
    locks.acquire(FEATURE, gsd, pid=holder.pid)
    before = lock_path(gsd).read_text()

    done = run_cli("lock", "acquire", FEATURE, "--gsd-dir", gsd, cwd=tmp_path)

    assert done.returncode == 1
    assert str(holder.pid) in done.stderr
    assert lock_path(gsd).read_text() == before


def test_release_of_another_owners_lock_exits_1_and_force_removes_it(
    tmp_path: Path, gsd: Path, holder: Child
) -> None:
    locks.acquire(FEATURE, gsd, pid=holder.pid)
    before = lock_path(gsd).read_text()

    refused = run_cli("lock", "release", FEATURE, "--gsd-dir", gsd, cwd=tmp_path)

    assert refused.returncode == 1
    assert lock_path(gsd).read_text() == before

    forced = run_cli("lock", "release", FEATURE, "--gsd-dir", gsd, "--force", cwd=tmp_path)

    assert forced.returncode == 0, forced.stderr
    assert not lock_path(gsd).exists()


def test_release_with_pid_matches_an_acquire_with_the_same_pid(
    tmp_path: Path, gsd: Path, holder: Child
) -> None:
    pid = ("--pid", holder.pid)
    assert run_cli("lock", "acquire", FEATURE, "--gsd-dir", gsd, *pid, cwd=tmp_path).returncode == 0

    done = run_cli("lock", "release", FEATURE, "--gsd-dir", gsd, *pid, cwd=tmp_path)

    assert done.returncode == 0, done.stderr
    assert not lock_path(gsd).exists()


def test_acquire_wait_gets_the_lock_once_the_holder_releases(
    tmp_path: Path, gsd: Path, holder: Child, spawn: Spawn
) -> None:
    locks.acquire(FEATURE, gsd, pid=holder.pid)
    waiter = spawn(cli_argv("lock", "acquire", FEATURE, "--gsd-dir", gsd, "--wait", 10))
    # One more CLI start-up on the same machine: by its end the waiter has tried at least once.
    assert run_cli("lock", "check", FEATURE, "--gsd-dir", gsd, cwd=tmp_path).returncode == 1
    assert waiter.proc.poll() is None, f"the waiter gave up early: {waiter.stderr}"

    locks.release(FEATURE, gsd, pid=holder.pid)

    assert waiter.wait() == 0, waiter.stderr
    assert read_record(lock_path(gsd))[0] == os.getpid()


def test_acquire_wait_gives_up_with_exit_1_after_the_given_time(
    tmp_path: Path, gsd: Path, holder: Child
) -> None:
    locks.acquire(FEATURE, gsd, pid=holder.pid)
    started = time.monotonic()

    done = run_cli("lock", "acquire", FEATURE, "--gsd-dir", gsd, "--wait", 0.5, cwd=tmp_path)

    assert done.returncode == 1
    assert str(holder.pid) in done.stderr
    assert time.monotonic() - started >= 0.5, "it must have waited the whole time"
    assert read_record(lock_path(gsd))[0] == holder.pid


def _make_features(gsd: Path, names: list[str]) -> None:
    for name in names:
        (gsd / "specs" / name).mkdir(parents=True)


def _claim_at_once(spawn: Spawn, gsd: Path, workers: int, names: list[str]) -> list[Child]:
    """Start ``workers`` gated claimers, wait until all are ready, then open every gate."""
    team = [
        spawn(
            [
                sys.executable,
                "-c",
                GATED,
                *("lock", "claim", *names, "--gsd-dir", str(gsd)),
                *("--pid", str(FIRST_WORKER_PID + index)),
            ],
            stdin=subprocess.PIPE,
        )
        for index in range(workers)
    ]
    for worker in team:
        assert worker.next_line("stderr") == "ready"
    for worker in team:
        worker.send("go\n")
    return team


@pytest.mark.parametrize("workers", [4, 8])
def test_workers_claiming_at_once_never_get_the_same_feature(
    tmp_path: Path, gsd: Path, spawn: Spawn, workers: int
) -> None:
    names = ["feat-a", "feat-b", "feat-c", "feat-d"]
    _make_features(gsd, names)

    team = _claim_at_once(spawn, gsd, workers, names)

    codes = [worker.wait() for worker in team]
    won = {
        worker.stdout.strip(): FIRST_WORKER_PID + i
        for i, worker in enumerate(team)
        if codes[i] == 0
    }
    assert sorted(won) == names, [(w.stdout, w.stderr) for w in team]
    assert codes.count(75) == workers - len(names)  # the rest are held by others: try later
    for name, pid in won.items():
        assert read_record(lock_path(gsd, name))[0] == pid, "each lock records its claimer"

    late = run_cli("lock", "claim", *names, "--gsd-dir", gsd, "--json", cwd=tmp_path)

    assert late.returncode == 75  # none free now, but held (not finished): 75, not 1
    assert "error" in one_document(late.stdout)


def test_claim_without_names_takes_feature_folders_by_name(tmp_path: Path, gsd: Path) -> None:
    _make_features(gsd, ["charlie", "alpha", "bravo"])
    (gsd / "specs" / "zulu.txt").write_text("not a feature folder")

    claimed = []
    for index in range(4):
        done = run_cli(
            "lock", "claim", "--gsd-dir", gsd, "--pid", FIRST_WORKER_PID + index, cwd=tmp_path
        )
        claimed.append((done.returncode, done.stdout.strip()))

    assert claimed == [(0, "alpha"), (0, "bravo"), (0, "charlie"), (75, "")]


def test_claim_takes_the_first_free_of_the_names_in_the_order_given(
    tmp_path: Path, gsd: Path
) -> None:
    _make_features(gsd, ["one", "two", "three"])
    locks.acquire("three", gsd, pid=FIRST_WORKER_PID)

    done = run_cli("lock", "claim", "three", "two", "one", "--gsd-dir", gsd, cwd=tmp_path)

    assert (done.returncode, done.stdout.strip()) == (0, "two")
    assert read_record(lock_path(gsd, "two"))[0] == os.getpid()


def _stderr_of_a_wait(gsd: Path, *, terminal: bool) -> bytes:
    """``lock acquire --wait`` on a lock that stays held; its stderr as a terminal would get it."""
    argv = [*cli_argv("lock", "acquire", FEATURE, "--gsd-dir", gsd, "--wait", "1.2")]
    if not terminal:
        done = subprocess.run(argv, capture_output=True, timeout=30, check=False)
        assert done.returncode == 1
        return done.stderr
    main, secondary = pty.openpty()
    try:
        child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=secondary)
        os.close(secondary)
        output = b""
        while chunk := _read_pty(main):
            output += chunk
        assert child.wait(timeout=30) == 1
    finally:
        os.close(main)
    return output


def _read_pty(fd: int) -> bytes:
    try:
        return os.read(fd, 4096)
    except OSError:  # EIO: the child closed its end
        return b""


def test_a_wait_at_a_terminal_shows_the_holder_and_the_time_left_then_erases_it(
    gsd: Path,
) -> None:
    write_lock(gsd, FEATURE, f"1:{time.time()}")  # another owner than the CLI's parent (us)
    shown = _stderr_of_a_wait(gsd, terminal=True).decode()
    assert f"\rwaiting: feature '{FEATURE}' is locked by pid 1" in shown
    assert "giving up in" in shown
    assert "\r\x1b[K" in shown  # the waiting line is erased before the answer


def test_a_wait_off_a_terminal_says_nothing_but_the_answer(gsd: Path) -> None:
    write_lock(gsd, FEATURE, f"1:{time.time()}")  # another owner than the CLI's parent (us)
    said = _stderr_of_a_wait(gsd, terminal=False).decode()
    assert "waiting" not in said
    assert len(said.strip().splitlines()) == 1
