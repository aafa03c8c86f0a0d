"""Issue 20 ("one map"): ``lock run``'s walk has no climb back into the CLI.

The import graph (``test_import_graph.py``) keeps arrows pointing down, but a callback the CLI
hands down is a call that climbs all the same: the runner used to enter the CLI's waiting line
and call its ``on_acquired`` (noting the holder), three calls from the lock layer into a face.
Here an uncontended ``lock run`` is traced call by call in-process (``sys.setprofile``, and
``threading.setprofile`` for the heartbeat and the signal reader), and every call of a function
defined in ``mahabharatha.cli`` whose nearest caller of the package lies below the faces (the
lock layer, the seam, a backend, a neutral module) is a climb. A control run hands the runner
a CLI function as ``on_acquired``: the same tracer must see that climb (the test can fail).
"""

from __future__ import annotations

import functools
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, Final

import pytest
from typer.testing import CliRunner

from mahabharatha import locks
from mahabharatha.cli import app
from mahabharatha.cli import lock as cli_lock
from mahabharatha.run import runner
from tests.unit.test_import_graph import FACE, layer_of

FEATURE: Final = "walk"
CLI: Final = "mahabharatha.cli"


def _module_of(frame: FrameType) -> str:
    return str(frame.f_globals.get("__name__", ""))


def _nearest_of_ours(frame: FrameType | None) -> FrameType | None:
    """The nearest frame, from ``frame`` down the stack, whose code is the package's (a call
    through ``contextlib`` or ``functools`` is the package's caller's all the same)."""
    while frame is not None and not _module_of(frame).startswith("mahabharatha"):
        frame = frame.f_back
    return frame


def _below_the_faces(module: str) -> bool:
    layer = layer_of(module)
    return layer is not None and layer != FACE


def _where(frame: FrameType) -> str:
    return f"{_module_of(frame)}.{frame.f_code.co_qualname}"


class Walk:
    """What a traced run called: the modules it entered, and its climbs into the CLI."""

    def __init__(self) -> None:
        self.entered: set[str] = set()
        self.climbs: list[str] = []
        self._mutex = threading.Lock()

    def profile(self, frame: FrameType, event: str, _arg: object) -> None:
        if event != "call":
            return
        module = _module_of(frame)
        if not module.startswith("mahabharatha"):
            return
        caller = _nearest_of_ours(frame.f_back)
        climb = (
            f"{_where(caller)} -> {_where(frame)}"
            if caller is not None
            and module.startswith(CLI)
            and _below_the_faces(_module_of(caller))
            else None
        )
        with self._mutex:
            self.entered.add(module)
            if climb is not None:
                self.climbs.append(climb)


@contextmanager
def traced() -> Iterator[Walk]:
    walk = Walk()
    threading.setprofile(walk.profile)  # the threads started meanwhile: heartbeat, signals
    sys.setprofile(walk.profile)
    try:
        yield walk
    finally:
        sys.setprofile(None)
        threading.setprofile(None)


@pytest.fixture
def gsd(tmp_path: Path) -> Path:
    folder = tmp_path / "gsd"
    folder.mkdir()
    return folder


def _touch(marker: Path) -> list[str]:
    return [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]


def test_an_uncontended_lock_run_never_calls_up_into_the_cli(gsd: Path, tmp_path: Path) -> None:
    """Fails before the change: ``runner.run_locked`` entered and left ``WaitingLine`` and
    called the CLI's ``on_acquired`` lambda (``_note_holder``)."""
    marker = tmp_path / "ran"
    argv = ["lock", "run", FEATURE, "--gsd-dir", str(gsd), "--", *_touch(marker)]

    with traced() as walk:
        result = CliRunner().invoke(app, argv)

    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    assert marker.exists()
    assert {
        "mahabharatha.run.runner",
        "mahabharatha.locks",
        "mahabharatha.cli.lock",
    } <= walk.entered
    assert not walk.climbs, "\n".join(walk.climbs)


def test_the_tracer_sees_a_cli_function_handed_down_as_a_callback(gsd: Path) -> None:
    """The control: a CLI function called by the runner (here as ``on_acquired``) is a climb."""
    holder = locks.FeatureLock(FEATURE, gsd)
    document: dict[str, Any] = {}
    noted: Callable[[], None] = functools.partial(cli_lock._note_holder, holder, document)

    with traced() as walk:
        code = runner.run_locked(holder, [sys.executable, "-c", "pass"], on_acquired=noted)

    assert code == 0
    assert document["acquired"] is True
    assert walk.climbs == [
        "mahabharatha.run.runner.run_locked -> mahabharatha.cli.lock._note_holder"
    ]


# --------------------------------------------------------------------------- the two steps


def _lock_file(gsd: Path) -> Path:
    return gsd / "specs" / FEATURE / ".lock"


class BetweenTheSteps(Exception):
    """The caller's own error after ``Run.acquire`` and before ``Run.command``."""


def test_an_error_between_acquire_and_command_releases_the_lock(gsd: Path) -> None:
    """As ``run_locked``'s ``finally`` did when ``on_acquired`` raised: never left held."""
    holder = locks.FeatureLock(FEATURE, gsd, timeout=0, heartbeat=None)
    with pytest.raises(BetweenTheSteps), runner.Run(holder) as run:
        run.acquire()
        assert _lock_file(gsd).exists()
        raise BetweenTheSteps

    assert not _lock_file(gsd).exists()


def test_a_signal_between_acquire_and_command_releases_and_never_runs(
    gsd: Path, tmp_path: Path
) -> None:
    """The relay holds the signal from the block's start: ``command`` raises it, CMD never
    starts, and the lock is released."""
    marker = tmp_path / "ran"
    holder = locks.FeatureLock(FEATURE, gsd, timeout=0, heartbeat=None)
    with pytest.raises(runner.Interrupted), runner.Run(holder) as run:
        run.acquire()
        signal.raise_signal(signal.SIGHUP)
        run.command(_touch(marker))

    assert not marker.exists()
    assert not _lock_file(gsd).exists()


def test_command_before_acquire_is_refused_and_runs_nothing(gsd: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    holder = locks.FeatureLock(FEATURE, gsd, timeout=0, heartbeat=None)
    with pytest.raises(RuntimeError), runner.Run(holder) as run:
        run.command(_touch(marker))

    assert not marker.exists()
    assert not _lock_file(gsd).exists()
