"""After a run dies: resume and ``resume --explain`` (SPEC §7).

``resume`` reloads the plan **from the journal** (never the edited file), revalidates it
against the current registry, takes the run's lease, replays succeeded steps and runs the
rest. A step left ``running`` by a crash has an unknown effect: it runs again under the
same idempotency key only if its tool is ``idempotent``; otherwise resume stops with
``indeterminate`` (exit 5) until a person settles it with ``planrun resolve``
(:mod:`planrun.settle`). ``retry`` is :mod:`planrun.retry`; both rebuild the journaled
plan with :func:`journaled_plan`, as ``explain`` does.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import clearance, redact, runner
from .approval import cleared_before, request_for
from .checking import check_approve, file_sha256, load_registry, no_gc
from .errors import ApprovalError, Refused, RunError, UsageError
from .executor import Later, StepState
from .issues import PlanReport, Report
from .journal import ItemRecord, Journal, RunRecord, StepRecord
from .journal.store import lease_owner
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


def run_param_input(row: RunRecord, data: Any, given: ParamInput | None,
                    declared: set[str] | None = None) -> ParamInput:
    """The parameters to check ``data`` (the run's plan, or a repair's revision) with.

    The journal is the truth: the run's journaled values are kept; only its secrets, which
    were never written down, are given again (``-p``, ``--params-file``,
    ``PLANRUN_PARAM_<NAME>``), and parameters it did not have may be given. ``declared``
    (a repair's revision): only journaled values of the parameters it declares are kept.

    Raises:
        UsageError: ``-p``/``--params-file`` give a parameter the run already has a value
            for (exit 2).
    """
    values, secret = journaled_params(row, data)
    given = given or ParamInput()
    if declared is not None:
        values = {k: v for k, v in values.items() if k in declared}
        # the run's secrets are asked for again; a revision that no longer declares one
        # does not refuse the value it was given (param_unknown)
        gone = secret - declared
        given = ParamInput(cli={k: v for k, v in given.cli.items() if k not in gone},
                           file_values={k: v for k, v in given.file_values.items()
                                        if k not in gone}, env=given.env)
    fixed = sorted((set(given.cli) | set(given.file_values)) & set(values))
    if fixed:
        raise UsageError(f"parameter {fixed[0]!r} keeps the value run {row.run_id} "
                         f"started with ({json.dumps(values[fixed[0]])}); -p and "
                         "--params-file give only secret parameters to resume and retry",
                         hint="To run with other values, start a new run with planrun "
                         "execute.")
    return ParamInput(cli={k: v for k, v in given.cli.items() if k not in values},
                      env={k: v for k, v in given.env.items() if k in secret or (
                          declared is not None and k in declared and k not in values)},
                      file_values={**values, **{k: v for k, v in given.file_values.items()
                                                 if k not in values}})


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
    doc = Document.of_data(data, shown)
    merged = run_param_input(row, data, given)
    with no_gc():
        return check_plan(doc, registry, settings, merged, concrete=True,
                          name_hint=row.plan_name, known_digest=row.digest)


def _replan(journal: Journal, settings: Settings, row: RunRecord,
            given: ParamInput | None, verb: str = "resume") -> CheckedPlan:
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
        secrets = missing_secrets(row, report.issues)
        if secrets:
            raise Refused(f"run {row.run_id} needs its secret parameter(s) "
                          f"{', '.join(map(repr, secrets))} again: a secret is never "
                          "journaled", code="param_missing", report=Report(plans=[report]),
                          hint="Give " + " ".join(f"-p {n}=VALUE" for n in secrets)
                          + " to this command (or --params-file, or "
                          + ", ".join(f"PLANRUN_PARAM_{n}" for n in secrets)
                          + "); nothing else of the plan changed.")
        raise Refused(f"run {row.run_id}'s plan (as journaled from {row.plan_file}) no "
                      "longer passes validation against the current tools.yaml and "
                      "policy",
                      code=report.issues[0].code if report.issues else "refused",
                      report=Report(plans=[report]),
                      hint="The issues point into the journaled plan by JSON Pointer. "
                      "Put the tool contracts or policy back as they were when the run "
                      f"started, then planrun {verb} {row.run_id}; or start the plan "
                      "anew with planrun execute.")
    return plan


def missing_secrets(row: RunRecord, issues: list[Any]) -> list[str]:
    """The secret parameters a journaled plan lacks, when they are all that is wrong.

    A secret's value is never journaled (SPEC §7), so ``resume``, ``retry`` and ``approve
    --resume`` need it given again: that is not a plan that "no longer passes validation".
    [] when any other issue is there.
    """
    declared = row.plan.get("params") if isinstance(row.plan, dict) else None
    if not isinstance(declared, dict) or not issues:
        return []
    names: list[str] = []
    for issue in issues:
        name = (issue.path or "").removeprefix("/params/")
        schema = declared.get(name)
        if issue.code != "param_missing" or not isinstance(schema, dict) \
                or schema.get("secret") is not True:
            return []
        names.append(name)
    return sorted(set(names))


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


@dataclass(eq=False)
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
            items: dict[str, list[ItemRecord]] | None = None, *,
            explain: bool = True) -> Analysis:
    """Decide, per journaled step (and fan-out item), what resume does; changes nothing.

    Args:
        rows: the run's step rows.
        plan: the revalidated plan (its registry decides ``idempotent``), or None.
        contracts: the journaled contracts (used when ``plan`` is None).
        items: fan-out item rows per step id, for steps that had started fanning out.
        explain: also say why, step by step (``Analysis.explain``; else it is empty).
    """
    state: dict[str, StepState] = {}
    replay: list[str] = []
    rerun: list[str] = []
    blocked: list[tuple[str, int | None]] = []
    why_each: list[dict[str, Any]] = []
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
            if explain:
                why_each.append({"step": sid, "tool": r.tool, "status": st,
                                 "action": action, "why": why})
            continue
        if st == "succeeded":
            state[sid] = StepState("succeeded", Later(r))
            replay.append(sid)
            action, why = "replay", f"succeeded at {r.finished_at}"
        elif st == "partial":
            # finished (issue 17): its output is replayed, its failed items are not run
            # again by resume (planrun retry runs them)
            state[sid] = StepState("partial", Later(r))
            replay.append(sid)
            action, why = "replay", (f"partial at {r.finished_at}: its items that "
                                     "succeeded are replayed, failed items are not run "
                                     "again (planrun retry runs them)")
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
        if explain:
            why_each.append({"step": sid, "tool": r.tool, "status": st, "action": action,
                             "why": why})
    return Analysis(state, replay, rerun, blocked, why_each)


def _max_recoveries(plan: CheckedPlan | None, sid: str) -> int:
    """The step's ``max_recoveries`` (SPEC §5 "Attempts")."""
    from .executor import MAX_RECOVERIES

    step = plan.by_id.get(sid) if plan is not None else None
    limit = step.raw.get("max_recoveries") if step is not None else None
    return MAX_RECOVERIES if limit is None else int(limit)


def _items(journal: Journal, run_id: str, rows: list[StepRecord]
           ) -> dict[str, list[ItemRecord]]:
    """Item records of the run's fan-out steps that were started (``rows``: its steps)."""
    out: dict[str, list[ItemRecord]] = {}
    for r in rows:
        if r.status in ("running", "indeterminate"):
            items = journal.items(run_id, r.step_id)
            if items:
                out[r.step_id] = items
    return out


#: A run waiting for a person (SPEC §10): resumed only when named, never by default.
AWAITING = "awaiting_approval"


def _resumable_run(journal: Journal, ref: str | None, settings: Settings) -> RunRecord:
    """The run ``resume`` (or ``--explain``) acts on: ``ref``, or this project's latest.

    Without ``ref``: the most recent ``interrupted`` or ``running`` run of this project,
    as ``planrun runs`` lists them (a journal shared by several projects must not resume
    another project's run against this project's registry; decided here, SPEC §8 is
    silent on projects).
    """
    if ref is None:
        from .checking import project_key
        from .journal.backends import shown_location

        project = project_key(settings)
        run_id = journal.latest_resumable(project)
        if run_id is None:
            raise RunError(f"there is no interrupted or running run of the project {project} "
                           f"to resume (journal {shown_location(settings.journal)})",
                           code="run_not_resumable", hint="List runs with `planrun runs` "
                           "(--all: every project's); name one to resume it (planrun "
                           "resume RUN); a run awaiting approval is resumed only by name, "
                           "after planrun approve RUN.")
    else:
        run_id = journal.resolve_run_id(ref)
    row = journal.run(run_id)
    if row.status == AWAITING and ref is not None:
        return row
    if row.status not in RESUMABLE:
        hint = (f"Start a child run that re-runs the failed steps: planrun retry {run_id}"
                if row.status == "failed" else "Start a new run with planrun execute.")
        raise RunError(f"run {run_id} is {row.status}; only an interrupted or running "
                       "run (or one awaiting approval) can be resumed",
                       code="run_not_resumable", hint=hint)
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
        "cut short (the run stopped, or a timeout killed the call) and "
        f"{'their tools are' if many else 'its tool is'} not "
        f"idempotent, so the effect is unknown; {then} will not call "
        f"{'them' if many else 'it'} again on its own", code="indeterminate",
        hint=f"Check what happened, then settle each: {cmds}; then planrun {then} {run_id}.",
        details={"steps": [{"step": s, "item": i} for s, i in blocked]})


def resume(settings: Settings, ref: str | None, given: ParamInput | None = None, *,
           approve: list[str] | None = None, approve_all: bool = False, approver: Any = None,
           max_parallel: int | None = None, keep_going: bool | None = None,
           progress: Any = None, defer_approval: bool = False) -> RunOutcome:
    """Continue an interrupted run (SPEC §7 "planrun resume").

    A run ``awaiting_approval`` (SPEC §10) is continued when ``ref`` names it: decisions
    journaled for it (``execute`` flags, ``planrun approve``) are reused while their
    digest matches; what is missing is asked (``approver``) or cleared by flags/grants.
    ``defer_approval`` (no ``approver``): what is still missing leaves the run
    ``awaiting_approval`` again, and the outcome says so (exit 4).

    Raises:
        RunError: ``unknown_run``, ``run_not_resumable``, ``run_busy``, ``indeterminate``
            (exit 5).
        Refused: the journaled plan no longer passes validation (exit 3).
        ApprovalError: a step that still needs clearance was not cleared (exit 4); the run
            stays resumable (an awaiting run stays awaiting; a person's "no" at the prompt
            ends an awaiting run ``denied``).
    """
    owner = lease_owner()
    with Journal(settings.journal, write=True) as journal, contextlib.ExitStack() as guard:
        row = _resumable_run(journal, ref, settings)
        run_id = row.run_id
        journal.take_lease(run_id, owner, statuses=(*RESUMABLE, AWAITING))
        guard.enter_context(runner.internal_guard(journal, run_id))  # a bug: run failed
        try:
            plan = _replan(journal, settings, row, given)
            if approve:
                check_approve(approve, plan)
            rows = journal.steps(run_id)
            found = analyse(rows, plan, row.contracts, _items(journal, run_id, rows),
                            explain=False)
            if found.blocked:
                journal.mark_indeterminate(run_id, found.blocked,
                                           "running when the run died; effect unknown")
                raise _indeterminate_error(run_id, found.blocked)
            to_run = {sid for sid, st in found.state.items() if st.status == "pending"}
            requests = _missing_approvals(journal, run_id, plan, to_run,
                                          set(approve or []), approve_all)
            if requests:
                try:
                    left = clearance.clear_approvals(
                        journal, run_id, requests, set(approve or []), approve_all,
                        approver, on_deny=None, plan=plan, policy=plan.policy,
                        whole_run=[request_for(s) for s in plan.steps
                                   if cleared_before(s, approve or [], approve_all)],
                        defer=defer_approval)
                except ApprovalError as exc:
                    if exc.code == "approval_denied" and row.status == AWAITING:
                        # a person said no to a run that waited for one: it is decided
                        journal.finish_run(run_id, "denied", {"reason": "approval_denied"})
                    raise
                if left:  # awaiting_approval again; its lease is released
                    from . import manifest

                    return RunOutcome(manifest.build(journal, run_id))
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
                               state=found.state, progress=progress,
                               approver=None if defer_approval else approver,
                               approve=set(approve or []), approve_all=approve_all,
                               notes=[note] if note else [])
        return outcome


def _missing_approvals(journal: Journal, run_id: str, plan: CheckedPlan,
                       to_run: set[str], approve: set[str], approve_all: bool
                       ) -> list[Any]:
    """Requests for steps about to run that have no granted decision with the same digest.

    An ``approve: resolved`` step is cleared at dispatch instead, unless ``--approve``
    names it (or ``--approve-all``).

    The digest covers the arguments and the tool as registered (SPEC §6), so a tool whose
    registration changed since is asked about again. A grant's decision is never reused:
    grants are checked again against the policy and clock of this moment (one removed,
    expired or narrowed since clears nothing).
    """
    granted = {(a.step_id, a.digest) for a in journal.approval_records(run_id)
               if a.granted and a.method != "grant"}
    out = []
    for step in plan.steps:
        if cleared_before(step, approve, approve_all) and step.id in to_run:
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
        row = _resumable_run(journal, ref, settings)
        run_id = row.run_id
        problems = None
        plan = None
        secrets: list[str] = []
        try:  # the plan as resume would rebuild it (a UsageError: resume's too)
            report, plan = journaled_plan(settings, row, given)
            if plan is None:
                problems = [i.to_json() for i in report.issues]
                secrets = missing_secrets(row, report.issues)
        except Refused as exc:
            problems = [i.to_json() for i in exc.report.all_issues()] if isinstance(
                exc.report, Report) else [{"code": exc.code, "message": exc.message}]
        rows = journal.steps(run_id)
        found = analyse(rows, plan, row.contracts, _items(journal, run_id, rows))
        lease = None
        if row.lease is not None:
            lease = {"owner": row.lease.owner, "alive": row.lease.holder_alive(),
                     "expires_in_s": round(row.lease.remaining_s, 1)}
        calls = journal.calls(run_id)
        busy = any(c["alive"] is not False for c in calls)
        note = changed_plan_note(settings, row)
        out: dict[str, Any] = {"run_id": run_id, "status": row.status, "lease": lease,
                               "calls": calls,
                               "revalidation": {"ok": problems is None,
                                                "issues": problems or [],
                                                "missing_secrets": secrets},
                               "would_stop": bool(found.blocked) or problems is not None
                               or busy,
                               "steps": found.explain, "notes": [note] if note else []}
        if row.status == AWAITING:
            _explain_waiting(journal, run_id, out)
        return out


def _explain_waiting(journal: Journal, run_id: str, report: dict[str, Any]) -> None:
    """An awaiting run's explanation: which steps wait for a person, how to clear them.

    Such a step's action is ``ask`` (resume asks on a terminal, or stops with exit 4
    without one); ``approval`` holds the run's waiting steps and the commands.
    """
    from .awaiting import summary

    approval = summary(journal, run_id)
    waits = {w["step"]: w for w in approval["waiting"]}
    for s in report["steps"]:
        w = waits.get(s["step"])
        if w is not None and s["action"] == "run":
            s["action"] = "ask"
            s["why"] = (f"never dispatched; needs a person's approval ({w['reason']}): "
                        f"planrun approve {run_id} {w['step']}, or resume on a terminal "
                        "to be asked")
    report["approval"] = approval
