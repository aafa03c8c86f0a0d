"""A feature name that differs only by case from an existing feature folder is warned about
(issue 19, item 8): on a case-sensitive file system it is a second feature nobody else sees; on
a case-insensitive one it is the same folder, and the warning says whose lock is taken."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Final

import pytest

from mahabharatha.cli.lock import case_warnings
from tests.cli._support import invoke, lock_path, one_sentence, write_lock
from tests.support.marks import needs_symlinks

EXISTING: Final = "auth-flow"
TYPED: Final = "AUTH-FLOW"
PY: Final = sys.executable


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["acquire", TYPED, "--pid", "1"], id="acquire"),
        pytest.param(["claim", TYPED, "--pid", "1"], id="claim"),
        pytest.param(["run", TYPED, "--", PY, "-c", "pass"], id="run"),
    ],
)
def test_a_name_differing_only_by_case_from_a_feature_is_warned_about(
    gsd: Path, argv: list[str]
) -> None:
    """Fails on the old code: a second feature was made in silence."""
    write_lock(gsd, EXISTING, pid=1, timestamp=1000.0)
    options = ["--gsd-dir", str(gsd)]
    at = argv.index("--") if "--" in argv else len(argv)

    result = invoke("lock", *argv[:at], *options, *argv[at:])

    assert result.exit_code == 0, result.stderr
    said = one_sentence(result.stderr)
    assert f"'{TYPED}' differs only by case from the feature '{EXISTING}'" in said
    assert lock_path(gsd, EXISTING).read_text() == "1:1000.0", "the other feature is untouched"


def test_the_same_name_or_another_name_is_not_warned_about(gsd: Path) -> None:
    (gsd / "specs" / EXISTING).mkdir(parents=True)

    same = invoke("lock", "acquire", EXISTING, "--gsd-dir", gsd, "--pid", "1")
    other = invoke("lock", "acquire", "billing", "--gsd-dir", gsd, "--pid", "1")

    assert (same.exit_code, other.exit_code) == (0, 0)
    assert same.stderr == other.stderr == ""


@needs_symlinks
def test_on_a_case_insensitive_file_system_the_warning_names_the_lock_taken(gsd: Path) -> None:
    """Where the two names reach one folder (simulated: TYPED is a link to EXISTING, as a
    case-insensitive file system resolves it), the warning says which folder's lock it is."""
    specs = gsd / "specs"
    (specs / EXISTING).mkdir(parents=True)
    (specs / TYPED).symlink_to(EXISTING)

    [warning] = case_warnings(str(gsd), TYPED)

    assert f"'{TYPED}' is the folder '{EXISTING}' on this case-insensitive file system" in warning
    assert str(specs / EXISTING / ".lock") in warning
