"""The scheduler, in process, through ``planrun.api.execute`` (SPEC §2, §3, §5).

Each test writes a small project into ``tmp_path``: python tools in ``xtools.py`` (every
call is appended to ``calls.log``) and command tools as script files run without a shell
wrapper. Concurrency is shown with a barrier that only opens when N calls are inside at
once, never with timings.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import Project, by_step, execute_plan, run_events
from planrun.journal import Journal

MODULE = '''
import asyncio
import threading
from pathlib import Path

import planrun

HERE = Path(__file__).resolve().parent
_LOCK = threading.Lock()
_BARRIERS = {}


def _record(name):
    with _LOCK, open(HERE / "calls.log", "a", encoding="utf-8") as f:
        f.write(name + "\\n")


def mark(name, value=None):
    _record(name)
    return {"name": name, "value": value}


def boom(name, value=None):
    _record(name)
    raise RuntimeError(f"{name} exploded")


def produce(name, value=None):
    _record(name)
    return {"x": 1, "nested": {"y": [10, 20]}}


def odd(name, value=None):
    """Outputs the journal must write as their JSON reads back (and their reference form)."""
    import enum

    class Level(enum.IntEnum):
        HIGH = 3

    _record(name)
    return {"markers": {"k\ufdd0": "v\ufdd1\ufdd2"}, "keys": {1: "x", "t": (1, 2)},
            "text": {"é": "ü ✓"}, "enum": Level.HIGH, "float": 2.5}[value]


def badout(name, value=None):
    _record(name)
    return {"n": "three"}


def collide(name, value=None):
    _record(name)
    return {"top": {1: "a", "1": "b"}, "nested": {"ok": [{"x": 1, True: 2, "true": 3}]},
            "none": {None: 1, "null": 2}}[value]


def notjson(name, value=None):
    _record(name)
    return {"when": {1, 2}}


def whoami(name, value=None):
    ctx = planrun.context()
    _record(f"{name}@{ctx.attempt}")
    if value is not None and ctx.attempt < value:
        raise RuntimeError(f"not before attempt {value}")
    return {"run_id": ctx.run_id, "step_id": ctx.step_id, "item_index": ctx.item_index,
            "key": ctx.idempotency_key, "attempt": ctx.attempt}


def peek(name, value=None):
    """What the journal says about this call while it runs (read from another connection)."""
    import os
    from planrun.journal import Journal

    ctx = planrun.context()
    with Journal(Path(os.environ["PLANRUN_JOURNAL"]), write=False) as j:
        rows = {r["step_id"]: r for r in j.step_rows(ctx.run_id)}
        done, _ = j.succeeded_key(ctx.idempotency_key)
    me = rows[ctx.step_id]
    _record(name)
    return {"status": me["status"], "key": me["idempotency_key"], "attempts": me["attempts"],
            "key_is_ctx_key": me["idempotency_key"] == ctx.idempotency_key,
            "key_succeeded": done,
            "others": {sid: r["status"] for sid, r in rows.items() if sid != ctx.step_id}}


async def amark(name, value=None):
    await asyncio.sleep(0)
    ctx = planrun.context()
    _record(name)
    return {"name": name, "value": value, "step": ctx.step_id,
            "in_loop": asyncio.get_running_loop() is not None}


def meet(name, value):
    """Wait at a barrier of ``value["parties"]`` calls; fails when it never fills."""
    parties, wait_s = value["parties"], value["wait_s"]
    with _LOCK:
        barrier = _BARRIERS.setdefault(parties, threading.Barrier(parties, timeout=wait_s))
    barrier.wait()
    _record(name)
    return {"name": name}
'''

PY_ARGS = """
    arguments:
      type: object
      properties:
        name: {type: string}
        value: {}
      required: [name]
      additionalProperties: false"""

TOOLS = f"""
tools:
  mark:
    python: xtools:mark{PY_ARGS}
  boom:
    python: xtools:boom{PY_ARGS}
  produce:
    python: xtools:produce{PY_ARGS}
  odd:
    python: xtools:odd{PY_ARGS}
  badout:
    python: xtools:badout{PY_ARGS}
    output_schema:
      type: object
      properties:
        n: {{type: integer}}
      required: [n]
  notjson:
    python: xtools:notjson{PY_ARGS}
  collide:
    python: xtools:collide{PY_ARGS}
  dupjson:
    command: [{json.dumps(sys.executable)}, "dupjson.py"]
    output: json
    arguments: {{type: object, additionalProperties: false}}
  whoami:
    python: xtools:whoami
    retries: {{max_attempts: 3}}{PY_ARGS}
  amark:
    python: xtools:amark{PY_ARGS}
  peek:
    python: xtools:peek{PY_ARGS}
  meet:
    python: xtools:meet{PY_ARGS}
  flaky:
    command: ["sh", "flaky.sh", "{{fail_times}}", "{{code}}"]
    retries: {{max_attempts: 5, backoff_s: 0, on_exit_codes: [75]}}
    arguments:
      type: object
      properties:
        fail_times: {{type: integer}}
        code: {{type: integer}}
      required: [fail_times, code]
      additionalProperties: false
  stubborn:
    command: ["sh", "stubborn.sh"]
    timeout: 0.5
    retries: {{max_attempts: 3}}
    arguments: {{type: object, additionalProperties: false}}
  sleepy:
    command: ["sh", "sleepy.sh"]
    idempotent: true
    timeout: 2
    retries: {{max_attempts: 2}}
    arguments: {{type: object, additionalProperties: false}}
  envdump:
    command: [{json.dumps(sys.executable)}, "envdump.py", "{{label}}"]
    output: json
    arguments:
      type: object
      properties:
        label: {{type: string}}
        n: {{type: integer}}
        nested: {{type: object}}
      required: [label]
      additionalProperties: false
"""

# Fails (exit $2) the first $1 times it is called; counts its calls in flaky.count.
FLAKY = """
n=$(cat flaky.count 2>/dev/null || echo 0)
n=$((n + 1))
echo "$n" > flaky.count
echo "$PLANRUN_ATTEMPT" >> flaky.attempts
if [ "$n" -le "$1" ]; then
  echo "failure number $n" >&2
  exit "$2"
fi
echo "ok after $n"
"""

# Does not stop on SIGTERM (records it and carries on): only SIGKILL ends it.
STUBBORN = """
echo "$$" > stubborn.pid
trap 'echo TERM >> stubborn.signals' TERM
i=0
while [ "$i" -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
echo finished > stubborn.done
"""

# Hangs on its first attempt (and dies on SIGTERM), answers on the next.
SLEEPY = """
echo "$PLANRUN_ATTEMPT" >> sleepy.attempts
if [ "$PLANRUN_ATTEMPT" = 1 ]; then exec sleep 30; fi
echo "done on attempt $PLANRUN_ATTEMPT"
"""

ENVDUMP = """
import json, os, sys
names = ["PLANRUN_RUN_ID", "PLANRUN_STEP_ID", "PLANRUN_ITEM_INDEX", "PLANRUN_IDEMPOTENCY_KEY",
         "PLANRUN_ATTEMPT"]
print(json.dumps({"stdin": json.load(sys.stdin), "argv": sys.argv[1:],
                  "env": {k: os.environ.get(k) for k in names}, "cwd": os.getcwd()}))
"""


@pytest.fixture
def xproject(project: Project) -> Project:
    project.write_tools(TOOLS, module=MODULE, module_name="xtools")
    project.write("flaky.sh", FLAKY)
    project.write("stubborn.sh", STUBBORN)
    project.write("sleepy.sh", SLEEPY)
    project.write("envdump.py", ENVDUMP)
    project.write("dupjson.py", 'print(\'{"a": 1, "b": {"k": 1, "k": 2}}\')\n')
    return project


def calls(project: Project) -> list[str]:
    log = project.root / "calls.log"
    return log.read_text().split() if log.exists() else []


def plan(project: Project, name: str, steps: str, params: str = "") -> None:
    head = "planrun: 1\ngoal: test the executor\n"
    if params:
        head += "params:\n" + "\n".join("  " + line for line in params.strip().splitlines())
        head += "\n"
    project.write_plan(name, head + "steps:\n" + steps.strip("\n") + "\n")


def step_rows(project: Project, run_id: str) -> dict[str, dict[str, Any]]:
    with Journal(project.settings().journal, write=False) as j:
        return {r["step_id"]: r for r in j.step_rows(run_id)}


def statuses(manifest: dict[str, Any]) -> dict[str, str]:
    return {s["id"]: s["status"] for s in manifest["steps"]}


def event_steps(project: Project, run_id: str, kind: str) -> list[str]:
    return [e["step"] for e in run_events(project, run_id, kind)]


# --- order and failures -------------------------------------------------------------------


def test_steps_run_in_dependency_order(xproject: Project) -> None:
    # Written in reverse so that file order cannot explain the result.
    plan(xproject, "diamond", """
  - {id: d, tool: mark, depends_on: [b, c], arguments: {name: d}}
  - {id: c, tool: mark, depends_on: [a], arguments: {name: c}}
  - {id: b, tool: mark, depends_on: [a], arguments: {name: b}}
  - {id: a, tool: mark, arguments: {name: a}}
""")
    m = execute_plan(xproject, "diamond")
    assert m["status"] == "completed"
    log = calls(xproject)
    assert sorted(log) == ["a", "b", "c", "d"]
    assert log[0] == "a"
    assert log[-1] == "d"
    events = run_events(xproject, m["run_id"])
    pos = {(e["kind"], e["step"]): n for n, e in enumerate(events)}
    for dep, step in [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")]:
        assert pos[("step_succeeded", dep)] < pos[("step_started", step)]


def test_ready_steps_are_dispatched_in_written_order(xproject: Project) -> None:
    plan(xproject, "ties", """
  - {id: z, tool: mark, arguments: {name: z}}
  - {id: m, tool: mark, arguments: {name: m}}
  - {id: a, tool: mark, arguments: {name: a}}
""")
    m = execute_plan(xproject, "ties", max_parallel=1)
    assert calls(xproject) == ["z", "m", "a"]
    assert event_steps(xproject, m["run_id"], "step_started") == ["z", "m", "a"]


FAILING = """
  - {id: bad, tool: boom, arguments: {name: bad}}
  - {id: other, tool: mark, arguments: {name: other}}
  - {id: child, tool: mark, depends_on: [bad], arguments: {name: child}}
  - {id: cousin, tool: mark, depends_on: [other], arguments: {name: cousin}}
"""


def test_a_failure_stops_new_dispatch_and_skips_dependents(xproject: Project) -> None:
    plan(xproject, "failing", FAILING)
    m = execute_plan(xproject, "failing", max_parallel=1)
    assert m["status"] == "failed"
    assert calls(xproject) == ["bad"]
    steps = by_step(m)
    assert steps["bad"]["status"] == "failed"
    assert steps["bad"]["error"]["code"] == "tool_error"
    assert "bad exploded" in steps["bad"]["error"]["message"]
    assert statuses(m) == {"bad": "failed", "other": "skipped", "child": "skipped",
                           "cousin": "skipped"}
    assert steps["child"]["error"]["code"] == "dependency"
    assert "bad" in steps["child"]["error"]["message"]
    skipped = {e["step"]: e["data"]["reason"]
               for e in run_events(xproject, m["run_id"], "step_skipped")}
    assert skipped["child"] == "dependency"
    assert skipped["other"] != "dependency"  # not dispatched because the run stopped
    assert event_steps(xproject, m["run_id"], "step_started") == ["bad"]
    assert m["counts"]["failed"] == 1
    assert m["counts"]["skipped"] == 3
    assert m["next"] == f"planrun retry {m['run_id']}"


def test_keep_going_runs_the_steps_that_do_not_depend_on_the_failure(xproject: Project
                                                                     ) -> None:
    plan(xproject, "failing", FAILING)
    m = execute_plan(xproject, "failing", max_parallel=1, keep_going=True)
    assert m["status"] == "failed"
    assert calls(xproject) == ["bad", "other", "cousin"]
    assert statuses(m) == {"bad": "failed", "other": "succeeded", "child": "skipped",
                           "cousin": "succeeded"}
    assert by_step(m)["child"]["error"]["code"] == "dependency"


def test_a_skip_reaches_every_transitive_dependent(xproject: Project) -> None:
    plan(xproject, "chain", """
  - {id: a, tool: boom, arguments: {name: a}}
  - {id: b, tool: mark, depends_on: [a], arguments: {name: b}}
  - {id: c, tool: mark, depends_on: [b], arguments: {name: c}}
""")
    m = execute_plan(xproject, "chain", keep_going=True)
    assert statuses(m) == {"a": "failed", "b": "skipped", "c": "skipped"}
    assert "'b'" in by_step(m)["c"]["error"]["message"]
    assert calls(xproject) == ["a"]


@pytest.mark.parametrize("shape", ["chain", "wide"])
def test_the_skips_after_a_failure_share_one_commit(
        xproject: Project, sqlite_commits: list[int], shape: str) -> None:
    """200 steps a failure skips do not take a commit each (issue 16).

    ``chain``: each depends on the one before (skipped as a blocked dependent); ``wide``:
    independent, their tasks already waiting for one of ``max_parallel`` 1 slot when the
    first step fails (skipped by the stop).
    """
    after = "depends_on: [s{prev}], " if shape == "chain" else ""
    steps = ["  - {id: s0, tool: boom, arguments: {name: s0}}"] + [
        f"  - {{id: s{i}, tool: mark, {after.format(prev=i - 1)}arguments: {{name: s{i}}}}}"
        for i in range(1, 201)]
    plan(xproject, "many", "\n".join(steps))
    commits = sqlite_commits
    m = execute_plan(xproject, "many", max_parallel=1)
    assert statuses(m) == {"s0": "failed", **{f"s{i}": "skipped" for i in range(1, 201)}}
    assert len(run_events(xproject, m["run_id"], "step_skipped")) == 200
    assert len(commits) < 20  # the run's own records; was over 200 (one a skip)
    assert calls(xproject) == ["s0"]


# --- retries ----------------------------------------------------------------------------------


def test_a_command_is_retried_on_a_listed_exit_code(xproject: Project) -> None:
    plan(xproject, "flaky", "  - {id: f, tool: flaky, arguments: {fail_times: 2, code: 75}}")
    m = execute_plan(xproject, "flaky")
    assert m["status"] == "completed"
    assert (xproject.root / "flaky.count").read_text().strip() == "3"
    assert (xproject.root / "flaky.attempts").read_text().split() == ["1", "2", "3"]
    step = by_step(m)["f"]
    assert step["attempts"] == 3
    retried = run_events(xproject, m["run_id"], "step_retried")
    assert [e["data"]["attempt"] for e in retried] == [1, 2]
    assert [e["data"]["error"]["exit_code"] for e in retried] == [75, 75]
    assert "failure number 1" in retried[0]["data"]["error"]["message"]
    assert [e["data"]["attempt"] for e in run_events(xproject, m["run_id"],
                                                     "step_started")] == [1, 2, 3]
    from planrun import api

    assert api.output(xproject.settings(), m["run_id"], "f") == "ok after 3"


def test_an_exit_code_not_listed_is_not_retried(xproject: Project) -> None:
    plan(xproject, "flaky", "  - {id: f, tool: flaky, arguments: {fail_times: 2, code: 3}}")
    m = execute_plan(xproject, "flaky")
    assert m["status"] == "failed"
    assert (xproject.root / "flaky.count").read_text().strip() == "1"
    step = by_step(m)["f"]
    assert step["attempts"] == 1
    assert step["error"]["code"] == "exit_status"
    assert "failure number 1" in step["error"]["message"]  # the tail of stderr
    assert run_events(xproject, m["run_id"], "step_retried") == []


def test_retries_stop_at_max_attempts(xproject: Project) -> None:
    plan(xproject, "flaky", "  - {id: f, tool: flaky, arguments: {fail_times: 99, code: 75}}")
    m = execute_plan(xproject, "flaky")
    assert m["status"] == "failed"
    assert (xproject.root / "flaky.count").read_text().strip() == "5"
    assert by_step(m)["f"]["attempts"] == 5
    retried = run_events(xproject, m["run_id"], "step_retried")
    assert [e["data"]["attempt"] for e in retried] == [1, 2, 3, 4]


def test_retry_backoff_doubles_per_attempt(xproject: Project) -> None:
    plan(xproject, "flaky", """
  - id: f
    tool: flaky
    arguments: {fail_times: 3, code: 75}
    retries: {max_attempts: 4, backoff_s: 0.01, on_exit_codes: [75]}
""")
    m = execute_plan(xproject, "flaky")
    assert m["status"] == "completed"
    retried = run_events(xproject, m["run_id"], "step_retried")
    assert [e["data"]["backoff_s"] for e in retried] == [0.01, 0.02, 0.04]


def test_a_step_can_override_the_tools_retries(xproject: Project) -> None:
    plan(xproject, "flaky", """
  - id: f
    tool: flaky
    arguments: {fail_times: 2, code: 75}
    retries: {max_attempts: 2, on_exit_codes: [75]}
""")
    m = execute_plan(xproject, "flaky")
    assert m["status"] == "failed"
    assert (xproject.root / "flaky.count").read_text().strip() == "2"


# --- timeouts ---------------------------------------------------------------------------------


def test_a_timed_out_command_is_killed_and_a_non_idempotent_step_is_indeterminate(
        xproject: Project) -> None:
    plan(xproject, "stuck", """
  - {id: stuck, tool: stubborn}
  - {id: after, tool: mark, depends_on: [stuck], arguments: {name: after}}
""")
    m = execute_plan(xproject, "stuck")
    root = xproject.root
    # SIGTERM came first; the script ignored it; SIGKILL ended it.
    assert "TERM" in (root / "stubborn.signals").read_text()
    assert not (root / "stubborn.done").exists()
    pid = int((root / "stubborn.pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    step = by_step(m)["stuck"]
    assert step["status"] == "indeterminate"
    assert step["error"]["code"] == "timeout"
    assert step["attempts"] == 1  # not retried: its effect is unknown
    assert run_events(xproject, m["run_id"], "step_retried") == []
    assert m["status"] != "completed"
    assert by_step(m)["after"]["status"] == "skipped"
    assert calls(xproject) == []
    # The key stays claimed: a later run must not assume the call did nothing.
    rows = step_rows(xproject, m["run_id"])
    with Journal(xproject.settings().journal, write=False) as j:
        assert j.succeeded_key(rows["stuck"]["idempotency_key"]) == (False, None)
        claimed = j.key(rows["stuck"]["idempotency_key"])
        assert claimed is not None
        assert claimed.status == "running"


def test_a_timed_out_idempotent_step_is_retried(xproject: Project) -> None:
    plan(xproject, "sleepy", "  - {id: s, tool: sleepy}")
    m = execute_plan(xproject, "sleepy")
    assert m["status"] == "completed"
    assert (xproject.root / "sleepy.attempts").read_text().split() == ["1", "2"]
    assert by_step(m)["s"]["attempts"] == 2
    retried = run_events(xproject, m["run_id"], "step_retried")
    assert [(e["data"]["attempt"], e["data"]["error"]["code"]) for e in retried] == [
        (1, "timeout")]
    from planrun import api

    assert api.output(xproject.settings(), m["run_id"], "s") == "done on attempt 2"


# --- conditions, references, outputs ---------------------------------------------------------

GATED = """
  - {id: first, tool: mark, arguments: {name: first}}
  - {id: gated, tool: mark, depends_on: [first], when: "params.go", arguments: {name: gated}}
  - {id: after, tool: mark, depends_on: [gated], arguments: {name: after}}
  - {id: last, tool: mark, depends_on: [after], arguments: {name: last}}
  - {id: other, tool: mark, depends_on: [first], arguments: {name: other}}
"""


def test_a_false_condition_skips_the_step_and_its_dependents(xproject: Project) -> None:
    plan(xproject, "gated", GATED, params="go: {type: boolean}")
    m = execute_plan(xproject, "gated", {"go": False})
    assert m["status"] == "completed"
    assert sorted(calls(xproject)) == ["first", "other"]
    assert statuses(m) == {"first": "succeeded", "gated": "skipped", "after": "skipped",
                           "last": "skipped", "other": "succeeded"}
    reasons = {e["step"]: e["data"]["reason"]
               for e in run_events(xproject, m["run_id"], "step_skipped")}
    assert reasons == {"gated": "condition", "after": "condition", "last": "condition"}
    assert by_step(m)["gated"]["error"]["code"] == "condition"


def test_a_true_condition_runs_the_step(xproject: Project) -> None:
    plan(xproject, "gated", GATED, params="go: {type: boolean}")
    m = execute_plan(xproject, "gated", {"go": True})
    assert set(statuses(m).values()) == {"succeeded"}
    assert sorted(calls(xproject)) == ["after", "first", "gated", "last", "other"]


def test_a_condition_can_read_an_ancestors_output(xproject: Project) -> None:
    plan(xproject, "byoutput", """
  - {id: p, tool: produce, arguments: {name: p}}
  - {id: yes, tool: mark, depends_on: [p], when: "steps.p.output.x == 1", arguments: {name: y}}
  - {id: no, tool: mark, depends_on: [p], when: "steps.p.output.x == 2", arguments: {name: n}}
""")
    m = execute_plan(xproject, "byoutput")
    assert statuses(m) == {"p": "succeeded", "yes": "succeeded", "no": "skipped"}
    assert sorted(calls(xproject)) == ["p", "y"]


def test_a_condition_that_fails_at_run_time_fails_the_step(xproject: Project) -> None:
    plan(xproject, "badwhen", """
  - {id: p, tool: produce, arguments: {name: p}}
  - {id: c, tool: mark, depends_on: [p], when: "steps.p.output.nope == 1", arguments: {name: c}}
""")
    m = execute_plan(xproject, "badwhen")
    step = by_step(m)["c"]
    assert step["status"] == "failed"
    assert step["error"]["code"] == "condition"
    assert calls(xproject) == ["p"]


def test_a_missing_output_path_fails_the_step_before_its_tool_is_called(xproject: Project
                                                                        ) -> None:
    plan(xproject, "missing", """
  - {id: p, tool: produce, arguments: {name: p}}
  - id: c
    tool: mark
    depends_on: [p]
    arguments: {name: c, value: "{steps.p.output.nested.nope}"}
  - {id: d, tool: mark, depends_on: [c], arguments: {name: d}}
""")
    m = execute_plan(xproject, "missing")
    assert m["status"] == "failed"
    step = by_step(m)["c"]
    assert step["status"] == "failed"
    assert step["error"]["code"] == "reference"
    assert "nope" in step["error"]["message"]
    assert calls(xproject) == ["p"]  # the tool of c was never called
    assert event_steps(xproject, m["run_id"], "step_started") == ["p"]
    assert by_step(m)["d"]["status"] == "skipped"


def test_run_time_references_keep_native_types_and_render_embedded(xproject: Project
                                                                   ) -> None:
    plan(xproject, "refs", """
  - {id: p, tool: produce, arguments: {name: p}}
  - id: c
    tool: mark
    depends_on: [p]
    arguments:
      name: c
      value: {whole: "{steps.p.output.nested}", leaf: "{steps.p.output.nested.y.1}",
              text: "x={steps.p.output.x}!"}
""")
    m = execute_plan(xproject, "refs")
    assert m["status"] == "completed"
    from planrun import api

    out = api.output(xproject.settings(), m["run_id"], "c")
    assert out["value"] == {"whole": {"y": [10, 20]}, "leaf": 20, "text": "x=1!"}


ODD = {"markers": {"k\ufdd0": "v\ufdd1\ufdd2"}, "keys": {"1": "x", "t": [1, 2]},
       "text": {"é": "ü ✓"}, "enum": 3, "float": 2.5}


@pytest.mark.parametrize("kind", sorted(ODD))
def test_an_output_is_journaled_as_its_json_reads_back(xproject: Project, kind: str) -> None:
    """The journal's text of an output is the text of the value later steps see.

    A value with marker characters is stored escaped (the reference form) and the next
    step is called with it as it was; ``{1: ...}``, a tuple and an ``IntEnum`` are what
    their JSON reads back as.
    The output is written once to check it and that text is journaled: it must be
    exactly what writing the value that steps see would give.
    """
    from planrun import api
    from planrun.journal.records import dumps

    plan(xproject, "odd", f"""
  - {{id: a, tool: odd, arguments: {{name: a, value: {kind}}}}}
  - {{id: b, tool: mark, depends_on: [a], arguments: {{name: b, value: "{{steps.a.output}}"}}}}
""")
    m = execute_plan(xproject, "odd")
    assert m["status"] == "completed", m
    from planrun.redact import reveal

    # api.output gives the reference form; the tool of step b was called with the value
    assert reveal(api.output(xproject.settings(), m["run_id"], "a"), {}) == ODD[kind]
    assert reveal(api.output(xproject.settings(), m["run_id"], "b"), {})["value"] == ODD[kind]
    stored = step_rows(xproject, m["run_id"])["a"]["output_json"]
    if kind == "markers":
        assert "\ufdd2\ufdd0" in stored  # escaped: not a reference
    else:
        assert stored == dumps(ODD[kind])


def test_an_output_that_does_not_match_output_schema_fails_with_code_output(
        xproject: Project) -> None:
    plan(xproject, "badout", "  - {id: b, tool: badout, arguments: {name: b}}")
    m = execute_plan(xproject, "badout")
    step = by_step(m)["b"]
    assert step["status"] == "failed"
    assert step["error"]["code"] == "output"
    assert calls(xproject) == ["b"]
    with Journal(xproject.settings().journal, write=False) as j:
        key = step_rows(xproject, m["run_id"])["b"]["idempotency_key"]
        assert j.succeeded_key(key) == (False, None)


def test_an_output_that_is_not_json_data_fails_with_code_output(xproject: Project) -> None:
    plan(xproject, "notjson", "  - {id: n, tool: notjson, arguments: {name: n}}")
    m = execute_plan(xproject, "notjson")
    step = by_step(m)["n"]
    assert step["status"] == "failed"
    assert step["error"]["code"] == "output"


@pytest.mark.parametrize("value", ["top", "nested", "none"])
def test_an_output_whose_keys_collide_as_json_fails_with_code_output(xproject: Project,
                                                                     value: str) -> None:
    """``{1: "a", "1": "b"}`` would be journaled as one key: a value lost unseen (found by
    a fresh helper). The step fails instead, saying why."""
    plan(xproject, "collide", f"  - {{id: c, tool: collide, arguments: {{name: c, value: "
         f"{value}}}}}")
    step = by_step(execute_plan(xproject, "collide"))["c"]
    assert step["status"] == "failed"
    assert step["error"]["code"] == "output"
    assert "same JSON text" in step["error"]["message"]


def test_a_command_printing_a_key_twice_fails_with_code_output(xproject: Project) -> None:
    """JSON on a command's stdout with a key repeated in one object (json keeps the last)."""
    plan(xproject, "dupjson", "  - {id: d, tool: dupjson}")
    step = by_step(execute_plan(xproject, "dupjson"))["d"]
    assert step["status"] == "failed"
    assert step["error"]["code"] == "output"
    assert 'the key "k" twice' in step["error"]["message"]


def test_the_dispatch_record_is_committed_before_the_call(xproject: Project) -> None:
    plan(xproject, "peek", """
  - {id: before, tool: mark, arguments: {name: before}}
  - {id: look, tool: peek, depends_on: [before], arguments: {name: look}}
  - {id: later, tool: mark, depends_on: [look], arguments: {name: later}}
""")
    m = execute_plan(xproject, "peek")
    assert m["status"] == "completed"
    from planrun import api

    seen = api.output(xproject.settings(), m["run_id"], "look")
    assert seen["status"] == "running"
    assert seen["key_is_ctx_key"] is True
    assert seen["key_succeeded"] is False
    assert seen["attempts"] == 1
    assert seen["others"] == {"before": "succeeded", "later": "pending"}


# --- python tools -----------------------------------------------------------------------------


def test_async_python_tools_run(xproject: Project) -> None:
    plan(xproject, "async", """
  - {id: one, tool: amark, arguments: {name: one, value: [1, 2]}}
  - {id: two, tool: amark, depends_on: [one], arguments: {name: two}}
""")
    m = execute_plan(xproject, "async")
    assert m["status"] == "completed"
    assert calls(xproject) == ["one", "two"]
    from planrun import api

    assert api.output(xproject.settings(), m["run_id"], "one") == {
        "name": "one", "value": [1, 2], "step": "one", "in_loop": True}


def test_context_gives_run_step_key_and_attempt(xproject: Project) -> None:
    plan(xproject, "ctx", """
  - {id: who, tool: whoami, arguments: {name: who}}
  - {id: again, tool: whoami, arguments: {name: again, value: 3}}
""")
    m = execute_plan(xproject, "ctx")
    assert m["status"] == "completed"
    rows = step_rows(xproject, m["run_id"])
    from planrun import api

    who = api.output(xproject.settings(), m["run_id"], "who")
    assert who == {"run_id": m["run_id"], "step_id": "who", "item_index": None,
                   "key": rows["who"]["idempotency_key"], "attempt": 1}
    assert len(who["key"]) == 64
    again = api.output(xproject.settings(), m["run_id"], "again")
    assert again["attempt"] == 3
    assert again["step_id"] == "again"
    assert again["key"] == rows["again"]["idempotency_key"] != who["key"]
    assert sorted(calls(xproject)) == ["again@1", "again@2", "again@3", "who@1"]


def test_context_outside_a_tool_call_raises() -> None:
    import planrun

    with pytest.raises(LookupError):
        planrun.context()


# --- command tools ----------------------------------------------------------------------------


def test_command_tools_get_env_vars_argv_and_the_arguments_on_stdin(xproject: Project
                                                                    ) -> None:
    plan(xproject, "env", """
  - id: dump
    tool: envdump
    arguments: {label: "two words; $(rm -rf /)", n: 3, nested: {list: [1, "two", null], ok: true}}
""")
    m = execute_plan(xproject, "env")
    assert m["status"] == "completed"
    from planrun import api

    out = api.output(xproject.settings(), m["run_id"], "dump")
    assert out["stdin"] == {"label": "two words; $(rm -rf /)", "n": 3,
                            "nested": {"list": [1, "two", None], "ok": True}}
    assert out["argv"] == ["two words; $(rm -rf /)"]  # one element, no shell
    key = step_rows(xproject, m["run_id"])["dump"]["idempotency_key"]
    assert out["env"] == {"PLANRUN_RUN_ID": m["run_id"], "PLANRUN_STEP_ID": "dump",
                          "PLANRUN_ITEM_INDEX": None, "PLANRUN_IDEMPOTENCY_KEY": key,
                          "PLANRUN_ATTEMPT": "1"}
    assert Path(out["cwd"]).resolve() == xproject.root.resolve()


def test_fan_out_items_get_their_index(xproject: Project) -> None:
    plan(xproject, "fan", """
  - id: dump
    tool: envdump
    for_each: ["first", "second"]
    arguments: {label: "{item}", n: "{index}"}
""")
    m = execute_plan(xproject, "fan")
    assert m["status"] == "completed"
    from planrun import api

    outs = api.output(xproject.settings(), m["run_id"], "dump")
    assert [o["argv"] for o in outs] == [["first"], ["second"]]
    assert [o["stdin"] for o in outs] == [{"label": "first", "n": 0},
                                          {"label": "second", "n": 1}]
    assert [o["env"]["PLANRUN_ITEM_INDEX"] for o in outs] == ["0", "1"]
    assert [o["env"]["PLANRUN_STEP_ID"] for o in outs] == ["dump", "dump"]
    keys = [o["env"]["PLANRUN_IDEMPOTENCY_KEY"] for o in outs]
    assert len(set(keys)) == 2  # one key per item


# --- concurrency ------------------------------------------------------------------------------


def _meeting(n: int, wait_s: float) -> str:
    return "".join(
        f"  - {{id: m{i}, tool: meet, arguments: {{name: m{i}, "
        f"value: {{parties: {n}, wait_s: {wait_s}}}}}}}\n" for i in range(n))


def test_independent_steps_run_concurrently(xproject: Project) -> None:
    """Each call waits at a barrier for N parties: all succeed only if N run at once."""
    n = 4
    plan(xproject, "meeting", _meeting(n, 60))
    m = execute_plan(xproject, "meeting", max_parallel=n)
    assert m["status"] == "completed", m
    assert sorted(calls(xproject)) == [f"m{i}" for i in range(n)]


def test_max_parallel_bounds_concurrency(xproject: Project) -> None:
    """The same barrier never fills when only N-1 calls may run at once."""
    n = 3
    plan(xproject, "meeting", _meeting(n, 1))
    m = execute_plan(xproject, "meeting", max_parallel=n - 1)
    assert m["status"] == "failed"
    errors = {s["error"]["message"] for s in m["steps"] if s["status"] == "failed"}
    assert errors
    assert all("BrokenBarrierError" in e for e in errors)
    assert calls(xproject) == []


def test_resume_parses_a_replayed_output_only_when_a_step_reads_it(xproject: Project) -> None:
    """analyse (resume, retry) leaves replayed outputs in their journaled text until read."""
    from planrun.execution.common import Later
    from planrun.lifecycle import analyse

    plan(xproject, "chain", """
  - {id: a, tool: produce, arguments: {name: a, value: {n: 1}}}
  - {id: b, tool: mark, depends_on: [a], arguments: {name: b, value: "{steps.a.output}"}}
""")
    m = execute_plan(xproject, "chain")
    assert m["status"] == "completed"
    with Journal(xproject.settings().journal, write=False) as j:
        rows = j.steps(m["run_id"])
    found = analyse(rows, None, {})
    assert found.replay == ["a", "b"]
    held = found.state["a"].output
    assert isinstance(held, Later)
    assert "output" not in vars(held.record)  # not parsed yet
    from planrun import api

    assert held.load() == api.output(xproject.settings(), m["run_id"], "a")
    assert "output" in vars(held.record)
