"""An empty ``gsd_dir`` is today's directory everywhere in the library (issue 16, item 12).

Fails before the fix: the lock functions built ``f"{gsd_dir}/specs/F"``, so ``""`` locked
``/specs/F`` in the root folder while the listings (``os.path.join``, ``pathlib``) looked in
``./specs``: a lock nobody else saw.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mahabharatha import locks
from mahabharatha.commands import _utils


def test_every_function_reads_an_empty_gsd_dir_as_todays_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert _utils.acquire_feature_lock("legacy", "")
    held = locks.acquire("layer", "")
    assert (tmp_path / "specs" / "legacy" / ".lock").is_file()
    assert (tmp_path / "specs" / "layer" / ".lock").is_file()
    assert [info.feature for info in locks.status("")] == ["layer", "legacy"]
    assert _utils.check_feature_lock("legacy", "") is not None
    _utils.release_feature_lock("legacy", "")
    locks.release("layer", "", pid=held.pid)
    assert not (tmp_path / "specs" / "legacy" / ".lock").exists()
    assert not (tmp_path / "specs" / "layer" / ".lock").exists()


@pytest.mark.parametrize(
    "args",
    [
        ("lock", "acquire", "f"),
        ("lock", "acquire", "f", "--create"),
        ("lock", "check", "f"),
        ("lock", "status"),
        ("lock", "claim"),
        ("lock", "run", "f", "--", "true"),
    ],
    ids=["acquire", "acquire-create", "check", "status", "claim", "run"],
)
def test_an_empty_gsd_dir_on_the_cli_is_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...]
) -> None:
    """``--gsd-dir "$GSD"`` with ``GSD`` unset: exit 2 and nothing made anywhere."""
    from tests.cli._support import invoke

    monkeypatch.chdir(tmp_path)
    command, verb, *rest = args
    split = rest.index("--") if "--" in rest else len(rest)
    result = invoke(command, verb, *rest[:split], "--gsd-dir", "", *rest[split:])
    assert result.exit_code == 2, result.output
    assert "--gsd-dir is empty" in result.stderr
    assert list(tmp_path.iterdir()) == []
