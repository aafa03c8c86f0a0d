"""Where ``lock work``'s command writes: ours, prefixed with its feature (``--tag``), and/or one
new file per attempt (``--log-dir``, named by time and pid), whose path ``.last-log`` in the
feature folder keeps for ``status --all``."""

from __future__ import annotations

import io
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from time import gmtime, strftime, time
from typing import IO, Any, NamedTuple

from mahabharatha.constants import LAST_LOG_NAME, PUMP_JOIN_SECONDS
from mahabharatha.reads import read_small_file


class CommandOutput(NamedTuple):
    """The command's ``stdout`` and ``stderr`` (``None``: ours), and the log file's path."""

    stdout: IO[Any] | None
    stderr: IO[Any] | None
    log: str | None


@contextmanager
def command_output(
    feature: str,
    *,
    tag: bool,
    log_dir: Path | None,
    gsd_dir: str | os.PathLike[str],
    stdout: IO[Any] | None,
) -> Iterator[CommandOutput]:
    """The outputs of one attempt at ``feature``; ``stdout``: its stdout untold (None: ours)."""
    with ExitStack() as stack:
        log: str | None = None
        out_to: IO[Any] | None = stdout
        err_to: IO[Any] | None = None
        if log_dir is not None:
            opened = stack.enter_context(_new_log(log_dir, feature))
            log = os.path.abspath(opened.name)
            _remember(gsd_dir, feature, log)
            out_to = err_to = opened
        if tag:
            prefix = f"[{feature}] ".encode()
            out_to = stack.enter_context(_tagging(prefix, out_to or sys.stdout))
            err_to = stack.enter_context(_tagging(prefix, err_to or sys.stderr))
        yield CommandOutput(out_to, err_to, log)


def _new_log(log_dir: Path, feature: str) -> IO[bytes]:
    stamp = strftime("%Y%m%dT%H%M%SZ", gmtime(time()))
    log_dir.mkdir(parents=True, exist_ok=True)
    again = 0
    while True:
        suffix = f"-{again}" if again else ""
        with suppress(FileExistsError):
            # "x": never append to, nor replace, another attempt's log (a retry takes a suffix).
            return open(log_dir / f"{feature}.{stamp}.{os.getpid()}{suffix}.log", "xb")
        again += 1


@contextmanager
def _tagging(prefix: bytes, target: IO[Any]) -> Iterator[IO[bytes]]:
    """A pipe whose lines are written to ``target`` with ``prefix``, by a thread of its own."""
    read_fd, write_fd = os.pipe()
    sink = target.buffer if isinstance(target, io.TextIOWrapper) else target  # bytes go there
    pump = threading.Thread(target=_pump, args=(read_fd, prefix, sink), daemon=True)
    pump.start()
    writer = os.fdopen(write_fd, "wb")
    try:
        yield writer
    finally:
        writer.close()  # the command has ended: EOF once its leftovers close their copies
        pump.join(PUMP_JOIN_SECONDS)


def _pump(read_fd: int, prefix: bytes, sink: IO[bytes]) -> None:
    with open(read_fd, "rb") as lines, suppress(OSError, ValueError):
        for line in lines:
            sink.write(prefix + (line if line.endswith(b"\n") else line + b"\n"))
            sink.flush()


def _marker(gsd_dir: str | os.PathLike[str], feature: str) -> Path:
    return Path(gsd_dir) / "specs" / feature / LAST_LOG_NAME


def _remember(gsd_dir: str | os.PathLike[str], feature: str, log: str) -> None:
    """Name ``log`` as the feature's last (atomically: a reader sees the old name or this)."""
    marker = _marker(gsd_dir, feature)
    if not marker.parent.is_dir():
        return  # a server's feature with no folder here: nothing to name it in
    temp = marker.with_name(f"{LAST_LOG_NAME}.{os.getpid()}.tmp")
    for last in (False, False, True):
        with suppress(FileNotFoundError):
            temp.unlink()  # an earlier attempt of this pid that died between the two steps
        # O_EXCL | O_NOFOLLOW: never write through a link someone put at the temporary name.
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with open(fd, "w") as written:
            written.write(log + "\n")
        try:
            os.replace(temp, marker)
            return
        except FileNotFoundError:
            # Race: lock clean swept the temp (its pid looked dead, or it looked old): again.
            if last:
                raise


def last_log(gsd_dir: str | os.PathLike[str], feature: str) -> str | None:
    """The path of the feature's last log (``None``: none named, or unreadable)."""
    try:
        # A FIFO, a link or a huge file at the name: no follow, no block, a bounded read.
        data = read_small_file(_marker(gsd_dir, feature))
        return None if data is None else data.decode().strip() or None
    except (OSError, UnicodeDecodeError):
        return None
