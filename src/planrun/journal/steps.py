"""Steps and fan-out items: outcome records, skips, retries, replay, fan-out, resolve."""

from __future__ import annotations

from typing import Any

from ..errors import RunError, UsageError
from .base import Conn, JournalBase, now
from .records import dumps


class StepsMixin(JournalBase):
    """The journal's steps: a part of :class:`planrun.journal.Journal`."""

    def step_finished(self, run_id: str, step_id: str, *, status: str, key: str | None,
                      output: Any = None, error: dict[str, Any] | None = None,
                      expect: str | tuple[str, ...] = "running", event_data: Any = None,
                      item: int | None = None, defer: bool = False,
                      facets: dict[str, Any] | None = None,
                      output_json: str | None = None) -> str:
        """The outcome record: ``succeeded``, ``failed`` or ``indeterminate``.

        Written with its event in one transaction; ``output`` for a success, ``error``
        otherwise. Guarded by the expected current status (one, or a tuple of them); the
        key is kept (succeeded),
        released (failed) so that a later attempt really runs, or left claimed
        (indeterminate).

        ``output_json``: :func:`planrun.journal.records.dumps` of ``output`` when the caller
        has it already (the executor wrote it to check the output).

        ``facets`` (a step, not an item, that succeeded): its facets as
        :func:`planrun.facets.compute` gives them, stored with it.

        With ``defer`` the record joins the next write's transaction instead of
        committing on its own (group commit: one durable commit can carry a finished
        step's outcome and its successor's dispatch record). The executor flushes before
        anything that could wait, so no other call starts while an outcome is uncommitted.
        """
        ts = now()
        out_json = None if status != "succeeded" else \
            output_json if output_json is not None else dumps(output)
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

        extra, more = ("", ()) if item is not None or facets is None else (
            ", facets_json = ?", (dumps(facets),))
        message = f"step {step_id!r} of run {run_id} was not {' or '.join(expected)}"
        calls = self.backend.calls
        if calls is not None:  # the same record, written by one server-side call
            facets_json = more[0] if more else None
            data_json = dumps(data) if data else None

            def call(c: Conn) -> None:
                calls.finish(c, run_id, self._lease_check(run_id), step_id, item, status,
                             out_json, err_json, ts, facets_json, bool(more), expected,
                             message, key, kind, data_json)

            self._apply(call, defer)
            return ts

        def write(c: Conn) -> None:
            self._guard(c, run_id)
            self._expect_changed(
                c, f"UPDATE {table} SET status = ?, output_json = ?, error_json = ?, "
                f"finished_at = ?{extra} WHERE {where} AND status IN "
                f"({', '.join('?' for _ in expected)})",
                (status, out_json, err_json, ts, *more, *args, *expected), message)
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
                     message: str | None = None, *, defer: bool = False) -> None:
        """Mark a step that will not run ``skipped`` with its reason, with ``step_skipped``.

        The step is ``pending``, or was left ``running``/``indeterminate`` by a crash and is
        not being called again (the executor never skips a call it dispatched).

        With ``defer`` the record joins the next write's transaction (as
        :meth:`step_finished`'s): the executor skips the dependents of a failed step
        this way, so 5,000 of them take one commit, not 5,000. A skip lost with a crash
        before that commit is worked out again by ``resume`` from what it depended on.

        Raises:
            JournalError: the step is in none of those states (with ``defer``: when the
                transaction that carries it commits).
        """
        ts = now()

        def write(c: Conn) -> None:
            self._guard(c, run_id)
            self._expect_changed(
                c, "UPDATE steps SET status = 'skipped', skip_reason = ?, finished_at = ?, "
                "error_json = ? WHERE run_id = ? AND step_id = ? "
                "AND status IN ('pending', 'running', 'indeterminate')",
                (reason, ts, dumps({"code": reason, "message": message}) if message else None,
                 run_id, step_id), f"step {step_id!r} of run {run_id} cannot be skipped now")
            self._event(c, run_id, "step_skipped", step_id=step_id,
                        data={"reason": reason, "message": message}, ts=ts)

        self._apply(write, defer)

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
            self._expect_changed(
                c, f"UPDATE {table} SET status = 'pending', error_json = ? WHERE {where} "
                "AND status = 'running'", (dumps(plain), *args),
                f"step {step_id!r} of run {run_id} was not running")
            if row and row[0]:
                c.execute("DELETE FROM idempotency_keys WHERE key = ?", (row[0],))
            self._event(c, run_id, "step_retried", step_id=step_id, item=item,
                        data={"attempt": attempt, "error": plain, "backoff_s": delay})

    def step_replayed(self, run_id: str, step_id: str, output: Any, key: str | None,
                      source: str, item: int | None = None,
                      facets: dict[str, Any] | None = None) -> None:
        """A pending step (or item) whose key already succeeded: reuse the output.

        ``facets``: a step's facets (as :meth:`step_finished`), computed from the output.
        """
        ts = now()
        table, where, args = self._target(run_id, step_id, item)
        extra, more = ("", ()) if item is not None or facets is None else (
            ", facets_json = ?", (dumps(facets),))
        with self._write() as c:
            self._guard(c, run_id)
            self._expect_changed(
                c, f"UPDATE {table} SET status = 'succeeded', output_json = ?, replayed = 1, "
                f"idempotency_key = ?, started_at = COALESCE(started_at, ?), finished_at = ?"
                f"{extra} WHERE {where} AND status = 'pending'",
                (dumps(output), key, ts, ts, *more, *args),
                f"step {step_id!r} of run {run_id} was not pending")
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
            self._expect_changed(
                c, "UPDATE steps SET status = 'running', started_at = COALESCE(started_at, ?), "
                "error_json = NULL WHERE run_id = ? AND step_id = ? AND status IN ('pending', "
                "'running', 'indeterminate')", (ts, run_id, step_id),
                f"step {step_id!r} of run {run_id} cannot start now")
            c.executemany("INSERT INTO items (run_id, step_id, item_index, status) "
                          "VALUES (?, ?, ?, 'pending') "
                          "ON CONFLICT (run_id, step_id, item_index) DO NOTHING",
                          ((run_id, step_id, i) for i in range(count)))
            self._event(c, run_id, "step_started", step_id=step_id,
                        data={"items": count}, ts=ts)
        return [str(st) for (st,) in self._c().execute(
            "SELECT status FROM items WHERE run_id = ? AND step_id = ? ORDER BY item_index",
            (run_id, step_id))]

    def fanout_succeeded(self, run_id: str, step_id: str,
                         facets: dict[str, Any] | None = None) -> None:
        """Every item succeeded: record the step's output (:meth:`fanout_finished`)."""
        self.fanout_finished(run_id, step_id, facets=facets)

    def fanout_finished(self, run_id: str, step_id: str, *, status: str = "succeeded",
                        keep: str = "all", error: dict[str, Any] | None = None,
                        collected: list[tuple[int, Any]] | None = None,
                        facets: dict[str, Any] | None = None) -> None:
        """A fan-out step finished with an output: ``succeeded`` or ``partial``.

        The output is the ordered list of item outputs, assembled inside the database (no
        Python list of them is built): every item's (``keep="all"``) or only those of the
        items that succeeded (``keep="succeeded"``, ``on_item_error: skip``). With
        ``collected`` (``on_item_error: collect``), each (index, error object) is first
        written as the output of that failed item (its status stays ``failed``), so the
        list holds it in the item's place. ``error``: a partial step's summary of its
        failed items; ``facets``: as :meth:`step_finished`. One transaction, with a
        ``step_succeeded`` event (data ``{"status": "partial", "error": …}`` for a
        partial step).
        """
        ts = now()
        only = " AND status = 'succeeded'" if keep == "succeeded" else ""
        data = None if status == "succeeded" else {"status": status, "error": error}
        with self._write() as c:
            self._guard(c, run_id)
            if collected:
                c.executemany("UPDATE items SET output_json = ? WHERE run_id = ? AND "
                              "step_id = ? AND item_index = ? AND status = 'failed'",
                              [(dumps(obj), run_id, step_id, i) for i, obj in collected])
            self._expect_changed(
                c, "UPDATE steps SET status = ?, finished_at = ?, error_json = ?, "
                "facets_json = ?, output_json = ("
                f"SELECT {self.backend.json_array('output_json')} FROM (SELECT output_json FROM "
                f"items WHERE run_id = ? AND step_id = ?{only} ORDER BY item_index) AS ordered) "
                "WHERE run_id = ? AND step_id = ? AND status = 'running'",
                (status, ts, None if error is None else dumps(error),
                 None if facets is None else dumps(facets), run_id, step_id, run_id, step_id),
                f"step {step_id!r} of run {run_id} was not running")
            self._event(c, run_id, "step_succeeded", step_id=step_id, data=data, ts=ts)

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
                     reason: str | None, decided_by: str, item: int | None = None,
                     facets: dict[str, Any] | None = None,
                     skips: dict[str, str] | None = None) -> None:
        """Settle an indeterminate step (or fan-out item) by a person's word.

        Journaled with an ``indeterminate_resolved`` event naming who decided. ``facets``:
        a step's facets computed from the output it is resolved with. ``skips``: skipped
        steps whose reason named the step as indeterminate → their reason now (written in
        the same transaction; listed in the event's ``skips``).

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
            extra, more = ("", ()) if item is not None or facets is None else (
                ", facets_json = ?", (dumps(facets),))
            # a call that ended (cancelled, cut short) keeps its end: the person's word
            # settles its outcome, not its time; one a crash left running ends now
            c.execute(f"UPDATE {table} SET status = ?, output_json = ?, error_json = ?, "
                      f"finished_at = COALESCE(finished_at, ?){extra} WHERE {where}",
                      (status, dumps(output) if succeeded else None,
                       None if error is None else dumps(error), ts, *more, *args))
            key = row[1]
            if key is not None:
                if succeeded:
                    c.execute("UPDATE idempotency_keys SET status = 'succeeded', "
                              "output_json = ?, finished_at = ? WHERE key = ?",
                              (dumps(output), ts, key))
                else:
                    c.execute("DELETE FROM idempotency_keys WHERE key = ?", (key,))
            for skipped, message in (skips or {}).items():
                c.execute("UPDATE steps SET error_json = ? WHERE run_id = ? AND step_id = ? "
                          "AND status = 'skipped' AND skip_reason = 'dependency'",
                          (dumps({"code": "dependency", "message": message}), run_id, skipped))
            data: dict[str, Any] = {"status": status, "decided_by": decided_by,
                                    "reason": reason}
            if skips:
                data["skips"] = skips
            self._event(c, run_id, "indeterminate_resolved", step_id=step_id, item=item, ts=ts,
                        data=data)

