"""Real mounts for the disk-fault tests: a probe (may this process mount?) and a small tmpfs."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mahabharatha.owner import proof


@dataclass(frozen=True)
class Mounting:
    """Whether this machine lets the tests mount a tmpfs (and why not, when it does not)."""

    allowed: bool
    reason: str


def probe_mounting() -> Mounting:
    if os.geteuid() != 0:
        return Mounting(False, "mounting a tmpfs needs root")
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return Mounting(False, "no mount/umount command on this machine")
    point = tempfile.mkdtemp(prefix="mahabharatha-mount-probe-")
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", point],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if done.returncode != 0:
            detail = done.stderr.strip() or f"exit {done.returncode}"
            return Mounting(False, f"this machine forbids mounting a tmpfs ({detail})")
        subprocess.run(["umount", point], check=True, timeout=10)
        return Mounting(True, "")
    finally:
        os.rmdir(point)


class Tmpfs:
    """A small tmpfs of the test's own, world-traversable (so a dropped uid can reach it)."""

    def __init__(self, size: str) -> None:
        self.point = Path(tempfile.mkdtemp(prefix="mahabharatha-tmpfs-"))
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(self.point)],
            check=True,
            capture_output=True,
            timeout=10,
        )

    def remount(self, mode: str) -> None:
        """``ro`` or ``rw``: the same file system, now read-only (or writable again)."""
        subprocess.run(
            ["mount", "-o", f"remount,{mode}", str(self.point)],
            check=True,
            capture_output=True,
            timeout=10,
        )

    def unmount(self) -> None:
        # A lock the test took in this process holds a descriptor of its folder (its proof
        # of life) until released: let go of them, or the file system stays busy.
        proof.let_go_of_all()
        subprocess.run(["umount", str(self.point)], check=True, capture_output=True, timeout=10)
        os.rmdir(self.point)
