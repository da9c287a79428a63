"""Clearing irreversible steps on a real terminal (SPEC §6), end to end.

The real ``planrun`` process (``python -m planrun``) runs on a pseudo-terminal (pexpect):
the table and ``Approve STEP (TOOL)? [y/N]`` come before anything runs, the default is No,
Ctrl-D / Ctrl-C / silence deny, every decision is journaled. Without a terminal planrun
refuses at once (exit 4) instead of waiting.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import subprocess
import sys
from typing import Any

import pexpect
import pytest

from conftest import Project
from planrun import api
from planrun.journal import Journal

MODULE = '''
from pathlib import Path

HERE = Path(__file__).resolve().parent


def record(name):
    with open(HERE / "calls.log", "a", encoding="utf-8") as f:
        f.write(name + "\\n")
    return {"name": name}
'''

TOOLS = """
tools:
  record:
    python: ttytools:record
    arguments:
      type: object
      properties:
        name: {type: string}
      required: [name]
      additionalProperties: false
  delete_thing:
    python: ttytools:record
    irreversible: true
    arguments:
      type: object
      properties:
        name: {type: string}
      required: [name]
      additionalProperties: false
  wipe:
    python: ttytools:record
    irreversible: true
    arguments:
      type: object
      properties:
        name: {type: string}
      required: [name]
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
    intent: Remove the old thing for good
"""

TWO = """
planrun: 1
goal: Two irreversible steps
steps:
  - {id: prepare, tool: record, arguments: {name: prepare}}
  - {id: drop, tool: delete_thing, depends_on: [prepare], arguments: {name: drop}}
  - {id: purge, tool: wipe, depends_on: [drop], arguments: {name: purge}}
"""

LATER = """
planrun: 1
goal: An irreversible step that uses an earlier output
steps:
  - {id: prepare, tool: record, arguments: {name: prepare}}
  - id: drop
    tool: delete_thing
    depends_on: [prepare]
    arguments: {name: "{steps.prepare.output.name}"}
"""

PROMPT_DROP = r"Approve drop \(delete_thing\)\? \[y/N\]"
PROMPT_PURGE = r"Approve purge \(wipe\)\? \[y/N\]"


@pytest.fixture
def proj(project: Project, monkeypatch: pytest.MonkeyPatch) -> Project:
    monkeypatch.chdir(project.root)
    project.write_tools(TOOLS, module=MODULE, module_name="ttytools")
    project.write_plan("cleanup", CLEANUP)
    project.write_plan("two", TWO)
    project.write_plan("later", LATER)
    return project


def spawn(project: Project, *args: str) -> pexpect.spawn:
    """``planrun ARGS`` on a pseudo-terminal (stdin, stdout and stderr are the tty)."""
    return pexpect.spawn(sys.executable, ["-m", "planrun", *args, "-C", str(project.root)],
                         cwd=str(project.root), env=dict(os.environ), encoding="utf-8",
                         timeout=30, dimensions=(50, 200))


def finish(child: pexpect.spawn) -> tuple[int, str]:
    """Wait for the end; (exit status, everything after the last match)."""
    child.expect(pexpect.EOF)
    rest = child.before or ""
    child.close()
    assert child.signalstatus is None, f"killed by signal {child.signalstatus}"
    return int(child.exitstatus), rest


def calls(project: Project) -> list[str]:
    log = project.root / "calls.log"
    return log.read_text().split() if log.exists() else []


def last_run(project: Project) -> dict[str, Any]:
    runs = api.runs(project.settings())
    assert runs, "no run was journaled"
    return runs[0]


def approvals(project: Project, run_id: str) -> list[dict[str, Any]]:
    with Journal(project.settings().journal, write=False) as j:
        return j.approvals(run_id)


def digest_of(arguments: dict[str, Any], tool: str = "delete_thing") -> str:
    """SHA-256 of the canonical JSON of the arguments and of the tool as registered."""
    registered = {"name": tool, "contract": {
        "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"],
        "additionalProperties": False}, "command": None, "python": "ttytools:record",
        "accepts": None, "cwd": None}
    text = json.dumps({"arguments": arguments, "tool": registered}, sort_keys=True,
                      separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def ask_drop(project: Project, *extra: str) -> tuple[pexpect.spawn, str]:
    """Start ``execute cleanup`` and wait for the question about ``drop``."""
    child = spawn(project, "execute", "cleanup", *extra)
    child.expect(PROMPT_DROP)
    shown = child.before or ""
    # Asked before anything runs: not even the step ``drop`` depends on has run.
    assert calls(project) == []
    return child, shown


# --- the question ----------------------------------------------------------------------------


def test_table_then_question_before_anything_runs_and_enter_denies(proj: Project) -> None:
    child, shown = ask_drop(proj)
    for text in ("drop", "delete_thing", "Remove the old thing for good", '"name": "drop"'):
        assert text in shown, shown
    assert "prepare" not in shown  # the table lists only the steps to clear
    child.sendline("")
    status, rest = finish(child)
    assert status == 4
    assert calls(proj) == []
    assert "Traceback" not in rest
    run = last_run(proj)
    assert run["status"] == "denied"
    [decision] = approvals(proj, run["run_id"])
    assert decision["granted"] == 0
    assert decision["step_id"] == "drop"


def test_run_time_placeholders_are_shown_as_written(proj: Project) -> None:
    child = spawn(proj, "execute", "later")
    child.expect(PROMPT_DROP)
    assert "{steps.prepare.output.name}" in (child.before or "")
    child.sendline("y")
    status, _ = finish(child)
    assert status == 0
    assert calls(proj) == ["prepare", "prepare"]
    [decision] = approvals(proj, last_run(proj)["run_id"])
    assert decision["digest"] == digest_of({"name": "{steps.prepare.output.name}"})


def test_n_denies(proj: Project) -> None:
    child, _ = ask_drop(proj)
    child.sendline("n")
    status, rest = finish(child)
    assert status == 4
    assert "drop" in rest  # the message names the step
    assert calls(proj) == []
    [decision] = approvals(proj, last_run(proj)["run_id"])
    assert decision["granted"] == 0


def test_y_runs_and_the_decision_is_journaled(proj: Project) -> None:
    child, _ = ask_drop(proj)
    child.sendline("y")
    status, rest = finish(child)
    assert status == 0, rest
    assert calls(proj) == ["prepare", "drop"]
    run = last_run(proj)
    assert run["status"] == "completed"
    [decision] = approvals(proj, run["run_id"])
    assert decision["granted"] == 1
    assert decision["step_id"] == "drop"
    assert decision["tool"] == "delete_thing"
    assert decision["decided_by"] == getpass.getuser()
    assert decision["method"] == "prompt"
    assert decision["digest"] == digest_of({"name": "drop"})
    assert decision["decided_at"].endswith("+00:00")
    manifest = api.status(proj.settings(), run["run_id"])
    steps = {s["id"]: s for s in manifest["steps"]}
    assert steps["drop"]["approved_by"] == getpass.getuser()
    assert steps["prepare"]["approved_by"] is None
    granted = api.log(proj.settings(), run["run_id"])[1]
    kinds = [e["kind"] for e in granted]
    assert kinds.index("approval_granted") < kinds.index("step_started")


@pytest.mark.parametrize("extra", [[], ["--approval-timeout", "60"]], ids=["plain", "timeout"])
def test_ctrl_d_denies(proj: Project, extra: list[str]) -> None:
    child, _ = ask_drop(proj, *extra)
    child.sendeof()
    status, rest = finish(child)
    assert status == 4
    assert "Traceback" not in rest
    assert calls(proj) == []
    [decision] = approvals(proj, last_run(proj)["run_id"])
    assert decision["granted"] == 0


@pytest.mark.parametrize("extra", [[], ["--approval-timeout", "60"]], ids=["plain", "timeout"])
def test_ctrl_c_at_the_prompt_denies_without_a_traceback(proj: Project,
                                                         extra: list[str]) -> None:
    child, _ = ask_drop(proj, *extra)
    child.sendintr()
    status, rest = finish(child)
    assert status == 4, rest
    assert "Traceback" not in rest
    assert "KeyboardInterrupt" not in rest
    assert calls(proj) == []
    run = last_run(proj)
    assert run["status"] == "denied"
    [decision] = approvals(proj, run["run_id"])
    assert decision["granted"] == 0


def test_silence_past_the_approval_timeout_denies_with_reason_timeout(proj: Project) -> None:
    child, _ = ask_drop(proj, "--approval-timeout", "1")
    status, _rest = finish(child)  # nobody answers
    assert status == 4
    assert calls(proj) == []
    run_id = last_run(proj)["run_id"]
    log = subprocess.run([sys.executable, "-m", "planrun", "log", run_id, "--json",
                          "-C", str(proj.root)], capture_output=True, text=True, timeout=60,
                         check=False, stdin=subprocess.DEVNULL)
    assert log.returncode == 0, log.stderr
    denied = [e for e in json.loads(log.stdout) if e["kind"] == "approval_denied"]
    assert len(denied) == 1
    assert denied[0]["step"] == "drop"
    assert denied[0]["data"]["reason"] == "timeout"
    assert denied[0]["data"]["method"] == "prompt"
    assert denied[0]["data"]["decided_by"] == getpass.getuser()
    assert denied[0]["data"]["digest"] == digest_of({"name": "drop"})


def test_the_question_goes_to_stderr_and_the_manifest_to_stdout(proj: Project) -> None:
    out = proj.root / "out.json"
    child = pexpect.spawn("sh", ["-c", 'exec "$0" -m planrun execute cleanup --json -C "$1" >"$2"',
                                 sys.executable, str(proj.root), str(out)],
                          cwd=str(proj.root), env=dict(os.environ), encoding="utf-8",
                          timeout=30, dimensions=(50, 200))
    child.expect(PROMPT_DROP)
    child.sendline("y")
    status, _ = finish(child)
    assert status == 0
    manifest = json.loads(out.read_text())
    assert manifest["status"] == "completed"
    assert {s["id"]: s["approved_by"] for s in manifest["steps"]} == {
        "prepare": None, "drop": getpass.getuser()}


# --- several steps --------------------------------------------------------------------------


def test_two_steps_are_asked_in_order(proj: Project) -> None:
    child = spawn(proj, "execute", "two")
    child.expect(PROMPT_DROP)
    child.sendline("y")
    child.expect(PROMPT_PURGE)
    assert calls(proj) == []  # still nothing ran: every step is cleared first
    child.sendline("y")
    status, rest = finish(child)
    assert status == 0, rest
    assert calls(proj) == ["prepare", "drop", "purge"]
    decisions = approvals(proj, last_run(proj)["run_id"])
    assert [(d["step_id"], d["granted"], d["method"]) for d in decisions] == [
        ("drop", 1, "prompt"), ("purge", 1, "prompt")]


def test_the_first_denial_stops_the_questions(proj: Project) -> None:
    child = spawn(proj, "execute", "two")
    child.expect(PROMPT_DROP)
    child.sendline("n")
    status, rest = finish(child)
    assert status == 4
    assert "Approve purge" not in rest
    assert calls(proj) == []
    decisions = approvals(proj, last_run(proj)["run_id"])
    assert [(d["step_id"], d["granted"]) for d in decisions] == [("drop", 0)]


def test_a_denial_of_the_second_step_runs_nothing(proj: Project) -> None:
    child = spawn(proj, "execute", "two")
    child.expect(PROMPT_DROP)
    child.sendline("y")
    child.expect(PROMPT_PURGE)
    child.sendline("")
    status, _ = finish(child)
    assert status == 4
    assert calls(proj) == []
    run = last_run(proj)
    assert run["status"] == "denied"
    decisions = approvals(proj, run["run_id"])
    assert [(d["step_id"], d["granted"]) for d in decisions] == [("drop", 1), ("purge", 0)]


def test_a_step_cleared_by_flag_is_not_asked(proj: Project) -> None:
    child = spawn(proj, "execute", "two", "--approve", "drop")
    child.expect(PROMPT_PURGE)
    assert "Approve drop" not in (child.before or "")
    child.sendline("y")
    status, _ = finish(child)
    assert status == 0
    decisions = approvals(proj, last_run(proj)["run_id"])
    assert [(d["step_id"], d["method"]) for d in decisions] == [("drop", "flag"),
                                                                 ("purge", "prompt")]


# --- no terminal --------------------------------------------------------------------------------


def test_without_a_terminal_it_exits_4_at_once_naming_the_step(proj: Project) -> None:
    proc = subprocess.run([sys.executable, "-m", "planrun", "execute", "cleanup",
                           "-C", str(proj.root)], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 4
    assert "drop" in proc.stderr
    assert "--approve drop" in proc.stderr
    assert "--approve-all" in proc.stderr
    assert "grant" in proc.stderr
    assert "[y/N]" not in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr
    assert calls(proj) == []
    run = last_run(proj)
    assert run["status"] == "denied"


def test_without_a_terminal_every_step_left_is_named(proj: Project) -> None:
    base = [sys.executable, "-m", "planrun", "execute", "two", "-C", str(proj.root)]
    proc = subprocess.run(base, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 4
    assert "--approve drop" in proc.stderr
    assert "--approve purge" in proc.stderr
    proc = subprocess.run([*base, "--approve", "drop"], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 4
    assert "--approve purge" in proc.stderr
    assert "--approve drop" not in proc.stderr
    assert calls(proj) == []


def test_a_terminal_stdin_with_stderr_redirected_is_not_asked(proj: Project) -> None:
    """SPEC §6: asking needs stdin *and* stderr on a terminal."""
    err = proj.root / "stderr.txt"
    child = pexpect.spawn("sh", ["-c", 'exec "$0" -m planrun execute cleanup -C "$1" 2>"$2"',
                                 sys.executable, str(proj.root), str(err)],
                          cwd=str(proj.root), env=dict(os.environ), encoding="utf-8",
                          timeout=30)
    status, rest = finish(child)
    assert status == 4
    assert "[y/N]" not in rest
    assert "--approve drop" in err.read_text()
    assert calls(proj) == []


def test_approve_flag_clears_without_a_terminal(proj: Project) -> None:
    proc = subprocess.run([sys.executable, "-m", "planrun", "execute", "cleanup",
                           "--approve", "drop", "-C", str(proj.root)],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert calls(proj) == ["prepare", "drop"]
    [decision] = approvals(proj, last_run(proj)["run_id"])
    assert (decision["granted"], decision["method"], decision["decided_by"]) == (
        1, "flag", getpass.getuser())


# --- waiting for a person (SPEC §10): execute --defer-approval, then approve on a terminal ---


def offline(project: Project, *args: str) -> subprocess.CompletedProcess[str]:
    """``planrun ARGS`` without a terminal (stdin is /dev/null), as cron runs it."""
    return subprocess.run([sys.executable, "-m", "planrun", *args, "-C", str(project.root)],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=60, check=False)


def deferred(project: Project, plan: str = "two") -> str:
    """``execute PLAN --defer-approval`` off a terminal: the run id of the waiting run."""
    proc = offline(project, "execute", plan, "--defer-approval", "--json")
    assert proc.returncode == 4, proc.stderr
    run_id = str(json.loads(proc.stdout)["run_id"])
    assert last_run(project)["status"] == "awaiting_approval"
    return run_id


def test_defer_approval_on_a_terminal_does_not_ask(proj: Project) -> None:
    """Deferring is the point: the person decides later with planrun approve."""
    child = spawn(proj, "execute", "two", "--defer-approval")
    status, rest = finish(child)
    assert status == 4
    assert "[y/N]" not in rest
    assert "planrun approve" in rest
    assert calls(proj) == []
    assert last_run(proj)["status"] == "awaiting_approval"


def test_approve_on_a_terminal_asks_each_step_then_resume_runs_without_asking(
        proj: Project) -> None:
    run_id = deferred(proj)
    child = spawn(proj, "approve", run_id)
    child.expect(PROMPT_DROP)
    shown = child.before or ""
    for text in ("drop", "delete_thing", '"name": "drop"', "purge", "wipe"):
        assert text in shown, shown
    assert "prepare" not in shown.split("Steps that need")[-1]
    child.sendline("y")
    child.expect(PROMPT_PURGE)
    child.sendline("yes")
    status, rest = finish(child)
    assert status == 0, rest
    assert f"planrun resume {run_id}" in rest
    assert calls(proj) == []  # approving runs nothing
    decisions = approvals(proj, run_id)
    assert [(d["step_id"], d["granted"], d["method"], d["decided_by"]) for d in decisions] == [
        ("drop", 1, "prompt", getpass.getuser()), ("purge", 1, "prompt", getpass.getuser())]
    assert decisions[0]["digest"] == digest_of({"name": "drop"})
    proc = offline(proj, "resume", run_id, "--json")  # no terminal: nothing left to ask
    assert proc.returncode == 0, proc.stderr
    assert calls(proj) == ["prepare", "drop", "purge"]


def test_approve_on_a_terminal_n_denies_the_run(proj: Project) -> None:
    run_id = deferred(proj)
    child = spawn(proj, "approve", run_id, "--reason", "checked the backups")
    child.expect(PROMPT_DROP)
    child.sendline("y")
    child.expect(PROMPT_PURGE)
    child.sendline("N")
    status, rest = finish(child)
    assert status == 4
    assert "approval_denied" in rest
    assert "Traceback" not in rest
    assert last_run(proj)["status"] == "denied"
    decisions = approvals(proj, run_id)
    assert [(d["step_id"], d["granted"], d["method"]) for d in decisions] == [
        ("drop", 1, "prompt"), ("purge", 0, "prompt")]
    assert decisions[0]["reason"] == "checked the backups"
    assert decisions[1]["reason"] == "answered no"
    assert offline(proj, "resume", run_id).returncode == 5
    assert calls(proj) == []


def test_approve_on_a_terminal_ctrl_d_is_a_denial(proj: Project) -> None:
    run_id = deferred(proj)
    child = spawn(proj, "approve", run_id)
    child.expect(PROMPT_DROP)
    child.sendeof()
    status, rest = finish(child)
    assert status == 4
    assert "Traceback" not in rest
    assert last_run(proj)["status"] == "denied"
    [decision] = approvals(proj, run_id)
    assert (decision["step_id"], decision["granted"], decision["reason"]) == ("drop", 0, "eof")
    assert calls(proj) == []


def test_approve_resume_on_a_terminal_runs_at_once(proj: Project) -> None:
    run_id = deferred(proj)
    child = spawn(proj, "approve", run_id, "--resume")
    child.expect(PROMPT_DROP)
    child.sendline("y")
    child.expect(PROMPT_PURGE)
    child.sendline("y")
    status, rest = finish(child)
    assert status == 0, rest
    assert "completed" in rest
    assert calls(proj) == ["prepare", "drop", "purge"]
    assert last_run(proj)["run_id"] == run_id


def test_resume_on_a_terminal_asks_only_for_what_approve_left(proj: Project) -> None:
    run_id = deferred(proj)
    proc = offline(proj, "approve", run_id, "drop")
    assert proc.returncode == 0, proc.stderr
    child = spawn(proj, "resume", run_id)
    child.expect(PROMPT_PURGE)
    assert "Approve drop" not in (child.before or "")
    child.sendline("y")
    status, rest = finish(child)
    assert status == 0, rest
    assert calls(proj) == ["prepare", "drop", "purge"]


def test_a_no_at_resume_of_an_awaiting_run_denies_it(proj: Project) -> None:
    run_id = deferred(proj)
    child = spawn(proj, "resume", run_id)
    child.expect(PROMPT_DROP)
    child.sendline("n")
    status, rest = finish(child)
    assert status == 4
    assert "Traceback" not in rest
    assert last_run(proj)["status"] == "denied"
    assert calls(proj) == []


# --- approve: resolved: asked at dispatch, with the real values (issue 17) -----------------


def test_approve_resolved_asks_at_dispatch_with_the_resolved_values(proj: Project) -> None:
    proj.write_plan("resolved", LATER.replace(
        "    depends_on: [prepare]\n", "    depends_on: [prepare]\n    approve: resolved\n"))
    child = spawn(proj, "execute", "resolved")
    child.expect(PROMPT_DROP)
    shown = child.before or ""
    assert calls(proj) == ["prepare"]  # asked when the values are known: prepare ran
    assert "Step that needs your" in shown  # approval now, with its resolved arguments
    assert '"name": "prepare"' in shown
    assert "{steps.prepare.output.name}" not in shown
    child.sendline("y")
    status, _ = finish(child)
    assert status == 0
    assert calls(proj) == ["prepare", "prepare"]
    [decision] = approvals(proj, last_run(proj)["run_id"])
    assert decision["digest"] == digest_of({"name": "prepare"})
    assert decision["method"] == "prompt"


def test_approve_resolved_denied_at_dispatch_ends_the_run_denied(proj: Project) -> None:
    proj.write_plan("resolved", LATER.replace(
        "    depends_on: [prepare]\n", "    depends_on: [prepare]\n    approve: resolved\n"))
    child = spawn(proj, "execute", "resolved")
    child.expect(PROMPT_DROP)
    child.sendcontrol("c")  # Ctrl-C at the prompt is a denial, not an interruption
    status, rest = finish(child)
    assert status == 4, rest
    assert "Traceback" not in rest
    assert calls(proj) == ["prepare"]
    run = last_run(proj)
    assert run["status"] == "denied"
    [decision] = approvals(proj, run["run_id"])
    assert (decision["granted"], decision["reason"]) == (0, "interrupt")


DISGUISED = r"""
planrun: 1
goal: "Tidy up\e[2K\rHarmless goal"
steps:
  - id: drop
    tool: delete_thing
    intent: "[bold green]Just a harmless note[/]"
    arguments: {name: "keep /tmp [conceal]and also rm -rf /home[/conceal] ok"}
"""


def test_what_a_person_approves_is_shown_as_written(proj: Project) -> None:
    # The table read a plan's intent and arguments as rich markup: `[conceal]…[/conceal]`
    # wrote the middle of an argument invisible (ESC[8m) in the very table a person
    # approves from, and an intent with a lone `[/]` ended the run `internal`
    # (MarkupError). A plan is data someone (or some planner) else wrote (found by an
    # attacker). Now every cell is plain text, ESC and CR as escapes.
    proj.write_plan("disguised", DISGUISED)
    proj.write_plan("broken", CLEANUP.replace("Remove the old thing for good",
                                              "closing [/] nothing"))
    child = spawn(proj, "execute", "disguised")
    child.expect(PROMPT_DROP)
    table = child.before or ""
    child.sendline("n")
    code, _ = finish(child)
    assert code == 4
    assert "[conceal]and also rm -rf /home[/conceal]" in table
    assert "\x1b[8m" not in table
    assert "[bold green]Just a harmless note[/]" in table
    child = spawn(proj, "execute", "broken")
    child.expect(PROMPT_DROP)
    assert "closing [/] nothing" in (child.before or "")
    child.sendline("n")
    code, rest = finish(child)
    assert code == 4, rest
    assert "internal" not in rest
    shown = subprocess.run([sys.executable, "-m", "planrun", "show", "disguised"],
                           cwd=proj.root, capture_output=True, text=True, check=False)
    assert "goal: Tidy up\\u001b[2K\\u000dHarmless goal" in shown.stdout, shown
    assert "\x1b" not in shown.stdout + shown.stderr


def test_a_failed_steps_message_is_shown_as_written_in_the_summary(proj: Project) -> None:
    # The summary table read the note `[CODE] MESSAGE` as markup: the code vanished (an
    # unknown style tag), a tool's `[conceal]` hid its words, its ESC sequences reached
    # the terminal (found by an attacker).
    proj.write_module("boomtools", "def boom(text):\n    raise ValueError(text)\n")
    proj.write("tools.yaml", TOOLS + """
  boom:
    python: boomtools:boom
    arguments:
      type: object
      properties: {text: {type: string}}
      required: [text]
""")
    proj.write_plan("boom", "planrun: 1\ngoal: fail\nsteps:\n  - id: b\n    tool: boom\n"
                    "    arguments: {text: \"x [conceal]hidden[/conceal] y\\e[2Kz\"}\n")
    child = spawn(proj, "execute", "boom")
    code, rest = finish(child)
    assert code == 1, rest
    assert "[tool_error] ValueError: x [conceal]hidden[/conceal] y\\u001b[2Kz" in rest
    assert "\x1b[8m" not in rest
    assert "\x1b[2Kz" not in rest
