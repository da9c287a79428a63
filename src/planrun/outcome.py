"""What a command that drives a run (execute, resume, retry) hands back: a :class:`RunOutcome`.

A plain record, below everything that drives runs (:mod:`planrun.runner`,
:mod:`planrun.lifecycle`, :mod:`planrun.api`), so that data flows down.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import EXIT_APPROVAL, EXIT_RUN_FAILED, PlanrunError


@dataclass
class RunOutcome:
    """How a driven run ended.

    Attributes:
        manifest: the run's manifest (SPEC §5), as ``planrun status`` prints it.
        signal_exit: 130 (SIGINT) or 143 (SIGTERM) when a signal interrupted the run,
            else None.
        abandoned_calls: python tool calls still running in threads (timed out, or the
            run's lease was lost): a program should exit without waiting for them.
        notes: one-line notes for the person (e.g. the plan file changed since the run
            started), printed on stderr.
        error: an unexpected error (a bug, code ``internal``) that ended the run
            ``failed``; the manifest is that failed run's.
    """

    manifest: dict[str, Any]
    signal_exit: int | None = None
    abandoned_calls: int = 0
    notes: list[str] = field(default_factory=list)
    error: PlanrunError | None = None

    @property
    def status(self) -> str:
        """The run's status (``completed``, ``failed``, ``interrupted`` …)."""
        return str(self.manifest["status"])

    @property
    def exit_code(self) -> int:
        """The exit status of SPEC §9: 0 completed, 1 failed, 130/143 interrupted.

        4 for a run left ``awaiting_approval`` (``--defer-approval``, SPEC §10, or an
        ``approve: resolved`` step nobody could clear at dispatch) or ``denied`` there.
        """
        if self.signal_exit is not None:
            return self.signal_exit
        if self.status in ("awaiting_approval", "denied") and self.error is None:
            return EXIT_APPROVAL
        return 0 if self.status == "completed" and self.error is None else EXIT_RUN_FAILED
