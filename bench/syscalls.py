"""Count the system calls and metadata writes of one uncontended acquire + release, per lock.

    python3 bench/syscalls.py [--cycles 200] [--workdir DIR] [--out bench/results/syscalls.md]

Each contender of scenario 1 (``bench/contenders.py: CYCLES``) runs in a child interpreter under
``strace -f``: a few warm-up cycles, a marker, ``--cycles`` cycles, a marker. Only the calls
between the two markers count, divided by the cycles, so imports and set-up are left out.
A metadata write is a call that changes a folder or an inode's metadata on disk: a create
(``open``/``openat`` with ``O_CREAT`` or ``O_TMPFILE``, ``mkdir``), ``link``, ``rename``,
``unlink``, an extended attribute set or removed, an ``fsync``/``fdatasync``, a time or mode
set; a call that failed writes nothing. strace cannot tell whether an ``O_CREAT`` open found
the file already there (``flock`` peers reopen theirs), so such an open counts. Counts do not
depend on the disk or the machine's load, so one run is the record; times are ``run.py``'s.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: import this work tree's bench and mahabharatha
    sys.path.insert(0, str(ROOT))

from bench.contenders import CYCLES, Cycle, missing_module  # noqa: E402

BEGIN, END = "mahabharatha-syscalls-begin", "mahabharatha-syscalls-end"
"""Markers the child writes to a bad descriptor: strace shows them, nothing else does."""

WARM_UP_CYCLES = 5

CHILD = """
import os, sys
from pathlib import Path
sys.path.insert(0, {root!r})
from bench.contenders import CYCLES
cycle = next(c for c in CYCLES if c.key == {key!r}).make(Path({work!r}))
for _ in range({warm}):
    cycle()
try:
    os.write(-1, {begin!r}.encode())
except OSError:
    pass
for _ in range({cycles}):
    cycle()
try:
    os.write(-1, {end!r}.encode())
except OSError:
    pass
"""

METADATA_CALLS = frozenset(
    {
        "link", "linkat", "rename", "renameat", "renameat2", "unlink", "unlinkat", "mkdir",
        "mkdirat", "rmdir", "setxattr", "lsetxattr", "fsetxattr", "removexattr",
        "lremovexattr", "fremovexattr", "fsync", "fdatasync", "utimensat", "futimesat",
        "fchmod", "fchmodat", "fchown", "fchownat", "ftruncate", "truncate", "symlink",
        "symlinkat",
    }
)  # fmt: skip
"""Calls that write metadata when they succeed; an open only when it creates (see _creates)."""

_CALL = re.compile(r"^(?:\[pid\s+\d+\]\s+|\d+\s+)?(\w+)\((.*)$")


def _creates(name: str, args: str) -> bool:
    """An ``open``/``openat``/``creat`` that makes an inode (a new name or an unnamed file)."""
    return name == "creat" or (
        name in {"open", "openat", "openat2"} and ("O_CREAT" in args or "O_TMPFILE" in args)
    )


def count(trace: str, cycles: int) -> tuple[dict[str, float], float, float]:
    """Per cycle: each call's count, all calls, metadata writes; from the text between markers."""
    calls: collections.Counter[str] = collections.Counter()
    metadata = 0
    inside = False
    for line in trace.splitlines():
        if BEGIN in line:
            inside = True
            continue
        if END in line:
            break
        match = _CALL.match(line)
        if not inside or match is None:
            continue  # outside the timed cycles, or a resumed/unfinished fragment
        name, args = match.groups()
        calls[name] += 1
        failed = re.search(r"= -1 E[A-Z]+", args) is not None  # e.g. mkdir of an existing folder
        metadata += not failed and (name in METADATA_CALLS or _creates(name, args))
    per_cycle = {name: n / cycles for name, n in calls.most_common()}
    return per_cycle, sum(calls.values()) / cycles, metadata / cycles


def trace_cycle(cycle: Cycle, work: Path, cycles: int) -> str:
    """The strace text of one contender's warm-up and timed cycles in a fresh interpreter."""
    script = CHILD.format(
        root=str(ROOT), key=cycle.key, work=str(work / cycle.key), warm=WARM_UP_CYCLES,
        begin=BEGIN, end=END, cycles=cycles,
    )  # fmt: skip
    out = work / f"{cycle.key}.strace"
    subprocess.run(
        ["strace", "-f", "-qq", "-s", "64", "-o", str(out), sys.executable, "-c", script],
        check=True,
    )
    return out.read_text()


def table(rows: list[tuple[Cycle, dict[str, float], float, float]]) -> str:
    """A Markdown table: calls and metadata writes per cycle, and the calls that make them up."""
    lines = [
        "| lock | system calls | metadata writes | calls per cycle |",
        "|---|---:|---:|---|",
    ]
    for cycle, per_cycle, total, metadata in rows:
        detail = ", ".join(f"{name} {n:g}" for name, n in per_cycle.items())
        lines.append(f"| {cycle.label} | {total:g} | {metadata:g} | {detail} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "syscalls.md")
    args = parser.parse_args(argv)
    if shutil.which("strace") is None:
        print("syscalls: strace is not installed (apt-get install strace)", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(dir=args.workdir) as folder:
        for cycle in CYCLES:
            if missing_module(cycle.module) is not None:
                print(f"skipped {cycle.key}: not installed", file=sys.stderr)
                continue
            rows.append((cycle, *count(trace_cycle(cycle, Path(folder), args.cycles), args.cycles)))
    text = table(rows)
    print(text, end="")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
