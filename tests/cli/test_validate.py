"""The command line, ``planrun validate``: text, JSON and GitHub formats, every problem, params
(SPEC §4, §5, §8, §9; through ``typer.testing.CliRunner``)."""

from __future__ import annotations

import json
import re
import sys
import tempfile
from typing import Any

import pytest
import yaml

from conftest import Project

from .support import (
    BROKEN,
    FAILING,
    HELLO,
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


# --- `validate -`: one plan from standard input (issue 13, SPEC §10) -------------------------


def _stdin(proj: Project, text: str | bytes, *args: str) -> Any:
    """``planrun validate - ARGS`` as a real process with ``text`` piped on stdin."""
    from harness import run_planrun

    data = text.encode() if isinstance(text, str) else text
    with tempfile.TemporaryFile() as f:
        f.write(data)
        f.seek(0)
        return run_planrun("validate", "-", *args, cwd=proj.root, stdin=f)


def test_validate_stdin_reads_one_yaml_plan(proj: Project) -> None:
    res = _stdin(proj, HELLO, "--format", "json")
    assert res.returncode == 0, res.stderr
    (plan,) = json.loads(res.stdout)["plans"]
    assert (plan["file"], plan["ok"], plan["plan"]["name"]) == ("<stdin>", True, "hello")


def test_validate_stdin_reads_json_and_names_it_stdin_in_text(proj: Project) -> None:
    doc = yaml.safe_load(BROKEN)
    res = _stdin(proj, json.dumps(doc, indent=1))
    assert res.returncode == 3, res.stdout
    assert re.search(r"^<stdin>:\d+:\d+: error\[unknown_tool\]", res.stdout, re.M), res.stdout
    assert re.search(r"^<stdin>:\d+:\d+: error\[arguments\]", res.stdout, re.M), res.stdout


def test_validate_stdin_with_named_plans(proj: Project) -> None:
    res = _stdin(proj, FAILING, "hello", "--format", "json")
    assert res.returncode == 0, res.stderr
    files = [p["file"] for p in json.loads(res.stdout)["plans"]]
    assert files == ["<stdin>", "plans/hello.yaml"]
    plan = json.loads(res.stdout)["plans"][0]["plan"]
    assert plan["name"] == "stdin"  # a plan without a name is called after where it came from


@pytest.mark.parametrize("text", ["", "  \n\n"])
def test_validate_empty_stdin_is_an_empty_issue(proj: Project, text: str) -> None:
    res = _stdin(proj, text, "--format", "json")
    assert res.returncode == 3, res.stdout
    (plan,) = json.loads(res.stdout)["plans"]
    assert [(i["code"], i["file"]) for i in plan["issues"]] == [("empty", "<stdin>")]
    assert "standard input is empty" in plan["issues"][0]["message"]


def test_validate_stdin_syntax_and_non_utf8(proj: Project) -> None:
    res = _stdin(proj, "planrun: 1\nsteps: [\n")
    assert res.returncode == 3
    assert re.search(r"^<stdin>:\d+:\d+: error\[syntax\]", res.stdout, re.M), res.stdout
    res = _stdin(proj, b"planrun: 1\ngoal: \xff\n")
    assert res.returncode == 3
    assert "error[syntax]" in res.stdout
    assert "not UTF-8" in res.stdout


def test_validate_stdin_twice_is_a_usage_error(proj: Project) -> None:
    res = _stdin(proj, HELLO, "-")
    assert res.returncode == 2
    assert "only once" in res.stderr


def test_validate_stdin_on_a_terminal_is_a_usage_error_not_a_wait(proj: Project) -> None:
    pexpect = pytest.importorskip("pexpect")
    child = pexpect.spawn(sys.executable, ["-m", "planrun", "validate", "-"],
                          cwd=str(proj.root), encoding="utf-8", timeout=30)
    child.expect("terminal")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 2


# --- `validate --format json`: the plan as substituted (issue 13, SPEC §4, §10) --------------

SUBST = """
planrun: 1
name: subst
goal: Show the plan as substituted
params:
  who: {type: string, default: world}
  n: {type: integer}
  items: {type: array, default: [1, 2]}
  token: {type: string, secret: true, default: hunter2-secret}
steps:
  - {id: greet, tool: echo, arguments: {value: "hello {params.who} x{params.n}"}}
  - {id: auth, tool: echo, depends_on: [greet], arguments: {value: "{params.token}"}}
  - id: each
    tool: echo
    depends_on: [greet]
    for_each: "{params.items}"
    arguments: {value: ["{item}", "{steps.greet.output}", "{{literal}}"]}
"""


def _plan_json(proj: Project, *args: str) -> dict[str, Any]:
    from harness import run_planrun

    res = run_planrun("validate", "subst", "--format", "json", *args, cwd=proj.root)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "hunter2" not in res.stdout
    (plan,) = json.loads(res.stdout)["plans"]
    assert plan["ok"] is True
    return dict(plan["plan"])


def test_validate_json_includes_the_plan_as_substituted(proj: Project) -> None:
    proj.write_plan("subst", SUBST)
    plan = _plan_json(proj, "-p", "n=3", "-p", "who=you")
    assert {"name", "revision", "goal", "digest", "params", "steps"} <= set(plan)
    assert plan["params"] == {"who": "you", "n": 3, "items": [1, 2], "token": "***"}
    greet, auth, each = plan["steps"]
    assert greet == {"id": "greet", "tool": "echo", "arguments": {"value": "hello you x3"}}
    assert auth["arguments"] == {"value": "***"}  # a secret never appears
    assert each["for_each"] == [1, 2]
    # run-time placeholders stay as written (a literal brace stays escaped)
    assert each["arguments"] == {"value": ["{item}", "{steps.greet.output}", "{{literal}}"]}
    assert each["depends_on"] == ["greet"]


def test_validate_json_leaves_a_parameter_without_value_as_written(proj: Project) -> None:
    proj.write_plan("subst", SUBST)
    plan = _plan_json(proj)  # no -p: n has no value, the others their defaults
    assert "n" not in plan["params"]
    assert plan["params"]["who"] == "world"
    assert plan["steps"][0]["arguments"] == {"value": "hello world x{params.n}"}


def test_validate_json_of_a_refused_plan_has_no_substituted_steps(broken: Project) -> None:
    res = invoke(broken, "validate", "broken", "--format", "json")
    assert res.exit_code == 3
    (plan,) = as_json(res)["plans"]
    assert "steps" not in plan["plan"]


def test_validate_json_substituted_braces_read_as_written(proj: Project) -> None:
    proj.write_plan("subst", SUBST)
    plan = _plan_json(proj, "-p", "n=1", "-p", "who=a{b}")
    assert plan["params"]["who"] == "a{b}"  # the value
    assert plan["steps"][0]["arguments"] == {"value": "hello a{{b}} x1"}  # as a plan reads


def test_validate_stdin_over_the_size_bound_is_too_large(proj: Project) -> None:
    from planrun.loading import MAX_FILE_BYTES

    res = _stdin(proj, b"#" * (MAX_FILE_BYTES + 10), "--format", "json")
    assert res.returncode == 3, res.stderr
    (plan,) = json.loads(res.stdout)["plans"]
    assert [i["code"] for i in plan["issues"]] == ["too_large"]
