"""Typed records at the journal boundary, and their mapping to and from rows.

Code outside ``planrun.journal`` reads runs, steps, items, approvals, leases and events
as these records (parsed values, no column names, no JSON text); this module is the one
place that knows the columns and parses the ``*_json`` ones.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import procs


def _loads(text: str | None) -> Any:
    """A JSON column's value (None for NULL).

    Raises:
        JournalError: the column does not hold JSON (a damaged journal; exit 6).
    """
    if text is None:
        return None
    try:
        return json.loads(text)
    except (ValueError, TypeError, RecursionError) as exc:
        from ..errors import JournalError

        raise JournalError(f"the journal holds a damaged value ({type(exc).__name__}: "
                           f"{str(exc)[:120]}); planrun wrote JSON there",
                           hint="Restore the journal from a backup, or start a new run "
                           "with planrun execute.") from None


#: The column encoders, built once (``json.dumps`` with options builds one per call).
_COLUMN = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_COLUMN_ASCII = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def dumps(value: Any) -> str:
    """Compact JSON for a column.

    Values arrive in reference form (``planrun.redact``): a secret parameter's value is
    already a reference wherever it was, so nothing here needs to know the secrets.
    """
    text = _COLUMN.encode(value)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates (undecodable file names): escape them
            text = _COLUMN_ASCII.encode(value)
    return text


# --- leases -----------------------------------------------------------------------------


def lease_owner() -> str:
    """This process as a lease holder: ``host:pid:token``."""
    return f"{procs.host_name()}:{os.getpid()}:{os.urandom(4).hex()}"


def _owner_pid(owner: str) -> int | None:
    """The pid of a lease holder on this host, or None (another host, or no pid)."""
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != procs.host_name() or not pid_text.isdigit():
        return None
    return int(pid_text)


def holder_identity(owner: str) -> tuple[str | None, int | None]:
    """(boot id, start ticks) of a holder on this host, journaled with its lease.

    With them a later reader tells a live holder from a process that got its pid after a
    reboot or pid reuse. (None, None) for a holder on another host.
    """
    pid = _owner_pid(owner)
    if pid is None:
        return None, None
    return procs.boot_id(), procs.identify(pid).start_ticks


def holder_alive(owner: str, boot_id: str | None = None,
                 start_ticks: int | None = None, since: float | None = None) -> bool | None:
    """Whether the process holding a lease is alive.

    True/False when the holder is on this host (its pid is checked, and with ``boot_id``
    and ``start_ticks`` from the lease, that it is still the same process); None when it is
    on another host, in another pid namespace of this one (a container sharing the host's
    name), or on another machine of the same name (``since``, when the lease was last
    taken or renewed, is after this machine booted: :func:`planrun.procs.same_pids`), and
    cannot be checked from here.
    """
    pid = _owner_pid(owner)
    if pid is None:
        return None
    same = procs.same_pids(boot_id, since)
    if same is not True:
        return same  # False: the machine restarted since; None: another pid space or host
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if procs.exited(pid):
        return False  # a zombie: it ended, its parent has not reaped it
    if start_ticks is not None:
        ticks = procs.identify(pid).start_ticks
        if ticks is not None and ticks != start_ticks:
            return False  # the pid now belongs to another process
    return True


@dataclass(frozen=True)
class Lease:
    """A run's lease (SPEC §7 "Leases", §11).

    Attributes:
        owner: ``host:pid:token`` of the holder.
        epoch: how many times the run's lease was taken; every guarded write checks it.
        until: when it expires, seconds since the epoch by the database clock.
        remaining_s: seconds left when it was read (database clock; 0 or less: expired,
            also when it has no expiry).
        boot_id: the holder's machine boot id, when known.
        start_ticks: the holder process's start time (clock ticks since boot), when known.
    """

    owner: str
    epoch: int
    until: float | None
    remaining_s: float
    boot_id: str | None = None
    start_ticks: int | None = None

    @property
    def expired(self) -> bool:
        """Whether the lease ran out without renewal (the database clock says)."""
        return self.remaining_s <= 0

    def holder_alive(self) -> bool | None:
        """:func:`holder_alive` of this lease's holder (None: another host)."""
        return holder_alive(self.owner, self.boot_id, self.start_ticks, self.renewed_at())

    def renewed_at(self) -> float | None:
        """When the lease was last taken or renewed (database clock), if it can be told."""
        if self.until is None:
            return None
        from .base import lease_ttl  # records is imported by base

        return self.until - lease_ttl()

    def driven(self) -> bool:
        """Unexpired and its holder not known dead: a process drives the run."""
        return not self.expired and self.holder_alive() is not False

    def held_by_this_process(self) -> bool:
        """Whether this process is the holder."""
        return _owner_pid(self.owner) == os.getpid() and procs.same_pids(self.boot_id) is True


def driven(lease: Lease | None) -> bool:
    """Whether a live process drives the run of ``lease`` (this one included).

    That is, an unexpired holder not known dead: a run whose process died shows
    ``running`` until it is resumed.
    """
    return lease is not None and (lease.held_by_this_process() or lease.driven())


def lease_record(row: Sequence[Any]) -> Lease:
    """(owner, epoch, until, until less the database clock, boot id, start ticks, …)."""
    owner, epoch, until, remaining, boot, start = row[:6]
    return Lease(owner=str(owner), epoch=int(epoch or 0),
                 until=None if until is None else float(until),
                 remaining_s=0.0 if remaining is None else float(remaining),
                 boot_id=boot, start_ticks=start)


# --- runs -----------------------------------------------------------------------------


@dataclass(frozen=True)
class NewRun:
    """A run to journal (``execute``, ``retry``, or a refused plan).

    ``plan`` is the stored plan document, ``params`` the stored parameter values,
    ``contracts`` the tools' contracts, ``options`` run options (``max_parallel``,
    ``keep_going``, ``file_sha256``), ``report`` a refused plan's report. ``lease_owner``:
    the process that takes the run's lease in the same transaction (its ``until`` comes
    from the database clock).
    """

    run_id: str
    root_run_id: str
    plan_name: str
    plan: Any
    digest: str
    revision: int
    status: str
    created_at: str
    parent_run_id: str | None = None
    plan_file: str | None = None
    project: str | None = None
    goal: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    contracts: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    report: Any = None
    finished_at: str | None = None
    lease_owner: str | None = None


def new_run_columns(run: NewRun) -> dict[str, Any]:
    """The ``runs`` columns of a new run (the lease columns are set by the journal)."""
    return {
        "run_id": run.run_id, "root_run_id": run.root_run_id,
        "parent_run_id": run.parent_run_id, "plan_name": run.plan_name,
        "plan_file": run.plan_file, "project": run.project, "plan_json": dumps(run.plan),
        "digest": run.digest, "revision": run.revision, "goal": run.goal,
        "params_json": dumps(run.params), "contracts_json": dumps(run.contracts),
        "options_json": dumps(run.options),
        "report_json": None if run.report is None else dumps(run.report),
        "status": run.status, "created_at": run.created_at, "finished_at": run.finished_at,
    }


@dataclass(frozen=True)
class RunRecord:
    """A journaled run.

    Attributes:
        run_id, root_run_id, parent_run_id: the run and its lineage.
        plan_name, plan_file, digest, revision, goal: its plan.
        status: one of ``RUN_STATUSES``.
        created_at, finished_at: RFC 3339 UTC (finished_at None while unfinished).
        project: the project folder it ran in (None: journaled before projects were).
        params: stored parameter values (reference form); contracts: the tools'
            contracts; options: run options; report: a refused plan's report or None.
        lease: the run's lease, or None when nobody holds it.
        plan: the stored plan document (parsed on first use).
    """

    run_id: str
    root_run_id: str
    parent_run_id: str | None
    plan_name: str
    plan_file: str | None
    digest: str
    revision: int
    goal: str | None
    status: str
    created_at: str
    finished_at: str | None
    project: str | None
    params: dict[str, Any]
    contracts: dict[str, Any]
    options: dict[str, Any]
    report: Any
    lease: Lease | None
    _plan_text: str = field(repr=False, compare=False, default="null")

    @functools.cached_property
    def plan(self) -> Any:
        """The stored plan document."""
        return json.loads(self._plan_text)


def run_record(row: dict[str, Any]) -> RunRecord:
    """A ``runs`` row (with ``lease_remaining``: ``lease_expires`` less the database clock)."""
    owner = row.get("lease_owner")
    lease = None if not owner else Lease(
        owner=str(owner), epoch=int(row.get("lease_epoch") or 0),
        until=row.get("lease_expires"),
        remaining_s=float(row["lease_remaining"]) if row.get("lease_remaining") is not None
        else 0.0,
        boot_id=row.get("lease_boot"), start_ticks=row.get("lease_start"))
    return RunRecord(
        run_id=row["run_id"], root_run_id=row["root_run_id"],
        parent_run_id=row["parent_run_id"], plan_name=row["plan_name"],
        plan_file=row["plan_file"], digest=row["digest"], revision=row["revision"],
        goal=row["goal"], status=row["status"], created_at=row["created_at"],
        finished_at=row["finished_at"], project=row.get("project"),
        params=_loads(row["params_json"]) or {},
        contracts=_loads(row["contracts_json"]) or {},
        options=_loads(row.get("options_json")) or {},
        report=_loads(row.get("report_json")), lease=lease,
        _plan_text=row["plan_json"])


# --- steps and items --------------------------------------------------------------------


@dataclass(frozen=True)
class StepRecord:
    """A journaled step of a run.

    Attributes:
        step_id, position, tool: the step, its index in plan order, its tool.
        status: one of ``STEP_STATUSES``.
        attempts: dispatches so far; recoveries: re-dispatches after a crash.
        idempotency_key: the key of its last dispatch, or None.
        error: ``{"code", "message", …}`` of a failed/indeterminate/skipped step, or None.
        skip_reason, started_at, finished_at, replayed, approved_by: as journaled.
        output_bytes: size of the stored output (0 without one): the length in bytes of
            its JSON text as stored (UTF-8, compact).
        facets: the stored facets (``{"values": {NAME: value}, "cut": [NAME]}``), or None.
        output: the stored output (parsed on first use; None without one).
    """

    run_id: str
    step_id: str
    position: int
    tool: str
    status: str
    attempts: int
    recoveries: int
    idempotency_key: str | None
    error: dict[str, Any] | None
    skip_reason: str | None
    started_at: str | None
    finished_at: str | None
    replayed: bool
    approved_by: str | None
    output_bytes: int
    facets: dict[str, Any] | None = None
    _output_text: str | None = field(repr=False, compare=False, default=None)

    @functools.cached_property
    def output(self) -> Any:
        """The stored output (None when there is none)."""
        return _loads(self._output_text)


def step_records(names: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[StepRecord]:
    """``steps`` rows (columns ``names``, as ``SELECT *`` gives them) as records.

    Columns added by later schema versions (``recoveries``, ``facets_json``) may be missing
    in a journal opened read-only before its migration: they read as 0 and None. The
    columns are looked up once, not per row (a 10,000-step run's resume reads them all).
    """
    at = {name: i for i, name in enumerate(names)}
    (run_i, step_i, pos_i, tool_i, status_i, attempts_i, key_i, err_i, skip_i, start_i,
     finish_i, replayed_i, approved_i, out_i) = (at[c] for c in (
        "run_id", "step_id", "position", "tool", "status", "attempts", "idempotency_key",
        "error_json", "skip_reason", "started_at", "finished_at", "replayed", "approved_by",
        "output_json"))
    rec_i, facets_i = at.get("recoveries"), at.get("facets_json")
    out = []
    # Made without the frozen __init__ (one object.__setattr__ a field: 3.1 against 0.35 µs
    # a record; a 10,000-step resume reads them all): every field is set, as
    # tests/test_journal_records.py checks against records made by the __init__.
    new, cls = object.__new__, StepRecord
    for row in rows:
        text = row[out_i]
        rec = new(cls)
        rec.__dict__.update(
            run_id=row[run_i], step_id=row[step_i], position=row[pos_i], tool=row[tool_i],
            status=row[status_i], attempts=row[attempts_i],
            recoveries=(row[rec_i] or 0) if rec_i is not None else 0,
            idempotency_key=row[key_i], error=_loads(row[err_i]), skip_reason=row[skip_i],
            started_at=row[start_i], finished_at=row[finish_i],
            replayed=bool(row[replayed_i]), approved_by=row[approved_i],
            output_bytes=len(text.encode()) if text else 0,
            facets=_loads(row[facets_i]) if facets_i is not None else None,
            _output_text=text)
        out.append(rec)
    return out


@dataclass(frozen=True)
class ItemRecord:
    """A journaled fan-out item of a step (fields as :class:`StepRecord`)."""

    run_id: str
    step_id: str
    index: int
    status: str
    attempts: int
    recoveries: int
    idempotency_key: str | None
    error: dict[str, Any] | None
    started_at: str | None
    finished_at: str | None
    replayed: bool
    _output_text: str | None = field(repr=False, compare=False, default=None)

    @functools.cached_property
    def output(self) -> Any:
        """The stored output (None when there is none)."""
        return _loads(self._output_text)


def item_record(row: dict[str, Any]) -> ItemRecord:
    """An ``items`` row as a record."""
    return ItemRecord(
        run_id=row["run_id"], step_id=row["step_id"], index=row["item_index"],
        status=row["status"], attempts=row["attempts"], recoveries=row.get("recoveries") or 0,
        idempotency_key=row["idempotency_key"], error=_loads(row["error_json"]),
        started_at=row["started_at"], finished_at=row["finished_at"],
        replayed=bool(row["replayed"]), _output_text=row["output_json"])


@dataclass(frozen=True)
class ApprovalRecord:
    """One journaled approval decision."""

    id: int
    run_id: str
    step_id: str
    item: int | None
    tool: str
    digest: str
    granted: bool
    decided_by: str
    method: str
    decided_at: str
    reason: str | None


def approval_record(row: dict[str, Any]) -> ApprovalRecord:
    """An ``approvals`` row as a record."""
    return ApprovalRecord(
        id=row["id"], run_id=row["run_id"], step_id=row["step_id"], item=row["item_index"],
        tool=row["tool"], digest=row["digest"], granted=bool(row["granted"]),
        decided_by=row["decided_by"], method=row["method"], decided_at=row["decided_at"],
        reason=row["reason"])


@dataclass(frozen=True)
class EventRecord:
    """One journaled event (``planrun log``'s objects, SPEC §8)."""

    id: int
    ts: str
    kind: str
    step: str | None
    item: int | None
    data: Any

    def to_json(self) -> dict[str, Any]:
        """``{"id", "ts", "kind", "step", "item", "data"}``."""
        return {"id": self.id, "ts": self.ts, "kind": self.kind, "step": self.step,
                "item": self.item, "data": self.data}


def event_record(row: Sequence[Any]) -> EventRecord:
    """(id, ts, kind, step_id, item_index, data_json) as a record."""
    eid, ts, kind, step_id, item, data = row
    return EventRecord(id=eid, ts=ts, kind=kind, step=step_id, item=item, data=_loads(data))


@dataclass(frozen=True)
class KeyRecord:
    """A journaled idempotency key (SPEC §7 "Idempotency keys")."""

    key: str
    root_run_id: str
    run_id: str
    step_id: str
    item: int | None
    status: str
    output: Any
    claimed_at: str
    finished_at: str | None


def key_record(row: Sequence[Any]) -> KeyRecord:
    """An ``idempotency_keys`` row (in column order) as a record."""
    key, root, run_id, step_id, item, status, out, claimed, finished = row
    return KeyRecord(key=key, root_run_id=root, run_id=run_id, step_id=step_id, item=item,
                     status=status, output=_loads(out), claimed_at=claimed,
                     finished_at=finished)


def named(names: Sequence[str], row: Sequence[Any]) -> dict[str, Any]:
    """A row as a dict of its column names."""
    return dict(zip(names, row, strict=True))
