"""Skip conditions, declared once for the whole suite."""

import os
import shlex
import shutil
import subprocess
import sys

import pytest

needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
needs_symlinks = pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symlinks")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching users or mounting needs root")
not_root = pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
posix_signals = pytest.mark.skipif(sys.platform == "win32", reason="needs POSIX signals")


def _succeeds(argv: list[str]) -> bool:
    """Does ``argv`` run and exit 0 here (within 10 s)?"""
    try:
        return subprocess.run(argv, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _unshare_permits(*args: str) -> bool:
    """Does ``unshare ARGS...`` succeed here (Linux; root or user namespaces)?"""
    unshare = shutil.which("unshare")
    if unshare is None or not sys.platform.startswith("linux"):
        return False
    return _succeeds([unshare, *args])


def _unshare_pid_permitted() -> bool:
    """Can this process start a child in a new PID namespace (root, or user namespaces)?"""
    return _unshare_permits("--pid", "--fork", "--mount-proc", "true")


needs_pid_namespaces = pytest.mark.skipif(
    not _unshare_pid_permitted(),
    reason="unshare --pid --fork --mount-proc is not permitted here (root or user namespaces)",
)
needs_proc = pytest.mark.skipif(
    not os.path.exists("/proc/self/stat"), reason="owner details need Linux's /proc"
)


def _leases_work() -> bool:
    """May this process take a kernel write lease (``F_SETLEASE``) on a file it owns here?"""
    import fcntl
    import tempfile

    lease = getattr(fcntl, "F_SETLEASE", None)
    try:
        with open("/proc/sys/fs/lease-break-time") as setting:
            long_enough = int(setting.read()) >= 10  # the test needs the lease to last seconds
    except (OSError, ValueError):
        return False
    if lease is None or not long_enough:
        return False
    handle, name = tempfile.mkstemp()
    os.close(handle)  # a write lease needs the file open nowhere else
    try:
        fd = os.open(name, os.O_RDONLY)
        try:
            fcntl.fcntl(fd, lease, fcntl.F_WRLCK)
            fcntl.fcntl(fd, lease, fcntl.F_UNLCK)
        finally:
            os.close(fd)
    except OSError:
        return False
    finally:
        os.unlink(name)
    return True


needs_leases = pytest.mark.skipif(
    not _leases_work(), reason="needs kernel leases (F_SETLEASE) lasting at least 10 s"
)
needs_prlimit = pytest.mark.skipif(
    shutil.which("prlimit") is None or (os.geteuid() == 0 and shutil.which("setpriv") is None),
    reason="needs prlimit (and setpriv when run as root) to limit processes",
)

PID_NAMESPACES_PERMITTED = _unshare_pid_permitted()
LEASES_WORK = _leases_work()
lacks_pid_namespaces_or_leases = pytest.mark.skipif(
    PID_NAMESPACES_PERMITTED and LEASES_WORK,
    reason="PID namespaces and kernel leases are permitted here: the full variant runs instead",
)


def _unshare_hosts_permitted() -> bool:
    """Can this process start a simulated host: new UTS (host name) and PID namespaces?"""
    return _unshare_permits("--uts", "--pid", "--fork", "--mount-proc", "hostname", "probe-host")


needs_simulated_hosts = pytest.mark.skipif(
    not _unshare_hosts_permitted(),
    reason="unshare --uts --pid --fork --mount-proc is not permitted here (needs root or user "
    "namespaces): cannot simulate other hosts",
)


def _unshare_time_permitted() -> bool:
    """Can this process start a child in a new time namespace with a boot-time offset?"""
    return _unshare_permits("--time", "--boottime", "1", "true")


needs_time_namespaces = pytest.mark.skipif(
    not _unshare_time_permitted(),
    reason="unshare --time --boottime is not permitted here (root or user namespaces)",
)


def _closed_folder(path: str) -> str | None:
    """The first folder on the way to ``path`` that others may not enter (no ``o+x``)."""
    folder = os.path.dirname(os.path.abspath(path))
    while True:
        try:
            if not os.stat(folder).st_mode & 0o001:
                return folder
        except OSError:
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def hidepid_unavailable(python: str = sys.executable, package: str | None = None) -> str | None:
    """Why the hidden-owner tests cannot run here (``None``: they can). They mount a ``/proc``
    with ``hidepid=2`` in a new mount namespace (root, ``unshare``) and run ``python`` with
    this package as ``nobody`` there (``setpriv``); a checkout or virtual environment in a
    folder only its owner may enter (``mktemp -d`` makes 0700 ones) stops the last part."""
    unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
    if unshare is None or setpriv is None or os.geteuid() != 0:
        return "needs root, unshare and setpriv to mount a /proc with hidepid=2 and run as nobody"
    if not _succeeds([unshare, "--mount", "sh", "-c", "mount -t proc -o hidepid=2 proc /proc"]):
        return "cannot mount a /proc with hidepid=2 here (unshare --mount refused or no procfs)"
    imports = f"{shlex.quote(python)} -c 'import mahabharatha.locks'"
    nobody = f"{setpriv} --reuid 65534 --regid 65534 --clear-groups {imports}"
    if _succeeds(
        [unshare, "--mount", "sh", "-c", f"mount -t proc -o hidepid=2 proc /proc && {nobody}"]
    ):
        return None
    for path in (python, package or os.path.dirname(os.path.dirname(__file__))):
        closed = _closed_folder(path)
        if closed is not None:
            return (
                f"nobody cannot run {python} with this package: {closed} is closed to others "
                f"(mode {os.stat(closed).st_mode & 0o777:o}); put the checkout and its virtual "
                "environment in a folder others may enter (chmod 755)"
            )
    return f"nobody cannot run {python} with this package (import mahabharatha.locks failed)"


_HIDEPID_UNAVAILABLE = hidepid_unavailable()
needs_hidepid = pytest.mark.skipif(
    _HIDEPID_UNAVAILABLE is not None, reason=_HIDEPID_UNAVAILABLE or "runs here"
)
