"""planrun.loading: YAML 1.2 core typing, duplicate keys, alias bound, limits, locate()."""

from __future__ import annotations

import json
import math
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planrun import loading, yamltext
from planrun.loading import (
    MAX_DEPTH,
    Document,
    DocumentError,
    kind_of,
    load_file,
    parse_text,
    pointer,
    pointer_escape,
    split_pointer,
)


def data_of(text: str, kind: str = "yaml") -> Any:
    return parse_text(text, kind=kind, file="f.yaml").data


def refused(text: str, kind: str = "yaml") -> list[Any]:
    with pytest.raises(DocumentError) as info:
        parse_text(text, kind=kind, file="f.yaml")
    assert info.value.issues, "a DocumentError must carry at least one issue"
    return info.value.issues


@pytest.fixture
def alarm() -> Iterator[None]:
    """Turn a hang (e.g. an alias bomb being expanded) into a failure instead of a stall."""

    def fail(_sig: int, _frame: Any) -> None:
        raise AssertionError("did not finish within 10 s")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


# --- YAML 1.2 core typing -------------------------------------------------------------


@pytest.mark.parametrize(
    ("scalar", "expected"),
    [
        # YAML 1.1 booleans stay text
        ("no", "no"), ("yes", "yes"), ("on", "on"), ("off", "off"), ("y", "y"), ("n", "n"),
        ("No", "No"), ("YES", "YES"), ("Off", "Off"),
        # dates, times and sexagesimal stay text
        ("2026-08-06", "2026-08-06"), ("2026-08-06T10:00:00Z", "2026-08-06T10:00:00Z"),
        ("1:30", "1:30"), ("190:20:30", "190:20:30"),
        # integers: no implicit octal, 0o octal, 0x hex; no underscores or binary
        ("012", 12), ("0o12", 10), ("0x1F", 31), ("+12", 12), ("-7", -7), ("0", 0),
        ("1_000", "1_000"), ("0b101", "0b101"), ("-0o12", "-0o12"),
        # floats
        ("1.5", 1.5), ("1e3", 1000.0), (".5", 0.5), ("-2.5e-3", -0.0025), ("1.", 1.0),
        # booleans: only true/false spellings of the core schema
        ("true", True), ("false", False), ("True", True), ("FALSE", False),
        # null
        ("null", None), ("~", None), ("", None), ("Null", None),
        # quoted and explicitly tagged
        ('"true"', "true"), ("'12'", "12"), ("!!str 12", "12"), ("!!int '12'", 12),
    ],
)
def test_yaml_core_typing(scalar: str, expected: Any) -> None:
    value = data_of(f"a: {scalar}\n")["a"]
    assert value == expected
    assert type(value) is type(expected)


def test_only_true_and_false_are_booleans() -> None:
    doc = data_of("a: [true, false, yes, no, on, off, y, n]\n")
    assert [v for v in doc["a"] if isinstance(v, bool)] == [True, False]


@pytest.mark.parametrize("scalar", [".nan", ".NaN", ".inf", "-.inf", "+.Inf", "1e400",
                                    "!!float nan"])
def test_nan_and_infinity_refused(scalar: str) -> None:
    issues = refused(f"planrun: 1\nvalue: {scalar}\n")
    assert [i.code for i in issues] == ["syntax"]
    assert (issues[0].line, issues[0].column) == (2, 8)
    assert issues[0].path == "/value"


@pytest.mark.parametrize("tagged", ["!!binary aGk=", "!!set {x}", "!foo x",
                                    "!!timestamp 2026-01-01", "!!omap [a: 1]"])
def test_tags_outside_the_json_model_refused(tagged: str) -> None:
    issues = refused(f"a:\n  b: {tagged}\n")
    assert issues[0].code == "syntax"
    assert issues[0].line == 2


def test_yaml_syntax_error_has_line_and_column() -> None:
    issues = refused("a: 1\nb: [1, 2\nc: 3\n")
    assert issues[0].code == "syntax"
    assert issues[0].line is not None
    assert issues[0].line >= 2
    assert issues[0].column is not None


def test_more_than_one_document_is_a_syntax_error() -> None:
    assert refused("a: 1\n---\nb: 2\n")[0].code == "syntax"


def test_empty_yaml_is_null() -> None:
    assert data_of("") is None
    assert data_of("# only a comment\n") is None


def test_yaml_merge_key_is_an_ordinary_key_in_yaml_1_2() -> None:
    # YAML 1.2 has no merge keys: "<<" is just text and nothing is merged.
    assert data_of("base: &b {x: 1}\nc:\n  <<: *b\n") == {"base": {"x": 1}, "c": {"<<": {"x": 1}}}


_BMP_TEXT = st.text(st.characters(max_codepoint=0xFFFF, exclude_categories=("Cs",)))


@given(st.recursive(
    st.none() | st.booleans() | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False) | _BMP_TEXT,
    # keys stay short: YAML limits implicit keys to 1024 characters (6 per \\uXXXX escape)
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(
        st.text(st.characters(max_codepoint=0xFFFF, exclude_categories=("Cs",)), max_size=20),
        kids, max_size=4),
    max_leaves=20,
))
def test_json_text_read_as_yaml_gives_the_same_data(value: Any) -> None:
    # YAML 1.2 is a superset of JSON: the core schema must type every JSON scalar as JSON does.
    text = json.dumps(value)
    assert data_of(text, "yaml") == value
    assert data_of(text, "json") == value


# --- keys ---------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "line", "column"), [
    ("a: 1\nb: 2\na: 3\n", 3, 1),
    ("steps:\n  - id: x\n    arguments: {name: a}\n    arguments: {name: b}\n", 4, 5),
    ("top:\n  inner:\n    k: 1\n    j: 2\n    k: 3\n", 5, 5),
    ("{a: 1, b: 2, a: 3}", 1, 14),
])
def test_duplicate_yaml_key_points_at_the_later_key(text: str, line: int, column: int) -> None:
    issues = refused(text)
    assert [i.code for i in issues] == ["duplicate_key"]
    assert (issues[0].line, issues[0].column) == (line, column)
    assert issues[0].file == "f.yaml"


def test_every_duplicate_key_is_reported() -> None:
    issues = refused("a: 1\na: 2\nb: {c: 1, c: 2}\n")
    assert [(i.code, i.path, i.line) for i in issues] == [
        ("duplicate_key", "/a", 2), ("duplicate_key", "/b/c", 3)]


@pytest.mark.parametrize(("text", "line", "column"), [
    ('{"a": 1, "a": 2}', 1, 10),
    ('{\n  "steps": [\n    {"id": "a", "arguments": {"name": "x", "name": "y"}}\n  ]\n}', 3, 44),
    ('{\n\t"a": 1,\n\t"a": 2\n}', 3, 2),
])
def test_duplicate_json_key_points_at_the_later_key(text: str, line: int, column: int) -> None:
    issues = refused(text, "json")
    assert [i.code for i in issues] == ["duplicate_key"]
    assert (issues[0].line, issues[0].column) == (line, column)


def test_duplicate_json_key_located_when_text_has_escaped_emoji() -> None:
    text = json.dumps({"goal": "ship \U0001F680"})[:-1] + ', "goal": "again"}'
    issues = refused(text, "json")
    assert [i.code for i in issues] == ["duplicate_key"]
    assert issues[0].line == 1
    assert issues[0].column is not None


@pytest.mark.parametrize("text", ["1: x\n", "true: x\n", "null: x\n", "~: x\n", "1.5: x\n",
                                  "? [a, b]\n: x\n", "? {a: 1}\n: x\n", "a:\n  2: x\n"])
def test_non_text_keys_refused(text: str) -> None:
    issues = refused(text)
    assert [i.code for i in issues] == ["syntax"]
    assert issues[0].line is not None
    assert issues[0].column is not None


def test_quoted_and_yaml_1_1_keys_are_text() -> None:
    assert data_of('"1": a\n"true": b\non: c\nno: d\n') == {"1": "a", "true": "b", "on": "c",
                                                            "no": "d"}


# --- aliases ---------------------------------------------------------------------------

BOMB = """\
planrun: 1
goal: Billion laughs
steps:
  - id: a
    tool: echo
    arguments:
      value:
        - &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
        - &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
        - &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
        - &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
        - &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
        - &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
        - &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
        - &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
        - &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


@pytest.mark.usefixtures("alarm")
def test_alias_bomb_refused_as_too_large_without_expanding_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*_args: Any) -> Any:
        raise AssertionError("the document was constructed (expanded) before being refused")

    monkeypatch.setattr(yamltext, "_construct", never)
    issues = refused(BOMB)
    assert [i.code for i in issues] == ["too_large"]
    assert issues[0].line == 1


@pytest.mark.usefixtures("alarm")
def test_alias_bomb_in_a_file_refused(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB, encoding="utf-8")
    with pytest.raises(DocumentError) as info:
        load_file(path)
    assert [i.code for i in info.value.issues] == ["too_large"]
    assert info.value.issues[0].file == str(path)


def _aliased(copies: int, width: int = 1000) -> str:
    return ("a: &a [" + ",".join(["1"] * width) + "]\n"
            "b: [" + ",".join(["*a"] * copies) + "]\n")


def test_alias_bound_is_on_the_expanded_size() -> None:
    # Each alias of a 1000-item list adds 1001 nodes; the bound is 100,000 added nodes.
    assert loading.MAX_ALIAS_EXPANSION == 100_000
    assert len(data_of(_aliased(99))["b"]) == 99
    assert [i.code for i in refused(_aliased(101))] == ["too_large"]


def _long_aliased(copies: int) -> str:
    """A 1 MiB string anchored once and aliased ``copies`` times: few nodes, much text."""
    return "a: &a '" + "y" * (1 << 20) + "'\nb: [" + ",".join(["*a"] * copies) + "]\n"


@pytest.mark.usefixtures("alarm")
def test_aliases_of_a_long_value_are_bounded_in_characters(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a review: 3,000 aliases of a 1 MB string (a 1 MB plan, 3,001 nodes) made
    3 GB of strings and 6 GB of memory in ``validate``; 30,000 would have taken the
    machine. The bound on nodes never saw it; one on characters does (64 Mi added)."""
    assert loading.MAX_ALIAS_CHARS == 64 * 1024 * 1024
    # each alias adds the string's 1,048,576 characters and one for its node
    assert len(data_of(_long_aliased(63))["b"]) == 63
    monkeypatch.setattr(yamltext, "_construct", lambda *_a: pytest.fail("expanded"))
    issues = refused(_long_aliased(64))
    assert [i.code for i in issues] == ["too_large"]
    assert "characters" in issues[0].message
    assert [i.code for i in refused(_long_aliased(3000))] == ["too_large"]


def test_small_aliases_are_accepted_and_expanded() -> None:
    text = """\
defaults: &defaults {retries: {max_attempts: 3}, timeout: 60}
names: &names [a, b]
steps:
  - id: one
    settings: *defaults
    for_each: *names
  - id: two
    settings: *defaults
"""
    data = data_of(text)
    assert data["steps"][0]["settings"] == {"retries": {"max_attempts": 3}, "timeout": 60}
    assert data["steps"][1]["settings"] == data["defaults"]
    assert data["steps"][0]["for_each"] == ["a", "b"]
    # expanded copies are independent values, not shared objects
    assert data["steps"][0]["settings"] is not data["steps"][1]["settings"]


@pytest.mark.parametrize("text", ["a: &x [1, *x]\n", "a: &x {k: *x}\n"])
def test_recursive_alias_refused(text: str) -> None:
    assert refused(text)[0].code == "syntax"


# --- size, encoding, nesting -------------------------------------------------------------


def test_file_over_the_size_bound_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    monkeypatch.setattr(loading, "MAX_FILE_BYTES", 100)
    ok = tmp_path / "ok.yaml"
    ok.write_text("a: '" + "x" * 94 + "'\n", encoding="utf-8")  # exactly 100 bytes
    assert ok.stat().st_size == 100
    assert load_file(ok).data == {"a": "x" * 94}
    big = tmp_path / "big.yaml"
    big.write_text("a: '" + "x" * 95 + "'\n", encoding="utf-8")
    with pytest.raises(DocumentError) as info:
        load_file(big)
    assert [i.code for i in info.value.issues] == ["too_large"]
    assert info.value.issues[0].file == str(big)


def test_text_over_the_size_bound_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loading, "MAX_FILE_BYTES", 10)
    assert refused("a: 'é1234567'\n")[0].code == "too_large"  # 14 bytes, 13 characters
    assert refused('{"a": 123456}', "json")[0].code == "too_large"
    assert data_of("a: 1234") == {"a": 1234}


def test_size_bound_is_64_mib() -> None:
    assert loading.MAX_FILE_BYTES == 64 * 1024 * 1024


@pytest.mark.parametrize("raw", [b"a: \xff\xfe\n", "a: caf\u00e9\n".encode("latin-1"),
                                 "a: 1\n".encode("utf-16")])
def test_non_utf8_file_refused(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "p.yaml"
    path.write_bytes(raw)
    with pytest.raises(DocumentError) as info:
        load_file(path, display="plans/p.yaml")
    issue = info.value.issues[0]
    assert issue.code == "syntax"
    assert "UTF-8" in issue.message
    assert issue.file == "plans/p.yaml"


def test_utf8_bom_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_bytes(b"\xef\xbb\xbf" + b'{"a": "caf\xc3\xa9"}')
    doc = load_file(path)
    assert doc.data == {"a": "café"}
    assert doc.kind == "json"


def test_unreadable_file_is_a_syntax_issue(tmp_path: Path) -> None:
    with pytest.raises(DocumentError) as info:
        load_file(tmp_path / "missing.yaml")
    assert info.value.issues[0].code == "syntax"


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_nesting_at_the_bound_accepted() -> None:
    # MAX_DEPTH levels below the root are accepted.
    value = data_of("a: " + _nested(MAX_DEPTH))
    for _ in range(MAX_DEPTH):
        value = value["a"] if isinstance(value, dict) else value[0]
    assert value == []


@pytest.mark.parametrize("depth", [MAX_DEPTH + 5, 900, 5_000, 200_000])
def test_deep_yaml_nesting_refused_without_crash(depth: int) -> None:
    issues = refused("a: " + _nested(depth))
    assert issues[0].code in {"too_large", "syntax"}


def test_deep_yaml_nesting_just_past_the_bound_is_too_large() -> None:
    issues = refused(_nested(MAX_DEPTH + 2))
    assert [i.code for i in issues] == ["too_large"]
    assert issues[0].line == 1


@pytest.mark.parametrize("depth", [5_000, 200_000])
def test_deep_json_nesting_refused_without_crash(depth: int) -> None:
    assert refused(_nested(depth), "json")[0].code == "too_large"


def test_json_nesting_past_the_bound_is_too_large() -> None:
    assert refused('{"a": ' + _nested(MAX_DEPTH + 50) + "}", "json")[0].code == "too_large"


def test_json_infinite_number_refused() -> None:
    issues = refused('{"planrun": 1, "value": 1e400}', "json")
    assert issues[0].code == "syntax"


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_json_nan_constants_refused(constant: str) -> None:
    assert refused(f'{{"a": {constant}}}', "json")[0].code == "syntax"


def test_json_nan_refusal_has_line_and_column() -> None:
    issue = refused('{"a": 1,\n "b": NaN}', "json")[0]
    assert (issue.line, issue.column) == (2, 7)


def test_json_syntax_error_has_line_and_column() -> None:
    issue = refused('{"a": 1,\n "b": }', "json")[0]
    assert issue.code == "syntax"
    assert (issue.line, issue.column) == (2, 7)


# --- locate ----------------------------------------------------------------------------

YAML_DOC = """\
planrun: 1
goal: "g"
steps:
  - id: a
    arguments:
      x: 1
      "a/b": 2
      "t~n": [10, 20]
  - {id: b, arguments: {y: [1, {z: 3}]}}
"""


@pytest.mark.parametrize(("ptr", "value_at", "key_at"), [
    ("", (1, 1), (1, 1)),
    ("/planrun", (1, 10), (1, 1)),
    ("/goal", (2, 7), (2, 1)),
    ("/steps", (4, 3), (3, 1)),
    ("/steps/0", (4, 5), (4, 5)),
    ("/steps/0/id", (4, 9), (4, 5)),
    ("/steps/0/arguments/x", (6, 10), (6, 7)),
    ("/steps/0/arguments/a~1b", (7, 14), (7, 7)),
    ("/steps/0/arguments/t~0n/1", (8, 19), (8, 19)),
    ("/steps/1/arguments/y/1/z", (9, 36), (9, 33)),
    # missing tokens: the closest enclosing node
    ("/steps/1/arguments/missing", (9, 24), (9, 24)),
    ("/steps/9", (4, 3), (4, 3)),
    ("/steps/0/arguments/x/deeper", (6, 10), (6, 10)),
])
def test_locate_yaml(ptr: str, value_at: tuple[int, int], key_at: tuple[int, int]) -> None:
    doc = parse_text(YAML_DOC, kind="yaml")
    assert doc.locate(ptr) == value_at
    assert doc.locate_key(ptr) == key_at


JSON_DOC = ('{"planrun":1,"goal":"g",\n'
            ' "steps":[{"id":"a","arguments":{"x":1, "a/b": 2}},\n'
            '\t{"id": "b", "arguments": {"y": [1, {"z": 3}]}}]}')


@pytest.mark.parametrize(("ptr", "value_at", "key_at"), [
    ("", (1, 1), (1, 1)),
    ("/planrun", (1, 12), (1, 2)),
    ("/goal", (1, 21), (1, 14)),
    ("/steps/0/arguments/x", (2, 38), (2, 34)),
    ("/steps/0/arguments/a~1b", (2, 48), (2, 41)),
    ("/steps/1/arguments/y/1/z", (3, 43), (3, 38)),
    ("/steps/1/id", (3, 9), (3, 3)),
])
def test_locate_json(ptr: str, value_at: tuple[int, int], key_at: tuple[int, int]) -> None:
    doc = parse_text(JSON_DOC, kind="json")
    assert doc.locate(ptr) == value_at
    assert doc.locate_key(ptr) == key_at


def test_locate_pretty_printed_json_agrees_with_the_text() -> None:
    data = {"planrun": 1, "goal": "g", "steps": [
        {"id": "a", "tool": "echo", "arguments": {"value": [1, 2, {"deep": True}]}}]}
    text = json.dumps(data, indent=2)
    doc = parse_text(text, kind="json")
    lines = text.splitlines()
    for ptr, needle in [("/steps/0/tool", '"echo"'), ("/steps/0/arguments/value/2/deep", "true"),
                        ("/goal", '"g"')]:
        line, column = doc.locate(ptr)
        assert line is not None
        assert column is not None
        assert lines[line - 1][column - 1:].startswith(needle), (ptr, line, column)


@pytest.mark.parametrize("first", [{"goal": "ship \U0001F680"}, {"k" * 1100: 1}])
def test_locate_json_that_yaml_cannot_compose(first: dict[str, Any]) -> None:
    text = json.dumps({**first, "steps": []}, indent=2)
    doc = parse_text(text, kind="json")
    assert doc.locate("/steps") == (3, 12)


def test_locate_null_pointer_and_empty_document() -> None:
    doc = parse_text("a: 1\n", kind="yaml")
    assert doc.locate(None) == (None, None)
    empty = parse_text("", kind="yaml")
    assert empty.locate("/a") == (None, None)


def test_document_keeps_text_and_kind() -> None:
    doc = parse_text("a: 1\n", kind="yaml", file="x.yaml")
    assert isinstance(doc, Document)
    assert (doc.file, doc.text, doc.kind) == ("x.yaml", "a: 1\n", "yaml")


# --- pointers and files -------------------------------------------------------------------


@given(st.lists(st.text(max_size=6) | st.integers(min_value=0, max_value=99), max_size=6))
def test_pointer_round_trip(tokens: list[str | int]) -> None:
    ptr = pointer(*tokens)
    assert split_pointer(ptr) == [str(t) for t in tokens]
    assert ptr == "".join("/" + pointer_escape(str(t)) for t in tokens)


def test_pointer_escaping_follows_rfc_6901() -> None:
    assert pointer("a/b", "m~n", 0) == "/a~1b/m~0n/0"
    assert split_pointer("/a~1b/m~0n/~01") == ["a/b", "m~n", "~1"]
    assert split_pointer("") == []


@pytest.mark.parametrize(("name", "kind"), [("p.json", "json"), ("p.JSON", "json"),
                                            ("p.yaml", "yaml"), ("p.yml", "yaml"),
                                            ("p", "yaml")])
def test_kind_of(name: str, kind: str) -> None:
    assert kind_of(Path(name)) == kind


def test_json_floats_and_ints_keep_their_type() -> None:
    data = data_of('{"i": 2, "f": 2.0, "e": 1e2, "b": true, "n": null}', "json")
    assert data == {"i": 2, "f": 2.0, "e": 100.0, "b": True, "n": None}
    assert [type(data[k]) for k in "ifebn"] == [int, float, float, bool, type(None)]
    assert not math.isnan(data["e"])
