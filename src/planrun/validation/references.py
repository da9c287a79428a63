"""Placeholders and ``when`` conditions, checked against the plan's graph and parameters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import graph
from ..issues import listed
from ..params import IndexRef, ItemRef, ParamRef, StepRef, references
from ..registry import ToolRegistry
from .report import Collector
from .steps import ShapedStep


@dataclass(eq=False)
class Scope:
    """What a reference is checked against.

    Attributes:
        out: where issues go.
        ids: step id → index.
        deps: step id → ids it depends on.
        acyclic: the graph has no cycle (ancestry is only checked then).
        registry: the tools (for ``output_schema``).
        steps: the well-shaped steps.
        declared: the declared parameters.
        used: parameter names some step reads (filled while checking).
    """

    out: Collector
    ids: dict[str, int]
    deps: dict[str, list[str]]
    acyclic: bool
    registry: ToolRegistry
    steps: list[ShapedStep]
    declared: dict[str, Any]
    used: set[str] = field(default_factory=set)
    _ancestry: graph.Ancestry | None = field(default=None, repr=False)
    _by_id: dict[str, Any] | None = field(default=None, repr=False)
    _walked_out: bool = field(default=False, repr=False)

    def model(self, sid: str) -> Any:
        """The fields of the well-shaped step ``sid`` (its first), or None."""
        if self._by_id is None:
            by_id: dict[str, Any] = {}
            for _i, _r, m in self.steps:
                by_id.setdefault(m.id, m)
            self._by_id = by_id
        return self._by_id.get(sid)

    def _asked(self) -> graph.Ancestry | None:
        """The plan's :class:`planrun.graph.Ancestry`; None when ancestry is not checked."""
        if not self.acyclic or self._walked_out:
            return None
        if self._ancestry is None:
            self._ancestry = graph.Ancestry(self.deps)
        return self._ancestry

    def _walked_past(self, sid: str, where: str, exc: graph.AncestryTooLarge) -> None:
        self._walked_out = True
        self.out.add("too_large", f"step {sid!r}: {exc}; give the steps that read a step "
                     "far above them that step in their depends_on (a direct dependency "
                     "is checked at once)", step=sid, path=where)

    def ancestors_past(self, sid: str, most: int, where: str) -> bool:
        """Whether ``sid`` depends on more than ``most`` steps (False when not known)."""
        asked = self._asked()
        if asked is None:
            return False
        try:
            return asked.more_than(sid, most)
        except graph.AncestryTooLarge as exc:
            self._walked_past(sid, where, exc)
            return False

    def reads_ancestor(self, sid: str, ref: str, where: str) -> bool:
        """Whether ``sid`` depends on ``ref``, directly or not (True when not known).

        Not known: the graph has a cycle, or the plan's questions went past the bound of
        :class:`planrun.graph.Ancestry` (one ``too_large`` issue, at the reference
        that went past it; the plan is refused).
        """
        asked = self._asked()
        if asked is None:
            return True
        try:
            return asked.depends(sid, ref)
        except graph.AncestryTooLarge as exc:
            self._walked_past(sid, where, exc)
            return True


def check_step_references(scope: Scope, base: str, raw: dict[str, Any], model: Any) -> None:
    """The placeholders of one step's arguments and ``for_each``, and its ``when``."""
    sid = model.id
    for ptr, ref in references(raw.get("arguments", {})):
        _check_ref(scope, ref, sid, f"{base}/arguments{ptr}", model.for_each is not None)
    fe = model.for_each
    if isinstance(fe, str | list):
        for ptr, ref in references(fe):
            if isinstance(ref, ItemRef | IndexRef):
                scope.out.add("reference", f"step {sid!r}: for_each cannot use "
                              f"{ref.source()}", step=sid, path=f"{base}/for_each{ptr}")
                continue
            _check_ref(scope, ref, sid, f"{base}/for_each{ptr}", True)
    if model.when is not None:
        _check_when(scope, model.when, sid, base)
    if model.facets is not None:
        _check_facet_schema(scope, raw.get("facets"), model, base + "/facets")


def _check_facet_schema(scope: Scope, raw: Any, model: Any, base: str) -> None:
    """With an ``output_schema``, refuse a facet path no output can reach (``reference``).

    Paths start at the step's output, or at each item's output for a fan-out, which is
    what the tool's ``output_schema`` describes either way.
    """
    from ..facets import KINDS, PathError, parse_path, schema_problem
    from ..pointers import pointer_escape

    tool = scope.registry.tools.get(model.tool)
    schema = tool.entry.output_schema if tool else None
    if not isinstance(schema, dict) or not isinstance(raw, dict):
        return
    for kind in KINDS:
        for name, path in (raw.get(kind) or {}).items():
            try:
                tokens = parse_path(path)
            except PathError:
                continue  # reported with the step's shape (schema)
            why = schema_problem(tokens, schema)
            if why is not None:
                scope.out.add("reference", f"step {model.id!r}: facet {name!r}: path "
                              f"{path!r}: in the output of tool {model.tool!r}, {why}",
                              step=model.id,
                              path=f"{base}/{kind}/{pointer_escape(str(name))}")


def _check_ref(scope: Scope, ref: Any, sid: str, where: str, fanout: bool) -> None:
    out = scope.out
    if isinstance(ref, ParamRef):
        scope.used.add(ref.name)
        if ref.name not in scope.declared:
            out.add("param_missing", f"step {sid!r}: {{params.{ref.name}}} names a parameter "
                    f"the plan does not declare.{out.did_you_mean(ref.name, scope.declared)} "
                    "Declare it under params:", step=sid, path=where)
        return
    if isinstance(ref, ItemRef | IndexRef):
        if not fanout:
            out.add("reference", f"step {sid!r}: {ref.source()} is only available in a step "
                    "with for_each", step=sid, path=where)
        return
    if isinstance(ref, StepRef):
        if ref.step not in scope.ids:
            out.add("reference", f"step {sid!r}: {ref.source()} names no step of this plan."
                    f"{out.did_you_mean(ref.step, scope.ids)}", step=sid, path=where)
        elif ref.step == sid:
            out.add("reference", f"step {sid!r}: {ref.source()} reads the step's own output",
                    step=sid, path=where)
        elif not scope.reads_ancestor(sid, ref.step, where):
            out.add("reference", f"step {sid!r}: {ref.source()} reads step {ref.step!r}, "
                    f"which {sid!r} does not depend on; add {ref.step!r} to its depends_on",
                    step=sid, path=where)
        else:
            _check_output_path(scope, ref, sid, where)


def _check_output_path(scope: Scope, ref: StepRef, sid: str, where: str) -> None:
    """With an ``output_schema``, refuse a path the output can never have."""
    target = scope.model(ref.step)
    if target is None or target.for_each is not None:
        return
    tool = scope.registry.tools.get(target.tool)
    schema = tool.entry.output_schema if tool else None
    for tok in ref.path:
        if not isinstance(schema, dict):
            return
        props = schema.get("properties")
        if isinstance(props, dict) and tok in props:
            schema = props[tok]
            continue
        if "items" in schema and tok.isdigit():
            schema = schema["items"]
            continue
        if schema.get("additionalProperties") is False and isinstance(props, dict):
            scope.out.add("reference", f"step {sid!r}: {ref.source()}: the output of tool "
                          f"{target.tool!r} has no {tok!r} (its output_schema declares "
                          f"{listed(props) or 'nothing'})", step=sid, path=where)
        return


def _check_facet_reads(scope: Scope, expr: str, sid: str, where: str, bad: set[str]) -> None:
    """``steps.ID.facets.NAME`` must name a facet step ID declares (``condition``)."""
    from ..conditions import facet_reads

    for ref, name in sorted(facet_reads(expr), key=lambda r: (r[0], r[1] or "")):
        model = scope.model(ref)
        if ref in bad or model is None:
            continue
        facets = model.facets
        names = [] if facets is None else list(dict.fromkeys(
            [*facets.paths, *facets.counts, *facets.group_counts]))
        if not names:
            scope.out.add("condition", f"step {sid!r}: when reads steps.{ref}.facets, but "
                          f"step {ref!r} declares no facets", step=sid, path=where)
        elif name is not None and name not in names:
            scope.out.add("condition", f"step {sid!r}: when reads steps.{ref}.facets.{name}, "
                          f"which step {ref!r} does not declare (its facets: "
                          f"{listed(names)}).{scope.out.did_you_mean(name, names)}", step=sid,
                          path=where)


def _check_step_fields(scope: Scope, expr: str, sid: str, where: str, bad: set[str]) -> None:
    """``steps.ID.NAME`` must be ``output``, ``status`` or ``facets`` (``condition``).

    A typo (``steps.a.outptu``) would only fail when the step is reached, and make a
    clean-up step fail a good run.
    """
    from ..conditions import STEP_FIELDS, step_field_reads

    for ref, names in sorted(step_field_reads(expr).items()):
        if ref in bad:
            continue
        for name in sorted(n for n in names if n is not None and n not in STEP_FIELDS):
            scope.out.add("condition", f"step {sid!r}: when reads steps.{ref}.{name}, but a "
                          "condition reads only steps.ID.output, steps.ID.status and "
                          f"steps.ID.facets.{scope.out.did_you_mean(name, STEP_FIELDS)}",
                          step=sid, path=where)


def _check_when(scope: Scope, expr: str, sid: str, base: str) -> None:
    from ..conditions import (
        MAX_DYNAMIC_ANCESTORS,
        ConditionError,
        ConditionTooLarge,
        compile_condition,
        named_steps,
        unknown_names,
    )
    from ..conditions import references as condition_references

    out, where = scope.out, base + "/when"
    try:
        compile_condition(expr)
        param_refs, step_refs = condition_references(expr)
        names, calls = unknown_names(expr)
    except ConditionTooLarge as exc:  # it would fail, or hold the run, when evaluated
        out.add("condition", f"step {sid!r}: when is refused: {exc}", step=sid, path=where)
        return
    except ConditionError as exc:
        out.add("condition", f"step {sid!r}: when does not compile: {exc}", step=sid,
                path=where)
        return
    for name in names:  # SPEC §3: a condition reads params and steps, nothing else
        out.add("condition", f"step {sid!r}: when reads {name!r}, but a condition can only "
                "read params.NAME, steps.ID.output, steps.ID.status and steps.ID.facets",
                step=sid, path=where)
    for name in calls:
        out.add("condition", f"step {sid!r}: when calls {name}(), which is not a CEL "
                "function", step=sid, path=where)
    scope.used.update(param_refs)
    bad: set[str] = set()
    for ref in sorted(step_refs):
        if ref not in scope.ids or ref == sid or not scope.reads_ancestor(sid, ref, where):
            bad.add(ref)
            out.add("condition", f"step {sid!r}: when reads steps.{ref}, which is not a step "
                    f"{sid!r} depends on", step=sid, path=where)
    if named_steps(expr) is None and scope.ancestors_past(sid, MAX_DYNAMIC_ANCESTORS, where):
        out.add("condition", f"step {sid!r}: when is refused: it reads steps other than "
                "by name (steps[x], \"a\" in steps, size(steps), a macro over steps), so "
                "it is given every step it depends on, and it depends on more than "
                f"{MAX_DYNAMIC_ANCESTORS:,}; name the steps it reads (steps.ID.output, "
                "steps.ID.status)", step=sid, path=where)
    _check_step_fields(scope, expr, sid, where, bad)
    _check_facet_reads(scope, expr, sid, where, bad)
    for pname in sorted(param_refs):
        if pname not in scope.declared:
            out.add("condition", f"step {sid!r}: when reads params.{pname}, which the plan "
                    "does not declare", step=sid, path=where)
