"""Deciding on a run that waits for a person: ``approve`` and ``deny`` (SPEC §10)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from .completion import complete_run_steps
from .guard import fail, guard, settings_of
from .options import (
    ApprovalTimeoutOpt,
    JournalOpt,
    JsonOpt,
    MaxParallelOpt,
    NoColorOpt,
    ParamOpt,
    ParamsFileOpt,
    ProjectOpt,
    QuietOpt,
    RunArg,
    VerboseOpt,
    text,
)


def _texts(values: list[str] | None) -> list[str] | None:
    """:func:`text` for each of several values (step names)."""
    return [v for v in values if text(v) is not None] if values else values


ReasonOpt = Annotated[str | None, typer.Option(
    "--reason", help="Why (journaled with each decision).", metavar="TEXT", callback=text)]


def approve(
    run: RunArg,
    steps: Annotated[list[str] | None, typer.Argument(
        help="Steps to approve (off a terminal: name them, or give --all).",
        show_default=False, callback=_texts, metavar="STEP",
        autocompletion=lambda ctx, args, incomplete: complete_run_steps(
            ctx, args, incomplete))] = None,
    approve_all: Annotated[bool, typer.Option(
        "--all", help="Approve every step the run waits for.")] = False,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Continue the run at once (as planrun resume RUN).")] = False,
    reason: ReasonOpt = None,
    param: ParamOpt = None,
    params_file: ParamsFileOpt = None,
    approval_timeout: ApprovalTimeoutOpt = None,
    max_parallel: MaxParallelOpt = None,
    as_json: JsonOpt = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
    quiet: QuietOpt = False,
    no_color: NoColorOpt = False,
) -> None:
    """Approve the steps a run awaiting approval waits for (on a terminal: asks each)."""
    from .. import api, ui
    from ..errors import UsageError
    from .run import _drive, _finish

    if approve_all and steps:
        fail(UsageError("give step names or --all, not both"), verbose)
    settings = guard(lambda: settings_of(project, journal), verbose, as_json)
    approver = (ui.TerminalApprover(approval_timeout, no_color)
                if not (steps or approve_all) and ui.can_prompt() else None)
    result = guard(lambda: api.approve(settings, run, steps or [], approve_all=approve_all,
                                       approver=approver, reason=reason),
                   verbose, as_json)
    if not resume:
        if as_json:
            ui.print_json(result)
        else:
            _say(result)
        raise typer.Exit(0)
    if not as_json and not quiet:
        _say(result, stream_err=True)
    outcome = _drive(lambda settings, given, approver, progress: api.resume(
        settings, result["run_id"], given, approver=approver, max_parallel=max_parallel,
        progress=progress), project=project, journal=journal, param=param,
        params_file=params_file, approval_timeout=approval_timeout, quiet=quiet,
        no_color=no_color, verbose=verbose, as_json=as_json)
    _finish(outcome, as_json, no_color, quiet)


def _say(result: dict[str, Any], stream_err: bool = False) -> None:
    """One line per fact: approved, already, still waiting, next."""
    from .. import ui

    say = ui.err if stream_err else ui.out
    run_id = result["run_id"]
    approved, already, waiting = result["approved"], result["already"], result["waiting"]
    if approved:
        say(f"run {run_id}: approved {', '.join(approved)}")
    if already:
        say(f"run {run_id}: not waiting for approval (nothing to do): {', '.join(already)}")
    if not approved and not already:
        say(f"run {run_id}: nothing approved")
    if waiting:
        say(f"run {run_id} still waits for: {', '.join(waiting)}")
    if not stream_err:
        say(f"next: {result['next']}")


def deny(
    run: RunArg,
    reason: ReasonOpt = None,
    as_json: JsonOpt = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
    no_color: NoColorOpt = False,
) -> None:
    """Deny a run awaiting approval: nothing of it runs; the run ends denied (exit 0)."""
    from .. import api, ui

    settings = guard(lambda: settings_of(project, journal), verbose, as_json)
    m = guard(lambda: api.deny(settings, run, reason=reason), verbose, as_json)
    if as_json:
        ui.print_json(m)
    else:
        ui.print_manifest(m, no_color=no_color)
