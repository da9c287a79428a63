"""Journal backends: where the journal's rules meet one database (SPEC §11).

The rules (statuses, events, leases, keys; ``planrun.journal``) are written once. A backend
supplies what differs between databases:

- ``open(write=...)``: a connection (created and migrated for writing), or None for a
  journal that does not exist yet (reads see it empty);
- ``transaction(conn)``: one write transaction, rolled back on any error, also when the
  commit itself fails; ``snapshot(conn)``: a read-only, consistent view;
- ``fail(exc, doing)``: a database error as a :class:`~planrun.errors.JournalError`
  (exit 6), classified by exception type and result code, never by message text;
- ``Error``/``DatabaseError``/``OperationalError``: the driver's exception types;
- checks of a write transaction: ``expect(conn, condition, params, fail, detail, ...)``
  (a SQL condition that must hold) and ``expect_changed(conn, sql, params, rows, fail)``
  (a statement that must change exactly ``rows`` rows); when one does not hold, ``fail``
  (given the ``detail`` value, or None) makes the exception raised and the transaction
  is rolled back. SQLite checks at once; PostgreSQL checks on the server, so that a
  transaction is one round trip (``planrun_expect``);
- fan-out claims: ``BATCH_CLAIMS`` (items that start together are claimed in one batch
  of statements: PostgreSQL, where a statement costs its share of a round trip; SQLite
  writes each item's record on its own, its fastest path) and ``CLAIM_SQL`` (the end of
  the ``SELECT`` that locks the rows claimed: ``FOR UPDATE SKIP LOCKED``);
- ``calls``: the hot writes (outcome and dispatch records, batch claims) as server-side
  calls (:class:`WriteCalls`; PostgreSQL, once its functions exist), or None: the
  journal's SQL (SQLite);
- SQL fragments: ``NOW_SQL`` (the database clock, seconds since the epoch; leases use
  it), ``json_array(column)`` (a JSON array aggregate), ``text_bytes(column)`` (a text's
  length in bytes), ``vacuum(conn, rewrite=)``;
- its migrations (``planrun.journal.schema`` for SQLite).

SQLite (:mod:`.sqlite`) for a file path (or ``sqlite://PATH``); PostgreSQL
(:mod:`.postgres`, psycopg 3, imported only then) for a ``postgresql://`` or
``postgres://`` URL; a URL of another scheme is refused with one message
(:func:`open_backend`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, ClassVar, Protocol
from urllib.parse import unquote

from ...errors import JournalError

#: Makes the exception for a check of a write transaction that does not hold, given the
#: check's detail value (text, or None).
Fail = Callable[[str | None], BaseException]

#: URL schemes of journal locations this planrun understands (a plain path is SQLite).
SCHEMES = ("sqlite", "postgresql", "postgres")


class WriteCalls(Protocol):
    """The journal's hot writes as server-side calls (``backend.calls``; PostgreSQL).

    Each writes what the journal's SQL for it writes (``journal.steps``,
    ``journal.dispatch``) and makes the same checks: ``guard`` is the lease check
    (owner, epoch or None, what a lost lease raises) or None for none; a record not in
    the expected state raises ``JournalError(message)``; either rolls the transaction back.
    """

    def finish(self, conn: Any, run_id: str, guard: tuple[str, int | None, Fail] | None,
               step_id: str, item: int | None, status: str, out_json: str | None,
               err_json: str | None, ts: str, facets_json: str | None, set_facets: bool,
               expected: Sequence[str], message: str, key: str | None, kind: str,
               data_json: str | None) -> None:
        """An outcome record, its key (succeeded: output kept; failed: released), event."""

    def start(self, conn: Any, run_id: str, guard: tuple[str, int | None, Fail] | None,
              step_id: str, item: int | None, attempt: int, key: str, ts: str,
              message: str, root_run_id: str, data_json: str) -> None:
        """A dispatch record (``running``), its key claimed, its ``step_started`` event."""

    def claim(self, conn: Any, run_id: str, guard: tuple[str, int | None, Fail] | None,
              step_id: str, root_run_id: str, claims: Sequence[tuple[int, int, str, str]],
              data_json: Sequence[str], message: str) -> None:
        """Items' dispatch records in one batch: (index, attempt, key, start time) each."""


class JournalBackend(Protocol):
    """What :class:`planrun.journal.Journal` needs of a database (see the module doc)."""

    name: ClassVar[str]
    Error: tuple[type[BaseException], ...]
    DatabaseError: tuple[type[BaseException], ...]
    OperationalError: tuple[type[BaseException], ...]
    NOW_SQL: ClassVar[str]
    BATCH_CLAIMS: ClassVar[bool]
    CLAIM_SQL: ClassVar[str]

    @property
    def calls(self) -> WriteCalls | None:
        """The hot writes as server-side calls, or None: the journal's own SQL."""

    def open(self, *, write: bool) -> Any:
        """A connection, or None (a journal not created yet; reads only)."""

    def transaction(self, conn: Any) -> AbstractContextManager[Any]:
        """One write transaction."""

    def snapshot(self, conn: Any) -> AbstractContextManager[Any]:
        """A read-only snapshot."""

    def fail(self, exc: BaseException, doing: str) -> JournalError:
        """A database error as a JournalError (exit 6)."""

    def expect(self, conn: Any, condition: str, params: Sequence[Any], fail: Fail,
               detail: str = "NULL", detail_params: Sequence[Any] = ()) -> None:
        """Raise ``fail(detail value)`` (rolling the transaction back) unless ``condition``."""

    def expect_changed(self, conn: Any, sql: str, params: Sequence[Any], rows: int,
                       fail: Fail) -> None:
        """Run ``sql`` (UPDATE/DELETE); raise ``fail(None)`` unless it changed ``rows`` rows."""

    def json_array(self, column: str) -> str:
        """SQL: the JSON array aggregate of a column of JSON texts."""

    def text_bytes(self, column: str) -> str:
        """SQL: the length in bytes (UTF-8) of a text column's value (NULL for NULL)."""

    def vacuum(self, conn: Any, *, rewrite: bool = False) -> dict[str, int]:
        """Give freed space back, when the database does that on request.

        ``rewrite``: by rewriting the whole database (``prune --vacuum``), where that is
        how it is done. Returns ``{"reclaimed_bytes", "free_bytes"}``: how much smaller
        the database is now, and how much is free inside it still (reused by later
        writes), in bytes; 0 and 0 where the server does it on its own.
        """


#: libpq connection parameters whose value is a secret: the server's password and the
#: password of the SSL client key (``sslpassword=`` was shown in clear, and a URL with
#: it reached tools whole; found by an attacker).
SECRET_PARAMETERS = frozenset({"password", "sslpassword"})


def secret_parameter(key: str, value: str) -> bool:
    """Whether a URL query parameter (``key``, ``value`` as written) holds a secret.

    libpq decodes a parameter's name (``pass%77ord=`` is a password), and takes a
    ``dbname`` that holds ``=`` or a URL scheme as a whole connection string, which may
    carry a password of its own: such a ``dbname`` is a secret too.
    """
    name = unquote(key)
    if name in SECRET_PARAMETERS:
        return True
    return name == "dbname" and ("=" in unquote(value) or "://" in unquote(value))


def shown_location(location: str | Path) -> str:
    """A journal location for messages: a URL's password is never shown.

    Neither in its user part (``user:***@host``) nor as a ``password=`` (or
    ``sslpassword=``) parameter, also one whose name is percent-encoded (``pass%77ord=``:
    libpq decodes parameter names, found by an attacker); see :func:`secret_parameter`.
    """
    text = str(location)
    scheme, sep, rest = text.partition("://")
    if not sep:
        return text
    rest, q, query = rest.partition("?")
    auth, at, host = rest.rpartition("@")
    if at and ":" in auth:
        auth = auth.split(":", 1)[0] + ":***"
    if q:
        pairs = [pair.partition("=") for pair in query.split("&")]
        query = "&".join(f"{key}{eq}***" if eq and secret_parameter(key, value)
                         else f"{key}{eq}{value}" for key, eq, value in pairs)
    return f"{scheme}://{auth}{at}{host}{q}{query}"


def open_backend(location: str | Path) -> JournalBackend:
    """The backend for a journal location: a file path (SQLite) or a URL.

    Raises:
        JournalError: a URL whose scheme this planrun has no backend for (exit 6).
    """
    from .sqlite import SqliteBackend

    if isinstance(location, Path):
        return SqliteBackend(location)
    scheme, sep, rest = location.partition("://")
    if not sep:
        return SqliteBackend(Path(location))
    if scheme.lower() == "sqlite":
        return SqliteBackend(Path(rest))
    if scheme.lower() in ("postgresql", "postgres"):
        try:
            from .postgres import PostgresBackend
        except ImportError:
            raise JournalError(
                f"the journal {shown_location(location)} is on PostgreSQL, which needs "
                "psycopg 3; it is not installed",
                hint="Install planrun's PostgreSQL extra: pip install 'planrun[postgres]'."
            ) from None
        return PostgresBackend(location)
    raise JournalError(
        f"the journal {shown_location(location)} is a {scheme}:// URL; this planrun "
        "journals to SQLite files and PostgreSQL (postgresql://) databases",
        hint="Give --journal (or PLANRUN_JOURNAL, or journal = in planrun.toml) a file "
        "path or a postgresql:// URL.")
