"""The command line, ``planrun log``: JSON events, tracebacks only when asked
(SPEC §4, §5, §8, §9; through ``typer.testing.CliRunner``)."""

from __future__ import annotations

from typing import Any

from typer.testing import CliRunner

from conftest import Project
from planrun.cli import app

from .support import (
    as_json,
    assert_utc,
    execute_json,
    invoke,
)


def test_log_json(proj: Project, done: dict[str, Any]) -> None:
    result = invoke(proj, "log", done["run_id"], "--json")
    assert result.exit_code == 0
    events = as_json(result)
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "planned"
    assert kinds[-1] == "run_finished"
    assert kinds.count("step_started") == 2 + 1 + 3  # plain steps, the fan-out, its items
    for e in events:
        assert_utc(e["ts"])
    started = [e for e in events if e["kind"] == "step_started" and e["step"] == "greet"]
    assert started[0]["data"]["attempt"] == 1


def test_log_hides_tracebacks_unless_asked(proj: Project) -> None:
    _result, m = execute_json(proj, "failing")
    plain = invoke(proj, "log", m["run_id"], "--json")
    failed = [e for e in as_json(plain) if e["kind"] == "step_failed"]
    assert failed
    assert "traceback" not in failed[0]["data"]
    assert failed[0]["data"]["error"]["message"] == "ValueError: cannot handle 2"
    full = CliRunner().invoke(app, ["log", m["run_id"], "--tracebacks"])
    assert full.exit_code == 0
    assert "Traceback" in full.stdout  # the tool's, kept in the journal and shown on demand
    text = CliRunner().invoke(app, ["log", m["run_id"], "-C", str(proj.root)])
    assert "Traceback" not in text.output
