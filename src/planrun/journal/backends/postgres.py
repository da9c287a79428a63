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
  multi-row INSERTs.
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
import re
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any, ClassVar
from urllib.parse import parse_qsl, unquote, urlsplit

import psycopg

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
#: the journal's write lock.
_BEGIN_WRITE = ("BEGIN", f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'",
                f"SET LOCAL idle_in_transaction_session_timeout = '{IDLE_TIMEOUT}'",
                f"SELECT pg_advisory_xact_lock({WRITE_LOCK})")


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
        #: The statements of the open batch (None: not batching) and their results.
        self._batch: list[tuple[bytes, list[_Result]]] | None = None
        #: The server-side checks of the open write transaction, by id (:meth:`expect`).
        self._checks: dict[str, Fail] = {}

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
        check_id = str(len(self._checks) + 1)
        self._checks[check_id] = fail
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
        check_id = str(len(self._checks) + 1)
        self._checks[check_id] = fail
        self.execute(f"WITH changed AS ({sql} RETURNING 1) SELECT planrun_expect("
                     "count(*) = ?, ?, NULL) FROM changed", (*params, rows, check_id))

    def begin_batch(self, statements: Sequence[str]) -> None:
        """Start batching, with ``statements`` (no parameters) first in the batch."""
        self._batch = [(s.encode(), [_Result(self)]) for s in statements]
        self._checks = {}

    def send_batch(self) -> None:
        """Send the statements batched so far in one round trip; fill in their results."""
        if not self._batch:
            return
        batch, self._batch = self._batch, []
        try:
            cur = self.raw.execute(b";\n".join(text for text, _ in batch))
        except psycopg.Error as exc:
            fail = self._checks.get(exc.diag.message_detail or "") \
                if exc.sqlstate == CHECK_FAILED else None
            if fail is None:
                raise
            raise fail(exc.diag.message_hint or None) from None
        for i, (_text, results) in enumerate(batch):
            if i:
                cur.nextset()
            rows = cur.fetchall() if cur.description is not None else []
            for result in results:
                result._set(cur.rowcount, rows, cur.description)

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


# --- errors ---------------------------------------------------------------------------------


def _password(location: str) -> str | None:
    """The password a URL carries (in its user part or as ``password=``), if any."""
    try:
        parts = urlsplit(location)
    except ValueError:
        return None
    if parts.password:
        return unquote(parts.password)
    for key, value in parse_qsl(parts.query):
        if key == "password" and value:
            return value
    return None


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
    secret = _password(location)
    if secret:
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
            hint="What was committed is kept: once the server is back, `planrun resume` "
            "continues the run.")
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


def _state(conn: PgConnection) -> tuple[int | None, bool]:
    """(the schema version or None, whether ``planrun_expect`` exists): what is set up."""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = "
        "current_schema() AND tablename = 'planrun_schema'), EXISTS (SELECT 1 FROM "
        "pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = current_schema() AND p.proname = 'planrun_expect')").fetchone()
    if not row[0]:
        return None, bool(row[1])
    version = conn.execute("SELECT max(version) FROM planrun_schema").fetchone()
    return (int(version[0]) if version and version[0] is not None else 0), bool(row[1])


def _check_version(location: str, version: int | None) -> None:
    if version is not None and version > SCHEMA_VERSION:
        raise JournalError(
            f"the journal {shown_location(location)} has schema version {version}, newer "
            f"than this planrun understands ({SCHEMA_VERSION})",
            hint="Upgrade planrun, or use another journal with --journal.")


def migrate(conn: PgConnection, location: str) -> None:
    """Bring the schema to :data:`SCHEMA_VERSION` in one transaction, under an advisory lock.

    Also (re)creates ``planrun_expect`` (:data:`EXPECT_FUNCTION`), the server-side check
    of write transactions: PostgreSQL only, so it has no schema version of its own.

    Raises:
        JournalError: a newer schema, or a database with other tables named like
            planrun's (exit 6).
    """
    conn.script(f"BEGIN; SELECT pg_advisory_xact_lock({MIGRATE_LOCK})")
    try:
        version = _version(conn)  # another process may have migrated meanwhile
        _check_version(location, version)
        if version is None:
            if _has_table(conn, "runs"):
                raise JournalError(
                    f"the database {shown_location(location)} has a table 'runs' but is "
                    "not a planrun journal",
                    hint="Give --journal a database of its own for planrun.")
            conn.execute("CREATE TABLE planrun_schema (version BIGINT NOT NULL)")
            conn.execute("INSERT INTO planrun_schema (version) VALUES (0)")
            version = 0
        while version < SCHEMA_VERSION:
            for statement in MIGRATIONS[version]:
                conn.execute(pg_statement(statement))
            version += 1
        conn.execute("UPDATE planrun_schema SET version = ?", (version,))
        conn.script(EXPECT_FUNCTION)
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

    def _connect(self) -> PgConnection:
        extra: dict[str, Any] = {}
        query = urlsplit(self.location).query
        if "connect_timeout" not in query:
            extra["connect_timeout"] = CONNECT_TIMEOUT_S
        if "application_name" not in query:
            extra["application_name"] = "planrun"
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
            version, has_expect = _state(conn)
            _check_version(self.location, version)
            if version is None and not write:
                conn.close()
                return None
            if version != SCHEMA_VERSION or (write and not has_expect):
                migrate(conn, self.location)
        except JournalError:
            conn.close()
            raise
        except psycopg.Error as exc:
            error = _fail(self.location, exc, "set up", conn)
            conn.close()
            raise error from None
        return conn

    @contextmanager
    def transaction(self, conn: PgConnection) -> Iterator[PgConnection]:
        """One write transaction, serialized with every other writer of this journal.

        Rolled back on any error, also when ``COMMIT`` itself fails.
        """
        conn.begin_batch(_BEGIN_WRITE)
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

    def vacuum(self, conn: PgConnection) -> None:
        """Nothing: the server's autovacuum gives freed space back."""
