"""How results look to a person at a terminal: the status table and the waiting line."""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from time import monotonic
from typing import Any, Final

from mahabharatha.backends.base import LockInfo, describe_holder, format_duration, owner_is_gone
from mahabharatha.constants import JUDGE_EVERY_SECONDS, REDRAW_SECONDS
from mahabharatha.locks import WaitCallback
from mahabharatha.states import State

RECLAIMABLE: Final = "reclaimable"  # held, its owner provably gone: --reclaim-dead takes it
_COUNTED_AS_HELD: Final = frozenset({State.ACTIVE, State.WRITING})
_SHOWN_FIRST: Final = ("done", "held", RECLAIMABLE, "free", "stale")
SUMMARY_KINDS: Final = _SHOWN_FIRST + tuple(
    str(state) for state in State if state not in _COUNTED_AS_HELD and state not in _SHOWN_FIRST
)  # every summary counts each kind, also when none is there: one shape for JSON readers


def _seconds(value: float | None) -> str:
    """A duration in the one format every message uses (``format_duration``); ``-``: none."""
    return "-" if value is None else format_duration(value)


def is_reclaimable(info: LockInfo) -> bool:
    """Is it held by an owner the backend judged gone (``--reclaim-dead`` takes it)?"""
    return info.held and owner_is_gone(info)


def _kind(info: LockInfo) -> str:
    if is_reclaimable(info):
        return RECLAIMABLE
    return "held" if info.state in _COUNTED_AS_HELD else str(info.state)


def summary_counts(infos: list[LockInfo]) -> dict[str, int]:
    """How many features of each kind of :data:`SUMMARY_KINDS` (0 when none)."""
    counts = dict.fromkeys(SUMMARY_KINDS, 0)
    for info in infos:
        counts[_kind(info)] += 1
    return counts


def summary(infos: list[LockInfo]) -> str:
    """One line counting every feature folder: done, held, free, failed, stale, and any other."""
    counts = summary_counts(infos)
    always = ("done", "held", "free", "failed", "stale")
    parts = [f"{counts.pop(kind)} {kind}" for kind in always]
    parts += [f"{count} {kind}" for kind, count in sorted(counts.items()) if count]
    plural = "" if len(infos) == 1 else "s"
    return f"{len(infos)} feature{plural}: " + ", ".join(parts)


COLUMNS: Final = ("feature", "state", "pid", "owner", "age", "time left")


def _row(info: LockInfo) -> tuple[str, ...]:
    pid = "-" if info.pid is None else str(info.pid)
    tried = f" ({info.attempts} failed: {info.reason})" if info.attempts else ""
    return (
        info.feature,
        RECLAIMABLE if is_reclaimable(info) else f"{info.state}{tried}",
        pid,
        info.owner,
        _seconds(info.age_seconds),
        _seconds(info.expires_in_seconds),
    )


def status_table(infos: list[LockInfo], footer: str | None = None) -> None:
    """Print the locks as a table (at a terminal a rich one, elsewhere plain columns that are
    never cut, for ``grep``/``awk``), or say there are none; then ``footer``."""
    if not infos:
        print("no feature locks")
    elif sys.stdout.isatty():
        from rich.console import Console  # imported here: only this command draws tables

        # A pid, a state or a time cut short is a wrong answer: only names may wrap.
        Console().print(_table(infos, "fold", names_wrap=True))
    else:  # columns as wide as their widest cell
        rows = [COLUMNS, *(_row(info) for info in infos)]
        widths = [max(len(cell) for cell in column) for column in zip(*rows, strict=True)]
        for row in rows:
            print("  ".join(map(str.ljust, row, widths)).rstrip())
    if any(is_reclaimable(info) for info in infos):
        print(f"{RECLAIMABLE}: its owner is gone; --reclaim-dead (acquire, claim, clean) takes it")
    if footer:
        print(footer)


def _table(infos: list[LockInfo], overflow: Any, names_wrap: bool = False, **style: Any) -> Any:
    from rich.table import Table

    table = Table(**style)
    for name in COLUMNS:
        table.add_column(name, no_wrap=not (names_wrap and name == "feature"), overflow=overflow)
    for info in infos:
        table.add_row(*_row(info))
    return table


WATCH_TABLE_LINES: Final = 2  # a watch table's own lines: its header and the rule under it


# Held first (what runs now), then what needs a look (failed, stale, odd: 1), free, done.
_WATCH_RANKS: Final = {"held": 0, RECLAIMABLE: 0, "free": 2, "done": 3}


def watch_table(infos: list[LockInfo], lines: int) -> list[Any]:
    """``status --watch``'s list in at most ``lines`` lines: held features first, one line
    each, then a line counting those left out; empty when none fits."""
    from rich import box
    from rich.text import Text

    ordered = sorted(infos, key=lambda info: (_WATCH_RANKS.get(_kind(info), 1), info.feature))
    room = lines - WATCH_TABLE_LINES
    if room < 1 or not ordered:
        return []
    if len(ordered) > room:
        room -= 1  # the "more" line takes one
    shown = ordered[:room]
    left_out = len(ordered) - len(shown)
    table = _table(shown, "ellipsis", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    more = [Text(f"... and {left_out} more", no_wrap=True)] if left_out else []
    return [table, *more]


class WaitingLine(AbstractContextManager["WaitingLine"]):
    """While a command waits at a terminal: one line on stderr saying who holds the lock and how
    long is left, at most once a second. ``with WaitingLine() as line:``, pass ``line.callback``
    (None off a terminal) as ``on_wait``; leaving erases the line (no answer glued onto it)."""

    def __init__(self) -> None:
        self.callback: WaitCallback | None = self._show if sys.stderr.isatty() else None
        self._drawn_at: float | None = None  # None: nothing on the line

    def _show(self, info: LockInfo, left: float | None) -> None:
        now = monotonic()
        if self._drawn_at is not None and now - self._drawn_at < REDRAW_SECONDS:
            return
        self._drawn_at = now
        limit = "" if left is None else f"; giving up in {_seconds(left)}"
        sys.stderr.write(f"\rwaiting: {describe_holder(info)}{limit}\x1b[K")
        sys.stderr.flush()

    def __exit__(self, *_exc: object) -> None:
        """Remove the waiting line (the answer, or the command's output, takes its place)."""
        if self._drawn_at is not None:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self._drawn_at = None


def gone_holder_notice(judge: Callable[[str], LockInfo], then: WaitCallback | None) -> WaitCallback:
    """A wait's callback that says once on stderr that the holder is gone and ``--reclaim-dead``
    would take the lock. ``judge`` looks at a feature's lock with its owner judged; ``then``
    is the callback it wraps."""
    told, look_at = False, monotonic()

    def notice(info: LockInfo, left: float | None) -> None:
        nonlocal told, look_at
        if then is not None:
            then(info, left)
        if told or monotonic() < look_at:
            return
        look_at = monotonic() + JUDGE_EVERY_SECONDS
        try:
            judged = judge(info.feature)
        except OSError:  # a look that failed says nothing; the wait goes on and asks again
            return
        if is_reclaimable(judged):
            told = True
            erase = "\r\x1b[K" if sys.stderr.isatty() else ""  # over the waiting line, if any
            sys.stderr.write(
                f"{erase}mahabharatha: {describe_holder(judged)}; waiting for it all the same:"
                " --reclaim-dead would take it now\n"
            )
            sys.stderr.flush()

    return notice
