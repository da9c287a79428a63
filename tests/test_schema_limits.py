"""A JSON Schema from a user cannot make a check hang or raise (planrun.schema_limits).

Found by attack: a 1.8 KB parameter schema whose ``$defs`` levels each say ``allOf:
[{$ref: next}, {$ref: next}]`` 24 levels deep never finished ``validate`` (2^24
subschemas); ``uniqueItems`` over 8,000 objects took 136 s (jsonschema compares
unhashable elements pairwise); ``multipleOf: 0.5`` and ``-p n=10**400`` printed an
``OverflowError`` traceback; a schema nested 150 levels deep a ``RecursionError`` one.
Real ``planrun`` processes where the CLI is the point; the subprocess timeout is the
hang guard.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import run_planrun
from planrun.policy import load_policy
from planrun.registry import schema_problems, strict_validator
from planrun.schema_limits import (
    MAX_SCHEMA_DEPTH,
    MAX_SCHEMA_SIZE,
    REFERENCE_BUDGET,
    duplicate,
    multiple_of,
    unique,
)

MODULE = "def echo(**kwargs):\n    return kwargs\n"


def _chain(levels: int) -> dict[str, Any]:
    """``levels`` definitions, each referring twice to the next: 2^levels subschemas."""
    defs: dict[str, Any] = {f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"},
                                                {"$ref": f"#/$defs/d{i + 1}"}]}
                            for i in range(levels)}
    defs[f"d{levels}"] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def _object(levels: int) -> dict[str, Any]:
    """An object schema whose property ``x`` is :func:`_chain`'s value."""
    return {"type": "object", "$defs": _chain(levels)["$defs"],
            "properties": {"x": {"$ref": "#/$defs/d0"}}}


def _project(root: Path, contract: Any = None, output_schema: Any = None) -> dict[str, str]:
    (root / "plans").mkdir(parents=True, exist_ok=True)
    (root / "t.py").write_text(MODULE)
    entry: dict[str, Any] = {"python": "t:echo",
                             "arguments": contract if contract is not None
                             else {"type": "object"}}
    if output_schema is not None:
        entry["output_schema"] = output_schema
    (root / "tools.yaml").write_text(json.dumps({"tools": {"echo": entry}}))
    return dict(os.environ, PLANRUN_JOURNAL=str(root / "journal.sqlite3"))


def _plan(root: Path, params: dict[str, Any], arguments: dict[str, Any]) -> None:
    (root / "plans" / "p.json").write_text(json.dumps(
        {"planrun": 1, "goal": "g", "params": params,
         "steps": [{"id": "s", "tool": "echo", "arguments": arguments}]}))


def _issues(res: subprocess.CompletedProcess[str]) -> list[tuple[str, str]]:
    report = json.loads(res.stdout)
    return [(i["code"], i["message"]) for i in report["issues"]
            + [i for plan in report["plans"] for i in plan["issues"]]]


# --- 1. the expanded size of a schema -------------------------------------------------


def test_an_exponential_ref_chain_in_a_parameter_is_refused_at_once(tmp_path: Path) -> None:
    env = _project(tmp_path)
    _plan(tmp_path, {"x": {**_chain(24), "default": 1}}, {"x": "{params.x}"})
    assert len((tmp_path / "plans" / "p.json").read_text()) < 2000
    start = time.monotonic()
    res = run_planrun("validate", "p", "--format", "json", cwd=tmp_path, env=env, timeout=60)
    assert time.monotonic() - start < 20
    assert res.returncode == 3, res.stdout + res.stderr
    [(code, message)] = _issues(res)
    assert code == "schema"
    assert "too large once its references are expanded" in message
    assert f"{MAX_SCHEMA_SIZE:,}" in message
    assert "Traceback" not in res.stderr


def test_an_exponential_ref_chain_in_a_tool_contract_is_a_registry_issue(
        tmp_path: Path) -> None:
    for contract, output in ((_object(24), None), ({"type": "object"}, _object(30))):
        env = _project(tmp_path, contract, output_schema=output)
        _plan(tmp_path, {}, {"x": 1})
        res = run_planrun("validate", "p", "--format", "json", cwd=tmp_path, env=env,
                          timeout=60)
        assert res.returncode == 3, res.stdout + res.stderr
        found = _issues(res)
        assert found[0][0] == "registry", found
        assert "too large once its references are expanded" in found[0][1]
        assert "Traceback" not in res.stderr


def test_an_exponential_ref_chain_in_a_grant_is_a_config_issue() -> None:
    expires = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    _policy, issues = load_policy({"grants": [{
        "id": "g", "tool": "t", "granted_by": "me", "expires": expires,
        "arguments": _object(40)}]}, {"t"}, None)
    assert [i.code for i in issues] == ["config"]
    assert "too large once its references are expanded" in issues[0].message


@pytest.mark.parametrize("keyword", ["anyOf", "oneOf", "allOf"])
def test_every_applicator_counts_its_references(keyword: str) -> None:
    levels = 20
    defs: dict[str, Any] = {f"d{i}": {keyword: [{"$ref": f"#/$defs/d{i + 1}"},
                                                {"$ref": f"#/$defs/d{i + 1}"}]}
                            for i in range(levels)}
    defs[f"d{levels}"] = {"type": "integer"}
    problems = schema_problems({"$defs": defs, "$ref": "#/$defs/d0"})
    assert problems
    assert "too large" in problems[0][1]


def test_if_then_else_and_dependent_schemas_and_items_count_too() -> None:
    levels = 20
    defs: dict[str, Any] = {
        f"d{i}": {"if": {"$ref": f"#/$defs/d{i + 1}"}, "then": {"$ref": f"#/$defs/d{i + 1}"},
                  "else": {"items": {"$ref": f"#/$defs/d{i + 1}"}},
                  "dependentSchemas": {"k": {"$ref": f"#/$defs/d{i + 1}"}}}
        for i in range(levels)}
    defs[f"d{levels}"] = {"type": "integer"}
    problems = schema_problems({"$defs": defs, "$ref": "#/$defs/d0"})
    assert problems
    assert "too large" in problems[0][1]


def test_a_definition_used_many_times_within_the_limit_is_fine() -> None:
    """A pydantic-like contract: one definition referred to from a few places, twice deep."""
    schema = {"$defs": {"Money": {"type": "object", "properties": {
        "amount": {"type": "number"}, "currency": {"type": "string"}}},
        "Line": {"type": "object", "properties": {"net": {"$ref": "#/$defs/Money"},
                                                  "tax": {"$ref": "#/$defs/Money"}}}},
        "type": "object", "properties": {"lines": {"type": "array",
                                                   "items": {"$ref": "#/$defs/Line"}},
                                         "total": {"$ref": "#/$defs/Money"}}}
    assert schema_problems(schema) == []
    assert schema_problems(_chain(10)) == []  # about 4,000 subschemas


TREE = {"type": "object", "properties": {
    "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#"}}}}


def _tree(depth: int) -> dict[str, Any]:
    return {"v": depth, "kids": [_tree(depth - 1) for _ in range(2)] if depth else []}


def test_a_recursive_schema_still_checks_a_large_tree() -> None:
    assert schema_problems(TREE) == []
    value = _tree(12)  # 8,191 objects, one $ref each: within the budget per node
    assert list(strict_validator(TREE).iter_errors(value)) == []
    value["kids"][1]["kids"][0]["v"] = "x"
    [err] = list(strict_validator(TREE).iter_errors(value))
    assert list(err.absolute_path) == ["kids", 1, "kids", 0, "v"]


def test_recursion_that_fans_out_at_the_same_place_stops_within_its_budget() -> None:
    """Statically a cycle counts once; at the same place of the value it is budgeted."""
    schema = {"$defs": {"n": {"type": "object", "properties": {"c": {"allOf": [
        {"$ref": "#/$defs/n"}, {"$ref": "#/$defs/n"}]}}}}, "$ref": "#/$defs/n"}
    assert schema_problems(schema) == []
    value: dict[str, Any] = {}
    for _ in range(40):  # 2^40 applications of n without the budget
        value = {"c": value}
    start = time.monotonic()
    [err] = list(strict_validator(schema).iter_errors(value))
    assert time.monotonic() - start < 10
    assert f"more than {REFERENCE_BUDGET + 2 * 41:,} references" in err.message
    assert err.validator == "$ref"
    assert strict_validator(schema).is_valid({"c": {"c": {}}})


def test_a_schema_nested_too_deeply_is_a_schema_issue_not_a_traceback(tmp_path: Path) -> None:
    deep: dict[str, Any] = {"type": "integer"}
    for _ in range(150):
        deep = {"items": deep}
    env = _project(tmp_path)
    _plan(tmp_path, {"x": {**deep, "default": []}}, {"x": "{params.x}"})
    res = run_planrun("validate", "p", "--format", "json", cwd=tmp_path, env=env)
    assert res.returncode == 3, res.stdout + res.stderr
    [(code, message)] = _issues(res)
    assert code == "schema"
    assert f"nested more than {MAX_SCHEMA_DEPTH} levels" in message
    assert "Traceback" not in res.stderr


# --- 2. uniqueItems in linear time ----------------------------------------------------


def _jsonschema_equal_pairwise(items: list[Any]) -> bool:
    """jsonschema's own uniqueItems rule: no two items equal under its ``equal``."""
    from jsonschema._utils import equal

    return not any(equal(items[i], items[j])
                   for i in range(len(items)) for j in range(i + 1, len(items)))


SCALARS = (st.none() | st.booleans() | st.integers(-3, 3) | st.integers()
           | st.sampled_from([0.0, -0.0, 1.0, 2.0, 0.5, 1e308, 10.0 ** 20])
           | st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(["", "a", "1"]))
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.sampled_from(["a", "b", "1"]), inner, max_size=3),
                    max_leaves=12)


@settings(max_examples=400, deadline=None)
@given(st.lists(JSON, max_size=6))
def test_unique_agrees_with_jsonschema_equality(items: list[Any]) -> None:
    assert unique(items) == _jsonschema_equal_pairwise(items)
    # doubling an element is always caught, whatever its order in the list
    if items:
        assert not unique([*items, json.loads(json.dumps(items[0]))])


@settings(max_examples=200, deadline=None)
@given(st.lists(JSON, max_size=6))
def test_unique_items_agrees_with_jsonschema_where_jsonschema_is_consistent(
        items: list[Any]) -> None:
    """jsonschema's validator sorts what it can; its verdict agrees unless it misses one."""
    from jsonschema import Draft202012Validator

    theirs = Draft202012Validator({"uniqueItems": True}).is_valid(items)
    ours = strict_validator({"uniqueItems": True}).is_valid(items)
    assert ours == _jsonschema_equal_pairwise(items)
    if not theirs:  # jsonschema never reports a duplicate that is not one
        assert not ours


def test_json_schema_equality_cases() -> None:
    assert not unique([1, 1.0])
    assert unique([True, 1])
    assert unique([False, 0])
    assert unique([[True], [1]])
    assert not unique([{"a": 1, "b": [1, {"c": None}]}, {"b": [1.0, {"c": None}], "a": 1}])
    assert unique([{"a": 1}, {"a": 1, "b": 2}])
    assert unique([[1, 2], [2, 1]])
    assert not unique([10 ** 400, 10 ** 400])
    assert unique([10 ** 400, 1e308])
    # jsonschema's own sorting check misses this one (the stable sort keeps [True] between)
    assert duplicate([[1], [True], [1]]) == (0, 2)


def test_unique_items_over_8000_objects_is_quick(tmp_path: Path) -> None:
    env = _project(tmp_path)
    _plan(tmp_path, {"xs": {"type": "array", "uniqueItems": True}}, {"xs": "{params.xs}"})
    items = [{"a": i, "b": [i, {"c": str(i)}]} for i in range(8000)]
    (tmp_path / "p.json").write_text(json.dumps({"xs": items}))
    start = time.monotonic()
    res = run_planrun("validate", "p", "--params-file", "p.json", cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    (tmp_path / "p.json").write_text(json.dumps({"xs": [*items, {"b": [7.0, {"c": "7"}],
                                                                  "a": 7}]}))
    res = run_planrun("validate", "p", "--params-file", "p.json", cwd=tmp_path, env=env)
    assert time.monotonic() - start < 15  # each was 136 s with jsonschema's check
    assert res.returncode == 3, res.stdout + res.stderr
    assert "items 7 and 8000 are equal" in res.stdout + res.stderr


# --- 3. multipleOf exact; no exception from a check ever -----------------------------


def test_a_huge_integer_against_a_fractional_multiple_of(tmp_path: Path) -> None:
    env = _project(tmp_path, {"type": "object", "properties": {
        "n": {"type": "integer", "multipleOf": 0.5}, "m": {"type": "number",
                                                           "multipleOf": 0.7}}})
    _plan(tmp_path, {"n": {"type": "integer", "multipleOf": 0.5, "default": 10 ** 400}},
          {"n": "{params.n}", "m": 10 ** 400 * 7})
    huge = str(10 ** 400)
    res = run_planrun("validate", "p", "-p", f"n={huge}", cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    res = run_planrun("execute", "p", "-p", f"n={huge}", cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    _plan(tmp_path, {"n": {"type": "number", "multipleOf": 0.7}}, {"m": "{params.n}"})
    res = run_planrun("validate", "p", "-p", f"n={huge}", "--format", "json", cwd=tmp_path,
                      env=env)
    assert res.returncode == 3, res.stdout + res.stderr
    [(code, message)] = _issues(res)
    assert code == "param_type"
    assert "is not a multiple of 0.7" in message
    assert "Traceback" not in res.stderr


def test_a_huge_output_against_a_fractional_multiple_of_is_an_output_failure(
        tmp_path: Path) -> None:
    env = _project(tmp_path, output_schema={"type": "object", "properties": {
        "n": {"multipleOf": 0.7}}})
    _plan(tmp_path, {}, {"n": 10 ** 400})
    res = run_planrun("execute", "p", "--json", cwd=tmp_path, env=env)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "[internal]" not in res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    assert "is not a multiple of 0.7" in res.stdout


@settings(max_examples=300, deadline=None)
@given(st.integers(-10 ** 30, 10 ** 30) | st.floats(allow_nan=False, allow_infinity=False),
       st.integers(1, 10 ** 6) | st.floats(min_value=1e-6, max_value=1e6))
def test_multiple_of_is_exact_on_the_decimal_written(instance: Any, divisor: Any) -> None:
    expected = (Fraction(repr(instance)) / Fraction(repr(divisor))).denominator == 1
    assert multiple_of(instance, divisor) == expected
    assert strict_validator({"multipleOf": divisor}).is_valid(instance) == expected


def test_decimal_multiples_are_exact() -> None:
    assert multiple_of(0.3, 0.1)
    assert multiple_of(10 ** 400, 0.5)
    assert multiple_of(1e308, 0.5)
    assert not multiple_of(10 ** 400 + 1, 2)
    assert not multiple_of(5e-324, 1e-323)


@pytest.mark.parametrize("keyword", ["minimum", "maximum", "exclusiveMinimum",
                                     "exclusiveMaximum", "multipleOf", "const", "enum"])
@pytest.mark.parametrize("bound", [10 ** 400, 1e308, 5e-324, 0.5])
@pytest.mark.parametrize("value", [10 ** 400, -(10 ** 400), 1e308, -1e308, 5e-324, 0.1, 3])
def test_extreme_numbers_never_raise(keyword: str, bound: Any, value: Any) -> None:
    schema = {keyword: [bound] if keyword == "enum" else bound}
    errors = list(strict_validator(schema).iter_errors(value))
    assert all(isinstance(e.message, str) for e in errors)


def test_an_exception_inside_a_check_is_a_violation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever jsonschema raises (here a format checker) is one error, never a traceback."""
    import planrun.registry as registry

    validator = strict_validator({"type": "object", "properties": {"ip": {"format": "ipv4"}}})
    checker = validator.format_checker
    monkeypatch.setitem(checker.checkers, "ipv4", (lambda _v: 1 / 0, ()))
    [err] = list(validator.iter_errors({"ip": "secret-value"}))
    assert "cannot be checked against its schema (ZeroDivisionError" in err.message
    assert "secret-value" not in err.message
    assert err.validator == "format"
    assert registry  # the same validator class serves every schema planrun checks
