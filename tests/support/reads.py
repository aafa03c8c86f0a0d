"""Read failures for the tests that specify how the legacy functions survive them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


def fail_read_text(monkeypatch: pytest.MonkeyPatch, file_name: str, exc: Exception) -> None:
    """Make ``Path.read_text`` raise ``exc`` for files named ``file_name`` (as the old tests do)."""
    original = Path.read_text

    def read_text(self: Path, *args: Any, **kwargs: Any) -> str:
        if self.name == file_name:
            raise exc
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
