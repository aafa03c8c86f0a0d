"""The CLI in-process: input checking, exit codes, JSON documents, status, clean and the audit log.

Each test drives ``mahabharatha.cli.app`` through Typer's ``CliRunner`` with an explicit
``--gsd-dir``. Ownership is always given with ``--pid`` here: in-process, "the caller's parent"
would be whatever started pytest (ownership by default is proven across real processes in
``test_cli_processes.py``). Every output is checked for tracebacks by ``invoke``.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Final

import pytest
from typer.testing import CliRunner

from mahabharatha.cli import app
from tests.cli._support import (
    FEATURE,
    STALE_AFTER_SECONDS,
    STATUS_KEYS,
    audit_lines,
    dead_pid,
    invoke,
    lock_path,
    one_document,
    one_sentence,
    read_record,
    write_lock,
)
from tests.support.marks import needs_fifo, needs_symlinks
from tests.support.owner_details import details_for

ME: Final = os.getpid()
OTHER: Final = 4_000_000
"""A valid pid that is not the test's (no --reclaim-dead anywhere here, so liveness is moot)."""

BAD_NAMES: Final = [
    pytest.param("..", id="dotdot"),
    pytest.param("a..b", id="inner-dotdot"),
    pytest.param("a/b", id="slash"),
    pytest.param("a\\b", id="backslash"),
    pytest.param(".hidden", id="leading-dot"),
    pytest.param("feat\n", id="trailing-newline"),
    pytest.param("", id="empty"),
    pytest.param("f\u00e9at", id="non-ascii"),
    pytest.param("x" * 256, id="too-long"),
]


def fresh(timestamp_offset: float = 0.0) -> dict[str, Any]:
    return {"timestamp": time.time() + timestamp_offset}


def touch(marker: Path) -> str:
    """A ``python -c`` program that leaves ``marker`` behind if it ever runs."""
    return f"open({str(marker)!r}, 'w').close()"


def tree(root: Path) -> dict[str, str]:
    """Every entry under ``root`` with what identifies it (content, link target or kind)."""
    found: dict[str, str] = {}
    for entry in sorted(root.rglob("*")):
        key = str(entry.relative_to(root))
        if entry.is_symlink():
            found[key] = "link->" + os.readlink(entry)
        elif entry.is_fifo():
            found[key] = "fifo"
        elif entry.is_dir():
            found[key] = "dir"
        else:
            found[key] = entry.read_text()
    return found


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("name", BAD_NAMES)
def test_acquire_rejects_a_bad_feature_name_with_exit_2_and_one_line(gsd: Path, name: str) -> None:
    result = invoke("lock", "acquire", name, "--gsd-dir", gsd, "--pid", ME)

    assert result.exit_code == 2
    assert "Invalid feature name" in one_sentence(result.stderr)
    assert list(gsd.iterdir()) == [], "nothing may be created for a rejected name"


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["lock", "acquire"], id="acquire"),
        pytest.param(["lock", "release"], id="release"),
        pytest.param(["lock", "check"], id="check"),
        pytest.param(["lock", "claim"], id="claim"),
    ],
)
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_every_lock_command_rejects_a_bad_name_with_exit_2(
    gsd: Path, command: list[str], as_json: bool
) -> None:
    result = invoke(*command, "a/../b", "--gsd-dir", gsd, *(["--json"] if as_json else []))

    assert result.exit_code == 2
    assert "Invalid feature name" in one_sentence(result.stderr)
    if as_json:
        document = one_document(result.stdout)
        assert "error" in document
    assert list(gsd.iterdir()) == []


def test_run_rejects_a_bad_name_without_running_cmd(gsd: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    result = invoke(
        "lock", "run", "--gsd-dir", gsd, "..", "--", sys.executable, "-c", touch(marker)
    )

    assert result.exit_code == 2
    assert "Invalid feature name" in one_sentence(result.stderr)
    assert not marker.exists()


@pytest.mark.parametrize("pid", [0, 4_194_305], ids=["zero", "above-max"])
def test_acquire_rejects_an_impossible_pid_with_exit_2(gsd: Path, pid: int) -> None:
    result = invoke("lock", "acquire", FEATURE, "--gsd-dir", gsd, "--pid", pid)

    assert result.exit_code == 2
    one_sentence(result.stderr)
    assert not lock_path(gsd).exists()


# --------------------------------------------------------------------------- acquire and release


def test_acquire_json_is_one_document_and_records_the_pid(gsd: Path) -> None:
    result = invoke("lock", "acquire", FEATURE, "--gsd-dir", gsd, "--pid", OTHER, "--json")

    assert result.exit_code == 0
    assert "error" not in one_document(result.stdout)
    assert read_record(lock_path(gsd))[0] == OTHER


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_acquire_of_a_held_lock_exits_1_naming_the_holder(gsd: Path, as_json: bool) -> None:
    path = write_lock(gsd, pid=OTHER, **fresh())
    before = path.read_text()

    result = invoke(
        "lock", "acquire", FEATURE, "--gsd-dir", gsd, "--pid", ME, *(["--json"] if as_json else [])
    )

    assert result.exit_code == 1
    sentence = one_sentence(result.stderr)
    assert str(OTHER) in sentence
    assert re.search(r"\bexpir", sentence), "the sentence says when the lock expires"
    assert re.search(r"\b(ago|age|since)\b", sentence), "the sentence says how old the lock is"
    if as_json:
        assert "error" in one_document(result.stdout)
    assert path.read_text() == before


def test_acquire_treats_a_fresh_empty_lock_as_being_written(gsd: Path) -> None:
    path = write_lock(gsd, content="")

    result = invoke("lock", "acquire", FEATURE, "--gsd-dir", gsd, "--pid", ME)

    assert result.exit_code == 1
    assert path.read_text() == ""


def test_release_of_another_owners_lock_exits_1_and_leaves_it_even_when_stale(gsd: Path) -> None:
    path = write_lock(gsd, pid=OTHER, **fresh(-STALE_AFTER_SECONDS - 100))
    before = path.read_text()

    result = invoke("lock", "release", FEATURE, "--gsd-dir", gsd, "--pid", ME, "--json")

    assert result.exit_code == 1
    assert "error" in one_document(result.stdout)
    assert path.read_text() == before
    assert audit_lines(gsd) == []


def test_release_of_own_lock_removes_it_and_nothing_to_release_is_fine(gsd: Path) -> None:
    assert invoke("lock", "acquire", FEATURE, "--gsd-dir", gsd, "--pid", ME).exit_code == 0

    first = invoke("lock", "release", FEATURE, "--gsd-dir", gsd, "--pid", ME, "--json")
    again = invoke("lock", "release", FEATURE, "--gsd-dir", gsd, "--pid", ME, "--json")

    assert (first.exit_code, again.exit_code) == (0, 0)
    one_document(first.stdout)
    one_document(again.stdout)
    assert not lock_path(gsd).exists()
    assert audit_lines(gsd) == [], "an owner's own release is not an audited event"


def test_forced_release_removes_another_owners_lock_and_writes_one_audit_line(gsd: Path) -> None:
    write_lock(gsd, pid=OTHER, **fresh())

    result = invoke("lock", "release", FEATURE, "--gsd-dir", gsd, "--pid", ME, "--force")

    assert result.exit_code == 0
    assert not lock_path(gsd).exists()
    [line] = audit_lines(gsd)
    assert line["feature"] == FEATURE
    assert str(OTHER) in str(line), "the audit line keeps the record it removed"


def test_acquire_over_a_stale_lock_reclaims_it_with_one_audit_line(gsd: Path) -> None:
    write_lock(gsd, pid=OTHER, **fresh(-STALE_AFTER_SECONDS - 100))

    result = invoke("lock", "acquire", FEATURE, "--gsd-dir", gsd, "--pid", ME)

    assert result.exit_code == 0
    assert read_record(lock_path(gsd))[0] == ME
    [line] = audit_lines(gsd)
    assert line["feature"] == FEATURE
    assert str(OTHER) in str(line)


def test_acquire_over_an_active_lock_writes_no_audit_line(gsd: Path) -> None:
    write_lock(gsd, pid=OTHER, **fresh())

    assert invoke("lock", "acquire", FEATURE, "--gsd-dir", gsd, "--pid", ME).exit_code == 1
    assert audit_lines(gsd) == []


@pytest.mark.parametrize(
    ("command", "busy_code"),
    [
        pytest.param(["acquire", FEATURE, "--pid", ME], 1, id="acquire"),
        # Held by another: 75, "none free now" (revision 4); 1 is "nothing left to claim".
        pytest.param(["claim", FEATURE, "--pid", ME], 75, id="claim"),
        pytest.param(
            ["run", "--timeout", 0, FEATURE, "--", sys.executable, "-c", "pass"], 75, id="run"
        ),
    ],
)
@pytest.mark.parametrize("reclaim_dead", [False, True], ids=["age-only", "reclaim-dead"])
def test_a_dead_owners_active_lock_is_taken_only_with_reclaim_dead(
    gsd: Path, command: list[object], busy_code: int, reclaim_dead: bool
) -> None:
    gone = dead_pid()
    path = write_lock(gsd, pid=gone, **fresh())
    before = path.read_text()
    verb, *rest = command
    flag = ["--reclaim-dead"] if reclaim_dead else []

    result = invoke("lock", verb, "--gsd-dir", gsd, *flag, *rest)

    if reclaim_dead:
        assert result.exit_code == 0, result.stderr
        assert not path.exists() or read_record(path)[0] != gone
        [line] = audit_lines(gsd)
        assert line["feature"] == FEATURE
        assert str(gone) in str(line)
    else:
        assert result.exit_code == busy_code
        assert path.read_text() == before, "a pid alone never frees a lock without the flag"
        assert audit_lines(gsd) == []


# --------------------------------------------------------------------------- check


def _no_lock(gsd: Path) -> None:
    pass


def _held(gsd: Path) -> None:
    write_lock(gsd, pid=ME, **fresh())


def _stale(gsd: Path) -> None:
    write_lock(gsd, pid=ME, **fresh(-STALE_AFTER_SECONDS - 100))


def _corrupt(gsd: Path) -> None:
    write_lock(gsd, content="not a lock record")


@pytest.mark.parametrize(
    ("setup", "code", "state"),
    [
        pytest.param(_no_lock, 0, "free", id="free"),
        pytest.param(_held, 1, "active", id="held"),
        pytest.param(_stale, 0, "stale", id="stale"),
        pytest.param(_corrupt, 0, "corrupt", id="corrupt"),
    ],
)
def test_check_exits_0_when_free_1_when_held_and_json_describes_the_lock(
    gsd: Path, setup: Any, code: int, state: str
) -> None:
    setup(gsd)

    text = invoke("lock", "check", FEATURE, "--gsd-dir", gsd)
    result = invoke("lock", "check", FEATURE, "--gsd-dir", gsd, "--json")

    assert (text.exit_code, result.exit_code) == (code, code)
    document = one_document(result.stdout)
    assert document.keys() >= STATUS_KEYS
    assert (document["feature"], document["state"]) == (FEATURE, state)
    if state == "active":
        assert document["pid"] == ME
        assert document["owner"] == "running"
        assert 0 <= document["age_seconds"] < 60
        assert STALE_AFTER_SECONDS - 60 < document["expires_in_seconds"] <= STALE_AFTER_SECONDS
    else:
        assert document["expires_in_seconds"] is None
    if state in ("free", "corrupt"):
        assert (document["pid"], document["timestamp"]) == (None, None)


# --------------------------------------------------------------------------- status and clean


@pytest.fixture
def crowded(gsd: Path, tmp_path: Path) -> dict[str, Path]:
    """A specs folder with a lock in every state, temp files and a folder without a lock."""
    gone = dead_pid()
    paths = {
        "active-feat": write_lock(gsd, "active-feat", pid=ME, **fresh()),
        "dead-owner": write_lock(gsd, "dead-owner", pid=gone, **fresh()),
        "reused-pid": write_lock(
            gsd,
            "reused-pid",
            pid=ME,
            details=details_for(ME, start=1, pgid=None, sid=None),
            **fresh(-3600),
        ),
        "stale-feat": write_lock(gsd, "stale-feat", pid=OTHER, **fresh(-STALE_AFTER_SECONDS - 5)),
        "corrupt-feat": write_lock(gsd, "corrupt-feat", content="7:1e9"),
        "old-empty": write_lock(gsd, "old-empty", content=""),
    }
    an_hour_ago = time.time() - 3600
    os.utime(paths["old-empty"], (an_hour_ago, an_hour_ago))

    target = tmp_path / "elsewhere.txt"
    target.write_text(f"{ME}:{time.time()}")
    link = lock_path(gsd, "link-feat")
    link.parent.mkdir(parents=True)
    link.symlink_to(target)
    paths["link-feat"] = link

    fifo = lock_path(gsd, "fifo-feat")
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    paths["fifo-feat"] = fifo

    (gsd / "specs" / "no-lock").mkdir()
    orphan = lock_path(gsd, "stale-feat").with_name(f".lock.{gone}.0123abcd.tmp")
    orphan.write_text("99:1.0")
    paths["orphan-temp"] = orphan
    live = lock_path(gsd, "active-feat").with_name(f".lock.{ME}.4567cdef.tmp")
    live.write_text("99:1.0")
    paths["live-temp"] = live
    # Last, so that it is still younger than the 2 s grace when the command looks at it.
    paths["writing-feat"] = write_lock(gsd, "writing-feat", content="")
    return paths


STATES: Final = {
    "active-feat": "active",
    "dead-owner": "active",
    "reused-pid": "active",
    "stale-feat": "stale",
    "corrupt-feat": "corrupt",
    "old-empty": "corrupt",
    "writing-feat": "writing",
    "link-feat": "not-a-file",
    "fifo-feat": "not-a-file",
}
REMOVABLE: Final = ("stale-feat", "corrupt-feat", "old-empty", "link-feat", "fifo-feat")
OWNER_GONE: Final = ("dead-owner", "reused-pid")
"""Active by age, but their owner is provably gone here: only --reclaim-dead removes them."""
KEPT: Final = ("active-feat", "writing-feat", *OWNER_GONE)


@needs_fifo
@needs_symlinks
def test_status_json_lists_every_lock_with_its_state(gsd: Path, crowded: dict[str, Path]) -> None:
    result = invoke("lock", "status", "--gsd-dir", gsd, "--json")

    assert result.exit_code == 0
    documents = one_document(result.stdout)["features"]
    assert isinstance(documents, list)
    by_feature = {document["feature"]: document for document in documents}
    assert len(by_feature) == len(documents), "one object per feature folder"
    assert {name: d["state"] for name, d in by_feature.items()} == STATES
    for document in documents:
        assert document.keys() >= STATUS_KEYS
        active = document["state"] == "active"
        assert (document["expires_in_seconds"] is not None) == active
    assert by_feature["active-feat"]["pid"] == ME
    owners = {name: by_feature[name]["owner"] for name in ("active-feat", *OWNER_GONE)}
    assert owners == {
        "active-feat": "running",
        "dead-owner": "not-running",
        "reused-pid": "pid-reused",
    }
    assert by_feature["stale-feat"]["pid"] == OTHER
    for name in ("corrupt-feat", "writing-feat", "link-feat", "fifo-feat"):
        assert (by_feature[name]["pid"], by_feature[name]["timestamp"]) == (None, None)


@needs_fifo
@needs_symlinks
def test_status_for_a_person_names_every_locked_feature(
    gsd: Path, crowded: dict[str, Path]
) -> None:
    result = invoke("lock", "status", "--gsd-dir", gsd)

    assert result.exit_code == 0
    for name in STATES:
        assert name in result.stdout
    assert "no-lock" not in result.stdout


@pytest.mark.parametrize("made", ["gsd", "specs"], ids=["no-specs-folder", "empty-specs"])
def test_status_with_no_locks_is_an_empty_list(gsd: Path, made: str) -> None:
    if made == "specs":
        (gsd / "specs" / "idle").mkdir(parents=True)
    gsd.mkdir(exist_ok=True)  # a missing gsd folder is a typo: tests/cli/test_options.py

    result = invoke("lock", "status", "--gsd-dir", gsd, "--json")

    assert result.exit_code == 0
    assert one_document(result.stdout)["features"] == []


@needs_fifo
@needs_symlinks
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_clean_dry_run_lists_what_it_would_remove_and_removes_nothing(
    gsd: Path, crowded: dict[str, Path], as_json: bool
) -> None:
    before = tree(gsd)

    result = invoke(
        "lock", "clean", "--gsd-dir", gsd, "--dry-run", *(["--json"] if as_json else [])
    )

    assert result.exit_code == 0
    listing = str(one_document(result.stdout)) if as_json else result.stdout
    assert tree(gsd) == before
    for name in (*REMOVABLE, "orphan-temp"):
        assert str(crowded[name]) in listing, name
    for name in (*KEPT, "live-temp"):
        assert str(crowded[name]) not in listing, name
    assert audit_lines(gsd) == []


@needs_fifo
@needs_symlinks
def test_clean_removes_stale_corrupt_non_file_and_orphans_and_leaves_live_locks(
    gsd: Path, crowded: dict[str, Path], tmp_path: Path
) -> None:
    kept_content = {name: crowded[name].read_text() for name in (*KEPT, "live-temp")}

    result = invoke("lock", "clean", "--gsd-dir", gsd, "--json")

    assert result.exit_code == 0
    one_document(result.stdout)
    for name in (*REMOVABLE, "orphan-temp"):
        assert not os.path.lexists(crowded[name]), name
    for name, content in kept_content.items():
        assert crowded[name].read_text() == content, name
    assert (tmp_path / "elsewhere.txt").exists(), "a symlink goes, never its target"
    assert (gsd / "specs" / "no-lock").is_dir()
    lines = audit_lines(gsd)
    assert sorted(line["feature"] for line in lines) == sorted(REMOVABLE)


@needs_fifo
@needs_symlinks
def test_clean_reclaim_dead_also_removes_locks_whose_owner_is_gone(
    gsd: Path, crowded: dict[str, Path]
) -> None:
    result = invoke("lock", "clean", "--gsd-dir", gsd, "--reclaim-dead")

    assert result.exit_code == 0
    for name in (*REMOVABLE, *OWNER_GONE):
        assert not os.path.lexists(crowded[name]), name
    for name in ("active-feat", "writing-feat"):
        assert crowded[name].exists(), name
    assert sorted(line["feature"] for line in audit_lines(gsd)) == sorted((*REMOVABLE, *OWNER_GONE))


@needs_fifo
@needs_symlinks
def test_a_second_clean_finds_nothing_more(gsd: Path, crowded: dict[str, Path]) -> None:
    assert invoke("lock", "clean", "--gsd-dir", gsd).exit_code == 0
    after_first = (tree(gsd / "specs"), len(audit_lines(gsd)))

    assert invoke("lock", "clean", "--gsd-dir", gsd).exit_code == 0

    assert (tree(gsd / "specs"), len(audit_lines(gsd))) == after_first


# --------------------------------------------------------------------------- OS errors


def test_a_directory_at_the_lock_path_exits_3_with_a_sentence_naming_it(gsd: Path) -> None:
    path = lock_path(gsd)
    path.mkdir(parents=True)

    result = invoke("lock", "acquire", FEATURE, "--gsd-dir", gsd, "--pid", ME)
    as_json = invoke("lock", "acquire", FEATURE, "--gsd-dir", gsd, "--pid", ME, "--json")

    assert (result.exit_code, as_json.exit_code) == (3, 3)
    assert str(path) in one_sentence(result.stderr)
    assert "error" in one_document(as_json.stdout)
    assert path.is_dir()


@pytest.mark.parametrize("command", ["acquire", "claim"])
def test_a_file_in_place_of_the_gsd_folder_exits_3_with_one_sentence(
    gsd: Path, command: str
) -> None:
    gsd.rmdir()
    gsd.write_text("not a folder")

    given = invoke("lock", command, FEATURE, "--gsd-dir", gsd, "--pid", ME, "--json")
    result = invoke("lock", command, FEATURE, "--gsd-dir", gsd, "--create", "--pid", ME, "--json")

    assert given.exit_code == 2 and "not a folder" in one_sentence(given.stderr)
    assert result.exit_code == 3  # told to create it: the file in the way is an OS error
    one_sentence(result.stderr)
    assert "error" in one_document(result.stdout)
    assert gsd.read_text() == "not a folder"


def test_release_with_a_directory_at_the_lock_path_exits_3_and_leaves_it(gsd: Path) -> None:
    path = lock_path(gsd)
    path.mkdir(parents=True)

    result = invoke("lock", "release", FEATURE, "--gsd-dir", gsd, "--pid", ME)

    assert result.exit_code == 3
    one_sentence(result.stderr)
    assert path.is_dir()


@needs_symlinks
@pytest.mark.parametrize("command", ["acquire", "run"])
def test_a_symlinked_feature_folder_exits_3_and_nothing_is_written_through_it(
    gsd: Path, tmp_path: Path, command: str
) -> None:
    target = tmp_path / "outside"
    target.mkdir()
    (gsd / "specs").mkdir(parents=True)
    (gsd / "specs" / FEATURE).symlink_to(target)
    marker = tmp_path / "ran"
    tail = ["--pid", ME] if command == "acquire" else ["--", sys.executable, "-c", touch(marker)]

    result = invoke("lock", command, "--gsd-dir", gsd, FEATURE, *tail)

    assert result.exit_code == 3
    one_sentence(result.stderr)
    assert list(target.iterdir()) == []
    assert not marker.exists()


# --------------------------------------------------------------------------- feature detect


def test_feature_detect_prints_the_env_var(gsd: Path) -> None:
    result = invoke(
        "feature", "detect", "--gsd-dir", gsd, env={"MAHABHARATHA_FEATURE": " billing "}
    )

    assert result.exit_code == 0
    assert result.stdout.strip() == "billing"


def test_feature_detect_reads_current_feature_of_the_given_gsd_dir(tmp_path: Path) -> None:
    (tmp_path / ".gsd").mkdir()
    (tmp_path / ".gsd" / ".current-feature").write_text("not-this-one\n")
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / ".current-feature").write_text("search-v2\n")

    default = invoke("feature", "detect", "--json")
    given = invoke("feature", "detect", "--gsd-dir", other, "--json")

    assert (default.exit_code, given.exit_code) == (0, 0)
    assert "not-this-one" in str(one_document(default.stdout))
    assert "search-v2" in str(one_document(given.stdout))
    assert "not-this-one" not in given.stdout


def test_feature_detect_exits_1_when_nothing_names_a_feature(tmp_path: Path) -> None:
    text = invoke("feature", "detect", "--gsd-dir", tmp_path)
    as_json = invoke("feature", "detect", "--gsd-dir", tmp_path, "--json")

    assert (text.exit_code, as_json.exit_code) == (1, 1)
    one_sentence(text.stderr)
    assert text.stdout == ""
    assert "error" in one_document(as_json.stdout)


@pytest.mark.parametrize(
    ("words", "expected"),
    [("mahabharatha lock ac", "acquire"), ("mahabharatha fea", "feature")],
)
def test_shell_completion_offers_the_commands(words: str, expected: str) -> None:
    env = {
        "_MAHABHARATHA_COMPLETE": "complete_bash",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split()) - 1),
    }
    result = CliRunner().invoke(app, [], env=env, prog_name="mahabharatha")
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == [expected]
