"""``mahabharatha lock ...``: claim, hold, inspect and clean feature locks."""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import typer

from mahabharatha import locks, runner
from mahabharatha.cli._output import (
    DEFAULT_GSD_DIR,
    EXIT_HELD,
    EXIT_OK,
    EXIT_OS_ERROR,
    EXIT_TEMPFAIL,
    GsdDirOption,
    JsonOption,
    PidOption,
    ReclaimDeadOption,
    Result,
    default_owner,
    problem_fields,
    problem_warnings,
    respond,
    sentence,
)
from mahabharatha.cli._render import WaitingLine, status_table
from mahabharatha.locks import FeatureProblem, LockHeldError, LockInfo

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
    # A fresh empty lock is being written by an older writer, and a busy one could not be read
    # just now (a kernel lease on it): acquire would fail on either, so: held.
    return info.state in ("active", "writing", "busy")


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
        problems: list[FeatureProblem] = []
        won = locks.claim(
            features, gsd_dir, pid=owner, reclaim_dead=reclaim_dead, problems=problems
        )
        found = {**document, "problems": [problem_fields(p) for p in problems]}
        if won is None and problems:
            # Some feature could not even be tried: "none free" would be a guess. One sentence
            # (the first problem); the JSON lists them all.
            more = len(problems) - 1
            message = sentence(problems[0].error) + (
                f" (and {more} other feature(s) could not be tried)" if more else ""
            )
            return Result(EXIT_OS_ERROR, found, message=message)
        if won is None:
            return Result(EXIT_HELD, found, message="no free feature to claim")
        claimed = {**found, "feature": won, "claimed": True}
        return Result(EXIT_OK, claimed, won, warnings=problem_warnings(problems))

    respond(as_json, document, action)


def _problem_entry(problem: FeatureProblem) -> dict[str, Any]:
    """A feature folder status could not look into, as one more entry of its list: every key
    of a lock (unknown), state ``error``, and the ``error`` sentence naming the full path."""
    unknown = dict.fromkeys(("pid", "timestamp", "age_seconds", "expires_in_seconds"))
    fields = problem_fields(problem)
    return {**unknown, "feature": problem.feature, "state": "error", "owner": "unknown", **fields}


@app.command()
def status(
    gsd_dir: GsdDirOption = DEFAULT_GSD_DIR,
    as_json: JsonOption = False,
) -> None:
    """List every feature lock with its state, owner, age and time left."""

    def action() -> Result:
        problems: list[FeatureProblem] = []
        infos = locks.status(gsd_dir, problems=problems)
        listed = [i.to_dict() for i in infos] + [_problem_entry(p) for p in problems]
        listed.sort(key=lambda entry: str(entry["feature"]))
        return Result(
            EXIT_OK,
            listed,
            show=lambda: status_table(infos),
            warnings=problem_warnings(problems),
        )

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
        problems: list[FeatureProblem] = []
        entries = locks.clean(
            gsd_dir, dry_run=dry_run, reclaim_dead=reclaim_dead, problems=problems
        )
        verb = "would remove" if dry_run else "removed"
        lines = [f"{verb} {e.path} ({e.state})" for e in entries if e.removed or dry_run]
        lines += [
            f"left {e.path} ({e.state}): it changed or is not empty"
            for e in entries
            if not e.removed and not dry_run
        ]
        text = "\n".join(lines) or ("nothing to clean" if not problems else None)
        found = {
            **document,
            "entries": [e.to_dict() for e in entries],
            "problems": [problem_fields(p) for p in problems],
        }
        return Result(EXIT_OK, found, text, warnings=problem_warnings(problems))

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
) -> None:
    """Hold FEATURE while CMD runs (kept fresh), release it after; exit with CMD's code.

    The lock records this process (it lives as long as CMD). A busy lock is waited for
    without limit unless --timeout bounds it (--timeout 0 tries once).
    """
    document: dict[str, Any] = {"feature": feature, "pid": os.getpid(), "exit_code": None}

    def action() -> Result:
        line = WaitingLine()
        holder = locks.FeatureLock(
            feature,
            gsd_dir,
            timeout=timeout,
            heartbeat=heartbeat,
            reclaim_dead=reclaim_dead,
            on_wait=line.callback,
        )
        try:
            # With --json our stdout is for the one document: the command's goes to stderr.
            stdout = sys.stderr if as_json else None
            code = runner.run_locked(holder, command, stdout, on_acquired=line.erase)
        except LockHeldError as busy:
            held = {**document, "holder": busy.info.to_dict()}
            return Result(EXIT_TEMPFAIL, held, message=f"{busy}; not run (see --timeout)")
        except runner.Interrupted as stop:
            return Result(stop.exit_code, document, message=str(stop))
        except runner.CommandNotFoundError as missing:
            return Result(runner.EXIT_NOT_FOUND, document, message=missing.strerror)
        lost = f"the lock on {feature!r} was taken away while CMD ran" if holder.lost else None
        return Result(code, {**document, "exit_code": code}, message=lost)

    respond(as_json, document, action)
