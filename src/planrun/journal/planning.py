"""Planning sessions: the run record of ``planrun plan`` (SPEC §10).

A planning session is a run with no steps: journaled ``planning`` at its first round,
it ends ``planned`` (the plan as accepted, its name, revision and digest) or ``refused``
(the last report; code ``replan_exhausted``). Its events say how the plan came to be:
``plan_proposed`` and ``plan_refused`` per round, then ``planned``, then
``run_finished``. ``resume`` and ``retry`` refuse it (``run_not_resumable``).
"""

from __future__ import annotations

from typing import Any

from .base import JournalBase, now
from .records import NewRun, dumps


class PlanningMixin(JournalBase):
    """The journal's planning sessions: a part of :class:`planrun.journal.Journal`."""

    def begin_planning(self, run: NewRun) -> None:
        """Journal a new planning session (status ``planning``), no event yet."""
        with self._write() as c:
            self._insert_run(c, run)  # type: ignore[attr-defined]

    def end_planning(self, run_id: str, *, status: str, event: str | None = None,
                     data: Any = None, plan: Any = None, digest: str | None = None,
                     plan_name: str | None = None, revision: int | None = None,
                     plan_file: str | None = None, report: Any = None,
                     params: dict[str, Any] | None = None) -> None:
        """End a planning session: ``status`` ``planned`` or ``refused``, in one transaction.

        Writes the accepted ``plan`` (stored form), its ``digest``, name, revision and
        file when given, the last ``report``, the ``params`` as finally known (reference
        form), the ``event`` (``planned``) with ``data``, and ``run_finished``.
        """
        ts = now()
        sets = ["status = ?", "finished_at = ?"]
        args: list[Any] = [status, ts]
        for column, value in (("plan_json", None if plan is None else dumps(plan)),
                              ("digest", digest), ("plan_name", plan_name),
                              ("revision", revision), ("plan_file", plan_file),
                              ("report_json", None if report is None else dumps(report)),
                              ("params_json", None if params is None else dumps(params))):
            if value is not None:
                sets.append(f"{column} = ?")
                args.append(value)
        with self._write() as c:
            c.execute(f"UPDATE runs SET {', '.join(sets)} WHERE run_id = ? "
                      "AND status = 'planning'", (*args, run_id))
            if event is not None:
                self._event(c, run_id, event, data=data, ts=ts)
            self._event(c, run_id, "run_finished", data={"status": status, **(
                {"code": report.get("code")} if isinstance(report, dict)
                and report.get("code") else {})}, ts=ts)
