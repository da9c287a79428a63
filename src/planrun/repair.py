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
