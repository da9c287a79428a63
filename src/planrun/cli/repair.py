"""``planrun repair RUN --planner P``: a planner revises a failed run's plan (SPEC §10)."""

from __future__ import annotations

from typing import Annotated

import typer

from .options import (
    ApprovalTimeoutOpt,
    ApproveAllOpt,
    ApproveOpt,
    DeferApprovalOpt,
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
from .run import _drive, _finish


def repair(
    run: RunArg,
    planner: Annotated[str, typer.Option(
        "--planner", help="cmd:ARGV, python:module:callable, or a [planners.NAME] of "
        "planrun.toml.", metavar="PLANNER", callback=text)],
    max_rounds: Annotated[int | None, typer.Option(
        "--max-rounds", min=1, help="Ask at most this many times (default 3).",
        metavar="N")] = None,
    param: ParamOpt = None,
    params_file: ParamsFileOpt = None,
    approve: ApproveOpt = None,
    approve_all: ApproveAllOpt = False,
    approval_timeout: ApprovalTimeoutOpt = None,
    max_parallel: MaxParallelOpt = None,
    keep_going: Annotated[bool, typer.Option(
        "--keep-going", help="After a failure, go on with independent steps.")] = False,
    defer_approval: DeferApprovalOpt = False,
    as_json: JsonOpt = False,
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
    quiet: QuietOpt = False,
    no_color: NoColorOpt = False,
) -> None:
    """Ask a planner to revise a failed run's plan; run it as a child, keeping what succeeded."""
    from .. import api, ui
    from .planning import round_note, said_if_interrupted

    def written(line: str) -> None:
        ui.err(f"planrun: {line}")

    # Each round and the file written, on stderr as planrun plan says them: the plan
    # file was rewritten without a word (found by a fresh operator).
    with said_if_interrupted("no revision was written; the run stays failed"):
        result = _drive(lambda settings, given, approver, progress: api.repair(
            settings, run, planner, max_rounds=max_rounds, given=given,
            approve=approve or [], approve_all=approve_all, approver=approver,
            max_parallel=max_parallel, keep_going=keep_going, progress=progress,
            on_round=None if quiet else round_note, on_written=None if quiet else written,
            defer_approval=defer_approval),
            project=project, journal=journal, param=param, params_file=params_file,
            approval_timeout=approval_timeout, quiet=quiet, no_color=no_color,
            verbose=verbose, as_json=as_json)
    _finish(result, as_json, no_color, quiet)
