"""status, runs, log, output and report read one state of the journal (SQLite).

Each is several queries. A run going on meanwhile commits between them: without a read
transaction, ``planrun status`` showed the run ``running`` (read first) beside a step its
later commit had finished (read second), and a report could count items that do not add
up. The commit is made here at the worst moment, by another connection, from the trace
callback of the reader's own connection (called as each statement starts).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from planrun import reading
from planrun.journal import Journal, now
from planrun.paths import load_settings

pytestmark = pytest.mark.sqlite

RUN = "0123456789abcdef"


def _running_run(path: Path, project: Path) -> None:
    """A run ``running``: step ``a`` running, ``b`` pending."""
    with Journal(path, write=True) as journal:
        journal.create_run(run={
            "run_id": RUN, "root_run_id": RUN, "parent_run_id": None, "plan_name": "p",
            "plan_file": "plans/p.yaml", "plan_json": "{}", "digest": "0" * 64,
            "revision": 1, "goal": "a test", "params_json": "{}", "contracts_json": "{}",
            "status": "running", "created_at": now(), "project": str(project.resolve()),
        }, steps=[("a", 0, "echo"), ("b", 1, "echo")])
        journal.conn.execute("UPDATE steps SET status = 'running' WHERE step_id = 'a'")


def _finish_the_run(path: Path) -> None:
    """What the run's own process commits next: both steps done, the run completed."""
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("UPDATE steps SET status = 'succeeded', output_json = '1' "
                     "WHERE run_id = ?", (RUN,))
        conn.execute("UPDATE runs SET status = 'completed' WHERE run_id = ?", (RUN,))
        conn.execute("COMMIT")


@pytest.fixture
def commit_at(monkeypatch: pytest.MonkeyPatch, tmp_path: Path
              ) -> Callable[[str], Path]:
    """``commit_at(TEXT)``: finish the run as the reader's first statement with TEXT starts."""
    path = tmp_path / "journal.sqlite3"
    _running_run(path, tmp_path)
    real = reading._reader

    def arm(text: str) -> Path:
        def reader(settings: Any, write: bool = False) -> Any:
            journal = real(settings, write)
            done = False

            def trace(sql: str) -> None:
                nonlocal done
                if not done and text in sql:
                    done = True
                    _finish_the_run(path)

            journal.conn.set_trace_callback(trace)
            return journal

        monkeypatch.setattr(reading, "_reader", reader)
        return path
    return arm


def _settings(tmp_path: Path) -> Any:
    return load_settings(project=tmp_path, journal=tmp_path / "journal.sqlite3")


def test_status_shows_the_run_and_its_steps_as_of_one_moment(
        commit_at: Callable[[str], Path], tmp_path: Path) -> None:
    commit_at("FROM steps")
    shown = reading.status(_settings(tmp_path), RUN)
    steps = {s["id"]: s["status"] for s in shown["steps"]}
    assert (shown["status"], steps) == ("running", {"a": "running", "b": "pending"})
    # the commit is there for the next read
    again = reading.status(_settings(tmp_path), RUN)
    assert again["status"] == "completed"
    assert {s["status"] for s in again["steps"]} == {"succeeded"}


def test_report_shows_the_run_as_of_one_moment(commit_at: Callable[[str], Path],
                                               tmp_path: Path) -> None:
    commit_at("FROM steps")
    _, page = reading.report(_settings(tmp_path), RUN)
    _, later = reading.report(_settings(tmp_path), RUN)
    assert page.count("succeeded") < later.count("succeeded")
    assert page.count("running") > later.count("running")
