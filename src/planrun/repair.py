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
written, ``depends_on`` as a set, ``for_each``, ``when``, ``run_if``, ``on_item_error``,
``max_items``, ``facets``) are equal, a field left out counting as its default. Fields that only say
how a step was run (``intent``, ``timeout``, ``retries``, ``max_parallel``, ``pool``) may
change. Removing a succeeded step is a change. Steps that did not succeed (failed,
skipped, never run) may change freely, whatever depends on them. Parameters keep the
values the run was given, so equal arguments as written mean equal arguments.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .issues import Issue
from .planners import PlannerParams
from .pointers import pointer

#: Step fields that decide what a step did (its call, its inputs, its items, whether it ran).
#: ``facets`` too (issue 17): an inherited step keeps the facets computed in the failed run.
#: ``run_if`` as ``when`` does: it decides whether the step ran (found by an attacker).
EFFECT_FIELDS = ("tool", "arguments", "depends_on", "for_each", "when", "run_if",
                 "on_item_error", "max_items", "facets")
#: The value of an effect field left out of a step (SPEC §3).
_DEFAULTS: dict[str, Any] = {"arguments": {}, "depends_on": [], "for_each": None,
                             "when": None, "run_if": "success", "on_item_error": "fail",
                             "max_items": 10000,
                             "facets": None}
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
    {"code", "message"}}] (``partial`` fan-outs too, issue 17: error ``items_failed``),
    "succeeded": [step ids], "not_run": [step ids neither succeeded nor failed]}``. A
    secret's value is never in it: stored data holds the reference form (SPEC §7).
    Outputs of succeeded steps are not included (a planner reads them with ``planrun
    output`` if it needs to).

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
        elif step["status"] in ("failed", "indeterminate", "partial"):
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


def revision_params(row: Any, given: Any) -> Any:
    """``given_for`` of :func:`planrun.planners.propose`: the parameters to check a revision.

    The run's journaled values of the parameters the revision declares (the child keeps
    them), its secrets and new parameters as given (:func:`planrun.lifecycle.run_param_input`).
    """
    from .lifecycle import run_param_input

    def given_for(data: Any) -> Any:
        params = data.get("params") if isinstance(data, dict) else None
        declared = {k for k in params if isinstance(k, str)} if isinstance(
            params, dict) else set()
        return run_param_input(row, data, given, declared=declared)

    return given_for


def revised(data: dict[str, Any], name: str, revision: int) -> dict[str, Any]:
    """``data`` with planrun's ``name`` and ``revision`` (after ``planrun``, as written)."""
    final: dict[str, Any] = {"planrun": data.get("planrun", 1), "name": name,
                             "revision": revision}
    final.update({k: v for k, v in data.items() if k not in ("planrun", "name", "revision")})
    return final


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
           progress: Any = None, on_round: Any = None, on_written: Any = None,
           defer_approval: bool = False) -> Any:
    """Ask ``planner`` for a revised plan of the failed run ``run_ref`` and run it (SPEC §10).

    The rounds are :func:`planrun.planners.propose`'s: each answer is validated (with the
    run's parameter values, :func:`revision_params`) and compared with the run
    (:func:`changed_succeeded`), journaled as events of the failed run (``plan_proposed``,
    ``plan_refused``) and, while refused, sent back with its issues, at most
    ``max_rounds`` rounds (default: the planner table's ``max_rounds``, else 3). The
    accepted revision is written to the plan's file (``plans/NAME.yaml``, or the
    existing ``.yml``/``.json`` of the plan) as its next revision — one past the run's
    revision and the file's — and runs as a child of the failed run
    (:func:`planrun.retry.start_child`). ``replanned`` events record it: on the child
    ``{"parent_run_id", "revision", "digest", "rounds", "planner", "file", "previous"}``,
    on the failed run the same with ``child_run_id``. ``on_round(round, report or None)``
    is called after each round, ``on_written(line)`` once the revision is written (before
    the child runs): what ``planrun repair`` says on stderr. ``defer_approval``: as
    retry's (:func:`planrun.retry.retry`): the child may be left ``awaiting_approval``.

    Returns:
        The child run's :class:`~planrun.outcome.RunOutcome`.

    Raises:
        RunError: ``unknown_run``; ``run_not_resumable`` (the run is not failed);
            ``run_busy``; ``indeterminate`` (a step of unknown effect must be settled
            first) (exit 5).
        Refused: ``replan_exhausted`` with the last report; ``param_missing``: a secret
            of the run is not given again; the registry or configuration is invalid
            (exit 3).
        UsageError: ``-p`` gives a value the run already has; ``--approve`` names no step;
            a malformed ``--planner``; the plan file cannot be written (exit 2).
        ApprovalError: a step to run was not cleared (exit 4).
    """
    from pathlib import Path

    from . import redact
    from .checking import check_approve, file_sha256, journaled_path, load_registry
    from .errors import Refused, RunError, UsageError
    from .journal import Journal
    from .journal.store import lease_owner
    from .lifecycle import _indeterminate_error, journaled_params, run_param_input
    from .manifest import RESUMABLE
    from .planners import (
        DEFAULT_MAX_ROUNDS,
        EventSession,
        propose,
        request_base,
        resolve_planner,
    )
    from .planning import (
        _existing,
        _previous,
        _write,
        folder_lock,
        plain_name,
        render,
        slug,
    )
    from .retry import refuse_driven_child, start_child

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
        unknown = [r for r in journal.steps(parent_id)
                   if r.status in ("indeterminate", "running")]
    registry = load_registry(settings)
    blocked: list[tuple[str, int | None]] = [
        (r.step_id, None) for r in unknown if r.tool not in registry.tools
        or not registry.tools[r.tool].entry.idempotent]
    if blocked:
        # A step whose effect nobody knows and that cannot safely run again: a person
        # settles it first (as for retry), before a planner plans around it.
        raise _indeterminate_error(parent_id, blocked, then="repair")
    old = redact.loaded_plan(row.plan)
    # A -p that the run already has a value for is a usage error before any round, and
    # the run's secrets must be given again before a planner is asked (as retry does).
    run_param_input(row, old, given)
    _need_secrets(row, given)
    who = resolve_planner(settings, planner)
    rounds = max_rounds or who.max_rounds or DEFAULT_MAX_ROUNDS
    succeeded = list(context["succeeded"])
    _, secret = journaled_params(row, old)
    params = _RunParams(given, set(secret), run_params=dict(row.params))
    base = request_base(registry, goal=row.goal or "", mode="repair", run=context)

    def extra_check(_checked: Any, data: Any) -> list[Issue]:
        from .planners.invoke import OUTPUT_NAME

        return changed_succeeded(old, data, succeeded, run_id=parent_id, file=OUTPUT_NAME)

    try:
        accepted = propose(settings, who, base, max_rounds=rounds, registry=registry,
                           given_for=revision_params(row, given), concrete=True,
                           name_hint=row.plan_name, extra_check=extra_check,
                           session=EventSession(settings.journal, parent_id), params=params,
                           on_round=on_round)
    except Refused as exc:
        if exc.code == "replan_exhausted":
            # as planrun plan says it: the report is printed before this line (it said
            # "follows"), and the rounds are events of the failed run
            exc.message = (f"no valid plan in {rounds} round(s); the last report is above. "
                           f"planrun log {parent_id} shows every round")
            # --json, MCP: the report is the error's "plans", or follows it
            exc.placed_message = (f"no valid plan in {rounds} round(s) (planrun log "
                                  f"{parent_id} shows every round)")
            exc.hint = (f"Run {parent_id} stays failed: repair it again (--max-rounds N "
                        f"for more rounds), or run it as it was with planrun retry "
                        f"{parent_id}.")
        raise
    # A plan name that is no plain file name (a `name:` with '/' or '..', or one ending
    # '.yaml') is not a path.
    stem = row.plan_name if plain_name(row.plan_name) else slug(row.plan_name)
    owner = lease_owner()
    with Journal(settings.journal, write=True) as journal:
        # The parent's lease is held for the whole child run (as retry does), and taken
        # before the file is written: a second repair at once writes nothing.
        journal.take_lease(parent_id, owner, statuses=("failed",))
        try:
            refuse_driven_child(journal, parent_id)
            # The file is read again and written under its folder's lock: a `plan` or a
            # repair of another run of the plan at once gets the revision after this one
            # (found by an attacker). The run's own file first (found by a fresh operator).
            home = _plan_home(settings, row)
            with folder_lock(Path(home).parent if home is not None
                             else Path(settings.plans_dir)):
                before = _plan_home(settings, row) or _existing(settings, row.plan_name, None)
                _prev_data, prev_text, prev_rev = _previous(before)
                revision = max(row.revision, prev_rev or 0) + 1
                final = revised(accepted.data, row.plan_name, revision)
                plan = _checked(settings, row, final, given)
                check_approve(approve or [], plan)  # a usage error before anything is written
                target = before or settings.plans_dir / f"{stem}.yaml"
                shown = journaled_path(Path(target), settings)
                previous = None if before is None else {
                    "file": journaled_path(before, settings), "revision": prev_rev,
                    "content": params.secrets().conceal_text(prev_text or "")}
                try:
                    _write(target, render(final, target.suffix))
                except OSError as exc:
                    raise UsageError(f"cannot write the revised plan to {target}: "
                                     f"{exc.strerror or exc}",
                                     hint="Make it a regular file you can write (or remove "
                                     "it), then repair again; nothing ran.") from None
            if on_written is not None:
                was = "new" if before is None else f"was {prev_rev}"
                on_written(f"wrote plan {row.plan_name!r} revision {revision} ({was}) to "
                           f"{shown} in {accepted.round} round(s); planrun log {parent_id} "
                           "shows how it came to be")
            return start_child(
                journal, settings, row, plan, owner, approve=approve or [],
                approve_all=approve_all, approver=approver, max_parallel=max_parallel,
                keep_going=keep_going, progress=progress,
                event_data={"plan": plan.name, "revision": plan.revision,
                            "digest": plan.digest, "repair_of": parent_id},
                document=plan.document, plan_file=shown, file_sha256=file_sha256(target),
                replanned={"revision": plan.revision, "digest": plan.digest,
                           "rounds": accepted.round, "planner": who.label, "file": shown,
                           "previous": previous}, defer_approval=defer_approval)
        finally:
            journal.release_lease(parent_id, owner)


def _plan_home(settings: Any, row: Any) -> Any:
    """The file the failed run's plan was run from (journaled), if it is still a file.

    A run of ``planrun execute ci/publish.yaml`` lives in that file, not in
    ``plans/publish.yaml``: looked up by name alone, its revision overwrote another plan
    of the same name (found by a fresh operator).
    """
    from pathlib import Path

    from .paths import probe

    if not row.plan_file:
        return None
    path = Path(row.project or settings.project) / row.plan_file
    return path if probe(path, "is_file") else None


def _checked(settings: Any, row: Any, data: dict[str, Any], given: Any) -> Any:
    """The accepted revision with planrun's name and revision, checked (a CheckedPlan).

    Raises:
        Refused: it no longer passes (it passed a moment ago with another revision
            number: only a changed registry in between can do this), exit 3.
    """
    from .checking import load_registry, no_gc
    from .errors import Refused
    from .issues import Report
    from .loading import Document
    from .validation import check_plan

    doc = Document.of_data(data, f"plans/{row.plan_name}.yaml")
    with no_gc():
        report, plan = check_plan(doc, load_registry(settings), settings,
                                  revision_params(row, given)(data), concrete=True,
                                  name_hint=row.plan_name)
    if plan is None:
        raise Refused("the accepted revision no longer passes validation",
                      code=report.issues[0].code if report.issues else "refused",
                      report=Report(plans=[report]))
    return plan


@dataclass
class _RunParams(PlannerParams):
    """The request's ``params`` for a repair.

    The run's values (secrets as references) below those given now (secrets as
    references too); planner output and reports concealed as for ``plan``.
    """

    run_params: dict[str, Any] = field(default_factory=dict)

    def request(self) -> dict[str, Any]:
        """The run's values, then the given ones (a secret's value never)."""
        return {**self.run_params, **super().request()}
