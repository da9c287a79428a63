"""Fixtures of the per-command CLI tests: a project with the CLI tools and plans."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import Project

from .support import (
    BROKEN,
    FAILING,
    HELLO,
    MODULE,
    TOOLS,
    execute_json,
)


@pytest.fixture
def proj(project: Project, monkeypatch: pytest.MonkeyPatch) -> Project:
    monkeypatch.chdir(project.root)  # files are shown relative to the current folder
    project.write_tools(TOOLS, module=MODULE, module_name="clitools")
    project.write_plan("hello", HELLO)
    project.write_plan("failing", FAILING)
    return project


@pytest.fixture
def broken(proj: Project) -> Project:
    proj.write_plan("broken", BROKEN)
    return proj


@pytest.fixture
def done(proj: Project) -> dict[str, Any]:
    """The manifest of a completed ``hello`` run."""
    result, m = execute_json(proj, "hello")
    assert result.exit_code == 0, result.output
    return m
