"""Several real ``planrun`` processes on one journal (SPEC §7 "Leases", one SQLite file).

(a) Two ``resume`` processes started at once on one crashed run: the lease lets exactly one
drive it; the other is refused with ``run_busy`` (exit 5) and calls nothing.
(b) Three ``execute`` processes on one fresh journal at once (they overlap for sure: each
run's ``meet`` step only succeeds once all three are inside it): all complete, and none
ever prints "database is locked".
"""

from __future__ import annotations

import time

import pytest

from planrun_cli import TIMEOUT_S, CliProject

TOOLS = """
tools:
  once:
    description: A python effect that must not happen twice
    python: crashtools:record
    arguments:
      type: object
      properties:
        label: {type: string}
        value: {}
      additionalProperties: false
  idem:
    description: An idempotent python effect
    python: crashtools:record
    idempotent: true
    arguments:
      type: object
      properties:
        label: {type: string}
        value: {}
      additionalProperties: false
  wait:
    description: Waits for a file (idempotent)
    python: crashtools:wait
    idempotent: true
    arguments:
      type: object
      properties:
        file: {type: string}
      required: [file]
      additionalProperties: false
  gate:
    description: Fails until a fix file exists; then waits for a hold file
    python: crashtools:gate
    arguments:
      type: object
      properties:
        fix: {type: string}
        hold: {type: string}
      required: [fix, hold]
      additionalProperties: false
  barrier:
    description: Succeeds only when all parties are inside at once
    python: crashtools:barrier
    arguments:
      type: object
      properties:
        room: {type: string}
        parties: {type: integer}
      required: [room, parties]
      additionalProperties: false
"""


@pytest.fixture
def proj(journal_location: object, cli: CliProject) -> CliProject:
    """The project, journaled on each backend (SQLite file, PostgreSQL database)."""
    cli.tools(TOOLS)
    return cli


def test_two_resumes_of_one_crashed_run(proj: CliProject) -> None:
    proj.plan("hold", """
        planrun: 1
        goal: A step that holds the run until a file appears
        steps:
          - {id: a, tool: once, arguments: {label: a}}
          - {id: w, tool: wait, depends_on: [a], arguments: {file: go}}
          - {id: z, tool: once, depends_on: [w], arguments: {label: z}}
    """)
    # Killed right after w's dispatch record: w is left running; its tool is idempotent,
    # so a resume runs it again (it was never called).
    r = proj.run("execute", "hold", "--json", crash="dispatch:w")
    assert r.returncode == -9, r
    (run_id,) = proj.probe().run_ids()

    first = proj.start("resume", run_id, "--json", name="resume")
    second = proj.start("resume", run_id, "--json", name="resume")
    # Whichever took the lease now waits inside w, holding it; the other must give up.
    deadline = time.monotonic() + TIMEOUT_S
    while first.poll() is None and second.poll() is None:
        assert time.monotonic() < deadline, "neither resume finished"
        time.sleep(0.02)
    loser, winner = (first, second) if first.poll() is not None else (second, first)
    lost = proj.finish(loser)
    assert lost.returncode == 5, lost
    assert "run_busy" in lost.stdout + lost.stderr, lost
    assert str(winner.pid) in lost.stderr, lost  # it names the holder
    assert winner.poll() is None, "the winner should still be holding the run"

    proj.wait_started("w", winner)
    # resolve and retry are refused too while the run is driven.
    r = proj.run("resolve", run_id, "w", "--failed", "--json")
    assert r.returncode == 5, r
    assert r.error_code == "run_busy", r
    proj.touch("go")
    won = proj.finish(winner)
    assert won.returncode == 0, won
    assert won.json["status"] == "completed"
    assert won.json["run_id"] == run_id
    # Nothing ran twice: a before the crash, w and z once by the winner.
    assert proj.counts() == {"a": 1, "w": 1, "z": 1}
    assert len(proj.started("w")) == 1
    assert {c["pid"] for c in proj.calls("w") + proj.calls("z")} == {winner.pid}
    (run,) = proj.probe().runs()
    assert (run.lease, run.status) == (None, "completed")
    assert proj.integrity() == "ok"
    # A third resume now finds nothing to do.
    r = proj.run("resume", run_id, "--json")
    assert r.returncode == 5, r
    assert r.error_code == "run_not_resumable"


def test_two_retries_of_one_failed_run(proj: CliProject) -> None:
    proj.plan("gated", """
        planrun: 1
        goal: A step that fails until fixed, then holds until released
        steps:
          - {id: a, tool: once, arguments: {label: a}}
          - {id: b, tool: gate, depends_on: [a], arguments: {fix: fix, hold: go}}
    """)
    r = proj.run("execute", "gated", "--json")
    assert r.returncode == 1, r
    parent = r.json["run_id"]
    assert len(proj.started("b")) == 1
    assert proj.counts() == {"a": 1}

    proj.touch("fix")
    first = proj.start("retry", parent, "--json", name="retry")
    proj.wait_started("b", first, count=2)  # the first child is inside b, holding
    second = proj.start("retry", parent, "--json", name="retry")
    # The second retry must be refused; if it is not, it reaches b too.
    deadline = time.monotonic() + TIMEOUT_S
    while second.poll() is None and len(proj.started("b")) < 3:
        assert time.monotonic() < deadline, "the second retry neither ended nor reached b"
        time.sleep(0.02)
    proj.touch("go")
    won, lost = proj.finish(first), proj.finish(second)
    assert proj.counts() == {"a": 1, "b": 1}, lost  # b's effect happened once
    assert won.returncode == 0, won
    assert lost.returncode == 5, lost
    assert "run_busy" in lost.stdout + lost.stderr, lost


def test_a_second_retry_never_calls_a_step_the_first_one_died_in(proj: CliProject) -> None:
    """The first retry was killed inside a non-idempotent call; the second took the key
    over and called it again (found by an attacker). Its effect is unknown: the second
    retry stops (``indeterminate``, exit 5) until a person settles the first's step."""
    proj.plan("gated", """
        planrun: 1
        goal: A step that fails until fixed, then holds until released
        steps:
          - {id: a, tool: once, arguments: {label: a}}
          - {id: b, tool: gate, depends_on: [a], arguments: {fix: fix, hold: go}}
    """)
    r = proj.run("execute", "gated", "--json")
    assert r.returncode == 1, r
    parent = r.json["run_id"]
    proj.touch("fix")
    first = proj.start("retry", parent, "--json", name="retry")
    proj.wait_started("b", first, count=2)  # the first child is inside b
    proj.kill_group(first)
    first.wait()
    (child,) = [c for c in proj.probe().run_ids() if c != parent]

    again = proj.run("retry", parent, "--json")
    assert again.returncode == 5, again
    assert again.error_code == "indeterminate", again
    assert f"run {child}" in again.json["error"]["message"], again
    assert f"planrun resolve {child} b" in again.json["error"]["hint"], again
    assert len(proj.started("b")) == 2  # not called a third time
    refused = again.json["error"]["run_id"]

    # Settled as failed (nothing happened there): the refused retry runs b, once.
    assert proj.run("resolve", child, "b", "--failed").returncode == 0
    proj.touch("go")
    done = proj.run("resume", refused, "--json")
    assert done.returncode == 0, done
    assert len(proj.started("b")) == 3
    assert proj.counts() == {"a": 1, "b": 1}



def test_a_retry_while_a_resume_drives_the_first_retry_is_refused(proj: CliProject) -> None:
    """The first retry was killed; ``resume`` drives its child. A second retry of the parent
    made a child of its own that stopped at the key the resume was calling, left
    ``running`` with nobody driving it, and named it the parent's "retried as" (found by
    an attacker). Now it is refused (``run_busy``) before anything is written."""
    proj.plan("fixed", """
        planrun: 1
        goal: A step that fails until fixed, then one that holds until released
        steps:
          - {id: b, tool: gate, arguments: {fix: fix, hold: fix}}
          - {id: w, tool: wait, depends_on: [b], arguments: {file: go}}
    """)
    r = proj.run("execute", "fixed", "--json")
    assert r.returncode == 1, r
    parent = r.json["run_id"]
    proj.touch("fix")
    first = proj.start("retry", parent, "--json", name="retry")
    proj.wait_started("w", first)  # b succeeded; the child waits in w (idempotent)
    proj.kill_group(first)
    first.wait()
    (child,) = [c for c in proj.probe().run_ids() if c != parent]
    resume = proj.start("resume", child, "--json", name="resume")
    proj.wait_started("w", resume, count=2)

    again = proj.run("retry", parent, "--json")
    assert again.returncode == 5, again
    assert again.error_code == "run_busy", again
    assert child in again.json["error"]["message"], again
    assert sorted(proj.probe().run_ids()) == sorted([parent, child])  # no third run
    proj.touch("go")
    done = proj.finish(resume)
    assert done.returncode == 0, done
    assert done.json["status"] == "completed", done
    assert proj.counts() == {"b": 1, "w": 1}

PARTIES = 3


@pytest.mark.parametrize("same_plan", [True, False], ids=["same-plan", "different-plans"])
def test_three_executes_on_one_journal(proj: CliProject, same_plan: bool) -> None:
    names = ["busy"] * PARTIES if same_plan else [f"busy{i}" for i in range(PARTIES)]
    for name in set(names):
        proj.plan(name, f"""
            planrun: 1
            goal: Many small journal writes around a step all runs must be inside at once
            steps:
              - {{id: a, tool: once, arguments: {{label: {name}}}}}
              - id: fan
                tool: idem
                depends_on: [a]
                for_each: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
                arguments: {{value: "{{item}}"}}
              - {{id: meet, tool: barrier, depends_on: [fan],
                  arguments: {{room: room, parties: {PARTIES}}}}}
              - id: after
                tool: idem
                depends_on: [meet]
                for_each: [1, 2, 3, 4, 5, 6, 7, 8]
                arguments: {{value: "{{item}}"}}
              - {{id: z, tool: once, depends_on: [after], arguments: {{label: z}}}}
        """)
    assert not proj.journal_exists()  # the three also race to create and migrate it
    procs = [proj.start("execute", name, "--json", name=f"exec{i}")
             for i, name in enumerate(names)]
    results = [proj.finish(p) for p in procs]
    for r in results:
        assert r.returncode == 0, r
        assert "database is locked" not in (r.stdout + r.stderr).lower(), r
        assert r.json["status"] == "completed", r
    run_ids = {r.json["run_id"] for r in results}
    assert len(run_ids) == PARTIES
    counts = proj.counts()
    assert counts["meet"] == PARTIES
    assert counts["a"] == counts["z"] == PARTIES
    assert all(counts[f"fan#{i}"] == PARTIES for i in range(12))
    assert all(counts[f"after#{i}"] == PARTIES for i in range(8))
    assert {c["run"] for c in proj.calls("meet")} == run_ids
    assert [r.status for r in proj.probe().runs()] == ["completed"] * 3
    assert proj.integrity() == "ok"
