"""Dispatch records and idempotency keys: a part of :class:`planrun.journal.Journal`.

A step (or fan-out item) is recorded ``running`` with its claimed key before its call
starts (record-call-record, SPEC §7); a key another live run claims is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import RunError
from .base import Conn, JournalBase, _reads, epoch_seconds, now
from .records import _loads, dumps, lease_record


class DispatchMixin(JournalBase):
    """The journal's dispatch records and keys: a part of :class:`planrun.journal.Journal`."""

    def step_started(self, run_id: str, step_id: str, *, attempt: int, key: str,
                     root_run_id: str, item: int | None = None, defer: bool = False,
                     arguments_digest: str | None = None, idempotent: bool = True) -> str:
        """The dispatch record: step (or item) ``running`` with its key claimed.

        ``idempotent``: whether the step's tool may be called again under a key another
        run's call was cut short with (:meth:`_refuse_live_claim`).

        ``arguments_digest`` (SHA-256 of the canonical JSON of the resolved arguments in
        reference form) goes into the ``step_started`` event's data, next to ``attempt``
        and ``key``: what was called is known even when a tool's ``key_arguments`` leave
        some arguments out of the key. (An event field: no schema change.)

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
        extra = {"arguments_digest": arguments_digest} if arguments_digest else {}
        if item is not None and defer and self.backend.BATCH_CLAIMS:
            self._claim_later(run_id, step_id, root_run_id, (item, attempt, key, ts),
                              extra, idempotent)
            return ts
        table, where, args = self._target(run_id, step_id, item)
        message = f"step {step_id!r} of run {run_id} is not pending"
        calls = self.backend.calls
        if calls is not None and self.fresh_keys:  # one server-side call writes the same
            data_json = dumps({"attempt": attempt, "key": key, **extra})

            def call(c: Conn) -> None:
                calls.start(c, run_id, self._lease_check(run_id), step_id, item, attempt,
                            key, ts, message, root_run_id, data_json)

            self._apply(call, defer)
            return ts

        def write(c: Conn) -> None:
            self._guard(c, run_id)
            self._expect_changed(
                c, f"UPDATE {table} SET status = 'running', attempts = ?, idempotency_key = ?, "
                "recoveries = recoveries + CASE WHEN status = 'running' THEN 1 ELSE 0 END, "
                f"started_at = COALESCE(started_at, ?), error_json = NULL WHERE {where} "
                "AND status IN ('pending', 'running', 'indeterminate')",
                (attempt, key, ts, *args), message)
            if not self.fresh_keys:
                self._refuse_live_claim(c, [key], run_id, idempotent)
            c.execute(
                "INSERT INTO idempotency_keys (key, root_run_id, run_id, step_id, item_index, "
                "status, claimed_at) VALUES (?, ?, ?, ?, ?, 'running', ?) "
                "ON CONFLICT (key) DO UPDATE SET run_id = excluded.run_id, "
                "status = 'running', claimed_at = excluded.claimed_at",
                (key, root_run_id, run_id, step_id, item, ts))
            self._event(c, run_id, "step_started", step_id=step_id, item=item,
                        data={"attempt": attempt, "key": key, **extra}, ts=ts)

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

    def _refuse_live_claim(self, c: Conn, keys: Sequence[str], run_id: str,
                           idempotent: bool = True) -> None:
        """Refuse a key (any of ``keys``) another run claimed for a call not known to end.

        A key ``running`` in another run is a call that run made and did not see end:

        - that run is still driven (its lease live): two runs must not both call it —
          two retries of one run at once, two runs of a ``dedupe: plan`` tool;
        - that run stopped (interrupted, killed, its lease expired): the call's effect is
          unknown, as for a step resume finds ``running``. An ``idempotent`` tool is
          called again under the key (SPEC §7), anything else is refused until a person
          settles that run's step (``planrun resolve``). Taking the key over silently
          called a non-idempotent step twice: a second ``retry`` after the first was
          interrupted inside it, a fresh run after a ``dedupe: plan`` call crashed (found
          by an attacker).

        A claim of the run whose lease this process holds (a retry holds its parent's for
        the whole child run) is taken over: nobody else can be calling it. One query for
        any number of keys.

        Raises:
            RunError: ``run_busy`` (exit 5): a live run is calling one of the keys;
                ``indeterminate`` (exit 5): a stopped run's call of one is unknown and the
                tool is not idempotent.
        """
        rows = c.execute(
            "SELECT k.run_id, r.lease_owner, r.lease_epoch, r.lease_expires, "
            f"r.lease_expires - {self.backend.NOW_SQL}, r.lease_boot, r.lease_start, "
            "k.step_id, k.item_index "
            "FROM idempotency_keys k JOIN runs r ON r.run_id = k.run_id "
            f"WHERE k.key IN ({', '.join('?' for _ in keys)}) AND k.status = 'running' "
            "AND k.run_id != ?", (*keys, run_id)).fetchall()
        for row in rows:
            if row[1] and row[1] == self.owner:
                continue
            if row[1]:
                lease = lease_record(row[1:7])
                if not lease.expired and lease.holder_alive() is not False:
                    raise RunError(f"run {row[0]} ({lease.owner}) is calling the same step "
                                   "with the same idempotency key right now",
                                   code="run_busy", hint="Wait for that run to finish.")
            if not idempotent:
                raise _unknown_elsewhere(str(row[0]), str(row[7]), row[8], run_id)

    def _claim_later(self, run_id: str, step_id: str, root_run_id: str,
                     claim: tuple[int, int, str, str], extra: dict[str, Any],
                     idempotent: bool = True) -> None:
        """Defer one fan-out item's dispatch record into a batch claim (:class:`_Claims`).

        Claims of one step deferred one after another (the items that start together)
        become one batch; a claim after another deferred write starts a new batch, so the
        journal's writes and events keep the order they were made in.
        """
        last = self._deferred[-1] if self._deferred else None
        if isinstance(last, _Claims) and last.target == (run_id, step_id, root_run_id):
            last.claims.append(claim)
        else:
            last = _Claims(self, (run_id, step_id, root_run_id), [claim], idempotent)
            self._deferred.append(last)
        last.extra[claim[0]] = extra

    @_reads
    def succeeded_key(self, key: str, ttl_s: float | None = None) -> Any:
        """(True, output) when ``key`` is recorded as succeeded, else (False, None).

        ``ttl_s`` (seconds, ``dedupe_ttl``): a key that succeeded longer ago than that is
        expired and counts as not recorded (the call runs again). Its time is the key's
        ``finished_at`` (else ``claimed_at``), RFC 3339 text, read as seconds since the
        epoch (:func:`~planrun.journal.base.epoch_seconds`, the same on every backend); a
        time that does not parse is expired.
        """
        row = self._c().execute(
            "SELECT output_json, COALESCE(finished_at, claimed_at) FROM idempotency_keys "
            "WHERE key = ? AND status = 'succeeded'", (key,)).fetchone()
        if not row:
            return (False, None)
        if ttl_s is not None:
            import time

            when = epoch_seconds(row[1])
            if when is None or time.time() - when > ttl_s:
                return (False, None)
        return (True, _loads(row[0]))


class _Claims:
    """Fan-out items claimed in one batch: their dispatch records (SPEC §11).

    For a backend with ``BATCH_CLAIMS`` (PostgreSQL): the items' rows are locked with the
    backend's ``CLAIM_SQL`` (``FOR UPDATE SKIP LOCKED``: a row another transaction is
    claiming is skipped, never waited for nor claimed twice) and set ``running`` with
    their attempts and keys in one statement, their keys claimed and their
    ``step_started`` events written in one statement each: what
    :meth:`DispatchMixin.step_started` writes for each item, in three statements for any
    number of items. Every item must be claimed, else the transaction fails with a
    JournalError naming the step and writes nothing (as for one item).
    """

    def __init__(self, journal: DispatchMixin, target: tuple[str, str, str],
                 claims: list[tuple[int, int, str, str]], idempotent: bool = True) -> None:
        self.journal = journal
        self.target = target
        #: Whether the step's tool may be called again under another run's unknown claim.
        self.idempotent = idempotent
        #: (item index, attempt, idempotency key, start time) per item.
        self.claims = claims
        #: item index → what its ``step_started`` event adds (``arguments_digest``).
        self.extra: dict[int, dict[str, Any]] = {}

    def __call__(self, c: Conn) -> None:
        journal = self.journal
        run_id, step_id, root_run_id = self.target
        claims = self.claims
        indices = [idx for idx, _, _, _ in claims]
        message = (f"item(s) {', '.join(map(str, indices))} of step {step_id!r} of run "
                   f"{run_id} are not pending")
        calls = journal.backend.calls
        if calls is not None and journal.fresh_keys:  # one server-side call, same writes
            calls.claim(c, run_id, journal._lease_check(run_id), step_id, root_run_id, claims,
                        [dumps({"attempt": attempt, "key": key, **self.extra.get(idx, {})})
                         for idx, attempt, key, _ in claims], message)
            return
        journal._guard(c, run_id)
        rows = ", ".join("(?, ?, ?, ?)" for _ in claims)
        marks = ", ".join("?" for _ in claims)
        journal._expect_changed(
            c, "UPDATE items SET status = 'running', attempts = w.attempts, "
            "idempotency_key = w.claimed_key, recoveries = items.recoveries + CASE WHEN "
            "items.status = 'running' THEN 1 ELSE 0 END, started_at = COALESCE("
            "items.started_at, w.started_at), error_json = NULL FROM (VALUES "
            f"{rows}) AS w (item_index, attempts, claimed_key, started_at) "
            "WHERE items.run_id = ? AND items.step_id = ? AND items.item_index = w.item_index "
            "AND items.item_index IN (SELECT item_index FROM items WHERE run_id = ? AND "
            f"step_id = ? AND item_index IN ({marks}) AND status IN ('pending', 'running', "
            f"'indeterminate'){journal.backend.CLAIM_SQL})",
            (*(v for claim in claims for v in claim), run_id, step_id, run_id, step_id,
             *indices), message, rows=len(claims))
        if not journal.fresh_keys:
            journal._refuse_live_claim(c, [key for _, _, key, _ in claims], run_id,
                                       self.idempotent)
        c.execute(
            "INSERT INTO idempotency_keys (key, root_run_id, run_id, step_id, item_index, "
            f"status, claimed_at) VALUES {', '.join('(?, ?, ?, ?, ?, ?, ?)' for _ in claims)} "
            "ON CONFLICT (key) DO UPDATE SET run_id = excluded.run_id, "
            "status = 'running', claimed_at = excluded.claimed_at",
            tuple(v for idx, _, key, ts in claims
                  for v in (key, root_run_id, run_id, step_id, idx, "running", ts)))
        journal._events(c, run_id, [
            ("step_started", step_id, idx,
             {"attempt": attempt, "key": key, **self.extra.get(idx, {})}, ts)
            for idx, attempt, key, ts in claims])


def _unknown_elsewhere(other: str, step_id: str, item: int | None, run_id: str) -> RunError:
    """``indeterminate`` (exit 5): run ``other`` stopped inside this call (same key)."""
    where = step_id if item is None else f"{step_id} --item {item}"
    shown = step_id if item is None else f"{step_id}[{item}]"
    return RunError(
        f"step {shown} was being called by run {other} with the same idempotency key when "
        "that run stopped, and its tool is not idempotent: the effect is unknown, so it is "
        "not called again", code="indeterminate",
        hint=f"Check what happened, then settle it there: planrun resolve {other} {where} "
        f"--succeeded [--output JSON] | --failed [--reason TEXT]; then planrun resume "
        f"{run_id} (a settled success is replayed, a failure runs again).",
        details={"run_id": other, "step": step_id, "item": item}, run_id=run_id)
