"""The default lock namespace of a checkout: its repository, named by its ``origin`` remote.

Two checkouts of one repository on two hosts share locks; two repositories never do. Plain
``git``; no database driver needed.
"""

from __future__ import annotations

import os
import re
import subprocess
from typing import Final

__all__ = ["derive_namespace", "normalise_remote"]

_SCP_LIKE: Final = re.compile(r"^(?:[^@/]+@)?([^:/]+):(?!//)(.*)$")
_URL_LIKE: Final = re.compile(r"^[a-z][a-z0-9+.-]*://(?:[^@/]*@)?([^/:]+)(?::\d+)?/?(.*)$", re.I)


def normalise_remote(url: str) -> str | None:
    """``git@github.com:org/repo.git`` and ``https://github.com/org/repo`` are one repository:
    ``github.com/org/repo`` (host lower-cased, no user, port, scheme or ``.git``)."""
    text = url.strip()
    match = _URL_LIKE.match(text) or _SCP_LIKE.match(text)
    if match is None:
        path, host = text, ""  # a local path: the path itself names the repository
    else:
        host, path = match.group(1).lower(), match.group(2)
    path = path.strip("/")
    path = path.removesuffix(".git").rstrip("/")
    name = f"{host}/{path}" if host else path
    return name or None


def derive_namespace(where: str | os.PathLike[str] | None = None) -> str | None:
    """The namespace of the repository at ``where`` (its ``origin`` remote), or None."""
    folder = os.fspath(where) if where is not None else os.getcwd()
    while folder and not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    try:
        done = subprocess.run(
            ["git", "-C", folder or ".", "config", "--get", "remote.origin.url"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return normalise_remote(done.stdout)
