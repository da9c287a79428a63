"""Dispatch records and idempotency keys: a part of :class:`planrun.journal.Journal`.

A step (or fan-out item) is recorded ``running`` with its claimed key before its call
starts (record-call-record, SPEC §7); a key another live run claims is refused.
"""

from __future__ import annotations

from typing import Any

from ..errors import RunError
from .base import Conn, JournalBase, _reads, now
from .records import _loads, lease_record


class DispatchMixin(JournalBase):
    """The journal's dispatch records and keys: a part of :class:`planrun.journal.Journal`."""

    def step_started(self, run_id: str, step_id: str, *, attempt: int, key: str,
                     root_run_id: str, item: int | None = None, defer: bool = False) -> str:
        """The dispatch record: step (or item) ``running`` with its key claimed.

        ``attempt`` is the step's count of dispatches including this one (SPEC §5
        "Attempts"). A record found ``running`` (left by a crash) counts one more recovery.

        Written with its ``step_started`` event in one transaction. With ``defer`` it joins
        the next commit (:meth:`flush`), so that calls starting at the same moment share
        one durable commit; the caller must flush before calling the tool.

        Returns the start time.

        Raises:
            JournalError: the step is not pending (or left running/indeterminate).
            LeaseLost: another process holds the run's lease.
        """
        ts = now()
        table, where, args = self._target(run_id, step_id, item)

        def write(c: Conn) -> None:
            self._guard(c, run_id)
            self._expect_one(
                c, f"UPDATE {table} SET status = 'running', attempts = ?, idempotency_key = ?, "
                "recoveries = recoveries + CASE WHEN status = 'running' THEN 1 ELSE 0 END, "
                f"started_at = COALESCE(started_at, ?), error_json = NULL WHERE {where} "
                "AND status IN ('pending', 'running', 'indeterminate')",
                (attempt, key, ts, *args), f"step {step_id!r} of run {run_id} is not pending")
            if not self.fresh_keys:
                self._refuse_live_claim(c, key, run_id)
            c.execute(
                "INSERT INTO idempotency_keys (key, root_run_id, run_id, step_id, item_index, "
                "status, claimed_at) VALUES (?, ?, ?, ?, ?, 'running', ?) "
                "ON CONFLICT (key) DO UPDATE SET run_id = excluded.run_id, "
                "status = 'running', claimed_at = excluded.claimed_at",
                (key, root_run_id, run_id, step_id, item, ts))
            self._event(c, run_id, "step_started", step_id=step_id, item=item,
                        data={"attempt": attempt, "key": key}, ts=ts)

        self._apply(write, defer)
        return ts

    @_reads
    def dispatch_state(self, run_id: str, step_id: str, item: int | None = None
                       ) -> tuple[str, int, int]:
        """(status, attempts, recoveries) of a step or item about to be dispatched.

        ``attempts`` counts its dispatches so far; ``recoveries`` those made by resume of a
        call a crash cut short (SPEC §5 "Attempts").
        """
        table, where, args = self._target(run_id, step_id, item)
        row = self._c().execute(f"SELECT status, attempts, recoveries FROM {table} "
                                f"WHERE {where}", args).fetchone()
        if row is None:
            return "pending", 0, 0
        return str(row[0]), int(row[1]), int(row[2])

    def withdraw_dispatch(self, run_id: str, step_id: str, key: str,
                          item: int | None = None) -> None:
        """Take back the dispatch record of a call cancelled before it started.

        Back to ``pending``, key released: nothing happened, so nothing is unknown, and
        the dispatch does not count as an attempt.
        """
        table, where, args = self._target(run_id, step_id, item)
        with self._write() as c:
            self._guard(c, run_id)
            cur = c.execute(f"UPDATE {table} SET status = 'pending', "
                            "attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END "
                            f"WHERE {where} "
                            "AND status = 'running'", args)
            if cur.rowcount == 1:  # a finished or indeterminate record keeps its key
                c.execute("DELETE FROM idempotency_keys WHERE key = ? AND "
                          "status = 'running'", (key,))

    def _refuse_live_claim(self, c: Conn, key: str, run_id: str) -> None:
        """Refuse a key another run has claimed and is still driving.

        Two retries of one run at once must not both call the same non-idempotent step.
        """
        row = c.execute(
            "SELECT k.run_id, r.lease_owner, r.lease_epoch, r.lease_expires, "
            f"r.lease_expires - {self.backend.NOW_SQL}, r.lease_boot, r.lease_start "
            "FROM idempotency_keys k JOIN runs r ON r.run_id = k.run_id "
            "WHERE k.key = ? AND k.status = 'running' AND k.run_id != ?",
            (key, run_id)).fetchone()
        if row is None or not row[1] or row[1] == self.owner:
            # No lease, or this process holds it: a retry holds its parent's lease for the
            # whole child run, so the parent's claim of a call left indeterminate is stale
            # (nobody else can be calling it) and the child takes the key over.
            return
        lease = lease_record(row[1:])
        if not lease.expired and lease.holder_alive() is not False:
            raise RunError(f"run {row[0]} ({lease.owner}) is calling the same step with the "
                           "same idempotency key right now", code="run_busy",
                           hint="Wait for that run to finish.")


    @_reads
    def succeeded_key(self, key: str) -> Any:
        """(True, output) when ``key`` is recorded as succeeded, else (False, None)."""
        row = self._c().execute(
            "SELECT output_json FROM idempotency_keys WHERE key = ? AND status = 'succeeded'",
            (key,)).fetchone()
        return (True, _loads(row[0])) if row else (False, None)
