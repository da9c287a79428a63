"""The command line (``planrun.cli.app``) through ``typer.testing.CliRunner`` (SPEC §4, §5,
§8, §9): formats, exit statuses, ``--json`` shapes, run-id prefixes, no tracebacks.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

import planrun
from conftest import Project
from planrun.cli import app
from planrun.journal import SCHEMA_VERSION, Journal, now

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

TOOLS = """
tools:
  echo:
    python: clitools:echo
    arguments:
      type: object
      properties:
        value: {}
      required: [value]
      additionalProperties: false
  chatty:
    python: clitools:chatty
    arguments:
      type: object
      properties:
        value: {}
      required: [value]
      additionalProperties: false
  boom:
    python: clitools:boom
    arguments:
      type: object
      properties:
        value: {}
      required: [value]
      additionalProperties: false
"""

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

# SPEC §5's keys, plus wall_s (issue 10: duration_s is working time, wall_s clock time).
MANIFEST_KEYS = {"run_id", "root_run_id", "parent_run_id", "plan", "goal", "status", "params",
                 "started_at", "finished_at", "duration_s", "counts", "steps", "resumable",
                 "next", "wall_s"}
PLAN_KEYS = {"name", "revision", "digest", "file"}
COUNT_KEYS = {"total", "pending", "running", "succeeded", "failed", "skipped", "indeterminate"}
STEP_KEYS = {"id", "tool", "status", "attempts", "started_at", "finished_at", "duration_s",
             "output_bytes", "replayed", "approved_by", "error"}
# SPEC §8's keys, plus the run's project folder (issue 10: one journal, many projects).
RUN_SUMMARY_KEYS = {"run_id", "plan", "revision", "status", "started_at", "finished_at",
                    "counts", "project"}


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


# --- help and version ------------------------------------------------------------------------


def test_help_lists_the_commands() -> None:
    result = invoke(None, "--help")
    assert result.exit_code == 0
    for command in ("validate", "execute", "resume", "resolve", "retry", "unlock", "status",
                    "runs", "log", "output"):
        assert re.search(rf"^\s+{command}\s", result.stdout, re.M), command


def test_help_lists_the_other_commands_of_the_spec() -> None:
    result = invoke(None, "--help")
    for command in ("show", "graph", "tools", "schema", "init"):
        assert re.search(rf"^\s+{command}\s", result.stdout, re.M), command


def test_no_arguments_shows_the_help() -> None:
    result = CliRunner().invoke(app, [])
    assert "execute" in result.output
    assert "Traceback" not in result.output


def test_version() -> None:
    result = invoke(None, "--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"planrun {planrun.__version__}"


@pytest.mark.parametrize("command", ["validate", "execute", "status", "runs", "log", "output"])
def test_each_command_has_help(command: str) -> None:
    result = invoke(None, command, "--help")
    assert result.exit_code == 0
    assert "--journal" in result.stdout
    assert "--project" in result.stdout


# --- validate -----------------------------------------------------------------------------------


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


# --- execute ------------------------------------------------------------------------------------


def test_execute_json_manifest_has_exactly_the_keys_of_the_spec(proj: Project) -> None:
    result, m = execute_json(proj, "hello", "-p", "who=there", "-p", "times=3")
    assert result.exit_code == 0, result.output
    assert set(m) == MANIFEST_KEYS
    assert set(m["plan"]) == PLAN_KEYS
    assert m["plan"]["name"] == "hello"
    assert m["plan"]["revision"] == 2
    assert re.fullmatch(r"[0-9a-f]{64}", m["plan"]["digest"])
    assert m["plan"]["file"] == "plans/hello.yaml"
    assert m["goal"] == "Say hello"
    assert m["status"] == "completed"
    assert m["params"] == {"who": "there", "times": 3}
    assert len(m["run_id"]) >= 12
    assert m["root_run_id"] == m["run_id"]
    assert m["parent_run_id"] is None
    assert set(m["counts"]) == COUNT_KEYS
    assert m["counts"] == {"total": 3, "pending": 0, "running": 0, "succeeded": 3,
                           "failed": 0, "skipped": 0, "indeterminate": 0}
    assert [s["id"] for s in m["steps"]] == ["greet", "count", "each"]
    for step in m["steps"]:
        extra = {"items"} if step["id"] == "each" else set()
        assert set(step) == STEP_KEYS | extra, step
        assert step["status"] == "succeeded"
        if step["id"] != "each":
            assert step["attempts"] == 1
        assert step["replayed"] is False
        assert step["approved_by"] is None
        assert step["error"] is None
        assert step["output_bytes"] > 0
        assert isinstance(step["duration_s"], int | float)
        assert_utc(step["started_at"])
        assert_utc(step["finished_at"])
    assert m["steps"][2]["items"] == {"total": 3, "succeeded": 3, "failed": 0}
    assert m["resumable"] is False
    assert m["next"] is None
    assert_utc(m["started_at"])
    assert_utc(m["finished_at"])
    assert isinstance(m["duration_s"], int | float)
    assert sorted(calls(proj)) == sorted(["hello there", "3", "1", "2", "3"])


def test_execute_json_of_a_failed_run(proj: Project) -> None:
    result, m = execute_json(proj, "failing")
    assert result.exit_code == 1
    steps = {s["id"]: s for s in m["steps"]}
    assert steps["bad"]["status"] == "failed"
    assert steps["bad"]["error"] == {"code": "tool_error",
                                     "message": "ValueError: cannot handle 2"}
    assert steps["never"]["status"] == "skipped"
    assert m["status"] == "failed"
    assert m["resumable"] is False
    assert m["next"] == f"planrun retry {m['run_id']}"
    assert "Traceback" not in result.stdout


def test_execute_json_stdout_stays_json_when_a_python_tool_prints(proj: Project) -> None:
    proj.write_plan("chatty", """
        planrun: 1
        goal: A tool that prints
        steps:
          - {id: talk, tool: chatty, arguments: {value: 1}}
    """)
    result = invoke(proj, "execute", "chatty", "--json")
    assert result.exit_code == 0, result.output
    assert "chatty tool says 1" in result.output  # shown, as a diagnostic
    assert json.loads(result.stdout)["status"] == "completed"


def test_execute_text_names_the_failed_step_and_its_error(proj: Project) -> None:
    result = invoke(proj, "execute", "failing")
    assert result.exit_code == 1
    assert re.search(r"failed\s+bad \(boom\).*ValueError: cannot handle 2", result.stdout)
    assert "skipped" in result.stdout


def test_execute_refused_plan_exits_3_and_journals_it(broken: Project) -> None:
    result = invoke(broken, "execute", "broken")
    assert result.exit_code == 3
    assert "unknown_tool" in result.stderr
    assert calls(broken) == []
    runs = as_json(invoke(broken, "runs", "--json"))
    assert [(r["plan"], r["status"]) for r in runs] == [("broken", "refused")]


def test_execute_unknown_plan_exits_3_and_lists_the_plans(proj: Project) -> None:
    result = invoke(proj, "execute", "helo")
    assert result.exit_code == 3
    assert "not_found" in result.stderr
    assert "hello" in result.stderr


def test_approve_naming_no_step_is_a_usage_error(proj: Project) -> None:
    result = invoke(proj, "execute", "hello", "--approve", "nosuchstep")
    assert result.exit_code == 2
    assert "nosuchstep" in result.stderr
    assert calls(proj) == []


def test_approve_naming_a_step_that_needs_none_is_harmless(proj: Project) -> None:
    result, m = execute_json(proj, "hello", "--approve", "greet")
    assert result.exit_code == 0, result.output
    assert m["status"] == "completed"
    assert sorted(calls(proj)) == sorted(["hello world", "1", "1", "2", "3"])
    # Nothing was decided for a step that needed no decision.
    assert [s["approved_by"] for s in m["steps"]] == [None, None, None]
    log = as_json(invoke(proj, "log", m["run_id"], "--json"))
    assert not [e for e in log if e["kind"].startswith("approval_")]


@pytest.mark.parametrize("args", [
    ["validate", "--format", "xml"],
    ["execute"],
    ["execute", "hello", "--max-parallel", "0"],
    ["runs", "--limit", "0"],
    ["nosuchcommand"],
    ["resolve", "abcdef123456", "greet"],
    ["resolve", "abcdef123456", "greet", "--succeeded", "--failed"],
], ids=lambda a: " ".join(a))
def test_usage_errors_exit_2(proj: Project, args: list[str]) -> None:
    result = invoke(proj, *args)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert calls(proj) == []


def test_param_without_equals_is_a_usage_error(proj: Project) -> None:
    result = invoke(proj, "execute", "hello", "-p", "who")
    assert result.exit_code == 2
    assert "NAME=VALUE" in result.stderr
    assert calls(proj) == []


@pytest.mark.parametrize(("param", "code"), [("times=2.0", "param_type"),
                                             ("nope=1", "param_unknown")])
def test_bad_param_values_are_refused(proj: Project, param: str, code: str) -> None:
    result = invoke(proj, "execute", "hello", "-p", param)
    assert result.exit_code == 3
    assert code in result.stderr
    assert calls(proj) == []


@pytest.mark.parametrize("toml", ["bogus_key = 1\n", "max_parallel = 'four'\n", "[[[\n"])
@pytest.mark.parametrize("command", [["execute", "hello"], ["validate"], ["runs"]])
def test_a_bad_planrun_toml_exits_3_with_code_config(proj: Project, toml: str,
                                                     command: list[str]) -> None:
    proj.write_config(toml)
    result = invoke(proj, *command)
    assert result.exit_code == 3, result.output
    assert "error[config]" in result.output
    assert "planrun.toml" in result.output
    assert calls(proj) == []


def test_a_bad_planrun_toml_in_json(proj: Project) -> None:
    proj.write_config("bogus_key = 1\n")
    result = invoke(proj, "execute", "hello", "--json")
    assert result.exit_code == 3
    out = as_json(result)
    assert out["ok"] is False
    assert out["error"]["code"] == "config"


# --- reading the journal ------------------------------------------------------------------------


@pytest.fixture
def done(proj: Project) -> dict[str, Any]:
    """The manifest of a completed ``hello`` run."""
    result, m = execute_json(proj, "hello")
    assert result.exit_code == 0, result.output
    return m


def test_status_json_is_the_manifest(proj: Project, done: dict[str, Any]) -> None:
    result = invoke(proj, "status", done["run_id"], "--json")
    assert result.exit_code == 0
    assert as_json(result) == done


def test_status_text(proj: Project, done: dict[str, Any]) -> None:
    result = invoke(proj, "status", done["run_id"])
    assert result.exit_code == 0
    assert done["run_id"] in result.stdout
    assert "completed" in result.stdout


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
