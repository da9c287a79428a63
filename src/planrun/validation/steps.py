"""Steps: each step's shape, unique ids, pools, then ``depends_on`` and cycles."""

from __future__ import annotations

import graphlib
from typing import Any

from .. import graph
from ..formats import StepData, step_data
from ..pointers import pointer, pointer_escape
from .plan import PlanLimits
from .report import Collector, pydantic_issues

#: (index in the plan, the step as written, its fields as ``models.Step`` gives them) of
#: each well-shaped step.
ShapedStep = tuple[int, dict[str, Any], StepData]

_FANOUT_ONLY = ("max_parallel", "max_items", "on_item_error")


def check_steps(raw_steps: list[Any], limits: PlanLimits,
                out: Collector) -> tuple[list[ShapedStep], dict[str, int]]:
    """Check each step's shape, id and pool.

    Returns:
        The well-shaped steps, and step id → index of its first use.
    """
    steps: list[ShapedStep] = []
    ids: dict[str, int] = {}
    for i, raw in enumerate(raw_steps):
        base = f"/steps/{i}"  # pointer("steps", i): an index needs no escaping
        if not isinstance(raw, dict):
            out.add("schema", f"step {i} must be a mapping", path=base)
            continue
        sid = raw.get("id") if isinstance(raw.get("id"), str) else None
        model = step_data(raw) or _step_by_model(raw, base, sid, out)
        if sid is not None:
            if sid in ids:
                out.add("duplicate_id", f"step id {sid!r} is used by steps {ids[sid]} and "
                        f"{i}; ids must be unique", step=sid, path=base + "/id")
            else:
                ids[sid] = i
        if model is not None:
            _check_fields(raw, model, sid, base, limits, out)
            steps.append((i, raw, model))
    return steps, ids


def _step_by_model(raw: dict[str, Any], base: str, sid: str | None,
                   out: Collector) -> StepData | None:
    """``raw`` validated by ``models.Step`` (what the fast path could not accept), or None.

    Each pydantic error is one ``schema`` issue (:func:`.report.pydantic_issues`).
    """
    from pydantic import ValidationError

    from ..models import Step

    try:
        return StepData.of_model(Step.model_validate(raw))
    except ValidationError as exc:
        pydantic_issues(out, exc, base, raw, sid)
        return None


def _check_fields(raw: dict[str, Any], model: StepData, sid: str | None, base: str,
                  limits: PlanLimits, out: Collector) -> None:
    """Fan-out fields without ``for_each``, and a pool the project does not declare."""
    if model.for_each is None:
        for fld in _FANOUT_ONLY:
            if fld in raw:
                out.add("schema", f"step {sid!r}: {fld!r} applies only to a step with "
                        "for_each", step=sid, path=f"{base}/{fld}", key=True)
    if model.facets is not None:
        _check_facet_paths(raw.get("facets"), sid, base + "/facets", out)
    if model.pool is not None and model.pool not in limits.pools:
        out.add("schema", f"step {sid!r}: pool {model.pool!r} is not declared in "
                f"[pools] of planrun.toml.{out.did_you_mean(model.pool, limits.pools)}",
                step=sid, path=base + "/pool")


def _check_facet_paths(raw: Any, sid: str | None, base: str, out: Collector) -> None:
    """Facet paths that do not parse, and a name declared by two kinds (``schema``)."""
    from ..facets import KINDS, PathError, parse_path

    first: dict[str, str] = {}
    for kind in KINDS:
        table = raw.get(kind) if isinstance(raw, dict) else None
        for name, path in (table or {}).items():
            where = f"{base}/{kind}/{pointer_escape(str(name))}"
            if name in first:
                out.add("schema", f"step {sid!r}: facet {name!r} is declared under both "
                        f"{first[name]} and {kind}; each facet name is used once "
                        "(steps.ID.facets.NAME reads it)", step=sid, path=where, key=True)
            else:
                first[name] = kind
            try:
                parse_path(path)
            except PathError as exc:
                out.add("schema", f"step {sid!r}: facet {name!r}: path {path!r}: {exc}",
                        step=sid, path=where)


def check_dependencies(steps: list[ShapedStep], ids: dict[str, int], out: Collector
                       ) -> tuple[dict[str, list[str]], list[str] | None,
                                  graphlib.TopologicalSorter[str] | None]:
    """Check each ``depends_on`` entry, then look for a cycle.

    Returns:
        Step id → the ids it depends on (unknown ones and repeats dropped), a cycle (as
        :func:`planrun.graph.find_cycle` gives it) or None, and the graph's prepared
        sorter when there is no cycle (:func:`planrun.graph.prepared_graph`).
    """
    deps: dict[str, list[str]] = {}
    for i, _raw, model in steps:
        mine: list[str] = []
        seen: set[str] = set()  # a list's ``in`` made a fan-in of N steps N x N
        for j, dep in enumerate(model.depends_on):
            if dep == model.id:
                out.add("dependency", f"step {model.id!r} depends on itself", step=model.id,
                        path=f"/steps/{i}/depends_on/{j}")
            elif dep not in ids:
                out.add("dependency", f"step {model.id!r} depends on {dep!r}, which is not a "
                        f"step of this plan.{out.did_you_mean(dep, ids)}", step=model.id,
                        path=f"/steps/{i}/depends_on/{j}")
            elif dep not in seen:
                seen.add(dep)
                mine.append(dep)
        deps.setdefault(model.id, mine)
    sorter, cycle = graph.prepared_graph(deps)
    if cycle is not None:
        loop = list(reversed(cycle))
        first = loop[0]
        out.add("cycle", f"steps wait on each other: {' -> '.join(loop)} (each waits on the "
                "next); break the loop", step=first,
                path=f"{pointer('steps', ids[first])}/depends_on")
    return deps, cycle, sorter
