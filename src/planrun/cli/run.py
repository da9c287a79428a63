"""Commands that drive a run: execute, resume (and ``--explain``), retry, resolve."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, NoReturn

import typer

from .completion import complete_plans, complete_run_steps, complete_runs
from .guard import fail, guard, leave, settings_of
from .options import (
    ApprovalTimeoutOpt,
    ApproveAllOpt,
    ApproveOpt,
    DeferApprovalOpt,
    ExecutorOpt,
    ItemOpt,
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
from .planning import MaxRoundsOpt, PlannerOpt


def execute(
    plan: Annotated[str | None, typer.Argument(
        help="Plan name (in the plans folder) or file path; none with --planner/--goal.",
        autocompletion=complete_plans)] = None,
    planner: PlannerOpt = None,
    goal: Annotated[str | None, typer.Option(
        "--goal", help="With --planner: plan this goal first, then run the plan.",
        callback=text)] = None,
    max_rounds: MaxRoundsOpt = None,
    param: ParamOpt = None,
    params_file: ParamsFileOpt = None,
    approve: ApproveOpt = None,
    approve_all: ApproveAllOpt = False,
    approval_timeout: ApprovalTimeoutOpt = None,
    defer_approval: DeferApprovalOpt = False,
    max_parallel: MaxParallelOpt = None,
    executor: ExecutorOpt = None,
    keep_going: Annotated[bool, typer.Option(
        "--keep-going", help="After a failure, go on with steps that do not depend on "
        "it.")] = False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Check and show the order and approvals; run and journal "
        "nothing.")] = False,
    as_json: JsonOpt = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
    quiet: QuietOpt = False,
    no_color: NoColorOpt = False,
) -> None:
    """Run a plan: validate, journal, clear approvals, run steps in dependency order."""
    from .. import api, ui

    plan, planned_by = _planned(plan, planner, goal, max_rounds, project=project,
                                journal=journal, param=param, params_file=params_file,
                                quiet=quiet, verbose=verbose, as_json=as_json)
    result = _drive(lambda settings, given, approver, progress: api.execute(
        settings, plan, given, approve=approve or [], approve_all=approve_all,
        approver=approver, max_parallel=max_parallel, keep_going=keep_going,
        dry_run=dry_run, progress=progress, planned_by=planned_by,
        defer_approval=defer_approval), project=project,
        journal=journal, param=param, params_file=params_file,
        approval_timeout=approval_timeout, quiet=quiet, no_color=no_color, verbose=verbose,
        as_json=as_json, executor=executor)
    if isinstance(result, api.DryRun):
        for issue in api.grant_warnings(result.plan):
            ui.err(ui.issue_line(issue))
        if as_json:
            ui.print_json(result.to_json())
        else:
            ui.print_dry_run(result)
        raise typer.Exit(0)
    _finish(result, as_json, no_color, quiet)


def _planned(plan: str | None, planner: str | None, goal: str | None,
             max_rounds: int | None, *, project: str | None, journal: str | None,
             param: list[str] | None, params_file: str | None, quiet: bool, verbose: bool,
             as_json: bool) -> tuple[str, str | None]:
    """The plan to execute and its planning session (None without ``--planner``).

    ``plan``, or (``--planner``/``--goal``) the one planned now.

    The planned plan is written like ``planrun plan`` writes it, validated with the
    parameters given (concrete), and then run exactly as ``execute NAME`` would.
    """
    from .. import api
    from ..errors import UsageError
    from .planning import report_planned, round_note, said_if_interrupted

    if planner is None and goal is None:
        if plan is None:
            fail(UsageError("execute needs a plan name, or --planner and --goal",
                            hint="planrun execute PLAN, or planrun execute --planner P "
                            "--goal TEXT"), verbose)
        return plan, None
    if plan is not None:
        fail(UsageError(f"give a plan name ({plan!r}) or --planner/--goal, not both"), verbose)
    if planner is None or goal is None:
        fail(UsageError("--planner and --goal go together: the planner plans the goal"),
             verbose)
    settings = guard(lambda: settings_of(project, journal), verbose, as_json)
    given = guard(lambda: api.param_input(param or [], params_file), verbose, as_json)
    with said_if_interrupted("no plan was written; nothing ran"):
        done = guard(lambda: api.plan(settings, goal, planner, max_rounds=max_rounds,
                                      given=given, concrete=True,
                                      on_round=None if quiet else round_note),
                     verbose, as_json)
    report_planned(done, as_json=False, quiet=quiet, show=False)
    return str(done.name), done.run_id


def _drive(call: Callable[[Any, Any, Any, Any], Any], *, project: str | None,
           journal: str | None, param: list[str] | None, params_file: str | None,
           approval_timeout: float | None, quiet: bool, no_color: bool, verbose: bool,
           as_json: bool, executor: str | None = None) -> Any:
    """The common part of execute, resume and retry.

    Settings (``--executor`` over planrun.toml's ``executor``), parameters, the person at
    the terminal (if any), live progress; then ``call(settings, given, approver,
    progress)``: a RunOutcome (or a DryRun).
    """
    from .. import api, ui

    settings = guard(lambda: settings_of(project, journal), verbose, as_json)
    if executor is not None:
        settings.executor = guard(lambda: _executor(executor), verbose, as_json)
    given = guard(lambda: api.param_input(param or [], params_file), verbose, as_json)
    approver = ui.TerminalApprover(approval_timeout, no_color) if ui.can_prompt() else None
    with ui.progress_reporter(quiet, no_color, verbose) as progress:
        return guard(lambda: call(settings, given, approver, progress), verbose, as_json)


def _executor(value: str) -> str:
    """``--executor``, checked (a usage error, exit 2, names what is accepted)."""
    from ..errors import UsageError
    from ..paths import parse_executor

    try:
        return parse_executor(value)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _finish(outcome: Any, as_json: bool, no_color: bool, quiet: bool) -> NoReturn:
    """Print a driven run's notes and manifest; exit with its status (SPEC §9).

    Where progress is plain lines (stderr not a terminal) and not ``--quiet``, the run's
    end is also one line on stderr (:func:`planrun.ui.print_run_end`).
    """
    import sys

    from .. import ui

    for note in outcome.notes:
        ui.err(f"planrun: note: {note}")
    _say_awaiting(outcome.manifest)
    if not quiet and not ui.is_terminal(sys.stderr):
        ui.print_run_end(outcome.manifest)
    if as_json:
        ui.print_json(outcome.manifest)
    else:
        ui.print_manifest(outcome.manifest, no_color=no_color)
    if outcome.error is not None:
        # A bug ended the run failed: it ends as any failed run (manifest, exit 1), with
        # the one-line error on stderr (SPEC §5).
        ui.print_error(outcome.error)
    leave(outcome.exit_code, outcome.abandoned_calls)


def _say_awaiting(m: dict[str, Any]) -> None:
    """A run left ``awaiting_approval``: one message on stderr with the commands (SPEC §10)."""
    from .. import ui

    approval = m.get("approval")
    if m.get("status") != "awaiting_approval" or not approval:
        return
    names = ", ".join(f"{w['step']} ({w['tool']})" for w in approval["waiting"])
    from ..manifest import ran_before_waiting

    ran = ran_before_waiting(m)
    ui.err(f"planrun: awaiting_approval: run {m['run_id']} waits for a person to approve "
           f"{names or 'nothing more'}; {ran}. Approve: {approval['approve']} "
           f"(--resume to continue at once); or deny: {approval['deny']}; then "
           f"{approval['resume']}.")


def resume(
    run: Annotated[str | None, typer.Argument(
        callback=text,
        help="Run id or prefix (default: the most recent interrupted or running run; a "
        "run awaiting approval must be named).",
        autocompletion=lambda ctx, args, incomplete: complete_runs(
            ctx, args, incomplete))] = None,
    explain: Annotated[bool, typer.Option(
        "--explain", help="Print what resume would do per step, and why; change "
        "nothing.")] = False,
    param: ParamOpt = None,
    params_file: ParamsFileOpt = None,
    approve: ApproveOpt = None,
    approve_all: ApproveAllOpt = False,
    approval_timeout: ApprovalTimeoutOpt = None,
    defer_approval: DeferApprovalOpt = False,
    max_parallel: MaxParallelOpt = None,
    executor: ExecutorOpt = None,
    as_json: JsonOpt = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
    quiet: QuietOpt = False,
    no_color: NoColorOpt = False,
) -> None:
    """Continue an interrupted run (or one awaiting approval) without repeating steps."""
    from .. import api, ui

    if explain:
        settings = guard(lambda: settings_of(project, journal), verbose, as_json)
        given = guard(lambda: api.param_input(param or [], params_file), verbose, as_json)
        report = guard(lambda: api.explain(settings, run, given), verbose, as_json)
        if as_json:
            ui.print_json(report)
        else:
            ui.print_explain(report)
        raise typer.Exit(0)
    result = _drive(lambda settings, given, approver, progress: api.resume(
        settings, run, given, approve=approve or [], approve_all=approve_all,
        approver=approver, max_parallel=max_parallel, progress=progress,
        defer_approval=defer_approval), project=project,
        journal=journal, param=param, params_file=params_file,
        approval_timeout=approval_timeout, quiet=quiet, no_color=no_color, verbose=verbose,
        as_json=as_json, executor=executor)
    _finish(result, as_json, no_color, quiet)


def resolve(
    run: RunArg,
    step: Annotated[str, typer.Argument(help="The indeterminate step.", callback=text)],
    succeeded: Annotated[bool, typer.Option(
        "--succeeded", help="Its effect happened: record it as succeeded.")] = False,
    failed: Annotated[bool, typer.Option(
        "--failed", help="Its effect did not happen: record it as failed.")] = False,
    output_json: Annotated[str | None, typer.Option(
        "--output", help="With --succeeded: the step's output, as JSON.",
        metavar="JSON")] = None,
    reason: Annotated[str | None, typer.Option(
        "--reason", help="Why (journaled).", metavar="TEXT", callback=text)] = None,
    item: ItemOpt = None,
    as_json: JsonOpt = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
    no_color: NoColorOpt = False,
) -> None:
    """Settle a step whose effect is unknown, so that resume can continue."""
    from .. import api, ui
    from ..errors import UsageError

    if succeeded and failed:
        fail(UsageError("give only one of --succeeded or --failed"), verbose)
    settings = guard(lambda: settings_of(project, journal), verbose, as_json)
    if not succeeded and not failed:
        def choose() -> None:
            from ..errors import PlanrunError

            try:  # the run's whole id in the commands shown, when it is there
                full = str(api.status(settings, run)["run_id"])
            except PlanrunError:
                full = run
            raise _choice(full, step, item)

        guard(choose, verbose, as_json)
    m = guard(lambda: api.resolve(settings, run, step, succeeded=succeeded,
                                  output=output_json, reason=reason, item=item),
              verbose, as_json)
    if as_json:
        ui.print_json(m)
    else:
        ui.print_manifest(m, no_color=no_color)


def retry(
    run: RunArg,
    param: ParamOpt = None,
    params_file: ParamsFileOpt = None,
    approve: ApproveOpt = None,
    approve_all: ApproveAllOpt = False,
    approval_timeout: ApprovalTimeoutOpt = None,
    max_parallel: MaxParallelOpt = None,
    executor: ExecutorOpt = None,
    keep_going: Annotated[bool, typer.Option(
        "--keep-going", help="After a failure, go on with independent steps.")] = False,
    from_step: Annotated[str | None, typer.Option(
        "--from", help="Run this step and every step after it again, even if they "
        "succeeded (the run may be completed).", metavar="STEP",
        autocompletion=lambda ctx, args, incomplete: complete_run_steps(
            ctx, args, incomplete))] = None,
    defer_approval: DeferApprovalOpt = False,
    as_json: JsonOpt = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
    quiet: QuietOpt = False,
    no_color: NoColorOpt = False,
) -> None:
    """Start a child run of a failed run: inherit succeeded steps, re-run the rest.

    The child keeps the parent's parameters and journaled plan; a new parameter value
    needs a new run (planrun execute).
    """
    from .. import api

    result = _drive(lambda settings, given, approver, progress: api.retry(
        settings, run, given, approve=approve or [], approve_all=approve_all,
        approver=approver, max_parallel=max_parallel, keep_going=keep_going,
        progress=progress, from_step=from_step, defer_approval=defer_approval),
        project=project, journal=journal, param=param,
        params_file=params_file, approval_timeout=approval_timeout, quiet=quiet,
        no_color=no_color, verbose=verbose, as_json=as_json, executor=executor)
    _finish(result, as_json, no_color, quiet)


def _choice(run_id: str, step: str, item: int | None) -> Exception:
    """``resolve`` with no decision (what a run's ``next`` names): the two choices, exit 2.

    It decides nothing. A ``next`` of ``… --succeeded|--failed`` pasted into a shell
    ran ``--succeeded`` piped into a ``--failed`` that is no command: the step was
    recorded as succeeded (found by a fresh operator).
    """
    from ..errors import UsageError

    what = f"step {step}" if item is None else f"item {item} of step {step}"
    where = step if item is None else f"{step} --item {item}"
    return UsageError(
        f"say what became of {what} of run {run_id}: resolve records a person's word on a "
        "call whose effect planrun cannot know",
        hint=f"Check (planrun status {run_id}; planrun log {run_id}), then: planrun resolve "
        f"{run_id} {where} --succeeded [--output JSON] if its effect happened, or planrun "
        f"resolve {run_id} {where} --failed [--reason TEXT] if it did not.")
