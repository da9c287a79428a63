"""``approve: resolved``: clearing a step with its real values, at dispatch (issue 17, part 4).

Through the CLI (``typer.testing.CliRunner``: stdin is not a terminal); the terminal
prompt at dispatch is in tests/test_approval_tty.py. Decisions are in
docs/approvals-and-policy.md "Approving the resolved values".
"""

from __future__ import annotations

import hashlib
import json

import pytest

from conftest import Project

from .support import MODULE, TOOLS, as_json, calls, execute_json, invoke

REMOVE = """
  remove:
    python: clitools:echo
    irreversible: true
    arguments:
      type: object
      properties:
        value: {type: string}
      required: [value]
      additionalProperties: false
"""

PLAN = """
planrun: 1
goal: Pick what to remove, then remove it once a person saw the real value
params:
  token: {type: string, secret: true, default: s3cr3t-t0ken}
steps:
  - {id: pick, tool: echo, arguments: {value: old-files}}
  - id: wipe
    tool: remove
    depends_on: [pick]
    approve: resolved
    arguments: {value: "{steps.pick.output.value} with {params.token}"}
"""


@pytest.fixture
def gated(proj: Project) -> Project:
    proj.write_tools(TOOLS + REMOVE, module=MODULE, module_name="clitools")
    proj.write_plan("gated", PLAN)
    return proj


def _events(proj: Project, run_id: str, kind: str) -> list[dict[str, object]]:
    log = as_json(invoke(proj, "log", run_id, "--json"))
    return [e for e in log if e["kind"] == kind]


def test_waits_at_dispatch_shows_resolved_values_and_resume_runs_it(gated: Project) -> None:
    result, m = execute_json(gated, "gated")
    assert result.exit_code == 4, result.output
    assert m["status"] == "awaiting_approval"
    assert [w["step"] for w in m["approval"]["waiting"]] == ["wipe"]
    assert calls(gated) == ["old-files"]  # pick ran; wipe did not
    run = m["run_id"]
    asked = _events(gated, run, "approval_required")
    assert [e["step"] for e in asked] == ["wipe"]
    assert asked[0]["data"]["resolved"] is True
    assert asked[0]["data"]["arguments"] == {"value": "old-files with ***"}

    shown = invoke(gated, "approve", run)  # no terminal: names the values, decides nothing
    assert shown.exit_code == 4
    assert 'wipe (remove) with arguments {"value": "old-files with ***"}' in shown.output
    assert "s3cr3t" not in shown.output

    assert invoke(gated, "approve", run, "wipe").exit_code == 0
    result = invoke(gated, "resume", run, "--json", "-p", "token=s3cr3t-t0ken")
    assert result.exit_code == 0, result.output
    assert as_json(result)["status"] == "completed"
    assert calls(gated) == ["old-files", "old-files with s3cr3t-t0ken"]


def test_a_changed_tool_is_asked_about_again_on_resume(gated: Project) -> None:
    _, m = execute_json(gated, "gated")
    run = m["run_id"]
    assert invoke(gated, "approve", run, "wipe").exit_code == 0
    # the tool's contract changes after the person decided: the decision was bound to
    # the resolved arguments and the tool as registered, so it no longer clears the step
    gated.write_tools(TOOLS + REMOVE.replace("value: {type: string}",
                                             "value: {type: string, maxLength: 100}"),
                      module=MODULE, module_name="clitools")
    result = invoke(gated, "resume", run, "--json", "-p", "token=s3cr3t-t0ken")
    assert result.exit_code == 4, result.output
    assert as_json(result)["status"] == "awaiting_approval"
    assert calls(gated) == ["old-files"]
    digests = [e["data"]["digest"] for e in _events(gated, run, "approval_required")]
    assert len(digests) == 2
    assert digests[0] != digests[1]


def test_approve_flag_clears_it(gated: Project) -> None:
    result, m = execute_json(gated, "gated", "--approve", "wipe")  # up front, as today
    assert result.exit_code == 0, result.output
    assert m["status"] == "completed"
    _, m = execute_json(gated, "gated")
    assert m["status"] == "awaiting_approval"
    result = invoke(gated, "resume", m["run_id"], "--approve", "wipe", "--json",
                    "-p", "token=s3cr3t-t0ken")
    assert result.exit_code == 0, result.output
    assert as_json(result)["status"] == "completed"
    assert calls(gated) == ["old-files", "old-files with s3cr3t-t0ken"] * 2


def test_a_grant_checks_the_resolved_values(gated: Project) -> None:
    grant = """
[[policy.grants]]
id = "wipe-old"
tool = "remove"
arguments = {{type = "object", properties = {{value = {{pattern = "{pattern}"}}}}}}
expires = 2099-12-31T00:00:00Z
granted_by = "ops@example.com"
"""
    gated.write_config(grant.format(pattern="^old-files "))
    result, m = execute_json(gated, "gated")
    assert result.exit_code == 0, result.output
    wipe = next(s for s in m["steps"] if s["id"] == "wipe")
    assert wipe["approved_by"] == "wipe-old"

    gated.write_config(grant.format(pattern="^new-files "))  # these values leave the grant
    result, m = execute_json(gated, "gated")
    assert result.exit_code == 4, result.output
    assert m["status"] == "awaiting_approval"
    why = _events(gated, m["run_id"], "autonomy_escalated")
    assert "arguments leave grant 'wipe-old'" in str(why[0]["data"]["why"])


def test_dispatch_record_carries_the_digest_of_the_resolved_arguments(proj: Project) -> None:
    result, m = execute_json(proj, "hello", "-p", "who=there")
    assert result.exit_code == 0, result.output
    started = {e["step"]: e["data"] for e in _events(proj, m["run_id"], "step_started")
               if e.get("item") is None}
    want = hashlib.sha256(json.dumps({"value": "hello there"}, separators=(",", ":"))
                          .encode()).hexdigest()
    assert started["greet"]["arguments_digest"] == want


@pytest.mark.parametrize(("step", "why"), [
    ("{id: b, tool: remove, approve: resolved, arguments: {value: fixed}}",
     "no {steps.…} placeholder"),
    ("{id: b, tool: echo, depends_on: [a], approve: resolved, "
     "arguments: {value: '{steps.a.output}'}}", "needs no approval"),
    ("{id: b, tool: remove, depends_on: [a], approve: resolved, for_each: [1], "
     "arguments: {value: '{steps.a.output.value}'}}", "fans out"),
    ("{id: b, tool: remove, depends_on: [a], approve: resolved, run_if: failure, "
     "arguments: {value: '{steps.a.output}'}}", "clean-up step (run_if: failure)"),
    ("{id: b, tool: remove, depends_on: [a], approve: resolved, run_if: always, "
     "arguments: {value: '{steps.a.output}'}}", "clean-up step (run_if: always)"),
])
def test_approve_resolved_where_it_has_no_meaning(gated: Project, step: str, why: str) -> None:
    gated.write_plan("bad", f"""
planrun: 1
goal: approve resolved in the wrong place
steps:
  - {{id: a, tool: echo, arguments: {{value: x}}}}
  - {step}
""")
    result = invoke(gated, "validate", "bad", "--format", "json")
    assert result.exit_code == 3, result.output
    issues = as_json(result)["plans"][0]["issues"]
    assert [(i["code"], i["path"]) for i in issues] == [("approve_resolved", "/steps/1/approve")]
    assert why in issues[0]["message"]
