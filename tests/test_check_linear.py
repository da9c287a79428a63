"""Checking a plan is linear in its size, whatever its shape and however many issues it has.

Found by a review of what grows without bound (the sibling of the placeholder and fan-out
bounds): each of these made ``planrun validate`` quadratic in the plan, and ``execute``
and ``resume`` run the same checks. A plan over ``max_steps`` is still checked in full
(one report lists every problem), so the default bound did not stop any of them.

- "did you mean" compared each unknown name with every name of the plan: 2,000 steps
  whose ``depends_on`` named no step took 54 s (now: at most ``MAX_SUGGESTION_WORK``
  comparisons per report; past it an issue has no hint);
- each issue was located by reading the file up to its node (JSON) or scanning its
  mapping's keys (YAML): 20,000 unused parameters took 8 s (JSON) and 28 s (YAML);
- ``depends_on`` was de-duplicated in a list: one step depending on 64,000 took 25 s;
- each ``{steps.ID.output}`` scanned the plan's steps for ID and walked the graph up to
  it, and each ``when`` rebuilt a table of every step: 16,000 steps each reading the first
  took 23 s, each with a ``when`` 28 s (now: :class:`planrun.graph.Ancestry`, which
  remembers its walks, bounded by ``MAX_ANCESTRY_WALK``: ``too_large`` past it);
- at run time a ``when`` was given every ancestor's status (a chain of 4,000 with a
  ``when`` each took 56 s instead of 4): now only the steps it names, and a condition
  that reads ``steps`` other than by name may depend on at most 1,000 steps
  (``condition``).

Work is asserted as counts (comparisons, steps walked, names listed), never as time.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from conftest import Project, one, only
from harness import run_planrun
from planrun import graph
from planrun.conditions import MAX_DYNAMIC_ANCESTORS, named_steps
from planrun.issues import MAX_SUGGESTION_WORK, Suggestions, listed
from planrun.jsontext import Lines, line_col
from planrun.validation import ParamInput

TOOLS = """\
tools:
  echo:
    description: Return the arguments
    python: lineartools:echo
    arguments: {type: object}
"""

MODULE = """\
def echo(**kwargs):
    return kwargs
"""


@pytest.fixture
def proj(project: Project) -> Project:
    project.write("tools.yaml", TOOLS)
    project.write_module("lineartools", MODULE)
    project.write("planrun.toml", "max_steps = 100000\n")  # large plans are the point
    return project


def _plan(steps: list[dict[str, Any]], **top: Any) -> str:
    return json.dumps({"planrun": 1, "goal": "g", **top, "steps": steps})


def _chain(n: int, **extra: Any) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = []
    for i in range(n):
        step: dict[str, Any] = {"id": f"s{i}", "tool": "echo"}
        if i:
            step["depends_on"] = [f"s{i - 1}"]
        steps.append(step)
    return steps


# --- did you mean -----------------------------------------------------------------------


def test_suggestions_of_one_report_are_bounded(proj: Project) -> None:
    n = 2000
    steps = [{"id": f"step_{i:05d}", "tool": "echo", "depends_on": [f"stp_{i:05d}"]}
             for i in range(n)]
    report, checked = proj.check(_plan(steps), kind="json", file="plans/p.json")
    assert checked is None
    issues = only(report, "dependency")
    assert len(issues) == n  # every problem is still reported
    hinted = [i for i in issues if "Did you mean" in i.message]
    # each suggestion compares with all 2,000 ids: the report's bound allows this many
    assert len(hinted) == MAX_SUGGESTION_WORK // n, len(hinted)
    assert "Did you mean 'step_00000'?" in issues[0].message


def test_a_small_plan_still_gets_every_suggestion(proj: Project) -> None:
    steps = [{"id": "build", "tool": "echo"},
             {"id": "test", "tool": "echo", "depends_on": ["biuld"]},
             {"id": "ship", "tool": "ehco", "depends_on": ["tset"]}]
    report, _ = proj.check(_plan(steps), kind="json", file="plans/p.json")
    messages = [i.message for i in report.issues]
    assert any("Did you mean 'build'?" in m for m in messages), messages
    assert any("Did you mean 'test'?" in m for m in messages), messages
    assert any("Did you mean 'echo'?" in m for m in messages), messages


def test_a_suggestion_past_the_bound_is_left_out_and_smaller_ones_still_made() -> None:
    s = Suggestions(budget=10)
    assert s.did_you_mean("bulid", [f"n{i}" for i in range(11)]) == ""
    assert s.did_you_mean("bulid", ["build", "test"]) == " Did you mean 'build'?"
    assert s.left == 8
    assert s.did_you_mean("x" * 101 + "a", ["x" * 101 + "b"]) == ""  # too long to compare


def test_an_unknown_parameter_lists_at_most_twenty_declared(proj: Project) -> None:
    n = 2000
    params = {f"p{i}": {"type": "string", "default": "x"} for i in range(n)}
    steps = [{"id": "a", "tool": "echo", "arguments": {f"p{i}": f"{{params.p{i}}}"
                                                       for i in range(n)}}]
    given = ParamInput(file_values={f"q{i}": "v" for i in range(n)})
    report, _ = proj.check(_plan(steps, params=params), kind="json", file="plans/p.json",
                           given=given)
    unknown = only(report, "param_unknown")
    assert len(unknown) == n
    for issue in unknown:  # 2,000 x 2,000 names were 40 MB of text
        assert issue.message.endswith(f"p19, … ({n - 20:,} more)"), issue.message
        assert len(issue.message) < 400, issue.message
    assert listed(["a", "b"]) == "a, b"


# --- locating issues --------------------------------------------------------------------


def test_lines_places_every_offset_as_line_col_does() -> None:
    text = 'a\n\nbc\r\nd"\n\n{\n  "x": 1}\n'
    lines = Lines(text)
    for offset in range(len(text) + 1):
        assert lines.at(offset) == line_col(text, offset), offset
    assert Lines("").at(0) == (1, 1)


@pytest.mark.parametrize("kind", ["json", "yaml"])
def test_many_issues_are_each_located(proj: Project, kind: str) -> None:
    n = 20_000
    if kind == "json":  # one parameter per line, its key at column 3
        text = '{"planrun": 1, "goal": "g", "params": {\n' + ",\n".join(
            f'  "p{i}": {{"type": "string", "default": "x"}}' for i in range(n)) \
            + '},\n"steps": [{"id": "a", "tool": "echo"}]}\n'
        first = 2
    else:
        text = "planrun: 1\ngoal: g\nparams:\n" + "".join(
            f"  p{i}: {{type: string, default: x}}\n" for i in range(n)) \
            + "steps:\n  - {id: a, tool: echo}\n"
        first = 4
    report, _ = proj.check(text, kind=kind, file=f"plans/p.{kind}")
    unused = only(report, "param_unused")
    assert len(unused) == n
    assert [(i.line, i.column) for i in unused] == [(first + k, 3) for k in range(n)]


def test_duplicate_keys_of_a_json_plan_are_each_located(proj: Project) -> None:
    n = 5000
    text = '{"planrun": 1,\n' + "".join(f'"k{i}": 1,\n"k{i}": 2,\n' for i in range(n)) \
        + '"goal": "g", "steps": []}'
    proj.write("plans/dups.json", text)
    res = run_planrun("validate", "dups", "--format", "json", cwd=proj.root)
    assert res.returncode == 3, res.stderr
    issues = json.loads(res.stdout)["plans"][0]["issues"]
    assert [(i["code"], i["line"]) for i in issues] == [
        ("duplicate_key", 3 + 2 * k) for k in range(n)]


# --- the dependency graph ---------------------------------------------------------------


def test_a_wide_fan_in_with_repeats_keeps_each_dependency_once(proj: Project) -> None:
    n = 20_000
    steps: list[dict[str, Any]] = [{"id": f"s{i}", "tool": "echo"} for i in range(n)]
    steps.append({"id": "join", "tool": "echo",
                  "depends_on": [f"s{i}" for i in range(n)] * 2})
    report, checked = proj.check(_plan(steps), kind="json", file="plans/p.json")
    assert report.ok, report.issues[:3]
    assert checked is not None
    assert checked.deps["join"] == [f"s{i}" for i in range(n)]


def _ask_all(deps: dict[str, list[str]], questions: list[tuple[str, str]]
             ) -> tuple[list[bool], int]:
    ancestry = graph.Ancestry(deps)
    answers = [ancestry.depends(step, cand) for step, cand in questions]
    return answers, ancestry.walked


def _chain_deps(n: int) -> dict[str, list[str]]:
    return {f"s{i}": [f"s{i - 1}"] if i else [] for i in range(n)}


def test_ancestry_of_the_usual_shapes_walks_each_step_a_few_times() -> None:
    n = 20_000
    deps = _chain_deps(n)
    # every step reads the first; every step reads its grandparent
    for questions in ([(f"s{i}", "s0") for i in range(1, n)],
                      [(f"s{i}", f"s{i - 2}") for i in range(2, n)]):
        answers, walked = _ask_all(deps, questions)
        assert all(answers)
        assert walked <= 2 * n, walked
    # one last step reads every step of the chain
    deps["last"] = [f"s{n - 1}"]
    answers, walked = _ask_all(deps, [("last", f"s{i}") for i in range(n)])
    assert all(answers)
    assert walked <= 2 * n, walked
    # a step of one chain reading the same step of a parallel chain: not an ancestor
    two = {**{f"a{i}": [f"a{i - 1}"] if i else [] for i in range(n)},
           **{f"b{i}": [f"b{i - 1}"] if i else [] for i in range(n)}}
    answers, walked = _ask_all(two, [(f"a{i}", f"b{i}") for i in range(n)])
    assert not any(answers)
    assert walked <= 2 * n, walked


def test_ancestry_answers_as_a_plain_walk_does() -> None:
    # a small diamond-rich graph: every pair asked
    deps = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"], "e": ["d"], "f": ["c"],
            "g": ["e", "f"], "h": []}
    ancestry = graph.Ancestry(deps)
    for step in deps:
        for cand in deps:
            assert ancestry.depends(step, cand) == (cand in graph.ancestors(step, deps)), \
                (step, cand)


def test_reading_far_ancestors_past_the_walk_bound_is_too_large(proj: Project) -> None:
    n = 6000  # each step reads the step halfway up the chain: ~n x n / 8 steps walked
    steps = _chain(n)
    for i in range(2, n):
        steps[i]["arguments"] = {"x": f"{{steps.s{i // 2}.output}}"}
    proj.write("plans/far.json", _plan(steps))
    res = run_planrun("validate", "far", "--format", "json", cwd=proj.root)
    assert res.returncode == 3, res.stderr
    issues = json.loads(res.stdout)["plans"][0]["issues"]
    assert [i["code"] for i in issues] == ["too_large"], issues[:3]
    assert f"{graph.MAX_ANCESTRY_WALK:,} steps" in issues[0]["message"]
    assert "depends_on" in issues[0]["message"]


def test_a_long_chain_of_references_to_the_first_step_is_valid(proj: Project) -> None:
    n = 20_000
    steps = _chain(n)
    for i in range(1, n):
        steps[i]["arguments"] = {"x": "{steps.s0.output}"}
        steps[i]["when"] = "steps.s0.status == 'succeeded'"
    report, checked = proj.check(_plan(steps), kind="json", file="plans/p.json")
    assert report.ok, report.issues[:3]
    assert checked is not None
    # a step that is no ancestor is still found, in the same plan
    steps[5]["arguments"] = {"x": "{steps.s9.output}"}
    report, _ = proj.check(_plan(steps), kind="json", file="plans/p.json")
    assert one(report, "reference").path == "/steps/5/arguments/x"


# --- conditions -------------------------------------------------------------------------


def test_named_steps_of_a_condition() -> None:
    assert named_steps("steps.a.output.n > 1 && steps['b'].status == 'failed'") == {"a", "b"}
    assert named_steps("params.x == 1") == frozenset()
    assert named_steps("size(steps) > 2") is None
    assert named_steps("'a' in steps") is None


def test_a_condition_reading_steps_by_expression_may_depend_on_at_most_1000(
        proj: Project) -> None:
    n = MAX_DYNAMIC_ANCESTORS + 3
    steps = _chain(n)
    for i in range(1, n):
        steps[i]["when"] = "size(steps) >= 0"
    report, checked = proj.check(_plan(steps), kind="json", file="plans/p.json")
    assert checked is None
    refused = only(report, "condition")
    # s1001 and s1002 depend on 1,001 and 1,002 steps
    assert [i.step for i in refused] == [f"s{n - 2}", f"s{n - 1}"], refused[:3]
    assert "more than 1,000" in refused[0].message
    assert "steps.ID.output" in refused[0].message


def test_a_condition_reads_the_status_of_a_far_ancestor_it_names(proj: Project) -> None:
    steps = _chain(30)
    steps[29]["when"] = "steps.s0.status == 'succeeded' && steps.s3.output == {}"
    steps[20]["when"] = "size(steps) == 20 && steps.exists(k, k == 's0')"
    steps.append({"id": "x", "tool": "echo", "depends_on": ["s27"],
                  "when": "steps.s1.status != 'succeeded'"})
    proj.write("plans/far.json", _plan(steps))
    res = run_planrun("execute", "far", "--json", cwd=proj.root)
    assert res.returncode == 0, res.stderr
    status = {s["id"]: s["status"] for s in json.loads(res.stdout)["steps"]}
    assert status["s20"] == status["s29"] == "succeeded", status
    assert status["x"] == "skipped", status


# --- run_if: failure at run time --------------------------------------------------------


def test_clean_up_steps_far_below_a_failure_run_and_the_others_are_skipped(
        proj: Project) -> None:
    """Each ``run_if: failure`` step's answer is kept (``Steps._wrong_above``), not walked.

    A chain of N such steps walked every ancestor of each (8,000 took 13 s, now 3 s); the
    answers must stay those of the walk: a failure far above is seen, a side branch with
    no failure above is not.
    """
    proj.write_module("lineartools", MODULE + "\n\ndef boom(**kwargs):\n"
                      "    raise RuntimeError('boom')\n")
    proj.write("tools.yaml", TOOLS + "  boom:\n    description: Fail\n"
               "    python: lineartools:boom\n    arguments: {type: object}\n")
    steps: list[dict[str, Any]] = [{"id": "s0", "tool": "echo"},
                                   {"id": "bad", "tool": "boom", "depends_on": ["s0"]}]
    prev = "bad"
    for i in range(1, 60):  # below the failure: every other step cleans up
        steps.append({"id": f"c{i}", "tool": "echo", "depends_on": [prev],
                      "run_if": "always" if i % 2 else "failure"})
        prev = f"c{i}"
    prev = "s0"
    for i in range(1, 20):  # a side branch: nothing failed above it
        steps.append({"id": f"d{i}", "tool": "echo", "depends_on": [prev],
                      "run_if": "always" if i % 2 else "failure"})
        prev = f"d{i}"
    proj.write("plans/clean.json", _plan(steps))
    res = run_planrun("execute", "clean", "--json", "--keep-going", cwd=proj.root)
    assert res.returncode == 1, res.stderr
    status = {s["id"]: s["status"] for s in json.loads(res.stdout)["steps"]}
    assert status["bad"] == "failed"
    assert all(status[f"c{i}"] == "succeeded" for i in range(1, 60)), status
    assert all(status[f"d{i}"] == ("succeeded" if i % 2 else "skipped")
               for i in range(1, 20)), status
