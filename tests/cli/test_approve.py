"""Waiting for a person (SPEC §10): ``execute --defer-approval``, ``approve``, ``deny``,
and ``resume`` of a run ``awaiting_approval``.

Everything goes through the real ``planrun`` process without a terminal (stdin is not a
TTY), with the side-effect counting tools of ``tests/crashtools.py``: an effect in the log
means the tool really ran. The questions on a real terminal are in
``tests/test_approval_tty.py``.
"""

from __future__ import annotations

import getpass
import subprocess
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from planrun_cli import PLANRUN, CliProject, Result

TOOLS = """
tools:
  src:
    python: crashtools:record
    arguments:
      type: object
      properties: {label: {type: string}}
      additionalProperties: false
  danger:
    description: An effect that cannot be undone
    python: crashtools:record
    irreversible: true
    arguments:
      type: object
      properties: {label: {type: string}}
      additionalProperties: false
  wipe:
    python: crashtools:record
    irreversible: true
    arguments:
      type: object
      properties: {label: {type: string}}
      additionalProperties: false
  flaky:
    description: Fails until its file exists
    python: crashtools:flaky
    arguments:
      type: object
      properties: {file: {type: string}}
      additionalProperties: false
"""

#: ``danger`` registered differently (one more optional argument): a new digest.
TOOLS_CHANGED = TOOLS.replace(
    "      properties: {label: {type: string}}\n      additionalProperties: false\n  wipe:",
    "      properties: {label: {type: string}, note: {type: string}}\n"
    "      additionalProperties: false\n  wipe:")

TWO = """
planrun: 1
goal: Prepare, then two effects that cannot be undone
steps:
  - {id: prep, tool: src, arguments: {label: prep}}
  - id: drop
    tool: danger
    depends_on: [prep]
    arguments: {label: drop}
    intent: Remove the old thing for good
  - {id: purge, tool: wipe, depends_on: [drop], arguments: {label: purge}}
"""

SAFE = """
planrun: 1
goal: Nothing that needs a person
steps:
  - {id: prep, tool: src, arguments: {label: prep}}
"""


@pytest.fixture
def proj(cli: CliProject) -> CliProject:
    assert TOOLS_CHANGED != TOOLS
    cli.tools(TOOLS)
    cli.plan("two", TWO)
    cli.plan("safe", SAFE)
    return cli


def refused(r: Result, code: str, exit_code: int) -> None:
    """Exit status, one ``error[code]`` line on stderr, no traceback."""
    assert r.returncode == exit_code, r
    assert f"error[{code}]" in r.stderr, r
    assert "Traceback" not in r.stderr + r.stdout, r


def defer(proj: CliProject, *extra: str) -> dict[str, Any]:
    """``execute two --defer-approval --json`` left waiting: its manifest."""
    r = proj.run("execute", "two", "--defer-approval", "--json", *extra)
    assert r.returncode == 4, r
    m: dict[str, Any] = r.json
    assert m["status"] == "awaiting_approval", r
    return m


def status(proj: CliProject, run_id: str) -> dict[str, Any]:
    r = proj.run("status", run_id, "--json")
    assert r.returncode == 0, r
    return r.json  # type: ignore[no-any-return]


def kinds(proj: CliProject, run_id: str) -> list[tuple[str, str | None]]:
    return [(e.kind, e.step) for e in proj.probe().events(run_id)]


def waiting(m: dict[str, Any]) -> list[str]:
    return [w["step"] for w in m["approval"]["waiting"]]


# --- execute --defer-approval ----------------------------------------------------------------


def test_defer_leaves_the_run_waiting_with_nothing_run(proj: CliProject) -> None:
    r = proj.run("execute", "two", "--defer-approval", "--json")
    assert r.returncode == 4, r
    m = r.json
    run_id = m["run_id"]
    assert m["status"] == "awaiting_approval"
    assert m["counts"]["pending"] == 3
    assert m["counts"]["succeeded"] == 0
    assert {s["status"] for s in m["steps"]} == {"pending"}
    assert m["finished_at"] is None
    assert m["resumable"] is True
    assert m["approval"] == {
        "waiting": [{"step": "drop", "tool": "danger", "reason": "irreversible"},
                    {"step": "purge", "tool": "wipe", "reason": "irreversible"}],
        "approve": f"planrun approve {run_id} drop purge",
        "deny": f"planrun deny {run_id}",
        "resume": f"planrun resume {run_id}"}
    assert m["next"] == f"planrun approve {run_id} drop purge"
    # the person reading a cron mail gets the commands on stderr too
    assert "awaiting_approval" in r.stderr
    assert f"planrun approve {run_id} drop purge" in r.stderr
    assert f"planrun deny {run_id}" in r.stderr
    assert proj.calls() == []  # nothing ran, not even the step before the gate
    assert proj.probe().run(run_id).status == "awaiting_approval"
    assert proj.probe().lease(run_id) is None  # nobody drives it now
    assert proj.probe().approvals(run_id) == []
    events = kinds(proj, run_id)
    assert ("approval_required", "drop") in events
    assert ("approval_required", "purge") in events
    assert events[-1] == ("run_finished", None)
    assert proj.probe().events(run_id)[-1].data["status"] == "awaiting_approval"


def test_defer_without_json_prints_the_manifest_and_the_commands(proj: CliProject) -> None:
    r = proj.run("execute", "two", "--defer-approval")
    assert r.returncode == 4, r
    run_id = proj.probe().run_ids()[0]
    assert "awaiting_approval" in r.stdout
    assert "waiting for approval: drop (danger), purge (wipe)" in r.stdout
    assert f"approve: planrun approve {run_id} drop purge" in r.stdout
    assert "Traceback" not in r.stderr


def test_status_runs_and_log_show_an_awaiting_run(proj: CliProject) -> None:
    run_id = defer(proj)["run_id"]
    proj.run("execute", "safe")
    assert status(proj, run_id)["status"] == "awaiting_approval"
    r = proj.run("runs", "--status", "awaiting_approval", "--json")
    assert r.returncode == 0, r
    assert [row["run_id"] for row in r.json] == [run_id]
    r = proj.run("log", run_id)
    assert r.returncode == 0, r
    assert "approval_required" in r.stdout
    assert "awaiting_approval" in r.stdout


def test_flags_clear_what_they_cover_and_only_the_rest_waits(proj: CliProject) -> None:
    m = defer(proj, "--approve", "drop")
    assert waiting(m) == ["purge"]
    [decision] = proj.probe().approvals(m["run_id"])
    assert (decision.step_id, decision.granted, decision.method) == ("drop", True, "flag")
    r = proj.run("execute", "two", "--defer-approval", "--approve-all", "--json")
    assert r.returncode == 0, r
    assert r.json["status"] == "completed"
    assert "approval" not in r.json
    assert proj.counts() == {"prep": 1, "drop": 1, "purge": 1}


def test_a_grant_clears_what_it_covers_and_only_the_rest_waits(proj: CliProject) -> None:
    expires = (datetime.now(UTC) + timedelta(days=1)).isoformat(timespec="seconds")
    proj.write("planrun.toml", f"""
        [[policy.grants]]
        id = "nightly-wipe"
        tool = "wipe"
        expires = "{expires}"
        granted_by = "ops@example.com"
        """)
    m = defer(proj)
    assert waiting(m) == ["drop"]
    [decision] = proj.probe().approvals(m["run_id"])
    assert (decision.step_id, decision.method, decision.decided_by) == (
        "purge", "grant", "nightly-wipe")
    r = proj.run("approve", m["run_id"], "drop", "--resume", "--json")
    assert r.returncode == 0, r
    assert r.json["status"] == "completed"
    assert proj.counts() == {"prep": 1, "drop": 1, "purge": 1}


def test_a_grant_removed_before_resume_leaves_its_step_waiting(proj: CliProject) -> None:
    expires = (datetime.now(UTC) + timedelta(days=1)).isoformat(timespec="seconds")
    proj.write("planrun.toml", f"""
        [[policy.grants]]
        id = "nightly-wipe"
        tool = "wipe"
        expires = "{expires}"
        granted_by = "ops@example.com"
        """)
    run_id = defer(proj)["run_id"]
    assert proj.run("approve", run_id, "drop").returncode == 0
    proj.write("planrun.toml", "")  # the grant is gone: it clears nothing any more
    r = proj.run("resume", run_id, "--defer-approval", "--json")
    assert r.returncode == 4, r
    assert waiting(r.json) == ["purge"]
    assert waiting(status(proj, run_id)) == ["purge"]
    assert proj.calls() == []


def test_defer_with_nothing_to_clear_just_runs(proj: CliProject) -> None:
    r = proj.run("execute", "safe", "--defer-approval", "--json")
    assert r.returncode == 0, r
    assert r.json["status"] == "completed"
    assert proj.counts() == {"prep": 1}


def test_without_defer_nothing_changes_denied_and_exit_4(proj: CliProject) -> None:
    r = proj.run("execute", "two")
    refused(r, "approval_required", 4)
    assert proj.probe().run().status == "denied"


# --- approve off a terminal -------------------------------------------------------------------


def test_approve_with_step_names_journals_like_execute_and_resume_reuses(
        proj: CliProject) -> None:
    run_id = defer(proj)["run_id"]
    required = {e.step: e.data["digest"] for e in proj.probe().events(run_id)
                if e.kind == "approval_required"}
    r = proj.run("approve", run_id, "drop", "--reason", "ticket 42")
    assert r.returncode == 0, r
    assert f"run {run_id}: approved drop" in r.stdout
    assert f"next: planrun approve {run_id} purge" in r.stdout
    assert proj.calls() == []
    m = status(proj, run_id)
    assert m["status"] == "awaiting_approval"
    assert waiting(m) == ["purge"]
    r = proj.run("approve", run_id, "purge", "--json")
    assert r.returncode == 0, r
    assert r.json == {"run_id": run_id, "status": "awaiting_approval", "approved": ["purge"],
                      "already": [], "waiting": [], "next": f"planrun resume {run_id}"}
    decisions = proj.probe().approvals(run_id)
    assert [(d.step_id, d.tool, d.granted, d.method, d.reason) for d in decisions] == [
        ("drop", "danger", True, "flag", "ticket 42"), ("purge", "wipe", True, "flag", None)]
    assert all(d.digest == required[d.step_id] for d in decisions)
    assert {d.decided_by for d in decisions} == {getpass.getuser()}
    assert all(d.decided_at for d in decisions)
    # resume without a terminal and without flags: the journaled decisions clear it
    r = proj.run("resume", run_id, "--json")
    assert r.returncode == 0, r
    assert r.json["status"] == "completed"
    assert proj.counts() == {"prep": 1, "drop": 1, "purge": 1}
    after = kinds(proj, run_id)
    resumed = after.index(("run_resumed", None))
    assert not [k for k in after[resumed:] if k[0].startswith("approval_")]


def test_approve_all_then_resume(proj: CliProject) -> None:
    run_id = defer(proj)["run_id"]
    r = proj.run("approve", run_id, "--all", "--json")
    assert r.returncode == 0, r
    assert r.json["approved"] == ["drop", "purge"]
    assert proj.calls() == []
    r = proj.run("resume", run_id)
    assert r.returncode == 0, r
    assert proj.counts() == {"prep": 1, "drop": 1, "purge": 1}


def test_approve_resume_continues_at_once(proj: CliProject) -> None:
    run_id = defer(proj)["run_id"]
    r = proj.run("approve", run_id, "--all", "--resume", "--json")
    assert r.returncode == 0, r
    assert r.json["status"] == "completed"
    assert r.json["run_id"] == run_id
    assert proj.counts() == {"prep": 1, "drop": 1, "purge": 1}


def test_approve_off_a_terminal_with_nothing_named_is_exit_4_and_changes_nothing(
        proj: CliProject) -> None:
    run_id = defer(proj)["run_id"]
    r = proj.run("approve", run_id)
    refused(r, "approval_required", 4)
    assert f"planrun approve {run_id} drop purge" in r.stderr
    assert proj.probe().approvals(run_id) == []
    assert proj.probe().run(run_id).status == "awaiting_approval"
    # a stdin that is a pipe nobody ever writes to or closes: still no waiting on it
    proc = subprocess.Popen([*PLANRUN, "approve", run_id, "--json"], cwd=proj.root,
                            env=proj.env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    proj.procs.append(proc)
    try:
        assert proc.wait(timeout=30) == 4
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
    out = proc.stdout.read().decode() if proc.stdout else ""
    assert '"approval_required"' in out


def test_approve_names_a_step_the_run_lacks_or_one_needing_nothing(
        proj: CliProject) -> None:
    run_id = defer(proj)["run_id"]
    r = proj.run("approve", run_id, "nosuch", "drop")
    refused(r, "unknown_step", 2)
    assert proj.probe().approvals(run_id) == []
    r = proj.run("approve", run_id, "prep", "--json")  # needs no approval: harmless
    assert r.returncode == 0, r
    assert r.json["approved"] == []
    assert r.json["already"] == ["prep"]
    assert proj.probe().approvals(run_id) == []
    r = proj.run("approve", run_id, "drop", "--all")
    refused(r, "usage", 2)


def test_approve_or_deny_a_run_that_does_not_wait(proj: CliProject) -> None:
    r = proj.run("execute", "safe", "--json")
    done = r.json["run_id"]
    for argv in (("approve", done, "--all"), ("deny", done)):
        r = proj.run(*argv)
        refused(r, "not_awaiting_approval", 5)
    r = proj.run("approve", "ffffffffffff", "--all")
    refused(r, "unknown_run", 5)


# --- deny ---------------------------------------------------------------------------------------


def test_deny_ends_the_run_denied_and_resume_refuses_it(proj: CliProject) -> None:
    run_id = defer(proj, "--approve", "drop")["run_id"]
    r = proj.run("deny", run_id, "--reason", "not tonight", "--json")
    assert r.returncode == 0, r
    assert r.json["status"] == "denied"
    assert r.json["resumable"] is False
    assert "approval" not in r.json
    decisions = proj.probe().approvals(run_id)
    assert [(d.step_id, d.granted, d.method) for d in decisions] == [
        ("drop", True, "flag"), ("purge", False, "flag")]
    assert decisions[-1].reason == "not tonight"
    assert ("approval_denied", "purge") in kinds(proj, run_id)
    assert proj.probe().run(run_id).finished_at is not None
    refused(proj.run("resume", run_id), "run_not_resumable", 5)
    refused(proj.run("approve", run_id, "--all"), "not_awaiting_approval", 5)
    refused(proj.run("deny", run_id), "not_awaiting_approval", 5)
    assert proj.calls() == []


# --- resume of an awaiting run ------------------------------------------------------------------


def test_resume_does_not_pick_an_awaiting_run_by_default(proj: CliProject) -> None:
    run_id = defer(proj)["run_id"]
    refused(proj.run("resume"), "run_not_resumable", 5)
    assert proj.probe().run(run_id).status == "awaiting_approval"
    assert proj.calls() == []


def test_resume_asks_for_what_is_missing_or_defers_again(proj: CliProject) -> None:
    run_id = defer(proj)["run_id"]
    r = proj.run("approve", run_id, "drop")
    assert r.returncode == 0, r
    # no terminal, no flag: exit 4, and the run still waits (not denied)
    r = proj.run("resume", run_id)
    refused(r, "approval_required", 4)
    assert "purge" in r.stderr
    assert proj.probe().run(run_id).status == "awaiting_approval"
    # --defer-approval: waits again, for purge only
    r = proj.run("resume", run_id, "--defer-approval", "--json")
    assert r.returncode == 4, r
    assert r.json["status"] == "awaiting_approval"
    assert waiting(r.json) == ["purge"]
    # flags at resume clear the rest
    r = proj.run("resume", run_id, "--approve", "purge", "--json")
    assert r.returncode == 0, r
    assert proj.counts() == {"prep": 1, "drop": 1, "purge": 1}


def test_resume_explain_names_the_steps_waiting(proj: CliProject) -> None:
    run_id = defer(proj, "--approve", "drop")["run_id"]
    r = proj.run("resume", "--explain", run_id, "--json")
    assert r.returncode == 0, r
    actions = {s["step"]: s["action"] for s in r.json["steps"]}
    assert actions == {"prep": "run", "drop": "run", "purge": "ask"}
    assert waiting(r.json) == ["purge"]
    r = proj.run("resume", "--explain", run_id)
    assert r.returncode == 0, r
    assert f"planrun approve {run_id} purge" in r.stdout


def test_a_registration_change_between_approve_and_resume_asks_again(
        proj: CliProject) -> None:
    run_id = defer(proj)["run_id"]
    assert proj.run("approve", run_id, "--all").returncode == 0
    proj.tools(TOOLS_CHANGED)  # danger's contract changed; the plan is still valid
    r = proj.run("resume", run_id)
    refused(r, "approval_required", 4)
    assert "drop" in r.stderr
    assert proj.calls() == []
    r = proj.run("resume", run_id, "--defer-approval", "--json")
    assert r.returncode == 4, r
    assert waiting(r.json) == ["drop"]  # purge's decision still matches
    r = proj.run("approve", run_id, "drop", "--resume", "--json")
    assert r.returncode == 0, r
    assert proj.counts() == {"prep": 1, "drop": 1, "purge": 1}


# --- crashes and races ---------------------------------------------------------------------------


def test_sigkill_between_approve_and_resume_loses_nothing(proj: CliProject) -> None:
    run_id = defer(proj)["run_id"]
    # killed (SIGKILL, for real) after the decisions are journaled, before the run starts
    r = proj.run("approve", run_id, "--all", "--resume", crash="approved:now")
    assert r.returncode == -9, r
    assert proj.calls() == []
    assert proj.probe().run(run_id).status == "awaiting_approval"
    assert [d.step_id for d in proj.probe().approvals(run_id)] == ["drop", "purge"]
    before = len(proj.probe().approvals(run_id))
    r = proj.run("resume", run_id, "--json")  # no terminal, no flags: nothing to ask
    assert r.returncode == 0, r
    assert r.json["status"] == "completed"
    assert len(proj.probe().approvals(run_id)) == before
    assert proj.counts() == {"prep": 1, "drop": 1, "purge": 1}


def test_approve_refuses_while_a_live_process_holds_the_lease(proj: CliProject) -> None:
    from planrun.journal import Journal
    from planrun.journal.store import lease_owner

    run_id = defer(proj)["run_id"]
    with Journal(proj.journal, write=True) as journal:  # this test process: a live holder
        journal.take_lease(run_id, lease_owner(), statuses=("awaiting_approval",))
        for argv in (("approve", run_id, "--all"), ("deny", run_id),
                     ("resume", run_id, "--approve-all")):
            refused(proj.run(*argv), "run_busy", 5)
        journal.release_lease(run_id)
    assert proj.probe().approvals(run_id) == []
    assert proj.probe().run(run_id).status == "awaiting_approval"
    assert proj.calls() == []


def test_two_approve_resume_at_once_run_each_effect_once(proj: CliProject) -> None:
    run_id = defer(proj)["run_id"]
    procs = [proj.start("approve", run_id, "--all", "--resume", "--json", name=f"p{i}")
             for i in range(2)]
    results = [proj.finish(p) for p in procs]
    # one drives it; the other finds it decided, driven (run_busy) or done: exit 5
    assert sorted(r.returncode for r in results) == [0, 5], results
    for r in results:
        assert "Traceback" not in r.stderr, r
    assert proj.probe().run(run_id).status == "completed"
    assert proj.counts() == {"prep": 1, "drop": 1, "purge": 1}
    granted = [d.step_id for d in proj.probe().approvals(run_id) if d.granted]
    assert sorted(granted) == ["drop", "purge"]  # each decided once


# --- the api (what the MCP server calls) ------------------------------------------------------


def test_api_execute_defer_approval_never_asks_and_reports_exit_4(proj: CliProject) -> None:
    from planrun import api
    from planrun.approval import ScriptedApprover

    asked: list[str] = []

    class Recording(ScriptedApprover):
        def decide(self, requests: Any) -> Any:
            asked.extend(r.step_id for r in requests)
            return super().decide(requests)

    settings = api.load_settings(project=proj.root)
    outcome = api.execute(settings, "two", api.param_input([], None),
                          approver=Recording({"drop": True, "purge": True}),
                          defer_approval=True)
    assert isinstance(outcome, api.RunOutcome)
    assert asked == []  # deferring: the approver is not used, even when there is one
    assert outcome.status == "awaiting_approval"
    assert outcome.exit_code == 4
    run_id = outcome.manifest["run_id"]
    assert outcome.manifest["approval"]["approve"] == f"planrun approve {run_id} drop purge"
    decided = api.approve(settings, run_id, ["drop", "purge"])
    assert decided["waiting"] == []
    outcome = api.resume(settings, run_id, defer_approval=True)
    assert outcome.exit_code == 0, outcome.manifest
    assert proj.counts() == {"prep": 1, "drop": 1, "purge": 1}


def test_deny_writes_its_denials_and_the_runs_end_at_once(
        tmp_path: Any, sqlite_commits: list[int]) -> None:
    """Found by an attacker: each denial was a transaction of its own, and the run ended in
    another; killed between them, the run stayed waiting with some of its steps denied.
    Now the denials of every waiting step and the run's end share one transaction: the
    transactions ``deny`` makes do not grow with the steps it denies."""
    from conftest import Project
    from planrun import api
    from planrun.validation import ParamInput

    made: list[int] = []
    approvals: list[int] = []
    for waiting_steps in (1, 4):
        project = Project(tmp_path / f"p{waiting_steps}")
        project.root.mkdir()
        project.write_tools("""\
            tools:
              danger:
                description: An effect that cannot be undone
                python: basictools:echo
                irreversible: true
                arguments: {type: object}
            """)
        steps = "".join(f"  - {{id: d{i}, tool: danger, arguments: {{n: {i}}}}}\n"
                        for i in range(waiting_steps))
        project.write("plans/w.yaml", f"planrun: 1\ngoal: effects\nsteps:\n{steps}")
        settings = project.settings()
        out = api.execute(settings, "w", ParamInput(), defer_approval=True)
        assert isinstance(out, api.RunOutcome)
        run_id = out.manifest["run_id"]
        assert out.manifest["status"] == "awaiting_approval"
        before = len(sqlite_commits)
        m = api.deny(settings, run_id, reason="not tonight")
        made.append(len(sqlite_commits) - before)
        # approve too: its decisions in one transaction (a second run of the plan)
        again = api.execute(settings, "w", ParamInput(), defer_approval=True)
        assert isinstance(again, api.RunOutcome)
        before = len(sqlite_commits)
        approved = api.approve(settings, again.manifest["run_id"], approve_all=True)
        approvals.append(len(sqlite_commits) - before)
        assert len(approved["approved"]) == waiting_steps
        assert m["status"] == "denied"
        events = [e["kind"] for e in api.log(settings, run_id)[1]]
        assert events.count("approval_denied") == waiting_steps
        # the denials come just before the run's end, in one transaction
        assert events[-1] == "run_finished"
    assert made[0] == made[1], made  # was 1 + one per step
    assert approvals[0] == approvals[1], approvals


# --- retry --defer-approval -------------------------------------------------------------------

FAILS_BEFORE_DROP = """
planrun: 1
goal: Prepare, check, then an effect that cannot be undone
steps:
  - {id: prep, tool: src, arguments: {label: prep}}
  - {id: check, tool: flaky, depends_on: [prep], arguments: {file: fixed.flag}}
  - {id: drop, tool: danger, depends_on: [check], arguments: {label: drop}}
"""


def test_retry_defer_approval_leaves_the_child_waiting_for_a_person(proj: CliProject
                                                                     ) -> None:
    """A nightly retry with nobody at hand: the child waits (exit 4), inheriting what
    succeeded; a second retry of the parent is refused while it waits; approve and resume
    finish it, and prep ran once."""
    proj.plan("gated", FAILS_BEFORE_DROP)
    first = proj.run("execute", "gated", "--approve", "drop", "--json")
    assert first.returncode == 1, first
    parent = first.json["run_id"]
    r = proj.run("retry", parent, "--defer-approval", "--json")
    assert r.returncode == 4, r
    child = r.json
    assert child["status"] == "awaiting_approval"
    assert waiting(child) == ["drop"]
    assert child["approval"]["resume"] == f"planrun resume {child['run_id']}"
    assert {s["id"]: s["status"] for s in child["steps"]} == {
        "prep": "succeeded", "check": "pending", "drop": "pending"}
    assert proj.probe().lease(child["run_id"]) is None
    assert proj.probe().run(parent).status == "failed"
    # what stderr says ran: nothing (prep is kept from the parent, not run again)
    assert f"nothing ran (1 succeeded step(s) kept from run {parent})" in r.stderr, r
    assert "approve: resolved" not in r.stderr
    again = proj.run("retry", parent)
    refused(again, "run_busy", 5)
    assert child["run_id"] in again.stderr
    assert f"planrun approve {child['run_id']}" in again.stderr
    (proj.root / "fixed.flag").write_text("")
    assert proj.run("approve", child["run_id"], "--all").returncode == 0
    done = proj.run("resume", child["run_id"], "--json")
    assert done.returncode == 0, done
    assert done.json["status"] == "completed"
    assert proj.counts()["prep"] == 1
    assert proj.counts()["drop"] == 1


def test_a_run_ended_before_its_first_step_is_named_on_its_error_line(proj: CliProject
                                                                      ) -> None:
    """A run denied at approval, or a plan refused, is journaled with a run id and has no
    other line: its one error line names it, so a log several cron jobs share splits by
    run id (found by a fresh operator)."""
    denied = proj.run("execute", "two")
    assert denied.returncode == 4, denied
    runs = proj.run("runs", "--json")
    (row,) = [r for r in runs.json if r["status"] == "denied"]
    line = next(x for x in denied.stderr.splitlines() if "error[approval_required]" in x)
    assert line.endswith(f"(run {row['run_id']})"), line
    proj.plan("bad", "planrun: 1\ngoal: a tool nobody has\nsteps:\n"
                     "  - {id: a, tool: nope, arguments: {}}\n")
    refused_ = proj.run("execute", "bad")
    assert refused_.returncode == 3, refused_
    (bad,) = [r for r in proj.run("runs", "--json").json if r["status"] == "refused"]
    line = next(x for x in refused_.stderr.splitlines() if x.startswith("planrun: error["))
    assert line.endswith(f"(run {bad['run_id']})"), line
