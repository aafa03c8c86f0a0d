"""The CLI under Ctrl-C and with something in the way (each failed before its fix):

- Ctrl-C during ``lock acquire --wait --json`` still prints one document;
- a directory at ``.lock`` or a symlinked feature folder makes ``lock check`` and ``lock release``
  exit 3, as ``lock acquire`` does.
"""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mahabharatha import locks
from tests.support.folders import FEATURE, one_feature_gsd

pytestmark = pytest.mark.timeout(30)
gsd = pytest.fixture(one_feature_gsd, name="gsd")


def _cli(*args: object) -> list[str]:
    return [sys.executable, "-m", "mahabharatha", *(str(arg) for arg in args)]


def test_ctrl_c_during_a_json_wait_still_prints_one_document(gsd: Path) -> None:
    locks.acquire(FEATURE, gsd, pid=1)  # another owner: the CLI (our child) must wait for it
    terminal, secondary = pty.openpty()  # stderr at a terminal: the waiting line is the handshake
    waiter = subprocess.Popen(
        _cli("lock", "acquire", FEATURE, "--gsd-dir", gsd, "--wait", 30, "--json"),
        stdout=subprocess.PIPE,
        stderr=secondary,
        text=True,
    )
    os.close(secondary)
    try:
        shown = b""
        while b"waiting:" not in shown:
            shown += os.read(terminal, 4096)
        waiter.send_signal(signal.SIGINT)
        out, _ = waiter.communicate(timeout=30)
    finally:
        waiter.kill()  # (a no-op when it has ended)
        waiter.wait()  # always reaped, also when the test failed
        os.close(terminal)
    assert waiter.returncode == 130
    document = json.loads(out)
    assert document["acquired"] is False
    assert document["error"] == "interrupted"


@pytest.mark.parametrize("command", ["check", "release"])
@pytest.mark.parametrize("in_the_way", ["directory at .lock", "symlinked folder"])
def test_check_and_release_exit_3_when_something_is_in_the_way(
    tmp_path: Path, command: str, in_the_way: str
) -> None:
    gsd = tmp_path / "gsd"
    folder = gsd / "specs" / FEATURE
    if in_the_way == "directory at .lock":
        (folder / ".lock").mkdir(parents=True)
    else:
        (tmp_path / "elsewhere").mkdir()
        folder.parent.mkdir(parents=True)
        folder.symlink_to(tmp_path / "elsewhere")
    done = subprocess.run(
        _cli("lock", command, FEATURE, "--gsd-dir", gsd, "--json"),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert str(folder) in json.loads(done.stdout)["error"]
    assert len(done.stderr.strip().splitlines()) == 1
