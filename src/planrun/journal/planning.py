"""Planning sessions: the run record of ``planrun plan`` (SPEC §10).

A planning session is a run with no steps: journaled ``planning`` at its first round,
it ends ``planned`` (the plan as accepted, its name, revision and digest) or ``refused``
(the last report; code ``replan_exhausted``). Its events say how the plan came to be:
``plan_proposed`` and ``plan_refused`` per round, then ``planned``, then
``run_finished``. ``resume`` and ``retry`` refuse it (``run_not_resumable``).

The session holds the run's lease while it plans (owner, boot id and start time, as a run
does; it is not renewed: a planner may take minutes). A session whose holder is provably
dead (same host, its pid gone or given to another process, or the machine rebooted) was
killed (SIGKILL, a crash): :meth:`PlanningMixin.settle_dead_planning` ends it ``refused``
with code ``interrupted``. A holder on another host is never presumed dead.
"""

from __future__ import annotations

from typing import Any

from .base import JournalBase, now
from .records import NewRun, dumps, lease_record


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
        sets = ["status = ?", "finished_at = ?", "lease_owner = NULL", "lease_expires = NULL",
                "lease_boot = NULL", "lease_start = NULL"]
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

    def settle_dead_planning(self) -> list[str]:
        """End ``refused`` (code ``interrupted``) every planning session whose holder died.

        Only sessions with a lease whose holder is provably dead (:meth:`Lease.holder_alive`
        False); one on another host, or journaled without a lease, stays ``planning``.

        Returns:
            The run ids settled.
        """
        rows = self._c().execute(
            "SELECT lease_owner, lease_epoch, lease_expires, "
            f"lease_expires - {self.backend.NOW_SQL}, lease_boot, lease_start, run_id "
            "FROM runs WHERE status = 'planning' AND lease_owner IS NOT NULL").fetchall()
        dead = [(str(r[6]), lease_record(r).owner) for r in rows
                if lease_record(r).holder_alive() is False]
        settled = []
        for run_id, owner in dead:
            report = {"code": "interrupted",
                      "message": f"the planning process ({owner}) ended without closing the "
                      "session (killed, or it crashed)"}
            ts = now()
            with self._write() as c:
                done = c.execute(
                    "UPDATE runs SET status = 'refused', finished_at = ?, report_json = ?, "
                    "lease_owner = NULL, lease_expires = NULL, lease_boot = NULL, "
                    "lease_start = NULL WHERE run_id = ? AND status = 'planning' "
                    "AND lease_owner = ?", (ts, dumps(report), run_id, owner)).rowcount
                if done == 1:  # not settled by another process meanwhile
                    self._event(c, run_id, "run_finished",
                                data={"status": "refused", "code": "interrupted"}, ts=ts)
                    settled.append(run_id)
        return settled
