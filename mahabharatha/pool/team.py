"""``lock work --jobs N``: N forked workers of one pool, each a lone ``lock work`` answering one
JSON report on a pipe, this process forwarding INT, TERM and HUP to them; :func:`merge_reports`
makes the pool's report. Long form: ``design/lockfile-hardening.md`` (``lock work -j N``)."""

from __future__ import annotations

import json
import os
import selectors
import signal
import threading
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack, suppress
from typing import Any, Final, NamedTuple, NoReturn

from mahabharatha import signals
from mahabharatha.exits import killed_by, shell_status
from mahabharatha.pool.work import WorkReport, WorkResult
from mahabharatha.states import WorkEnd, WorkOutcome

READ_CHUNK: Final = 65536
WORKER_FAILED: Final = 70  # EX_SOFTWARE: a worker whose own code raised past its answer


class WorkerEnd(NamedTuple):
    """How one worker ended: its answer (``None``: it died first) and its shell exit status."""

    pid: int
    answer: dict[str, Any] | None
    status: int


def run_team(jobs: int, job: Callable[[], dict[str, Any]]) -> list[WorkerEnd]:
    """Run ``job`` (a JSON-able answer; raising: status 70, or 128+n) in ``jobs`` forked workers;
    how each ended, in start order. Call it before any thread, lock or connection exists: a fork
    copies one thread, and workers share no lock or server descriptor."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, not {jobs}")
    if threading.active_count() > 1:
        raise RuntimeError("a team of workers is forked before any thread starts")
    workers: dict[int, int] = {}  # pid -> the read end of its answer's pipe, in start order
    ended: set[int] = set()  # workers whose pipe ended: they exited (reaped later)

    def forward(signum: int, _frame: object) -> None:
        """While the team works, each :data:`signals.FORWARDED` signal goes to every live worker."""
        for pid in workers:
            # Race: a worker that ended is not reaped yet (a zombie keeps its pid), and it is
            # marked ended before it is reaped: a signal never reaches a recycled pid.
            if pid not in ended:
                with suppress(ProcessLookupError):
                    os.kill(pid, signum)

    with ExitStack() as forwarded:
        # Race: a signal between two forks would reach only the workers forked so far: held
        # back until every worker is started, then forwarded (an ignored one stays ignored).
        with signals.masked(signal.SIG_BLOCK, signals.FORWARDED) as unblocked:
            _fork_workers(jobs, job, unblocked, workers)
            forwarded.enter_context(signals.Handling(signals.FORWARDED, forward))
        answers = _read_answers(workers, ended)
    return [WorkerEnd(pid, answers.get(pid), _reaped(pid)) for pid in workers]


def _fork_workers(
    jobs: int, job: Callable[[], dict[str, Any]], mask: Iterable[int], workers: dict[int, int]
) -> None:
    for _ in range(jobs):
        try:
            answer_fd, write_fd = os.pipe()
            try:
                pid = os.fork()
            except OSError:
                os.close(answer_fd)
                os.close(write_fd)
                raise
        except OSError:
            if not workers:
                raise
            return  # out of processes: a smaller team still finishes the pool
        if pid == 0:
            _be_worker(job, mask, write_fd, [answer_fd, *workers.values()])
        os.close(write_fd)
        workers[pid] = answer_fd


def _be_worker(
    job: Callable[[], dict[str, Any]], mask: Iterable[int], write_fd: int, foreign: Sequence[int]
) -> NoReturn:
    """The forked worker; never returns (``os._exit``: the parent's exit handlers stay its own)."""
    status = WORKER_FAILED
    try:
        for fd in foreign:  # the other workers' answers are not ours to hold open
            os.close(fd)
        _leave_the_terminal()
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        answer = json.dumps(job()).encode()
        with suppress(OSError), open(write_fd, "wb") as pipe:  # OSError: the parent is gone
            pipe.write(answer)
        status = 0
    except KeyboardInterrupt as stop:
        # Race: a signal forwarded while the workers were forked is delivered as this one
        # unblocks it, before its job answers anything: it ends as that signal ends a process.
        status = killed_by(getattr(stop, "signum", signal.SIGINT))
    finally:  # whatever was raised: a forked worker must never run on as the parent
        os._exit(status)


def _leave_the_terminal() -> None:
    """A session of our own (the terminal's signals reach only the parent), stdin /dev/null in
    place of a terminal. Race: a worker in a background group of the terminal's session was
    stopped by SIGTTIN/SIGTTOU with nobody to continue it: the team never ended."""
    if os.isatty(0):
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
    os.setsid()


def _read_answers(workers: dict[int, int], ended: set[int]) -> dict[int, dict[str, Any]]:
    """Every worker's answer, read as it comes; a worker's pipe ends (EOF) when it exits."""
    chunks: dict[int, list[bytes]] = {pid: [] for pid in workers}
    with selectors.DefaultSelector() as selector:
        for pid, answer_fd in workers.items():
            selector.register(answer_fd, selectors.EVENT_READ, pid)
        while selector.get_map():
            for key, _ in selector.select():  # retried after a forwarded signal (PEP 475)
                data = os.read(key.fd, READ_CHUNK)
                if data:
                    chunks[key.data].append(data)
                    continue
                selector.unregister(key.fd)
                os.close(key.fd)
                ended.add(key.data)
    answers: dict[int, dict[str, Any]] = {}
    for pid, parts in chunks.items():
        with suppress(ValueError):  # died mid-answer: as if it never answered
            answers[pid] = json.loads(b"".join(parts))
    return answers


def _reaped(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return shell_status(os.waitstatus_to_exitcode(status))


# --------------------------------------------------------------------------- one report


def report_from_document(document: dict[str, Any]) -> WorkReport | None:
    """The report a worker's ``lock work --json`` document carries (``None``: an error instead)."""
    if document.get("ended") is None:
        return None
    results = tuple(
        WorkResult(**{**result, "outcome": WorkOutcome(result["outcome"])})
        for result in document.get("results", ())
    )
    return WorkReport(
        WorkEnd(document["ended"]),
        results,
        tuple(document.get("failed", ())),
        tuple(document.get("busy", ())),
        document.get("exit_code"),
    )


ENDED_FIRST: Final = (WorkEnd.STOPPED, WorkEnd.FINISHED, WorkEnd.WAITED_OUT, WorkEnd.ONCE)
"""Which worker's ending the pool's report takes. Race: a teammate's wait can run out on a
feature a worker then finishes: finished is the later fact (only ``reopen`` undoes it)."""


def merge_reports(reports: Sequence[WorkReport]) -> WorkReport:
    """The pool's report: every result and failed feature, the ending that says most
    (:data:`ENDED_FIRST`), and the busy features of the workers that ended so."""
    if not reports:
        raise ValueError("no report to merge")
    ended = min(reports, key=lambda report: ENDED_FIRST.index(report.ended))
    results = tuple(result for report in reports for result in report.results)
    failed = _union(report.failed for report in reports)
    # Race: a feature one worker left held (another's kernel lease) is taken and finished by
    # a teammate once the lease goes: finished is the later fact, never "left in place".
    finished = {r.feature for r in results if r.outcome is WorkOutcome.DONE} | set(failed)
    busy = _union(report.busy for report in reports if report.ended == ended.ended)
    return WorkReport(
        ended.ended,
        results,
        failed,
        tuple(name for name in busy if name not in finished),
        ended.exit_code,
    )


def _union(lists: Iterable[Sequence[str]]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(name for names in lists for name in names))
