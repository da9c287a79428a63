"""Runs: create, refuse, finish, approvals, events, resume, retry copies, deletion."""

from __future__ import annotations

from typing import Any

from ..errors import RunError
from .base import Conn, lease_ttl, now
from .calls import CallsMixin
from .records import NewRun, dumps, holder_identity, lease_record, new_run_columns


class RunsMixin(CallsMixin):
    """The journal's runs: a part of :class:`planrun.journal.Journal`."""

    def _insert_run(self, c: Conn, run: NewRun | dict[str, Any]) -> tuple[str, str]:
        """INSERT the run (next ``seq``; a lease until the database clock says); (id, ts)."""
        if isinstance(run, NewRun):
            cols = new_run_columns(run)
            owner = run.lease_owner
        else:  # columns as they are (tests and tools that journal a run by hand)
            cols = dict(run)
            owner = None
        extra = ["(SELECT COALESCE(MAX(seq), 0) + 1 FROM runs)"]
        if owner:
            boot, start = holder_identity(owner)
            cols.update(lease_owner=owner, lease_epoch=1, lease_boot=boot, lease_start=start)
            extra.append(f"{self.backend.NOW_SQL} + ?")
        names = list(cols)
        values = [cols[k] for k in names]
        names.append("seq")
        if owner:
            names.append("lease_expires")
            values.append(lease_ttl())
        c.execute(f"INSERT INTO runs ({', '.join(names)}) VALUES "
                  f"({', '.join(['?'] * len(cols) + extra)})", values)
        return str(cols["run_id"]), str(cols["created_at"])

    def create_run(self, *, run: NewRun | dict[str, Any], steps: list[tuple[str, int, str]],
                   event_data: Any = None) -> None:
        """Journal a new run and its steps as ``pending``, with its ``planned`` event.

        ``run`` is a :class:`NewRun` (with ``lease_owner``, that process takes the run's
        lease at epoch 1 in the same transaction), or the columns of ``runs`` as a dict;
        ``steps`` is (step id, position, tool) per step.
        """
        with self._write() as c:
            run_id, ts = self._insert_run(c, run)
            c.executemany(
                "INSERT INTO steps (run_id, step_id, position, tool, status) "
                "VALUES (?, ?, ?, ?, 'pending')",
                [(run_id, sid, pos, tool) for sid, pos, tool in steps])
            self._event(c, run_id, "planned", data=event_data, ts=ts)
        if isinstance(run, NewRun) and run.lease_owner:
            self.owner = run.lease_owner
            self._epochs[run_id] = 1

    def refuse_run(self, *, run: NewRun | dict[str, Any], report: Any) -> None:
        """Journal a run refused by validation (status ``refused``, ``plan_refused``)."""
        with self._write() as c:
            run_id, ts = self._insert_run(c, run)
            self._event(c, run_id, "plan_refused", data=report, ts=ts)

    def finish_run(self, run_id: str, status: str, data: Any = None) -> None:
        """Set the run's final status and release its lease.

        With its ``run_finished`` event (``run_interrupted`` for an interrupted run, which
        stays resumable). ``awaiting_approval`` (SPEC §10) is not finished either: no
        ``finished_at``; its event is ``run_finished`` with that status (this process is
        done with it until a person decides).
        """
        ts = now()
        done = status not in ("running", "interrupted", "awaiting_approval")
        with self._write() as c:
            self._guard(c, run_id)
            c.execute("UPDATE runs SET status = ?, finished_at = ?, lease_owner = NULL, "
                      "lease_expires = NULL WHERE run_id = ?",
                      (status, ts if done else None, run_id))
            kind = "run_interrupted" if status == "interrupted" else "run_finished"
            self._event(c, run_id, kind, data={"status": status, **(data or {})}, ts=ts)

    def record_approval(self, *, run_id: str, step_id: str, tool: str, digest: str,
                        granted: bool, decided_by: str, method: str, reason: str | None,
                        item: int | None = None, defer: bool = False) -> None:
        """Journal one approval decision with its ``approval_granted|denied`` event.

        ``defer``: written in the next write transaction (with what it writes, at once),
        not in one of its own.
        """
        ts = now()

        def write(c: Any) -> None:
            c.execute(
                "INSERT INTO approvals (run_id, step_id, item_index, tool, digest, granted, "
                "decided_by, method, decided_at, reason) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (run_id, step_id, item, tool, digest, int(granted), decided_by, method, ts,
                 reason))
            if granted:
                c.execute("UPDATE steps SET approved_by = ? WHERE run_id = ? AND step_id = ?",
                          (decided_by, run_id, step_id))
            self._event(c, run_id, "approval_granted" if granted else "approval_denied",
                        step_id=step_id, item=item,
                        data={"tool": tool, "digest": digest, "decided_by": decided_by,
                              "method": method, "reason": reason}, ts=ts)

        self._apply(write, defer)

    def add_event(self, run_id: str, kind: str, step_id: str | None = None,
                  data: Any = None, *, defer: bool = False) -> None:
        """Journal one event on its own (``defer``: in the next write transaction)."""
        self._apply(lambda c: self._event(c, run_id, kind, step_id=step_id, data=data),
                    defer)

    def begin_resume(self, run_id: str, replayed: list[str], data: Any) -> None:
        """Mark the run ``running`` again, its succeeded steps replayed, ``run_resumed``."""
        ts = now()
        with self._write() as c:
            self._guard(c, run_id)
            c.execute("UPDATE runs SET status = 'running', finished_at = NULL "
                      "WHERE run_id = ?", (run_id,))
            self._event(c, run_id, "run_resumed", data=data, ts=ts)
            c.executemany("UPDATE steps SET replayed = 1 WHERE run_id = ? AND step_id = ?",
                          ((run_id, sid) for sid in replayed))
            source = dumps({"source": "journal"})
            c.executemany(
                "INSERT INTO events (run_id, ts, kind, step_id, item_index, data_json) "
                "VALUES (?, ?, 'step_replayed', ?, NULL, ?)",
                ((run_id, ts, sid, source) for sid in replayed))

    def copy_succeeded(self, parent: str, child: str, step_ids: list[str]) -> None:
        """A retry's inherited steps: succeeded in ``parent``, replayed in ``child``."""
        ts = now()
        with self._write() as c:
            for sid in step_ids:
                c.execute(
                    "UPDATE steps SET status = 'succeeded', replayed = 1, "
                    "(output_json, facets_json, idempotency_key, attempts, started_at, "
                    "finished_at, approved_by) = (SELECT output_json, facets_json, "
                    "idempotency_key, attempts, started_at, finished_at, approved_by "
                    "FROM steps p "
                    "WHERE p.run_id = ? AND p.step_id = ?) "
                    "WHERE run_id = ? AND step_id = ?", (parent, sid, child, sid))
                self._event(c, child, "step_replayed", step_id=sid,
                            data={"source": parent}, ts=ts)

    def release_keys(self, root_run_id: str, step_ids: list[str]) -> int:
        """Forget the idempotency keys of these steps in a lineage (``retry --from``).

        Their next call really runs instead of replaying. Returns how many keys went.
        """
        if not step_ids:
            return 0
        marks = ", ".join("?" for _ in step_ids)
        with self._write() as c:
            return int(c.execute(f"DELETE FROM idempotency_keys WHERE root_run_id = ? AND "
                                 f"step_id IN ({marks})", [root_run_id, *step_ids]).rowcount)

    def delete_runs(self, run_ids: list[str], *, rewrite: bool = False) -> dict[str, int]:
        """Delete runs and everything of theirs, then give the space back to the disk.

        Steps, fan-out items, approvals, events and the idempotency keys the runs wrote
        go with them: a later run can no longer replay those calls. Runs whose lease a
        live holder has (``holder_alive`` true and not expired), or with a call that
        outlives its planrun, are refused before anything is deleted.

        Each run goes in a write transaction of its own, so that the other processes on
        the journal wait at most for one run's rows, not for all of them (a prune of nine
        runs of 190 MB each held the journal's write lock for 15 s in one transaction; a
        nightly run's next step waited for it, and past ``busy_timeout``, 30 s, would have
        failed): a run is deleted whole or not at all. The space is then given back by
        the backend (:meth:`~planrun.journal.backends.Backend.vacuum`; ``rewrite``: by
        rewriting the whole file, ``prune --vacuum``).

        Returns:
            ``{"runs", "events", "keys"}``: how many rows of each went; ``reclaimed_bytes``
            (the journal file is that much smaller) and ``free_bytes`` (free inside the
            file, reused by later writes, not given back).

        Raises:
            RunError: ``run_busy`` when one of the runs is driven by a live process (when
            found only after earlier runs were deleted, the message says how many).
        """
        counts = {"runs": 0, "events": 0, "keys": 0}
        if not run_ids and not rewrite:
            return {**counts, "reclaimed_bytes": 0, "free_bytes": 0}
        with self._write() as c:  # every run checked first: refused, nothing is deleted
            for start in range(0, len(run_ids), 500):
                self._refuse_busy_runs(c, run_ids[start:start + 500])
        for n, run_id in enumerate(run_ids):
            try:
                with self._write() as c:
                    self._refuse_busy_runs(c, [run_id])  # it may have been resumed since
                    c.execute("DELETE FROM call_groups WHERE run_id = ?", (run_id,))
                    counts["events"] += c.execute(
                        "DELETE FROM events WHERE run_id = ?", (run_id,)).rowcount
                    counts["keys"] += c.execute(
                        "DELETE FROM idempotency_keys WHERE run_id = ?", (run_id,)).rowcount
                    for table in ("approvals", "items", "steps"):
                        c.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
                    counts["runs"] += c.execute(
                        "DELETE FROM runs WHERE run_id = ?", (run_id,)).rowcount
            except RunError as exc:
                if n:
                    exc.message += f" (the {n} run(s) before it were deleted)"
                raise
        return {**counts, **self.backend.vacuum(self._c(), rewrite=rewrite)}

    def _refuse_busy_runs(self, c: Conn, run_ids: list[str]) -> None:
        """``run_busy`` unless none of ``run_ids`` is driven or has a call under way."""
        marks = ", ".join("?" for _ in run_ids)
        for row in c.execute(
                "SELECT lease_owner, lease_epoch, lease_expires, "
                f"lease_expires - {self.backend.NOW_SQL}, lease_boot, lease_start, "
                f"run_id, status FROM runs WHERE run_id IN ({marks})", run_ids).fetchall():
            lease = None if row[0] is None else lease_record(row)
            if lease is not None and lease.driven():
                raise RunError(f"run {row[6]} is {row[7]} and its lease is held by "
                               f"{lease.owner}; it cannot be deleted while it runs",
                               code="run_busy", hint="Wait for it to end, or stop "
                               "that process (Ctrl-C); then try again.")
            # a command its dead planrun left running (found by an attacker: the run was
            # deleted while its call went on)
            self._refuse_live_calls(c, str(row[6]), "deleting the run now would lose the "
                                    "record of a call still under way")
