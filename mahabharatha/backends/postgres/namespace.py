"""A checkout's default lock namespace: the repository its ``origin`` remote names, by identity
(``host/path``, or a local git folder's real path), so two checkouts of one repository share
locks and two repositories never do (``design/postgres.md``, Namespaces)."""

from __future__ import annotations

import os
import re
import subprocess
from typing import Final

# Hosts whose repository paths are case-insensitive (``Org/Repo`` is ``org/repo``).
CASE_INSENSITIVE_HOSTS: Final = frozenset({"github.com", "gitlab.com", "bitbucket.org"})

_SCP_LIKE: Final = re.compile(r"^(?:[^@/]+@)?([^:/]+):(?!//)(.*)$")
_URL_LIKE: Final = re.compile(r"^([a-z][a-z0-9+.-]*)://(?:[^@/]*@)?([^/:]*)(?::\d*)?(/.*)?$", re.I)
_GIT_SUFFIX: Final = ".git"


def normalise_remote(url: str) -> str | None:
    """The repository ``url`` names, or None when it names none stably."""
    text = url.strip()
    if not text:
        return None
    match = _URL_LIKE.match(text)
    if match is not None:
        scheme, host, path = match.group(1).lower(), match.group(2), match.group(3) or ""
        if scheme == "file":
            return _local_identity(path) if host in ("", "localhost") else None
        return _hosted(host, path)
    if os.path.isabs(text):
        return _local_identity(text)
    scp = _SCP_LIKE.match(text)
    if scp is not None:
        return _hosted(scp.group(1), scp.group(2))
    return None  # a relative path: another repository from each folder it is read in


def _hosted(host: str, path: str) -> str | None:
    host = host.lower()
    name = "/".join(segment for segment in path.split("/") if segment)
    name = name.removesuffix(_GIT_SUFFIX).rstrip("/")  # "org/.git" names "org"
    if host in CASE_INSENSITIVE_HOSTS:
        name = name.lower()
    return f"{host}/{name}" if host and name else None


def _local_identity(path: str) -> str | None:
    """The real path of the git folder ``path`` names, as git's local transport finds it
    (``path/.git``, ``path.git``, ``path`` itself); else ``path`` absolute and normalised."""
    if not path or not os.path.isabs(path):
        return None
    real = os.path.realpath(path)
    for candidate in (os.path.join(real, ".git"), real + _GIT_SUFFIX, real):
        if _is_git_folder(candidate):
            return os.path.realpath(candidate)
    return os.path.normpath(real)


def _is_git_folder(folder: str) -> bool:
    """A repository's own folder: ``HEAD``, ``objects`` and ``refs`` in it."""
    inside = ("HEAD", os.path.isfile), ("objects", os.path.isdir), ("refs", os.path.isdir)
    return all(is_kind(os.path.join(folder, name)) for name, is_kind in inside)


def derive_namespace(where: str | os.PathLike[str] | None = None) -> str | None:
    """The namespace of the repository at ``where`` (its ``origin`` remote), or None."""
    folder = os.fspath(where) if where is not None else os.getcwd()
    while folder and not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    try:
        done = subprocess.run(
            # get-url: the remote as git fetches it (after any url.*.insteadOf rewriting)
            ["git", "-C", folder or ".", "remote", "get-url", "origin"],
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
