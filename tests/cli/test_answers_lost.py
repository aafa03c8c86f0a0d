"""An answer is printed, or the lock is given back (issue 16, items 10 and 11).

Fails before the fix: ``acquire``/``claim`` whose answer could not be written (stdout on a
full disk, a reader gone) died with a traceback or exit 1 while keeping the lock; a SIGTERM
that reached ``acquire`` after its lock was published (``timeout 5 mahabharatha lock acquire F
--wait 10``, a cancelled CI job) ended it with no answer at all, the caller's shell holding a
lock nobody knew it held.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import signal
import subprocess
from pathlib import Path
from typing import Final

import pytest

from tests.cli._support import FEATURE, SYNC_TIMEOUT, child_env, cli_argv, lock_path, wait_for

EXIT_OS_ERROR: Final = 3
COMMANDS: Final = [
    pytest.param(("acquire", FEATURE), id="acquire"),
    pytest.param(("claim", FEATURE), id="claim"),
]


def _start(
    tmp_path: Path, gsd: Path, args: tuple[str, ...], stdout: int
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        cli_argv("lock", *args, "--gsd-dir", gsd, "--json"),
        cwd=tmp_path,
        env=child_env(),
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.PIPE,
    )


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("args", COMMANDS)
def test_an_answer_that_cannot_be_written_to_a_full_disk_gives_the_lock_back(
    tmp_path: Path, gsd: Path, args: tuple[str, ...]
) -> None:
    (gsd / "specs" / FEATURE).mkdir(parents=True, exist_ok=True)
    with open("/dev/full", "wb") as full:
        proc = _start(tmp_path, gsd, args, full.fileno())
        _, err = proc.communicate(timeout=SYNC_TIMEOUT)
    assert proc.returncode == EXIT_OS_ERROR, err
    said = err.decode()
    assert "Traceback" not in said and "Exception ignored" not in said, said
    assert "could not write the answer" in said and "released" in said, said
    assert not lock_path(gsd).exists(), "the lock stayed although nobody was told of it"


@pytest.mark.parametrize("args", COMMANDS)
def test_an_answer_whose_reader_is_gone_gives_the_lock_back(
    tmp_path: Path, gsd: Path, args: tuple[str, ...]
) -> None:
    (gsd / "specs" / FEATURE).mkdir(parents=True, exist_ok=True)
    proc = _start(tmp_path, gsd, args, subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.close()  # the reader is gone before the CLI could say anything
    _, err = proc.communicate(timeout=SYNC_TIMEOUT)
    assert proc.returncode == EXIT_OS_ERROR, err
    assert "Traceback" not in err.decode()
    assert not lock_path(gsd).exists()


@pytest.mark.skipif(platform.machine() != "x86_64", reason="reads x86-64 system call numbers")
def test_sigterm_around_the_answer_leaves_an_answer_or_no_lock(tmp_path: Path, gsd: Path) -> None:
    """The answer's pipe is full, so the CLI blocks writing it, its lock on disk; SIGTERM comes
    then. The pipe is drained: either the answer arrives ("acquired"), or the lock is gone.
    Never neither (before the fix: killed mid-write, no answer, the lock kept)."""
    (gsd / "specs" / FEATURE).mkdir(parents=True, exist_ok=True)
    reader, writer = os.pipe()
    fcntl.fcntl(writer, fcntl.F_SETFL, os.O_NONBLOCK)
    for size in (4096, 1):  # fill the pipe to its last byte: the answer must wait for us
        try:
            while True:
                os.write(writer, b"x" * size)
        except BlockingIOError:
            pass
    fcntl.fcntl(writer, fcntl.F_SETFL, 0)
    proc = _start(tmp_path, gsd, ("acquire", FEATURE, "--wait", "5"), writer)
    os.close(writer)
    try:
        wait_for(lambda: _blocked_writing(proc.pid), what="the CLI to block writing its answer")
        proc.send_signal(signal.SIGTERM)
        drained = b""
        while chunk := os.read(reader, 65536):
            drained += chunk
        proc.wait(timeout=SYNC_TIMEOUT)
    finally:
        os.close(reader)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    answer = drained.lstrip(b"x")
    assert proc.stderr is not None
    with proc.stderr:
        said = proc.stderr.read().decode()
    assert "Traceback" not in said, said
    if answer:
        assert json.loads(answer)["acquired"] is True, answer
        assert lock_path(gsd).exists(), "the caller was told it holds a lock that is gone"
    else:
        assert not lock_path(gsd).exists(), "no answer, and a lock nobody knew of stayed"


def test_sigterm_while_acquire_waits_ends_it_with_one_document_and_no_lock(
    tmp_path: Path, gsd: Path
) -> None:
    holder = subprocess.run(
        cli_argv("lock", "acquire", FEATURE, "--gsd-dir", gsd, "--pid", "1", "--create"),
        cwd=tmp_path, env=child_env(), capture_output=True, check=False,
    )  # fmt: skip
    assert holder.returncode == 0, holder.stderr
    before = lock_path(gsd).read_bytes()
    proc = _start(tmp_path, gsd, ("acquire", FEATURE, "--wait", "30"), subprocess.PIPE)
    assert proc.stderr is not None
    wait_for(lambda: _catches_sigterm(proc.pid), what="acquire to take SIGTERM itself")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=SYNC_TIMEOUT)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert json.loads(out)["acquired"] is False
    assert lock_path(gsd).read_bytes() == before


WRITE_SYSCALL: Final = 1
"""``write`` on x86-64, as ``/proc/<pid>/syscall`` numbers it."""


def _blocked_writing(pid: int) -> bool:
    """Is the CLI asleep in a ``write`` to its stdout (descriptor 1, the full pipe)?"""
    try:
        with open(f"/proc/{pid}/syscall", "rb") as syscall:
            fields = syscall.read().split()
    except OSError:
        return False
    return len(fields) > 1 and fields[0] == str(WRITE_SYSCALL).encode() and fields[1] == b"0x1"


def _catches_sigterm(pid: int) -> bool:
    """Has the CLI installed its SIGTERM handler (``SigCgt`` in ``/proc/<pid>/status``)? From
    then on a SIGTERM ends it with an answer."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"SigCgt:"):
                    return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    except OSError:
        return False
    return False
