"""Commands that read runs from the journal: status, runs, log, output, report."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

import typer

from .guard import guard, settings_of
from .options import (
    AllProjectsOpt,
    ItemOpt,
    JournalOpt,
    JsonOpt,
    LatestRunArg,
    NoColorOpt,
    PlanFilterOpt,
    ProjectOpt,
    QuietOpt,
    StatusOpt,
    StepArg,
    VerboseOpt,
)


def status(
    run: LatestRunArg = "last",
    as_json: JsonOpt = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
    no_color: NoColorOpt = False,
) -> None:
    """Show a run's manifest (default: this project's latest run)."""
    from .. import api, ui

    settings = guard(lambda: settings_of(project, journal), verbose, as_json)
    m = guard(lambda: api.status(settings, run), verbose, as_json)
    if as_json:
        ui.print_json(m)
    else:
        ui.print_manifest(m, no_color=no_color)


def runs(
    plan: PlanFilterOpt = None,
    status_: StatusOpt = None,
    limit: Annotated[int | None, typer.Option("--limit", help="At most this many.",
                                              min=1, max=2**63 - 1)] = None,
    all_projects: AllProjectsOpt = False,
    as_json: JsonOpt = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """List this project's runs, newest first (--all: every project's)."""
    from .. import api, ui

    settings = guard(lambda: settings_of(project, journal), verbose, as_json)
    rows = guard(lambda: api.runs(settings, plan=plan,
                                  status=status_.value if status_ else None, limit=limit,
                                  all_projects=all_projects),
                 verbose, as_json)
    if as_json:
        ui.print_json(rows)
    else:
        from pathlib import Path

        from ..journal.backends import shown_location
        from ..paths import probe

        missing = isinstance(settings.journal, Path) and not probe(settings.journal)
        ui.print_runs(rows, here=api.project_key(settings) if not all_projects else None,
                      journal=shown_location(settings.journal), missing=missing)


def _without_tracebacks(event: dict[str, Any]) -> dict[str, Any]:
    if isinstance(event["data"], dict):
        event["data"].pop("traceback", None)
    return event


def log(
    run: LatestRunArg = "last",
    tracebacks: Annotated[bool, typer.Option("--tracebacks", help="Show tools' "
                                             "tracebacks.")] = False,
    follow: Annotated[bool, typer.Option(
        "-f", "--follow", help="Keep printing new events until the run ends (--json: one "
        "JSON object per line).")] = False,
    as_json: JsonOpt = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Show a run's events in order (default: this project's latest run)."""
    from .. import api, ui

    settings = guard(lambda: settings_of(project, journal), verbose, as_json)
    if follow:
        def ended(run_id: str, status: str) -> None:
            if status == "not driven":  # a silent end would read as "it finished"
                ui.err(f"planrun: run {run_id} is still running but nobody drives it (its "
                       f"process is gone); planrun status {run_id} says what next")

        events_iter = api.follow(settings, run, ended=ended)
        while True:
            event = guard(lambda: next(events_iter, None), verbose, as_json)
            if event is None:
                raise typer.Exit(0)
            if as_json:
                ui.print_json_line(event if tracebacks else _without_tracebacks(event))
            else:
                ui.print_events([event], tracebacks)
    # a page of events at a time, each printed as it comes: a run's events in memory at
    # once took 680 MB for a 100,000-item fan-out (found by attack)
    stream = api.log_stream(settings, run)

    def events() -> Iterator[dict[str, Any]]:
        while True:
            event = guard(lambda: next(stream, None), verbose, as_json)
            if event is None:
                return
            yield event if tracebacks or not as_json else _without_tracebacks(event)

    if as_json:
        ui.print_json_array(events())
    else:
        ui.print_events(events(), tracebacks)


def output(
    run: LatestRunArg,
    step: StepArg = None,
    item: ItemOpt = None,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Print one step's output as JSON on stdout: output [RUN] STEP (RUN: default last)."""
    from .. import api, ui

    if step is None:
        run, step = "last", run
    settings = guard(lambda: settings_of(project, journal), verbose)
    value = guard(lambda: api.output(settings, run, step, item), verbose)
    ui.print_json(value)


def report(
    run: LatestRunArg = "last",
    out: Annotated[str | None, typer.Option(
        "-o", "--out", help="Write the page here (default: planrun-report-RUNID.html in "
        "the current folder; - for stdout).", metavar="FILE")] = None,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Write a run as one self-contained HTML file (default: this project's latest run)."""
    import sys

    from .. import api

    settings = guard(lambda: settings_of(project, journal), verbose)
    run_id, page = guard(lambda: api.report(settings, run), verbose)
    if out == "-":
        sys.stdout.write(page)
        return
    from ..report import report_file, save

    written = guard(lambda: save(out or report_file(run_id), page), verbose)
    if not quiet:
        typer.echo(str(written))
