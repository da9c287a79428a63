"""The planning half as a fresh operator uses it: planners, repair, a run waiting for a
person, found by a fresh operator trying it from the docs.

Everything here goes through the real ``planrun`` process in a project folder written by
the test, with real planner commands (stdin is not a terminal).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pexpect

from harness import PLANRUN, run_planrun

TOOLS = """\
tools:
  note:
    description: Append a line to effects.txt
    command: ["{PY}", "-c", "import sys; print(sys.argv[1], file=open('effects.txt', 'a'))",
              "{line}"]
    output: none
    arguments:
      type: object
      properties: {line: {type: string}}
      required: [line]
      additionalProperties: false
  copy:
    description: Copy a file
    command: ["cp", "{src}", "{dest}"]
    output: none
    arguments:
      type: object
      properties: {src: {type: string}, dest: {type: string}}
      required: [src, dest]
      additionalProperties: false
"""

PUBLISH = """\
planrun: 1
goal: Build and publish the site
steps:
  - {id: build, tool: note, arguments: {line: build}}
  - {id: publish, tool: copy, depends_on: [build], arguments: {src: draft.txt, dest: out.txt}}
"""

# docs/repair.md's fix.py, shortened: the failed step copies site.txt instead
FIX = """\
import json, sys
request = json.load(sys.stdin)
plan = request["run"]["plan"]
failed = {f["step"] for f in request["run"]["failed"]}
for step in plan["steps"]:
    if step["id"] in failed:
        step["arguments"]["src"] = "site.txt"
print(json.dumps(plan))
"""


def project(base: Path) -> Path:
    root = base / "site"
    (root / "plans").mkdir(parents=True)
    (root / "tools.yaml").write_text(TOOLS.replace("{PY}", sys.executable), encoding="utf-8")
    (root / "site.txt").write_text("the site\n", encoding="utf-8")
    (root / "fix.py").write_text(FIX, encoding="utf-8")
    return root


def planrun(root: Path, *args: str) -> Any:
    result = run_planrun(*args, cwd=root)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def fixer() -> str:
    return f"cmd:{sys.executable} fix.py"


def test_repair_revises_the_file_the_run_came_from_not_another_plan_of_its_name(
        tmp_path: Path) -> None:
    # `planrun execute ci/publish.yaml` failed; plans/publish.yaml is another plan of the
    # same name. The repair's revision overwrote plans/publish.yaml (a different plan,
    # lost), and ci/publish.yaml stayed as it was.
    root = project(tmp_path)
    (root / "ci").mkdir()
    (root / "ci" / "publish.yaml").write_text(PUBLISH, encoding="utf-8")
    other = textwrap.dedent("""\
        planrun: 1
        revision: 5
        goal: Another plan of the same name
        steps:
          - {id: only, tool: note, arguments: {line: other}}
        """)
    (root / "plans" / "publish.yaml").write_text(other, encoding="utf-8")
    failed = planrun(root, "execute", "ci/publish.yaml", "--json")
    assert failed.returncode == 1, failed.stderr
    run_id = json.loads(failed.stdout)["run_id"]

    done = planrun(root, "repair", run_id, "--planner", fixer(), "--json")
    assert done.returncode == 0, done.stderr
    child = json.loads(done.stdout)
    assert child["plan"]["file"] == "ci/publish.yaml"
    assert child["plan"]["revision"] == 2
    assert (root / "plans" / "publish.yaml").read_text(encoding="utf-8") == other
    revised = (root / "ci" / "publish.yaml").read_text(encoding="utf-8")
    assert "revision: 2" in revised
    assert "src: site.txt" in revised


def test_a_revision_saved_while_the_planner_thinks_is_replaced_and_kept(
        tmp_path: Path) -> None:
    # With --name, the file was read before the rounds: a revision 7 a person saved while
    # the planner ran was overwritten by "revision 2" and its text was not journaled.
    root = project(tmp_path)
    (root / "plans" / "race.yaml").write_text(
        "planrun: 1\nname: race\nrevision: 1\ngoal: first\nsteps:\n"
        "- {id: w, tool: note, arguments: {line: first}}\n", encoding="utf-8")
    edited = ("planrun: 1\nname: race\nrevision: 7\ngoal: edited by a person\nsteps:\n"
              "- {id: w, tool: note, arguments: {line: person}}\n")
    (root / "slow_planner.py").write_text(textwrap.dedent(f"""\
        import json, pathlib, sys
        request = json.load(sys.stdin)
        # meanwhile, a person saves revision 7 of the plan
        pathlib.Path("plans/race.yaml").write_text({edited!r})
        print(json.dumps({{"planrun": 1, "goal": request["goal"], "steps": [
            {{"id": "w", "tool": "note", "arguments": {{"line": "planner"}}}}]}}))
        """), encoding="utf-8")
    done = planrun(root, "plan", "race", "--name", "race", "--json",
                   "--planner", f"cmd:{sys.executable} slow_planner.py")
    assert done.returncode == 0, done.stderr
    planned = json.loads(done.stdout)
    assert (planned["revision"], planned["previous_revision"]) == (8, 7)
    assert "revision: 8" in (root / "plans" / "race.yaml").read_text(encoding="utf-8")
    log = planrun(root, "log", planned["run_id"], "--json")
    data = json.loads(log.stdout)
    events = data["events"] if isinstance(data, dict) else data
    [event] = [e for e in events if e["kind"] == "planned"]
    assert event["data"]["previous"] == {"file": "plans/race.yaml", "revision": 7,
                                         "content": edited}


def test_repair_says_each_round_and_the_file_it_rewrote(tmp_path: Path) -> None:
    # repair rewrote plans/publish.yaml without a word (planrun plan says each round and
    # the file), its child run said "a retry of", and past --max-rounds the report it
    # had printed above was said to "follow", with no pointer to the rounds.
    root = project(tmp_path)
    (root / "plans" / "publish.yaml").write_text(PUBLISH, encoding="utf-8")
    failed = planrun(root, "execute", "publish", "--json")
    assert failed.returncode == 1, failed.stderr
    run_id = json.loads(failed.stdout)["run_id"]
    (root / "eager.py").write_text(FIX.replace(
        'print(json.dumps(plan))',
        'plan["steps"][0]["arguments"]["line"] += " again"\nprint(json.dumps(plan))'),
        encoding="utf-8")

    refused = planrun(root, "repair", run_id, "--max-rounds", "1",
                      "--planner", f"cmd:{sys.executable} eager.py")
    assert refused.returncode == 3, refused.stderr
    err = refused.stderr
    assert "planrun: round 1: refused (1 issue(s): repair_changes_succeeded)" in err
    assert err.index("error[repair_changes_succeeded]") < err.index("error[replan_exhausted]")
    assert (f"error[replan_exhausted]: no valid plan in 1 round(s); the last report is above."
            f" planrun log {run_id} shows every round") in err
    assert f"planrun retry {run_id}" in err
    assert "follows" not in err

    done = planrun(root, "repair", run_id, "--planner", fixer())
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert "planrun: round 1: plan accepted" in lines
    assert (f"planrun: wrote plan 'publish' revision 2 (was 1) to plans/publish.yaml in 1 "
            f"round(s); planrun log {run_id} shows how it came to be") in lines
    assert any(f"started (a repair of {run_id})" in line for line in lines), lines


def test_status_of_a_refused_session_or_run_says_why(tmp_path: Path) -> None:
    # `planrun status` of a refused planning session (or refused plan) said only
    # "refused — 0/0 succeeded": why, and where the rounds are, was in no output.
    root = project(tmp_path)
    no_model = f"cmd:{sys.executable} -c 'import sys; sys.exit(\"no model today\")'"
    refused = planrun(root, "plan", "note hi", "--planner", no_model, "--max-rounds", "1",
                      "--json")
    assert refused.returncode == 3, refused.stderr
    session = refused.stderr.split("planrun log ")[1].split()[0]
    shown = planrun(root, "status", session)
    assert shown.returncode == 0, shown.stderr
    assert ("refused: [replan_exhausted] no valid plan in 1 round(s); the last one: "
            "[planner] the planner exited with status 1: no model today") in shown.stdout
    assert f"next: planrun log {session}" in shown.stdout
    m = json.loads(planrun(root, "status", session, "--json").stdout)
    assert m["refused"]["code"] == "replan_exhausted"
    assert m["next"] == f"planrun log {session}"

    (root / "plans" / "bad.yaml").write_text(
        "planrun: 1\ngoal: x\nsteps:\n  - {id: a, tool: nte, arguments: {line: x}}\n",
        encoding="utf-8")
    assert planrun(root, "execute", "bad").returncode == 3
    shown = planrun(root, "status", "last")
    assert ("refused: [unknown_tool] step 'a': no tool named 'nte' in tools.yaml. Did you "
            "mean 'note'?") in shown.stdout, shown.stdout
    m = json.loads(planrun(root, "status", "last", "--json").stdout)
    assert m["refused"]["code"] == "unknown_tool"
    assert m["next"] is None


def test_status_of_a_killed_planning_session_names_the_dead_process(tmp_path: Path) -> None:
    root = project(tmp_path)
    (root / "slow.py").write_text("import sys, time\nsys.stdin.read()\ntime.sleep(60)\n",
                                  encoding="utf-8")
    proc = subprocess.Popen([*PLANRUN, "plan", "note slow", "--planner",
                             f"cmd:{sys.executable} slow.py"], cwd=root,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            runs = json.loads(planrun(root, "runs", "--json").stdout)
            if runs and runs[0]["status"] == "planning":
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the session never started planning")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    shown = planrun(root, "status", "last")
    assert "refused: [interrupted] the planning process (" in shown.stdout, shown.stdout
    assert f":{proc.pid}:" in shown.stdout
    assert "ended without closing the session (killed, or it crashed)" in shown.stdout


SLOW = """\
import pathlib, sys, time
sys.stdin.read()
pathlib.Path("planner-started").touch()
time.sleep(60)
"""


def wait_for(path: Path, proc: Any) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        alive = proc.isalive() if hasattr(proc, "isalive") else proc.poll() is None
        assert alive, "planrun ended before the planner started"
        assert time.monotonic() < deadline, "the planner never started"
        time.sleep(0.05)


def test_ctrl_c_while_the_planner_thinks_says_so(tmp_path: Path) -> None:
    # Ctrl-C (and SIGTERM, below) stopped planrun plan with exit 130 and not a word; the
    # session was journaled with the message "KeyboardInterrupt".
    root = project(tmp_path)
    (root / "slow.py").write_text(SLOW, encoding="utf-8")
    child = pexpect.spawn(PLANRUN[0], [*PLANRUN[1:], "plan", "note slow", "--planner",
                                       f"cmd:{sys.executable} slow.py"],
                          cwd=str(root), encoding="utf-8", timeout=30)
    try:
        wait_for(root / "planner-started", child)
        child.sendintr()
        child.expect(r"planrun: interrupted \(SIGINT\) while asking the planner: it was "
                     r"stopped and no plan was written")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 130
    assert not list((root / "plans").iterdir())
    shown = planrun(root, "status", "last")
    assert ("refused: [interrupted] stopped by SIGINT (Ctrl-C) before a plan was accepted"
            in shown.stdout), shown.stdout


def test_sigterm_while_the_planner_thinks_says_so(tmp_path: Path) -> None:
    root = project(tmp_path)
    (root / "slow.py").write_text(SLOW, encoding="utf-8")
    (root / "plans" / "publish.yaml").write_text(PUBLISH, encoding="utf-8")
    failed = planrun(root, "execute", "publish", "--json")
    run_id = json.loads(failed.stdout)["run_id"]
    slow = f"cmd:{sys.executable} slow.py"
    for args, what in (
            (("execute", "--planner", slow, "--goal", "note slow"),
             "no plan was written; nothing ran"),
            (("repair", run_id, "--planner", slow),
             "no revision was written; the run stays failed")):
        (root / "planner-started").unlink(missing_ok=True)
        proc = subprocess.Popen([*PLANRUN, *args], cwd=root, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            wait_for(root / "planner-started", proc)
            proc.terminate()
            _, err = proc.communicate(timeout=30)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode == 143, err
        assert (f"planrun: interrupted (SIGTERM) while asking the planner: it was stopped "
                f"and {what}") in err
        assert "Traceback" not in err
    assert json.loads(planrun(root, "status", run_id, "--json").stdout)["status"] == "failed"


def test_a_denied_repair_or_retry_child_points_back_at_its_parent(tmp_path: Path) -> None:
    # A repair (or retry) from cron whose child had a step nobody could clear ended
    # `denied` with next "planrun execute PLAN --approve STEP": that runs again the steps
    # the parent had done (its build ran twice).
    root = project(tmp_path)
    tools = (root / "tools.yaml").read_text(encoding="utf-8")
    (root / "tools.yaml").write_text(tools.replace(
        "  copy:\n    description: Copy a file\n",
        "  copy:\n    description: Copy a file\n    irreversible: true\n"), encoding="utf-8")
    (root / "plans" / "publish.yaml").write_text(PUBLISH, encoding="utf-8")
    failed = planrun(root, "execute", "publish", "--approve", "publish", "--json")
    assert failed.returncode == 1, failed.stderr
    parent = json.loads(failed.stdout)["run_id"]

    for args, expected in (
            (("repair", parent, "--planner", fixer()),
             f"planrun repair {parent} --planner '{fixer()}' --approve publish"),
            (("retry", parent), f"planrun retry {parent} --approve publish")):
        denied = planrun(root, *args)
        assert denied.returncode == 4, denied.stderr
        assert "error[approval_required]" in denied.stderr
        child = json.loads(planrun(root, "status", "last", "--json").stdout)
        assert (child["status"], child["parent_run_id"]) == ("denied", parent)
        assert child["next"] == expected
    done = planrun(root, "repair", parent, "--planner", fixer(), "--approve", "publish")
    assert done.returncode == 0, done.stderr
    assert (root / "effects.txt").read_text(encoding="utf-8").splitlines() == ["build"]


def test_replan_exhausted_in_json_points_at_no_text_around_it(tmp_path: Path) -> None:
    """With ``--json`` no report is printed above the error line (it is the error
    object's ``plans`` on stdout): the message said "the last report is above" there,
    on stdout and stderr alike (found by a review). ``plan`` and ``repair`` both."""
    root = project(tmp_path)
    (root / "plans" / "publish.yaml").write_text(PUBLISH, encoding="utf-8")
    failed = planrun(root, "execute", "publish", "--json")
    run_id = json.loads(failed.stdout)["run_id"]
    (root / "eager.py").write_text(FIX.replace(
        'print(json.dumps(plan))',
        'plan["steps"][0]["arguments"]["line"] += " again"\nprint(json.dumps(plan))'),
        encoding="utf-8")
    (root / "wrong.py").write_text(
        "import json\nprint(json.dumps({'planrun': 1, 'goal': 'g', 'steps': "
        "[{'id': 'a', 'tool': 'nte', 'arguments': {}}]}))\n", encoding="utf-8")
    for argv, run in (
            (["repair", run_id, "--planner", f"cmd:{sys.executable} eager.py"], run_id),
            (["plan", "do a thing", "--planner", f"cmd:{sys.executable} wrong.py"], None)):
        r = planrun(root, *argv, "--max-rounds", "1", "--json")
        assert r.returncode == 3, r.stderr
        data = json.loads(r.stdout)
        error = data["error"]
        assert error["code"] == "replan_exhausted"
        assert data["plans"][0]["issues"]  # the report is in the object, not "above"
        for said in (error["message"], r.stderr):
            for word in ("above", "below", "follows"):
                assert word not in said, (word, said)
        run = run or error["message"].split("planrun log ")[1].split()[0]
        assert error["message"] == (f"no valid plan in 1 round(s) (planrun log {run} "
                                    "shows every round)")
        # stderr keeps its one line with the first reason
        assert "error[replan_exhausted]: no valid plan in 1 round(s) (planrun log" in r.stderr
        # and on a terminal's text form the report is above, as it says
        text = planrun(root, *argv, "--max-rounds", "1")
        assert "the last report is above" in text.stderr
        assert text.stderr.index("error[replan_exhausted]") > text.stderr.index("error[")
