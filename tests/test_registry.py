"""planrun.registry: tools.yaml checks (code ``registry``) and the strict validator."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import Project, dedent
from planrun.issues import Issue
from planrun.registry import (
    ToolRegistry,
    load_registry,
    schema_problems,
    strict_validator,
)

MODULE = '''
from pydantic import BaseModel


def run(**kwargs):
    return kwargs


async def arun(**kwargs):
    return kwargs


NOT_CALLABLE = 5


class Model(BaseModel):
    count: int
    name: str = "x"
'''

OBJ = "{type: object}"
X_REQUIRED = "{type: object, properties: {x: {type: string}}, required: [x]}"


def load(project: Project, tools: str) -> tuple[ToolRegistry, list[Issue]]:
    project.write_module("regtools", MODULE)
    project.write("tools.yaml", "tools:\n" + textwrap.indent(dedent(tools), "  "))
    return project.registry()


def single(project: Project, tools: str) -> tuple[ToolRegistry, Issue]:
    registry, issues = load(project, tools)
    assert len(issues) == 1, issues
    issue = issues[0]
    assert issue.code == "registry"
    assert issue.severity == "error"
    assert issue.file == "project/tools.yaml"  # relative to the current folder
    assert issue.line is not None
    assert issue.column is not None
    return registry, issue


# --- a valid registry ----------------------------------------------------------------------


def test_basic_registry_loads(basic_project: Project) -> None:
    registry = basic_project.good_registry()
    assert sorted(registry) == ["archive_dir", "delete_all", "echo", "lister"]
    assert "echo" in registry
    assert "nope" not in registry
    echo, archive = registry["echo"], registry["archive_dir"]
    assert (echo.kind, archive.kind) == ("python", "command")
    assert archive.output_mode == "text"
    assert callable(echo.func)
    assert echo.func(value=1) == {"value": 1}
    assert echo.contract["required"] == ["value"]
    assert registry["delete_all"].entry.irreversible is True
    assert registry["lister"].output_validator is not None
    assert echo.output_validator is None
    assert echo.folder == basic_project.root.resolve()


def test_missing_registry_file_is_an_empty_registry(project: Project) -> None:
    registry, issues = project.registry()
    assert (list(registry), issues) == ([], [])


def test_suggest_closest_tool(basic_project: Project) -> None:
    registry = basic_project.good_registry()
    assert registry.suggest("ecko") == "echo"
    assert registry.suggest("archive") == "archive_dir"
    assert registry.suggest("zzzzzz") is None


def test_python_tool_with_accepts_model(project: Project) -> None:
    registry, issues = load(project, """\
      counted:
        python: regtools:run
        accepts: regtools:Model
      asynchronous:
        python: regtools:arun
        arguments: {type: object}
    """)
    assert issues == []
    spec = registry["counted"]
    assert spec.model is not None
    assert spec.model.__name__ == "Model"
    assert spec.contract["properties"]["count"]["type"] == "integer"
    assert spec.contract["required"] == ["count"]
    assert "asynchronous" in registry


def test_command_placeholder_in_its_own_argv_element_is_fine(project: Project) -> None:
    registry, issues = load(project, f"""\
      safe_shell:
        command: [sh, -c, 'cp -- "$1" "$2"', sh, "{{src}}", "--dest={{dst}}"]
        arguments: {{type: object, properties: {{src: {{type: string}}, dst: {{type: integer}}}},
                    required: [src, dst]}}
      escaped:
        command: [sh, -c, "echo {{{{x}}}}; awk '{{print $1}}'"]
        arguments: {OBJ}
    """)
    assert issues == []
    assert sorted(registry) == ["escaped", "safe_shell"]


# --- registry issues -------------------------------------------------------------------


def test_no_contract(project: Project) -> None:
    registry, issue = single(project, """\
      bare:
        command: [echo, hi]
    """)
    assert "no contract" in issue.message
    assert (issue.path, issue.line, issue.column) == ("/tools/bare", 3, 5)
    assert "bare" not in registry


def test_unknown_field_points_at_the_key(project: Project) -> None:
    registry, issue = single(project, f"""\
      colourful:
        command: [echo]
        arguments: {OBJ}
        colour: red
    """)
    assert "unknown field 'colour'" in issue.message
    assert (issue.path, issue.line, issue.column) == ("/tools/colourful/colour", 5, 5)
    assert "colourful" not in registry


def test_unknown_top_level_field(project: Project) -> None:
    project.write("tools.yaml", f"""\
        version: 2
        tools:
          ok: {{command: [echo], arguments: {OBJ}}}
    """)
    registry, issues = project.registry()
    assert [(i.code, i.path, i.line, i.column) for i in issues] == [
        ("registry", "/version", 1, 1)]
    assert "ok" in registry


@pytest.mark.parametrize("entry", [
    "{command: [echo], python: 'regtools:run', arguments: {type: object}}",
    "{arguments: {type: object}}",
])
def test_exactly_one_of_command_and_python(project: Project, entry: str) -> None:
    registry, issue = single(project, f"  both: {entry}\n")
    assert "exactly one of 'command'" in issue.message
    assert issue.path == "/tools/both"
    assert "both" not in registry


@pytest.mark.parametrize(("target", "module", "fragment"), [
    ("regtools:missing", None, "AttributeError"),
    ("nosuchmodule_planrun:run", None, "ModuleNotFoundError"),
    ("broken_at_import:run", "raise RuntimeError('boom at import')\n", "boom at import"),
    ("broken_syntax:run", "def run(:\n", "SyntaxError"),
])
def test_unimportable_callable(project: Project, target: str, module: str | None,
                               fragment: str) -> None:
    if module is not None:
        project.write_module(target.partition(":")[0], module)
    registry, issue = single(project, f"""\
      tool:
        python: {target}
        arguments: {OBJ}
    """)
    assert fragment in issue.message
    assert (issue.path, issue.line, issue.column) == ("/tools/tool/python", 3, 13)
    assert "tool" not in registry


def test_not_callable(project: Project) -> None:
    entry = f"{{python: 'regtools:NOT_CALLABLE', arguments: {OBJ}}}"
    _registry, issue = single(project, f"  t: {entry}\n")
    assert "not callable" in issue.message


@pytest.mark.parametrize(("contract", "where"), [
    ("{type: strin}", "/tools/t/arguments/type"),
    ("{type: object, properties: {a: 5}}", "/tools/t/arguments/properties/a"),
    ("{type: object, required: a}", "/tools/t/arguments/required"),
    ("{type: object, minProperties: -1}", "/tools/t/arguments/minProperties"),
    ("[type, object]", "/tools/t/arguments"),
])
def test_malformed_schema(project: Project, contract: str, where: str) -> None:
    registry, issue = single(project, f"  t: {{command: [echo], arguments: {contract}}}\n")
    assert issue.path == where
    assert "t" not in registry


def test_malformed_output_schema(project: Project) -> None:
    _registry, issue = single(
        project, f"  t: {{command: [echo], arguments: {OBJ}, output_schema: {{type: 3}}}}\n")
    assert issue.path.startswith("/tools/t/output_schema")
    assert "output_schema" in issue.message


def test_unresolvable_ref_is_a_malformed_schema(project: Project) -> None:
    _registry, issue = single(project, """\
      t:
        command: [echo]
        arguments: {type: object, properties: {a: {$ref: "#/$defs/missing"}}}
    """)
    assert issue.path.startswith("/tools/t/arguments")


@pytest.mark.parametrize("argv", [
    '[sh, -c, "echo {x}"]',
    '[/bin/sh, -c, "{x}"]',
    '[bash, -lc, "echo {x} > out"]',
    '[bash, -o, pipefail, -c, "echo {x}"]',
    '[zsh, --login, -c, "echo {x}"]',
    '[/usr/bin/env, -i, A=1, bash, -c, "echo {x}"]',
    '[busybox, sh, -c, "echo {x}"]',
    '[python3, -c, "print({x})"]',
    '[python3.12, -c, "print(\'{x}\')"]',
    '[perl, -e, "print {x}"]',
    '[node, -e, "console.log({x})"]',
])
def test_placeholder_inside_shell_script_text(project: Project, argv: str) -> None:
    registry, issue = single(project, f"  t: {{command: {argv}, arguments: {X_REQUIRED}}}\n")
    assert "inside shell script text" in issue.message
    assert issue.path is not None
    assert issue.path.startswith("/tools/t/command/")
    assert "t" not in registry


@pytest.mark.parametrize("argv", ['[bash, -e, -c, "echo {x}"]', '[sh, -eu, -c, "rm -rf {x}"]'])
def test_placeholder_inside_script_after_errexit_flag(project: Project, argv: str) -> None:
    _registry, issue = single(project, f"  t: {{command: {argv}, arguments: {X_REQUIRED}}}\n")
    assert "inside shell script text" in issue.message


@pytest.mark.parametrize(("arguments", "fragment"), [
    ("{type: object, properties: {y: {type: string}}, required: [y]}",
     "not a declared argument"),
    ("{type: object}", "not a declared argument"),
    ("{type: object, properties: {x: {type: string}}}", "must be a required argument"),
    ("{type: object, properties: {x: {type: array}}, required: [x]}", "only a scalar"),
    ("{type: object, properties: {x: {type: object}}, required: [x]}", "only a scalar"),
    ("{type: object, properties: {x: {type: [string, array]}}, required: [x]}", "only a scalar"),
])
def test_argv_placeholder_must_name_a_required_scalar(project: Project, arguments: str,
                                                      fragment: str) -> None:
    registry, issue = single(project, f"""\
      t:
        command: [echo, "--name={{x}}"]
        arguments: {arguments}
    """)
    assert fragment in issue.message
    assert (issue.path, issue.line, issue.column) == ("/tools/t/command/1", 3, 21)
    assert "t" not in registry


@pytest.mark.parametrize(("entry", "fragment"), [
    (f"{{python: 'regtools:run', arguments: {OBJ}, accepts: 'regtools:Model'}}", "not both"),
    ("{command: [echo], accepts: 'regtools:Model'}", "for python tools"),
    ("{python: 'regtools:run', accepts: 'regtools:run'}", "not a pydantic BaseModel"),
    ("{python: 'regtools:run', accepts: 'regtools:Nope'}", "AttributeError"),
    (f"{{python: 'regtools:run', arguments: {OBJ}, output: json}}", "command tools only"),
    (f"{{python: 'regtools:run', arguments: {OBJ}, cwd: sub}}", "command tools only"),
    (f"{{command: [echo], arguments: {OBJ}, key_arguments: [zz]}}", "key argument 'zz'"),
    (f"{{command: [echo], arguments: {OBJ}, output: yaml}}", "output"),
    (f"{{command: [echo], arguments: {OBJ}, timeout: 0}}", "timeout"),
    (f"{{command: [echo], arguments: {OBJ}, irreversible: 'yes'}}", "irreversible"),
    (f"{{command: [], arguments: {OBJ}}}", "command"),
    ("{python: 'no colon', arguments: {type: object}}", "python"),
    ("5", "must be a mapping"),
])
def test_other_entry_problems(project: Project, entry: str, fragment: str) -> None:
    registry, issue = single(project, f"  t: {entry}\n")
    assert fragment in issue.message
    assert "t" not in registry


def test_bad_tool_name(project: Project) -> None:
    _registry, issue = single(project, f'  "bad name!": {{command: [echo], arguments: {OBJ}}}\n')
    assert "must match" in issue.message
    assert (issue.line, issue.column) == (2, 3)


def test_unknown_pool_needs_declared_pools(project: Project) -> None:
    project.write_config("[pools]\ndb = 1\n")
    _registry, issue = single(project, f"""\
      a: {{command: [echo], arguments: {OBJ}, pool: db}}
      b: {{command: [echo], arguments: {OBJ}, pool: web}}
    """)
    assert "pool 'web'" in issue.message
    assert issue.path == "/tools/b/pool"


@pytest.mark.parametrize(("text", "code"), [
    ("tools:\n  a: [1, 2\n", "syntax"),
    ("tools:\n  a: {command: [echo], arguments: {}}\n  a: {command: [ls], arguments: {}}\n",
     "duplicate_key"),
])
def test_unreadable_registry_is_a_registry_issue(project: Project, text: str, code: str
                                                 ) -> None:
    project.write("tools.yaml", text)
    registry, issues = project.registry()
    assert [i.code for i in issues] == ["registry"]
    assert issues[0].message.startswith(code)
    assert issues[0].line is not None
    assert list(registry) == []


@pytest.mark.parametrize("text", ["[]\n", "tools: [a]\n", "tools:\n", "other: {}\n"])
def test_registry_shape(project: Project, text: str) -> None:
    project.write("tools.yaml", text)
    _registry, issues = project.registry()
    assert [i.code for i in issues] == ["registry"]
    assert "'tools' mapping" in issues[0].message


def test_every_problem_is_reported_at_once(project: Project) -> None:
    registry, issues = load(project, f"""\
      a: {{command: [echo]}}
      b: {{command: [echo], arguments: {OBJ}, colour: red}}
      c: {{command: [echo], python: 'regtools:run', arguments: {OBJ}}}
      d: {{python: 'regtools:missing', arguments: {OBJ}}}
      e: {{command: [echo], arguments: {{type: strin}}}}
      f: {{command: [sh, -c, 'echo {{x}}'], arguments: {X_REQUIRED}}}
      g: {{command: [echo, '{{y}}'], arguments: {X_REQUIRED}}}
      ok: {{command: [echo], arguments: {OBJ}}}
    """)
    assert [i.path.split("/")[2] for i in issues if i.path] == list("abcdefg")
    assert {i.code for i in issues} == {"registry"}
    assert [i.line for i in issues] == [2, 3, 4, 5, 6, 7, 8]
    assert list(registry) == ["ok"]


def test_registry_folder_is_importable(project: Project) -> None:
    load(project, f"  t: {{python: 'regtools:run', arguments: {OBJ}}}\n")
    assert str(project.root.resolve()) in sys.path


# --- the strict validator -------------------------------------------------------------


@pytest.mark.parametrize(("schema", "good", "bad"), [
    ({"type": "integer"}, [0, -3, 2**70], [60.0, 1.0, True, False, "2", None, 1.5]),
    ({"type": "number"}, [0, 1.5, -2, 2**70, 60.0], [True, False, "1.5", "2", None]),
    ({"type": "boolean"}, [True, False], [0, 1, "true", None]),
    ({"type": "string"}, ["", "2"], [2, 2.0, True, None]),
    ({"type": "array", "items": {"type": "integer"}}, [[], [1, 2]], [[1.0], [True], "[]"]),
    ({"type": ["integer", "null"]}, [None, 3], [3.0, False]),
    ({"type": "string", "format": "date"}, ["2026-08-06"], ["2026-13-01", "06/08/2026"]),
    ({"enum": [1, "a"]}, [1, "a"], [True, "b"]),
])
def test_strict_validator(schema: dict[str, Any], good: list[Any], bad: list[Any]) -> None:
    validator = strict_validator(schema)
    for value in good:
        assert validator.is_valid(value), value
    for value in bad:
        assert not validator.is_valid(value), value


@given(st.booleans())
def test_booleans_are_never_numbers(value: bool) -> None:
    assert not strict_validator({"type": "integer"}).is_valid(value)
    assert not strict_validator({"type": "number"}).is_valid(value)


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_floats_are_never_integers(value: float) -> None:
    assert not strict_validator({"type": "integer"}).is_valid(value)
    assert strict_validator({"type": "number"}).is_valid(value)


@given(st.integers())
def test_integers_are_integers_and_numbers(value: int) -> None:
    assert strict_validator({"type": "integer"}).is_valid(value)
    assert strict_validator({"type": "number"}).is_valid(value)


@given(st.text())
def test_strings_are_never_numbers(value: str) -> None:
    assert not strict_validator({"type": "number"}).is_valid(value)


def test_strict_validator_reports_every_violation_with_its_path() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"},
                                               "b": {"type": "array",
                                                     "items": {"type": "string"}}}}
    errors = sorted(strict_validator(schema).iter_errors({"a": 1.0, "b": ["x", 2]}),
                    key=lambda e: list(e.absolute_path))
    assert [list(e.absolute_path) for e in errors] == [["a"], ["b", 1]]


@pytest.mark.parametrize(("schema", "problems"), [
    ({"type": "object"}, 0), (True, 0), (False, 0), ({}, 0),
    ({"type": "strin"}, 1), ({"properties": {"a": 1}}, 1), ("string", 1), (5, 1), (None, 1),
])
def test_schema_problems(schema: Any, problems: int) -> None:
    assert len(schema_problems(schema)) == problems


def test_registry_file_shown_relative_to_the_current_folder(project: Project) -> None:
    project.write("tools.yaml", "tools: {a: {command: [echo]}}\n")
    _registry, issues = load_registry(Path(project.root / "tools.yaml"))
    assert issues[0].file == "project/tools.yaml"
    os.chdir("/")
    _registry, issues = load_registry(Path(project.root / "tools.yaml"))
    assert issues[0].file == str(project.root / "tools.yaml").lstrip("/")
