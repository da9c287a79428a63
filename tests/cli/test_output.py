"""The command line, ``planrun output``: a step's output as JSON, an unknown step
(SPEC §4, §5, §8, §9; through ``typer.testing.CliRunner``)."""

from __future__ import annotations

from typing import Any

from conftest import Project

from .support import (
    as_json,
    invoke,
)


def test_output_prints_the_steps_output_as_json(proj: Project, done: dict[str, Any]) -> None:
    result = invoke(proj, "output", done["run_id"], "greet")
    assert result.exit_code == 0
    assert as_json(result) == {"value": "hello world"}
    result = invoke(proj, "output", done["run_id"], "each")
    assert as_json(result) == [{"value": 1}, {"value": 2}, {"value": 3}]
    result = invoke(proj, "output", done["run_id"], "each", "--item", "1")
    assert as_json(result) == {"value": 2}


def test_output_of_an_unknown_step(proj: Project, done: dict[str, Any]) -> None:
    result = invoke(proj, "output", done["run_id"], "nope")
    assert result.exit_code == 2
    assert "greet" in result.stderr  # lists the steps that exist
