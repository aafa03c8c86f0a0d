"""The library's one voice: the ``mahabharatha`` logger, with a ``NullHandler``, ``logging``
imported on the first message. What it says: ``design/contract.md`` ("Messages")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import logging

LOGGER_NAME: Final = "mahabharatha"
# logging's levels, named here so that a caller need not import it to say something.
DEBUG: Final = 10
INFO: Final = 20
WARNING: Final = 30


def logger() -> logging.Logger:
    """The ``mahabharatha`` logger, with its ``NullHandler`` (added once)."""
    import logging

    found = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(handler, logging.NullHandler) for handler in found.handlers):
        found.addHandler(logging.NullHandler())
    return found


def say(level: int, message: str, *args: object) -> None:
    """Log ``message % args`` at ``level`` on the ``mahabharatha`` logger."""
    logger().log(level, message, *args)
