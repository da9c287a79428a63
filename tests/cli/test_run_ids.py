"""The command line, run ids across the reading commands: prefixes, ambiguity, unknown runs
(SPEC §4, §5, §8, §9; through ``typer.testing.CliRunner``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from conftest import Project
from planrun.journal import Journal, now

from .support import (
    as_json,
    invoke,
)


@pytest.mark.parametrize("command", [["status"], ["log"], ["output", "greet"]])
def test_run_id_prefixes_of_4_or_more_characters(proj: Project, done: dict[str, Any],
                                                 command: list[str]) -> None:
    run_id = done["run_id"]
    name, *rest = command
    for n in (4, 7, len(run_id)):
        result = invoke(proj, name, run_id[:n], *rest, "--json") if name != "output" else \
            invoke(proj, name, run_id[:n], *rest)
        assert result.exit_code == 0, (n, result.output)
    result = invoke(proj, name, run_id[:3], *rest)
    assert result.exit_code == 5
    assert "unknown_run" in result.stderr


def _fake_runs(journal: Path, ids: Sequence[str]) -> None:
    with Journal(journal, write=True) as j:
        for run_id in ids:
            j.create_run(run={"run_id": run_id, "root_run_id": run_id, "plan_name": "p",
                              "plan_json": "{}", "digest": "d", "revision": 1,
                              "params_json": "{}", "contracts_json": "{}",
                              "status": "completed", "created_at": now(),
                              "finished_at": now()}, steps=[])


def test_an_ambiguous_prefix_exits_5(proj: Project) -> None:
    _fake_runs(proj.settings().journal, ["beef000000000001", "beef000000000002"])
    result = invoke(proj, "status", "beef")
    assert result.exit_code == 5
    assert "ambiguous" in result.stderr
    assert invoke(proj, "status", "beef000000000002", "--json").exit_code == 0


@pytest.mark.parametrize("command", [["status"], ["log"], ["output", "a"], ["resume"],
                                     ["retry"], ["resolve", "a", "--failed"]])
def test_an_unknown_run_exits_5(proj: Project, done: dict[str, Any],
                                command: list[str]) -> None:
    name, *rest = command
    result = invoke(proj, name, "ffffffffffff", *rest)
    assert result.exit_code == 5, result.output
    assert "unknown_run" in result.stderr


def test_an_unknown_run_with_json(proj: Project, done: dict[str, Any]) -> None:
    result = invoke(proj, "status", "ffffffffffff", "--json")
    assert result.exit_code == 5
    assert as_json(result)["error"]["code"] == "unknown_run"


def test_an_unknown_run_on_an_empty_journal_exits_5(proj: Project) -> None:
    result = invoke(proj, "status", "abcdef123456")
    assert result.exit_code == 5
    assert not proj.settings().journal.exists()
