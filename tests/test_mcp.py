"""``planrun mcp`` driven by the MCP SDK's own client over real stdio (SPEC §10, Agents).

Each test starts ``python -m planrun mcp -C PROJECT --journal FILE`` as a real subprocess
through ``mcp.client.stdio.stdio_client`` and talks to it with ``ClientSession``; the
person's side (``planrun approve``, ``planrun resume``, ``planrun runs``) is the real CLI
in another subprocess, on the same journal.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from harness import run_planrun

TOOLS = """
tools:
  echo:
    python: agenttools:echo
    description: Record a value.
    arguments:
      type: object
      properties: {value: {}}
      required: [value]
      additionalProperties: false
  shout:
    python: agenttools:shout
    description: Print to stdout (and stderr), then return.
    arguments:
      type: object
      properties: {value: {}}
      required: [value]
      additionalProperties: false
  wipe:
    python: agenttools:wipe
    description: Irreversible on purpose.
    irreversible: true
    arguments:
      type: object
      properties: {value: {}}
      required: [value]
      additionalProperties: false
  hold:
    python: agenttools:hold
    description: Tell the test this process's id, then wait for its word.
    arguments: {type: object, additionalProperties: false}
  launch:
    python: agenttools:echo
    description: Registered, but the policy does not allow it.
    arguments:
      type: object
      properties: {value: {}}
      required: [value]
      additionalProperties: false
"""

MODULE = '''
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _record(what):
    with open(HERE / "effects.log", "a", encoding="utf-8") as f:
        f.write(f"{what}\\n")


def echo(value):
    _record(f"echo {value}")
    return {"value": value}


def shout(value):
    # Everything a tool can write to "stdout": Python, the file descriptor, a child.
    print(f"SHOUT {value} " + "{" * 3, flush=True)
    os.write(1, b"not json-rpc at all\\n")
    os.system("echo from a child process")
    print("to stderr", file=sys.stderr)
    _record(f"shout {value}")
    return {"value": value}


def hold():
    import time

    (HERE / "server.pid").write_text(str(os.getpid()))
    for _ in range(600):
        if (HERE / "go").exists():
            break
        time.sleep(0.05)
    _record("hold")
    return {"held": True}


def wipe(value):
    _record(f"wipe {value}")
    return {"wiped": value}
'''

CONFIG = """
[policy]
allowed_tools = ["echo", "shout", "wipe", "hold"]
"""

HELLO = """
planrun: 1
name: hello
goal: Say hello loudly
params:
  who: {type: string, default: world}
  token: {type: string, default: "", secret: true}
steps:
  - {id: greet, tool: echo, arguments: {value: "hello {params.who}"}}
  - {id: loud, tool: shout, depends_on: [greet], arguments: {value: "{params.token}"}}
"""

DANGER = """
planrun: 1
name: danger
goal: Record, then wipe
steps:
  - {id: first, tool: echo, arguments: {value: 1}}
  - {id: wipe, tool: wipe, depends_on: [first], arguments: {value: "{steps.first.output.value}"}}
"""

HOLD = """
planrun: 1
name: hold
goal: Wait for the test, then echo
steps:
  - {id: hold, tool: hold}
  - {id: after, tool: echo, depends_on: [hold], arguments: {value: 2}}
"""

BROKEN = """
planrun: 1
name: broken
goal: Has problems
steps:
  - {id: a, tool: ecko, arguments: {value: 1}}
  - {id: b, tool: echo, depends_on: [zz], arguments: {value: 1, extra: 2}}
"""


@pytest.fixture
def agent_project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / "plans").mkdir(parents=True)
    (root / "tools.yaml").write_text(TOOLS)
    (root / "agenttools.py").write_text(MODULE)
    (root / "planrun.toml").write_text(CONFIG)
    (root / "plans" / "hello.yaml").write_text(HELLO)
    (root / "plans" / "danger.yaml").write_text(DANGER)
    (root / "plans" / "hold.yaml").write_text(HOLD)
    return root


def _effects(root: Path) -> list[str]:
    log = root / "effects.log"
    return log.read_text().splitlines() if log.exists() else []


def _serve(root: Path, body: Callable[[ClientSession], Awaitable[Any]],
           env: dict[str, str] | None = None) -> Any:
    """Run ``body`` against a real ``planrun mcp`` subprocess; its stderr in server.err.

    ``env``: more variables of the server's environment.
    """
    journal = root.parent / "journal.sqlite3"
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "planrun", "mcp", "-C", str(root), "--journal", str(journal)],
        cwd=str(root.parent), env={"NO_COLOR": "1", **(env or {})})

    async def main() -> Any:
        with (root.parent / "server.err").open("w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                with anyio.fail_after(60):
                    return await body(session)

    return anyio.run(main)


def _server_err(root: Path) -> str:
    return (root.parent / "server.err").read_text()


def _cli(root: Path, *args: str) -> Any:
    journal = root.parent / "journal.sqlite3"
    return run_planrun(*args, "-C", str(root), "--journal", str(journal), cwd=root.parent)


async def _call(session: ClientSession, name: str, **arguments: Any) -> Any:
    return await session.call_tool(name, arguments)


@contextlib.contextmanager
def _raw_server(root: Path, plan: str) -> Iterator[subprocess.Popen[str]]:
    """``planrun mcp`` on pipes, no SDK client: initialized, asked to execute ``plan``.

    Killed at the end (and by a watchdog after 60 s).
    """
    from mcp.client.session import LATEST_HANDSHAKE_VERSION

    journal = root.parent / "journal.sqlite3"
    proc = subprocess.Popen(
        [sys.executable, "-m", "planrun", "mcp", "-C", str(root), "--journal",
         str(journal)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=root.parent)
    watchdog = threading.Timer(60, proc.kill)
    watchdog.start()
    try:
        assert proc.stdin is not None
        for message in (
                {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                    "protocolVersion": LATEST_HANDSHAKE_VERSION, "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "1"}}},
                {"jsonrpc": "2.0", "method": "notifications/initialized"},
                {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
                    "name": "execute_plan", "arguments": {"plan": plan}}}):
            proc.stdin.write(json.dumps(message) + "\n")
        proc.stdin.flush()
        yield proc
    finally:
        watchdog.cancel()
        proc.kill()


# --- the catalog and the tools' schemas ----------------------------------------------------


def test_lists_only_allowed_tools_and_no_tool_can_clear_a_step(agent_project: Path) -> None:
    async def body(session: ClientSession) -> Any:
        listed = await session.list_tools()
        catalog = await _call(session, "list_tools")
        return listed, catalog

    listed, catalog = _serve(agent_project, body)
    names = {t.name for t in listed.tools}
    assert {"list_tools", "validate_plan", "show_plan", "dry_run", "execute_plan",
            "resume_run", "run_status", "run_log", "run_output"} <= names
    # Nothing a client can call or pass clears a step: no approve tool, no approve field.
    assert not [n for n in names if "approv" in n or "deny" in n or "grant" in n]
    for tool in listed.tools:
        fields = set(tool.input_schema.get("properties", {}))
        assert not [f for f in fields if "approv" in f or "grant" in f], (tool.name, fields)
        assert tool.input_schema["additionalProperties"] is False, tool.name
    assert not catalog.is_error
    allowed = [t["name"] for t in catalog.structured_content["tools"]]
    assert sorted(allowed) == ["echo", "hold", "shout", "wipe"]  # launch is registered, not allowed
    wipe = next(t for t in catalog.structured_content["tools"] if t["name"] == "wipe")
    assert wipe["irreversible"] is True


# --- validation ------------------------------------------------------------------------------


def test_validate_a_broken_inline_plan_reports_codes_and_pointers(agent_project: Path) -> None:
    async def body(session: ClientSession) -> Any:
        broken = await _call(session, "validate_plan", text=BROKEN)
        as_json = await _call(session, "validate_plan", text=json.dumps(
            {"planrun": 1, "goal": "g", "steps": [{"id": "x", "tool": "echo",
                                                   "arguments": {"value": 1}}]}))
        by_name = await _call(session, "validate_plan", plan="hello")
        both = await _call(session, "validate_plan", plan="hello", text=BROKEN)
        return broken, as_json, by_name, both

    broken, as_json, by_name, both = _serve(agent_project, body)
    # A refused plan is a normal result: the report, not a protocol or tool error.
    assert broken.is_error is False
    report = broken.structured_content
    assert report["ok"] is False
    issues = report["plans"][0]["issues"]
    codes = {i["code"] for i in issues}
    assert {"unknown_tool", "dependency"} <= codes, codes
    pointers = {i["path"] for i in issues}
    assert "/steps/0/tool" in pointers, pointers
    assert any(p.startswith("/steps/1") for p in pointers), pointers
    text = broken.content[0].text
    assert text.startswith("refused")
    assert "unknown_tool" in text
    assert "/steps/0/tool" in text
    # The same shape as `planrun validate --format json`.
    (agent_project / "plans" / "broken.yaml").write_text(BROKEN)
    cli = _cli(agent_project, "validate", "broken", "--format", "json")
    assert cli.returncode == 3
    cli_issues = json.loads(cli.stdout)["plans"][0]["issues"]
    assert [{**i, "file": None} for i in cli_issues] == [{**i, "file": None} for i in issues]
    assert {i["file"] for i in issues} == {"<stdin>"}  # an inline plan has no file
    assert as_json.structured_content is not None, as_json
    assert as_json.structured_content["ok"] is True
    assert as_json.structured_content["plans"][0]["plan"]["steps"][0]["id"] == "x"
    assert by_name.structured_content["ok"] is True
    assert both.is_error is True
    assert both.structured_content["error"]["code"] == "usage"


def test_show_and_dry_run(agent_project: Path) -> None:
    async def body(session: ClientSession) -> Any:
        return (await _call(session, "show_plan", plan="danger"),
                await _call(session, "dry_run", plan="plans/danger.yaml"),
                await _call(session, "dry_run", plan="nope"))

    show, dry, missing = _serve(agent_project, body)
    assert not show.is_error
    assert [s["id"] for s in show.structured_content["steps"]] == ["first", "wipe"]
    assert dry.structured_content["order"] == ["first", "wipe"]
    assert dry.structured_content["approvals"] == ["wipe"]
    assert missing.is_error is True
    assert missing.structured_content["error"]["code"] == "not_found"
    assert _effects(agent_project) == []  # nothing ran
    assert json.loads(_cli(agent_project, "runs", "--json").stdout) == []  # nothing journaled


# --- running: deferred approval, the person's side, reading the run -----------------------


def test_execute_waits_for_a_person_then_approve_and_resume_complete_it(
        agent_project: Path) -> None:
    async def first(session: ClientSession) -> Any:
        return await _call(session, "execute_plan", plan="danger")

    started = _serve(agent_project, first)
    data = started.structured_content
    run_id = data["run_id"]
    assert data["status"] == "awaiting_approval", data
    assert data["ok"] is False
    assert data["next"] == f"planrun approve {run_id} wipe"
    assert data["waiting"] == [{"step": "wipe", "tool": "wipe", "reason": "irreversible"}]
    assert data["exit_status"] == 4
    assert f"planrun approve {run_id}" in started.content[0].text
    assert _effects(agent_project) == []  # nothing has run
    # An ordinary journaled run, seen by the CLI.
    rows = json.loads(_cli(agent_project, "runs", "--json").stdout)
    assert [(r["run_id"], r["status"]) for r in rows] == [(run_id, "awaiting_approval")]

    async def still_waiting(session: ClientSession) -> Any:
        resumed = await _call(session, "resume_run", run=run_id)
        cheat = await _call(session, "resume_run", run=run_id, approve_all=True)
        return resumed, cheat

    resumed, cheat = _serve(agent_project, still_waiting)
    # Resuming through the server never clears the step: the run still waits.
    assert resumed.structured_content["status"] == "awaiting_approval"
    assert cheat.is_error is True  # an unknown argument is refused, not ignored
    assert cheat.structured_content["error"]["code"] == "usage"
    assert "'approve_all'" in cheat.content[0].text
    assert _effects(agent_project) == []

    approved = _cli(agent_project, "approve", run_id, "--all")
    assert approved.returncode == 0, approved.stderr
    done = _cli(agent_project, "resume", run_id, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "completed"
    assert _effects(agent_project) == ["echo 1", "wipe 1"]

    async def read(session: ClientSession) -> Any:
        return (await _call(session, "run_status", run=run_id),
                await _call(session, "run_log", run=run_id),
                await _call(session, "run_output", run=run_id, step="wipe"),
                await _call(session, "run_output", run="zzzzzzzz", step="wipe"),
                await _call(session, "list_runs"))

    status, log, output, unknown, runs = _serve(agent_project, read)
    assert status.structured_content["status"] == "completed"
    assert status.structured_content["run_id"] == run_id
    kinds = [e["kind"] for e in log.structured_content["events"]]
    assert kinds[0] == "planned"
    assert "awaiting_approval" in kinds or any("approv" in k for k in kinds), kinds
    assert ("step_succeeded", "wipe") in [(e["kind"], e["step"])
                                          for e in log.structured_content["events"]]
    assert "step_succeeded wipe" in log.content[0].text
    assert output.structured_content["output"] == {"wiped": 1}
    assert unknown.is_error is True
    assert unknown.structured_content["error"]["code"] == "unknown_run"
    assert [r["run_id"] for r in runs.structured_content["runs"]] == [run_id]
    assert "Traceback" not in _server_err(agent_project)


def test_a_tool_that_prints_does_not_break_the_protocol_and_secrets_are_masked(
        agent_project: Path) -> None:
    secret = "s3cr3t-T0KEN-value"

    async def body(session: ClientSession) -> Any:
        ran = await _call(session, "execute_plan", plan="hello",
                          params={"who": "agent", "token": secret})
        # The session still works after the tool printed on every channel it could.
        after = await _call(session, "run_output", step="loud")
        shown = await _call(session, "show_plan", plan="hello", params={"token": secret})
        checked = await _call(session, "validate_plan", plan="hello",
                              params={"token": secret})
        again = await _call(session, "resume_run", run=ran.structured_content["run_id"],
                            params={"token": secret})
        return ran, after, shown, checked, again

    ran, after, shown, checked, again = _serve(agent_project, body)
    assert again.is_error is True  # a completed run is not resumable
    assert again.structured_content["error"]["code"] == "run_not_resumable"
    assert ran.structured_content["manifest"]["params"]["token"] == "***"
    assert ran.structured_content["status"] == "completed", ran.structured_content
    assert _effects(agent_project) == ["echo hello agent", f"shout {secret}"]
    assert after.structured_content["output"] == {"value": "***"}
    err = _server_err(agent_project)
    assert "SHOUT" in err
    assert "not json-rpc at all" in err
    assert "from a child process" in err
    for result in (ran, after, shown, checked, again):
        dumped = json.dumps(result.structured_content) + result.content[0].text
        assert secret not in dumped
    assert secret not in err
    assert "Traceback" not in err


def test_sigterm_during_a_run_interrupts_it_and_the_session_goes_on(
        agent_project: Path) -> None:
    # The run is driven on the server's main thread: the scheduler's signal handlers work,
    # and SIGTERM interrupts the run as it does `planrun execute` (journaled, resumable).
    import os
    import signal

    async def body(session: ClientSession) -> Any:
        results: list[Any] = []

        async def execute() -> None:
            results.append(await _call(session, "execute_plan", plan="hold"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(execute)
            pid_file = agent_project / "server.pid"
            while not pid_file.exists():
                await anyio.sleep(0.05)
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
            # While the run is stopping, the read tools still answer.
            status = await _call(session, "run_status")
            (agent_project / "go").write_text("")
        after = await _call(session, "run_status")
        return results[0], status, after

    ran, during, after = _serve(agent_project, body)
    assert ran.structured_content["status"] == "interrupted", ran.structured_content
    assert ran.structured_content["exit_status"] == 143
    assert during.structured_content["status"] in ("running", "interrupted")
    assert after.structured_content["status"] == "interrupted"
    assert _effects(agent_project) == ["hold"]  # 'after' never started
    done = _cli(agent_project, "resume", "--json")
    assert done.returncode == 0, done.stderr
    assert _effects(agent_project) == ["hold", "echo 2"]  # hold is not run again
    assert "Traceback" not in _server_err(agent_project)


def test_bad_arguments_are_tool_errors_without_a_traceback(agent_project: Path) -> None:
    async def body(session: ClientSession) -> Any:
        return [await _call(session, "execute_plan"),
                await _call(session, "execute_plan", plan=7),
                await _call(session, "run_output", step="x", item=-1),
                await _call(session, "validate_plan"),
                await _call(session, "validate_plan", text="steps: [: nope"),
                await _call(session, "validate_plan", text="x" * 3_000_000),
                await _call(session, "execute_plan", plan="broken"),
                await _call(session, "no_such_tool"),
                await _call(session, "validate_plan", plan="/etc/hostname"),
                await _call(session, "execute_plan", plan="../outside.yaml"),
                # a name whose file in the plans folder is a symlink out of the project
                await _call(session, "validate_plan", plan="linked"),
                await _call(session, "execute_plan", plan="linked")]

    (agent_project.parent / "outside.yaml").write_text(HELLO)
    (agent_project / "plans" / "linked.yaml").symlink_to(agent_project.parent / "outside.yaml")
    results = _serve(agent_project, body)
    assert [r.is_error for r in results] == [True, True, True, True, False, False, True, True,
                                             True, True, True, True]
    for outside in results[-4:]:
        assert outside.structured_content["error"]["code"] == "usage"
        assert "outside the project" in outside.content[0].text
    assert _effects(agent_project) == []
    assert results[4].structured_content["ok"] is False
    assert results[5].structured_content["ok"] is False  # a big text: a report, as any
    assert "Traceback" not in _server_err(agent_project)


def test_arguments_against_the_input_schema_are_usage_errors_in_the_documented_shape(
        agent_project: Path) -> None:
    async def body(session: ClientSession) -> Any:
        return [await _call(session, "execute_plan", plan=7),
                await _call(session, "execute_plan"),
                await _call(session, "list_runs", limit="many"),
                await _call(session, "run_status", run=["a"]),
                await _call(session, "run_output", step="x", item=-1),
                # found by attack: a NUL in a name, an index past 64 bits (tracebacks)
                await _call(session, "validate_plan", plan="a/\u0000"),
                await _call(session, "validate_plan", plan="a\u0000"),
                await _call(session, "run_output", step="x", item=10**23),
                await _call(session, "run_status", run="ab\u0000cd")]

    results = _serve(agent_project, body)
    for result, words in zip(results, ["plan", "plan", "limit", "run", "item", "plan", "plan",
                                       "item", "run"], strict=True):
        assert result.is_error is True
        error = result.structured_content["error"]
        assert (error["code"], error["exit_status"]) == ("usage", 2)
        assert set(error) == {"code", "message", "hint", "exit_status"}
        assert result.structured_content["ok"] is False
        assert words in error["message"]
        assert result.content[0].text.startswith("error[usage]: ")
        assert "pydantic" not in result.content[0].text
    assert _effects(agent_project) == []
    assert "Traceback" not in _server_err(agent_project)


def test_stdout_carries_only_protocol_messages_and_the_server_exits_with_its_client(
        agent_project: Path) -> None:
    # The raw wire, no SDK client: every line on the server's stdout is a JSON-RPC message
    # while a tool prints on every channel it can, and the server exits by itself (status
    # 0, no thread left waiting) once its client closes stdin.
    with _raw_server(agent_project, "hello") as proc:
        assert proc.stdin is not None
        assert proc.stdout is not None
        lines = []
        while True:
            line = proc.stdout.readline()
            assert line, "the server closed stdout before answering"
            lines.append(line)
            if json.loads(line).get("id") == 2:
                break
        proc.stdin.close()
        rest = proc.stdout.read()
        err = proc.stderr.read() if proc.stderr else ""
        code = proc.wait()
    messages = [json.loads(line) for line in [*lines, *rest.splitlines()] if line.strip()]
    assert all(m.get("jsonrpc") == "2.0" for m in messages), messages
    answer = next(m for m in messages if m.get("id") == 2)
    assert answer["result"]["structuredContent"]["status"] == "completed", answer
    assert code == 0, err
    assert "SHOUT" in err
    assert "not json-rpc at all" in err
    assert "Traceback" not in err


def test_missing_extra_is_one_message(tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(textwrap.dedent("""
        import sys
        sys.modules["mcp"] = None  # as if the extra were not installed
    """))
    import os

    env = {**os.environ, "PYTHONPATH": str(blocker)}
    # a fresh interpreter: a fork of a warm one would not read PYTHONPATH's sitecustomize
    result = run_planrun("mcp", "-C", str(tmp_path), env=env, cwd=tmp_path, real=True)
    assert result.returncode == 2
    assert "pip install 'planrun[mcp]'" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_cli_start_up_does_not_import_mcp() -> None:
    import subprocess

    # nor the dask extra's packages (--executor dask imports them when used)
    probe = ("import sys; import planrun.cli; "
             "print(sorted(m for m in sys.modules "
             "if m.split('.')[0] in ('mcp', 'dask', 'distributed')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out.strip() == "[]"


# --- what a client is sent (found by attack) --------------------------------------------------


def test_a_short_secret_leaves_ids_statuses_and_counts_as_they_are(
        agent_project: Path) -> None:
    """SPEC §7: run ids, statuses, codes and planrun's own words are never masked,
    however short the secret: ``"e"`` made ``"status": "compl***t***d"`` and a run id no
    client could use."""
    import re

    async def body(session: ClientSession) -> Any:
        ran = await _call(session, "execute_plan", plan="hello",
                          params={"who": "agent", "token": "e"})
        status = await _call(session, "run_status", run=ran.structured_content["run_id"])
        shown = await _call(session, "show_plan", plan="hello", params={"token": "e"})
        checked = await _call(session, "validate_plan", plan="hello", params={"token": "a"})
        return ran, status, shown, checked

    ran, status, shown, checked = _serve(agent_project, body)
    # Nor plan names, files, step ids in depends_on, run_if or the summary's words: the
    # server looked for every secret the client gave in every text, "e" and "a" too
    # (found by an attacker: "plans/h***llo.yaml", ["gr******t"], "succ***ss").
    assert shown.content[0].text == "plan hello: 2 step(s), 0 need approval"
    assert shown.structured_content["file"] == "plans/hello.yaml"
    assert [(s["depends_on"], s["run_if"]) for s in shown.structured_content["steps"]] == [
        ([], "success"), (["greet"], "success")]
    assert [p["name"] for p in shown.structured_content["params"]] == ["who", "token"]
    assert shown.structured_content["params"][1]["default"] == "***"
    assert checked.content[0].text == "ok: 0 error(s), 0 warning(s)"
    assert checked.structured_content["plans"][0]["file"] == "plans/hello.yaml"
    assert checked.structured_content["plans"][0]["plan"]["goal"] == "Say hello loudly"
    assert checked.structured_content["plans"][0]["plan"]["params"]["token"] == "***"
    assert "exit 0" in ran.content[0].text
    assert ran.structured_content["manifest"]["plan"]["file"] == "plans/hello.yaml"
    data = ran.structured_content
    assert re.fullmatch(r"[0-9a-f]{16}", data["run_id"]), data["run_id"]
    assert data["status"] == "completed"
    assert isinstance(data["manifest"]["counts"]["total"], int)
    assert data["run_id"] in ran.content[0].text
    assert "completed" in ran.content[0].text
    assert status.structured_content["run_id"] == data["run_id"]
    assert _effects(agent_project)[-1] == "shout e"
    # the secret itself is still hidden where a tool echoed it
    assert status.structured_content["steps"][1]["id"] == "loud"


def test_a_message_with_a_lone_surrogate_is_sent_escaped(agent_project: Path) -> None:
    """A tool's error naming an undecodable file name (``os.listdir`` keeps its byte as
    a lone surrogate): the SDK could not send the answer and the session stopped
    answering; ``planrun report`` failed on the same run."""
    (agent_project / "tools.yaml").write_text(TOOLS + """\
  latin:
    python: agenttools:latin
    description: Fails naming a file name that is not UTF-8.
    arguments: {type: object, additionalProperties: false}
""")
    (agent_project / "agenttools.py").write_text(MODULE + '''

def latin():
    raise ValueError("file name not UTF-8: " + b"caf\\xe9.txt".decode("utf-8", "surrogateescape"))
''')
    (agent_project / "planrun.toml").write_text(CONFIG.replace('"hold"]', '"hold", "latin"]'))
    (agent_project / "plans" / "latin.yaml").write_text(
        "planrun: 1\nname: latin\ngoal: fail\nsteps:\n  - {id: l, tool: latin}\n")

    async def body(session: ClientSession) -> Any:
        ran = await _call(session, "execute_plan", plan="latin")
        run_id = ran.structured_content["run_id"]
        return (ran, await _call(session, "run_status", run=run_id),
                await _call(session, "run_log", run=run_id))

    ran, status, log = _serve(agent_project, body)
    assert ran.structured_content["status"] == "failed"
    for result in (ran, status, log):  # the surrogate as its escape: \\udce9, as text
        sent = json.dumps(result.structured_content, ensure_ascii=False)
        assert "caf\\\\udce9.txt" in sent, result
    out = agent_project.parent / "r.html"
    res = _cli(agent_project, "report", ran.structured_content["run_id"], "--out", str(out))
    assert res.returncode == 0, res
    assert "caf\\udce9.txt" in out.read_text(encoding="utf-8")


def test_a_summary_keeps_planruns_words_but_never_cuts_a_secret() -> None:
    """The summary text keeps ids and statuses whole, but a word kept must not cut a
    secret in pieces that are then not found (found by a re-checking helper)."""
    from planrun.mcp_server import _result

    data = {"run_id": "ab12cd34ef56ab78", "status": "failed",
            "issues": [{"step": "a", "code": "arguments"}]}
    summary = "run ab12cd34ef56ab78: failed; step a: 'bananarama' is not an integer"
    result = _result(data, summary, secrets={"tok": "bananarama"})
    text = result.content[0].text
    assert "banana" not in text
    assert "ab12cd34ef56ab78" in text
    assert "failed" in text
    short = _result(data, summary.replace("bananarama", "e"), secrets={"tok": "e"})
    assert "failed" in short.content[0].text  # a one-letter secret garbles no word


def test_a_client_that_leaves_mid_run_changes_no_outcome(agent_project: Path) -> None:
    # The client disconnects (stdin, stdout and stderr closed) while a run goes on: the
    # run ends as it would have, journaled. A python tool that then writes to file
    # descriptor 1 itself (what tools print goes to the server's stderr, now a pipe
    # nobody reads) failed with BrokenPipeError (found by an attacker).
    import time

    (agent_project / "plans" / "later.yaml").write_text(textwrap.dedent("""
        planrun: 1
        name: later
        goal: Wait for the test, then print on every channel
        steps:
          - {id: hold, tool: hold}
          - {id: loud, tool: shout, depends_on: [hold], arguments: {value: after}}
    """))
    with _raw_server(agent_project, "later") as proc:
        assert proc.stdin is not None
        assert proc.stdout is not None
        assert proc.stderr is not None
        assert json.loads(proc.stdout.readline())["id"] == 1
        pid_file = agent_project / "server.pid"
        while not pid_file.exists():
            time.sleep(0.05)
        for stream in (proc.stdin, proc.stdout, proc.stderr):  # the client is gone
            stream.close()
        time.sleep(0.5)
        (agent_project / "go").write_text("")
        code = proc.wait(timeout=50)
    assert code == 0
    assert _effects(agent_project) == ["hold", "shout after"]
    done = json.loads(_cli(agent_project, "status", "last", "--json").stdout)
    assert done["status"] == "completed", done
    assert [(s["id"], s["status"], s.get("error")) for s in done["steps"]] == [
        ("hold", "succeeded", None), ("loud", "succeeded", None)]


RESOLVED = """
planrun: 1
name: resolved
goal: Record, then wipe what the record says (cleared with its resolved value)
steps:
  - {id: first, tool: echo, arguments: {value: 1}}
  - id: wipe
    tool: wipe
    depends_on: [first]
    approve: resolved
    arguments: {value: "{steps.first.output.value}"}
"""

SECRET = """
planrun: 1
name: secret
goal: Wipe with a secret
params:
  token: {type: string, secret: true}
steps:
  - {id: wipe, tool: wipe, arguments: {value: "{params.token}"}}
"""


def test_what_an_agent_is_told_of_a_waiting_or_failed_run_is_true(agent_project: Path) -> None:
    # The summary said "nothing has run" for an `approve: resolved` run whose first step
    # had run; a run with a secret parameter's resume_run was told to "give -p token=VALUE
    # to this command"; a failed run's summary did not name its failed step (found by a
    # fresh operator).
    (agent_project / "plans" / "resolved.yaml").write_text(RESOLVED)
    (agent_project / "plans" / "secret.yaml").write_text(SECRET)
    (agent_project / "plans" / "broke.yaml").write_text(
        "planrun: 1\ngoal: Fail\nsteps:\n  - {id: first, tool: echo, arguments: {value: 1}}\n"
        "  - {id: bad, tool: echo, depends_on: [first],\n"
        "     arguments: {value: '{steps.first.output.nope}'}}\n")

    async def body(session: ClientSession) -> Any:
        return (await _call(session, "execute_plan", plan="resolved"),
                await _call(session, "execute_plan", plan="secret",
                            params={"token": "s3cr3t-value"}),
                await _call(session, "resume_run", run="last"),
                await _call(session, "execute_plan", plan="broke"))

    resolved, secret, again, broke = _serve(agent_project, body)
    assert resolved.structured_content["status"] == "awaiting_approval"
    assert _effects(agent_project)[0] == "echo 1"  # first ran (broke's first too, below)
    text = resolved.content[0].text
    assert "nothing has run" not in text
    assert "the steps before it ran (approve: resolved)" in text
    assert secret.structured_content["status"] == "awaiting_approval"
    text = secret.content[0].text
    assert "nothing has run" in text
    assert ("and params giving the secret parameter(s) 'token' again (a secret is never "
            "journaled)") in text
    assert "s3cr3t-value" not in text
    assert again.is_error is True
    error = again.structured_content["error"]
    assert error["code"] == "param_missing"
    assert "resume_run again with params" in error["hint"]
    assert "-p " not in error["hint"]
    assert broke.structured_content["status"] == "failed"
    assert "; step bad failed: [" in broke.content[0].text
    assert "Traceback" not in _server_err(agent_project)


def test_an_inline_plan_never_reads_the_servers_environment_values(agent_project: Path) -> None:
    # PLANRUN_PARAM_TOKEN of the server's environment (how an operator gives a secret
    # without a command line) was offered to an inline draft too: one that declared
    # `token` without `secret: true` got its value back in the substituted steps, and
    # one with a `pattern` of its own turned param_type into an oracle for it (found by
    # an attacker). A plan of the project still gets it.
    leak = textwrap.dedent("""
        planrun: 1
        name: leak
        goal: Read the server's token
        params:
          token: {type: string}
        steps:
          - {id: a, tool: echo, arguments: {value: "token={params.token}"}}
    """)
    oracle = leak.replace("{type: string}", "{type: string, pattern: '^z'}")
    (agent_project / "plans" / "uses-env.yaml").write_text(leak.replace("name: leak",
                                                                         "name: uses-env"))

    async def body(session: ClientSession) -> Any:
        return [await _call(session, "validate_plan", text=leak),
                await _call(session, "validate_plan", text=oracle),
                await _call(session, "validate_plan", text=leak, params={"token": "mine"}),
                await _call(session, "validate_plan", plan="uses-env")]

    drafted, guessed, given, project = _serve(agent_project, body,
                                              env={"PLANRUN_PARAM_TOKEN": "hunter2-s3cret"})
    for result in (drafted, guessed, given, project):
        assert result.is_error is False
    assert "hunter2" not in json.dumps([drafted.structured_content, guessed.structured_content,
                                        drafted.content[0].text, guessed.content[0].text])
    # without the environment's value the draft is checked as any plan without values
    assert drafted.structured_content["ok"] is True
    assert drafted.structured_content["plans"][0]["plan"]["steps"][0]["arguments"] == {
        "value": "token={params.token}"}
    assert guessed.structured_content["ok"] is True  # no value: no oracle
    assert given.structured_content["plans"][0]["plan"]["steps"][0]["arguments"] == {
        "value": "token=mine"}
    assert project.structured_content["plans"][0]["plan"]["steps"][0]["arguments"] == {
        "value": "token=hunter2-s3cret"}  # the operator's plan, the operator's values


def test_runs_queued_behind_a_long_run_leave_the_read_tools_answering(
        agent_project: Path) -> None:
    # The SDK runs a tool in one of 40 worker threads; each execute_plan waiting for its
    # run (queued behind a long one) held one, so 41 of them left list_runs without an
    # answer until the runs ended (found by an attacker). Each queued run still runs.
    import time

    waiting = 41

    async def body(session: ClientSession) -> Any:
        answered: list[Any] = []
        async with anyio.create_task_group() as tg:
            async def execute() -> None:
                answered.append(await _call(session, "execute_plan", plan="hold"))

            for _ in range(waiting):
                tg.start_soon(execute)
            while not (agent_project / "server.pid").exists():
                await anyio.sleep(0.05)
            await anyio.sleep(0.5)  # every call sent, one run holding
            start = time.monotonic()
            with anyio.fail_after(10):
                runs = await _call(session, "list_runs")
            took = time.monotonic() - start
            (agent_project / "go").write_text("")
        return runs, took, answered

    runs, took, answered = _serve(agent_project, body)
    assert runs.is_error is False
    assert [r["status"] for r in runs.structured_content["runs"]] == ["running"]
    assert took < 5, took
    assert sorted(r.structured_content["status"] for r in answered) == ["completed"] * waiting
    assert _effects(agent_project).count("hold") == waiting


def test_a_client_that_stops_reading_mid_run_ends_the_session_quietly(
        agent_project: Path) -> None:
    # The client closes its end of the server's stdout while a run goes on, and its
    # stdin only later: the answer to execute_plan met a closed pipe, and the server
    # ended with a BrokenPipeError traceback and exit status 1 (found by an attacker).
    # The run ends as it would have, journaled; the server exits 0 when stdin ends.
    import time

    with _raw_server(agent_project, "hold") as proc:
        assert proc.stdin is not None
        assert proc.stdout is not None
        assert proc.stderr is not None
        assert json.loads(proc.stdout.readline())["id"] == 1
        while not (agent_project / "server.pid").exists():
            time.sleep(0.05)
        proc.stdout.close()  # nobody reads the answers any more
        (agent_project / "go").write_text("")
        journal = agent_project.parent / "journal.sqlite3"
        for _ in range(200):
            done = json.loads(_cli(agent_project, "status", "last", "--json").stdout)
            if done["status"] != "running":
                break
            time.sleep(0.1)
        time.sleep(0.3)  # the answer written into the closed pipe
        proc.stdin.close()
        code = proc.wait(timeout=50)
        err = proc.stderr.read()
    assert code == 0, err
    assert "Traceback" not in err
    assert "BrokenPipeError" not in err
    assert done["status"] == "completed", done
    assert journal.exists()
    assert _effects(agent_project) == ["hold", "echo 2"]


def test_an_unknown_tool_or_prompt_is_one_clear_error_without_a_traceback(
        agent_project: Path) -> None:
    # An unknown tool was the SDK's bare text "Unknown tool: NAME", not a planrun error;
    # prompts/get (this server has no prompts) raised ValueError, whose traceback the SDK
    # logged on the server's stderr for a client's mistake (found by an attacker).
    from mcp.shared.exceptions import MCPError

    async def body(session: ClientSession) -> Any:
        unknown = await _call(session, "list_run")
        empty = await _call(session, "")
        try:
            await session.get_prompt("plan")
        except MCPError as exc:
            prompt: Any = exc
        else:
            prompt = None
        return unknown, empty, prompt, await _call(session, "list_runs")

    unknown, empty, prompt, after = _serve(agent_project, body)
    for result in (unknown, empty):
        assert result.is_error is True
        error = result.structured_content["error"]
        assert (error["code"], error["exit_status"]) == ("usage", 2)
        assert result.content[0].text.startswith("error[usage]: no tool ")
    assert "Did you mean 'list_runs'?" in unknown.content[0].text
    assert "list_tools" in empty.content[0].text
    assert isinstance(prompt, MCPError)
    assert prompt.error.code == -32602
    assert "no prompt 'plan'" in prompt.error.message
    assert after.is_error is False
    assert "Traceback" not in _server_err(agent_project)


def test_run_log_is_read_a_page_at_a_time(agent_project: Path) -> None:
    """A big run's log is not one answer: a 100,000-item fan-out's 200,000 events were a
    51 MB tool result. Pages of ``limit`` events after ``after``, linked by
    ``next_after``, add up to the whole log; a run that fits is one page as before."""
    (agent_project / "plans" / "many.yaml").write_text(
        "planrun: 1\nname: many\ngoal: Echo 30 items\nsteps:\n"
        "  - {id: each, tool: echo, for_each: [" + ", ".join(str(i) for i in range(30))
        + "], arguments: {value: '{item}'}}\n")
    done = _cli(agent_project, "execute", "many", "--json")
    assert done.returncode == 0, done.stderr
    run_id = json.loads(done.stdout)["run_id"]
    whole = _cli(agent_project, "log", run_id, "--json")
    every = [e["id"] for e in json.loads(whole.stdout)]
    assert len(every) > 60

    async def read(session: ClientSession) -> Any:
        pages, after = [], 0
        while after is not None and len(pages) < 20:
            page = await _call(session, "run_log", run=run_id, after=after, limit=25)
            pages.append(page)
            after = page.structured_content["next_after"]
        return pages, await _call(session, "run_log", run=run_id), \
            await _call(session, "run_log", run=run_id, limit=0)

    pages, one, zero = _serve(agent_project, read)
    ids = [e["id"] for p in pages for e in p.structured_content["events"]]
    assert ids == every
    assert [len(p.structured_content["events"]) for p in pages[:-1]] == [25] * (
        len(pages) - 1)
    assert f"run_log with after={pages[0].structured_content['next_after']}" in \
        pages[0].content[0].text
    assert one.structured_content["next_after"] is None  # all of it in one page
    assert [e["id"] for e in one.structured_content["events"]] == every
    assert zero.is_error is True  # limit at least 1
