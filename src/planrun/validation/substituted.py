"""A checked plan as substituted: what ``validate --format json`` shows of it (SPEC §4, §10)."""

from __future__ import annotations

from typing import Any

from .. import redact
from ..params import UNKNOWN, Template, escape
from .plan import CheckedPlan


def substituted(plan: CheckedPlan) -> dict[str, Any]:
    """``{"params": {...}, "steps": [...]}``: the values used and the steps as substituted.

    ``params`` maps each parameter that has a value (given or default) to it; a secret's
    value is a reference (shown ``***``). ``steps`` are the steps as written, in order, with
    each ``{params.NAME}`` in ``arguments`` and ``for_each`` replaced by its value;
    run-time placeholders (``{steps.…}``, ``{item}``) and parameters with no value stay as
    written, and a literal brace stays escaped (``{{``): the steps read as a plan would.
    """
    params = {name: redact.reference(name) if name in plan.secret_params else value
              for name, value in plan.params.items() if value is not UNKNOWN}
    steps = []
    for step in plan.steps:
        shown = dict(step.raw)
        if "arguments" in shown:
            shown["arguments"] = _written(shown["arguments"], step.arguments)
        if "for_each" in shown and step.for_each is not None:
            shown["for_each"] = _written(shown["for_each"], step.for_each)
        steps.append(shown)
    return {"params": params, "steps": steps}


def _written(raw: Any, value: Any) -> Any:
    """``value`` (substituted) as JSON; where it is unknown, ``raw`` (as written) instead."""
    if value is UNKNOWN:
        return raw
    if isinstance(value, Template):
        return value.source()
    if isinstance(value, str):  # a value: its braces escaped, as it would be written
        return escape(value)
    if isinstance(value, dict):
        return {k: _written(raw.get(k) if isinstance(raw, dict) else None, v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_written(raw[i] if isinstance(raw, list) and i < len(raw) else None, v)
                for i, v in enumerate(value)]
    return value
