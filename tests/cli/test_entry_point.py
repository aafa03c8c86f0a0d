"""The entry point builds only the command it is asked for, and that changes nothing a user sees.

``main()`` hands typer an app cut down to the one command on the command line (a cold start then
skips building the other fourteen). These tests hold the cut-down app to the whole one: the same
help, the same usage errors, the same exit codes; and the whole app wherever a call names no
single command (group help, typos, root options, completion). ``main()`` also freezes what
start-up made, so that no collection (nor the final one at exit) walks it again.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest
import typer
import typer.main
from typer.testing import CliRunner

from mahabharatha.cli import app, app_for
from tests.cli._support import RUN_TIMEOUT, assert_no_traceback, child_env, run_cli


def _calls() -> list[tuple[str, str]]:
    """Every ``group command`` pair the whole app has, as typer names them."""
    whole = typer.main.get_group(app)
    return [
        (name, command)
        for name, group in sorted(whole.commands.items())
        if isinstance(group, typer.core.TyperGroup)
        for command in sorted(group.commands)
    ]


def _command_counts() -> dict[str | None, int]:
    return {
        g.name: len(g.typer_instance.registered_commands)
        for g in app.registered_groups
        if g.typer_instance is not None
    }


CALLS = _calls()

TAILS = {
    "help": ["--help"],
    "missing-arguments": [],
    "unknown-option": ["--no-such-option"],
}
"""What follows the command: its help, a usage error, an option it does not have."""


@pytest.mark.parametrize("tail", TAILS.values(), ids=TAILS.keys())
@pytest.mark.parametrize(("group", "command"), CALLS, ids=[f"{g}-{c}" for g, c in CALLS])
def test_a_command_built_alone_answers_as_in_the_whole_app(
    group: str, command: str, tail: list[str]
) -> None:
    argv = [group, command, *tail]
    whole = CliRunner().invoke(app, argv)
    alone = CliRunner().invoke(app_for(argv), argv)
    assert (alone.exit_code, alone.output) == (whole.exit_code, whole.output)
    assert "Traceback" not in alone.output


@pytest.mark.parametrize(("group", "command"), CALLS, ids=[f"{g}-{c}" for g, c in CALLS])
def test_only_the_called_command_is_built(group: str, command: str) -> None:
    root = typer.main.get_group(app_for([group, command, "x"]))
    assert list(root.commands) == [group]
    built = root.commands[group]
    assert isinstance(built, typer.core.TyperGroup)
    assert list(built.commands) == [command]


@pytest.mark.parametrize(
    "argv",
    [[], ["lock"], ["lock", "--help"], ["lock", "chek", "x"], ["--version"], ["nope", "check"]],
    ids=["nothing", "group", "group-help", "typo", "root-option", "no-such-group"],
)
def test_a_call_naming_no_single_command_gets_the_whole_app(argv: list[str]) -> None:
    assert app_for(argv) is app


def test_cutting_down_leaves_the_whole_app_as_it_was() -> None:
    before = _command_counts()
    for group, command in CALLS:
        app_for([group, command])
    assert _command_counts() == before
    assert len(CALLS) == sum(before.values())


FREEZE_PROBE = (
    "import atexit, gc, sys\n"
    "atexit.register(lambda: print('frozen', gc.get_freeze_count(), file=sys.stderr))\n"
    "sys.argv = ['mahabharatha', 'lock', 'check', 'x']\n"
    "from mahabharatha.cli import main\n"
    "main()\n"
)
"""A CLI call through the console script's function, reporting at exit what gc keeps frozen."""


def _probe(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``code`` run by a child of the run, as a CLI call is (its environment, no stdin)."""
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=child_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )


def test_the_entry_point_freezes_what_start_up_made(tmp_path: Path) -> None:
    """Fails without ``gc.freeze()`` in ``main()``: nothing is frozen (0), and the collection at
    exit walks every module, class and typer object again (about 10 ms of a cold call)."""
    done = _probe(FREEZE_PROBE, tmp_path)
    assert_no_traceback(done.stdout, done.stderr)
    assert (done.returncode, done.stdout) == (0, "x is free\n")
    frozen = int(done.stderr.split("frozen ")[1])
    assert frozen > 10_000  # start-up's objects: typer, click, the lock layer


CACHED_PROBE: Final = (
    "import importlib.util, mahabharatha.cli as cli\n"
    "print(importlib.util.cache_from_source(cli.__file__))\n"
)
"""Where a child of the run reads the CLI's byte code from (``PYTHONPYCACHEPREFIX`` or not)."""


def test_a_cli_call_of_the_run_leaves_byte_code_that_the_next_one_reads(tmp_path: Path) -> None:
    """The suite starts thousands of CLI processes: each compiling the package from source again
    was most of a call's CPU. Failed before tests/conftest.py shared a cache, wherever the
    environment sets ``PYTHONDONTWRITEBYTECODE`` (this machine's did): no byte code was left."""
    assert run_cli("--version", cwd=tmp_path).returncode == 0
    done = _probe(CACHED_PROBE, tmp_path)
    assert_no_traceback(done.stdout, done.stderr)
    assert Path(done.stdout.strip()).is_file(), done.stdout
