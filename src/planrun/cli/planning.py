"""``planrun plan``: ask a planner for a plan for a goal (SPEC §10)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Annotated, Any

import typer

from .guard import guard, settings_of
from .options import (
    JournalOpt,
    JsonOpt,
    NoColorOpt,
    ParamOpt,
    ParamsFileOpt,
    ProjectOpt,
    QuietOpt,
    VerboseOpt,
    text,
)

PlannerOpt = Annotated[str | None, typer.Option(
    "--planner", help="cmd:ARGV (no shell), python:module:callable, or a [planners] name "
    "of planrun.toml.", metavar="PLANNER", callback=text)]
MaxRoundsOpt = Annotated[int | None, typer.Option(
    "--max-rounds", help="Ask at most this many times (default: the planner's max_rounds, "
    "else 3).", min=1, max=1000)]


def plan(
    goal: Annotated[str, typer.Argument(help="What the plan is for (given to the planner).",
                                        callback=text)],
    planner: PlannerOpt = None,
    name: Annotated[str | None, typer.Option(
        "--name", help="The plan's name and file (default: the plan's own name, else a "
        "slug of the goal).", callback=text)] = None,
    max_rounds: MaxRoundsOpt = None,
    param: ParamOpt = None,
    params_file: ParamsFileOpt = None,
    out: Annotated[str | None, typer.Option(
        "--out", help="Write the plan to this file instead of plans/NAME.yaml.",
        metavar="FILE")] = None,
    as_json: JsonOpt = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
    quiet: QuietOpt = False,
    no_color: NoColorOpt = False,
) -> None:
    """Ask a planner for a plan; validate it, send the report back, write the valid one."""
    from .. import api
    from ..errors import UsageError
    from .guard import fail

    if planner is None:
        fail(UsageError("planrun plan needs --planner PLANNER",
                        hint="e.g. --planner 'cmd:python3 planners/backup_planner.py'"),
             verbose)
    settings = guard(lambda: settings_of(project, journal), verbose, as_json)
    given = guard(lambda: api.param_input(param or [], params_file), verbose, as_json)
    with said_if_interrupted("no plan was written"):
        done = guard(lambda: api.plan(settings, goal, planner, name=name,
                                      max_rounds=max_rounds, given=given, out=out,
                                      on_round=None if quiet else round_note),
                     verbose, as_json)
    report_planned(done, as_json=as_json, quiet=quiet)


@contextlib.contextmanager
def said_if_interrupted(what: str) -> Iterator[None]:
    """One line on stderr when SIGINT or SIGTERM stops a planner's rounds (then re-raised).

    The planner's process group is ended and the session journaled ``refused``; planrun
    exited 130 or 143 without a word, also in a cron log (found by a fresh operator).
    """
    from .. import ui

    try:
        yield
    except KeyboardInterrupt:
        ui.err(f"planrun: interrupted (SIGINT) while asking the planner: it was stopped and "
               f"{what}")
        raise
    except SystemExit as exc:
        if exc.code == 143:
            ui.err(f"planrun: interrupted (SIGTERM) while asking the planner: it was stopped "
                   f"and {what}")
        raise


def round_note(round_no: int, report: Any) -> None:
    """One line on stderr per round: refused (with its issue codes) or accepted."""
    from .. import ui

    if report is None:
        ui.err(f"planrun: round {round_no}: plan accepted")
        return
    codes = sorted({i.code for i in report.issues if i.severity == "error"})
    ui.err(f"planrun: round {round_no}: refused ({len(report.issues)} issue(s): "
           f"{', '.join(codes)})")


def report_planned(done: Any, *, as_json: bool, quiet: bool, show: bool = True) -> None:
    """Print what ``plan`` wrote: the plan (or ``--json``) on stdout, a note on stderr."""
    from .. import ui

    for issue in done.warnings:
        ui.err(ui.issue_line(issue))
    if not quiet:
        what = (f"revision {done.revision} (was {done.previous_revision})"
                if done.previous_revision is not None else "revision 1 (new)")
        ui.err(f"planrun: wrote plan {done.name!r} {what} to {done.to_json()['file']} in "
               f"{done.rounds} round(s); planrun log {done.run_id} shows how it came to be")
    if as_json:
        ui.print_json(done.to_json())
    elif show:
        ui.out(done.text.rstrip("\n"))
