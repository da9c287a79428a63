"""Options, arguments and choices shared by the commands (one ``Annotated`` alias each).

A command's signature names these aliases instead of repeating an option's flags and help.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from .completion import (
    complete_approve,
    complete_param,
    complete_plans,
    complete_run_steps,
    complete_runs,
)


def text(value: str | None) -> str | None:
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


# --- common options (accepted after the command name) ------------------------------------

JournalOpt = Annotated[str | None, typer.Option(
    "--journal", help="Journal location: a file path or a postgresql:// URL (default: "
    "$PLANRUN_JOURNAL, planrun.toml, or the user data folder).", metavar="PATH|URL")]
ProjectOpt = Annotated[str | None, typer.Option(
    "-C", "--project", help="Project folder (default: where planrun.toml is found).",
    metavar="DIR")]
VerboseOpt = Annotated[bool, typer.Option("-v", "--verbose", help="More detail on errors.")]
QuietOpt = Annotated[bool, typer.Option("-q", "--quiet", help="Print only results and "
                                        "errors.")]
#: ``-q`` of the commands that print a validation report (validate, import).
ReportQuietOpt = Annotated[bool, typer.Option(
    "-q", "--quiet", help="Print only problems (no 'ok' lines).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON on stdout.")]
NoColorOpt = Annotated[bool, typer.Option("--no-color", help="No colour (also NO_COLOR).")]
ParamOpt = Annotated[list[str] | None, typer.Option(
    "-p", "--param", help="A parameter value, NAME=VALUE (parsed by its declared type); "
    "repeatable.", metavar="NAME=VALUE",
    autocompletion=lambda ctx, args, incomplete: complete_param(ctx, args, incomplete))]
ParamsFileOpt = Annotated[str | None, typer.Option(
    "--params-file", help="YAML or JSON file of parameter values.", metavar="FILE")]

# --- what several commands take ------------------------------------------------------------

PlanArg = Annotated[str, typer.Argument(help="Plan name (in the plans folder) or file path.",
                                        autocompletion=complete_plans)]
RunArg = Annotated[str, typer.Argument(
    help="Run id or unique prefix (4+ characters).", callback=text,
    autocompletion=lambda ctx, args, incomplete: complete_runs(ctx, args, incomplete))]
LatestRunArg = Annotated[str, typer.Argument(
    help="Run id, unique prefix (4+ characters) or `last` (default: this project's latest "
    "run).", callback=text,
    autocompletion=lambda ctx, args, incomplete: complete_runs(ctx, args, incomplete))]
ApproveOpt = Annotated[list[str] | None, typer.Option(
    "--approve", help="Clear this step without asking; repeatable.", metavar="STEP",
    autocompletion=lambda ctx, args, incomplete: complete_approve(ctx, args, incomplete))]
ApproveAllOpt = Annotated[bool, typer.Option(
    "--approve-all", help="Clear every step that needs approval.")]
DeferApprovalOpt = Annotated[bool, typer.Option(
    "--defer-approval", help="Ask nobody now: a step that flags or grants do not clear "
    "leaves the run awaiting_approval (exit 4) until planrun approve or deny.")]
ApprovalTimeoutOpt = Annotated[float | None, typer.Option(
    "--approval-timeout", help="On a terminal, deny when nobody answers in this many "
    "seconds.", metavar="SECONDS", min=0, max=1e9)]
MaxParallelOpt = Annotated[int | None, typer.Option(
    "--max-parallel", help="Calls running at once (default: the plan's max_parallel, else "
    "planrun.toml's, else 4; resume, retry, approve --resume: the run's own).", min=1,
    max=2**63 - 1)]
ExecutorOpt = Annotated[str | None, typer.Option(
    "--executor", help="Where calls run: local (default: planrun.toml's executor), dask (a "
    "local Dask cluster for the run) or dask:tcp://HOST:PORT (a Dask scheduler).",
    metavar="EXECUTOR")]
ItemOpt = Annotated[int | None, typer.Option(
    "--item", help="A fan-out item's index.", min=0, max=2**63 - 1)]
StepArg = Annotated[str | None, typer.Argument(
    help="Step id (given alone, the step of this project's latest run).", callback=text,
    autocompletion=lambda ctx, args, incomplete: complete_run_steps(ctx, args, incomplete))]
PlanFilterOpt = Annotated[str | None, typer.Option("--plan", help="Only runs of this plan.",
                                                   callback=text)]
AllProjectsOpt = Annotated[bool, typer.Option(
    "--all", help="Runs of every project sharing this journal (default: this project's).")]
StrictOpt = Annotated[bool, typer.Option("--strict", help="Warnings fail too.")]


class Format(StrEnum):
    """Report formats of ``planrun validate``."""

    text = "text"
    json = "json"
    github = "github"


FormatOpt = Annotated[Format, typer.Option("--format", help="Report format.")]


class RunStatus(StrEnum):
    """Run statuses (SPEC §5)."""

    running = "running"
    completed = "completed"
    failed = "failed"
    interrupted = "interrupted"
    denied = "denied"
    refused = "refused"
    planning = "planning"
    planned = "planned"
    awaiting_approval = "awaiting_approval"


StatusOpt = Annotated[RunStatus | None, typer.Option("--status",
                                                     help="Only runs in this status.")]


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
