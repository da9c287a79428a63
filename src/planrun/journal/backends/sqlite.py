"""The SQLite journal backend: pragmas, transactions, snapshots, migrations (SPEC §7, §11).

This module is the only code that imports :mod:`sqlite3` (the journal's rules, written once
for every backend, are in ``planrun.journal``; :class:`SqliteBackend` supplies what differs:
connections, transactions, a read-only snapshot, a few SQL fragments, migrations, and the
classification of database errors). Every connection runs in
autocommit mode (``isolation_level=None``) and writes only inside :func:`atomic`, which
starts with ``BEGIN IMMEDIATE`` (the write lock is taken up front, so a busy journal waits
``busy_timeout`` instead of failing half-way) and rolls back on any exception.
Pragmas: WAL, ``synchronous=FULL`` (a committed record survives power loss),
``foreign_keys=ON``, ``busy_timeout`` 30 s; a journal file made by this planrun has
``auto_vacuum=INCREMENTAL`` (prune gives freed space back in pieces).

A journal file planrun creates is readable by its owner only (0600; SQLite gives its
``-wal`` and ``-shm`` files the same mode), and so are the folders it creates for it (0700)
and the ``.setup-lock`` file (SPEC §7): a journal holds what tools returned.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, ClassVar

from ...errors import JournalError
from ...paths import probe
from ..schema import MIGRATIONS, SCHEMA_VERSION
from . import Fail

#: How long a writer waits for another process's transaction, in milliseconds.
BUSY_TIMEOUT_MS = 30_000


#: SQLite primary result codes that mean "this file is not a (sound) database".
_CORRUPT_CODES = (11, 26)  # SQLITE_CORRUPT, SQLITE_NOTADB
_IOERR, _FULL = 10, 13  # SQLITE_IOERR, SQLITE_FULL (primary result codes)
#: Bytes of an SQLite database file's header: a file shorter is none (SQLite reads it as
#: an empty database).
_SQLITE_HEADER = 100


def _is_corrupt(exc: BaseException) -> bool:
    """Whether ``exc`` says the file is corrupt or not a database (by result code)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.DatabaseError) and isinstance(code, int) and (
        code & 0xFF) in _CORRUPT_CODES


def _fail(path: Path, exc: BaseException, doing: str) -> JournalError:
    """The :class:`JournalError` (exit 6) of ``exc``, with the fix its cause asks for.

    A journal that cannot be written (its disk full, an I/O error, no permission) is
    fixed where it is: another journal (``--journal``) would not hold the runs it has, so
    that is offered only for one that cannot be opened at all (found by a fresh operator
    whose journal's disk filled up mid-run).
    """
    text = str(exc)
    if _is_corrupt(exc):
        return JournalError(f"the journal {path} is corrupt or not a planrun journal ({text})",
                            hint="Move it aside and start a new journal with --journal.")
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    if primary == _FULL:
        hint = f"Free space on the disk that holds {path}."
    elif primary == _IOERR:
        hint = (f"Check the disk that holds {path}: its free space, and errors in the "
                "system's log.")
    elif doing in ("open", "create", "create the folder of"):
        hint = "Check the path and its permissions, or choose another with --journal."
    elif doing == "read":
        hint = f"Check that {path} can be read."
    else:
        hint = f"Check that {path} and its folder can be written."
    return JournalError(f"cannot {doing} the journal {path}: {text}", hint=hint)


def _is_dir(path: Path) -> JournalError:
    return JournalError(f"the journal path {path} is a directory, not a file",
                        hint="Give --journal (or PLANRUN_JOURNAL) a file path, e.g. "
                        f"{path / 'journal.sqlite3'}.")


def _not_a_file(path: Path) -> JournalError:
    return JournalError(f"the journal path {path} is not a regular file (a FIFO, a device "
                        "or a socket)", hint="Give --journal (or PLANRUN_JOURNAL) a file path.")


@contextmanager
def atomic(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction: ``BEGIN IMMEDIATE`` … ``COMMIT``, rolled back on any error.

    Also when ``COMMIT`` itself fails (e.g. disk full, I/O error): the transaction is
    rolled back so that the connection is usable again and no half-state lingers.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            with suppress(sqlite3.Error):
                conn.rollback()
        raise


@contextmanager
def snapshot(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """A read-only snapshot: the reads inside see one state of the journal.

    A deferred ``BEGIN`` (a read transaction in WAL mode); inside a transaction already
    open, that transaction is the snapshot.
    """
    if conn.in_transaction:
        yield conn
        return
    conn.execute("BEGIN")
    try:
        yield conn
    finally:
        if conn.in_transaction:
            with suppress(sqlite3.Error):
                conn.execute("COMMIT")


#: Free pages given back to the disk in one write transaction (:meth:`SqliteBackend.vacuum`):
#: 1,024 pages of 4 KiB, 4 MiB, about 0.1 to 0.2 s of another writer's wait.
RECLAIM_PAGES = 1024


def _pragmas(conn: sqlite3.Connection) -> None:
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA synchronous = FULL")


def _version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def _check_version(path: Path, version: int) -> None:
    if version > SCHEMA_VERSION:
        raise JournalError(
            f"the journal {path} has schema version {version}, newer than this planrun "
            f"understands ({SCHEMA_VERSION})",
            hint="Upgrade planrun, or use another journal with --journal.")


def _refuse_foreign(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse a file at schema version 0 that is not an empty journal.

    Another application's database (it has tables), or a file too short to be any SQLite
    database, which SQLite itself reads as empty (a journal truncated to 50 bytes).
    Reads and writes say the same: reads had called both "no runs" (exit 0; found by an
    attacker).

    Raises:
        JournalError: exit 6.
    """
    try:
        tables = conn.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'"
                              ).fetchone()[0]
    except sqlite3.Error as exc:
        raise _fail(path, exc, "read") from None
    if tables:
        raise JournalError(f"{path} is an SQLite database but not a planrun journal",
                           hint="Give --journal a new file or an existing planrun journal.")
    with suppress(OSError):
        size = path.stat().st_size
        if 0 < size < _SQLITE_HEADER:
            raise JournalError(f"the journal {path} is corrupt or not a planrun journal "
                               f"({size} bytes: shorter than any SQLite database)",
                               hint="Move it aside and start a new journal with --journal.")


def migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Bring the schema to :data:`SCHEMA_VERSION` (forward only, one transaction each)."""
    version = _version(conn)
    _check_version(path, version)
    if version == 0:
        _refuse_foreign(conn, path)
    while version < SCHEMA_VERSION:
        with atomic(conn):
            version = _version(conn)  # another process may have migrated meanwhile
            if version >= SCHEMA_VERSION:
                break
            for statement in MIGRATIONS[version]:
                conn.execute(statement)
            version += 1
            conn.execute(f"PRAGMA user_version = {version}")


def open_write(path: Path) -> sqlite3.Connection:
    """Open (creating if needed) and migrate the journal for writing.

    Raises:
        JournalError: cannot create/open/write, corrupt, or newer schema (exit 6).
    """
    if probe(path, "is_dir"):
        raise _is_dir(path)
    if probe(path) and not probe(path, "is_file"):
        raise _not_a_file(path)
    try:
        _make_folder(path.parent)
    except OSError as exc:
        raise _fail(path, exc, "create the folder of") from None
    try:
        if not path.exists():
            _create_private(path)
    except OSError as exc:
        raise _fail(path, exc, "create") from None
    try:
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                               check_same_thread=False)
    except sqlite3.Error as exc:
        raise _fail(path, exc, "open") from None
    try:
        _pragmas(conn)
        ready = (str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal"
                 and _version(conn) == SCHEMA_VERSION)
        if not ready:
            # Switching to WAL and migrating need the database to themselves; SQLite may
            # answer "database is locked" to a second process doing the same at once
            # without waiting, so processes set a journal up one at a time.
            with _setup_lock(path):
                if not conn.execute("PRAGMA page_count").fetchone()[0]:
                    # a new file: before its first page, so that prune can give freed
                    # space back in pieces (SqliteBackend.vacuum)
                    conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise sqlite3.OperationalError(f"cannot switch to WAL (mode {mode})")
                migrate(conn, path)
        else:
            _check_version(path, _version(conn))
    except JournalError:
        conn.close()
        raise
    except sqlite3.Error as exc:
        conn.close()
        raise _fail(path, exc, "write") from None
    return conn


def _make_folder(folder: Path) -> None:
    """Create ``folder`` and its missing parents, each readable by its owner only (0700)."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        if folder.parent == folder:
            break
        folder = folder.parent
    for d in reversed(missing):
        with suppress(FileExistsError):  # another process was quicker
            d.mkdir(mode=0o700)


def _create_private(path: Path) -> None:
    """Create an empty file (an empty SQLite database) with mode 0600, if it is new."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process was quicker: its file, its mode
        return
    os.close(fd)


@contextmanager
def _setup_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``<journal>.setup-lock`` (POSIX ``flock``).

    Held while a journal is switched to WAL and migrated.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: rely on SQLite's own locking
        yield
        return
    lock = path.with_name(path.name + ".setup-lock")
    with open(os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def open_read(path: Path) -> sqlite3.Connection | None:
    """Open the journal read-only; None when it does not exist yet (reads see it empty).

    Never creates it; an older journal is migrated first when this user may write it.

    Raises:
        JournalError: unreadable, corrupt, or newer schema (exit 6).
    """
    if not probe(path):
        return None
    if probe(path, "is_dir"):
        raise _is_dir(path)
    if not probe(path, "is_file"):  # a FIFO would be waited on, a device read as empty
        raise _not_a_file(path)
    try:
        conn = _connect_ro(path, "mode=ro")
        version = _version(conn)
    except sqlite3.Error as exc:
        if not _read_only_storage(path):
            raise _fail(path, exc, "read") from None
        try:
            conn = _open_on_read_only_storage(path)
            version = _version(conn)
        except (sqlite3.Error, OSError) as again:
            raise _fail(path, again, "read") from None
    _check_version(path, version)
    if version == 0:
        try:
            _refuse_foreign(conn, path)
        finally:
            conn.close()
        return None
    if version < SCHEMA_VERSION:
        conn.close()
        # An older journal: bring it forward once when this user may write it (the
        # migrations only add), so that upgrading planrun does not break `planrun runs`;
        # a journal it may not write stays as it is and is refused.
        if os.access(path, os.W_OK) and os.access(path.parent, os.W_OK):
            open_write(path).close()
            return open_read(path)
        raise JournalError(f"the journal {path} has schema version {version}; this planrun "
                           f"needs {SCHEMA_VERSION}",
                           hint="Run any planrun execute/resume once to migrate it.")
    return conn


def _connect_ro(path: Path, query: str) -> sqlite3.Connection:
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?{query}", uri=True,
                           timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                           check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    return conn


def _read_only_storage(path: Path) -> bool:
    """Whether the journal's folder cannot be written (read-only mount or permissions)."""
    return not os.access(path.parent, os.W_OK)


def _open_on_read_only_storage(path: Path) -> sqlite3.Connection:
    """Read a WAL journal whose folder cannot be written (SQLite cannot create ``-shm``).

    SQLite opens a WAL database read-only only if its ``-shm`` file exists or can be
    created (https://sqlite.org/wal.html#readonly). On read-only storage:

    - no ``-wal`` file, or an empty one (the journal was closed cleanly): nothing can change
      the file, so it is opened ``immutable=1`` (no locks, no ``-shm``);
    - a ``-wal`` with content (e.g. copied without its ``-shm``): the database and its WAL
      are copied into a private temporary folder and the copy is read, so committed
      records in the WAL are seen; the copy is removed when the connection is collected
      or the process exits.
    """
    wal = path.with_name(path.name + "-wal")
    if not wal.exists() or wal.stat().st_size == 0:
        return _connect_ro(path, "mode=ro&immutable=1")
    import tempfile  # only here: a journal on read-only storage

    folder = Path(tempfile.mkdtemp(prefix="planrun-ro-"))
    try:
        copy = folder / path.name
        shutil.copyfile(path, copy)
        shutil.copyfile(wal, folder / wal.name)
        conn = sqlite3.connect(f"{copy.as_uri()}?mode=ro", uri=True, isolation_level=None,
                               check_same_thread=False, factory=_SnapshotConnection)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    conn.folder = folder
    weakref.finalize(conn, shutil.rmtree, folder, True)  # also run at exit
    return conn


class _SnapshotConnection(sqlite3.Connection):
    """A connection to a private copy of a journal; closing it removes the copy."""

    folder: Path | None = None

    def close(self) -> None:
        super().close()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


class SqliteBackend:
    """The SQLite backend of :class:`planrun.journal.Journal` (one file, WAL).

    Args:
        path: the journal file.
    """

    name: ClassVar[str] = "sqlite"
    #: Errors of the database driver (anything else is not the journal's).
    Error: tuple[type[BaseException], ...] = (sqlite3.Error,)
    #: Errors that mean the journal could not be read or written as asked.
    DatabaseError: tuple[type[BaseException], ...] = (sqlite3.DatabaseError,)
    #: Errors of an ``OperationalError`` kind (busy, locked): retried or skipped by callers.
    OperationalError: tuple[type[BaseException], ...] = (sqlite3.OperationalError,)
    #: The database clock in seconds since the epoch (a SQL expression; leases use it).
    NOW_SQL: ClassVar[str] = "((julianday('now') - 2440587.5) * 86400.0)"
    #: Each fan-out item's dispatch record is written on its own (no batch claims).
    BATCH_CLAIMS: ClassVar[bool] = False
    #: Nothing: ``BEGIN IMMEDIATE`` holds the whole file for the write transaction.
    CLAIM_SQL: ClassVar[str] = ""
    #: No server-side writes: the journal's SQL, run in-process.
    calls: None = None

    def __init__(self, path: Path) -> None:
        self.path = path

    def open(self, *, write: bool) -> sqlite3.Connection | None:
        """A connection (migrated for writing), or None: a journal not created yet.

        Raises:
            JournalError: cannot create/open/read, corrupt, or newer schema (exit 6).
        """
        return open_write(self.path) if write else open_read(self.path)

    def transaction(self, conn: sqlite3.Connection) -> Any:
        """One write transaction (:func:`atomic`)."""
        return atomic(conn)

    def snapshot(self, conn: sqlite3.Connection) -> Any:
        """A read-only snapshot (:func:`snapshot`)."""
        return snapshot(conn)

    def fail(self, exc: BaseException, doing: str) -> JournalError:
        """The :class:`JournalError` (exit 6) for a database error while ``doing``."""
        return _fail(self.path, exc, doing)

    @staticmethod
    def expect(conn: sqlite3.Connection, condition: str, params: Sequence[Any], fail: Fail,
               detail: str = "NULL", detail_params: Sequence[Any] = ()) -> None:
        """Check ``condition`` (SQL) now; raise ``fail(detail value)`` unless it holds.

        The detail is read only when the check fails.
        """
        if not conn.execute(f"SELECT ({condition})", params).fetchone()[0]:
            value = conn.execute(f"SELECT ({detail})", detail_params).fetchone()[0]
            raise fail(None if value is None else str(value))

    @staticmethod
    def expect_changed(conn: sqlite3.Connection, sql: str, params: Sequence[Any], rows: int,
                       fail: Fail) -> None:
        """Run ``sql``; raise ``fail(None)`` unless it changed exactly ``rows`` rows."""
        if conn.execute(sql, params).rowcount != rows:
            raise fail(None)

    @staticmethod
    def json_array(column: str) -> str:
        """SQL: the JSON array of ``column`` (JSON texts) over the rows of a subquery."""
        return f"json_group_array(json({column}))"

    @staticmethod
    def text_bytes(column: str) -> str:
        """SQL: the length in bytes of ``column``'s text (SQLite's length() counts characters)."""
        return f"length(CAST({column} AS BLOB))"

    def vacuum(self, conn: sqlite3.Connection, *, rewrite: bool = False) -> dict[str, int]:
        """Give freed space back to the disk, in pieces that other writers can wait for.

        A journal created by this planrun keeps a map of its pages (``auto_vacuum =
        INCREMENTAL``, set when the file is made: :func:`open_write`), so its free pages
        are given back :data:`RECLAIM_PAGES` at a time, one write transaction each
        (``PRAGMA incremental_vacuum``): another process's next journal write waits for
        one piece (≈ 0.1 to 0.2 s), not for the whole file. Before, ``VACUUM`` rewrote the
        file in one transaction: 35 s for 1.7 GB on a 2-core machine, longer than the
        30 s another writer waits (``busy_timeout``) before it fails.

        A journal made by an earlier planrun (``auto_vacuum`` off) cannot give pages back
        in pieces: its free pages stay, and later writes reuse them, unless ``rewrite``
        (``planrun prune --vacuum``) rewrites it with ``VACUUM``, switching it to the
        incremental mode on the way. A rewrite, or a piece, that another process keeps
        from its lock is left for later (the space stays free inside the file).

        Returns:
            ``{"reclaimed_bytes", "free_bytes"}``: how many bytes smaller the database
            is, how many are still free inside it.
        """
        def pages(pragma: str) -> int:
            return int(conn.execute(f"PRAGMA {pragma}").fetchone()[0])

        size, before = pages("page_size"), pages("page_count")
        try:
            if rewrite:
                conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
                conn.execute("VACUUM")
            elif pages("auto_vacuum") == 2:
                while pages("freelist_count"):
                    # executescript steps the pragma until done (execute frees one page)
                    conn.executescript(f"BEGIN IMMEDIATE; PRAGMA incremental_vacuum"
                                       f"({RECLAIM_PAGES}); COMMIT;")
        except sqlite3.OperationalError:  # busy: the space is given back another time
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        # The file shrinks once the write-ahead log is copied back into it; PASSIVE never
        # waits for (or holds up) another process: what it cannot copy now goes later.
        with suppress(sqlite3.Error):
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        return {"reclaimed_bytes": max(0, before - pages("page_count")) * size,
                "free_bytes": pages("freelist_count") * size}
