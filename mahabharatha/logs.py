"""The library's one voice: the ``mahabharatha`` logger (:mod:`logging`).

What the library says, it says here, so that an application can route or silence it:
a wait for a held lock (INFO, once per wait), a lock reclaimed from a stale, corrupt or dead
holder (INFO), a lock lost while held (WARNING), a wait for a free server connection slot
(WARNING, once per run). Expected outcomes (acquired, released, held by another) are answers,
not messages: they are never logged. The logger has a ``NullHandler``, as a library's should:
nothing reaches stderr unless the application (or the CLI's ``-v``) configures a handler.

``logging`` is imported on the first message only: most CLI calls say nothing and must not pay
its import at start-up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import logging

LOGGER_NAME: Final = "mahabharatha"
DEBUG: Final = 10
INFO: Final = 20
WARNING: Final = 30
"""``logging``'s levels, named here so that a caller need not import it to say something."""


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
