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
    vacuum: Annotated[bool, typer.Option(
        "--vacuum", help="Then rewrite the SQLite journal to give all free space back "
        "(other runs' journal writes wait for it: run it when none is going).")] = False,
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
                                     all_projects=all_projects, dry_run=dry_run,
                                     vacuum=vacuum),
                   verbose, as_json)
    if as_json:
        ui.print_json(result)
        return
    for r in result["runs"]:
        ui.out(("would delete " if dry_run else "deleted ")
               + f"{r['run_id']}  {r['status']}  {r['plan']}  {r['created_at']}")
    ui.out(f"{len(result['deleted'])} run(s) {'would be ' if dry_run else ''}deleted"
           + ("" if dry_run else f", {result['keys']} idempotency key(s) with them"
              + ("" if vacuum else _space(result))))
    if vacuum and not dry_run:
        # what --vacuum did, also with nothing to delete (it said nothing; found by a
        # fresh operator)
        if result["free_bytes"]:
            ui.out(f"could not rewrite the journal now (another process is using it): "
                   f"{_size(result['free_bytes'])} stay free inside it, for later runs; "
                   "run planrun prune --older-than AGE --vacuum again when no run is going")
        else:
            ui.out(f"rewrote the journal: {_size(result['reclaimed_bytes'])} given back to "
                   "the disk")
        return
    _free_hint(result)
    kept = result["kept_unfinished"]
    if kept:
        ui.out(f"kept {len(kept)} unfinished run(s) ({', '.join(kept[:3])}"
               + (", …" if len(kept) > 3 else "") + "): each may still go on (planrun "
               "status RUN says what next: one may be running now), or name their status "
               "with --status to delete them")


#: Free space left inside a journal from which prune says how to give it back (bytes).
FREE_HINT_BYTES = 1 << 20


def _size(n: int) -> str:
    """``n`` bytes for a person: ``12.3 MiB`` (KiB, MiB or GiB), ``0 bytes``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


def _space(result: dict[str, int]) -> str:
    """``; 1.6 GiB given back to the disk``, or nothing when no space was."""
    freed = result["reclaimed_bytes"]
    return f"; {_size(freed)} given back to the disk" if freed else ""


def _free_hint(result: dict[str, int]) -> None:
    """Say how to give back the space left free inside the journal, when it is much."""
    from .. import ui

    if result["free_bytes"] >= FREE_HINT_BYTES:
        ui.out(f"{_size(result['free_bytes'])} stay free inside the journal (later runs "
               "reuse it); planrun prune --older-than AGE --vacuum rewrites the file to "
               "give it back to the disk (other runs' journal writes wait for it: run it "
               "when none is going)")


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
               f"{result['keys']} idempotency key(s)){_space(result)}")
        _free_hint(result)


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
