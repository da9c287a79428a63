"""``planrun retry``: a child run of a failed (or, with ``--from``, completed) run (SPEC §7).

The child inherits the parent's succeeded steps (their outputs are replayed) and runs
the rest; a ``partial`` fan-out step (issue 17) runs again, its succeeded items replayed by
their idempotency keys and its failed items called again (a completed run with partial
steps can be retried for that); ``--from STEP`` runs that step and every step after it
again under fresh idempotency keys. The parent's lease is held for the whole child run.
"""

from __future__ import annotations

from typing import Any

from . import clearance, runner
from .approval import cleared_before, request_for
from .checking import check_approve
from .errors import RunError, UsageError
from .executor import Later, StepState
from .journal import Journal, RunRecord, StepRecord
from .journal.store import lease_owner, new_run_id
from .lifecycle import _indeterminate_error, _replan, changed_plan_note
from .manifest import RESUMABLE
from .outcome import RunOutcome
from .paths import Settings
from .validation import CheckedPlan, ParamInput


def retry(settings: Settings, run_ref: str, given: ParamInput | None = None, *,
          approve: list[str] | None = None, approve_all: bool = False, approver: Any = None,
          max_parallel: int | None = None, keep_going: bool = False,
          progress: Any = None, from_step: str | None = None,
          defer_approval: bool = False) -> RunOutcome:
    """Start a child run of a failed run that inherits its succeeded steps (SPEC §7).

    ``from_step`` (``retry RUN --from STEP``): the run may also be ``completed``; STEP and
    every step after it (its descendants) run again even if they succeeded, under fresh
    idempotency keys (the lineage's keys of those steps are released first).
    ``defer_approval`` (``retry --defer-approval``, as execute's, SPEC §10): nobody is
    asked; a step that flags and grants do not clear leaves the child
    ``awaiting_approval`` (its succeeded steps inherited, nothing run; exit 4), for
    ``planrun approve CHILD`` and ``planrun resume CHILD``.

    Raises:
        RunError: ``unknown_run``, ``run_not_resumable`` (the run is not failed),
            ``run_busy`` (exit 5).
        Refused: the journaled plan no longer passes validation (exit 3).
        ApprovalError: a step to run again was not cleared (exit 4).
    """
    owner = lease_owner()
    with Journal(settings.journal, write=True) as journal:
        parent_id = journal.resolve_run_id(run_ref)
        row = journal.run(parent_id)
        # a completed run with partial steps (issue 17) is retried too: its failed items
        allowed = ("failed", "completed") if from_step or (
            row.status == "completed" and any(
                r.status == "partial" for r in journal.steps(parent_id))) else ("failed",)
        if row.status not in allowed:
            hint = (f"Use planrun resume {parent_id}." if row.status in RESUMABLE
                    else f"It waits for a person: planrun approve {parent_id}, then "
                    f"planrun resume {parent_id}." if row.status == "awaiting_approval"
                    else f"Re-run steps with planrun retry {parent_id} --from STEP, or "
                    "start a new run with planrun execute." if row.status == "completed"
                    else "Start a new run with planrun execute.")
            raise RunError(f"run {parent_id} is {row.status}; only a failed run is "
                           "retried" + (" (or a completed one with partial steps, or "
                                        "with --from)" if not from_step else ""),
                           code="run_not_resumable", hint=hint)
        # The parent's lease is held for the whole child run: two retries of one run at
        # once would both re-run its failed steps.
        journal.take_lease(parent_id, owner, statuses=allowed)
        try:
            refuse_driven_child(journal, parent_id)
            return _retry_child(journal, settings, row, given, owner, approve or [],
                                approve_all, approver, max_parallel, keep_going, progress,
                                from_step, defer_approval)
        finally:
            journal.release_lease(parent_id, owner)


def refuse_driven_child(journal: Journal, parent_id: str) -> None:
    """``run_busy`` while a child run of ``parent_id`` (a retry or repair) is driven.

    A retry killed leaves its child to ``resume``; a second retry of the parent while that
    resume runs made a child whose first call found the key taken, and stopped, left
    ``running`` with nobody driving it and named the parent's "retried as" (found by an
    attacker). A child ``awaiting_approval`` (``--defer-approval``) waits for a person:
    a second child would run the same failed steps once both were approved. Checked with
    the parent's lease held, before anything is written.

    Raises:
        RunError: ``run_busy`` (exit 5).
    """
    for child in journal.child_run_ids(parent_id):
        if journal.run(child).status == "awaiting_approval":
            raise RunError(f"run {parent_id} has a retry, {child}, that waits for "
                           "approval", code="run_busy",
                           hint=f"Decide it: planrun approve {child} (then planrun resume "
                           f"{child}), or planrun deny {child}; then retry again if need "
                           "be.")
        lease = journal.lease(child)
        if lease is not None and lease.driven():
            raise RunError(f"run {parent_id} has a retry, {child}, that another process "
                           f"drives now ({lease.owner})", code="run_busy",
                           hint=f"Wait for it to finish (planrun log {child} --follow); "
                           f"if it fails, retry it: planrun retry {child}.")


def _retry_child(journal: Journal, settings: Settings, row: RunRecord,
                 given: ParamInput | None, owner: str, approve: list[str],
                 approve_all: bool, approver: Any, max_parallel: int | None,
                 keep_going: bool, progress: Any, from_step: str | None = None,
                 defer_approval: bool = False) -> RunOutcome:
    """Create and drive the child run of the failed run ``row`` (its lease is held)."""
    plan = _replan(journal, settings, row, given, verb="retry")
    again: set[str] = set()
    if from_step is not None:
        again = _from_and_after(plan, from_step)
    return start_child(journal, settings, row, plan, owner, approve=approve,
                       approve_all=approve_all, approver=approver,
                       max_parallel=max_parallel, keep_going=keep_going, progress=progress,
                       again=again, event_data={"plan": plan.name, "retry_of": row.run_id},
                       defer_approval=defer_approval)


def start_child(journal: Journal, settings: Settings, row: RunRecord, plan: CheckedPlan,
                owner: str, *, approve: list[str], approve_all: bool, approver: Any,
                max_parallel: int | None, keep_going: bool, progress: Any,
                again: set[str] | None = None, event_data: dict[str, Any],
                document: Any = None, plan_file: str | None = None,
                file_sha256: str | None = None,
                replanned: dict[str, Any] | None = None,
                defer_approval: bool = False) -> RunOutcome:
    """Create and drive a child run of ``row`` running ``plan`` (retry and repair, SPEC §7, §10).

    The parent's lease is held by ``owner``. The child (lineage: ``root_run_id`` of the
    parent, ``parent_run_id`` = ``row``) inherits the parent's succeeded steps that
    ``plan`` has, except those in ``again`` (their lineage keys are released so they run
    afresh), and runs the rest. ``document``/``plan_file``/``file_sha256``: the plan as
    journaled and its file (default: the parent's — a retry runs the parent's plan; a
    repair passes its revision). ``replanned`` (a repair): the data of the ``replanned``
    events journaled right after the child is created, on the child (with
    ``parent_run_id``) and on the parent (with ``child_run_id``).

    Raises:
        UsageError: ``--approve`` names no step of ``plan`` (exit 2).
        RunError: ``indeterminate``: the parent has a step of unknown effect whose tool is
            not idempotent (exit 5).
        ApprovalError: a step to run was not cleared (exit 4).
    """
    parent_id = row.run_id
    check_approve(approve, plan)
    parent_rows = journal.steps(parent_id)
    unknown: list[tuple[str, int | None]] = []
    for r in parent_rows:
        if r.status not in ("indeterminate", "running") or r.step_id not in plan.by_id \
                or plan.by_id[r.step_id].tool.entry.idempotent:
            continue
        if plan.by_id[r.step_id].for_each is None:
            unknown.append((r.step_id, None))
            continue
        # A fan-out's unknown effects are its items': once each is settled (resolve
        # --item N), the step runs again, its settled items replayed by their keys (the
        # step's own row stayed indeterminate and the run could never be retried; found
        # by an attacker).
        unknown.extend((r.step_id, i.index) for i in journal.items(parent_id, r.step_id)
                       if i.status in ("indeterminate", "running"))
    if unknown:
        # A child run would call them again without anyone knowing whether the first call
        # had its effect: a person settles them first.
        raise _indeterminate_error(parent_id, unknown, then="retry")
    again = again or set()
    if again:
        journal.release_keys(row.root_run_id, sorted(again))
    # A partial step runs again (issue 17): its items that succeeded are replayed by their
    # keys, its failed items are called again; the steps after it run again on its new
    # output (their keys kept: a call that comes out the same is replayed).
    partial = {r.step_id for r in parent_rows if r.status == "partial"}
    rerun = _and_after(plan, partial & set(plan.by_id)) if partial else set()
    inherited = [r.step_id for r in parent_rows if r.status == "succeeded"
                 and r.step_id in plan.by_id and r.step_id not in again | rerun]
    child = new_run_id()
    options = row.options
    parallel = max_parallel or options.get("max_parallel") or settings.max_parallel
    journal.create_run(run=runner.new_run(
        plan, run_id=child, root_run_id=row.root_run_id, parent_run_id=parent_id,
        owner=owner, document=row.plan if document is None else document,
        plan_file=row.plan_file if document is None else plan_file, project=row.project,
        options={"max_parallel": parallel, "keep_going": keep_going,
                 "file_sha256": options.get("file_sha256") if document is None
                 else file_sha256},
    ), steps=[(s.id, s.index, s.tool.name) for s in plan.steps], event_data=event_data)
    journal.owner = owner
    if replanned is not None:
        journal.add_event(child, "replanned", data={"parent_run_id": parent_id, **replanned})
        journal.add_event(parent_id, "replanned", data={"child_run_id": child, **replanned})
    with runner.internal_guard(journal, child):  # a bug ends the child run failed
        return _drive_child(journal, settings, row, plan, child, owner, inherited,
                            parent_rows, approve, approve_all, approver, int(parallel),
                            keep_going, progress, note_changed=document is None,
                            kind="retry" if replanned is None else "repair",
                            defer_approval=defer_approval)


def _drive_child(journal: Journal, settings: Settings, row: RunRecord,
                 plan: CheckedPlan, child: str, owner: str, inherited: list[str],
                 parent_rows: list[StepRecord], approve: list[str], approve_all: bool,
                 approver: Any, parallel: int, keep_going: bool, progress: Any,
                 note_changed: bool = True, kind: str = "retry",
                 defer_approval: bool = False) -> RunOutcome:
    """Clear and run the new child run ``child`` of the failed run ``row``.

    ``note_changed``: note when the parent's plan file changed since (a retry runs the
    journaled plan; a repair runs its own revision, so it says nothing). ``kind``:
    ``retry`` or ``repair``, as the run's first line on stderr says it.
    ``defer_approval``: nobody is asked; what is left uncleared leaves the child
    ``awaiting_approval`` (its outcome's manifest says how to decide).
    """
    parent_id = row.run_id
    journal.copy_succeeded(parent_id, child, inherited)
    state = {sid: StepState("succeeded", Later(r))
             for r in parent_rows if (sid := r.step_id) in inherited}
    to_run = set(plan.by_id) - set(inherited)
    requests = [request_for(s) for s in plan.steps
                if cleared_before(s, approve, approve_all) and s.id in to_run]
    if defer_approval:
        approver = None
    if requests and clearance.clear_approvals(
            journal, child, requests, set(approve), approve_all, approver,
            on_deny="denied", plan=plan, policy=plan.policy, defer=defer_approval):
        from . import manifest

        return RunOutcome(manifest.build(journal, child))  # awaiting_approval
    note = changed_plan_note(settings, row) if note_changed else None
    outcome = runner.drive(journal, settings, plan, run_id=child,
                           root_run_id=row.root_run_id, owner=owner,
                           max_parallel=int(parallel), keep_going=keep_going, state=state,
                           progress=progress, also_leased=[parent_id],
                           approver=approver, approve=set(approve), approve_all=approve_all,
                           begun=f"started (a {kind} of {parent_id})",
                           notes=[note] if note else [])
    return outcome


def _from_and_after(plan: CheckedPlan, step: str) -> set[str]:
    """``step`` and every step that depends on it, directly or not.

    Raises:
        UsageError: ``unknown_step`` when the plan has no such step (exit 2).
    """
    if step not in plan.by_id:
        from .issues import did_you_mean

        raise UsageError(f"--from {step!r}: the plan has no such step."
                         + did_you_mean(step, plan.by_id), code="unknown_step",
                         hint=f"Steps: {', '.join(plan.by_id)}.")
    return _and_after(plan, {step})


def _and_after(plan: CheckedPlan, steps: set[str]) -> set[str]:
    """``steps`` and every step that depends on one of them, directly or not."""
    out = set(steps)
    changed = True
    while changed:
        changed = False
        for s in plan.steps:
            if s.id not in out and any(d in out for d in s.depends_on):
                out.add(s.id)
                changed = True
    return out
