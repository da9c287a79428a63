"""Errors to exit statuses: one message on stderr and the exit status of SPEC §9.

Every :class:`~planrun.errors.PlanrunError` becomes one message on stderr (with its report,
if any) and its exit status; anything else is a bug and shows a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import typer

T = TypeVar("T")


class AbandonedExit(SystemExit):
    """Exit now with ``code``, not waiting for python tool calls still running in threads.

    Raised by a command; :func:`planrun.cli.main` (the outermost layer) ends the process
    with :func:`os._exit`, which nothing below it may call.
    """


def leave(code: int, abandoned_calls: int) -> NoReturn:
    """End the command with exit status ``code``.

    With python tool calls still running in threads (timed out, or the run's lease was
    lost): :class:`AbandonedExit`, so that the process does not wait for them.
    """
    if abandoned_calls:
        sys.stdout.flush()
        sys.stderr.flush()
        raise AbandonedExit(code)
    raise typer.Exit(code)


def fail(exc: Any, verbose: bool) -> NoReturn:
    """Print ``exc`` (a PlanrunError) as one message and end with its exit status."""
    from ..ui import print_error

    print_error(exc, verbose)
    leave(exc.exit_code, getattr(exc, "abandoned_calls", 0))


def settings_of(project: str | None, journal: str | None) -> Any:
    """The settings: flag > environment > planrun.toml > defaults (SPEC §8)."""
    from .. import api

    return api.load_settings(project=project, journal=journal)


def guard(fn: Callable[[], T], verbose: bool = False, as_json: bool = False) -> T:
    """Run ``fn``; turn a PlanrunError into its message and exit status.

    ``as_json``: the error goes on stdout too, as ``{"ok": false, "error": {…}}``.
    """
    from ..errors import PlanrunError, Refused

    try:
        return fn()
    except Refused as exc:
        from ..api import Report
        from ..ui import print_error, print_json, print_report

        if as_json:
            exc = _unplaced(exc)  # no report is printed "above" this line
        if isinstance(exc.report, Report):
            if as_json:
                error = {"code": exc.code, "message": exc.message}
                if exc.run_id is not None:  # the run ``refused`` it journaled
                    error["run_id"] = exc.run_id
                print_json({"ok": False, "error": error, **exc.report.to_json()})
                exc = _with_reason(exc, exc.report.all_issues())
            else:
                print_report(exc.report, "text", stream=sys.stderr)
        print_error(exc, verbose)
        raise typer.Exit(exc.exit_code) from None
    except PlanrunError as exc:
        if as_json:
            from ..ui import print_json

            exc = _unplaced(exc)
            error = {"code": exc.code, "message": exc.message, "hint": exc.hint}
            if exc.run_id is not None:
                error["run_id"] = exc.run_id
            print_json({"ok": False, "error": error})
        fail(exc, verbose)


def _unplaced(exc: Any) -> Any:
    """``exc`` with its :meth:`~planrun.errors.PlanrunError.unplaced` message (``--json``)."""
    import copy

    if exc.unplaced() == exc.message:
        return exc
    shown = copy.copy(exc)
    shown.message = exc.unplaced()
    return shown


def _with_reason(exc: Any, issues: list[Any]) -> Any:
    """``exc`` with its first error (and how many more) in its one line on stderr.

    With ``--json`` the report goes to stdout only: a cron job that keeps stderr apart had
    "plan 'nightly' was refused" and no reason (found by a fresh operator).
    """
    import copy

    errors = [i for i in issues if i.severity == "error"]
    if not errors:
        return exc
    first = errors[0]
    at = f"{first.file}: " if first.file else ""
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    shown = copy.copy(exc)
    shown.message = f"{exc.message}: {at}{first.message}{more}"
    return shown
