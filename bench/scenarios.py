"""The six scenarios. Each returns a JSON-able dict: what was measured, one row per contender.

Every scenario measures its contenders *side by side*: round ``r`` runs every contender once
(in an order rotated each round), so a noisy neighbour slows all of them alike, and the figure
reported is the median over the rounds. Ratios are taken against the floor measured in the same
run (``ratio = median(contender) / median(floor)``).

Multi-process scenarios fork (children share this process's imports, nothing is pickled), start
their workers at one barrier, and time inside the workers with ``time.perf_counter``
(CLOCK_MONOTONIC on Linux: one clock for every process). A worker that fails sends its traceback
to the parent, which raises :class:`BenchError`: a broken run never yields a number.
"""

from __future__ import annotations

import gc
import math
import multiprocessing
import os
import random
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
import traceback
from collections import Counter
from collections.abc import Callable, Collection, Sequence, Sized
from contextlib import suppress
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from bench.contenders import (
    CONTENDED,
    CYCLES,
    HANDOFFS,
    STORM,
    BenchError,
    HandOffLock,
    TryLock,
    gsd_with_feature,
    missing_module,
)

CTX = multiprocessing.get_context("fork")
BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
SYNC_TIMEOUT = 60.0
"""Longest wait at a barrier or for a worker's answer: a dead worker fails the run, not hangs it."""

Row = dict[str, Any]
Scenario = dict[str, Any]


# --------------------------------------------------------------------------- helpers


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100), linear between the two nearest ranks."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    pos = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _rotated(items: Sequence[Any], round_no: int) -> list[Any]:
    shift = round_no % len(items) if items else 0
    return [*items[shift:], *items[:shift]]


def _ratio(value: float, floor: float | None) -> float | None:
    if floor is None or not floor or math.isnan(floor) or math.isnan(value):
        return None
    return value / floor


def spread(values: Sequence[float]) -> float:
    """Interquartile range over the median, in percent: how noisy a figure's rounds were."""
    middle = statistics.median(values) if values else math.nan
    if not middle or math.isnan(middle):
        return math.nan
    return 100.0 * (percentile(values, 75) - percentile(values, 25)) / middle


def _with_ratios(rows: list[Row], floor_key: str) -> list[Row]:
    floor = next((row["value"] for row in rows if row["key"] == floor_key), None)
    for row in rows:
        row["ratio"] = _ratio(row["value"], floor)
        row["spread_pct"] = spread(row["rounds"])
    return rows


def _skip_reasons(
    contenders: Sequence[Any], only: Collection[str] | None = None
) -> tuple[list[Any], list[dict[str, str]]]:
    """The contenders to run (those named in ``only``, if given) and why others are skipped."""
    available, skipped = [], []
    for contender in contenders:
        if only is not None and contender.key not in only:
            continue
        reason = missing_module(contender.module)
        if reason is None:
            available.append(contender)
        else:
            skipped.append({"key": contender.key, "label": contender.label, "reason": reason})
    return available, skipped


def _send_failure(conn: Connection) -> None:
    with suppress(OSError):  # the parent is gone: nobody to tell
        conn.send(("error", traceback.format_exc()))


def _receive(conn: Connection, what: str, timeout: float = SYNC_TIMEOUT) -> Any:
    if not conn.poll(timeout):
        raise BenchError(f"{what}: no answer within {timeout:.0f} s")
    message = conn.recv()
    if isinstance(message, tuple) and message and message[0] == "error":
        raise BenchError(f"{what} failed in a worker:\n{message[1]}")
    return message


def _reap(processes: Sequence[multiprocessing.process.BaseProcess]) -> None:
    for process in processes:
        process.join(SYNC_TIMEOUT)
        if process.is_alive():
            process.terminate()
            process.join()


def _team(target: Callable[..., None], each: Sequence[tuple[Any, ...]], what: str) -> list[Any]:
    """Fork one worker per ``each`` entry, ``target(conn, *entry)``; return their answers."""
    pipes = [CTX.Pipe(duplex=False) for _ in each]
    processes = [
        CTX.Process(target=target, args=(sender, *args), daemon=True)
        for (_, sender), args in zip(pipes, each, strict=True)
    ]
    try:
        for process in processes:
            process.start()
        for _, sender in pipes:
            sender.close()
        return [_receive(receiver, what) for receiver, _ in pipes]
    finally:
        for receiver, _ in pipes:
            receiver.close()
        _reap(processes)


# --------------------------------------------------------------------------- (1) uncontended


def uncontended(
    work: Path, *, rounds: int, cycles: int, only: Collection[str] | None = None
) -> Scenario:
    """Acquire + release of one free lock in one process, ``cycles`` times per round."""
    return uncontended_on({"": work}, rounds=rounds, cycles=cycles, only=only)[""]


def uncontended_on(
    places: dict[str, Path], *, rounds: int, cycles: int, only: Collection[str] | None = None
) -> dict[str, Scenario]:
    """Scenario (1) in each folder of ``places`` (name -> folder, each on its own file
    system), every contender on every file system once per round: one scenario per name."""
    available, skipped = _skip_reasons(CYCLES, only)
    runs: dict[tuple[str, str], Callable[[], None]] = {}
    for place, folder in places.items():
        for contender in available:
            cycle = contender.make(folder / "uncontended" / contender.key)
            for _ in range(max(5, cycles // 10)):  # warm-up: caches, first-time imports, dentries
                cycle()
            runs[place, contender.key] = cycle
    samples: dict[tuple[str, str], list[float]] = {key: [] for key in runs}
    for round_no in range(rounds):
        for key in _rotated(list(runs), round_no):
            cycle = runs[key]
            gc.collect()
            start = time.perf_counter()
            for _ in range(cycles):
                cycle()
            samples[key].append(cycles / (time.perf_counter() - start))
    return {
        place: _uncontended_scenario(
            [
                {
                    "key": contender.key,
                    "label": contender.label,
                    "group": contender.group,
                    "value": statistics.median(samples[place, contender.key]),
                    "us_per_cycle": 1e6 / statistics.median(samples[place, contender.key]),
                    "rounds": samples[place, contender.key],
                }
                for contender in available
            ],
            skipped,
            {"rounds": rounds, "cycles_per_round": cycles},
        )
        for place in places
    }


def _uncontended_scenario(rows: list[Row], skipped: list[dict[str, str]], sizes: Row) -> Scenario:
    return {
        "id": "uncontended",
        "kind": "uncontended",
        "number": 1,
        "title": "Uncontended acquire + release, one process",
        "unit": "cycles/s",
        "better": "higher",
        "floor": "floor-link",
        "sizes": sizes,
        "rows": _with_ratios(rows, "floor-link"),
        "skipped": skipped,
    }


# --------------------------------------------------------------------------- (2) contended


def _contend_worker(
    conn: Connection,
    contender: TryLock,
    gsd: str,
    feature: str,
    barrier: Any,
    seconds: float,
    shared: tuple[Any, Any, Any],
) -> None:
    inside, overlaps, mutex = shared
    try:
        try_acquire, release = contender.make(gsd, feature)
        won = attempts = 0
        barrier.wait(SYNC_TIMEOUT)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            attempts += 1
            if not try_acquire():
                os.sched_yield()  # a spinning contender lets the holder run
                continue
            with mutex:  # occupancy marker: a second holder inside is an overlap
                inside.value += 1
                if inside.value > 1:
                    overlaps.value += 1
            with mutex:
                inside.value -= 1
            release()
            if time.perf_counter() < end:
                won += 1
        conn.send((won, attempts))
    except BaseException:
        _send_failure(conn)
        barrier.abort()


def contended(
    work: Path,
    *,
    rounds: int,
    seconds: float,
    procs: int,
    only: Collection[str] | None = None,
) -> Scenario:
    """``procs`` processes hammer one feature for ``seconds``; count cycles and overlaps."""
    available, skipped = _skip_reasons(CONTENDED, only)
    samples: dict[str, list[float]] = {c.key: [] for c in available}
    overlaps_total: Counter[str] = Counter()
    attempts_total: Counter[str] = Counter()
    won_total: Counter[str] = Counter()
    for round_no in range(rounds):
        for contender in _rotated(available, round_no):
            gsd = gsd_with_feature(work / "contended" / f"{contender.key}-{round_no}")
            barrier = CTX.Barrier(procs)
            shared = (CTX.Value("i", 0, lock=False), CTX.Value("i", 0, lock=False), CTX.Lock())
            each = [(contender, gsd, "bench-feature", barrier, seconds, shared)] * procs
            answers = _team(_contend_worker, each, f"contended {contender.key}")
            won = sum(answer[0] for answer in answers)
            samples[contender.key].append(won / seconds)
            won_total[contender.key] += won
            attempts_total[contender.key] += sum(answer[1] for answer in answers)
            overlaps_total[contender.key] += shared[1].value
    rows = [
        {
            "key": c.key,
            "label": c.label,
            "group": c.group,
            "value": statistics.median(samples[c.key]),
            "overlaps": overlaps_total[c.key],
            "acquisitions": won_total[c.key],
            "attempts": attempts_total[c.key],
            "rounds": samples[c.key],
        }
        for c in available
    ]
    return {
        "id": "contended",
        "number": 2,
        "title": f"{procs} processes contending one feature",
        "unit": "cycles/s",
        "better": "higher",
        "floor": "floor-link",
        "sizes": {"rounds": rounds, "seconds_per_round": seconds, "processes": procs},
        "rows": _with_ratios(rows, "floor-link"),
        "skipped": skipped,
    }


# --------------------------------------------------------------------------- (3) claim storm


def _storm_worker(
    conn: Connection,
    contender: TryLock,
    gsd: str,
    names: list[str],
    order: list[int],
    barrier: Any,
) -> None:
    try:
        tries = [contender.make(gsd, names[index])[0] for index in order]
        barrier.wait(SYNC_TIMEOUT)
        start = time.perf_counter()
        won = [index for index, try_acquire in zip(order, tries, strict=True) if try_acquire()]
        conn.send((start, time.perf_counter(), won))
    except BaseException:
        _send_failure(conn)
        barrier.abort()


def _storm_tree(gsd: Path, names: Sequence[str]) -> None:
    for name in names:
        (gsd / "specs" / name).mkdir(parents=True)


def storm(
    work: Path,
    *,
    rounds: int,
    features: int,
    workers: int,
    seed: int = 4,
    only: Collection[str] | None = None,
) -> Scenario:
    """``workers`` processes each try every one of ``features`` features once, in random order."""
    available, skipped = _skip_reasons(STORM, only)
    names = [f"feat-{index:05d}" for index in range(features)]
    samples: dict[str, list[float]] = {c.key: [] for c in available}
    duplicates: Counter[str] = Counter()
    unclaimed: Counter[str] = Counter()
    missing_files: Counter[str] = Counter()
    rng = random.Random(seed)
    for round_no in range(rounds):
        orders = [rng.sample(range(features), features) for _ in range(workers)]
        for contender in _rotated(available, round_no):
            base = work / "storm" / f"{contender.key}-{round_no}"
            gsd = base / "gsd"
            _storm_tree(gsd, names)
            os.sync()  # the setup's metadata is written now, not during the timed storm
            barrier = CTX.Barrier(workers)
            each = [(contender, str(gsd), names, order, barrier) for order in orders]
            answers = _team(_storm_worker, each, f"claim storm {contender.key}")
            elapsed = max(a[1] for a in answers) - min(a[0] for a in answers)
            samples[contender.key].append(elapsed)
            claims = Counter(index for answer in answers for index in answer[2])
            duplicates[contender.key] += sum(count - 1 for count in claims.values())
            unclaimed[contender.key] += features - len(claims)
            missing_files[contender.key] += sum(
                not os.path.lexists(gsd / "specs" / names[index] / ".lock") for index in claims
            )
            shutil.rmtree(base)
            os.sync()
    rows = [
        {
            "key": c.key,
            "label": c.label,
            "group": c.group,
            "value": statistics.median(samples[c.key]),
            "duplicate_claims": duplicates[c.key],
            "unclaimed": unclaimed[c.key],
            "missing_lock_files": missing_files[c.key],
            "rounds": samples[c.key],
        }
        for c in available
    ]
    for row in rows:
        row["claims_per_s"] = features / row["value"]
    return {
        "id": "storm",
        "number": 3,
        "title": f"Claim storm: {workers} workers, {features} features, random order",
        "unit": "s",
        "better": "lower",
        "floor": "floor-link",
        "sizes": {"rounds": rounds, "features": features, "workers": workers},
        "rows": _with_ratios(rows, "floor-link"),
        "skipped": skipped,
    }


# --------------------------------------------------------------------------- (4) status


def _status_tree(gsd: Path, count: int, *, distinct: bool) -> None:
    """``count`` feature folders, each with an active lock of this (live) process.

    ``distinct``: each record has its own timestamp, as locks taken one by one have; otherwise
    every lock holds the very same record (the best case for ``status``'s liveness cache).
    """
    now = time.time()
    pid = os.getpid()
    for index in range(count):
        folder = gsd / "specs" / f"feat-{index:05d}"
        folder.mkdir(parents=True)
        stamp = now - index * 0.01 if distinct else now
        (folder / ".lock").write_bytes(f"{pid}:{stamp}".encode("ascii"))


def bare_status_loop(gsd: str) -> list[tuple[str, bytes]]:
    """The floor: list ``specs``, and for each folder open, fstat and read its ``.lock``."""
    found = []
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    with os.scandir(os.path.join(gsd, "specs")) as entries:
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                continue
            try:
                fd = os.open(os.path.join(entry.path, ".lock"), flags)
            except FileNotFoundError:
                continue
            try:
                os.fstat(fd)
                found.append((entry.name, os.read(fd, 4097)))
            finally:
                os.close(fd)
    return found


def status(work: Path, *, rounds: int, locks_count: int) -> Scenario:
    """``mahabharatha.locks.status`` over ``locks_count`` locks vs the bare loop."""
    from mahabharatha import locks

    distinct = work / "status" / "distinct"
    shared = work / "status" / "shared"
    _status_tree(distinct, locks_count, distinct=True)
    _status_tree(shared, locks_count, distinct=False)
    os.sync()  # flush the setup's 40,000 new entries before anything is timed
    calls: list[tuple[str, str, str, Callable[[], Sized]]] = [
        (
            "ours-status",
            "ours: locks.status(), one record per lock",
            "ours",
            lambda: locks.status(distinct),
        ),
        (
            "ours-status-shared",
            "ours: locks.status(), all locks one record (cached liveness)",
            "ours",
            lambda: locks.status(shared),
        ),
        (
            "floor-loop",
            "floor: scandir + open/fstat/read/close loop",
            "floor",
            lambda: bare_status_loop(str(distinct)),
        ),
    ]
    samples: dict[str, list[float]] = {key: [] for key, *_ in calls}
    for _key, _label, _group, call in calls:  # warm-up: page cache, dentries, psutil import
        if len(call()) != locks_count:
            raise BenchError(f"status listed {len(call())} locks, not {locks_count}")
    for round_no in range(rounds):
        for key, _label, _group, call in _rotated(calls, round_no):
            gc.collect()
            start = time.perf_counter()
            listed = call()
            samples[key].append(time.perf_counter() - start)
            if len(listed) != locks_count:
                raise BenchError(f"{key} listed {len(listed)} locks, not {locks_count}")
    rows = [
        {
            "key": key,
            "label": label,
            "group": group,
            "value": statistics.median(samples[key]),
            "locks_per_s": locks_count / statistics.median(samples[key]),
            "rounds": samples[key],
        }
        for key, label, group, _call in calls
    ]
    return {
        "id": "status",
        "number": 4,
        "title": f"Status of {locks_count} locks",
        "unit": "s",
        "better": "lower",
        "floor": "floor-loop",
        "sizes": {"rounds": rounds, "locks": locks_count},
        "rows": _with_ratios(rows, "floor-loop"),
        "skipped": [],
    }


# --------------------------------------------------------------------------- (5) CLI cold call


def console_script() -> str | None:
    """The ``mahabharatha`` console script of *this* interpreter (a pyenv shim would add its own
    start-up to every call), else the first one on PATH."""
    candidate = Path(sysconfig.get_path("scripts")) / "mahabharatha"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which("mahabharatha")


def cli_environment(work: Path) -> dict[str, str]:
    """The environment of every timed command: this work tree first on the path, and byte code
    cached as after a ``pip install`` (in a private prefix, so the work tree stays clean).

    Without this, ``PYTHONDONTWRITEBYTECODE`` (set on some machines) would make every call
    compile our modules from source while Typer's come pre-compiled: an unfair 15-20 ms.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    return env


def cli(work: Path, *, runs: int) -> Scenario:
    """Cold start of one CLI call, a fresh interpreter each time, vs importing Typer."""
    python = sys.executable
    cwd = work / "cli"
    cwd.mkdir(parents=True, exist_ok=True)  # an empty folder: no .gsd, "x is free"
    env = cli_environment(work)
    commands: list[tuple[str, str, str, list[str]]] = [
        (
            "ours-module",
            "ours: python -m mahabharatha lock check x",
            "ours",
            [python, "-m", "mahabharatha", "lock", "check", "x"],
        ),
    ]
    skipped = []
    script = console_script()
    if script:
        commands.append(
            (
                "ours-script",
                "ours: mahabharatha lock check x (console script)",
                "ours",
                [script, "lock", "check", "x"],
            )
        )
    else:
        skipped.append(
            {
                "key": "ours-script",
                "label": "console script",
                "reason": "no mahabharatha script installed",
            }
        )
    commands += [
        ("floor-typer", 'floor: python -c "import typer"', "floor", [python, "-c", "import typer"]),
        (
            "typer-app",
            "reference: minimal Typer app, one str argument",
            "reference",
            [python, str(BENCH_DIR / "typer_minimal.py"), "check", "x"],
        ),
        ("python-bare", "reference: python -c pass", "reference", [python, "-c", "pass"]),
    ]

    def run(argv: list[str]) -> float:
        start = time.perf_counter()
        done = subprocess.run(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            check=False,
        )
        elapsed = time.perf_counter() - start
        if done.returncode != 0:
            raise BenchError(f"{argv} exited {done.returncode}: {done.stderr.decode()[-2000:]}")
        return elapsed

    samples: dict[str, list[float]] = {key: [] for key, *_ in commands}
    for _key, _label, _group, argv in commands:
        run(argv)  # warm-up: byte-code caches, page cache
    for round_no in range(runs):
        for key, _label, _group, argv in _rotated(commands, round_no):
            samples[key].append(run(argv))
    rows = [
        {
            "key": key,
            "label": label,
            "group": group,
            "value": statistics.median(samples[key]),
            "argv": argv,
            "rounds": samples[key],
        }
        for key, label, group, argv in commands
    ]
    return {
        "id": "cli",
        "number": 5,
        "title": "CLI cold call, a fresh interpreter per call",
        "unit": "s",
        "better": "lower",
        "floor": "floor-typer",
        "sizes": {"runs": runs, "bytecode": "cached (PYTHONPYCACHEPREFIX)"},
        "rows": _with_ratios(rows, "floor-typer"),
        "skipped": skipped,
    }


# --------------------------------------------------------------------------- (6) hand-off


HOLD_SECONDS = (0.002, 0.050)
"""Each hold lasts a random time in this range, the same sequence for every contender, so a
waiter is caught at every point of its backoff (early short polls and capped long ones)."""


def _handoff_waiter(conn: Connection, contender: HandOffLock, work: Path) -> None:
    try:
        _acquire_now, wait_acquire, release = contender.make(work)
        while conn.recv() == "go":
            wait_acquire(lambda: conn.send("waiting"))
            acquired = time.perf_counter_ns()
            conn.send(acquired)
            release()
            conn.send("released")
    except BaseException:
        _send_failure(conn)


def handoff(
    work: Path, *, handoffs: int, seed: int = 6, only: Collection[str] | None = None
) -> Scenario:
    """A holder releases while a waiter is blocked in acquire: time from release to acquire.

    The holder (this process) reads ``perf_counter_ns`` just before it calls release; the waiter
    reads it just after its acquire returns and sends it through a pipe. Contenders alternate
    hand-off by hand-off.
    """
    available, skipped = _skip_reasons(HANDOFFS, only)
    sides: dict[str, tuple[Connection, Any, Callable[[], None], Callable[[], None]]] = {}
    try:
        for contender in available:
            lock_work = work / "handoff" / contender.key
            acquire_now, _wait, release = contender.make(lock_work)
            parent, child = CTX.Pipe()
            waiter = CTX.Process(
                target=_handoff_waiter, args=(child, contender, lock_work), daemon=True
            )
            waiter.start()
            child.close()
            sides[contender.key] = (parent, waiter, acquire_now, release)
        latencies: dict[str, list[float]] = {key: [] for key in sides}
        rng = random.Random(seed)
        for _ in range(handoffs):
            hold = rng.uniform(*HOLD_SECONDS)
            for key, (conn, _waiter, acquire_now, release) in sides.items():
                acquire_now()
                conn.send("go")
                if _receive(conn, f"hand-off {key}") != "waiting":
                    raise BenchError(f"hand-off {key}: waiter out of step")
                time.sleep(hold)
                released = time.perf_counter_ns()
                release()
                acquired = _receive(conn, f"hand-off {key}")
                if _receive(conn, f"hand-off {key}") != "released":
                    raise BenchError(f"hand-off {key}: waiter out of step")
                latencies[key].append((acquired - released) / 1e6)
    finally:
        for conn, _waiter, _acquire, _release in sides.values():
            with suppress(OSError):  # a waiter that died already
                conn.send("stop")
            conn.close()
        _reap([waiter for _c, waiter, _a, _r in sides.values()])
    rows = [
        {
            "key": c.key,
            "label": c.label,
            "group": c.group,
            "value": percentile(latencies[c.key], 50),
            "p50_ms": percentile(latencies[c.key], 50),
            "p99_ms": percentile(latencies[c.key], 99),
            "mean_ms": statistics.fmean(latencies[c.key]),
            "max_ms": max(latencies[c.key]),
            "handoffs": len(latencies[c.key]),
            "rounds": latencies[c.key],
        }
        for c in available
    ]
    for row in rows:
        row["ratio"] = None  # absolute target: no floor
    return {
        "id": "handoff",
        "number": 6,
        "title": "Hand-off latency: release to a blocked waiter's acquire",
        "unit": "ms",
        "better": "lower",
        "floor": None,
        "sizes": {"handoffs": handoffs, "hold_ms": [s * 1000 for s in HOLD_SECONDS]},
        "rows": rows,
        "skipped": skipped,
    }
