"""The planner protocol (SPEC §10): planners as real commands and as callables.

A scripted planner (``planner.py``, written into the project) answers from a list of
answers, one per round, and records every request it got to ``requests.jsonl``; the tests
read back what each round was sent. Nothing is mocked: commands are real processes, the
journal a real SQLite file.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import Project, run_events
from planrun import api
from planrun.errors import Refused, UsageError
from planrun.planners import (
    EventSession,
    PlannerParams,
    propose,
    request_base,
    resolve_planner,
)
from planrun.redact import reference
from planrun.validation import ParamInput

#: A planner command: answers ``answers.json[round - 1]`` (the last one past its end).
#: An answer is the text to print, or {"exit": N, "stderr": TEXT}, {"sleep": S}, or
#: {"spawn_sleep": S} (a child that would outlive it, then hang).
PLANNER = r'''
import json, os, subprocess, sys, time
from pathlib import Path

here = Path(__file__).resolve().parent
request = json.loads(sys.stdin.read())
with open(here / "requests.jsonl", "a", encoding="utf-8") as f:
    f.write(json.dumps(request) + "\n")
    seen = sorted(k for k in os.environ if k.startswith("PLANRUN_PARAM_"))
    f.write(json.dumps({"env": seen}) + "\n")
answers = json.loads((here / "answers.json").read_text(encoding="utf-8"))
answer = answers[min(request["round"], len(answers)) - 1]
if isinstance(answer, dict):
    if "spawn_sleep" in answer:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        (here / "child.pid").write_text(str(child.pid))
        time.sleep(answer["spawn_sleep"])
    if "sleep" in answer:
        time.sleep(answer["sleep"])
    if "stderr" in answer:
        sys.stderr.write(answer["stderr"])
    sys.exit(answer.get("exit", 0))
sys.stdout.write(answer)
'''

GOOD = """\
planrun: 1
name: greet
goal: Say hello
steps:
  - {id: hello, tool: echo, arguments: {value: hi}}
"""
#: Wrong: an unknown tool and an undeclared argument.
WRONG = """\
planrun: 1
goal: Say hello
steps:
  - {id: hello, tool: ecko, arguments: {value: hi}}
  - {id: list, tool: lister, arguments: {n: 1, m: 2}}
"""


@pytest.fixture
def proj(basic_project: Project, monkeypatch: pytest.MonkeyPatch) -> Project:
    monkeypatch.chdir(basic_project.root)
    basic_project.write("planner.py", PLANNER)
    return basic_project


def command(script: str = "planner.py") -> str:
    return f"cmd:{shlex.quote(sys.executable)} {script}"


def answers(project: Project, *items: Any) -> None:
    (project.root / "answers.json").write_text(json.dumps(list(items)), encoding="utf-8")


def requests(project: Project) -> list[dict[str, Any]]:
    path = project.root / "requests.jsonl"
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return [x for x in lines if "env" not in x]


def planner_env(project: Project) -> list[list[str]]:
    lines = (project.root / "requests.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["env"] for line in lines if '"env"' in line[:8]]


def plan(project: Project, goal: str = "say hello", planner: str | None = None,
         **kwargs: Any) -> Any:
    return api.plan(project.settings(), goal, planner or command(), **kwargs)


# --- the protocol --------------------------------------------------------------------------


def test_a_planner_right_at_once_writes_revision_1(proj: Project) -> None:
    answers(proj, GOOD)
    done = plan(proj)
    assert (done.name, done.revision, done.rounds) == ("greet", 1, 1)
    written = proj.plans / "greet.yaml"
    assert done.file == written
    assert "revision: 1" in written.read_text()
    report = api.validate(proj.settings(), ["greet"])
    assert report.ok(), report.to_json()
    [req] = requests(proj)
    assert req["protocol"] == 1
    assert req["mode"] == "plan"
    assert req["goal"] == "say hello"
    assert (req["round"], req["max_rounds"], req["previous"], req["run"]) == (1, 3, None,
                                                                                 None)
    assert req["plan_schema"] == api.json_schema("plan")
    names = [t["name"] for t in req["catalog"]]
    assert names == sorted(proj.good_registry().tools)
    echo = next(t for t in req["catalog"] if t["name"] == "echo")
    assert set(echo) == {"name", "description", "arguments", "output_schema", "irreversible",
                         "idempotent"}
    assert echo["arguments"]["required"] == ["value"]
    lister = next(t for t in req["catalog"] if t["name"] == "lister")
    assert lister["output_schema"]["properties"]["n"] == {"type": "integer"}


def test_wrong_twice_then_right_takes_three_rounds_each_sent_the_last_report(
        proj: Project) -> None:
    answers(proj, WRONG, "planrun: 1\nsteps: []\ngoal: x\n", GOOD)
    done = plan(proj)
    assert done.rounds == 3
    first, second, third = requests(proj)
    assert [r["round"] for r in (first, second, third)] == [1, 2, 3]
    assert first["previous"] is None
    sent = second["previous"]
    assert sent["plan"]["steps"][0]["tool"] == "ecko"
    assert {i["code"] for i in sent["issues"]} == {"unknown_tool", "arguments"}
    bad_arg = next(i for i in sent["issues"] if i["code"] == "arguments")
    assert bad_arg["path"] == "/steps/1/arguments/m"
    assert bad_arg["step"] == "list"
    assert [i["code"] for i in third["previous"]["issues"]] == ["empty"]
    # Journaled: one session run, every round.
    events = run_events(proj, done.run_id)
    kinds = [e["kind"] for e in events]
    assert kinds == ["plan_proposed", "plan_refused", "plan_proposed", "plan_refused",
                     "plan_proposed", "planned", "run_finished"]
    assert [e["data"]["round"] for e in events if e["kind"] == "plan_proposed"] == [1, 2, 3]
    refused = [e["data"] for e in events if e["kind"] == "plan_refused"]
    assert refused[0]["issues"] == sent["issues"]
    planned = next(e["data"] for e in events if e["kind"] == "planned")
    assert planned["digest"] == done.digest
    assert planned["round"] == 3
    status = api.status(proj.settings(), done.run_id)
    assert status["status"] == "planned"


def test_never_right_is_replan_exhausted_with_the_last_report(proj: Project) -> None:
    answers(proj, WRONG)
    with pytest.raises(Refused) as caught:
        plan(proj, max_rounds=2)
    assert caught.value.code == "replan_exhausted"
    assert caught.value.exit_code == 3
    assert {i.code for i in caught.value.report.all_issues()} == {"unknown_tool", "arguments"}
    assert len(requests(proj)) == 2
    assert not proj.plans.exists()
    [row] = api.runs(proj.settings())
    assert row["status"] == "refused"
    kinds = [e["kind"] for e in run_events(proj, row["run_id"])]
    assert kinds == ["plan_proposed", "plan_refused"] * 2 + ["run_finished"]
    assert run_events(proj, row["run_id"])[-1]["data"] == {"status": "refused",
                                                           "code": "replan_exhausted"}


@pytest.mark.parametrize(("answer", "words"), [
    ({"exit": 3, "stderr": "model unavailable"}, "exited with status 3: model unavailable"),
    ("this is not { a plan", "not a plan"),
    ("- just\n- a list\n", "a plan is a mapping"),
    ("", "wrote nothing"),
])
def test_a_failing_planner_is_a_planner_issue_sent_back(proj: Project, answer: Any,
                                                        words: str) -> None:
    answers(proj, answer, GOOD)
    done = plan(proj)
    assert done.rounds == 2
    sent = requests(proj)[1]["previous"]
    assert sent["plan"] is None
    [issue] = sent["issues"]
    assert issue["code"] == "planner"
    assert words in issue["message"], issue


def test_output_that_is_not_utf8_or_too_large_is_a_planner_issue(proj: Project) -> None:
    from planrun.planners import MAX_OUTPUT_BYTES

    proj.write("binary.py", "import sys\nsys.stdin.read()\nsys.stdout.buffer.write(b'\\xff')\n")
    proj.write("huge.py", "import sys\nsys.stdin.read()\n"
               f"sys.stdout.write('#' * {MAX_OUTPUT_BYTES + 1})\n")
    for script, words in (("binary.py", "not UTF-8"), ("huge.py", "at most")):
        with pytest.raises(Refused) as caught:
            plan(proj, planner=command(script), max_rounds=1)
        [issue] = caught.value.report.all_issues()
        assert issue.code == "planner"
        assert words in issue.message, issue.message


def test_a_planner_that_hangs_is_killed_with_its_group(proj: Project) -> None:
    import os
    import time

    proj.write_config("[planners.slow]\ncommand = [" + json.dumps(sys.executable)
                      + ', "planner.py"]\ntimeout = 1\n')
    answers(proj, {"spawn_sleep": 30}, GOOD)
    done = plan(proj, planner="slow")
    assert done.rounds == 2
    [issue] = requests(proj)[1]["previous"]["issues"]
    assert issue["code"] == "planner"
    assert "timeout of 1 s" in issue["message"]
    child = int((proj.root / "child.pid").read_text())
    for _ in range(100):  # the kill is immediate; reaping by init may take a moment
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the planner's child outlived the timeout")


FLOOD = r"""
import os, sys
sys.stdin.read()
out = sys.stdout.buffer if sys.argv[1] == "stdout" else sys.stderr.buffer
chunk = b"x" * 65536
while True:  # until killed
    out.write(chunk)
"""


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_planner_that_floods_is_killed_at_the_bound_not_at_its_timeout(
        proj: Project, stream: str) -> None:
    """A planner writing without end filled the disk (~1 GB a second into a temporary
    file) until its timeout (300 s by default) before the 4 MiB bound was looked at
    (found by an attacker). It is killed as soon as it writes past the bound."""
    import time

    from planrun.planners.invoke import MAX_OUTPUT_BYTES, MAX_STDERR_BYTES

    proj.write("flood.py", FLOOD)
    proj.write_config("[planners.flood]\ncommand = [" + json.dumps(sys.executable)
                      + f', "flood.py", "{stream}"]\ntimeout = 120\n')
    started = time.monotonic()
    with pytest.raises(Refused) as caught:
        plan(proj, planner="flood", max_rounds=1)
    assert time.monotonic() - started < 60
    [issue] = caught.value.report.all_issues()
    assert issue.code == "planner"
    bound = MAX_OUTPUT_BYTES if stream == "stdout" else MAX_STDERR_BYTES
    assert f"more than {bound:,} bytes on {stream}" in issue.message, issue.message
    assert "timeout" not in issue.message, issue.message


def test_a_plan_cannot_carry_decisions(proj: Project) -> None:
    # A planner that tries to clear approvals, grant itself a tool or change the policy
    # inside the plan: the plan format has no such fields, the plan is refused (schema).
    sneaky = """\
        planrun: 1
        goal: Delete everything
        approvals: [{step: wipe, granted: true}]
        policy: {allowed_tools: [delete_all]}
        grants: [{tool: delete_all}]
        steps:
          - {id: wipe, tool: delete_all, arguments: {path: /}, approved: true,
             approve: true}
        """
    answers(proj, "\n".join(line[8:] for line in sneaky.splitlines()))
    with pytest.raises(Refused) as caught:
        plan(proj, max_rounds=1)
    issues = caught.value.report.all_issues()
    assert {i.code for i in issues} == {"schema"}
    assert {i.path for i in issues} == {"/approvals", "/policy", "/grants",
                                        "/steps/0/approved", "/steps/0/approve"}


def test_an_accepted_plan_still_needs_approval_at_execute(proj: Project) -> None:
    answers(proj, "planrun: 1\nname: wipe\ngoal: wipe\nsteps:\n"
            "  - {id: wipe, tool: delete_all, arguments: {path: x}}\n")
    done = plan(proj)
    from planrun.errors import ApprovalError

    with pytest.raises(ApprovalError):
        api.execute(proj.settings(), done.name, ParamInput())


# --- callables -----------------------------------------------------------------------------


def test_a_callable_planner_gets_the_request_and_may_return_a_dict(proj: Project) -> None:
    proj.write_module("myplanner", """
        SEEN = []

        def plan(request):
            SEEN.append(request)
            if request["round"] == 1:
                return {"planrun": 1, "goal": request["goal"], "steps": []}
            return {"planrun": 1, "name": "made", "goal": request["goal"],
                    "steps": [{"id": "a", "tool": "echo", "arguments": {"value": 1}}]}
        """)
    done = plan(proj, planner="python:myplanner:plan")
    assert (done.name, done.rounds) == ("made", 2)
    import myplanner  # type: ignore[import-not-found]

    assert [r["round"] for r in myplanner.SEEN] == [1, 2]
    assert myplanner.SEEN[1]["previous"]["issues"][0]["code"] == "empty"


@pytest.mark.parametrize(("body", "words"), [
    ("raise RuntimeError('no model')", "raised RuntimeError: no model"),
    ("return 42", "returned int, not a plan"),
    ("import time; time.sleep(30)", "past its timeout"),
])
def test_a_failing_callable_is_a_planner_issue(proj: Project, body: str, words: str) -> None:
    proj.write_module("badplanner", f"def plan(request):\n    {body}\n")
    proj.write_config('[planners.bad]\npython = "badplanner:plan"\ntimeout = 0.5\n')
    with pytest.raises(Refused) as caught:
        plan(proj, planner="bad", max_rounds=1)
    [issue] = caught.value.report.all_issues()
    assert issue.code == "planner"
    assert words in issue.message, issue.message


@pytest.mark.parametrize(("body", "words"), [
    # a dict nested past what json.dumps can follow: a RecursionError traceback
    ("d = {}\n    for _ in range(100000):\n        d = {'a': d}\n    return d",
     "nested too deeply"),
    # text with a lone surrogate: a UnicodeEncodeError traceback from the YAML reader
    ("return 'planrun: 1\\ngoal: \\udcff\\nsteps: []\\n'", "not UTF-8 text"),
    # a dict past the bound of a planner's output was accepted whatever its size
    ("return {'planrun': 1, 'goal': 'g' * (5 * 1024 * 1024), 'steps': []}",
     "a plan from a planner is at most"),
    # keys that are not strings became strings ({1: ...} read as {"1": ...})
    ("return {'planrun': 1, 'goal': 'g', 'steps': [], 1: 'x'}", "not a string"),
    ("d = {'planrun': 1, 'goal': 'g', 'steps': []}\n    d['x'] = d\n    return d",
     "Circular reference"),
])
def test_a_callable_answer_that_is_not_plan_data_is_a_planner_issue(
        proj: Project, body: str, words: str) -> None:
    """Found by an attacker: each answer was a traceback, or was repaired silently."""
    proj.write_module("oddplanner", f"def plan(request):\n    {body}\n")
    with pytest.raises(Refused) as caught:
        plan(proj, planner="python:oddplanner:plan", max_rounds=1)
    [issue] = caught.value.report.all_issues()
    assert issue.code == "planner"
    assert words in issue.message, issue.message


def test_a_callable_that_cannot_be_imported_is_a_planner_issue(proj: Project) -> None:
    with pytest.raises(Refused) as caught:
        plan(proj, planner="python:nosuchmodule:plan", max_rounds=1)
    [issue] = caught.value.report.all_issues()
    assert issue.code == "planner"
    assert "cannot import" in issue.message


# --- planner specs -------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["cmd:", "cmd:'unbalanced", "python:nocolon",
                                   "python:a:b:c", "nosuchplanner", ""])
def test_a_malformed_planner_value_is_a_usage_error(proj: Project, value: str) -> None:
    with pytest.raises(UsageError) as caught:
        resolve_planner(proj.settings(), value)
    assert caught.value.exit_code == 2


@pytest.mark.parametrize("table", [
    "[planners.p]\ntimeout = 3\n",
    '[planners.p]\ncommand = ["x"]\npython = "a:b"\n',
    "[planners.p]\ncommand = []\n",
    '[planners.p]\ncommand = ["x"]\ntimeout = 0\n',
    '[planners.p]\ncommand = ["x"]\nmax_rounds = 0\n',
    '[planners.p]\ncommand = ["x"]\nshell = true\n',
    '[planners.p]\npython = "not a target"\n',
    "[planners]\np = 3\n",
])
def test_a_bad_planner_table_is_a_config_error(proj: Project, table: str) -> None:
    proj.write_config(table)
    with pytest.raises(Refused) as caught:
        resolve_planner(proj.settings(), "p")
    assert (caught.value.code, caught.value.exit_code) == ("config", 3)


def test_a_planner_table_gives_timeout_and_max_rounds(proj: Project) -> None:
    proj.write_config('[planners.p]\ncommand = ["python3", "x.py"]\ntimeout = 2.5\n'
                      "max_rounds = 5\n")
    who = resolve_planner(proj.settings(), "p")
    assert (who.argv, who.timeout, who.max_rounds) == (("python3", "x.py"), 2.5, 5)
    answers(proj, WRONG)
    proj.write_config("[planners.p]\ncommand = [" + json.dumps(sys.executable)
                      + ', "planner.py"]\nmax_rounds = 4\n')
    with pytest.raises(Refused):
        plan(proj, planner="p")
    assert len(requests(proj)) == 4


def test_cmd_is_split_like_a_shell_and_run_without_one(proj: Project) -> None:
    proj.write("my planner.py", "import sys, json\nr = json.load(sys.stdin)\n"
               "print(json.dumps({'planrun': 1, 'name': 'x', 'goal': sys.argv[1], "
               "'steps': [{'id': 'a', 'tool': 'echo', 'arguments': {'value': sys.argv[2]}}]}))\n")
    done = plan(proj, planner=f"cmd:{shlex.quote(sys.executable)} 'my planner.py' "
                "'a $HOME goal' '$(echo no)'")
    assert done.data["goal"] == "a $HOME goal"
    assert done.data["steps"][0]["arguments"]["value"] == "$(echo no)"


# --- secrets -------------------------------------------------------------------------------


SECRET_PLAN = """\
planrun: 1
name: login
goal: Log in
params:
  user: {type: string}
  token: {type: string, secret: true}
steps:
  - {id: go, tool: echo, arguments: {value: "{params.user}", name: "{params.token}"}}
"""


def test_a_secret_never_reaches_the_planner_or_the_journal(
        proj: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    proj.write_plan("login", SECRET_PLAN)
    # The old file declares token secret: its -p value goes as a reference. A value given
    # in the environment is always a reference. The planner echoes what it got.
    monkeypatch.setenv("PLANRUN_PARAM_pin", "pin-4242-value")
    echo_back = SECRET_PLAN.replace("Log in", "Log in as {params.user}")
    answers(proj, "planrun: 1\ngoal: x\nsteps: []\n", echo_back)
    given = api.param_input(["user=alice", "token=tok-9999-secret"])
    done = plan(proj, name="login", given=given)
    assert done.revision == 2
    reqs = requests(proj)
    for req in reqs:
        assert req["params"] == {"user": "alice", "token": reference("token"),
                                 "pin": reference("pin")}
        assert "tok-9999-secret" not in json.dumps(req)
        assert "pin-4242-value" not in json.dumps(req)
    assert planner_env(proj) == [[], []]  # PLANRUN_PARAM_* never reach a planner
    journal = Path(proj.settings().journal).read_bytes()
    for wal in Path(proj.settings().journal).parent.glob("*.sqlite3-wal"):
        journal += wal.read_bytes()
    assert b"tok-9999-secret" not in journal
    assert b"pin-4242-value" not in journal
    assert b"alice" in journal  # a plain value is journaled (the params of the session)


def test_a_secret_a_proposal_declares_is_never_journaled(proj: Project) -> None:
    # A new plan: nothing says `token` is secret until the planner's plan declares it.
    answers(proj, SECRET_PLAN.replace('"{params.token}"', '"{params.token} tok-1234-val"'))
    given = api.param_input(["user=alice", "token=tok-1234-val"])
    done = plan(proj, given=given, concrete=True)
    assert done.name == "login"
    settings = proj.settings()
    [row] = api.runs(settings)
    events = json.dumps(run_events(proj, row["run_id"]))
    assert "tok-1234-val" not in events
    journal = Path(settings.journal).read_bytes()
    for wal in Path(settings.journal).parent.glob("*.sqlite3-wal"):
        journal += wal.read_bytes()
    assert b"tok-1234-val" not in journal
    assert b"alice" in journal


def test_a_secret_in_a_report_is_masked_before_it_is_sent_back(
        proj: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    # The planner's plan makes the secret fail its schema: the report would quote it.
    monkeypatch.setenv("PLANRUN_PARAM_token", "tok-9999-secret")
    bad = SECRET_PLAN.replace("token: {type: string, secret: true}",
                              "token: {type: integer, secret: true}").replace(
        "user: {type: string}", "user: {type: string, default: a}")
    answers(proj, bad)
    with pytest.raises(Refused) as caught:
        plan(proj, max_rounds=2, concrete=True)
    text = json.dumps([i.to_json() for i in caught.value.report.all_issues()])
    assert "tok-9999-secret" not in text
    assert "tok-9999-secret" not in json.dumps(requests(proj))


def test_a_name_with_two_dots_is_no_plan_name(proj: Project) -> None:
    # `a..b` was written as plans/a..b.yaml, which every command refuses to look up by
    # name (bad_name: a NAME with '..'), so the plan written could be run by none (found
    # by an attacker). A planner's such name gives way to the goal's slug; --name is refused.
    answers(proj, GOOD.replace("name: greet", "name: a..b"))
    done = plan(proj, goal="say hello")
    assert done.name == "say-hello"
    assert api.validate(proj.settings(), [done.name]).ok()
    with pytest.raises(UsageError, match=r"no '\.\.'"):
        plan(proj, name="x..y")
    assert not list(proj.plans.glob("*..*"))


def _journal_bytes(proj: Project) -> bytes:
    journal = Path(proj.settings().journal)
    return b"".join(f.read_bytes() for f in sorted(journal.parent.glob(journal.name + "*")))


def test_a_planner_cannot_make_a_secret_a_plain_value(proj: Project) -> None:
    # A value given in the environment goes to the planner as a reference; an answer that
    # declared `token` without `secret: true` made it plain: `execute --planner` ran it
    # and journaled PLANRUN_PARAM_token's value in clear (found by an attacker). Now the
    # answer is refused (param_type at /params/token) and sent back; the next is run.
    import os

    from harness import run_planrun

    plain = SECRET_PLAN.replace("token: {type: string, secret: true}",
                                "token: {type: string}")
    answers(proj, plain, SECRET_PLAN)
    env = {**os.environ, "PLANRUN_PARAM_token": "tok-7777-secret"}
    done = run_planrun("execute", "--planner", command(), "--goal", "log in",
                       "-p", "user=alice", "--json", cwd=proj.root, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "completed"
    _, second = requests(proj)
    [issue] = second["previous"]["issues"]
    assert (issue["code"], issue["path"], issue["line"]) == ("param_type", "/params/token", 6)
    assert "secret: true" in issue["message"]
    assert "PLANRUN_PARAM_" in issue["message"]
    assert b"tok-7777-secret" not in _journal_bytes(proj)
    assert "tok-7777-secret" not in done.stdout + done.stderr


def test_a_revision_cannot_drop_the_secrecy_of_the_plan_it_replaces(proj: Project) -> None:
    # The plan being replaced declares `token` secret; a revision without it would have
    # been written as plans/login.yaml revision 2, and every later run journaled the value.
    proj.write_plan("login", SECRET_PLAN)
    plain = SECRET_PLAN.replace("token: {type: string, secret: true}",
                                "token: {type: string, description: now plain}")
    answers(proj, plain)
    with pytest.raises(Refused) as caught:
        plan(proj, name="login", max_rounds=2)
    assert caught.value.code == "replan_exhausted"
    [issue] = caught.value.report.all_issues()
    assert (issue.code, issue.path) == ("param_type", "/params/token")
    assert "the plan it replaces" in issue.message
    assert (proj.plans / "login.yaml").read_text() == SECRET_PLAN  # nothing written


def test_planner_params_hide_declared_and_environment_secrets() -> None:
    given = ParamInput(cli={"a": "1", "s": "x"}, file_values={"f": [1]},
                       env={"E": "e", "e": "e"})
    p = PlannerParams(given, {"s"})
    assert p.request() == {"a": "1", "s": reference("s"), "f": [1], "e": reference("e")}
    p.learn({"params": {"a": {"type": "string", "secret": True}}})
    assert p.request()["a"] == reference("a")
    assert sorted(p.secrets().values) == ["a", "e", "s"]


# --- the core as repair uses it --------------------------------------------------------------


def test_propose_with_an_extra_check_and_an_event_session(proj: Project) -> None:
    from planrun.issues import Issue

    proj.write_plan("base", GOOD)
    from conftest import execute_plan

    manifest = execute_plan(proj, "base")
    answers(proj, GOOD, GOOD.replace("hi", "hello"))

    def no_hi(checked: Any, data: Any) -> list[Issue]:
        args = checked.by_id["hello"].arguments
        return [Issue(code="repair_changes_succeeded", message="hi is taken",
                      step="hello")] if "hi" in json.dumps(data) and args else []

    settings = proj.settings()
    registry = api.load_registry(settings)
    base = request_base(registry, goal="g", mode="repair", params={"p": 1},
                        run={"run_id": manifest["run_id"]})
    accepted = propose(settings, resolve_planner(settings, command()), base, max_rounds=2,
                       registry=registry, extra_check=no_hi,
                       session=EventSession(settings.journal, manifest["run_id"]))
    assert accepted.round == 2
    first, second = requests(proj)
    assert first["mode"] == "repair"
    assert first["run"] == {"run_id": manifest["run_id"]}
    assert first["params"] == {"p": 1}
    assert second["previous"]["issues"][0]["code"] == "repair_changes_succeeded"
    kinds = [e["kind"] for e in run_events(proj, manifest["run_id"])]
    assert kinds[-3:] == ["plan_proposed", "plan_refused", "plan_proposed"]


def test_propose_needs_at_least_one_round(proj: Project) -> None:
    settings = proj.settings()
    registry = api.load_registry(settings)
    with pytest.raises(UsageError):
        propose(settings, resolve_planner(settings, command()),
                request_base(registry, goal="g"), max_rounds=0, registry=registry)
    assert requests(proj) == []
