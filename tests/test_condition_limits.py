"""Limits of ``when`` conditions: what validation refuses, what evaluation cuts short.

A hostile plan's condition could hold the run for ever (seven nested ``map`` over ten
items: 10^7 evaluations, deaf to SIGTERM and to the run's ``timeout``), pass validation
and then fail by recursion (500 ``&&``), or be failed by a parameter it does not read (an
integer beyond 64 bits). See ``planrun.conditions`` (``MAX_*``, ``COST_LIMIT``) and
docs/plans.md "Conditions".
"""

from __future__ import annotations

import re
import signal
import sys
import time
from typing import Any

import pytest

from planrun import conditions
from planrun.conditions import ConditionError, ConditionStopped, ConditionTooLarge
from planrun.errors import RunError
from planrun_cli import CliProject

DIGITS = "[0,1,2,3,4,5,6,7,8,9]"


def nested_maps(depth: int) -> str:
    """The attacker's condition: ``depth`` maps over ten items, each inside the last."""
    body = "1"
    for name in reversed("abcdefghij"[:depth]):
        body = f"{DIGITS}.map({name}, {body})"
    return f"size({body}) > 0"


# --- validation: what evaluation could not do is refused ----------------------------------

@pytest.mark.parametrize(("expr", "words"), [
    (nested_maps(4), "nests 4 macros"),
    (nested_maps(7), "nests 7 macros"),
    (f"{DIGITS}.all(a, {DIGITS}.exists(b, {DIGITS}.filter(c, {DIGITS}.exists_one(d, "
     "a == d)).size() > 0))", "nests 4 macros"),
    (" && ".join(["true"] * 500), "levels deep"),
    ("(" * 3000 + "true" + ")" * 3000, "characters long"),  # the attacker's: too long
    ("-" * 5000 + "1 != 0", "characters long"),
    ("(" * 300 + "true" + ")" * 300, "levels deep"),
    ("-" * 1000 + "1 != 0", "levels deep"),
    ("size(" + "[" * 60 + "1" + "]" * 60 + ") == 1", "levels deep"),
    ("params.n == 1 || " * 300 + "true", "characters long"),
])
def test_a_condition_past_a_limit_is_refused(expr: str, words: str) -> None:
    with pytest.raises(ConditionTooLarge, match=words):
        conditions.compile_condition(expr)
    for check in (conditions.references, conditions.unknown_names):
        with pytest.raises(ConditionTooLarge):
            check(expr)  # every reader of the tree refuses it, not only compile


def test_macros_in_a_row_are_not_nested() -> None:
    """A macro over another's result runs after it, not once an item: not nested."""
    expr = f"{DIGITS}.map(a, a).filter(b, b > 1).map(c, c).map(d, d).all(e, e > 1)"
    assert conditions.evaluate(expr, {}, {}) is True
    assert conditions.evaluate(nested_maps(conditions.MAX_MACRO_NESTING), {}, {}) is True


KINDS = {  # n → a condition nesting about n levels of one kind
    "and": lambda n: " && ".join(["true"] * n),
    "plus": lambda n: " + ".join(["1"] * n) + " > 0",
    "minus": lambda n: "-" * n + "1 != 0",
    "not": lambda n: "!" * (2 * (n // 2)) + "true",
    "paren": lambda n: "(" * n + "true" + ")" * n,
    "list": lambda n: "size(" + "[" * n + "1" + "]" * n + ") == 1",
    "map": lambda n: "size(" + '{"a": ' * n + "1" + "}" * n + ") == 1",
    "call": lambda n: "string(" * n + "1" + ")" * n + ' == "1"',
    "index": lambda n: "[" * n + "true" + "]" * n + "[0]" * n,
    "member": lambda n: "has(params" + ".a" * n + ") || true",
}


def deepest_accepted(kind: str) -> str:
    make = KINDS[kind]
    for n in range(1, 1000):
        try:
            conditions.compile_condition(make(n + 1))
        except ConditionTooLarge:
            return make(n)
    raise AssertionError(f"{kind}: validation accepts any depth")


def call_at_depth(frames: int, fn: Any) -> Any:
    """``fn()`` called ``frames`` Python frames deeper than here (a deep caller)."""
    return fn() if frames == 0 else call_at_depth(frames - 1, fn)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_what_validation_accepts_evaluates_even_from_a_deep_caller(kind: str) -> None:
    """The deepest condition of each kind validation accepts evaluates, without a
    RecursionError, from 300 frames down (a run's own stack is ~100)."""
    expr = deepest_accepted(kind)
    assert call_at_depth(300, lambda: conditions.evaluate(expr, {"a": {}}, {})) is True


def test_the_validate_command_refuses_the_attackers_conditions(cli: CliProject) -> None:
    cli.tools("""
        tools:
          record:
            description: records its call
            python: crashtools:record
            arguments: {type: object}
    """)
    cli.plan("deep", f"""
        planrun: 1
        goal: conditions past the limits
        steps:
          - id: maps
            tool: record
            when: "{nested_maps(7)}"
          - id: ands
            tool: record
            when: "{' && '.join(['true'] * 500)}"
    """)
    res = cli.run("validate", "deep")
    assert res.returncode != 0
    text = res.stdout + res.stderr
    assert "error[condition]: step 'maps': when is refused: it nests 7 macros" in text
    assert "error[condition]: step 'ands': when is refused: it nests" in text
    assert "Traceback" not in text


# --- evaluation: a cost budget, a clock, and a poll ----------------------------------------

def cubed(items: int) -> tuple[str, dict[str, Any]]:
    """Three nested maps over a parameter of ``items`` items: within the static limits,
    items^3 evaluations at run time."""
    expr = ("size(params.xs.map(a, params.xs.map(b, params.xs.map(c, a + b + c)))) > 0")
    return expr, {"xs": list(range(items))}


def test_an_evaluation_past_the_cost_limit_fails_cleanly(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conditions, "TIME_LIMIT_S", 3600.0)  # the steps' limit, not time's
    expr, params = cubed(100)  # 10^6 bodies: ~30 million steps, minutes without the limit
    conditions.compile_condition(expr)  # validation accepts it
    limit = f"needs more than {conditions.COST_LIMIT:,} evaluation steps"
    with pytest.raises(ConditionError, match=limit):
        conditions.evaluate(expr, params, {})
    expr, params = cubed(10)  # 1,000 bodies: well within
    assert conditions.evaluate(expr, params, {}) is True


def test_every_step_of_a_macro_body_is_charged(monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget counts the bodies a macro evaluates (sub-evaluators share it)."""
    monkeypatch.setattr(conditions, "COST_LIMIT", 2_000)
    monkeypatch.setattr(conditions, "POLL_EVERY", 100)
    items = list(range(200))
    conditions.evaluate("size(params.xs) == 200", {"xs": items}, {})  # a few steps
    with pytest.raises(ConditionError, match="needs more than 2,000 evaluation steps"):
        conditions.evaluate("params.xs.all(x, x >= 0)", {"xs": items}, {})
    assert conditions.evaluate("params.xs.all(x, x >= 0)", {"xs": items[:20]}, {}) is True


def test_the_clock_cuts_an_evaluation_whose_steps_are_slow(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conditions, "TIME_LIMIT_S", 0.0)
    monkeypatch.setattr(conditions, "POLL_EVERY", 16)
    with pytest.raises(ConditionError, match=r"ran longer than 0 s"):
        conditions.evaluate(*cubed(10), {})


def test_poll_is_called_during_a_long_evaluation_and_can_stop_it() -> None:
    calls: list[int] = []

    def poll() -> str | None:
        calls.append(1)
        return "signal" if len(calls) == 3 else None

    assert conditions.evaluate("params.n > 1", {"n": 2}, {}, poll=poll) is True
    assert calls == []  # a short evaluation never polls
    with pytest.raises(ConditionStopped) as info:
        conditions.evaluate(*cubed(100), {}, poll=poll)
    assert info.value.reason == "signal"
    assert len(calls) == 3

    class Gone(Exception):
        pass

    def broken() -> str | None:
        raise Gone("the journal went away")

    with pytest.raises(Gone):  # raised as it is, not as a condition failure
        conditions.evaluate(*cubed(100), {}, poll=broken)


# --- values CEL cannot hold ---------------------------------------------------------------

BIG = 18446744073709551616  # 2^64


def test_a_value_cel_cannot_hold_fails_only_a_condition_that_reads_it() -> None:
    params = {"n": BIG, "m": 1, "deep": call_at_depth(0, lambda: nest(5000))}
    statuses = {"a": "succeeded"}
    outputs = {"a": {"ok": True, "huge": [1, -BIG]}}
    for expr in ('steps.a.status == "succeeded"', "params.m == 1", "steps.a.output.ok",
                 "params.n > 1 || true", "size(steps.a.output.huge) == 2"):
        assert conditions.evaluate(expr, params, outputs, statuses) is True, expr
    for expr, where in (("params.n > 1", "params.n holds an integer beyond CEL's 64-bit"),
                        ("steps.a.output.huge[1] < 0", "steps.a.output holds an integer"),
                        ("size(params.deep) == 1", "params.deep is nested too deeply")):
        with pytest.raises(ConditionError, match=where):
            conditions.evaluate(expr, params, outputs, statuses)
    top = 2 ** 63 - 1
    assert conditions.evaluate(f"params.n == {top}", {"n": top}, {}) is True
    assert conditions.evaluate(f"params.n == -{top} - 1", {"n": -top - 1}, {}) is True


def nest(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def test_a_param_beyond_64_bits_fails_no_step_that_does_not_read_it(
        cli: CliProject) -> None:
    cli.tools("""
        tools:
          record:
            description: records its call
            python: crashtools:record
            arguments: {type: object}
    """)
    cli.plan("big", """
        planrun: 1
        goal: a huge integer parameter
        params:
          n: {type: integer, default: 1}
        steps:
          - {id: a, tool: record}
          - {id: b, tool: record, depends_on: [a], when: 'steps.a.status == "succeeded"'}
          - {id: c, tool: record, depends_on: [b], when: 'params.n > 1'}
    """)
    res = cli.run("execute", "big", "-p", f"n={BIG}")
    assert res.returncode == 1, res.stderr
    steps = {s.step_id: s for s in cli.probe().steps()}
    assert steps["a"].status == steps["b"].status == "succeeded"
    assert steps["c"].status == "failed"
    assert steps["c"].error is not None
    assert steps["c"].error["code"] == "condition"
    assert "params.n holds an integer beyond CEL's 64-bit int range" in \
        steps["c"].error["message"]
    assert "internal" not in res.stderr
    assert "Traceback" not in res.stderr


# --- a real run: ended by the limit, by its timeout, by a signal ----------------------------

HANG_GUARD_S = 60.0

TOOLS = """
    tools:
      record:
        description: records its call
        python: crashtools:record
        arguments: {type: object}
      say:
        description: a command (its success is deferred to share the next commit)
        command: ["echo", "said"]
        output: text
        arguments: {type: object, additionalProperties: false}
"""


def slow_plan(cli: CliProject, condition: str, timeout: str = "") -> None:
    cli.tools(TOOLS)
    maps = ", ".join(f"{{k: {i}}}" for i in range(20000))
    ms = f"ms: {{type: array, default: [{maps}]}}" if "params.ms" in condition else ""
    cli.plan("slow", f"""
        planrun: 1
        goal: a condition that takes long to evaluate
        {timeout}
        params:
          xs: {{type: array, default: {list(range(100))}}}
          {ms}
        steps:
          - {{id: a, tool: say}}
          - {{id: b, tool: record, depends_on: [a], when: '{condition}'}}
    """)


#: ~30 million evaluation steps: cut by the cost limit (minutes without it).
CUBED = "size(params.xs.map(a, params.xs.map(b, params.xs.map(c, a + b + c)))) > 0"
#: Few steps (100 bodies of ~20), each slow (``in`` over 20,000 maps, ~0.3 s on a slow
#: machine): the clock cuts it after 20 s, unless the run does first.
SLOW = 'params.xs.all(a, !({"k": -1} in params.ms))'


def test_execute_ends_when_a_condition_passes_the_cost_limit(cli: CliProject) -> None:
    slow_plan(cli, CUBED)
    assert cli.run("validate", "slow").returncode == 0
    res = cli.run("execute", "slow", timeout=HANG_GUARD_S)
    assert res.returncode == 1, res.stderr
    b = cli.probe().step("b")
    assert b.status == "failed"
    assert b.error is not None
    assert b.error["code"] == "condition"
    # cut by the budget of steps; on a machine loaded enough, by the clock before it
    assert re.search(f"needs more than {conditions.COST_LIMIT:,} evaluation steps|ran "
                     f"longer than {conditions.TIME_LIMIT_S:g} s", b.error["message"])
    assert cli.counts() == {}  # b's tool never called


def test_the_runs_timeout_cuts_a_condition_short(cli: CliProject) -> None:
    slow_plan(cli, SLOW, timeout="timeout: 2")
    res = cli.run("execute", "slow", timeout=HANG_GUARD_S)
    assert res.returncode == 1, res.stderr
    steps = {s.step_id: s for s in cli.probe().steps()}
    assert steps["a"].status == "succeeded"
    # failed by the timeout, never called (not called once the evaluation ended, and then
    # cut and left indeterminate)
    b = steps["b"]
    assert b.status == "failed"
    assert b.error is not None
    assert b.error["code"] == "timeout"
    assert "while its condition was evaluated" in b.error["message"]
    assert cli.counts() == {}  # b's tool never called
    assert "[timeout] the run's timeout of 2.0 s ran out while its condition was evaluated" \
        in res.stdout


def wait_a_committed(cli: CliProject, proc: Any) -> None:
    """Until the journal has step a succeeded (committed), the process still running,
    and b not dispatched yet: a was committed before b's condition ended."""
    deadline = time.monotonic() + HANG_GUARD_S
    while True:
        if cli.journal_exists():
            try:
                steps = {s.step_id: s.status for s in cli.probe().steps()}
            except RunError:
                steps = {}  # the run is not journaled yet
            if steps.get("a") == "succeeded":
                assert steps["b"] == "pending", steps
                return
        assert proc.poll() is None, cli.output_of(proc)
        assert time.monotonic() < deadline, "step a never committed"
        time.sleep(0.05)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_a_run_while_a_condition_evaluates(cli: CliProject,
                                                        signum: int) -> None:
    """The step before was committed while the condition ran (its success no longer
    waits for the next commit), and the signal is heard: the run ends interrupted, the
    step left pending for resume."""
    slow_plan(cli, SLOW)
    proc = cli.start("execute", "slow")
    wait_a_committed(cli, proc)  # committed while b's condition evaluates
    time.sleep(0.3)
    assert proc.poll() is None  # still evaluating (it takes ~20 s)
    proc.send_signal(signum)
    res = cli.finish(proc, timeout=HANG_GUARD_S)
    assert res.returncode == (130 if signum == signal.SIGINT else 143), res.stderr
    steps = {s.step_id: s for s in cli.probe().steps()}
    assert steps["a"].status == "succeeded"
    assert steps["b"].status == "pending"
    assert cli.counts() == {}  # b's tool never called


def test_a_kill_while_a_condition_evaluates_keeps_the_step_before(cli: CliProject) -> None:
    slow_plan(cli, SLOW)
    proc = cli.start("execute", "slow")
    wait_a_committed(cli, proc)  # without the commit: 'running' until b dispatches
    assert proc.poll() is None  # still evaluating (it takes ~20 s)
    cli.kill_group(proc)
    proc.wait(timeout=HANG_GUARD_S)
    assert cli.probe().step("a").status == "succeeded"
