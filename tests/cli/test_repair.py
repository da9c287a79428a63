"""``planrun repair RUN --planner P`` through the CLI (SPEC §10): scripted planners (a
real subprocess and a callable) revise a failed run; the revision runs as a child that
inherits what succeeded (checked with an effects file that counts calls per step)."""

from __future__ import annotations

import json
import shlex
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import Project

from .support import WIPE_TOOL, as_json, calls, execute_json, invoke

PLAN = """
planrun: 1
goal: Fetch, build, upload, notify
steps:
  - {id: fetch, tool: echo, arguments: {value: fetch}}
  - {id: build, tool: echo, depends_on: [fetch], arguments: {value: build}}
  - {id: upload, tool: boom, depends_on: [build], arguments: {value: upload}}
  - {id: notify, tool: echo, depends_on: [upload], arguments: {value: notify}}
"""

# A planner as a command: reads the request on stdin, keeps it in requests.jsonl, answers
# by its first argument: "touch" (changes the succeeded step build), "fix" (the failed step
# upload calls echo), "touch-then-fix", "remove" (drops the succeeded step fetch).
FIX = r'''
import json, sys
req = json.load(sys.stdin)
with open("requests.jsonl", "a", encoding="utf-8") as f:
    f.write(json.dumps(req) + "\n")
how = sys.argv[1]
if how == "touch-then-fix":
    how = "touch" if req["round"] == 1 else "fix"
plan = req["run"]["plan"]
steps = plan["steps"]
if how == "touch":
    steps[1]["arguments"] = {"value": "build again"}
elif how == "remove":
    del steps[0]
    steps[0]["depends_on"] = []
elif how == "fix":
    for s in steps:
        if s["id"] == "upload":
            s["tool"] = "echo"
elif how == "fix-irreversibly":
    for s in steps:
        if s["id"] == "upload":
            s["tool"] = "wipe"
print(json.dumps(plan) if req["round"] % 2 else __import__("yaml").safe_dump(plan))
'''

# The same planner as a callable (python:repairer:plan).
CALLABLE = '''
ROUNDS = []


def plan(request):
    ROUNDS.append(request)
    p = request["run"]["plan"]
    if request["round"] == 1:
        p["steps"][0]["tool"] = "chatty"      # touches the succeeded step fetch
    else:
        p["steps"][2] = {"id": "upload", "tool": "echo", "depends_on": ["build"],
                         "arguments": {"value": "upload"}}
    return p
'''


@pytest.fixture
def failed(proj: Project) -> str:
    """The id of a failed run of ``repairme``: fetch, build succeeded; upload failed."""
    proj.write_plan("repairme", PLAN)
    proj.write("fix.py", FIX)
    result, m = execute_json(proj, "repairme")
    assert result.exit_code == 1, result.output
    assert m["status"] == "failed"
    return str(m["run_id"])


def planner(how: str) -> str:
    return f"cmd:{shlex.quote(sys.executable)} fix.py {how}"


def requests(proj: Project) -> list[dict[str, Any]]:
    path = proj.root / "requests.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def events(proj: Project, run: str) -> list[dict[str, Any]]:
    result = invoke(proj, "log", run, "--json")
    assert result.exit_code == 0, result.output
    data = as_json(result)
    return list(data["events"] if isinstance(data, dict) else data)


def test_a_revision_touching_a_succeeded_step_is_sent_back_then_the_fix_runs(
        proj: Project, failed: str) -> None:
    result = invoke(proj, "repair", failed, "--planner", planner("touch-then-fix"), "--json")
    assert result.exit_code == 0, result.output
    child = as_json(result)
    assert child["status"] == "completed"
    assert child["parent_run_id"] == failed
    assert child["root_run_id"] == failed
    assert child["plan"]["revision"] == 2
    assert child["plan"]["file"] == "plans/repairme.yaml"
    by_id = {s["id"]: s for s in child["steps"]}
    assert by_id["fetch"]["replayed"]
    assert by_id["build"]["replayed"]
    assert not by_id["upload"]["replayed"]
    assert by_id["upload"]["tool"] == "echo"
    # Each step's effect happened once over both runs: nothing that succeeded ran again.
    assert Counter(calls(proj)) == {"fetch": 1, "build": 1, "upload": 1, "notify": 1}

    first, second = requests(proj)
    assert (first["mode"], first["round"], first["previous"]) == ("repair", 1, None)
    assert first["run"]["run_id"] == failed
    assert first["run"]["succeeded"] == ["fetch", "build"]
    assert first["run"]["not_run"] == ["notify"]
    (bad,) = first["run"]["failed"]
    assert bad["step"] == "upload"
    assert bad["error"]["code"] == "tool_error"
    assert "cannot handle 'upload'" in bad["error"]["message"]
    assert first["run"]["manifest"]["status"] == "failed"
    assert first["run"]["plan"]["steps"][2]["tool"] == "boom"
    # The planner got the refusal of round 1 back, pointing at the step it touched.
    issues = second["previous"]["issues"]
    assert [(i["code"], i["step"], i["path"]) for i in issues] == [
        ("repair_changes_succeeded", "build", "/steps/1")]
    assert second["previous"]["plan"]["steps"][1]["arguments"] == {"value": "build again"}

    # The revision is the plan file's next revision.
    written = yaml.safe_load((proj.plans / "repairme.yaml").read_text())
    assert written["revision"] == 2
    assert written["name"] == "repairme"
    assert written["steps"][2]["tool"] == "echo"

    # How the revision came to be is in the journal of both runs.
    kinds = [e["kind"] for e in events(proj, failed)]
    assert kinds[-4:] == ["plan_proposed", "plan_refused", "plan_proposed", "replanned"]
    replanned = [e for e in events(proj, child["run_id"]) if e["kind"] == "replanned"]
    assert len(replanned) == 1
    assert replanned[0]["data"]["parent_run_id"] == failed
    assert replanned[0]["data"]["revision"] == 2
    assert replanned[0]["data"]["digest"] == child["plan"]["digest"]

    # Lineage in runs and status.
    runs = as_json(invoke(proj, "runs", "--json"))
    assert [(r["run_id"], r["revision"], r["status"]) for r in runs[:2]] == [
        (child["run_id"], 2, "completed"), (failed, 1, "failed")]
    status = as_json(invoke(proj, "status", child["run_id"], "--json"))
    assert (status["parent_run_id"], status["root_run_id"]) == (failed, failed)
    shown = invoke(proj, "log", child["run_id"])
    assert "replanned" in shown.stdout


def test_a_callable_planner(proj: Project, failed: str, monkeypatch: pytest.MonkeyPatch
                            ) -> None:
    proj.write_module("repairer", CALLABLE)
    monkeypatch.syspath_prepend(str(proj.root))
    result = invoke(proj, "repair", failed, "--planner", "python:repairer:plan", "--json")
    assert result.exit_code == 0, result.output
    assert as_json(result)["status"] == "completed"
    import repairer

    assert [r["round"] for r in repairer.ROUNDS] == [1, 2]
    (issue,) = repairer.ROUNDS[1]["previous"]["issues"]
    assert (issue["code"], issue["step"], issue["path"]) == (
        "repair_changes_succeeded", "fetch", "/steps/0")
    assert "tool" in issue["message"]
    assert Counter(calls(proj)) == {"fetch": 1, "build": 1, "upload": 1, "notify": 1}


def test_past_max_rounds_is_replan_exhausted(proj: Project, failed: str) -> None:
    before = (proj.plans / "repairme.yaml").read_text()
    result = invoke(proj, "repair", failed, "--planner", planner("touch"),
                    "--max-rounds", "2")
    assert result.exit_code == 3, result.output
    assert "replan_exhausted" in result.output
    assert "repair_changes_succeeded" in result.output
    assert [r["round"] for r in requests(proj)] == [1, 2]
    assert all(r["max_rounds"] == 2 for r in requests(proj))
    # nothing ran, nothing was written, no child run
    assert Counter(calls(proj)) == {"fetch": 1, "build": 1}
    assert (proj.plans / "repairme.yaml").read_text() == before
    assert len(as_json(invoke(proj, "runs", "--json"))) == 1


def test_a_revision_removing_a_succeeded_step_is_refused(proj: Project, failed: str) -> None:
    result = invoke(proj, "repair", failed, "--planner", planner("remove"),
                    "--max-rounds", "1", "--json")
    assert result.exit_code == 3, result.output
    refused = [e for e in events(proj, failed) if e["kind"] == "plan_refused"]
    removed, rewired = [i for i in refused[-1]["data"]["issues"]
                        if i["code"] == "repair_changes_succeeded"]
    assert (removed["step"], removed["path"]) == ("fetch", "/steps")
    assert "removes" in removed["message"]
    # build lost its dependency on fetch: that changes it too
    assert (rewired["step"], rewired["path"]) == ("build", "/steps/0")
    assert "depends_on" in rewired["message"]


def test_only_a_failed_run_is_repaired(proj: Project, failed: str) -> None:
    done, m = execute_json(proj, "hello")
    assert done.exit_code == 0
    result = invoke(proj, "repair", m["run_id"], "--planner", planner("fix"))
    assert result.exit_code == 5, result.output
    assert "run_not_resumable" in result.output
    assert requests(proj) == []  # the planner was never asked
    unknown = invoke(proj, "repair", "zzzzzzzz", "--planner", planner("fix"))
    assert unknown.exit_code == 5
    assert "unknown_run" in unknown.output
    # a repaired run's child that completed is not repaired either
    ok = invoke(proj, "repair", failed, "--planner", planner("fix"), "--json")
    assert ok.exit_code == 0, ok.output
    again = invoke(proj, "repair", as_json(ok)["run_id"], "--planner", planner("fix"))
    assert again.exit_code == 5


def test_a_journaled_parameter_cannot_be_given_again(proj: Project) -> None:
    result, m = execute_json(proj, "hello", "-p", "who=me")
    assert result.exit_code == 0
    proj.write_plan("twice", PLAN.replace("value: fetch", "value: '{params.who}'").replace(
        "goal:", "params: {who: {type: string}}\ngoal:"))
    result, m = execute_json(proj, "twice", "-p", "who=fetch")
    assert result.exit_code == 1
    proj.write("fix.py", FIX)
    bad = invoke(proj, "repair", m["run_id"], "--planner", planner("fix"), "-p", "who=x")
    assert bad.exit_code == 2, bad.output
    assert requests(proj) == []


SECRET_PLAN = """
planrun: 1
goal: Upload with a token
params:
  token: {type: string, secret: true}
steps:
  - {id: fetch, tool: echo, arguments: {value: fetch}}
  - {id: upload, tool: boom, depends_on: [fetch], arguments: {value: "{params.token}"}}
"""

SECRET_FIX = r'''
import json, sys
req = json.load(sys.stdin)
with open("requests.jsonl", "a", encoding="utf-8") as f:
    f.write(json.dumps(req) + "\n")
plan = req["run"]["plan"]
plan["steps"][1]["tool"] = "echo"
print(json.dumps(plan))
'''


def test_secrets_are_references_in_the_request_and_given_again(proj: Project) -> None:
    secret = "s3cr3t-Tok3n"
    proj.write_plan("secretive", SECRET_PLAN)
    proj.write("fix.py", SECRET_FIX)
    result, m = execute_json(proj, "secretive", "-p", f"token={secret}")
    assert result.exit_code == 1
    assert secret not in result.output
    cmd = f"cmd:{shlex.quote(sys.executable)} fix.py"
    # Without the value again: refused before the planner is asked, as retry refuses.
    missing = invoke(proj, "repair", m["run_id"], "--planner", cmd)
    assert missing.exit_code == 3, missing.output
    assert "param_missing" in missing.output
    assert "token" in missing.output
    assert requests(proj) == []
    result = invoke(proj, "repair", m["run_id"], "--planner", cmd, "-p", f"token={secret}",
                    "--json")
    assert result.exit_code == 0, result.output
    assert secret not in result.output
    (req,) = requests(proj)
    text = (proj.root / "requests.jsonl").read_text()
    assert secret not in text
    # where the value was, the request holds the parameter's reference
    assert req["run"]["params"]["token"] != secret
    assert "token" in req["run"]["params"]["token"]
    # the child's tool got the value again
    assert Counter(calls(proj)) == {"fetch": 1, secret: 1}
    journal = Path(proj.settings().journal)
    assert secret.encode() not in journal.read_bytes()


def test_repair_defer_approval_leaves_the_child_waiting_for_a_person(
        proj: Project, failed: str) -> None:
    """A revision whose step needs a person, with nobody at hand (cron): the child waits
    (exit 4) with what succeeded inherited; approve and resume finish it, nothing twice."""
    proj.write("tools.yaml", proj.root.joinpath("tools.yaml").read_text() + WIPE_TOOL)
    before = Counter(calls(proj))
    result = invoke(proj, "repair", failed, "--planner", planner("fix-irreversibly"),
                    "--defer-approval", "--json")
    assert result.exit_code == 4, result.output
    child = as_json(result)
    assert child["status"] == "awaiting_approval"
    assert [w["step"] for w in child["approval"]["waiting"]] == ["upload"]
    states = {s["id"]: s["status"] for s in child["steps"]}
    assert states == {"fetch": "succeeded", "build": "succeeded", "upload": "pending",
                      "notify": "pending"}
    assert Counter(calls(proj)) == before  # nothing ran
    assert invoke(proj, "approve", child["run_id"], "--all").exit_code == 0
    done = invoke(proj, "resume", child["run_id"], "--json")
    assert done.exit_code == 0, done.output
    assert as_json(done)["status"] == "completed"
    after = Counter(calls(proj)) - before
    assert after["fetch"] == 0
    assert after["build"] == 0
