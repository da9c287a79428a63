""":func:`check_plan`: the phases of validation, run in order into one report."""

from __future__ import annotations

from typing import Any

from .. import fits, redact
from ..canonical import digest
from ..formats import SUPPORTED_FORMATS, HeadData, StepData, head_data
from ..issues import PlanReport
from ..loading import Document
from ..params import (
    UNKNOWN,
    Placed,
    Problem,
    StepRef,
    Template,
    has_templates,
    substitute,
)
from ..pointers import pointer
from ..registry import ToolRegistry, ToolSpec
from .arguments import argument_problems
from .params import ParamValues, check_params
from .plan import CheckedPlan, CheckedStep, ParamInput, PlanLimits
from .references import Scope, check_step_references
from .report import Collector, pydantic_issues
from .steps import check_dependencies, check_steps


def check_plan(doc: Document, registry: ToolRegistry, settings: PlanLimits,
               given: ParamInput | None = None, *, concrete: bool | None = None,
               name_hint: str | None = None, known_digest: str | None = None
               ) -> tuple[PlanReport, CheckedPlan | None]:
    """Check one plan document completely.

    The fits found are written for later processes as it ends (:func:`planrun.fits.save`),
    before anything runs: a run killed midway leaves them for its ``resume``.

    Args:
        doc: the loaded plan file.
        registry: the loaded tools registry.
        settings: ``max_steps`` and ``pools`` (a ``planrun.paths.Settings`` will do).
        given: parameter values given by the user.
        concrete: check with concrete values (missing required parameters are errors);
            default: when any value was given.
        name_hint: the plan's name when the document has no ``name`` (the file stem).
        known_digest: the digest of ``doc.data`` when already known (a journaled plan).

    Returns:
        The report, and the checked plan when the report has no error.
    """
    try:
        return _check_plan(doc, registry, settings, given, concrete, name_hint, known_digest)
    finally:
        fits.save()


def _check_plan(doc: Document, registry: ToolRegistry, settings: PlanLimits,
                given: ParamInput | None, concrete: bool | None, name_hint: str | None,
                known_digest: str | None) -> tuple[PlanReport, CheckedPlan | None]:
    given = given or ParamInput()
    concrete = given.given if concrete is None else concrete
    out = Collector(doc)
    report = PlanReport(file=doc.file, issues=out.issues)
    data = doc.data
    if not _format_ok(data, out):
        return report, None
    assert isinstance(data, dict)
    head = _check_head(data, out)
    raw_name = data.get("name")
    name: str = raw_name if isinstance(raw_name, str) else name_hint or "plan"
    report.plan = {"name": name, "revision": data.get("revision", 1), "goal": data.get("goal")}
    raw_steps = data.get("steps")
    if not isinstance(raw_steps, list):
        return report, None
    _check_size(raw_steps, settings, out)
    params = check_params(data.get("params"), given, concrete, out)
    steps, ids = check_steps(raw_steps, settings, out)
    deps, cycle, sorter = check_dependencies(steps, ids, out)
    scope = Scope(out=out, ids=ids, deps=deps, acyclic=cycle is None, registry=registry,
                  steps=steps, declared=params.declared)
    # the source text tells at once whether any string could hold a marker character
    marks = not isinstance(doc.text, str) or doc.may_hold_marks()
    # one budget of placed values for the plan, one for its stored form (secret references)
    placed = (Placed("the plan's steps hold"), Placed("the plan's steps hold"))
    checked = [step for i, raw, model in steps
               if (step := _check_step(scope, params, marks, i, raw, model, placed))
               is not None]
    for pname in params.declared:
        if pname not in scope.used:
            out.add("param_unused", f"parameter {pname!r} is declared but no step uses it; "
                    f"use {{params.{pname}}} or remove it", path=pointer("params", pname),
                    key=True)
    if not report.ok or head is None:
        return report, None
    document = redact.stored_plan(data)
    plan = CheckedPlan(
        file=doc.file or "", name=name, revision=head.revision, goal=head.goal,
        document=document, digest=known_digest or digest(document), params=params.values,
        secret_params=params.secrets,
        steps=checked, deps={s.id: s.depends_on for s in checked},
        max_parallel=head.max_parallel, timeout=head.timeout, policy=registry.policy)
    if sorter is not None and len(checked) == len(raw_steps):
        plan.give_sorter(sorter)  # every step is in it: the graph the run will walk
    report.plan["digest"] = plan.digest
    return report, plan


def _format_ok(data: Any, out: Collector) -> bool:
    """A mapping with a supported ``planrun:`` version (else nothing more is checked)."""
    if not isinstance(data, dict):
        out.add("schema", "a plan must be a mapping with planrun, goal and steps", path="")
        return False
    version = data.get("planrun")
    if "planrun" not in data:
        out.add("format_version", "the plan has no 'planrun:' field; add 'planrun: 1' as its "
                "first line", path="")
        return False
    if isinstance(version, bool) or version not in SUPPORTED_FORMATS:
        out.add("format_version",
                f"planrun: {version!r} is not a supported plan format version "
                f"(supported: {', '.join(map(str, SUPPORTED_FORMATS))})", path="/planrun")
        return False
    return True


def _check_size(raw_steps: list[Any], settings: PlanLimits, out: Collector) -> None:
    """No steps, or more than ``max_steps`` (a plan is refused, never trimmed)."""
    if not raw_steps:
        out.add("empty", "the plan has no steps", path="/steps")
    if len(raw_steps) > settings.max_steps:
        out.add("too_long", f"the plan has {len(raw_steps):,} steps, more than max_steps "
                f"({settings.max_steps:,}); split it or raise max_steps in planrun.toml "
                "(plans are never trimmed)", path="/steps")


def _check_head(data: dict[str, Any], out: Collector) -> HeadData | None:
    """The plan's top-level fields as ``models.PlanHead`` gives them, or None (issues added).

    The plain-Python fast path (:mod:`planrun.formats`) first; pydantic judges the rest.
    """
    head = head_data(data)
    if head is not None:
        return head
    from pydantic import ValidationError

    from ..models import PlanHead

    try:
        return HeadData.of_model(PlanHead.model_validate(data))
    except ValidationError as exc:
        pydantic_issues(out, exc, "", data, None)
        return None


def _check_step(scope: Scope, params: ParamValues, marks: bool, i: int,
                raw: dict[str, Any], model: StepData, placed: tuple[Placed, Placed]
                ) -> CheckedStep | None:
    """References, substitution, tool, arguments and policy of one well-shaped step.

    ``placed``: the plan's budgets of values its placeholders place (:class:`Placed`; in
    the values, in their stored form), shared by its steps.
    """
    out, base, sid, fe = scope.out, f"/steps/{i}", model.id, model.for_each
    check_step_references(scope, base, raw, model)
    problems: list[Problem] = []
    arguments = substitute(model.arguments, params.values, f"{base}/arguments", problems,
                           placed[0])
    for_each = substitute(fe, params.values, f"{base}/for_each", problems, placed[0]) \
        if fe is not None else None
    if params.plain and not (marks and (redact.has_marks(model.arguments)
                                        or redact.has_marks(fe))):
        stored, stored_fe = arguments, for_each
    else:
        stored = substitute(redact.escape_value(model.arguments), params.stored,
                            placed=placed[1])
        stored_fe = substitute(redact.escape_value(fe), params.stored, placed=placed[1]) \
            if fe is not None else None
    for p in problems:
        out.add(p.code, f"step {sid!r}: {p.message}", step=sid, path=p.path)
    if for_each is not None and not (
            isinstance(for_each, list) or for_each is UNKNOWN
            or (isinstance(for_each, Template) and isinstance(for_each.exact, StepRef))):
        out.add("schema", f"step {sid!r}: for_each must be a list or exactly one "
                "placeholder such as {steps.ID.output.items}", step=sid,
                path=f"{base}/for_each")
    tool = _tool_of(scope, sid, base, model.tool)
    if tool is None:
        return None
    if not problems:
        for sub, msg, is_key in argument_problems(
                tool, arguments, None if stored is arguments else stored, out.suggestions):
            out.add("arguments", f"step {sid!r}: {msg}", step=sid,
                    path=f"{base}/arguments{sub}", key=is_key)
    step = CheckedStep(index=i, id=sid, tool=tool, arguments=stored, for_each=stored_fe,
                       depends_on=scope.deps.get(sid, []), raw=raw,
                       approval_reason=_clearance(scope, sid, base, tool),
                       static=for_each is None and not has_templates(arguments))
    if model.approve is not None:
        _check_approve_resolved(scope, base, step)
    if step.run_if == "failure" and not step.depends_on:
        out.add("schema", f"step {sid!r}: run_if: failure on a step that depends on no "
                "step: it could never run; give it depends_on (the steps whose failure it "
                "handles)", step=sid, path=f"{base}/run_if")
    return step


def _check_approve_resolved(scope: Scope, base: str, step: CheckedStep) -> None:
    """Issue ``approve_resolved`` where a step's ``approve: resolved`` cannot apply.

    It has a meaning only for a step that needs a person, whose arguments hold a run-time
    placeholder (else they are known, and shown, before the run), that does not fan
    out (each item would be a decision of its own) and that is not a clean-up step
    (``run_if: failure | always``: waiting there would hide the failure). A tool's
    ``approve: resolved`` is not checked this way: its steps that do not fit are cleared
    before the run.
    """
    sid = step.id
    if step.for_each is not None:
        why = "it fans out (for_each): a fan-out step is cleared before the run"
    elif step.static:
        why = ("its arguments hold no {steps.…} placeholder: they are known, and shown, "
               "before the run; remove approve")
    elif step.run_if != "success":
        why = (f"it is a clean-up step (run_if: {step.run_if}): a run waiting for a person "
               "there would end awaiting_approval, not failed, and hide the failure it "
               "cleans up after; clear it before the run (remove approve)")
    elif not step.approval_reason:
        why = (f"it needs no approval (tool {step.tool.name!r} is reversible and no "
               "policy asks for a person); remove approve, or list the tool in "
               "policy.require_approval")
    else:
        return
    scope.out.add("approve_resolved", f"step {sid!r}: approve: resolved has no meaning "
                  f"here: {why}", step=sid, path=f"{base}/approve")


def _tool_of(scope: Scope, sid: str, base: str, name: str) -> ToolSpec | None:
    """The step's tool; None (with an issue unless the registry reported it) when missing."""
    registry = scope.registry
    tool = registry.tools.get(name)
    if tool is None and name not in registry:
        scope.out.add("unknown_tool", f"step {sid!r}: no tool named {name!r} in "
                      f"{registry.file.name}.{scope.out.did_you_mean(name, registry.tools)}",
                      step=sid, path=f"{base}/tool")
    return tool


def _clearance(scope: Scope, sid: str, base: str, tool: ToolSpec) -> str | None:
    """Why the step needs a person (or None); policy refusals become issues."""
    policy = scope.registry.policy
    if policy is None:
        return "irreversible" if tool.entry.irreversible else None
    if policy.allowed_tools is not None and tool.name not in policy.allowed_tools:
        scope.out.add("not_allowed", f"step {sid!r}: tool {tool.name!r} is not in the "
                      "policy's allowed_tools", step=sid, path=f"{base}/tool")
    cls = policy.class_of(tool.name)
    if cls is not None and cls[1] == "refuse":
        scope.out.add("refused", f"step {sid!r}: the policy refuses tool {tool.name!r} "
                      f"outright (class {cls[0]!r})", step=sid, path=f"{base}/tool")
    reason: str | None = policy.clearance(tool.name, tool.entry.irreversible)
    return reason
