"""The facade the CLI and tests both call: validate, execute, status, runs, log, output.

Functions here take settings and plain values, return plain data (dicts, reports) and
raise :class:`~planrun.errors.PlanrunError` subclasses; they never print. Rendering is the
CLI's job (:mod:`planrun.cli`, :mod:`planrun.ui`).
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import Refused, RunError, UsageError
from .issues import Issue, PlanReport, Report
from .paths import PlanLookupError, Settings, find_plan, shown_path
from .validation import CheckedPlan, ParamInput


@dataclass
class Loaded:
    """A registry plus one located plan file and its check."""

    report: PlanReport
    plan: CheckedPlan | None
    document: Any = None
    path: Path | None = None


def load_params_file(path: str | None) -> dict[str, Any]:
    """Values of ``--params-file`` (YAML or JSON mapping, native types).

    Raises:
        Refused: unreadable, invalid, or not a mapping (codes ``syntax``, ``duplicate_key``,
            ``too_large``, ``schema``; exit 3).
    """
    if path is None:
        return {}
    from .loading import DocumentError, load_file

    p = Path(path)
    from .paths import probe

    if not probe(p, "is_file"):
        what = "is not a file" if probe(p) else "does not exist"
        raise UsageError(f"--params-file {path!r} {what}")
    try:
        doc = load_file(p)
    except DocumentError as exc:
        raise Refused(f"cannot read parameters from {path}: {exc}",
                      code=exc.issues[0].code, report=Report(issues=exc.issues)) from None
    if not isinstance(doc.data, dict):
        issue = Issue(code="schema", file=path, message="a params file must be a mapping of "
                      "parameter names to values")
        raise Refused(issue.message, code="schema", report=Report(issues=[issue]))
    return dict(doc.data)


def param_input(cli: Sequence[str] = (), params_file: str | None = None) -> ParamInput:
    """Parse ``-p NAME=VALUE`` options and ``--params-file``.

    ``PLANRUN_PARAM_<NAME>`` environment values are offered too (used only for declared
    parameters, below ``-p``).

    Raises:
        UsageError: a ``-p`` without ``=`` (exit 2).
    """
    values: dict[str, str] = {}
    for item in cli:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"-p {item!r}: write -p NAME=VALUE")
        if name in values:
            raise UsageError(f"-p {name} is given twice; give each parameter once")
        values[name] = value
    env = {k[len("PLANRUN_PARAM_"):]: v for k, v in os.environ.items()
           if k.startswith("PLANRUN_PARAM_")}
    env.update({k.lower(): v for k, v in env.items() if k.lower() not in env})
    return ParamInput(cli=values, file_values=load_params_file(params_file), env=env)


def load_registry(settings: Settings) -> Any:
    """The registry with its policy attached.

    Raises:
        Refused: code ``registry`` (every registry issue) or ``config`` (every policy
            issue), exit 3.
    """
    from .policy import load_policy
    from .registry import load_registry as _load

    registry, issues = _load(settings.registry, settings.pools)
    if issues:
        raise Refused(f"{settings.registry} has {len(issues)} problem(s)", code="registry",
                      report=Report(issues=issues))
    if settings.policy:
        shown = shown_path(settings.config_file) if settings.config_file else None
        registry.policy, problems = load_policy(settings.policy, set(registry.tools), shown)
        if problems:
            raise Refused(f"the policy in {shown} has {len(problems)} problem(s)",
                          code="config", report=Report(issues=problems))
    return registry


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a large document is loaded and checked.

    Loading allocates millions of acyclic objects, and the collector's passes over them
    made validation time grow faster than the plan (2-3x slower at 100,000 steps).
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def check(settings: Settings, name: str, registry: Any, given: ParamInput | None,
          *, concrete: bool | None = None) -> Loaded:
    """Locate, load and check one plan; problems are in the report, never raised."""
    with no_gc():
        return _check(settings, name, registry, given, concrete=concrete)


def _check(settings: Settings, name: str, registry: Any, given: ParamInput | None,
           *, concrete: bool | None = None) -> Loaded:
    from .loading import DocumentError, load_file
    from .validation import check_plan, plan_name

    try:
        path = find_plan(name, settings.plans_dir)
    except PlanLookupError as exc:
        return Loaded(PlanReport(file=exc.issue.file, issues=[exc.issue]), None)
    shown = _shown(path, settings)
    try:
        doc = load_file(path, display=shown)
    except DocumentError as exc:
        return Loaded(PlanReport(file=shown, issues=list(exc.issues)), None, path=path)
    report, plan = check_plan(doc, registry, settings, given, concrete=concrete,
                              name_hint=plan_name(path, doc))
    if plan is not None:
        report.issues.extend(grant_warnings(plan, doc))
    return Loaded(report, plan, document=doc.data, path=path)


def grant_warnings(plan: CheckedPlan, doc: Any = None) -> list[Issue]:
    """``ungrantable`` warnings: steps the policy means grants to clear, that none ever can.

    A step needing clearance whose tool (or class) a grant names, or whose class is
    ``act``, but whose arguments (or ``for_each``) are only known at run time: no grant
    can check them before the run, so an unattended run always stops with exit 4
    (issue 10, bug 1). ``doc`` (a :class:`~planrun.loading.Document`) locates the issue.
    """
    from .params import StepRef, Template

    def steps_read(value: Any) -> bool:  # a Template holding {steps.…}: run time only
        if isinstance(value, Template):
            return any(isinstance(r, StepRef) for r in value.refs())
        if isinstance(value, dict):
            return any(steps_read(v) for v in value.values())
        if isinstance(value, list):
            return any(steps_read(v) for v in value)
        return False

    def templated(value: Any) -> bool:
        if isinstance(value, Template):
            return True
        if isinstance(value, dict):
            return any(templated(v) for v in value.values())
        if isinstance(value, list):
            return any(templated(v) for v in value)
        return False

    policy = plan.policy
    if policy is None:
        return []
    out: list[Issue] = []
    for step in plan.steps:
        if not step.approval_reason or step.approval_reason == "escalate":
            continue
        literal = isinstance(step.for_each, list) and not templated(step.for_each)
        if step.for_each is not None and not literal:
            what = "for_each"
        elif (steps_read(step.arguments) if step.for_each is not None
              else templated(step.arguments)):
            what = "arguments"
        else:
            continue
        c = step.tool.name
        cls = policy.class_of(c)
        names = [g.id for g in policy.grants
                 if g.tool == c or (cls is not None and g.cls == cls[0])]
        if not names and not (cls is not None and cls[1] == "act"):
            continue
        which = (f"grant {', '.join(repr(n) for n in names)} names"
                 if names else f"class {cls[0]!r} (level act) holds" if cls else "")
        path = f"/steps/{step.index}/{what}"
        line = col = None
        if doc is not None:
            with contextlib.suppress(Exception):
                line, col = doc.locate(path)
        out.append(Issue(
            code="ungrantable", severity="warning", step=step.id, path=path,
            file=plan.file or None, line=line, column=col,
            message=f"step {step.id!r}: no grant can ever clear it unattended: "
            f"{which} its tool {c!r}, but its {what} are only known at run time, and a "
            "grant checks arguments before the run. An unattended run (cron, CI) stops "
            f"with exit 4; give the {what} from parameters or literals, or clear the step "
            f"with --approve {step.id}"))
    return out


def _shown(path: Path, settings: Settings) -> str:
    return shown_path(path)


def validate(settings: Settings, names: Sequence[str], given: ParamInput | None = None
             ) -> Report:
    """Check the registry and the named plans (all plans in the folder when none).

    Registry or configuration problems are reported before any plan is looked at.
    """
    from .paths import plan_names

    try:
        registry = load_registry(settings)
    except Refused as exc:
        return exc.report if isinstance(exc.report, Report) else Report()
    report = Report()
    targets = list(names) or plan_names(settings.plans_dir)
    if not targets:
        report.issues.append(Issue(code="not_found", severity="warning", file=shown_path(
            settings.plans_dir), message=f"no plans in {shown_path(settings.plans_dir)}"))
    concrete = bool(given and given.given)
    for name in targets:
        report.plans.append(check(settings, name, registry, given, concrete=concrete).report)
    return report


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


@dataclass
class DryRun:
    """What ``execute --dry-run`` would do: order, approvals, parameters."""

    plan: CheckedPlan
    order: list[str]
    approvals: list[Any] = field(default_factory=list)


def execute(settings: Settings, name: str, given: ParamInput, *,
            approve: Sequence[str] = (), approve_all: bool = False, approver: Any = None,
            max_parallel: int | None = None, keep_going: bool = False,
            dry_run: bool = False, progress: Any = None,
            dispatcher: Any = None) -> dict[str, Any] | DryRun:
    """Load, check, journal, clear and run one plan (SPEC §5).

    ``dispatcher`` (a :class:`planrun.dispatch.Dispatcher`) makes the calls; default:
    the local one (threads and child processes of this process).

    Returns:
        The manifest (``dry_run``: a :class:`DryRun`, nothing journaled or run).

    Raises:
        Refused: the plan, registry or configuration is refused (exit 3); the run is
            journaled ``refused`` when the plan file was found.
        UsageError: ``--approve`` names no step of the plan (exit 2).
        ApprovalError: a step was denied or could not be cleared (exit 4).
        JournalError: the journal is unusable (exit 6).
    """
    from . import approval, runner
    from .journal import Journal, dumps, now
    from .journal.store import lease_owner, lease_ttl, new_run_id

    registry = load_registry(settings)
    loaded = check(settings, name, registry, given, concrete=True)
    report = Report(plans=[loaded.report])
    if loaded.plan is None:
        if loaded.path is not None and not dry_run:
            _journal_refused(settings, loaded, report)
        raise Refused(f"plan {name!r} was refused", code=_first_code(loaded.report),
                      report=report)
    plan = loaded.plan
    check_approve(approve, plan)
    requests = [approval.request_for(s) for s in plan.steps if s.approval_reason]
    if dry_run:
        return DryRun(plan=plan, order=plan.order(), approvals=requests)

    run_id = new_run_id()
    parallel = max_parallel or plan.max_parallel or settings.max_parallel
    owner = lease_owner()
    with Journal(settings.journal, write=True) as journal:
        created = now()
        journal.create_run(run={
            "run_id": run_id, "root_run_id": run_id, "parent_run_id": None,
            "plan_name": plan.name, "plan_file": journaled_path(loaded.path, settings),
            "project": project_key(settings), "plan_json": dumps(plan.document),
            "digest": plan.digest, "revision": plan.revision, "goal": plan.goal,
            "params_json": dumps(runner.stored_params(plan)),
            "contracts_json": dumps(runner.contracts(plan)),
            "options_json": dumps({"max_parallel": parallel, "keep_going": keep_going,
                                   "file_sha256": file_sha256(loaded.path, plan)}),
            "status": "running", "created_at": created, "lease_owner": owner,
            "lease_expires": time.time() + lease_ttl(),
        }, steps=[(s.id, s.index, s.tool.name) for s in plan.steps],
            event_data={"plan": plan.name, "revision": plan.revision, "digest": plan.digest})
        journal.owner = owner
        journal.fresh_keys = True
        with runner.internal_guard(journal, run_id):
            if requests:
                runner.clear_approvals(journal, run_id, requests, set(approve), approve_all,
                                       approver, on_deny="denied", plan=plan,
                                       policy=registry.policy)
            return runner.drive(journal, settings, plan, run_id=run_id, root_run_id=run_id,
                                owner=owner, max_parallel=parallel, keep_going=keep_going,
                                progress=progress, fresh=True, dispatcher=dispatcher)


def check_approve(approve: Sequence[str], plan: CheckedPlan) -> None:
    """Refuse ``--approve`` naming no step of the plan, suggesting the closest step.

    Raises:
        UsageError: ``usage`` (exit 2), e.g. ``--approve 'pubish': the plan has no such
            step. Did you mean 'publish'?``.
    """
    from .issues import did_you_mean

    unknown = [s for s in approve if s not in plan.by_id]
    if unknown:
        needs = [s.id for s in plan.steps if s.approval_reason]
        raise UsageError(f"--approve {unknown[0]!r}: the plan has no such step."
                         + did_you_mean(unknown[0], plan.by_id),
                         hint=f"Steps: {', '.join(plan.by_id)}"
                         + (f"; needing approval: {', '.join(needs)}." if needs else "."))


def project_key(settings: Settings) -> str:
    """The project folder as journaled with each run: absolute, symlinks resolved."""
    try:
        return str(settings.project.resolve())
    except OSError:
        return str(settings.project)


def journaled_path(path: Path | None, settings: Settings) -> str | None:
    """A plan file's path as journaled: relative to the project folder when inside it.

    With the run's ``project`` column it means the same from any current folder (issue
    10, bug 3); a file outside the project is journaled absolute.
    """
    if path is None:
        return None
    try:
        full = path.resolve()
    except OSError:
        full = path.absolute()
    try:
        return str(full.relative_to(project_key(settings)))
    except ValueError:
        return str(full)


def file_sha256(path: Path | None, plan: CheckedPlan | None = None) -> str | None:
    """SHA-256 of a plan file's bytes (to notice later edits cheaply), or None.

    None too for a plan whose file holds a secret parameter's ``default``: a digest of
    those bytes would let the secret be guessed from the journal.
    """
    import hashlib

    declared = plan.document.get("params") if plan is not None else None
    if isinstance(declared, dict) and any(
            isinstance(declared.get(n), dict) and "default" in declared[n]
            for n in plan.secret_params):  # type: ignore[union-attr]
        return None
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path else None
    except OSError:
        return None


def _first_code(report: PlanReport) -> str:
    return report.issues[0].code if report.issues else "refused"


def _journal_refused(settings: Settings, loaded: Loaded, report: Report) -> None:
    from . import redact
    from .canonical import digest
    from .journal import Journal, dumps, now
    from .journal.store import new_run_id
    from .models import MAX_STORED_INT

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
        journal.refuse_run(run={
            "run_id": run_id, "root_run_id": run_id, "plan_name": str(name),
            "plan_file": journaled_path(loaded.path, settings),
            "project": project_key(settings), "plan_json": dumps(data), "digest": dig,
            "revision": revision if isinstance(revision, int) and not isinstance(
                revision, bool) and 1 <= revision <= MAX_STORED_INT else 1,
            "goal": data.get("goal") if isinstance(data, dict) and isinstance(
                data.get("goal"), str) else None,
            "params_json": "{}", "contracts_json": "{}", "status": "refused",
            "report_json": dumps(report.to_json()), "created_at": now(), "finished_at": now(),
        }, report={"issues": [i.to_json() for i in loaded.report.issues]})
        for issue in loaded.report.issues:
            if issue.code == "refused":
                journal.add_event(run_id, "autonomy_refused", step_id=issue.step,
                                  data={"message": issue.message})


# --- reading ---------------------------------------------------------------------------


def _reader(settings: Settings, write: bool = False) -> Any:
    from .journal import Journal

    journal = Journal(settings.journal, write=write)
    journal.project = project_key(settings)  # what `last` means here
    return journal


def status(settings: Settings, run_ref: str = "last") -> dict[str, Any]:
    """The manifest of a run (id, unique prefix, or ``last``: this project's latest run).

    Raises:
        RunError: ``unknown_run`` (exit 5).
    """
    from . import manifest

    with _reader(settings) as journal:
        return manifest.build(journal, journal.resolve_run_id(run_ref))


def runs(settings: Settings, *, plan: str | None = None, status: str | None = None,
         limit: int | None = None, all_projects: bool = False) -> list[dict[str, Any]]:
    """Run summaries, newest first: this project's (``all_projects``: every project's).

    Each has ``project``: the folder the run was started in (None for runs journaled
    before planrun recorded it; those are listed with every project).
    """
    with _reader(settings) as journal:
        return list(journal.list_runs(plan=plan, status=status, limit=limit,
                                      project=None if all_projects else journal.project))


def log(settings: Settings, run_ref: str = "last") -> tuple[str, list[dict[str, Any]]]:
    """(run id, the run's events in order)."""
    with _reader(settings) as journal:
        run_id = journal.resolve_run_id(run_ref)
        return run_id, list(journal.events(run_id))


def output(settings: Settings, run_ref: str, step: str, item: int | None = None) -> Any:
    """The output of one step (or fan-out item) of a run.

    Raises:
        RunError: ``unknown_run``; ``no_output`` when the step did not succeed (exit 5).
        UsageError: ``unknown_step``, the run has no such step or item (exit 2).
    """
    with _reader(settings) as journal:
        run_id = journal.resolve_run_id(run_ref)
        found = journal.step_output(run_id, step, item)
        if found is None:
            steps = [r["step_id"] for r in journal.step_rows(run_id)]
            raise UsageError(f"run {run_id} has no step {step!r}"
                             + (f" item {item}" if item is not None else "")
                             + f" (steps: {', '.join(steps)})", code="unknown_step")
        state, value = found
        if state != "succeeded":
            raise RunError(f"step {step!r} of run {run_id} is {state}; it has no output",
                           code="no_output")
        return value


def follow(settings: Settings, run_ref: str = "last", *, poll_s: float = 0.5,
           after: int = 0) -> Iterator[dict[str, Any]]:
    """The run's events in order, then new ones as they are written, until the run ends.

    Ends when the run's status is no longer ``running`` (its last events read), or when
    nobody drives it any more (no lease, the lease expired, or its holder on this host
    died). ``poll_s``: the
    seconds between two reads of the journal.

    Raises:
        RunError: ``unknown_run`` (exit 5).
    """
    from .journal import Journal

    last = after
    while True:
        with _reader(settings) as journal:
            run_id = journal.resolve_run_id(run_ref)
            run_ref = run_id
            events = [e for e in journal.events(run_id) if e["id"] > last]
            row = journal.run_row(run_id)
        yield from events
        if events:
            last = events[-1]["id"]
        from .journal.store import holder_alive

        owner = row["lease_owner"]
        driven = (owner is not None and (row["lease_expires"] or 0) > time.time()
                  and holder_alive(owner) is not False)
        if row["status"] != "running" or not driven:
            with Journal(settings.journal, write=False) as journal:
                tail = [e for e in journal.events(run_id) if e["id"] > last]
            yield from tail
            return
        time.sleep(poll_s)


def parse_age(text: str) -> float:
    """Seconds of an age such as ``30d``, ``12h``, ``90m``, ``2w``, ``45s``.

    Raises:
        UsageError: not a positive whole number followed by s, m, h, d or w (exit 2).
    """
    import re

    m = re.fullmatch(r"\s*(\d+)\s*([smhdw])\s*", text)
    if not m or int(m.group(1)) == 0:
        raise UsageError(f"--older-than {text!r}: give a number and a unit, e.g. 30d, 12h, "
                         "90m, 2w (s, m, h, d, w)")
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[
        m.group(2)]


def prune(settings: Settings, *, older_than: str, status: str | None = None,
          plan: str | None = None, all_projects: bool = False,
          dry_run: bool = False) -> dict[str, Any]:
    """Delete runs started more than ``older_than`` ago, then reclaim the space.

    Only this project's runs unless ``all_projects``; ``status`` and ``plan`` narrow it.
    Each run goes with its steps, items, approvals, events and idempotency keys (a later
    run can no longer replay those calls).

    Returns:
        ``{"deleted": [run ids], "events": n, "keys": n}`` (``dry_run``: what would go).

    Raises:
        UsageError: a malformed ``older_than`` (exit 2).
        RunError: ``run_busy`` when a selected run is driven by a live process (exit 5).
    """
    from datetime import UTC, datetime, timedelta

    age = parse_age(older_than)
    before = (datetime.now(UTC) - timedelta(seconds=age)).isoformat(timespec="milliseconds")
    with _reader(settings, write=not dry_run) as journal:
        if journal.conn is None:
            return {"deleted": [], "events": 0, "keys": 0}
        ids = journal.select_runs(before=before, status=status, plan=plan,
                                  project=None if all_projects else journal.project)
        if dry_run:
            return {"deleted": ids, "events": 0, "keys": 0}
        counts = journal.delete_runs(ids)
    return {"deleted": ids, "events": counts["events"], "keys": counts["keys"]}


def forget(settings: Settings, run_ref: str) -> dict[str, Any]:
    """Delete one run and everything of its (idempotency keys too), then reclaim space.

    Returns ``{"deleted": [run id], "events": n, "keys": n}``.

    Raises:
        RunError: ``unknown_run``; ``run_busy`` when a live process drives it (exit 5).
    """
    with _reader(settings, write=True) as journal:
        run_id = journal.resolve_run_id(run_ref)
        counts = journal.delete_runs([run_id])
    return {"deleted": [run_id], "events": counts["events"], "keys": counts["keys"]}


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
