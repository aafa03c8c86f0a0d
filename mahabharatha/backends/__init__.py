"""Where locks live: the :class:`~mahabharatha.backends.base.LockBackend` seam and its backends.

:func:`open_backend` is the one place a backend is chosen (by the URL's scheme)."""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import re
import threading
from typing import Any, Final

from mahabharatha.backends.base import LockBackend
from mahabharatha.constants import GSD_DIR, LOCK_URL_ENV, NAMESPACE_ENV

POSTGRES_SCHEMES: Final = ("postgresql://", "postgres://")  # libpq accepts both
# A URL's scheme, the only part of an unknown URL that a message repeats.
_SCHEME: Final = re.compile(r"([A-Za-z][A-Za-z0-9+.-]{0,20})://")
# What to run when the PostgreSQL backend or its driver is not installed.
POSTGRES_EXTRA_HINT: Final = (
    "pip install '.[postgres]' in the mahabharatha checkout (the postgres extra; the package "
    "is on no package index, so 'mahabharatha[postgres]' cannot be fetched by name)"
)


def open_backend(
    url: str | None, gsd_dir: str | os.PathLike[str] = GSD_DIR, **options: Any
) -> LockBackend:
    """The backend a URL names (``None``: the folder of ``gsd_dir``); ``ValueError`` for an
    unknown URL, ``RuntimeError`` when PostgreSQL support is not installed."""
    if url is None:
        from mahabharatha.backends.files.backend import FileBackend

        return FileBackend(gsd_dir)
    if url.startswith(POSTGRES_SCHEMES):
        backend: LockBackend = _postgres_module().PostgresBackend(url, gsd_dir=gsd_dir, **options)
        return backend
    # Never the URL itself: a libpq key=value string ("host=db password=...") is all secret.
    scheme = _SCHEME.match(url)
    named = f" ({scheme.group(1)}://)" if scheme else ""
    raise ValueError(
        f"unknown lock backend URL{named}: expected a postgresql:// or postgres:// URL "
        "(a libpq key=value string is not accepted)"
    )


def _postgres_module() -> Any:
    try:
        return importlib.import_module("mahabharatha.backends.postgres.backend")
    except ImportError as error:  # the module, or psycopg under it, is not installed
        raise RuntimeError(
            f"PostgreSQL locks need the optional driver: {POSTGRES_EXTRA_HINT} ({error})"
        ) from error


def load_backend_code(url: str | None) -> None:
    """Import the backends' code a command on ``url`` uses, opening nothing: workers forked
    afterwards share the import."""
    importlib.import_module("mahabharatha.backends.files.backend")
    if url is not None and url.startswith(POSTGRES_SCHEMES):
        with contextlib.suppress(RuntimeError):
            _postgres_module()


def url_holds_password(url: str) -> bool:
    """Does ``url`` carry a password (``user:PASSWORD@host``, or a ``password`` parameter)?"""
    rest = url.partition("://")[2]
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if authority.rpartition("@")[0].partition(":")[2]:
        return True
    query = rest.partition("?")[2].partition("#")[0]
    return any(
        name == "password" and value
        for name, _, value in (part.partition("=") for part in query.split("&"))
    )


def lock_url() -> str | None:
    """The lock server ``MAHABHARATHA_LOCK_URL`` names, or None (files)."""
    return os.environ.get(LOCK_URL_ENV) or None


_SHARED: dict[tuple[int, str, str, str | None], LockBackend] = {}
_SHARED_GUARD = threading.Lock()  # Race: two threads' first use each opening a backend


def shared_backend(url: str | None, gsd_dir: str | os.PathLike[str] = GSD_DIR) -> LockBackend:
    """The backend of ``url`` for callers that pass none: a server's is opened once per
    process, URL, folder and namespace, kept warm and closed at exit (never across a fork)."""
    if url is None:
        return open_backend(None, gsd_dir)
    key = (os.getpid(), url, os.fspath(gsd_dir), os.environ.get(NAMESPACE_ENV))
    with _SHARED_GUARD:
        backend = _SHARED.get(key)
        if backend is None:
            backend = _SHARED[key] = open_backend(url, gsd_dir)
        return backend


@atexit.register
def _close_shared() -> None:
    mine = os.getpid()
    for (pid, *_), backend in list(_SHARED.items()):
        if pid == mine:
            backend.close()
    _SHARED.clear()
