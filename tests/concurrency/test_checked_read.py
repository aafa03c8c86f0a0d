"""``_safe_read_text`` reads what it checked, never the name again (contract: "Reads").

A racer process swaps ``.current-feature`` back and forth between a small regular file and
something that must never be read: a FIFO (opening it for reading blocks until a writer comes)
or a symlink to a 50 MB file. A reader process calls ``_safe_read_text`` over and over. Every
answer must be the small file's text or ``None``, and the reader must finish.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import pytest

from mahabharatha.commands import _utils
from tests.concurrency._harness import CTX, SYNC_TIMEOUT, require, trials
from tests.support.marks import needs_fifo, needs_symlinks

TEXT: Final = "feat-a"
BIG_BYTES: Final = 50 * 1024 * 1024
DEFAULT_READS: Final = 3000
"""Reads per case by default (about a second); the racer swaps the entry all the while."""
MAX_READS_FACTOR: Final = 10
"""How far past ``reads`` the reader goes on when it has not yet seen both answers."""


def _put_small(target: Path) -> None:
    spare = target.with_name("small.tmp")
    spare.write_text(TEXT)
    os.replace(spare, target)


def _put_fifo(target: Path) -> None:
    spare = target.with_name("fifo.tmp")
    os.mkfifo(spare)
    os.replace(spare, target)


def _put_big_link(target: Path) -> None:
    spare = target.with_name("link.tmp")
    os.symlink(target.with_name("big"), spare)
    os.replace(spare, target)


def _racer(target: Path, put_other: Callable[[Path], None], started: Any, stop: Any) -> None:
    put_other(target)
    started.set()
    while not stop.is_set():
        _put_small(target)
        put_other(target)


def _reader(target: Path, reads: int, started: Any, report: Any) -> None:
    """At least ``reads`` reads, and on until both answers were seen: under load the racer may
    sit still for all of the first ``reads`` (a test of nothing), so the reader reads on,
    up to ``MAX_READS_FACTOR`` times as many."""
    texts = nones = wrong = done = 0
    started.wait(SYNC_TIMEOUT)
    while done < reads or not (texts and nones):
        if done >= reads * MAX_READS_FACTOR:
            break
        text = _utils._safe_read_text(target)
        done += 1
        if text is None:
            nones += 1
        elif text == TEXT:
            texts += 1
        else:
            wrong += 1
    report.put((texts, nones, wrong))


def _race(tmp_path: Path, put_other: Callable[[Path], None]) -> tuple[int, int, int] | None:
    """Run the racer and the reader; the reader's tally, or None if it never finished."""
    target = tmp_path / ".current-feature"
    _put_small(target)
    started, stop, report = CTX.Event(), CTX.Event(), CTX.SimpleQueue()
    racer = CTX.Process(target=_racer, args=(target, put_other, started, stop), daemon=True)
    reads = trials(DEFAULT_READS)
    reader = CTX.Process(target=_reader, args=(target, reads, started, report), daemon=True)
    racer.start()
    reader.start()
    try:
        reader.join(SYNC_TIMEOUT)
        hung = reader.is_alive()
        return None if hung else report.get()
    finally:
        stop.set()
        for proc in (reader, racer):
            if proc.is_alive():
                proc.kill()
            proc.join()


@needs_fifo
@pytest.mark.timeout(60)
def test_a_file_swapped_for_a_fifo_never_hangs_the_reader(tmp_path: Path) -> None:
    """Fails before the fix: the check opened the file, the read opened the name again and
    found the FIFO there, and blocked for ever waiting for a writer."""
    tally = _race(tmp_path, _put_fifo)
    assert tally is not None, "the reader hung (it opened a FIFO by name)"
    texts, nones, wrong = tally
    assert wrong == 0
    require(texts > 0 and nones > 0, f"the race was not exercised: {tally}")


@needs_symlinks
@pytest.mark.timeout(60)
def test_a_file_swapped_for_a_link_to_a_huge_file_is_never_read_whole(tmp_path: Path) -> None:
    """Fails before the fix: the read followed the link that replaced the checked file and
    returned 50 MB."""
    with open(tmp_path / "big", "wb") as big:
        big.truncate(BIG_BYTES)  # sparse: 50 MB of zero bytes without writing them
    tally = _race(tmp_path, _put_big_link)
    assert tally is not None, "the reader hung"
    texts, nones, wrong = tally
    assert wrong == 0, f"{wrong} reads returned something other than the checked small file"
    require(texts > 0 and nones > 0, f"the race was not exercised: {tally}")
