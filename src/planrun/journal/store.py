"""Journal records: runs, steps, items, approvals, events, idempotency keys (SPEC §7).

Every state change and its event are written in one transaction. A step's dispatch record
(``running`` with its idempotency key) commits before its tool is called; its outcome is an
UPDATE guarded by the expected status, so a record can never move backwards.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import socket
import sqlite3
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from .. import procs
from ..errors import JournalError, RunError, UsageError
from .connection import _fail, atomic, open_read, open_write

EVENT_KINDS = (
    "planned", "plan_refused", "approval_required", "approval_granted", "approval_denied",
    "autonomy_escalated", "autonomy_refused", "step_started", "step_succeeded", "step_failed",
    "step_retried", "step_skipped", "step_replayed", "run_interrupted", "run_resumed",
    "run_finished", "indeterminate_resolved",
)
STEP_STATUSES = ("pending", "running", "succeeded", "failed", "skipped", "indeterminate")
RUN_STATUSES = ("running", "completed", "failed", "interrupted", "denied", "refused")
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


def lease_owner() -> str:
    """This process as a lease holder: ``host:pid:token``."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def holder_alive(owner: str) -> bool | None:
    """Whether the process holding a lease is alive.

    True/False when the holder is on this host (its pid is checked); None when it is on
    another host and cannot be checked from here.
    """
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return None
    pid = int(pid_text)
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


F = TypeVar("F", bound=Callable[..., Any])


def _reads(method: F) -> F:
    """A read whose failure on a corrupt or unreadable journal is a JournalError (exit 6)."""

    @functools.wraps(method)
    def wrapper(self: Journal, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except sqlite3.DatabaseError as exc:
            raise _fail(self.path, exc, "read") from None

    return wrapper  # type: ignore[return-value]


def now() -> str:
    """The current time, RFC 3339 in UTC with an offset (``2026-11-29T12:00:00.123+00:00``)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def new_run_id() -> str:
    """A fresh run id: 16 random hex characters."""
    return secrets.token_hex(8)


def dumps(value: Any) -> str:
    """Compact JSON for a column.

    Values arrive in reference form (``planrun.redact``): a secret parameter's value is
    already a reference wherever it was, so nothing here needs to know the secrets.
    """
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates (undecodable file names): escape them
            text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    return text


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


class Journal:
    """A handle on one journal file.

    Args:
        path: the SQLite file.
        write: open for writing (creates and migrates); else read-only, and a journal that
            does not exist yet reads as empty.

    Raises:
        JournalError: the file cannot be used (exit 6).
    """

    def __init__(self, path: Path, *, write: bool) -> None:
        self.path = path
        self.conn: sqlite3.Connection | None = open_write(path) if write else open_read(path)
        #: When set, step writes check that this owner still holds the run's lease.
        self.owner: str | None = None
        #: Outcome records waiting to share the next write's transaction (group commit).
        self._deferred: list[Callable[[sqlite3.Connection], None]] = []
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

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- plumbing ---------------------------------------------------------------------

    def _c(self) -> sqlite3.Connection:
        if self.conn is None:
            raise JournalError(f"the journal {self.path} is not open for this")
        return self.conn

    def _write(self) -> Any:
        return _Tx(self)

    def flush(self) -> None:
        """Commit the deferred outcome records now (one transaction)."""
        if self._deferred:
            with self._write():
                pass

    def drop_deferred(self) -> None:
        """Forget the deferred records unwritten (after the run's lease was lost)."""
        self._deferred.clear()

    @_reads
    def lease_holder(self, run_id: str) -> str | None:
        """Who holds the run's lease now (``host:pid:token``), or None."""
        row = self._c().execute("SELECT lease_owner FROM runs WHERE run_id = ?",
                                (run_id,)).fetchone()
        return None if row is None or row[0] is None else str(row[0])

    @property
    def pending_writes(self) -> int:
        """How many deferred records wait for the next commit."""
        return len(self._deferred)

    def _guard(self, conn: sqlite3.Connection, run_id: str) -> None:
        if self.owner is None or run_id in self._guarded:
            return  # checked once per transaction and run
        self._guarded.add(run_id)
        row = conn.execute("SELECT lease_owner FROM runs WHERE run_id = ?",
                           (run_id,)).fetchone()
        if row is None or row[0] != self.owner:
            raise LeaseLost(f"run {run_id} is now held by {row[0] if row else 'nobody'}; "
                            "this process stops writing to it")

    def _event(self, conn: sqlite3.Connection, run_id: str, kind: str,
               step_id: str | None = None, item: int | None = None, data: Any = None,
               ts: str | None = None) -> None:
        conn.execute(
            "INSERT INTO events (run_id, ts, kind, step_id, item_index, data_json) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (run_id, ts or now(), kind, step_id, item, None if data is None else dumps(data)))

    # --- runs -----------------------------------------------------------------------------

    def create_run(self, *, run: dict[str, Any], steps: list[tuple[str, int, str]],
                   event_data: Any = None) -> None:
        """Journal a new run and its steps as ``pending``, with its ``planned`` event.

        ``run`` holds the columns of ``runs`` (``run_id``, ``plan_name`` …); ``steps`` is
        (step id, position, tool) per step.
        """
        cols = list(run)
        with self._write() as c:
            c.execute(f"INSERT INTO runs ({', '.join(cols)}) VALUES "
                      f"({', '.join('?' for _ in cols)})", [run[k] for k in cols])
            c.executemany(
                "INSERT INTO steps (run_id, step_id, position, tool, status) "
                "VALUES (?, ?, ?, ?, 'pending')",
                [(run["run_id"], sid, pos, tool) for sid, pos, tool in steps])
            self._event(c, run["run_id"], "planned", data=event_data, ts=run["created_at"])

    def refuse_run(self, *, run: dict[str, Any], report: Any) -> None:
        """Journal a run refused by validation (status ``refused``, ``plan_refused``)."""
        cols = list(run)
        with self._write() as c:
            c.execute(f"INSERT INTO runs ({', '.join(cols)}) VALUES "
                      f"({', '.join('?' for _ in cols)})", [run[k] for k in cols])
            self._event(c, run["run_id"], "plan_refused", data=report, ts=run["created_at"])

    def finish_run(self, run_id: str, status: str, data: Any = None) -> None:
        """Set the run's final status and release its lease.

        With its ``run_finished`` event (``run_interrupted`` for an interrupted run, which
        stays resumable).
        """
        ts = now()
        done = status not in ("running", "interrupted")
        with self._write() as c:
            self._guard(c, run_id)
            c.execute("UPDATE runs SET status = ?, finished_at = ?, lease_owner = NULL, "
                      "lease_expires = NULL WHERE run_id = ?",
                      (status, ts if done else None, run_id))
            kind = "run_interrupted" if status == "interrupted" else "run_finished"
            self._event(c, run_id, kind, data={"status": status, **(data or {})}, ts=ts)


    def record_approval(self, *, run_id: str, step_id: str, tool: str, digest: str,
                        granted: bool, decided_by: str, method: str, reason: str | None,
                        item: int | None = None) -> None:
        """Journal one approval decision with its ``approval_granted|denied`` event."""
        ts = now()
        with self._write() as c:
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

    def add_event(self, run_id: str, kind: str, step_id: str | None = None,
                  data: Any = None) -> None:
        """Journal one event on its own."""
        with self._write() as c:
            self._event(c, run_id, kind, step_id=step_id, data=data)

    # --- steps ------------------------------------------------------------------------------

    @staticmethod
    def _target(run_id: str, step_id: str, item: int | None) -> tuple[str, str, tuple[Any, ...]]:
        """(table, WHERE clause, its parameters) of a step or one fan-out item."""
        if item is None:
            return "steps", "run_id = ? AND step_id = ?", (run_id, step_id)
        return "items", "run_id = ? AND step_id = ? AND item_index = ?", (run_id, step_id,
                                                                           item)

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

        def write(c: sqlite3.Connection) -> None:
            self._guard(c, run_id)
            cur = c.execute(
                f"UPDATE {table} SET status = 'running', attempts = ?, idempotency_key = ?, "
                "recoveries = recoveries + (status = 'running'), "
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

        if defer:
            self._deferred.append(write)
        else:
            with self._write() as c:
                write(c)
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

    # --- process groups of running command calls (SPEC §12) ---------------------------

    def record_call(self, run_id: str, step_id: str, item: int | None,
                    group: procs.Group) -> None:
        """Journal the process group of a command call that just started (committed now).

        Raises:
            LeaseLost: another process holds the run's lease (the caller ends the call).
        """
        with self._write() as c:
            self._guard(c, run_id)
            c.execute("INSERT OR REPLACE INTO call_groups (run_id, step_id, item_index, pgid, "
                      "host, boot_id, start_ticks, started_at) VALUES (?,?,?,?,?,?,?,?)",
                      (run_id, step_id, item, group.pgid, group.host, group.boot_id,
                       group.start_ticks, now()))

    def end_call(self, run_id: str, group: procs.Group) -> None:
        """Forget a call's group once its leader was reaped (joins the next commit)."""
        def write(c: sqlite3.Connection) -> None:
            c.execute("DELETE FROM call_groups WHERE run_id = ? AND host = ? AND pgid = ?",
                      (run_id, group.host, group.pgid))

        self._deferred.append(write)

    @staticmethod
    def _call_rows(c: sqlite3.Connection, run_ids: list[str]
                   ) -> list[tuple[str, str, int | None, procs.Group, str]]:
        marks = ", ".join("?" for _ in run_ids)
        rows = c.execute(
            "SELECT run_id, step_id, item_index, pgid, host, boot_id, start_ticks, "
            f"started_at FROM call_groups WHERE run_id IN ({marks}) ORDER BY started_at",
            run_ids).fetchall()
        return [(r[0], r[1], r[2], procs.Group(r[3], r[4], r[5], r[6]), r[7]) for r in rows]

    def calls(self, run_id: str) -> list[dict[str, Any]]:
        """The recorded command calls of a run still running or left by a dead process.

        Each: ``step``, ``item``, ``pgid``, ``host``, ``started_at``, ``alive`` (True /
        False, None on another host). Changes nothing.
        """
        if self.conn is None:
            return []
        try:
            rows = self._call_rows(self.conn, [run_id])
        except sqlite3.DatabaseError as exc:
            raise _fail(self.path, exc, "read") from None
        return [{"step": sid, "item": item, "pgid": g.pgid, "host": g.host,
                 "started_at": ts, "alive": procs.group_alive(g)}
                for _run, sid, item, g, ts in rows]

    def forget_calls(self, run_id: str, *, host: str | None = None) -> int:
        """Forget a run's recorded calls (only those on ``host`` when given); how many."""
        with self._write() as c:
            if host is None:
                cur = c.execute("DELETE FROM call_groups WHERE run_id = ?", (run_id,))
            else:
                cur = c.execute("DELETE FROM call_groups WHERE run_id = ? AND host = ?",
                                (run_id, host))
            return int(cur.rowcount)

    def _refuse_live_calls(self, c: sqlite3.Connection, run_id: str) -> None:
        """``run_busy`` while a call of the run (or of a child run) outlives its planrun.

        Calls that are provably over are forgotten; one on another host cannot be
        checked from here and counts as running until ``planrun unlock``.
        """
        runs = [run_id] + [r[0] for r in c.execute(
            "SELECT run_id FROM runs WHERE parent_run_id = ?", (run_id,))]
        live = []
        for rid, sid, item, group, _ts in self._call_rows(c, runs):
            alive = procs.group_alive(group)
            if alive is False:
                c.execute("DELETE FROM call_groups WHERE run_id = ? AND host = ? AND pgid = ?",
                          (rid, group.host, group.pgid))
            else:
                live.append((rid, sid, item, group, alive))
        if not live:
            return
        rid, sid, item, group, alive = live[0]
        what = f"step {sid!r}" + (f" item {item}" if item is not None else "")
        of = "" if rid == run_id else f" (of its retry {rid})"
        if alive:
            where = f"process group {group.pgid}"
            hint = (f"Wait for it to end, or end it (kill -TERM -{group.pgid}); then run "
                    "this command again.")
        else:
            where = f"process group {group.pgid} on host {group.host}"
            hint = (f"Make sure it ended on {group.host}, then `planrun unlock {run_id}` "
                    "forgets it.")
        more = f" and {len(live) - 1} more" if len(live) > 1 else ""
        raise RunError(f"run {run_id}: the call of {what}{of} is still running "
                       f"({where}{more}), started by a planrun process that is gone; "
                       "running the step again now could do its effect twice",
                       code="run_busy", hint=hint,
                       details={"calls": [{"run_id": r, "step": s, "item": i,
                                           **procs.describe(g)} for r, s, i, g, _a in live]})

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
                            f"attempts = MAX(attempts - 1, 0) WHERE {where} "
                            "AND status = 'running'", args)
            if cur.rowcount == 1:  # a finished or indeterminate record keeps its key
                c.execute("DELETE FROM idempotency_keys WHERE key = ? AND "
                          "status = 'running'", (key,))

    @staticmethod
    def _refuse_live_claim(c: sqlite3.Connection, key: str, run_id: str) -> None:
        """Refuse a key another run has claimed and is still driving.

        Two retries of one run at once must not both call the same non-idempotent step.
        """
        row = c.execute(
            "SELECT k.run_id, r.lease_owner, r.lease_expires FROM idempotency_keys k "
            "JOIN runs r ON r.run_id = k.run_id WHERE k.key = ? AND k.status = 'running' "
            "AND k.run_id != ?", (key, run_id)).fetchone()
        if row is None or not row[1]:
            return
        other, holder, expires = row
        if (expires is None or expires >= time.time()) and holder_alive(holder) is not False:
            raise RunError(f"run {other} ({holder}) is calling the same step with the same "
                           "idempotency key right now", code="run_busy",
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

        def write(c: sqlite3.Connection) -> None:
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

        if defer:
            self._deferred.append(write)
        else:
            with self._write() as c:
                write(c)
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
            c.executemany("INSERT OR IGNORE INTO items (run_id, step_id, item_index, status) "
                          "VALUES (?, ?, ?, 'pending')",
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
                "SELECT json_group_array(json(output_json)) FROM (SELECT output_json FROM "
                "items WHERE run_id = ? AND step_id = ? ORDER BY item_index)) "
                "WHERE run_id = ? AND step_id = ? AND status = 'running'",
                (ts, run_id, step_id, run_id, step_id))
            if cur.rowcount != 1:
                raise JournalError(f"step {step_id!r} of run {run_id} was not running")
            self._event(c, run_id, "step_succeeded", step_id=step_id, ts=ts)

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

    # --- leases, resume, resolve ------------------------------------------------------------

    def take_lease(self, run_id: str, owner: str, *, ttl: float | None = None,
                   statuses: tuple[str, ...] | None = None) -> None:
        """Take the run's lease for ``owner`` (SPEC §7 "Leases").

        A lease held by a live process is refused; a dead holder (same host, pid gone) or
        an expired lease is taken over. A command call of the run (or of a retry of it)
        that outlived its planrun and still runs is refused too (SPEC §12). With
        ``statuses``, the run's status is checked in the same transaction (a run another
        process just finished is not taken).

        Raises:
            RunError: ``run_busy``; ``run_not_resumable`` when the status is not one of
                ``statuses`` (exit 5).
        """
        with self._write() as c:
            row = c.execute("SELECT lease_owner, lease_expires, status FROM runs "
                            "WHERE run_id = ?", (run_id,)).fetchone()
            if row is None:
                raise RunError(f"no run {run_id!r}", code="unknown_run")
            holder, expires, status = row
            if statuses is not None and status not in statuses:
                raise RunError(f"run {run_id} is {status} now", code="run_not_resumable")
            if holder and holder != owner:
                alive = holder_alive(holder)
                expired = expires is not None and expires < time.time()
                # A live holder renews every LEASE_TTL_S / 3; one that let its lease expire
                # is stuck (or its pid was reused by another process): take it over.
                if not expired and alive is not False:
                    where = "" if alive else " on another host"
                    raise RunError(
                        f"run {run_id} is being driven by another process{where} "
                        f"({holder}); its lease expires in "
                        f"{max(0, (expires or 0) - time.time()):.0f} s",
                        code="run_busy",
                        hint="Wait for it to finish; if that process is gone for good "
                        f"(another host), `planrun unlock {run_id}` releases the lease.")
            self._refuse_live_calls(c, run_id)
            c.execute("UPDATE runs SET lease_owner = ?, lease_expires = ? WHERE run_id = ?",
                      (owner, time.time() + (ttl or lease_ttl()), run_id))
        self.owner = owner

    def renew_lease(self, run_id: str, owner: str, *, ttl: float | None = None) -> bool:
        """Extend ``owner``'s lease; False when it no longer holds it."""
        with self._write() as c:
            cur = c.execute("UPDATE runs SET lease_expires = ? WHERE run_id = ? "
                            "AND lease_owner = ?", (time.time() + (ttl or lease_ttl()), run_id,
                                                    owner))
            return bool(cur.rowcount == 1)

    def release_lease(self, run_id: str, owner: str | None = None) -> str | None:
        """Clear the lease (only ``owner``'s when given); returns who held it."""
        with self._write() as c:
            row = c.execute("SELECT lease_owner FROM runs WHERE run_id = ?",
                            (run_id,)).fetchone()
            holder = row[0] if row else None
            if owner is None or holder == owner:
                c.execute("UPDATE runs SET lease_owner = NULL, lease_expires = NULL "
                          "WHERE run_id = ?", (run_id,))
        if self.owner == owner:
            self.owner = None
        return holder if holder is None else str(holder)

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
    def latest_resumable(self) -> str | None:
        """The most recent run that is ``interrupted`` or ``running``, if any."""
        if self.conn is None:
            return None
        row = self.conn.execute(
            "SELECT run_id FROM runs WHERE status IN ('interrupted', 'running') "
            "ORDER BY created_at DESC, rowid DESC LIMIT 1").fetchone()
        return None if row is None else str(row[0])

    def copy_succeeded(self, parent: str, child: str, step_ids: list[str]) -> None:
        """A retry's inherited steps: succeeded in ``parent``, replayed in ``child``."""
        ts = now()
        with self._write() as c:
            for sid in step_ids:
                c.execute(
                    "UPDATE steps SET status = 'succeeded', replayed = 1, "
                    "(output_json, idempotency_key, attempts, started_at, finished_at, "
                    "approved_by) = (SELECT output_json, idempotency_key, attempts, "
                    "started_at, finished_at, approved_by FROM steps p "
                    "WHERE p.run_id = ? AND p.step_id = ?) "
                    "WHERE run_id = ? AND step_id = ?", (parent, sid, child, sid))
                self._event(c, child, "step_replayed", step_id=sid,
                            data={"source": parent}, ts=ts)

    @_reads
    def succeeded_key(self, key: str) -> Any:
        """(True, output) when ``key`` is recorded as succeeded, else (False, None)."""
        row = self._c().execute(
            "SELECT output_json FROM idempotency_keys WHERE key = ? AND status = 'succeeded'",
            (key,)).fetchone()
        return (True, _loads(row[0])) if row else (False, None)

    # --- reading ------------------------------------------------------------------------------

    def resolve_run_id(self, ref: str) -> str:
        """The full run id for a run id or a unique prefix (at least 4 characters).

        Raises:
            RunError: ``unknown_run`` (none, or an ambiguous prefix).
        """
        if self.conn is None:
            raise RunError(f"no run {ref!r} (the journal {self.path} is empty)",
                           code="unknown_run", hint="List runs with `planrun runs`.")
        if ref == "last":
            latest = self.latest_run(self.project)
            if latest is None:
                raise RunError(f"no run yet in {self.path}"
                               + (f" for the project {self.project}" if self.project else ""),
                               code="unknown_run", hint="List every project's runs with "
                               "`planrun runs --all`.")
            return latest
        if len(ref) < MIN_PREFIX:
            raise RunError(f"run id {ref!r} is too short; give at least {MIN_PREFIX} "
                           "characters", code="unknown_run")
        escaped = ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        try:
            rows = self.conn.execute(
                "SELECT run_id FROM runs WHERE run_id LIKE ? ESCAPE '\\' LIMIT 3",
                (escaped + "%",)).fetchall()
        except sqlite3.DatabaseError as exc:
            raise _fail(self.path, exc, "read") from None
        exact = [r[0] for r in rows if r[0] == ref]
        if exact:
            return str(exact[0])
        if not rows:
            raise RunError(f"no run {ref!r} in {self.path}", code="unknown_run",
                           hint="List runs with `planrun runs`.")
        if len(rows) > 1:
            raise RunError(f"run id prefix {ref!r} is ambiguous ({', '.join(r[0] for r in rows)}"
                           "…); give more characters", code="unknown_run")
        return str(rows[0][0])

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

    def list_runs(self, *, plan: str | None = None, status: str | None = None,
                  limit: int | None = None, project: str | None = None
                  ) -> list[dict[str, Any]]:
        """Runs newest first, optionally filtered, each with its step counts.

        ``project``: only runs of that project folder (and runs journaled before projects
        were, whose ``project`` is null). Each summary has ``project`` (or None).
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
        sql = ("SELECT run_id, plan_name, revision, status, created_at, finished_at, project "
               "FROM runs" + (" WHERE " + " AND ".join(where) if where else "")
               + " ORDER BY created_at DESC, rowid DESC")
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        try:
            runs = self.conn.execute(sql, args).fetchall()
            out = []
            for run_id, name, revision, st, created, finished, proj in runs:
                counts = dict(self.conn.execute(
                    "SELECT status, COUNT(*) FROM steps WHERE run_id = ? GROUP BY status",
                    (run_id,)).fetchall())
                out.append({"run_id": run_id, "plan": name, "revision": revision,
                            "status": st, "started_at": created, "finished_at": finished,
                            "counts": count_summary(counts), "project": proj})
        except sqlite3.DatabaseError as exc:
            raise _fail(self.path, exc, "read") from None
        return out

    @_reads
    def events(self, run_id: str) -> list[dict[str, Any]]:
        """The run's events in order."""
        cur = self._c().execute(
            "SELECT id, ts, kind, step_id, item_index, data_json FROM events "
            "WHERE run_id = ? ORDER BY id", (run_id,))
        return [{"id": eid, "ts": ts, "kind": kind, "step": step_id, "item": item,
                 "data": _loads(data)} for eid, ts, kind, step_id, item, data in cur]

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
    def approvals(self, run_id: str) -> list[dict[str, Any]]:
        """The run's approval decisions in order."""
        cur = self._c().execute("SELECT * FROM approvals WHERE run_id = ? ORDER BY id",
                                (run_id,))
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

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

    @_reads
    def idle_gaps(self, run_id: str) -> list[tuple[str, str]]:
        """When nobody drove the run: (last event before a resume, the resume) pairs.

        A run that died (or was interrupted) and was resumed later was idle from its last
        journaled event to the ``run_resumed`` event; manifests leave those gaps out of
        durations (issue 10, bug 12).
        """
        c = self._c()
        out: list[tuple[str, str]] = []
        for eid, ts in c.execute("SELECT id, ts FROM events WHERE run_id = ? AND "
                                 "kind = 'run_resumed' ORDER BY id", (run_id,)).fetchall():
            before = c.execute("SELECT ts FROM events WHERE run_id = ? AND id < ? "
                               "ORDER BY id DESC LIMIT 1", (run_id, eid)).fetchone()
            if before is not None and before[0] < ts:
                out.append((str(before[0]), str(ts)))
        return out

    # --- upkeep (issue 10: planrun prune / forget) -------------------------------------

    @_reads
    def latest_run(self, project: str | None = None) -> str | None:
        """The most recent run (of ``project`` and of no recorded project), if any."""
        sql = "SELECT run_id FROM runs"
        args: list[Any] = []
        if project:
            sql += " WHERE (project = ? OR project IS NULL)"
            args.append(project)
        row = self._c().execute(sql + " ORDER BY created_at DESC, rowid DESC LIMIT 1",
                                args).fetchone()
        return None if row is None else str(row[0])

    @_reads
    def select_runs(self, *, before: str, status: str | None = None, plan: str | None = None,
                    project: str | None = None) -> list[str]:
        """Ids of runs created before ``before`` (RFC 3339), optionally filtered."""
        sql = "SELECT run_id FROM runs WHERE created_at < ?"
        args: list[Any] = [before]
        for column, value in (("status", status), ("plan_name", plan)):
            if value:
                sql += f" AND {column} = ?"
                args.append(value)
        if project:
            sql += " AND (project = ? OR project IS NULL)"
            args.append(project)
        return [str(r[0]) for r in self._c().execute(sql + " ORDER BY created_at", args)]

    def delete_runs(self, run_ids: list[str]) -> dict[str, int]:
        """Delete runs and everything of theirs, then give the space back to the disk.

        Steps, fan-out items, approvals, events and the idempotency keys the runs wrote
        go with them: a later run can no longer replay those calls. Runs whose lease a
        live holder has (``holder_alive`` true and not expired) are refused first.

        Returns:
            ``{"runs", "events", "keys"}``: how many rows of each went.

        Raises:
            RunError: ``run_busy`` when one of the runs is driven by a live process.
        """
        if not run_ids:
            return {"runs": 0, "events": 0, "keys": 0}
        counts = {"runs": 0, "events": 0, "keys": 0}
        with self._write() as c:
            for start in range(0, len(run_ids), 500):
                chunk = run_ids[start:start + 500]
                marks = ", ".join("?" for _ in chunk)
                for run_id, owner, expires, st in c.execute(
                        f"SELECT run_id, lease_owner, lease_expires, status FROM runs "
                        f"WHERE run_id IN ({marks})", chunk).fetchall():
                    if owner and (expires or 0) > time.time() and holder_alive(owner) is not False:
                        raise RunError(f"run {run_id} is {st} and its lease is held by "
                                       f"{owner}; it cannot be deleted while it runs",
                                       code="run_busy", hint="Wait for it to end, or stop "
                                       "that process (Ctrl-C); then try again.")
                counts["events"] += c.execute(
                    f"DELETE FROM events WHERE run_id IN ({marks})", chunk).rowcount
                counts["keys"] += c.execute(
                    f"DELETE FROM idempotency_keys WHERE run_id IN ({marks})", chunk).rowcount
                for table in ("approvals", "items", "steps"):
                    c.execute(f"DELETE FROM {table} WHERE run_id IN ({marks})", chunk)
                counts["runs"] += c.execute(
                    f"DELETE FROM runs WHERE run_id IN ({marks})", chunk).rowcount
        # Another process reading or writing makes VACUUM fail: the space is reused later.
        with contextlib.suppress(sqlite3.OperationalError):
            self._c().execute("VACUUM")
        return counts


def count_summary(by_status: dict[str, int]) -> dict[str, int]:
    """``counts`` of a manifest: total plus one entry per step status."""
    counts = {"total": sum(by_status.values())}
    for st in STEP_STATUSES:
        counts[st] = int(by_status.get(st, 0))
    return counts


class _Tx:
    """``with journal._write() as conn``: one write transaction, errors as JournalError."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._cm: Any = None

    def __enter__(self) -> sqlite3.Connection:
        conn = self.journal._c()
        self.journal._guarded.clear()
        self._cm = atomic(conn)
        try:
            c: sqlite3.Connection = self._cm.__enter__()
            for write in self.journal._deferred:
                write(c)
        except BaseException as exc:
            self._cm.__exit__(type(exc), exc, exc.__traceback__)
            if isinstance(exc, sqlite3.Error):
                raise _fail(self.journal.path, exc, "write") from None
            raise
        return c

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        try:
            self._cm.__exit__(et, ev, tb)
        except sqlite3.Error as exc:
            raise _fail(self.journal.path, exc, "write") from None
        if et is None:
            self.journal._deferred.clear()
        if isinstance(ev, sqlite3.Error):
            raise _fail(self.journal.path, ev, "write") from None
