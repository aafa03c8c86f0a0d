"""``mahabharatha lock ...``: claim, hold, inspect and clean feature locks."""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any, Final

import typer
from typer.core import TyperCommand

from mahabharatha import locks
from mahabharatha.backends.base import (
    HELD_STATES,
    Held,
    LockBackend,
    LockServer,
    UnsupportedError,
    describe_holder,
    format_duration,
)
from mahabharatha.cli._output import (
    CreateOption,
    FeatureArg,
    LeaseOption,
    NonblockOption,
    PidOption,
    ReclaimDeadOption,
    Result,
    Shared,
    WaitOption,
    complete_feature,
    default_owner,
    exit_code_for,
    feature_folders,
    finite_seconds,
    lock_entry,
    note,
    problem_fields,
    problem_warnings,
    respond,
    sentence,
    wait_seconds,
    with_shared_options,
)
from mahabharatha.cli._render import (
    WaitingLine,
    gone_holder_notice,
    is_reclaimable,
    status_table,
    summary,
    summary_counts,
)
from mahabharatha.exits import EXIT_HELD, EXIT_OK, EXIT_OS_ERROR, EXIT_TEMPFAIL
from mahabharatha.locks import (
    AlreadyHeldError,
    FeatureProblem,
    LockHeldError,
    LockInfo,
    LockLostError,
)
from mahabharatha.names import is_valid_feature_name, validate_feature_name
from mahabharatha.owner import ownership
from mahabharatha.run import runner

app = typer.Typer(
    help="Feature locks: one session per feature, across shells and worker pools.",
    no_args_is_help=True,
)
_NO_HOLDER: Final = {"host": None, "token": None}  # _held_fields before a lock is held


@app.command()
@with_shared_options
def acquire(
    feature: FeatureArg,
    shared: Shared,
    pid: PidOption = None,
    wait: WaitOption = None,
    nonblock: NonblockOption = False,
    reclaim_dead: ReclaimDeadOption = False,
    lease: LeaseOption = None,
    create: CreateOption = False,
) -> None:
    """Claim FEATURE for the calling shell or worker (or --pid). Exit 1 if someone holds it.

    Tries once unless --wait (or --timeout) SECONDS lets it wait for a busy lock.
    """
    timeout = wait_seconds(wait, nonblock, default=0.0)
    owner = default_owner(pid)
    document: dict[str, Any] = {"feature": feature, "pid": owner, "acquired": False, **_NO_HOLDER}

    def action() -> Result:
        store = shared.backend()
        warned = case_warnings(shared.gsd_dir, feature)  # before acquire makes a new folder
        with WaitingLine() as line:
            held = locks.acquire(
                feature,
                shared.gsd_dir,
                backend=store,
                pid=owner,
                timeout=timeout,
                reclaim_dead=reclaim_dead,
                on_wait=_on_wait(store, line, reclaim_dead),
                lease=lease,
            )
        found = {**document, "acquired": True, **_held_fields(store, held)}
        return Result(
            EXIT_OK,
            found,
            f"acquired {feature} for pid {owner}",
            warnings=warned,
            give_back=lambda: store.release_held(held),  # when the answer cannot get out
        )

    respond(shared.as_json, document, action, advice=what_to_do)


@app.command()
@with_shared_options
def release(
    feature: FeatureArg,
    shared: Shared,
    pid: PidOption = None,
    force: Annotated[
        bool, typer.Option("--force", help="Remove the lock even if another owner holds it.")
    ] = False,
) -> None:
    """Release FEATURE if the calling shell (or --pid) holds it; another owner's lock stays."""
    owner = default_owner(pid)
    document: dict[str, Any] = {"feature": feature, "pid": owner, "released": False}

    def action() -> Result:
        removed = locks.release(feature, backend=shared.backend(), pid=owner, force=force)
        text = f"released {feature}" if removed else f"{feature} was not locked"
        return Result(EXIT_OK, {**document, "released": removed}, text)

    respond(shared.as_json, document, action, advice=_release_advice)


RECLAIM_DEAD_ADVICE: Final = "its owner is gone: --reclaim-dead takes the lock over"


def what_to_do(busy: LockHeldError) -> str:
    """What a person can do about a lock that stayed held: take it over when its owner is gone,
    otherwise wait (never advised again once a wait has run out) or ask its owner."""
    if locks.owner_is_gone(busy.info):
        return RECLAIM_DEAD_ADVICE
    if busy.info.state not in HELD_STATES:
        return "try again in a moment (nobody holds it; `lock check` says the same)"
    if isinstance(busy, locks.LockTimeoutError):
        return "still held after the wait; ask its owner to release it, or try again later"
    return "wait for it with --wait SECONDS, or ask its owner"


def _run_advice(busy: LockHeldError) -> str:
    if locks.owner_is_gone(busy.info):
        return RECLAIM_DEAD_ADVICE
    if isinstance(busy, locks.LockTimeoutError):
        return "still held when --timeout ran out; ask its owner, or try again later"
    return "--timeout SECONDS waits for it (none: waits for as long as it takes)"


def _release_advice(busy: LockHeldError) -> str:
    if locks.owner_is_gone(busy.info):
        return "its owner is gone: lock clean --reclaim-dead removes it (or --force)"
    return "--force removes it anyway; lock clean once stale"


@app.command()
@with_shared_options
def check(feature: FeatureArg, shared: Shared) -> None:
    """Exit 0 if FEATURE is free (no lock, stale, corrupt), 1 if it is held.

    A feature nobody has locked is free, also one with no folder at all: check never says
    whether a feature exists (lock status --all lists the feature folders).
    """

    def action() -> Result:
        info = locks.inspect(feature, backend=shared.backend())
        return Result(EXIT_HELD if info.held else EXIT_OK, lock_entry(info), _check_text(info))

    respond(shared.as_json, {"feature": feature, "state": None}, action)


def case_warnings(gsd_dir: str, feature: str) -> list[str]:
    """A warning when ``feature`` differs only by case from a feature folder: two features on
    a case-sensitive file system (a typo), one folder on a case-insensitive one (whose lock).
    None for an invalid name (the command says so itself)."""
    if not is_valid_feature_name(feature):
        return []
    specs = os.path.join(gsd_dir, "specs")
    folder = os.path.join(specs, feature)
    flipped = feature.swapcase()
    if not os.path.isdir(folder):
        twins = " or ".join(repr(twin) for twin in _case_twins(gsd_dir, feature))
        if not twins:
            return []
        return [
            f"{feature!r} differs only by case from the feature {twins}: it is another "
            f"feature with its own lock (did you mean {twins}?)"
        ]
    try:  # do both spellings reach one folder (a case-insensitive file system)?
        if flipped == feature or not os.path.samefile(folder, os.path.join(specs, flipped)):
            return []
    except OSError:
        return []
    return [
        f"{feature!r} is the folder {name!r} on this case-insensitive file system: the lock "
        f"taken is {name!r}'s ({os.path.join(specs, name, '.lock')})"
        for name in _case_twins(gsd_dir, feature)
    ]


def _case_twins(gsd_dir: str, feature: str) -> list[str]:
    wanted = feature.casefold()
    return feature_folders(gsd_dir, lambda name: name != feature and name.casefold() == wanted)


def _check_text(info: LockInfo) -> str:
    if info.held:
        said = describe_holder(info)
        return f"{said}; {RECLAIM_DEAD_ADVICE}" if locks.owner_is_gone(info) else said
    if info.state == "free":
        return f"{info.feature} is free"
    return f"{info.feature} is free (its lock is {info.state}: the next acquire replaces it)"


WAIT_FOREVER: Final = 1e18  # a bare claim --wait (no SECONDS): as long as it takes


def _is_seconds(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


class _WaitTakesOptionalSeconds(TyperCommand):
    """``claim --wait [SECONDS]``: a ``--wait`` not followed by a number waits for ever (click
    options take a value or none, never maybe one)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        words = list(args)
        for at, word in enumerate(words, start=1):
            if word == "--":
                break
            if word == "--wait" and (at == len(words) or not _is_seconds(words[at])):
                words.insert(at, repr(WAIT_FOREVER))  # the first bare one (--wait 0 --wait)
                break
        return list(super().parse_args(ctx, words))


@app.command(cls=_WaitTakesOptionalSeconds)
@with_shared_options
def claim(
    features: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[FEATURE]...",
            autocompletion=complete_feature,
            help="Candidates in order (default: every feature folder, by name).",
        ),
    ] = None,
    *,  # typer passes every option by name
    shared: Shared,
    pid: PidOption = None,
    reclaim_dead: ReclaimDeadOption = False,
    include_done: Annotated[
        bool,
        typer.Option("--include-done", help="Also claim features marked done (lock done)."),
    ] = False,
    lease: LeaseOption = None,
    create: CreateOption = False,
    attempts: Annotated[
        int | None,
        typer.Option(
            "--attempts",
            metavar="N",
            min=1,
            help=(
                "Skip features whose attempts failed N times (default: the limit recorded "
                "with them by lock fail or lock work, 3 unless given)."
            ),
        ),
    ] = None,
    wait: Annotated[
        float | None,
        typer.Option(
            "--wait",
            min=0,
            callback=finite_seconds,
            metavar="[SECONDS]",
            help=(
                "While none is free but some are held by others, wait (up to SECONDS; none: as "
                "long as it takes) for one to be released (exit 75 if none came)."
            ),
        ),
    ] = None,
) -> None:
    """Claim the first free feature that is not done or failed and print its name.

    Exit codes: 0 claimed (its name on stdout); 1 nothing left to claim (every feature done or
    failed, or no feature at all); 75 none free now but some held by others (with --wait: the
    wait ran out); 2 bad input; 3 an OS error, or nothing claimed while some feature folder
    could not be tried.
    """
    owner = default_owner(pid)
    document: dict[str, Any] = {"feature": None, "pid": owner, "claimed": False, **_NO_HOLDER}

    def action() -> Result:
        problems: list[FeatureProblem] = []
        store = shared.backend(needs_folder=not features)  # none named: the folders are the list
        warned = [w for name in features or () for w in case_warnings(shared.gsd_dir, name)]
        outcome = locks.claim_next(
            features,
            backend=store,
            pid=owner,
            reclaim_dead=reclaim_dead,
            include_done=include_done,
            problems=problems,
            lease=lease,
            attempts=attempts,
            wait=0.0 if wait is None else None if wait >= WAIT_FOREVER else wait,
        )
        held = outcome.held
        found = {**document, "problems": [problem_fields(p) for p in problems]}
        if held is not None:
            return Result(
                EXIT_OK,
                {**found, "feature": held.feature, "claimed": True, **_held_fields(store, held)},
                held.feature,
                warnings=[*warned, *problem_warnings(problems)],
                give_back=lambda: store.release_held(held),  # if the answer cannot get out
            )
        if problems:
            # Some feature could not be tried: "none free" would be a guess (JSON lists all).
            more = len(problems) - 1
            message = sentence(problems[0].error) + (
                f" (and {more} other feature(s) could not be tried)" if more else ""
            )
            return Result(EXIT_OS_ERROR, found, message=message)
        if outcome.busy:
            busy = f"no free feature to claim now: {len(outcome.busy)} held by others"
            return Result(EXIT_TEMPFAIL, found, message=busy, warnings=warned)
        if outcome.mine:
            # Waiting would wait for ourselves: the rest is done, failed or the caller's own.
            yours = ", ".join(outcome.mine)
            left = f"nothing else to claim: the caller already holds {yours}"
            return Result(EXIT_HELD, {**found, "mine": list(outcome.mine)}, message=left)
        left = "nothing left to claim: every feature is done or failed"
        return Result(EXIT_HELD, found, message=left, warnings=warned)

    respond(shared.as_json, document, action)


def _problem_entry(problem: FeatureProblem) -> dict[str, Any]:
    """A folder status could not look into, as an entry: state ``error``, its sentence."""
    unknown = dict.fromkeys(("pid", "timestamp", "age_seconds", "expires_in_seconds"))
    said = {"state": "error", "owner": "unknown", "reclaimable": False}
    return {**unknown, **said, **problem_fields(problem)}


STATUS_JSON_VERSION: Final = 1  # lock status --json: version, features, summary (error)


def _status_document(entries: list[dict[str, Any]], infos: list[LockInfo]) -> dict[str, Any]:
    """``lock status --json``, one shape whatever happens (an error only adds ``error``)."""
    counts = summary_counts(infos)
    counts["error"] = sum(entry["state"] == "error" for entry in entries)  # folders not read
    return {
        "version": STATUS_JSON_VERSION,
        "features": entries,
        "summary": {"features": len(infos) + counts["error"], **counts},
    }


@app.command()
@with_shared_options
def status(
    shared: Shared,
    show_all: Annotated[
        bool,
        typer.Option("--all", help="Also list feature folders that are free, done or failed."),
    ] = False,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch",
            help=(
                "Redraw the --all view every second with a progress bar until Ctrl-C (off a "
                "terminal, or with --json: one JSON document per change, one a line)."
            ),
        ),
    ] = False,
    until_done: Annotated[
        bool,
        typer.Option(
            "--until-done",
            help="With --watch: stop once nothing is left to claim (exit 0 all done, 1 failed).",
        ),
    ] = False,
) -> None:
    """List every feature lock with its state, owner, age and time left (--all: every
    feature folder, free, done and failed ones too), then a one-line summary. A lock whose owner
    is provably gone on this host is shown as reclaimable: --reclaim-dead takes it."""
    if watch or until_done:
        from mahabharatha.cli.watch import watch_status  # only a watch needs the live view

        watch_status(shared, until_done)

    def action() -> Result:
        problems: list[FeatureProblem] = []
        store = shared.backend(needs_folder=shared.url is None)  # a server lists its own
        every = locks.survey(backend=store, problems=problems)
        infos = every if show_all else [i for i in every if i.state not in ("free", "done")]
        listed = [lock_entry(i) for i in infos] + [_problem_entry(p) for p in problems]
        listed.sort(key=lambda entry: str(entry["feature"]))
        logs: dict[str, str] = {}  # each feature's last log of lock work --log-dir, if any
        if show_all:
            from mahabharatha.cli._work_output import last_log  # only status --all reads them

            logs = {i.feature: log for i in infos if (log := last_log(shared.gsd_dir, i.feature))}
        for entry in listed:
            if entry["feature"] in logs:
                entry["log"] = logs[entry["feature"]]
        footer = "\n".join(
            [summary(every), *(f"last log of {name}: {path}" for name, path in logs.items())]
        )
        return Result(
            EXIT_OK,
            _status_document(listed, every),
            show=lambda: status_table(infos, footer),
            warnings=problem_warnings(problems),
        )

    respond(shared.as_json, _status_document([], []), action)


@app.command()
@with_shared_options
def clean(
    shared: Shared,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List what would be removed; remove nothing.")
    ] = False,
    reclaim_dead: ReclaimDeadOption = False,
) -> None:
    """Remove stale and corrupt locks, non-file entries and orphan temp files."""
    document: dict[str, Any] = {"dry_run": dry_run, "entries": [], "reclaimable": []}

    def action() -> Result:
        problems: list[FeatureProblem] = []
        store = shared.backend(needs_folder=shared.url is None)
        entries = locks.clean(
            backend=store, dry_run=dry_run, reclaim_dead=reclaim_dead, problems=problems
        )
        verb = "would remove" if dry_run else "removed"
        lines = [f"{verb} {e.path} ({_why(e)})" for e in entries if e.removed or dry_run]
        lines += [
            f"left {e.path} ({_why(e)}): it changed or is not empty"
            for e in entries
            if not e.removed and not dry_run
        ]
        # The features whose lock only --reclaim-dead would remove (its owner is gone here);
        # a folder not read is left out: clean has reported it already.
        listed = [] if reclaim_dead else locks.status(backend=store, problems=[])
        gone = [info.feature for info in listed if is_reclaimable(info)]
        if gone:
            lines.append(
                f"left {len(gone)} lock(s) whose owner is not running ({', '.join(gone)}): "
                "lock clean --reclaim-dead removes them"
            )
        text = "\n".join(lines) or ("nothing to clean" if not problems else None)
        found = {
            **document,
            "entries": [e.to_dict() for e in entries],
            "problems": [problem_fields(p) for p in problems],
            "reclaimable": gone,
        }
        return Result(EXIT_OK, found, text, warnings=problem_warnings(problems))

    respond(shared.as_json, document, action)


def _why(entry: locks.CleanedEntry) -> str:
    # An active lock is cleaned only under --reclaim-dead: because its owner is gone.
    return "its owner is not running" if entry.state == "active" else entry.state


# --------------------------------------------------------------------------- lock run


@app.command("run")
@with_shared_options
def run_command(
    feature: FeatureArg,
    command: Annotated[
        list[str], typer.Argument(metavar="-- CMD...", help="The command to run (after --).")
    ],
    shared: Shared,
    wait: WaitOption = None,
    nonblock: NonblockOption = False,
    heartbeat: Annotated[
        float,
        typer.Option(
            "--heartbeat",
            min=0.01,
            max=60,
            metavar="SECONDS",
            help="Seconds between lock refreshes (with a --lease: at most a third of it).",
        ),
    ] = locks.HEARTBEAT_SECONDS,
    lease: LeaseOption = None,
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
    create: CreateOption = False,
    conflict_exit_code: Annotated[
        int | None,
        typer.Option(
            "--conflict-exit-code",
            "-E",
            min=0,
            max=255,
            metavar="N",
            help=(
                "Exit N when the lock could not be taken (busy past --timeout, busy with -n, "
                "or already held by you), as flock -E does; default 75 (busy) and 1 (yours). "
                "--json tells it from CMD's own code: acquired false, exit_code null."
            ),
        ),
    ] = None,
) -> None:
    """Hold FEATURE while CMD runs (kept fresh), release it after; exit with CMD's code.

    The lock records this process (it lives as long as CMD). A busy lock is waited for
    without limit unless --timeout (or --wait) SECONDS bounds it (exit 75 then); -n or
    --timeout 0 tries once. A lock lost while CMD runs stops CMD and exits 76, unless
    --on-lost warn.
    """
    timeout = wait_seconds(wait, nonblock, default=None)
    document: dict[str, Any] = {
        "feature": feature,
        "pid": os.getpid(),
        "acquired": False,  # true once held: false with an exit code is run's own answer
        "exit_code": None,  # CMD's own code; null when CMD did not run
        **_NO_HOLDER,
    }

    told: list[LockLostError] = []  # losses already reported on stderr, as they happened

    def tell(lost: LockLostError) -> None:
        """Said on stderr the moment the heartbeat finds the lock lost, while CMD still runs."""
        then = "stopping CMD" if on_lost is runner.OnLost.TERMINATE else "CMD keeps running"
        typer.echo(f"mahabharatha: {lost}; {then} (--on-lost {on_lost.value})", err=True)
        told.append(lost)

    def lost_result(lost: LockLostError, found: dict[str, Any], code: int) -> Result:
        """The lost-lock rule: exit 76 (or CMD's code with --on-lost warn), ``error: lost``. The
        loss is said once: ``told`` while CMD ran (stopped or kept), else now (CMD ended first)."""
        exit_code = code if on_lost is runner.OnLost.WARN else exit_code_for(lost)
        # Race: taken away after the last refresh, found once CMD had ended: nothing stopped it.
        said = None if told else f"{lost}; CMD had already ended (exit code {code})"
        return Result(exit_code, {**found, "error": "lost", "reason": lost.reason}, message=said)

    def action() -> Result:
        try:
            line = WaitingLine()  # entered around the wait only: gone before CMD's output
            store = shared.backend()
            for warning in case_warnings(shared.gsd_dir, feature):
                note(warning)
            holder = locks.FeatureLock(
                feature,
                shared.gsd_dir,
                backend=store,
                timeout=timeout,
                heartbeat=heartbeat,
                reclaim_dead=reclaim_dead,
                on_wait=_on_wait(store, line, reclaim_dead),
                command=command,
                caller_pids=(os.getppid(),),  # the shell that ran us: its lock is "yours" too
                lease=lease,
            )
            # With --json our stdout is for the one document: the command's goes to stderr.
            stdout = sys.stderr if shared.as_json else None
            with runner.Run(
                holder,
                on_lost=on_lost,
                notify_lost=tell,
                on_release_wait=lambda bound: _warn_release_wait(feature, bound),
                adopt_orphans=True,
            ) as run:
                with line:
                    run.acquire()
                _note_holder(holder, document)
                code = run.command(command, stdout)
        except runner.ReleaseInterrupted as stop:  # the command ran; its lock was left
            stopped = {**document, "exit_code": stop.status}
            return Result(stop.exit_code, stopped, message=str(stop))
        except runner.WorkLeftError as left:  # the command ran; its escaped work keeps the lock
            kept = {**document, "exit_code": left.status, "work_left": True}
            if holder.lost is not None:
                lost = lost_result(holder.lost, kept, left.status)
                return lost._replace(message=f"{lost.message or holder.lost}; {left}")
            return Result(left.status, kept, message=str(left))
        except LockHeldError as busy:
            usual = exit_code_for(busy, before_run=True)
            code = usual if conflict_exit_code is None else conflict_exit_code  # -E N
            held = {**document, "holder": lock_entry(busy.info)}
            mine = isinstance(busy, AlreadyHeldError)  # nobody else to wait for: no advice
            said = str(busy) if mine else f"{busy}; not run: {_run_advice(busy)}"
            return Result(code, held, message=said)
        except (runner.Interrupted, runner.CommandStartError) as unrun:  # CMD never ran
            return Result(exit_code_for(unrun, before_run=True), document, message=sentence(unrun))
        except LockLostError as lost:  # lost before CMD could start: it never ran
            never = {**document, "error": "lost", "reason": lost.reason}
            return Result(exit_code_for(lost), never, message=f"{lost}; CMD was not started")
        if holder.lost is not None:
            return lost_result(holder.lost, {**document, "exit_code": code}, code)
        return Result(code, {**document, "exit_code": code})

    respond(shared.as_json, document, action)


def _on_wait(
    store: LockBackend, line: WaitingLine, reclaim_dead: bool
) -> locks.WaitCallback | None:
    """At each look of a wait: the waiting line, and once a word when the holder is gone."""
    if reclaim_dead:
        return line.callback
    return gone_holder_notice(lambda name: locks.inspect(name, backend=store), line.callback)


def _warn_release_wait(feature: str, bound: float) -> None:
    """Said on stderr when a kernel lease holds up ``lock run``'s release."""
    note(
        f"another process holds a kernel lease on the lock of {feature!r}; "
        f"waiting up to {format_duration(bound)} for the kernel to break it, then releasing "
        "(Ctrl-C leaves the lock behind)"
    )


# --------------------------------------------------------------------------- worker pools


@app.command()
@with_shared_options
def done(feature: FeatureArg, shared: Shared, pid: PidOption = None) -> None:
    """Mark FEATURE done and release it (the holder only); claim never hands it out again.

    Exit 1, with nothing written, when the calling shell (or --pid) does not hold its lock.
    """
    owner = default_owner(pid)
    document: dict[str, Any] = {"feature": feature, "pid": owner, "done": False}

    def action() -> Result:
        stamp = locks.done(feature, backend=shared.backend(), pid=owner)
        found = {**document, "done": True, "completed_at": stamp}
        return Result(EXIT_OK, found, f"{feature} is done (released)")

    respond(shared.as_json, document, action)


@app.command()
@with_shared_options
def reopen(
    shared: Shared,
    features: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[FEATURE]...",
            autocompletion=complete_feature,
            help="The features to reopen (folders under <gsd-dir>/specs).",
        ),
    ] = None,
    failed: Annotated[bool, typer.Option("--failed", help="Reopen every failed feature.")] = False,
    every: Annotated[
        bool,
        typer.Option("--all", help="Reopen every done or failed feature (reset the pool)."),
    ] = False,
) -> None:
    """Clear the done marker, failed state and attempts of FEATURE(s), of every failed one
    (--failed) or of every feature (--all), so that claim hands them out again (a lock stays
    as it is)."""
    named = list(features or [])
    one = len(named) == 1 and not (failed or every)
    document: dict[str, Any] = (
        {"feature": named[0], "reopened": False} if one else {"features": named, "reopened": []}
    )

    def action() -> Result:
        store = shared.backend()
        if one:
            removed = locks.reopen(named[0], backend=store)
            text = f"reopened {named[0]}" if removed else f"{named[0]} was not done nor failed"
            return Result(EXIT_OK, {**document, "reopened": removed}, text)
        if named and (failed or every):
            raise ValueError("name features, or give --failed or --all, not both")
        if failed and every:
            raise ValueError("--failed and --all: choose one (--all includes the failed)")
        if not (named or failed or every):
            raise ValueError("name the features to reopen, or give --failed or --all")
        if named:
            reopened = [name for name in named if locks.reopen(name, backend=store)]
        else:
            reopened = locks.reopen_finished(failed_only=failed, backend=store)
        text = (
            f"reopened {len(reopened)}: {', '.join(reopened)}" if reopened else "nothing to reopen"
        )
        return Result(EXIT_OK, {**document, "reopened": reopened}, text)

    respond(shared.as_json, document, action)


# --------------------------------------------------------------------------- across hosts


def _held_fields(store: LockBackend, held: Held | locks.FeatureLock) -> dict[str, Any]:
    """``host`` and ``token`` of a lock just taken (files: no tokens, null)."""
    host = ownership.host_name() if isinstance(store, LockServer) else None
    return {"host": host, "token": held.token}


def _note_holder(holder: locks.FeatureLock, document: dict[str, Any]) -> None:
    document.update(acquired=True, **_held_fields(holder.backend, holder))


@app.command()
@with_shared_options
def init(shared: Shared) -> None:
    """Create the lock tables on the --backend server (once, as a role that may create tables;
    afterwards SELECT, INSERT, UPDATE, DELETE suffice). The folder backend needs nothing."""
    document: dict[str, Any] = {"backend": "file", "schema_version": None}

    def action() -> Result:
        # The tables serve every namespace.
        store = shared._replace(namespace=shared.namespace or "-").backend()
        if not isinstance(store, LockServer):
            return Result(EXIT_OK, document, "the folder backend needs no set-up")
        version = store.init()
        done = {"backend": store.kind, "schema_version": version}
        return Result(EXIT_OK, done, f"lock tables ready on {store.where()} (schema {version})")

    respond(shared.as_json, document, action)


@app.command()
@with_shared_options
def verify(
    feature: FeatureArg,
    token: Annotated[
        int,
        typer.Option(
            "--token",
            metavar="N",
            help="The fencing token to check (lock run: $MAHABHARATHA_LOCK_TOKEN).",
        ),
    ],
    shared: Shared,
) -> None:
    """Exit 0 while N is the token of FEATURE's current holder, 1 otherwise (a taken-over or
    expired lock); 2 on the folder backend, which has no tokens."""
    document: dict[str, Any] = {"feature": feature, "token": token, "current": False}

    def action() -> Result:
        validate_feature_name(feature)
        store = shared.backend()
        if not isinstance(store, LockServer):
            raise UnsupportedError(
                f"the {store.kind} backend has no fencing tokens: lock verify needs --backend "
                "postgresql://..."
            )
        current = store.verify(feature, token)
        said = "is" if current else "is not"
        text = f"token {token} {said} the current holder's of {feature}"
        return Result(EXIT_OK if current else EXIT_HELD, {**document, "current": current}, text)

    respond(shared.as_json, document, action)
