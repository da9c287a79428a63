"""What the per-command CLI tests share: the project's tools and plans, and
``invoke`` (``planrun ARGS -C PROJECT`` through ``typer.testing.CliRunner``)."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from conftest import Project
from harness import asset
from planrun.cli import app

MODULE = '''
from pathlib import Path

HERE = Path(__file__).resolve().parent


def echo(value):
    with open(HERE / "calls.log", "a", encoding="utf-8") as f:
        f.write(f"{value}\\n")
    return {"value": value}


def boom(value):
    raise ValueError(f"cannot handle {value!r}")


def chatty(value):
    print(f"chatty tool says {value}")
    return {"value": value}
'''

TOOLS = asset("registries/cli.yaml")

HELLO = """
planrun: 1
name: hello
revision: 2
goal: Say hello
params:
  who: {type: string, default: world}
  times: {type: integer, default: 1}
steps:
  - {id: greet, tool: echo, arguments: {value: "hello {params.who}"}}
  - {id: count, tool: echo, depends_on: [greet], arguments: {value: "{params.times}"}}
  - id: each
    tool: echo
    depends_on: [greet]
    for_each: [1, 2, 3]
    arguments: {value: "{item}"}
"""

FAILING = """
planrun: 1
goal: Fail on purpose
steps:
  - {id: ok, tool: echo, arguments: {value: 1}}
  - {id: bad, tool: boom, depends_on: [ok], arguments: {value: 2}}
  - {id: never, tool: echo, depends_on: [bad], arguments: {value: 3}}
"""

BROKEN = """
planrun: 1
goal: Has problems
steps:
  - {id: a, tool: ecko, arguments: {value: 1}}
  - {id: b, tool: echo, arguments: {value: 1, extra: 2}}
"""

RFC3339_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?\+00:00$")

# SPEC §5's keys, plus wall_s (issue 10: duration_s is working time, wall_s clock time)
# and output_bytes (issue 17: the run's total of its steps' output_bytes).
MANIFEST_KEYS = {"run_id", "root_run_id", "parent_run_id", "plan", "goal", "status", "params",
                 "started_at", "finished_at", "duration_s", "counts", "steps", "resumable",
                 "next", "wall_s", "output_bytes"}
PLAN_KEYS = {"name", "revision", "digest", "file"}
# SPEC §5's, plus partial (issue 17: a fan-out with on_item_error skip|collect).
COUNT_KEYS = {"total", "pending", "running", "succeeded", "partial", "failed", "skipped",
              "indeterminate"}
STEP_KEYS = {"id", "tool", "status", "attempts", "started_at", "finished_at", "duration_s",
             "output_bytes", "replayed", "approved_by", "error"}
# SPEC §8's keys, plus the run's project folder (issue 10: one journal, many projects).
RUN_SUMMARY_KEYS = {"run_id", "plan", "revision", "status", "started_at", "finished_at",
                    "counts", "project", "parent_run_id", "retried_as"}



def invoke(project: Project | None, *args: str, input: str | None = None) -> Result:
    """``planrun ARGS -C PROJECT``; asserts that no exception other than an exit escaped."""
    argv = list(args)
    if project is not None:
        argv += ["-C", str(project.root)]
    result = CliRunner().invoke(app, argv, input=input)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        result.exception, result.output)
    assert "Traceback" not in result.output, result.output
    return result


def as_json(result: Result) -> Any:
    try:
        return json.loads(result.stdout)
    except ValueError:
        pytest.fail(f"stdout is not JSON (exit {result.exit_code}):\n{result.stdout}\n"
                    f"stderr:\n{result.stderr}")


def execute_json(project: Project, plan: str, *extra: str) -> tuple[Result, dict[str, Any]]:
    result = invoke(project, "execute", plan, "--json", *extra)
    return result, as_json(result)


def calls(project: Project) -> list[str]:
    log = project.root / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def assert_utc(value: str) -> None:
    assert RFC3339_UTC.match(value), value
    from datetime import datetime

    assert datetime.fromisoformat(value).utcoffset() == timedelta(0)


#: An irreversible tool to add to the project's registry (approval tests).
WIPE_TOOL = """
  wipe:
    python: clitools:echo
    irreversible: true
    arguments:
      type: object
      properties:
        value: {}
      required: [value]
      additionalProperties: false
"""
