"""The one front door: what the CLI and tests call (SPEC §5-§9).

Checking (``validate``, ``policy_check``, ``plans``, ``plan_for_viewing``), driving runs
(``execute`` here; ``resume``, ``retry``, ``resolve``, ``unlock``, ``explain`` from
:mod:`planrun.lifecycle`), reading the journal (``status``, ``runs``, ``log``, ``follow``,
``output``, ``report``), journal maintenance (``prune``, ``forget``), and what the CLI
shows of plans and tools. Commands that drive a run return a :class:`~planrun.outcome.RunOutcome`.

Functions here take settings and plain values, return plain data (dicts, reports,
outcomes) and raise :class:`~planrun.errors.PlanrunError` subclasses; they never print.
Rendering is the CLI's job (:mod:`planrun.cli`, :mod:`planrun.ui`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .checking import (
    Loaded,
    _first_code,
    check,
    check_approve,
    file_sha256,
    grant_warnings,
    journaled_path,
    load_params_file,
    load_registry,
    no_gc,
    param_input,
    project_key,
)
from .errors import InternalError, Refused
from .issues import Issue, Report
from .outcome import RunOutcome
from .paths import Settings, load_settings, present, probe, shown_path
from .reading import (
    follow,
    forget,
    log,
    log_page,
    log_stream,
    output,
    parse_age,
    plan_outline,
    prune,
    report,
    runs,
    status,
)
from .validation import CheckedPlan, ParamInput

if TYPE_CHECKING:
    from pathlib import Path

    from .planning import Planned

__all__ = [
    "DryRun", "Loaded", "Report", "RunOutcome", "approve", "check", "check_approve",
    "deny", "describe_plan", "describe_tools", "execute", "explain", "file_sha256", "follow",
    "forget", "grant_warnings",
    "init_project", "journaled_path", "json_schema", "load_params_file", "load_registry",
    "load_settings", "log", "log_page", "log_stream", "no_gc", "output", "param_input",
    "parse_age", "plan",
    "plan_for_viewing",
    "plan_names", "plan_outline", "plans", "policy_check", "project_key", "prune",
    "read_plan_input", "render_graph", "resolve", "resume", "retry", "runs", "status", "unlock",
    "validate",
]
__all__ += ["repair"]  # issue 13: planrun repair (planrun.repair)
__all__ += ["report"]  # issue 18: planrun report (planrun.report)


def validate(settings: Settings, names: Sequence[str], given: ParamInput | None = None,
             *, stdin: bytes | None = None) -> Report:
    """Check the registry and the named plans (all plans in the folder when none).

    A plan free of errors has its ``plan`` summary completed with ``params`` (the values
    used) and ``steps`` (as substituted; see :func:`planrun.validation.substituted.substituted`).
    The name ``-`` is the plan in ``stdin`` (the bytes read from standard input; JSON or
    YAML), reported as file ``<stdin>``. Registry or configuration problems are reported
    before any plan is looked at.

    Raises:
        UsageError: ``-`` is named but no ``stdin`` was given (exit 2).
    """
    from .checking import check_stdin
    from .errors import UsageError
    from .paths import plan_names
    from .validation.substituted import substituted

    if "-" in names and stdin is None:
        raise UsageError("'-' names the plan on standard input, but none was read")
    try:
        registry = load_registry(settings)
    except Refused as exc:
        return exc.report if isinstance(exc.report, Report) else Report()
    report = Report()
    targets = list(names) or plan_names(settings.plans_dir)
    if not targets:
        report.issues.append(Issue(code="not_found", severity="warning", file=shown_path(
            settings.plans_dir), message=_no_plans(settings.plans_dir)))
    concrete = bool(given and given.given)
    for name in targets:
        if name == "-" and stdin is not None:
            loaded = check_stdin(settings, stdin, registry, given, concrete=concrete)
        else:
            loaded = check(settings, name, registry, given, concrete=concrete)
        if loaded.plan is not None and loaded.report.plan is not None:
            loaded.report.plan.update(substituted(loaded.plan))
        report.plans.append(loaded.report)
    return report


def plan(settings: Settings, goal: str, planner: str, *, name: str | None = None,
         max_rounds: int | None = None, given: ParamInput | None = None,
         out: str | None = None, concrete: bool | None = None,
         on_round: Callable[[int, Any], None] | None = None) -> Planned:
    """Ask a planner for a plan for ``goal`` and write it (``planrun plan``, SPEC §10).

    ``planner``: ``cmd:ARGV``, ``python:module:callable`` or a ``[planners]`` name. The
    arguments, the result and the rules for NAME and the revision are those of
    :func:`planrun.planning.plan`.

    Raises:
        UsageError: a malformed ``--planner``, an empty goal, a bad NAME (exit 2).
        Refused: ``replan_exhausted`` with the last report, or ``registry``/``config``
            (exit 3).
        JournalError: the journal is unusable (exit 6).
    """
    from .planning import plan as ask_planner

    return ask_planner(settings, goal, planner, name=name, max_rounds=max_rounds,
                       given=given, out=out, concrete=concrete, on_round=on_round)


def read_plan_input(stream: Any) -> bytes:
    """The bytes of one plan from a binary stream (``validate -``), read to a bound.

    At most one byte over the plan size bound is read: more is refused (``too_large``) by
    :func:`validate` without holding all of it.
    """
    from .loading import MAX_FILE_BYTES

    data: bytes = stream.read(MAX_FILE_BYTES + 1)
    return data


def policy_check(settings: Settings) -> Report:
    """Lint the policy itself: configuration errors, then warnings (``planrun policy check``).

    Errors: unknown tools/classes, bad levels, grants without ``expires``. Warnings:
    classes without tools, expired grants, irreversible tools nothing clears unattended.
    """
    from .policy import lint, load_policy

    try:
        registry = load_registry(settings)
    except Refused as exc:
        return exc.report if isinstance(exc.report, Report) else Report()
    shown = shown_path(settings.config_file) if settings.config_file else None
    policy, _ = load_policy(settings.policy or {}, set(registry.tools), shown)
    irreversible = {name: spec.entry.irreversible for name, spec in registry.tools.items()}
    report = Report(issues=lint(policy, irreversible, shown))
    # The plans of the project: a step that no grant can ever clear is a warning here too.
    from .paths import plan_names

    for name in plan_names(settings.plans_dir):
        loaded = check(settings, name, registry, None, concrete=False)
        report.issues.extend(i for i in loaded.report.issues if i.code == "ungrantable")
    return report


def plan_for_viewing(settings: Settings, name: str, given: ParamInput | None = None
                     ) -> CheckedPlan:
    """A checked plan for ``show`` and ``graph`` (parameters without values are fine).

    Raises:
        Refused: the registry or the plan has errors (exit 3, with the report).
    """
    registry = load_registry(settings)
    loaded = check(settings, name, registry, given, concrete=bool(given and given.given))
    if loaded.plan is None:
        raise Refused(f"plan {name!r} does not pass validation",
                      code=_first_code(loaded.report), report=Report(plans=[loaded.report]))
    return loaded.plan


@dataclass(eq=False)
class DryRun:
    """What ``execute --dry-run`` would do: order, approvals, parameters."""

    plan: CheckedPlan
    order: list[str]
    approvals: list[Any] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The dry run as ``execute --dry-run --json`` prints it.

        ``{"plan", "order", "approvals": [step ids], "steps": [{"id", "tool", "when",
        "for_each", "arguments"}]}`` (run-time placeholders as written).
        """
        from .params import as_written, shown_as_written

        by_id = self.plan.by_id
        return {"plan": self.plan.name, "order": self.order,
                "approvals": [r.step_id for r in self.approvals],
                "steps": [{"id": sid, "tool": by_id[sid].tool.name, "when": by_id[sid].when,
                           "for_each": shown_as_written(by_id[sid].for_each,
                                                        by_id[sid].raw.get("for_each")),
                           "arguments": as_written(by_id[sid].arguments)}
                          for sid in self.order]}


def _settled(drive: Callable[[], RunOutcome], settings: Settings | None = None,
             dispatcher: Any = None) -> RunOutcome:
    """``drive()``; a bug that ended the run ``failed`` is that run's outcome (SPEC §5).

    With ``settings`` naming a cluster (``executor``, SPEC §12) and no ``dispatcher``
    given, the cluster is connected to first, before anything is journaled
    (:func:`planrun.runner.executor_for`).

    The outcome's ``error`` is the :class:`~planrun.errors.InternalError`; without a
    manifest (the journal could not be read) it is raised.
    """
    from .runner import executor_for

    try:
        if settings is None:
            return drive()
        with executor_for(settings, dispatcher):
            return drive()
    except InternalError as exc:
        if exc.manifest is None:
            raise
        return RunOutcome(exc.manifest, error=exc,
                          abandoned_calls=getattr(exc, "abandoned_calls", 0))


def execute(settings: Settings, name: str, given: ParamInput, *,
            approve: Sequence[str] = (), approve_all: bool = False, approver: Any = None,
            max_parallel: int | None = None, keep_going: bool = False,
            dry_run: bool = False, progress: Any = None,
            dispatcher: Any = None, planned_by: str | None = None,
            defer_approval: bool = False) -> RunOutcome | DryRun:
    """Load, check, journal, clear and run one plan (SPEC §5).

    ``dispatcher`` (a :class:`planrun.dispatch.Dispatcher`) makes the calls; default:
    the local one (threads and child processes of this process). ``planned_by``: the
    planning session that wrote the plan (``execute --planner``), named in the run's
    ``planned`` event as ``planning_run``.

    ``defer_approval`` (``--defer-approval``, SPEC §10): nobody is asked now (``approver``
    is not used, also on a terminal). ``approve``, ``approve_all`` and grants clear what
    they cover; when a step is left, the run is journaled ``awaiting_approval`` with
    nothing run, and the outcome's manifest (``status`` ``awaiting_approval``,
    ``exit_code`` 4) has ``approval``: ``{"waiting": [{"step", "tool", "reason"}],
    "approve", "deny", "resume"}`` — the commands a person uses to decide.

    Returns:
        The run's outcome (``dry_run``: a :class:`DryRun`, nothing journaled or run); a
        bug that ended the run failed is in its ``error``.

    Raises:
        Refused: the plan, registry or configuration is refused (exit 3); the run is
            journaled ``refused`` when the plan file was found.
        UsageError: ``--approve`` names no step of the plan (exit 2).
        ApprovalError: a step was denied or could not be cleared (exit 4).
        JournalError: the journal is unusable (exit 6).
    """
    from . import approval

    registry = load_registry(settings)
    loaded = check(settings, name, registry, given, concrete=True)
    report = Report(plans=[loaded.report])
    if loaded.plan is None:
        refused_id = (_journal_refused(settings, loaded, report)
                      if loaded.path is not None and not dry_run else None)
        raise Refused(f"plan {name!r} was refused", code=_first_code(loaded.report),
                      report=report, run_id=refused_id)
    plan = loaded.plan
    check_approve(approve, plan)
    requests = [approval.request_for(s) for s in plan.steps if s.approval_reason]
    if dry_run:
        return DryRun(plan=plan, order=plan.order(), approvals=requests)
    requests = [r for r in requests
                if approval.cleared_before(plan.by_id[r.step_id], approve, approve_all)]
    return _settled(lambda: _start(settings, loaded, plan, requests, approve, approve_all,
                                   None if defer_approval else approver, max_parallel,
                                   keep_going, progress, dispatcher, planned_by,
                                   defer=defer_approval), settings, dispatcher)


def _start(settings: Settings, loaded: Loaded, plan: CheckedPlan, requests: list[Any],
           approve: Sequence[str], approve_all: bool, approver: Any,
           max_parallel: int | None, keep_going: bool, progress: Any,
           dispatcher: Any = None, planned_by: str | None = None,
           defer: bool = False) -> RunOutcome:
    """Journal the checked plan as a new run, clear its approvals, drive it."""
    from . import clearance, runner
    from .journal import Journal
    from .journal.store import lease_owner, new_run_id

    run_id = new_run_id()
    parallel = max_parallel or plan.max_parallel or settings.max_parallel
    owner = lease_owner()
    with Journal(settings.journal, write=True) as journal:
        journal.create_run(run=runner.new_run(
            plan, run_id=run_id, root_run_id=run_id, owner=owner, document=plan.document,
            plan_file=journaled_path(loaded.path, settings), project=project_key(settings),
            options={"max_parallel": parallel, "keep_going": keep_going,
                     "file_sha256": file_sha256(loaded.path, plan)},
        ), steps=[(s.id, s.index, s.tool.name) for s in plan.steps],
            event_data={"plan": plan.name, "revision": plan.revision, "digest": plan.digest,
                        **({"planning_run": planned_by} if planned_by else {})})
        journal.owner = owner
        # A fresh run's keys are its own, except those of ``dedupe: plan`` tools: another
        # run of the plan may be calling one of those right now.
        journal.fresh_keys = all(s.tool.entry.dedupe == "run" for s in plan.steps)
        with runner.internal_guard(journal, run_id):
            if requests and clearance.clear_approvals(
                    journal, run_id, requests, set(approve), approve_all, approver,
                    on_deny="denied", plan=plan, policy=plan.policy,  # the registry's
                    defer=defer):
                from . import manifest

                return RunOutcome(manifest.build(journal, run_id))  # awaiting_approval
            return runner.drive(journal, settings, plan, run_id=run_id, root_run_id=run_id,
                                owner=owner, max_parallel=parallel, keep_going=keep_going,
                                progress=progress, fresh=True, dispatcher=dispatcher,
                                approver=approver, approve=set(approve),
                                approve_all=approve_all)



def _journal_refused(settings: Settings, loaded: Loaded, report: Report) -> str:
    """Journal the refused plan as a run ``refused`` (SPEC §4); its run id."""
    from . import redact
    from .canonical import digest
    from .formats import MAX_STORED_INT
    from .journal import Journal, NewRun, now
    from .journal.store import new_run_id

    run_id = new_run_id()
    data = redact.stored_plan(loaded.document)
    name = (data.get("name") if isinstance(data, dict) and isinstance(data.get("name"), str)
            else loaded.path.stem if loaded.path else "plan")
    try:
        dig = digest(data)
    except (TypeError, ValueError):
        dig = ""
    revision = data.get("revision") if isinstance(data, dict) else None
    with Journal(settings.journal, write=True) as journal:
        journal.refuse_run(run=NewRun(
            run_id=run_id, root_run_id=run_id, plan_name=str(name),
            plan_file=journaled_path(loaded.path, settings),
            project=project_key(settings), plan=data, digest=dig,
            revision=revision if isinstance(revision, int) and not isinstance(
                revision, bool) and 1 <= revision <= MAX_STORED_INT else 1,
            goal=data.get("goal") if isinstance(data, dict) and isinstance(
                data.get("goal"), str) else None,
            status="refused", report=report.to_json(), created_at=now(), finished_at=now(),
        ), report={"issues": [i.to_json() for i in loaded.report.issues]})
        for issue in loaded.report.issues:
            if issue.code == "refused":
                journal.add_event(run_id, "autonomy_refused", step_id=issue.step,
                                  data={"message": issue.message})
    return run_id


def plans(settings: Settings) -> list[dict[str, Any]]:
    """The plans of the plans folder: name, revision, goal, steps, what needs approval.

    Each: ``{"name", "file", "revision", "goal", "steps", "needs_approval": [step ids],
    "ok", "issues"}`` (a plan that does not pass validation has ``ok`` false and its
    issue count; its other fields are what could be read).

    Raises:
        Refused: the registry or configuration is invalid (exit 3).
    """
    from .paths import plan_names

    registry = load_registry(settings)
    out = []
    for name in plan_names(settings.plans_dir):
        loaded = check(settings, name, registry, None, concrete=False)
        p = loaded.plan
        doc = loaded.document if isinstance(loaded.document, dict) else {}
        errors = [i for i in loaded.report.issues if i.severity == "error"]
        steps = doc.get("steps")
        out.append({
            "name": p.name if p else name,
            "file": loaded.report.file,
            "revision": p.revision if p else doc.get("revision", 1),
            "goal": p.goal if p else doc.get("goal"),
            "steps": len(p.steps) if p else len(steps) if isinstance(steps, list) else 0,
            "needs_approval": [s.id for s in p.steps if s.approval_reason] if p else [],
            "ok": not errors, "issues": len(errors),
        })
    return out


# --- after a run stopped (SPEC §7): resume, explain, resolve, retry, unlock ------------


def resume(settings: Settings, ref: str | None, given: ParamInput | None = None, *,
           approve: Sequence[str] = (), approve_all: bool = False, approver: Any = None,
           max_parallel: int | None = None, progress: Any = None,
           defer_approval: bool = False) -> RunOutcome:
    """Continue an interrupted run without repeating finished steps.

    ``ref``: a run id or prefix; None: the most recent interrupted or running run (a run
    ``awaiting_approval`` is continued only when named).

    Decisions journaled earlier (by ``execute`` or ``approve``) whose digest still matches
    are reused; the person is asked for what is missing. ``defer_approval``: nobody is
    asked; what is still missing leaves the run ``awaiting_approval`` (outcome exit 4), as
    for :func:`execute`.

    Returns:
        The run's outcome (a note when the plan file changed since the run started).

    Raises:
        RunError: ``unknown_run``, ``run_not_resumable``, ``run_busy``, ``indeterminate``
            (exit 5).
        Refused: the journaled plan no longer passes validation (exit 3).
        UsageError: ``--approve`` names no step, or ``-p`` gives a journaled value (exit 2).
        ApprovalError: a step still needing clearance was not cleared (exit 4).
    """
    from . import lifecycle

    return _settled(lambda: lifecycle.resume(
        settings, ref, given, approve=list(approve), approve_all=approve_all,
        approver=None if defer_approval else approver, max_parallel=max_parallel,
        progress=progress, defer_approval=defer_approval), settings)


def approve(settings: Settings, ref: str, steps: Sequence[str] = (), *,
            approve_all: bool = False, approver: Any = None,
            reason: str | None = None) -> dict[str, Any]:
    """Decide on the steps a run ``awaiting_approval`` waits for (SPEC §10).

    ``steps`` (or ``approve_all``) approve by name (method ``flag``); with neither, the
    ``approver`` (a person at a terminal) is asked about each waiting step. Decisions are
    journaled as at ``execute`` and reused by :func:`resume` while their digest matches.

    Returns:
        ``{"run_id", "status", "approved": [step ids], "already": [named steps that were
        not waiting], "waiting": [step ids still waiting], "next"}``.

    Raises:
        UsageError: ``unknown_step`` — a named step is not in the run (exit 2).
        ApprovalError: ``approval_required`` (nothing named, nobody to ask) or
            ``approval_denied`` (the person said no; the run is now ``denied``) (exit 4).
        RunError: ``unknown_run``, ``run_busy``, ``not_awaiting_approval`` (exit 5).
        JournalError: the journal is unusable (exit 6).
    """
    from . import awaiting
    from .journal import Journal

    with Journal(settings.journal, write=True) as journal:
        return awaiting.approve(journal, ref, list(steps), approve_all=approve_all,
                                approver=approver, reason=reason)


def deny(settings: Settings, ref: str, *, reason: str | None = None) -> dict[str, Any]:
    """Deny a run ``awaiting_approval``: its waiting steps are denied, the run ``denied``.

    Returns:
        The run's manifest (status ``denied``).

    Raises:
        RunError: ``unknown_run``, ``run_busy``, ``not_awaiting_approval`` (exit 5).
        JournalError: the journal is unusable (exit 6).
    """
    from . import awaiting, manifest
    from .journal import Journal

    with Journal(settings.journal, write=True) as journal:
        run_id = awaiting.deny(journal, ref, reason=reason)
        return manifest.build(journal, run_id)


def retry(settings: Settings, run_ref: str, given: ParamInput | None = None, *,
          approve: Sequence[str] = (), approve_all: bool = False, approver: Any = None,
          max_parallel: int | None = None, keep_going: bool = False,
          progress: Any = None, from_step: str | None = None,
          defer_approval: bool = False) -> RunOutcome:
    """Start a child run of a failed run that inherits its succeeded steps.

    ``from_step``: the run may be completed too; that step and every step after it run
    again. ``defer_approval``: as :func:`execute`'s; the child may be left
    ``awaiting_approval`` (``exit_code`` 4 in its manifest).

    Returns:
        The child run's outcome.

    Raises:
        RunError: ``unknown_run``, ``run_not_resumable``, ``run_busy``, ``indeterminate``
            (exit 5).
        Refused: the journaled plan no longer passes validation (exit 3).
        UsageError: ``--approve``/``--from`` name no step (``unknown_step``, exit 2).
        ApprovalError: a step to run again was not cleared (exit 4).
    """
    from .retry import retry as start_child

    return _settled(lambda: start_child(
        settings, run_ref, given, approve=list(approve), approve_all=approve_all,
        approver=approver, max_parallel=max_parallel, keep_going=keep_going,
        progress=progress, from_step=from_step, defer_approval=defer_approval), settings)


def repair(settings: Settings, run_ref: str, planner: str, *,
           max_rounds: int | None = None, given: ParamInput | None = None,
           approve: Sequence[str] = (), approve_all: bool = False, approver: Any = None,
           max_parallel: int | None = None, keep_going: bool = False,
           progress: Any = None, on_round: Callable[[int, Any], None] | None = None,
           on_written: Callable[[str], None] | None = None,
           defer_approval: bool = False) -> RunOutcome:
    """Ask a planner to revise a failed run's plan; run the revision as a child (SPEC §10).

    ``planner``: ``cmd:ARGV``, ``python:module:callable`` or a ``[planners.NAME]``.
    See :func:`planrun.repair.repair` (what may change, the request's ``run``, and
    ``on_round``/``on_written``, what the CLI says on stderr). ``defer_approval``: as
    :func:`retry`'s.

    Returns:
        The child run's outcome.

    Raises:
        RunError: ``unknown_run``, ``run_not_resumable`` (not failed), ``run_busy``,
            ``indeterminate`` (exit 5).
        Refused: ``replan_exhausted`` (exit 3), with the last round's report.
        UsageError: ``-p`` gives a value the run has, ``--approve`` names no step (exit 2).
        ApprovalError: a step to run was not cleared (exit 4).
    """
    from .repair import repair as replan

    return _settled(lambda: replan(
        settings, run_ref, planner, max_rounds=max_rounds, given=given,
        approve=list(approve), approve_all=approve_all, approver=approver,
        max_parallel=max_parallel, keep_going=keep_going, progress=progress,
        on_round=on_round, on_written=on_written, defer_approval=defer_approval), settings)


def explain(settings: Settings, ref: str | None, given: ParamInput | None = None
            ) -> dict[str, Any]:
    """What :func:`resume` would do, per step, and why; changes nothing.

    Returns:
        ``{"run_id", "status", "lease", "calls", "revalidation": {"ok", "issues"},
        "would_stop", "steps": [{"step", "tool", "status", "action", "why"}], "notes"}``.

    Raises:
        RunError: ``unknown_run``, ``run_not_resumable`` (exit 5).
        UsageError: ``-p`` gives a journaled value, as for resume (exit 2).
    """
    from . import lifecycle

    return lifecycle.explain(settings, ref, given)


def resolve(settings: Settings, run_ref: str, step: str, *, succeeded: bool,
            output: str | None, reason: str | None, item: int | None = None
            ) -> dict[str, Any]:
    """Settle an indeterminate step (or fan-out ``item``) by a person's word.

    ``output``: with ``succeeded``, the step's output as JSON text.

    Returns:
        The run's manifest.

    Raises:
        UsageError: ``--output`` is not JSON or does not fit, a fan-out step without
            ``item`` (exit 2).
        RunError: ``unknown_run``, ``run_busy``, or the step is not indeterminate (exit 5).
    """
    from . import settle

    return settle.resolve(settings, run_ref, step, succeeded=succeeded, output=output,
                             reason=reason, item=item)


def unlock(settings: Settings, run_ref: str) -> dict[str, Any]:
    """Release a run's lease whose holder cannot be proven dead (another host).

    Returns:
        ``{"run_id", "released", "owner"}``.

    Raises:
        RunError: ``unknown_run``; ``run_busy`` when the holder or a call of the run is
            a live process on this host (exit 5).
    """
    from . import settle

    return settle.unlock(settings, run_ref)


# --- what the CLI shows of plans, tools and file formats --------------------------------


def describe_plan(plan: CheckedPlan) -> dict[str, Any]:
    """A checked plan as ``planrun show`` prints it (see :func:`planrun.views.describe_plan`)."""
    from .views import describe_plan as describe

    return describe(plan)


def render_graph(plan: CheckedPlan, fmt: str) -> str:
    """The plan's dependency graph as text: ``fmt`` ``mermaid`` or ``dot``."""
    from .views import render_graph as render

    return render(plan, fmt)


def describe_tools(registry: Any, *, allowed: bool = False) -> list[dict[str, Any]]:
    """The registered tools as ``planrun tools`` prints them.

    ``allowed``: only those the policy lets a plan use (``planrun tools --allowed``).
    """
    from .views import describe_tools as describe

    return describe(registry, allowed=allowed)


def json_schema(kind: str) -> dict[str, Any]:
    """The JSON Schema of ``kind``: ``plan`` or ``tools`` (tools.yaml)."""
    from .views import json_schema as schema

    return schema(kind)


def init_project(folder: str) -> list[str]:
    """Create a starter project in ``folder``; the files written (shown paths).

    Raises:
        UsageError: a file to write exists already (exit 2).
    """
    from pathlib import Path

    from .views import init_project as init

    return [str(p) for p in init(Path(folder))]



def plan_names(settings: Settings) -> list[str]:
    """Names of the plans in the project's plans folder."""
    from .paths import plan_names as names

    return names(settings.plans_dir)


def _no_plans(folder: Path) -> str:
    """Why ``validate`` with no plan named checked none: an empty, missing or no folder."""
    shown = shown_path(folder)
    if probe(folder, "is_dir"):
        return f"no plans in {shown}"
    if present(folder):
        return f"the plans folder {shown} is not a folder"
    return f"no plans folder {shown}"
