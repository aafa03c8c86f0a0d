"""``--json`` is exactly one JSON document on stdout, whatever the arguments (issue 19, items 9
and 10): usage errors included, and ``lock status --json`` has one shape, success or not.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mahabharatha.cli._output import asks_for_json
from tests.cli._support import (
    FEATURE,
    every_command,
    invoke,
    one_document,
    one_sentence,
    write_lock,
)

COMMANDS: Final = every_command()
"""Every command there is: a command added later is walked too."""

VALUES: Final = (
    FEATURE,
    FEATURE.upper(),
    "0",
    "1",
    "-1",
    "0.01",
    "abc",
    "nan",
    "inf",
    "",
    "a/b",
    "..",
    "warn",
    "--",
    "--bogus",
    "-x",
    "--help-me",
    "postgresql://127.0.0.1:1/none",
)
"""Words a careless user types: names, numbers and not-numbers, options that do not exist.
Never a long number: a wait or a lease of hours would stall the test, not fail it."""

MISSING_DIR: Final = "no-such-gsd-dir"


RUN_UNTIL_STOPPED: Final = frozenset({"--help", "--watch", "--until-done"})
"""Left out: the help (text, not a document, by design) and the watch, which prints a document
per change until Ctrl-C by design (a drawn ``status --watch`` stalled the test until its
timeout; its own tests are in ``tests/cli/test_pool_commands.py``)."""


def _options(command: Any) -> list[str]:
    """Every option of ``command`` but those of :data:`RUN_UNTIL_STOPPED`."""
    names = (opt for param in command.params for opt in (*param.opts, *param.secondary_opts))
    return sorted(n for n in names if n.startswith("-") and n not in RUN_UNTIL_STOPPED)


def _taking_a_value(command: Any) -> set[str]:
    """Options followed by a value: a ``--json`` right after one is that value, not ours."""
    options = (p for p in command.params if p.param_type_name == "option" and not p.is_flag)
    return {opt for param in options for opt in param.opts}


def _arguments(command: Any) -> st.SearchStrategy[list[str]]:
    words = st.sampled_from([*_options(command), *VALUES, MISSING_DIR])
    return st.lists(words, max_size=6)


@contextlib.contextmanager
def _fresh_folder() -> Iterator[Path]:
    """A folder of its own for one example (its default ``.gsd`` too), with a held lock in it."""
    with tempfile.TemporaryDirectory() as folder, contextlib.chdir(folder):
        gsd = Path(folder) / ".gsd"
        write_lock(gsd, "held-feature", pid=1, timestamp=1000.0)  # stale: never waited for
        yield Path(folder)


def _check_one_document(argv: list[str]) -> None:
    with _fresh_folder():
        result = invoke(*argv)
    assert asks_for_json(argv)
    document = one_document(result.stdout)
    assert isinstance(document, dict), result.stdout
    if result.exit_code in (2, 3):
        assert "error" in document, (argv, result.stdout, result.stderr)
        assert one_sentence(result.stderr.splitlines()[-1])


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
@settings(
    max_examples=25,
    deadline=None,
    # The autouse chdir of tests/cli/conftest.py is harmless: each example makes its own folder.
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_json_is_one_document_whatever_the_arguments(
    path: tuple[str, ...], command: Any, data: st.DataObject
) -> None:
    """Random argument lists, valid and not, with ``--json`` among them (before any ``--``).
    Fails on the old code: a usage error printed a boxed message on stderr and nothing on
    stdout, and ``lock status --json`` printed a list."""
    words = data.draw(_arguments(command), label="arguments")
    own = words.index("--") if "--" in words else len(words)
    at = data.draw(st.integers(0, own), label="--json at")
    assume(at == 0 or words[at - 1] not in _taking_a_value(command))
    _check_one_document([*path, *words[:at], "--json", *words[at:]])


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["lock", "acquire", "--bogus"], id="unknown-option"),
        pytest.param(["lock", "acquire"], id="missing-feature"),
        pytest.param(["lock", "acquire", FEATURE, "-w", "abc"], id="wait-not-a-number"),
        pytest.param(["lock", "acquire", FEATURE, "--lease", "0"], id="lease-0"),
        pytest.param(["lock", "run", FEATURE], id="run-without-command"),
        pytest.param(["lock", "nosuchcommand"], id="unknown-command"),
    ],
)
def test_a_usage_error_with_json_is_one_document_with_an_error_and_exit_2(
    argv: list[str],
) -> None:
    """Fails on the old code: stdout was empty (the message was a box on stderr)."""
    result = invoke(*argv, "--json")

    assert result.exit_code == 2
    assert set(one_document(result.stdout)) == {"error"}
    assert "╭" not in result.stderr
    one_sentence(result.stderr)


def test_a_usage_error_without_json_keeps_typers_message() -> None:
    result = invoke("lock", "acquire", "--bogus")

    assert result.exit_code == 2 and result.stdout == ""
    assert "No such option: --bogus" in result.stderr


def test_json_after_the_double_dash_is_the_commands_not_ours(tmp_path: Path) -> None:
    assert asks_for_json(["lock", "run", FEATURE, "--json", "--", "x"])
    assert not asks_for_json(["lock", "run", FEATURE, "--", "x", "--json"])


STATUS_DOCUMENT_KEYS: Final = {"version", "features", "summary"}


def test_status_json_is_one_versioned_object_on_success_and_on_error(gsd: Path) -> None:
    """Fails on the old code: a list on success, an object on error."""
    write_lock(gsd, FEATURE, pid=1, timestamp=1000.0)

    found = invoke("lock", "status", "--json", "--gsd-dir", gsd)
    failed = invoke("lock", "status", "--json", "--gsd-dir", gsd / "typo")

    ok, error = one_document(found.stdout), one_document(failed.stdout)
    assert (found.exit_code, failed.exit_code) == (0, 2)
    assert set(ok) == STATUS_DOCUMENT_KEYS and set(error) == STATUS_DOCUMENT_KEYS | {"error"}
    assert ok["version"] == error["version"] == 1
    assert [entry["feature"] for entry in ok["features"]] == [FEATURE]
    assert error["features"] == [] and set(error["summary"]) == set(ok["summary"])
    assert ok["summary"]["features"] == 1 and ok["summary"]["stale"] == 1
