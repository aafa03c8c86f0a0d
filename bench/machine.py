"""What the benchmark ran on: CPU, cores, kernel, Python, the file system of the work folder."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path
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
