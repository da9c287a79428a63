"""The journal: the only package that knows its database (SPEC §7, §11).

Outside it, runs, steps, items, leases, approvals and events are typed records
(:mod:`.records`); the database itself is a backend (:mod:`.backends`; SQLite so far).
"""

from __future__ import annotations

from .records import (
    ApprovalRecord,
    EventRecord,
    ItemRecord,
    Lease,
    NewRun,
    RunRecord,
    StepRecord,
)
from .schema import SCHEMA_VERSION
from .store import (
    EVENT_KINDS,
    FINISHED,
    RUN_STATUSES,
    STEP_STATUSES,
    Journal,
    count_summary,
    dumps,
    now,
)

__all__ = ["EVENT_KINDS", "FINISHED", "RUN_STATUSES", "SCHEMA_VERSION", "STEP_STATUSES",
           "ApprovalRecord",
           "EventRecord", "ItemRecord", "Journal", "Lease", "NewRun", "RunRecord",
           "StepRecord", "count_summary", "dumps", "now"]
