"""prune and forget give space back without holding the journal for long (SQLite).

A prune of nine runs of 190 MB each deleted them all in one write transaction and then
rewrote the file with ``VACUUM``: the journal's write lock was held for 15 s, a nightly
run going on meanwhile stalled that long between two steps, and a larger journal would
have made it fail (another writer waits ``busy_timeout``, 30 s). Now each run goes in a
transaction of its own and a journal file made by planrun (``auto_vacuum=INCREMENTAL``)
gives its free pages back 1,024 at a time; one made before keeps them for reuse until
``prune --vacuum`` rewrites it. Real ``planrun`` processes on real journal files; the
transactions are read off the journal's own SQLite connection (its statement trace).
"""

from __future__ import annotations

import json
import os
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from harness import run_planrun
from planrun.journal import Journal
from planrun.journal.backends.sqlite import RECLAIM_PAGES

TOOLS = """\
tools:
  blob:
    description: Some KiB of text
    python: blob_tools:blob
    blocking: false
    arguments: {type: object, properties: {kib: {type: integer}}, required: [kib]}
"""
BLOB_TOOLS = """\
def blob(kib):
    return "x" * (kib * 1024)
"""
#: Four items of 1 MiB: 4 MiB of outputs a run (the items' and the step's assembled list).
PLAN = """\
planrun: 1
name: blobs
goal: write some MiB into the journal
steps:
  - id: b
    tool: blob
    for_each: [1024, 1024, 1024, 1024]
    arguments: {kib: "{item}"}
"""


def _project(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    app = tmp_path / "app"
    (app / "plans").mkdir(parents=True)
    (app / "tools.yaml").write_text(TOOLS)
    (app / "blob_tools.py").write_text(BLOB_TOOLS)
    (app / "plans" / "blobs.yaml").write_text(PLAN)
    env = {**os.environ, "PLANRUN_JOURNAL": str(tmp_path / "journal.sqlite3")}
    return app, env


def _execute(app: Path, env: dict[str, str], runs: int) -> list[str]:
    ids = []
    for _ in range(runs):
        res = run_planrun("execute", "blobs", "--json", cwd=app, env=env)
        assert res.returncode == 0, res
        ids.append(json.loads(res.stdout)["run_id"])
    return ids


def _pragma(journal: Path, name: str) -> int:
    with closing(sqlite3.connect(journal)) as conn:
        return int(conn.execute(f"PRAGMA {name}").fetchone()[0])


@pytest.mark.sqlite
def test_a_new_journal_file_gives_freed_pages_back_in_pieces(tmp_path: Path) -> None:
    app, env = _project(tmp_path)
    _execute(app, env, 1)
    assert _pragma(tmp_path / "journal.sqlite3", "auto_vacuum") == 2  # INCREMENTAL


@pytest.mark.sqlite
def test_prune_deletes_each_run_in_its_own_transaction_then_reclaims_in_pieces(
        tmp_path: Path) -> None:
    app, env = _project(tmp_path)
    path = tmp_path / "journal.sqlite3"
    ids = _execute(app, env, 4)
    pages_before = _pragma(path, "page_count")
    statements: list[str] = []
    with Journal(path, write=True) as journal:
        assert journal.conn is not None
        journal.conn.set_trace_callback(lambda sql: statements.append(sql.strip()))
        counts = journal.delete_runs(ids[:3])
    assert counts["runs"] == 3
    # one write transaction a run: BEGIN IMMEDIATE ... DELETE FROM runs ... COMMIT
    transactions: list[list[str]] = []
    for sql in statements:
        if sql.startswith("BEGIN"):
            transactions.append([])
        elif transactions:
            transactions[-1].append(sql)
    deleting = [t for t in transactions if any(s.startswith("DELETE FROM runs") for s in t)]
    assert len(deleting) == 3
    assert all(sum(s.startswith("DELETE FROM runs") for s in t) == 1 for t in deleting)
    # 12 MiB freed: given back RECLAIM_PAGES at a time, never by rewriting the whole file
    pieces = [t for t in transactions
              if any(s.startswith("PRAGMA incremental_vacuum") for s in t)]
    assert len(pieces) >= 3
    assert all(f"incremental_vacuum({RECLAIM_PAGES})" in " ".join(t) for t in pieces)
    assert not any(s.strip().upper() == "VACUUM" for s in statements)
    assert counts["free_bytes"] == 0
    page = _pragma(path, "page_size")
    assert counts["reclaimed_bytes"] >= 12 * 2**20
    assert _pragma(path, "page_count") * page <= pages_before * page - 12 * 2**20
    # the run that was kept is whole
    res = run_planrun("output", ids[3], "b", cwd=app, env=env)
    assert res.returncode == 0, res
    assert [len(x) for x in json.loads(res.stdout)] == [1024 * 1024] * 4


@pytest.mark.sqlite
def test_prune_and_forget_say_how_much_space_went_back(tmp_path: Path) -> None:
    app, env = _project(tmp_path)
    path = tmp_path / "journal.sqlite3"
    first, second, third = _execute(app, env, 3)
    size = path.stat().st_size
    res = run_planrun("forget", first, cwd=app, env=env)
    assert res.returncode == 0, res
    assert "MiB given back to the disk" in res.stdout
    assert path.stat().st_size <= size - 4 * 2**20  # the file itself is smaller
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("UPDATE runs SET created_at = '2020-01-01T00:00:00.000+00:00'")
    res = run_planrun("prune", "--older-than", "30d", "--json", cwd=app, env=env)
    assert res.returncode == 0, res
    out = json.loads(res.stdout)
    assert sorted(out["deleted"]) == sorted([second, third])
    assert out["reclaimed_bytes"] >= 8 * 2**20
    assert out["free_bytes"] == 0


@pytest.mark.sqlite
def test_a_journal_made_before_keeps_free_pages_until_prune_vacuum(tmp_path: Path) -> None:
    app, env = _project(tmp_path)
    path = tmp_path / "journal.sqlite3"
    ids = _execute(app, env, 3)
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA auto_vacuum = NONE")  # as an earlier planrun made it
        conn.execute("VACUUM")
        assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 0
        conn.execute("UPDATE runs SET created_at = '2020-01-01T00:00:00.000+00:00' "
                     "WHERE run_id != ?", (ids[2],))
    res = run_planrun("forget", ids[0], cwd=app, env=env)
    assert res.returncode == 0, res
    assert "given back to the disk" not in res.stdout
    assert "stay free inside the journal" in res.stdout
    res = run_planrun("prune", "--older-than", "30d", cwd=app, env=env)
    assert res.returncode == 0, res
    assert "1 run(s) deleted" in res.stdout
    assert "given back to the disk" not in res.stdout
    assert "stay free inside the journal" in res.stdout
    assert "--vacuum" in res.stdout
    free = _pragma(path, "freelist_count")
    assert free * _pragma(path, "page_size") >= 8 * 2**20  # kept for later runs
    size = path.stat().st_size
    # --vacuum with nothing left to delete still rewrites the file, and says so
    res = run_planrun("prune", "--older-than", "36525d", "--vacuum", cwd=app, env=env)
    assert res.returncode == 0, res
    assert "0 run(s) deleted" in res.stdout
    assert "rewrote the journal: " in res.stdout
    assert "MiB given back to the disk" in res.stdout
    res = run_planrun("prune", "--older-than", "30d", "--vacuum", "--json", cwd=app, env=env)
    assert res.returncode == 0, res
    out = json.loads(res.stdout)
    assert out["deleted"] == []
    assert out["reclaimed_bytes"] == 0  # the first rewrite gave it all back
    assert out["free_bytes"] == 0
    assert path.stat().st_size <= size - 8 * 2**20
    assert _pragma(path, "auto_vacuum") == 2  # from now on, in pieces
    res = run_planrun("output", ids[2], "b", cwd=app, env=env)
    assert res.returncode == 0, res


def test_prune_and_forget_on_every_backend(tmp_path: Path, journal_location: Path | str
                                           ) -> None:
    """The journal conformance part of it: runs go whole, the others stay, the JSON shape."""
    app, env = _project(tmp_path)
    env["PLANRUN_JOURNAL"] = str(journal_location)
    first, second, third = _execute(app, env, 3)
    res = run_planrun("forget", first, "--json", cwd=app, env=env)
    assert res.returncode == 0, res
    out = json.loads(res.stdout)
    assert out["deleted"] == [first]
    assert isinstance(out["reclaimed_bytes"], int)
    assert isinstance(out["free_bytes"], int)
    res = run_planrun("prune", "--older-than", "1s", "--dry-run", "--json", cwd=app, env=env)
    assert res.returncode == 0, res
    res = run_planrun("runs", "--json", cwd=app, env=env)
    assert sorted(r["run_id"] for r in json.loads(res.stdout)) == sorted([second, third])
    res = run_planrun("prune", "--older-than", "100w", "--vacuum", "--json", cwd=app, env=env)
    assert res.returncode == 0, res  # nothing that old: nothing deleted, the file rewritten
    assert json.loads(res.stdout)["deleted"] == []
    res = run_planrun("output", third, "b", cwd=app, env=env)
    assert res.returncode == 0, res
    assert [len(x) for x in json.loads(res.stdout)] == [1024 * 1024] * 4


@pytest.mark.parametrize("age", ["740000d", "110000w", "9999999999999s",
                                 "99999999999999999999d", "36526d", "1" + "0" * 5000 + "s"])
def test_an_age_past_100_years_is_a_usage_error(tmp_path: Path, age: str) -> None:
    """``--older-than 740000d`` went before the year 1 and ended prune with a traceback
    (OverflowError; found by a fresh operator); 5,000 digits were past int()'s limit."""
    app, env = _project(tmp_path)
    res = run_planrun("prune", "--older-than", age, "--dry-run", cwd=app, env=env)
    assert res.returncode == 2, res
    assert "error[usage]" in res.stderr
    assert "at most 100 years" in res.stderr
    assert "Traceback" not in res.stderr
    assert run_planrun("prune", "--older-than", "36525d", "--dry-run", cwd=app,
                       env=env).returncode == 0
