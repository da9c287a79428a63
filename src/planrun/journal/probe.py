"""A read-only look at a journal, as records: for tests and tools, never SQL.

``probe(location)`` answers what a test would otherwise ask the database directly (the
lease of a run, a step's status, the recorded calls, an idempotency key), through the
journal's own reads, so the same test runs against any backend. Each question opens the
journal afresh (it sees what other processes committed) and changes nothing.

Example::

    p = probe(project.journal)
    assert p.step("a").status == "succeeded"
    assert p.lease() is None
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import RunError
from .records import (
    ApprovalRecord,
    EventRecord,
    ItemRecord,
    KeyRecord,
    Lease,
    RunRecord,
    StepRecord,
)
from .store import Journal


class Probe:
    """Questions about one journal (see :func:`probe`).

    ``run_id`` arguments default to the newest run; a unique prefix is accepted.

    Raises:
        RunError: ``unknown_run`` when there is no such run (or no run at all).
        JournalError: the journal cannot be read (exit 6).
    """

    def __init__(self, location: Path | str) -> None:
        self.location = location

    @contextmanager
    def _open(self) -> Iterator[Journal]:
        with Journal(self.location, write=False) as journal:
            yield journal

    def _id(self, journal: Journal, run_id: str | None) -> str:
        if run_id is not None:
            return journal.resolve_run_id(run_id)
        ids = journal.run_ids()
        if not ids:
            from .backends import shown_location

            raise RunError(f"no run in {shown_location(self.location)}", code="unknown_run")
        return ids[0]

    def run_ids(self) -> list[str]:
        """Every run's id, newest first."""
        with self._open() as j:
            return j.run_ids()

    def runs(self) -> list[RunRecord]:
        """Every run, newest first."""
        with self._open() as j:
            return [j.run(r) for r in j.run_ids()]

    def run(self, run_id: str | None = None) -> RunRecord:
        """One run."""
        with self._open() as j:
            return j.run(self._id(j, run_id))

    def lease(self, run_id: str | None = None) -> Lease | None:
        """A run's lease, or None when nobody holds it."""
        with self._open() as j:
            return j.lease(self._id(j, run_id))

    def steps(self, run_id: str | None = None) -> list[StepRecord]:
        """A run's steps in plan order."""
        with self._open() as j:
            return j.steps(self._id(j, run_id))

    def step(self, step_id: str, run_id: str | None = None) -> StepRecord:
        """One step of a run.

        Raises:
            KeyError: the run has no such step.
        """
        for s in self.steps(run_id):
            if s.step_id == step_id:
                return s
        raise KeyError(step_id)

    def items(self, step_id: str, run_id: str | None = None) -> list[ItemRecord]:
        """A fan-out step's items in index order."""
        with self._open() as j:
            return j.items(self._id(j, run_id), step_id)

    def events(self, run_id: str | None = None) -> list[EventRecord]:
        """A run's events in order."""
        with self._open() as j:
            return j.event_records(self._id(j, run_id))

    def approvals(self, run_id: str | None = None) -> list[ApprovalRecord]:
        """A run's approval decisions in order."""
        with self._open() as j:
            return j.approval_records(self._id(j, run_id))

    def calls(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """Recorded command calls (of one run, or of every run), as ``Journal.calls``."""
        with self._open() as j:
            ids = [self._id(j, run_id)] if run_id is not None else j.run_ids()
            return [{"run_id": r, **c} for r in ids for c in j.calls(r)]

    def key(self, key: str) -> KeyRecord | None:
        """An idempotency key as journaled, or None."""
        with self._open() as j:
            return j.key(key)


def probe(location: Path | str) -> Probe:
    """A :class:`Probe` of the journal at ``location`` (a file path or a URL)."""
    return Probe(location)
