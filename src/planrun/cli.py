"""The ``planrun`` command line (Typer): parse, call :mod:`planrun.api`, render.

No SQL, no jsonschema, no business logic here. Heavy modules are imported inside the
commands that need them so that ``planrun --help`` starts fast. Every
:class:`~planrun.errors.PlanrunError` becomes one message on stderr and the exit status of
SPEC §9; anything else is a bug and shows a traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Any, NoReturn, TypeVar

import typer

from . import __version__

app = typer.Typer(
    name="planrun",
    help="Validate, approve, run and resume plans of tool calls, journaled in SQLite.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    add_completion=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)

T = TypeVar("T")

# --- common options (accepted after the command name) ------------------------------------

JournalOpt = Annotated[str | None, typer.Option(
    "--journal", help="Journal file (default: $PLANRUN_JOURNAL, planrun.toml, or the user "
    "data folder).", metavar="PATH")]
ProjectOpt = Annotated[str | None, typer.Option(
    "-C", "--project", help="Project folder (default: where planrun.toml is found).",
    metavar="DIR")]
VerboseOpt = Annotated[bool, typer.Option("-v", "--verbose", help="More detail on errors.")]
QuietOpt = Annotated[bool, typer.Option("-q", "--quiet", help="Print only results and "
                                        "errors.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON on stdout.")]
NoColorOpt = Annotated[bool, typer.Option("--no-color", help="No colour (also NO_COLOR).")]
ParamOpt = Annotated[list[str] | None, typer.Option(
    "-p", "--param", help="A parameter value, NAME=VALUE (parsed by its declared type); "
    "repeatable.", metavar="NAME=VALUE")]
ParamsFileOpt = Annotated[str | None, typer.Option(
    "--params-file", help="YAML or JSON file of parameter values.", metavar="FILE")]


RunArg = Annotated[str, typer.Argument(help="Run id or unique prefix (4+ characters).",
                                       autocompletion=lambda incomplete: _complete_runs(
                                           incomplete))]
ApproveOpt = Annotated[list[str] | None, typer.Option(
    "--approve", help="Clear this step without asking; repeatable.", metavar="STEP")]
ApproveAllOpt = Annotated[bool, typer.Option(
    "--approve-all", help="Clear every step that needs approval.")]
ApprovalTimeoutOpt = Annotated[float | None, typer.Option(
    "--approval-timeout", help="On a terminal, deny when nobody answers in this many "
    "seconds.", metavar="SECONDS", min=0)]
MaxParallelOpt = Annotated[int | None, typer.Option(
    "--max-parallel", help="Calls running at once (default: as journaled).", min=1)]


class Format(StrEnum):
    """Report formats of ``planrun validate``."""

    text = "text"
    json = "json"
    github = "github"


def _fail(exc: Any, verbose: bool) -> NoReturn:
    from .ui import print_error

    print_error(exc, verbose)
    raise typer.Exit(exc.exit_code)


def _settings(project: str | None, journal: str | None) -> Any:
    from .paths import load_settings

    return load_settings(project=project, journal=journal)


def _guard(fn: Callable[[], T], verbose: bool = False, as_json: bool = False) -> T:
    """Run ``fn``; turn a PlanrunError into its message and exit status."""
    from .errors import PlanrunError, Refused

    try:
        return fn()
    except Refused as exc:
        from .issues import Report
        from .ui import print_error, print_json, print_report

        if isinstance(exc.report, Report):
            if as_json:
                print_json({"ok": False, "error": {"code": exc.code, "message": exc.message},
                            **exc.report.to_json()})
            else:
                print_report(exc.report, "text", stream=sys.stderr)
        print_error(exc, verbose)
        raise typer.Exit(exc.exit_code) from None
    except PlanrunError as exc:
        if as_json:
            from .ui import print_json

            print_json({"ok": False, "error": {"code": exc.code, "message": exc.message,
                                               "hint": exc.hint}})
        _fail(exc, verbose)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"planrun {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
    project: Annotated[str | None, typer.Option(
        "-C", "--project", help="Project folder (also accepted after the command).",
        metavar="DIR")] = None,
    journal: Annotated[str | None, typer.Option(
        "--journal", help="Journal file (also accepted after the command).",
        metavar="PATH")] = None,
) -> None:
    """Validate, approve, run and resume plans of tool calls, journaled in SQLite."""
    # Given before the command, they act like the environment: an option given after the
    # command still wins (flag > environment > planrun.toml).
    if project is not None:
        os.environ["PLANRUN_PROJECT"] = project
    if journal is not None:
        os.environ["PLANRUN_JOURNAL"] = journal


@app.command()
def validate(
    plans: Annotated[list[str] | None, typer.Argument(
        help="Plan names or files (default: every plan in the plans folder).",
        autocompletion=lambda incomplete: _complete_plans(incomplete))] = None,
    fmt: Annotated[Format, typer.Option("--format", help="Report format.")] = Format.text,
    strict: Annotated[bool, typer.Option("--strict", help="Warnings fail too.")] = False,
    param: ParamOpt = None,
    params_file: ParamsFileOpt = None,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
    quiet: QuietOpt = False,
    no_color: NoColorOpt = False,
) -> None:
    """Check the registry and plans without calling any tool (exit 0 valid, 3 refused)."""
    from . import api
    from .errors import PlanrunError, Refused
    from .issues import Report
    from .ui import print_error, print_report

    try:
        settings = _settings(project, journal)
        given = api.param_input(param or [], params_file)
    except Refused as exc:  # a bad planrun.toml or params file: the report, as asked
        if isinstance(exc.report, Report):
            print_report(exc.report, fmt.value, strict=strict)
        print_error(exc, verbose)
        raise typer.Exit(exc.exit_code) from None
    except PlanrunError as exc:
        _fail(exc, verbose)
    report = _guard(lambda: api.validate(settings, plans or [], given), verbose)
    print_report(report, fmt.value, strict=strict)
    raise typer.Exit(0 if report.ok(strict=strict) else 3)


@app.command()
def execute(
    plan: PlanArg,
    param: ParamOpt = None,
    params_file: ParamsFileOpt = None,
    approve: ApproveOpt = None,
    approve_all: ApproveAllOpt = False,
    approval_timeout: ApprovalTimeoutOpt = None,
    max_parallel: MaxParallelOpt = None,
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
    from . import api, ui

    result = _drive(lambda settings, given, approver, progress: api.execute(
        settings, plan, given, approve=approve or [], approve_all=approve_all,
        approver=approver, max_parallel=max_parallel, keep_going=keep_going,
        dry_run=dry_run, progress=progress), project=project, journal=journal, param=param,
        params_file=params_file, approval_timeout=approval_timeout, quiet=quiet,
        no_color=no_color, verbose=verbose, as_json=as_json)
    if isinstance(result, api.DryRun):
        for issue in api.grant_warnings(result.plan):
            ui.err(ui.issue_line(issue))
        if as_json:
            ui.print_json({"plan": result.plan.name, "order": result.order,
                           "approvals": [r.step_id for r in result.approvals]})
        else:
            ui.print_dry_run(result)
        raise typer.Exit(0)
    _finish(result, as_json, no_color)


def _drive(call: Callable[[Any, Any, Any, Any], T], *, project: str | None,
           journal: str | None, param: list[str] | None, params_file: str | None,
           approval_timeout: float | None, quiet: bool, no_color: bool, verbose: bool,
           as_json: bool) -> T:
    """The common part of execute, resume and retry.

    Settings, parameters, the person at the terminal (if any), live progress; then
    ``call(settings, given, approver, progress)``.
    """
    from . import api, ui

    settings = _guard(lambda: _settings(project, journal), verbose, as_json)
    given = _guard(lambda: api.param_input(param or [], params_file), verbose, as_json)
    approver = ui.TerminalApprover(approval_timeout, no_color) if ui.can_prompt() else None
    with ui.progress_reporter(quiet, no_color) as progress:
        return _guard(lambda: call(settings, given, approver, progress), verbose, as_json)


def _finish(manifest: dict[str, Any], as_json: bool, no_color: bool) -> NoReturn:
    from . import ui

    abandoned = manifest.pop("_abandoned_calls", 0)
    signal_exit = manifest.pop("_exit", None)
    for note in manifest.pop("_notes", []):
        ui.err(f"planrun: note: {note}")
    if as_json:
        ui.print_json(manifest)
    else:
        ui.print_manifest(manifest, no_color=no_color)
    code = 0 if manifest["status"] == "completed" else 1
    if signal_exit is not None:
        code = signal_exit
    if abandoned:
        # A python tool call that timed out is still running in a thread; do not wait.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise typer.Exit(code)


@app.command()
def resume(
    run: Annotated[str | None, typer.Argument(
        help="Run id or prefix (default: the most recent interrupted or running run).",
        autocompletion=lambda incomplete: _complete_runs(incomplete))] = None,
    explain: Annotated[bool, typer.Option(
        "--explain", help="Print what resume would do per step, and why; change "
        "nothing.")] = False,
    param: ParamOpt = None,
    params_file: ParamsFileOpt = None,
    approve: ApproveOpt = None,
    approve_all: ApproveAllOpt = False,
    approval_timeout: ApprovalTimeoutOpt = None,
    max_parallel: MaxParallelOpt = None,
    as_json: JsonOpt = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
    quiet: QuietOpt = False,
    no_color: NoColorOpt = False,
) -> None:
    """Continue an interrupted run without repeating finished steps."""
    from . import api, lifecycle, ui

    if explain:
        settings = _guard(lambda: _settings(project, journal), verbose, as_json)
        given = _guard(lambda: api.param_input(param or [], params_file), verbose, as_json)
        report = _guard(lambda: lifecycle.explain(settings, run, given), verbose, as_json)
        if as_json:
            ui.print_json(report)
        else:
            ui.print_explain(report)
        raise typer.Exit(0)
    result = _drive(lambda settings, given, approver, progress: lifecycle.resume(
        settings, run, given, approve=approve or [], approve_all=approve_all,
        approver=approver, max_parallel=max_parallel, progress=progress), project=project,
        journal=journal, param=param, params_file=params_file,
        approval_timeout=approval_timeout, quiet=quiet, no_color=no_color, verbose=verbose,
        as_json=as_json)
    _finish(result, as_json, no_color)


@app.command()
def resolve(
    run: RunArg,
    step: Annotated[str, typer.Argument(help="The indeterminate step.")],
    succeeded: Annotated[bool, typer.Option(
        "--succeeded", help="Its effect happened: record it as succeeded.")] = False,
    failed: Annotated[bool, typer.Option(
        "--failed", help="Its effect did not happen: record it as failed.")] = False,
    output_json: Annotated[str | None, typer.Option(
        "--output", help="With --succeeded: the step's output, as JSON.",
        metavar="JSON")] = None,
    reason: Annotated[str | None, typer.Option(
        "--reason", help="Why (journaled).", metavar="TEXT")] = None,
    item: Annotated[int | None, typer.Option(
        "--item", help="A fan-out item's index.", min=0)] = None,
    as_json: JsonOpt = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
    no_color: NoColorOpt = False,
) -> None:
    """Settle a step whose effect is unknown, so that resume can continue."""
    from . import lifecycle, ui
    from .errors import UsageError

    if succeeded == failed:
        _fail(UsageError("give exactly one of --succeeded or --failed"), verbose)
    settings = _guard(lambda: _settings(project, journal), verbose, as_json)
    m = _guard(lambda: lifecycle.resolve(settings, run, step, succeeded=succeeded,
                                         output=output_json, reason=reason, item=item),
               verbose, as_json)
    if as_json:
        ui.print_json(m)
    else:
        ui.print_manifest(m, no_color=no_color)


@app.command()
def retry(
    run: RunArg,
    param: ParamOpt = None,
    params_file: ParamsFileOpt = None,
    approve: ApproveOpt = None,
    approve_all: ApproveAllOpt = False,
    approval_timeout: ApprovalTimeoutOpt = None,
    max_parallel: MaxParallelOpt = None,
    keep_going: Annotated[bool, typer.Option(
        "--keep-going", help="After a failure, go on with independent steps.")] = False,
    as_json: JsonOpt = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
    quiet: QuietOpt = False,
    no_color: NoColorOpt = False,
) -> None:
    """Start a child run of a failed run: inherit succeeded steps, re-run the rest."""
    from . import lifecycle

    result = _drive(lambda settings, given, approver, progress: lifecycle.retry(
        settings, run, given, approve=approve or [], approve_all=approve_all,
        approver=approver, max_parallel=max_parallel, keep_going=keep_going,
        progress=progress), project=project, journal=journal, param=param,
        params_file=params_file, approval_timeout=approval_timeout, quiet=quiet,
        no_color=no_color, verbose=verbose, as_json=as_json)
    _finish(result, as_json, no_color)


@app.command()
def unlock(
    run: RunArg,
    as_json: JsonOpt = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Release a run's lease held by a process that cannot be proven dead (another host)."""
    from . import lifecycle, ui

    settings = _guard(lambda: _settings(project, journal), verbose, as_json)
    result = _guard(lambda: lifecycle.unlock(settings, run), verbose, as_json)
    if as_json:
        ui.print_json(result)
    elif result["owner"]:
        ui.out(f"released the lease of run {result['run_id']} held by {result['owner']}")
    else:
        ui.out(f"run {result['run_id']} had no lease")


def _complete_plans(incomplete: str) -> list[str]:
    """Plan names of the project found from the current folder (empty on any problem)."""
    try:
        from .paths import load_settings, plan_names

        return [n for n in plan_names(load_settings().plans_dir) if n.startswith(incomplete)]
    except Exception:  # completion must never fail loudly
        return []


def _complete_runs(incomplete: str) -> list[str]:
    """Recent run ids from the journal (read-only; empty on any problem)."""
    try:
        from .journal import Journal
        from .paths import load_settings

        with Journal(load_settings().journal, write=False) as journal:
            return [r["run_id"] for r in journal.list_runs(limit=50)
                    if r["run_id"].startswith(incomplete)]
    except Exception:  # completion must never fail loudly
        return []


PlanArg = Annotated[str, typer.Argument(help="Plan name (in the plans folder) or file path.",
                                        autocompletion=_complete_plans)]


class RunStatus(StrEnum):
    """Run statuses (SPEC §5)."""

    running = "running"
    completed = "completed"
    failed = "failed"
    interrupted = "interrupted"
    denied = "denied"
    refused = "refused"


class GraphFormat(StrEnum):
    """Formats of ``planrun graph``."""

    mermaid = "mermaid"
    dot = "dot"


class SchemaKind(StrEnum):
    """File formats ``planrun schema`` describes."""

    plan = "plan"
    tools = "tools"


class Shell(StrEnum):
    """Shells ``planrun completion`` writes a script for."""

    bash = "bash"
    zsh = "zsh"
    fish = "fish"


@app.command()
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
    from . import api, ui, views

    settings = _guard(lambda: _settings(project, journal), verbose, as_json)
    given = _guard(lambda: api.param_input(param or [], params_file), verbose, as_json)
    checked = _guard(lambda: api.plan_for_viewing(settings, plan, given), verbose, as_json)
    data = views.describe_plan(checked)
    warnings = api.grant_warnings(checked)
    for issue in warnings:
        ui.err(ui.issue_line(issue))
    if as_json:
        data["warnings"] = [i.to_json() for i in warnings]
        ui.print_json(data)
    else:
        ui.print_plan(data)


@app.command()
def graph(
    plan: PlanArg,
    fmt: Annotated[GraphFormat, typer.Option("--format", help="Graph language.")
                   ] = GraphFormat.mermaid,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Print a plan's dependency graph (Mermaid or Graphviz DOT)."""
    from . import api, views

    settings = _guard(lambda: _settings(project, journal), verbose)
    checked = _guard(lambda: api.plan_for_viewing(settings, plan), verbose)
    sys.stdout.write(views.render_graph(checked, fmt.value))


@app.command()
def tools(
    as_json: JsonOpt = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """List the registered tools with their arguments and flags."""
    from . import api, ui, views

    settings = _guard(lambda: _settings(project, journal), verbose, as_json)
    registry = _guard(lambda: api.load_registry(settings), verbose, as_json)
    data = views.describe_tools(registry)
    if as_json:
        ui.print_json(data)
    else:
        ui.print_tools(data)


@app.command()
def schema(
    kind: Annotated[SchemaKind, typer.Argument(help="plan or tools.")],
) -> None:
    """Print the JSON Schema of the plan format or of tools.yaml (for editors)."""
    from . import ui, views

    ui.print_json(views.json_schema(kind.value))


@app.command()
def init(
    folder: Annotated[str, typer.Argument(help="Where to create the project.")] = ".",
    verbose: VerboseOpt = False,
) -> None:
    """Create a starter project (planrun.toml, tools.yaml, plans/hello.yaml)."""
    from pathlib import Path

    from . import ui, views

    written = _guard(lambda: views.init_project(Path(folder)), verbose)
    for path in written:
        ui.out(f"created {path}")
    go = "" if Path(folder).resolve() == Path.cwd().resolve() else f"cd {folder} && "
    ui.out(f"next: {go}planrun validate && planrun execute hello")


@app.command(hidden=True)
def completion(
    shell: Annotated[Shell, typer.Argument(help="bash, zsh or fish.")],
) -> None:
    """Print the shell completion script (the files in completions/ are this output)."""
    from typer._completion_shared import get_completion_script

    script = get_completion_script(prog_name="planrun", complete_var="_PLANRUN_COMPLETE",
                                   shell=shell.value).rstrip("\n") + "\n"
    if shell is Shell.zsh:
        # Installed in $fpath as `_planrun`, zsh runs this file on the first Tab: complete
        # that Tab too, not only the following ones.
        script += ('if [[ "${funcstack[1]}" == "_planrun" ]]; then\n'
                   '  _planrun_completion "$@"\nfi\n')
    sys.stdout.write(script)


policy_app = typer.Typer(help="Inspect the [policy] of planrun.toml.", no_args_is_help=True)
app.add_typer(policy_app, name="policy")


@policy_app.command("check")
def policy_check(
    strict: Annotated[bool, typer.Option("--strict", help="Warnings fail too.")] = False,
    fmt: Annotated[Format, typer.Option("--format", help="Report format.")] = Format.text,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Lint the policy: unknown tools, empty classes, expired grants, unclearable tools."""
    from . import api
    from .ui import print_report

    settings = _guard(lambda: _settings(project, journal), verbose)
    report = api.policy_check(settings)
    print_report(report, fmt.value, strict=strict)
    raise typer.Exit(0 if report.ok(strict=strict) else 3)


@app.command()
def status(
    run: RunArg,
    as_json: JsonOpt = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
    no_color: NoColorOpt = False,
) -> None:
    """Show a run's manifest."""
    from . import api, ui

    settings = _guard(lambda: _settings(project, journal), verbose, as_json)
    m = _guard(lambda: api.status(settings, run), verbose, as_json)
    if as_json:
        ui.print_json(m)
    else:
        ui.print_manifest(m, no_color=no_color)


@app.command()
def runs(
    plan: Annotated[str | None, typer.Option("--plan", help="Only runs of this plan.")] = None,
    status_: Annotated[RunStatus | None, typer.Option("--status", help="Only runs in this "
                                                      "status.")] = None,
    limit: Annotated[int | None, typer.Option("--limit", help="At most this many.",
                                              min=1)] = None,
    as_json: JsonOpt = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """List runs, newest first."""
    from . import api, ui

    settings = _guard(lambda: _settings(project, journal), verbose, as_json)
    rows = _guard(lambda: api.runs(settings, plan=plan,
                                   status=status_.value if status_ else None, limit=limit),
                  verbose, as_json)
    if as_json:
        ui.print_json(rows)
    else:
        ui.print_runs(rows)


@app.command()
def log(
    run: RunArg,
    tracebacks: Annotated[bool, typer.Option("--tracebacks", help="Show tools' "
                                             "tracebacks.")] = False,
    as_json: JsonOpt = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Show a run's events in order."""
    from . import api, ui

    settings = _guard(lambda: _settings(project, journal), verbose, as_json)
    _run_id, events = _guard(lambda: api.log(settings, run), verbose, as_json)
    if as_json:
        if not tracebacks:
            for e in events:
                if isinstance(e["data"], dict):
                    e["data"].pop("traceback", None)
        ui.print_json(events)
    else:
        ui.print_events(events, tracebacks)


@app.command()
def output(
    run: RunArg,
    step: Annotated[str, typer.Argument(help="Step id.")],
    item: Annotated[int | None, typer.Option("--item", help="A fan-out item's index.",
                                             min=0)] = None,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Print one step's output as JSON on stdout."""
    from . import api, ui

    settings = _guard(lambda: _settings(project, journal), verbose)
    value = _guard(lambda: api.output(settings, run, step, item), verbose)
    ui.print_json(value)


def main() -> None:
    """Console-script entry point.

    Command-line mistakes caught by the parser get the same one-line form as every other
    user error (``planrun: error[usage]: …``, exit 2).
    """
    from typer.exceptions import TyperException

    try:
        code = app(prog_name="planrun", standalone_mode=False)
    except KeyboardInterrupt:
        # Ctrl-C outside a run (while loading or validating): nothing was started.
        sys.stderr.write("planrun: interrupted\n")
        raise SystemExit(130) from None
    except TyperException as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":
            sys.stdout.write(exc.format_message() + "\n")
            raise SystemExit(0) from None
        ctx = getattr(exc, "ctx", None)
        where = ctx.command_path if ctx is not None else "planrun"
        sys.stderr.write(f"planrun: error[usage]: {exc.format_message()}\n"
                         f"  See: {where} --help\n")
        raise SystemExit(getattr(exc, "exit_code", 2)) from None
    except typer.Abort:
        sys.stderr.write("planrun: interrupted\n")
        raise SystemExit(130) from None
    raise SystemExit(code if isinstance(code, int) else 0)
