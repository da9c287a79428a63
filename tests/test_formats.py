"""The fast path of planrun.formats says yes only where the pydantic models say yes (issue 16).

Whenever :func:`~planrun.formats.step_data` / ``head_data`` / ``tool_data`` accept a
mapping, the model (``Step``, ``PlanHead``, ``Tool``) accepts it too and every attribute
is equal (same type, same value, nested ``retries``/``facets`` included). And the fast
path accepts every plan and registry of the repository, the tests' fixtures and generated
valid ones, so it cannot pass by declining everything.
"""

from __future__ import annotations

import ast
import math
import typing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from planrun import formats
from planrun.formats import (
    FacetsData,
    HeadData,
    RetriesData,
    StepData,
    ToolData,
    head_data,
    step_data,
    tool_data,
)
from planrun.loading import DocumentError, parse_text
from planrun.models import Facets, PlanHead, Retries, Step, Tool

ROOT = Path(__file__).resolve().parent.parent
PAIRS: list[tuple[Any, Any]] = [(RetriesData, Retries), (FacetsData, Facets), (StepData, Step),
         (HeadData, PlanHead), (ToolData, Tool)]


def text_keys(v: Any) -> bool:
    """JSON data as planrun's loader gives it: every mapping key is text."""
    if isinstance(v, dict):
        return all(isinstance(k, str) and text_keys(x) for k, x in v.items())
    if isinstance(v, list):
        return all(text_keys(x) for x in v)
    return True


def same(fast: Any, model: Any) -> None:
    """Every field of the model equal in ``fast`` (type and value; nested models too), and
    the dumps (the JSON one for loader data: pydantic's renders other keys as text)."""
    for name in type(model).model_fields:
        a, b = getattr(fast, name), getattr(model, name)
        if isinstance(b, BaseModel):
            same(a, b)
        else:
            assert type(a) is type(b), (name, a, b)
            assert a == b, (name, a, b)
    assert fast.model_dump() == model.model_dump()
    if text_keys(fast.model_dump()):
        assert fast.model_dump(mode="json") == model.model_dump(mode="json")


# --- the two descriptions have the same fields, defaults and choices ------------------------

@pytest.mark.parametrize(("data", "model"), PAIRS, ids=lambda x: x.__name__)
def test_fields_defaults_and_choices_are_the_models(data: Any, model: Any) -> None:
    assert data._fields == tuple(model.model_fields)
    assert data._required == tuple(n for n, i in model.model_fields.items() if i.is_required())
    built = data(**{n: "x" for n in data._required})  # every default, fresh
    for name, info in model.model_fields.items():
        if not info.is_required():
            assert getattr(built, name) == info.get_default(call_default_factory=True), name
    for name in data._factories:  # default_factory: each object its own
        assert getattr(built, name) is not getattr(data(**{n: "x" for n in data._required}),
                                                   name)


def test_the_records_are_frozen_and_compare_by_value() -> None:
    a, b = StepData(id="s", tool="t"), step_data({"id": "s", "tool": "t"})
    assert a == b
    assert a != StepData(id="s", tool="u")
    with pytest.raises(AttributeError):
        a.id = "x"
    with pytest.raises(TypeError):
        StepData(id="s")
    with pytest.raises(TypeError):
        StepData(id="s", tool="t", retry=2)


LITERALS = {("Step", "on_item_error"): formats.ON_ITEM_ERROR,
            ("Step", "run_if"): formats.RUN_IF, ("Step", "approve"): formats.APPROVE,
            ("Tool", "output"): formats.OUTPUT_MODES, ("Tool", "dedupe"): formats.DEDUPE_SCOPES,
            ("Tool", "approve"): formats.APPROVE}


def test_every_literal_field_has_its_choices_here() -> None:
    found = {}
    for _data, model in PAIRS:
        for name, info in model.model_fields.items():
            for part in (info.annotation, *typing.get_args(info.annotation)):
                if typing.get_origin(part) is typing.Literal:
                    found[(model.__name__, name)] = typing.get_args(part)
    assert found == LITERALS


# --- every edge value at every field of a valid mapping -------------------------------------

BASES: list[tuple[Any, Any, dict[str, Any]]] = [(step_data, Step, {"id": "s1", "tool": "t"}),
         (head_data, PlanHead, {"planrun": 1, "goal": "g", "steps": []}),
         (tool_data, Tool, {"python": "m:f", "arguments": {"type": "object"}})]
NESTED_MODELS: dict[str, Any] = {"retries": Retries, "facets": Facets}


def one_field_off() -> list[tuple[Any, Any, dict[Any, Any]]]:
    """(fast path, model, a valid mapping with one field, nested one or key set to an edge)."""
    cases = []
    for fast, model, base in BASES:
        for name in [*model.model_fields, "retry", 1]:
            for value in EDGES:
                cases.append((fast, model, {**base, name: value}))
            sub = NESTED_MODELS.get(name) if isinstance(name, str) else None
            for inner in [*sub.model_fields, "extra"] if sub else []:
                for value in EDGES:
                    cases.append((fast, model, {**base, name: {inner: value}}))
                    if inner in ("paths", "counts", "group_counts"):
                        cases.append((fast, model, {**base, name: {inner: {"n": value}}}))
                        if isinstance(value, str):
                            cases.append((fast, model, {**base, name: {inner: {value: "x"}}}))
        for missing in [n for n, info in model.model_fields.items() if info.is_required()]:
            cases.append((fast, model, {k: v for k, v in base.items() if k != missing}))
    for value in EDGES:  # a parameter's name, and its declaration
        cases.append((head_data, PlanHead, {**BASES[1][2], "params": {"p": value}}))
        if isinstance(value, str):
            cases.append((head_data, PlanHead, {**BASES[1][2], "params": {value: {}}}))
    return cases


def test_one_edge_value_anywhere_the_fast_path_accepts_only_what_the_model_does() -> None:
    cases = one_field_off()
    accepted = 0
    for fast, model, raw in cases:
        got = fast(raw)
        if got is not None:
            accepted += 1
            same(got, model.model_validate(raw))
    assert accepted > len(cases) // 10, (accepted, len(cases))  # not a test of declining


# --- generated valid mappings (the fast path accepts them all) ------------------------------

NAME = st.from_regex(r"\A[A-Za-z][A-Za-z0-9_-]{0,6}\Z")
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                    | st.text(max_size=4),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=8)
GOOD_SECONDS = st.one_of(st.integers(1, 10**9), st.floats(min_value=1e-3, max_value=1e9))
GOOD_RETRIES = st.fixed_dictionaries({}, optional={
    "max_attempts": st.integers(1, 1000),
    "backoff_s": st.one_of(st.integers(0, 86_400), st.floats(0, 86_400)),
    "on_exit_codes": st.none() | st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3)})
FACET_NAMES = st.dictionaries(st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_]{0,4}\Z"), st.text(),
                              max_size=2)
GOOD_FACETS = st.fixed_dictionaries({}, optional={
    "paths": FACET_NAMES, "counts": FACET_NAMES, "group_counts": FACET_NAMES,
    "max_group_keys": st.integers(1, 1000)})
GOOD_STEP = st.fixed_dictionaries({"id": NAME, "tool": st.text(min_size=1)}, optional={
    "arguments": st.dictionaries(st.text(max_size=4), JSON, max_size=3),
    "depends_on": st.lists(NAME, max_size=3), "intent": st.none() | st.text(),
    "for_each": st.none() | st.text() | st.lists(JSON, max_size=3),
    "max_parallel": st.none() | st.integers(1, 2**63 - 1),
    "max_items": st.none() | st.integers(1, 2**63 - 1),
    "on_item_error": st.none() | st.sampled_from(formats.ON_ITEM_ERROR),
    "timeout": st.none() | GOOD_SECONDS, "retries": st.none() | GOOD_RETRIES,
    "when": st.none() | st.text(), "run_if": st.none() | st.sampled_from(formats.RUN_IF),
    "approve": st.none() | st.just("resolved"), "pool": st.none() | st.text(),
    "max_recoveries": st.none() | st.integers(0, 2**63 - 1),
    "facets": st.none() | GOOD_FACETS,
})
GOOD_HEAD = st.fixed_dictionaries(
    {"planrun": st.just(1), "goal": st.text(), "steps": st.lists(JSON, max_size=3)},
    optional={"name": st.none() | st.text(min_size=1), "revision": st.integers(1, 2**63 - 1),
              "params": st.dictionaries(st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_-]{0,4}\Z"),
                                        st.dictionaries(st.text(max_size=3), JSON,
                                                        max_size=2), max_size=2),
              "max_parallel": st.none() | st.integers(1, 2**63 - 1),
              "timeout": st.none() | GOOD_SECONDS})
TARGET = st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_.]{0,4}:[A-Za-z_][A-Za-z0-9_]{0,4}\Z")
GOOD_TOOL = st.fixed_dictionaries({}, optional={
    "description": st.none() | st.text(), "command": st.none() | st.lists(st.text(),
                                                                          min_size=1),
    "python": st.none() | TARGET, "arguments": st.none() | st.just({"type": "object"}),
    "accepts": st.none() | TARGET, "output": st.none() | st.sampled_from(formats.OUTPUT_MODES),
    "output_schema": st.none() | st.dictionaries(st.text(max_size=3), JSON, max_size=2),
    "irreversible": st.booleans(), "idempotent": st.booleans(),
    "key_arguments": st.none() | st.lists(st.text(), max_size=2),
    "dedupe": st.sampled_from(formats.DEDUPE_SCOPES),
    "dedupe_ttl": st.none() | st.sampled_from(["12h", "x"]) | st.floats(allow_nan=False,
                                                                       allow_infinity=False),
    "timeout": st.none() | GOOD_SECONDS, "retries": st.none() | GOOD_RETRIES,
    "cwd": st.none() | st.text(), "pool": st.none() | st.text(),
    "approve": st.none() | st.just("resolved"),
    "allow_embedded": st.none() | st.lists(st.text(), max_size=2),
    "allow_option_values": st.none() | st.booleans() | st.lists(st.text(), max_size=2),
    "blocking": st.none() | st.booleans(),
})


# --- generated mappings: fast yes ⇒ pydantic yes, equal -------------------------------------

EDGES: list[Any] = [
    None, True, False, 0, 1, -1, 2, 25, 1000, 1001, 86_400, 10**9, 10**9 + 1,
    2**53, 2**53 + 1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 10**30,
    0.0, -0.0, 0.5, 1.0, 5e-324, 86_400.0, 86_400.5, 1e9, 1e9 + 1, 1.5e300,
    math.nan, math.inf, -math.inf,
    "", "a", "s1", "a\n", "\na", "1a", "-a", "a-b", "a_b", "a.b", "_x", "é", "aé", "ab ",
    "mod:fn", "mod.sub:fn.attr", "mod:Model", "mod:Mod.el", "mod:", ":fn", "1mod:fn",
    "mod:fn\n", "m:f²", "m:fé", "m:f\u0301",  # Rust's \w has marks but not ², Python's not
    "fail", "continue", "skip", "collect", "success", "failure", "always",
    "resolved", "none", "text", "json", "run", "plan", "Run", "12h", "0d",
    [], ["a"], ["a", "b"], ["a", 1], [1, 2], [-1], [True], [2**63], [None], [""],
    {}, {"a": 1}, {1: "a"}, {"a": {"b": 1}}, {"type": "object"}, {"n": "files[].ext"},
    10**400, {"a": math.inf}, [math.nan], {"n": 1}, {"1n": "x"}, {"n-1": "x"}, {"p": {}},
    {"p": {1: 2}}, {"p.q": {}}, {"p": 1}, {"max_attempts": 2}, {"max_attempts": True},
    {"backoff_s": -1}, {"on_exit_codes": [True]}, {"counts": {"n": "x"}},
    {"counts": {"n": 1}}, {"max_group_keys": 0}, {"paths": {"é": "x"}},
]
EDGE = st.sampled_from(EDGES)
RETRIES_VALUES = {
    "max_attempts": st.one_of(st.sampled_from([1, 3, 1000, 1001, 0]), EDGE),
    "backoff_s": st.one_of(st.sampled_from([0, 0.0, 1.5, 86_400, 86_401, -0.1]), EDGE),
    "on_exit_codes": st.one_of(st.lists(st.one_of(st.integers(), st.booleans()),
                                        max_size=3), EDGE),
}
FACET_TABLE = st.dictionaries(
    st.one_of(st.sampled_from(["n", "_n", "n1", "1n", "n-1", "é", ""]), st.integers(0, 2)),
    st.one_of(st.sampled_from(["files[].ext", "x", ""]), EDGE), max_size=3)
FACETS_VALUES = {
    "paths": st.one_of(FACET_TABLE, EDGE), "counts": st.one_of(FACET_TABLE, EDGE),
    "group_counts": st.one_of(FACET_TABLE, EDGE),
    "max_group_keys": st.one_of(st.sampled_from([1, 25, 1000, 1001, 0]), EDGE),
}
UNKNOWN = ["retry", "Id", "ids", "extra", 1, 0, True]




def mutated(good: st.SearchStrategy[dict[str, Any]], values: dict[Any, Any],
            required: tuple[str, ...] = ()) -> st.SearchStrategy[dict[Any, Any]]:
    """A valid mapping with up to two fields (or unknown ones) set to edge values, and
    maybe a required field left out: most stay valid, each edge value meets valid others."""
    keys = [*values, *UNKNOWN]

    def apply(base: dict[str, Any], changes: dict[Any, Any], drop: list[str]
              ) -> dict[Any, Any]:
        out = {**base, **changes}
        for k in drop:
            out.pop(k, None)
        return out

    changes = st.lists(st.sampled_from(keys), max_size=2, unique=True).flatmap(
        lambda ks: st.fixed_dictionaries({k: values.get(k, EDGE) for k in ks}))
    drops = st.lists(st.sampled_from(required), max_size=1) if required else st.just([])
    return st.builds(apply, good, changes, st.just([]) | st.just([]) | drops)


RETRIES = mutated(GOOD_RETRIES, RETRIES_VALUES)
FACETS = mutated(GOOD_FACETS, FACETS_VALUES)
SECONDS = st.one_of(st.sampled_from([1, 0.5, 1e9, 10**9, 1e9 + 1, 0, -1]), st.floats(), EDGE)
POSITIVE = st.one_of(st.sampled_from([1, 2, 2**63 - 1, 2**63, 0]), EDGE)
NESTED = {"retries": st.one_of(RETRIES, EDGE), "facets": st.one_of(FACETS, EDGE)}
STEP_VALUES = {
    "id": st.one_of(st.sampled_from(["s1", "a-b_c", "S", "1a", "a.b", "a\n", ""]), EDGE),
    "tool": st.one_of(st.sampled_from(["noop", "x.y", ""]), EDGE),
    "arguments": st.one_of(st.dictionaries(st.one_of(st.text(max_size=2), st.integers()),
                                           EDGE, max_size=3), EDGE),
    "depends_on": st.one_of(st.lists(st.one_of(st.sampled_from(["s1", ""]), EDGE),
                                     max_size=3), EDGE),
    "intent": EDGE, "for_each": EDGE, "max_parallel": POSITIVE, "max_items": POSITIVE,
    "on_item_error": EDGE, "timeout": SECONDS, "retries": NESTED["retries"], "when": EDGE,
    "run_if": EDGE, "approve": EDGE, "pool": EDGE,
    "max_recoveries": st.one_of(st.sampled_from([0, 3, -1, 10**20]), EDGE),
    "facets": NESTED["facets"],
}
HEAD_VALUES = {
    "planrun": st.one_of(st.just(1), EDGE), "name": EDGE, "revision": POSITIVE,
    "goal": st.one_of(st.just("g"), EDGE),
    "params": st.one_of(st.dictionaries(
        st.one_of(st.sampled_from(["p", "_p", "p-1", "1p", "p.q", "p\n"]), st.integers()),
        st.one_of(st.dictionaries(st.one_of(st.just("type"), st.integers()), EDGE,
                                  max_size=2), EDGE), max_size=2), EDGE),
    "max_parallel": POSITIVE, "timeout": SECONDS,
    "steps": st.one_of(st.lists(EDGE, max_size=3), EDGE),
}
TOOL_VALUES = {
    "description": EDGE, "command": EDGE,
    "python": st.one_of(st.sampled_from(["m:f", "m.n:f.g", "m:f:g", "m", "é:f"]), EDGE),
    "arguments": EDGE,
    "accepts": st.one_of(st.sampled_from(["m:M", "m.n:M", "m:M.N", "m:1"]), EDGE),
    "output": EDGE, "output_schema": EDGE, "irreversible": EDGE, "idempotent": EDGE,
    "key_arguments": EDGE, "dedupe": EDGE,
    "dedupe_ttl": st.one_of(st.floats(), st.integers(), EDGE),
    "timeout": SECONDS, "retries": NESTED["retries"], "cwd": EDGE, "pool": EDGE,
    "approve": EDGE, "allow_embedded": EDGE, "allow_option_values": EDGE,
    "blocking": EDGE,
}
CASES = [(step_data, Step, mutated(GOOD_STEP, STEP_VALUES, ("id", "tool"))),
         (head_data, PlanHead, mutated(GOOD_HEAD, HEAD_VALUES, ("planrun", "goal", "steps"))),
         (tool_data, Tool, mutated(GOOD_TOOL, TOOL_VALUES)),
         (formats.retries_data, Retries, RETRIES), (formats.facets_data, Facets, FACETS)]


@pytest.mark.parametrize(("fast", "model", "strategy"), CASES,
                         ids=["Step", "PlanHead", "Tool", "Retries", "Facets"])
def test_what_the_fast_path_accepts_the_model_accepts_alike(
        fast: Any, model: Any, strategy: st.SearchStrategy[dict[Any, Any]]) -> None:
    @given(strategy)
    def check(raw: dict[Any, Any]) -> None:
        got = fast(raw)
        if got is not None:
            same(got, model.model_validate(raw))

    check()


@pytest.mark.parametrize(("fast", "model", "strategy"),
                         [(step_data, Step, GOOD_STEP), (head_data, PlanHead, GOOD_HEAD),
                          (tool_data, Tool, GOOD_TOOL)], ids=["Step", "PlanHead", "Tool"])
def test_the_fast_path_accepts_generated_valid_mappings(
        fast: Any, model: Any, strategy: st.SearchStrategy[dict[str, Any]]) -> None:
    @given(strategy)
    def check(raw: dict[str, Any]) -> None:
        got = fast(raw)
        assert got is not None, raw
        same(got, model.model_validate(raw))

    check()


# --- every plan and registry in the repository and the tests --------------------------------

def _texts_of(path: Path) -> list[str]:
    """The YAML documents in a file: the file itself, its multi-line strings, a test's
    string literals."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        return [n.value for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Constant)
                and isinstance(n.value, str) and ("planrun:" in n.value or "tools:" in n.value)]
    out = [text]
    try:
        data = parse_text(text, kind="yaml").data
    except DocumentError:
        return out

    def walk(v: Any) -> None:
        if isinstance(v, str) and "\n" in v:
            out.append(v)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
    walk(data)
    return out


def corpus() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(plan heads, steps, tool entries) that the models accept, from every file around."""
    files = [*ROOT.glob("plans/*.yaml"), ROOT / "tools.yaml", *ROOT.glob("tests/**/*.yaml"),
             *ROOT.glob("tests/**/*.py"), *ROOT.glob("docs/**/*.md")]
    heads: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    tools: list[dict[str, Any]] = []
    for path in files:
        for text in _texts_of(path):
            try:
                data = parse_text(text, kind="yaml").data
            except DocumentError:
                continue
            if not isinstance(data, dict):
                continue
            if data.get("planrun") == 1 and isinstance(data.get("steps"), list):
                heads.append(data)
                steps.extend(s for s in data["steps"] if isinstance(s, dict))
            if isinstance(data.get("tools"), dict):
                tools.extend(t for t in data["tools"].values() if isinstance(t, dict))
    return heads, steps, tools


def _valid(model: Any, raw: dict[str, Any]) -> Any:
    from pydantic import ValidationError

    try:
        return model.model_validate(raw)
    except ValidationError:
        return None


def test_the_fast_path_accepts_every_plan_and_registry_around() -> None:
    heads, steps, tools = corpus()
    counts = {}
    for fast, model, items in ((head_data, PlanHead, heads), (step_data, Step, steps),
                               (tool_data, Tool, tools)):
        valid = [(raw, m) for raw in items if (m := _valid(model, raw)) is not None]
        for raw, m in valid:
            got = fast(raw)
            assert got is not None, raw
            same(got, m)
        counts[model.__name__] = len(valid)
    # the corpus is real: the repository's plans, the acceptance cases, the tests' texts
    assert counts["PlanHead"] > 100, counts
    assert counts["Step"] > 300, counts
    assert counts["Tool"] > 100, counts


# --- what the fast path declines but the model accepts keeps the model's values ------------

def test_a_step_only_pydantic_accepts_gets_the_models_values() -> None:
    raw = {"id": "s", "tool": "t", "max_recoveries": 10**20,
           "retries": {"on_exit_codes": [2**64]}, "facets": {"counts": {"n": "x"}}}
    assert step_data(raw) is None  # beyond 64 bits: not certain here
    got = StepData.of_model(Step.model_validate(raw))
    assert isinstance(got.retries, RetriesData)
    assert isinstance(got.facets, FacetsData)
    same(got, Step.model_validate(raw))
