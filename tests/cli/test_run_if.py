"""Clean-up and notify steps: ``run_if`` and ``steps.ID.status`` in ``when`` (issue 17, part 3).

Through the CLI (``typer.testing.CliRunner``), one run per behaviour; the decisions are in
docs/plans.md "Clean-up and notify steps".
"""

from __future__ import annotations

from conftest import Project

from .support import MODULE, TOOLS, as_json, calls, execute_json, invoke

NOTIFY = """
planrun: 1
goal: Work, then say how it went
params:
  fail: {type: boolean, default: false}
steps:
  - {id: first, tool: echo, arguments: {value: first}}
  - id: work
    tool: boom
    depends_on: [first]
    when: params.fail
    arguments: {value: work}
  - {id: after, tool: echo, depends_on: [work], arguments: {value: after}}
  - id: on_failure
    tool: echo
    depends_on: [after]
    run_if: failure
    when: steps.work.status == "failed" && steps.after.status == "skipped"
    arguments: {value: "failure noticed"}
  - {id: cleanup, tool: echo, depends_on: [after], run_if: always,
     arguments: {value: "cleaned up"}}
  - {id: on_success, tool: echo, depends_on: [after], arguments: {value: "all good"}}
"""


def _statuses(m: dict[str, object]) -> dict[str, str]:
    return {s["id"]: s["status"] for s in m["steps"]}  # type: ignore[attr-defined, index]


def test_failure_runs_notify_and_cleanup_and_the_run_stays_failed(proj: Project) -> None:
    proj.write_plan("notify", NOTIFY)
    result, m = execute_json(proj, "notify", "-p", "fail=true")
    assert result.exit_code == 1, result.output
    assert m["status"] == "failed"
    assert _statuses(m) == {"first": "succeeded", "work": "failed", "after": "skipped",
                            "on_failure": "succeeded", "cleanup": "succeeded",
                            "on_success": "skipped"}
    done = calls(proj)  # on_failure and cleanup are independent: either may start first
    assert done[0] == "first"
    assert sorted(done[1:]) == ["cleaned up", "failure noticed"]


def test_success_skips_the_failure_step_by_condition(proj: Project) -> None:
    proj.write_plan("notify", NOTIFY.replace("when: params.fail", "when: '!params.fail'")
                    .replace("tool: boom", "tool: echo"))
    result, m = execute_json(proj, "notify")
    assert result.exit_code == 0, result.output
    assert m["status"] == "completed"
    assert _statuses(m)["on_failure"] == "skipped"
    assert sorted(calls(proj)) == sorted(["first", "work", "after", "cleaned up",
                                          "all good"])
    log = as_json(invoke(proj, "log", m["run_id"], "--json"))
    skipped = [e for e in log if e["kind"] == "step_skipped" and e["step"] == "on_failure"]
    assert skipped[0]["data"]["reason"] == "condition"


def test_a_step_skipped_by_its_condition_is_not_a_failure(proj: Project) -> None:
    proj.write_plan("notify", NOTIFY)
    result, m = execute_json(proj, "notify")  # work's when is false: skipped (condition)
    assert result.exit_code == 0, result.output
    assert _statuses(m)["on_failure"] == "skipped"
    assert "failure noticed" not in calls(proj)
    assert "cleaned up" in calls(proj)


def test_a_failing_cleanup_step_fails_the_run(proj: Project) -> None:
    proj.write_plan("cleanup", """
planrun: 1
goal: Clean-up that fails
steps:
  - {id: work, tool: echo, arguments: {value: work}}
  - {id: cleanup, tool: boom, depends_on: [work], run_if: always, arguments: {value: 1}}
""")
    result, m = execute_json(proj, "cleanup")
    assert result.exit_code == 1, result.output
    assert m["status"] == "failed"
    assert _statuses(m) == {"work": "succeeded", "cleanup": "failed"}


def test_fail_fast_does_not_hold_back_a_cleanup_step(proj: Project) -> None:
    # ``slow`` is independent of the failure and stopped by it (no --keep-going);
    # the clean-up step after it still runs, and it sees why.
    proj.write_plan("stop", """
planrun: 1
goal: Stop on failure, clean up anyway
steps:
  - {id: bad, tool: boom, arguments: {value: 1}}
  - {id: other, tool: echo, depends_on: [bad], arguments: {value: other}}
  - {id: cleanup, tool: echo, depends_on: [other], run_if: failure,
     arguments: {value: cleanup}}
""")
    result, m = execute_json(proj, "stop")
    assert result.exit_code == 1, result.output
    assert _statuses(m) == {"bad": "failed", "other": "skipped", "cleanup": "succeeded"}
    assert calls(proj) == ["cleanup"]


def test_bad_run_if_is_a_schema_issue(proj: Project) -> None:
    proj.write_plan("bad", """
planrun: 1
goal: Typo
steps:
  - {id: a, tool: echo, arguments: {value: 1}}
  - {id: b, tool: echo, depends_on: [a], run_if: failed, arguments: {value: 2}}
""")
    result = invoke(proj, "validate", "bad", "--format", "json")
    assert result.exit_code == 3, result.output
    issues = as_json(result)["plans"][0]["issues"]
    assert [(i["code"], i["path"]) for i in issues] == [("schema", "/steps/1/run_if")]
    assert "'success', 'failure' or 'always'" in issues[0]["message"]


def test_run_if_failure_on_a_step_with_no_dependency_is_refused(proj: Project) -> None:
    proj.write_plan("bad", """
planrun: 1
goal: A notify step that could never run
steps:
  - {id: a, tool: echo, arguments: {value: 1}}
  - {id: b, tool: echo, run_if: failure, arguments: {value: 2}}
""")
    result = invoke(proj, "validate", "bad", "--format", "json")
    assert result.exit_code == 3, result.output
    issues = as_json(result)["plans"][0]["issues"]
    assert [(i["code"], i["path"]) for i in issues] == [("schema", "/steps/1/run_if")]
    assert "could never run" in issues[0]["message"]


def test_a_typo_in_what_when_reads_of_a_step_is_refused_at_validation(proj: Project) -> None:
    proj.write_plan("bad", """
planrun: 1
goal: Typos that would fail only at run time
steps:
  - {id: a, tool: echo, arguments: {value: 1}}
  - {id: b, tool: echo, depends_on: [a], run_if: always,
     when: 'steps.a.stauts == "failed" || steps.a.outptu == 1 || steps.a.status == "x"',
     arguments: {value: 2}}
""")
    result = invoke(proj, "validate", "bad", "--format", "json")
    assert result.exit_code == 3, result.output
    issues = as_json(result)["plans"][0]["issues"]
    assert [(i["code"], i["path"]) for i in issues] == [("condition", "/steps/1/when")] * 2
    messages = sorted(i["message"] for i in issues)
    assert "steps.a.outptu" in messages[0]
    assert "Did you mean 'output'?" in messages[0]
    assert "steps.a.stauts" in messages[1]
    assert "Did you mean 'status'?" in messages[1]


def test_when_reads_status_of_ancestors_only(proj: Project) -> None:
    proj.write_plan("bad", """
planrun: 1
goal: Status of a step that is not an ancestor
steps:
  - {id: a, tool: echo, arguments: {value: 1}}
  - {id: b, tool: echo, when: 'steps.a.status == "failed"', run_if: always,
     arguments: {value: 2}}
""")
    result = invoke(proj, "validate", "bad", "--format", "json")
    assert result.exit_code == 3, result.output
    issues = as_json(result)["plans"][0]["issues"]
    assert [(i["code"], i["path"]) for i in issues] == [("condition", "/steps/1/when")]


def test_retry_inherits_a_notify_step_that_ran(proj: Project) -> None:
    # The failure was noticed once; a retry that now succeeds does not notify again, and
    # the steps skipped by the failure run (on_success now succeeds).
    proj.write_plan("notify", NOTIFY)
    _, m = execute_json(proj, "notify", "-p", "fail=true")
    assert m["status"] == "failed"
    proj.write_tools(TOOLS.replace("clitools:boom", "clitools:echo"), module=MODULE,
                     module_name="clitools")  # the failing tool is fixed
    result = invoke(proj, "retry", m["run_id"], "--json")
    assert result.exit_code == 0, result.output
    child = as_json(result)
    assert child["status"] == "completed"
    assert _statuses(child) == {"first": "succeeded", "work": "succeeded",
                                "after": "succeeded", "on_failure": "succeeded",
                                "cleanup": "succeeded", "on_success": "succeeded"}
    assert calls(proj).count("failure noticed") == 1
    assert calls(proj).count("cleaned up") == 1


def test_a_cleanup_step_reading_the_output_of_a_step_that_failed_fails_before_its_call(
        proj: Project) -> None:
    """Only a step that succeeded has an output (docs/plans.md): the clean-up step was
    called with ``null`` (and ``"after null"`` inside text) instead (found by an
    attacker). It now fails with ``reference``, uncalled, as any unresolvable placeholder;
    its condition still reads the failed step's status."""
    for argument in ('"{steps.work.output}"', '"after {steps.work.output}"'):
        proj.write_plan("notify", NOTIFY.replace(
            'arguments: {value: "cleaned up"}', f"arguments: {{value: {argument}}}"))
        result, m = execute_json(proj, "notify", "-p", "fail=true")
        assert result.exit_code == 1, result.output
        steps = {s["id"]: s for s in m["steps"]}  # type: ignore[attr-defined, index]
        assert steps["cleanup"]["status"] == "failed", steps["cleanup"]
        assert steps["cleanup"]["error"]["code"] == "reference", steps["cleanup"]
        assert "only a step that succeeded has an output" in \
            steps["cleanup"]["error"]["message"]
        assert steps["on_failure"]["status"] == "succeeded"  # its when read the status
        assert not any(c in (None, "None", "null", "after None", "after null")
                       for c in calls(proj)), calls(proj)
