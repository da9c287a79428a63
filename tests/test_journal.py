"""The SQLite journal on real files (SPEC §7; STYLE "SQLite done right").

Every test opens real SQLite files in ``tmp_path``; concurrency is shown with real
processes, dead lease holders with a real (reaped) pid.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from planrun.errors import EXIT_JOURNAL, EXIT_RUN, JournalError, RunError
from planrun.journal import SCHEMA_VERSION, Journal, now
from planrun.journal.store import LeaseLost

#: These tests look at and tamper with the SQLite file itself (SPEC §7 on SQLite).
pytestmark = pytest.mark.sqlite

HOST = socket.gethostname()
TABLES = {"runs", "steps", "items", "approvals", "events", "idempotency_keys"}


# --- helpers ------------------------------------------------------------------------------


def new_run(journal: Journal, run_id: str = "0123456789abcdef",
            steps: tuple[str, ...] = ("a", "b"), **columns: Any) -> str:
    """Journal a run with ``steps`` (all ``pending``) the way ``api.execute`` does."""
    run = {
        "run_id": run_id, "root_run_id": run_id, "parent_run_id": None, "plan_name": "p",
        "plan_file": "plans/p.yaml", "plan_json": "{}", "digest": "0" * 64, "revision": 1,
        "goal": "a test", "params_json": "{}", "contracts_json": "{}", "status": "running",
        "created_at": now(), **columns,
    }
    journal.create_run(run=run, steps=[(s, i, "echo") for i, s in enumerate(steps)])
    return run_id


def raw(path: Path) -> sqlite3.Connection:
    """A plain sqlite3 connection to look at (or tamper with) the file."""
    return sqlite3.connect(path, isolation_level=None)


def scalar(path: Path, sql: str, *args: Any) -> Any:
    conn = raw(path)
    try:
        row = conn.execute(sql, args).fetchone()
        return None if row is None else row[0]
    finally:
        conn.close()


def count(path: Path, table: str, where: str = "1", *args: Any) -> int:
    return int(scalar(path, f"SELECT COUNT(*) FROM {table} WHERE {where}", *args))


def step_status(path: Path, run_id: str, step: str) -> str:
    return str(scalar(path, "SELECT status FROM steps WHERE run_id = ? AND step_id = ?",
                      run_id, step))


def dead_pid() -> int:
    """The pid of a process that existed and is gone (spawned and reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "j" / "journal.sqlite3"


@pytest.fixture
def journal(path: Path) -> Iterator[Journal]:
    with Journal(path, write=True) as j:
        yield j


# --- opening --------------------------------------------------------------------------------


def test_write_open_creates_the_file_with_wal_full_sync_and_schema_version(path: Path) -> None:
    assert not path.parent.exists()
    with Journal(path, write=True) as j:
        assert j.conn is not None
        assert j.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert j.conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert j.conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert j.conn.execute("PRAGMA busy_timeout").fetchone()[0] > 0
    assert path.is_file()
    # WAL is a property of the file: a fresh connection sees it too.
    assert scalar(path, "PRAGMA journal_mode") == "wal"
    assert scalar(path, "PRAGMA user_version") == SCHEMA_VERSION
    names = {r[0] for r in raw(path).execute(
        "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert names >= TABLES


def _schema_sql(conn: sqlite3.Connection) -> list[tuple[str, str]]:
    return [(r[0], r[1]) for r in conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY name")]


def test_a_new_journal_has_every_migration_applied(path: Path) -> None:
    """The file's schema is what applying each entry of MIGRATIONS in order builds."""
    from planrun.journal.schema import MIGRATIONS

    expected = sqlite3.connect(":memory:")
    for statements in MIGRATIONS:
        for statement in statements:
            expected.execute(statement)
    with Journal(path, write=True):
        pass
    conn = raw(path)
    try:
        assert _schema_sql(conn) == _schema_sql(expected)
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    finally:
        conn.close()
        expected.close()


def test_a_journal_of_each_older_version_is_migrated_forward(tmp_path: Path) -> None:
    """A journal left at version n (by an older planrun) gets exactly the later steps."""
    from planrun.journal.schema import MIGRATIONS

    for n in range(1, len(MIGRATIONS)):
        old = tmp_path / f"v{n}.sqlite3"
        conn = raw(old)
        for statements in MIGRATIONS[:n]:
            for statement in statements:
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {n}")
        conn.close()
        with Journal(old, write=True):
            pass
        assert scalar(old, "PRAGMA user_version") == len(MIGRATIONS)
        fresh = tmp_path / f"fresh{n}.sqlite3"
        with Journal(fresh, write=True):
            pass
        assert _schema_sql(raw(old)) == _schema_sql(raw(fresh))


def test_migrations_are_idempotent(path: Path) -> None:
    with Journal(path, write=True) as j:
        new_run(j)
    for _ in range(3):
        with Journal(path, write=True):
            pass
    assert scalar(path, "PRAGMA user_version") == SCHEMA_VERSION
    assert count(path, "runs") == 1
    assert count(path, "sqlite_master", "type = 'table' AND name = 'runs'") == 1


def test_a_second_connection_opens_while_the_first_is_open(path: Path) -> None:
    with Journal(path, write=True) as first, Journal(path, write=True) as second:
        new_run(first, "aaaa000000000001")
        new_run(second, "bbbb000000000002")
        reader = Journal(path, write=False)
        assert {r["run_id"] for r in reader.list_runs()} == {"aaaa000000000001",
                                                               "bbbb000000000002"}
        reader.close()


def test_processes_opening_a_new_journal_at_once_do_not_fail(path: Path,
                                                              tmp_path: Path) -> None:
    n = 6
    go = tmp_path / "go"
    script = textwrap.dedent(f"""
        import os, sys, time
        from pathlib import Path
        from planrun.journal import Journal, now
        go = Path({str(go)!r})
        Path(sys.argv[2]).touch()
        while not go.exists():
            time.sleep(0.005)
        with Journal(Path({str(path)!r}), write=True) as j:
            run_id = sys.argv[1]
            j.create_run(run={{"run_id": run_id, "root_run_id": run_id, "plan_name": "p",
                              "plan_json": "{{}}", "digest": "d", "revision": 1,
                              "params_json": "{{}}", "contracts_json": "{{}}",
                              "status": "running", "created_at": now()}},
                         steps=[("a", 0, "echo")])
    """)
    ready = [tmp_path / f"ready{i}" for i in range(n)]
    procs = [subprocess.Popen([sys.executable, "-c", script, f"{i:016x}", str(ready[i])],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(n)]
    try:
        # Release them together once every process is up (imports done).
        while not all(r.exists() for r in ready):
            if any(p.poll() is not None for p in procs):
                break
            time.sleep(0.01)
        go.touch()
        results = [(p.wait(timeout=60), p.stderr.read() if p.stderr else "") for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert results == [(0, "")] * n
    assert scalar(path, "PRAGMA user_version") == SCHEMA_VERSION
    assert count(path, "runs") == n
    assert count(path, "events", "kind = 'planned'") == n


@pytest.mark.parametrize("write", [True, False], ids=["write", "read"])
def test_a_journal_newer_than_the_code_is_refused(path: Path, write: bool) -> None:
    path.parent.mkdir()
    conn = raw(path)
    conn.execute("CREATE TABLE future (x)")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(JournalError) as caught:
        Journal(path, write=write)
    assert caught.value.exit_code == EXIT_JOURNAL == 6
    assert caught.value.code == "journal"
    assert str(SCHEMA_VERSION + 1) in caught.value.message
    # Nothing was migrated or added.
    assert scalar(path, "PRAGMA user_version") == SCHEMA_VERSION + 1
    assert count(path, "sqlite_master", "type = 'table'") == 1


@pytest.mark.parametrize("write", [True, False], ids=["write", "read"])
def test_a_file_that_is_not_a_database_is_refused_with_a_clear_message(path: Path,
                                                                         write: bool) -> None:
    path.parent.mkdir()
    text = "these are my notes, not a database\n" * 20
    path.write_text(text)
    with pytest.raises(JournalError) as caught:
        Journal(path, write=write)
    err = caught.value
    assert err.exit_code == 6
    assert err.code == "journal"
    assert str(path) in err.message
    assert "not a planrun journal" in err.message or "not a database" in err.message
    assert err.hint
    assert "--journal" in err.hint
    assert path.read_text() == text  # never "repaired"


@pytest.mark.parametrize("write", [True, False], ids=["write", "read"])
def test_a_directory_as_journal_is_refused(tmp_path: Path, write: bool) -> None:
    folder = tmp_path / "afolder"
    folder.mkdir()
    with pytest.raises(JournalError) as caught:
        Journal(folder, write=write)
    assert caught.value.exit_code == 6
    assert str(folder) in caught.value.message
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize("write", [True, False], ids=["write", "read"])
def test_a_directory_as_journal_is_named_as_a_directory(tmp_path: Path, write: bool) -> None:
    folder = tmp_path / "afolder"
    folder.mkdir()
    with pytest.raises(JournalError) as caught:
        Journal(folder, write=write)
    message = caught.value.message.replace(str(folder), "PATH").lower()
    assert "directory" in message or "folder" in message


def test_read_only_open_of_a_missing_journal_is_empty_and_creates_nothing(path: Path) -> None:
    with Journal(path, write=False) as j:
        assert j.conn is None
        assert j.list_runs() == []
        assert j.latest_resumable() is None
        with pytest.raises(RunError) as caught:
            j.resolve_run_id("abcd1234")
        assert caught.value.code == "unknown_run"
    assert not path.exists()
    assert not path.parent.exists()


def test_read_only_open_never_writes(journal: Journal, path: Path) -> None:
    new_run(journal)
    with Journal(path, write=False) as reader:
        assert reader.conn is not None
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            reader.conn.execute("DELETE FROM runs")
    assert count(path, "runs") == 1


# --- steps: guarded updates, events in the same transaction ----------------------------------


def test_step_started_then_finished_is_guarded_by_the_expected_status(journal: Journal,
                                                                      path: Path) -> None:
    run_id = new_run(journal)
    journal.step_started(run_id, "a", attempt=1, key="k-a", root_run_id=run_id)
    assert step_status(path, run_id, "a") == "running"
    journal.step_finished(run_id, "a", status="succeeded", key="k-a", output={"n": 1})
    assert step_status(path, run_id, "a") == "succeeded"
    events = count(path, "events")
    with pytest.raises(JournalError, match="was not running"):
        journal.step_finished(run_id, "a", status="failed", key="k-a",
                              error={"code": "x", "message": "late"})
    assert step_status(path, run_id, "a") == "succeeded"
    assert scalar(path, "SELECT output_json FROM steps WHERE step_id = 'a'") == '{"n":1}'
    assert count(path, "events") == events
    # A succeeded step is not dispatched again either.
    with pytest.raises(JournalError, match="not pending"):
        journal.step_started(run_id, "a", attempt=2, key="k-a", root_run_id=run_id)
    assert count(path, "events") == events


def test_finishing_a_step_that_never_started_raises(journal: Journal, path: Path) -> None:
    run_id = new_run(journal)
    with pytest.raises(JournalError):
        journal.step_finished(run_id, "b", status="succeeded", key=None, output=1)
    assert step_status(path, run_id, "b") == "pending"
    assert count(path, "events", "kind = 'step_succeeded'") == 0


def test_each_state_change_writes_exactly_one_event(journal: Journal, path: Path) -> None:
    run_id = new_run(journal)
    assert count(path, "events", "run_id = ?", run_id) == 1  # planned
    journal.step_started(run_id, "a", attempt=1, key="k", root_run_id=run_id)
    assert count(path, "events", "run_id = ?", run_id) == 2
    journal.step_finished(run_id, "a", status="succeeded", key="k", output=None)
    journal.step_skipped(run_id, "b", "dependency", "dependency 'a' failed")
    kinds = [r[0] for r in raw(path).execute(
        "SELECT kind FROM events WHERE run_id = ? ORDER BY id", (run_id,))]
    assert kinds == ["planned", "step_started", "step_succeeded", "step_skipped"]


@pytest.mark.parametrize("kind", ["step_started", "step_succeeded"])
def test_a_state_change_and_its_event_are_one_transaction(journal: Journal, path: Path,
                                                          kind: str) -> None:
    """When the event cannot be written, the state change is rolled back with it."""
    run_id = new_run(journal)
    if kind == "step_succeeded":
        journal.step_started(run_id, "a", attempt=1, key="k", root_run_id=run_id)
    conn = raw(path)
    conn.execute(f"CREATE TRIGGER no_event BEFORE INSERT ON events WHEN NEW.kind = '{kind}' "
                 "BEGIN SELECT RAISE(ABORT, 'event refused'); END")
    conn.close()
    before = (step_status(path, run_id, "a"), count(path, "events"),
              count(path, "idempotency_keys"),
              scalar(path, "SELECT status FROM idempotency_keys WHERE key = 'k'"))
    if kind == "step_started":
        with pytest.raises(JournalError, match="event refused"):
            journal.step_started(run_id, "a", attempt=1, key="k", root_run_id=run_id)
    else:
        with pytest.raises(JournalError, match="event refused"):
            journal.step_finished(run_id, "a", status="succeeded", key="k", output={"x": 1})
    after = (step_status(path, run_id, "a"), count(path, "events"),
             count(path, "idempotency_keys"),
             scalar(path, "SELECT status FROM idempotency_keys WHERE key = 'k'"))
    assert after == before
    assert scalar(path, "SELECT output_json FROM steps WHERE step_id = 'a'") is None
    # The connection is usable again (no transaction left open).
    assert journal.conn is not None
    assert not journal.conn.in_transaction


@pytest.mark.parametrize("state", ["running", "succeeded"])
def test_step_skipped_never_writes_an_event_without_its_state_change(journal: Journal,
                                                                     path: Path,
                                                                     state: str) -> None:
    run_id = new_run(journal)
    journal.step_started(run_id, "a", attempt=1, key="k", root_run_id=run_id)
    if state == "succeeded":
        journal.step_finished(run_id, "a", status="succeeded", key="k", output=1)
    with contextlib.suppress(JournalError):
        journal.step_skipped(run_id, "a", "stopped", "the run stopped")
    skipped_events = count(path, "events", "kind = 'step_skipped' AND step_id = 'a'")
    assert (step_status(path, run_id, "a") == "skipped") == (skipped_events == 1)


def test_a_deferred_outcome_commits_with_the_next_write(journal: Journal, path: Path) -> None:
    """Group commit: the outcome joins the successor's dispatch transaction."""
    run_id = new_run(journal)
    journal.step_started(run_id, "a", attempt=1, key="ka", root_run_id=run_id)
    journal.step_finished(run_id, "a", status="succeeded", key="ka", output=1, defer=True)
    assert journal.pending_writes == 1
    assert step_status(path, run_id, "a") == "running"  # not committed yet
    journal.step_started(run_id, "b", attempt=1, key="kb", root_run_id=run_id)
    assert journal.pending_writes == 0
    assert step_status(path, run_id, "a") == "succeeded"
    assert step_status(path, run_id, "b") == "running"


def test_a_deferred_skip_commits_with_the_next_write(journal: Journal, path: Path) -> None:
    run_id = new_run(journal)
    journal.step_skipped(run_id, "b", "dependency", "dependency 'a' failed", defer=True)
    assert journal.pending_writes == 1
    assert step_status(path, run_id, "b") == "pending"  # not committed yet
    assert count(path, "events", "kind = 'step_skipped'") == 0
    journal.flush()
    assert step_status(path, run_id, "b") == "skipped"
    assert count(path, "events", "kind = 'step_skipped'") == 1


def test_flush_commits_deferred_outcomes(journal: Journal, path: Path) -> None:
    run_id = new_run(journal)
    journal.step_started(run_id, "a", attempt=1, key="ka", root_run_id=run_id)
    journal.step_finished(run_id, "a", status="failed", key="ka", defer=True,
                          error={"code": "tool_error", "message": "no"})
    journal.flush()
    assert journal.pending_writes == 0
    assert step_status(path, run_id, "a") == "failed"
    assert count(path, "events", "kind = 'step_failed'") == 1


def test_a_deferred_outcome_and_the_next_write_fail_together(journal: Journal,
                                                             path: Path) -> None:
    run_id = new_run(journal)
    journal.step_started(run_id, "a", attempt=1, key="ka", root_run_id=run_id)
    journal.step_finished(run_id, "a", status="succeeded", key="ka", output=1, defer=True)
    conn = raw(path)
    conn.execute("CREATE TRIGGER no_event BEFORE INSERT ON events WHEN NEW.kind = "
                 "'step_succeeded' BEGIN SELECT RAISE(ABORT, 'event refused'); END")
    conn.close()
    with pytest.raises(JournalError, match="event refused"):
        journal.step_started(run_id, "b", attempt=1, key="kb", root_run_id=run_id)
    assert step_status(path, run_id, "a") == "running"
    assert step_status(path, run_id, "b") == "pending"
    assert count(path, "events", "kind = 'step_started' AND step_id = 'b'") == 0
    # closing tries the deferred outcome once more and says that it could not be written
    with pytest.raises(JournalError, match="event refused"):
        journal.close()
    assert step_status(path, run_id, "a") == "running"


# --- idempotency keys ---------------------------------------------------------------------


def _key_row(path: Path, key: str) -> tuple[Any, ...] | None:
    conn = raw(path)
    try:
        row = conn.execute("SELECT status, output_json, run_id, step_id FROM idempotency_keys "
                           "WHERE key = ?", (key,)).fetchone()
        return tuple(row) if row else None
    finally:
        conn.close()


def test_key_is_claimed_on_start_and_kept_on_success(journal: Journal, path: Path) -> None:
    run_id = new_run(journal)
    journal.step_started(run_id, "a", attempt=1, key="key-a", root_run_id=run_id)
    assert _key_row(path, "key-a") == ("running", None, run_id, "a")
    assert journal.succeeded_key("key-a") == (False, None)
    journal.step_finished(run_id, "a", status="succeeded", key="key-a", output=[1, "two"])
    assert _key_row(path, "key-a") == ("succeeded", '[1,"two"]', run_id, "a")
    assert journal.succeeded_key("key-a") == (True, [1, "two"])


def test_key_is_released_on_failure(journal: Journal, path: Path) -> None:
    run_id = new_run(journal)
    journal.step_started(run_id, "a", attempt=1, key="key-a", root_run_id=run_id)
    journal.step_finished(run_id, "a", status="failed", key="key-a",
                          error={"code": "tool_error", "message": "boom"})
    assert _key_row(path, "key-a") is None
    assert journal.succeeded_key("key-a") == (False, None)


def test_key_stays_claimed_when_the_outcome_is_unknown(journal: Journal, path: Path) -> None:
    run_id = new_run(journal)
    journal.step_started(run_id, "a", attempt=1, key="key-a", root_run_id=run_id)
    journal.step_finished(run_id, "a", status="indeterminate", key=None,
                          error={"code": "timeout", "message": "ran past its timeout"})
    assert _key_row(path, "key-a") == ("running", None, run_id, "a")


def test_a_retried_attempt_releases_the_key(journal: Journal, path: Path) -> None:
    run_id = new_run(journal)
    journal.step_started(run_id, "a", attempt=1, key="key-a", root_run_id=run_id)
    journal.step_retried(run_id, "a", 1, {"code": "exit_status", "message": "exit 1"}, 0.0)
    assert _key_row(path, "key-a") is None
    assert step_status(path, run_id, "a") == "pending"
    journal.step_started(run_id, "a", attempt=2, key="key-a", root_run_id=run_id)
    assert scalar(path, "SELECT attempts FROM steps WHERE step_id = 'a'") == 2


# --- leases ----------------------------------------------------------------------------------


def test_take_lease_refuses_a_live_holder(journal: Journal, path: Path) -> None:
    run_id = new_run(journal)
    mine = f"{HOST}:{os.getpid()}:aaaaaaaa"
    journal.take_lease(run_id, mine)
    other = Journal(path, write=True)
    try:
        with pytest.raises(RunError) as caught:
            other.take_lease(run_id, f"{HOST}:{os.getpid()}:bbbbbbbb")
    finally:
        other.close()
    assert caught.value.code == "run_busy"
    assert caught.value.exit_code == EXIT_RUN == 5
    assert scalar(path, "SELECT lease_owner FROM runs") == mine


def test_take_lease_takes_over_a_dead_holder(journal: Journal, path: Path) -> None:
    run_id = new_run(journal)
    gone = f"{HOST}:{dead_pid()}:deadbeef"
    journal.take_lease(run_id, gone)
    mine = f"{HOST}:{os.getpid()}:cafecafe"
    with Journal(path, write=True) as other:
        other.take_lease(run_id, mine)
    assert scalar(path, "SELECT lease_owner FROM runs") == mine


def test_take_lease_takes_over_an_expired_lease_of_another_host(journal: Journal,
                                                                path: Path) -> None:
    run_id = new_run(journal)
    remote = "elsewhere.invalid:4242:0000aaaa"
    journal.take_lease(run_id, remote, ttl=-1.0)
    mine = f"{HOST}:{os.getpid()}:cafecafe"
    with Journal(path, write=True) as other:
        other.take_lease(run_id, mine)
    assert scalar(path, "SELECT lease_owner FROM runs") == mine


def test_take_lease_refuses_a_live_lease_of_another_host(journal: Journal, path: Path) -> None:
    run_id = new_run(journal)
    remote = "elsewhere.invalid:4242:0000aaaa"
    journal.take_lease(run_id, remote)
    with Journal(path, write=True) as other, pytest.raises(RunError) as caught:
        other.take_lease(run_id, f"{HOST}:{os.getpid()}:cafecafe")
    assert caught.value.code == "run_busy"
    assert "unlock" in (caught.value.hint or "")


def test_take_lease_takes_over_an_expired_lease_whose_pid_is_in_use(journal: Journal,
                                                                    path: Path) -> None:
    run_id = new_run(journal)
    # An unrelated live process now has the pid the holder had (pid reuse).
    sleeper = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                               stdin=subprocess.PIPE)
    try:
        journal.take_lease(run_id, f"{HOST}:{sleeper.pid}:0ld0ld00", ttl=-1.0)
        mine = f"{HOST}:{os.getpid()}:cafecafe"
        with Journal(path, write=True) as other:
            other.take_lease(run_id, mine)
        assert scalar(path, "SELECT lease_owner FROM runs") == mine
    finally:
        assert sleeper.stdin is not None
        sleeper.stdin.close()
        sleeper.wait()


def test_a_writer_whose_lease_was_taken_stops_writing(journal: Journal, path: Path) -> None:
    run_id = new_run(journal)
    journal.take_lease(run_id, f"{HOST}:{dead_pid()}:11111111")
    assert journal.owner is not None
    journal.step_started(run_id, "a", attempt=1, key="k", root_run_id=run_id)
    with Journal(path, write=True) as other:
        other.take_lease(run_id, f"{HOST}:{os.getpid()}:22222222")
    events = count(path, "events")
    with pytest.raises(LeaseLost) as caught:
        journal.step_finished(run_id, "a", status="succeeded", key="k", output=1)
    assert caught.value.code == "run_busy"
    with pytest.raises(LeaseLost):
        journal.step_started(run_id, "b", attempt=1, key="kb", root_run_id=run_id)
    with pytest.raises(LeaseLost):
        journal.finish_run(run_id, "completed")
    assert step_status(path, run_id, "a") == "running"
    assert step_status(path, run_id, "b") == "pending"
    assert scalar(path, "SELECT status FROM runs") == "running"
    assert count(path, "events") == events


def test_release_lease_only_releases_its_own_owner(journal: Journal, path: Path) -> None:
    run_id = new_run(journal)
    mine = f"{HOST}:{os.getpid()}:aaaaaaaa"
    journal.take_lease(run_id, mine)
    assert journal.release_lease(run_id, "someone:else:token") == mine
    assert scalar(path, "SELECT lease_owner FROM runs") == mine
    assert journal.release_lease(run_id, mine) == mine
    assert scalar(path, "SELECT lease_owner FROM runs") is None


# --- run ids ----------------------------------------------------------------------------------


@pytest.fixture
def ids(journal: Journal) -> Journal:
    for run_id in ("abcd1111aaaaaaaa", "abcd2222bbbbbbbb", "abce3333cccccccc",
                   "f00d4444dddddddd"):
        new_run(journal, run_id)
    return journal


def test_resolve_run_id_accepts_an_exact_id(ids: Journal) -> None:
    assert ids.resolve_run_id("abcd2222bbbbbbbb") == "abcd2222bbbbbbbb"


@pytest.mark.parametrize(("prefix", "full"), [("abce", "abce3333cccccccc"),
                                               ("abcd1", "abcd1111aaaaaaaa"),
                                               ("f00d4444ddd", "f00d4444dddddddd")])
def test_resolve_run_id_accepts_a_unique_prefix_of_4_or_more(ids: Journal, prefix: str,
                                                            full: str) -> None:
    assert ids.resolve_run_id(prefix) == full


@pytest.mark.parametrize("short", ["f00", "f", ""])
def test_resolve_run_id_refuses_a_prefix_under_4_characters(ids: Journal, short: str) -> None:
    with pytest.raises(RunError) as caught:
        ids.resolve_run_id(short)
    assert caught.value.code == "unknown_run"
    assert caught.value.exit_code == 5
    assert "4" in caught.value.message


def test_resolve_run_id_refuses_an_ambiguous_prefix(ids: Journal) -> None:
    with pytest.raises(RunError) as caught:
        ids.resolve_run_id("abcd")
    assert caught.value.code == "unknown_run"
    assert "ambiguous" in caught.value.message
    assert "abcd1111aaaaaaaa" in caught.value.message
    assert "abcd2222bbbbbbbb" in caught.value.message


@pytest.mark.parametrize("ref", ["beef", "abcd3", "abcd1111aaaaaaaaX", "ab_d", "ab%d",
                                 "abc%"])
def test_resolve_run_id_refuses_unknown_ids_and_wildcards(ids: Journal, ref: str) -> None:
    with pytest.raises(RunError) as caught:
        ids.resolve_run_id(ref)
    assert caught.value.code == "unknown_run"


def test_a_deferred_dispatch_commits_with_the_next_flush_and_can_be_withdrawn(
        journal: Journal, path: Path) -> None:
    run_id = new_run(journal)
    journal.step_started(run_id, "a", attempt=1, key="ka", root_run_id=run_id, defer=True)
    assert step_status(path, run_id, "a") == "pending"  # not yet written
    journal.flush()
    assert step_status(path, run_id, "a") == "running"
    assert _key_row(path, "ka") is not None
    # the call was cancelled before it started: nothing happened, so it is pending again
    journal.withdraw_dispatch(run_id, "a", "ka")
    assert step_status(path, run_id, "a") == "pending"
    assert _key_row(path, "ka") is None
