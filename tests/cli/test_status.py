"""The command line, ``planrun status``: the manifest as JSON and as text
(SPEC §4, §5, §8, §9; through ``typer.testing.CliRunner``)."""

from __future__ import annotations

from typing import Any

from conftest import Project

from .support import (
    as_json,
    invoke,
)


def test_status_json_is_the_manifest(proj: Project, done: dict[str, Any]) -> None:
    result = invoke(proj, "status", done["run_id"], "--json")
    assert result.exit_code == 0
    assert as_json(result) == done


def test_status_text(proj: Project, done: dict[str, Any]) -> None:
    result = invoke(proj, "status", done["run_id"])
    assert result.exit_code == 0
    assert done["run_id"] in result.stdout
    assert "completed" in result.stdout
