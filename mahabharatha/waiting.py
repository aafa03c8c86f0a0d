"""Waiting in one place: a deadline on the monotonic clock, and the one backoff (a jittered
pause whose ceiling doubles), so that a crowd of waiters never polls in step."""

from __future__ import annotations

import random
from collections.abc import Iterator
from time import monotonic


class Deadline:
    """The end of a wait of ``seconds`` from now (``None``: a wait without end)."""

    __slots__ = ("at",)

    def __init__(self, seconds: float | None) -> None:
        self.at = None if seconds is None else monotonic() + max(0.0, seconds)

    def left(self) -> float | None:
        """The seconds left (0 or less: passed); ``None`` without end."""
        return None if self.at is None else self.at - monotonic()

    def passed(self) -> bool:
        return self.at is not None and monotonic() >= self.at

    def cap(self, seconds: float) -> float:
        """``seconds``, or what is left of the wait when that is less."""
        left = self.left()
        return seconds if left is None else min(seconds, left)


def jittered(most: float) -> float:
    """A pause of between half ``most`` and ``most``."""
    return random.uniform(most / 2, most)


def backoff(
    first: float, most: float, *, patient_after: float | None = None, patient_most: float = 0.0
) -> Iterator[float]:
    """Jittered pauses whose ceiling doubles from ``first`` up to ``most``; once
    ``patient_after`` seconds have passed, up to ``patient_most`` instead."""
    started = monotonic()
    ceiling = first
    while True:
        yield jittered(ceiling)
        patient = patient_after is not None and monotonic() - started > patient_after
        ceiling = min(ceiling * 2, patient_most if patient else most)
