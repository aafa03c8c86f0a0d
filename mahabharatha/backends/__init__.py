"""Where locks live: the :class:`~mahabharatha.backends.base.LockBackend` seam and its backends.

:func:`open_backend` is the one place a backend is chosen (by the URL's scheme)."""

from __future__ import annotations

import importlib
import os
from typing import Any, Final

from mahabharatha.backends.base import LockBackend
from mahabharatha.constants import GSD_DIR

__all__ = ["POSTGRES_EXTRA_HINT", "open_backend"]

POSTGRES_SCHEMES: Final = ("postgresql://", "postgres://")
"""The URL schemes that name a PostgreSQL server (libpq accepts both)."""

POSTGRES_EXTRA_HINT: Final = (
    "pip install '.[postgres]' in the mahabharatha checkout (the postgres extra; the package "
    "is on no package index, so 'mahabharatha[postgres]' cannot be fetched by name)"
)
"""What to run when the PostgreSQL backend or its driver is not installed."""


def open_backend(
    url: str | None, gsd_dir: str | os.PathLike[str] = GSD_DIR, **options: Any
) -> LockBackend:
    """The backend a URL names: ``None`` for the folder backend of ``gsd_dir``, a
    ``postgresql://`` (or ``postgres://``) URL for PostgreSQL (``options``: ``namespace``,
    ``connect_timeout``). ``ValueError`` for any other URL; ``RuntimeError`` naming
    :data:`POSTGRES_EXTRA_HINT` when PostgreSQL support is not installed."""
    if url is None:
        from mahabharatha.backends.files import FileBackend

        return FileBackend(gsd_dir)
    if url.startswith(POSTGRES_SCHEMES):
        return _postgres(url, gsd_dir, **options)
    raise ValueError(f"unknown lock backend URL (expected postgresql://...): {url.split(':')[0]}")


def _postgres(url: str, gsd_dir: str | os.PathLike[str], **options: Any) -> LockBackend:
    try:
        postgres = importlib.import_module("mahabharatha.backends.postgres")
    except ImportError as error:  # the module, or psycopg under it, is not installed
        raise RuntimeError(
            f"PostgreSQL locks need the optional driver: {POSTGRES_EXTRA_HINT} ({error})"
        ) from error
    backend: LockBackend = postgres.PostgresBackend.from_url(url, gsd_dir=gsd_dir, **options)
    return backend
