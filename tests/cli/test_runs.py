"""The command line, ``planrun runs``: the JSON summary, a journal that does not exist yet
(SPEC §4, §5, §8, §9; through ``typer.testing.CliRunner``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import Project

from .support import (
    COUNT_KEYS,
    RUN_SUMMARY_KEYS,
    as_json,
    assert_utc,
    execute_json,
    invoke,
)


def test_runs_json(proj: Project, done: dict[str, Any]) -> None:
    failed_result, failed = execute_json(proj, "failing")
    assert failed_result.exit_code == 1
    result = invoke(proj, "runs", "--json")
    assert result.exit_code == 0
    rows = as_json(result)
    assert [r["run_id"] for r in rows] == [failed["run_id"], done["run_id"]]  # newest first
    for row in rows:
        assert set(row) == RUN_SUMMARY_KEYS
        assert set(row["counts"]) == COUNT_KEYS
        assert_utc(row["started_at"])
        assert_utc(row["finished_at"])
    assert (rows[1]["plan"], rows[1]["revision"], rows[1]["status"]) == ("hello", 2,
                                                                         "completed")
    assert rows[0]["counts"]["failed"] == 1
    only = as_json(invoke(proj, "runs", "--json", "--status", "failed"))
    assert [r["run_id"] for r in only] == [failed["run_id"]]
    only = as_json(invoke(proj, "runs", "--json", "--plan", "hello"))
    assert [r["run_id"] for r in only] == [done["run_id"]]
    assert len(as_json(invoke(proj, "runs", "--json", "--limit", "1"))) == 1


def test_runs_on_a_journal_that_does_not_exist_yet(proj: Project, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "j.sqlite3"
    result = invoke(proj, "runs", "--json", "--journal", str(missing))
    assert result.exit_code == 0
    assert as_json(result) == []
    assert not missing.parent.exists()


def test_usage_messages_are_planruns_words_not_pydantics(tmp_path: Path) -> None:
    """Typer converts with pydantic, whose words reached the operator (found by a fresh
    operator): "Input should be greater than or equal to 1", "Value error, …", and
    ``--older-than 0d`` was told to "give a number and a unit"."""
    import os

    from harness import run_planrun

    env = dict(os.environ, PLANRUN_JOURNAL=str(tmp_path / "j.sqlite3"))
    for args, words in (
            (["runs", "--limit", "0"], "'--limit': must be at least 1"),
            (["runs", "--limit", "x"], "'--limit': must be a whole number"),
            (["runs", "--status", "bogus"], "'--status': 'bogus' is not one of 'running'"),
            (["prune", "--older-than", "0d"], "the age must be more than 0"),
            (["prune", "--older-than", "soon"], "give a number and a unit")):
        res = run_planrun(*args, cwd=tmp_path, env=env)
        assert res.returncode == 2, (args, res)
        assert "error[usage]" in res.stderr
        assert words in res.stderr, (args, res.stderr)
        assert "Input should" not in res.stderr
        assert "Value error" not in res.stderr
