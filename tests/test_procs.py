"""No call outlives planrun unnoticed; no lease lost mid-call (SPEC §12, §7 "Leases", §5).

Real ``planrun`` processes, killed with SIGKILL **alone** (``os.kill(pid)``, never the
process group), while a command tool runs; every effect is counted in the effects log
(``tests/crashtools.py``). Command tools here also hold a lock while they run and log an
``overlap`` line when another live copy of the same call holds it, so "two copies at
once" is seen even when it does not duplicate an effect.

- a command and everything in its group die with planrun (the keeper process);
- while a call of a dead planrun still runs (its keeper killed too), ``resume``,
  ``resolve`` and ``retry`` refuse with ``run_busy`` (the journaled process group);
- following the printed advice after a kill never writes a non-idempotent effect twice;
- an ``async def`` tool that blocks the event loop does not stop the lease heartbeat; a
  lease that is lost anyway ends the process cleanly (exit 5, no traceback);
- every dispatch counts in ``attempts`` / ``PLANRUN_ATTEMPT``, and a tool that kills
  planrun is re-dispatched at most ``max_recoveries`` times (``recovery_exhausted``).
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from planrun import procs
from planrun.errors import JournalError
from planrun_cli import CliProject, Result, resolve_targets, wait_dead

TOOLS = """
tools:
  idem_cmd:
    description: An idempotent command effect (done once per idempotency key)
    command: [{PY}, crashtools.py, wait, "{file}", "{after}", --once-per-key]
    output: json
    idempotent: true
    arguments:
      type: object
      properties:
        file: {type: string}
        after: {type: string}
      required: [file, after]
      additionalProperties: false
  once_cmd:
    description: A command effect that must not happen twice
    command: [{PY}, crashtools.py, wait, "{file}", "{after}"]
    output: json
    arguments:
      type: object
      properties:
        file: {type: string}
        after: {type: string}
      required: [file, after]
      additionalProperties: false
  once_tree:
    description: A command whose effect is done by a child process in its group
    command: [{PY}, crashtools.py, spawn, "{file}", "{after}"]
    output: json
    arguments:
      type: object
      properties:
        file: {type: string}
        after: {type: string}
      required: [file, after]
      additionalProperties: false
  fails:
    description: A command that fails until a file exists
    command: [{PY}, -c, "import os, sys; sys.exit(0 if os.path.exists('fixed') else 3)"]
    output: none
    arguments: {type: object, additionalProperties: false}
  blocker:
    description: An async python tool that blocks the event loop until a file exists
    python: crashtools:block
    idempotent: true
    arguments:
      type: object
      properties:
        file: {type: string}
      required: [file]
      additionalProperties: false
  killer_cmd:
    description: A command that SIGKILLs planrun after its effect
    command: [{PY}, crashtools.py, kill-parent]
    output: none
    idempotent: true
    arguments: {type: object, additionalProperties: false}
  killer_py:
    description: A python tool that SIGKILLs the planrun it runs in after its effect
    python: crashtools:kill_planrun
    idempotent: true
    arguments: {type: object, additionalProperties: false}
  record:
    description: A python effect
    python: crashtools:record
    idempotent: true
    arguments: {type: object, additionalProperties: false}
"""

#: How long a test lets a short lease (the ``PLANRUN_TEST_LEASE_TTL_S`` seam) run out.
SHORT_TTL_S = 2.0


@pytest.fixture
def proj(cli: CliProject) -> CliProject:
    cli.tools(TOOLS)
    return cli


# --- helpers ---------------------------------------------------------------------------------


def run_id_of(proj: CliProject) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proj.journal.exists():
            try:
                rows = proj.probe().run_ids()
            except JournalError:
                rows = []
            if rows:
                return str(rows[0])
        time.sleep(0.05)
    raise AssertionError("no run was journaled")


def children_of(pid: int) -> list[int]:
    """Live processes whose parent is ``pid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(entry.name))
    return out


def keeper_of(pid: int) -> int:
    """The keeper process of planrun ``pid`` (its child running ``python -I -S …``).

    Its command line is short: the keeper's file, not its source (``ps`` was a wall of
    text, one copy of the source a planrun; found by an operator).
    """
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for child in children_of(pid):
            try:
                argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"-S" in argv and any(a.endswith(b"_watchdog.py") for a in argv):
                assert b"-c" not in argv
                assert sum(map(len, argv)) < 1000, argv
                return child
        time.sleep(0.02)
    raise AssertionError(f"planrun {pid} started no keeper")


def kill_alone(proc: subprocess.Popen[bytes] | int) -> None:
    """SIGKILL one process — not its group — and wait until it is gone (reaped if ours)."""
    pid = proc if isinstance(proc, int) else proc.pid
    os.kill(pid, signal.SIGKILL)
    if isinstance(proc, int):
        assert wait_dead(pid), f"{pid} survived SIGKILL"
    else:
        proc.wait(timeout=30)


def pids_of(proj: CliProject, effect: str, event: str = "start") -> list[int]:
    return [e["pid"] for e in proj.entries() if e["event"] == event and e["effect"] == effect]


def overlaps(proj: CliProject) -> list[dict[str, Any]]:
    return [e for e in proj.entries() if e["event"] == "overlap"]


def alive(pid: int) -> bool:
    return not wait_dead(pid, timeout=0)


def no_traceback(r: Result) -> None:
    text = r.stdout + r.stderr
    assert "Traceback" not in text, r
    assert "never retrieved" not in text, r


def plan_one(proj: CliProject, tool: str, *, name: str = "one", extra: str = "") -> None:
    proj.plan(name, f"""
        planrun: 1
        goal: One command call that waits for a file
        steps:
          - id: s
            tool: {tool}
            arguments: {{file: go, after: "after"}}{extra}
          - {{id: t, tool: record, depends_on: [s]}}
    """)


# --- children die with planrun ------------------------------------------------------------


@pytest.mark.parametrize("tool", ["once_cmd", "once_tree"])
def test_a_command_and_its_group_die_when_planrun_is_killed_alone(
        proj: CliProject, tool: str) -> None:
    plan_one(proj, tool)
    p = proj.start("execute", "one", "--json")
    proj.wait_started("s", p)
    leader = next(e["pid"] for e in proj.entries() if e["effect"] == "s")
    worker = pids_of(proj, "s")[0]  # the leader itself, or its child (once_tree)
    kill_alone(p)
    assert wait_dead(leader), "the command outlived planrun"
    assert wait_dead(worker), "a process in the command's group outlived planrun"
    proj.touch("go")
    proj.touch("after")
    assert proj.counts() == {}, proj.entries()


def test_the_keeper_ends_with_a_clean_run(proj: CliProject) -> None:
    plan_one(proj, "once_cmd")
    proj.touch("go")
    proj.touch("after")
    p = proj.start("execute", "one", "--json")
    r = proj.finish(p)
    assert r.returncode == 0, r
    assert proj.counts() == {"s": 1, "t": 1}
    assert proj.probe().calls() == []
    assert children_of(p.pid) == []


def test_a_journaled_group_is_forgotten_when_its_call_ends(proj: CliProject) -> None:
    plan_one(proj, "once_tree")
    p = proj.start("execute", "one", "--json")
    proj.wait_started("s", p)
    ((pgid, host, step),) = [(c["pgid"], c["host"], c["step"]) for c in proj.probe().calls()]
    assert (host, step) == (socket.gethostname(), "s")
    assert pgid == next(e["pid"] for e in proj.entries() if e["event"] == "leader")
    proj.touch("go")
    proj.touch("after")
    assert proj.finish(p).returncode == 0
    assert proj.probe().calls() == []


# --- resume finds what is still running ------------------------------------------------------


def orphan(proj: CliProject, tool: str = "once_cmd", plan: str = "one",
           args: tuple[str, ...] = ("execute", "one", "--json")) -> tuple[str, int]:
    """Kill planrun and its keeper (SIGKILL, one by one) while a command call runs.

    Returns (run id, the surviving call's process group).
    """
    p = proj.start(*args)
    effect = "s" if plan == "one" else "w"
    proj.wait_started(effect, p)
    keeper = keeper_of(p.pid)
    kill_alone(keeper)
    kill_alone(p)
    (pgid,) = [c["pgid"] for c in proj.probe().calls()]
    assert alive(pgid), "the call should have outlived planrun (its keeper was killed)"
    return run_id_of(proj), pgid


def end_group(pgid: int) -> None:
    os.killpg(pgid, signal.SIGKILL)
    assert wait_dead(pgid)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and procs.group_alive(procs.Group(
            pgid, socket.gethostname(), procs.boot_id(), None)):
        time.sleep(0.02)


@pytest.mark.parametrize("tool", ["once_cmd", "once_tree", "idem_cmd"])
def test_resume_and_resolve_refuse_while_an_orphaned_call_runs(
        proj: CliProject, tool: str) -> None:
    plan_one(proj, tool)
    run_id, pgid = orphan(proj, tool)
    for args in (("resume", run_id, "--json"), ("resume", "--json"),
                 ("resolve", run_id, "s", "--failed", "--json")):
        r = proj.run(*args)
        assert r.returncode == 5, r
        assert r.error_code == "run_busy", r
        assert f"process group {pgid}" in r.stderr, r
        assert f"kill -TERM -{pgid}" in r.stderr, r
        no_traceback(r)
    ex = proj.run("resume", "--explain", "--json", run_id)
    assert ex.returncode == 0, ex
    assert [(c["step"], c["pgid"], c["alive"]) for c in ex.json["calls"]] == [
        ("s", pgid, True)]
    assert ex.json["would_stop"] is True
    text = proj.run("resume", "--explain", run_id)
    assert f"call of s: process group {pgid} on {socket.gethostname()} (still running)" in \
        text.stdout, text
    u = proj.run("unlock", run_id, "--json")
    assert u.error_code == "run_busy", u
    # Nothing was dispatched again; the orphan alone may do the effect, once.
    assert [e["event"] for e in proj.entries()] == ["leader", "start"][
        (0 if tool == "once_tree" else 1):]
    proj.touch("go")
    proj.touch("after")
    assert wait_dead(pgid)
    end_group(pgid)  # its members too
    assert proj.counts() == {"s": 1}
    # Once it ended, resume goes on: the orphan's effect is in the log.
    r = proj.run("resume", run_id, "--json")
    if tool == "idem_cmd":
        assert r.returncode == 0, r
    else:
        assert r.error_code == "indeterminate", r
        r = proj.run("resolve", run_id, "s", "--succeeded", "--output",
                     '{"effect": "s", "args": {"file": "go"}}')
        assert r.returncode == 0, r
        r = proj.run("resume", run_id, "--json")
        assert r.returncode == 0, r
    assert r.json["status"] == "completed"
    assert proj.counts() == {"s": 1, "t": 1}
    assert overlaps(proj) == []
    assert proj.probe().calls() == []


def test_forget_refuses_while_an_orphaned_call_runs_and_takes_its_record_with_it(
        proj: CliProject) -> None:
    """``forget`` deleted a run whose call its dead planrun left running, and every run's
    ``call_groups`` rows stayed in the journal after it was deleted (found by an
    attacker)."""
    plan_one(proj, "once_cmd")
    run_id, pgid = orphan(proj)
    r = proj.run("forget", run_id, "--json")
    assert r.returncode == 5, r
    assert r.error_code == "run_busy", r
    assert f"process group {pgid}" in r.stderr, r
    assert "deleting the run now would lose the record of a call" in r.stderr, r
    assert proj.probe().run_ids() == [run_id]  # nothing deleted
    proj.touch("go")
    proj.touch("after")
    end_group(pgid)
    gone = proj.run("forget", run_id, "--json")
    assert gone.returncode == 0, gone
    assert proj.probe().run_ids() == []
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(proj.journal)) as db:
        assert db.execute("SELECT count(*) FROM call_groups").fetchone()[0] == 0


def test_retry_refuses_while_a_call_of_an_earlier_retry_runs(proj: CliProject) -> None:
    proj.plan("two", """
        planrun: 1
        goal: A failing step, then a waiting one
        steps:
          - {id: f, tool: fails}
          - {id: w, tool: once_cmd, depends_on: [f], arguments: {file: go, after: after}}
    """)
    r = proj.run("execute", "two", "--json")
    assert r.returncode == 1, r
    parent = r.json["run_id"]
    proj.touch("fixed")
    child, pgid = orphan(proj, plan="two", args=("retry", parent, "--json"))
    assert child != parent
    r = proj.run("retry", parent, "--json")
    assert r.error_code == "run_busy", r
    assert f"process group {pgid}" in r.stderr
    r = proj.run("resume", child, "--json")
    assert r.error_code == "run_busy", r
    end_group(pgid)
    r = proj.run("resume", child, "--json")
    assert r.error_code == "indeterminate", r  # killed before its effect, not idempotent
    assert proj.counts() == {}


def test_a_dead_orphan_is_forgotten(proj: CliProject) -> None:
    plan_one(proj, "idem_cmd")
    run_id, pgid = orphan(proj, "idem_cmd")
    end_group(pgid)
    proj.touch("go")
    proj.touch("after")
    r = proj.run("resume", run_id, "--json")
    assert r.returncode == 0, r
    assert proj.counts() == {"s": 1, "t": 1}
    assert proj.probe().calls() == []


@pytest.mark.sqlite
def test_a_call_recorded_on_another_host_needs_unlock(proj: CliProject) -> None:
    plan_one(proj, "idem_cmd")
    run_id, pgid = orphan(proj, "idem_cmd")
    end_group(pgid)
    with closing(sqlite3.connect(proj.journal)) as conn:
        conn.execute("UPDATE call_groups SET host = 'elsewhere.invalid'")
        conn.commit()
    r = proj.run("resume", run_id, "--json")
    assert r.error_code == "run_busy", r
    assert "elsewhere.invalid" in r.stderr
    assert f"planrun unlock {run_id}" in r.stderr
    u = proj.run("unlock", run_id)
    assert u.returncode == 0, u
    proj.touch("go")
    proj.touch("after")
    r = proj.run("resume", run_id, "--json")
    assert r.returncode == 0, r
    assert proj.counts() == {"s": 1, "t": 1}


# --- group_alive: process groups and pid reuse -------------------------------------------------


def test_group_alive_tells_a_recorded_group_from_a_later_one() -> None:
    here, boot = socket.gethostname(), procs.boot_id()
    leader = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              process_group=0)
    try:
        group = procs.identify(leader.pid)
        assert group.start_ticks is not None
        assert procs.group_alive(group) is True
        # the same number with another start time: that pid was given to a new process
        assert procs.group_alive(procs.Group(leader.pid, here, boot,
                                             group.start_ticks - 1)) is False
        # another boot: nothing of it runs; another host: cannot be told from here
        assert procs.group_alive(procs.Group(leader.pid, here, "another-boot",
                                             group.start_ticks)) is False
        assert procs.group_alive(procs.Group(leader.pid, "elsewhere.invalid", boot,
                                             group.start_ticks)) is None
        # another boot, journaled before this machine booted: its earlier boot, dead; one
        # journaled since: another machine with this host name, which cannot be told
        booted = procs.booted_at()
        assert booted is not None
        assert procs.group_alive(procs.Group(leader.pid, here, "another-boot",
                                             group.start_ticks, booted - 60)) is False
        assert procs.group_alive(procs.Group(leader.pid, here, "another-boot",
                                             group.start_ticks, time.time() - 1)) is None
    finally:
        leader.kill()
        leader.wait()
    assert procs.group_alive(group) is False


def test_group_alive_sees_members_after_their_leader_exited(tmp_path: Path) -> None:
    code = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(60)']); print(p.pid, flush=True)")
    leader = subprocess.Popen([sys.executable, "-c", code], process_group=0,
                              stdout=subprocess.PIPE, text=True)
    group = procs.identify(leader.pid)
    assert leader.stdout is not None
    member = int(leader.stdout.readline())
    leader.wait()
    try:
        assert procs.group_alive(group) is True  # no leader, a member still runs
    finally:
        os.kill(member, signal.SIGKILL)
    assert wait_dead(member)
    deadline = time.monotonic() + 10
    while procs.group_alive(group) and time.monotonic() < deadline:
        time.sleep(0.02)  # until its new parent reaped it
    assert procs.group_alive(group) is False


# --- the printed advice never writes an effect twice --------------------------------------------


@pytest.mark.parametrize("tool", ["once_cmd", "once_tree"])
def test_following_the_advice_after_a_kill_writes_a_non_idempotent_effect_once(
        proj: CliProject, tool: str) -> None:
    """The issue's example: kill planrun alone during a non-idempotent command call.

    The call is released right after the kill: a copy that outlived planrun would now do
    its effect. The operator follows the printed advice (the call logged no effect, so
    ``resolve --failed``; ``resume``; ``retry``): the effect happens exactly once.
    """
    plan_one(proj, tool)
    p = proj.start("execute", "one", "--json")
    proj.wait_started("s", p)
    kill_alone(p)
    run_id = run_id_of(proj)
    proj.touch("go")
    proj.touch("after")
    r = proj.run("resume", run_id, "--json")
    assert r.error_code == "indeterminate", r
    ((_run, step, item),) = resolve_targets(r)
    assert (step, item) == ("s", None)
    assert proj.counts() == {}  # the call died with planrun, before its effect
    assert proj.run("resolve", run_id, "s", "--failed").returncode == 0
    r = proj.run("resume", run_id, "--json")
    assert r.returncode == 1, r
    assert r.json["status"] == "failed"
    r = proj.run("retry", run_id, "--json")
    assert r.returncode == 0, r
    assert proj.counts() == {"s": 1, "t": 1}
    assert overlaps(proj) == []


# --- the lease does not depend on tools behaving --------------------------------------------------


def short_lease(proj: CliProject, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANRUN_TEST_LEASE_TTL_S", str(SHORT_TTL_S))


@pytest.mark.sqlite
def test_an_async_tool_blocking_the_loop_keeps_the_lease(
        proj: CliProject, monkeypatch: pytest.MonkeyPatch) -> None:
    short_lease(proj, monkeypatch)
    proj.plan("block", """
        planrun: 1
        goal: An async tool that blocks the event loop
        steps:
          - {id: b, tool: blocker, arguments: {file: go}}
    """)
    p = proj.start("execute", "block", "--json")
    proj.wait_started("b", p)
    run_id = run_id_of(proj)
    time.sleep(SHORT_TTL_S * 2.5)  # the loop is blocked: only a heartbeat thread renews
    r = proj.run("resume", run_id, "--json")
    assert r.error_code == "run_busy", r
    ((expires,),) = proj.query("SELECT lease_expires FROM runs")
    assert expires > time.time()
    proj.touch("go")
    done = proj.finish(p)
    assert done.returncode == 0, done
    no_traceback(done)
    assert proj.counts() == {"b": 1}
    assert len(proj.started("b")) == 1


def steal_lease(proj: CliProject, run_id: str) -> str:
    holder = "elsewhere.invalid:4242:0badcafe"
    with closing(sqlite3.connect(proj.journal, timeout=30)) as conn:
        conn.execute("UPDATE runs SET lease_owner = ?, lease_expires = ? WHERE run_id = ?",
                     (holder, time.time() + 3600, run_id))
        conn.commit()
    return holder


@pytest.mark.parametrize("tool", ["once_cmd", "once_tree", "blocker"])
def test_a_lost_lease_ends_the_process_cleanly(
        proj: CliProject, monkeypatch: pytest.MonkeyPatch, tool: str) -> None:
    short_lease(proj, monkeypatch)
    proj.plan("lost", f"""
        planrun: 1
        goal: A call running when another process takes the lease
        steps:
          - id: s
            tool: {tool}
            arguments: {{file: go{', after: after' if tool != 'blocker' else ''}}}
          - {{id: t, tool: record, depends_on: [s]}}
    """)
    p = proj.start("execute", "lost", "--json")
    proj.wait_started("s", p)
    run_id = run_id_of(proj)
    worker = pids_of(proj, "s")[0]
    holder = steal_lease(proj, run_id)
    if tool == "blocker":
        time.sleep(SHORT_TTL_S)  # the heartbeat finds the lease taken; the loop is blocked
        proj.touch("go")  # the tool returns; its outcome must not be written
    else:
        assert wait_dead(worker), "the command was not ended when the lease was lost"
    done = proj.finish(p)
    assert done.returncode == 5, done
    no_traceback(done)
    assert "error[run_busy]" in done.stderr, done
    assert "lost the run's lease" in done.stderr, done
    assert holder in done.stderr, done
    # It wrote nothing after losing the lease: the step is as the dispatch left it.
    assert [(s.step_id, s.status) for s in proj.probe().steps()] == [
        ("s", "running"), ("t", "pending")]
    lease = proj.probe().lease()
    assert lease is not None
    assert lease.owner == holder
    assert proj.counts() == ({"s": 1} if tool == "blocker" else {})


# --- attempts and max_recoveries -------------------------------------------------------------


def killer_plan(proj: CliProject, tool: str, limit: int | None) -> None:
    extra = "" if limit is None else f"\n    max_recoveries: {limit}"
    proj.plan("killer", f"""
        planrun: 1
        goal: A tool that kills planrun
        steps:
          - id: k
            tool: {tool}{extra}
          - {{id: t, tool: record, depends_on: [k]}}
    """.replace("\n    max_recoveries", "\n            max_recoveries"))


@pytest.mark.parametrize(("tool", "limit"), [("killer_cmd", None), ("killer_py", 1),
                                             ("killer_cmd", 0)])
def test_a_tool_that_kills_planrun_is_recovered_at_most_max_recoveries_times(
        proj: CliProject, tool: str, limit: int | None) -> None:
    killer_plan(proj, tool, limit)
    bound = 3 if limit is None else limit
    r = proj.run("execute", "killer", "--json")
    assert r.returncode == -9, r
    run_id = run_id_of(proj)
    for n in range(bound):
        k = proj.probe().step("k")
        assert (k.attempts, k.recoveries) == (n + 1, n)
        ex = proj.run("resume", "--explain", "--json", run_id)
        assert [s["action"] for s in ex.json["steps"]] == ["run", "run"], ex
        r = proj.run("resume", run_id, "--json")
        assert r.returncode == -9, r
    ex = proj.run("resume", "--explain", "--json", run_id)
    assert ex.json["steps"][0]["action"] == "fail", ex
    assert "max_recoveries" in ex.json["steps"][0]["why"]
    r = proj.run("resume", run_id, "--json")
    assert r.returncode == 1, r
    no_traceback(r)
    m = r.json
    assert m["status"] == "failed"
    k, t = m["steps"]
    assert k["status"] == "failed", k
    assert k["error"]["code"] == "recovery_exhausted", k
    assert k["attempts"] == bound + 1
    assert t["status"] == "skipped"
    # Every dispatch was counted: PLANRUN_ATTEMPT went 1, 2, … (never 1 again).
    assert [e["attempt"] for e in proj.calls("k")] == list(range(1, bound + 2))
    assert proj.run("resume", run_id, "--json").error_code == "run_not_resumable"


def test_max_recoveries_is_a_checked_step_field(proj: CliProject) -> None:
    for bad in ("-1", '"3"', "1.5", "true"):
        proj.plan("bad", f"""
            planrun: 1
            goal: g
            steps:
              - {{id: k, tool: record, max_recoveries: {bad}}}
        """)
        r = proj.run("validate", "bad", "--format", "json")
        assert r.returncode == 3, r
        assert "max_recoveries" in r.stdout, r
    proj.plan("good", """
        planrun: 1
        goal: g
        steps:
          - {id: k, tool: record, max_recoveries: 0}
    """)
    assert proj.run("validate", "good").returncode == 0
    schema = proj.run("schema", "plan").json
    step = schema["$defs"]["Step"]["properties"]["max_recoveries"]
    assert {"type": "integer", "minimum": 0} in step["anyOf"]


def test_attempts_count_dispatches_across_resumes(proj: CliProject) -> None:
    """A call cut short by a crash counts: the resumed dispatch is attempt 2."""
    plan_one(proj, "idem_cmd")
    p = proj.start("execute", "one", "--json")
    proj.wait_started("s", p)
    kill_alone(p)
    run_id = run_id_of(proj)
    proj.touch("go")
    proj.touch("after")
    r = proj.run("resume", run_id, "--json")
    assert r.returncode == 0, r
    assert [e["attempt"] for e in proj.started("s")] == [1, 2]
    assert r.json["steps"][0]["attempts"] == 2
    assert proj.probe().step("s").recoveries == 1


# --- the keeper and the journal, in process -----------------------------------------------------


def test_the_keeper_ends_the_groups_still_listed_when_it_is_closed() -> None:
    keeper = procs.Keeper()
    keeper.start()
    assert keeper.pid is not None
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             process_group=0)
    try:
        keeper.add(child.pid)
        keeper.close()  # as if planrun ended with a call still running
        assert child.wait(timeout=30) == -signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_the_keeper_leaves_a_group_that_was_removed() -> None:
    keeper = procs.Keeper()
    keeper.start()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             process_group=0)
    try:
        keeper.add(child.pid)
        keeper.remove(child.pid)
        keeper.close()
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()


@pytest.mark.sqlite
def test_a_version_1_journal_is_migrated(tmp_path: Path) -> None:
    from planrun.journal import Journal
    from planrun.journal.schema import MIGRATIONS

    path = tmp_path / "old.sqlite3"
    with closing(sqlite3.connect(path)) as conn:
        for statement in MIGRATIONS[0]:
            conn.execute(statement)
        conn.execute("INSERT INTO runs (run_id, root_run_id, plan_name, plan_json, digest, "
                     "revision, params_json, contracts_json, status, created_at) VALUES "
                     "('r1', 'r1', 'p', '{}', 'd', 1, '{}', '{}', 'running', 'now')")
        conn.execute("INSERT INTO steps (run_id, step_id, position, tool, status, attempts) "
                     "VALUES ('r1', 's', 0, 't', 'running', 1)")
        conn.execute("PRAGMA user_version = 1")
        conn.commit()
    with Journal(path, write=True) as journal:
        assert journal.dispatch_state("r1", "s") == ("running", 1, 0)
        assert journal.calls("r1") == []
