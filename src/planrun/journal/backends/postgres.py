"""The PostgreSQL journal backend: psycopg 3, one history for several hosts (SPEC §11).

Imported only when a ``postgresql://`` (or ``postgres://``) journal location is opened:
``planrun --help`` and SQLite journals never import :mod:`psycopg`. No ORM, no server-side
prepared statements (``prepare_threshold=None``, so a transaction-pooling PgBouncer in
front of the server works), autocommit connections that write only inside
:func:`PostgresBackend.transaction`.

Decisions (``docs/postgres-journal.md``):

- **SQL.** The journal's rules are written once, with ``?`` placeholders; this backend's
  connection (:class:`PgConnection`) rewrites each statement once (cached) to psycopg's
  ``%s`` style, outside string literals and quoted names. ``NOW_SQL`` is
  ``clock_timestamp()`` in seconds since the epoch (the database clock), ``json_array`` a
  ``string_agg`` that gives exactly SQLite's compact text.
- **Round trips.** Inside a write transaction statements are bound on the client and
  sent together with the next statement whose result is read (:class:`PgConnection`),
  and the journal's checks (the lease guard, rowcounts: the backend's ``expect`` and
  ``expect_changed``) are made on the server by ``planrun_expect`` (SQLSTATE
  :data:`CHECK_FAILED`), so ``BEGIN``, the lock, checks, writes and ``COMMIT`` are one
  round trip: one per chain step (9 before batching). Fan-out items that start together
  are claimed in one batch (``BATCH_CLAIMS``, ``CLAIM_SQL``: ``FOR UPDATE SKIP
  LOCKED``), and a batched ``executemany`` of an ``INSERT … VALUES`` is sent as
  multi-row INSERTs. A transaction sent whole goes without ``BEGIN``/``COMMIT`` (one
  query message is one implicit transaction on the server).
- **Server-side writes.** Outcome and dispatch records and batch claims, the hot path,
  are one call each of a PL/pgSQL function (:data:`WRITE_FUNCTIONS`, :class:`PgCalls`,
  ``backend.calls``): the server plans the statements in them once per server session,
  so a chain step is 3 statements to parse instead of 12, with no named prepared
  statements (PgBouncer-safe). They have a version of their own
  (:data:`FUNCTIONS_VERSION`), created or brought up by :func:`migrate`.
- **Writes.** Every write transaction starts with ``pg_advisory_xact_lock`` on a key of
  this journal (one database): write transactions of all processes on all hosts are
  serialized as SQLite's ``BEGIN IMMEDIATE`` serializes them, so every guarded write
  (lease owner and epoch checked, then written) and every key claim is correct across
  processes without retry loops. Reads take no lock (MVCC); ``snapshot`` is one
  ``REPEATABLE READ READ ONLY`` transaction. A writer waits at most ``lock_timeout``
  (30 s) for the lock; a write transaction left idle for 60 s is ended by the server
  (``idle_in_transaction_session_timeout``), so a stopped process cannot hold the journal.
  Both are ``SET LOCAL``: no session state, so a transaction-pooling PgBouncer works.
- **Schema.** The SQLite migrations (:mod:`planrun.journal.schema`) translated statement
  by statement (:func:`pg_statement`: ``INTEGER`` → ``BIGINT``, ``REAL`` → ``DOUBLE
  PRECISION``, ``INTEGER PRIMARY KEY`` → an identity column, no ``WITHOUT ROWID``), so both
  backends have the same tables, columns and version numbers. The version is the one row
  of ``planrun_schema``; migrations run under ``pg_advisory_xact_lock`` (two first runs do
  not race); a schema newer than this planrun is refused (exit 6).
- **Errors.** psycopg errors are classified by class and SQLSTATE (never by message
  text): cannot connect (server down, authentication, database missing — libpq gives no
  SQLSTATE for these, its own message is shown), connection lost (class 08, 57P0x, or a
  broken connection), anything else; each is one :class:`JournalError` (exit 6). A
  password in the URL is never shown (:func:`shown_location`; also masked inside the
  driver's messages).
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any, ClassVar
from urllib.parse import parse_qsl, unquote, urlsplit

import psycopg

from ... import childenv
from ...errors import JournalError
from ..schema import MIGRATIONS, SCHEMA_VERSION
from . import Fail, shown_location

#: ``pg_advisory_xact_lock`` key every write transaction takes ("planrun" + "w").
WRITE_LOCK = 0x706C616E72756E77
#: ``pg_advisory_xact_lock`` key of schema migrations ("planrun" + "m").
MIGRATE_LOCK = 0x706C616E72756E6D
#: How long a writer waits for another process's write transaction.
LOCK_TIMEOUT = "30s"
#: A transaction idle this long is ended by the server (its locks go with it).
IDLE_TIMEOUT = "60s"
#: Seconds to wait for a connection, unless the URL says (``connect_timeout=``).
CONNECT_TIMEOUT_S = 10

#: SQLSTATE ``planrun_expect`` raises for a check that does not hold (class PR: planrun's).
CHECK_FAILED = "PR001"
#: The server-side check of a write transaction (created by :func:`migrate`): raises
#: :data:`CHECK_FAILED` with the check's id as DETAIL and its detail value as HINT unless
#: ``ok`` is true, so a transaction's checks need no round trip of their own and its
#: ``COMMIT`` goes in the same one (a raised check aborts the rest of the batch).
EXPECT_FUNCTION = """\
CREATE OR REPLACE FUNCTION planrun_expect(ok boolean, check_id text, detail text)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
  IF ok IS NOT TRUE THEN
    RAISE EXCEPTION 'a planrun journal check did not hold (%)', check_id
      USING ERRCODE = 'PR001', DETAIL = check_id, HINT = COALESCE(detail, '');
  END IF;
  RETURN true;
END
$fn$"""

#: The start of every write transaction (sent with its first read): the transaction, its
#: limits (``SET LOCAL``: nothing outlives it, as a transaction-pooling PgBouncer needs),
#: the journal's write lock. With the write functions (:data:`WRITE_FUNCTIONS`):
#: :data:`_BEGIN_CALL`, the same in one statement.
_BEGIN_WRITE = ("BEGIN", f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'",
                f"SET LOCAL idle_in_transaction_session_timeout = '{IDLE_TIMEOUT}'",
                f"SELECT pg_advisory_xact_lock({WRITE_LOCK})")
_BEGIN_CALL = ("BEGIN", "SELECT planrun_begin()")

#: The version of :data:`WRITE_FUNCTIONS`, kept as the comment of ``planrun_begin()``
#: (``planrun write functions N``). A journal whose functions are older (none, or only
#: ``planrun_expect``: version 1) gets them when it is opened for writing (:func:`migrate`);
#: newer ones (a newer planrun's) are never replaced by these.
FUNCTIONS_VERSION = 2
#: The server-side writes of the hot path (created by :func:`migrate` with
#: ``planrun_expect``): PL/pgSQL, so the server parses and plans each statement in them
#: once per server session and reuses the plan (no named prepared statements: a
#: transaction-pooling PgBouncer works), and a write is one short statement on the wire.
#: Each does what the journal's SQL for it does (``journal.steps``, ``journal.dispatch``),
#: the same checks raising :data:`CHECK_FAILED` with the check ids the client gave (each
#: starts with the lease check, :data:`_GUARD`, unless its owner is NULL):
#:
#: - ``planrun_begin()``: the transaction's limits (``set_config(…, true)``, as
#:   ``SET LOCAL``) and the journal's write lock;
#: - ``planrun_finish(…)``: an outcome record (a step's or an item's), its key and event;
#: - ``planrun_start(…)``: a dispatch record (a step's or one item's), its key and event;
#: - ``planrun_claim(…)``: a batch of items' dispatch records (``FOR UPDATE SKIP LOCKED``).
_GUARD = """\
  IF p_owner IS NOT NULL AND NOT EXISTS (SELECT 1 FROM runs WHERE run_id = p_run
      AND lease_owner = p_owner AND (p_epoch IS NULL OR lease_epoch = p_epoch)) THEN
    PERFORM planrun_expect(false, p_guard,
                           (SELECT lease_owner FROM runs WHERE run_id = p_run));
  END IF;
"""
WRITE_FUNCTIONS = f"""\
CREATE OR REPLACE FUNCTION planrun_begin() RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM set_config('lock_timeout', '{LOCK_TIMEOUT}', true);
  PERFORM set_config('idle_in_transaction_session_timeout', '{IDLE_TIMEOUT}', true);
  PERFORM pg_advisory_xact_lock({WRITE_LOCK});
END
$fn$;
CREATE OR REPLACE FUNCTION planrun_finish(p_run text, p_owner text, p_epoch bigint,
  p_guard text, p_step text, p_item bigint, p_status text, p_out text, p_err text,
  p_ts text, p_set_facets boolean, p_facets text, p_expected text, p_check text,
  p_key text, p_kind text, p_data text) RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  changed bigint;
BEGIN
{_GUARD}  IF p_item IS NOT NULL THEN
    UPDATE items SET status = p_status, output_json = p_out, error_json = p_err,
      finished_at = p_ts WHERE run_id = p_run AND step_id = p_step
      AND item_index = p_item AND status = ANY (string_to_array(p_expected, ','));
  ELSIF p_set_facets THEN
    UPDATE steps SET status = p_status, output_json = p_out, error_json = p_err,
      finished_at = p_ts, facets_json = p_facets WHERE run_id = p_run
      AND step_id = p_step AND status = ANY (string_to_array(p_expected, ','));
  ELSE
    UPDATE steps SET status = p_status, output_json = p_out, error_json = p_err,
      finished_at = p_ts WHERE run_id = p_run AND step_id = p_step
      AND status = ANY (string_to_array(p_expected, ','));
  END IF;
  GET DIAGNOSTICS changed = ROW_COUNT;
  IF changed <> 1 THEN
    PERFORM planrun_expect(false, p_check, NULL);
  END IF;
  IF p_key IS NOT NULL AND p_status = 'succeeded' THEN
    UPDATE idempotency_keys SET status = 'succeeded', output_json = p_out,
      finished_at = p_ts WHERE key = p_key;
  ELSIF p_key IS NOT NULL AND p_status = 'failed' THEN
    DELETE FROM idempotency_keys WHERE key = p_key;
  END IF;
  INSERT INTO events (run_id, ts, kind, step_id, item_index, data_json)
    VALUES (p_run, p_ts, p_kind, p_step, p_item, p_data);
END
$fn$;
CREATE OR REPLACE FUNCTION planrun_start(p_run text, p_owner text, p_epoch bigint,
  p_guard text, p_step text, p_item bigint, p_attempt bigint, p_key text, p_ts text,
  p_check text, p_root text, p_data text) RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  changed bigint;
BEGIN
{_GUARD}  IF p_item IS NULL THEN
    UPDATE steps SET status = 'running', attempts = p_attempt, idempotency_key = p_key,
      recoveries = recoveries + CASE WHEN status = 'running' THEN 1 ELSE 0 END,
      started_at = COALESCE(started_at, p_ts), error_json = NULL
      WHERE run_id = p_run AND step_id = p_step
      AND status IN ('pending', 'running', 'indeterminate');
  ELSE
    UPDATE items SET status = 'running', attempts = p_attempt, idempotency_key = p_key,
      recoveries = recoveries + CASE WHEN status = 'running' THEN 1 ELSE 0 END,
      started_at = COALESCE(started_at, p_ts), error_json = NULL
      WHERE run_id = p_run AND step_id = p_step AND item_index = p_item
      AND status IN ('pending', 'running', 'indeterminate');
  END IF;
  GET DIAGNOSTICS changed = ROW_COUNT;
  IF changed <> 1 THEN
    PERFORM planrun_expect(false, p_check, NULL);
  END IF;
  INSERT INTO idempotency_keys (key, root_run_id, run_id, step_id, item_index, status,
      claimed_at) VALUES (p_key, p_root, p_run, p_step, p_item, 'running', p_ts)
    ON CONFLICT (key) DO UPDATE SET run_id = excluded.run_id, status = 'running',
      claimed_at = excluded.claimed_at;
  INSERT INTO events (run_id, ts, kind, step_id, item_index, data_json)
    VALUES (p_run, p_ts, 'step_started', p_step, p_item, p_data);
END
$fn$;
CREATE OR REPLACE FUNCTION planrun_claim(p_run text, p_owner text, p_epoch bigint,
  p_guard text, p_step text, p_root text, p_claims json, p_check text)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  w record;
BEGIN
{_GUARD}  FOR w IN SELECT (e->>0)::bigint AS i, (e->>1)::bigint AS a, e->>2 AS k, e->>3 AS t,
      e->>4 AS d FROM json_array_elements(p_claims) WITH ORDINALITY AS j (e, o) ORDER BY o
  LOOP
    PERFORM 1 FROM items WHERE run_id = p_run AND step_id = p_step AND item_index = w.i
      AND status IN ('pending', 'running', 'indeterminate') FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
      PERFORM planrun_expect(false, p_check, NULL);
    END IF;
    UPDATE items SET status = 'running', attempts = w.a, idempotency_key = w.k,
      recoveries = recoveries + CASE WHEN status = 'running' THEN 1 ELSE 0 END,
      started_at = COALESCE(started_at, w.t), error_json = NULL
      WHERE run_id = p_run AND step_id = p_step AND item_index = w.i;
    INSERT INTO idempotency_keys (key, root_run_id, run_id, step_id, item_index, status,
        claimed_at) VALUES (w.k, p_root, p_run, p_step, w.i, 'running', w.t)
      ON CONFLICT (key) DO UPDATE SET run_id = excluded.run_id, status = 'running',
        claimed_at = excluded.claimed_at;
    INSERT INTO events (run_id, ts, kind, step_id, item_index, data_json)
      VALUES (p_run, w.t, 'step_started', p_step, w.i, w.d);
  END LOOP;
END
$fn$;
COMMENT ON FUNCTION planrun_begin() IS 'planrun write functions {FUNCTIONS_VERSION}'"""


# --- SQL ------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def pg_sql(sql: str) -> str:
    """A statement with ``?`` placeholders in psycopg's style: ``%s``, a literal ``%`` doubled.

    Question marks inside string literals ('…') and quoted names ("…") stay as they are.
    """
    out: list[str] = []
    quote: str | None = None
    for ch in sql:
        if ch == "%":
            out.append("%%")
        elif quote is not None:
            out.append(ch)
            if ch == quote:
                quote = None  # a doubled quote closes and reopens: same result
        elif ch in ("'", '"'):
            quote = ch
            out.append(ch)
        elif ch == "?":
            out.append("%s")
        else:
            out.append(ch)
    return "".join(out)


_TYPES = [
    (re.compile(r"\bINTEGER PRIMARY KEY\b"), "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"),
    (re.compile(r"\bINTEGER\b"), "BIGINT"),
    (re.compile(r"\bREAL\b"), "DOUBLE PRECISION"),
    (re.compile(r"\)\s*WITHOUT ROWID\s*$"), ")"),
]

#: SQLite statements of :data:`MIGRATIONS` with no direct translation, and their
#: PostgreSQL equivalents.
_OVERRIDES = {
    # 3 -> 4: a run's seq from SQLite's rowid; on PostgreSQL: creation order.
    "UPDATE runs SET seq = rowid":
        "UPDATE runs SET seq = o.n FROM (SELECT run_id, row_number() OVER "
        "(ORDER BY created_at, run_id) AS n FROM runs) AS o WHERE runs.run_id = o.run_id",
}


def pg_statement(statement: str) -> str:
    """One SQLite migration statement as PostgreSQL DDL (types, identity, no rowid)."""
    if statement in _OVERRIDES:
        return _OVERRIDES[statement]
    for pattern, replacement in _TYPES:
        statement = pattern.sub(replacement, statement)
    return statement


# --- the connection -------------------------------------------------------------------------


class _Result:
    """A statement's result, for a statement sent in a batch (:class:`PgConnection`).

    Reading anything of it (``rowcount``, ``fetchone``, ``fetchall``, iteration,
    ``description``) first sends the batch it is in, so statements whose results nobody
    reads share the round trip of the next one that is read.
    """

    def __init__(self, conn: PgConnection) -> None:
        self._conn = conn
        self._ready = False
        self._rowcount = -1
        self._rows: list[Any] = []
        self._description: Any = None

    def _set(self, rowcount: int, rows: list[Any], description: Any) -> None:
        self._ready = True
        self._rowcount = rowcount
        self._rows = rows
        self._description = description

    def _wait(self) -> None:
        if not self._ready:
            self._conn.send_batch()

    @property
    def rowcount(self) -> int:
        self._wait()
        return self._rowcount

    @property
    def description(self) -> Any:
        self._wait()
        return self._description

    def fetchone(self) -> Any:
        self._wait()
        return self._rows.pop(0) if self._rows else None

    def fetchall(self) -> list[Any]:
        self._wait()
        rows, self._rows = self._rows, []
        return rows

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())


class PgConnection:
    """A psycopg connection that speaks the journal's SQL (``?`` placeholders).

    ``execute``/``executemany`` return cursors (``fetchone``, ``fetchall``, iteration,
    ``rowcount``, ``description``). Inside a write transaction (:meth:`begin_batch`)
    statements are bound on the client and batched: each is sent with the first later
    statement whose result is read (one round trip, the simple query protocol), so the
    statements nobody reads the result of (events, keys, ``BEGIN``) cost no round trip of
    their own. An error of a batched statement is raised by that read (or by ``COMMIT``);
    the transaction is rolled back either way.
    """

    def __init__(self, raw: psycopg.Connection[Any]) -> None:
        self.raw = raw
        self._client = psycopg.ClientCursor(raw)
        #: The cursor batches are sent with (their results are read at once).
        self._cursor = raw.cursor()
        #: The statements of the open batch (None: not batching) and their results.
        self._batch: list[tuple[bytes, list[_Result]]] | None = None
        #: The server-side checks of the open write transaction, by id (:meth:`expect`).
        self._checks: dict[str, Fail] = {}
        #: Whether nothing of the open write transaction was sent yet.
        self._unsent = False

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> Any:
        """Run one statement (``?`` placeholders)."""
        if self._batch is None:
            return self.raw.execute(pg_sql(sql), tuple(params or ()))
        result = _Result(self)
        self._batch.append((self._bind(sql, params), [result]))
        return result

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Any:
        """Run one statement once per row of parameters."""
        if self._batch is None:
            cur = self.raw.cursor()
            cur.executemany(pg_sql(sql), [tuple(r) for r in rows])
            return cur
        rows = [tuple(r) for r in rows]
        many = _multirow(sql)
        if many is not None and rows:  # one statement: INSERT … VALUES (…), (…), …
            head, values, tail = many
            results = []
            for start in range(0, len(rows), _ROWS_PER_INSERT):
                chunk = rows[start:start + _ROWS_PER_INSERT]
                text = head + ", ".join(values for _ in chunk) + tail
                result = _Result(self)
                self._batch.append((self._bind(text, [v for r in chunk for v in r]),
                                    [result]))
                results.append(result)
            return _Many(self, results)
        results = []
        for row in rows:
            result = _Result(self)
            self._batch.append((self._bind(sql, row), [result]))
            results.append(result)
        return _Many(self, results)

    def _bind(self, sql: str, params: Sequence[Any] | None) -> bytes:
        query = pg_sql(sql)
        return self._client.mogrify(query, tuple(params or ())).encode()

    def expect(self, condition: str, params: Sequence[Any], fail: Fail,
               detail: str = "NULL", detail_params: Sequence[Any] = ()) -> None:
        """Raise ``fail(detail value)`` unless the SQL ``condition`` holds.

        In a write transaction the check is made by the server (``planrun_expect``), in
        the batch's order: it costs no round trip, and a check that does not hold aborts
        the rest of the transaction (its ``COMMIT`` included) and is raised by the read
        that sent it. Outside one it is checked now.
        """
        sql = f"({condition}), ({detail})"
        args = (*params, *detail_params)
        if self._batch is None:
            row = self.execute(f"SELECT {sql}", args).fetchone()
            if not row[0]:
                raise fail(None if row[1] is None else str(row[1]))
            return
        check_id = self.check(fail)
        # The check's id is a parameter: the statement's text (and its cached
        # translation, pg_sql) stays the same in every transaction.
        self.execute(f"SELECT planrun_expect({condition}, ?, ({detail})::text)",
                     (*params, check_id, *detail_params))

    def expect_changed(self, sql: str, params: Sequence[Any], rows: int, fail: Fail) -> None:
        """Run ``sql`` (an UPDATE or DELETE); raise ``fail(None)`` unless it changed ``rows``.

        In a write transaction, checked by the server as :meth:`expect` is.
        """
        if self._batch is None:
            if self.execute(sql, params).rowcount != rows:
                raise fail(None)
            return
        check_id = self.check(fail)
        self.execute(f"WITH changed AS ({sql} RETURNING 1) SELECT planrun_expect("
                     "count(*) = ?, ?, NULL) FROM changed", (*params, rows, check_id))

    def check(self, fail: Fail) -> str:
        """Register a server-side check of the open write transaction; its id.

        A statement of the transaction that raises :data:`CHECK_FAILED` with this id as
        DETAIL (and the detail value as HINT) is raised as ``fail(hint or None)``.
        """
        check_id = str(len(self._checks) + 1)
        self._checks[check_id] = fail
        return check_id

    def begin_batch(self, statements: Sequence[str]) -> None:
        """Start batching, with ``statements`` (no parameters) first in the batch."""
        self._batch = [(s.encode(), [_Result(self)]) for s in statements]
        self._checks = {}
        self._unsent = True

    def send_batch(self) -> None:
        """Send the statements batched so far in one round trip; fill in their results.

        A whole transaction sent at once (``BEGIN`` … ``COMMIT`` in one batch) goes
        without its ``BEGIN`` and ``COMMIT``: the server runs the statements of one query
        message as one implicit transaction (committed at its end, as durably; rolled
        back, the rest skipped, at the first error), so they need not be sent.
        """
        if not self._batch:
            return
        batch, self._batch = self._batch, []
        if self._unsent and len(batch) > 2 and batch[0][0] == b"BEGIN" \
                and batch[-1][0] == b"COMMIT":
            for _text, results in (batch[0], batch[-1]):
                for result in results:
                    result._set(-1, [], None)
            batch = batch[1:-1]
        self._unsent = False
        try:
            cur = self._cursor.execute(b";\n".join(text for text, _ in batch))
        except psycopg.Error as exc:
            fail = self._checks.get(exc.diag.message_detail or "") \
                if exc.sqlstate == CHECK_FAILED else None
            if fail is None:
                raise
            raise fail(exc.diag.message_hint or None) from None
        for i, (_text, results) in enumerate(batch):
            if i:
                cur.nextset()
            description = cur.description  # (built anew at each reading)
            rows = cur.fetchall() if description is not None else []
            for result in results:
                result._set(cur.rowcount, rows, description)

    @property
    def batching(self) -> bool:
        """Whether a write transaction is open (its start may not be sent yet)."""
        return self._batch is not None

    def end_batch(self) -> None:
        """Stop batching (unsent statements are dropped: call after COMMIT or an error)."""
        self._batch = None
        self._checks = {}

    def script(self, sql: str) -> None:
        """Run statements without parameters in one round trip (simple query protocol)."""
        self.raw.execute(sql.encode())

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction is open (or failed and not rolled back yet)."""
        status = self.raw.info.transaction_status
        return status in (psycopg.pq.TransactionStatus.INTRANS,
                          psycopg.pq.TransactionStatus.INERROR)

    @property
    def broken(self) -> bool:
        """Whether the connection to the server is gone."""
        return bool(self.raw.broken or self.raw.closed)

    def rollback(self) -> None:
        """Roll back the open transaction, if the connection still works."""
        if not self.broken and self.in_transaction:
            with suppress(psycopg.Error):
                self.raw.execute(b"ROLLBACK")

    def close(self) -> None:
        """Close the connection (an open transaction is rolled back by the server)."""
        self.raw.close()


#: Rows per multi-row INSERT of a batched ``executemany``.
_ROWS_PER_INSERT = 500
_INSERT = re.compile(r"^(INSERT INTO \w+ \([^)]*\) VALUES )(\([^()]*\))((?: ON CONFLICT .*)?)$",
                     re.S)


@functools.lru_cache(maxsize=64)
def _multirow(sql: str) -> tuple[str, str, str] | None:
    """(head, one row's ``(?, …)``, tail) of a single-row ``INSERT … VALUES``, else None.

    An ``executemany`` of such a statement in a write transaction is sent as multi-row
    INSERTs (one statement per :data:`_ROWS_PER_INSERT` rows, not one per row).
    """
    match = _INSERT.match(sql)
    return None if match is None else (match.group(1), match.group(2), match.group(3))


class _Many:
    """The results of an ``executemany`` in a batch: ``rowcount`` is their sum.

    (One result per row, or per multi-row INSERT of :func:`_multirow`.)
    """

    def __init__(self, conn: PgConnection, results: list[_Result]) -> None:
        self._conn = conn
        self._results = results

    @property
    def rowcount(self) -> int:
        return sum(max(0, r.rowcount) for r in self._results)


# --- server-side writes ----------------------------------------------------------------------


#: (owner, epoch or None, what a lost lease raises) of a transaction's lease check, or
#: None: no check (no owner, or the run was checked already in this transaction).
Guard = tuple[str, int | None, Fail] | None

_FINISH = "SELECT planrun_finish(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_START = "SELECT planrun_start(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_CLAIM = "SELECT planrun_claim(?, ?, ?, ?, ?, ?, ?, ?)"


def _guard_args(conn: PgConnection, guard: Guard) -> tuple[Any, ...]:
    """(owner, epoch, check id) of ``planrun_guard``: all None for no check."""
    if guard is None:
        return (None, None, None)
    owner, epoch, lost = guard
    return (owner, epoch, conn.check(lost))


class PgCalls:
    """The journal's hot writes as calls of :data:`WRITE_FUNCTIONS` (one statement each).

    The journal (``journal.steps``, ``journal.dispatch``) uses these instead of its SQL
    when the backend has them (``backend.calls``); each writes what that SQL writes and
    makes the same checks, on the server: a check that does not hold raises its ``fail``
    (``LeaseLost`` for the lease, ``JournalError(message)`` for a record not in the
    expected state) and rolls the whole transaction back.
    """

    @staticmethod
    def finish(conn: PgConnection, run_id: str, guard: Guard, step_id: str,
               item: int | None, status: str, out_json: str | None, err_json: str | None,
               ts: str, facets_json: str | None, set_facets: bool,
               expected: Sequence[str], message: str, key: str | None, kind: str,
               data_json: str | None) -> None:
        """An outcome record (``step_finished``): status, output/error, key, event."""
        conn.execute(_FINISH, (
            run_id, *_guard_args(conn, guard), step_id, item, status, out_json, err_json, ts,
            set_facets, facets_json, ",".join(expected),  # statuses: never a comma
            conn.check(lambda _: JournalError(message)), key, kind, data_json))

    @staticmethod
    def start(conn: PgConnection, run_id: str, guard: Guard, step_id: str, item: int | None,
              attempt: int, key: str, ts: str, message: str, root_run_id: str,
              data_json: str) -> None:
        """A dispatch record (``step_started``): ``running``, its key claimed, its event."""
        conn.execute(_START, (
            run_id, *_guard_args(conn, guard), step_id, item, attempt, key, ts,
            conn.check(lambda _: JournalError(message)), root_run_id, data_json))

    @staticmethod
    def claim(conn: PgConnection, run_id: str, guard: Guard, step_id: str, root_run_id: str,
              claims: Sequence[tuple[int, int, str, str]], data_json: Sequence[str],
              message: str) -> None:
        """Items' dispatch records in one batch: (index, attempt, key, start time) each."""
        conn.execute(_CLAIM, (
            run_id, *_guard_args(conn, guard), step_id, root_run_id,
            json.dumps([[*claim, data] for claim, data in zip(claims, data_json, strict=True)],
                       separators=(",", ":")),
            conn.check(lambda _: JournalError(message))))


# --- errors ---------------------------------------------------------------------------------


def _login_password(location: str) -> bool:
    """Whether the URL gives the login password itself (user part, or ``password=``)."""
    try:
        parts = urlsplit(location)
    except ValueError:
        return False
    return bool(parts.password) or any(
        unquote(key) == "password" and value for key, value in parse_qsl(parts.query))


def _passwords(location: str) -> list[str]:
    """The secrets a URL carries (its user part's password, ``password=`` …), longest first."""
    from . import secret_parameter

    try:
        parts = urlsplit(location)
    except ValueError:
        return []
    found = [unquote(parts.password)] if parts.password else []
    found += [value for key, value in parse_qsl(parts.query)
              if value and secret_parameter(key, value)]
    return sorted(set(found), key=len, reverse=True)


def _lost(exc: BaseException, conn: PgConnection | None) -> bool:
    """Whether ``exc`` means the connection to the server is gone (class, SQLSTATE)."""
    if conn is not None and conn.broken:
        return True
    state = getattr(exc, "sqlstate", None) or ""
    return state.startswith("08") or state in ("57P01", "57P02", "57P03")


def _fail(location: str, exc: BaseException, doing: str,
          conn: PgConnection | None = None) -> JournalError:
    shown = shown_location(location)
    text = " ".join(str(exc).split())
    for secret in _passwords(location):
        text = text.replace(secret, "***")
    state = getattr(exc, "sqlstate", None)
    if doing == "connect":
        return JournalError(
            f"cannot connect to the PostgreSQL journal {shown}: {text}",
            hint="Check that the server runs and accepts connections, the user and its "
            "password (the URL, PGPASSWORD or ~/.pgpass), and that the database exists "
            "(createdb).")
    if _lost(exc, conn):
        return JournalError(
            f"lost the connection to the PostgreSQL journal {shown} while trying to "
            f"{doing} it: {text}",
            hint="What was committed is kept: run the command again once the server is "
            "back.")
    if state == "55P03":  # lock_not_available: lock_timeout ran out
        return JournalError(
            f"the PostgreSQL journal {shown} stayed busy (another process held its write "
            f"lock for {LOCK_TIMEOUT})", hint="Try again; look for a stuck planrun process.")
    if state is not None and state.startswith("42"):
        return JournalError(
            f"the PostgreSQL database {shown} is not a planrun journal of this version "
            f"({state}: {text})",
            hint="Give --journal a database of its own for planrun.")
    code = f"{state}: " if state else ""
    return JournalError(f"cannot {doing} the PostgreSQL journal {shown}: {code}{text}",
                        hint="Check the server's log; what was committed is kept.")


# --- schema ---------------------------------------------------------------------------------


def _has_table(conn: PgConnection, name: str) -> bool:
    """Whether the current schema has the table ``name``.

    Read from ``pg_tables`` with this statement's snapshot (``to_regclass`` may answer
    from a cache that predates another process's migration).
    """
    row = conn.execute("SELECT count(*) FROM pg_catalog.pg_tables "
                       "WHERE schemaname = current_schema() AND tablename = ?",
                       (name,)).fetchone()
    return bool(row and row[0])


def _version(conn: PgConnection) -> int | None:
    """The schema version, or None for a database planrun has not set up."""
    return _state(conn)[0]


def _state(conn: PgConnection) -> tuple[int | None, int]:
    """(the schema version or None, the version of its server-side functions): what is set up.

    The functions' version is 0 without ``planrun_expect``, 1 with it alone, else the one
    in the comment of ``planrun_begin()`` (:data:`FUNCTIONS_VERSION`).
    """
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = "
        "current_schema() AND tablename = 'planrun_schema'), (SELECT max(CASE WHEN "
        "p.proname = 'planrun_expect' THEN 1 ELSE COALESCE(substring(pg_catalog."
        "obj_description(p.oid, 'pg_proc') FROM '^planrun write functions ([0-9]+)$')::int, "
        "0) END) FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = "
        "p.pronamespace WHERE n.nspname = current_schema() AND p.proname IN "
        "('planrun_expect', 'planrun_begin'))").fetchone()
    functions = int(row[1] or 0)
    if not row[0]:
        return None, functions
    version = conn.execute("SELECT max(version) FROM planrun_schema").fetchone()
    return (int(version[0]) if version and version[0] is not None else 0), functions


def _refuse_foreign(conn: PgConnection, location: str) -> None:
    """Refuse a database planrun has not set up that has a table named like its ``runs``.

    Raises:
        JournalError: exit 6.
    """
    if _has_table(conn, "runs"):
        raise JournalError(
            f"the database {shown_location(location)} has a table 'runs' but is "
            "not a planrun journal",
            hint="Give --journal a database of its own for planrun.")


def _check_version(location: str, version: int | None) -> None:
    if version is not None and version > SCHEMA_VERSION:
        raise JournalError(
            f"the journal {shown_location(location)} has schema version {version}, newer "
            f"than this planrun understands ({SCHEMA_VERSION})",
            hint="Upgrade planrun, or use another journal with --journal.")


def migrate(conn: PgConnection, location: str) -> None:
    """Bring the schema to :data:`SCHEMA_VERSION` in one transaction, under an advisory lock.

    Also creates the server-side functions of write transactions, ``planrun_expect``
    (:data:`EXPECT_FUNCTION`) and :data:`WRITE_FUNCTIONS`, unless the journal has these or
    newer ones (a newer planrun's, which these never replace): PostgreSQL only, so they
    have a version of their own (:data:`FUNCTIONS_VERSION`), not a schema version.

    Raises:
        JournalError: a newer schema, or a database with other tables named like
            planrun's (exit 6).
    """
    conn.script(f"BEGIN; SELECT pg_advisory_xact_lock({MIGRATE_LOCK})")
    try:
        version, functions = _state(conn)  # another process may have migrated meanwhile
        _check_version(location, version)
        if version is None:
            _refuse_foreign(conn, location)
            conn.execute("CREATE TABLE planrun_schema (version BIGINT NOT NULL)")
            conn.execute("INSERT INTO planrun_schema (version) VALUES (0)")
            version = 0
        while version < SCHEMA_VERSION:
            for statement in MIGRATIONS[version]:
                conn.execute(pg_statement(statement))
            version += 1
        conn.execute("UPDATE planrun_schema SET version = ?", (version,))
        if functions < FUNCTIONS_VERSION:
            conn.script(EXPECT_FUNCTION)
            conn.script(WRITE_FUNCTIONS)
        conn.script("COMMIT")
    except BaseException:
        conn.rollback()
        raise


# --- the backend ----------------------------------------------------------------------------


class PostgresBackend:
    """The PostgreSQL backend of :class:`planrun.journal.Journal` (one database).

    Args:
        location: the ``postgresql://`` (or ``postgres://``) URL, as libpq reads it
            (``host=`` may name a Unix socket folder; ``PGPASSWORD``, ``~/.pgpass`` and
            ``PGSERVICE`` work as for ``psql``).
    """

    name: ClassVar[str] = "postgresql"
    Error: tuple[type[BaseException], ...] = (psycopg.Error,)
    DatabaseError: tuple[type[BaseException], ...] = (psycopg.Error,)
    OperationalError: tuple[type[BaseException], ...] = (psycopg.OperationalError,)
    #: The database clock in seconds since the epoch.
    NOW_SQL: ClassVar[str] = "(EXTRACT(EPOCH FROM clock_timestamp())::double precision)"
    #: Fan-out items that start together are claimed in one batch (``journal.dispatch``).
    BATCH_CLAIMS: ClassVar[bool] = True
    #: The end of the SELECT that locks the items a batch claims: a row another
    #: transaction holds is skipped, never waited for nor claimed twice.
    CLAIM_SQL: ClassVar[str] = " FOR UPDATE SKIP LOCKED"

    def __init__(self, location: str) -> None:
        self.location = location
        self._conn: PgConnection | None = None
        #: The server-side writes (:class:`PgCalls`), once :meth:`open` found them.
        self.calls: PgCalls | None = None

    def _connect(self) -> PgConnection:
        extra: dict[str, Any] = {}
        query = urlsplit(self.location).query
        if "connect_timeout" not in query:
            extra["connect_timeout"] = CONNECT_TIMEOUT_S
        if "application_name" not in query:
            extra["application_name"] = "planrun"
        if "PGPASSWORD" not in os.environ and not _login_password(self.location):
            # kept from children while they may start (planrun.childenv.hidden): libpq
            # gets it as it would have read it
            kept = childenv.getenv("PGPASSWORD")
            if kept:
                extra["password"] = kept
        try:
            raw = psycopg.connect(self.location, autocommit=True, prepare_threshold=None,
                                  **extra)
        except psycopg.Error as exc:
            raise _fail(self.location, exc, "connect") from None
        conn = PgConnection(raw)
        self._conn = conn
        return conn

    def open(self, *, write: bool) -> PgConnection | None:
        """A connection (the schema migrated), or None: planrun has not set it up yet.

        Raises:
            JournalError: cannot connect, newer schema, not a planrun journal (exit 6).
        """
        conn = self._connect()
        try:
            version, functions = _state(conn)
            _check_version(self.location, version)
            if version is None and not write:
                # read as empty only when it is not another application's (reads had
                # called a database with its own `runs` table "no runs"; writes refuse it)
                _refuse_foreign(conn, self.location)
                conn.close()
                return None
            if version != SCHEMA_VERSION or (write and functions < FUNCTIONS_VERSION):
                migrate(conn, self.location)
                functions = FUNCTIONS_VERSION
        except JournalError:
            conn.close()
            raise
        except psycopg.Error as exc:
            error = _fail(self.location, exc, "set up", conn)
            conn.close()
            raise error from None
        # A journal opened for reading may have older functions: its writes (if any) are
        # made with the journal's SQL.
        self.calls = PgCalls() if functions >= FUNCTIONS_VERSION else None
        return conn

    @contextmanager
    def transaction(self, conn: PgConnection) -> Iterator[PgConnection]:
        """One write transaction, serialized with every other writer of this journal.

        Rolled back on any error, also when ``COMMIT`` itself fails.
        """
        conn.begin_batch(_BEGIN_WRITE if self.calls is None else _BEGIN_CALL)
        try:
            yield conn
            conn.execute("COMMIT")
            conn.send_batch()
        except BaseException:
            conn.end_batch()
            conn.rollback()
            raise
        finally:
            conn.end_batch()

    @contextmanager
    def snapshot(self, conn: PgConnection) -> Iterator[PgConnection]:
        """A read-only snapshot (``REPEATABLE READ``); inside a transaction, that one."""
        if conn.in_transaction or conn.batching:
            yield conn
            return
        conn.script("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        try:
            yield conn
        finally:
            if conn.in_transaction:
                with suppress(psycopg.Error):
                    conn.script("COMMIT")

    def fail(self, exc: BaseException, doing: str) -> JournalError:
        """The :class:`JournalError` (exit 6) for a database error while ``doing``."""
        return _fail(self.location, exc, doing, self._conn)

    @staticmethod
    def expect(conn: PgConnection, condition: str, params: Sequence[Any], fail: Fail,
               detail: str = "NULL", detail_params: Sequence[Any] = ()) -> None:
        """:meth:`PgConnection.expect`: checked on the server inside a write transaction."""
        conn.expect(condition, params, fail, detail, detail_params)

    @staticmethod
    def expect_changed(conn: PgConnection, sql: str, params: Sequence[Any], rows: int,
                       fail: Fail) -> None:
        """:meth:`PgConnection.expect_changed`: checked on the server in a transaction."""
        conn.expect_changed(sql, params, rows, fail)

    @staticmethod
    def json_array(column: str) -> str:
        """SQL: the JSON array of ``column`` (compact JSON texts), in the subquery's order."""
        return f"'[' || COALESCE(string_agg(COALESCE({column}, 'null'), ','), '') || ']'"

    @staticmethod
    def text_bytes(column: str) -> str:
        """SQL: the length in bytes of ``column``'s text (in the database's encoding)."""
        return f"octet_length({column})"

    def vacuum(self, conn: PgConnection, *, rewrite: bool = False) -> dict[str, int]:
        """Nothing: the server's autovacuum makes freed space reusable (``rewrite`` too).

        A ``VACUUM FULL`` would lock each table against every host's runs for as long as
        it takes; a database administrator's job, not a journal command's (decided here).
        """
        return {"reclaimed_bytes": 0, "free_bytes": 0}
