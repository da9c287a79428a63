"""Arguments that fit a contract are not checked again (issue 16); a changed contract is."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import Project, codes, one

PLAN = """\
planrun: 1
goal: count
steps:
  - {id: a, tool: lister, arguments: {n: 3}}
  - {id: b, tool: lister, arguments: {n: 3}}
"""


pytestmark = pytest.mark.usefixtures("empty_memo")


def test_arguments_that_fitted_are_not_checked_again(basic_project: Project,
                                                     schema_checks: list[Any]) -> None:
    report, plan = basic_project.check(PLAN)
    assert plan is not None, report
    assert schema_checks == [{"n": 3}]  # step b: the same arguments, the same contract
    report, plan = basic_project.check(PLAN)  # a second check in this process: none
    assert plan is not None
    assert schema_checks == [{"n": 3}]


def test_a_problem_is_worked_out_every_time(basic_project: Project,
                                            schema_checks: list[Any]) -> None:
    bad = PLAN.replace("{n: 3}", "{n: -1}")
    first, _ = basic_project.check(bad)
    second, _ = basic_project.check(bad)
    assert codes(first) == codes(second) == ["arguments", "arguments"]
    assert [i.message for i in first.issues] == [i.message for i in second.issues]
    assert len(schema_checks) == 4


def test_an_edited_tools_yaml_is_checked_again(basic_project: Project) -> None:
    report, plan = basic_project.check(PLAN)
    assert plan is not None, report
    tools = (basic_project.root / "tools.yaml").read_text()
    edited = tools.replace("n: {type: integer, minimum: 0}", "n: {type: integer, minimum: 5}")
    assert edited != tools
    (basic_project.root / "tools.yaml").write_text(edited)
    report, plan = basic_project.check(PLAN)
    assert plan is None
    assert "minimum" in one(report.issues[:1], "arguments").message
