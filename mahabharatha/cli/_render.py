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


def status_table(infos: list[LockInfo]) -> None:
    """Print the locks as a table (rich), or say there are none."""
    if not infos:
        print("no feature locks")
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


def wait_reporter(feature: str) -> Callable[[LockInfo, float | None], None]:
    """A waiting line on the terminal, rewritten in place at most about once a second."""
    last_shown: list[float | None] = [None]

    def report(info: LockInfo, left: float | None) -> None:
        shown = last_shown[0]
        if shown is not None and left is not None and shown - left < 1.0:
            return
        last_shown[0] = left if left is not None else 0.0
        limit = "" if left is None else f"; giving up in {_seconds(left)}"
        sys.stderr.write(f"\rwaiting: {describe_holder(info)}{limit}\x1b[K")
        sys.stderr.flush()

    return report
