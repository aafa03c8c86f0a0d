"""``mahabharatha lock fail`` and ``lock work``: a worker pool's commands. ``lock work`` claims as
``lock claim`` does, runs each feature's command as ``lock run`` does, then marks or fails it."""

from __future__ import annotations

import functools
import gc
import os
import signal
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Annotated, Any, Final

import typer
from typer.core import TyperCommand

from mahabharatha import locks, logs, signals
from mahabharatha.backends import load_backend_code
from mahabharatha.backends.base import BackendError, describe_holder
from mahabharatha.cli._output import (
    AttemptsOption,
    FeatureArg,
    PidOption,
    ReclaimDeadOption,
    Result,
    Shared,
    answer,
    complete_feature,
    default_owner,
    exit_code_for,
    finite_seconds,
    note,
    problem_warnings,
    respond,
    stopped_code,
    with_shared_options,
)
from mahabharatha.cli._work_output import CommandOutput, command_output
from mahabharatha.cli.lock import _warn_release_wait, app
from mahabharatha.constants import FEATURE_ENV_VAR, RETRY_DELAY_SECONDS
from mahabharatha.exits import (
    EXIT_BAD_INPUT,
    EXIT_HELD,
    EXIT_LOST,
    EXIT_OK,
    EXIT_TEMPFAIL,
    killed_by,
)
from mahabharatha.locks import FeatureProblem, LockInfo, PoolLock, StopWork, WorkReport, WorkResult
from mahabharatha.pool import team
from mahabharatha.run import runner
from mahabharatha.states import State, WorkEnd, WorkOutcome

FEATURE_PLACEHOLDER: Final = "{}"  # the feature's name in lock work's command (as xargs -I)
OutputFor = Callable[[str], AbstractContextManager[CommandOutput]]  # a feature's outputs


@app.command()
@with_shared_options
def fail(
    feature: FeatureArg,
    shared: Shared,
    pid: PidOption = None,
    reason: Annotated[
        str,
        typer.Option("--reason", metavar="TEXT", help="Why it failed (kept with the attempt)."),
    ] = "failed",
    attempts: AttemptsOption = locks.DEFAULT_ATTEMPTS,
) -> None:
    """Record a failed attempt at FEATURE and release it (the holder only). After --attempts
    failed attempts it is failed: claim never hands it out again until lock reopen.

    Exit 1, with nothing written, when the calling shell (or --pid) does not hold its lock.
    """
    owner = default_owner(pid)
    document: dict[str, Any] = {"feature": feature, "pid": owner, "recorded": False}

    def action() -> Result:
        store = shared.backend()
        record = locks.fail(feature, backend=store, pid=owner, reason=reason, attempts=attempts)
        state = "failed" if record.failed else "free again"
        found = {
            **document,
            "recorded": True,
            "attempts": record.tries,
            "limit": record.limit,
            "failed": record.failed,
        }
        text = f"{feature}: attempt {record.tries} of {record.limit} failed (released, {state})"
        return Result(EXIT_OK, found, text)

    respond(shared.as_json, document, action)


# --------------------------------------------------------------------------- lock work


class _SplitAtDashes(TyperCommand):
    """``lock work [FEATURE ...] [OPTIONS] -- CMD ...``: two lists of words, told apart by the
    ``--`` (click would swallow it). The command's words are kept in ``ctx.meta``."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            ctx.meta["work_command"] = args[cut + 1 :]
            args = args[:cut]
        return list(super().parse_args(ctx, args))


@app.command(cls=_SplitAtDashes)
@with_shared_options
def work(
    ctx: typer.Context,
    features: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[FEATURE]... -- CMD...",
            autocompletion=complete_feature,
            help=(
                "Features in order (default: every feature folder, by name), then after -- the "
                "command to run for each; {} in it is replaced by the feature."
            ),
        ),
    ] = None,
    *,  # typer passes every option by name
    shared: Shared,
    attempts: AttemptsOption = locks.DEFAULT_ATTEMPTS,
    wait: Annotated[
        float | None,
        typer.Option(
            "--wait",
            min=0,
            callback=finite_seconds,
            metavar="SECONDS",
            help=(
                "While others hold every feature left, wait at most SECONDS for one to come "
                "back (exit 75 then); default: as long as it takes."
            ),
        ),
    ] = None,
    reclaim_dead: ReclaimDeadOption = False,
    once: Annotated[
        bool,
        typer.Option("--once", help="Take one feature, run CMD, exit with its code."),
    ] = False,
    retry_delay: Annotated[
        float,
        typer.Option(
            "--retry-delay",
            min=0,
            callback=finite_seconds,
            metavar="SECONDS",
            help=(
                "A feature whose attempt failed is not tried again for SECONDS (by any worker "
                f"that reads its record). Default {RETRY_DELAY_SECONDS:g}."
            ),
        ),
    ] = RETRY_DELAY_SECONDS,
    tag: Annotated[
        bool,
        typer.Option("--tag", help="Prefix each line of CMD's output with [FEATURE]."),
    ] = False,
    log_dir: Annotated[
        Path | None,
        typer.Option(
            "--log-dir",
            metavar="DIR",
            file_okay=False,
            help=(
                "Write CMD's output to one file per feature attempt in DIR (made if missing); "
                "status --all names each feature's last."
            ),
        ),
    ] = None,
    jobs: Annotated[
        int,
        typer.Option(
            "--jobs",
            "-j",
            min=1,
            metavar="N",
            help=(
                "Run N workers of the pool in this one command (as xargs -P N), each as a lone "
                "lock work would; one document with --json. Default 1."
            ),
        ),
    ] = 1,
) -> None:
    """Claim features one at a time and run CMD for each, holding its lock as lock run does;
    exit 0 marks it done, another exit records a failed attempt. Ends when every feature is
    done or failed: exit 0 all done, 1 some failed, 75 when --wait ran out."""
    command: list[str] = ctx.meta.get("work_command") or []
    document: dict[str, Any] = {"pid": os.getpid(), "ended": None, "results": []}

    def action() -> Result:
        if not command:
            raise ValueError("lock work needs the command to run after --: lock work -- CMD {}")
        if jobs == 1:
            return one_worker()
        if once:
            raise ValueError("--once takes one feature: it cannot be shared by --jobs workers")
        # Each worker connects on its own; code is imported once for the team, before the fork.
        load_backend_code(shared.url)
        logs.logger()
        gc.freeze()  # start-up's objects: no worker's collection copies their pages
        ends = team.run_team(jobs, lambda: _worker_answer(answer(document, team_worker)))
        return _team_result(ends, document)

    def team_worker() -> Result:
        try:
            return one_worker()
        finally:
            # Race: a signal forwarded after this worker's report was made would kill it before
            # its answer is written; held back till it exits (nothing is left to stop).
            signal.pthread_sigmask(signal.SIG_BLOCK, signals.FORWARDED)

    def one_worker() -> Result:
        store = shared.backend(needs_folder=not features, on_slot_wait=_say_server_full)
        problems: list[FeatureProblem] = []
        output = functools.partial(
            command_output,
            tag=tag,
            log_dir=log_dir,
            gsd_dir=shared.gsd_dir,
            stdout=sys.stderr if shared.as_json else None,
        )
        results: list[WorkResult] = []  # kept here too: a stop between features keeps them

        def said(result: WorkResult) -> None:
            results.append(result)
            _say(result, attempts)

        try:
            report = locks.run_pool(
                functools.partial(_run_step, command, attempts, output),
                features,
                shared.gsd_dir,
                attempts=attempts,
                wait=wait,
                reclaim_dead=reclaim_dead,
                once=once,
                backend=store,
                command=command,
                on_result=said,
                problems=problems,
                retry_delay=retry_delay,
                on_waiting=_say_waiting,
            )
        except KeyboardInterrupt as stop:  # Ctrl-C, TERM, HUP between features: what was done
            report = WorkReport(WorkEnd.STOPPED, tuple(results), exit_code=stopped_code(stop))
            return _work_result(report, document, once, problems)._replace(message="interrupted")
        return _work_result(report, document, once, problems)

    respond(shared.as_json, document, action)


def _run_step(command: list[str], attempts: int, output: OutputFor, lock: PoolLock) -> WorkResult:
    """One feature of ``lock work``: CMD run as ``lock run`` does under the claimed lock."""
    feature = lock.feature
    with ExitStack() as stack:
        try:
            where = stack.enter_context(output(feature))
        except BaseException:
            lock.finish(None, None, attempts)  # no log to write to: never leave it held
            raise
        argv = [word.replace(FEATURE_PLACEHOLDER, feature) for word in command]
        running_lost: list[locks.LockLostError] = []  # the loss the relay acted on: while CMD ran
        run = runner.Run(
            lock,
            notify_lost=running_lost.append,
            on_release_wait=lambda bound: _warn_release_wait(feature, bound),
            adopt_orphans=True,
        )
        try:
            with run:
                run.acquire()
                result = _command_then_end(run, lock, argv, attempts, where, running_lost)
        except runner.CommandStartError as unstarted:
            # Every feature would fail the same way: release it unmarked, stop this worker.
            code = exit_code_for(unstarted, before_run=True)
            raise StopWork(lock.finish(None, unstarted.strerror, attempts), code) from None
        except runner.Interrupted as stop:
            raise StopWork(lock.finish(None, str(stop), attempts), stop.exit_code) from None
        except StopWork:
            raise  # the feature has ended: its result is in it
        except BaseException:
            lock.finish(None, None, attempts)  # whatever went wrong: never leave it held
            raise
        if run.signalled is not None:  # told to stop, whatever CMD made of it: after its result
            raise StopWork(result, killed_by(run.signalled))
    return result._replace(log=where.log)


def _command_then_end(
    run: runner.Run,
    lock: PoolLock,
    argv: list[str],
    attempts: int,
    output: CommandOutput,
    running_lost: list[locks.LockLostError],
) -> WorkResult:
    """CMD, then its feature's mark and release, inside the run: a signal is the relay's until
    the feature has ended; one since CMD ended cuts a wait for another's kernel lease on the
    lock short: the worker stops, the feature lost and its lock left, in ``lock run``'s words.
    Lost: ``running_lost`` says whether the loss was found while CMD ran."""
    env = {FEATURE_ENV_VAR: lock.feature}
    try:
        code = run.command(argv, output.stdout, env=env, stderr=output.stderr)
    except locks.LockLostError:
        # Race: taken away (a forced release, a lease run out) between the claim and CMD's
        # start: CMD never ran, the feature is lost to this worker, which goes on.
        return lock.finish(None, None, attempts)
    except runner.WorkLeftError as left:
        # CMD ended but its work outside its group holds the lock until it ends: the result
        # is recorded all the same and the worker goes on (or stops, when told to).
        code = left.status
        end = functools.partial(lock.finish_leaving_work, code, left.still_running)
    else:
        told = run.signalled
        if lock.lost is None and told is not None:
            # Race: CMD caught the signal and exited 1 (or 0): the worker was still told to
            # stop, so the feature is released unmarked.
            why = f"interrupted by {signal.Signals(told).name} (exit code {code})"
            return lock.finish(None, why, attempts)
        end = functools.partial(lock.finish, code, None, attempts)
    try:
        result = end()
    except runner.ReleaseInterrupted as stop:
        lost = WorkResult(lock.feature, WorkOutcome.LOST, code, 0, str(stop))
        raise StopWork(lost, stop.exit_code) from None
    return result._replace(lost_while_running=bool(running_lost))


def _say(result: WorkResult, limit: int) -> None:
    """The one stderr line per feature."""
    if result.outcome == WorkOutcome.FAILED:
        final = " (failed: no more attempts)" if result.attempts >= limit else ""
        said = f"attempt {result.attempts} of {limit} failed: {result.reason}{final}"
    elif result.outcome == WorkOutcome.DONE:
        said = "done" if result.reason is None else f"done ({result.reason})"
    elif result.outcome == WorkOutcome.LEFT:
        said = f"not marked: {result.reason}"
    elif result.outcome == WorkOutcome.LOST:
        why = "" if result.reason is None else f" ({result.reason})"
        found = "lost its lock while CMD ran"
        if result.exit_code is None:
            found = "lost its lock before CMD started"
        elif not result.lost_while_running:  # a lease, a forced release no refresh saw
            found = "found its lock lost once CMD had ended"
        ran = "" if result.exit_code is None else f" (exit code {result.exit_code})"
        said = f"{found}{why}{ran}: not marked"
    else:
        said = f"released unmarked ({result.reason or f'exit code {result.exit_code}'})"
    note(f"{result.feature}: {said}")


def _say_waiting(info: LockInfo) -> None:
    """Said once on stderr when only features held by others are left: what it waits for."""
    if info.state is State.FREE:  # the pool tells a free feature only when it rests
        said = f"feature {info.feature!r} rests after a failed attempt (--retry-delay)"
    else:
        said = describe_holder(info)
    note(f"waiting: {said} (Ctrl-C to stop)")


def _say_server_full(error: BackendError) -> None:
    """Said once on stderr when the server turns the worker away for want of a slot."""
    note(f"{error}; waiting for a free connection slot (Ctrl-C to stop)")


def _worker_answer(result: Result) -> dict[str, Any]:
    """What a worker of ``lock work --jobs`` sends back: its answer, as it would print it."""
    said = result._asdict()
    return {name: said[name] for name in ("code", "document", "message", "warnings")}


def _team_result(ends: list[team.WorkerEnd], document: dict[str, Any]) -> Result:
    """The one answer of ``lock work --jobs``: the workers' reports merged; a worker that
    answered an error, or died without answering, is said on stderr."""
    reports: list[WorkReport] = []
    errors: list[tuple[int, str]] = []
    said: list[str] = []
    for end in ends:
        if end.answer is None:
            said.append(f"worker {end.pid} ended without an answer (exit status {end.status})")
            continue
        report = team.report_from_document(end.answer["document"])
        if report is None:
            errors.append((end.answer["code"], end.answer["message"] or "failed"))
        else:
            reports.append(report)
        said.extend(end.answer["warnings"])
    workers = [
        {"pid": end.pid, "exit_code": end.answer["code"] if end.answer else end.status}
        for end in ends
    ]
    found = {**document, "workers": workers}
    if not reports:
        code, message = errors[0] if errors else (ends[0].status, "no worker answered")
        return Result(code, found, message=message, warnings=list(dict.fromkeys(said)))
    said.extend(f"worker failed: {message}" for _, message in errors)
    result = _work_result(team.merge_reports(reports), found, False, [])
    return result._replace(warnings=list(dict.fromkeys([*result.warnings, *said])))


def _waited_out(report: WorkReport) -> str:
    """Why ``--wait`` ran out: features held by others, or by work a failed CMD left."""
    last = {result.feature: result.outcome for result in report.results}
    left = [f for f in report.busy if last.get(f) == WorkOutcome.LEFT]
    others = len(report.busy) - len(left)
    parts = [f"{others} feature(s) still held by others"] if others or not left else []
    if left:
        parts.append(
            f"{len(left)} still held by work its failed CMD left running (the lock stays "
            f"until that work ends; the attempt is not recorded): {', '.join(left)}"
        )
    return f"--wait ran out: {'; '.join(parts)}"


def _work_result(
    report: WorkReport, document: dict[str, Any], once: bool, problems: list[FeatureProblem]
) -> Result:
    """How the worker loop ended, as the exit code, the sentence and the document."""
    said: str | None = None
    if report.ended == WorkEnd.STOPPED:
        code = EXIT_BAD_INPUT if report.exit_code is None else report.exit_code
    elif report.ended == WorkEnd.ONCE:
        last = report.results[-1]
        code = EXIT_HELD if last.exit_code is None else last.exit_code
        if last.outcome == WorkOutcome.LOST:
            code = EXIT_LOST  # lock run's lost-lock rule, and its document's fields
            document = {**document, "error": "lost", "reason": last.reason}
    elif report.ended == WorkEnd.WAITED_OUT:
        code, said = EXIT_TEMPFAIL, _waited_out(report)
    elif once:
        code, said = EXIT_HELD, "nothing left to take: every feature is done or failed"
    elif report.failed or report.busy:
        code = EXIT_HELD  # finished, yet not every feature done
        parts = ["nothing else to take" if report.busy else "every feature is finished"]
        if report.failed:
            parts.append(f"{len(report.failed)} failed: {', '.join(report.failed)}")
        if report.busy:  # e.g. lost to another's kernel lease: this worker left its lock
            parts.append(
                f"{len(report.busy)} left with its lock in place: {', '.join(report.busy)}"
            )
        said = "; ".join(parts)
    else:
        code = EXIT_OK
    found = {
        **document,
        "ended": report.ended,
        "results": [result.to_dict() for result in report.results],
        "failed": list(report.failed),
        "busy": list(report.busy),
        "exit_code": code,
    }
    # Skipped folders are warned of unless a sentence says why the loop stopped.
    warnings = [] if said else problem_warnings(problems)
    return Result(code, found, message=said, warnings=warnings)
