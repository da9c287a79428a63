"""Quick sync python calls on the event loop's thread (``planrun.dispatch.inline``, issue 16).

A sync python tool is called in a worker thread until one call of it has shown it quick
(under ``QUICK_S``); then on the loop's own thread, without the thread hop — but only
while no other call is under way, with no timeout on the call or the run, and never again
once one of its calls took longer. Whatever thread a call runs on, it must behave as in a
thread: its output, its failure (``SystemExit`` too), ``planrun.context()``, a tool that
starts its own event loop, and Ctrl-C / SIGTERM, which must still end a call that blocks.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import Project, by_step, execute_plan
from planrun.dispatch.inline import QUICK_S, Cut, Interruptible, Quick
from planrun.executor import GRACE_S
from planrun_cli import CliProject

MODULE = '''
import asyncio
import json
import threading
import time
from pathlib import Path

import planrun


def _main():
    return threading.current_thread() is threading.main_thread()


def where(**kwargs):
    return {"main": _main(), "step": planrun.context().step_id}


def nap(seconds, **kwargs):
    time.sleep(seconds)
    return {"main": _main()}


def nested(**kwargs):
    async def inner():
        await asyncio.sleep(0)
        return 7
    return {"main": _main(), "value": asyncio.run(inner())}


def leave(code, **kwargs):
    if code is not None:
        raise SystemExit(code)
    return {"main": _main()}


def hold(block, file=None, **kwargs):
    """Quick unless ``block``: then mark the start and wait a minute, or until ``file``."""
    if block:
        step = planrun.context().step_id
        Path(f"started-{step}.json").write_text(json.dumps({"main": _main()}))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (file and Path(file).exists()):
            time.sleep(0.01)
    return {"main": _main()}
'''

TOOLS = """
tools:
  where:
    description: Says which thread called it
    python: inl:where
    arguments: {type: object, additionalProperties: false}
  nap:
    description: Sleeps, then says which thread called it
    python: inl:nap
    arguments:
      type: object
      properties: {seconds: {type: number}}
      required: [seconds]
      additionalProperties: false
  nested:
    description: Runs an event loop of its own
    python: inl:nested
    arguments: {type: object, additionalProperties: false}
  leave:
    description: Raises SystemExit when given a code
    python: inl:leave
    arguments:
      type: object
      properties: {code: {type: [integer, "null"]}}
      required: [code]
      additionalProperties: false
  hold:
    description: Blocks for a minute when asked
    python: inl:hold
    arguments:
      type: object
      properties: {block: {type: boolean}, file: {type: string}}
      required: [block]
      additionalProperties: false
  shout:
    description: A command
    command: [{PY}, -c, "print('{\\"ok\\": true}')"]
    output: json
    arguments: {type: object, additionalProperties: false}
"""


@pytest.fixture
def proj(project: Project) -> Project:
    project.write_tools(TOOLS.replace("{PY}", json.dumps(_python())), module=MODULE,
                        module_name="inl")
    return project


def _python() -> str:
    import sys

    return sys.executable


def chain(tool: str, args: list[str], *, head: str = "", step_extra: str = "") -> str:
    """A plan: steps s0, s1, … of ``tool``, each after the one before."""
    lines = ["planrun: 1", "goal: A chain", head, "steps:"]
    for i, arguments in enumerate(args):
        after = f", depends_on: [s{i - 1}]" if i else ""
        lines.append(f"  - {{id: s{i}, tool: {tool}, arguments: {arguments}{after}"
                     f"{step_extra}}}")
    return "\n".join(line for line in lines if line) + "\n"


def outputs(proj: Project, manifest: dict[str, Any]) -> dict[str, Any]:
    """Step id → its output (steps that succeeded)."""
    from planrun import api

    return {s["id"]: api.output(proj.settings(), manifest["run_id"], s["id"])
            for s in manifest["steps"] if s["status"] == "succeeded"}


def mains(proj: Project, manifest: dict[str, Any], prefix: str = "s") -> list[bool]:
    """Whether each chain step's call ran on the main (the loop's) thread."""
    return [out["main"] for step, out in outputs(proj, manifest).items()
            if step.startswith(prefix)]


def test_a_quick_tool_runs_on_the_loop_thread_from_its_second_call(proj: Project) -> None:
    proj.write_plan("p", chain("where", ["{}"] * 4))
    m = execute_plan(proj, "p")
    assert m["status"] == "completed", m
    assert mains(proj, m) == [False, True, True, True]
    # planrun.context() is the call's own on either thread
    assert [o["step"] for o in outputs(proj, m).values()] == ["s0", "s1", "s2", "s3"]


def test_a_call_that_took_longer_sends_its_tool_back_to_threads(proj: Project) -> None:
    slow = QUICK_S * 4
    proj.write_plan("p", chain("nap", [f"{{seconds: {s}}}" for s in (0, slow, 0, 0)]))
    m = execute_plan(proj, "p")
    assert m["status"] == "completed", m
    # s0 in a thread (quick), s1 on the loop (slow: never again), s2 and s3 in threads
    assert mains(proj, m) == [False, True, False, False]


def test_a_slow_first_call_keeps_the_tool_in_threads(proj: Project) -> None:
    proj.write_plan("p", chain("nap", [f"{{seconds: {QUICK_S * 4}}}", "{seconds: 0}",
                                       "{seconds: 0}"]))
    m = execute_plan(proj, "p")
    assert mains(proj, m) == [False, False, False]


def test_no_call_on_the_loop_thread_while_another_call_is_under_way(proj: Project) -> None:
    # n naps 3 s in a thread while the chain s0..s3 runs beside it; last waits for both
    proj.write_plan("p", chain("where", ["{}"] * 4)
                    + "  - {id: n, tool: nap, arguments: {seconds: 3}}\n"
                    + "  - {id: last, tool: where, arguments: {}, depends_on: [n, s3]}\n")
    m = execute_plan(proj, "p")
    assert m["status"] == "completed", m
    out = outputs(proj, m)
    assert out["n"]["main"] is False
    assert mains(proj, m) == [False, False, False, False]
    assert out["last"]["main"] is True  # nothing else under way any more


@pytest.mark.parametrize("where", ["step", "run"])
def test_a_timeout_keeps_calls_in_threads(proj: Project, where: str) -> None:
    text = (chain("where", ["{}"] * 3, step_extra=", timeout: 30") if where == "step"
            else chain("where", ["{}"] * 3, head="timeout: 60"))
    proj.write_plan("p", text)
    m = execute_plan(proj, "p")
    assert m["status"] == "completed", m
    assert mains(proj, m) == [False, False, False]


def test_a_tool_may_run_an_event_loop_of_its_own_on_the_loop_thread(proj: Project) -> None:
    proj.write_plan("p", chain("nested", ["{}"] * 3)
                    + "  - {id: c, tool: shout, arguments: {}, depends_on: [s2]}\n")
    m = execute_plan(proj, "p")
    assert m["status"] == "completed", m
    assert mains(proj, m) == [False, True, True]
    out = outputs(proj, m)
    assert [out[f"s{i}"]["value"] for i in range(3)] == [7, 7, 7]
    # the run's own loop still works afterwards: a command (a child process) ran
    assert out["c"] == {"ok": True}


def test_a_failure_on_the_loop_thread_is_the_tools_failure(proj: Project) -> None:
    proj.write_plan("p", chain("leave", ["{code: null}", "{code: 3}"]))
    m = execute_plan(proj, "p")
    assert m["status"] == "failed", m
    assert outputs(proj, m)["s0"]["main"] is False
    s1 = by_step(m)["s1"]
    assert s1["status"] == "failed"
    assert s1["error"]["code"] == "tool_error"
    assert "SystemExit" in s1["error"]["message"], s1["error"]


def test_quick_learns_from_every_call() -> None:
    quick = Quick()
    assert "t" not in quick  # unknown until a call ended
    quick.took("t", 0.0)
    assert "t" in quick
    quick.took("t", QUICK_S)  # at the limit: not quick
    assert "t" not in quick
    quick.took("t", 0.0)  # once slow, slow for the run
    assert "t" not in quick


def _blocked(guard: Interruptible, signals: list[int]) -> None:
    """A call that takes ``signals`` (a pause after each), then blocks for 30 s."""
    with guard:
        for signum in signals:
            os.kill(os.getpid(), signum)
            time.sleep(0.05)
        time.sleep(30)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_first_signal_gives_a_blocking_call_the_grace_period(signum: int) -> None:
    before = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)]
    guard = Interruptible(0.3)
    with pytest.raises(Cut, match="SIGALRM"):  # the grace timer cut it, not the signal
        _blocked(guard, [signum])
    assert guard.received == [signum]  # for the scheduler to handle afterwards
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM,
                                          signal.SIGALRM)] == before
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_second_sigint_cuts_a_blocking_call_at_once() -> None:
    guard = Interruptible(60)
    with pytest.raises(Cut, match="SIGINT"):
        _blocked(guard, [signal.SIGINT, signal.SIGINT])
    assert guard.received == [signal.SIGINT, signal.SIGINT]
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_second_sigterm_does_not_cut_before_the_grace_period() -> None:
    guard = Interruptible(0.5)
    with pytest.raises(Cut, match="SIGALRM"):
        _blocked(guard, [signal.SIGTERM, signal.SIGTERM])
    assert guard.received == [signal.SIGTERM, signal.SIGTERM]


def test_a_call_that_ends_leaves_no_timer_and_the_handlers_as_they_were() -> None:
    before = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)]
    with Interruptible(60):
        pass
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM,
                                          signal.SIGALRM)] == before


# --- a real planrun process -----------------------------------------------------------------


@pytest.fixture
def held(cli: CliProject) -> CliProject:
    cli.tools(TOOLS.replace("{PY}", json.dumps(_python())))
    (cli.root / "inl.py").write_text(MODULE)
    cli.plan("held", """
        planrun: 1
        goal: A quick tool that blocks on its second call
        steps:
          - {id: a, tool: hold, arguments: {block: false}}
          - {id: b, tool: hold, depends_on: [a], arguments: {block: true}}
          - {id: z, tool: hold, depends_on: [b], arguments: {block: false}}
    """)
    return cli


def _wait_file(path: Path, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)
    return json.loads(path.read_text())  # type: ignore[no-any-return]


@pytest.mark.parametrize(("signals", "exit_code"), [
    ([signal.SIGINT, signal.SIGINT], 130),  # the second cuts it at once
    ([signal.SIGTERM], 143),                # cut when the grace period ends
], ids=["SIGINT-twice", "SIGTERM-once"])
def test_a_signal_ends_a_call_blocking_the_loop_thread(
        held: CliProject, signals: list[int], exit_code: int) -> None:
    p = held.start("execute", "held", "--json")
    marker = _wait_file(held.root / "started-b.json")
    assert marker["main"] is True, "the blocking call did not run on the loop's thread"
    p.send_signal(signals[0])
    time.sleep(1.0)
    assert p.poll() is None, "the first signal must give the call its grace period"
    for signum in signals[1:]:
        p.send_signal(signum)
    # hang guards shorter than the minute the call would take: a second Ctrl-C ends it
    # before the grace period would have; one SIGTERM, when the grace period ends
    r = held.finish(p, timeout=GRACE_S * 0.8 if len(signals) == 2 else GRACE_S + 20)
    assert r.returncode == exit_code, r
    assert "Traceback" not in r.stderr, r
    run_id = held.probe().run_ids()[0]
    m = held.run("status", run_id, "--json").json
    assert m["status"] == "interrupted"
    steps = {s["id"]: s for s in m["steps"]}
    assert steps["a"]["status"] == "succeeded"
    assert steps["b"]["status"] == "indeterminate"
    assert steps["b"]["error"]["code"] == "interrupted"
    # it ended (nothing of it runs on): cancelled, not abandoned in a thread
    assert "call cancelled" in steps["b"]["error"]["message"], steps["b"]["error"]
    assert steps["z"]["status"] == "pending"


def test_a_signal_taken_during_a_call_that_then_ends_stops_the_run(held: CliProject) -> None:
    """The signal the call's guard took reaches the scheduler: nothing new starts."""
    held.plan("released", """
        planrun: 1
        goal: A quick tool that waits for a file on its second call
        steps:
          - {id: a, tool: hold, arguments: {block: false}}
          - {id: b, tool: hold, depends_on: [a], arguments: {block: true, file: go}}
          - {id: z, tool: hold, depends_on: [b], arguments: {block: false}}
    """)
    p = held.start("execute", "released", "--json")
    assert _wait_file(held.root / "started-b.json")["main"] is True
    p.send_signal(signal.SIGINT)
    time.sleep(1.0)
    held.touch("go")  # the call ends inside the grace period
    r = held.finish(p)
    assert r.returncode == 130, r
    run_id = held.probe().run_ids()[0]
    m = held.run("status", run_id, "--json").json
    assert m["status"] == "interrupted"
    assert [s["status"] for s in m["steps"]] == ["succeeded", "succeeded", "pending"]
    r = held.run("resume", run_id, "--json")
    assert r.returncode == 0, r
    assert r.json["status"] == "completed"
