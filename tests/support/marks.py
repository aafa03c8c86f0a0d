"""Skip conditions, declared once for the whole suite."""

import os
import shutil
import sys

import pytest

needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
needs_symlinks = pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symlinks")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching users or mounting needs root")
not_root = pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
posix_signals = pytest.mark.skipif(sys.platform == "win32", reason="needs POSIX signals")
needs_prlimit = pytest.mark.skipif(
    shutil.which("prlimit") is None or (os.geteuid() == 0 and shutil.which("setpriv") is None),
    reason="needs prlimit (and setpriv when run as root) to limit processes",
)
