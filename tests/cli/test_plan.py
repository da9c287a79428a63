"""``planrun plan`` and ``execute --planner/--goal`` through the real ``planrun`` process
(SPEC §10): what is printed, written, journaled, and the exit statuses."""

from __future__ import annotations

import json
import shlex
import shutil
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from conftest import Project
from harness import run_planrun

from .support import MODULE, calls

TOOLS = """
tools:
  echo:
    description: Record a value in calls.log
    python: clitools:echo
    arguments:
      type: object
      properties: {value: {}}
      required: [value]
      additionalProperties: false
  wipe:
    description: Pretend to delete something (records it in calls.log)
    python: clitools:echo
    irreversible: true
    arguments:
      type: object
      properties: {value: {type: string}}
      required: [value]
      additionalProperties: false
"""

#: Answers ``answers.json[round - 1]`` (the last one past its end); records requests.
PLANNER = r'''
import json, sys
from pathlib import Path

here = Path(__file__).resolve().parent
request = json.loads(sys.stdin.read())
with open(here / "requests.jsonl", "a", encoding="utf-8") as f:
    f.write(json.dumps(request) + "\n")
answers = json.loads((here / "answers.json").read_text(encoding="utf-8"))
sys.stdout.write(answers[min(request["round"], len(answers)) - 1])
'''

GOOD = """\
planrun: 1
name: greet
revision: 9
goal: Greet
steps:
  - {id: hello, tool: echo, arguments: {value: planned-hello}}
"""
WRONG = "planrun: 1\ngoal: Greet\nsteps:\n  - {id: hello, tool: eko, arguments: {}}\n"
PLANNER_ARG = f"cmd:{shlex.quote(sys.executable)} planner.py"


@pytest.fixture
def proj(project: Project) -> Project:
    project.write_tools(TOOLS, module=MODULE, module_name="clitools")
    project.write("planner.py", PLANNER)
    return project


def answers(project: Project, *items: str) -> None:
    (project.root / "answers.json").write_text(json.dumps(list(items)), encoding="utf-8")


def requests(project: Project) -> list[dict[str, Any]]:
    path = project.root / "requests.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def planrun(project: Project, *args: str) -> Any:
    return run_planrun(*args, cwd=project.root)


def run_json(project: Project, *args: str) -> Any:
    result = planrun(project, *args, "--json")
    return result, json.loads(result.stdout)


def test_plan_prints_and_writes_revision_1(proj: Project) -> None:
    answers(proj, GOOD)
    result = planrun(proj, "plan", "greet people", "--planner", PLANNER_ARG)
    assert result.returncode == 0, result.stderr
    written = (proj.plans / "greet.yaml").read_text()
    assert result.stdout == written
    assert "revision: 1\n" in written  # planrun sets the revision, not the planner
    assert "round 1: plan accepted" in result.stderr
    assert "revision 1 (new)" in result.stderr
    assert planrun(proj, "validate", "greet").returncode == 0


def test_plan_json_and_the_session_in_runs_and_log(proj: Project) -> None:
    answers(proj, WRONG, GOOD)
    result, out = run_json(proj, "plan", "greet people", "--planner", PLANNER_ARG)
    assert result.returncode == 0, result.stderr
    assert (out["ok"], out["name"], out["revision"], out["rounds"]) == (True, "greet", 1, 2)
    assert out["file"] == "plans/greet.yaml"
    assert out["plan"]["steps"][0]["arguments"] == {"value": "planned-hello"}
    _, rows = run_json(proj, "runs", "--status", "planned")
    assert [r["run_id"] for r in rows] == [out["run_id"]]
    assert rows[0]["plan"] == "greet"
    _, events = run_json(proj, "log", out["run_id"])
    assert [e["kind"] for e in events] == ["plan_proposed", "plan_refused", "plan_proposed",
                                           "planned", "run_finished"]
    assert events[1]["data"]["issues"][0]["code"] == "unknown_tool"
    # A planning session is not a run to resume or retry.
    for command in ("resume", "retry"):
        again = planrun(proj, command, out["run_id"])
        assert again.returncode == 5, again.stderr
        assert "run_not_resumable" in again.stderr


def test_never_right_exits_3_replan_exhausted_with_the_last_report(proj: Project) -> None:
    answers(proj, WRONG)
    result = planrun(proj, "plan", "greet", "--planner", PLANNER_ARG, "--max-rounds", "2")
    assert result.returncode == 3
    assert result.stdout == ""
    assert "error[unknown_tool]" in result.stderr
    assert "error[replan_exhausted]" in result.stderr
    assert len(requests(proj)) == 2
    assert not proj.plans.exists()
    result, out = run_json(proj, "plan", "greet", "--planner", PLANNER_ARG, "--max-rounds",
                           "1")
    assert result.returncode == 3
    assert out["error"]["code"] == "replan_exhausted"
    assert out["plans"][0]["issues"][0]["code"] == "unknown_tool"


def test_the_next_revision_keeps_the_previous_file_in_the_journal(proj: Project) -> None:
    old = GOOD.replace("revision: 9", "revision: 4").replace("planned-hello", "old-hello")
    proj.write_plan("greet", old)
    answers(proj, GOOD)
    result, out = run_json(proj, "plan", "greet people", "--planner", PLANNER_ARG)
    assert result.returncode == 0, result.stderr
    assert (out["revision"], out["previous_revision"]) == (5, 4)
    text = (proj.plans / "greet.yaml").read_text()
    assert "revision: 5" in text
    assert "planned-hello" in text
    _, events = run_json(proj, "log", out["run_id"])
    planned = next(e["data"] for e in events if e["kind"] == "planned")
    assert planned["previous"] == {"file": "plans/greet.yaml", "revision": 4,
                                   "content": old}
    assert planned["revision"] == 5


def test_name_and_out(proj: Project, tmp_path: Path) -> None:
    answers(proj, GOOD)
    result = planrun(proj, "plan", "greet people", "--planner", PLANNER_ARG, "--name",
                     "hello-world", "-q")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "name: hello-world" in (proj.plans / "hello-world.yaml").read_text()
    out = tmp_path / "elsewhere" / "p.json"
    out.parent.mkdir()  # --out's folder must exist (test_out_into_a_missing_folder_...)
    result = planrun(proj, "plan", "greet people", "--planner", PLANNER_ARG, "--out",
                     str(out))
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text())["revision"] == 1
    assert sorted(p.name for p in proj.plans.iterdir()) == ["hello-world.yaml"]
    bad = planrun(proj, "plan", "g", "--planner", PLANNER_ARG, "--name", "../escape")
    assert bad.returncode == 2
    assert "error[usage]" in bad.stderr
    # a file suffix in the name wrote plans/x.yaml.yaml (found by an attacker)
    for suffixed in ("x.yaml", "x.YML", "x.json"):
        bad = planrun(proj, "plan", "g", "--planner", PLANNER_ARG, "--name", suffixed)
        assert bad.returncode == 2, bad
        assert "without a file suffix" in bad.stderr, bad.stderr
        assert "--name x writes plans/x.yaml" in bad.stderr, bad.stderr
    assert sorted(p.name for p in proj.plans.iterdir()) == ["hello-world.yaml"]


def test_a_planner_name_with_a_file_suffix_is_not_the_file_name(proj: Project) -> None:
    """The plan's own ``name: x.yaml`` wrote plans/x.yaml.yaml, as ``--name x.yaml`` did
    before it was refused (found by an attacker): such a name is not a plain file name,
    so NAME is the goal's slug, as for any other."""
    for suffixed in ("greet.yaml", "greet.JSON"):
        answers(proj, GOOD.replace("name: greet", f"name: {suffixed}"))
        result = planrun(proj, "plan", "greet people", "--planner", PLANNER_ARG, "-q")
        assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in proj.plans.iterdir()) == ["greet-people.yaml"]
    assert "name: greet-people" in (proj.plans / "greet-people.yaml").read_text()


@pytest.mark.parametrize(("args", "status", "words"), [
    (["plan", "g"], 2, "needs --planner"),
    (["plan", "g", "--planner", "cmd:"], 2, "no command"),
    (["plan", "g", "--planner", "python:nocallable"], 2, "python:module:callable"),
    (["plan", "g", "--planner", "nosuch"], 2, "not cmd:ARGV"),
    (["plan", "  ", "--planner", PLANNER_ARG], 2, "goal is empty"),
    (["plan", "g", "--planner", "bad"], 3, "error[config]"),
    (["plan", "g", "--planner", PLANNER_ARG, "--max-rounds", "0"], 2, ""),
    (["execute", "greet", "--planner", PLANNER_ARG, "--goal", "g"], 2, "not both"),
    (["execute", "--planner", PLANNER_ARG], 2, "go together"),
    (["execute", "--goal", "g"], 2, "go together"),
    (["execute"], 2, "needs a plan name"),
])
def test_usage_and_config_errors(proj: Project, args: list[str], status: int,
                                 words: str) -> None:
    proj.write_config("[planners.bad]\ncommand = []\n")
    answers(proj, GOOD)
    result = planrun(proj, *args)
    assert result.returncode == status, result.stderr
    assert words in result.stderr
    assert "Traceback" not in result.stderr
    assert requests(proj) == []  # the planner was never asked
    assert result.stdout == ""


def test_execute_planner_goal_plans_then_runs(proj: Project) -> None:
    answers(proj, WRONG, GOOD)
    result, manifest = run_json(proj, "execute", "--planner", PLANNER_ARG, "--goal",
                                "greet people")
    assert result.returncode == 0, result.stderr
    assert manifest["status"] == "completed"
    assert manifest["plan"]["name"] == "greet"
    assert manifest["plan"]["file"] == "plans/greet.yaml"
    assert calls(proj) == ["planned-hello"]
    assert "round 2: plan accepted" in result.stderr
    _, rows = run_json(proj, "runs")
    assert [r["status"] for r in rows] == ["completed", "planned"]
    _, events = run_json(proj, "log", manifest["run_id"])
    assert events[0]["kind"] == "planned"
    assert events[0]["data"]["planning_run"] == rows[1]["run_id"]


def test_execute_planner_params_are_checked_concretely(proj: Project) -> None:
    needs = GOOD.replace("steps:", "params:\n  who: {type: string}\nsteps:").replace(
        "planned-hello", "\"hello {params.who}\"")
    answers(proj, needs)
    result = planrun(proj, "execute", "--planner", PLANNER_ARG, "--goal", "g",
                     "--max-rounds", "1")
    assert result.returncode == 3  # who has no value: refused in the round, sent back
    assert "param_missing" in result.stderr
    result = planrun(proj, "execute", "--planner", PLANNER_ARG, "--goal", "g", "-p",
                     "who=bob")
    assert result.returncode == 0, result.stderr
    assert calls(proj) == ["hello bob"]


def test_nothing_a_planner_writes_clears_a_step(proj: Project) -> None:
    wipe = ("planrun: 1\nname: wipe\ngoal: wipe\nsteps:\n"
            "  - {id: wipe, tool: wipe, arguments: {value: all}}\n")
    sneaky = wipe.replace("goal: wipe\n", "goal: wipe\napprovals: {wipe: true}\n")
    answers(proj, sneaky, wipe)
    result = planrun(proj, "execute", "--planner", PLANNER_ARG, "--goal", "wipe")
    assert result.returncode == 4, result.stderr  # planned fine, then not cleared
    assert "approval_required" in result.stderr
    assert calls(proj) == []
    sent = requests(proj)[1]["previous"]["issues"]
    assert [(i["code"], i["path"]) for i in sent] == [("schema", "/approvals")]
    result = planrun(proj, "execute", "wipe", "--approve", "wipe")
    assert result.returncode == 0, result.stderr
    assert calls(proj) == ["all"]


# --- the example planner shipped with the project ------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


def test_the_example_backup_planner_plans_a_backup_that_runs(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "planners").mkdir(parents=True)
    for name in ("tools.yaml", "backup_tools.py", "tree_tools.py",
                 "planners/backup_planner.py"):
        shutil.copy(ROOT / name, repo / name)
    source = tmp_path / "data"
    (source / "sub").mkdir(parents=True)
    (source / "a.txt").write_text("hello\n")
    (source / "sub" / "b.txt").write_text("world\n")
    dest = tmp_path / "backups"
    goal = f"back up {shlex.quote(str(source))} to {shlex.quote(str(dest))} keeping 2"
    planner = f"cmd:{shlex.quote(sys.executable)} planners/backup_planner.py"
    result = run_planrun("plan", goal, "--planner", planner, cwd=repo)
    assert result.returncode == 0, result.stderr
    assert run_planrun("validate", "backup", cwd=repo).returncode == 0
    for _ in range(3):
        ran = run_planrun("execute", "backup", "--approve", "prune", "--json", cwd=repo)
        assert ran.returncode == 0, ran.stderr
        assert json.loads(ran.stdout)["counts"]["succeeded"] == 6
    archives = sorted(dest.glob("backup-*.tar.gz"))
    assert len(archives) == 2  # keeping 2
    with tarfile.open(archives[-1]) as tar:
        assert {"./a.txt", "./sub/b.txt"} <= set(tar.getnames())
    # The callable form gives the same plan; a goal it cannot read is a planner issue.
    again = run_planrun("plan", goal, "--planner", "python:planners.backup_planner:plan",
                        "--json", cwd=repo)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["revision"] == 2
    bad = run_planrun("plan", "tidy my room", "--planner", planner, "--max-rounds", "1",
                      cwd=repo)
    assert bad.returncode == 3
    assert "error[planner]" in bad.stderr
    assert "cannot read the goal" in bad.stderr


@pytest.mark.parametrize(("sig", "status"), [("SIGTERM", 143), ("SIGINT", 130)])
def test_a_signal_while_planning_kills_the_planner_and_closes_the_session(
        proj: Project, sig: str, status: int) -> None:
    import os
    import signal
    import subprocess
    import time

    from harness import PLANRUN

    proj.write("slow.py", "import os, sys, time\nsys.stdin.read()\n"
               "open('planner.pid', 'w').write(str(os.getpid()))\ntime.sleep(60)\n")
    proc = subprocess.Popen([*PLANRUN, "plan", "g", "--planner",
                             f"cmd:{shlex.quote(sys.executable)} slow.py"], cwd=proj.root,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid_file = proj.root / "planner.pid"
    try:
        for _ in range(400):
            if pid_file.exists() and pid_file.read_text():
                break
            time.sleep(0.05)
        planner = int(pid_file.read_text())
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == status, err
    assert "Traceback" not in err
    for _ in range(100):
        try:
            os.kill(planner, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the planner outlived planrun")
    _, rows = run_json(proj, "runs")
    assert [r["status"] for r in rows] == ["refused"]


def test_execute_planner_dry_run_plans_but_runs_nothing(proj: Project) -> None:
    answers(proj, GOOD)
    result, out = run_json(proj, "execute", "--planner", PLANNER_ARG, "--goal", "g",
                           "--dry-run")
    assert result.returncode == 0, result.stderr
    assert out["order"] == ["hello"]
    assert (proj.plans / "greet.yaml").exists()
    assert calls(proj) == []


def test_an_empty_out_is_a_usage_error(proj: Project) -> None:
    answers(proj, GOOD)
    result = planrun(proj, "plan", "greet people", "--planner", PLANNER_ARG, "--out", "")
    assert result.returncode == 2, result.stderr
    assert "error[usage]" in result.stderr
    assert "--out is empty" in result.stderr
    assert "busy" not in result.stderr
    assert requests(proj) == []  # the planner was never asked


def test_out_into_a_missing_folder_is_refused_naming_it(proj: Project, tmp_path: Path) -> None:
    answers(proj, GOOD)
    missing = tmp_path / "nosuch" / "deeper"
    result = planrun(proj, "plan", "greet people", "--planner", PLANNER_ARG, "--out",
                     str(missing / "p.yaml"))
    assert result.returncode == 2, result.stderr
    assert "error[usage]" in result.stderr
    assert f"{missing}" in result.stderr
    assert "does not exist" in result.stderr
    assert not (tmp_path / "nosuch").exists()
    assert requests(proj) == []
    # the plans folder itself is created when missing, also as --out's folder
    shutil.rmtree(proj.plans, ignore_errors=True)
    result = planrun(proj, "plan", "greet people", "--planner", PLANNER_ARG, "--out",
                     "plans/mine.yaml")
    assert result.returncode == 0, result.stderr
    assert (proj.plans / "mine.yaml").is_file()


def test_a_callable_planner_that_changes_folder_does_not_change_the_shown_path(
        proj: Project) -> None:
    proj.write("wanderer.py", "import os\n\n\ndef plan(request):\n    os.chdir('/')\n"
               "    return {'planrun': 1, 'name': 'greet', 'goal': request['goal'],\n"
               "            'steps': [{'id': 'a', 'tool': 'echo', "
               "'arguments': {'value': 1}}]}\n")
    result, out = run_json(proj, "plan", "greet people", "--planner",
                           "python:wanderer:plan")
    assert result.returncode == 0, result.stderr
    assert out["file"] == str(Path("plans") / "greet.yaml")
    assert f"to {Path('plans') / 'greet.yaml'} in 1 round" in result.stderr
    assert (proj.plans / "greet.yaml").is_file()


def test_a_sigkilled_plan_leaves_a_session_the_next_reader_settles_interrupted(
        proj: Project) -> None:
    import os
    import signal
    import subprocess
    import time

    from harness import PLANRUN

    proj.write("slow.py", "import os, sys, time\nsys.stdin.read()\n"
               "open('planner.pid', 'w').write(str(os.getpid()))\ntime.sleep(60)\n")
    proc = subprocess.Popen([*PLANRUN, "plan", "g", "--planner",
                             f"cmd:{shlex.quote(sys.executable)} slow.py"], cwd=proj.root,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid_file = proj.root / "planner.pid"
    try:
        for _ in range(400):
            if pid_file.exists() and pid_file.read_text():
                break
            time.sleep(0.05)
        planner = int(pid_file.read_text())
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        proc.kill()
        with __import__("contextlib").suppress(ProcessLookupError):
            os.kill(planner, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    _, rows = run_json(proj, "runs")
    assert [r["status"] for r in rows] == ["refused"]  # not `planning` forever
    _, events = run_json(proj, "log", rows[0]["run_id"])
    finished = [e for e in events if e["kind"] == "run_finished"]
    assert [e["data"] for e in finished] == [{"status": "refused", "code": "interrupted"}]
    _, shown = run_json(proj, "status", rows[0]["run_id"])
    assert shown["status"] == "refused"
