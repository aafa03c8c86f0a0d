"""Many workers, few connections (issue 17 item 15): N concurrent ``lock run`` (or ``lock
work``) holders against one PostgreSQL server with a small ``max_connections``, each holding
its own feature for a while with the default lease (60 s, refreshed every 20 s).

    python bench/pg_many_holders.py [--holders 200] [--max-connections 40] [--hold 30]
                                    [--command run|work]

Printed (one JSON document): every holder's exit code (none may be 3, the server unreachable,
nor 76, a lost lock), the seconds until all held (from the first start), the most server
connections seen at once (``pg_stat_activity``, sampled), and the refresh load: the server's
committed transactions per second while all held (``pg_stat_database.xact_commit``).
The server is a throw-away one of the suite's kind (``tests/support/postgres.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.postgres import PgServer, admin_execute, start_server  # noqa: E402

SAMPLE_SECONDS = 0.1
"""How often the server is looked at (as a superuser: from the reserved slots)."""


def _count(server: PgServer, query: str) -> int:
    found = admin_execute(server, query)
    value = found[0][0]
    assert isinstance(value, int)
    return value


def _commits(server: PgServer) -> int:
    return _count(
        server, "SELECT xact_commit::int FROM pg_stat_database WHERE datname = current_database()"
    )


HOLDER_COMMANDS = {"run": ["lock", "run", "--timeout", "0"], "work": ["lock", "work"]}
"""Each holder's command, its feature and the rest appended."""


def measure(
    holders: int, max_connections: int, hold: float, command: str = "run"
) -> dict[str, Any]:
    server = start_server({"max_connections": str(max_connections)})
    work = Path(server.base, "work")
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    url = server.url()
    try:
        subprocess.run(
            [sys.executable, "-m", "mahabharatha", "lock", "init", "--backend", url],
            check=True,
            cwd=work,
            env=env,
            capture_output=True,
        )
        cmd = ["sleep", str(hold)]
        opts = ["--backend", url, "--namespace", "many", "--"]
        started = time.monotonic()
        running = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "mahabharatha",
                    *HOLDER_COMMANDS[command],
                    f"f{number:03d}",
                    *opts,
                    *cmd,
                ],
                cwd=work,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            for number in range(holders)
        ]
        peak, all_held_after, commits_from = 0, None, None
        while any(process.poll() is None for process in running):
            connected = _count(
                server,
                "SELECT count(*)::int FROM pg_stat_activity WHERE application_name LIKE 'mahab%'",
            )
            peak = max(peak, connected)
            if all_held_after is None:
                held = _count(
                    server, "SELECT count(*)::int FROM mahabharatha_locks WHERE pid IS NOT NULL"
                )
                if held == holders:
                    all_held_after = time.monotonic() - started
                    commits_from = (_commits(server), time.monotonic())
            time.sleep(SAMPLE_SECONDS)
        commits = None
        if commits_from is not None:
            count, since = commits_from
            commits = (_commits(server) - count) / (time.monotonic() - since)
        codes = Counter(process.returncode for process in running)
        errors = [
            process.stderr.read().decode(errors="replace").strip()
            for process in running
            if process.returncode != 0 and process.stderr is not None
        ]
        for process in running:
            if process.stderr is not None:
                process.stderr.close()
        return {
            "command": f"lock {command}",
            "holders": holders,
            "max_connections": max_connections,
            "hold_seconds": hold,
            "exit_codes": {str(code): n for code, n in sorted(codes.items())},
            "seconds_until_all_held": all_held_after,
            "peak_connections": peak,
            "commits_per_second_while_held": commits,
            "first_errors": errors[:3],
        }
    finally:
        server.stop("immediate")
        server.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--holders", type=int, default=200)
    parser.add_argument("--max-connections", type=int, default=40)
    parser.add_argument("--hold", type=float, default=30.0)
    parser.add_argument("--command", choices=sorted(HOLDER_COMMANDS), default="run")
    args = parser.parse_args(argv)
    found = measure(args.holders, args.max_connections, args.hold, args.command)
    print(json.dumps(found, indent=2))


if __name__ == "__main__":
    main()
