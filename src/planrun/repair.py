"""``planrun repair``: a planner revises the plan of a failed run (SPEC §10).

The request (``mode: "repair"``) carries, in ``run`` (:func:`run_context`), the failed
run's plan as journaled, its manifest, the errors of its failed steps and the ids of the
steps that succeeded. The planner answers with a revised plan; each answer is validated
like any plan, and also compared with the run (:func:`changed_succeeded`): a revision may
change only steps that did not succeed, and add new ones. A revision that changes (or
removes) a succeeded step is refused with issue ``repair_changes_succeeded`` and sent back
for the next round. The accepted revision is written as the next revision of the plan
(``plans/NAME.yaml``) and runs as a child of the failed run, exactly as ``retry`` does
(:func:`planrun.retry.start_child`): lineage, succeeded steps inherited, never re-run.

**What "changes" means.** A succeeded step is unchanged when the revision has a step with
the same ``id`` whose *effect fields* (:data:`EFFECT_FIELDS`: ``tool``, ``arguments`` as
written, ``depends_on`` as a set, ``for_each``, ``when``, ``on_item_error``,
``max_items``) are equal, a field left out counting as its default. Fields that only say
how a step was run (``intent``, ``timeout``, ``retries``, ``max_parallel``, ``pool``) may
change. Removing a succeeded step is a change. Steps that did not succeed (failed,
skipped, never run) may change freely, whatever depends on them. Parameters keep the
values the run was given, so equal arguments as written mean equal arguments.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .issues import Issue
from .pointers import pointer

#: Step fields that decide what a step did (its call, its inputs, its items, whether it ran).
EFFECT_FIELDS = ("tool", "arguments", "depends_on", "for_each", "when", "on_item_error",
                 "max_items")
#: The value of an effect field left out of a step (SPEC §3).
_DEFAULTS: dict[str, Any] = {"arguments": {}, "depends_on": [], "for_each": None,
                             "when": None, "on_item_error": "fail", "max_items": 10000}
#: The issue code of a revision that changes a step the failed run completed.
CODE = "repair_changes_succeeded"


def effect(step: dict[str, Any]) -> dict[str, Any]:
    """The effect fields of one step as written, defaults filled in, ``depends_on`` a set.

    ``depends_on`` becomes a sorted list of its distinct entries (entries that are not
    strings are kept in written order after them, so a malformed list still compares).
    """
    out: dict[str, Any] = {}
    for name in EFFECT_FIELDS:
        value = step.get(name, _DEFAULTS.get(name))
        if name == "depends_on" and isinstance(value, list):
            names = sorted({d for d in value if isinstance(d, str)})
            value = names + [d for d in value if not isinstance(d, str)]
        out[name] = value
    return out


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON data (canonical JSON: ``true`` is not ``1``, key order is nothing)."""
    from .canonical import canonical_json

    try:
        return canonical_json(a) == canonical_json(b)
    except (TypeError, ValueError):  # not JSON data: validation refuses it anyway
        return repr(a) == repr(b)


def _steps_by_id(doc: Any) -> dict[str, tuple[int, dict[str, Any]]]:
    """{id: (position, step)} of a plan document's well-formed steps (first of a duplicate)."""
    steps = doc.get("steps") if isinstance(doc, dict) else None
    out: dict[str, tuple[int, dict[str, Any]]] = {}
    for i, step in enumerate(steps if isinstance(steps, list) else []):
        if isinstance(step, dict) and isinstance(step.get("id"), str):
            out.setdefault(step["id"], (i, step))
    return out


def changed_succeeded(old: Any, new: Any, succeeded: Iterable[str], *,
                      run_id: str = "", file: str | None = None) -> list[Issue]:
    """``repair_changes_succeeded`` issues: the succeeded steps ``new`` changes or removes.

    Args:
        old: the failed run's plan document (as journaled).
        new: the revised plan document (as the planner wrote it).
        succeeded: ids of the steps that succeeded in the run.
        run_id: the failed run (named in messages).
        file: what the issues point into (e.g. ``planner:round 2``).

    Returns:
        One error per changed step (pointer ``/steps/N``, the step in ``new``, naming the
        fields that differ) and per removed step (pointer ``/steps``), in the order of
        ``old``; empty when ``new`` keeps every succeeded step. A ``new`` that is not a
        plan-shaped mapping gives none here: validation reports it.
    """
    if not isinstance(new, dict) or not isinstance(new.get("steps"), list):
        return []
    before = _steps_by_id(old)
    after = _steps_by_id(new)
    done = set(succeeded)
    run = f" in run {run_id}" if run_id else ""
    issues: list[Issue] = []
    for sid in [s for s in before if s in done]:
        if sid not in after:
            issues.append(Issue(
                code=CODE, step=sid, path=pointer("steps"), file=file,
                message=f"step {sid!r} succeeded{run} and the revision removes it; a "
                "repair keeps every succeeded step as it was (its output is inherited) "
                "and may change only steps that did not succeed"))
            continue
        was, now = effect(before[sid][1]), effect(after[sid][1])
        differ = [name for name in EFFECT_FIELDS if not _same(was[name], now[name])]
        if differ:
            issues.append(Issue(
                code=CODE, step=sid, path=pointer("steps", after[sid][0]), file=file,
                message=f"step {sid!r} succeeded{run} and the revision changes its "
                f"{', '.join(differ)}; a repair may change only steps that did not "
                "succeed: keep this step as it was, or add a new step with another id"))
    return issues


def run_context(journal: Any, run_id: str) -> dict[str, Any]:
    """The ``run`` member of a repair request: what the planner knows of the failed run.

    ``{"run_id", "root_run_id", "status", "plan" (the plan as journaled, secret defaults
    left out), "revision", "params" (the run's values, secrets as references),
    "manifest" (as ``planrun status RUN --json``), "failed": [{"step", "tool", "error":
    {"code", "message"}}], "succeeded": [step ids], "not_run": [step ids neither
    succeeded nor failed]}``. A secret's value is never in it: stored data holds the
    reference form (SPEC §7). Outputs of succeeded steps are not included (a planner reads
    them with ``planrun output`` if it needs to).

    Raises:
        RunError: ``unknown_run`` (exit 5).
    """
    from . import manifest, redact

    row = journal.run(run_id)
    shown = manifest.build(journal, run_id)
    failed, succeeded, not_run = [], [], []
    for step in shown["steps"]:
        if step["status"] == "succeeded":
            succeeded.append(step["id"])
        elif step["status"] in ("failed", "indeterminate"):
            error = step.get("error") or {}
            failed.append({"step": step["id"], "tool": step["tool"],
                           "error": {"code": error.get("code"),
                                     "message": error.get("message")}})
        else:
            not_run.append(step["id"])
    return {"run_id": row.run_id, "root_run_id": row.root_run_id, "status": row.status,
            "plan": redact.loaded_plan(row.plan), "revision": row.revision,
            "params": dict(row.params), "manifest": shown, "failed": failed,
            "succeeded": succeeded, "not_run": not_run}


def next_revision(settings: Any, row: Any) -> int:
    """The revision a repair of ``row`` writes: one past the run's and the plan file's.

    The run's revision + 1, or the revision in ``plans/NAME.yaml`` + 1 when the file was
    revised further since the run (a repair never writes a revision backwards).
    """
    from .loading import load_file

    best = row.revision
    for suffix in (".yaml", ".yml", ".json"):
        path = settings.plans_dir / f"{row.plan_name}{suffix}"
        if path.is_file():
            try:
                data = load_file(path).data
            except Exception:  # an unreadable file: the run's revision decides
                data = None
            rev = data.get("revision") if isinstance(data, dict) else None
            if isinstance(rev, int) and not isinstance(rev, bool):
                best = max(best, rev)
            break
    return int(best) + 1


def check_revision(settings: Any, row: Any, data: Any, given: Any, succeeded: list[str],
                   *, revision: int, file: str, text: str | None = None,
                   kind: str = "json") -> tuple[Any, Any]:
    """Check one revised plan against the failed run ``row``.

    ``data`` gets the run's plan ``name`` and ``revision`` (planrun's to set: the revision
    is the next revision of the run's plan), is validated like any plan — with the run's
    parameter values (secrets given again), against the current registry and policy —
    and compared with the run (:func:`changed_succeeded`).

    Returns:
        (the :class:`~planrun.issues.PlanReport`, the checked plan or None when refused).

    Raises:
        UsageError: ``-p`` gives a value the run already has (exit 2).
        Refused: the registry or configuration is invalid (exit 3).
    """
    import json
    from dataclasses import replace

    from . import redact
    from .checking import load_registry, no_gc
    from .lifecycle import run_param_input
    from .loading import Document
    from .validation import check_plan

    if isinstance(data, dict):
        head = {"planrun": data["planrun"]} if "planrun" in data else {}
        data = {**head, "name": row.plan_name, "revision": revision, **{
            k: v for k, v in data.items() if k not in ("planrun", "name", "revision")}}
    params = data.get("params") if isinstance(data, dict) else None
    declared = set(params) if isinstance(params, dict) else set()
    merged = run_param_input(row, data, given, declared=declared)
    doc = Document(data=data, file=file, text=text if text is not None else json.dumps(
        data, indent=2, default=str), kind=kind)
    with no_gc():
        report, plan = check_plan(doc, load_registry(settings), settings, merged,
                                  concrete=True, name_hint=row.plan_name)
    extra = changed_succeeded(redact.loaded_plan(row.plan), data, succeeded,
                              run_id=row.run_id, file=file)
    if extra:
        report.issues.extend(replace(i, line=at[0], column=at[1]) for i in extra
                             for at in [doc.locate(i.path)])
        plan = None
    return report, plan


def _need_secrets(row: Any, given: Any) -> None:
    """Refuse (``param_missing``, exit 3) when a secret of the run is not given again.

    A secret's value is not in the journal: like ``retry``, a repair needs it again
    (``-p``, ``--params-file``, ``PLANRUN_PARAM_<NAME>``), checked before any planner
    round so that no round is spent on it.
    """
    from . import redact
    from .errors import Refused
    from .lifecycle import journaled_params

    _, secret = journaled_params(row, redact.loaded_plan(row.plan))
    have = set(given.cli) | set(given.file_values) | set(given.env) if given else set()
    missing = sorted(secret - have)
    if missing:
        names = ", ".join(missing)
        raise Refused(f"run {row.run_id} has secret parameter{'s' if len(missing) > 1 else ''}"
                      f" {names} whose value is not journaled; give "
                      f"{'them' if len(missing) > 1 else 'it'} again",
                      code="param_missing",
                      hint=f"-p {missing[0]}=VALUE, --params-file FILE or "
                      f"PLANRUN_PARAM_{missing[0].upper()}.")


def repair(settings: Any, run_ref: str, planner: str, *, max_rounds: int | None = None,
           given: Any = None, approve: list[str] | None = None, approve_all: bool = False,
           approver: Any = None, max_parallel: int | None = None, keep_going: bool = False,
           progress: Any = None) -> Any:
    """Ask ``planner`` for a revised plan of the failed run ``run_ref`` and run it (SPEC §10).

    Rounds as ``planrun plan``: each answer is validated (plus
    :func:`changed_succeeded`), journaled on the failed run (``plan_proposed``,
    ``plan_refused``) and, while refused, sent back with its issues, at most
    ``max_rounds`` rounds. The accepted revision is written to ``plans/NAME.yaml`` (the
    next revision, :func:`next_revision`) and runs as a child of the failed run
    (:func:`planrun.retry.start_child`), whose journal starts with ``planned`` and
    ``replanned`` (``{"parent_run_id", "revision", "digest", "rounds", "planner"}``; the
    failed run gets a ``replanned`` event too, with ``child_run_id``).

    Returns:
        The child run's :class:`~planrun.outcome.RunOutcome`.

    Raises:
        RunError: ``unknown_run``; ``run_not_resumable`` (the run is not failed);
            ``run_busy``; ``indeterminate`` (a step of unknown effect must be settled
            first) (exit 5).
        Refused: ``replan_exhausted`` with the last report; ``param_missing``: a secret
            of the run is not given again; the registry or configuration is invalid
            (exit 3).
        UsageError: ``-p`` gives a value the run already has; ``--approve`` names no step
            (exit 2).
        ApprovalError: a step to run was not cleared (exit 4).
    """
    from . import redact
    from .errors import RunError
    from .journal import Journal
    from .journal.store import lease_owner
    from .lifecycle import _indeterminate_error, run_param_input
    from .manifest import RESUMABLE
    from .retry import start_child

    with Journal(settings.journal, write=True) as journal:
        parent_id = journal.resolve_run_id(run_ref)
        row = journal.run(parent_id)
        if row.status != "failed":
            hint = (f"Use planrun resume {parent_id}." if row.status in RESUMABLE
                    else "Start a new run with planrun execute (or plan a new one with "
                    "planrun plan).")
            raise RunError(f"run {parent_id} is {row.status}; only a failed run is "
                           "repaired", code="run_not_resumable", hint=hint)
        context = run_context(journal, parent_id)
        blocked: list[tuple[str, int | None]] = [(r.step_id, None) for r in journal.steps(parent_id)
                   if r.status in ("indeterminate", "running")]
    if blocked:
        # The planner would plan around a step whose effect nobody knows: settle it first.
        raise _indeterminate_error(parent_id, blocked, then="repair")
    # A -p that the run already has a value for is a usage error before any round, and
    # the run's secrets must be given again before a planner is asked (as retry does).
    run_param_input(row, redact.loaded_plan(row.plan), given)
    _need_secrets(row, given)
    revision = next_revision(settings, row)
    succeeded = list(context["succeeded"])

    def check(data: Any, file: str, text: str | None, kind: str) -> tuple[Any, Any]:
        return check_revision(settings, row, data, given, succeeded, revision=revision,
                              file=file, text=text, kind=kind)

    accepted = _rounds(settings, planner, row=row, context=context, given=given,
                       max_rounds=max_rounds, check=check)
    plan, rounds = accepted
    path, sha = _write_plan(settings, plan)
    owner = lease_owner()
    with Journal(settings.journal, write=True) as journal:
        # The parent's lease is held for the whole child run (as retry does).
        journal.take_lease(parent_id, owner, statuses=("failed",))
        try:
            return start_child(
                journal, settings, row, plan, owner, approve=approve or [],
                approve_all=approve_all, approver=approver, max_parallel=max_parallel,
                keep_going=keep_going, progress=progress,
                event_data={"plan": plan.name, "revision": plan.revision,
                            "digest": plan.digest, "repair_of": parent_id},
                document=plan.document, plan_file=path, file_sha256=sha,
                replanned={"revision": plan.revision, "digest": plan.digest,
                           "rounds": rounds, "planner": planner})
        finally:
            journal.release_lease(parent_id, owner)


# --- stand-in for the planners package (branch i13-plan); replaced when it lands -------


def _ask(planner: str, request: dict[str, Any], timeout: float) -> tuple[Any, str | None, str]:
    """(plan data, its text, its kind) from one planner call; raises ValueError on failure."""
    import importlib
    import json
    import shlex
    import subprocess

    from .loading import parse_text

    if planner.startswith("cmd:"):
        try:
            done = subprocess.run(shlex.split(planner[4:]), input=json.dumps(request),
                                  capture_output=True, text=True, timeout=timeout,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ValueError(f"the planner could not run: {exc}") from exc
        if done.returncode != 0:
            raise ValueError(f"the planner exited {done.returncode}: "
                             f"{done.stderr.strip()[-300:]}")
        text = done.stdout
    elif planner.startswith("python:"):
        module, _, name = planner[7:].rpartition(":")
        # a copy: a callable that edits its request in place changes nothing of ours
        answer = getattr(importlib.import_module(module), name)(json.loads(json.dumps(request)))
        if not isinstance(answer, str):
            return answer, None, "json"
        text = answer
    else:
        raise ValueError(f"unknown planner {planner!r}")
    kind = "json" if text.lstrip().startswith("{") else "yaml"
    doc = parse_text(text, kind=kind, file="planner")
    return doc.data, text, kind


def _rounds(settings: Any, planner: str, *, row: Any, context: dict[str, Any], given: Any,
            max_rounds: int | None, check: Any) -> tuple[Any, int]:
    """The bounded rounds loop: (the accepted checked plan, rounds used)."""
    from .api import describe_tools, json_schema
    from .canonical import digest
    from .checking import load_registry
    from .errors import Refused
    from .issues import PlanReport, Report
    from .journal import Journal

    bound = max_rounds or 3
    registry = load_registry(settings)
    previous: dict[str, Any] | None = None
    report: PlanReport | None = None
    for n in range(1, bound + 1):
        request = {"protocol": 1, "mode": "repair", "goal": row.goal, "round": n,
                   "max_rounds": bound, "plan_schema": json_schema("plan"),
                   "catalog": describe_tools(registry, allowed=True),
                   "params": dict(row.params), "previous": previous, "run": context}
        file = f"planner:round {n}"
        try:
            data, text, kind = _ask(planner, request, 300.0)
        except Exception as exc:
            data, text, kind = None, None, "json"
            report = PlanReport(file=file, issues=[Issue(
                code="planner", message=str(exc), file=file)])
            plan = None
        else:
            report, plan = check(data, file, text, kind)
        with Journal(settings.journal, write=True) as journal:
            try:
                dig = digest(data)
            except (TypeError, ValueError):
                dig = ""
            journal.add_event(row.run_id, "plan_proposed",
                              data={"round": n, "digest": dig, "mode": "repair"})
            if plan is not None:
                return plan, n
            journal.add_event(row.run_id, "plan_refused",
                              data={"round": n, "issues": [i.to_json()
                                                           for i in report.issues]})
        previous = {"plan": data, "issues": [i.to_json() for i in report.issues]}
    raise Refused(f"the planner gave no acceptable revision of run {row.run_id} in "
                  f"{bound} rounds", code="replan_exhausted",
                  report=Report(plans=[report] if report else []))


def _write_plan(settings: Any, plan: Any) -> tuple[str, str]:
    """Write the accepted revision to ``plans/NAME.yaml``: (its journaled path, SHA-256)."""
    import yaml

    from . import redact
    from .checking import file_sha256, journaled_path

    path = settings.plans_dir / f"{plan.name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(redact.loaded_plan(plan.document), sort_keys=False,
                                   allow_unicode=True), encoding="utf-8")
    return str(journaled_path(path, settings)), str(file_sha256(path))
