"""Journaling a planning session (SPEC §10): one run record per ``planrun plan``.

:class:`JournalSession` creates the session's run at its first round (status
``planning``; plan name, goal, planner and parameters in reference form), journals each
round (``plan_proposed``, ``plan_refused``) and ends it ``planned`` or ``refused``
(:mod:`planrun.journal.planning`). :class:`EventSession` journals the rounds as events of
a run that exists already (what ``repair`` uses on the run it repairs).
"""

from __future__ import annotations

from typing import Any


class EventSession:
    """Rounds journaled as events of an existing run ``run_id`` (no run record created).

    Args:
        journal_at: the journal's location (``settings.journal``).
        run_id: the run the events belong to.
    """

    def __init__(self, journal_at: Any, run_id: str) -> None:
        self.journal_at = journal_at
        self.run_id: str | None = run_id

    def _add(self, kind: str, data: Any) -> None:
        from ..journal import Journal

        assert self.run_id is not None
        with Journal(self.journal_at, write=True) as journal:
            journal.add_event(self.run_id, kind, data=data)

    def proposed(self, round_no: int, digest: str | None, plan: Any) -> None:
        """``plan_proposed`` ``{"round", "digest", "plan"}`` (digest and plan None: no plan)."""
        self._add("plan_proposed", {"round": round_no, "digest": digest, "plan": plan})

    def refused(self, round_no: int, issues: list[dict[str, Any]]) -> None:
        """``plan_refused`` ``{"round", "issues"}``."""
        self._add("plan_refused", {"round": round_no, "issues": issues})


class JournalSession(EventSession):
    """A planning session's own run record, created at the first round.

    Args:
        settings: the invocation's settings (journal, project).
        goal: the goal as given.
        name: the plan name known so far (``--name``, or a slug of the goal).
        planner: the planner's label (the ``--planner`` value).
        mode: ``plan`` (or ``repair``).
        params: the parameters as the planner sees them (reference form); set it again
            before the session ends when more secrets became known (journaled at the end).
        max_rounds: the bound.
    """

    def __init__(self, settings: Any, *, goal: str, name: str, planner: str, mode: str,
                 params: dict[str, Any], max_rounds: int) -> None:
        super().__init__(settings.journal, "")
        self.run_id = None
        self.settings = settings
        self.goal = goal
        self.name = name
        self.options = {"planning": {"planner": planner, "mode": mode,
                                     "max_rounds": max_rounds}}
        self.params = params

    def _add(self, kind: str, data: Any) -> None:
        if self.run_id is None:
            self.start()
        super()._add(kind, data)

    def start(self) -> None:
        """Journal the session's run (status ``planning``, its lease held by this process).

        Before the first round; planning sessions of dead processes are settled first
        (:meth:`planrun.journal.Journal.settle_dead_planning`).
        """
        from ..checking import project_key
        from ..journal import Journal, NewRun, now
        from ..journal.store import lease_owner, new_run_id

        run_id = new_run_id()
        with Journal(self.journal_at, write=True) as journal:
            journal.settle_dead_planning()  # sessions of planrun processes killed earlier
            journal.begin_planning(NewRun(
                run_id=run_id, root_run_id=run_id, plan_name=self.name, plan=None,
                digest="", revision=1, status="planning", created_at=now(),
                project=project_key(self.settings), goal=self.goal, params=self.params,
                options=self.options, lease_owner=lease_owner()))
        self.run_id = run_id

    def accepted(self, *, plan: Any, digest: str, name: str, revision: int,
                 plan_file: str | None, data: dict[str, Any]) -> None:
        """End the session ``planned``: the plan as accepted (stored form), ``planned``."""
        from ..journal import Journal

        if self.run_id is None:
            self.start()
        assert self.run_id is not None
        with Journal(self.journal_at, write=True) as journal:
            journal.end_planning(self.run_id, status="planned", event="planned", data=data,
                                 plan=plan, digest=digest, plan_name=name, revision=revision,
                                 plan_file=plan_file, params=self.params)

    def fail(self, report: dict[str, Any]) -> None:
        """End the session ``refused``.

        ``report`` has its ``code`` (``replan_exhausted``, or what else ended it) and the
        last report.
        """
        from ..journal import Journal

        if self.run_id is None:
            self.start()
        assert self.run_id is not None
        with Journal(self.journal_at, write=True) as journal:
            journal.end_planning(self.run_id, status="refused", report=report,
                                 params=self.params)
