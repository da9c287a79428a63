"""Regressions found by trying to break planrun: hangs, tracebacks, leaks, odd journals.

Every test drives the real ``planrun`` process; a subprocess timeout is the hang guard.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

from harness import run_planrun

MODULE = '''
import sys

def leave():
    sys.exit(3)

def interrupt():
    raise KeyboardInterrupt

def stop():
    raise StopIteration("no more")

def cancel():
    import asyncio
    raise asyncio.CancelledError("inner")

class Odd(Exception):
    def __str__(self):
        raise ValueError("no")

def odd():
    raise Odd()

def keyed():
    return {"m": {1: "one"}, "pair": (1, 2)}

def deep(levels=5000):
    value = []
    for _ in range(levels):
        value = [value]
    return value

def ask():
    return input("name? ")

def echo(value):
    return {"echo": value}

def boom(value):
    raise RuntimeError("x" * 10 + str(value) + "y" * 1995)
'''

TOOLS = """
tools:
  stubborn:
    command: ["sh", "-c", "trap '' TERM; sleep 60"]
    timeout: 1
    arguments: {type: object, additionalProperties: false}
  daemonize:
    command: ["sh", "-c", "sleep 30 & echo started"]
    output: text
    timeout: 20
    arguments: {type: object, additionalProperties: false}
  tail_secret:
    command:
      - sh
      - -c
      - 'printf "%s" "$1" >&2; head -c 1990 /dev/zero | tr "\\\\0" x >&2; exit 1'
      - sh
      - "{value}"
    arguments: {type: object, properties: {value: {type: string}}, required: [value],
                additionalProperties: false}
  leave:
    python: hard:leave
    arguments: {type: object, additionalProperties: false}
  leave_timed:
    python: hard:leave
    timeout: 60
    arguments: {type: object, additionalProperties: false}
  interrupt_timed:
    python: hard:interrupt
    timeout: 60
    arguments: {type: object, additionalProperties: false}
  stop:
    python: hard:stop
    arguments: {type: object, additionalProperties: false}
  cancel:
    python: hard:cancel
    arguments: {type: object, additionalProperties: false}
  keyed:
    python: hard:keyed
    arguments: {type: object, additionalProperties: false}
  take_keyed:
    command: ["cat"]
    output: json
    arguments: {type: object, properties: {m: {type: object, properties: {"1": {type: integer}}}},
                required: [m]}
  odd:
    python: hard:odd
    arguments: {type: object, additionalProperties: false}
  deep:
    python: hard:deep
    arguments: {type: object, properties: {levels: {type: integer}},
                additionalProperties: false}
  ask:
    python: hard:ask
    arguments: {type: object, additionalProperties: false}
  echo:
    python: hard:echo
    arguments: {type: object, properties: {value: {}}, required: [value],
                additionalProperties: false}
"""


class Proj:
    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "plans").mkdir(parents=True)
        (root / "hard.py").write_text(MODULE)
        (root / "tools.yaml").write_text(TOOLS)
        self.journal = root / "journal.sqlite3"

    def plan(self, name: str, text: str) -> None:
        (self.root / "plans" / f"{name}.yaml").write_text(text)

    def one_step(self, name: str, tool: str, arguments: str = "{}", params: str = "") -> None:
        self.plan(name, f"planrun: 1\ngoal: {name}\n{params}steps:\n"
                        f"  - {{id: s, tool: {tool}, arguments: {arguments}}}\n")

    def run(self, *args: str, stdin: int | None = subprocess.DEVNULL, journal: str | None = None
            ) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, PLANRUN_JOURNAL=journal or str(self.journal))
        return run_planrun(*args, cwd=self.root, env=env, stdin=stdin)


@pytest.fixture
def proj(tmp_path: Path) -> Proj:
    return Proj(tmp_path / "p")


def _step(res: subprocess.CompletedProcess[str]) -> dict[str, object]:
    return dict(json.loads(res.stdout)["steps"][0])


def test_a_command_ignoring_sigterm_is_killed_at_its_timeout(proj: Proj) -> None:
    proj.one_step("stub", "stubborn")
    res = proj.run("execute", "stub", "--json")
    assert res.returncode == 1
    step = _step(res)
    assert step["status"] == "indeterminate"
    assert step["error"] == {"code": "timeout", "message":
                             "command ran past its timeout of 1.0 s and was killed"}


def test_a_background_child_does_not_hold_the_call_open(proj: Proj) -> None:
    proj.one_step("bg", "daemonize")
    res = proj.run("execute", "bg", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    run_id = json.loads(res.stdout)["run_id"]
    assert json.loads(proj.run("output", run_id, "s").stdout) == "started"


@pytest.mark.parametrize(("tool", "arguments", "code", "needle"), [
    ("leave", "{}", "tool_error", "SystemExit: 3"),
    # with a timeout too: the call is awaited another way (asyncio.wait_for)
    ("leave_timed", "{}", "tool_error", "SystemExit: 3"),
    ("interrupt_timed", "{}", "tool_error", "KeyboardInterrupt"),
    # asyncio refuses a StopIteration as a future's exception: it must not hang the run
    ("stop", "{}", "tool_error", "StopIteration: no more"),
    # the tool's own CancelledError is its failure, not an interruption of the run
    ("cancel", "{}", "tool_error", "CancelledError: inner"),
    ("odd", "{}", "tool_error", "Odd: <the exception's message could not be read>"),
    ("deep", "{}", "output", "nested too deeply"),
    # json writes 500 levels, but planrun's recursive walks (masking, facets) would not
    ("deep", "{levels: 500}", "output", "nested too deeply to store (more than 200 levels)"),
], ids=["leave", "leave_timed", "interrupt_timed", "stop", "cancel",
                                 "odd", "deep5000", "deep500"])
def test_odd_python_tools_fail_their_step_not_planrun(proj: Proj, tool: str, arguments: str,
                                                      code: str, needle: str) -> None:
    proj.one_step("t", tool, arguments)
    res = proj.run("execute", "t", "--json")
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr
    step = _step(res)
    assert step["status"] == "failed"
    assert isinstance(step["error"], dict)
    assert step["error"]["code"] == code
    assert needle in str(step["error"]["message"])


def test_an_output_is_seen_by_the_next_step_as_the_journal_keeps_it(proj: Proj) -> None:
    """A python tool's ``{1: "one"}`` is JSON ``{"1": "one"}``: checked as that, now too.

    The key ``1`` was skipped by the contract's ``properties: {"1": {type: integer}}``, and
    the command got ``{"1": "one"}`` on stdin, which its contract refuses (and which a
    retry, reading the output from the journal, refused).
    """
    proj.plan("keyed", "planrun: 1\ngoal: g\nsteps:\n  - {id: a, tool: keyed, arguments: {}}\n"
                       "  - {id: b, tool: take_keyed, depends_on: [a],\n"
                       "     arguments: {m: '{steps.a.output.m}'}}\n")
    res = proj.run("execute", "keyed", "--json")
    assert res.returncode == 1, res.stdout + res.stderr
    steps = {s["id"]: s for s in json.loads(res.stdout)["steps"]}
    assert steps["a"]["status"] == "succeeded"
    assert steps["b"]["status"] == "failed"
    assert steps["b"]["error"]["code"] == "arguments"
    assert "/m/1" in steps["b"]["error"]["message"]


def test_a_tool_reading_stdin_gets_end_of_file_not_the_pipe(proj: Proj) -> None:
    proj.one_step("ask", "ask")
    # stdin is a pipe nobody ever writes to or closes: reading it would hang forever
    read, write = os.pipe()
    try:
        res = proj.run("execute", "ask", "--json", stdin=read)
    finally:
        os.close(read)
        os.close(write)
    step = _step(res)
    assert step["status"] == "failed"
    assert "EOFError" in str(step["error"])


def test_a_json_plan_with_a_huge_integer_is_a_syntax_issue(proj: Proj) -> None:
    (proj.root / "plans" / "big.json").write_text(
        '{"planrun": 1, "goal": "g", "steps": [{"id": "a", "tool": "echo", '
        '"arguments": {"value": ' + "9" * 5000 + "}}]}")
    res = proj.run("validate", "big", "--format", "json")
    assert res.returncode == 3
    assert [i["code"] for i in json.loads(res.stdout)["plans"][0]["issues"]] == ["syntax"]


@pytest.mark.sqlite
def test_a_journal_that_is_not_a_regular_file_or_not_planruns_is_refused(
        proj: Proj, tmp_path: Path) -> None:
    proj.one_step("e", "echo", "{value: 1}")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    res = proj.run("execute", "e", journal=str(fifo))
    assert res.returncode == 6
    assert "not a regular file" in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("fifo")) == ["fifo"]
    foreign = tmp_path / "other.sqlite3"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE mine (a)")
    res = proj.run("execute", "e", journal=str(foreign))
    assert res.returncode == 6
    assert "not a planrun journal" in res.stderr
    with sqlite3.connect(foreign) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert tables == {"mine"}  # nothing of ours was written into it


@pytest.mark.sqlite
def test_read_commands_refuse_a_journal_that_is_not_one_as_writes_do(
        proj: Proj, tmp_path: Path) -> None:
    """``runs`` called another application's database, and a journal truncated to 50
    bytes, "no runs" (exit 0) where a write said exit 6 (found by an attacker)."""
    proj.one_step("e", "echo", "{value: 1}")
    real = tmp_path / "real.sqlite3"
    assert proj.run("execute", "e", journal=str(real)).returncode == 0
    cut = tmp_path / "cut.sqlite3"
    cut.write_bytes(real.read_bytes()[:50])
    foreign = tmp_path / "other.sqlite3"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE mine (a)")
    for path, words in ((cut, "corrupt or not a planrun journal"),
                        (foreign, "not a planrun journal")):
        for args in (("runs",), ("status", "last"), ("execute", "e")):
            res = proj.run(*args, journal=str(path))
            assert res.returncode == 6, (args, res)
            assert words in res.stderr, (args, res)
            assert "Traceback" not in res.stderr, res
    empty = tmp_path / "empty.sqlite3"
    empty.touch()  # a journal planrun made and has not set up yet: it reads as empty
    assert proj.run("runs", journal=str(empty)).returncode == 0


def test_a_parameter_given_twice_is_a_usage_error(proj: Proj) -> None:
    proj.one_step("e", "echo", '{value: "{params.v}"}', params="params:\n  v: {type: string}\n")
    res = proj.run("execute", "e", "-p", "v=1", "-p", "v=2")
    assert res.returncode == 2
    assert "given twice" in res.stderr


@pytest.mark.parametrize(("schema", "value", "secret_texts"), [
    ("{type: integer, secret: true}", "98765432", ["98765432"]),
    ("{type: object, secret: true}", '{"user": "bob", "password": "hunter2XYZ"}',
     ["hunter2XYZ"]),
])
def test_number_and_structured_secrets_are_masked(proj: Proj, schema: str, value: str,
                                                  secret_texts: list[str]) -> None:
    proj.one_step("s", "echo", '{value: "{params.v}"}', params=f"params:\n  v: {schema}\n")
    res = proj.run("execute", "s", "-p", f"v={value}", "--json")
    assert res.returncode == 0, res.stderr
    run_id = json.loads(res.stdout)["run_id"]
    texts = [res.stdout, res.stderr, proj.run("output", run_id, "s").stdout,
             proj.run("log", run_id, "--json").stdout]
    texts += [p.read_bytes().decode("utf-8", "replace") for p in proj.root.iterdir()
              if p.name.startswith("journal.sqlite3")]
    for text in texts:
        for secret in secret_texts:
            assert secret not in text


def test_a_secret_cut_by_the_stderr_tail_leaves_no_fragment(proj: Proj) -> None:
    secret = "AbCdEfGhIjKlMnOpQrSt"
    proj.one_step("t", "tail_secret", '{value: "{params.v}"}',
                  params="params:\n  v: {type: string, secret: true}\n")
    res = proj.run("execute", "t", "-p", f"v={secret}", "--json")
    assert res.returncode == 1
    message = str(_step(res)["error"])
    for cut in range(4, len(secret) + 1):
        assert secret[-cut:] not in message  # no tail end of the secret either
    assert "***" in message
