"""After a run dies: resume, explain, resolve, retry, unlock (SPEC §7).

``resume`` reloads the plan **from the journal** (never the edited file), revalidates it
against the current registry, takes the run's lease, replays succeeded steps and runs the
rest. A step left ``running`` by a crash has an unknown effect: it runs again under the
same idempotency key only if its tool is ``idempotent``; otherwise resume stops with
``indeterminate`` (exit 5) until a person settles it with ``planrun resolve``.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import clearance, redact, runner
from .approval import request_for, user_name
from .checking import check_approve, file_sha256, load_registry, no_gc
from .errors import Refused, RunError, UsageError
from .executor import StepState
from .issues import PlanReport, Report
from .journal import ItemRecord, Journal, RunRecord, StepRecord
from .journal.store import lease_owner, new_run_id
from .manifest import RESUMABLE
from .outcome import RunOutcome
from .paths import Settings
from .validation import CheckedPlan, ParamInput


def journaled_params(row: RunRecord, data: Any) -> tuple[dict[str, Any], set[str]]:
    """(values journaled for the run's parameters, names of its secret parameters).

    A secret is journaled as a reference to itself (``***`` in journals written before
    references): its value is not in the journal and must be given again.
    """
    from .redact import reveal

    journaled = row.params
    declared = data.get("params") if isinstance(data, dict) else None
    declared = declared if isinstance(declared, dict) else {}
    secret = {k for k, v in journaled.items()
              if redact.reference_name(v) == k or (
                  v == redact.MASK and isinstance(declared.get(k), dict)
                  and declared[k].get("secret") is True)}
    return {k: reveal(v, {}) for k, v in journaled.items() if k not in secret}, secret


def journaled_plan(settings: Settings, row: RunRecord, given: ParamInput | None
                   ) -> tuple[PlanReport, CheckedPlan | None]:
    """The run's journaled plan, checked again against the current registry and policy.

    One rebuild for ``resume``, ``retry`` and ``resume --explain``, so that explain says
    what resume does. Journaled parameter values are reused; secret ones (journaled as
    references) must be given again (``-p``, ``--params-file``, ``PLANRUN_PARAM_<NAME>``).

    Returns:
        (the plan's report, the checked plan or None when it no longer passes).

    Raises:
        Refused: the registry or configuration is invalid (codes ``registry``,
            ``config``; exit 3).
        UsageError: ``-p``/``--params-file`` give a parameter the run already has a value
            for (exit 2).
    """
    from .loading import Document
    from .validation import check_plan

    registry = load_registry(settings)
    shown = f"journal:{row.run_id} ({row.plan_file})"
    data = redact.loaded_plan(row.plan)
    # the journal wrote it: no need to parse it again, only to give issues a text to point at
    doc = Document(data=data, file=shown, text=json.dumps(data, indent=2), kind="json")
    values, secret = journaled_params(row, data)
    given = given or ParamInput()
    # The journal is the truth: a resumed run keeps the values it started with; only the
    # secrets, which were never written down, are given again.
    fixed = sorted((set(given.cli) | set(given.file_values)) & set(values))
    if fixed:
        raise UsageError(f"parameter {fixed[0]!r} keeps the value run {row.run_id} "
                         f"started with ({json.dumps(values[fixed[0]])}); -p and "
                         "--params-file give only secret parameters to resume and retry",
                         hint="To run with other values, start a new run with planrun "
                         "execute.")
    merged = ParamInput(cli={k: v for k, v in given.cli.items() if k not in values},
                        env={k: v for k, v in given.env.items() if k in secret},
                        file_values={**values, **{k: v for k, v in given.file_values.items()
                                                   if k not in values}})
    with no_gc():
        return check_plan(doc, registry, settings, merged, concrete=True,
                          name_hint=row.plan_name, known_digest=row.digest)


def _replan(journal: Journal, settings: Settings, row: RunRecord,
            given: ParamInput | None) -> CheckedPlan:
    """:func:`journaled_plan`, or ``plan_refused`` journaled and :class:`Refused` raised.

    Raises:
        Refused: the plan no longer fits (the ordinary report codes, exit 3).
        UsageError: as :func:`journaled_plan`.
    """
    report, plan = journaled_plan(settings, row, given)
    if plan is None:
        journal.add_event(row.run_id, "plan_refused",
                          data={"issues": [i.to_json() for i in report.issues],
                                "during": "resume"})
        raise Refused(f"run {row.run_id}'s plan no longer passes validation",
                      code=report.issues[0].code if report.issues else "refused",
                      report=Report(plans=[report]))
    return plan


def changed_plan_note(settings: Settings, row: RunRecord) -> str | None:
    """A note when the plan file on disk no longer matches the journaled plan.

    resume and retry always use the journaled plan; a user who edited the file expects the
    edit to apply, so say that it does not. Compares the file's bytes with the SHA-256
    journaled at execute (cheap even for a large plan).
    """
    shown = row.plan_file
    then = row.options.get("file_sha256")
    if not shown or not then:
        return None
    # The run's own project folder first (journaled since schema 2); older runs: here.
    bases = [Path(row.project)] if row.project else []
    for base in (*bases, Path.cwd(), settings.project):
        path = base / shown
        if path.is_file():
            if file_sha256(path) != then:
                return (f"{shown} changed since run {row.run_id} started; this uses the "
                        "journaled plan. To run the edited file, start a new run with "
                        "planrun execute.")
            return None
    return None


@dataclass
class Analysis:
    """What resume would do with each step of a run.

    ``blocked`` lists (step id, item index or None) whose effect is unknown and whose tool
    is not idempotent: resume stops on them.
    """

    state: dict[str, StepState]
    replay: list[str]
    rerun: list[str]
    blocked: list[tuple[str, int | None]]
    explain: list[dict[str, Any]]


def analyse(rows: list[StepRecord], plan: CheckedPlan | None,
            contracts: dict[str, Any],
            items: dict[str, list[ItemRecord]] | None = None) -> Analysis:
    """Decide, per journaled step (and fan-out item), what resume does; changes nothing.

    Args:
        rows: the run's step rows.
        plan: the revalidated plan (its registry decides ``idempotent``), or None.
        contracts: the journaled contracts (used when ``plan`` is None).
        items: fan-out item rows per step id, for steps that had started fanning out.
    """
    state: dict[str, StepState] = {}
    replay: list[str] = []
    rerun: list[str] = []
    blocked: list[tuple[str, int | None]] = []
    explain: list[dict[str, Any]] = []
    for r in rows:
        sid, st = r.step_id, r.status
        tool = plan.by_id[sid].tool if plan and sid in plan.by_id else None
        idempotent = tool.entry.idempotent if tool else bool(
            (contracts.get(r.tool) or {}).get("idempotent"))
        its = (items or {}).get(sid)
        if its and st in ("running", "indeterminate"):
            unknown = [i.index for i in its if i.status in ("running", "indeterminate")]
            done = sum(1 for i in its if i.status == "succeeded")
            if unknown and not idempotent:
                state[sid] = StepState("indeterminate")
                blocked.extend((sid, i) for i in unknown)
                action, why = "stop", (f"indeterminate: fan-out item(s) {unknown} were "
                                       f"running at crash and tool {r.tool!r} is not "
                                       "idempotent; settle each with planrun resolve --item")
            else:
                state[sid] = StepState("pending")
                rerun.append(sid)
                again = f", item(s) {unknown} again (idempotent)" if unknown else ""
                action, why = "run", (f"fan-out: {done} of {len(its)} items succeeded and "
                                      f"are replayed; the rest run{again}")
            explain.append({"step": sid, "tool": r.tool, "status": st, "action": action,
                            "why": why})
            continue
        if st == "succeeded":
            state[sid] = StepState("succeeded", r.output)
            replay.append(sid)
            action, why = "replay", f"succeeded at {r.finished_at}"
        elif st in ("running", "indeterminate"):
            was = ("running when the run stopped" if st == "running"
                   else "its effect is unknown")
            limit = _max_recoveries(plan, sid)
            if idempotent and st == "running" and r.recoveries >= limit:
                state[sid] = StepState("pending")  # the executor fails it, without a call
                rerun.append(sid)
                action, why = "fail", (f"recovery_exhausted: {was} {r.recoveries + 1} "
                                       f"time(s), and max_recoveries is {limit}")
            elif idempotent:
                state[sid] = StepState("pending")
                rerun.append(sid)
                action, why = "run", f"{was}, tool {r.tool!r} is idempotent (same key)"
            else:
                state[sid] = StepState("indeterminate")
                blocked.append((sid, None))
                action, why = "stop", (f"indeterminate ({was}) and tool {r.tool!r} is "
                                       "not idempotent; settle it with planrun resolve")
        elif st == "pending":
            state[sid] = StepState("pending")
            action, why = "run", "never dispatched"
        else:
            state[sid] = StepState(st, reason=r.skip_reason)
            action = "keep"
            why = st if st != "skipped" else f"skipped ({r.skip_reason})"
        explain.append({"step": sid, "tool": r.tool, "status": st, "action": action,
                        "why": why})
    return Analysis(state, replay, rerun, blocked, explain)


def _max_recoveries(plan: CheckedPlan | None, sid: str) -> int:
    """The step's ``max_recoveries`` (SPEC §5 "Attempts")."""
    from .executor import MAX_RECOVERIES

    step = plan.by_id.get(sid) if plan is not None else None
    limit = step.raw.get("max_recoveries") if step is not None else None
    return MAX_RECOVERIES if limit is None else int(limit)


def _items(journal: Journal, run_id: str) -> dict[str, list[ItemRecord]]:
    """Item records of the run's fan-out steps that were started."""
    out: dict[str, list[ItemRecord]] = {}
    for r in journal.steps(run_id):
        if r.status in ("running", "indeterminate"):
            rows = journal.items(run_id, r.step_id)
            if rows:
                out[r.step_id] = rows
    return out


def _resumable_run(journal: Journal, ref: str | None) -> RunRecord:
    if ref is None:
        run_id = journal.latest_resumable()
        if run_id is None:
            raise RunError("there is no interrupted or running run to resume",
                           code="run_not_resumable", hint="List runs with `planrun runs`.")
    else:
        run_id = journal.resolve_run_id(ref)
    row = journal.run(run_id)
    if row.status not in RESUMABLE:
        hint = (f"Start a child run that re-runs the failed steps: planrun retry {run_id}"
                if row.status == "failed" else "Start a new run with planrun execute.")
        raise RunError(f"run {run_id} is {row.status}; only an interrupted or running "
                       "run can be resumed", code="run_not_resumable", hint=hint)
    return row


def _indeterminate_error(run_id: str, blocked: list[tuple[str, int | None]],
                         then: str = "resume") -> RunError:
    def name(sid: str, item: int | None) -> str:
        return sid if item is None else f"{sid} --item {item}"

    cmds = "; ".join(f"planrun resolve {run_id} {name(sid, item)} --succeeded "
                     "[--output JSON] | --failed [--reason TEXT]" for sid, item in blocked)
    shown = ", ".join(sid if item is None else f"{sid}[{item}]" for sid, item in blocked)
    many = len(blocked) > 1
    return RunError(
        f"run {run_id}: {'steps' if many else 'step'} {shown} {'were' if many else 'was'} "
        f"running when the run stopped and {'their tools are' if many else 'its tool is'} not "
        f"idempotent, so the effect is unknown; {then} will not call "
        f"{'them' if many else 'it'} again on its own", code="indeterminate",
        hint=f"Check what happened, then settle each: {cmds}; then planrun {then} {run_id}.",
        details={"steps": [{"step": s, "item": i} for s, i in blocked]})


def resume(settings: Settings, ref: str | None, given: ParamInput | None = None, *,
           approve: list[str] | None = None, approve_all: bool = False, approver: Any = None,
           max_parallel: int | None = None, keep_going: bool | None = None,
           progress: Any = None) -> RunOutcome:
    """Continue an interrupted run (SPEC §7 "planrun resume").

    Raises:
        RunError: ``unknown_run``, ``run_not_resumable``, ``run_busy``, ``indeterminate``
            (exit 5).
        Refused: the journaled plan no longer passes validation (exit 3).
        ApprovalError: a step that still needs clearance was not cleared (exit 4); the run
            stays resumable.
    """
    owner = lease_owner()
    with Journal(settings.journal, write=True) as journal, contextlib.ExitStack() as guard:
        row = _resumable_run(journal, ref)
        run_id = row.run_id
        journal.take_lease(run_id, owner, statuses=RESUMABLE)
        guard.enter_context(runner.internal_guard(journal, run_id))  # a bug: run failed
        try:
            plan = _replan(journal, settings, row, given)
            if approve:
                check_approve(approve, plan)
            found = analyse(journal.steps(run_id), plan,
                            row.contracts, _items(journal, run_id))
            if found.blocked:
                journal.mark_indeterminate(run_id, found.blocked,
                                           "running when the run died; effect unknown")
                raise _indeterminate_error(run_id, found.blocked)
            to_run = {sid for sid, st in found.state.items() if st.status == "pending"}
            requests = _missing_approvals(journal, run_id, plan, to_run)
            if requests:
                clearance.clear_approvals(journal, run_id, requests, set(approve or []),
                                       approve_all, approver, on_deny=None, plan=plan,
                                       policy=plan.policy, whole_run=[
                                           request_for(s) for s in plan.steps
                                           if s.approval_reason])
            options = row.options
            parallel = max_parallel or options.get("max_parallel") or settings.max_parallel
            going = options.get("keep_going", False) if keep_going is None else keep_going
            journal.begin_resume(run_id, found.replay, {
                "by": owner, "replayed": len(found.replay), "rerun": found.rerun})
        except BaseException:
            journal.release_lease(run_id, owner)
            raise
        note = changed_plan_note(settings, row)
        outcome = runner.drive(journal, settings, plan, run_id=run_id,
                               root_run_id=row.root_run_id, owner=owner,
                               max_parallel=int(parallel), keep_going=bool(going),
                               state=found.state, progress=progress)
        outcome.notes.extend([note] if note else [])
        return outcome


def _missing_approvals(journal: Journal, run_id: str, plan: CheckedPlan,
                       to_run: set[str]) -> list[Any]:
    """Requests for steps about to run that have no granted decision with the same digest.

    The digest covers the arguments and the tool as registered (SPEC §6), so a tool whose
    registration changed since is asked about again. A grant's decision is never reused:
    grants are checked again against the policy and clock of this moment (one removed,
    expired or narrowed since clears nothing).
    """
    granted = {(a.step_id, a.digest) for a in journal.approval_records(run_id)
               if a.granted and a.method != "grant"}
    out = []
    for step in plan.steps:
        if step.approval_reason and step.id in to_run:
            req = request_for(step)
            if (step.id, req.digest) not in granted:
                out.append(req)
    return out


def explain(settings: Settings, ref: str | None, given: ParamInput | None = None
            ) -> dict[str, Any]:
    """What ``resume`` would do, per step, and why; changes nothing."""
    with Journal(settings.journal, write=False) as journal:
        if journal.conn is None:
            raise RunError("the journal is empty; there is no run to resume",
                           code="run_not_resumable")
        row = _resumable_run(journal, ref)
        run_id = row.run_id
        problems = None
        plan = None
        try:  # the plan as resume would rebuild it (a UsageError: resume's too)
            report, plan = journaled_plan(settings, row, given)
            if plan is None:
                problems = [i.to_json() for i in report.issues]
        except Refused as exc:
            problems = [i.to_json() for i in exc.report.all_issues()] if isinstance(
                exc.report, Report) else [{"code": exc.code, "message": exc.message}]
        found = analyse(journal.steps(run_id), plan, row.contracts,
                        _items(journal, run_id))
        lease = None
        if row.lease is not None:
            lease = {"owner": row.lease.owner, "alive": row.lease.holder_alive(),
                     "expires_in_s": round(row.lease.remaining_s, 1)}
        calls = journal.calls(run_id)
        busy = any(c["alive"] is not False for c in calls)
        note = changed_plan_note(settings, row)
        return {"run_id": run_id, "status": row.status, "lease": lease, "calls": calls,
                "revalidation": {"ok": problems is None, "issues": problems or []},
                "would_stop": bool(found.blocked) or problems is not None or busy,
                "steps": found.explain, "notes": [note] if note else []}


def resolve(settings: Settings, run_ref: str, step: str, *, succeeded: bool,
            output: str | None, reason: str | None, item: int | None = None
            ) -> dict[str, Any]:
    """Settle an indeterminate step by a person's word (``indeterminate_resolved``).

    Raises:
        UsageError: ``--output`` is not JSON (exit 2).
        RunError: ``unknown_run``, ``run_busy``, or the step is not indeterminate (exit 5).
    """
    value = None
    if output is not None:
        if not succeeded:
            raise UsageError("--output goes with --succeeded")
        from .loading import DocumentError, parse_text

        try:  # the rules of a JSON file: finite numbers, bounded depth, text, no dup keys
            value = redact.escape_value(parse_text(output, kind="json").data)
        except DocumentError as exc:
            raise UsageError(f"--output is not valid JSON: {exc.issues[0].message}") from None
    owner = lease_owner()
    with Journal(settings.journal, write=True) as journal:
        run_id = journal.resolve_run_id(run_ref)
        journal.take_lease(run_id, owner)
        try:
            if item is None and journal.items(run_id, step):
                raise UsageError(f"step {step!r} fans out: resolve its indeterminate items "
                                 "one by one with --item N")
            if succeeded:
                _check_resolved_output(settings, journal.run(run_id), step, item,
                                       value, output is not None)
            journal.resolve_step(run_id, step, succeeded=succeeded, output=value,
                                 reason=reason, decided_by=user_name(), item=item)
        finally:
            journal.release_lease(run_id, owner)
        from . import manifest

        return manifest.build(journal, run_id)


def _readers(document: Any, step: str) -> list[str]:
    """Ids of the plan's steps that read ``step``'s output.

    In their arguments, ``for_each`` or ``when``.
    """
    import re

    from .params import StepRef, references

    out = []
    for s in (document.get("steps") or []) if isinstance(document, dict) else []:
        if not isinstance(s, dict):
            continue
        used = {"arguments": s.get("arguments"), "for_each": s.get("for_each")}
        reads = any(isinstance(ref, StepRef) and ref.step == step
                    for _ptr, ref in references(used))
        when = s.get("when")
        if not reads and isinstance(when, str):
            reads = re.search(rf"\bsteps\.{re.escape(step)}\b", when) is not None
        if reads:
            out.append(str(s.get("id")))
    return out


def _check_resolved_output(settings: Settings, row: RunRecord, step: str,
                           item: int | None, value: Any, given: bool) -> None:
    """Refuse a ``resolve --succeeded`` whose output later steps could not use.

    Without ``--output`` the output is null: refused when a later step reads it (it would
    fail on the null, and a succeeded step cannot be resolved again). A given output must
    fit the tool's ``output_schema`` (per item for a fan-out) in the current registry.

    Raises:
        UsageError: ``usage`` (exit 2), naming the readers or the schema problem.
    """
    what = f"step {step!r}" + (f" item {item}" if item is not None else "")
    readers = _readers(row.plan, step)
    if not given and readers:
        raise UsageError(f"{what}: later steps read its output ({', '.join(readers)}), so "
                         "resolving it as succeeded needs the output it produced",
                         hint="Give it with --output JSON (as `planrun output` would print "
                         "it), or resolve it --failed.")
    if not given:
        return
    try:
        registry = load_registry(settings)
    except Exception:  # no registry to check against: the journal keeps what was given
        return
    tool = None
    for s in row.plan.get("steps") or []:
        if isinstance(s, dict) and s.get("id") == step:
            tool = s.get("tool")
    spec = registry.tools.get(tool) if isinstance(tool, str) else None
    schema = getattr(getattr(spec, "entry", None), "output_schema", None)
    if not schema:
        return
    from .registry import strict_validator

    errors = [e.message for e in strict_validator(schema).iter_errors(value)]
    if errors:
        raise UsageError(f"--output does not fit the output_schema of tool {tool!r} "
                         f"({what}): {errors[0]}",
                         hint="Give the output the tool would have returned.")


def retry(settings: Settings, run_ref: str, given: ParamInput | None = None, *,
          approve: list[str] | None = None, approve_all: bool = False, approver: Any = None,
          max_parallel: int | None = None, keep_going: bool = False,
          progress: Any = None, from_step: str | None = None) -> RunOutcome:
    """Start a child run of a failed run that inherits its succeeded steps (SPEC §7).

    ``from_step`` (``retry RUN --from STEP``): the run may also be ``completed``; STEP and
    every step after it (its descendants) run again even if they succeeded, under fresh
    idempotency keys (the lineage's keys of those steps are released first).

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
        allowed = ("failed", "completed") if from_step else ("failed",)
        if row.status not in allowed:
            hint = (f"Use planrun resume {parent_id}." if row.status in RESUMABLE
                    else f"Re-run steps with planrun retry {parent_id} --from STEP, or "
                    "start a new run with planrun execute." if row.status == "completed"
                    else "Start a new run with planrun execute.")
            raise RunError(f"run {parent_id} is {row.status}; only a failed run is "
                           "retried" + (" (or a completed one, with --from)"
                                        if not from_step else ""),
                           code="run_not_resumable", hint=hint)
        # The parent's lease is held for the whole child run: two retries of one run at
        # once would both re-run its failed steps.
        journal.take_lease(parent_id, owner, statuses=allowed)
        try:
            return _retry_child(journal, settings, row, given, owner, approve or [],
                                approve_all, approver, max_parallel, keep_going, progress,
                                from_step)
        finally:
            journal.release_lease(parent_id, owner)


def _retry_child(journal: Journal, settings: Settings, row: RunRecord,
                 given: ParamInput | None, owner: str, approve: list[str],
                 approve_all: bool, approver: Any, max_parallel: int | None,
                 keep_going: bool, progress: Any, from_step: str | None = None
                 ) -> RunOutcome:
    """Create and drive the child run of the failed run ``row`` (its lease is held)."""
    parent_id = row.run_id
    plan = _replan(journal, settings, row, given)
    check_approve(approve, plan)
    parent_rows = journal.steps(parent_id)
    unknown: list[tuple[str, int | None]] = [
        (r.step_id, None) for r in parent_rows if r.status in (
        "indeterminate", "running") and r.step_id in plan.by_id
        and not plan.by_id[r.step_id].tool.entry.idempotent]
    if unknown:
        # A child run would call them again without anyone knowing whether the first call
        # had its effect: a person settles them first.
        raise _indeterminate_error(parent_id, unknown, then="retry")
    again: set[str] = set()
    if from_step is not None:
        again = _from_and_after(plan, from_step)
        journal.release_keys(row.root_run_id, sorted(again))
    inherited = [r.step_id for r in parent_rows if r.status == "succeeded"
                 and r.step_id in plan.by_id and r.step_id not in again]
    child = new_run_id()
    options = row.options
    parallel = max_parallel or options.get("max_parallel") or settings.max_parallel
    journal.create_run(run=runner.new_run(
        plan, run_id=child, root_run_id=row.root_run_id, parent_run_id=parent_id,
        owner=owner, document=row.plan, plan_file=row.plan_file, project=row.project,
        options={"max_parallel": parallel, "keep_going": keep_going,
                 "file_sha256": options.get("file_sha256")},
    ), steps=[(s.id, s.index, s.tool.name) for s in plan.steps],
        event_data={"plan": plan.name, "retry_of": parent_id})
    journal.owner = owner
    with runner.internal_guard(journal, child):  # a bug ends the child run failed
        return _drive_child(journal, settings, row, plan, child, owner, inherited,
                            parent_rows, approve, approve_all, approver, int(parallel),
                            keep_going, progress)


def _drive_child(journal: Journal, settings: Settings, row: RunRecord,
                 plan: CheckedPlan, child: str, owner: str, inherited: list[str],
                 parent_rows: list[StepRecord], approve: list[str], approve_all: bool,
                 approver: Any, parallel: int, keep_going: bool, progress: Any
                 ) -> RunOutcome:
    """Clear and run the new child run ``child`` of the failed run ``row``."""
    parent_id = row.run_id
    journal.copy_succeeded(parent_id, child, inherited)
    state = {sid: StepState("succeeded", r.output)
             for r in parent_rows if (sid := r.step_id) in inherited}
    to_run = set(plan.by_id) - set(inherited)
    requests = [request_for(s) for s in plan.steps
                if s.approval_reason and s.id in to_run]
    if requests:
        clearance.clear_approvals(journal, child, requests, set(approve), approve_all,
                               approver, on_deny="denied", plan=plan, policy=plan.policy)
    note = changed_plan_note(settings, row)
    outcome = runner.drive(journal, settings, plan, run_id=child,
                           root_run_id=row.root_run_id, owner=owner,
                           max_parallel=int(parallel), keep_going=keep_going, state=state,
                           progress=progress, also_leased=[parent_id])
    outcome.notes.extend([note] if note else [])
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
    out = {step}
    changed = True
    while changed:
        changed = False
        for s in plan.steps:
            if s.id not in out and any(d in out for d in s.depends_on):
                out.add(s.id)
                changed = True
    return out


def unlock(settings: Settings, run_ref: str) -> dict[str, Any]:
    """Release a run's lease whose holder cannot be proven dead automatically.

    Returns ``{"run_id", "released", "owner"}``.

    Raises:
        RunError: ``run_busy`` when the holder is a live process on this host (exit 5).
    """
    with Journal(settings.journal, write=True) as journal:
        run_id = journal.resolve_run_id(run_ref)
        row = journal.run(run_id)
        holder = row.lease.owner if row.lease else None
        if row.lease and row.lease.holder_alive() is True and not row.lease.expired:
            raise RunError(f"run {run_id}'s lease is held by a live process on this host "
                           f"({holder})", code="run_busy",
                           hint="Stop that process (Ctrl-C or SIGTERM) instead.")
        live = [c for c in journal.calls(run_id) if c["alive"]]
        if live:
            pgid = live[0]["pgid"]
            raise RunError(f"run {run_id}: the call of step {live[0]['step']!r} still runs on "
                           f"this host (process group {pgid})", code="run_busy",
                           hint=f"Wait for it to end, or end it (kill -TERM -{pgid}).")
        # what was recorded on another host cannot be checked from here: the person
        # unlocking says it is over (SPEC §7 "planrun unlock")
        journal.forget_calls(run_id)
        journal.release_lease(run_id)
        return {"run_id": run_id, "released": holder is not None, "owner": holder}
