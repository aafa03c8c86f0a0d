"""One repository, one namespace (issue 27 item 2): the default namespace names the repository
an ``origin`` remote reaches, not the remote's spelling. Real repositories and clones: one bare
repository cloned by path, by ``file://``, through a symlink, without its ``.git``, with a
trailing slash; hosted remotes spelled over https and ssh in any host case; and two different
repositories, which never share a namespace (a relative-path origin gets none: exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mahabharatha.backends.postgres.namespace import derive_namespace
from tests.support.postgres import PgServer

REPO = Path(__file__).resolve().parents[2]


def _git(*args: str, cwd: Path | None = None) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _bare(path: Path) -> Path:
    _git("init", "-q", "--bare", str(path))
    return path


def _clone(source: str, into: Path) -> Path:
    """A checkout of ``source`` (git keeps the spelling given as its ``origin``)."""
    _git("clone", "-q", source, str(into))
    return into


def _checkout_with_origin(into: Path, origin: str) -> Path:
    """A checkout whose ``origin`` is ``origin`` as written (hosted, or relative: no fetch)."""
    _git("init", "-q", str(into))
    _git("-C", str(into), "remote", "add", "origin", origin)
    return into


def _lock(cwd: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("MAHABHARATHA_LOCK_NAMESPACE", None)
    return subprocess.run(
        [sys.executable, "-m", "mahabharatha", "lock", *args, "--backend", url],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_one_bare_repository_cloned_in_five_spellings_is_one_namespace(tmp_path: Path) -> None:
    """Path, ``file://``, a symlinked folder, the path without ``.git`` (git finds
    ``up.git``) and a trailing slash: one namespace. Failed before: ``srv/up`` for the path,
    and for ``file://`` a namespace of its own (``file:///srv/up.git`` read as a host)."""
    bare = _bare(tmp_path / "srv" / "up.git")
    (tmp_path / "link").symlink_to(tmp_path / "srv")
    spellings = [
        str(bare),
        f"file://{bare}",
        str(tmp_path / "link" / "up.git"),
        str(tmp_path / "srv" / "up"),
        f"{bare}/",
    ]
    found = {
        derive_namespace(_clone(spelling, tmp_path / f"checkout{number}"))
        for number, spelling in enumerate(spellings)
    }
    assert found == {str(bare.resolve())}


def test_a_hosted_repository_in_any_spelling_is_one_namespace(tmp_path: Path) -> None:
    """https and ssh (scp-like and ``ssh://``), host and path case (GitHub's paths are
    case-insensitive), ``.git`` or not, trailing and doubled slashes, a user and a port.
    Failed before: ``github.com/Org/Repo`` and ``github.com/org/repo`` were two."""
    spellings = [
        "https://github.com/Org/Repo",
        "git@github.com:org/repo",
        "ssh://git@GitHub.com:22/org/repo.git/",
        "https://token@GITHUB.COM//Org/Repo.git/",
    ]
    found = {
        derive_namespace(_checkout_with_origin(tmp_path / f"c{number}", spelling))
        for number, spelling in enumerate(spellings)
    }
    assert found == {"github.com/org/repo"}


def test_two_repositories_never_share_a_namespace(tmp_path: Path) -> None:
    """Two bare repositories of one name in two folders; on a self-hosted server (paths
    case-sensitive) ``Repo`` and ``repo``: four namespaces."""
    first = _clone(str(_bare(tmp_path / "a" / "up.git")), tmp_path / "one")
    second = _clone(str(_bare(tmp_path / "b" / "up.git")), tmp_path / "two")
    upper = _checkout_with_origin(tmp_path / "upper", "https://git.example.org/team/Repo")
    lower = _checkout_with_origin(tmp_path / "lower", "https://git.example.org/team/repo")
    found = [derive_namespace(checkout) for checkout in (first, second, upper, lower)]
    assert None not in found and len(set(found)) == 4


def test_two_checkouts_of_one_repository_by_path_and_file_url_exclude_each_other(
    pg_server: PgServer, tmp_path: Path
) -> None:
    """The issue's two holders: one bare repository cloned as ``/srv/up.git`` and as
    ``file:///srv/up.git``, each checkout acquiring ``auth-flow`` with no ``--namespace``:
    the second is refused (held). Failed before: two namespaces, both acquired (exit 0)."""
    bare = _bare(tmp_path / "srv" / "up.git")
    by_path = _clone(str(bare), tmp_path / "by-path")
    by_url = _clone(f"file://{bare}", tmp_path / "by-url")
    url = pg_server.url()
    first = _lock(by_path, url, "acquire", "auth-flow", "--pid", str(os.getpid()))
    second = _lock(by_url, url, "acquire", "auth-flow", "--pid", str(os.getpid()), "-n")
    try:
        assert first.returncode == 0, first.stderr
        assert second.returncode == 1, second.stdout + second.stderr
    finally:
        _lock(by_path, url, "release", "auth-flow", "--force")


@pytest.mark.parametrize("origin", ["../up.git", "up", None])
def test_a_checkout_with_no_stable_origin_is_told_to_pass_a_namespace(
    pg_server: PgServer, tmp_path: Path, origin: str | None
) -> None:
    """Two checkouts whose origin is the relative path ``../up.git`` reach two different
    repositories: no namespace is derived, the command exits 2 naming ``--namespace`` (so
    does one with no origin). Failed before: both got the namespace ``../up`` (shared)."""
    if origin is None:
        _git("init", "-q", str(tmp_path / "work"))
        checkout = tmp_path / "work"
    else:
        checkout = _checkout_with_origin(tmp_path / "work", origin)
    said = _lock(checkout, pg_server.url(), "acquire", "auth-flow")
    assert said.returncode == 2, said.stdout + said.stderr
    assert "--namespace" in said.stderr
