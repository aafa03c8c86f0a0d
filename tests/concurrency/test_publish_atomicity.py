"""No reader ever sees a lock empty or half-written.

A writer process acquires and releases in a loop; a checker process opens ``.lock`` and reads it
in a loop for as long as the writer runs. Every read of an existing lock must be a whole record
of the writer. The run is bounded by the writer's iteration count, not by time.

The old design loses this: it creates ``.lock`` with ``O_EXCL`` and writes the record a moment
later, and a reader in between sees an empty file (thousands of times per run: no widening).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.concurrency._harness import (
    CTX,
    TEST_TIMEOUT,
    implementations,
    load,
    lock_path,
    meet,
    read_entry,
    record_pid,
    require,
    stress,
    team,
    trials,
)


def _writer(impl_name: str, gsd: Path, rounds: int, start: Any, done: Any, bad: Any) -> None:
    impl = load(impl_name)
    meet(start)
    try:
        for _ in range(rounds):
            if bad.value:
                break  # caught: the rest of the run would prove nothing more
            if impl.acquire(gsd):
                impl.release(gsd)
    finally:
        done.value = 1


def _checker(gsd: Path, writer_pid: int, start: Any, done: Any, seen: Any, bad: Any) -> None:
    lock = lock_path(gsd)
    meet(start)
    while not done.value:
        content = read_entry(lock)
        if content is None:
            continue
        seen.value += 1
        if record_pid(content) != writer_pid:
            bad.value += 1
            if bad.value == 1:
                (gsd / "first-bad-read").write_bytes(content)


@stress
@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize(
    "impl_name", implementations("the lock is empty between os.open(O_EXCL) and os.write")
)
def test_a_reader_never_sees_an_empty_or_partial_lock(impl_name: str, tmp_path: Path) -> None:
    gsd = tmp_path / "gsd"
    (gsd / "specs").mkdir(parents=True)
    rounds = 50 * trials(80)
    done = CTX.Value("b", 0, lock=False)
    seen = CTX.Value("q", 0, lock=False)
    bad = CTX.Value("q", 0, lock=False)
    with team(tmp_path) as crew:
        start = crew.barrier(2)
        writer = crew.spawn(_writer, impl_name, gsd, rounds, start, done, bad)
        crew.spawn(_checker, gsd, writer, start, done, seen, bad)
        crew.join()
    require(seen.value > 0, "the checker never caught the lock in place")
    first = (gsd / "first-bad-read").read_bytes() if bad.value else b""
    assert bad.value == 0, f"{bad.value} of {seen.value} reads were not a whole record: {first!r}"
