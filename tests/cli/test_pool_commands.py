"""A pool's commands one by one: ``lock fail`` and the attempts record, ``claim``'s exit codes
and ``--wait``, ``reopen``, and ``status --watch`` (as NDJSON and in a pseudo-terminal).

Processes are synchronised by their output (read with a deadline), never by sleeping.
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import pty
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import pytest

from mahabharatha import locks
from mahabharatha.backends.files import backend as files
from mahabharatha.backends.files import release_watch
from mahabharatha.pool import claim
from tests.cli._support import SYNC_TIMEOUT, invoke, one_document, one_sentence

CLI: Final = (sys.executable, "-m", "mahabharatha")
QUICK_WATCH_CLI: Final = (
    sys.executable,
    "-c",
    "from mahabharatha.cli import main, watch; "
    "watch.WATCH_SECONDS; watch.WATCH_SECONDS = 0.05; main()",
)
"""The CLI with its watch looking every 50 ms (not every second): a change is seen at once.
Reading the name first fails if it ever leaves ``watch`` (it once patched ``pool``, which read
none, and every watch waited a whole second)."""


def _features(gsd: Path, *names: str) -> None:
    for name in names:
        (gsd / "specs" / name).mkdir(parents=True, exist_ok=True)


def _owner() -> str:
    return str(os.getpid())


# --------------------------------------------------------------------------- fail and attempts


def test_fail_records_attempts_until_failed_and_reopen_clears_them(gsd: Path) -> None:
    """Fails on the old code: there was no ``lock fail``; a failing build could only release,
    and the feature was handed out again for ever."""
    _features(gsd, "alpha")
    for attempt in (1, 2, 3):
        claimed = invoke("lock", "claim", "--gsd-dir", gsd, "--pid", _owner())
        assert (claimed.exit_code, claimed.stdout.strip()) == (0, "alpha")
        failed = invoke(
            "lock",
            "fail",
            "alpha",
            "--gsd-dir",
            gsd,
            "--pid",
            _owner(),
            "--reason",
            f"r{attempt}",
            "--json",
        )
        document = one_document(failed.stdout)
        assert failed.exit_code == 0
        assert (document["attempts"], document["failed"]) == (attempt, attempt == 3)
        assert not (gsd / "specs" / "alpha" / ".lock").exists(), "fail releases the lock"

    left = invoke("lock", "claim", "--gsd-dir", gsd, "--pid", _owner())
    assert left.exit_code == 1, "failed for good: nothing left to claim"
    assert "nothing left" in one_sentence(left.stderr)
    status = invoke("lock", "status", "--all", "--gsd-dir", gsd, "--json")
    listed = one_document(status.stdout)["features"]
    assert [(e["state"], e["attempts"], e["reason"]) for e in listed] == [("failed", 3, "r3")]

    assert invoke("lock", "reopen", "alpha", "--gsd-dir", gsd).exit_code == 0
    again = invoke("lock", "claim", "--gsd-dir", gsd, "--pid", _owner())
    assert (again.exit_code, again.stdout.strip()) == (0, "alpha")


def test_fail_by_a_caller_that_does_not_hold_it_writes_nothing(gsd: Path) -> None:
    _features(gsd, "alpha")
    result = invoke("lock", "fail", "alpha", "--gsd-dir", gsd, "--pid", _owner())
    assert result.exit_code == 1
    assert "nothing recorded as failed" in one_sentence(result.stderr)
    assert not (gsd / "specs" / "alpha" / files.ATTEMPTS_RECORD_NAME).exists()


def test_the_attempts_record_stays_bounded_however_often_a_feature_fails(gsd: Path) -> None:
    _features(gsd, "alpha")
    for _ in range(60):
        locks.acquire("alpha", gsd)
        record = locks.fail("alpha", gsd, reason="x" * 10_000, attempts=1000)
    size = (gsd / "specs" / "alpha" / files.ATTEMPTS_RECORD_NAME).stat().st_size
    assert record.tries == 60
    assert size <= files.MAX_ATTEMPTS_BYTES
    assert len(record.history) == files.KEPT_ATTEMPTS


def _fail_repeatedly(gsd: str, times: int, ready: Any) -> None:
    ready.wait()
    for _ in range(times):
        locks.acquire("alpha", gsd, timeout=None)
        locks.fail("alpha", gsd, reason="r" * 150, attempts=10_000)


def test_readers_never_see_a_half_written_attempts_record(gsd: Path) -> None:
    """Two processes record failed attempts as fast as they can while this one reads the
    record: every read is a whole record (published by rename), and the count only grows.
    Fails if the record is written in place (a reader sees it empty or cut)."""
    _features(gsd, "alpha")
    context = multiprocessing.get_context("spawn")
    ready = context.Barrier(3)
    writers = [
        context.Process(target=_fail_repeatedly, args=(str(gsd), 150, ready)) for _ in range(2)
    ]
    for writer in writers:
        writer.start()
    path = gsd / "specs" / "alpha" / files.ATTEMPTS_RECORD_NAME
    seen, last = 0, 0
    try:
        ready.wait(timeout=SYNC_TIMEOUT)
        while any(writer.is_alive() for writer in writers):
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            count = json.loads(data)["count"]  # raises on a half-written record
            assert count >= last
            seen, last = seen + 1, count
    finally:
        for writer in writers:
            writer.join(timeout=60)
    assert [writer.exitcode for writer in writers] == [0, 0]
    assert json.loads(path.read_bytes())["count"] == 300
    assert seen > 0


# --------------------------------------------------------------------------- claim


def test_claim_exits_0_claimed_75_held_by_others_1_nothing_left(gsd: Path) -> None:
    """Fails on the old code, where "held by others" and "all done" were both exit 1, so a
    loop could not tell "wait" from "finished"."""
    _features(gsd, "alpha")
    first = invoke("lock", "claim", "--gsd-dir", gsd, "--pid", _owner())
    busy = invoke("lock", "claim", "--gsd-dir", gsd, "--pid", "1", "--json")
    assert first.exit_code == 0
    assert busy.exit_code == 75
    assert "held by others" in one_document(busy.stdout)["error"]
    assert invoke("lock", "done", "alpha", "--gsd-dir", gsd, "--pid", _owner()).exit_code == 0
    finished = invoke("lock", "claim", "--gsd-dir", gsd, "--pid", "1")
    assert finished.exit_code == 1
    assert invoke("lock", "claim", "--gsd-dir", gsd, "--pid", "1", "--wait", "0").exit_code == 1


def test_a_claimer_holding_the_rest_is_told_so_and_never_waits_for_itself(gsd: Path) -> None:
    """Fails on the old code: the claimer's own locks counted as "held by others", so a shell
    worker that claimed again got 75, and with ``--wait`` it waited for itself (for ever: here,
    until the subprocess's hang guard). Run as a real process, as a worker shell would."""
    _features(gsd, "alpha", "beta")
    for _ in range(2):
        assert invoke("lock", "claim", "--gsd-dir", gsd, "--pid", _owner()).exit_code == 0
    again = subprocess.run(
        [*CLI, "lock", "claim", "--gsd-dir", str(gsd), "--pid", _owner(), "--wait", "--json"],
        capture_output=True,
        text=True,
        timeout=SYNC_TIMEOUT,
    )
    assert again.returncode == 1, again.stderr
    document = json.loads(again.stdout)
    assert document["mine"] == ["alpha", "beta"]
    assert "already holds alpha, beta" in document["error"]
    # Held by someone else too: that one may come back, so the answer is still "wait" (75).
    others = invoke("lock", "claim", "--gsd-dir", gsd, "--pid", "1")
    assert others.exit_code == 75


def test_claim_wait_is_woken_by_the_release_not_by_its_recheck(
    gsd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claimer's periodic recheck is pushed far past the test's deadline: only the
    kernel's event for the release can end its wait in time. The release comes from another
    process once the claimer is known to be waiting (its watch was entered)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("inotify is Linux's")
    _features(gsd, "alpha")
    holder = subprocess.run(
        [*CLI, "lock", "acquire", "alpha", "--gsd-dir", str(gsd), "--pid", "1"],
        capture_output=True,
        timeout=SYNC_TIMEOUT,
    )
    assert holder.returncode == 0
    monkeypatch.setattr(release_watch, "RECHECK_SECONDS", 3600.0)
    monkeypatch.setattr(claim, "RECHECK_SECONDS", 3600.0)
    waiting = threading.Event()
    original = release_watch.ReleaseWatch.wait

    def noted_wait(self: release_watch.ReleaseWatch, seconds: float) -> bool:
        assert self.kernel_events, "inotify was expected here"
        waiting.set()
        return original(self, seconds)

    monkeypatch.setattr(release_watch.ReleaseWatch, "wait", noted_wait)
    answer: list[str | None] = []
    claimer = threading.Thread(
        target=lambda: answer.append(locks.claim(["alpha"], gsd, wait=SYNC_TIMEOUT)),
        daemon=True,
    )
    claimer.start()
    assert waiting.wait(SYNC_TIMEOUT)
    released = subprocess.run(
        [*CLI, "lock", "release", "alpha", "--gsd-dir", str(gsd), "--pid", "1"],
        capture_output=True,
        timeout=SYNC_TIMEOUT,
    )
    assert released.returncode == 0
    claimer.join(SYNC_TIMEOUT)
    assert answer == ["alpha"]
    locks.release("alpha", gsd)


def test_claim_wait_runs_out_with_75(gsd: Path) -> None:
    _features(gsd, "alpha")
    assert invoke("lock", "acquire", "alpha", "--gsd-dir", gsd, "--pid", "1").exit_code == 0
    result = invoke("lock", "claim", "--gsd-dir", gsd, "--pid", _owner(), "--wait", "0.2")
    assert result.exit_code == 75


def test_work_once_and_an_empty_pool(gsd: Path, tmp_path: Path) -> None:
    _features(gsd, "alpha")
    argv = [*CLI, "lock", "work", "--gsd-dir", str(gsd), "--once", "--json", "--"]
    first = subprocess.run(
        [
            *argv,
            sys.executable,
            "-c",
            "import os,sys; sys.exit(os.environ['MAHABHARATHA_FEATURE'] != 'alpha')",
        ],
        capture_output=True,
        text=True,
        timeout=SYNC_TIMEOUT,
        cwd=tmp_path,
    )
    assert first.returncode == 0, first.stderr
    assert one_document(first.stdout)["results"][0]["outcome"] == "done"
    empty = subprocess.run(
        [*argv, "true"], capture_output=True, text=True, timeout=SYNC_TIMEOUT, cwd=tmp_path
    )
    assert empty.returncode == 1
    assert one_document(empty.stdout)["ended"] == "finished"


WAITS_FOR_GO: Final = ("sh", "-c", "echo running; read -r _")
"""A CMD that says it runs (on lock work's stderr, with ``--json``), then waits for a line on
its stdin (lock work's: the test's pipe) and exits 0."""


def _work_losing_its_first_lock(
    gsd: Path, *words: str, then: tuple[str, ...] = (), cmd: tuple[str, ...] = WAITS_FOR_GO
) -> tuple[int, dict[str, Any]]:
    """``lock work alpha WORDS -- CMD``: while its first CMD runs, the lock is taken away
    (``lock release --force``, then the command ``then``), then CMD exits 0; every later CMD
    exits 0 at once."""
    _features(gsd, "alpha")
    argv = [*CLI, "lock", "work", "alpha", *words, "--json", "--gsd-dir", str(gsd), "--"]
    worker = subprocess.Popen(
        [*argv, *cmd],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert worker.stdin is not None and worker.stdout is not None and worker.stderr is not None
    try:
        buffer = bytearray()
        while read_line(worker.stderr.fileno(), buffer) != b"running":
            pass
        forced = subprocess.run(
            [*CLI, "lock", "release", "alpha", "--force", "--gsd-dir", str(gsd)],
            capture_output=True,
            timeout=SYNC_TIMEOUT,
        )
        assert forced.returncode == 0, forced.stderr
        if then:
            taken = subprocess.run([*CLI, *then], capture_output=True, timeout=SYNC_TIMEOUT)
            assert taken.returncode == 0, taken.stderr
        worker.stdin.write(b"go\n" * 2)  # the first CMD, and the next one's if there is one
        worker.stdin.close()
        code = worker.wait(timeout=SYNC_TIMEOUT)
        return code, one_document(worker.stdout.read().decode())
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        worker.stdout.close()
        worker.stderr.close()


@pytest.mark.parametrize("taken_by_another", [False, True], ids=["free", "taken"])
def test_work_once_reports_a_lock_forced_away_while_a_short_cmd_ran(
    gsd: Path, taken_by_another: bool
) -> None:
    """CMD exit 0 after its lock was taken away (and maybe taken by another), before any
    heartbeat could see it: the outcome is "lost", nothing is marked done, exit 76 as lock
    run's lost-lock rule. Failed on 328df3d: the done that found the lock gone (or another's)
    raised, so the worker answered "not locked by pid" (exit 1) with no result at all."""
    another = ("lock", "acquire", "alpha", "--pid", "1", "--gsd-dir", str(gsd))
    code, document = _work_losing_its_first_lock(
        gsd, "--once", then=another if taken_by_another else ()
    )
    assert [r["outcome"] for r in document["results"]] == ["lost"], document
    assert code == 76, document
    assert not (gsd / "specs" / "alpha" / ".completed").exists()
    # As lock run's document: the loss said, with what the done or fail found.
    assert document["error"] == "lost", document
    assert "pid 1" in document["reason"] if taken_by_another else document["reason"], document
    assert document["results"][0]["reason"] == document["reason"]


LEAVES_WORK_THEN_EXITS_0: Final = (
    'echo running; read -r _; setsid sleep 60 </dev/null >/dev/null 2>&1 & echo $! > "$0"; exit 0'
)
"""A CMD (``sh -c``) like :data:`WAITS_FOR_GO` that leaves work outside its group holding the
lock's proof of life (its pid written to ``$0``) and exits 0."""


def test_work_once_reports_a_lock_forced_away_while_a_cmd_that_left_work_ran(
    gsd: Path, tmp_path: Path
) -> None:
    """As the short CMD's loss, when CMD left work running: the done that found the lock gone
    makes the outcome "lost", exit 76. Fails on c000d56: ``finish_leaving_work`` let the
    done's ``NotHeldError`` out, so the worker answered "not locked by pid" (exit 1) with no
    result at all, as the short CMD's loss did before d98ed4b."""
    escaped = tmp_path / "escaped.pid"
    try:
        code, document = _work_losing_its_first_lock(
            gsd, "--once", cmd=("sh", "-c", LEAVES_WORK_THEN_EXITS_0, str(escaped))
        )
    finally:
        if escaped.exists():
            os.kill(int(escaped.read_text()), signal.SIGKILL)
    assert [r["outcome"] for r in document.get("results", [])] == ["lost"], document
    assert code == 76, document
    assert not (gsd / "specs" / "alpha" / ".completed").exists()


def test_work_goes_on_after_a_lock_forced_away_while_a_short_cmd_ran(gsd: Path) -> None:
    """The loop: the lost run marks nothing, the feature is taken again and done. Failed on
    328df3d: the worker stopped at the lost lock with exit 1 ("not locked by pid")."""
    code, document = _work_losing_its_first_lock(gsd)
    assert [r["outcome"] for r in document["results"]] == ["lost", "done"], document
    assert code == 0, document


FORCES_ITS_LOCK_AWAY: Final = (
    "import subprocess, sys, time\n"
    "seconds, gsd, cli = float(sys.argv[1]), sys.argv[2], sys.argv[3:]\n"
    "forced = [*cli, 'lock', 'release', 'alpha', '--force', '--gsd-dir', gsd]\n"
    "subprocess.run(forced, check=True, capture_output=True)\n"
    "time.sleep(seconds)\n"
)
"""A CMD that forces its own lock away, then sleeps ``argv[1]`` seconds (its gsd-dir, then
the CLI's words, follow)."""


@pytest.mark.parametrize(
    ("heartbeat", "sleep", "said"),
    [
        (0.05, "60", "alpha: lost its lock while CMD ran (lost the lock on 'alpha'"),
        (60.0, "0", "alpha: found its lock lost once CMD had ended ("),
    ],
    ids=["found-by-a-refresh", "found-by-the-done"],
)
def test_work_says_whether_a_loss_was_found_while_cmd_ran(
    gsd: Path, capsys: pytest.CaptureFixture[str], heartbeat: float, sleep: str, said: str
) -> None:
    """CMD forces its own lock away, then sleeps (a refresh finds the loss, CMD is stopped)
    or exits 0 at once (the done finds it): ``lock work``'s line says which. Fails on 96f1493
    for the done: "lost its lock while CMD ran" though CMD had ended before the loss was seen."""
    from mahabharatha.cli import pool as cli_pool
    from mahabharatha.cli._work_output import command_output

    _features(gsd, "alpha")
    cmd = [sys.executable, "-c", FORCES_ITS_LOCK_AWAY, sleep, str(gsd), *CLI]
    output = functools.partial(command_output, tag=False, log_dir=None, gsd_dir=gsd, stdout=None)
    report = locks.run_pool(
        functools.partial(cli_pool._run_step, cmd, 1, output),
        ["alpha"],
        gsd,
        heartbeat=heartbeat,
        once=True,
        on_result=lambda result: cli_pool._say(result, 1),
    )
    assert [result.outcome for result in report.results] == ["lost"], report
    assert not (gsd / "specs" / "alpha" / ".completed").exists()
    assert said in capsys.readouterr().err


def test_work_goes_on_after_a_lock_lost_before_cmd_started(
    gsd: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """alpha's lock is forced away between the claim and CMD's start, and a beat finds it:
    the line says so, nothing is marked, and the worker takes alpha again and runs it once.
    Fails on b2ae882: the loss ended the whole worker (``LockLostError`` out of the loop:
    exit 76, no line for alpha, any other feature left to other workers)."""
    from mahabharatha.cli import pool as cli_pool
    from mahabharatha.cli._work_output import command_output
    from mahabharatha.run import runner

    _features(gsd, "alpha")
    runs = tmp_path / "runs.log"
    cmd = [sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write('ran\\n')", str(runs)]
    command, forced = runner.Run.command, list[bool]()

    def lost_first(run: runner.Run, *args: Any, **kwargs: Any) -> int:
        if not forced:  # the window: held, CMD not started; a beat comes now
            forced.append(locks.release("alpha", gsd, force=True))
            run.lock._beat_once()
        return command(run, *args, **kwargs)

    monkeypatch.setattr(runner.Run, "command", lost_first)
    output = functools.partial(command_output, tag=False, log_dir=None, gsd_dir=gsd, stdout=None)
    report = locks.run_pool(
        functools.partial(cli_pool._run_step, cmd, 1, output),
        ["alpha"],
        gsd,
        heartbeat=60.0,
        on_result=lambda result: cli_pool._say(result, 1),
    )
    assert forced == [True]
    assert [result.outcome for result in report.results] == ["lost", "done"], report
    assert runs.read_text() == "ran\n"
    assert "alpha: lost its lock before CMD started (" in capsys.readouterr().err


def test_work_without_a_command_is_bad_input(gsd: Path) -> None:
    _features(gsd, "alpha")
    result = invoke("lock", "work", "--gsd-dir", gsd)
    assert result.exit_code == 2
    assert "after --" in one_sentence(result.stderr)


# --------------------------------------------------------------------------- status --watch


def read_line(fd: int, buffer: bytearray) -> bytes:
    deadline = time.monotonic() + SYNC_TIMEOUT
    while b"\n" not in buffer:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, "no line within the deadline"
        chunk = os.read(fd, 65536)
        assert chunk, "the watch ended early"
        buffer += chunk
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return line


def test_status_watch_prints_one_json_document_per_change_until_done(gsd: Path) -> None:
    names = ("alpha", "bravo", "charlie")
    _features(gsd, *names)
    argv = ["lock", "status", "--watch", "--until-done", "--json", "--gsd-dir", str(gsd)]
    watch = subprocess.Popen(
        [*QUICK_WATCH_CLI, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert watch.stdout is not None
    buffer = bytearray()
    try:
        seen = [json.loads(read_line(watch.stdout.fileno(), buffer))["summary"]["done"]]
        for name in names:
            locks.acquire(name, gsd)
            locks.done(name, gsd)
            while seen[-1] < names.index(name) + 1:  # one document per change, in order
                line = read_line(watch.stdout.fileno(), buffer)
                seen.append(json.loads(line)["summary"]["done"])
        assert watch.wait(timeout=SYNC_TIMEOUT) == 0
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
        watch.stdout.close()
        assert watch.stderr is not None
        watch.stderr.close()
    assert seen == sorted(seen) and seen[0] == 0 and seen[-1] == 3


def _read_until(fd: int, wanted: bytes, seen: bytearray) -> None:
    deadline = time.monotonic() + SYNC_TIMEOUT
    while wanted not in seen:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"{wanted!r} never shown: {bytes(seen)[-400:]!r}"
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            chunk = b""
        assert chunk, f"the watch ended before showing {wanted!r}"
        seen += chunk


def _watch_at_a_terminal(
    gsd: Path, drive: Callable[[int, int, bytearray], None]
) -> tuple[int, bytearray]:
    """``lock status --watch`` in a pseudo-terminal, ``drive(pid, master, seen)`` until it ends:
    its wait status, and all it wrote."""
    pid, master = pty.fork()
    if pid == 0:  # the child: the watch, with the pty as its controlling terminal
        os.environ["COLUMNS"] = "120"
        os.execv(sys.executable, [*CLI, "lock", "status", "--watch", "--gsd-dir", str(gsd)])
    seen = bytearray()
    try:
        drive(pid, master, seen)
        _, status = os.waitpid(pid, 0)
        pid = 0
        return status, _with_rest(master, seen)
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(master)


def test_status_watch_at_a_terminal_moves_its_bar_and_ctrl_c_leaves_it_clean(gsd: Path) -> None:
    """In a pseudo-terminal: the view shows 0/2, then 1/2 done once a feature finishes; Ctrl-C
    ends it with exit 130 and the cursor shown again (rich hides it while drawing)."""
    _features(gsd, "alpha", "bravo")

    def finish_one_then_ctrl_c(_pid: int, master: int, seen: bytearray) -> None:
        _read_until(master, b"0/2 done", seen)
        locks.acquire("alpha", gsd)
        locks.done("alpha", gsd)
        _read_until(master, b"1/2 done", seen)
        os.write(master, b"\x03")  # Ctrl-C, through the terminal's line discipline

    status, with_rest = _watch_at_a_terminal(gsd, finish_one_then_ctrl_c)
    assert os.waitstatus_to_exitcode(status) == 130
    assert b"\x1b[?25l" in with_rest, "rich hid the cursor while drawing"
    assert with_rest.rfind(b"\x1b[?25h") > with_rest.rfind(b"\x1b[?25l"), "cursor shown again"
    assert b"Traceback" not in with_rest


def _with_rest(master: int, seen: bytearray) -> bytearray:
    """``seen`` and what the ended watch still wrote to its terminal."""
    with_rest = bytearray(seen)
    try:
        while select.select([master], [], [], 0.5)[0]:
            chunk = os.read(master, 65536)
            if not chunk:
                break
            with_rest += chunk
    except OSError:  # EIO: everything written was read
        pass
    return with_rest


def test_status_watch_at_a_terminal_ends_on_sigterm_as_on_ctrl_c(gsd: Path) -> None:
    """SIGTERM (``kill``, a service manager) ends the watch as Ctrl-C does: the cursor shown
    again, no traceback, the shell's code for the signal (128 + 15). Failed on 328df3d: the
    watch was killed by the signal (status -15) and the terminal's cursor stayed hidden."""
    _features(gsd, "alpha")

    def terminate_once_shown(pid: int, master: int, seen: bytearray) -> None:
        _read_until(master, b"0/1 done", seen)
        os.kill(pid, signal.SIGTERM)

    status, with_rest = _watch_at_a_terminal(gsd, terminate_once_shown)
    assert os.waitstatus_to_exitcode(status) == 128 + signal.SIGTERM
    assert with_rest.rfind(b"\x1b[?25h") > with_rest.rfind(b"\x1b[?25l"), "cursor shown again"
    assert b"Traceback" not in with_rest


def test_status_watch_off_a_terminal_ends_on_sigterm_with_143(gsd: Path) -> None:
    """Off a terminal too, SIGTERM ends the watch with 128 + 15 and no traceback. Failed on
    328df3d: killed by the signal (return code -15)."""
    _features(gsd, "alpha")
    argv = ["lock", "status", "--watch", "--json", "--gsd-dir", str(gsd)]
    watch = subprocess.Popen([*CLI, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert watch.stdout is not None and watch.stderr is not None
    try:
        read_line(watch.stdout.fileno(), bytearray())  # the first document: it watches
        watch.send_signal(signal.SIGTERM)
        assert watch.wait(timeout=SYNC_TIMEOUT) == 128 + signal.SIGTERM
        assert b"Traceback" not in watch.stderr.read()
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
        watch.stdout.close()
        watch.stderr.close()


@pytest.mark.parametrize(
    ("words", "features", "wait"),
    [
        (["--wait"], None, None),
        (["--wait", "alpha"], ["alpha"], None),
        (["alpha", "--wait", "--json"], ["alpha"], None),
        (["--wait", "2.5", "alpha"], ["alpha"], 2.5),
        (["--wait=0", "alpha"], ["alpha"], 0.0),
        (["alpha"], ["alpha"], 0.0),
        (["--wait", "0", "--wait"], None, None),  # the last one counts, bare too
        (["--wait", "0", "--wait", "alpha"], ["alpha"], None),
    ],
)
def test_claim_wait_takes_optional_seconds(
    gsd: Path,
    monkeypatch: pytest.MonkeyPatch,
    words: list[str],
    features: list[str] | None,
    wait: float | None,
) -> None:
    """``--wait [SECONDS]``: bare (or followed by a feature name) waits as long as it takes
    (``wait=None``); a number bounds it; no ``--wait`` tries once (``wait=0``)."""
    _features(gsd, "alpha")
    asked: dict[str, Any] = {}

    def fake_claim_next(names: Any, **options: Any) -> locks.ClaimOutcome:
        asked.update(features=names, wait=options["wait"])
        return locks.ClaimOutcome(None)

    monkeypatch.setattr(locks, "claim_next", fake_claim_next)
    result = invoke("lock", "claim", "--gsd-dir", gsd, *words)
    assert result.exit_code == 1, result.stderr
    assert asked == {"features": features, "wait": wait}


def test_work_whose_command_cannot_start_stops_and_counts_no_attempt(
    gsd: Path, tmp_path: Path
) -> None:
    """A missing command would fail every feature the same way: the worker exits 127 as a
    shell would, releases the feature unmarked and records no attempt against it."""
    _features(gsd, "alpha")
    argv = [*CLI, "lock", "work", "--gsd-dir", str(gsd), "--", str(tmp_path / "missing"), "{}"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=SYNC_TIMEOUT)
    assert result.returncode == 127
    assert "command not found" in result.stderr and "Traceback" not in result.stderr
    folder = gsd / "specs" / "alpha"
    assert not (folder / ".lock").exists()
    assert not (folder / files.ATTEMPTS_RECORD_NAME).exists()
