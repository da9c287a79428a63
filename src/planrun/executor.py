"""The executor's names, where they were before it was split (see :mod:`planrun.execution`).

``from planrun.executor import Executor, StepState, inject_fault, ...`` keeps working.
"""

from __future__ import annotations

from .execution.common import (
    BEFORE_CALL,
    CRASH_ENV,
    CRASH_POINTS,
    GRACE_S,
    IN_JOURNAL,
    INTERNAL_ENV,
    MAX_ITEMS,
    MAX_RECOVERIES,
    Later,
    Outcome,
    Progress,
    StepState,
    idempotency_key,
    inject_fault,
    internal_error,
)
from .execution.scheduler import Executor

__all__ = [
    "BEFORE_CALL",
    "CRASH_ENV",
    "CRASH_POINTS",
    "GRACE_S",
    "INTERNAL_ENV",
    "IN_JOURNAL",
    "MAX_ITEMS",
    "MAX_RECOVERIES",
    "Executor",
    "Later",
    "Outcome",
    "Progress",
    "StepState",
    "idempotency_key",
    "inject_fault",
    "internal_error",
]
