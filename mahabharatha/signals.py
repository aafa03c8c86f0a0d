"""Every signal rule: the signals forwarded and held back, handlers for a block (main thread
only) and masks. A signal set to be ignored (``nohup``) stays ignored, for us and for a child."""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # (no stub: the C half of ``signal``)
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final

# What lock run passes on to CMD, and lock work -j to its workers.
FORWARDED: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Signals whose Python handlers may raise: held back while a lock is being published.
DEFERRED: Final = (*FORWARDED, signal.SIGQUIT, signal.SIGALRM, signal.SIGUSR1, signal.SIGUSR2)

# The C functions under ``signal``, without the enum wrapping every acquire try would pay for.
_get_handler: Final[Callable[[int], Any]] = _signal.getsignal
_set_handler: Final[Callable[[int, Any], Any]] = _signal.signal
Handler = Callable[[int, Any], object]


def not_ignored(current: object) -> bool:
    return current != signal.SIG_IGN


def is_default(current: object) -> bool:
    return current == signal.SIG_DFL


class Handling:
    """``with Handling(signums, handler):`` ``handler`` for each of ``signums`` whose handler
    ``take`` accepts (default: not ignored), restored on leaving (a class: cheap per try)."""

    __slots__ = ("_handler", "_signums", "_take", "saved")

    def __init__(
        self, signums: Sequence[int], handler: Handler, take: Callable[[Any], bool] = not_ignored
    ) -> None:
        self._signums, self._handler, self._take = signums, handler, take
        self.saved: dict[int, Any] = {}

    def __enter__(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            for signum in self._signums:
                if self._take(_get_handler(signum)):
                    self.saved[signum] = _set_handler(signum, self._handler)
        except BaseException:
            self.__exit__()  # put back the handlers already replaced
            raise

    def __exit__(self, *_exc: object) -> None:
        for signum, previous in self.saved.items():
            _set_handler(signum, previous)


class Deferred(Handling):
    """``with Deferred():`` holds back the handlers of :data:`DEFERRED`, then runs them: no
    ``KeyboardInterrupt`` lands between publishing a lock and handing it over."""

    __slots__ = ("caught",)

    def __init__(self) -> None:
        caught: list[int] = []
        super().__init__(DEFERRED, lambda signum, _frame: caught.append(signum), callable)
        self.caught = caught

    def __exit__(self, *_exc: object) -> None:
        super().__exit__()
        for signum in self.caught:
            self.saved[signum](signum, None)  # may raise: the caller's frame knows what it holds


@contextmanager
def masked(how: int, signums: Sequence[int]) -> Iterator[Iterable[int]]:
    """This thread's mask changed by ``how`` for the block; yields the mask before, put back."""
    previous = signal.pthread_sigmask(how, signums)
    try:
        yield previous
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def start_without_signals(thread: threading.Thread) -> None:
    """Start ``thread`` with :data:`DEFERRED` blocked in it. Race: a helper thread that took a
    signal would only flag it, and the handler would run (forward it to CMD) once CMD ended."""
    with masked(signal.SIG_BLOCK, DEFERRED):
        thread.start()
