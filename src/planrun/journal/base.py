"""The journal's plumbing: one handle, its transactions, its lease guard (SPEC §7).

Every state change and its event are written in one transaction. A step's dispatch record
(``running`` with its idempotency key) commits before its tool is called; its outcome is an
UPDATE guarded by the expected status, so a record can never move backwards.

Nothing here is specific to one database: the backend (``planrun.journal.backends``)
supplies connections, transactions and the few SQL fragments that differ.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from ..errors import JournalError, RunError
from .backends import Fail, JournalBackend, open_backend, shown_location
from .records import dumps

#: A connection of the backend (its driver's type).
Conn = Any

#: Event kinds (SPEC §7; ``plan_proposed`` and ``replanned`` from SPEC §10).
EVENT_KINDS: tuple[str, ...] = (
    "planned", "plan_proposed", "plan_refused", "replanned", "approval_required",
    "approval_granted", "approval_denied", "autonomy_escalated", "autonomy_refused",
    "step_started", "step_succeeded", "step_failed",
    "step_retried", "step_skipped", "step_replayed", "run_interrupted", "run_resumed",
    "run_finished", "indeterminate_resolved",
)
STEP_STATUSES = ("pending", "running", "succeeded", "partial", "failed", "skipped",
                 "indeterminate")
#: Statuses of a step that finished with an output later steps use: ``partial`` is a
#: fan-out with ``on_item_error: skip|collect`` some of whose items failed (issue 17).
FINISHED = ("succeeded", "partial")
#: Run statuses (SPEC §7; ``planning``, ``planned`` and ``awaiting_approval`` from SPEC §10).
RUN_STATUSES: tuple[str, ...] = (
    "running", "completed", "failed", "interrupted", "denied", "refused",
    "awaiting_approval", "planning", "planned",
)
#: Run statuses of a run that may still go on (resume, approve, a plan to run): ``prune``
#: deletes such a run only when its status is named (it may hold calls of unknown effect).
UNFINISHED: tuple[str, ...] = ("running", "interrupted", "awaiting_approval", "planning",
                               "planned")
#: Shortest run-id prefix accepted (SPEC §8).
MIN_PREFIX = 4
#: Seconds a lease lasts without renewal; a running process renews it every third of this.
LEASE_TTL_S = 30.0
#: Test-only seam: ``PLANRUN_TEST_LEASE_TTL_S=SECONDS`` shortens the lease (and so the
#: heartbeat, every third of it), so lease tests need not wait 30 s.
LEASE_TTL_ENV = "PLANRUN_TEST_LEASE_TTL_S"


def lease_ttl() -> float:
    """Seconds a lease lasts without renewal: :data:`LEASE_TTL_S` unless the test seam says."""
    raw = os.environ.get(LEASE_TTL_ENV)
    if raw:
        try:
            value = float(raw)
        except ValueError:
            return LEASE_TTL_S
        if 0.3 <= value <= LEASE_TTL_S:
            return value
    return LEASE_TTL_S


class LeaseLost(RunError):
    """Another process took this run's lease: this process must stop writing to it.

    Exit 5, code ``run_busy``.
    """

    default_code = "run_busy"


F = TypeVar("F", bound=Callable[..., Any])


def _reads(method: F) -> F:
    """A read whose failure on a corrupt or unreadable journal is a JournalError (exit 6)."""

    @functools.wraps(method)
    def wrapper(self: JournalBase, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except self.backend.DatabaseError as exc:
            raise self.backend.fail(exc, "read") from None

    return wrapper  # type: ignore[return-value]


def now() -> str:
    """The current time, RFC 3339 in UTC with an offset (``2026-11-29T12:00:00.123+00:00``)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def epoch_seconds(ts: Any) -> float | None:
    """A journal time (RFC 3339 text, as :func:`now` writes it) in seconds since the epoch.

    One without an offset is UTC (planrun never wrote one; a hand-edited journal may).
    None for no time or one that does not parse.
    """
    if not ts:
        return None
    try:
        when = datetime.fromisoformat(str(ts))
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def new_run_id() -> str:
    """A fresh run id: 16 random hex characters."""
    return os.urandom(8).hex()


class JournalBase:
    """A handle on one journal: its connection, transactions and lease guard.

    Args:
        path: the journal's location: a file path (SQLite) or a URL.
        write: open for writing (creates and migrates); else read-only, and a journal that
            does not exist yet reads as empty.

    Raises:
        JournalError: the journal cannot be used, or its URL scheme is not supported
            (exit 6).
    """

    def __init__(self, path: Path | str, *, write: bool) -> None:
        self.backend: JournalBackend = open_backend(path)
        #: Where the journal is, to connect to: a URL may hold a password. Messages use
        #: :attr:`shown`.
        self.path = path
        #: The location for messages: a URL's password masked (``shown_location``).
        self.shown = shown_location(path)
        self.conn: Conn | None = self.backend.open(write=write)
        #: When set, step writes check that this owner still holds the run's lease.
        self.owner: str | None = None
        #: The lease epoch this handle took per run; guarded writes check it.
        self._epochs: dict[str, int] = {}
        #: Outcome records waiting to share the next write's transaction (group commit).
        self._deferred: list[Callable[[Conn], None]] = []
        #: Runs whose lease was checked in the current transaction.
        self._guarded: set[str] = set()
        #: A fresh run's keys cannot be claimed by another run (its id is part of each).
        self.fresh_keys = False
        #: The project folder ``last`` (and other defaults) are taken in, or None for any.
        self.project: str | None = None

    def close(self) -> None:
        """Commit deferred outcome records, then close the connection.

        Raises:
            JournalError: the deferred records could not be written (the connection is
                closed anyway; the steps stay ``running`` for resume to settle).
        """
        if self.conn is not None:
            try:
                self.flush()
            finally:
                self._deferred.clear()
                self.conn.close()
                self.conn = None

    def __enter__(self) -> Any:
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        if et is None:
            self.close()
            return
        # An error is on its way out: the deferred records are tried once more, but a
        # failure to write them never takes that error's place (a journal whose disk
        # filled up mid-run said so without naming the run: the close's second error
        # masked the one that did; found by a fresh operator).
        with contextlib.suppress(JournalError):
            self.close()

    def _c(self) -> Conn:
        if self.conn is None:
            raise JournalError(f"the journal {self.shown} is not open for this")
        return self.conn

    def _write(self) -> Any:
        return _Tx(self)

    def snapshot(self) -> Any:
        """``with journal.snapshot():`` the reads inside see one state of the journal."""
        if self.conn is None:
            return contextlib.nullcontext()
        return self.backend.snapshot(self.conn)

    def flush(self) -> None:
        """Commit the deferred outcome records now (one transaction)."""
        if self._deferred:
            with self._write():
                pass

    def _apply(self, write: Callable[[Conn], None], defer: bool) -> None:
        """Run ``write`` in a transaction now, or (``defer``) in the next commit's."""
        if defer:
            self._deferred.append(write)
        else:
            with self._write() as c:
                write(c)

    def drop_deferred(self) -> None:
        """Forget the deferred records unwritten (after the run's lease was lost)."""
        self._deferred.clear()

    @property
    def pending_writes(self) -> int:
        """How many deferred records wait for the next commit."""
        return len(self._deferred)

    def _guard(self, conn: Conn, run_id: str) -> None:
        """Refuse the write unless this handle's owner holds the run's lease at its epoch.

        The lease row is checked in the write transaction (which every other writer waits
        for), by the backend's ``expect`` (on PostgreSQL on the server, before anything
        after it in the transaction): a lost lease rolls the whole transaction back.

        Raises:
            LeaseLost: another process (or nobody) holds the lease now (exit 5, run_busy).
        """
        guard = self._lease_check(run_id)
        if guard is None:
            return
        owner, epoch, lost = guard
        condition = "EXISTS (SELECT 1 FROM runs WHERE run_id = ? AND lease_owner = ?"
        params: tuple[Any, ...] = (run_id, owner)
        if epoch is not None:
            condition += " AND lease_epoch = ?"
            params += (epoch,)
        self.backend.expect(conn, condition + ")", params, lost,
                            "SELECT lease_owner FROM runs WHERE run_id = ?", (run_id,))

    def _lease_check(self, run_id: str) -> tuple[str, int | None, Fail] | None:
        """(owner, epoch or None, the LeaseLost maker) of :meth:`_guard`'s check, or None.

        None when there is nothing to check: no owner, or the run was checked already in
        this transaction (once per transaction and run). A backend's server-side write
        (``backend.calls``) makes the check itself with these.
        """
        if self.owner is None or run_id in self._guarded:
            return None
        self._guarded.add(run_id)

        def lost(holder: str | None) -> BaseException:
            return LeaseLost(f"run {run_id} is now held by {holder or 'nobody'}; "
                             "this process stops writing to it")

        return self.owner, self._epochs.get(run_id), lost

    def _expect_changed(self, conn: Conn, sql: str, params: tuple[Any, ...], message: str,
                        rows: int = 1) -> None:
        """Run ``sql`` (UPDATE/DELETE), which must change ``rows`` rows, else JournalError.

        The backend checks it (``expect_changed``; on PostgreSQL on the server): the
        transaction is rolled back, nothing of it is written.

        Raises:
            JournalError: ``message`` (exit 6) when the statement changed another count.
        """
        self.backend.expect_changed(conn, sql, params, rows, lambda _: JournalError(message))

    def _event(self, conn: Conn, run_id: str, kind: str,
               step_id: str | None = None, item: int | None = None, data: Any = None,
               ts: str | None = None) -> None:
        conn.execute(
            "INSERT INTO events (run_id, ts, kind, step_id, item_index, data_json) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (run_id, ts or now(), kind, step_id, item, None if data is None else dumps(data)))

    def _events(self, conn: Conn, run_id: str,
                events: list[tuple[str, str | None, int | None, Any, str]]) -> None:
        """Several events of one run in one statement: (kind, step, item, data, ts) each."""
        conn.execute(
            "INSERT INTO events (run_id, ts, kind, step_id, item_index, data_json) VALUES "
            + ", ".join("(?, ?, ?, ?, ?, ?)" for _ in events),
            tuple(v for kind, step_id, item, data, ts in events
                  for v in (run_id, ts, kind, step_id, item,
                            None if data is None else dumps(data))))

    @staticmethod
    def _target(run_id: str, step_id: str, item: int | None) -> tuple[str, str, tuple[Any, ...]]:
        """(table, WHERE clause, its parameters) of a step or one fan-out item."""
        if item is None:
            return "steps", "run_id = ? AND step_id = ?", (run_id, step_id)
        return "items", "run_id = ? AND step_id = ? AND item_index = ?", (run_id, step_id,
                                                                           item)


def count_summary(by_status: dict[str, int]) -> dict[str, int]:
    """``counts`` of a manifest: total plus one entry per step status."""
    counts = {"total": sum(by_status.values())}
    for st in STEP_STATUSES:
        counts[st] = int(by_status.get(st, 0))
    return counts


class _Tx:
    """``with journal._write() as conn``: one write transaction, errors as JournalError."""

    def __init__(self, journal: JournalBase) -> None:
        self.journal = journal
        self._cm: Any = None

    def __enter__(self) -> Conn:
        journal = self.journal
        conn = journal._c()
        journal._guarded.clear()
        self._cm = journal.backend.transaction(conn)
        try:
            c = self._cm.__enter__()
            for write in journal._deferred:
                write(c)
        except BaseException as exc:
            self._cm.__exit__(type(exc), exc, exc.__traceback__)
            if isinstance(exc, journal.backend.Error):
                raise journal.backend.fail(exc, "write") from None
            raise
        return c

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        backend = self.journal.backend
        try:
            self._cm.__exit__(et, ev, tb)
        except backend.Error as exc:
            raise backend.fail(exc, "write") from None
        if et is None:
            self.journal._deferred.clear()
        if isinstance(ev, backend.Error):
            raise backend.fail(ev, "write") from None
