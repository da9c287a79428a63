"""Every static check of a plan, gathered into one report (SPEC §4).

:func:`check_plan` takes a loaded document, the registry and the parameter values and
returns a :class:`~planrun.issues.PlanReport` with *every* issue (never only the first)
and, when there is no error, a :class:`CheckedPlan` ready to run. Nothing is repaired:
no coercion, no dropping of unknown fields, no trimming.

The checks run in phases, one module each:

- :mod:`.plan` — the result types (:class:`CheckedPlan`, :class:`CheckedStep`,
  :class:`ParamInput`, :class:`PlanLimits`);
- :mod:`.report` — the issue collector and pydantic errors as issues;
- :mod:`.params` — parameter declarations and the values given;
- :mod:`.steps` — step shapes, ids, pools, dependencies and cycles;
- :mod:`.references` — placeholders and ``when`` conditions against the graph;
- :mod:`.arguments` — arguments against the tool's contract;
- :mod:`.check` — :func:`check_plan`, which runs the phases in order;
- :mod:`.substituted` — a checked plan's steps as substituted (``validate --format json``).
"""

from __future__ import annotations

from .arguments import argument_problems
from .check import check_plan
from .plan import CheckedPlan, CheckedStep, ParamInput, PlanLimits, plan_name

__all__ = ["CheckedPlan", "CheckedStep", "ParamInput", "PlanLimits", "argument_problems",
           "check_plan", "plan_name"]
