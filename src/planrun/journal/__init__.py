"""The SQLite journal: the only package that imports :mod:`sqlite3` (SPEC §7)."""

from __future__ import annotations

from .schema import SCHEMA_VERSION
from .store import EVENT_KINDS, RUN_STATUSES, STEP_STATUSES, Journal, count_summary, dumps, now

__all__ = ["EVENT_KINDS", "RUN_STATUSES", "SCHEMA_VERSION", "STEP_STATUSES", "Journal",
           "count_summary", "dumps", "now"]
