"""The README's "At a shell" examples, taken from README.md and run in order in one bash, as a
reader would type them (issue 19, item 2): each answers as the README shows, with the exit code
its comment gives ("exit N"; 0 otherwise). Also: the README and the design name an install
command that works from the checkout, and document the audit log (items 1 and 6); the README's
first screens hold what a newcomer needs (issue 28, item 10).
"""

from __future__ import annotations

import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path
from typing import Final, NamedTuple

from mahabharatha.backends import POSTGRES_EXTRA_HINT
from tests.cli._support import RUN_TIMEOUT, assert_no_traceback, child_env

ROOT: Final = Path(__file__).resolve().parents[2]
README: Final = ROOT / "README.md"
MAKEFILE: Final = "test:\n\t@echo tests pass\nall:\n\t@echo built\n"
"""``make`` and ``make test`` of the README's ``lock run`` examples, answered at once."""


class Step(NamedTuple):
    command: str
    shown: list[str]  # the output lines the README shows ("..." alone: anything)
    exit_code: int


def readme_shell_steps() -> list[Step]:
    """The ``console`` block of the README's "At a shell" section, command by command."""
    text = README.read_text()
    section = text[text.index("## At a shell") :]
    match = re.search(r"```console\n(.*?)```", section, re.DOTALL)
    assert match is not None, "the README lost its shell examples"
    steps: list[Step] = []
    for line in match.group(1).splitlines():
        if line.startswith("$ "):
            command, _, comment = line[2:].partition("#")
            code = re.search(r"\bexit (\d+)\b", comment)
            steps.append(Step(command.strip(), [], int(code.group(1)) if code else 0))
        else:
            steps[-1].shown.append(line)
    assert len(steps) >= 10 and all(s.command.startswith("mahabharatha ") for s in steps)
    return steps


def _pattern(shown: str) -> re.Pattern[str]:
    """A shown line as a pattern: numbers (pids, ages) may differ, ``...`` is anything."""
    parts = [re.escape(piece) for piece in shown.split("...")]
    numbers = [re.sub(r"\d+", r"[\\d.]+", part) for part in parts]
    return re.compile(".*".join(numbers))


def _script(steps: list[Step], out: Path) -> str:
    """One bash running every step in order (so every CLI call has the same parent, the
    README's "this shell"), each step's output and exit code kept apart."""
    lines = []
    for i, step in enumerate(steps):
        lines.append(f"{step.command} > {shlex.quote(str(out / f'{i}.out'))} 2>&1")
        lines.append(f"echo $? > {shlex.quote(str(out / f'{i}.rc'))}")
    return "\n".join(lines) + "\n"


def test_the_readme_shell_examples_are_true_as_a_sequence(tmp_path: Path) -> None:
    """Fails on the old README: ``lock acquire auth-flow -w 30`` right after the acquire said
    "already held by you" (the example read as a wait), and ``lock done`` after the release
    exited 1."""
    steps = readme_shell_steps()
    (tmp_path / "Makefile").write_text(MAKEFILE)
    shim = tmp_path / "bin" / "mahabharatha"
    shim.parent.mkdir()
    # exec: the shim becomes the CLI, so the CLI's parent is still the one bash.
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m mahabharatha "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "out"
    out.mkdir()
    env = {**child_env(), "PATH": f"{shim.parent}:{child_env()['PATH']}"}

    subprocess.run(
        ["bash", "-c", _script(steps, out)],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=RUN_TIMEOUT * 2,
        check=True,
    )

    for i, step in enumerate(steps):
        said = (out / f"{i}.out").read_text()
        assert_no_traceback(said)
        code = int((out / f"{i}.rc").read_text())
        assert code == step.exit_code, (step.command, code, said)
        lines = said.splitlines()
        for shown in step.shown:
            if shown != "...":
                assert any(_pattern(shown).fullmatch(line) for line in lines), (shown, said)


def test_every_install_command_works_from_the_checkout() -> None:
    """Fails on the old docs and hint: ``pip install 'mahabharatha[postgres]'``, which no
    index can answer (the package is not published)."""
    docs = [README, *sorted((ROOT / "design").glob("*.md"))]
    for doc in docs:
        text = doc.read_text()
        assert "install 'mahabharatha[postgres]'" not in text, doc
    assert "pip install '.[postgres]'" in README.read_text()
    assert "pip install '.[postgres]'" in POSTGRES_EXTRA_HINT


AUDIT_KEYS: Final = ("time", "feature", "action", "by_pid", "old_record", "new_owner", "reason")


def test_the_audit_log_and_its_keys_are_documented_for_users() -> None:
    """Fails on the old docs: ``lock-audit.jsonl`` was named only in the design's internals.
    It is in the CLI's reference (moved there from the README, issue 28) and the contract."""
    for doc in (ROOT / "design" / "reference.md", ROOT / "design" / "contract.md"):
        text = doc.read_text()
        assert "<gsd-dir>/lock-audit.jsonl" in text, doc
        for key in AUDIT_KEYS:
            assert f"`{key}`" in text, (doc, key)


FIRST_SCREENS: Final = 60
"""Lines a newcomer reads before scrolling far: three screens of a 24-row terminal, less the
first block of commands."""
COMMANDS: Final = (
    *(f"lock {name}" for name in ("acquire", "release", "check", "claim", "done", "fail")),
    *(f"lock {name}" for name in ("run", "work", "status", "clean", "reopen")),
    "feature detect",
)


def test_the_readme_starts_with_a_quick_start_the_three_ways_and_the_exit_codes() -> None:
    """Failed on 211f242: the README went from its first block straight into the shell
    reference, and its exit codes were one paragraph of 20 lines far below."""
    lines = README.read_text().splitlines()[:FIRST_SCREENS]
    first = "\n".join(lines)
    assert "## Quick start" in first
    for way in ("**At a shell**", "**In a pool of workers**", "**From Python**"):
        assert way in first, way
    table = [line for line in lines if line.startswith("| `")]
    for command in COMMANDS:
        rows = [row for row in table if f"`{command}`" in row or f"`{command.split()[1]}`" in row]
        assert rows, f"no exit-code row for {command}"


def test_the_readme_first_block_keeps_its_two_commands() -> None:
    """CI (``.ci/run``) runs the second line of the first block: it must stay the test command."""
    text = README.read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.DOTALL)
    assert block is not None and text.index("```bash") < text.index("## ")
    commands = [line for line in block.group(1).splitlines() if line.strip()]
    assert len(commands) == 2 and "pytest" in commands[1], commands
