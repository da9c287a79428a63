"""Attacks on ``blocking: false`` python tools (called on the event loop's thread).

The promise (docs/tools-and-contracts.md "Which thread", README "Tools"): such a call
behaves as a call in a worker thread would, except for speed and what the docs say —
every exception a tool raises is its failure (``tool_error``), a second Ctrl-C cancels at
once, the first signal gives the running calls the grace period (10 s), never a traceback.

Each test drives a real ``planrun`` process (``tests/planrun_cli.py``).
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from planrun.executor import GRACE_S
from planrun_cli import CliProject

MODULE = '''
import asyncio
import threading
import time
from pathlib import Path

import planrun


def _main():
    return threading.current_thread() is threading.main_thread()


def own_cancel(**kwargs):
    """A sync tool handing back a coroutine that fails with a CancelledError of its own."""
    async def inner():
        await asyncio.sleep(0)
        raise asyncio.CancelledError("the tool's own")
    return inner()


def hold(seconds, **kwargs):
    Path(f"started-{planrun.context().step_id}").write_text(str(_main()))
    time.sleep(seconds)
    return {"main": _main()}


def use(v, **kwargs):
    return {"v": v}


def say(v, **kwargs):
    return {"v": v}
'''

MODEL = '''
from pydantic import BaseModel, field_validator


class M(BaseModel):
    v: str

    @field_validator("v")
    @classmethod
    def check(cls, v):
        if v == "SystemExit":
            raise SystemExit(4)
        if v == "KeyboardInterrupt":
            raise KeyboardInterrupt()
        if v == "GeneratorExit":
            raise GeneratorExit("the model's own")
        return v
'''

TOOLS = """\
tools:
  own_cancel: {description: c, python: atk:own_cancel, blocking: false, arguments: {type: object}}
  own_cancel_t: {description: c, python: atk:own_cancel, arguments: {type: object}}
  hold: {description: h, python: atk:hold, blocking: false, arguments: {type: object}}
  hold_t: {description: h, python: atk:hold, arguments: {type: object}}
  say: {description: s, python: atk:say, blocking: false, arguments: {type: object}}
  use: {description: u, python: atk:use, blocking: false, accepts: atkmodel:M}
  use_t: {description: u, python: atk:use, accepts: atkmodel:M}
  sleeper:
    description: A command that sleeps
    command: [{PY}, -c, "import time; time.sleep(60)"]
    output: none
    arguments: {type: object, additionalProperties: false}
"""


@pytest.fixture
def atk(cli: CliProject) -> CliProject:
    cli.tools(TOOLS)
    (cli.root / "atk.py").write_text(MODULE)
    (cli.root / "atkmodel.py").write_text(MODEL)
    return cli


def _steps(m: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["id"]: s for s in m["steps"]}


def _wait(path: Path, proc: Any, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        assert proc.poll() is None, f"planrun exited {proc.returncode} before {path.name}"
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)
    return path.read_text()


def _status(cli: CliProject) -> tuple[str, dict[str, dict[str, Any]]]:
    run_id = cli.probe().run_ids()[0]
    m = cli.run("status", run_id, "--json").json
    return m["status"], _steps(m)


# --- a tool's own CancelledError, from the awaitable a sync tool returns -------------------


@pytest.mark.parametrize("tool", ["own_cancel", "own_cancel_t"], ids=["loop-thread", "thread"])
def test_own_cancelled_error_of_a_returned_coroutine_is_the_tools_failure(
        atk: CliProject, tool: str) -> None:
    """A sync tool that returns a coroutine raising its own ``CancelledError``: in a
    thread that is the tool's failure (``tool_error``, exit 1); on the loop's thread
    (``blocking: false``) ``_on_loop`` re-raises it as a cancellation, so the step is
    journaled ``indeterminate`` ("call abandoned because the run was interrupted") though
    nothing interrupted the run."""
    atk.plan("p", f"""
        planrun: 1
        goal: own cancel
        steps:
          - {{id: a, tool: {tool}, arguments: {{}}}}
    """)
    r = atk.run("execute", "p", "--json")
    assert "Traceback" not in r.stderr, r
    assert r.returncode == 1, r
    a = _steps(r.json)["a"]
    assert (a["status"], a["error"]["code"]) == ("failed", "tool_error"), a
    assert "CancelledError" in a["error"]["message"], a


# --- signals: SIGTERM then Ctrl-C ------------------------------------------------------------


@pytest.mark.parametrize("tool", ["hold", "hold_t"], ids=["loop-thread", "thread"])
def test_ctrl_c_after_sigterm_cancels_at_once(atk: CliProject, tool: str) -> None:
    """The scheduler reads any SIGINT after a first signal as "cancel now" (a thread call
    is abandoned at once, exit 143). The loop-thread guard cuts only at a *second SIGINT*
    (``received.count(SIGINT) > 1``), so after SIGTERM a Ctrl-C does nothing and the call
    runs out the whole 10 s grace period."""
    atk.plan("p", f"""
        planrun: 1
        goal: term then int
        steps:
          - {{id: b, tool: {tool}, arguments: {{seconds: 60}}}}
    """)
    p = atk.start("execute", "p", "--json")
    _wait(atk.root / "started-b", p)
    p.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    r = atk.finish(p, timeout=GRACE_S * 0.6)  # hang guard: well under the grace period
    assert r.returncode == 143, r
    assert "Traceback" not in r.stderr, r
    status, steps = _status(atk)
    assert status == "interrupted"
    assert steps["b"]["status"] == "indeterminate", steps["b"]


# --- signals: one Ctrl-C, a loop-thread call and another call running ------------------------


@pytest.mark.parametrize("other", ["hold_t", "sleeper"], ids=["thread-call", "command"])
def test_one_ctrl_c_gives_the_running_calls_one_grace_period(atk: CliProject,
                                                            other: str) -> None:
    """"The first Ctrl-C ... lets the running calls finish for up to 10 seconds, then
    cancels them" (docs/journal-and-resume.md). With a ``blocking: false`` call blocking
    and another call running (a thread, a command), the scheduler hears of the Ctrl-C only
    when the loop-thread call is cut at the end of *its* grace period, then starts a second
    grace period for the other call: planrun ends after ~20 s, not ~10 s."""
    atk.plan("p", f"""
        planrun: 1
        goal: two running calls
        steps:
          - {{id: a, tool: {other}, arguments: {{{'seconds: 60' if other == 'hold_t' else ''}}}}}
          - {{id: b, tool: hold, arguments: {{seconds: 60}}}}
    """)
    p = atk.start("execute", "p", "--json")
    assert _wait(atk.root / "started-b", p) == "True"
    if other == "hold_t":
        _wait(atk.root / "started-a", p)
    else:
        time.sleep(1.0)  # the command has started (it was dispatched before b)
    p.send_signal(signal.SIGINT)
    # hang guard: one grace period and some slack, well under two grace periods
    r = atk.finish(p, timeout=GRACE_S + 5)
    assert r.returncode == 130, r
    assert "Traceback" not in r.stderr, r
    status, steps = _status(atk)
    assert status == "interrupted"
    assert steps["a"]["status"] == "indeterminate", steps["a"]
    assert steps["b"]["status"] == "indeterminate", steps["b"]


# --- an ``accepts`` model raising a BaseException --------------------------------------------


@pytest.mark.parametrize("kind", ["SystemExit", "KeyboardInterrupt", "GeneratorExit"])
@pytest.mark.parametrize("tool", ["use", "use_t"], ids=["loop-thread", "thread"])
def test_a_model_validator_raising_a_base_exception_fails_the_step(
        atk: CliProject, tool: str, kind: str) -> None:
    """An ``accepts`` model is code run for the call (its value known only at run time,
    from an earlier step's output). A validator raising ``SystemExit``,
    ``KeyboardInterrupt`` or ``GeneratorExit`` escapes ``validate_model`` (it catches
    ``Exception`` only): planrun ends with a traceback (``SystemExit(4)`` even exits 4,
    "approval denied"), and the run is left ``running``. It should fail the step
    (``arguments`` or ``tool_error``), as any other exception of the model does."""
    atk.plan("p", f"""
        planrun: 1
        goal: a model that raises
        steps:
          - {{id: a, tool: say, arguments: {{v: {kind}}}}}
          - {{id: b, tool: {tool}, depends_on: [a], arguments: {{v: "{{steps.a.output.v}}"}}}}
    """)
    r = atk.run("execute", "p", "--json")
    assert "Traceback" not in r.stderr, r
    assert r.returncode == 1, r
    b = _steps(r.json)["b"]
    assert b["status"] == "failed", b
    assert b["error"]["code"] in ("arguments", "tool_error"), b
    status, _ = _status(atk)
    assert status == "failed"


# --- a run driven on another thread than the main one --------------------------------------

DRIVER = """
import json, sys, threading
from planrun import api
from planrun.paths import load_settings
from planrun.validation import ParamInput

settings = load_settings(project=sys.argv[1])
result = {}


def drive():
    try:
        outcome = api.execute(settings, "p", ParamInput(file_values={}))
        m = outcome.manifest
        result["status"] = m["status"]
        result["steps"] = {s["id"]: [s["status"], s.get("error")] for s in m["steps"]}
        if m["status"] == "completed":
            result["out"] = api.output(settings, m["run_id"], "a")
    except BaseException as exc:
        result["raised"] = repr(exc)


t = threading.Thread(target=drive)
t.start()
t.join()
print(json.dumps(result))
"""


def test_a_run_driven_off_the_main_thread_calls_blocking_false_tools_in_threads(
        atk: CliProject) -> None:
    """The docs: a ``blocking: false`` tool runs in a thread "when the run is not driven
    on the main thread". But a run driven by ``planrun.api.execute`` on another thread
    never gets that far: the scheduler's ``loop.add_signal_handler`` raises there, and
    every run ends ``failed`` with code ``internal`` ("this is a bug in planrun")."""
    import subprocess

    atk.plan("p", """
        planrun: 1
        goal: off the main thread
        steps:
          - {id: a, tool: say, arguments: {v: x}}
    """)
    r = subprocess.run([sys.executable, "-c", DRIVER, str(atk.root)], cwd=atk.root,
                       env=atk.env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result.get("status") == "completed", result
    assert result["out"] == {"v": "x"}, result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
