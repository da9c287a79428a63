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
    "--journal", help="Journal location, a file path (default: $PLANRUN_JOURNAL, "
    "planrun.toml, or the user data folder).", metavar="PATH")]
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
    "repeatable.", metavar="NAME=VALUE",
    autocompletion=lambda ctx, args, incomplete: _complete_param(ctx, args,
                                                                incomplete))]
ParamsFileOpt = Annotated[str | None, typer.Option(
    "--params-file", help="YAML or JSON file of parameter values.", metavar="FILE")]


def _text(value: str | None) -> str | None:
    """Refuse a value that is not UTF-8 text (undecodable bytes in argv): usage, exit 2.

    Run ids, step ids, plan names and reasons are looked up in or written to the journal,
    which holds text only.
    """
    if value is not None and not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise typer.BadParameter(f"{value!r} is not UTF-8 text") from None
    return value


RunArg = Annotated[str, typer.Argument(
    help="Run id or unique prefix (4+ characters).", callback=_text,
    autocompletion=lambda ctx, args, incomplete: _complete_runs(ctx, args, incomplete))]
LatestRunArg = Annotated[str, typer.Argument(
    help="Run id, unique prefix (4+ characters) or `last` (default: this project's latest "
    "run).", callback=_text,
    autocompletion=lambda ctx, args, incomplete: _complete_runs(ctx, args, incomplete))]
ApproveOpt = Annotated[list[str] | None, typer.Option(
    "--approve", help="Clear this step without asking; repeatable.", metavar="STEP",
    autocompletion=lambda ctx, args, incomplete: _complete_approve(ctx, args,
                                                                  incomplete))]
ApproveAllOpt = Annotated[bool, typer.Option(
    "--approve-all", help="Clear every step that needs approval.")]
ApprovalTimeoutOpt = Annotated[float | None, typer.Option(
    "--approval-timeout", help="On a terminal, deny when nobody answers in this many "
    "seconds.", metavar="SECONDS", min=0, max=1e9)]
MaxParallelOpt = Annotated[int | None, typer.Option(
    "--max-parallel", help="Calls running at once (default: as journaled).", min=1,
    max=2**63 - 1)]


class Format(StrEnum):
    """Report formats of ``planrun validate``."""

    text = "text"
    json = "json"
    github = "github"


def _fail(exc: Any, verbose: bool) -> NoReturn:
    from .ui import print_error

    print_error(exc, verbose)
    if getattr(exc, "abandoned_calls", 0):
        # python tool calls still run in threads (the run's lease was lost): do not wait
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exc.exit_code)
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
        "--journal", help="Journal location, a file path (also accepted after the command).",
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
        autocompletion=lambda ctx, args, incomplete: _complete_plans(
            ctx, args, incomplete))] = None,
    fmt: Annotated[Format, typer.Option("--format", help="Report format.")] = Format.text,
    strict: Annotated[bool, typer.Option("--strict", help="Warnings fail too.")] = False,
    param: ParamOpt = None,
    params_file: ParamsFileOpt = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="The report as JSON (same as --format json).")] = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
    quiet: Annotated[bool, typer.Option(
        "-q", "--quiet", help="Print only problems (no 'ok' lines).")] = False,
    no_color: NoColorOpt = False,
) -> None:
    """Check the registry and plans without calling any tool (exit 0 valid, 3 refused)."""
    from . import api
    from .errors import PlanrunError, Refused, UsageError
    from .issues import Report
    from .ui import print_error, print_report

    if as_json:
        if fmt not in (Format.text, Format.json):
            _fail(UsageError(f"--json and --format {fmt.value} disagree; give one"), verbose)
        fmt = Format.json

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
    print_report(report, fmt.value, strict=strict, quiet=quiet)
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
            from .params import as_written

            plan_ = result.plan
            ui.print_json({"plan": plan_.name, "order": result.order,
                           "approvals": [r.step_id for r in result.approvals],
                           "steps": [{"id": sid, "tool": plan_.by_id[sid].tool.name,
                                      "when": plan_.by_id[sid].when,
                                      "for_each": as_written(plan_.by_id[sid].for_each),
                                      "arguments": as_written(plan_.by_id[sid].arguments)}
                                     for sid in result.order]})
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

    def run() -> Any:
        from .errors import InternalError

        try:
            return call(settings, given, approver, progress)
        except InternalError as exc:
            if exc.manifest is None:
                raise
            # A bug ended the run failed: end as any failed run (manifest, exit 1), with
            # the one-line error on stderr (SPEC §5).
            return {**exc.manifest, "_error": exc}

    with ui.progress_reporter(quiet, no_color, verbose) as progress:
        return _guard(run, verbose, as_json)  # type: ignore[no-any-return]


def _finish(manifest: dict[str, Any], as_json: bool, no_color: bool) -> NoReturn:
    from . import ui

    abandoned = manifest.pop("_abandoned_calls", 0)
    signal_exit = manifest.pop("_exit", None)
    error = manifest.pop("_error", None)
    for note in manifest.pop("_notes", []):
        ui.err(f"planrun: note: {note}")
    if as_json:
        ui.print_json(manifest)
    else:
        ui.print_manifest(manifest, no_color=no_color)
    if error is not None:
        ui.print_error(error)
    code = 0 if manifest["status"] == "completed" and error is None else 1
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
        callback=_text,
        help="Run id or prefix (default: the most recent interrupted or running run).",
        autocompletion=lambda ctx, args, incomplete: _complete_runs(
            ctx, args, incomplete))] = None,
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
    step: Annotated[str, typer.Argument(help="The indeterminate step.", callback=_text)],
    succeeded: Annotated[bool, typer.Option(
        "--succeeded", help="Its effect happened: record it as succeeded.")] = False,
    failed: Annotated[bool, typer.Option(
        "--failed", help="Its effect did not happen: record it as failed.")] = False,
    output_json: Annotated[str | None, typer.Option(
        "--output", help="With --succeeded: the step's output, as JSON.",
        metavar="JSON")] = None,
    reason: Annotated[str | None, typer.Option(
        "--reason", help="Why (journaled).", metavar="TEXT", callback=_text)] = None,
    item: Annotated[int | None, typer.Option(
        "--item", help="A fan-out item's index.", min=0, max=2**63 - 1)] = None,
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
    from_step: Annotated[str | None, typer.Option(
        "--from", help="Run this step and every step after it again, even if they "
        "succeeded (the run may be completed).", metavar="STEP",
        autocompletion=lambda ctx, args, incomplete: _complete_run_steps(
            ctx, args, incomplete))] = None,
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
        progress=progress, from_step=from_step), project=project, journal=journal, param=param,
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


def _complete_plans(ctx: Any, args: list[str], incomplete: str) -> list[str]:
    """Plan names of the project (its -C DIR, else found from here); empty on any problem."""
    try:
        from .paths import plan_names

        return [n for n in plan_names(_ctx_settings(args).plans_dir)
                if n.startswith(incomplete)]
    except Exception:  # completion must never fail loudly
        return []


#: Options that take a value (to find the positional words of a command line).
_VALUED = {"-C", "--project", "--journal", "-p", "--param", "--params-file", "--approve",
           "--approval-timeout", "--max-parallel", "--format", "--output", "--reason",
           "--item", "--plan", "--status", "--limit", "--older-than", "--from"}


def _completion_words() -> list[str]:
    """The words of the command line being completed, before the one under the cursor.

    Typer hands completion callbacks no words, so they are read as its shell classes read
    them: ``COMP_WORDS``/``COMP_CWORD`` (bash) or ``_TYPER_COMPLETE_ARGS`` (zsh, fish).
    """
    import shlex

    def split(text: str) -> list[str]:
        lexer = shlex.shlex(text, posix=True)
        lexer.whitespace_split = True
        lexer.commenters = ""
        out: list[str] = []
        try:
            for token in lexer:
                out.append(token)
        except ValueError:  # an unclosed quote: what was read so far
            out.append(lexer.token)
        return out

    if "COMP_WORDS" in os.environ:
        words = split(os.environ["COMP_WORDS"])
        try:
            return words[1:int(os.environ.get("COMP_CWORD", len(words)))]
        except ValueError:
            return words[1:]
    text = os.environ.get("_TYPER_COMPLETE_ARGS", "")
    words = split(text)[1:]
    return words if text.endswith(" ") else words[:-1]


def _words(args: list[str] | None) -> tuple[dict[str, list[str]], list[str]]:
    """(option → values, positional words after the command) of a partial command line.

    Completion parses on its own: a trailing option still missing its value makes the
    parser drop every parameter it had read.
    """
    options: dict[str, list[str]] = {}
    positional: list[str] = []
    words = list(args or []) or _completion_words()
    i = 0
    while i < len(words):
        w = words[i]
        if w.startswith("-") and "=" in w and w.startswith("--"):
            name, _, value = w.partition("=")
            options.setdefault(name, []).append(value)
        elif w in _VALUED:
            if i + 1 < len(words):
                options.setdefault(w, []).append(words[i + 1])
            i += 1
        elif not w.startswith("-"):
            positional.append(w)
        i += 1
    return options, positional[1:]  # the first positional word is the command


def _ctx_settings(args: list[str] | None) -> Any:
    """The settings a completed command line would use: its -C/--project and --journal.

    Given before the command or after it; else the environment and planrun.toml.
    """
    from .paths import load_settings

    options, _ = _words(args)
    projects = options.get("-C", []) + options.get("--project", [])
    journals = options.get("--journal", [])
    project = projects[-1] if projects else None
    journal = journals[-1] if journals else None
    return load_settings(project=project, journal=journal)


def _complete_runs(ctx: Any, args: list[str], incomplete: str) -> list[str]:
    """Recent run ids of the project from the journal (read-only; empty on any problem).

    ``resume``: only runs it can continue (``interrupted`` or ``running``); ``retry``: only
    failed ones.
    """
    try:
        from .api import project_key
        from .journal import Journal

        settings = _ctx_settings(args)
        wanted = {"resume": ("interrupted", "running"), "retry": ("failed",),
                  "resolve": ("interrupted", "running", "failed")}.get(
            getattr(getattr(ctx, "command", None), "name", ""))
        with Journal(settings.journal, write=False) as journal:
            rows = journal.list_runs(limit=200, project=project_key(settings))
        return [r["run_id"] for r in rows if r["run_id"].startswith(incomplete)
                and (wanted is None or r["status"] in wanted)][:50]
    except Exception:  # completion must never fail loudly
        return []


def _plan_steps_and_params(ctx: Any, args: list[str]
                           ) -> tuple[list[str], list[str], list[str]]:
    """(step ids, steps needing approval, parameter names) for completion.

    Of the plan on the command line (``execute PLAN``) or of the run (``resume RUN``,
    ``retry RUN``, ``output RUN``; default the latest).
    """
    settings = _ctx_settings(args)
    command = getattr(getattr(ctx, "command", None), "name", "")
    _, positional = _words(args)
    data: Any = None
    if command in ("execute", "show", "validate", "graph"):
        if not positional:
            return [], [], []
        from .loading import load_file
        from .paths import find_plan

        data = load_file(find_plan(positional[0], settings.plans_dir)).data
    else:
        from .journal import Journal

        with Journal(settings.journal, write=False) as journal:
            journal.project = _project_of(settings)
            ref = positional[0] if (positional and command != "output") or len(
                positional) > 1 else "last"
            data = journal.run(journal.resolve_run_id(ref)).plan
    if not isinstance(data, dict):
        return [], [], []
    steps = [s for s in data.get("steps") or [] if isinstance(s, dict)]
    ids = [str(s.get("id")) for s in steps if s.get("id") is not None]
    needs: list[str] = []
    try:
        from .registry import load_registry

        registry, _ = load_registry(settings.registry, settings.pools)
        for s in steps:
            tool = registry.tools.get(str(s.get("tool")))
            if tool is not None and tool.entry.irreversible:
                needs.append(str(s.get("id")))
    except Exception:  # the registry is optional for completion
        pass
    declared = data.get("params")
    names = list(declared) if isinstance(declared, dict) else []
    return ids, needs, names


def _project_of(settings: Any) -> str:
    from .api import project_key

    return project_key(settings)


def _complete_approve(ctx: Any, args: list[str], incomplete: str) -> list[str]:
    """Step ids for ``--approve``: those needing approval first, then the others."""
    try:
        ids, needs, _ = _plan_steps_and_params(ctx, args)
        given = set(_words(args)[0].get("--approve", []))
        ordered = needs + [i for i in ids if i not in needs]
        return [i for i in ordered if i.startswith(incomplete) and i not in given]
    except Exception:  # completion must never fail loudly
        return []


def _complete_param(ctx: Any, args: list[str], incomplete: str) -> list[str]:
    """``NAME=`` for ``-p``: the plan's declared parameters not given yet."""
    try:
        _, _, names = _plan_steps_and_params(ctx, args)
        options = _words(args)[0]
        given = {p.partition("=")[0] for p in options.get("-p", []) + options.get(
            "--param", [])}
        return [f"{n}=" for n in names if f"{n}=".startswith(incomplete) and n not in given]
    except Exception:  # completion must never fail loudly
        return []


def _complete_run_steps(ctx: Any, args: list[str], incomplete: str) -> list[str]:
    """Step ids of the run named on the command line (``output RUN <Tab>``)."""
    try:
        ids, _, _ = _plan_steps_and_params(ctx, args)
        return [i for i in ids if i.startswith(incomplete)]
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
    run: LatestRunArg = "last",
    as_json: JsonOpt = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
    no_color: NoColorOpt = False,
) -> None:
    """Show a run's manifest (default: this project's latest run)."""
    from . import api, ui

    settings = _guard(lambda: _settings(project, journal), verbose, as_json)
    m = _guard(lambda: api.status(settings, run), verbose, as_json)
    if as_json:
        ui.print_json(m)
    else:
        ui.print_manifest(m, no_color=no_color)


@app.command()
def runs(
    plan: Annotated[str | None, typer.Option("--plan", help="Only runs of this plan.",
                                             callback=_text)] = None,
    status_: Annotated[RunStatus | None, typer.Option("--status", help="Only runs in this "
                                                      "status.")] = None,
    limit: Annotated[int | None, typer.Option("--limit", help="At most this many.",
                                              min=1, max=2**63 - 1)] = None,
    all_projects: Annotated[bool, typer.Option(
        "--all", help="Runs of every project sharing this journal (default: this "
        "project's).")] = False,
    as_json: JsonOpt = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """List this project's runs, newest first (--all: every project's)."""
    from . import api, ui

    settings = _guard(lambda: _settings(project, journal), verbose, as_json)
    rows = _guard(lambda: api.runs(settings, plan=plan,
                                   status=status_.value if status_ else None, limit=limit,
                                   all_projects=all_projects),
                  verbose, as_json)
    if as_json:
        ui.print_json(rows)
    else:
        ui.print_runs(rows, here=api.project_key(settings) if not all_projects else None)


@app.command()
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
    from . import api, ui

    settings = _guard(lambda: _settings(project, journal), verbose, as_json)
    if follow:
        events_iter = api.follow(settings, run)
        while True:
            event = _guard(lambda: next(events_iter, None), verbose, as_json)
            if event is None:
                raise typer.Exit(0)
            if as_json:
                if not tracebacks and isinstance(event["data"], dict):
                    event["data"].pop("traceback", None)
                ui.print_json_line(event)
            else:
                ui.print_events([event], tracebacks)
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
    run: LatestRunArg,
    step: Annotated[str | None, typer.Argument(
        help="Step id (given alone, the step of this project's latest run).",
        callback=_text,
        autocompletion=lambda ctx, args, incomplete: _complete_run_steps(
            ctx, args, incomplete))] = None,
    item: Annotated[int | None, typer.Option("--item", help="A fan-out item's index.",
                                             min=0, max=2**63 - 1)] = None,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Print one step's output as JSON on stdout: output [RUN] STEP (RUN: default last)."""
    from . import api, ui

    if step is None:
        run, step = "last", run
    settings = _guard(lambda: _settings(project, journal), verbose)
    value = _guard(lambda: api.output(settings, run, step, item), verbose)
    ui.print_json(value)


@app.command()
def plans(
    as_json: JsonOpt = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """List the plans: name, revision, goal, steps, which need approval."""
    from . import api, ui

    settings = _guard(lambda: _settings(project, journal), verbose, as_json)
    rows = _guard(lambda: api.plans(settings), verbose, as_json)
    if as_json:
        ui.print_json(rows)
    else:
        ui.print_plans(rows)


@app.command("prune")
def prune_runs(
    older_than: Annotated[str, typer.Option(
        "--older-than", help="Runs started longer ago than this: 30d, 12h, 90m, 2w.",
        metavar="AGE")],
    status_: Annotated[RunStatus | None, typer.Option(
        "--status", help="Only runs in this status.")] = None,
    plan: Annotated[str | None, typer.Option("--plan", help="Only runs of this plan.")
                    ] = None,
    all_projects: Annotated[bool, typer.Option(
        "--all", help="Runs of every project sharing this journal (default: this "
        "project's).")] = False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="List what would be deleted; delete nothing.")] = False,
    as_json: JsonOpt = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Delete old runs with everything of theirs (idempotency keys too); reclaim space."""
    from . import api, ui

    settings = _guard(lambda: _settings(project, journal), verbose, as_json)
    result = _guard(lambda: api.prune(settings, older_than=older_than,
                                      status=status_.value if status_ else None, plan=plan,
                                      all_projects=all_projects, dry_run=dry_run),
                    verbose, as_json)
    if as_json:
        ui.print_json(result)
        return
    for run_id in result["deleted"]:
        ui.out(("would delete " if dry_run else "deleted ") + run_id)
    ui.out(f"{len(result['deleted'])} run(s) {'would be ' if dry_run else ''}deleted"
           + ("" if dry_run else f", {result['keys']} idempotency key(s) with them"))


@app.command()
def forget(
    run: RunArg,
    as_json: JsonOpt = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Delete one run with everything of its (idempotency keys too); reclaim space."""
    from . import api, ui

    settings = _guard(lambda: _settings(project, journal), verbose, as_json)
    result = _guard(lambda: api.forget(settings, run), verbose, as_json)
    if as_json:
        ui.print_json(result)
    else:
        ui.out(f"deleted run {result['deleted'][0]} ({result['events']} event(s), "
               f"{result['keys']} idempotency key(s))")


#: Common flags that may also be given before the command name (``planrun -q execute``).
_MOVABLE = {"-q", "--quiet", "-v", "--verbose", "--no-color", "--json"}


def _common_flags_after_command(argv: list[str]) -> list[str]:
    """``argv`` with the common flags given before the command moved after its name.

    ``-C``/``--journal`` before the command are the root's own options; ``-q``, ``-v``,
    ``--no-color`` and ``--json`` mean the same before the command as after it (SPEC §9
    lists them as common options). A flag the command does not take is left where it
    was, so the parser reports it as usual.
    """
    import typer.main

    i = 0
    before: list[str] = []
    rest = list(argv)
    while i < len(rest):
        word = rest[i]
        if word in ("-C", "--project", "--journal"):
            i += 2
            continue
        if word in _MOVABLE:
            before.append(rest.pop(i))
            continue
        if word.startswith("-"):
            i += 1
            continue
        break
    if not before or i >= len(rest):
        return argv
    group = typer.main.get_command(app)
    sub = getattr(group, "commands", {}).get(rest[i])
    takes = {opt for p in getattr(sub, "params", []) for opt in getattr(p, "opts", [])}
    moved = [w for w in before if w in takes]
    if len(moved) != len(before):
        return argv
    return rest[:i + 1] + moved + rest[i + 1:]


def main() -> None:
    """Console-script entry point.

    Command-line mistakes caught by the parser get the same one-line form as every other
    user error (``planrun: error[usage]: …``, exit 2).
    """
    import contextlib

    from typer.exceptions import TyperException

    # Text that is not UTF-8 (a lone surrogate from an undecodable byte) is printed as a
    # backslash escape, never an exception: printing must not change an outcome.
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with contextlib.suppress(OSError, ValueError):  # e.g. a socket: cannot seek
                reconfigure(errors="backslashreplace")
    from .streams import harden

    harden()  # a closed or broken stdout/stderr never changes an outcome (SPEC §5)
    try:
        code = app(args=_common_flags_after_command(sys.argv[1:]), prog_name="planrun",
                   standalone_mode=False)
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
