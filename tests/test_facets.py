"""``planrun.facets``: path syntax, what a path reaches, caps, and the output_schema check.

In-process and fast; the behaviour through the CLI is in ``tests/cli/test_facets_partial.py``.
"""

from __future__ import annotations

import pytest

from planrun.facets import (
    MAX_VALUE_BYTES,
    OTHER,
    PathError,
    compute,
    parse_path,
    reach,
    schema_problem,
    spec_of,
)


@pytest.mark.parametrize(("path", "tokens"), [
    (".", ()),
    ("files", (("key", "files"),)),
    ("files[]", (("key", "files"), ("flat", ""))),
    ("[].name", (("flat", ""), ("key", "name"))),
    ("m[][].x-y_1", (("key", "m"), ("flat", ""), ("flat", ""), ("key", "x-y_1"))),
    ("files.0.name", (("key", "files"), ("key", "0"), ("key", "name"))),
])
def test_paths_parse(path: str, tokens: tuple[tuple[str, str], ...]) -> None:
    assert parse_path(path) == tokens


@pytest.mark.parametrize("path", ["", "a..b", "a.", "files[", "a[]b", "a b", "$.a", "[0]"])
def test_malformed_paths_are_refused(path: str) -> None:
    with pytest.raises(PathError):
        parse_path(path)


def test_a_path_reaches_values_and_missing_parts_reach_nothing() -> None:
    out = {"files": [{"ext": "py"}, {"ext": "md"}, {}], "n": 3}
    assert reach(out, parse_path("files[].ext")) == ["py", "md"]
    assert reach(out, parse_path("files.1.ext")) == ["md"]
    assert reach(out, parse_path("files.9.ext")) == []
    assert reach(out, parse_path("n[]")) == []  # [] over a number reaches nothing
    assert reach(out, parse_path("nothing")) == []
    assert reach(out, parse_path(".")) == [out]


def test_counts_skip_nulls_and_groups_key_non_strings_by_json() -> None:
    spec = spec_of({"counts": {"n": "v[]"}, "group_counts": {"g": "v[]"}})
    assert spec is not None
    got = compute(spec, [{"v": ["a", None, 1, True, "a", {"k": 1}]}], fanout=False)
    assert got["values"] == {"n": 5, "g": {"a": 2, "1": 1, "true": 1, '{"k":1}': 1}}


def test_group_counts_fold_keys_past_the_cap_into_other() -> None:
    spec = spec_of({"group_counts": {"g": "."}, "max_group_keys": 2})
    assert spec is not None
    got = compute(spec, ["x", "y", "z", "x", "w", OTHER], fanout=True)
    # first two keys kept in the order first reached; z, w and a real "(other)" fold
    assert got["values"]["g"] == {"x": 2, "y": 1, OTHER: 3}
    assert list(got["values"]["g"]) == ["x", "y", OTHER]


def test_a_facet_never_copies_a_large_value() -> None:
    big = {"files": [f"file-{i}.txt" for i in range(200)]}  # ~2.8 KB of JSON
    small = "é" * (MAX_VALUE_BYTES // 2)  # exactly MAX_VALUE_BYTES of UTF-8, plus quotes
    spec = spec_of({"paths": {"whole": ".", "name": "name"}})
    assert spec is not None
    got = compute(spec, [{**big, "name": "a"}], fanout=False)
    assert got == {"values": {"whole": None, "name": "a"}, "cut": ["whole"]}
    spec = spec_of({"paths": {"p": "v"}, "group_counts": {"g": "v"}})
    assert spec is not None
    got = compute(spec, [{"v": big}, {"v": "x"}, {"v": small[:-1]}, {"v": big}], fanout=True)
    assert got["values"]["p"] == ["x", small[:-1]]
    assert got["cut"] == ["p"]
    assert got["values"]["g"] == {"x": 1, small[:-1]: 1, OTHER: 2}


def test_fan_out_paths_are_distinct_values_and_cut_at_the_cap() -> None:
    spec = spec_of({"paths": {"p": "v"}, "max_group_keys": 2})
    assert spec is not None
    assert compute(spec, [{"v": 1}, {"v": 1}, {"v": 2}], fanout=True) == {
        "values": {"p": [1, 2]}, "cut": []}
    assert compute(spec, [{"v": 1}, {"v": 2}, {"v": 3}], fanout=True) == {
        "values": {"p": [1, 2]}, "cut": ["p"]}
    # one output, a path without []: the value itself, or null
    assert compute(spec, [{"v": 3}], fanout=False)["values"] == {"p": 3}
    assert compute(spec, [{}], fanout=False)["values"] == {"p": None}


SCHEMA = {"type": "object", "additionalProperties": False, "properties": {
    "name": {"type": "string"},
    "files": {"type": "array", "items": {"type": "object", "additionalProperties": False,
                                         "properties": {"ext": {"type": "string"}}}},
    "open": {"type": "object"}}}


@pytest.mark.parametrize(("path", "problem"), [
    ("files[].ext", None),
    ("files.0.ext", None),
    ("open.anything", None),  # no additionalProperties: false, nothing to say
    ("nope", "has no 'nope'"),
    ("files[].size", "has no 'size'"),
    ("name[]", "not an array"),
    ("name.x", "so it has no 'x'"),
])
def test_paths_are_checked_against_output_schema(path: str, problem: str | None) -> None:
    why = schema_problem(parse_path(path), SCHEMA)
    if problem is None:
        assert why is None
    else:
        assert why is not None
        assert problem in why


@pytest.mark.parametrize(("expr", "output", "facets"), [
    ("steps.a.facets.n > 3", False, True),
    ('steps["a"].facets["n"] > 3', False, True),
    ("steps.a.output.size() > 0", True, False),
    ("steps.b.facets.n > 0", False, False),
    ("steps.a == null", True, True),  # the whole step
    ("steps[params.s].output == 1", True, True),  # any step may be read
    ('"a" in steps', True, True),
])
def test_what_a_condition_reads_of_a_step(expr: str, output: bool, facets: bool) -> None:
    from planrun.conditions import facet_reads, reads_facets, reads_output

    assert reads_output(expr, "a") is output
    assert reads_facets(expr, "a") is facets
    if expr.startswith("steps.a.facets") or expr.startswith('steps["a"].facets'):
        assert facet_reads(expr) == {("a", "n")}
