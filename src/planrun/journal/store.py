"""The journal handle: :class:`Journal`, composed of its parts by concern (SPEC §7).

- :mod:`.base`: the handle, its transactions, the lease guard, events;
- :mod:`.runs`: runs (create, refuse, finish, approvals, resume, retry copies, deletion);
- :mod:`.steps`: steps and fan-out items (dispatch and outcome records, replay, resolve);
- :mod:`.calls`: process groups of running command calls (SPEC §12);
- :mod:`.leases`: leases (owner, epoch, until by the database clock);
- :mod:`.reads`: reads, as typed records (:mod:`.records`);
- :mod:`.planning`: planning sessions (SPEC §10).

The names other modules import from here stay importable from here.
"""

from __future__ import annotations

from .base import (
    EVENT_KINDS,
    FINISHED,
    LEASE_TTL_ENV,
    LEASE_TTL_S,
    MIN_PREFIX,
    RUN_STATUSES,
    STEP_STATUSES,
    LeaseLost,
    count_summary,
    lease_ttl,
    new_run_id,
    now,
)
from .dispatch import DispatchMixin
from .leases import LeasesMixin
from .planning import PlanningMixin
from .reads import ReadsMixin
from .records import dumps, holder_alive, lease_owner
from .runs import RunsMixin
from .steps import StepsMixin

__all__ = ["EVENT_KINDS", "FINISHED", "LEASE_TTL_ENV", "LEASE_TTL_S", "MIN_PREFIX", "RUN_STATUSES",
           "STEP_STATUSES", "Journal", "LeaseLost", "count_summary", "dumps", "holder_alive",
           "lease_owner", "lease_ttl", "new_run_id", "now"]


class Journal(RunsMixin, DispatchMixin, StepsMixin, LeasesMixin, ReadsMixin, PlanningMixin):
    """A handle on one journal (a file path, SQLite; or a URL of a supported backend).

    Args:
        path: the journal's location.
        write: open for writing (creates and migrates); else read-only, and a journal that
            does not exist yet reads as empty.

    Raises:
        JournalError: the journal cannot be used (exit 6).
    """

    def __enter__(self) -> Journal:
        return self
