"""Sync python calls on the event loop's thread (``blocking: false``, issue 16).

A sync python tool whose registry entry says ``blocking: false`` is called on the loop's
own thread, without the thread hop — but never when the call or the run has a timeout;
any other tool runs in a worker thread, whatever it did before (nothing is guessed).
Whatever thread a call runs on, it must behave as in a thread: its output, its failure
(``SystemExit``, ``TimeoutError``, ``GeneratorExit`` too), ``planrun.context()``, a tool
that starts its own event loop, and Ctrl-C / SIGTERM, which must still end a call that
blocks, even one that catches what ends it.
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
from planrun.dispatch.inline import Cut, Interruptible
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


def swallow(block, **kwargs):
    """A sloppy retry loop: a bare ``except:`` around a sleep (40 s at most)."""
    if block:
        Path(f"started-{planrun.context().step_id}.json").write_text(json.dumps({"main": _main()}))
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            try:
                time.sleep(0.05)
            except:  # noqa: E722
                pass
    return {"main": _main()}


def wrap(block, **kwargs):
    """Turns whatever interrupts it into an error of its own (a common pattern)."""
    if block:
        Path(f"started-{planrun.context().step_id}.json").write_text(json.dumps({"main": _main()}))
        try:
            time.sleep(40)
        except BaseException as exc:
            raise RuntimeError(f"interrupted: {exc!r}") from exc
    return {"main": _main()}


def boom(kind, **kwargs):
    import concurrent.futures
    if kind == "none":
        return {"main": _main()}
    raise {"TimeoutError": TimeoutError, "GeneratorExit": GeneratorExit,
           "FuturesCancelled": concurrent.futures.CancelledError,
           "StopIteration": StopIteration}[kind]("the tool's own")


_CONN = None


def count(**kwargs):
    """Keeps one sqlite connection for the run (made on its first call)."""
    import sqlite3
    global _CONN
    if _CONN is None:
        _CONN = sqlite3.connect(":memory:")
        _CONN.execute("create table t(x)")
    _CONN.execute("insert into t values (1)")
    return {"n": _CONN.execute("select count(*) from t").fetchone()[0]}


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

def _tool(name: str, props: dict[str, Any], extra: str = "    blocking: false\n",
          alias: str | None = None) -> str:
    schema = json.dumps({"type": "object", "properties": props,
                         "required": sorted(p for p in props if p != "file"),
                         "additionalProperties": False})
    return (f"  {alias or name}:\n    description: {name}\n    python: inl:{name}\n{extra}"
            f"    arguments: {schema}\n")


BLOCK = {"block": {"type": "boolean"}}
TOOLS = "tools:\n" + "".join([
    _tool("where", {}), _tool("where", {}, extra="", alias="where_t"),
    _tool("nap", {"seconds": {"type": "number"}}),
    _tool("nested", {}),
    _tool("leave", {"code": {"type": ["integer", "null"]}}),
    _tool("hold", {**BLOCK, "file": {"type": "string"}}),
    _tool("swallow", BLOCK), _tool("wrap", BLOCK),
    _tool("boom", {"kind": {"type": "string"}}),
    _tool("boom", {"kind": {"type": "string"}}, extra="", alias="boom_t"),
    _tool("count", {}, extra=""),
]) + """\
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


def test_a_tool_declared_not_blocking_runs_on_the_loop_thread(proj: Project) -> None:
    proj.write_plan("p", chain("where", ["{}"] * 3))
    m = execute_plan(proj, "p")
    assert m["status"] == "completed", m
    assert mains(proj, m) == [True, True, True]
    # planrun.context() is the call's own
    assert [o["step"] for o in outputs(proj, m).values()] == ["s0", "s1", "s2"]


def test_any_other_tool_runs_in_threads(proj: Project) -> None:
    proj.write_plan("p", chain("where_t", ["{}"] * 3))
    m = execute_plan(proj, "p")
    assert m["status"] == "completed", m
    assert mains(proj, m) == [False, False, False]


@pytest.mark.parametrize("tool", ["where", "where_t"])
def test_a_chain_commits_once_a_step(proj: Project, sqlite_commits: list[int],
                                     tool: str) -> None:
    """Each step's outcome shares its successor's dispatch commit (issue 16).

    On the loop's thread the next step's dispatch is committed at once, without a turn of
    the loop; the scheduler's own commit after that dispatch must not then commit the
    step's outcome alone (a second commit a step). In a thread, as before.
    """
    steps = 30
    proj.write_plan("p", chain(tool, ["{}"] * steps))
    commits = sqlite_commits
    m = execute_plan(proj, "p")
    assert m["status"] == "completed", m
    assert mains(proj, m) == [tool == "where"] * steps
    # the run's own records (journaling the run, the lease, its end) take a handful
    assert steps <= len(commits) < steps + 8, len(commits)


def test_a_tool_keeping_state_bound_to_its_thread_works_on_every_call(
        proj: Project) -> None:
    """A module-level sqlite3 connection made on the first call: nothing is guessed, so
    an undeclared tool is never moved to another thread after its first call."""
    proj.write_plan("p", chain("count", ["{}"] * 3))
    m = execute_plan(proj, "p")
    assert m["status"] == "completed", m
    assert outputs(proj, m)["s2"] == {"n": 3}


@pytest.mark.parametrize("where", ["step", "run"])
def test_a_timeout_keeps_calls_in_threads(proj: Project, where: str) -> None:
    text = (chain("where", ["{}"] * 3, step_extra=", timeout: 30") if where == "step"
            else chain("where", ["{}"] * 3, head="timeout: 60"))
    proj.write_plan("p", text)
    m = execute_plan(proj, "p")
    assert m["status"] == "completed", m
    assert mains(proj, m) == [False, False, False]


def test_a_tool_may_run_an_event_loop_of_its_own_on_the_loop_thread(proj: Project) -> None:
    proj.write_plan("p", chain("nested", ["{}"] * 2)
                    + "  - {id: c, tool: shout, arguments: {}, depends_on: [s1]}\n")
    m = execute_plan(proj, "p")
    assert m["status"] == "completed", m
    assert mains(proj, m) == [True, True]
    out = outputs(proj, m)
    assert [out[f"s{i}"]["value"] for i in range(2)] == [7, 7]
    # the run's own loop still works afterwards: a command (a child process) ran
    assert out["c"] == {"ok": True}


def test_a_failure_on_the_loop_thread_is_the_tools_failure(proj: Project) -> None:
    proj.write_plan("p", chain("leave", ["{code: null}", "{code: 3}"]))
    m = execute_plan(proj, "p")
    assert m["status"] == "failed", m
    assert outputs(proj, m)["s0"]["main"] is True
    s1 = by_step(m)["s1"]
    assert s1["status"] == "failed"
    assert s1["error"]["code"] == "tool_error"
    assert "SystemExit" in s1["error"]["message"], s1["error"]


@pytest.mark.parametrize("kind", ["TimeoutError", "FuturesCancelled", "GeneratorExit",
                                  "StopIteration"])
@pytest.mark.parametrize("tool", ["boom", "boom_t"], ids=["loop-thread", "thread"])
def test_what_a_tool_raises_is_its_failure_on_either_thread(proj: Project, kind: str,
                                                            tool: str) -> None:
    """Exceptions asyncio has a meaning for are the tool's own: not the call's timeout
    (``TimeoutError``), not a cancellation, not an escape from planrun (``GeneratorExit``
    used to end planrun with a traceback, leaving the step ``running``)."""
    proj.write_plan("p", chain(tool, [f"{{kind: {kind}}}"]))
    m = execute_plan(proj, "p")
    assert m["status"] == "failed", m
    s0 = by_step(m)["s0"]
    assert (s0["status"], s0["error"]["code"]) == ("failed", "tool_error"), s0


def test_an_async_tools_own_timeout_error_is_its_failure(proj: Project) -> None:
    proj.write_module("atool", """
        async def late(**kwargs):
            raise TimeoutError("the tool's own")
    """)
    proj.write_tools(TOOLS.replace("{PY}", json.dumps(_python())) + """\
  late:
    description: An async tool whose own wait ran out
    python: atool:late
    arguments: {type: object}
""", module=MODULE, module_name="inl")
    proj.write_plan("p", chain("late", ["{}"]))
    m = execute_plan(proj, "p")
    s0 = by_step(m)["s0"]
    assert (s0["status"], s0["error"]["code"]) == ("failed", "tool_error"), s0


def test_blocking_is_for_python_tools(project: Project) -> None:
    project.write_tools("""
        tools:
          c:
            description: A command
            command: [echo, hi]
            blocking: false
            arguments: {type: object}
    """, module=None)
    _registry, issues = project.registry()
    assert [(i.code, "python tools only" in i.message) for i in issues] == \
        [("registry", True)], issues


# --- the signals of a call on the loop's thread ---------------------------------------------


def _blocked(guard: Interruptible, signals: list[int], swallow: bool = False) -> None:
    """A call that takes ``signals`` (a pause after each), then blocks for 30 s."""
    with guard:
        for signum in signals:
            os.kill(os.getpid(), signum)
            time.sleep(0.05)
        try:
            time.sleep(30)
        except Cut:
            if not swallow:
                raise


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_first_signal_gives_a_blocking_call_the_grace_period(signum: int) -> None:
    before = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)]
    guard = Interruptible(0.3)
    with pytest.raises(Cut):
        _blocked(guard, [signum])
    assert guard.cut
    assert [s for s, _ in guard.received] == [signum]  # for the scheduler, afterwards
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM,
                                          signal.SIGALRM)] == before
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_stray_alarm_is_not_taken_for_the_grace_timer() -> None:
    """A tool's own ``signal.alarm`` (SIGALRM with no timer of the guard's) cuts nothing."""
    guard = Interruptible(60)
    with guard:
        os.kill(os.getpid(), signal.SIGALRM)
        time.sleep(0.05)
    assert not guard.cut
    assert guard.received == []


def test_a_sigint_after_a_sigterm_cuts_at_once() -> None:
    guard = Interruptible(60)
    with pytest.raises(Cut):
        _blocked(guard, [signal.SIGTERM, signal.SIGINT])
    assert [s for s, _ in guard.received] == [signal.SIGTERM, signal.SIGINT]


def test_a_second_sigint_cuts_a_blocking_call_at_once() -> None:
    guard = Interruptible(60)  # not the grace period: that would outlast the 30 s call
    with pytest.raises(Cut):
        _blocked(guard, [signal.SIGINT, signal.SIGINT])
    assert [s for s, _ in guard.received] == [signal.SIGINT, signal.SIGINT]
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_call_that_ends_leaves_no_timer_and_the_handlers_as_they_were() -> None:
    before = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)]
    guard = Interruptible(60)
    with guard:
        pass
    assert not guard.cut
    assert guard.received == []
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM,
                                          signal.SIGALRM)] == before


# --- a real planrun process -----------------------------------------------------------------


@pytest.fixture
def held(cli: CliProject) -> CliProject:
    cli.tools(TOOLS.replace("{PY}", json.dumps(_python())))
    (cli.root / "inl.py").write_text(MODULE)
    for tool in ("hold", "swallow", "wrap"):
        cli.plan(tool, f"""
            planrun: 1
            goal: A tool that blocks on the loop's thread
            steps:
              - {{id: a, tool: {tool}, arguments: {{block: false}}}}
              - {{id: b, tool: {tool}, depends_on: [a], arguments: {{block: true}}}}
              - {{id: z, tool: {tool}, depends_on: [b], arguments: {{block: false}}}}
        """)
    return cli


def _wait_file(path: Path, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def _status(cli: CliProject) -> tuple[str, dict[str, dict[str, Any]]]:
    run_id = cli.probe().run_ids()[0]
    m = cli.run("status", run_id, "--json").json
    return m["status"], {s["id"]: s for s in m["steps"]}


@pytest.mark.parametrize(("tool", "signals", "exit_code"), [
    ("hold", [signal.SIGINT, signal.SIGINT], 130),  # the second cuts it at once
    ("hold", [signal.SIGTERM], 143),                # cut when the grace period ends
    ("wrap", [signal.SIGINT, signal.SIGINT], 130),  # it turns the Cut into its own error
], ids=["SIGINT-twice", "SIGTERM-once", "SIGINT-twice-wrapped"])
def test_a_signal_ends_a_call_blocking_the_loop_thread(
        held: CliProject, tool: str, signals: list[int], exit_code: int) -> None:
    p = held.start("execute", tool, "--json")
    marker = _wait_file(held.root / "started-b.json")
    assert marker["main"] is True, "the blocking call did not run on the loop's thread"
    p.send_signal(signals[0])
    time.sleep(1.0)
    assert p.poll() is None, "the first signal must give the call its grace period"
    for signum in signals[1:]:
        p.send_signal(signum)
    # hang guards shorter than the 40 to 60 s the call would take: a second Ctrl-C ends
    # it before the grace period would have; one SIGTERM, when the grace period ends
    r = held.finish(p, timeout=GRACE_S * 0.8 if len(signals) == 2 else GRACE_S + 20)
    assert r.returncode == exit_code, r
    assert "Traceback" not in r.stderr, r
    status, steps = _status(held)
    assert status == "interrupted"
    assert steps["a"]["status"] == "succeeded"
    # its effect is unknown (whatever the tool made of the Cut), and it ended: cancelled,
    # not abandoned in a thread
    assert steps["b"]["status"] == "indeterminate", steps["b"]
    assert steps["b"]["error"]["code"] == "interrupted"
    assert "call cancelled" in steps["b"]["error"]["message"], steps["b"]["error"]
    assert steps["z"]["status"] == "pending"


def test_a_signal_taken_during_a_call_that_then_ends_stops_the_run(held: CliProject) -> None:
    """The signal the call's guard took reaches the scheduler: nothing new starts."""
    held.plan("released", """
        planrun: 1
        goal: A tool that waits for a file on its second call
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
    status, steps = _status(held)
    assert status == "interrupted"
    assert [s["status"] for s in steps.values()] == ["succeeded", "succeeded", "pending"]
    r = held.run("resume", "--json")
    assert r.returncode == 0, r
    assert r.json["status"] == "completed"


def test_a_call_that_swallows_its_cut_ends_the_process_as_a_crash(held: CliProject) -> None:
    """A bare ``except:`` in a loop catches every Cut: a third Ctrl-C ends planrun at
    once, as a crash would — the step stays ``running`` for resume to settle."""
    p = held.start("execute", "swallow", "--json")
    assert _wait_file(held.root / "started-b.json")["main"] is True
    for _ in range(3):
        p.send_signal(signal.SIGINT)
        time.sleep(0.5)
    r = held.finish(p, timeout=GRACE_S * 0.8)  # not the 40 s the tool loops
    assert r.returncode == 130, r
    assert "Traceback" not in r.stderr, r
    assert "went on after it was cut short" in r.stderr, r
    _, steps = _status(held)
    assert steps["a"]["status"] == "succeeded"
    assert steps["b"]["status"] == "running"  # as a crash leaves it
    # resume: a is not called again; b's tool is not idempotent, so a person settles it
    r = held.run("resume", "--json")
    assert r.returncode == 5, r
    assert r.error_code == "indeterminate"
