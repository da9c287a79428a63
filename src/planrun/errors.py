"""planrun's error hierarchy: every error has a stable code and an exit status.

The exit statuses are the table of SPEC §9; the codes are the public interface scripts
match on (SPEC §4 for plan problems, §7 for run problems)::

    PlanrunError                     (code, message, hint, details)
    ├── UsageError                   exit 2  usage          command-line misuse
    ├── Refused                      exit 3  (report code)  plan/registry/config refused
    ├── ApprovalError                exit 4  approval_required | approval_denied
    ├── RunError                     exit 5  unknown_run | run_busy | run_not_resumable |
    │                                        indeterminate | not_awaiting_approval
    │   └── ExecutorUnavailable      exit 5  executor_unavailable (--executor dask)
    ├── JournalError                 exit 6  journal        cannot open/write, corrupt, newer
    └── InternalError                exit 1  internal       a bug in planrun ended the run

An interrupted run is not an error either: it ends with its manifest (status
``interrupted``) and exit 130 (SIGINT) or 143 (SIGTERM).

A run that finishes with failed steps is not an error: the manifest says so and the CLI
exits 1 (``EXIT_RUN_FAILED``).
"""

from __future__ import annotations

from typing import Any

EXIT_OK = 0
EXIT_RUN_FAILED = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_APPROVAL = 4
EXIT_RUN = 5
EXIT_JOURNAL = 6
EXIT_SIGINT = 130
EXIT_SIGTERM = 143

#: Exit status → meaning; the README's table is checked against this (tests/test_docs.py).
EXIT_CODES: dict[int, str] = {
    EXIT_OK: "success (plan valid; run completed)",
    EXIT_RUN_FAILED: "the run finished with failed steps",
    EXIT_USAGE: "command-line usage error",
    EXIT_REFUSED: "plan, registry or configuration refused (validation report printed)",
    EXIT_APPROVAL: "approval denied or required but not available (also: a run left "
    "`awaiting_approval`)",
    EXIT_RUN: "run cannot proceed: `unknown_run`, `run_busy`, `run_not_resumable`, "
    "`indeterminate`",
    EXIT_JOURNAL: "journal unusable (cannot open/write, corrupt, newer schema)",
    EXIT_SIGINT: "interrupted by SIGINT (the run is resumable)",
    EXIT_SIGTERM: "interrupted by SIGTERM (the run is resumable)",
}


#: Error codes of a command that stops (besides the issue codes of a refused plan) →
#: (exit status, meaning). The README's table is checked against this.
ERROR_CODES: dict[str, tuple[int, str]] = {
    "usage": (EXIT_USAGE, "the command line is wrong (unknown option, missing argument, "
              "--approve naming no step)"),
    "unknown_step": (EXIT_USAGE, "the run has no such step (or fan-out item)"),
    "approval_required": (EXIT_APPROVAL, "a step needs clearing and nobody can be asked "
                          "(no terminal, no flag, no grant)"),
    "approval_denied": (EXIT_APPROVAL, "a person answered no (or did not answer in time)"),
    "unknown_run": (EXIT_RUN, "no run with that id or prefix"),
    "run_busy": (EXIT_RUN, "another live process holds the run's lease, or a call of a "
                 "planrun that died still runs"),
    "run_not_resumable": (EXIT_RUN, "the run is finished (or not failed, for retry)"),
    "indeterminate": (EXIT_RUN, "a step's effect is unknown and its tool is not "
                      "idempotent: settle it with planrun resolve"),
    "not_indeterminate": (EXIT_RUN, "resolve was given a step whose outcome is known"),
    "no_output": (EXIT_RUN, "the step did not succeed, so it has no output"),
    "not_awaiting_approval": (EXIT_RUN, "approve or deny was given a run that is not "
                              "`awaiting_approval`"),
    "executor_unavailable": (EXIT_RUN, "the Dask cluster of `--executor dask` cannot be "
                             "reached, has no workers, has workers without planrun or the "
                             "project, or re-runs tasks whose worker died; nothing ran"),
    "journal": (EXIT_JOURNAL, "the journal cannot be opened, read or written, is corrupt, "
                "or is newer than this planrun"),
    "internal": (EXIT_RUN_FAILED, "an unexpected error in planrun (a bug) ended the run "
                 "`failed`; `planrun log RUN --tracebacks` shows where"),
    "interrupted": (EXIT_SIGINT, "SIGINT (130) or SIGTERM (143) stopped the run; it is "
                    "resumable"),
}


class PlanrunError(Exception):
    """Base of every error planrun reports to a user.

    Args:
        code: stable machine-readable code (e.g. ``unknown_run``).
        message: what is wrong, one sentence.
        hint: what to do about it (optional).
        details: extra data shown with ``-v`` and in JSON output.
        run_id: the run the error is about, when there is one (``run_id`` of the JSON
            error object: a monitor reads it there, not out of the hint's text).

    ``placed_message``: set when ``message`` points at text printed around it on a
    terminal ("the last report is above"); it is the message for output where that text
    is not there or elsewhere (``--json`` on stdout and stderr, the MCP server), read
    with :meth:`unplaced`.
    """

    exit_code: int = EXIT_USAGE
    default_code: str = "error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        hint: str | None = None,
        details: Any = None,
        run_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code or self.default_code
        self.message = message
        self.hint = hint
        self.details = details
        self.run_id = run_id
        self.placed_message: str | None = None

    def unplaced(self) -> str:
        """The message without words about where other output is (``placed_message``)."""
        return self.placed_message or self.message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" + (f" {self.hint}" if self.hint else "")


class UsageError(PlanrunError):
    """The command line is wrong (exit 2), e.g. ``--approve`` naming no step of the plan."""

    exit_code = EXIT_USAGE
    default_code = "usage"


class Refused(PlanrunError):
    """A plan, the registry or the configuration is refused (exit 3).

    ``report`` holds the validation report (``planrun.validation.Report``) when there is
    one; the CLI prints it.
    """

    exit_code = EXIT_REFUSED
    default_code = "refused"

    def __init__(self, message: str, *, report: Any = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.report = report


class ApprovalError(PlanrunError):
    """A step that needs clearance was denied or could not be asked about (exit 4)."""

    exit_code = EXIT_APPROVAL
    default_code = "approval_required"


class RunError(PlanrunError):
    """A run cannot proceed (exit 5).

    Codes: ``unknown_run``, ``run_busy``, ``run_not_resumable``, ``indeterminate``.
    """

    exit_code = EXIT_RUN
    default_code = "unknown_run"


class ExecutorUnavailable(RunError):
    """The Dask scheduler of ``--executor dask`` cannot be reached or used (exit 5).

    Code ``executor_unavailable``. Raised before the run is journaled (or, for resume and
    retry, before its lease is taken): nothing ran, and the command can simply be run
    again once the scheduler is up.
    """

    default_code = "executor_unavailable"


class JournalError(PlanrunError):
    """The journal cannot be opened, read or written, is corrupt, or is newer (exit 6)."""

    exit_code = EXIT_JOURNAL
    default_code = "journal"


class InternalError(PlanrunError):
    """An unexpected error inside planrun (a bug) ended a run ``failed`` (exit 1).

    SPEC §5: no error, however unexpected, leaves a run ``running`` or shows a user a
    traceback; the traceback is journaled (``planrun log RUN --tracebacks``). ``manifest``
    holds the run's manifest when it could still be read, so the CLI ends as for any failed
    run.
    """

    exit_code = EXIT_RUN_FAILED
    default_code = "internal"

    def __init__(self, message: str, *, manifest: dict[str, Any] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.manifest = manifest
