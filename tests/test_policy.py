"""Policy and autonomy (SPEC §6, issue 5): allowlist, ladder, grants with limits, secrets.

Process-level tests run the real ``planrun`` (``python -m planrun``) in a project folder;
every tool call appends a line to ``calls.log`` so a test can tell what really ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from harness import run_planrun
from planrun import redact
from planrun.policy import Covered, Policy, grant_for, lint, load_policy

TOOLS_MODULE = '''
import json, os

def _log(name, payload):
    with open(os.path.join(os.environ["CALLS_DIR"], "calls.log"), "a") as fh:
        fh.write(name + " " + json.dumps(payload, sort_keys=True) + "\\n")

def record(name, **kwargs):
    _log(name, kwargs)
    return {"name": name, **kwargs}

def pay(name, amount, **kwargs):
    _log(name, {"amount": amount, **kwargs})
    return {"paid": amount}

def echo_secret(name, token):
    _log(name, {"len": len(token)})
    return {"echo": "token was " + token}

def boom(token):
    raise RuntimeError("cannot log in with " + token)
'''

TOOLS_YAML = """
tools:
  record:
    python: ptools:record
    idempotent: true
    arguments:
      type: object
      properties: {name: {type: string}, note: {type: string}}
      required: [name]
      additionalProperties: false
  delete_thing:
    python: ptools:record
    irreversible: true
    arguments:
      type: object
      properties: {name: {type: string}, note: {type: string}}
      required: [name]
      additionalProperties: false
  pay:
    python: ptools:pay
    arguments:
      type: object
      properties: {name: {type: string}, amount: {type: number}, to: {type: string}}
      required: [name, amount]
      additionalProperties: false
  echo_secret:
    python: ptools:echo_secret
    arguments:
      type: object
      properties: {name: {type: string}, token: {type: string}}
      required: [name, token]
      additionalProperties: false
  boom:
    python: ptools:boom
    arguments:
      type: object
      properties: {token: {type: string}}
      required: [token]
      additionalProperties: false
"""

CLEANUP = """
planrun: 1
goal: Prepare, then delete something
steps:
  - id: prepare
    tool: record
    arguments: {name: prepare}
  - id: drop
    tool: delete_thing
    depends_on: [prepare]
    arguments: {name: drop}
"""

PAYMENTS = """
planrun: 1
goal: Pay two invoices
steps:
  - id: first
    tool: pay
    arguments: {name: first, amount: 40, to: acme}
  - id: second
    tool: pay
    depends_on: [first]
    arguments: {name: second, amount: 50, to: acme}
"""


def iso(delta: timedelta) -> str:
    return (datetime.now(UTC) + delta).isoformat(timespec="seconds")


class Proj:
    """A project folder driven through the real planrun process."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "plans").mkdir(parents=True)
        (root / "ptools.py").write_text(TOOLS_MODULE)
        (root / "tools.yaml").write_text(TOOLS_YAML)
        self.journal = root / "journal.sqlite3"

    def plan(self, name: str, text: str) -> None:
        (self.root / "plans" / f"{name}.yaml").write_text(text)

    def config(self, text: str) -> None:
        (self.root / "planrun.toml").write_text(text)

    def run(self, *args: str, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
        full = dict(os.environ, PLANRUN_JOURNAL=str(self.journal), CALLS_DIR=str(self.root),
                    **(env or {}))
        return run_planrun(*args, cwd=self.root, env=full)

    def calls(self) -> list[str]:
        log = self.root / "calls.log"
        return [line.split()[0] for line in log.read_text().splitlines()] if log.exists() \
            else []

    def events(self, run_id: str) -> list[dict[str, Any]]:
        res = self.run("log", run_id, "--json")
        assert res.returncode == 0, res.stderr
        return list(json.loads(res.stdout))


@pytest.fixture
def proj(tmp_path: Path) -> Proj:
    return Proj(tmp_path / "p")


def grant_toml(gid: str = "g1", *, tool: str = "delete_thing", expires: str | None = None,
               arguments: str | None = None, extra: str = "") -> str:
    lines = [
        "[[policy.grants]]",
        f'id = "{gid}"',
        f'tool = "{tool}"',
        f'expires = "{expires or iso(timedelta(days=1))}"',
        'granted_by = "ops@example.com"',
    ]
    if arguments:
        lines.append(f"arguments = {arguments}")
    return "\n".join(lines) + "\n" + extra


# --- the allowlist and the ladder, before anything runs ---------------------------------


def test_allowlist_refuses_before_anything_runs(proj: Proj) -> None:
    proj.plan("cleanup", CLEANUP)
    proj.config('[policy]\nallowed_tools = ["record"]\n')
    res = proj.run("execute", "cleanup", "--approve-all", "--json")
    assert res.returncode == 3
    assert "not_allowed" in res.stdout + res.stderr
    assert proj.calls() == []
    res = proj.run("validate", "cleanup", "--format", "json")
    issues = json.loads(res.stdout)["plans"][0]["issues"]
    assert [(i["code"], i["step"], i["path"]) for i in issues] == [
        ("not_allowed", "drop", "/steps/1/tool")]


def test_allowlist_entry_naming_an_unregistered_tool_is_a_config_error(proj: Proj) -> None:
    proj.plan("cleanup", CLEANUP)
    proj.config('[policy]\nallowed_tools = ["record", "recrod"]\n')
    res = proj.run("validate", "cleanup")
    assert res.returncode == 3
    assert "config" in res.stdout
    assert "recrod" in res.stdout


def test_refuse_class_fails_validation_and_is_journaled(proj: Proj) -> None:
    proj.plan("cleanup", CLEANUP)
    proj.config('[policy.classes.danger]\ntools = ["delete_thing"]\nlevel = "refuse"\n')
    res = proj.run("execute", "cleanup", "--approve-all")
    assert res.returncode == 3
    assert "refused" in res.stderr
    assert proj.calls() == []
    runs = json.loads(proj.run("runs", "--json").stdout)
    assert runs[0]["status"] == "refused"
    kinds = [e["kind"] for e in proj.events(runs[0]["run_id"])]
    assert kinds == ["plan_refused", "autonomy_refused"]


def test_escalate_class_needs_a_person_even_with_a_grant(proj: Proj) -> None:
    proj.plan("pay", PAYMENTS)
    proj.config('[policy.classes.money]\ntools = ["pay"]\nlevel = "escalate"\n'
                + grant_toml(tool="pay"))
    res = proj.run("execute", "pay")
    assert res.returncode == 4
    assert "first" in res.stderr
    assert "--approve" in res.stderr
    assert proj.calls() == []


def test_act_class_without_grant_escalates_to_exit_4_without_terminal(proj: Proj) -> None:
    proj.plan("pay", PAYMENTS)
    proj.config('[policy.classes.money]\ntools = ["pay"]\nlevel = "act"\n')
    res = proj.run("execute", "pay")
    assert res.returncode == 4
    assert proj.calls() == []
    run_id = json.loads(proj.run("runs", "--json").stdout)[0]["run_id"]
    kinds = [e["kind"] for e in proj.events(run_id)]
    assert kinds.count("autonomy_escalated") == 2


def test_act_class_escalates_to_the_prompt_on_a_terminal(proj: Proj) -> None:
    pexpect = pytest.importorskip("pexpect")
    proj.plan("pay", PAYMENTS)
    proj.config('[policy.classes.money]\ntools = ["pay"]\nlevel = "act"\n')
    env = dict(os.environ, PLANRUN_JOURNAL=str(proj.journal), CALLS_DIR=str(proj.root),
               NO_COLOR="1")
    child = pexpect.spawn(sys.executable, ["-m", "planrun", "execute", "pay"],
                          cwd=str(proj.root), env=env, encoding="utf-8", timeout=30,
                          dimensions=(50, 200))
    child.expect(r"Approve first \(pay\)\? \[y/N\]")
    child.sendline("y")
    child.expect(r"Approve second \(pay\)\? \[y/N\]")
    child.sendline("y")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert proj.calls() == ["first", "second"]


# --- grants ------------------------------------------------------------------------------------


def test_grant_within_limits_acts_unattended(proj: Proj) -> None:
    proj.plan("pay", PAYMENTS)
    proj.config('[policy.classes.money]\ntools = ["pay"]\nlevel = "act"\n'
                + grant_toml("nightly", tool="pay",
                             arguments='{type = "object", properties = {to = {const = "acme"}}}',
                             extra='max_total = 100\namount_field = "amount"\n'))
    res = proj.run("execute", "pay", "--json")
    assert res.returncode == 0, res.stderr
    manifest = json.loads(res.stdout)
    assert [s["approved_by"] for s in manifest["steps"]] == ["nightly", "nightly"]
    assert proj.calls() == ["first", "second"]
    grants = [e for e in proj.events(manifest["run_id"]) if e["kind"] == "approval_granted"]
    assert {e["data"]["method"] for e in grants} == {"grant"}


@pytest.mark.parametrize(("case", "config_extra"), [
    ("expired", {"expires": iso(timedelta(seconds=-5))}),
    ("arguments", {"arguments": '{type = "object", properties = {to = {const = "other"}}}'}),
    ("max_total", {"extra": 'max_total = 60\namount_field = "amount"\n'}),
])
def test_grant_that_does_not_cover_escalates(proj: Proj, case: str,
                                             config_extra: dict[str, str]) -> None:
    proj.plan("pay", PAYMENTS)
    proj.config('[policy.classes.money]\ntools = ["pay"]\nlevel = "act"\n'
                + grant_toml("nightly", tool="pay", **config_extra))
    res = proj.run("execute", "pay")
    assert res.returncode == 4, (case, res.stdout, res.stderr)
    assert proj.calls() == []
    run_id = json.loads(proj.run("runs", "--json").stdout)[0]["run_id"]
    whys = [e["data"]["why"] for e in proj.events(run_id) if e["kind"] == "autonomy_escalated"]
    assert whys, case
    expected = {"expired": "expired", "arguments": "arguments leave",
                "max_total": "over max_total"}[case]
    assert expected in whys[0]
    # and the same run with a person's flag goes through
    res = proj.run("execute", "pay", "--approve-all")
    assert res.returncode == 0
    assert proj.calls() == ["first", "second"]


def test_grant_clears_an_irreversible_tool(proj: Proj) -> None:
    proj.plan("cleanup", CLEANUP)
    proj.config(grant_toml("drop-ok", arguments='{type = "object", '
                           'properties = {name = {const = "drop"}}}'))
    res = proj.run("execute", "cleanup", "--json")
    assert res.returncode == 0, res.stderr
    steps = {s["id"]: s for s in json.loads(res.stdout)["steps"]}
    assert steps["drop"]["approved_by"] == "drop-ok"


def test_grant_over_run_time_arguments_does_not_clear(proj: Proj) -> None:
    proj.plan("cleanup", """
        planrun: 1
        goal: Delete what an earlier step names
        steps:
          - id: prepare
            tool: record
            arguments: {name: prepare}
          - id: drop
            tool: delete_thing
            depends_on: [prepare]
            arguments: {name: "{steps.prepare.output.name}"}
        """.replace("\n        ", "\n"))
    proj.config(grant_toml("drop-ok", arguments='{type = "object", '
                           'properties = {name = {const = "prepare"}}}'))
    res = proj.run("execute", "cleanup")
    assert res.returncode == 4
    assert proj.calls() == []


def test_fan_out_items_count_towards_max_total(proj: Proj) -> None:
    proj.plan("fan", """
        planrun: 1
        goal: Pay each invoice of a literal list
        steps:
          - id: each
            tool: pay
            for_each: [{n: a, amount: 30}, {n: b, amount: 30}, {n: c, amount: 30}]
            arguments: {name: "{item.n}", amount: "{item.amount}"}
        """.replace("\n        ", "\n"))
    act = '[policy.classes.money]\ntools = ["pay"]\nlevel = "act"\n'
    proj.config(act + grant_toml("fan", tool="pay",
                                 extra='max_total = 80\namount_field = "amount"\n'))
    res = proj.run("execute", "fan")
    assert res.returncode == 4
    assert "over max_total" in proj.run("log", json.loads(proj.run(
        "runs", "--json").stdout)[0]["run_id"]).stdout
    proj.config(act + grant_toml("fan", tool="pay",
                                 extra='max_total = 90\namount_field = "amount"\n'))
    res = proj.run("execute", "fan")
    assert res.returncode == 0, res.stderr
    assert sorted(proj.calls()) == ["a", "b", "c"]


# --- approvals bound to digests on resume ----------------------------------------------------


def test_an_approval_binds_to_the_secret_by_reference_not_by_value(proj: Proj) -> None:
    """Approval digests are over the reference form (SPEC §7): nothing to guess from."""
    proj.plan("wipe", """
        planrun: 1
        goal: Wait, then delete with a secret in the arguments
        params:
          token: {type: string, secret: true}
        steps:
          - id: wait
            tool: record
            arguments: {name: wait}
          - id: drop
            tool: delete_thing
            depends_on: [wait]
            arguments: {name: drop, note: "{params.token}"}
        """.replace("\n        ", "\n"))
    res = proj.run("execute", "wipe", "-p", "token=alpha-1234", "--approve", "drop",
                   env={"PLANRUN_TEST_CRASH": "outcome:wait"})
    assert res.returncode == -9
    res = proj.run("resume", "--explain")
    assert res.returncode == 0
    run_id = json.loads(proj.run("runs", "--json").stdout)[0]["run_id"]
    digests = {e["data"]["digest"] for e in proj.events(run_id)
               if e["kind"] == "approval_granted"}
    # the digest is the one of the arguments with the secret as a reference, and of the
    # tool as registered
    from planrun.approval import tool_identity
    from planrun.canonical import digest
    from planrun.registry import load_registry

    registry, _issues = load_registry(proj.root / "tools.yaml")
    tool = tool_identity(registry["delete_thing"])
    assert digests == {digest({"arguments": {"name": "drop",
                                             "note": redact.reference("token")},
                               "tool": tool})}
    # the approval covers the step with whatever value the secret has: nothing is asked
    same = proj.run("resume", "-p", "token=beta-5678", "--json")
    assert same.returncode == 0, same.stderr
    assert proj.calls() == ["wait", "drop"]
    assert "beta-5678" in (proj.root / "calls.log").read_text()


def test_resume_asks_for_a_secret_again(proj: Proj) -> None:
    proj.plan("s", """
        planrun: 1
        goal: Use a secret after a crash
        params:
          token: {type: string, secret: true}
        steps:
          - id: a
            tool: record
            arguments: {name: a}
          - id: b
            tool: echo_secret
            depends_on: [a]
            arguments: {name: b, token: "{params.token}"}
        """.replace("\n        ", "\n"))
    res = proj.run("execute", "s", "-p", "token=gamma-9999",
                   env={"PLANRUN_TEST_CRASH": "outcome:a"})
    assert res.returncode == -9
    res = proj.run("resume")
    assert res.returncode == 3
    assert "param_missing" in res.stderr
    assert "token" in res.stderr
    res = proj.run("resume", env={"PLANRUN_PARAM_token": "gamma-9999"})
    assert res.returncode == 0, res.stderr
    assert proj.calls() == ["a", "b"]


# --- secrets appear nowhere -------------------------------------------------------------------


def test_a_secret_given_with_p_appears_nowhere(proj: Proj) -> None:
    secret = "hunter2-SECRET-value"
    proj.plan("leak", """
        planrun: 1
        goal: Try hard to leak a secret
        params:
          token: {type: string, secret: true}
        steps:
          - id: echo
            tool: echo_secret
            arguments: {name: echo, token: "{params.token}"}
          - id: boom
            tool: boom
            depends_on: [echo]
            arguments: {token: "{params.token}"}
        """.replace("\n        ", "\n"))
    outputs: list[str] = []
    res = proj.run("execute", "leak", "-p", f"token={secret}", "-v")
    assert res.returncode == 1
    outputs += [res.stdout, res.stderr]
    res = proj.run("execute", "leak", "-p", f"token={secret}", "--json", "-v")
    outputs += [res.stdout, res.stderr]
    run_id = json.loads(res.stdout)["run_id"]
    assert "***" in res.stdout  # the masked parameter and the masked echo
    for args in (["status", run_id], ["status", run_id, "--json"], ["log", run_id],
                 ["log", run_id, "--json", "--tracebacks"], ["runs"], ["runs", "--json"],
                 ["output", run_id, "echo"], ["validate", "leak", "-p", f"token={secret}"]):
        res = proj.run(*args, "-v") if args[0] != "output" else proj.run(*args)
        outputs += [res.stdout, res.stderr]
    # a value that fails its schema is masked in the refusal too
    proj.plan("typed", """
        planrun: 1
        goal: A secret with a pattern
        params:
          token: {type: string, secret: true, pattern: "^x"}
        steps:
          - id: echo
            tool: echo_secret
            arguments: {name: echo, token: "{params.token}"}
        """.replace("\n        ", "\n"))
    res = proj.run("execute", "typed", "-p", f"token={secret}", "-v")
    assert res.returncode == 3
    outputs += [res.stdout, res.stderr]
    for text in outputs:
        assert secret not in text
    files = [p for p in proj.root.iterdir() if p.name.startswith("journal.sqlite3")]
    assert any(p.name.endswith("-wal") for p in files) or files
    for path in files:
        assert secret.encode() not in path.read_bytes(), path.name
    assert proj.calls().count("echo") == 2  # the tool itself did receive the value


# --- the policy file itself -------------------------------------------------------------------


def test_policy_check_lints(proj: Proj) -> None:
    proj.plan("cleanup", CLEANUP)
    proj.config('[policy.classes.empty]\ntools = []\nlevel = "act"\n'
                + grant_toml("old", expires=iso(timedelta(days=-1))))
    res = proj.run("policy", "check")
    assert res.returncode == 0, res.stdout
    assert "class 'empty' lists no tools" in res.stdout
    assert "grant 'old' expired" in res.stdout
    assert "irreversible tool 'delete_thing' has no live grant" in res.stdout
    assert proj.run("policy", "check", "--strict").returncode == 3
    proj.config('[policy]\nrequire_approval = ["nope"]\n')
    res = proj.run("policy", "check")
    assert res.returncode == 3
    assert "nope" in res.stdout


def test_load_policy_rejects_a_grant_without_expiry() -> None:
    _, issues = load_policy({"grants": [{"id": "g", "tool": "t", "granted_by": "me"}]},
                            {"t"}, "planrun.toml")
    assert [i.code for i in issues] == ["config"]
    assert "expires" in issues[0].message
    _, issues = load_policy({"grants": [{"id": "g", "tool": "t", "granted_by": "me",
                                         "expires": "2030-01-01T00:00:00"}]}, {"t"}, None)
    assert "offset" in issues[0].message


def test_grant_for_checks_each_condition() -> None:
    future = datetime.now(UTC) + timedelta(days=1)
    raw = {
        "classes": {"money": {"tools": ["pay"], "level": "act"}},
        "grants": [{"id": "g", "class": "money", "granted_by": "me", "expires": future,
                    "arguments": {"type": "object", "properties": {
                        "amount": {"type": "number", "maximum": 100}}},
                    "max_total": 150, "amount_field": "amount"}],
    }
    policy, issues = load_policy(raw, {"pay", "other"}, None)
    assert issues == []
    fine = [Covered("a", "pay", [{"amount": 60}]), Covered("b", "pay", [{"amount": 80}])]
    grant, _why = grant_for(policy, fine, "a")
    assert grant is not None
    assert grant.id == "g"
    too_big = [Covered("a", "pay", [{"amount": 101}])]
    grant, why = grant_for(policy, too_big, "a")
    assert grant is None
    assert "arguments leave" in why
    over = [Covered("a", "pay", [{"amount": 100}]), Covered("b", "pay", [{"amount": 60}])]
    grant, why = grant_for(policy, over, "b")
    assert grant is None
    assert "over max_total" in why
    other = [Covered("x", "other", [{"amount": 1}])]
    assert grant_for(policy, other, "x") == (None, "no grant covers this tool")
    later = datetime.now(UTC) + timedelta(days=2)
    grant, why = grant_for(policy, fine, "a", at=later)
    assert grant is None
    assert "expired" in why


def test_grant_total_boundaries() -> None:
    future = datetime.now(UTC) + timedelta(days=1)
    policy, _ = load_policy({"grants": [{"id": "g", "tool": "pay", "granted_by": "me",
                                         "expires": future, "max_total": 100,
                                         "amount_field": "amount"}]}, {"pay"}, None)
    at_limit = [Covered("a", "pay", [{"amount": 60}]), Covered("b", "pay", [{"amount": 40}])]
    assert grant_for(policy, at_limit, "a")[0] is not None
    over = [Covered("a", "pay", [{"amount": 60}]), Covered("b", "pay", [{"amount": 41}])]
    assert grant_for(policy, over, "b")[0] is None
    unknown = [Covered("a", "pay", None)]
    assert "not known" in grant_for(policy, unknown, "a")[1] or \
        "run time" in grant_for(policy, unknown, "a")[1]


def test_lint_flags_irreversible_tools_without_a_live_grant() -> None:
    warnings = lint(Policy(), {"drop": True, "read": False}, None)
    assert [w.severity for w in warnings] == ["warning"]
    assert "drop" in warnings[0].message


def test_the_executor_asks_an_injected_approver_and_respects_its_answer(tmp_path: Path) -> None:
    """The person is injected: a scripted approver stands in for the terminal."""
    from planrun import api
    from planrun.approval import ScriptedApprover
    from planrun.errors import ApprovalError
    from planrun.paths import load_settings

    project = Proj(tmp_path / "inproc")
    project.plan("cleanup", CLEANUP)
    os.environ["CALLS_DIR"] = str(project.root)
    try:
        settings = load_settings(project=project.root, journal=project.journal)
        with pytest.raises(ApprovalError) as denied:
            api.execute(settings, "cleanup", api.param_input(),
                        approver=ScriptedApprover({"drop": False}))
        assert denied.value.code == "approval_denied"
        assert project.calls() == []
        outcome = api.execute(settings, "cleanup", api.param_input(),
                              approver=ScriptedApprover({"drop": True}, who="alice"))
        assert isinstance(outcome, api.RunOutcome)
        manifest = outcome.manifest
        assert manifest["status"] == "completed"
        assert {s["id"]: s["approved_by"] for s in manifest["steps"]} == {
            "prepare": None, "drop": "alice"}
        assert project.calls() == ["prepare", "drop"]
    finally:
        del os.environ["CALLS_DIR"]
