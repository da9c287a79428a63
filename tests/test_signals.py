"""SIGINT / SIGTERM sent to a real ``planrun execute`` (SPEC §5 "Signals"), and journals
that cannot be used (SPEC §9, exit 6).

The signal goes to the planrun process itself (its commands run in its session but do not
get it), once the step is known to be running: the tool writes a start marker to the
effects log before it blocks.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sqlite3
import subprocess
import time
from contextlib import closing
from pathlib import Path

import pytest

from harness import move_run_back, planrun_command
from planrun.executor import GRACE_S
from planrun_cli import CliProject, wait_dead

TOOLS = """
tools:
  once:
    description: A python effect that must not happen twice
    python: crashtools:record
    arguments:
      type: object
      properties:
        label: {type: string}
      additionalProperties: false
  wait:
    description: Waits for a file (not idempotent)
    python: crashtools:wait
    arguments:
      type: object
      properties:
        file: {type: string}
      required: [file]
      additionalProperties: false
  wait_again:
    description: Waits for a file, safe to call again
    python: crashtools:wait
    idempotent: true
    arguments:
      type: object
      properties:
        file: {type: string}
      required: [file]
      additionalProperties: false
  retried:
    description: Waits for a file; its first attempt fails, the next succeeds
    python: crashtools:fail_first
    retries: {max_attempts: 3, backoff_s: 0}
    arguments:
      type: object
      properties:
        hold: {type: string}
      required: [hold]
      additionalProperties: false
  each:
    description: Waits for a file, per item
    python: crashtools:wait
    arguments:
      type: object
      properties:
        file: {type: string}
        value: {}
      required: [file]
      additionalProperties: false
  snooze:
    description: A command that sleeps a minute
    command: [{PY}, crashtools.py, sleep, "60"]
    output: json
    arguments: {type: object, additionalProperties: false}
"""

#: Time given to the process to take a signal before the test acts on the running call.
#: Not an assertion: without it the call could end before planrun has seen the signal,
#: and the run would (correctly) finish instead of being interrupted.
SETTLE_S = 0.5


@pytest.fixture
def proj(cli: CliProject) -> CliProject:
    cli.tools(TOOLS)
    cli.plan("held", """
        planrun: 1
        goal: A step that runs until a file appears, between two others
        steps:
          - {id: a, tool: once, arguments: {label: a}}
          - {id: w, tool: wait, depends_on: [a], arguments: {file: go}}
          - {id: z, tool: once, depends_on: [w], arguments: {label: z}}
    """)
    return cli


def run_id_of(proj: CliProject) -> str:
    run_id = proj.probe().run_ids()[0]
    return str(run_id)


@pytest.mark.parametrize(("signum", "exit_code"), [(signal.SIGINT, 130),
                                                   (signal.SIGTERM, 143)],
                         ids=["SIGINT", "SIGTERM"])
def test_a_signal_interrupts_the_run_and_resume_completes_it(
        proj: CliProject, signum: int, exit_code: int) -> None:
    p = proj.start("execute", "held", "--json")
    proj.wait_started("w", p)
    run_id = run_id_of(proj)
    p.send_signal(signum)
    time.sleep(SETTLE_S)
    proj.touch("go")  # the running call ends inside the grace period
    r = proj.finish(p)
    assert r.returncode == exit_code, r
    assert "Traceback" not in r.stderr, r
    # The call that was running finished; nothing new was dispatched.
    assert proj.counts() == {"a": 1, "w": 1}

    st = proj.run("status", run_id, "--json")
    assert st.returncode == 0, st
    m = st.json
    assert m["status"] == "interrupted"
    assert m["resumable"] is True
    assert m["next"] == f"planrun resume {run_id}"
    assert [s["status"] for s in m["steps"]] == ["succeeded", "succeeded", "pending"]
    kinds = [e.kind for e in proj.probe().events(run_id)]
    assert kinds[-1] == "run_interrupted"
    assert proj.probe().lease(run_id) is None

    r = proj.run("resume", "--json")
    assert r.returncode == 0, r
    assert r.json["run_id"] == run_id
    assert r.json["status"] == "completed"
    assert proj.counts() == {"a": 1, "w": 1, "z": 1}
    again = proj.run("resume", "--json")
    assert again.returncode == 5, again
    assert again.error_code == "run_not_resumable"
    again = proj.run("resume", run_id, "--json")
    assert again.returncode == 5, again
    assert again.error_code == "run_not_resumable"


def test_a_signal_during_a_fan_out_leaves_the_other_items_to_resume(
        proj: CliProject) -> None:
    proj.plan("fan", """
        planrun: 1
        goal: Items one at a time
        steps:
          - id: f
            tool: each
            for_each: [a, b, c]
            max_parallel: 1
            arguments: {file: go, value: "{item}"}
          - {id: z, tool: once, depends_on: [f], arguments: {label: z}}
    """)
    p = proj.start("execute", "fan", "--json")
    proj.wait_started("f#0", p)
    run_id = run_id_of(proj)
    p.send_signal(signal.SIGTERM)
    time.sleep(SETTLE_S)
    proj.touch("go")
    r = proj.finish(p)
    assert r.returncode == 143, r
    assert proj.counts() == {"f#0": 1}
    m = proj.run("status", run_id, "--json").json
    assert m["status"] == "interrupted"
    assert m["steps"][0]["items"] == {"total": 3, "succeeded": 1, "failed": 0}

    r = proj.run("resume", run_id, "--json")
    assert r.returncode == 0, r
    assert r.json["status"] == "completed"
    assert proj.counts() == {"f#0": 1, "f#1": 1, "f#2": 1, "z": 1}
    out = proj.run("output", run_id, "f")
    assert [o["args"]["value"] for o in json.loads(out.stdout)] == ["a", "b", "c"]


def test_no_retry_attempt_is_dispatched_after_a_signal(proj: CliProject) -> None:
    proj.plan("retrying", """
        planrun: 1
        goal: A step with retries whose first attempt fails after the signal
        steps:
          - {id: r, tool: retried, arguments: {hold: go}}
          - {id: z, tool: once, depends_on: [r], arguments: {label: z}}
    """)
    p = proj.start("execute", "retrying", "--json")
    proj.wait_started("r", p)
    run_id = run_id_of(proj)
    p.send_signal(signal.SIGINT)
    time.sleep(SETTLE_S)
    proj.touch("go")  # attempt 1 now fails, inside the grace period
    r = proj.finish(p)
    assert r.returncode == 130, r
    # "The first SIGINT stops dispatching": attempt 2 is a new call, it must wait for resume.
    assert [e["attempt"] for e in proj.started("r")] == [1], proj.entries()
    m = proj.run("status", run_id, "--json").json
    assert [s["status"] for s in m["steps"]] == ["pending", "pending"]
    r = proj.run("resume", run_id, "--json")
    assert r.returncode == 0, r
    assert proj.counts() == {"r": 1, "z": 1}


@pytest.mark.parametrize("kind", ["command", "python"])
def test_a_second_sigint_cancels_at_once(proj: CliProject, kind: str) -> None:
    """The running call is cancelled (command killed / python call abandoned), not waited.

    The first SIGINT alone would wait GRACE_S (10 s) for the call; the hang guard on the
    process after the second SIGINT is shorter than that, so only an immediate cancel
    passes. The call itself would take 60 s.
    """
    step, tool, args = (("snooze", "snooze", "{}") if kind == "command"
                        else ("w", "wait", "{file: never}"))
    proj.plan("long", f"""
        planrun: 1
        goal: A call that takes a minute
        steps:
          - {{id: a, tool: once, arguments: {{label: a}}}}
          - {{id: {step}, tool: {tool}, depends_on: [a], arguments: {args}}}
          - {{id: z, tool: once, depends_on: [{step}], arguments: {{label: z}}}}
    """)
    p = proj.start("execute", "long", "--json")
    marker = proj.wait_started(step, p)
    run_id = run_id_of(proj)
    p.send_signal(signal.SIGINT)
    time.sleep(SETTLE_S)
    assert p.poll() is None, "the first SIGINT must wait for the running call"
    p.send_signal(signal.SIGINT)
    r = proj.finish(p, timeout=GRACE_S * 0.8)
    assert r.returncode == 130, r
    if kind == "command":
        assert wait_dead(marker["pid"]), "the command was not killed"
    assert proj.counts() == {"a": 1}

    st = proj.run("status", run_id, "--json")
    assert st.returncode == 0, st
    m = st.json
    assert m["status"] == "interrupted"
    steps = {s["id"]: s for s in m["steps"]}
    assert steps[step]["status"] == "indeterminate"
    assert steps[step]["error"]["code"] == "interrupted"
    assert steps["z"]["status"] == "pending"
    # what to do next is to settle that call: resume alone would stop on it (exit 5)
    assert m["next"] == f"planrun resolve {run_id} {step}", m
    # Its effect is unknown and the tool is not idempotent: resume asks a person.
    r = proj.run("resume", run_id, "--json")
    assert r.returncode == 5, r
    assert r.error_code == "indeterminate"
    assert proj.counts() == {"a": 1}


def _cancel_twice(proj: CliProject, plan: str, effect: str) -> str:
    """Start ``plan``, Ctrl-C twice once ``effect`` runs (exit 130); the run's id."""
    p = proj.start("execute", plan, "--json")
    proj.wait_started(effect, p)
    run_id = run_id_of(proj)
    p.send_signal(signal.SIGINT)
    time.sleep(SETTLE_S)
    p.send_signal(signal.SIGINT)
    r = proj.finish(p, timeout=GRACE_S * 0.8)  # not the grace period: at once
    assert r.returncode == 130, r
    return run_id


def test_next_names_the_item_or_the_crashed_call_resume_would_stop_on(
        proj: CliProject) -> None:
    """A cancelled fan-out item, and a call a SIGKILL cut short: neither tool may be
    called again, so ``next`` is the resolve that resume's own refusal asks for."""
    proj.plan("fan", """
        planrun: 1
        goal: Items one at a time
        steps:
          - {id: f, tool: each, for_each: [a, b], max_parallel: 1,
             arguments: {file: never, value: "{item}"}}
    """)
    run_id = _cancel_twice(proj, "fan", "f#0")
    m = proj.run("status", run_id, "--json").json
    assert m["next"] == f"planrun resolve {run_id} f --item 0", m
    refused = proj.run("resume", run_id, "--json")
    assert refused.returncode == 5, refused
    assert "--item 0" in refused.stderr, refused

    p = proj.start("execute", "held", "--json")
    proj.wait_started("w", p)
    crashed = next(r for r in proj.probe().run_ids() if r != run_id)
    proj.kill_group(p)
    p.wait()
    m = proj.run("status", crashed, "--json").json
    assert m["next"] == f"planrun resolve {crashed} w", m


def test_a_cancelled_call_of_an_idempotent_tool_leaves_resume_next(proj: CliProject) -> None:
    """Its effect is unknown, but its tool may be called again: resume does (SPEC §5)."""
    proj.plan("again", """
        planrun: 1
        goal: A call that may be made again
        steps:
          - {id: a, tool: once, arguments: {label: a}}
          - {id: w, tool: wait_again, depends_on: [a], arguments: {file: go}}
    """)
    run_id = _cancel_twice(proj, "again", "w")
    m = proj.run("status", run_id, "--json").json
    assert {s["id"]: s["status"] for s in m["steps"]}["w"] == "indeterminate"
    assert m["next"] == f"planrun resume {run_id}", m
    proj.touch("go")
    r = proj.run("resume", run_id, "--json")
    assert r.returncode == 0, r
    assert r.json["status"] == "completed"


def test_the_wait_for_a_person_to_resolve_is_not_working_time(proj: CliProject) -> None:
    """An hour between the cut call and its ``resolve``: neither the step's duration nor
    the run's counts it (decisions taken while nobody drives the run, issue 10 bug 12)."""
    run_id = _cancel_twice(proj, "held", "w")
    assert isinstance(proj.journal, Path), "the test moves SQLite timestamps"
    move_run_back(proj.journal, run_id)  # the person took an hour to decide
    r = proj.run("resolve", run_id, "w", "--succeeded", "--output", '{"ok": true}')
    assert r.returncode == 0, r
    r = proj.run("resume", run_id, "--json")
    assert r.returncode == 0, r
    m = r.json
    assert m["status"] == "completed"
    assert m["wall_s"] > 3600
    assert m["duration_s"] < 600, m["duration_s"]
    steps = {s["id"]: s for s in m["steps"]}
    assert steps["w"]["duration_s"] < 600, steps["w"]  # it ran well under a minute


# --- journals that cannot be used ----------------------------------------------------------


def _unusable(proj: CliProject, journal: str, *args: str) -> None:
    for json_flag in ((), ("--json",)):
        r = proj.run(*args, "--journal", journal, *json_flag)
        assert r.returncode == 6, r
        assert "Traceback" not in r.stderr + r.stdout, r
        stderr = r.stderr.splitlines()
        assert stderr[0].startswith("planrun: error[journal]: "), r
        assert journal in stderr[0], r
        # One message line, then at most one indented hint line.
        assert len(stderr) <= 2, r
        assert all(line.startswith("  ") for line in stderr[1:]), r
        if json_flag:
            assert r.error_code == "journal", r
        else:
            assert r.stdout == "", r


def test_journal_is_a_directory(proj: CliProject) -> None:
    folder = proj.root.parent / "a-folder"
    folder.mkdir()
    _unusable(proj, str(folder), "execute", "held")
    _unusable(proj, str(folder), "runs")
    assert proj.counts() == {}
    assert list(folder.iterdir()) == []


def test_journal_is_not_a_database(proj: CliProject) -> None:
    text = proj.root.parent / "notes.txt"
    text.write_text("these are my notes, not a journal\n" * 20)
    before = text.read_bytes()
    _unusable(proj, str(text), "execute", "held")
    _unusable(proj, str(text), "runs")
    _unusable(proj, str(text), "status", "abcd1234")
    _unusable(proj, str(text), "resume")
    assert proj.counts() == {}
    assert text.read_bytes() == before


def test_journal_folder_is_a_file(proj: CliProject) -> None:
    blocker = proj.root.parent / "blocker"
    blocker.write_text("x")
    _unusable(proj, str(blocker / "journal.sqlite3"), "execute", "held")
    assert proj.counts() == {}


@pytest.mark.sqlite
def test_journal_from_a_newer_planrun(proj: CliProject) -> None:
    newer = proj.root.parent / "newer.sqlite3"
    with closing(sqlite3.connect(newer)) as conn:
        conn.execute("PRAGMA user_version = 999")
        conn.commit()
    _unusable(proj, str(newer), "execute", "held")
    _unusable(proj, str(newer), "runs")
    assert proj.counts() == {}
    with closing(sqlite3.connect(newer)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (999,)
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == []


def test_journal_status_of_a_healthy_journal_still_reads(proj: CliProject) -> None:
    """Control for the cases above: the same commands work on a usable journal."""
    good = proj.root.parent / "good.sqlite3"
    proj.touch("go")
    r = proj.run("execute", "held", "--journal", str(good), "--json")
    assert r.returncode == 0, r
    runs = proj.run("runs", "--journal", str(good), "--json")
    assert runs.returncode == 0, runs
    assert [x["run_id"] for x in json.loads(runs.stdout)] == [r.json["run_id"]]


def test_the_resolve_a_run_names_next_decides_nothing_and_tells_the_choice(
        tmp_path: Path) -> None:
    """``next`` of a run with a step of unknown effect is ``planrun resolve RUN STEP``:
    run as it is, it records nothing (exit 2) and prints both commands. It was
    ``… --succeeded|--failed``, which a shell ran as ``--succeeded`` piped into a
    ``--failed`` that is no command: the step was recorded as succeeded (found by a fresh
    operator)."""
    from harness import run_planrun

    root = tmp_path / "p"
    (root / "plans").mkdir(parents=True)
    (root / "tools.yaml").write_text(
        "tools:\n  nap:\n    command: [sleep, '{s}']\n    timeout: 0.5\n"
        "    arguments: {type: object, properties: {s: {type: string}}, required: [s], "
        "additionalProperties: false}\n")
    (root / "plans" / "nap.yaml").write_text(
        "planrun: 1\ngoal: a call cut short\nsteps:\n"
        "  - {id: n, tool: nap, arguments: {s: '30'}}\n")
    env = dict(os.environ, PLANRUN_JOURNAL=str(tmp_path / "j.sqlite3"))
    r = run_planrun("execute", "nap", "--json", cwd=root, env=env)
    m = json.loads(r.stdout)
    assert m["steps"][0]["status"] == "indeterminate", m
    run_id = m["run_id"]
    assert m["next"] == f"planrun resolve {run_id} n", m
    # what an operator does at 3 a.m.: paste the hint into a shell
    pasted = subprocess.run(["sh", "-c", m["next"].replace("planrun", " ".join(
        shlex.quote(a) for a in planrun_command()), 1)], cwd=root, env=env,
        capture_output=True, text=True, timeout=60)
    assert pasted.returncode == 2, pasted
    assert (f"planrun resolve {run_id} n --succeeded [--output JSON] if its effect happened, "
            f"or planrun resolve {run_id} n --failed [--reason TEXT] if it did not"
            ) in pasted.stderr
    after = json.loads(run_planrun("status", run_id, "--json", cwd=root, env=env).stdout)
    assert after["steps"][0]["status"] == "indeterminate"  # nothing recorded
    both = run_planrun("resolve", run_id, "n", "--succeeded", "--failed", cwd=root, env=env)
    assert both.returncode == 2
    assert "give only one of --succeeded or --failed" in both.stderr
