"""Waiting in one place: a deadline on the monotonic clock, and the one backoff (a jittered
pause whose ceiling doubles), so that a crowd of waiters never polls in step."""

from __future__ import annotations

import random
from collections.abc import Iterator
from time import monotonic

from mahabharatha.constants import (
    BACKOFF_FIRST_SECONDS,
    BACKOFF_MAX_SECONDS,
    PATIENT_AFTER_SECONDS,
    PATIENT_MAX_SECONDS,
)


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
        """``seconds``, or what is left of the wait when that is less (never below 0)."""
        left = self.left()
        # Race: the deadline passes between a caller's check and this read: a negative pause
        # would make ``time.sleep`` raise ValueError.
        return seconds if left is None else max(0.0, min(seconds, left))


def jittered(most: float) -> float:
    """A pause of between half ``most`` and ``most``."""
    return random.uniform(most / 2, most)


def backoff(
    first: float = BACKOFF_FIRST_SECONDS,
    most: float = BACKOFF_MAX_SECONDS,
    patient_after: float = PATIENT_AFTER_SECONDS,
) -> Iterator[float]:
    """Jittered pauses whose ceiling doubles from ``first`` to ``most`` (after ``patient_after``
    seconds: to ``PATIENT_MAX_SECONDS``)."""
    started = monotonic()
    ceiling = first
    while True:
        yield jittered(ceiling)
        patient = monotonic() - started > patient_after
        ceiling = min(ceiling * 2, PATIENT_MAX_SECONDS if patient else most)
