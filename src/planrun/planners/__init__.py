"""Planners: from a goal to a plan (SPEC §10).

- :mod:`.spec`: which planner a ``--planner`` value names (``cmd:``, ``python:``,
  ``[planners.NAME]``);
- :mod:`.invoke`: asking it once (protocol version 1: a JSON request in, a plan out);
- :mod:`.rounds`: the bounded rounds loop, :func:`propose` (used by ``plan`` and
  ``repair``);
- :mod:`.session`: journaling the rounds.

A planner is never trusted: what it writes is data, validated like any plan file. A plan
cannot carry decisions (approvals, grants, policy): the plan format has no such fields,
so a plan that tries is refused (``schema``) and sent back.
"""

from __future__ import annotations

from .invoke import MAX_OUTPUT_BYTES, PlannerFailed
from .rounds import PROTOCOL, Accepted, PlannerParams, Session, catalog, propose, request_base
from .session import EventSession, JournalSession
from .spec import DEFAULT_MAX_ROUNDS, DEFAULT_TIMEOUT_S, Planner, resolve_planner

__all__ = ["DEFAULT_MAX_ROUNDS", "DEFAULT_TIMEOUT_S", "MAX_OUTPUT_BYTES", "PROTOCOL",
           "Accepted", "EventSession", "JournalSession", "Planner", "PlannerFailed",
           "PlannerParams", "Session", "catalog", "propose", "request_base",
           "resolve_planner"]
