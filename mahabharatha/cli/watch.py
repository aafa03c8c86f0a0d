"""``mahabharatha lock status --watch``: the ``--all`` view again and again, as a live screen on
a terminal, or one JSON document per change off one."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from time import monotonic, sleep, time
from typing import Final, NoReturn

import typer

from mahabharatha import locks
from mahabharatha.backends.base import LockBackend, format_duration
from mahabharatha.cli._output import Result, Shared, answer, emit, stopped_code
from mahabharatha.cli._render import summary_counts, watch_table
from mahabharatha.constants import WATCH_SECONDS
from mahabharatha.exits import EXIT_HELD, EXIT_OK
from mahabharatha.locks import LockInfo

BAR_WIDTH: Final = 40
TOP_LINES: Final = 3  # the bar, the counts, the rate and estimate: always on top
SPARE_LINES: Final = 1  # where the cursor rests: a view that filled it would scroll


COUNT_ORDER: Final = ("held", "failed", "reclaimable", "stale", "free")  # most telling first


def counts_line(counts: dict[str, int]) -> str:
    """The counts that are not zero (done is on the bar's line), in :data:`COUNT_ORDER`."""
    kinds = [*COUNT_ORDER, *(kind for kind in counts if kind not in (*COUNT_ORDER, "done"))]
    shown = [f"{counts[kind]} {kind}" for kind in kinds if counts.get(kind)]
    return ", ".join(shown) if shown else "every feature done"


def watch_status(shared: Shared, until_done: bool) -> NoReturn:
    """``lock status --watch``: the ``--all`` view again and again, until Ctrl-C (exit 130),
    TERM or HUP (128 + N; the live view's cursor shown again, as on Ctrl-C) or, with
    ``until_done``, until nothing is left to claim (exit 0 all done, 1 some failed)."""

    def action() -> Result:
        try:
            store = shared.backend(needs_folder=shared.url is None)
            lines = shared.as_json or not sys.stdout.isatty()  # one JSON document per change
            return Result((_watch_lines if lines else _watch_terminal)(store, until_done), {})
        except KeyboardInterrupt as stop:  # how a watch ends: no answer, only its exit code
            return Result(stopped_code(stop), {})

    result = answer({}, action)  # a failure (bad --gsd-dir, no server) as any command says it
    if result.message is None:
        raise typer.Exit(result.code)
    emit(result, shared.as_json)


def _what_changes(info: LockInfo) -> tuple[object, ...]:
    """What of a feature makes a new line off a terminal: its state and holder, its failed
    attempts; not its ages, which change every second while anything is held."""
    return (info.feature, info.state, info.pid, info.host, info.token, info.owner, info.attempts)


def _watch(store: LockBackend, until_done: bool, show: Callable[[list[LockInfo]], None]) -> int:
    """Survey and ``show`` every second, until nothing is left to claim with ``until_done``."""
    while True:
        infos = locks.survey(backend=store, problems=[])  # a folder not read: left out
        show(infos)
        counts = summary_counts(infos)
        left = [count for kind, count in counts.items() if kind not in ("done", "failed")]
        if until_done and not any(left):  # nothing left to claim
            return EXIT_HELD if counts["failed"] else EXIT_OK
        sleep(WATCH_SECONDS)


def _watch_lines(store: LockBackend, until_done: bool) -> int:
    """One JSON document per change (:func:`_what_changes`) a line: the counts, the features."""
    last: list[object] = [None]

    def show(infos: list[LockInfo]) -> None:
        now = [_what_changes(info) for info in infos]
        if now != last[0]:
            features = [info.to_dict() for info in infos]
            document = {"time": time(), "summary": summary_counts(infos), "features": features}
            typer.echo(json.dumps(document, sort_keys=True))
            sys.stdout.flush()
            last[0] = now

    return _watch(store, until_done, show)


def _watch_terminal(store: LockBackend, until_done: bool) -> int:
    """The live view, redrawn every second to fit the terminal: the bar, the counts, the rate
    and time left on top, then the features, held ones first."""
    from rich.console import Console, Group
    from rich.live import Live
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    started, first_finished = monotonic(), list[int]()
    console = Console()

    def line(text: str) -> Text:
        return Text(text, no_wrap=True, overflow="ellipsis")

    def rate(counts: dict[str, int]) -> str:
        total, finished = sum(counts.values()), counts["done"] + counts["failed"]
        if not first_finished:
            first_finished.append(finished)
        elapsed = monotonic() - started
        per_second = (finished - first_finished[0]) / elapsed if elapsed > 0 else 0.0
        left = total - finished
        if not left:
            return "nothing left to claim"
        eta = "no estimate yet"
        if per_second > 0:
            eta = f"about {format_duration(left / per_second)} left"
        return f"{per_second * 60:.1f}/min, {eta}"

    def view(infos: list[LockInfo]) -> Group:
        counts = summary_counts(infos)
        total = sum(counts.values())
        width, height = console.size
        done = f" {counts['done']}/{total} done"
        bar_width = max(10, min(BAR_WIDTH, width - len(done)))
        bar = ProgressBar(total=max(1, total), completed=counts["done"], width=bar_width)
        top = Table.grid()
        top.add_row(bar, line(done))
        listed = watch_table(infos, max(0, height - TOP_LINES - SPARE_LINES))
        return Group(top, line(counts_line(counts)), line(rate(counts)), *listed)

    with Live(console=console, auto_refresh=False, transient=False) as live:
        return _watch(store, until_done, lambda infos: live.update(view(infos), refresh=True))
