"""``planrun import``: a seed-format execution plan (JSON) → a planrun plan (issue #17).

The converter is :mod:`planrun.importing`, imported only when the command runs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from .guard import fail, settings_of
from .options import Format, FormatOpt, NoColorOpt, ProjectOpt, ReportQuietOpt, VerboseOpt


def import_plan(
    file: Annotated[Path, typer.Argument(
        help="The seed plan: JSON with name, objective and nodes (.yaml/.yml: YAML).",
        metavar="FILE")],
    out: Annotated[Path | None, typer.Option(
        "--out", help="Write the plan to this file (.json: JSON, else YAML) instead of "
        "stdout; the report then goes to stdout.", metavar="FILE")] = None,
    fmt: FormatOpt = Format.text,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
    quiet: ReportQuietOpt = False,
    no_color: NoColorOpt = False,
) -> None:
    """Convert a seed execution plan into a planrun plan, then validate it (exit 0 or 3).

    Every construct that has no planrun equivalent is reported (code unmappable) at its
    JSON Pointer, and then no plan is written. The plan goes to stdout (the report to
    stderr), or with --out to FILE (the report to stdout).
    """
    from .. import api
    from ..errors import PlanrunError, Refused
    from ..importing import import_plan as convert
    from ..ui import print_error, print_report

    stream = sys.stdout if out is not None else sys.stderr
    try:
        settings = settings_of(project, None)
    except Refused as exc:  # a bad planrun.toml: the report, as validate prints it
        if isinstance(exc.report, api.Report):
            print_report(exc.report, fmt.value, stream=stream)
        print_error(exc, verbose)
        raise typer.Exit(exc.exit_code) from None
    except PlanrunError as exc:
        fail(exc, verbose)
    outcome = convert(settings, file, out)
    if outcome.text is not None:
        if out is None:
            sys.stdout.write(outcome.text)
            sys.stdout.flush()
        else:
            from ..planning import _write

            try:
                _write(out, outcome.text)
            except OSError as exc:
                from ..errors import UsageError

                fail(UsageError(f"cannot write {out}: {exc.strerror or exc}"), verbose)
    print_report(outcome.report, fmt.value, stream=stream, quiet=quiet)
    raise typer.Exit(0 if outcome.ok else 3)
