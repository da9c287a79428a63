"""Commands about plans, tools and the project.

validate, show, graph, tools, schema, init, plans, policy check.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from .completion import complete_plans
from .guard import fail, guard, settings_of
from .options import (
    Format,
    FormatOpt,
    GraphFormat,
    JournalOpt,
    JsonOpt,
    NoColorOpt,
    ParamOpt,
    ParamsFileOpt,
    PlanArg,
    ProjectOpt,
    ReportQuietOpt,
    SchemaKind,
    StrictOpt,
    VerboseOpt,
)


def validate(
    plans: Annotated[list[str] | None, typer.Argument(
        help="Plan names or files (default: every plan in the plans folder); '-' reads "
        "one plan (YAML or JSON) from standard input.",
        autocompletion=lambda ctx, args, incomplete: complete_plans(
            ctx, args, incomplete))] = None,
    fmt: FormatOpt = Format.text,
    strict: StrictOpt = False,
    param: ParamOpt = None,
    params_file: ParamsFileOpt = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="The report as JSON (same as --format json).")] = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
    quiet: ReportQuietOpt = False,
    no_color: NoColorOpt = False,
) -> None:
    """Check the registry and plans without calling any tool (exit 0 valid, 3 refused)."""
    from .. import api
    from ..errors import PlanrunError, Refused, UsageError
    from ..ui import print_error, print_report

    if as_json:
        if fmt not in (Format.text, Format.json):
            fail(UsageError(f"--json and --format {fmt.value} disagree; give one"), verbose)
        fmt = Format.json
    stdin = _read_stdin(plans or [], verbose)

    try:
        settings = settings_of(project, journal)
        given = api.param_input(param or [], params_file)
    except Refused as exc:  # a bad planrun.toml or params file: the report, as asked
        if isinstance(exc.report, api.Report):
            print_report(exc.report, fmt.value, strict=strict)
        print_error(exc, verbose)
        raise typer.Exit(exc.exit_code) from None
    except PlanrunError as exc:
        fail(exc, verbose)
    report = guard(lambda: api.validate(settings, plans or [], given, stdin=stdin), verbose)
    print_report(report, fmt.value, strict=strict, quiet=quiet)
    raise typer.Exit(0 if report.ok(strict=strict) else 3)


def _read_stdin(names: list[str], verbose: bool) -> bytes | None:
    """The bytes of standard input when ``-`` is among ``names`` (else None).

    A terminal on stdin, or ``-`` named twice, is a usage error (exit 2): nothing waits
    on a person typing a plan.
    """
    from .. import api
    from ..errors import UsageError

    if "-" not in names:
        return None
    if names.count("-") > 1:
        fail(UsageError("'-' (the plan on standard input) can be named only once"), verbose)
    if sys.stdin is None or sys.stdin.isatty():
        fail(UsageError("'-' reads a plan from standard input, which is a terminal; pipe "
                        "a plan in (planrun validate - < plan.yaml)"), verbose)
    return api.read_plan_input(sys.stdin.buffer)


def show(
    plan: PlanArg,
    param: ParamOpt = None,
    params_file: ParamsFileOpt = None,
    as_json: JsonOpt = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Show a plan: parameters, steps in run order, which need approval and why."""
    from .. import api, ui

    settings = guard(lambda: settings_of(project, journal), verbose, as_json)
    given = guard(lambda: api.param_input(param or [], params_file), verbose, as_json)
    checked = guard(lambda: api.plan_for_viewing(settings, plan, given), verbose, as_json)
    data = api.describe_plan(checked)
    warnings = api.grant_warnings(checked)
    for issue in warnings:
        ui.err(ui.issue_line(issue))
    if as_json:
        data["warnings"] = [i.to_json() for i in warnings]
        ui.print_json(data)
    else:
        ui.print_plan(data)


def graph(
    plan: PlanArg,
    fmt: Annotated[GraphFormat, typer.Option("--format", help="Graph language.")
                   ] = GraphFormat.mermaid,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Print a plan's dependency graph (Mermaid or Graphviz DOT)."""
    from .. import api

    settings = guard(lambda: settings_of(project, journal), verbose)
    checked = guard(lambda: api.plan_for_viewing(settings, plan), verbose)
    sys.stdout.write(api.render_graph(checked, fmt.value))


def tools(
    as_json: JsonOpt = False,
    allowed: Annotated[bool, typer.Option(
        "--allowed", help="Only the tools the policy lets a plan use (the registry ∩ "
        "allowed_tools, less refused classes): what a planner may use.")] = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """List the registered tools with their arguments and flags."""
    from .. import api, ui

    settings = guard(lambda: settings_of(project, journal), verbose, as_json)
    registry = guard(lambda: api.load_registry(settings), verbose, as_json)
    data = api.describe_tools(registry, allowed=allowed)
    if as_json:
        ui.print_json(data)
    else:
        ui.print_tools(data)


def schema(
    kind: Annotated[SchemaKind, typer.Argument(help="plan or tools.")],
) -> None:
    """Print the JSON Schema of the plan format or of tools.yaml (for editors)."""
    from .. import api, ui

    ui.print_json(api.json_schema(kind.value))


def init(
    folder: Annotated[str, typer.Argument(help="Where to create the project.")] = ".",
    verbose: VerboseOpt = False,
) -> None:
    """Create a starter project (planrun.toml, tools.yaml, plans/hello.yaml)."""
    from pathlib import Path

    from .. import api, ui

    written = guard(lambda: api.init_project(folder), verbose)
    for path in written:
        ui.out(f"created {path}")
    go = "" if Path(folder).resolve() == Path.cwd().resolve() else f"cd {folder} && "
    ui.out(f"next: {go}planrun validate && planrun execute hello")


def plans(
    as_json: JsonOpt = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """List the plans: name, revision, goal, steps, which need approval."""
    from .. import api, ui

    settings = guard(lambda: settings_of(project, journal), verbose, as_json)
    rows = guard(lambda: api.plans(settings), verbose, as_json)
    if as_json:
        ui.print_json(rows)
    else:
        ui.print_plans(rows)


def policy_check(
    strict: StrictOpt = False,
    fmt: FormatOpt = Format.text,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Lint the policy: unknown tools, empty classes, expired grants, unclearable tools."""
    from .. import api
    from ..ui import print_report

    settings = guard(lambda: settings_of(project, journal), verbose)
    report = api.policy_check(settings)
    print_report(report, fmt.value, strict=strict)
    raise typer.Exit(0 if report.ok(strict=strict) else 3)
