"""``planrun repair`` below the CLI (SPEC §10): what counts as changing a succeeded step,
the ``run`` part of the request, and the child run a revision becomes."""

from __future__ import annotations

import copy
import json
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planrun.canonical import canonical_json
from planrun.issues import ISSUE_CODES
from planrun.repair import CODE, changed_succeeded, effect
from planrun.validation import ParamInput

OLD: dict[str, Any] = {
    "planrun": 1, "name": "p", "goal": "g",
    "steps": [
        {"id": "a", "tool": "echo", "arguments": {"value": 1}, "intent": "first"},
        {"id": "b", "tool": "echo", "depends_on": ["a"], "arguments": {"value": 2}},
        {"id": "c", "tool": "boom", "depends_on": ["a", "b"], "arguments": {"value": 3}},
        {"id": "d", "tool": "echo", "depends_on": ["c"], "arguments": {"value": 4}},
    ],
}
DONE = ["a", "b"]


def revised(**changes: Any) -> dict[str, Any]:
    """OLD with ``changes`` = {step id: {field: value or None to delete}}."""
    new = copy.deepcopy(OLD)
    for step in new["steps"]:
        for name, value in changes.get(step["id"], {}).items():
            if value is None:
                step.pop(name, None)
            else:
                step[name] = value
    return new


def test_the_code_is_an_issue_code() -> None:
    assert CODE == "repair_changes_succeeded"
    assert CODE in ISSUE_CODES


def test_the_same_plan_changes_nothing() -> None:
    assert changed_succeeded(OLD, copy.deepcopy(OLD), DONE) == []


@pytest.mark.parametrize(("name", "value"), [
    ("tool", "other"), ("arguments", {"value": 9}), ("arguments", {"value": 1, "x": 1}),
    ("depends_on", ["a", "c"]), ("for_each", [1, 2]), ("when", "true"),
    ("on_item_error", "continue"), ("max_items", 5),
    # run_if decides whether the step runs, as when does: it was not compared (found by
    # an attacker), so a revision could say a notify step that ran runs on success only
    ("run_if", "always"), ("run_if", "failure"),
])
def test_each_effect_field_of_a_succeeded_step_is_a_change(name: str, value: Any) -> None:
    issues = changed_succeeded(OLD, revised(b={name: value}), DONE, run_id="r1")
    assert [(i.code, i.step, i.path, i.severity) for i in issues] == [
        (CODE, "b", "/steps/1", "error")]
    assert name in issues[0].message
    assert "r1" in issues[0].message


@pytest.mark.parametrize(("name", "value"), [
    ("intent", "said otherwise"), ("timeout", 5), ("retries", {"max_attempts": 2}),
    ("max_parallel", 2), ("pool", "slow"),
])
def test_how_a_step_is_run_is_not_a_change(name: str, value: Any) -> None:
    assert changed_succeeded(OLD, revised(a={name: value}), DONE) == []


def test_defaults_and_dependency_order_are_not_changes() -> None:
    new = revised(a={"arguments": {"value": 1}, "depends_on": [], "on_item_error": "fail",
                     "max_items": 10000, "run_if": "success"},
                  b={"depends_on": ["a", "a"]})
    old = copy.deepcopy(OLD)
    old["steps"][0].pop("arguments")
    old["steps"][0]["arguments"] = {"value": 1}
    assert changed_succeeded(old, new, DONE) == []
    two = copy.deepcopy(OLD)
    two["steps"][2]["depends_on"] = ["b", "a"]
    # c did not succeed, but a reordered set is equal anyway
    assert effect(two["steps"][2]) == effect(OLD["steps"][2])


def test_a_missing_arguments_field_is_empty_arguments() -> None:
    old = {"steps": [{"id": "a", "tool": "t"}]}
    assert changed_succeeded(old, {"steps": [{"id": "a", "tool": "t", "arguments": {}}]},
                             ["a"]) == []


def test_true_is_not_one_and_key_order_is_nothing() -> None:
    old = {"steps": [{"id": "a", "tool": "t", "arguments": {"x": 1, "y": 2}}]}
    same = {"steps": [{"id": "a", "tool": "t", "arguments": {"y": 2, "x": 1}}]}
    other = {"steps": [{"id": "a", "tool": "t", "arguments": {"x": True, "y": 2}}]}
    assert changed_succeeded(old, same, ["a"]) == []
    assert [i.step for i in changed_succeeded(old, other, ["a"])] == ["a"]


def test_failed_skipped_and_new_steps_may_change() -> None:
    new = revised(c={"tool": "echo", "arguments": {"value": 30}},
                  d={"depends_on": ["a"], "arguments": {"value": 40}})
    new["steps"].append({"id": "e", "tool": "echo", "depends_on": ["b"], "arguments": {}})
    assert changed_succeeded(OLD, new, DONE) == []
    # removing steps that did not succeed is fine too
    new["steps"] = [s for s in new["steps"] if s["id"] not in ("c", "d")]
    assert changed_succeeded(OLD, new, DONE) == []


def test_removing_a_succeeded_step_is_a_change() -> None:
    new = copy.deepcopy(OLD)
    new["steps"] = [s for s in new["steps"] if s["id"] != "b"]
    issues = changed_succeeded(OLD, new, DONE, file="planner:round 1")
    assert [(i.code, i.step, i.path, i.file) for i in issues] == [
        (CODE, "b", "/steps", "planner:round 1")]
    assert "removes" in issues[0].message


def test_the_pointer_is_the_step_in_the_revision() -> None:
    new = revised(a={"arguments": {"value": 0}})
    new["steps"].insert(0, {"id": "z", "tool": "echo"})
    new["steps"].reverse()
    (issue,) = changed_succeeded(OLD, new, DONE)
    assert issue.path == f"/steps/{[s['id'] for s in new['steps']].index('a')}"


def test_every_changed_step_is_reported_in_plan_order() -> None:
    new = revised(a={"tool": "x"}, b={"tool": "y"})
    assert [i.step for i in changed_succeeded(OLD, new, DONE)] == ["a", "b"]


@pytest.mark.parametrize("new", [None, [], "text", {"steps": "no"}, {"goal": "g"}])
def test_a_revision_that_is_no_plan_is_left_to_validation(new: Any) -> None:
    assert changed_succeeded(OLD, new, DONE) == []


def test_malformed_steps_do_not_raise() -> None:
    new = {"steps": [None, 3, {"id": 5}, {"id": "a", "tool": "echo",
                                          "arguments": {"value": 1}, "depends_on": [1, "x"]}]}
    issues = changed_succeeded(OLD, new, ["a"])
    assert [(i.step, i.path) for i in issues] == [("a", "/steps/3")]


json_leaf = st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=3)
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                          max_leaves=6)
step_fields = st.fixed_dictionaries({}, optional={
    "tool": st.sampled_from(["echo", "boom"]),
    "arguments": st.dictionaries(st.sampled_from(["value", "x"]), json_value, max_size=2),
    "depends_on": st.lists(st.sampled_from(["a", "b", "c"]), max_size=3),
    "for_each": json_value, "when": st.sampled_from(["true", "false"]),
    "on_item_error": st.sampled_from(["fail", "continue"]),
    "max_items": st.integers(1, 3), "intent": st.text(max_size=3),
    "timeout": st.integers(1, 3)})


@settings(max_examples=300, deadline=None)
@given(before=step_fields, after=step_fields, done=st.booleans())
def test_a_step_is_refused_exactly_when_it_succeeded_and_its_effect_differs(
        before: dict[str, Any], after: dict[str, Any], done: bool) -> None:
    old = {"steps": [{"id": "s", **before}]}
    new = {"steps": [{"id": "s", **after}]}
    issues = changed_succeeded(old, new, ["s"] if done else [])
    # equal as canonical JSON (true is not 1, key order is nothing, a set of dependencies)
    differs = canonical_json(effect(old["steps"][0])) != canonical_json(
        effect(new["steps"][0]))
    assert [i.step for i in issues] == (["s"] if done and differs else [])
    # symmetric: swapping the plans refuses the same step
    assert bool(issues) == bool(changed_succeeded(new, old, ["s"] if done else []))


@settings(max_examples=200, deadline=None)
@given(fields=step_fields)
def test_a_step_compared_with_itself_is_unchanged(fields: dict[str, Any]) -> None:
    plan = {"steps": [{"id": "s", **fields}]}
    assert changed_succeeded(plan, copy.deepcopy(plan), ["s"]) == []


# --- through the api: a real project, real journal, scripted planners ---------------------

TOOLS = """
tools:
  echo:
    python: repairtools:echo
    arguments: {type: object, properties: {value: {}}, required: [value],
                additionalProperties: false}
  boom:
    python: repairtools:boom
    arguments: {type: object, properties: {value: {}}, required: [value],
                additionalProperties: false}
  slow:
    description: Sleeps; not idempotent
    command: [sleep, "{seconds}"]
    output: none
    arguments: {type: object, properties: {seconds: {type: string}}, required: [seconds],
                additionalProperties: false}
"""

MODULE = '''
from pathlib import Path

HERE = Path(__file__).resolve().parent


def echo(value):
    with open(HERE / "effects.log", "a", encoding="utf-8") as f:
        f.write(f"{value}\\n")
    return {"value": value}


def boom(value):
    raise ValueError(f"cannot reach {value}")
'''

PLANNERS = '''
import json


def fix(request):
    """Call echo where the run failed; drop parameters nobody uses any more."""
    plan = request["run"]["plan"]
    failed = {f["step"] for f in request["run"]["failed"]}
    for step in plan["steps"]:
        if step["id"] in failed:
            step["tool"] = "echo"
            step["arguments"] = {"value": step["id"]}
    text = json.dumps(plan)
    plan["params"] = {k: v for k, v in plan.get("params", {}).items()
                      if "{params." + k + "}" in json.dumps(plan["steps"])}
    if not plan["params"]:
        del plan["params"]
    return plan


def rename(request):
    plan = fix(request)
    plan["name"] = "something-else"
    plan["revision"] = 99
    return plan


def touch(request):
    plan = request["run"]["plan"]
    plan["steps"][0]["arguments"] = {"value": "changed"}
    return plan


def slow_fix(request):
    plan = request["run"]["plan"]
    for step in plan["steps"]:
        if step["tool"] == "slow":
            step["tool"] = "echo"
            step["arguments"] = {"value": step["id"]}
    return plan
'''

FAILING = """
planrun: 1
goal: Send the report
params:
  endpoint: {type: string}
  token: {type: string, secret: true}
steps:
  - {id: render, tool: echo, arguments: {value: render}}
  - id: send
    tool: boom
    depends_on: [render]
    arguments: {value: "{params.endpoint}/{params.token}"}
  - {id: log, tool: echo, depends_on: [send], arguments: {value: log}}
"""


@pytest.fixture
def repair_project(project: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.chdir(project.root)
    project.write_tools(TOOLS, module=MODULE, module_name="repairtools")
    project.write_module("repairplanners", PLANNERS)
    project.write_plan("report", FAILING)
    return project


def _failed_run(project: Any) -> tuple[Any, str]:
    from planrun import api
    from planrun.validation import ParamInput

    settings = project.settings()
    given = ParamInput(cli={"endpoint": "https://example.test", "token": "tok-SECRET-1"})
    outcome = api.execute(settings, "report", given)
    assert outcome.manifest["status"] == "failed"
    return settings, outcome.manifest["run_id"]


def _effects(project: Any) -> Counter[str]:
    path = project.root / "effects.log"
    return Counter(path.read_text().splitlines() if path.exists() else [])


def test_run_context_is_what_the_planner_knows(repair_project: Any) -> None:
    from planrun.journal import Journal
    from planrun.repair import run_context

    settings, run_id = _failed_run(repair_project)
    with Journal(settings.journal, write=False) as journal:
        ctx = run_context(journal, run_id)
    assert set(ctx) == {"run_id", "root_run_id", "status", "plan", "revision", "params",
                        "manifest", "failed", "succeeded", "not_run"}
    assert (ctx["run_id"], ctx["root_run_id"], ctx["status"]) == (run_id, run_id, "failed")
    assert ctx["succeeded"] == ["render"]
    assert ctx["not_run"] == ["log"]
    assert ctx["failed"] == [{"step": "send", "tool": "boom", "error": {
        "code": "tool_error", "message": ctx["failed"][0]["error"]["message"]}}]
    assert ctx["params"]["endpoint"] == "https://example.test"
    assert ctx["params"]["token"] != "tok-SECRET-1"
    assert "tok-SECRET-1" not in json.dumps(ctx)
    # the error message echoed the secret: it holds the reference, not the value
    assert "cannot reach https://example.test/" in ctx["failed"][0]["error"]["message"]


def test_a_revision_may_drop_a_parameter_only_the_failed_step_used(
        repair_project: Any) -> None:
    from planrun import api
    from planrun.validation import ParamInput

    settings, run_id = _failed_run(repair_project)
    outcome = api.repair(settings, run_id, "python:repairplanners:fix",
                         given=ParamInput(cli={"token": "tok-SECRET-1"}))
    m = outcome.manifest
    assert m["status"] == "completed", m
    assert m["params"] == {}
    assert (m["parent_run_id"], m["root_run_id"]) == (run_id, run_id)
    assert _effects(repair_project) == {"render": 1, "send": 1, "log": 1}


def test_planrun_sets_the_name_and_the_next_revision(repair_project: Any) -> None:
    from planrun import api
    from planrun.loading import load_file
    from planrun.validation import ParamInput

    settings, run_id = _failed_run(repair_project)
    # the file moved on since the run (revision 5): the repair writes revision 6
    path = repair_project.plans / "report.yaml"
    path.write_text(path.read_text().replace("goal:", "revision: 5\ngoal:"))
    outcome = api.repair(settings, run_id, "python:repairplanners:rename",
                         given=ParamInput(cli={"token": "tok-SECRET-1"}))
    assert outcome.manifest["plan"]["name"] == "report"
    assert outcome.manifest["plan"]["revision"] == 6
    data = load_file(path).data
    assert (data["name"], data["revision"]) == ("report", 6)
    assert list(data)[:3] == ["planrun", "name", "revision"]
    assert not (repair_project.plans / "something-else.yaml").exists()


def test_a_named_planner_and_its_max_rounds(repair_project: Any) -> None:
    from planrun import api
    from planrun.errors import Refused
    from planrun.journal import Journal
    from planrun.validation import ParamInput

    repair_project.write_config("""
        [planners.toucher]
        python = "repairplanners:touch"
        max_rounds = 2
    """)
    settings, run_id = _failed_run(repair_project)
    with pytest.raises(Refused) as caught:
        api.repair(settings, run_id, "toucher", given=ParamInput(cli={"token": "t"}))
    assert caught.value.code == "replan_exhausted"
    with Journal(settings.journal, write=False) as journal:
        kinds = [e["kind"] for e in journal.events(run_id)]
    assert kinds.count("plan_proposed") == 2
    assert kinds.count("plan_refused") == 2
    assert "replanned" not in kinds


def test_a_step_of_unknown_effect_is_settled_before_a_repair(repair_project: Any) -> None:
    from planrun import api
    from planrun.errors import RunError

    repair_project.write_plan("slow", """
        planrun: 1
        goal: Wait too long
        steps:
          - {id: first, tool: echo, arguments: {value: first}}
          - {id: wait, tool: slow, depends_on: [first], timeout: 0.2,
             arguments: {seconds: "5"}}
    """)
    settings = repair_project.settings()
    outcome = api.execute(settings, "slow", ParamInput())
    assert outcome.manifest["status"] == "failed"
    run_id = outcome.manifest["run_id"]
    with pytest.raises(RunError) as caught:
        api.repair(settings, run_id, "python:repairplanners:slow_fix")
    assert caught.value.code == "indeterminate"
    assert "planrun resolve" in (caught.value.hint or "")
    api.resolve(settings, run_id, "wait", succeeded=False, output=None, reason="checked")
    done = api.repair(settings, run_id, "python:repairplanners:slow_fix")
    assert done.manifest["status"] == "completed"
    assert _effects(repair_project) == {"first": 1, "wait": 1}


def test_nothing_is_written_when_the_run_is_busy_or_approve_names_no_step(
        repair_project: Any) -> None:
    from planrun import api
    from planrun.errors import RunError, UsageError
    from planrun.journal import Journal
    from planrun.journal.store import lease_owner

    settings, run_id = _failed_run(repair_project)
    path = repair_project.plans / "report.yaml"
    before = path.read_text()
    given = ParamInput(cli={"token": "tok-SECRET-1"})
    with pytest.raises(UsageError):
        api.repair(settings, run_id, "python:repairplanners:fix", given=given,
                   approve=["nosuchstep"])
    assert path.read_text() == before
    owner = lease_owner()  # this live process holds the failed run's lease
    with Journal(settings.journal, write=True) as journal:
        journal.take_lease(run_id, owner, statuses=("failed",))
    with pytest.raises(RunError) as caught:
        api.repair(settings, run_id, "python:repairplanners:fix", given=given)
    assert caught.value.code == "run_busy"
    assert path.read_text() == before
    assert len(api.runs(settings)) == 1  # no child


def test_a_plan_name_that_is_no_file_name_is_not_a_path(repair_project: Any) -> None:
    from planrun import api

    repair_project.write_plan("odd", FAILING.replace("planrun: 1", "planrun: 1\nname: ../odd"))
    settings = repair_project.settings()
    given = ParamInput(cli={"endpoint": "e", "token": "t"})
    outcome = api.execute(settings, "odd", given)
    assert outcome.manifest["plan"]["name"] == "../odd"
    child = api.repair(settings, outcome.manifest["run_id"], "python:repairplanners:fix",
                       given=ParamInput(cli={"token": "t"}))
    assert child.manifest["status"] == "completed"
    assert child.manifest["plan"]["file"] == "plans/odd.yaml"
    assert not (repair_project.root / "odd.yaml").exists()
