"""The command line, an unusable journal (a folder, not a database, a newer schema) exits 6
(SPEC §4, §5, §8, §9; through ``typer.testing.CliRunner``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from conftest import Project
from planrun.journal import SCHEMA_VERSION

from .support import (
    calls,
    invoke,
)

# --- unusable journals ----------------------------------------------------------------------------


def _newer(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()


@pytest.mark.sqlite
@pytest.mark.parametrize("kind", ["directory", "not-a-database", "newer-schema"])
@pytest.mark.parametrize("command", [["runs"], ["status", "abcdef123456"],
                                     ["execute", "hello"]])
def test_an_unusable_journal_exits_6(proj: Project, tmp_path: Path, kind: str,
                                     command: list[str]) -> None:
    path = tmp_path / "bad-journal"
    if kind == "directory":
        path.mkdir()
    elif kind == "not-a-database":
        path.write_text("not a database, just text\n" * 10)
    else:
        _newer(path)
    result = invoke(proj, *command, "--journal", str(path))
    assert result.exit_code == 6, result.output
    assert "error[journal]" in result.stderr
    assert str(path) in result.stderr
    assert calls(proj) == []
