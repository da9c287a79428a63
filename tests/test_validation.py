"""planrun.validation: every static check of SPEC §4, in one report, located in the file.

Also a hypothesis fuzz test: random documents and random mutations of a valid plan never
raise and always give a report whose codes are all in ``ISSUE_CODES``.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import Project, check_document, codes, dedent, one, only
from planrun import api
from planrun.canonical import digest
from planrun.errors import Refused
from planrun.issues import ISSUE_CODES, Issue, PlanReport
from planrun.loading import DocumentError, parse_text
from planrun.params import UNKNOWN, ItemRef, Template
from planrun.validation import ParamInput, argument_problems


def text_at(text: str, issue: Issue) -> str:
    """The plan text from the issue's line and column to the end of that line."""
    assert issue.line is not None, issue
    assert issue.column is not None, issue
    return dedent(text).splitlines()[issue.line - 1][issue.column - 1:]


def check(project: Project, text: str, **kwargs: Any) -> tuple[PlanReport, Any]:
    return project.check(text, **kwargs)


GOOD = """\
planrun: 1
name: nightly
revision: 3
goal: Back up and list
params:
  source: {type: string}
  keep: {type: integer, minimum: 1, default: 7}
  date: {type: string, format: date, default: "2026-08-06"}
steps:
  - id: archive
    tool: archive_dir
    arguments: {source: "{params.source}", dest: "/backup/data-{params.date}.tgz"}
    intent: Snapshot the data directory
  - id: list
    tool: lister
    depends_on: [archive]
    arguments: {n: "{params.keep}"}
  - id: each
    tool: echo
    depends_on: [list]
    for_each: "{steps.list.output.files}"
    max_parallel: 2
    when: "params.keep > 1 && size(steps.list.output.files) > 0"
    arguments: {value: "{item}", count: "{index}", name: "file-{index}: {item}"}
  - id: wipe
    tool: delete_all
    depends_on: [each]
    arguments: {path: "{steps.list.output.files.0}"}
"""


# --- a valid plan ---------------------------------------------------------------------


def test_valid_plan_without_values(basic_project: Project) -> None:
    report, plan = check(basic_project, GOOD)
    assert report.issues == []
    assert report.ok
    assert plan is not None
    assert plan.params["source"] is UNKNOWN  # no value given: checks needing it are skipped
    assert plan.params["keep"] == 7


def test_valid_plan_with_values(basic_project: Project) -> None:
    given = ParamInput(cli={"source": "/srv/data", "keep": "3"})
    report, plan = check(basic_project, GOOD, given=given)
    assert report.issues == []
    assert plan is not None
    assert (plan.name, plan.revision, plan.goal) == ("nightly", 3, "Back up and list")
    assert plan.params == {"source": "/srv/data", "keep": 3, "date": "2026-08-06"}
    assert plan.order() == ["archive", "list", "each", "wipe"]
    assert plan.digest == digest(plan.document)
    assert report.plan is not None
    assert report.plan["digest"] == plan.digest
    steps = plan.by_id
    assert steps["archive"].arguments == {"source": "/srv/data",
                                          "dest": "/backup/data-2026-08-06.tgz"}
    assert steps["list"].arguments == {"n": 3}  # exact leaf: an integer stays an integer
    assert isinstance(steps["each"].arguments["value"], Template)
    assert steps["each"].arguments["value"].exact == ItemRef()
    assert steps["each"].depends_on == ["list"]
    assert steps["wipe"].approval_reason == "irreversible"
    assert steps["archive"].approval_reason is None
    assert steps["archive"].intent == "Snapshot the data directory"


def test_policy_require_approval(basic_project: Project) -> None:
    basic_project.write_config('[policy]\nrequire_approval = ["lister"]\n')
    registry = api.load_registry(basic_project.settings())
    report, plan = check(basic_project, GOOD, registry=registry)
    assert report.issues == []
    assert plan is not None
    assert plan.by_id["list"].approval_reason == "policy"
    assert plan.by_id["wipe"].approval_reason == "irreversible"
    assert plan.by_id["archive"].approval_reason is None


POLICY = """\
[policy]
allowed_tools = ["echo", "lister", "delete_all"]
[policy.classes.danger]
tools = ["delete_all"]
level = "refuse"
"""


def test_policy_not_allowed_and_refused(basic_project: Project) -> None:
    basic_project.write_config(POLICY)
    registry = api.load_registry(basic_project.settings())
    text = """\
    planrun: 1
    goal: g
    steps:
      - {id: ok, tool: echo, arguments: {value: 1}}
      - {id: outside, tool: archive_dir, arguments: {source: a, dest: b}}
      - {id: never, tool: delete_all, arguments: {path: /}}
    """
    report, plan = check(basic_project, text, registry=registry)
    assert plan is None
    assert [(i.code, i.step, i.path) for i in report.issues] == [
        ("not_allowed", "outside", "/steps/1/tool"),
        ("refused", "never", "/steps/2/tool"),
    ]
    assert text_at(text, report.issues[0]) == "archive_dir, arguments: {source: a, dest: b}}"


def test_policy_naming_an_unregistered_tool_is_a_config_error(basic_project: Project) -> None:
    basic_project.write_config('[policy]\nallowed_tools = ["echo", "ecko"]\n')
    with pytest.raises(Refused) as info:
        api.load_registry(basic_project.settings())
    assert info.value.code == "config"
    assert codes(info.value.report) == ["config"]
    assert "'ecko'" in info.value.report.issues[0].message


def test_name_defaults_to_the_hint(basic_project: Project) -> None:
    _report, plan = check(basic_project, GOOD.replace("name: nightly\n", ""))
    assert plan is not None
    assert plan.name == "p"


# --- one report with every problem --------------------------------------------------------

MANY = """\
planrun: 1
goal: Everything wrong at once
bogus: 1
params:
  unused: {type: string}
  bad_default: {type: integer, default: "7"}
steps:
  - id: a
    tool: echo
    arguments:
      value: 1
      count: "2"
      ratio: true
      extra: 1
  - id: b
    tool: ecko
    arguments: {value: 1}
  - id: a
    tool: echo
    arguments: {value: "{foo.bar}"}
  - id: c
    tool: echo
    depends_on: [c, zz]
    arguments: {value: "{params.nope}", name: "{steps.a.output}"}
  - id: d
    tool: echo
    when: "1 +"
    arguments: {value: "{item}"}
  - id: e
    tool: echo
    depends_on: [f]
    arguments: {value: 1}
  - id: f
    tool: echo
    depends_on: [e]
    arguments: {value: 1, count: 60.0}
"""


def test_every_problem_in_one_report(basic_project: Project) -> None:
    report, plan = check(basic_project, MANY)
    assert plan is None
    assert not report.ok
    found = codes(report)
    for code in ("schema", "param_type", "duplicate_id", "dependency", "cycle", "arguments",
                 "unknown_tool", "placeholder", "param_missing", "reference", "condition",
                 "param_unused"):
        assert code in found, (code, found)
    assert len(only(report, "arguments")) == 4  # count, ratio, extra (step a), count (step f)
    assert len(only(report, "dependency")) == 2
    for issue in report.issues:
        assert issue.code in ISSUE_CODES
        assert issue.severity == "error"
        assert issue.file == "plans/p.yaml"
        assert issue.line is not None, issue
        assert issue.column is not None, issue
        assert issue.path is not None, issue
        assert issue.path.startswith("/"), issue


# --- format and shape ----------------------------------------------------------------


@pytest.mark.parametrize(("head", "path"), [
    ("goal: g\n", ""),
    ("planrun: 2\ngoal: g\n", "/planrun"),
    ("planrun: '1'\ngoal: g\n", "/planrun"),
    ("planrun: true\ngoal: g\n", "/planrun"),
    ("planrun: null\ngoal: g\n", "/planrun"),
])
def test_format_version(basic_project: Project, head: str, path: str) -> None:
    steps = "steps: [{id: a, tool: echo, arguments: {value: 1}}]\n"
    report, plan = check(basic_project, head + steps)
    issue = one(report, "format_version")
    assert codes(report) == ["format_version"]  # nothing else is checked in an unknown format
    assert issue.path == path
    assert (issue.line, issue.column) != (None, None)
    assert plan is None


@pytest.mark.parametrize("text", ["[1, 2]\n", "just text\n", "42\n", ""])
def test_not_a_mapping(basic_project: Project, text: str) -> None:
    report, _plan = check(basic_project, text)
    assert codes(report) == ["schema"]


def test_unknown_fields_and_wrong_types_are_schema(basic_project: Project) -> None:
    text = """\
    planrun: 1
    goal: [not, text]
    revision: 0
    colour: red
    steps:
      - id: a
        tool: echo
        arguments: {value: 1}
        retry: 3
      - id: 9bad
        tool: echo
        arguments: {value: 1}
      - just a string
      - id: d
        tool: echo
        arguments: [1]
    """
    report, _plan = check(basic_project, text)
    schema = only(report, "schema")
    paths = sorted(i.path or "" for i in schema)
    assert paths == ["/colour", "/goal", "/revision", "/steps/0/retry", "/steps/1/id",
                     "/steps/2", "/steps/3/arguments"]
    retry = next(i for i in schema if i.path == "/steps/0/retry")
    assert text_at(text, retry).startswith("retry:")  # an unknown key points at the key
    assert retry.step == "a"
    colour = next(i for i in schema if i.path == "/colour")
    assert text_at(text, colour).startswith("colour:")


def test_fan_out_fields_without_for_each(basic_project: Project) -> None:
    text = """\
    planrun: 1
    goal: g
    steps:
      - {id: a, tool: echo, arguments: {value: 1}, max_items: 3, on_item_error: continue}
    """
    report, _plan = check(basic_project, text)
    assert sorted(i.path or "" for i in only(report, "schema")) == [
        "/steps/0/max_items", "/steps/0/on_item_error"]


def test_undeclared_pool(basic_project: Project) -> None:
    basic_project.write_config("[pools]\ndb = 1\n")
    text = """\
    planrun: 1
    goal: g
    steps:
      - {id: a, tool: echo, arguments: {value: 1}, pool: db}
      - {id: b, tool: echo, arguments: {value: 1}, pool: dbs}
    """
    report, _plan = check(basic_project, text)
    issue = one(report, "schema")
    assert issue.path == "/steps/1/pool"
    assert "Did you mean 'db'?" in issue.message


def test_empty(basic_project: Project) -> None:
    report, plan = check(basic_project, "planrun: 1\ngoal: g\nsteps: []\n")
    issue = one(report, "empty")
    assert (issue.path, issue.line) == ("/steps", 3)
    assert plan is None


def test_too_long_is_refused_never_trimmed(basic_project: Project) -> None:
    basic_project.write_config("max_steps = 2\n")
    steps = "".join(f"  - {{id: s{i}, tool: echo, arguments: {{value: {i}}}}}\n"
                    for i in range(3))
    report, plan = check(basic_project, "planrun: 1\ngoal: g\nsteps:\n" + steps)
    issue = one(report, "too_long")
    assert "3 steps" in issue.message
    assert "max_steps (2)" in issue.message
    assert issue.line == 4
    assert plan is None
    two = steps[: steps.rindex("  - ")]
    report, plan = check(basic_project, "planrun: 1\ngoal: g\nsteps:\n" + two)
    assert report.issues == []
    assert plan is not None
    assert len(plan.steps) == 2


def test_duplicate_id(basic_project: Project) -> None:
    text = """\
    planrun: 1
    goal: g
    steps:
      - {id: a, tool: echo, arguments: {value: 1}}
      - {id: b, tool: echo, arguments: {value: 1}}
      - {id: a, tool: echo, arguments: {value: 2}}
    """
    report, _plan = check(basic_project, text)
    issue = one(report, "duplicate_id")
    assert (issue.path, issue.step) == ("/steps/2/id", "a")
    assert "steps 0 and 2" in issue.message
    assert issue.line == 6
    assert text_at(text, issue).startswith("a,")


# --- tools and arguments ------------------------------------------------------------------


def test_unknown_tool_suggests_the_closest(basic_project: Project) -> None:
    text = """\
    planrun: 1
    goal: g
    steps:
      - id: a
        tool: ecko
        arguments: {value: 1}
      - id: b
        tool: completely_different
    """
    report, _plan = check(basic_project, text)
    first, second = only(report, "unknown_tool")
    assert "'ecko'" in first.message
    assert "Did you mean 'echo'?" in first.message
    assert (first.path, first.step, first.line) == ("/steps/0/tool", "a", 5)
    assert text_at(text, first) == "ecko"
    assert "Did you mean" not in second.message


ARGS = """\
planrun: 1
goal: g
steps:
  - id: a
    tool: echo
    arguments:
      value: 1
      count: "2"
      ratio: true
      flag: 1
      items: [x, 2]
      info: []
      when: 2026-13-01
      colour: red
  - id: b
    tool: echo
    arguments:
      name: 60
  - id: c
    tool: archive_dir
    arguments: {source: /srv}
"""


def test_arguments_each_violation_with_its_pointer(basic_project: Project) -> None:
    report, plan = check(basic_project, ARGS)
    assert plan is None
    issues = {i.path: i for i in only(report, "arguments")}
    assert sorted(issues) == sorted([
        "/steps/0/arguments/count", "/steps/0/arguments/ratio", "/steps/0/arguments/flag",
        "/steps/0/arguments/items/1", "/steps/0/arguments/info", "/steps/0/arguments/when",
        "/steps/0/arguments/colour",
        "/steps/1/arguments", "/steps/1/arguments/name",
        "/steps/2/arguments",
    ])
    # a wrong value: line/column of the value
    assert text_at(ARGS, issues["/steps/0/arguments/count"]) == '"2"'
    assert text_at(ARGS, issues["/steps/0/arguments/items/1"]) == "2]"
    # an undeclared argument: its key
    assert text_at(ARGS, issues["/steps/0/arguments/colour"]) == "colour: red"
    assert "'colour' is not declared" in issues["/steps/0/arguments/colour"].message
    # a missing required argument: the arguments object
    missing = issues["/steps/2/arguments"]
    assert "'dest' is a required property" in missing.message
    assert text_at(ARGS, missing).startswith("{source:")
    assert "'value' is a required property" in issues["/steps/1/arguments"].message
    assert {i.step for i in issues.values()} == {"a", "b", "c"}


@pytest.mark.parametrize(("value", "ok"), [
    ("2", True), ("-2", True), ("2.0", False), ("60.0", False), ('"2"', False),
    ("true", False), ("null", False), ("2.5", False),
])
def test_strict_integer_argument(basic_project: Project, value: str, ok: bool) -> None:
    report, _plan = check(basic_project, f"""\
    planrun: 1
    goal: g
    steps:
      - {{id: a, tool: echo, arguments: {{value: 1, count: {value}}}}}
    """)
    assert codes(report) == ([] if ok else ["arguments"])


@pytest.mark.parametrize(("value", "ok"), [
    ("2", True), ("2.5", True), ("true", False), ("false", False), ('"2.5"', False),
])
def test_strict_number_argument(basic_project: Project, value: str, ok: bool) -> None:
    report, _plan = check(basic_project, f"""\
    planrun: 1
    goal: g
    steps:
      - {{id: a, tool: echo, arguments: {{value: 1, ratio: {value}}}}}
    """)
    assert codes(report) == ([] if ok else ["arguments"])


def test_yaml_1_1_words_are_strings_for_a_boolean_argument(basic_project: Project) -> None:
    report, _plan = check(basic_project, """\
    planrun: 1
    goal: g
    steps:
      - {id: a, tool: echo, arguments: {value: no, flag: yes, name: off}}
    """)
    issue = one(report, "arguments")
    assert issue.path == "/steps/0/arguments/flag"


def test_placeholders_and_argument_types(basic_project: Project) -> None:
    text = """\
    planrun: 1
    goal: g
    steps:
      - {id: src, tool: lister, arguments: {}}
      - id: a
        tool: echo
        depends_on: [src]
        arguments:
          value: "{steps.src.output}"
          count: "{steps.src.output.n}"
          ratio: "n={steps.src.output.n}"
          name: "{steps.src.output.n}"
    """
    report, _plan = check(basic_project, text)
    # an exact run-time placeholder is not known yet: not checked; an embedded one is text
    issue = one(report, "arguments")
    assert issue.path == "/steps/1/arguments/ratio"
    assert "placeholder inside text" in issue.message


def test_embedded_placeholder_only_type_checked(basic_project: Project) -> None:
    text = """\
    planrun: 1
    goal: g
    steps:
      - id: a
        tool: echo
        for_each: ["2026-01-01"]
        arguments: {value: 1, when: "{item}", name: "{item}x"}
    """
    report, _plan = check(basic_project, text)
    assert report.issues == []


def test_argument_problems_directly(basic_project: Project) -> None:
    tool = basic_project.good_registry()["echo"]
    problems = argument_problems(tool, {"value": 1, "count": "x", "zz": 1})
    assert sorted((p, k) for p, _m, k in problems) == [("/count", False), ("/zz", True)]
    assert argument_problems(tool, {"value": UNKNOWN, "count": UNKNOWN}) == []


# --- parameters ------------------------------------------------------------------------

PARAMS = """\
planrun: 1
goal: g
params:
  n: {type: integer}
  s: {type: string, default: x}
  flag: {type: boolean, default: false}
  items: {type: array, default: [a]}
steps:
  - id: a
    tool: echo
    arguments:
      value: "{params.items}"
      count: "{params.n}"
      name: "<params.s>"
      flag: "{params.flag}"
"""


@pytest.mark.parametrize(("given", "expected"), [
    (ParamInput(cli={"n": "3"}), []),
    (ParamInput(cli={"n": "3.0"}), ["param_type"]),
    (ParamInput(cli={"n": "three"}), ["param_type"]),
    (ParamInput(cli={"n": "3", "flag": "yes"}), ["param_type"]),
    (ParamInput(cli={"n": "3", "items": "[1, 2]"}), []),
    (ParamInput(cli={"n": "3", "items": "a,b"}), ["param_type"]),
    (ParamInput(file_values={"n": 3}), []),
    (ParamInput(file_values={"n": 60.0}), ["param_type"]),
    (ParamInput(file_values={"n": "2"}), ["param_type"]),
    (ParamInput(file_values={"n": True}), ["param_type"]),
    (ParamInput(cli={"n": "3", "zz": "1"}), ["param_unknown"]),
    (ParamInput(file_values={"n": 3, "zz": 1}), ["param_unknown"]),
    (ParamInput(cli={"s": "y"}), ["param_missing"]),
])
def test_parameter_values(basic_project: Project, given: ParamInput, expected: list[str]
                          ) -> None:
    report, plan = check(basic_project, PARAMS, given=given)
    assert codes(report) == expected
    for issue in report.issues:
        if issue.code in ("param_type", "param_unknown"):
            # a value given with -p or in a params file has no node in the plan file
            assert (issue.line, issue.column) == (None, None)
    assert (plan is None) == bool(expected)


def test_parameter_values_reach_arguments_with_their_types(basic_project: Project) -> None:
    _report, plan = check(basic_project, PARAMS,
                          given=ParamInput(cli={"n": "3", "s": "{x}", "flag": "true"}))
    assert plan is not None
    assert plan.by_id["a"].arguments == {"value": ["a"], "count": 3, "name": "{x}", "flag": True}


def test_env_values_only_for_declared_parameters(basic_project: Project) -> None:
    given = ParamInput(cli={}, env={"n": "4", "other": "x"})
    report, plan = check(basic_project, PARAMS, given=given, concrete=True)
    assert report.issues == []
    assert plan is not None
    assert plan.params["n"] == 4


def test_concrete_values_are_checked_against_arguments(basic_project: Project) -> None:
    text = """\
    planrun: 1
    goal: g
    params:
      label: {type: string}
    steps:
      - {id: a, tool: echo, arguments: {value: 1, count: "{params.label}"}}
    """
    report, _plan = check(basic_project, text)
    assert report.issues == []  # unknown value: skipped
    report, _plan = check(basic_project, text, given=ParamInput(cli={"label": "x"}))
    assert codes(report) == ["arguments"]


def test_param_declarations(basic_project: Project) -> None:
    text = """\
    planrun: 1
    goal: g
    params:
      unused: {type: string}
      bad_default: {type: integer, default: 60.0}
      bad_schema: {type: strin}
      secret_flag: {type: string, secret: "yes"}
      ok: {type: string, secret: true}
    steps:
      - id: a
        tool: echo
        arguments:
          value: "{params.bad_default}{params.bad_schema}{params.secret_flag}{params.ok}"
          name: "{params.nope}"
    """
    report, plan = check(basic_project, text)
    assert plan is None
    unused = one(report, "param_unused")
    assert unused.path == "/params/unused"
    assert text_at(text, unused).startswith("unused:")
    default = one(report, "param_type")
    assert default.path == "/params/bad_default/default"
    assert text_at(text, default).startswith("60.0")
    assert sorted(i.path or "" for i in only(report, "schema")) == [
        "/params/bad_schema/type", "/params/secret_flag/secret"]
    missing = one(report, "param_missing")
    assert missing.path == "/steps/0/arguments/name"
    assert "{params.nope}" in missing.message
    assert missing.step == "a"


def test_secret_parameters(basic_project: Project) -> None:
    text = """\
    planrun: 1
    goal: g
    params:
      token: {type: string, secret: true}
    steps:
      - {id: a, tool: echo, arguments: {value: "{params.token}"}}
    """
    report, plan = check(basic_project, text, given=ParamInput(cli={"token": "s3cr3t"}))
    assert report.issues == []
    assert plan is not None
    assert plan.secret_params == {"token"}


def test_required_parameter_without_value_at_execute_time(basic_project: Project) -> None:
    report, _plan = check(basic_project, PARAMS, concrete=True)
    issue = one(report, "param_missing")
    assert issue.path == "/params/n"
    assert "-p n=VALUE" in issue.message


def test_embedded_object_parameter_is_param_type(basic_project: Project) -> None:
    text = """\
    planrun: 1
    goal: g
    params:
      info: {type: object, default: {a: 1}}
    steps:
      - {id: a, tool: echo, arguments: {value: "x{params.info}"}}
    """
    report, _plan = check(basic_project, text)
    issue = one(report, "param_type")
    assert issue.path == "/steps/0/arguments/value"
    assert issue.line == 6


def test_parameter_used_only_in_when_or_for_each_is_used(basic_project: Project) -> None:
    text = """\
    planrun: 1
    goal: g
    params:
      go: {type: boolean, default: true}
      things: {type: array, default: [1, 2]}
    steps:
      - id: a
        tool: echo
        when: "params.go"
        for_each: "{params.things}"
        arguments: {value: "{item}"}
    """
    report, plan = check(basic_project, text)
    assert report.issues == []
    assert plan is not None
    assert plan.by_id["a"].for_each == [1, 2]


# --- placeholders -------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "code"), [
    ("{foo.bar}", "placeholder"),
    ("x {stpes.a.output} y", "placeholder"),
    ("{params.a.b}", "placeholder"),
    ("{steps.a}", "placeholder"),
    ("<params.>", "placeholder"),
    ("{params.undeclared}", "param_missing"),
])
def test_malformed_placeholders(basic_project: Project, value: str, code: str) -> None:
    text = f"""\
    planrun: 1
    goal: g
    steps:
      - id: a
        tool: echo
        arguments: {{value: "{value}"}}
    """
    report, _plan = check(basic_project, text)
    issue = one(report, code)
    assert (issue.path, issue.step, issue.line) == ("/steps/0/arguments/value", "a", 6)


@pytest.mark.parametrize("value", ["{word}", "{ not a name }", "{{params.x}}", "{", "a}b",
                                   "{}"])
def test_literal_braces_are_fine(basic_project: Project, value: str) -> None:
    text = f"""\
    planrun: 1
    goal: g
    steps:
      - {{id: a, tool: echo, arguments: {{value: 1, name: "{value}"}}}}
    """
    report, plan = check(basic_project, text)
    assert report.issues == []
    assert plan is not None


# --- dependencies, cycles, references -------------------------------------------------------


def test_dependency(basic_project: Project) -> None:
    text = """\
    planrun: 1
    goal: g
    steps:
      - {id: first, tool: echo, arguments: {value: 1}}
      - {id: b, tool: echo, depends_on: [b, frist, first, first], arguments: {value: 1}}
    """
    report, plan = check(basic_project, text)
    self_dep, unknown = only(report, "dependency")
    assert (self_dep.path, self_dep.step) == ("/steps/1/depends_on/0", "b")
    assert "itself" in self_dep.message
    assert unknown.path == "/steps/1/depends_on/1"
    assert "Did you mean 'first'?" in unknown.message
    assert text_at(text, unknown).startswith("frist")
    assert codes(report) == ["dependency", "dependency"]  # a repeated dependency is harmless
    assert plan is None


def test_cycle_names_the_loop_in_waiting_order(basic_project: Project) -> None:
    text = """\
    planrun: 1
    goal: g
    steps:
      - {id: ok, tool: echo, arguments: {value: 1}}
      - {id: a, tool: echo, depends_on: [c], arguments: {value: 1}}
      - {id: b, tool: echo, depends_on: [a, ok], arguments: {value: 1}}
      - {id: c, tool: echo, depends_on: [b], arguments: {value: 1}}
    """
    report, plan = check(basic_project, text)
    issue = one(report, "cycle")
    match = re.search(r"([\w-]+(?: -> [\w-]+)+)", issue.message)
    assert match is not None, issue.message
    loop = match.group(1).split(" -> ")
    assert loop[0] == loop[-1]
    assert sorted(loop[:-1]) == ["a", "b", "c"]
    deps = {"a": ["c"], "b": ["a", "ok"], "c": ["b"]}
    for waiter, waited in itertools.pairwise(loop):
        assert waited in deps[waiter], f"{waiter} -> {waited} but {waiter} does not wait on it"
    assert issue.path is not None
    assert issue.path.endswith("/depends_on")
    assert issue.step == loop[0]
    assert issue.line is not None
    assert plan is None


def test_references(basic_project: Project) -> None:
    text = """\
    planrun: 1
    goal: g
    steps:
      - {id: src, tool: lister, arguments: {}}
      - {id: mid, tool: echo, depends_on: [src], arguments: {value: "{steps.src.output.files}"}}
      - id: far
        tool: echo
        depends_on: [mid]
        arguments: {value: "{steps.src.output.n}", name: "{steps.loner.output}"}
      - {id: loner, tool: echo, arguments: {value: "{steps.mid.output}"}}
      - {id: own, tool: echo, arguments: {value: "{steps.own.output}"}}
      - {id: ghost, tool: echo, arguments: {value: "{steps.gohst.output}"}}
      - {id: item, tool: echo, arguments: {value: "{item}", count: "{index}"}}
      - {id: typo, tool: echo, depends_on: [src], arguments: {value: "{steps.src.output.nope}"}}
      - {id: fe, tool: echo, for_each: "{item.x}", arguments: {value: 1}}
    """
    report, _plan = check(basic_project, text)
    refs = {(i.step, i.path) for i in only(report, "reference")}
    assert refs == {
        ("far", "/steps/2/arguments/name"),     # loner is not an ancestor of far
        ("loner", "/steps/3/arguments/value"),  # mid is not an ancestor of loner
        ("own", "/steps/4/arguments/value"),    # its own output
        ("ghost", "/steps/5/arguments/value"),  # no such step
        ("item", "/steps/6/arguments/value"),   # {item} outside for_each
        ("item", "/steps/6/arguments/count"),   # {index} outside for_each
        ("typo", "/steps/7/arguments/value"),   # not in the output_schema of lister
        ("fe", "/steps/8/for_each"),            # {item} in for_each itself
    }
    # far -> mid -> src: a transitive ancestor is fine
    assert ("far", "/steps/2/arguments/value") not in refs
    ghost = next(i for i in only(report, "reference") if i.step == "ghost")
    assert "Did you mean 'ghost'?" in ghost.message
    for issue in only(report, "reference"):
        assert issue.line is not None
        assert issue.column is not None


def test_for_each_must_be_a_list_or_one_step_placeholder(basic_project: Project) -> None:
    text = """\
    planrun: 1
    goal: g
    params:
      p: {type: string, default: x}
    steps:
      - {id: a, tool: echo, for_each: "a {params.p}", arguments: {value: "{item}"}}
      - {id: b, tool: echo, for_each: "{params.p}", arguments: {value: "{item}"}}
      - {id: c, tool: echo, for_each: [1, "{params.p}"], arguments: {value: "{item}"}}
    """
    report, _plan = check(basic_project, text)
    assert [(i.code, i.path) for i in report.issues] == [
        ("schema", "/steps/0/for_each"), ("schema", "/steps/1/for_each")]


@pytest.mark.parametrize(("when", "fragment"), [
    ("1 +", "does not compile"),
    ("params.x ==", "does not compile"),
    ("steps.later.output.ok", "steps.later"),
    ("steps.nope.output.ok", "steps.nope"),
    ("params.undeclared == 1", "params.undeclared"),
])
def test_condition(basic_project: Project, when: str, fragment: str) -> None:
    text = f"""\
    planrun: 1
    goal: g
    params:
      x: {{type: integer, default: 1}}
    steps:
      - {{id: a, tool: echo, when: "{when}", arguments: {{value: "{{params.x}}"}}}}
      - {{id: later, tool: echo, arguments: {{value: 1}}}}
    """
    report, _plan = check(basic_project, text)
    issue = one(report, "condition")
    assert fragment in issue.message
    assert (issue.path, issue.step) == ("/steps/0/when", "a")
    assert text_at(text, issue).startswith('"')


def test_condition_on_an_ancestor_is_fine(basic_project: Project) -> None:
    text = """\
    planrun: 1
    goal: g
    steps:
      - {id: src, tool: lister, arguments: {}}
      - id: a
        tool: echo
        depends_on: [src]
        when: "steps.src.output.n > 1"
        arguments: {value: 1}
    """
    report, plan = check(basic_project, text)
    assert report.issues == []
    assert plan is not None
    assert plan.by_id["a"].when == "steps.src.output.n > 1"


def test_parameter_read_by_index_in_when_is_used(basic_project: Project) -> None:
    report, _plan = check(basic_project, """\
    planrun: 1
    goal: g
    params:
      keep-all: {type: boolean, default: true}
    steps:
      - {id: a, tool: echo, when: 'params["keep-all"]', arguments: {value: 1}}
    """)
    assert report.issues == []


def test_step_name_inside_a_cel_string_is_not_a_read(basic_project: Project) -> None:
    report, _plan = check(basic_project, """\
    planrun: 1
    goal: g
    steps:
      - {id: a, tool: echo, arguments: {value: 1}}
      - {id: b, tool: echo, when: '"see steps.a" != ""', arguments: {value: 1}}
    """)
    assert report.issues == []


# --- JSON plans and known crashes ------------------------------------------------------


def test_json_plan_issues_are_located(basic_project: Project) -> None:
    data = {"planrun": 1, "goal": "g",
            "steps": [{"id": "a", "tool": "echo", "arguments": {"value": 1, "count": "2"}}]}
    text = json.dumps(data, indent=2)
    report, _plan = check(basic_project, text, kind="json", file="plans/p.json")
    issue = one(report, "arguments")
    assert issue.path == "/steps/0/arguments/count"
    assert issue.file == "plans/p.json"
    assert text.splitlines()[issue.line - 1][issue.column - 1:] == '"2"'


def test_json_plan_with_escaped_emoji_is_located(basic_project: Project) -> None:
    data = {"planrun": 1, "goal": "ship \U0001F680",
            "steps": [{"id": "a", "tool": "ecko", "arguments": {"value": 1}}]}
    text = json.dumps(data, indent=2)  # the emoji is written as a \\ud83d\\ude80 escape
    assert "\\ud83d" in text
    report, _plan = check(basic_project, text, kind="json")
    issue = one(report, "unknown_tool")
    assert issue.line is not None
    assert issue.column is not None
    assert text.splitlines()[issue.line - 1][issue.column - 1:] == '"ecko",'


def test_json_plan_with_infinite_number_does_not_crash(basic_project: Project) -> None:
    text = ('{"planrun": 1, "goal": "g", "steps": [{"id": "a", "tool": "echo", '
            '"arguments": {"value": 1e400}}]}')
    try:
        report, _plan = check(basic_project, text, kind="json")
    except DocumentError:
        return  # refused while loading: fine
    assert not report.ok


def test_deep_json_plan_does_not_crash(basic_project: Project) -> None:
    value = "[" * 800 + "]" * 800
    text = ('{"planrun": 1, "goal": "g", "steps": [{"id": "a", "tool": "echo", '
            '"arguments": {"value": ' + value + "}}]}")
    registry, settings_ = basic_project.good_registry(), basic_project.settings()
    failure: list[BaseException] = []

    def run() -> None:  # a fresh thread: the same stack depth whatever pytest's own depth
        try:
            doc = parse_text(text, kind="json", file="p.json")
            check_document(doc, registry, settings_)
        except DocumentError as exc:
            if exc.issues[0].code != "too_large":
                failure.append(exc)
        except BaseException as exc:
            failure.append(exc)

    # cel-python raises the recursion limit to 2500 on its first compile; use Python's default
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
    finally:
        sys.setrecursionlimit(limit)
    if failure:
        raise failure[0]


def test_param_schema_with_unresolvable_ref_does_not_crash(basic_project: Project) -> None:
    report, _plan = check(basic_project, """\
    planrun: 1
    goal: g
    params:
      p: {$ref: "#/$defs/missing", default: 1}
    steps:
      - {id: a, tool: echo, arguments: {value: "{params.p}"}}
    """)
    assert "schema" in codes(report)


def test_infinite_cli_number_is_param_type(basic_project: Project) -> None:
    report, _plan = check(basic_project, """\
    planrun: 1
    goal: g
    params:
      r: {type: number}
    steps:
      - {id: a, tool: echo, arguments: {value: 1, ratio: "{params.r}"}}
    """, given=ParamInput(cli={"r": "1e400"}))
    assert codes(report) == ["param_type"]


# --- api.validate ---------------------------------------------------------------------


def test_api_validate_reports_every_plan(basic_project: Project) -> None:
    basic_project.write_plan("good", GOOD)
    basic_project.write_plan("bad", "planrun: 1\ngoal: g\nsteps: []\n")
    basic_project.write_plan("broken", '{"planrun": 1, "planrun": 1}', suffix=".json")
    report = api.validate(basic_project.settings(), [])
    assert [p.file for p in report.plans] == ["project/plans/bad.yaml",
                                              "project/plans/broken.json",
                                              "project/plans/good.yaml"]
    assert [p.ok for p in report.plans] == [False, False, True]
    assert codes(report) == ["empty", "duplicate_key"]
    assert not report.ok()
    out = report.to_json()
    assert out["ok"] is False
    assert out["plans"][2]["plan"]["name"] == "nightly"


def test_api_validate_registry_problems_come_first(basic_project: Project) -> None:
    basic_project.write("tools.yaml", "tools:\n  a: {command: [echo]}\n")
    basic_project.write_plan("good", GOOD)
    report = api.validate(basic_project.settings(), [])
    assert codes(report) == ["registry"]
    assert report.plans == []


def test_api_validate_unknown_and_bad_names(basic_project: Project) -> None:
    basic_project.write_plan("good", GOOD)
    report = api.validate(basic_project.settings(), ["godo", "../x"])
    assert codes(report) == ["not_found", "bad_name"]
    assert "good" in report.plans[0].issues[0].message


# --- fuzzing --------------------------------------------------------------------------

FIELDS = ["planrun", "name", "revision", "goal", "params", "steps", "max_parallel", "timeout",
          "id", "tool", "arguments", "depends_on", "intent", "for_each", "max_items",
          "on_item_error", "retries", "when", "pool", "type", "default", "secret", "value",
          "facets", "paths", "counts", "group_counts", "max_group_keys", "skip", "collect",
          "count", "ratio", "flag", "items", "max_attempts", "echo", "lister", "a", "b"]
BRACES = st.lists(st.sampled_from(
    ["{", "}", "{{", "}}", "{params.", "{steps.", "{item", "{index}", ".output", ".", "a", "b",
     "keep", "<params.", ">", "x", " ", "0", "}}}", "{foo.bar}", "params.keep", "steps.a"]),
    max_size=8).map("".join)
SCALARS = (st.none() | st.booleans() | st.integers(-5, 5) | st.floats(-1e6, 1e6)
           | st.sampled_from(FIELDS) | BRACES | st.text(max_size=6))
DOCS = st.recursive(
    SCALARS,
    lambda kids: st.lists(kids, max_size=4)
    | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=4), kids, max_size=5),
    max_leaves=25,
)

VALID: dict[str, Any] = yaml.safe_load(dedent(GOOD))


@st.composite
def mutated_plans(draw: st.DrawFn) -> Any:
    plan = copy.deepcopy(VALID)
    for _ in range(draw(st.integers(1, 6))):
        containers = list(_containers(plan))
        kind = draw(st.sampled_from(["drop", "duplicate", "retype", "braces", "depends_on",
                                     "add"]))
        _path, node = draw(st.sampled_from(containers))
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        if kind == "depends_on":
            steps = plan.get("steps") if isinstance(plan, dict) else None
            if isinstance(steps, list) and steps and isinstance(steps[0], dict):
                step = draw(st.sampled_from(steps))
                if isinstance(step, dict):
                    ids = [s.get("id") for s in steps if isinstance(s, dict)] + ["zz", 3]
                    step["depends_on"] = draw(st.lists(st.sampled_from(ids), max_size=4))
            continue
        if kind == "add":
            if isinstance(node, dict):
                node[draw(st.sampled_from(FIELDS))] = draw(DOCS)
            else:
                node.append(draw(DOCS))
            continue
        if not keys:
            continue
        key = draw(st.sampled_from(keys))
        if kind == "drop":
            del node[key]
        elif kind == "duplicate":
            if isinstance(node, list):
                node.insert(key, copy.deepcopy(node[key]))
            else:
                node[draw(st.sampled_from(FIELDS))] = copy.deepcopy(node[key])
        elif kind == "retype":
            node[key] = draw(DOCS)
        elif kind == "braces":
            node[key] = draw(BRACES)
    return plan


def _containers(value: Any, path: tuple[Any, ...] = ()) -> Any:
    if isinstance(value, dict | list):
        yield path, value
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for k, v in items:
            yield from _containers(v, (*path, k))


def _assert_report(report: PlanReport, plan: Any) -> None:
    _assert_issues(report)
    assert (plan is not None) == report.ok


def _assert_issues(report: PlanReport) -> None:
    assert isinstance(report, PlanReport)
    for issue in report.issues:
        assert issue.code in ISSUE_CODES, issue
        assert issue.severity in ("error", "warning")
        assert issue.line is None or issue.line >= 1
        assert issue.column is None or issue.column >= 1
        assert isinstance(issue.message, str)
        assert issue.message
    json.dumps(report.to_json())  # the --format json report can always be written


@pytest.fixture
def fuzz_env(basic_project: Project) -> tuple[Any, Any]:
    return basic_project.good_registry(), basic_project.settings()


def _check_data(data: Any, env: tuple[Any, Any], kind: str,
                given: ParamInput | None = None) -> None:
    text = json.dumps(data) if kind == "json" else yaml.safe_dump(data, allow_unicode=True)
    try:
        doc = parse_text(text, kind=kind, file="plans/fuzz." + kind)
    except DocumentError as exc:
        issues = exc.issues
    else:
        report, plan = check_document(doc, *env, given=given)
        _assert_report(report, plan)
        return
    assert issues
    assert all(i.code in ISSUE_CODES for i in issues)


@settings(max_examples=200)
@given(DOCS, st.sampled_from(["json", "yaml"]))
def test_fuzz_random_documents(fuzz_env: tuple[Any, Any], data: Any, kind: str) -> None:
    _check_data(data, fuzz_env, kind)


@settings(max_examples=200)
@given(mutated_plans(), st.sampled_from(["json", "yaml"]),
       st.dictionaries(st.sampled_from(["source", "keep", "date", "zz"]), BRACES, max_size=3))
def test_fuzz_mutated_valid_plan(fuzz_env: tuple[Any, Any], data: Any, kind: str,
                                 cli: dict[str, str]) -> None:
    _check_data(data, fuzz_env, kind, ParamInput(cli=cli) if cli else None)


YAMLISH = st.text(alphabet=st.sampled_from(list("{}[]:,-&*!|>'\"#\n  ab1.<>%@`?~\t"))
                  | st.characters(), max_size=120)
PLAN_WITH = ("planrun: 1\ngoal: g\nsteps:\n"
             "  - {{id: a, tool: echo, arguments: {{value: '{}'}}}}\n").format


@settings(max_examples=60)
@given(st.one_of(YAMLISH, BRACES.map(PLAN_WITH)),
       st.sampled_from([".yaml", ".json"]))
def test_fuzz_random_files_through_api_validate(basic_project: Project, tmp_path: Path,
                                                text: str, suffix: str) -> None:
    for old in basic_project.plans.glob("*"):
        old.unlink()
    if suffix == ".json":
        text = text.replace("e", "").replace("E", "")  # no float can overflow in 120 characters
    basic_project.write(f"plans/fuzz{suffix}", text.encode("utf-8", "surrogatepass"))
    report = api.validate(basic_project.settings(), ["fuzz"])
    assert len(report.plans) == 1
    _assert_issues(report.plans[0])
