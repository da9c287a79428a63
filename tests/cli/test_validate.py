"""The command line, ``planrun validate``: text, JSON and GitHub formats, every problem, params
(SPEC §4, §5, §8, §9; through ``typer.testing.CliRunner``)."""

from __future__ import annotations

import re

from conftest import Project

from .support import (
    as_json,
    invoke,
)


def test_validate_text_ok(proj: Project) -> None:
    result = invoke(proj, "validate")
    assert result.exit_code == 0, result.output
    assert "plans/hello.yaml: ok" in result.stdout
    assert "2 plan(s) checked, 2 ok, 0 refused" in result.stdout


def test_validate_text_lists_every_problem(broken: Project) -> None:
    result = invoke(broken, "validate", "broken")
    assert result.exit_code == 3
    lines = result.stdout.splitlines()
    assert any(re.match(r"^plans/broken\.yaml:4:\d+: error\[unknown_tool\]: .*'echo'", line)
               for line in lines), result.stdout
    assert any(re.match(r"^plans/broken\.yaml:5:\d+: error\[arguments\]: .*extra", line)
               for line in lines), result.stdout
    assert result.stderr == ""  # the report goes to stdout


def test_validate_json(broken: Project) -> None:
    result = invoke(broken, "validate", "--format", "json")
    assert result.exit_code == 3
    report = as_json(result)
    assert set(report) == {"ok", "issues", "plans"}
    assert report["ok"] is False
    assert report["issues"] == []
    by_file = {p["file"]: p for p in report["plans"]}
    assert set(by_file) == {"plans/broken.yaml", "plans/failing.yaml", "plans/hello.yaml"}
    assert by_file["plans/hello.yaml"]["ok"] is True
    assert by_file["plans/hello.yaml"]["issues"] == []
    assert by_file["plans/hello.yaml"]["plan"]["name"] == "hello"
    bad = by_file["plans/broken.yaml"]
    assert bad["ok"] is False
    assert {"file", "ok", "issues", "plan"} <= set(bad)
    issues = {i["code"]: i for i in bad["issues"]}
    assert set(issues) == {"unknown_tool", "arguments"}
    tool = issues["unknown_tool"]
    assert {"code", "severity", "message", "step", "path", "file", "line",
            "column"} <= set(tool)
    assert (tool["severity"], tool["step"], tool["path"], tool["file"], tool["line"]) == (
        "error", "a", "/steps/0/tool", "plans/broken.yaml", 4)
    assert isinstance(tool["column"], int)
    assert issues["arguments"]["path"] == "/steps/1/arguments/extra"


def test_validate_json_ok(proj: Project) -> None:
    result = invoke(proj, "validate", "--format", "json", "hello")
    assert result.exit_code == 0
    report = as_json(result)
    assert report["ok"] is True
    assert [p["file"] for p in report["plans"]] == ["plans/hello.yaml"]


def test_validate_github(broken: Project) -> None:
    result = invoke(broken, "validate", "--format", "github", "broken")
    assert result.exit_code == 3
    annotations = [line for line in result.stdout.splitlines() if line.startswith("::")]
    assert len(annotations) == 2
    assert re.match(r"^::error file=plans/broken\.yaml,line=4,col=\d+(,[^:]*)?::.*ecko",
                    annotations[0]), annotations[0]
    assert re.match(r"^::error file=plans/broken\.yaml,line=5,col=\d+(,[^:]*)?::.*extra",
                    annotations[1]), annotations[1]


def test_validate_with_params_checks_the_concrete_plan(proj: Project) -> None:
    result = invoke(proj, "validate", "hello", "-p", "times=two")
    assert result.exit_code == 3
    assert "param_type" in result.stdout
