"""Messages that say what to do: each sentence a person reads after a refusal or a wait."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cli._support import (
    FEATURE,
    invoke,
    lock_of_a_dead_process,
    one_document,
    one_sentence,
    write_lock,
)

ME = os.getpid()


HolderOf = Callable[[Any], Any]
"""Where a command's JSON document keeps the holder."""

COMMANDS_THAT_REPORT_THE_HOLDER: dict[str, tuple[list[Any], HolderOf]] = {
    "acquire": (["lock", "acquire", FEATURE, "--pid", ME], lambda doc: doc["holder"]),
    "run": (["lock", "run", FEATURE, "--timeout", "0"], lambda doc: doc["holder"]),
    "check": (["lock", "check", FEATURE], lambda doc: doc),
    "status": (["lock", "status"], lambda doc: doc["features"][0]),
}


@pytest.mark.parametrize("command", sorted(COMMANDS_THAT_REPORT_THE_HOLDER))
def test_a_dead_holder_is_not_running_in_every_command(gsd: Path, command: str) -> None:
    """One judgement of the owner in acquire, run, check and status.
    Fails before the fix: acquire and run said ``unknown`` where status said ``not-running``."""
    lock_of_a_dead_process(gsd)
    argv, holder = COMMANDS_THAT_REPORT_THE_HOLDER[command]
    result = invoke(*argv, "--gsd-dir", gsd, "--json", *_command(command))
    assert holder(one_document(result.stdout))["owner"] == "not-running"


@pytest.mark.parametrize("command", ["acquire", "run", "check"])
def test_a_dead_holder_is_said_to_be_gone_and_reclaim_dead_is_named(
    gsd: Path, command: str
) -> None:
    """Fails before the fix: the sentence advised waiting for a holder that no longer runs."""
    lock_of_a_dead_process(gsd)
    argv, _ = COMMANDS_THAT_REPORT_THE_HOLDER[command]
    result = invoke(*argv, "--gsd-dir", gsd, *_command(command))
    said = result.stdout if command == "check" else one_sentence(result.stderr)
    assert "not running" in said and "--reclaim-dead" in said, said
    assert "--wait" not in said


def test_after_the_wait_ran_out_waiting_is_not_advised(gsd: Path) -> None:
    """Fails before the fix: 'wait for it with --wait SECONDS' after a --wait had run out."""
    write_lock(gsd, pid=ME, timestamp=_now())  # held by this live test process
    result = invoke("lock", "acquire", FEATURE, "--gsd-dir", gsd, "--pid", 1, "--wait", "0.05")
    assert result.exit_code == 1
    said = one_sentence(result.stderr)
    assert "--wait" not in said and "still held after the wait" in said


def test_a_busy_lock_without_a_wait_still_advises_waiting(gsd: Path) -> None:
    write_lock(gsd, pid=ME, timestamp=_now())
    result = invoke("lock", "acquire", FEATURE, "--gsd-dir", gsd, "--pid", 1)
    assert "--wait SECONDS" in one_sentence(result.stderr)


def test_clean_with_reclaim_dead_says_the_owner_was_gone(gsd: Path) -> None:
    """Fails before the fix: 'removed .../.lock (active)'."""
    lock_of_a_dead_process(gsd)
    result = invoke("lock", "clean", "--reclaim-dead", "--gsd-dir", gsd)
    assert result.exit_code == 0
    assert "(its owner is not running)" in result.stdout
    assert "(active)" not in result.stdout


def test_check_of_a_free_feature_says_free_once(gsd: Path) -> None:
    """Fails before the fix: 'nothere is free (free)'."""
    result = invoke("lock", "check", "nothere", "--gsd-dir", gsd)
    assert result.exit_code == 0
    assert result.stdout.strip() == "nothere is free"


def test_check_of_a_stale_lock_says_why_it_is_free(gsd: Path) -> None:
    write_lock(gsd, pid=ME, timestamp=1000.0)
    result = invoke("lock", "check", FEATURE, "--gsd-dir", gsd)
    assert (
        result.stdout.strip()
        == f"{FEATURE} is free (its lock is stale: the next acquire replaces it)"
    )


def test_a_refused_name_says_what_a_name_may_be_without_echoing_it_whole(gsd: Path) -> None:
    """Fails before the fix: the 300 characters came back, and no word on what is allowed."""
    name = "a" * 300
    result = invoke("lock", "acquire", name, "--gsd-dir", gsd)
    assert result.exit_code == 2
    said = one_sentence(result.stderr)
    assert said.startswith("mahabharatha: Invalid feature name")
    assert "letters, digits" in said and "255 bytes" in said
    assert name not in said and "(300 characters)" in said
    assert len(said) < 250


def _command(command: str) -> list[str]:
    """What ``lock run`` runs (after every option)."""
    return ["--", "true"] if command == "run" else []


def _now() -> float:
    from mahabharatha.commands._utils import now

    return now()
