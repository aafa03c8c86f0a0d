"""``mahabharatha lock ...``: claim, hold, inspect and clean feature locks."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from typing import Annotated, Any

import typer

from mahabharatha import locks, runner
from mahabharatha.cli._output import (
    DEFAULT_GSD_DIR,
    EXIT_HELD,
    EXIT_OK,
    EXIT_TEMPFAIL,
    GsdDirOption,
    JsonOption,
    PidOption,
    ReclaimDeadOption,
    Result,
    default_owner,
    exit_code_for,
    respond,
)
from mahabharatha.cli._render import WaitingLine, status_table
from mahabharatha.locks import AlreadyHeldError, LockHeldError, LockInfo, LockLostError

app = typer.Typer(
    help="Feature locks: one session per feature, across shells and worker pools.",
    no_args_is_help=True,
)

FeatureArg = Annotated[str, typer.Argument(help="The feature (a folder under <gsd-dir>/specs).")]


@app.command()
def acquire(
    feature: FeatureArg,
    gsd_dir: GsdDirOption = DEFAULT_GSD_DIR,
    as_json: JsonOption = False,
    pid: PidOption = None,
    wait: Annotated[
        float | None,
        typer.Option("--wait", min=0, help="Wait up to SECONDS for a busy lock (with backoff)."),
    ] = None,
    reclaim_dead: ReclaimDeadOption = False,
) -> None:
    """Claim FEATURE for the calling shell or worker (or --pid). Exit 1 if someone holds it."""
    owner = default_owner(pid)
    document: dict[str, Any] = {"feature": feature, "pid": owner, "acquired": False}

    def action() -> Result:
        with WaitingLine() as on_wait:
            locks.acquire(
                feature,
                gsd_dir,
                pid=owner,
                timeout=wait or 0.0,
                reclaim_dead=reclaim_dead,
                on_wait=on_wait,
            )
        return Result(
            EXIT_OK, {**document, "acquired": True}, f"acquired {feature} for pid {owner}"
        )

    respond(as_json, document, action, advice="wait for it with --wait SECONDS, or ask its owner")


@app.command()
def release(
    feature: FeatureArg,
    gsd_dir: GsdDirOption = DEFAULT_GSD_DIR,
    as_json: JsonOption = False,
    pid: PidOption = None,
    force: Annotated[
        bool, typer.Option("--force", help="Remove the lock even if another owner holds it.")
    ] = False,
) -> None:
    """Release FEATURE if the calling shell (or --pid) holds it; another owner's lock stays."""
    owner = default_owner(pid)
    document: dict[str, Any] = {"feature": feature, "pid": owner, "released": False}

    def action() -> Result:
        removed = locks.release(feature, gsd_dir, pid=owner, force=force)
        text = f"released {feature}" if removed else f"{feature} was not locked"
        return Result(EXIT_OK, {**document, "released": removed}, text)

    respond(as_json, document, action, advice="--force removes it anyway; lock clean once stale")


def _is_held(info: LockInfo) -> bool:
    # A fresh empty lock is being written by an older writer: acquire would fail, so: held.
    return info.state in ("active", "writing")


@app.command()
def check(
    feature: FeatureArg,
    gsd_dir: GsdDirOption = DEFAULT_GSD_DIR,
    as_json: JsonOption = False,
) -> None:
    """Exit 0 if FEATURE is free (no lock, stale, corrupt), 1 if it is held."""

    def action() -> Result:
        info = locks.inspect(feature, gsd_dir)
        held = _is_held(info)
        text = locks.describe_holder(info) if held else f"{feature} is free ({info.state})"
        return Result(EXIT_HELD if held else EXIT_OK, info.to_dict(), text)

    respond(as_json, {"feature": feature, "state": None}, action)


@app.command()
def claim(
    features: Annotated[
        list[str] | None,
        typer.Argument(help="Candidates in order (default: every feature folder, by name)."),
    ] = None,
    gsd_dir: GsdDirOption = DEFAULT_GSD_DIR,
    as_json: JsonOption = False,
    pid: PidOption = None,
    reclaim_dead: ReclaimDeadOption = False,
) -> None:
    """Claim the first free feature and print its name; exit 1 if none is free."""
    owner = default_owner(pid)
    document: dict[str, Any] = {"feature": None, "pid": owner, "claimed": False}

    def action() -> Result:
        won = locks.claim(features, gsd_dir, pid=owner, reclaim_dead=reclaim_dead)
        if won is None:
            return Result(EXIT_HELD, document, message="no free feature to claim")
        return Result(EXIT_OK, {**document, "feature": won, "claimed": True}, won)

    respond(as_json, document, action)


@app.command()
def status(
    gsd_dir: GsdDirOption = DEFAULT_GSD_DIR,
    as_json: JsonOption = False,
) -> None:
    """List every feature lock with its state, owner, age and time left."""

    def action() -> Result:
        infos = locks.status(gsd_dir)
        return Result(EXIT_OK, [i.to_dict() for i in infos], show=lambda: status_table(infos))

    respond(as_json, {}, action)


@app.command()
def clean(
    gsd_dir: GsdDirOption = DEFAULT_GSD_DIR,
    as_json: JsonOption = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List what would be removed; remove nothing.")
    ] = False,
    reclaim_dead: ReclaimDeadOption = False,
) -> None:
    """Remove stale and corrupt locks, non-file entries and orphan temp files."""
    document: dict[str, Any] = {"dry_run": dry_run, "entries": []}

    def action() -> Result:
        entries = locks.clean(gsd_dir, dry_run=dry_run, reclaim_dead=reclaim_dead)
        verb = "would remove" if dry_run else "removed"
        lines = [f"{verb} {e.path} ({e.state})" for e in entries if e.removed or dry_run]
        lines += [
            f"left {e.path} ({e.state}): it changed or is not empty"
            for e in entries
            if not e.removed and not dry_run
        ]
        text = "\n".join(lines) or "nothing to clean"
        return Result(EXIT_OK, {**document, "entries": [e.to_dict() for e in entries]}, text)

    respond(as_json, document, action)


# --------------------------------------------------------------------------- lock run


@app.command("run")
def run_command(
    feature: FeatureArg,
    command: Annotated[list[str], typer.Argument(help="The command to run (after --).")],
    gsd_dir: GsdDirOption = DEFAULT_GSD_DIR,
    as_json: JsonOption = False,
    timeout: Annotated[
        float | None,
        typer.Option("--timeout", min=0, help="Give up (exit 75) if still busy after SECONDS."),
    ] = None,
    heartbeat: Annotated[
        float,
        typer.Option("--heartbeat", min=0.01, max=60, help="Seconds between lock refreshes."),
    ] = locks.HEARTBEAT_SECONDS,
    reclaim_dead: ReclaimDeadOption = False,
    on_lost: Annotated[
        runner.OnLost,
        typer.Option(
            "--on-lost",
            help=(
                "If the lock is lost while CMD runs: 'terminate' sends CMD SIGTERM (SIGKILL "
                "after a grace) and exits 76; 'warn' keeps CMD running and exits with its code."
            ),
        ),
    ] = runner.OnLost.TERMINATE,
) -> None:
    """Hold FEATURE while CMD runs (kept fresh), release it after; exit with CMD's code.

    The lock records this process (it lives as long as CMD). A busy lock is waited for
    without limit unless --timeout bounds it (--timeout 0 tries once). A lock lost while CMD
    runs stops CMD and exits 76, unless --on-lost warn.
    """
    document: dict[str, Any] = {"feature": feature, "pid": os.getpid(), "exit_code": None}

    told: list[LockLostError] = []  # losses already reported on stderr, as they happened

    def tell(lost: LockLostError) -> None:
        _warn_lost(lost, on_lost)
        told.append(lost)

    def action() -> Result:
        line = WaitingLine()
        holder = locks.FeatureLock(
            feature,
            gsd_dir,
            timeout=timeout,
            heartbeat=heartbeat,
            reclaim_dead=reclaim_dead,
            on_wait=line.callback,
            caller_pids=(os.getppid(),),  # the shell that ran us: its lock is "yours" too
        )
        try:
            # With --json our stdout is for the one document: the command's goes to stderr.
            stdout = sys.stderr if as_json else None
            code = runner.run_locked(
                holder,
                command,
                stdout,
                on_acquired=line.erase,
                on_lost=on_lost,
                notify_lost=tell,
            )
        except AlreadyHeldError as mine:
            return Result(EXIT_HELD, {**document, "holder": mine.info.to_dict()}, message=str(mine))
        except LockHeldError as busy:
            held = {**document, "holder": busy.info.to_dict()}
            return Result(EXIT_TEMPFAIL, held, message=f"{busy}; not run (see --timeout)")
        except runner.Interrupted as stop:
            return Result(stop.exit_code, document, message=str(stop))
        except runner.CommandNotFoundError as missing:
            return Result(runner.EXIT_NOT_FOUND, document, message=missing.strerror)
        if holder.lost is not None:
            result = _lost_result(holder.lost, on_lost, {**document, "exit_code": code}, code)
            return replace(result, message=None) if told else result  # said once is enough
        return Result(code, {**document, "exit_code": code})

    respond(as_json, document, action)


def _warn_lost(lost: LockLostError, on_lost: runner.OnLost) -> None:
    """Said on stderr the moment the heartbeat finds the lock lost, while CMD still runs."""
    then = "stopping CMD" if on_lost is runner.OnLost.TERMINATE else "CMD keeps running"
    typer.echo(f"mahabharatha: {lost}; {then} (--on-lost {on_lost.value})", err=True)


def _lost_result(
    lost: LockLostError, on_lost: runner.OnLost, document: dict[str, Any], code: int
) -> Result:
    """The lost-lock rule: exit 76 (or CMD's code with --on-lost warn), ``error: lost``."""
    document = {**document, "error": "lost", "reason": lost.reason}
    if on_lost is runner.OnLost.WARN:
        return Result(code, document)
    return Result(exit_code_for(lost), document, message=f"{lost}; CMD was stopped")
