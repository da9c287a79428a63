"""A contract that reads only keys and types is checked once per shape (issue 16).

The memo of fits (:mod:`planrun.validation.arguments`) keys a shape-determined contract's
checks by the arguments' shape (:mod:`planrun.validation.shapes`); these tests show that a
value the schema would refuse is never let through by it: every keyword that reads a value
keeps checks by value, a command tool's option rule still reads values, and for random
shape-only schemas two values of one shape always get the same verdict from the library.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import Project, codes
from planrun.registry import ToolSpec, strict_validator
from planrun.validation import argument_problems
from planrun.validation.shapes import shape_determined, shape_of

pytestmark = pytest.mark.usefixtures("empty_memo")


TYPED = """\
tools:
  count:
    python: basictools:echo
    arguments:
      type: object
      properties:
        n: {type: integer}
        tags: {type: array, items: {type: string}}
      required: [n]
      additionalProperties: false
  archive:
    command: ["tar", "-czf", "{dest}", "-C", "{source}", "."]
    arguments:
      type: object
      properties: {source: {type: string}, dest: {type: string}}
      required: [source, dest]
      additionalProperties: false
"""


def _tool(project: Project, name: str, tools: str = TYPED) -> ToolSpec:
    project.write_tools(tools)
    return project.good_registry().tools[name]


def test_a_shape_is_checked_once_for_a_type_only_contract(project: Project,
                                                           schema_checks: list[Any]) -> None:
    plan = "planrun: 1\ngoal: g\nsteps:\n" + "".join(
        f"  - {{id: s{i}, tool: count, arguments: {{n: {i}}}}}\n" for i in range(1, 6))
    project.write_tools(TYPED)
    report, checked = project.check(plan)
    assert checked is not None, report
    assert schema_checks == [{"n": 1}]  # s2..s5: other values, the same shape

    # another shape is checked, and a wrong type is still refused
    report, checked = project.check(plan.replace("{n: 5}", '{n: "5"}'))
    assert checked is None
    assert codes(report) == ["arguments"]
    assert schema_checks[-1] == {"n": "5"}


def test_lists_of_another_length_are_another_shape(project: Project,
                                                   schema_checks: list[Any]) -> None:
    tool = _tool(project, "count")
    assert argument_problems(tool, {"n": 1, "tags": ["a"]}) == []
    assert argument_problems(tool, {"n": 2, "tags": ["b"]}) == []
    assert len(schema_checks) == 1
    assert argument_problems(tool, {"n": 2, "tags": ["b", "c"]}) == []
    assert len(schema_checks) == 2
    problems = argument_problems(tool, {"n": 2, "tags": ["b", 3]})
    assert [p for p, _m, _k in problems] == ["/tags/1"]


def test_a_command_tools_option_rule_still_reads_every_value(project: Project,
                                                             schema_checks: list[Any]) -> None:
    tool = _tool(project, "archive")
    assert argument_problems(tool, {"source": "data", "dest": "out.tgz"}) == []
    problems = argument_problems(tool, {"source": "-rf", "dest": "out.tgz"})
    assert len(schema_checks) == 1  # the schema's verdict came from the memo...
    assert [p for p, _m, _k in problems] == ["/source"]  # ...the option rule did not
    assert "starts with '-'" in problems[0][1]
    nul = argument_problems(tool, {"source": "a\x00b", "dest": "out.tgz"})
    assert [p for p, _m, _k in nul] == ["/source"]


#: (keyword and value, a value that fits, a value of the same shape that does not)
VALUE_RULES = [
    ({"enum": [1, 2]}, 1, 3),
    ({"const": 1}, 1, 2),
    ({"minimum": 0}, 1, -1),
    ({"maximum": 5}, 1, 6),
    ({"exclusiveMinimum": 0}, 1, 0),
    ({"exclusiveMaximum": 5}, 1, 5),
    ({"multipleOf": 2}, 2, 3),
    ({"type": "string", "minLength": 2}, "ab", "a"),
    ({"type": "string", "maxLength": 1}, "a", "ab"),
    ({"type": "string", "pattern": "^a"}, "ab", "ba"),
    ({"type": "string", "format": "date"}, "2026-12-02", "2026-13-45"),
    ({"type": "array", "uniqueItems": True}, [1, 2], [1, 1]),
    ({"$ref": "#/$defs/small"}, 1, 9),
    ({"not": {"const": 9}}, 1, 9),
    ({"anyOf": [{"enum": [1]}, {"type": "string"}]}, 1, 2),
]


@pytest.mark.parametrize(("rule", "fits", "breaks"), VALUE_RULES,
                         ids=["-".join(k for k in r if k != "type") for r, _f, _b in VALUE_RULES])
def test_a_keyword_that_reads_values_keeps_checks_by_value(project: Project, rule: Any,
                                                           fits: Any, breaks: Any) -> None:
    contract: dict[str, Any] = {"type": "object", "properties": {"v": rule},
                                "additionalProperties": False,
                                "$defs": {"small": {"maximum": 5}}}
    assert not shape_determined(contract)
    project.write_tools("tools:\n  t:\n    python: basictools:echo\n    arguments: "
                        + json.dumps(contract) + "\n")
    tool = project.good_registry().tools["t"]
    assert shape_of({"v": fits}) == shape_of({"v": breaks})
    assert argument_problems(tool, {"v": fits}) == []
    assert [p for p, _m, _k in argument_problems(tool, {"v": breaks})] != []


DRAFT_07 = "http://json-schema.org/draft-07/schema#"
DRAFT_2020 = "https://json-schema.org/draft/2020-12/schema"


@pytest.mark.parametrize("dialect", [DRAFT_07, DRAFT_2020])
def test_a_schema_keyword_inside_does_not_make_the_check_lenient(project: Project,
                                                                 dialect: str) -> None:
    """jsonschema follows a nested ``$schema`` to a class without planrun's strictness.

    There ``2.0`` was an integer and ``2.5`` was not: two values of one shape, two
    verdicts — the 2.5 of a fan-out after a 2.0 came out of the memo as a fit.
    """
    contract = {"type": "object", "additionalProperties": False, "required": ["n"],
                "properties": {"n": {"$schema": dialect, "type": "integer"}}}
    project.write_tools("tools:\n  t:\n    python: basictools:echo\n    arguments: "
                        + json.dumps(contract) + "\n")
    tool = project.good_registry().tools["t"]
    assert argument_problems(tool, {"n": 2}) == []
    for value in (2.0, 2.5):
        assert [p for p, _m, _k in argument_problems(tool, {"n": value})] == ["/n"]


@pytest.mark.parametrize("schema", [
    {"type": "object", "unevaluatedProperties": False},
    {"type": "object", "properties": {"a": {"x-custom": 1}}},
    {"type": "object", "properties": []},
    {"allOf": {"type": "object"}},
    {"items": {"contentEncoding": "base64"}},
    [],
])
def test_what_is_not_understood_is_not_shape_determined(schema: Any) -> None:
    assert not shape_determined(schema)


def test_shapes_keep_keys_lengths_and_json_types() -> None:
    assert shape_of({"x": 3, "tags": ["a", "b"]}) == '{"tags":["s","s"],"x":"i"}'
    # planrun's strict integer refuses 2.0, and a bool is not a number: all differ
    assert len({shape_of(v) for v in (1, 1.0, True, "1", None)}) == 5
    with pytest.raises(TypeError):
        shape_of({"x": object()})


# --- the claim itself: one shape, one verdict, for random shape-only schemas ----------

_types = st.sampled_from(["integer", "number", "string", "boolean", "null", "array",
                          "object"])


def _schemas() -> st.SearchStrategy[Any]:
    leaf = st.one_of(st.booleans(), st.builds(lambda t: {"type": t}, _types),
                     st.builds(lambda ts: {"type": ts}, st.lists(_types, min_size=1,
                                                                 max_size=3, unique=True)),
                     # an annotation, as far as planrun is concerned (not followed)
                     st.builds(lambda d, t: {"$schema": d, "type": t},
                               st.sampled_from([DRAFT_07, DRAFT_2020]), _types))

    def grow(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        names = st.sampled_from(["a", "b", "c"])
        return st.one_of(
            st.builds(lambda p, r, extra: {"type": "object", "properties": p,
                                           "required": r, "additionalProperties": extra},
                      st.dictionaries(names, inner, max_size=3),
                      st.lists(names, max_size=2, unique=True), inner),
            st.builds(lambda i, lo: {"type": "array", "items": i, "minItems": lo},
                      inner, st.integers(0, 2)),
            st.builds(lambda xs: {"anyOf": xs}, st.lists(inner, min_size=1, max_size=3)),
            st.builds(lambda xs: {"oneOf": xs}, st.lists(inner, min_size=1, max_size=3)),
            st.builds(lambda x: {"not": x}, inner),
            st.builds(lambda c, lo: {"contains": c, "minContains": lo}, inner,
                      st.integers(0, 2)),
            st.builds(lambda n: {"maxProperties": n}, st.integers(0, 3)),
        )
    return st.recursive(leaf, grow, max_leaves=8)


_shapes = st.recursive(
    st.sampled_from(["b", "i", "f", "s", "z"]),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from(["a", "b", "c"]), inner,
                                            max_size=3)),
    max_leaves=10)

_VALUES = {"b": st.booleans(), "i": st.integers(-3, 3),
           "f": st.floats(allow_nan=False, allow_infinity=False)
           | st.integers(-3, 3).map(float),  # 2.0: an integer to a lenient validator
           "s": st.text(max_size=3), "z": st.none()}


def _value_of(shape: Any) -> st.SearchStrategy[Any]:
    if isinstance(shape, str):
        return _VALUES[shape]
    if isinstance(shape, list):
        return st.tuples(*map(_value_of, shape)).map(list)
    return st.fixed_dictionaries({k: _value_of(v) for k, v in shape.items()})


@settings(max_examples=300, deadline=None)
@given(schema=_schemas(), pair=_shapes.flatmap(lambda s: st.tuples(_value_of(s),
                                                                    _value_of(s))))
def test_one_shape_one_verdict_from_the_library(schema: Any, pair: tuple[Any, Any]) -> None:
    first, second = pair
    assert shape_determined(schema)
    assert shape_of(first) == shape_of(second)
    validator = strict_validator(schema)
    assert validator.is_valid(first) == validator.is_valid(second)
