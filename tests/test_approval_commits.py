"""Clearing many irreversible steps takes a few commits, not two a step (issue 16).

Each step's ``approval_required`` event and each decision were a write transaction of
their own: a plan of 1,000 irreversible steps run with ``--approve-all`` made 2,000
commits (each a ``fdatasync``) before its first call. Now the requests go in one, and
the decisions in one (with the run's end when a denial ends it). Real SQLite journal;
the write transactions are counted (``sqlite_commits``).
"""

from __future__ import annotations

import pytest

from conftest import Project, by_step, execute_plan, run_events

STEPS = 40


def _plan(n: int) -> str:
    lines = ["planrun: 1", "name: many", "goal: many irreversible steps", "steps:"]
    lines += [f"  - {{id: d{i}, tool: delete_all, arguments: {{path: /tmp/x{i}}}}}"
              for i in range(n)]
    return "\n".join(lines) + "\n"


@pytest.fixture
def many(basic_project: Project) -> Project:
    basic_project.write_plan("many", _plan(STEPS))
    return basic_project


@pytest.mark.sqlite
def test_approve_all_clears_every_step_in_a_few_commits(many: Project,
                                                         sqlite_commits: list[int]) -> None:
    m = execute_plan(many, "many", approve_all=True)
    assert m["status"] == "completed", m
    assert {s["approved_by"] for s in m["steps"]} != {None}
    # the run, the requests, the decisions, the steps (4 slots share commits), its end
    assert len(sqlite_commits) < STEPS + 12, len(sqlite_commits)
    granted = run_events(many, m["run_id"], "approval_granted")
    assert sorted(e["step"] for e in granted) == sorted(f"d{i}" for i in range(STEPS))
    assert len(run_events(many, m["run_id"], "approval_required")) == STEPS


def test_a_denial_journals_every_decision_with_the_run_end(many: Project) -> None:
    from planrun import api
    from planrun.approval import ScriptedApprover
    from planrun.errors import ApprovalError

    answers = {f"d{i}": i != STEPS - 1 for i in range(STEPS)}  # no to the last
    with pytest.raises(ApprovalError) as denied:
        execute_plan(many, "many", approver=ScriptedApprover(answers, who="tester"))
    assert denied.value.code == "approval_denied"
    run_id = denied.value.run_id
    assert run_id is not None
    m = api.status(many.settings(), run_id)
    assert m["status"] == "denied", m
    kinds = [e["kind"] for e in run_events(many, run_id)]
    assert kinds.count("approval_required") == STEPS
    assert kinds.count("approval_granted") == STEPS - 1
    assert kinds.count("approval_denied") == 1
    assert kinds[-1] == "run_finished"
    assert not any(s["status"] == "succeeded" for s in by_step(m).values())
