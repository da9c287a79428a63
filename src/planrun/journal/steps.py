"""Steps and fan-out items: dispatch and outcome records, replay, resolve."""

from __future__ import annotations

from typing import Any

from ..errors import JournalError, RunError, UsageError
from .base import Conn, JournalBase, _reads, now
from .records import _loads, dumps, lease_record


class StepsMixin(JournalBase):
    """The journal's steps: a part of :class:`planrun.journal.Journal`."""

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
            cur = c.execute(
                f"UPDATE {table} SET status = 'running', attempts = ?, idempotency_key = ?, "
                "recoveries = recoveries + CASE WHEN status = 'running' THEN 1 ELSE 0 END, "
                f"started_at = COALESCE(started_at, ?), error_json = NULL WHERE {where} "
                "AND status IN ('pending', 'running', 'indeterminate')",
                (attempt, key, ts, *args))
            if cur.rowcount != 1:
                raise JournalError(f"step {step_id!r} of run {run_id} is not pending")
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

    def step_finished(self, run_id: str, step_id: str, *, status: str, key: str | None,
                      output: Any = None, error: dict[str, Any] | None = None,
                      expect: str | tuple[str, ...] = "running", event_data: Any = None,
                      item: int | None = None, defer: bool = False) -> str:
        """The outcome record: ``succeeded``, ``failed`` or ``indeterminate``.

        Written with its event in one transaction; ``output`` for a success, ``error``
        otherwise. Guarded by the expected current status (one, or a tuple of them); the
        key is kept (succeeded),
        released (failed) so that a later attempt really runs, or left claimed
        (indeterminate).

        With ``defer`` the record joins the next write's transaction instead of
        committing on its own (group commit: one durable commit can carry a finished
        step's outcome and its successor's dispatch record). The executor flushes before
        anything that could wait, so no other call starts while an outcome is uncommitted.
        """
        ts = now()
        out_json = dumps(output) if status == "succeeded" else None
        err_json = None if error is None else dumps(error)
        table, where, args = self._target(run_id, step_id, item)
        expected = (expect,) if isinstance(expect, str) else tuple(expect)
        kind = {"succeeded": "step_succeeded", "failed": "step_failed"}.get(
            status, f"step_{status}")
        data = dict(event_data or {})
        if error is not None:
            data["error"] = {k: v for k, v in error.items() if k != "traceback"}
            if "traceback" in error:
                data["traceback"] = error["traceback"]

        def write(c: Conn) -> None:
            self._guard(c, run_id)
            cur = c.execute(
                f"UPDATE {table} SET status = ?, output_json = ?, error_json = ?, "
                f"finished_at = ? WHERE {where} AND status IN "
                f"({', '.join('?' for _ in expected)})",
                (status, out_json, err_json, ts, *args, *expected))
            if cur.rowcount != 1:
                raise JournalError(f"step {step_id!r} of run {run_id} was not "
                                   f"{' or '.join(expected)}")
            if key is not None:
                if status == "succeeded":
                    c.execute("UPDATE idempotency_keys SET status = 'succeeded', "
                              "output_json = ?, finished_at = ? WHERE key = ?",
                              (out_json, ts, key))
                elif status == "failed":
                    c.execute("DELETE FROM idempotency_keys WHERE key = ?", (key,))
            self._event(c, run_id, kind, step_id=step_id, item=item, data=data or None,
                        ts=ts)

        self._apply(write, defer)
        return ts

    def step_skipped(self, run_id: str, step_id: str, reason: str,
                     message: str | None = None) -> None:
        """Mark a step that will not run ``skipped`` with its reason, with ``step_skipped``.

        The step is ``pending``, or was left ``running``/``indeterminate`` by a crash and is
        not being called again (the executor never skips a call it dispatched).

        Raises:
            JournalError: the step is in none of those states.
        """
        ts = now()
        with self._write() as c:
            self._guard(c, run_id)
            cur = c.execute(
                "UPDATE steps SET status = 'skipped', skip_reason = ?, finished_at = ?, "
                "error_json = ? WHERE run_id = ? AND step_id = ? "
                "AND status IN ('pending', 'running', 'indeterminate')",
                (reason, ts, dumps({"code": reason, "message": message}) if message else None,
                 run_id, step_id))
            if cur.rowcount != 1:
                raise JournalError(f"step {step_id!r} of run {run_id} cannot be skipped now")
            self._event(c, run_id, "step_skipped", step_id=step_id,
                        data={"reason": reason, "message": message}, ts=ts)

    def step_retried(self, run_id: str, step_id: str, attempt: int, error: dict[str, Any],
                     delay: float, item: int | None = None) -> None:
        """Journal a failed attempt that will be retried (``step_retried``).

        The step (or item) goes back to ``pending`` and its key is released: the failed
        call's outcome is known, and the next attempt writes its own dispatch record.
        """
        table, where, args = self._target(run_id, step_id, item)
        plain = {k: v for k, v in error.items() if k != "traceback"}
        with self._write() as c:
            self._guard(c, run_id)
            row = c.execute(f"SELECT idempotency_key FROM {table} WHERE {where}",
                            args).fetchone()
            cur = c.execute(f"UPDATE {table} SET status = 'pending', error_json = ? "
                            f"WHERE {where} AND status = 'running'", (dumps(plain), *args))
            if cur.rowcount != 1:
                raise JournalError(f"step {step_id!r} of run {run_id} was not running")
            if row and row[0]:
                c.execute("DELETE FROM idempotency_keys WHERE key = ?", (row[0],))
            self._event(c, run_id, "step_retried", step_id=step_id, item=item,
                        data={"attempt": attempt, "error": plain, "backoff_s": delay})

    def step_replayed(self, run_id: str, step_id: str, output: Any, key: str | None,
                      source: str, item: int | None = None) -> None:
        """A pending step (or item) whose key already succeeded: reuse the output."""
        ts = now()
        table, where, args = self._target(run_id, step_id, item)
        with self._write() as c:
            self._guard(c, run_id)
            cur = c.execute(
                f"UPDATE {table} SET status = 'succeeded', output_json = ?, replayed = 1, "
                "idempotency_key = ?, started_at = COALESCE(started_at, ?), finished_at = ? "
                f"WHERE {where} AND status = 'pending'", (dumps(output), key, ts, ts, *args))
            if cur.rowcount != 1:
                raise JournalError(f"step {step_id!r} of run {run_id} was not pending")
            self._event(c, run_id, "step_replayed", step_id=step_id, item=item,
                        data={"source": source}, ts=ts)

    def fanout_begin(self, run_id: str, step_id: str, count: int) -> list[str]:
        """Start a fan-out step: the step ``running``, its items journaled ``pending``.

        Items already journaled (a resumed run) are kept. Returns every item's status, in
        index order.
        """
        ts = now()
        with self._write() as c:
            self._guard(c, run_id)
            cur = c.execute("UPDATE steps SET status = 'running', started_at = COALESCE("
                            "started_at, ?), error_json = NULL WHERE run_id = ? AND "
                            "step_id = ? AND status IN ('pending', 'running', "
                            "'indeterminate')", (ts, run_id, step_id))
            if cur.rowcount != 1:
                raise JournalError(f"step {step_id!r} of run {run_id} cannot start now")
            c.executemany("INSERT INTO items (run_id, step_id, item_index, status) "
                          "VALUES (?, ?, ?, 'pending') "
                          "ON CONFLICT (run_id, step_id, item_index) DO NOTHING",
                          ((run_id, step_id, i) for i in range(count)))
            self._event(c, run_id, "step_started", step_id=step_id,
                        data={"items": count}, ts=ts)
        return [str(st) for (st,) in self._c().execute(
            "SELECT status FROM items WHERE run_id = ? AND step_id = ? ORDER BY item_index",
            (run_id, step_id))]

    def fanout_succeeded(self, run_id: str, step_id: str) -> None:
        """Every item succeeded: record the step's output.

        The output is the ordered list of item outputs, assembled inside SQLite (no Python
        list of them is built).
        """
        ts = now()
        with self._write() as c:
            self._guard(c, run_id)
            cur = c.execute(
                "UPDATE steps SET status = 'succeeded', finished_at = ?, output_json = ("
                f"SELECT {self.backend.json_array('output_json')} FROM (SELECT output_json FROM "
                "items WHERE run_id = ? AND step_id = ? ORDER BY item_index)) "
                "WHERE run_id = ? AND step_id = ? AND status = 'running'",
                (ts, run_id, step_id, run_id, step_id))
            if cur.rowcount != 1:
                raise JournalError(f"step {step_id!r} of run {run_id} was not running")
            self._event(c, run_id, "step_succeeded", step_id=step_id, ts=ts)

    def mark_indeterminate(self, run_id: str, targets: list[tuple[str, int | None]],
                           message: str) -> None:
        """Steps (or items) left ``running`` by a dead process become ``indeterminate``."""
        ts = now()
        error = dumps({"code": "indeterminate", "message": message})
        with self._write() as c:
            self._guard(c, run_id)
            for sid, item in targets:
                table, where, args = self._target(run_id, sid, item)
                c.execute(f"UPDATE {table} SET status = 'indeterminate', error_json = ?, "
                          f"finished_at = ? WHERE {where} AND status = 'running'",
                          (error, ts, *args))

    def resolve_step(self, run_id: str, step_id: str, *, succeeded: bool, output: Any,
                     reason: str | None, decided_by: str, item: int | None = None) -> None:
        """Settle an indeterminate step (or fan-out item) by a person's word.

        Journaled with an ``indeterminate_resolved`` event naming who decided.

        Raises:
            RunError: no such step/item, or it is not indeterminate.
        """
        ts = now()
        table, where, args = self._target(run_id, step_id, item)
        what = f"step {step_id!r}" + (f" item {item}" if item is not None else "")
        status = "succeeded" if succeeded else "failed"
        error = None if succeeded else {"code": "resolved_failed",
                                        "message": reason or f"resolved as failed by "
                                        f"{decided_by}"}
        with self._write() as c:
            self._guard(c, run_id)
            row = c.execute(f"SELECT status, idempotency_key FROM {table} WHERE {where}",
                            args).fetchone()
            if row is None:
                raise UsageError(f"run {run_id} has no {what}", code="unknown_step")
            if row[0] not in ("indeterminate", "running"):
                raise RunError(f"{what} of run {run_id} is {row[0]}, not indeterminate; "
                               "only indeterminate steps are resolved",
                               code="not_indeterminate")
            c.execute(f"UPDATE {table} SET status = ?, output_json = ?, error_json = ?, "
                      f"finished_at = ? WHERE {where}",
                      (status, dumps(output) if succeeded else None,
                       None if error is None else dumps(error), ts, *args))
            key = row[1]
            if key is not None:
                if succeeded:
                    c.execute("UPDATE idempotency_keys SET status = 'succeeded', "
                              "output_json = ?, finished_at = ? WHERE key = ?",
                              (dumps(output), ts, key))
                else:
                    c.execute("DELETE FROM idempotency_keys WHERE key = ?", (key,))
            self._event(c, run_id, "indeterminate_resolved", step_id=step_id, item=item, ts=ts,
                        data={"status": status, "decided_by": decided_by, "reason": reason})

    @_reads
    def succeeded_key(self, key: str) -> Any:
        """(True, output) when ``key`` is recorded as succeeded, else (False, None)."""
        row = self._c().execute(
            "SELECT output_json FROM idempotency_keys WHERE key = ? AND status = 'succeeded'",
            (key,)).fetchone()
        return (True, _loads(row[0])) if row else (False, None)
