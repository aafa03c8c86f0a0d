"""Real processes for the conformance suite: forked, synchronised by a barrier, always reaped."""

from __future__ import annotations

import multiprocessing
import os
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, Final

CTX: Final = multiprocessing.get_context("fork")
"""Fork: children share the parent's imports; each opens its own backend."""

SYNC_TIMEOUT: Final = 60.0
"""Hang guard for a barrier or a child's answer (a stuck peer fails the test, never hangs it)."""


def stress(default: int) -> int:
    """Rounds per test: ``MAHABHARATHA_STRESS`` when set, else ``default`` (small)."""
    raw = os.environ.get("MAHABHARATHA_STRESS")
    return max(1, int(raw)) if raw else default


def _child(work: Callable[[int], Any], index: int, answer: Connection) -> None:
    try:
        answer.send(("ok", work(index)))
    except BaseException:  # reported to the parent, which fails the test with it
        answer.send(("error", traceback.format_exc()))
    finally:
        answer.close()


def run_team(count: int, work: Callable[[int], Any], context: Any = CTX) -> list[Any]:
    """Run ``work(i)`` for i in 0..count-1, each in its own forked process; their answers in
    order. A child that raised fails the caller with its traceback; every child is reaped.
    ``context``: another start method's (``spawn``: then ``work`` must pickle, e.g. a
    ``functools.partial`` of a module-level function)."""
    pipes = [context.Pipe(duplex=False) for _ in range(count)]
    team = [
        context.Process(target=_child, args=(work, index, sender))
        for index, (_, sender) in enumerate(pipes)
    ]
    for process in team:
        process.start()
    try:
        answers = []
        for (receiver, sender), process in zip(pipes, team, strict=True):
            sender.close()
            if not receiver.poll(SYNC_TIMEOUT):
                raise AssertionError(f"child {process.pid} gave no answer in {SYNC_TIMEOUT} s")
            status, value = receiver.recv()
            if status != "ok":
                raise AssertionError(f"child {process.pid} failed:\n{value}")
            answers.append(value)
        return answers
    finally:
        for process in team:
            process.join(SYNC_TIMEOUT)
            if process.is_alive():
                process.kill()
                process.join()
