"""Where the time of each missed target goes: the numbers behind ``bench/PROFILE.md``.

    python3 bench/profile_hot_path.py [--cycles 3000] [--rounds 9] [--locks 10000] [--out FILE]

Sections:

1. *System-call replay*: the exact system calls ours makes per acquire + release (as ``strace``
   shows them), issued back to back from Python with no logic in between, against the bare
   ``link()`` floor. The gap between the replay and the floor is the protocol's system-call cost;
   the gap between the replay and ours is Python code.
2. *Single system calls*: each step of the cycle timed alone, to tell which calls cost most.
3. *pyinstrument* (or cProfile when pyinstrument is missing) of the uncontended cycle and of
   ``status`` over ``--locks`` locks.
4. *CLI imports*: ``-X importtime`` of the CLI call and of a minimal Typer app.

Every timing is a median over ``--rounds`` interleaved rounds.
"""

from __future__ import annotations

import argparse
import fcntl
import gc
import io
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.contenders import FEATURE, gsd_with_feature, link_floor_try  # noqa: E402

TMPFILE = getattr(os, "O_TMPFILE", 0)
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def _interleaved(
    calls: dict[str, Callable[[], object]], cycles: int, rounds: int
) -> dict[str, float]:
    """Median microseconds per call of each entry, rounds interleaved."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():
        for _ in range(max(5, cycles // 10)):
            call()
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            for _ in range(cycles):
                call()
            samples[name].append((time.perf_counter() - start) / cycles * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def _table(rows: dict[str, float], base: str) -> str:
    width = max(len(name) for name in rows)
    lines = []
    for name, value in rows.items():
        lines.append(f"  {name:<{width}}  {value:7.1f} us   {value / rows[base]:5.2f}x {base}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- 1 + 2


def syscall_sections(work: Path, cycles: int, rounds: int) -> str:
    from mahabharatha.commands._utils import acquire_feature_lock, release_feature_lock

    gsd = gsd_with_feature(work / "ours")
    folder = os.path.join(gsd, "specs", FEATURE)
    floor_folder = os.path.join(gsd_with_feature(work / "floor"), "specs", FEATURE)
    floor_try, floor_release = link_floor_try(floor_folder)
    record = f"{os.getpid()}:{time.time()}".encode()

    def ours() -> None:
        acquire_feature_lock(FEATURE, gsd)
        release_feature_lock(FEATURE, gsd)

    def floor() -> None:
        floor_try()
        floor_release()

    def release_calls(dfd: int) -> None:  # release: guard, read back, unlink, let go
        fcntl.flock(dfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fd = os.open(".lock", READ_FLAGS, dir_fd=dfd)
        os.fstat(fd)
        os.read(fd, 4097)
        os.close(fd)
        os.unlink(".lock", dir_fd=dfd)
        fcntl.flock(dfd, fcntl.LOCK_UN)
        os.close(dfd)

    def replay() -> None:  # the 16 system calls of ours, nothing else
        dfd = os.open(folder, DIR_FLAGS)
        fd = os.open(".", TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o644, dir_fd=dfd)
        os.write(fd, record)
        os.link(f"/proc/self/fd/{fd}", ".lock", dst_dir_fd=dfd, follow_symlinks=True)
        os.fstat(fd)
        os.close(fd)
        os.close(dfd)
        release_calls(os.open(folder, DIR_FLAGS))

    def replay_today() -> None:  # the 29 calls of 2026-11-27 (proof of life, owner details)
        dfd = os.open(folder, DIR_FLAGS)
        os.urandom(4)  # the proof's slot
        pfd = os.open(".", os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECTORY, dir_fd=dfd)
        os.fstat(pfd)
        os.getpid(), os.getpid(), os.getpgrp()
        fcntl.fcntl(pfd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_RDLCK, 0, 4005, 1, 0))
        fd = os.open(".", TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o644, dir_fd=dfd)
        os.write(fd, record)
        os.setxattr(fd, "user.mahabharatha.owner", b"\3" + bytes(47))  # 48 bytes, as ours
        os.fstat(fd)
        os.link(f"/proc/thread-self/fd/{fd}", ".lock", dst_dir_fd=dfd, follow_symlinks=True)
        os.close(fd)
        fcntl.fcntl(pfd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_RDLCK, 0, 4004, 2, 0))
        os.close(dfd)
        dfd = os.open(folder, DIR_FLAGS)
        os.getpid()
        fcntl.flock(dfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fd = os.open(".lock", READ_FLAGS, dir_fd=dfd)
        os.fstat(fd)
        os.read(fd, 4097)
        os.getxattr(fd, "user.mahabharatha.owner")
        os.close(fd)
        os.getpid()
        os.unlink(".lock", dir_fd=dfd)
        fcntl.flock(dfd, fcntl.LOCK_UN)
        os.close(pfd)
        os.close(dfd)

    def replay_one_dirfd() -> None:  # same protocol, the folder opened once per cycle
        dfd = os.open(folder, DIR_FLAGS)
        fd = os.open(".", TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o644, dir_fd=dfd)
        os.write(fd, record)
        os.link(f"/proc/self/fd/{fd}", ".lock", dst_dir_fd=dfd, follow_symlinks=True)
        os.fstat(fd)
        os.close(fd)
        release_calls(dfd)

    def replay_named_temp() -> None:  # publish through a named temp instead of O_TMPFILE
        dfd = os.open(folder, DIR_FLAGS)
        fd = os.open(
            ".lock.t.tmp", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644, dir_fd=dfd
        )
        os.write(fd, record)
        os.fstat(fd)
        os.close(fd)
        os.link(".lock.t.tmp", ".lock", src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
        os.unlink(".lock.t.tmp", dir_fd=dfd)
        os.close(dfd)
        release_calls(os.open(folder, DIR_FLAGS))

    from mahabharatha import names
    from mahabharatha.backends.files.lockfile import publish_or_reclaim, release_at

    def lean() -> None:
        """Ours from the same primitives (``try_acquire``, ``release_at``), minus the pathlib
        path and the context manager around the folder descriptor."""
        names.validate_feature_name(FEATURE)
        dfd = os.open(os.path.join(gsd, "specs", FEATURE), DIR_FLAGS)
        try:
            publish_or_reclaim(dfd, os.getpid(), time.time())
        finally:
            os.close(dfd)
        names.validate_feature_name(FEATURE)
        dfd = os.open(os.path.join(gsd, "specs", FEATURE), DIR_FLAGS)
        try:
            release_at(dfd, os.getpid(), time.time())
        finally:
            os.close(dfd)

    cycle = _interleaved(
        {
            "ours (legacy functions)": ours,
            "ours, lean prototype (no pathlib, no ctx manager)": lean,
            "replay: ours' 29 system calls of today": replay_today,
            "replay: ours' 16 system calls (issue 4's cycle)": replay,
            "replay, folder opened once (14)": replay_one_dirfd,
            "replay, named temp not O_TMPFILE": replay_named_temp,
            "floor: temp + link + unlink both": floor,
        },
        cycles,
        rounds,
    )
    out = [
        "## 1. System-call replay (us per acquire + release)",
        "",
        _table(cycle, "floor: temp + link + unlink both"),
        "",
    ]

    # 2. single steps, each made repeatable on its own
    dfd = os.open(folder, DIR_FLAGS)
    lock_fd_holder: list[int] = []

    def open_close_dir() -> None:
        os.close(os.open(folder, DIR_FLAGS))

    def tmpfile_write_close() -> None:
        fd = os.open(".", TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o644, dir_fd=dfd)
        os.write(fd, record)
        os.close(fd)

    def tmpfile_link_proc_unlink() -> None:
        fd = os.open(".", TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o644, dir_fd=dfd)
        os.link(f"/proc/self/fd/{fd}", ".lock", dst_dir_fd=dfd, follow_symlinks=True)
        os.close(fd)
        os.unlink(".lock", dir_fd=dfd)

    def named_create_link_unlink2() -> None:
        fd = os.open(
            ".t.tmp", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644, dir_fd=dfd
        )
        os.close(fd)
        os.link(".t.tmp", ".lock", src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
        os.unlink(".t.tmp", dir_fd=dfd)
        os.unlink(".lock", dir_fd=dfd)

    def flock_pair() -> None:
        fcntl.flock(dfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(dfd, fcntl.LOCK_UN)

    def read_back() -> None:
        fd = os.open(".lock", READ_FLAGS, dir_fd=dfd)
        os.fstat(fd)
        os.read(fd, 4097)
        os.close(fd)

    def fstat_only() -> None:
        os.fstat(lock_fd_holder[0])

    with open(os.path.join(folder, ".lock"), "wb") as lock:
        lock.write(record)
    lock_fd_holder.append(os.open(os.path.join(folder, ".lock"), os.O_RDONLY))
    steps = _interleaved(
        {
            "open + close folder (O_DIRECTORY)": open_close_dir,
            "O_TMPFILE open + write + close": tmpfile_write_close,
            "flock EX + UN": flock_pair,
            "open + fstat + read + close .lock": read_back,
            "fstat": fstat_only,
        },
        cycles,
        rounds,
    )
    os.close(lock_fd_holder[0])
    os.unlink(os.path.join(folder, ".lock"))
    steps.update(
        _interleaved(
            {
                "O_TMPFILE + linkat /proc/self/fd + close + unlink": tmpfile_link_proc_unlink,
                "named create + close + link + unlink both": named_create_link_unlink2,
            },
            cycles,
            rounds,
        )
    )
    width = max(len(name) for name in steps)
    out += ["## 2. Single steps (us per call)", ""]
    out += [f"  {name:<{width}}  {value:7.2f} us" for name, value in steps.items()]
    out.append("")
    out += [python_pieces(gsd, dfd, record, cycles, rounds)]
    os.close(dfd)
    return "\n".join(out)


def python_pieces(gsd: str, dfd: int, record: bytes, cycles: int, rounds: int) -> str:
    """The Python-only steps of one legacy cycle, each timed alone (no system call inside,
    except where named)."""
    from mahabharatha import names
    from mahabharatha.backends.files.folder import Guard, OpenFeatureDir, feature_dir_path
    from mahabharatha.backends.files.lockfile import AcquireOutcome
    from mahabharatha.backends.files.snapshot import (
        EntryKind,
        LockSnapshot,
        format_record,
        judge_lock,
    )

    snapshot = LockSnapshot(EntryKind.FILE, (1, 2), record, 1.0)
    now = time.time()

    def open_feature_dir_nop() -> None:
        with OpenFeatureDir(gsd, FEATURE, create=False):
            pass

    def guard_pair() -> None:
        with Guard(dfd, wait=True):
            pass

    pieces = _interleaved(
        {
            "feature_dir_path (pathlib, 2 joins)": lambda: feature_dir_path(gsd, FEATURE),
            "os.path.join equivalent": lambda: os.path.join(gsd, "specs", FEATURE),
            "OpenFeatureDir enter+exit (incl. open+close)": open_feature_dir_nop,
            "Guard enter+exit (incl. flock EX+UN)": guard_pair,
            "validate_feature_name": lambda: names.validate_feature_name(FEATURE),
            "format_record": lambda: format_record(os.getpid(), now),
            "LockSnapshot(...) (slotted class)": lambda: LockSnapshot(
                EntryKind.FILE, (1, 2), record, 1.0
            ),
            "AcquireOutcome(mine)": lambda: AcquireOutcome(snapshot),
            "judge_lock (decode + regex + float)": lambda: judge_lock(snapshot, now),
            "snapshot.record_at(now)": lambda: snapshot.record_at(now),
        },
        cycles * 3,
        rounds,
    )
    width = max(len(name) for name in pieces)
    lines = ["## 2b. Python pieces of the cycle (us per call)", ""]
    lines += [f"  {name:<{width}}  {value:7.2f} us" for name, value in pieces.items()]
    lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------------- 3


def _profile(call: Callable[[], object], repeat: int, title: str) -> str:
    try:
        from pyinstrument import Profiler
    except ImportError:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(repeat):
            call()
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
        return f"## {title} (cProfile, tottime)\n\n{text.getvalue()}"
    sampler: Any = Profiler(interval=0.001)
    sampler.start()
    for _ in range(repeat):
        call()
    sampler.stop()
    text = sampler.output_text(unicode=False, color=False, show_all=False, short_mode=False)
    return f"## {title} (pyinstrument)\n\n{text}"


def profile_sections(work: Path, cycles: int, locks_count: int) -> str:
    from bench.scenarios import _status_tree
    from mahabharatha import locks
    from mahabharatha.commands._utils import acquire_feature_lock, release_feature_lock

    gsd = gsd_with_feature(work / "profile")
    feature_lock = locks.FeatureLock(FEATURE, gsd, heartbeat=None, timeout=0)

    def legacy() -> None:
        acquire_feature_lock(FEATURE, gsd)
        release_feature_lock(FEATURE, gsd)

    def context() -> None:
        with feature_lock:
            pass

    sampled = min(cycles, 1000)  # a sampling profile needs no more, and disturbs less
    tree = work / "status"
    _status_tree(tree, locks_count, distinct=True)
    locks.status(tree)  # warm-up
    return "\n".join(
        [
            _profile(legacy, sampled, f"3a. legacy cycle x{sampled}"),
            _profile(context, sampled, f"3b. FeatureLock cycle x{sampled}"),
            _profile(lambda: locks.status(tree), 1, f"3c. status over {locks_count} locks"),
            status_breakdown(tree, locks_count),
        ]
    )


def _own_tree(tree: Path, count: int) -> None:
    """``count`` locks published by this package (owner details, a proof of life) by a child
    that then exits: every lock is judged by its proof, and its owner found gone."""
    from mahabharatha.commands import _utils
    from mahabharatha.owner import proof

    child = os.fork()
    if child == 0:  # pragma: no cover (the child)
        code = 0
        try:
            for index in range(count):
                _utils.acquire_feature_lock(f"feat-{index:05d}", str(tree))
                proof.let_go_of_all()  # one descriptor at a time, the lock stays
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(child, 0)
    if status != 0:
        raise RuntimeError("the child could not publish the locks")


def _our_system_calls(tree: Path) -> Callable[[], object]:
    """The system calls a status makes per lock (folder opened without following a link,
    the lock opened in it, fstat, read, the owner details, two closes) with no judgement: the
    floor of this design."""

    def loop() -> list[tuple[str, bytes, list[str]]]:
        found = []
        specs = os.open(tree / "specs", os.O_RDONLY | os.O_DIRECTORY)
        try:
            with os.scandir(specs) as entries:
                names = sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
            for name in names:
                dfd = os.open(name, DIR_FLAGS, dir_fd=specs)
                try:
                    fd = os.open(".lock", READ_FLAGS, dir_fd=dfd)
                    try:
                        os.fstat(fd)
                        content = os.read(fd, 4097)
                        found.append((name, content, os.listxattr(fd)))
                    finally:
                        os.close(fd)
                finally:
                    os.close(dfd)
        finally:
            os.close(specs)
        return found

    return loop


def _cpu_interleaved(calls: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Median CPU seconds of each call, rounds interleaved (CPU time: the machine is shared,
    and a status is all CPU once the tree is in the page cache)."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():
        call()
    names = list(calls)
    for round_no in range(rounds):
        for name in names[round_no % len(names) :] + names[: round_no % len(names)]:
            gc.collect()
            start = time.process_time()
            calls[name]()
            samples[name].append(time.process_time() - start)
    return {name: statistics.median(values) for name, values in samples.items()}


def status_breakdown(tree: Path, locks_count: int) -> str:
    """Where a status's time goes: the bare loop, our system calls alone, the scan (reads
    and proofs, no judgement), the judgement and the listing of the scanned locks, the whole
    ``locks.status`` on older writers' locks (the scenario's tree), and on ours."""
    from bench.scenarios import bare_status_loop
    from mahabharatha import locks
    from mahabharatha.backends.files import folder, snapshot
    from mahabharatha.backends.files.backend import describe_snapshot
    from mahabharatha.backends.liveness import per_pid

    own = tree.parent / "status-own"
    _own_tree(own, locks_count)
    scanned = list(folder.scan_locks(tree))

    def judged() -> list[object]:
        now, liveness = time.time(), per_pid()
        return [
            describe_snapshot(name, snap, snapshot.judge_lock(snap, now), now, liveness)
            for name, snap in scanned
        ]

    seconds = _cpu_interleaved(
        {
            "bare scandir + open/fstat/read loop": lambda: bare_status_loop(str(tree)),
            "our system calls, no judgement": _our_system_calls(tree),
            "folder.scan_locks (reads, proofs)": lambda: list(folder.scan_locks(tree)),
            "judge + describe the scanned locks": judged,
            "locks.status, older writers' locks": lambda: locks.status(tree),
            "locks.status, locks of this package": lambda: locks.status(own),
        },
        9,
    )
    per_lock = {name: value / locks_count * 1e6 for name, value in seconds.items()}
    return "\n".join(
        [
            f"## 3d. status over {locks_count} locks, where the time goes (CPU us per lock)",
            "",
            _table(per_lock, "bare scandir + open/fstat/read loop"),
            "",
        ]
    )


# --------------------------------------------------------------------------- 4


def import_section(work: Path) -> str:
    from bench.scenarios import cli_environment

    env = cli_environment(work)
    for argv in (["-m", "mahabharatha", "lock", "check", "x"], ["-c", "import typer"]):
        subprocess.run(
            [sys.executable, *argv], cwd=work, env=env, capture_output=True, check=False
        )  # warm-up: write the byte code once
    out = ["## 4. CLI imports (-X importtime, top 15 by cumulative us)", ""]
    for title, argv in (
        ("python -m mahabharatha lock check x", ["-m", "mahabharatha", "lock", "check", "x"]),
        ("minimal Typer app", [str(ROOT / "bench" / "typer_minimal.py"), "check", "x"]),
        ("python -c 'import typer'", ["-c", "import typer"]),
    ):
        done = subprocess.run(
            [sys.executable, "-X", "importtime", *argv],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        rows = []
        for line in done.stderr.splitlines():
            parts = line.removeprefix("import time:").split("|")
            if not line.startswith("import time:") or not parts[0].strip().isdigit():
                continue
            rows.append((int(parts[1]), parts[2]))  # leading spaces of the name: depth
        top_level = sum(c for c, name in rows if len(name) - len(name.lstrip()) == 1)
        rows.sort(reverse=True)
        out.append(f"{title}: {top_level / 1000:.1f} ms of imports at top level")
        out += [f"  {c / 1000:7.1f} ms  {name.strip()}" for c, name in rows[:15]]
        out.append("")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--locks", type=int, default=10_000)
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    args = parser.parse_args()
    parent = ROOT / "bench" / ".work"
    parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="profile-", dir=parent) as tmp:
        work = Path(tmp)
        text = "\n".join(
            [
                syscall_sections(work, args.cycles, args.rounds),
                profile_sections(work, args.cycles, args.locks),
                import_section(work),
            ]
        )
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
