"""Reads: runs, steps, items, approvals, events as typed records."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..errors import RunError
from .base import MIN_PREFIX, JournalBase, _reads, count_summary
from .records import (
    ApprovalRecord,
    EventRecord,
    ItemRecord,
    KeyRecord,
    RunRecord,
    StepRecord,
    _loads,
    approval_record,
    event_record,
    item_record,
    key_record,
    named,
    run_record,
    step_records,
)

#: Events read at a time by :meth:`ReadsMixin.iter_events`.
EVENTS_PAGE = 1000


class ReadsMixin(JournalBase):
    """The journal's reads: a part of :class:`planrun.journal.Journal`."""

    def resolve_run_id(self, ref: str) -> str:
        """The full run id for a run id or a unique prefix (at least 4 characters).

        The prefix is compared without regard to the case of its letters, on every
        backend alike (SQLite's ``LIKE`` ignores ASCII case, PostgreSQL's does not: one
        prefix found a run on one and none on the other); ``%`` and ``_`` in it are
        themselves. Run ids are lowercase hex, so no two differ only in case.

        Raises:
            RunError: ``unknown_run`` (none, or an ambiguous prefix).
        """
        if self.conn is None:
            raise RunError(f"no run {ref!r} (the journal {self.shown} is empty)",
                           code="unknown_run", hint="List runs with `planrun runs`.")
        if ref == "last":
            latest = self.latest_run(self.project)
            if latest is None:
                raise RunError(f"no run yet in {self.shown}"
                               + (f" for the project {self.project}" if self.project else ""),
                               code="unknown_run", hint="List every project's runs with "
                               "`planrun runs --all`.")
            return latest
        if len(ref) < MIN_PREFIX:
            raise RunError(f"run id {ref!r} is too short; give at least {MIN_PREFIX} "
                           "characters", code="unknown_run")
        try:
            rows = self.conn.execute(
                "SELECT run_id FROM runs WHERE lower(substr(run_id, 1, ?)) = lower(?) "
                "LIMIT 3", (len(ref), ref)).fetchall()
        except self.backend.DatabaseError as exc:
            raise self.backend.fail(exc, "read") from None
        exact = [r[0] for r in rows if r[0] == ref or r[0] == ref.lower()]
        if exact:
            return str(exact[0])
        if not rows:
            raise RunError(f"no run {ref!r} in {self.shown}", code="unknown_run",
                           hint="List runs with `planrun runs`.")
        if len(rows) > 1:
            raise RunError(f"run id prefix {ref!r} is ambiguous ({', '.join(r[0] for r in rows)}"
                           "…); give more characters", code="unknown_run")
        return str(rows[0][0])

    @_reads
    def run(self, run_id: str) -> RunRecord:
        """The run as a record (its lease as the database clock sees it now).

        Raises:
            RunError: ``unknown_run`` (exit 5).
        """
        cur = self._c().execute(
            f"SELECT *, lease_expires - {self.backend.NOW_SQL} AS lease_remaining "
            "FROM runs WHERE run_id = ?", (run_id,))
        row = cur.fetchone()
        if row is None:
            raise RunError(f"no run {run_id!r}", code="unknown_run")
        return run_record(named([d[0] for d in cur.description], row))

    @_reads
    def steps(self, run_id: str) -> list[StepRecord]:
        """The run's steps as records, in plan order."""
        cur = self._c().execute("SELECT * FROM steps WHERE run_id = ? ORDER BY position",
                                (run_id,))
        return step_records([d[0] for d in cur.description], cur.fetchall())

    @_reads
    def items(self, run_id: str, step_id: str) -> list[ItemRecord]:
        """The fan-out items of a step as records, in index order."""
        cur = self._c().execute("SELECT * FROM items WHERE run_id = ? AND step_id = ? "
                                "ORDER BY item_index", (run_id, step_id))
        names = [d[0] for d in cur.description]
        return [item_record(named(names, r)) for r in cur.fetchall()]

    @_reads
    def approval_records(self, run_id: str) -> list[ApprovalRecord]:
        """The run's approval decisions as records, in order."""
        cur = self._c().execute("SELECT * FROM approvals WHERE run_id = ? ORDER BY id",
                                (run_id,))
        names = [d[0] for d in cur.description]
        return [approval_record(named(names, r)) for r in cur.fetchall()]

    @_reads
    def event_records(self, run_id: str, after: int = 0) -> list[EventRecord]:
        """The run's events after event id ``after``, as records in order.

        All in memory: :meth:`iter_events` for a run that may have many.
        """
        return list(self.iter_events(run_id, after))

    def iter_events(self, run_id: str, after: int = 0, kinds: tuple[str, ...] = (),
                    page: int = EVENTS_PAGE) -> Iterator[EventRecord]:
        """The run's events after event id ``after`` (only ``kinds``, if given), in order.

        Read ``page`` events at a time (keyset pagination on the event id), so that
        memory does not grow with the number of events (a 100,000-item fan-out has
        200,000 and more; ``planrun log --json`` held them all, 680 MB). Events written
        while it reads come at the end.

        Raises:
            JournalError: the journal cannot be read (exit 6).
        """
        where = f" AND kind IN ({', '.join('?' for _ in kinds)})" if kinds else ""
        while True:
            try:
                rows = self._c().execute(
                    "SELECT id, ts, kind, step_id, item_index, data_json FROM events "
                    f"WHERE run_id = ? AND id > ?{where} ORDER BY id LIMIT ?",
                    (run_id, after, *kinds, page)).fetchall()
            except self.backend.DatabaseError as exc:
                raise self.backend.fail(exc, "read") from None
            for row in rows:
                record = event_record(row)
                after = record.id
                yield record
            if len(rows) < page:
                return

    @_reads
    def child_run_ids(self, run_id: str) -> list[str]:
        """Ids of the runs whose parent is ``run_id`` (its retries), oldest first."""
        return [str(r[0]) for r in self._c().execute(
            "SELECT run_id FROM runs WHERE parent_run_id = ? ORDER BY created_at, seq",
            (run_id,))]

    @_reads
    def key(self, key: str) -> KeyRecord | None:
        """The idempotency key ``key`` as journaled, or None."""
        if self.conn is None:
            return None
        row = self.conn.execute(
            "SELECT key, root_run_id, run_id, step_id, item_index, status, output_json, "
            "claimed_at, finished_at FROM idempotency_keys WHERE key = ?", (key,)).fetchone()
        return None if row is None else key_record(row)

    @_reads
    def run_ids(self) -> list[str]:
        """Every run's id, newest first."""
        if self.conn is None:
            return []
        return [str(r[0]) for r in self.conn.execute(
            "SELECT run_id FROM runs ORDER BY created_at DESC, seq DESC")]

    # The raw rows (column name -> value), kept for tools and tests that read columns.

    @_reads
    def run_row(self, run_id: str) -> dict[str, Any]:
        """The ``runs`` row as a dict."""
        cur = self._c().execute("SELECT * FROM runs WHERE run_id = ?", (run_id,))
        row = cur.fetchone()
        if row is None:
            raise RunError(f"no run {run_id!r}", code="unknown_run")
        return dict(zip([d[0] for d in cur.description], row, strict=True))

    @_reads
    def step_rows(self, run_id: str) -> list[dict[str, Any]]:
        """The run's ``steps`` rows, in plan order."""
        cur = self._c().execute("SELECT * FROM steps WHERE run_id = ? ORDER BY position",
                                (run_id,))
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

    @_reads
    def item_rows(self, run_id: str, step_id: str) -> list[dict[str, Any]]:
        """The fan-out items of a step, in order."""
        cur = self._c().execute("SELECT * FROM items WHERE run_id = ? AND step_id = ? "
                                "ORDER BY item_index", (run_id, step_id))
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

    @_reads
    def item_counts(self, run_id: str) -> dict[str, dict[str, int]]:
        """Per fan-out step: ``{"total", "succeeded", "failed"}`` of its items."""
        out: dict[str, dict[str, int]] = {}
        for sid, st, n in self._c().execute(
                "SELECT step_id, status, COUNT(*) FROM items WHERE run_id = ? "
                "GROUP BY step_id, status", (run_id,)):
            d = out.setdefault(sid, {"total": 0, "succeeded": 0, "failed": 0})
            d["total"] += n
            if st in d:
                d[st] += n
        return out

    def list_runs(self, *, plan: str | None = None, status: str | None = None,
                  limit: int | None = None, project: str | None = None
                  ) -> list[dict[str, Any]]:
        """Runs newest first, optionally filtered, each with its step counts.

        ``project``: only runs of that project folder (and runs journaled before projects
        were, whose ``project`` is null). Each summary has ``project`` (or None). One
        query (the runs and their step counts together).
        """
        if self.conn is None:
            return []
        where: list[str] = []
        args: list[Any] = []
        if plan:
            where.append("plan_name = ?")
            args.append(plan)
        if status:
            where.append("status = ?")
            args.append(status)
        if project:
            where.append("(project = ? OR project IS NULL)")
            args.append(project)
        picked = ("SELECT run_id, plan_name, revision, status, created_at, finished_at, "
                  "project, seq, parent_run_id FROM runs"
                  + (" WHERE " + " AND ".join(where) if where else "")
                  + " ORDER BY created_at DESC, seq DESC")
        if limit is not None:
            picked += " LIMIT ?"
            args.append(limit)
        sql = (f"SELECT r.run_id, r.plan_name, r.revision, r.status, r.created_at, "
               "r.finished_at, r.project, r.parent_run_id, s.status, COUNT(s.step_id) "
               f"FROM ({picked}) r LEFT JOIN steps s ON s.run_id = r.run_id "
               "GROUP BY r.run_id, r.plan_name, r.revision, r.status, r.created_at, "
               "r.finished_at, r.project, r.seq, r.parent_run_id, s.status "
               "ORDER BY r.created_at DESC, r.seq DESC")
        try:
            rows = self.conn.execute(sql, args).fetchall()
        except self.backend.DatabaseError as exc:
            raise self.backend.fail(exc, "read") from None
        out: list[dict[str, Any]] = []
        by_run: dict[str, dict[str, int]] = {}
        for run_id, name, revision, st, created, finished, proj, parent, step_st, n in rows:
            if run_id not in by_run:
                by_run[run_id] = {}
                out.append({"run_id": run_id, "plan": name, "revision": revision,
                            "status": st, "started_at": created, "finished_at": finished,
                            "counts": {}, "project": proj, "parent_run_id": parent,
                            "retried_as": None})
            if step_st is not None:
                by_run[run_id][step_st] = int(n)
        for summary in out:
            summary["counts"] = count_summary(by_run[summary["run_id"]])
        try:
            self._retried_as(out)
        except self.backend.DatabaseError as exc:
            raise self.backend.fail(exc, "read") from None
        return out

    def _retried_as(self, summaries: list[dict[str, Any]]) -> None:
        """Set each summary's ``retried_as``: its newest child run (a retry or repair)."""
        ids = [s["run_id"] for s in summaries]
        newest: dict[str, str] = {}
        for at in range(0, len(ids), 500):  # well under SQLite's bound parameters
            chunk = ids[at:at + 500]
            rows = self._c().execute(
                "SELECT parent_run_id, run_id FROM runs WHERE parent_run_id IN ("
                + ", ".join("?" for _ in chunk) + ") ORDER BY created_at, seq", chunk)
            for parent, child in rows:
                newest[str(parent)] = str(child)
        for s in summaries:
            s["retried_as"] = newest.get(s["run_id"])

    @_reads
    def events(self, run_id: str) -> list[dict[str, Any]]:
        """The run's events in order."""
        return [e.to_json() for e in self.event_records(run_id)]

    @_reads
    def step_output(self, run_id: str, step_id: str, item: int | None = None) -> Any:
        """(status, output) of a step (or one fan-out item)."""
        if item is None:
            row = self._c().execute(
                "SELECT status, output_json FROM steps WHERE run_id = ? AND step_id = ?",
                (run_id, step_id)).fetchone()
        else:
            row = self._c().execute(
                "SELECT status, output_json FROM items WHERE run_id = ? AND step_id = ? "
                "AND item_index = ?", (run_id, step_id, item)).fetchone()
        if row is None:
            return None
        return row[0], _loads(row[1])

    @_reads
    def step_facets(self, run_id: str, step_id: str) -> dict[str, Any] | None:
        """The stored facets of a step (``{"values", "cut"}``), or None (none stored)."""
        row = self._c().execute("SELECT facets_json FROM steps WHERE run_id = ? AND "
                                "step_id = ?", (run_id, step_id)).fetchone()
        found = None if row is None else _loads(row[0])
        return found if isinstance(found, dict) else None

    def item_outputs(self, run_id: str, step_id: str, page: int = 500) -> Iterator[Any]:
        """The outputs of a fan-out step's items that succeeded, in index order.

        Read ``page`` items at a time (keyset pagination), so that memory does not grow
        with the number of items, on either backend.
        """
        after = -1
        while True:
            try:
                rows = self._c().execute(
                    "SELECT item_index, output_json FROM items WHERE run_id = ? AND "
                    "step_id = ? AND status = 'succeeded' AND item_index > ? "
                    "ORDER BY item_index LIMIT ?", (run_id, step_id, after, page)).fetchall()
            except self.backend.DatabaseError as exc:
                raise self.backend.fail(exc, "read") from None
            for index, out in rows:
                yield _loads(out)
                after = int(index)
            if len(rows) < page:
                return

    @_reads
    def item_output_bytes(self, run_id: str, step_id: str) -> tuple[int, int]:
        """(bytes, count) of the outputs of a fan-out step's items that succeeded.

        ``bytes``: their stored JSON texts' lengths in bytes (UTF-8, compact) summed, 4
        (``null``) for an item without one; what the step's output assembled from them
        (:meth:`fanout_finished`) would hold but its brackets and commas. Counted in the
        database, nothing loaded.
        """
        size = self.backend.text_bytes("output_json")
        row = self._c().execute(
            f"SELECT COALESCE(SUM(COALESCE({size}, 4)), 0), COUNT(*) FROM items "
            "WHERE run_id = ? AND step_id = ? AND status = 'succeeded'",
            (run_id, step_id)).fetchone()
        return int(row[0]), int(row[1])

    @_reads
    def item_errors(self, run_id: str, step_id: str | None = None,
                    limit: int = 10) -> dict[str, list[dict[str, Any]]]:
        """Per fan-out step (or only ``step_id``): its first ``limit`` failed items.

        Each ``{"index", "code", "message"}``, in index order; steps with no failed item
        are left out.
        """
        sql = ("SELECT step_id, item_index, error_json FROM (SELECT step_id, item_index, "
               "error_json, ROW_NUMBER() OVER (PARTITION BY step_id ORDER BY item_index) "
               "AS n FROM items WHERE run_id = ? AND status = 'failed'"
               + (" AND step_id = ?" if step_id is not None else "")
               + ") AS failed WHERE n <= ? ORDER BY step_id, item_index")
        args: tuple[Any, ...] = (run_id, *(() if step_id is None else (step_id,)), limit)
        out: dict[str, list[dict[str, Any]]] = {}
        for sid, index, err in self._c().execute(sql, args).fetchall():
            error = _loads(err) or {}
            out.setdefault(str(sid), []).append(
                {"index": int(index), "code": error.get("code"),
                 "message": error.get("message")})
        return out

    @_reads
    def approvals(self, run_id: str) -> list[dict[str, Any]]:
        """The run's approval decisions in order."""
        cur = self._c().execute("SELECT * FROM approvals WHERE run_id = ? ORDER BY id",
                                (run_id,))
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

    @_reads
    def idle_gaps(self, run_id: str) -> list[tuple[str, str]]:
        """When nobody drove the run: (last event before a resume, the resume) pairs.

        A run that died (or was interrupted) and was resumed later was idle from its last
        journaled event to the ``run_resumed`` event; manifests leave those gaps out of
        durations (issue 10, bug 12). Decisions journaled while it waited (``planrun
        approve`` on a run ``awaiting_approval``, or at resume's prompt; ``planrun
        resolve`` of a call whose effect was unknown) and a resume refused at validation
        (``plan_refused``) do not end the idle time: nothing ran.
        """
        c = self._c()
        out: list[tuple[str, str]] = []
        for eid, ts in c.execute("SELECT id, ts FROM events WHERE run_id = ? AND "
                                 "kind = 'run_resumed' ORDER BY id", (run_id,)).fetchall():
            before = c.execute("SELECT ts FROM events WHERE run_id = ? AND id < ? AND kind "
                               "NOT IN ('approval_required', 'approval_granted', "
                               "'approval_denied', 'autonomy_escalated', 'plan_refused', "
                               "'indeterminate_resolved') "
                               "ORDER BY id DESC LIMIT 1", (run_id, eid)).fetchone()
            if before is not None and before[0] < ts:
                out.append((str(before[0]), str(ts)))
        return out

    @_reads
    def latest_run(self, project: str | None = None) -> str | None:
        """The most recent run (of ``project`` and of no recorded project), if any."""
        sql = "SELECT run_id FROM runs"
        args: list[Any] = []
        if project:
            sql += " WHERE (project = ? OR project IS NULL)"
            args.append(project)
        row = self._c().execute(sql + " ORDER BY created_at DESC, seq DESC LIMIT 1",
                                args).fetchone()
        return None if row is None else str(row[0])

    @_reads
    def latest_resumable(self, project: str | None = None) -> str | None:
        """The most recent run that is ``interrupted`` or ``running``, if any.

        With ``project``: of that project (or journaled before runs had one), as ``planrun
        runs`` lists them: one journal may hold the runs of several projects.
        """
        if self.conn is None:
            return None
        where, args = ("", ()) if project is None else (
            " AND (project = ? OR project IS NULL)", (project,))
        row = self.conn.execute(
            f"SELECT run_id FROM runs WHERE status IN ('interrupted', 'running'){where} "
            "ORDER BY created_at DESC, seq DESC LIMIT 1", args).fetchone()
        return None if row is None else str(row[0])

    @_reads
    def select_runs(self, *, before: str, status: str | None = None, plan: str | None = None,
                    project: str | None = None) -> list[tuple[str, str, str, str]]:
        """(run id, status, plan name, created at) of runs created before ``before``.

        Optionally filtered; oldest first.
        """
        sql = "SELECT run_id, status, plan_name, created_at FROM runs WHERE created_at < ?"
        args: list[Any] = [before]
        for column, value in (("status", status), ("plan_name", plan)):
            if value:
                sql += f" AND {column} = ?"
                args.append(value)
        if project:
            sql += " AND (project = ? OR project IS NULL)"
            args.append(project)
        return [(str(r[0]), str(r[1]), str(r[2]), str(r[3]))
                for r in self._c().execute(sql + " ORDER BY created_at", args)]
