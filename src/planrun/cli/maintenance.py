"""Journal maintenance: prune old runs, forget one run, unlock a run's lease."""

from __future__ import annotations

from typing import Annotated

import typer

from .guard import guard, settings_of
from .options import (
    AllProjectsOpt,
    JournalOpt,
    JsonOpt,
    ProjectOpt,
    RunArg,
    StatusOpt,
    VerboseOpt,
)


def prune_runs(
    older_than: Annotated[str, typer.Option(
        "--older-than", help="Runs started longer ago than this: 30d, 12h, 90m, 2w.",
        metavar="AGE")],
    status_: StatusOpt = None,
    plan: Annotated[str | None, typer.Option("--plan", help="Only runs of this plan.")
                    ] = None,
    all_projects: AllProjectsOpt = False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="List what would be deleted; delete nothing.")] = False,
    as_json: JsonOpt = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Delete old runs with everything of theirs (idempotency keys too); reclaim space.

    A run that may still go on (running, interrupted, awaiting approval) is kept unless
    --status names its status.
    """
    from .. import api, ui

    settings = guard(lambda: settings_of(project, journal), verbose, as_json)
    result = guard(lambda: api.prune(settings, older_than=older_than,
                                     status=status_.value if status_ else None, plan=plan,
                                     all_projects=all_projects, dry_run=dry_run),
                   verbose, as_json)
    if as_json:
        ui.print_json(result)
        return
    for r in result["runs"]:
        ui.out(("would delete " if dry_run else "deleted ")
               + f"{r['run_id']}  {r['status']}  {r['plan']}  {r['created_at']}")
    ui.out(f"{len(result['deleted'])} run(s) {'would be ' if dry_run else ''}deleted"
           + ("" if dry_run else f", {result['keys']} idempotency key(s) with them"))
    kept = result["kept_unfinished"]
    if kept:
        ui.out(f"kept {len(kept)} unfinished run(s) ({', '.join(kept[:3])}"
               + (", …" if len(kept) > 3 else "") + "): each may still go on (planrun "
               "status RUN says what next: one may be running now), or name their status "
               "with --status to delete them")


def forget(
    run: RunArg,
    as_json: JsonOpt = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Delete one run with everything of its (idempotency keys too); reclaim space."""
    from .. import api, ui

    settings = guard(lambda: settings_of(project, journal), verbose, as_json)
    result = guard(lambda: api.forget(settings, run), verbose, as_json)
    if as_json:
        ui.print_json(result)
    else:
        ui.out(f"deleted run {result['deleted'][0]} ({result['events']} event(s), "
               f"{result['keys']} idempotency key(s))")


def unlock(
    run: RunArg,
    as_json: JsonOpt = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Release a run's lease held by a process that cannot be proven dead (another host)."""
    from .. import api, ui

    settings = guard(lambda: settings_of(project, journal), verbose, as_json)
    result = guard(lambda: api.unlock(settings, run), verbose, as_json)
    if as_json:
        ui.print_json(result)
    elif result["owner"]:
        ui.out(f"released the lease of run {result['run_id']} held by {result['owner']}")
    else:
        ui.out(f"run {result['run_id']} had no lease")
