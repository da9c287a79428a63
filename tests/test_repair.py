"""``planrun repair`` below the CLI (SPEC §10): what counts as changing a succeeded step,
the ``run`` part of the request, and the child run a revision becomes."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planrun.canonical import canonical_json
from planrun.issues import ISSUE_CODES
from planrun.repair import CODE, changed_succeeded, effect

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
                     "max_items": 10000},
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
