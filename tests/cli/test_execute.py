"""The command line, ``planrun execute``: the JSON manifest, failures, refused plans, --approve
(SPEC §4, §5, §8, §9; through ``typer.testing.CliRunner``)."""

from __future__ import annotations

import json
import re

from conftest import Project

from .support import (
    COUNT_KEYS,
    MANIFEST_KEYS,
    PLAN_KEYS,
    STEP_KEYS,
    as_json,
    assert_utc,
    calls,
    execute_json,
    invoke,
)


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
                           "partial": 0, "failed": 0, "skipped": 0, "indeterminate": 0}
    assert m["output_bytes"] == sum(s["output_bytes"] for s in m["steps"])
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
