"""Failure paths end in a journaled state, never a traceback (SPEC §5, issue 9 §3).

Through the real ``planrun`` process:

- a run-time check that fails when a step is dispatched again after a crash (a contract
  changed since, fan-out items included) fails that step with its code, never the journal;
- an unexpected error inside planrun (injected with the ``PLANRUN_TEST_INTERNAL`` test
  seam) ends the run ``failed`` with code ``internal``, its traceback only in
  ``planrun log --tracebacks``, exit 1 — never a run left ``running``;
- a closed or broken stdout/stderr never changes an outcome, for every command;
- nothing but the result reaches stdout, whatever a tool module prints when imported.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from harness import asset
from planrun_cli import PLANRUN, TIMEOUT_S, CliProject, Result

TOOLS = asset("registries/record.yaml")

#: ``b`` takes its label from ``a``'s output: checked only at run time.
CHAIN = """
planrun: 1
goal: A label handed on at run time
steps:
  - {id: a, tool: src, arguments: {label: hello}}
  - {id: b, tool: idem, depends_on: [a], arguments: {label: "{steps.a.output.args.label}"}}
  - {id: c, tool: once, depends_on: [b], arguments: {label: c}}
"""

FAN = """
planrun: 1
goal: Fan out over labels from a step
steps:
  - {id: a, tool: src, arguments: {value: [hello, world, again]}}
  - id: f
    tool: idem
    depends_on: [a]
    for_each: "{steps.a.output.args.value}"
    max_parallel: 1
    arguments: {label: "{item}"}
"""

GUARDED = """
planrun: 1
goal: An irreversible step after an ordinary one
steps:
  - {id: a, tool: once, arguments: {label: a}}
  - {id: z, tool: danger, depends_on: [a], arguments: {label: z}}
"""


@pytest.fixture
def proj(cli: CliProject) -> CliProject:
    cli.tools(TOOLS)
    cli.plan("chain", CHAIN)
    cli.plan("fan", FAN)
    cli.plan("guarded", GUARDED)
    return cli


def last_run(proj: CliProject) -> str:
    return proj.probe().run_ids()[0]


def run_status(proj: CliProject, run_id: str) -> str:
    status = proj.probe().run(run_id).status
    return str(status)


def manifest(proj: CliProject, run_id: str) -> dict[str, Any]:
    r = proj.run("status", run_id, "--json")
    assert r.returncode == 0, r
    return r.json  # type: ignore[no-any-return]


def step(m: dict[str, Any], sid: str) -> dict[str, Any]:
    return next(s for s in m["steps"] if s["id"] == sid)


def tighten(proj: CliProject, tool: str) -> None:
    """``tool``'s ``label`` may now have at most 3 characters."""
    text = (proj.root / "tools.yaml").read_text()
    head, _, tail = text.partition(f"  {tool}:\n")
    tail = tail.replace("label: {type: string}", "label: {type: string, maxLength: 3}", 1)
    (proj.root / "tools.yaml").write_text(f"{head}  {tool}:\n{tail}")


def no_traceback(r: Result) -> None:
    assert "Traceback" not in r.stderr, r
    assert "Traceback" not in r.stdout, r


# --- a check that fails when a step is dispatched again --------------------------------------


def test_a_contract_tightened_after_a_crash_fails_the_redispatched_step(
        proj: CliProject) -> None:
    r = proj.run("execute", "chain", "--json", crash="dispatch:b")
    assert r.returncode == -9, r
    run_id = last_run(proj)
    tighten(proj, "idem")  # the journaled run-time arguments ({label: hello}) no longer fit

    r = proj.run("resume", run_id, "--json")
    assert r.returncode == 1, r
    no_traceback(r)
    assert r.json["status"] == "failed"
    b = step(r.json, "b")
    assert b["status"] == "failed"
    assert b["error"]["code"] == "arguments"
    assert "too long" in b["error"]["message"]
    assert step(r.json, "c")["status"] == "skipped"
    assert run_status(proj, run_id) == "failed"
    assert proj.counts() == {"a": 1}  # b's re-dispatch never reached the tool
    # the run is finished: resuming again is refused like any failed run, retry is offered
    again = proj.run("resume", run_id)
    assert again.returncode == 5, again
    assert "error[run_not_resumable]" in again.stderr
    assert f"planrun retry {run_id}" in again.stderr
    assert proj.integrity() == "ok"


def test_the_same_check_fails_a_step_in_text_mode_too(proj: CliProject) -> None:
    proj.run("execute", "chain", crash="dispatch:b")
    tighten(proj, "idem")
    r = proj.run("resume")
    assert r.returncode == 1, r
    no_traceback(r)
    assert "error[journal]" not in r.stderr, r
    assert "[arguments]" in r.stdout, r


def test_fan_out_items_redispatched_after_a_contract_change_fail_with_their_code(
        proj: CliProject) -> None:
    r = proj.run("execute", "fan", "--json", crash="dispatch:f#1")
    assert r.returncode == -9, r
    run_id = last_run(proj)
    items = {i.index: i.status for i in proj.probe().items("f", run_id)}
    assert items == {0: "succeeded", 1: "running", 2: "pending"}
    tighten(proj, "idem")

    r = proj.run("resume", run_id, "--json")
    assert r.returncode == 1, r
    no_traceback(r)
    f = step(r.json, "f")
    assert f["status"] == "failed"
    assert f["error"]["code"] == "items_failed"
    items = proj.probe().items("f", run_id)
    assert items[0].status == "succeeded"
    assert items[1].status == "failed"  # was left running by the crash
    assert items[1].error is not None
    assert items[1].error["code"] == "arguments"
    assert proj.counts() == {"a": 1, "f#0": 1}
    assert run_status(proj, run_id) == "failed"


def test_keep_going_fan_out_fails_every_item_that_no_longer_fits(proj: CliProject) -> None:
    proj.plan("fan", FAN.replace("max_parallel: 1", "max_parallel: 1\n    on_item_error: "
                                 "continue"))
    proj.run("execute", "fan", crash="dispatch:f#1")
    run_id = last_run(proj)
    tighten(proj, "idem")
    r = proj.run("resume", run_id, "--json")
    assert r.returncode == 1, r
    statuses = [i.status for i in proj.probe().items("f", run_id)]
    assert statuses == ["succeeded", "failed", "failed"]  # the running one and the pending one


def test_journal_outcome_before_a_call_accepts_each_state_a_crash_can_leave(
        tmp_path: Path) -> None:
    """``step_finished`` guarded by several statuses: the journal-level half of the fix."""
    from planrun.errors import JournalError
    from planrun.executor import BEFORE_CALL
    from planrun.journal import Journal, now

    with Journal(tmp_path / "j.sqlite3", write=True) as journal:
        journal.create_run(run={"run_id": "r" * 16, "root_run_id": "r" * 16,
                                "plan_name": "p", "plan_json": "{}", "digest": "d",
                                "revision": 1, "params_json": "{}", "contracts_json": "{}",
                                "status": "running", "created_at": now()},
                           steps=[("p", 0, "t"), ("r", 1, "t"), ("i", 2, "t")])
        journal.step_started("r" * 16, "r", attempt=1, key="k1", root_run_id="r" * 16)
        journal.step_started("r" * 16, "i", attempt=1, key="k2", root_run_id="r" * 16)
        journal.mark_indeterminate("r" * 16, [("i", None)], "crashed")
        for sid in ("p", "r", "i"):
            journal.step_finished("r" * 16, sid, status="failed", key=None,
                                  error={"code": "arguments", "message": "no"},
                                  expect=BEFORE_CALL)
        with pytest.raises(JournalError, match="was not pending or running or indeterminate"):
            journal.step_finished("r" * 16, "p", status="failed", key=None,
                                  error={"code": "x", "message": "y"}, expect=BEFORE_CALL)
        assert {r["step_id"]: r["status"] for r in journal.step_rows("r" * 16)} == {
            "p": "failed", "r": "failed", "i": "failed"}


# --- an unexpected error inside planrun ----------------------------------------------------------

SEAM = "PLANRUN_TEST_INTERNAL"


def run_with_fault(proj: CliProject, fault: str, *args: str) -> Result:
    """``planrun ARGS`` with the internal-error test seam set to ``fault``."""
    os.environ[SEAM] = fault
    try:
        return proj.run(*args)
    finally:
        del os.environ[SEAM]


def tracebacks_only_in_log(proj: CliProject, run_id: str, needle: str) -> None:
    plain = proj.run("log", run_id)
    assert plain.returncode == 0, plain
    assert "Traceback" not in plain.stdout
    js = proj.run("log", run_id, "--json")
    assert "Traceback (most recent" not in js.stdout
    assert all("traceback" not in (e["data"] or {}) for e in js.json)
    full = proj.run("log", run_id, "--tracebacks")
    assert full.returncode == 0, full
    assert "Traceback (most recent call last)" in full.stdout, full
    assert needle in full.stdout


@pytest.mark.parametrize(("fault", "code", "b_status", "calls"), [
    ("prepare:b", "internal", "failed", {"a": 1}),
    ("dispatch:b", "internal", "indeterminate", {"a": 1}),
    ("call:b", "internal", "indeterminate", {"a": 1, "b": 1}),
])
def test_a_bug_while_handling_a_step_fails_that_step_and_the_run(
        proj: CliProject, fault: str, code: str, b_status: str,
        calls: dict[str, int]) -> None:
    r = run_with_fault(proj, fault, "execute", "chain", "--json")
    assert r.returncode == 1, r
    no_traceback(r)
    assert r.json["status"] == "failed"
    b = step(r.json, "b")
    assert (b["status"], b["error"]["code"]) == (b_status, code)
    assert "bug in planrun" in b["error"]["message"]
    assert f"planrun log {r.json['run_id']} --tracebacks" in b["error"]["message"]
    assert step(r.json, "c")["status"] == "skipped"
    assert run_status(proj, r.json["run_id"]) == "failed"
    assert proj.counts() == calls
    tracebacks_only_in_log(proj, r.json["run_id"], f"injected internal error at {fault}")


@pytest.mark.parametrize("fault", ["schedule", "finish", "approval"])
def test_a_bug_outside_any_step_ends_the_run_failed_with_code_internal(
        proj: CliProject, fault: str) -> None:
    r = run_with_fault(proj, fault, "execute", "guarded", "--json", "--approve", "z")
    assert r.returncode == 1, r
    no_traceback(r)
    run_id = r.json["run_id"]
    assert r.json["status"] == "failed"  # stdout: the manifest, as for any failed run
    assert "planrun: error[internal]:" in r.stderr
    assert f"planrun log {run_id} --tracebacks" in r.stderr
    assert run_status(proj, run_id) == "failed"
    assert not [s for s in proj.probe().steps(run_id) if s.status == "running"]
    assert proj.probe().lease(run_id) is None
    log = proj.run("log", run_id, "--json").json
    finished = [e for e in log if e["kind"] == "run_finished"]
    assert [e["data"]["status"] for e in finished] == ["failed"]
    assert finished[0]["data"]["error"]["code"] == "internal"
    tracebacks_only_in_log(proj, run_id, f"injected internal error at {fault}")
    assert proj.integrity() == "ok"
    text = run_with_fault(proj, fault, "execute", "guarded", "--approve", "z")
    assert text.returncode == 1, text
    no_traceback(text)
    assert "error[internal]" in text.stderr


def test_a_bug_in_a_fan_out_item_fails_that_item(proj: CliProject) -> None:
    r = run_with_fault(proj, "prepare:f#1", "execute", "fan", "--json")
    assert r.returncode == 1, r
    no_traceback(r)
    f = step(r.json, "f")
    assert f["status"] == "failed"
    assert f["error"]["code"] == "items_failed"
    items = proj.probe().items("f", r.json["run_id"])
    assert [(i.index, i.status) for i in items] == [
        (0, "succeeded"), (1, "failed"), (2, "pending")]
    assert items[1].error is not None
    assert items[1].error["code"] == "internal"
    assert run_status(proj, r.json["run_id"]) == "failed"


def test_a_bug_during_resume_ends_the_run_failed_not_running(proj: CliProject) -> None:
    r = proj.run("execute", "guarded", "--approve", "z", crash="outcome:a")
    assert r.returncode == -9, r
    run_id = last_run(proj)
    r = run_with_fault(proj, "prepare:z", "resume", run_id, "--json")
    assert r.returncode == 1, r
    no_traceback(r)
    assert step(r.json, "z")["error"]["code"] == "internal"
    assert run_status(proj, run_id) == "failed"
    assert proj.counts() == {"a": 1}


def test_a_bug_during_retry_ends_the_child_run_failed(proj: CliProject) -> None:
    first = run_with_fault(proj, "prepare:b", "execute", "chain", "--json")
    assert first.returncode == 1, first
    r = run_with_fault(proj, "schedule", "retry", first.json["run_id"], "--json")
    assert r.returncode == 1, r
    no_traceback(r)
    assert r.json["parent_run_id"] == first.json["run_id"]
    assert r.json["status"] == "failed"
    assert run_status(proj, r.json["run_id"]) == "failed"
    assert proj.probe().lease(first.json["run_id"]) is None  # the parent's is released too
    ok = proj.run("retry", r.json["run_id"], "--json")  # and the lineage goes on
    assert ok.returncode == 0, ok
    assert proj.counts() == {"a": 1, "b": 1, "c": 1}


# --- output errors never change an outcome ---------------------------------------------------


def _popen(proj: CliProject, args: tuple[str, ...], stdout: Any, stderr: Any
           ) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*PLANRUN, *args], cwd=proj.root, env=proj.env(),
                          stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                          timeout=TIMEOUT_S, check=False, start_new_session=True)


def closed_fd(fd: int) -> Any:
    """A ``preexec_fn`` that closes ``fd`` in the child (``2>&-`` / ``>&-``)."""
    def close() -> None:
        os.close(fd)
    return close


def run_with_streams(proj: CliProject, how: str, *args: str) -> int:
    """Exit status of ``planrun ARGS`` with one stream closed or a broken pipe.

    ``how``: ``closed-stdout`` | ``closed-stderr`` | ``broken-stdout`` | ``broken-stderr``
    | ``both-broken``.
    """
    argv = [*PLANRUN, *args]
    if how.startswith("closed"):
        fd = 1 if how.endswith("stdout") else 2
        proc = subprocess.run(argv, cwd=proj.root, env=proj.env(), stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=TIMEOUT_S, check=False, start_new_session=True,
                              preexec_fn=closed_fd(fd))
        return proc.returncode
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has exited
    try:
        out = write_end if how in ("broken-stdout", "both-broken") else subprocess.DEVNULL
        err = write_end if how in ("broken-stderr", "both-broken") else subprocess.DEVNULL
        return _popen(proj, tuple(args), out, err).returncode
    finally:
        os.close(write_end)


HOWS = ["closed-stdout", "closed-stderr", "broken-stdout", "broken-stderr", "both-broken"]


@pytest.mark.parametrize("how", HOWS)
def test_a_completed_run_exits_0_whatever_happens_to_its_output(proj: CliProject,
                                                                how: str) -> None:
    code = run_with_streams(proj, how, "execute", "chain", "--json")
    assert code == 0, how
    run_id = last_run(proj)
    assert run_status(proj, run_id) == "completed"
    assert proj.counts() == {"a": 1, "b": 1, "c": 1}


@pytest.mark.parametrize("how", HOWS)
def test_a_failed_run_exits_1_whatever_happens_to_its_output(proj: CliProject,
                                                             how: str) -> None:
    proj.run("execute", "chain", crash="dispatch:b")
    tighten(proj, "idem")
    assert run_with_streams(proj, how, "resume", "--json") == 1
    assert run_status(proj, last_run(proj)) == "failed"


@pytest.mark.parametrize("how", HOWS)
def test_approval_required_stays_exit_4(proj: CliProject, how: str) -> None:
    assert run_with_streams(proj, how, "execute", "guarded") == 4
    assert run_status(proj, last_run(proj)) == "denied"
    assert proj.counts() == {}


@pytest.mark.parametrize("how", HOWS[:4])
@pytest.mark.parametrize(("args", "expected"), [
    (("status", "zzzz"), 5),
    (("status", "zzzz", "--json"), 5),
    (("runs", "--json"), 0),
    (("validate", "--format", "json"), 0),
    (("validate", "nope"), 3),
    (("tools", "--json"), 0),
    (("show", "chain"), 0),
    (("graph", "chain"), 0),
    (("execute", "chain", "--dry-run"), 0),
    (("resume",), 5),
    (("execute", "--bogus"), 2),
    (("--version",), 0),
    (("--help",), 0),
    (("policy", "check"), 0),
])
def test_every_command_keeps_its_exit_status(proj: CliProject, how: str,
                                             args: tuple[str, ...], expected: int) -> None:
    assert run_with_streams(proj, how, *args) == expected


@pytest.mark.parametrize("how", ["broken-stdout", "both-broken", "closed-stdout"])
def test_read_commands_of_a_finished_run_exit_0(proj: CliProject, how: str) -> None:
    done = proj.run("execute", "chain", "--json")
    assert done.returncode == 0, done
    run_id = done.json["run_id"]
    for args in (("status", run_id), ("log", run_id, "--tracebacks"),
                 ("output", run_id, "a"), ("resume", run_id, "--explain")):
        expected = 5 if args[0] == "resume" else 0
        assert run_with_streams(proj, how, *args) == expected, args


def test_a_tool_module_that_restores_default_sigpipe_cannot_kill_planrun(
        proj: CliProject) -> None:
    """A module that sets SIGPIPE to its default when imported (a common CLI idiom)."""
    proj.write("piper.py", """
        import signal

        signal.signal(signal.SIGPIPE, signal.SIG_DFL)

        def run(**kwargs):
            return kwargs
    """)
    proj.tools(TOOLS + """
  piper:
    python: piper:run
    arguments: {type: object}
""")
    proj.plan("pipe", """
        planrun: 1
        goal: A step whose module changes SIGPIPE
        steps:
          - {id: p, tool: piper, arguments: {x: 1}}
    """)
    for how in ("broken-stdout", "broken-stderr", "both-broken"):
        assert run_with_streams(proj, how, "execute", "pipe", "--json") == 0, how
        assert run_status(proj, last_run(proj)) == "completed"
        assert run_with_streams(proj, how, "validate", "--format", "json") == 0, how


def test_stdout_closed_while_a_run_is_under_way(proj: CliProject) -> None:
    """The reader goes away mid-run (``planrun execute … | head -c1``)."""
    proj.tools(TOOLS + """
  wait:
    python: crashtools:wait
    idempotent: true
    arguments:
      type: object
      properties: {file: {type: string}}
      required: [file]
""")
    proj.plan("slow", """
        planrun: 1
        goal: Wait for a file
        steps:
          - {id: w, tool: wait, arguments: {file: go}}
          - {id: a, tool: once, depends_on: [w], arguments: {label: after}}
    """)
    proc = subprocess.Popen([*PLANRUN, "execute", "slow", "-v"], cwd=proj.root,
                            env=proj.env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    proj.procs.append(proc)
    proj.wait_started("w", proc)
    assert proc.stdout is not None
    assert proc.stderr is not None
    proc.stdout.close()
    proc.stderr.close()  # both readers exit while the call runs
    proj.touch("go")
    assert proc.wait(timeout=TIMEOUT_S) == 0
    assert run_status(proj, last_run(proj)) == "completed"
    assert proj.counts() == {"w": 1, "a": 1}


# --- nothing but results on stdout -----------------------------------------------------------

NOISY = '''
import os
import subprocess
import sys

print("noise from print at import")
sys.stdout.write("noise from sys.stdout at import\\n")
sys.stdout.flush()
os.write(1, b"noise from fd 1 at import\\n")
subprocess.run(["echo", "noise from a child at import"], check=False)


def run(**kwargs):
    print("noise from print in the call")
    os.write(1, b"noise from fd 1 in the call\\n")
    return kwargs
'''


@pytest.fixture
def noisy(proj: CliProject) -> CliProject:
    proj.write("noisy.py", NOISY)
    proj.tools(TOOLS + """
  noisy:
    python: noisy:run
    arguments: {type: object}
""")
    proj.plan("noise", """
        planrun: 1
        goal: A step whose module prints
        steps:
          - {id: n, tool: noisy, arguments: {x: 1}}
    """)
    return proj


@pytest.mark.parametrize("args", [
    ("validate", "--format", "json"),
    ("validate", "noise", "--format", "json"),
    ("validate", "noise", "--format", "github"),
    ("execute", "noise", "--json"),
    ("execute", "noise", "--dry-run", "--json"),
    ("tools", "--json"),
    ("show", "noise", "--json"),
    ("schema", "tools"),
])
def test_a_tool_module_that_prints_at_import_never_reaches_stdout(
        noisy: CliProject, args: tuple[str, ...]) -> None:
    r = noisy.run(*args)
    assert r.returncode == 0, r
    assert "noise from" not in r.stdout, r
    if "github" not in args:
        json.loads(r.stdout)
    if args[0] in ("validate", "execute", "tools", "show"):
        assert "noise from print at import" in r.stderr  # not lost: it is diagnostics


def test_resume_and_retry_stdout_stay_json_with_a_noisy_module(noisy: CliProject) -> None:
    r = noisy.run("execute", "noise", "--json", crash="dispatch:n")
    assert r.returncode == -9, r
    resumed = noisy.run("resume", "--json")
    assert resumed.returncode == 5, resumed  # not idempotent: indeterminate, settle it
    assert "noise from" not in resumed.stdout
    assert resumed.json["error"]["code"] == "indeterminate"
    run_id = last_run(noisy)
    settled = noisy.run("resolve", run_id, "n", "--failed", "--json")
    assert settled.returncode == 0, settled
    assert "noise from" not in settled.stdout
    ended = noisy.run("resume", run_id, "--json")
    assert ended.returncode == 1, ended
    assert ended.json["status"] == "failed"
    retried = noisy.run("retry", run_id, "--json")
    assert retried.returncode == 0, retried
    assert retried.json["status"] == "completed"
    assert "noise from" not in retried.stdout


def test_a_pydantic_contract_that_prints_reaches_stderr_only(proj: CliProject) -> None:
    proj.write("chatty.py", '''
        from pydantic import BaseModel, field_validator

        print("noise from the model module")


        class Args(BaseModel):
            name: str

            @field_validator("name")
            @classmethod
            def loud(cls, v: str) -> str:
                print("noise from a validator")
                return v

            @classmethod
            def model_json_schema(cls, *args, **kwargs):
                print("noise from the schema")
                return super().model_json_schema(*args, **kwargs)


        def run(name: str) -> dict:
            return {"name": name}
    ''')
    proj.tools(TOOLS + """
  chatty:
    python: chatty:run
    accepts: chatty:Args
""")
    proj.plan("chat", """
        planrun: 1
        goal: A model that prints
        steps:
          - {id: c, tool: chatty, arguments: {name: x}}
    """)
    for args in (("validate", "chat", "--format", "json"), ("execute", "chat", "--json")):
        r = proj.run(*args)
        assert r.returncode == 0, r
        assert "noise from" not in r.stdout, r
        json.loads(r.stdout)


def test_a_tool_module_that_exits_at_import_is_a_registry_error(proj: CliProject) -> None:
    proj.write("quitter.py", "import sys\nsys.exit(0)\n")
    proj.tools(TOOLS + """
  quitter:
    python: quitter:run
    arguments: {type: object}
""")
    r = proj.run("validate", "--format", "json")
    assert r.returncode == 3, r
    assert [i["code"] for i in r.json["issues"]] == ["registry"]
    assert "SystemExit" in r.json["issues"][0]["message"]


def test_a_closed_stdin_is_not_a_terminal_and_asks_nobody(proj: CliProject) -> None:
    proc = subprocess.run([*PLANRUN, "execute", "guarded", "--json"], cwd=proj.root,
                          env=proj.env(), capture_output=True, timeout=TIMEOUT_S,
                          check=False, start_new_session=True, preexec_fn=closed_fd(0))
    assert proc.returncode == 4, proc
    assert json.loads(proc.stdout)["error"]["code"] == "approval_required"


def test_an_async_tool_that_restores_default_sigpipe_during_its_call(
        proj: CliProject) -> None:
    """An ``async def`` tool runs on the main thread: it can change SIGPIPE mid-run."""
    proj.write("apiper.py", """
        import signal

        async def run(**kwargs):
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
            return kwargs
    """)
    proj.tools(TOOLS + """
  apiper:
    python: apiper:run
    arguments: {type: object}
""")
    proj.plan("apipe", """
        planrun: 1
        goal: A step that changes SIGPIPE while it runs
        steps:
          - {id: p, tool: apiper, arguments: {x: 1}}
          - {id: q, tool: apiper, depends_on: [p], arguments: {x: 2}}
    """)
    for how in ("broken-stdout", "broken-stderr", "both-broken"):
        assert run_with_streams(proj, how, "execute", "apipe", "--json", "-v") == 0, how
        assert run_status(proj, last_run(proj)) == "completed"


def test_a_bug_in_the_scheduler_cuts_running_calls_short_as_internal(
        proj: CliProject) -> None:
    """Calls under way when the scheduler fails are journaled indeterminate (internal)."""
    proj.write("waiter.py", """
        import json
        import os
        import time

        def until_started(effect):
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                path = os.environ["CRASH_EFFECTS"]
                if os.path.exists(path):
                    for line in open(path):
                        entry = json.loads(line)
                        if entry["event"] == "start" and entry["effect"] == effect:
                            return {"seen": effect}
                time.sleep(0.02)
            raise TimeoutError(effect)
    """)
    proj.tools(TOOLS + """
  until_started:
    python: waiter:until_started
    arguments: {type: object, properties: {effect: {type: string}}}
  sleeper:
    command: [{PY}, crashtools.py, sleep, "60"]
    output: json
    arguments: {type: object}
""")
    proj.plan("busy", """
        planrun: 1
        goal: A long call under way when the scheduler fails
        steps:
          - {id: w, tool: sleeper}
          - {id: a, tool: until_started, arguments: {effect: w}}
          - {id: b, tool: once, depends_on: [a], arguments: {label: b}}
    """)
    r = run_with_fault(proj, "schedule:b", "execute", "busy", "--json")
    assert r.returncode == 1, r
    no_traceback(r)
    assert "error[internal]" in r.stderr
    steps = {s["id"]: s for s in r.json["steps"]}
    assert steps["w"]["status"] == "indeterminate"
    assert steps["w"]["error"]["code"] == "internal"
    assert steps["a"]["status"] == "succeeded"
    assert steps["b"]["status"] == "pending"
    assert run_status(proj, r.json["run_id"]) == "failed"
    assert proj.counts() == {}  # the sleeper was killed before it could record its effect


@pytest.mark.parametrize(("when", "code"), [(None, "reference"),
                                             ('steps.a.output.args.label == "hello"',
                                              "condition")])
@pytest.mark.sqlite
def test_a_reference_that_no_longer_resolves_on_redispatch_fails_the_step(
        proj: CliProject, when: str | None, code: str) -> None:
    """The journal is the truth: ``b`` left running reads an output that lacks the path.

    (Written into the journal by hand here, as an older planrun or a person's
    ``resolve --succeeded --output`` could leave it.)
    """
    import sqlite3
    from contextlib import closing

    if when is not None:
        proj.plan("chain", CHAIN.replace("depends_on: [a], arguments",
                                         f"depends_on: [a], when: '{when}', arguments"))
    r = proj.run("execute", "chain", "--json", crash="dispatch:b")
    assert r.returncode == -9, r
    run_id = last_run(proj)
    with closing(sqlite3.connect(proj.journal)) as conn, conn:
        conn.execute("UPDATE steps SET output_json = '{}' WHERE run_id = ? AND step_id = 'a'",
                     (run_id,))
    r = proj.run("resume", run_id, "--json")
    assert r.returncode == 1, r
    no_traceback(r)
    b = step(r.json, "b")
    assert (b["status"], b["error"]["code"]) == ("failed", code)
    assert run_status(proj, run_id) == "failed"


@pytest.mark.sqlite
def test_a_command_printing_json_too_deep_to_read_fails_its_step_not_indeterminate(
        proj: CliProject) -> None:
    """``[`` x 100,000 on stdout was a RecursionError in planrun (a bug: ``internal``,
    the step indeterminate) although the call had ended (found by an attacker)."""
    proj.tools(TOOLS + """
  deep:
    command: [{PY}, -c, "print('[' * 100000 + ']' * 100000)"]
    output: json
    arguments: {type: object}
""")
    proj.plan("deep", """
        planrun: 1
        goal: An output too deep to read
        steps:
          - {id: d, tool: deep}
    """)
    r = proj.run("execute", "deep", "--json")
    assert r.returncode == 1, r
    no_traceback(r)
    (step,) = r.json["steps"]
    assert step["status"] == "failed", step
    assert step["error"]["code"] == "output", step
    assert "nested too deeply" in step["error"]["message"], step


@pytest.mark.sqlite
def test_a_fan_out_with_an_item_of_unknown_effect_is_retried_once_the_item_is_settled(
        proj: CliProject) -> None:
    """A non-idempotent item cut short by its timeout: its step stayed indeterminate
    after ``resolve --item N``, retry refused it for ever, and ``next`` lacked the
    ``--item N`` it needs (found by an attacker)."""
    proj.tools(TOOLS + """
  nap:
    command: [{PY}, crashtools.py, sleep, "{s}"]
    timeout: 5
    arguments: {type: object, properties: {s: {type: string}}, required: [s]}
""")
    proj.plan("naps", """
        planrun: 1
        goal: Three naps, one too long
        steps:
          - {id: each, tool: nap, for_each: ["0", "60", "0"], arguments: {s: "{item}"}}
    """)
    r = proj.run("execute", "naps", "--json")
    assert r.returncode == 1, r
    run_id = r.json["run_id"]
    # Each item of unknown effect is named with its --item (the halted siblings of the
    # one that timed out were cut short too); once all are settled, retry.
    nxt, settled = r.json["next"], []
    while nxt.startswith(f"planrun resolve {run_id} each --item "):
        item = nxt.split("--item ")[1].split()[0]
        assert nxt == f"planrun resolve {run_id} each --item {item}", nxt  # no choice made
        settle = proj.run("resolve", run_id, "each", "--item", item, "--failed")
        assert settle.returncode == 0, settle
        settled.append(item)
        nxt = proj.run("status", run_id, "--json").json["next"]
    assert "1" in settled, settled  # the one that timed out
    assert nxt == f"planrun retry {run_id}", nxt
    proj.tools(TOOLS + """
  nap:
    command: [{PY}, crashtools.py, sleep, "0"]
    timeout: 5
    arguments: {type: object, properties: {s: {type: string}}, required: [s]}
""")
    again = proj.run("retry", run_id, "--json")
    assert again.returncode == 0, again
    (step,) = again.json["steps"]
    assert step["status"] == "succeeded", step
