"""Which file an OS error names: the step that raises it says so, nothing guesses.

Errors from calls relative to the feature folder's descriptor name a bare file (``.lock``, a
temp); ``OpenFeatureDir`` turns that into the full path. An error that names no file is left as
it is: it is not about a file of the folder unless the code that raised it says so.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from mahabharatha.backends.files import lockfile
from mahabharatha.commands import _utils

FEATURE = "feat"


def test_an_error_naming_no_file_passes_the_folder_descriptor_unchanged(tmp_path: Path) -> None:
    """Fails before the fix: ``OpenFeatureDir.__exit__`` rewrote every ``OSError`` of its block,
    naming ``<folder>/.lock`` for an error that was about no file at all."""
    gsd = str(tmp_path / "gsd")
    error = OSError(errno.EIO, "not about any file")
    with pytest.raises(OSError) as caught, lockfile.OpenFeatureDir(gsd, FEATURE, create=True):
        raise error
    assert caught.value is error
    assert caught.value.filename is None


def test_a_failed_write_of_the_lock_names_the_lock_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write of the record fails with no file name (``write`` on a descriptor): the publish
    step names the lock it was writing, and the folder's descriptor makes that a full path."""
    gsd = tmp_path / "gsd"

    def disk_full(_fd: int, _data: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", disk_full)
    with pytest.raises(OSError) as caught:
        _utils.acquire_feature_lock(FEATURE, str(gsd))
    monkeypatch.undo()
    assert caught.value.errno == errno.ENOSPC
    assert caught.value.filename == str(gsd / "specs" / FEATURE / ".lock")
    assert not (gsd / "specs" / FEATURE / ".lock").exists()
