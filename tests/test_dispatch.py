"""The dispatcher seam (SPEC §12): the real scheduler and journal, calls made by a script.

A :class:`~planrun.dispatch.scripted.ScriptedDispatcher` stands where tools would run, so
that ordering, concurrency limits, retries, timeouts and a worker lost mid-call can be
driven exactly; the journal, the manifest and resume/retry are the real ones.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from typing import Any

import pytest

from conftest import Project, by_step, execute_plan, run_events
from planrun.dispatch import CALL_LOST, Call, Watch
from planrun.dispatch.scripted import Fail, Hang, Lost, ScriptedDispatcher, Succeed
from planrun.errors import PlanrunError

TOOLS = """
tools:
  work:
    python: dtools:work
    idempotent: true
    arguments: {type: object, properties: {name: {type: string}}}
  once:
    python: dtools:work
    arguments: {type: object, properties: {name: {type: string}}}
    retries: {max_attempts: 3, backoff_s: 0}
  again:
    python: dtools:work
    idempotent: true
    arguments: {type: object, properties: {name: {type: string}}}
    retries: {max_attempts: 3, backoff_s: 0}
"""

MODULE = """
import json
import planrun


def work(name=None):
    ctx = planrun.context()
    with open("dcalls.log", "a") as f:
        f.write(json.dumps([ctx.step_id, ctx.idempotency_key]) + "\\n")
    return {"name": name}
"""


@pytest.fixture
def dproject(project: Project) -> Project:
    project.write_tools(TOOLS, module=MODULE, module_name="dtools")
    return project


def plan(project: Project, name: str, steps: str, extra: str = "") -> None:
    project.write_plan(name, "planrun: 1\ngoal: test the dispatcher seam\n" + extra
                       + "steps:\n" + steps.strip("\n") + "\n")


def run(project: Project, name: str, dispatcher: ScriptedDispatcher,
        params: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
    return execute_plan(project, name, params, dispatcher=dispatcher, **kwargs)


def status(manifest: dict[str, Any]) -> dict[str, str]:
    return {sid: s["status"] for sid, s in by_step(manifest).items()}


# --- ordering and concurrency -------------------------------------------------------------


def test_calls_follow_dependencies_then_the_written_order(dproject: Project) -> None:
    plan(dproject, "diamond", """
  - {id: d, tool: work, depends_on: [b, c]}
  - {id: c, tool: work, depends_on: [a]}
  - {id: b, tool: work, depends_on: [a]}
  - {id: a, tool: work}
  - {id: e, tool: work}
""")
    script = ScriptedDispatcher()
    manifest = run(dproject, "diamond", script, max_parallel=1)
    assert manifest["status"] == "completed"
    assert [c.context.step_id for c in script.calls] == ["a", "e", "c", "b", "d"]


def test_max_parallel_bounds_the_calls_running_at_once(dproject: Project) -> None:
    plan(dproject, "wide", "\n".join(f"  - {{id: s{i}, tool: work}}" for i in range(6)))
    script = ScriptedDispatcher(default=Succeed(seconds=0.05))
    manifest = run(dproject, "wide", script, max_parallel=2)
    assert manifest["status"] == "completed"
    assert len(script.calls) == 6
    assert script.most == 2


def test_a_pool_bounds_its_steps_below_max_parallel(dproject: Project) -> None:
    dproject.write_config("[pools]\nslow = 1\n")
    plan(dproject, "pooled", "\n".join(f"  - {{id: s{i}, tool: work, pool: slow}}"
                                       for i in range(4)))
    script = ScriptedDispatcher(default=Succeed(seconds=0.05))
    assert run(dproject, "pooled", script, max_parallel=4)["status"] == "completed"
    assert script.most == 1


def test_fan_out_items_are_called_in_index_order_within_the_steps_limit(
        dproject: Project) -> None:
    plan(dproject, "fan", """
  - id: f
    tool: work
    for_each: [a, b, c, d, e, f, g]
    max_parallel: 3
    arguments: {name: "{item}"}
""")
    script = ScriptedDispatcher(default=Succeed(seconds=0.05))
    manifest = run(dproject, "fan", script, max_parallel=4)
    assert manifest["status"] == "completed"
    assert [c.context.item_index for c in script.calls] == list(range(7))
    assert [c.arguments for c in script.calls][:2] == [{"name": "a"}, {"name": "b"}]
    assert script.most == 3


# --- retries and timeouts -----------------------------------------------------------------


def test_a_failed_call_is_retried_under_the_same_key(dproject: Project) -> None:
    plan(dproject, "flaky", "  - {id: a, tool: once}\n")
    script = ScriptedDispatcher({"a": [Fail(2), Fail(3), Succeed({"ok": True})]})
    manifest = run(dproject, "flaky", script)
    assert status(manifest) == {"a": "succeeded"}
    assert [c.context.attempt for c in script.calls] == [1, 2, 3]
    assert len({c.context.idempotency_key for c in script.calls}) == 1
    assert len(run_events(dproject, manifest["run_id"], "step_retried")) == 2


def test_retries_stop_at_max_attempts_and_the_run_fails(dproject: Project) -> None:
    plan(dproject, "bad", "  - {id: a, tool: once}\n  - {id: b, tool: work, depends_on: [a]}\n")
    script = ScriptedDispatcher({"a": Fail(9)})
    manifest = run(dproject, "bad", script)
    assert manifest["status"] == "failed"
    assert status(manifest) == {"a": "failed", "b": "skipped"}
    assert by_step(manifest)["a"]["error"]["code"] == "exit_status"
    assert len(script.calls) == 3


def test_a_hung_call_of_a_non_idempotent_tool_times_out_indeterminate(
        dproject: Project) -> None:
    plan(dproject, "hang", "  - {id: a, tool: once, timeout: 0.2}\n")
    script = ScriptedDispatcher({"a": Hang()})
    manifest = run(dproject, "hang", script)
    assert status(manifest) == {"a": "indeterminate"}
    assert by_step(manifest)["a"]["error"]["code"] == "timeout"
    assert len(script.calls) == 1  # its effect is unknown: never called again by itself
    assert script.calls[0].timeout == 0.2


def test_a_hung_call_of_an_idempotent_tool_is_retried(dproject: Project) -> None:
    plan(dproject, "hang2", "  - {id: a, tool: again, timeout: 0.2}\n")
    script = ScriptedDispatcher({"a": [Hang(), Succeed("done")]})
    manifest = run(dproject, "hang2", script)
    assert status(manifest) == {"a": "succeeded"}
    assert [c.context.attempt for c in script.calls] == [1, 2]


# --- a worker lost mid-call ---------------------------------------------------------------


def test_a_lost_call_is_indeterminate_and_stops_the_run(dproject: Project) -> None:
    plan(dproject, "lost", "  - {id: a, tool: once}\n  - {id: b, tool: work, depends_on: [a]}\n")
    script = ScriptedDispatcher({"a": Lost()})
    manifest = run(dproject, "lost", script)
    assert manifest["status"] == "failed"
    assert status(manifest) == {"a": "indeterminate", "b": "skipped"}
    assert by_step(manifest)["a"]["error"]["code"] == CALL_LOST
    assert len(script.calls) == 1  # a lost call is not retried: its effect is unknown


def test_a_lost_call_of_a_non_idempotent_tool_needs_a_person(dproject: Project) -> None:
    from planrun import api

    plan(dproject, "lost2", "  - {id: a, tool: once}\n")
    manifest = run(dproject, "lost2", ScriptedDispatcher({"a": Lost()}))
    with pytest.raises(PlanrunError) as exc:
        api.retry(dproject.settings(), manifest["run_id"])
    assert exc.value.code == "indeterminate"
    assert not (dproject.root / "dcalls.log").exists()  # nothing called it again


def test_a_lost_call_of_an_idempotent_tool_runs_again_under_the_same_key(
        dproject: Project) -> None:
    from planrun import api

    plan(dproject, "lost3", "  - {id: a, tool: work}\n  - {id: b, tool: work, depends_on: [a]}\n")
    script = ScriptedDispatcher({"a": Lost(seconds=0.01)})
    manifest = run(dproject, "lost3", script)
    assert status(manifest) == {"a": "indeterminate", "b": "skipped"}
    again = api.retry(dproject.settings(), manifest["run_id"])  # the local dispatcher
    assert again.manifest["status"] == "completed"
    called = (dproject.root / "dcalls.log").read_text().splitlines()
    keys = dict(json.loads(line) for line in called)
    assert keys["a"] == script.calls[0].context.idempotency_key


def test_a_lost_fan_out_item_leaves_the_others_done(dproject: Project) -> None:
    plan(dproject, "fanlost", """
  - id: f
    tool: once
    for_each: [a, b, c]
    max_parallel: 1
    arguments: {name: "{item}"}
""")
    script = ScriptedDispatcher({"f#1": Lost()})
    manifest = run(dproject, "fanlost", script)
    assert status(manifest) == {"f": "indeterminate"}
    assert [c.context.item_index for c in script.calls] == [0, 1]  # halted after the loss


# --- the call description -----------------------------------------------------------------


def test_a_call_is_plain_data_with_the_secrets_to_mask(dproject: Project) -> None:
    plan(dproject, "secret", "  - {id: a, tool: work, arguments: {name: \"{params.token}\"}}\n",
         extra="params:\n  token: {type: string, secret: true}\n")
    script = ScriptedDispatcher()
    run(dproject, "secret", script, {"token": "hunter22"})
    call = pickle.loads(pickle.dumps(script.calls[0]))
    assert isinstance(call, Call)
    assert (call.tool, call.arguments) == ("work", {"name": "hunter22"})
    assert "hunter22" not in call.secrets.conceal_text("said hunter22")


def test_only_the_local_dispatcher_changes_the_process(dproject: Project) -> None:
    seen: list[tuple[str, Any]] = []

    class Looking(ScriptedDispatcher):
        async def call(self, call: Call, watch: Watch) -> Any:
            seen.append((os.getcwd(), sys.stdout))
            return await super().call(call, watch)

    plan(dproject, "look", "  - {id: a, tool: work}\n")
    here, out = os.getcwd(), sys.stdout
    assert str(dproject.root) != here
    run(dproject, "look", Looking())
    assert seen == [(here, out)]  # no chdir, no redirected stdout: that is local's job
