"""The PostgreSQL scenarios (7-10): the lock table against bare SQL on the same server.

The benchmark starts its own throw-away server like the tests (``tests/support/postgres.py``:
initdb into a temporary folder, a Unix socket there; as an unprivileged user under root) and
stops it at the end. Each scenario measures side by side, rounds rotated, medians reported, as
the file scenarios do (``bench/scenarios.py``).

7. uncontended acquire + release over a warm connection vs the floor: a bare
   ``INSERT ... ON CONFLICT DO NOTHING`` + ``DELETE`` pair on one connection (>= 0.8x);
8. 8 processes claiming 1,000 features vs a bare SQL claim loop (``UPDATE ... WHERE feature =
   (SELECT ... ORDER BY feature LIMIT 1 FOR UPDATE SKIP LOCKED)`` over a table of the features;
   <= 1.5x its time, every feature once);
9. hand-off to a waiting process (LISTEN/NOTIFY; p50 <= 5 ms, no poll more often than every
   250 ms);
10. a CLI cold call with a PostgreSQL URL vs a bare script that imports typer and psycopg and
   runs ``SELECT 1`` (<= 1.3x).
"""

from __future__ import annotations

import gc
import os
import random
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final

from bench.scenarios import (
    CTX,
    Row,
    Scenario,
    _reap,
    _receive,
    _rotated,
    _send_failure,
    _team,
    _with_ratios,
    cli_environment,
    percentile,
)

WAIT_SLICE_SECONDS = 0.25
"""A waiter sleeps on LISTEN at most this long between tries: the poll rate when a wake-up is
missed, never faster (the issue's bound)."""
BARE_FLOOR_TABLE = "bench_floor"
BARE_CLAIM_TABLE = "bench_claims"


PG_CYCLES: Final = 1000
"""Acquire + release pairs per round of scenario 7 (two round trips each: about 0.3 s)."""
PG_STORM_ROUNDS: Final = 3
PG_STORM_FEATURES: Final = 1000
PG_STORM_WORKERS: Final = 8


def runners(rounds: int, handoffs: int, cli_runs: int) -> dict[str, Callable[[Path], Scenario]]:
    """Scenarios 7-10 for ``bench/run.py``; the server starts on the first one run, and stops
    when the benchmark exits. Without PostgreSQL each raises, saying what to install."""

    def on_server(run: Callable[[Any, Path], Scenario]) -> Callable[[Path], Scenario]:
        def wrapped(work: Path) -> Scenario:
            from tests.support import postgres

            return run(postgres.shared_server(), work)

        return wrapped

    from tests.support import postgres

    if postgres.client_missing() is not None:
        return {}  # run.py leaves them out, saying why
    small = rounds <= 2  # --tiny: proves the scenarios run, not speed
    return {
        "pg-uncontended": on_server(
            lambda pg, _w: uncontended(pg, rounds=rounds, cycles=20 if small else PG_CYCLES)
        ),
        "pg-storm": on_server(
            lambda pg, _w: storm(
                pg,
                rounds=1 if small else PG_STORM_ROUNDS,
                features=40 if small else PG_STORM_FEATURES,
                workers=PG_STORM_WORKERS,
            )
        ),
        "pg-handoff": on_server(lambda pg, _w: handoff(pg, handoffs=handoffs)),
        "pg-cli": on_server(lambda pg, w: cli(pg, w, runs=cli_runs)),
    }


@contextmanager
def server() -> Iterator[Any]:
    """A throw-away PostgreSQL server for the PostgreSQL scenarios (None without one)."""
    from tests.support import postgres

    missing = postgres.client_missing()
    if missing is not None:
        yield None
        return
    started = postgres.start_server()
    try:
        yield started
    finally:
        started.stop("immediate")
        started.cleanup()


def _backend(url: str, namespace: str) -> Any:
    from mahabharatha.backends.postgres.backend import PostgresBackend

    return PostgresBackend(url, namespace=namespace)


def _me() -> Any:
    from mahabharatha.backends.base import Requester
    from mahabharatha.owner import ownership

    return Requester(os.getpid(), ownership.details_of(os.getpid()))


# --------------------------------------------------------------------------- (7) uncontended


def _ours_cycle(url: str) -> tuple[Callable[[], None], Callable[[], None]]:
    backend = _backend(url, "bench-uncontended")
    me = _me()

    def cycle() -> None:
        held = backend.try_acquire("feature", me).held
        if held is None:
            raise RuntimeError("uncontended acquire failed")
        backend.release_held(held)

    return cycle, backend.close


def _floor_cycle(url: str) -> tuple[Callable[[], None], Callable[[], None]]:
    import psycopg

    conn = psycopg.connect(url, autocommit=True)
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {BARE_FLOOR_TABLE} (namespace text, feature text,"
        " PRIMARY KEY (namespace, feature))"
    )
    insert = f"INSERT INTO {BARE_FLOOR_TABLE} VALUES (%s, %s) ON CONFLICT DO NOTHING RETURNING 1"
    delete = f"DELETE FROM {BARE_FLOOR_TABLE} WHERE namespace = %s AND feature = %s"

    def cycle() -> None:
        if not conn.execute(insert, ("bench", "feature")).fetchall():
            raise RuntimeError("floor insert failed")
        conn.execute(delete, ("bench", "feature"))

    return cycle, conn.close


def uncontended(pg: Any, *, rounds: int, cycles: int) -> Scenario:
    url = pg.url()
    made = {"pg-floor": _floor_cycle(url), "pg-ours": _ours_cycle(url)}
    runs = {key: cycle for key, (cycle, _close) in made.items()}
    labels = {
        "pg-floor": ("bare INSERT ON CONFLICT DO NOTHING + DELETE", "floor"),
        "pg-ours": ("PostgresBackend try_acquire + release_held", "ours"),
    }
    for cycle in runs.values():
        for _ in range(max(20, cycles // 10)):  # warm-up: prepared statements, caches
            cycle()
    samples: dict[str, list[float]] = {key: [] for key in runs}
    for round_no in range(rounds):
        for key in _rotated(list(runs), round_no):
            gc.collect()
            start = time.perf_counter()
            for _ in range(cycles):
                runs[key]()
            samples[key].append(cycles / (time.perf_counter() - start))
    for _cycle, close in made.values():
        close()
    rows: list[Row] = []
    for key, (label, group) in labels.items():
        value = statistics.median(samples[key])
        rows.append(
            {
                "key": key,
                "label": label,
                "group": group,
                "value": value,
                "us_per_cycle": 1e6 / value,
                "rounds": samples[key],
            }
        )
    return {
        "id": "pg-uncontended",
        "kind": "uncontended",
        "number": 7,
        "title": "PostgreSQL: uncontended acquire + release over a warm connection",
        "unit": "cycles/s",
        "better": "higher",
        "floor": "pg-floor",
        "sizes": {"rounds": rounds, "cycles_per_round": cycles},
        "rows": _with_ratios(rows, "pg-floor"),
        "skipped": [],
    }


# --------------------------------------------------------------------------- (8) claim storm


def _claim_worker(
    conn: Connection, kind: str, url: str, namespace: str, names: list[str], start: Any
) -> None:
    try:
        import psycopg

        claimed: list[str] = []
        if kind == "pg-ours":
            backend = _backend(url, namespace)
            me = _me()
            backend.inspect(names[0])  # connect before the start
            start.wait()
            began = time.perf_counter()
            while (won := backend.try_claim(names, me)) is not None:
                claimed.append(won.held.feature)
            backend.close()
        else:
            bare = psycopg.connect(url, autocommit=True)
            claim = (
                f"UPDATE {BARE_CLAIM_TABLE} SET owner = %s WHERE round = %s AND feature = ("
                f"SELECT feature FROM {BARE_CLAIM_TABLE} WHERE round = %s AND owner IS NULL"
                " ORDER BY feature LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING feature"
            )
            start.wait()
            began = time.perf_counter()
            while found := bare.execute(claim, (os.getpid(), namespace, namespace)).fetchall():
                claimed.append(found[0][0])
            bare.close()
        conn.send((began, time.perf_counter(), claimed))
    except BaseException:
        _send_failure(conn)


def storm(pg: Any, *, rounds: int, features: int, workers: int) -> Scenario:
    import psycopg

    url = pg.url()
    names = [f"feature-{index:05d}" for index in range(features)]
    with psycopg.connect(url, autocommit=True) as setup:
        setup.execute(
            f"CREATE TABLE IF NOT EXISTS {BARE_CLAIM_TABLE} (round text, feature text"
            ' COLLATE "C", owner integer, PRIMARY KEY (round, feature))'
        )
    samples: dict[str, list[float]] = {"pg-floor": [], "pg-ours": []}
    faults: dict[str, Counter[str]] = {key: Counter() for key in samples}
    for round_no in range(rounds):
        for key in _rotated(list(samples), round_no):
            namespace = f"storm-{round_no}-{key}"
            if key == "pg-floor":
                with psycopg.connect(url, autocommit=True) as setup:
                    setup.execute(
                        f"INSERT INTO {BARE_CLAIM_TABLE} (round, feature)"
                        " SELECT %s, unnest(%s::text[])",
                        (namespace, names),
                    )
            start = CTX.Barrier(workers)
            answers = _team(
                _claim_worker,
                [(key, url, namespace, names, start) for _ in range(workers)],
                f"pg storm {key}",
            )
            began = min(answer[0] for answer in answers)
            ended = max(answer[1] for answer in answers)
            claims = Counter(name for answer in answers for name in answer[2])
            faults[key]["duplicate_claims"] += sum(n - 1 for n in claims.values() if n > 1)
            faults[key]["unclaimed"] += len(set(names) - set(claims))
            samples[key].append(ended - began)
    rows: list[Row] = []
    labels = {
        "pg-floor": ("bare SQL claim loop (FOR UPDATE SKIP LOCKED)", "floor"),
        "pg-ours": ("PostgresBackend try_claim", "ours"),
    }
    for key, (label, group) in labels.items():
        value = statistics.median(samples[key])
        rows.append(
            {
                "key": key,
                "label": label,
                "group": group,
                "value": value,
                "claims_per_s": features / value,
                "duplicate_claims": faults[key]["duplicate_claims"],
                "unclaimed": faults[key]["unclaimed"],
                "missing_lock_files": 0,
                "rounds": samples[key],
            }
        )
    return {
        "id": "pg-storm",
        "kind": "storm",
        "number": 8,
        "title": f"PostgreSQL: {workers} processes claiming {features} features",
        "unit": "s",
        "better": "lower",
        "floor": "pg-floor",
        "sizes": {"rounds": rounds, "features": features, "workers": workers},
        "rows": _with_ratios(rows, "pg-floor"),
        "skipped": [],
    }


# --------------------------------------------------------------------------- (9) hand-off


def _handoff_waiter(conn: Connection, url: str) -> None:
    try:
        backend = _backend(url, "bench-handoff")
        me = _me()
        backend.wait_for_release("feature", 0)  # start listening before the first round
        polls = 0
        while conn.recv() == "go":
            conn.send("waiting")
            while (held := backend.try_acquire("feature", me).held) is None:
                backend.wait_for_release("feature", WAIT_SLICE_SECONDS)
                polls += 1
            acquired = time.perf_counter_ns()
            conn.send(acquired)
            backend.release_held(held)
            conn.send("released")
        backend.close()
        conn.send(polls)
    except BaseException:
        _send_failure(conn)


def handoff(pg: Any, *, handoffs: int, seed: int = 9) -> Scenario:
    """The holder (this process) releases while the waiter is blocked on LISTEN; the time from
    just before the release to just after the waiter's acquire returned."""
    from mahabharatha.backends.base import Requester

    url = pg.url()
    holder = _backend(url, "bench-handoff")
    me = Requester(os.getpid())
    parent, child = CTX.Pipe()
    waiter = CTX.Process(target=_handoff_waiter, args=(child, url), daemon=True)
    waiter.start()
    child.close()
    latencies: list[float] = []
    rng = random.Random(seed)
    try:
        for _ in range(handoffs):
            held = None
            while held is None:
                held = holder.try_acquire("feature", me).held
            parent.send("go")
            if _receive(parent, "pg hand-off") != "waiting":
                raise RuntimeError("pg hand-off: waiter out of step")
            time.sleep(rng.uniform(0.002, 0.050))  # let the waiter block (part of the scenario)
            released = time.perf_counter_ns()
            holder.release_held(held)
            acquired = _receive(parent, "pg hand-off")
            if _receive(parent, "pg hand-off") != "released":
                raise RuntimeError("pg hand-off: waiter out of step")
            latencies.append((acquired - released) / 1e6)
        parent.send("stop")
        polls = _receive(parent, "pg hand-off")
    finally:
        parent.close()
        _reap([waiter])
        holder.close()
    row: Row = {
        "key": "pg-ours",
        "label": "PostgresBackend: try_acquire + wait_for_release (LISTEN/NOTIFY)",
        "group": "ours",
        "value": percentile(latencies, 50),
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "mean_ms": statistics.fmean(latencies),
        "max_ms": max(latencies),
        "handoffs": len(latencies),
        "wake_ups": polls,
        "rounds": latencies,
        "ratio": None,
    }
    return {
        "id": "pg-handoff",
        "kind": "handoff",
        "number": 9,
        "title": "PostgreSQL: hand-off to a waiting process (LISTEN/NOTIFY)",
        "unit": "ms",
        "better": "lower",
        "floor": None,
        "sizes": {"handoffs": handoffs, "wait_slice_ms": WAIT_SLICE_SECONDS * 1000},
        "rows": [row],
        "skipped": [],
    }


# --------------------------------------------------------------------------- (10) CLI


BARE_CLI = (
    "import sys, typer, psycopg\n"
    "with psycopg.connect(sys.argv[1], autocommit=True) as c: c.execute('SELECT 1')\n"
)


def cli(pg: Any, work: Path, *, runs: int) -> Scenario:
    url = pg.url()
    env = {**cli_environment(work), "MAHABHARATHA_LOCK_NAMESPACE": "bench-cli"}
    commands = {
        "pg-floor": [sys.executable, "-c", BARE_CLI, url],
        "pg-ours": [
            sys.executable,
            "-m",
            "mahabharatha",
            "lock",
            "check",
            "feature",
            "--backend",
            url,
        ],
    }
    for command in commands.values():
        subprocess.run(command, env=env, cwd=work, capture_output=True, check=False)  # warm-up
    samples: dict[str, list[float]] = {key: [] for key in commands}
    for round_no in range(runs):
        for key in _rotated(list(commands), round_no):
            start = time.perf_counter()
            done = subprocess.run(commands[key], env=env, cwd=work, capture_output=True)
            samples[key].append(time.perf_counter() - start)
            if done.returncode not in (0, 1):
                raise RuntimeError(f"{key} failed: {done.stderr.decode(errors='replace')}")
    labels = {
        "pg-floor": ("python: import typer, psycopg; SELECT 1", "floor"),
        "pg-ours": ("python -m mahabharatha lock check --backend postgresql://...", "ours"),
    }
    rows: list[Row] = [
        {
            "key": key,
            "label": label,
            "group": group,
            "value": statistics.median(samples[key]),
            "rounds": samples[key],
        }
        for key, (label, group) in labels.items()
    ]
    return {
        "id": "pg-cli",
        "kind": "cli",
        "number": 10,
        "title": "PostgreSQL: CLI cold call with a PostgreSQL URL",
        "unit": "s",
        "better": "lower",
        "floor": "pg-floor",
        "sizes": {"runs": runs},
        "rows": _with_ratios(rows, "pg-floor"),
        "skipped": [],
    }


# --------------------------------------------------------------------------- targets


def targets(
    results: dict[str, Any], row: Callable[..., Any], target: Callable[..., Any]
) -> list[dict[str, Any]]:
    """The four PostgreSQL targets of issue 12."""
    found = []
    mine, floor = (
        row(results, "pg-uncontended", "pg-ours"),
        row(results, "pg-uncontended", "pg-floor"),
    )
    text = "(7) PostgreSQL uncontended: throughput vs bare INSERT ON CONFLICT + DELETE"
    if mine is None or floor is None:
        found.append(target(text, ">= 0.8x", None, None, "not measured"))
    else:
        ratio = mine["value"] / floor["value"]
        found.append(target(text, ">= 0.8x", ratio, ratio >= 0.8))
    mine, floor = row(results, "pg-storm", "pg-ours"), row(results, "pg-storm", "pg-floor")
    text = "(8) PostgreSQL claim storm: time vs bare SQL claim loop, every feature once"
    if mine is None or floor is None:
        found.append(target(text, "<= 1.5x, exact", None, None, "not measured"))
    else:
        ratio = mine["value"] / floor["value"]
        exact = not (mine["duplicate_claims"] or mine["unclaimed"])
        note = f"duplicates {mine['duplicate_claims']}, unclaimed {mine['unclaimed']}"
        found.append(target(text, "<= 1.5x, exact", ratio, ratio <= 1.5 and exact, note))
    mine = row(results, "pg-handoff", "pg-ours")
    text = "(9) PostgreSQL hand-off p50 (ms), no poll faster than every 250 ms"
    if mine is None:
        found.append(target(text, "<= 5 ms", None, None, "not measured"))
    else:
        note = f"p99 {mine['p99_ms']:.1f} ms; waits on LISTEN at most 250 ms each"
        found.append(target(text, "<= 5 ms", mine["p50_ms"], mine["p50_ms"] <= 5.0, note))
    mine, floor = row(results, "pg-cli", "pg-ours"), row(results, "pg-cli", "pg-floor")
    text = "(10) PostgreSQL CLI cold call vs python importing typer+psycopg, SELECT 1"
    if mine is None or floor is None:
        found.append(target(text, "<= 1.3x", None, None, "not measured"))
    else:
        ratio = mine["value"] / floor["value"]
        found.append(target(text, "<= 1.3x", ratio, ratio <= 1.3))
    return found
