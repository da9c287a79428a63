"""Placeholders cannot build gigabytes from a small plan (the sibling of YAML aliases).

Found by a review of what grows without bound: a 2 MB plan whose one string held
``{params.x}`` 200,000 times, with a 10 KB value, made ``planrun validate`` build a 2 GB
string, and each placement copied the text built so far (``out[-1] + s``): 2,000
placements took 22 s, 200,000 never ended. Exact placeholders share their value but every
check and digest walked each place again.

Now the values placeholders place are counted, each time they are placed, against
``MAX_PLACED_BYTES`` (64 MiB): at load time over the whole plan (``too_large`` at the
place that goes past, exit 3 from ``validate``, nothing long built), at run time over one
call's arguments or one ``for_each`` (the step fails: ``arguments``, ``for_each``). Text
is joined once, not copied at each placement.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from conftest import Project, by_step, execute_plan, one
from harness import run_planrun
from planrun.params import MAX_PLACED_BYTES, Placed, json_size
from planrun.validation import ParamInput

MIB = 1024 * 1024

TOOLS = """\
tools:
  echo:
    description: Return the arguments
    python: placetools:echo
    arguments: {type: object}
  text:
    description: A string of n characters
    python: placetools:text
    arguments: {type: object, properties: {n: {type: integer}}, required: [n]}
"""

MODULE = """\
def echo(**kwargs):
    return {k: len(json.dumps(v)) for k, v in kwargs.items()}


def text(n):
    return "y" * n


import json
"""


@pytest.fixture
def proj(project: Project) -> Project:
    project.write("tools.yaml", TOOLS)
    project.write("placetools.py", MODULE)
    return project


def _given(**values: Any) -> ParamInput:
    return ParamInput(file_values=values)


# --- load time: the whole plan ----------------------------------------------------------


def test_one_short_value_placed_many_times_in_one_string_is_refused(proj: Project) -> None:
    times = MAX_PLACED_BYTES // 1000 + 1  # 1,000 characters each: just past the bound
    plan = ("planrun: 1\ngoal: amplify\nparams:\n  x: {type: string}\nsteps:\n"
            f'  - {{id: a, tool: echo, arguments: {{t: "{"{params.x}" * times}"}}}}\n')
    report, checked = proj.check(plan, given=_given(x="z" * 1000))
    assert checked is None
    issue = one(report, "too_large")
    assert issue.path == "/steps/0/arguments/t", issue
    assert "64 Mi" in issue.message, issue


def test_a_long_value_placed_whole_many_times_is_refused(proj: Project) -> None:
    """Exact placeholders share the value, but each place counts."""
    places = ", ".join(['"{params.big}"'] * 65)
    plan = ("planrun: 1\ngoal: amplify\nparams:\n  big: {type: string}\nsteps:\n"
            f"  - {{id: a, tool: echo, arguments: {{xs: [{places}]}}}}\n")
    report, checked = proj.check(plan, given=_given(big="b" * MIB))
    assert checked is None
    # a string placed counts its length: 1 MiB a place, the 65th goes past 64 MiB
    assert one(report, "too_large").path == "/steps/0/arguments/xs/64"


def test_the_bound_is_over_the_plan_not_each_step(proj: Project) -> None:
    steps = "".join(f'  - {{id: s{i}, tool: echo, arguments: {{t: "{{params.big}}"}}}}\n'
                    for i in range(70))
    plan = "planrun: 1\ngoal: many steps\nparams:\n  big: {type: string}\nsteps:\n" + steps
    report, _ = proj.check(plan, given=_given(big="b" * MIB))
    # 1 MiB a place: the 65th place (step s64) goes past 64 MiB
    assert one(report, "too_large").path == "/steps/64/arguments/t"


def test_values_placed_below_the_bound_are_kept(proj: Project) -> None:
    places = ", ".join(['"{params.big}"'] * 60)
    plan = ("planrun: 1\ngoal: fits\nparams:\n  big: {type: string}\nsteps:\n"
            f"  - {{id: a, tool: echo, arguments: {{xs: [{places}], "
            f't: "{{params.big}}-{{params.big}}"}}}}\n')
    report, checked = proj.check(plan, given=_given(big="b" * MIB))
    assert report.ok, report.issues
    assert checked is not None
    args = checked.steps[0].arguments
    assert args["t"] == "b" * MIB + "-" + "b" * MIB
    assert len(args["xs"]) == 60


def test_validate_refuses_an_amplifying_plan_at_once(proj: Project) -> None:
    """The real CLI: one ``too_large`` line, exit 3, and no 2 GB built (it ends)."""
    proj.write("plans/amp.yaml", "planrun: 1\ngoal: amplify\nparams:\n  x: {type: string}\n"
               "steps:\n  - id: a\n    tool: echo\n"
               f'    arguments: {{t: "{"{params.x}" * 200_000}"}}\n')
    r = run_planrun("validate", "amp", "-p", "x=" + "z" * 10_000, cwd=proj.root, timeout=120)
    assert r.returncode == 3, r
    assert "error[too_large]" in r.stdout, r
    assert "Traceback" not in r.stderr


# --- run time: one call's arguments, one for_each ---------------------------------------


RUN_PLAN = """\
planrun: 1
goal: outputs placed many times
steps:
  - {{id: a, tool: text, arguments: {{n: {n}}}}}
  - {{id: b, tool: echo, depends_on: [a], arguments: {{{args}}}}}
"""


@pytest.mark.parametrize(("args", "ok"), [
    # embedded in text: 65 places of a 1 MiB output
    ('t: "' + "{steps.a.output}" * 65 + '"', False),
    # whole values: one output shared by 65 places
    ("xs: [" + ", ".join(['"{steps.a.output}"'] * 65) + "]", False),
    ("xs: [" + ", ".join(['"{steps.a.output}"'] * 60) + "]", True),
])
def test_a_steps_arguments_are_bounded_at_run_time(proj: Project, args: str, ok: bool
                                                   ) -> None:
    proj.write("plans/run.yaml", RUN_PLAN.format(n=MIB, args=args))
    manifest = execute_plan(proj, "run")
    b = by_step(manifest)["b"]
    if ok:
        assert b["status"] == "succeeded", b
        return
    assert manifest["status"] == "failed"
    assert b["status"] == "failed", b
    assert b["error"]["code"] == "arguments", b
    assert "64 Mi" in b["error"]["message"], b


def test_a_for_each_is_bounded_at_run_time(proj: Project) -> None:
    places = ", ".join(['"{steps.a.output}"'] * 65)
    proj.write("plans/fan.yaml", "planrun: 1\ngoal: items placed\nsteps:\n"
               f"  - {{id: a, tool: text, arguments: {{n: {MIB}}}}}\n"
               f"  - {{id: b, tool: echo, depends_on: [a], for_each: [{places}], "
               'arguments: {x: "{item}"}}\n')
    manifest = execute_plan(proj, "fan")
    b = by_step(manifest)["b"]
    assert b["status"] == "failed", b
    assert b["error"]["code"] == "for_each", b
    assert "its for_each holds more than" in b["error"]["message"], b


# --- the measure ------------------------------------------------------------------------


@pytest.mark.parametrize("value", [
    None, True, False, 0, -17, 10**40, 1.5, "", "abc", "é€😀", [], {}, [1, "a", None],
    {"k": [1, 2, {"z": "w"}], "ü": False}])
def test_json_size_is_the_compact_json_length_without_escapes(value: Any) -> None:
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    assert json_size(value) >= len(text) - (2 if isinstance(value, int) and value < 0 else 0)
    assert json_size(value) <= len(text) + 2


def test_json_size_of_what_is_no_json_data_walks_it() -> None:
    """A value nested past the encoder's depth is measured by a walk (no RecursionError)."""
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    assert json_size(deep) == 200_000 + 2
    assert json_size({"a": (1, "bc")}) == len('{"a":[1,"bc"]}')  # as the encoder writes it


def test_a_value_placed_again_is_counted_again_and_sized_once() -> None:
    shared = ["x" * 100] * 3
    placed = Placed("the test holds", bound=1000)
    assert placed.add(shared)
    first = placed.used
    assert first == json_size(shared)
    assert placed.add(shared)
    assert placed.used == 2 * first
    assert not Placed("t", bound=10).add("x" * 11)
    at = Placed("t", bound=10)
    assert at.add("x" * 10)  # at the bound: kept
    assert not at.over
    assert not at.add("x")  # one more: past it, and it stays past
    assert not at.add("")
