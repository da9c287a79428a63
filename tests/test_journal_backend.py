"""The journal's seams (issue 12): typed records, the backend, leases with epochs, locations.

Records and the probe are read through the journal's own API; the tests that must look at
or tamper with the SQLite file itself are marked ``sqlite``.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from planrun.errors import JournalError
from planrun.journal import Journal, NewRun, RunRecord, StepRecord, now
from planrun.journal.backends.sqlite import atomic
from planrun.journal.probe import probe
from planrun.journal.schema import MIGRATIONS, SCHEMA_VERSION
from planrun.journal.store import LeaseLost
from planrun_cli import CliProject

HOST = socket.gethostname()
RUN = "0123456789abcdef"


def new_run(journal: Journal, run_id: str = RUN, owner: str | None = None,
            steps: tuple[str, ...] = ("a", "b")) -> str:
    journal.create_run(run=NewRun(
        run_id=run_id, root_run_id=run_id, plan_name="p", plan={"steps": []},
        digest="0" * 64, revision=1, status="running", created_at=now(),
        params={"n": 1}, contracts={"echo": {"idempotent": True}},
        options={"max_parallel": 2}, plan_file="plans/p.yaml", lease_owner=owner,
    ), steps=[(s, i, "echo") for i, s in enumerate(steps)])
    return run_id


@pytest.fixture
def path(journal_location: Path | str) -> Path | str:
    """A fresh journal of each backend (SQLite file, PostgreSQL database): one suite."""
    return journal_location


# --- typed records -----------------------------------------------------------------------


def test_run_and_step_records_carry_parsed_values(path: Path) -> None:
    with Journal(path, write=True) as j:
        new_run(j)
        j.step_started(RUN, "a", attempt=1, key="k-a", root_run_id=RUN)
        j.step_finished(RUN, "a", status="succeeded", key="k-a", output={"x": [1, 2]})
        run = j.run(RUN)
        steps = j.steps(RUN)
    assert isinstance(run, RunRecord)
    assert (run.params, run.contracts, run.options) == (
        {"n": 1}, {"echo": {"idempotent": True}}, {"max_parallel": 2})
    assert run.plan == {"steps": []}
    assert run.lease is None
    assert [type(s) for s in steps] == [StepRecord, StepRecord]
    a, b = steps
    assert (a.status, a.output, a.output_bytes, a.attempts) == (
        "succeeded", {"x": [1, 2]}, len('{"x":[1,2]}'), 1)
    assert (b.status, b.output, b.output_bytes, b.error) == ("pending", None, 0, None)


def test_list_runs_counts_steps_of_every_run_newest_first(path: Path) -> None:
    with Journal(path, write=True) as j:
        new_run(j, "a" * 16, steps=("x",))
        new_run(j, "b" * 16, steps=("x", "y", "z"))
        new_run(j, "c" * 16, steps=())
        j.step_skipped("b" * 16, "y", "when_false")
        runs = j.list_runs()
    assert [r["run_id"] for r in runs] == ["c" * 16, "b" * 16, "a" * 16]
    assert [r["counts"]["total"] for r in runs] == [0, 3, 1]
    assert runs[1]["counts"]["skipped"] == 1
    assert runs[1]["counts"]["pending"] == 2
    with Journal(path, write=False) as j:
        assert [r["run_id"] for r in j.list_runs(limit=1)] == ["c" * 16]


# --- leases --------------------------------------------------------------------------------


def test_a_new_run_holds_its_lease_at_epoch_one_until_the_database_clock_says(
        path: Path) -> None:
    mine = f"{HOST}:{os.getpid()}:aaaaaaaa"
    with Journal(path, write=True) as j:
        new_run(j, owner=mine)
        lease = j.lease(RUN)
    assert lease is not None
    assert (lease.owner, lease.epoch) == (mine, 1)
    assert 0 < lease.remaining_s <= 30.0
    assert not lease.expired
    assert lease.holder_alive() is True


def test_taking_a_lease_again_bumps_its_epoch_and_fences_the_old_handle(path: Path) -> None:
    """Same owner text, new epoch: the handle that took the older epoch writes nothing."""
    mine = f"{HOST}:{os.getpid()}:aaaaaaaa"
    with Journal(path, write=True) as first:
        new_run(first)
        first.take_lease(RUN, mine)
        with Journal(path, write=True) as second:
            second.take_lease(RUN, mine)
            lease = second.lease(RUN)
            assert lease is not None
            assert lease.epoch == 2
        with pytest.raises(LeaseLost):
            first.step_skipped(RUN, "a", "when_false")
    assert probe(path).step("a", RUN).status == "pending"


def test_renewal_keeps_the_epoch_and_release_keeps_it_for_the_next_holder(path: Path) -> None:
    mine = f"{HOST}:{os.getpid()}:aaaaaaaa"
    with Journal(path, write=True) as j:
        new_run(j)
        j.take_lease(RUN, mine, ttl=2.0)
        assert j.renew_lease(RUN, mine, ttl=20.0) is True
        lease = j.lease(RUN)
        assert lease is not None
        assert lease.epoch == 1
        assert lease.remaining_s > 2.0
        j.release_lease(RUN, mine)
        assert j.lease(RUN) is None
        j.take_lease(RUN, mine)
        lease = j.lease(RUN)
        assert lease is not None
        assert lease.epoch == 2


@pytest.mark.sqlite
def test_a_live_pid_with_another_start_time_is_not_the_holder(path: Path) -> None:
    """The lease's start time tells a reused pid from its holder (not only host+pid)."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        holder = f"{HOST}:{sleeper.pid}:0ld0ld00"
        with Journal(path, write=True) as j:
            new_run(j)
            j.take_lease(RUN, holder, ttl=30.0)
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("UPDATE runs SET lease_start = lease_start + 1")
        conn.close()
        lease = probe(path).lease(RUN)
        assert lease is not None
        assert not lease.expired
        assert lease.holder_alive() is False
        mine = f"{HOST}:{os.getpid()}:newnew00"
        with Journal(path, write=True) as j:
            j.take_lease(RUN, mine)  # unexpired, but its holder is gone: taken over
        lease = probe(path).lease(RUN)
        assert lease is not None
        assert lease.owner == mine
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_lost_lease_found_at_a_group_commit_names_the_holder_and_writes_nothing(
        path: Path) -> None:
    """The outcome deferred into the next dispatch's commit is not written either.

    On PostgreSQL the lease and the rowcounts are checked on the server inside the one
    round trip of the transaction (``planrun_expect``); the holder comes back as detail.
    """
    mine = f"{HOST}:{os.getpid()}:aaaaaaaa"
    theirs = f"{HOST}:{os.getpid()}:bbbbbbbb"
    with Journal(path, write=True) as j:
        new_run(j)
        j.take_lease(RUN, mine, ttl=60.0)
        j.step_started(RUN, "a", attempt=1, key="k-a", root_run_id=RUN)
        j.renew_lease(RUN, mine, ttl=-1.0)  # expired: another process may take it over
        before = len(j.events(RUN))
        j.step_finished(RUN, "a", status="succeeded", key="k-a", output=1, defer=True)
        j.step_started(RUN, "b", attempt=1, key="k-b", root_run_id=RUN, defer=True)
        with Journal(path, write=True) as other:
            other.take_lease(RUN, theirs)
        with pytest.raises(LeaseLost) as caught:
            j.flush()
        j.drop_deferred()
    assert caught.value.code == "run_busy"
    assert f"held by {theirs}" in str(caught.value)
    seen = probe(path)
    assert (seen.step("a", RUN).status, seen.step("b", RUN).status) == ("running", "pending")
    with Journal(path, write=False) as j:
        assert len(j.events(RUN)) == before


def test_a_failed_check_late_in_a_transaction_rolls_back_its_earlier_writes(
        path: Path) -> None:
    """A dispatch of a finished step fails its rowcount check after the deferred outcome
    and its event were sent: none of them is written, the error names the step."""
    with Journal(path, write=True) as j:
        new_run(j)
        j.step_started(RUN, "a", attempt=1, key="k-a", root_run_id=RUN)
        j.step_started(RUN, "b", attempt=1, key="k-b", root_run_id=RUN)
        j.step_finished(RUN, "b", status="succeeded", key="k-b", output=2)
        before = len(j.events(RUN))
        j.step_finished(RUN, "a", status="succeeded", key="k-a", output=1, defer=True)
        j.step_started(RUN, "b", attempt=2, key="k-b2", root_run_id=RUN, defer=True)
        with pytest.raises(JournalError) as caught:
            j.flush()
        j.drop_deferred()
        assert "step 'b' of run" in str(caught.value)
        assert "is not pending" in str(caught.value)
        assert len(j.events(RUN)) == before
        assert j.succeeded_key("k-a") == (False, None)
        j.step_finished(RUN, "a", status="succeeded", key="k-a", output=1)  # still usable
    seen = probe(path)
    assert (seen.step("a", RUN).status, seen.step("b", RUN).status) == (
        "succeeded", "succeeded")


def _fan_run(j: Journal, items: int = 3) -> None:
    """A run whose step ``a`` is a fan-out of ``items`` pending items (and a lease)."""
    new_run(j)
    j.take_lease(RUN, f"{HOST}:{os.getpid()}:aaaaaaaa")
    j.fanout_begin(RUN, "a", items)


def test_items_that_start_together_are_claimed_as_each_alone_would_be(path: Path) -> None:
    """Deferred claims of one step share a commit: the same records and events in order.

    On PostgreSQL they are one batch claim (``FOR UPDATE SKIP LOCKED``), on SQLite one
    record per item; what the journal holds afterwards is the same.
    """
    with Journal(path, write=True) as j:
        _fan_run(j, 4)
        before = len(j.events(RUN))
        j.step_started(RUN, "a", attempt=2, key="k1", root_run_id=RUN, item=1, defer=True)
        j.step_started(RUN, "a", attempt=1, key="k0", root_run_id=RUN, item=0, defer=True)
        j.step_started(RUN, "a", attempt=1, key="k3", root_run_id=RUN, item=3, defer=True)
        assert j.pending_writes >= 1
        j.flush()
        assert j.pending_writes == 0
        started = [(e["kind"], e["item"], e["data"]) for e in j.events(RUN)[before:]]
        j.step_finished(RUN, "a", status="succeeded", key="k0", output="zero", item=0)
    assert started == [("step_started", 1, {"attempt": 2, "key": "k1"}),
                       ("step_started", 0, {"attempt": 1, "key": "k0"}),
                       ("step_started", 3, {"attempt": 1, "key": "k3"})]
    items = {i.index: i for i in probe(path).items("a", RUN)}
    assert {i: (r.status, r.attempts, r.idempotency_key) for i, r in items.items()} == {
        0: ("succeeded", 1, "k0"), 1: ("running", 2, "k1"), 2: ("pending", 0, None),
        3: ("running", 1, "k3")}
    with Journal(path, write=True) as j:
        assert j.succeeded_key("k0") == (True, "zero")


def test_a_batch_claim_with_an_item_that_is_not_pending_writes_nothing(path: Path) -> None:
    with Journal(path, write=True) as j:
        _fan_run(j)
        j.step_started(RUN, "a", attempt=1, key="k1", root_run_id=RUN, item=1)
        j.step_finished(RUN, "a", status="succeeded", key="k1", output=1, item=1)
        before = len(j.events(RUN))
        j.step_started(RUN, "a", attempt=1, key="k0", root_run_id=RUN, item=0, defer=True)
        j.step_started(RUN, "a", attempt=2, key="k1b", root_run_id=RUN, item=1, defer=True)
        with pytest.raises(JournalError) as caught:
            j.flush()
        j.drop_deferred()
        assert "step 'a' of run" in str(caught.value)
        assert "not pending" in str(caught.value)
        assert len(j.events(RUN)) == before
    items = {i.index: i.status for i in probe(path).items("a", RUN)}
    assert items == {0: "pending", 1: "succeeded", 2: "pending"}


# --- transactions --------------------------------------------------------------------------


@pytest.mark.sqlite
def test_a_failed_commit_is_rolled_back(path: Path) -> None:
    """COMMIT itself fails (a deferred foreign key): nothing stays, the connection is usable."""
    with Journal(path, write=True) as j:
        new_run(j)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA foreign_keys = ON")

    def orphan() -> None:
        with atomic(conn):
            conn.execute("PRAGMA defer_foreign_keys = ON")
            conn.execute("INSERT INTO steps (run_id, step_id, position, tool, status) "
                         "VALUES ('no-such-run', 's', 0, 't', 'pending')")

    with pytest.raises(sqlite3.IntegrityError):
        orphan()
    assert not conn.in_transaction
    assert conn.execute("SELECT count(*) FROM steps WHERE run_id = 'no-such-run'"
                        ).fetchone() == (0,)
    with atomic(conn):  # usable again
        conn.execute("UPDATE runs SET goal = 'after'")
    conn.close()
    assert probe(path).run(RUN).goal == "after"


# --- schema --------------------------------------------------------------------------------


@pytest.mark.sqlite
def test_a_journal_of_the_previous_version_migrates_and_resumes(cli: CliProject) -> None:
    """A run interrupted under schema version N-1 is resumed by this planrun."""
    cli.tools("""
tools:
  once:
    description: records its call
    python: crashtools:record
    idempotent: true
    arguments:
      type: object
      properties: {label: {type: string}}
      additionalProperties: false
""")
    cli.plan("chain", """
planrun: 1
goal: two steps
steps:
  - id: a
    tool: once
    arguments: {label: a}
  - id: b
    tool: once
    depends_on: [a]
    arguments: {label: b}
""")
    r = cli.run("execute", "chain", "--json", crash="dispatch:b")
    assert r.returncode == -9, r
    # Take the file back to what version N-1 wrote: the columns and index N added go.
    previous = sqlite3.connect(":memory:")
    for statements in MIGRATIONS[:-1]:
        for statement in statements:
            previous.execute(statement)
    conn = sqlite3.connect(cli.journal, isolation_level=None)
    # version 5 (issue 17) added the steps' facets
    conn.execute("ALTER TABLE steps DROP COLUMN facets_json")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION - 1}")

    def schema(c: sqlite3.Connection) -> list[Any]:
        return sorted(c.execute("SELECT type, name FROM sqlite_master "
                                "WHERE name NOT LIKE 'sqlite_%'").fetchall())

    def columns(c: sqlite3.Connection, table: str) -> list[Any]:
        return [r[1] for r in c.execute(f"PRAGMA table_info({table})")]

    assert schema(conn) == schema(previous)
    for table in ("runs", "steps", "items"):
        assert columns(conn, table) == columns(previous, table)
    conn.close()
    run_id = probe_run_id_without_migrating(cli.journal)
    r = cli.run("resume", run_id, "--json")
    assert r.returncode == 0, r
    assert r.json["status"] == "completed"
    check = sqlite3.connect(cli.journal)
    assert check.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    check.close()
    p = probe(cli.journal)
    assert [s.status for s in p.steps(run_id)] == ["succeeded", "succeeded"]
    assert p.run(run_id).lease is None
    assert p.run_ids() == [run_id]


def probe_run_id_without_migrating(journal: Path) -> str:
    conn = sqlite3.connect(f"{journal.resolve().as_uri()}?mode=ro", uri=True)
    try:
        ((run_id,),) = conn.execute("SELECT run_id FROM runs").fetchall()
    finally:
        conn.close()
    return str(run_id)


# --- locations -----------------------------------------------------------------------------


def test_a_url_of_another_scheme_is_refused_without_its_password(cli: CliProject) -> None:
    r = cli.run("runs", "--journal", "mysql://alice:s3cret@db.example/planrun")
    assert r.returncode == 6, r
    assert "error[journal]" in r.stderr or "journal" in r.stderr, r
    assert "mysql://alice:***@db.example/planrun" in r.stderr, r
    assert "s3cret" not in r.stderr + r.stdout, r
    assert "Traceback" not in r.stderr, r


def test_an_sqlite_url_is_the_file_it_names(cli: CliProject, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere" / "j.sqlite3"
    r = cli.run("execute", "--journal", f"sqlite://{target}", "--help")
    assert r.returncode == 0, r
    with Journal(f"sqlite://{target}", write=True) as j:
        new_run(j)
    assert target.is_file()
    assert probe(target).run_ids() == [RUN]


def test_settings_keep_a_url_as_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from planrun.paths import load_settings

    url = "postgresql://u@h:5432/db?sslmode=require"
    assert load_settings(journal=url, cwd=tmp_path).journal == url
    monkeypatch.setenv("PLANRUN_JOURNAL", url)
    assert load_settings(cwd=tmp_path).journal == url
    (tmp_path / "planrun.toml").write_text(f'journal = "{url}"\n')
    monkeypatch.delenv("PLANRUN_JOURNAL")
    assert load_settings(cwd=tmp_path).journal == url
    with pytest.raises(JournalError, match="postgresql://u@h:5432/db"):
        Journal(url, write=False)
