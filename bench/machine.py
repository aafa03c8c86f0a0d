"""What the benchmark ran on: CPU, cores, kernel, Python, the file system of the work folder."""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import Any

PEER_DISTRIBUTIONS = ("filelock", "fasteners", "portalocker", "flufl.lock", "typer", "psutil")


def cpu_model() -> str:
    """The ``model name`` line of /proc/cpuinfo (Linux); elsewhere what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _unescape_mount(field: str) -> str:
    """/proc/self/mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def filesystem_of(path: str | os.PathLike[str]) -> dict[str, str]:
    """File system type, device and mount point of the mount that holds ``path``."""
    target = os.path.realpath(path)
    best: dict[str, str] = {"type": "unknown", "source": "unknown", "mount_point": "unknown"}
    best_len = -1
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as mounts:
            for line in mounts:
                left, _, right = line.partition(" - ")
                fields, tail = left.split(), right.split()
                if len(fields) < 5 or len(tail) < 2:
                    continue
                mount_point = _unescape_mount(fields[4])
                inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
                if inside and len(mount_point) >= best_len:  # later mounts shadow earlier ones
                    best_len = len(mount_point)
                    best = {"type": tail[0], "source": tail[1], "mount_point": mount_point}
    except OSError:
        pass
    return best


def io_pressure() -> float | None:
    """Linux PSI: percent of the last 60 s in which some task waited for I/O (None: unknown).
    Other processes' file-system work shows here, and it slows every contender that creates
    files."""
    try:
        with open("/proc/pressure/io", encoding="ascii") as pressure:
            for line in pressure:
                if line.startswith("some "):
                    fields = dict(item.split("=") for item in line.split()[1:])
                    return float(fields["avg60"])
    except (OSError, KeyError, ValueError):
        pass
    return None


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def machine_info(workdir: str | os.PathLike[str]) -> dict[str, Any]:
    """Everything a reader needs to judge the numbers, as one JSON-able dict."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count() or 0
    uname = platform.uname()
    return {
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "kernel": f"{uname.system} {uname.release}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "workdir": str(Path(workdir).resolve()),
        "filesystem": filesystem_of(workdir),
        "loadavg_at_start": list(os.getloadavg()),
        "io_pressure_at_start": io_pressure(),
        "versions": {name: _version(name) for name in ("mahabharatha", *PEER_DISTRIBUTIONS)},
    }


SCRATCH_SIZE = "64m"
"""The bench's own tmpfs: scenario (1) makes a few files at a time, so this is plenty."""
_MOUNT_TIMEOUT = 30.0


def _leave(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through the ``finally`` that unmounts


def is_root() -> bool:
    """May this process mount a tmpfs (a seam: a test plays "not root" without lying to the
    lock about who it is)."""
    return os.geteuid() == 0


@contextlib.contextmanager
def scratch_tmpfs(parent: Path) -> Iterator[tuple[Path | None, str]]:
    """A tmpfs the bench mounts itself in a new folder under ``parent``, for the block:
    ``(folder, "")``, or ``(None, why not)`` when this process is not root or the mount fails.

    Unmounted and its folder removed on every way out of the block: an exception, Ctrl-C,
    and SIGTERM or SIGHUP (turned into ``SystemExit`` while the mount exists)."""
    if not is_root():
        yield None, "not root: no tmpfs mounted, only the work folder's file system measured"
        return
    folder = Path(tempfile.mkdtemp(prefix="tmpfs-", dir=parent))
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SCRATCH_SIZE},mode=0700", "bench-tmpfs", folder],
        capture_output=True,
        text=True,
        timeout=_MOUNT_TIMEOUT,
        check=False,
    )
    if mounted.returncode != 0:
        folder.rmdir()
        why = mounted.stderr.strip() or f"exit {mounted.returncode}"
        yield None, f"mounting a tmpfs failed ({why}): only the work folder's file system measured"
        return
    earlier = {sig: signal.signal(sig, _leave) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield folder, ""
    finally:
        # Lazy: a descriptor still open in a reaped child's leftovers must not keep it mounted.
        subprocess.run(["umount", "-l", folder], capture_output=True, check=False)
        with contextlib.suppress(OSError):
            folder.rmdir()
        for sig, handler in earlier.items():
            signal.signal(sig, handler)


def mounted_below(parent: Path) -> list[str]:
    """Mount points inside ``parent`` (the test's check that the bench left none behind)."""
    root = os.path.realpath(parent).rstrip("/") + "/"
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as mounts:
        points = [_unescape_mount(line.split()[4]) for line in mounts]
    return [point for point in points if point.startswith(root)]
