"""How results look to a person at a terminal: the status table and the waiting line."""

from __future__ import annotations

import sys
from collections.abc import Callable

from mahabharatha.locks import LockInfo, describe_holder


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    minutes, seconds = divmod(int(value), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"


def summary(infos: list[LockInfo]) -> str:
    """One line counting every feature folder: done, held, free, stale (and any others)."""
    counts: dict[str, int] = {}
    for info in infos:
        kind = "held" if info.state in ("active", "writing") else info.state
        counts[kind] = counts.get(kind, 0) + 1
    parts = [f"{counts.pop(kind, 0)} {kind}" for kind in ("done", "held", "free", "stale")]
    parts += [f"{count} {kind}" for kind, count in sorted(counts.items())]
    plural = "" if len(infos) == 1 else "s"
    return f"{len(infos)} feature{plural}: " + ", ".join(parts)


def status_table(infos: list[LockInfo], footer: str | None = None) -> None:
    """Print the locks as a table (rich), or say there are none; then ``footer``."""
    if not infos:
        print("no feature locks")
        if footer:
            print(footer)
        return
    from rich.console import Console  # imported here: only this command draws tables
    from rich.table import Table

    table = Table("feature", "state", "pid", "owner", "age", "time left")
    for info in infos:
        pid = "-" if info.pid is None else str(info.pid)
        table.add_row(
            info.feature,
            info.state,
            pid,
            info.owner,
            _seconds(info.age_seconds),
            _seconds(info.expires_in_seconds),
        )
    Console().print(table)
    if footer:
        print(footer)


class WaitingLine:
    """While a command waits for a lock at a terminal: one line on stderr saying who holds it
    and how long is left, rewritten in place about once a second, erased when the wait ends.
    Not a terminal: says nothing (``callback`` is None)."""

    def __init__(self) -> None:
        self.callback: Callable[[LockInfo, float | None], None] | None = (
            self._show if sys.stderr.isatty() else None
        )
        self._last: float | None = None
        self._shown = False

    def _show(self, info: LockInfo, left: float | None) -> None:
        if self._shown and self._last is not None and left is not None and self._last - left < 1:
            return
        self._last, self._shown = (left if left is not None else 0.0), True
        limit = "" if left is None else f"; giving up in {_seconds(left)}"
        sys.stderr.write(f"\rwaiting: {describe_holder(info)}{limit}\x1b[K")
        sys.stderr.flush()

    def __enter__(self) -> Callable[[LockInfo, float | None], None] | None:
        return self.callback

    def __exit__(self, *_exc: object) -> None:
        self.erase()

    def erase(self) -> None:
        """Remove the waiting line (the answer, or the command's output, takes its place)."""
        if self._shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self._shown = False
