"""``planrun resume`` / ``resume --explain`` / ``retry`` / ``resolve`` / ``unlock`` edge cases.

Against the real ``planrun`` process (SPEC §7), with runs killed by the crash seam
``PLANRUN_TEST_CRASH`` and every side effect counted in the effects log (see
``tests/crashtools.py``).
"""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from typing import Any

import pytest

from harness import asset
from planrun_cli import CliProject, Result

TOOLS = asset("registries/record.yaml") + asset("registries/waiting.yaml")

CHAIN = """
planrun: 1
goal: Three steps in a row
steps:
  - id: a
    tool: once
    arguments: {label: a}
  - id: b
    tool: once
    depends_on: [a]
    arguments: {label: journaled}
  - id: c
    tool: idem
    depends_on: [b]
    arguments: {label: c}
"""


@pytest.fixture
def proj(journal_location: object, cli: CliProject) -> CliProject:
    """The project, journaled on each backend (SQLite file, PostgreSQL database)."""
    cli.tools(TOOLS)
    cli.plan("chain", CHAIN)
    return cli


def crash(proj: CliProject, plan: str, point: str, *extra: str) -> str:
    """``planrun execute PLAN`` killed at ``point``; returns the run id."""
    r = proj.run("execute", plan, "--json", *extra, crash=point)
    assert r.returncode == -9, r
    return proj.probe().run_ids()[0]


def status(proj: CliProject, run_id: str) -> dict[str, Any]:
    r = proj.run("status", run_id, "--json")
    assert r.returncode == 0, r
    return r.json  # type: ignore[no-any-return]


def refused(r: Result, code: str, exit_code: int = 5) -> None:
    """Exit status, ``--json`` error code, and a one-line ``error[code]`` on stderr."""
    assert r.returncode == exit_code, r
    if "--json" in r.argv:
        assert r.error_code == code, r
    else:
        assert r.stdout == "", r
    assert f"error[{code}]" in r.stderr, r
    assert "Traceback" not in r.stderr, r


# --- what resume refuses ------------------------------------------------------------------


def test_resume_of_a_completed_run_is_refused(proj: CliProject) -> None:
    r = proj.run("execute", "chain", "--json")
    assert r.returncode == 0, r
    run_id = r.json["run_id"]
    refused(proj.run("resume", run_id, "--json"), "run_not_resumable")
    refused(proj.run("resume", run_id[:6], "--json"), "run_not_resumable")  # a prefix
    # Without an id there is no interrupted or running run either.
    refused(proj.run("resume", "--json"), "run_not_resumable")
    assert proj.counts() == {"a": 1, "b": 1, "c": 1}
    assert status(proj, run_id)["status"] == "completed"


def test_resume_with_no_resumable_run(proj: CliProject) -> None:
    refused(proj.run("resume", "--json"), "run_not_resumable")  # no journal at all
    r = proj.run("execute", "chain", "--json")
    assert r.returncode == 0, r
    refused(proj.run("resume"), "run_not_resumable", 5)


def test_resume_of_an_unknown_run(proj: CliProject) -> None:
    refused(proj.run("resume", "0123456789abcdef", "--json"), "unknown_run")
    crash(proj, "chain", "outcome:a")
    refused(proj.run("resume", "0123456789abcdef", "--json"), "unknown_run")
    assert proj.counts() == {"a": 1}


def test_resume_of_a_failed_run_points_to_retry(proj: CliProject) -> None:
    proj.plan("fails", """
        planrun: 1
        goal: One failing step
        steps:
          - {id: f, tool: flaky, arguments: {file: never}}
    """)
    r = proj.run("execute", "fails", "--json")
    assert r.returncode == 1, r
    res = proj.run("resume", r.json["run_id"], "--json")
    refused(res, "run_not_resumable")
    assert f"planrun retry {r.json['run_id']}" in res.stderr


# --- resume --explain -----------------------------------------------------------------------


@pytest.mark.sqlite  # compares the SQLite file's bytes before and after
def test_explain_changes_nothing_and_names_each_action(proj: CliProject) -> None:
    proj.plan("four", """
        planrun: 1
        goal: Replay, stop, run
        steps:
          - {id: a, tool: once, arguments: {label: a}}
          - {id: b, tool: once, depends_on: [a], arguments: {label: b}}
          - {id: c, tool: idem, depends_on: [b], arguments: {label: c}}
    """)
    run_id = crash(proj, "four", "dispatch:b")
    rows = proj.dump()
    files = proj.journal_files()
    assert files["main"] is not None

    r = proj.run("resume", "--explain", "--json", run_id)
    assert r.returncode == 0, r
    t = proj.run("resume", "--explain")  # the default run, as text
    assert t.returncode == 0, t

    assert proj.journal_files() == files, "resume --explain wrote to the journal"
    assert proj.dump() == rows
    report = r.json
    assert report["run_id"] == run_id
    assert report["would_stop"] is True
    actions = {s["step"]: s["action"] for s in report["steps"]}
    assert actions == {"a": "replay", "b": "stop", "c": "run"}
    why = {s["step"]: s["why"] for s in report["steps"]}
    assert "succeeded at" in why["a"]
    assert "not idempotent" in why["b"]
    assert "never dispatched" in why["c"]
    text = {line.split()[1]: line.split()[0] for line in t.stdout.splitlines()
            if line.startswith("  ")}
    assert text == {"a": "replay", "b": "stop", "c": "run"}, t
    # Nothing ran, and the run is still what the crash left.
    assert proj.counts() == {"a": 1}
    m = status(proj, run_id)
    assert m["status"] == "running"
    assert [s["status"] for s in m["steps"]] == ["succeeded", "running", "pending"]


def test_explain_of_an_idempotent_step_left_running(proj: CliProject) -> None:
    run_id = crash(proj, "chain", "dispatch:c")
    r = proj.run("resume", "--explain", "--json", run_id)
    assert r.returncode == 0, r
    steps = {s["step"]: s for s in r.json["steps"]}
    assert [steps[s]["action"] for s in "abc"] == ["replay", "replay", "run"]
    assert "idempotent" in steps["c"]["why"]
    assert r.json["would_stop"] is False


def test_explain_and_resume_agree_on_the_same_interrupted_run(proj: CliProject) -> None:
    """explain rebuilds the journaled plan exactly as resume does (one function, issue 12).

    Before, explain checked the plan with the journaled values *under* ``-p``: it said a
    run would go on with a value that resume refuses to change (exit 2).
    """
    proj.plan("labelled", """
        planrun: 1
        goal: A parameter fixed at execute
        params:
          label: {type: string}
        steps:
          - {id: a, tool: once, arguments: {label: a}}
          - {id: b, tool: idem, depends_on: [a], arguments: {label: "{params.label}"}}
    """)
    run_id = crash(proj, "labelled", "dispatch:b", "-p", "label=first")

    # Given again with another value: both refuse it the same way, and nothing changes.
    ex = proj.run("resume", "--explain", "--json", run_id, "-p", "label=second")
    re = proj.run("resume", "--json", run_id, "-p", "label=second")
    refused(ex, "usage", exit_code=2)
    refused(re, "usage", exit_code=2)
    assert ex.json["error"]["message"] == re.json["error"]["message"], (ex, re)
    assert "keeps the value" in ex.json["error"]["message"]
    assert proj.counts() == {"a": 1}

    # Without it: what explain says per step is what resume then does.
    ex = proj.run("resume", "--explain", "--json", run_id)
    assert ex.returncode == 0, ex
    assert ex.json["revalidation"] == {"ok": True, "issues": [], "missing_secrets": []}
    assert ex.json["would_stop"] is False
    actions = {s["step"]: s["action"] for s in ex.json["steps"]}
    assert actions == {"a": "replay", "b": "run"}
    re = proj.run("resume", "--json", run_id)
    assert re.returncode == 0, re
    done = {s["id"]: ("replay" if s["replayed"] else "run") for s in re.json["steps"]}
    assert done == actions
    assert proj.counts() == {"a": 1, "b": 1}
    assert proj.calls("b")[0]["output"]["args"] == {"label": "first"}  # as journaled


# --- what resume runs -----------------------------------------------------------------------


def test_resume_runs_the_journaled_plan_not_the_edited_file(proj: CliProject) -> None:
    run_id = crash(proj, "chain", "outcome:a")
    digest = status(proj, run_id)["plan"]["digest"]
    proj.plan("chain", CHAIN.replace("label: journaled", "label: edited") + """
  - id: extra
    tool: once
    depends_on: [c]
    arguments: {label: extra}
""")
    r = proj.run("resume", run_id, "--json")
    assert r.returncode == 0, r
    m = r.json
    assert m["status"] == "completed"
    assert [s["id"] for s in m["steps"]] == ["a", "b", "c"]
    assert m["plan"]["digest"] == digest
    assert proj.counts() == {"a": 1, "b": 1, "c": 1}
    assert proj.calls("b")[0]["output"]["args"] == {"label": "journaled"}
    steps = {s["id"]: s for s in m["steps"]}
    assert steps["a"]["replayed"] is True
    assert steps["b"]["replayed"] is False
    # The edited file is what a new run uses.
    r = proj.run("execute", "chain", "--json")
    assert r.returncode == 0, r
    assert proj.calls("b")[-1]["output"]["args"] == {"label": "edited"}
    assert proj.counts()["extra"] == 1


def test_registry_change_that_breaks_the_plan(proj: CliProject) -> None:
    run_id = crash(proj, "chain", "outcome:a")
    tools = (proj.root / "tools.yaml").read_text()
    # ``label`` must now be an integer: the journaled ``label: journaled`` no longer fits.
    proj.tools(TOOLS.replace("label: {type: string}", "label: {type: integer}"))

    r = proj.run("resume", run_id, "--json")
    assert r.returncode == 3, r
    assert r.json["ok"] is False
    issues = [i for p in r.json["plans"] for i in p["issues"]]
    assert {i["code"] for i in issues} == {"arguments"}, r
    assert {i["step"] for i in issues} == {"a", "b", "c"}
    t = proj.run("resume", run_id)
    assert t.returncode == 3, t
    assert "arguments" in t.stderr, t
    assert "Traceback" not in t.stderr, t

    m = status(proj, run_id)
    assert m["resumable"] is True
    assert m["status"] in ("running", "interrupted")
    # resume would refuse it as it is: status says so, and where to see why
    assert m["next"] == f"planrun resume {run_id} --explain"
    assert m["resume_refused"]["code"] == "arguments"
    assert proj.counts() == {"a": 1}

    (proj.root / "tools.yaml").write_text(tools)
    assert status(proj, run_id)["next"] == f"planrun resume {run_id}"
    r = proj.run("resume", "--json")
    assert r.returncode == 0, r
    assert r.json["run_id"] == run_id
    assert proj.counts() == {"a": 1, "b": 1, "c": 1}


def test_a_contract_change_that_keeps_the_plan_valid_is_accepted(proj: CliProject) -> None:
    run_id = crash(proj, "chain", "outcome:a")
    proj.tools(TOOLS.replace("value: {}", "value: {}\n        note: {type: string}"))
    r = proj.run("resume", run_id, "--json")
    assert r.returncode == 0, r
    assert proj.counts() == {"a": 1, "b": 1, "c": 1}


def test_approvals_are_reused_when_the_arguments_match(proj: CliProject) -> None:
    proj.plan("guarded", """
        planrun: 1
        goal: An irreversible step after an ordinary one
        steps:
          - {id: a, tool: once, arguments: {label: a}}
          - {id: z, tool: danger, depends_on: [a], arguments: {label: point of no return}}
    """)
    # Not on a terminal and not cleared: refused, nothing runs.
    r = proj.run("execute", "guarded", "--json")
    assert r.returncode == 4, r
    assert proj.counts() == {}

    run_id = crash(proj, "guarded", "outcome:a", "--approve", "z")
    r = proj.run("resume", run_id, "--json")  # no --approve this time
    assert r.returncode == 0, r
    assert r.json["status"] == "completed"
    assert proj.counts() == {"a": 1, "z": 1}
    log = proj.run("log", run_id, "--json")
    assert log.returncode == 0, log
    granted = [e for e in log.json if e["kind"] == "approval_granted"]
    assert [(e["step"], e["data"]["method"]) for e in granted] == [("z", "flag")]
    assert not [e for e in log.json if e["kind"] == "approval_required"
                and e["data"] and e["step"] == "z" and e["id"] > granted[0]["id"]]


# --- retry and resolve ---------------------------------------------------------------------


def test_retry_makes_a_child_run_with_lineage(proj: CliProject) -> None:
    proj.plan("fragile", """
        planrun: 1
        goal: Two steps that fail until fixed
        steps:
          - {id: a, tool: once, arguments: {label: a}}
          - {id: b, tool: flaky, depends_on: [a], arguments: {file: fix-b}}
          - {id: c, tool: flaky, depends_on: [b], arguments: {file: fix-c}}
          - {id: d, tool: once, depends_on: [c], arguments: {label: d}}
    """)
    r = proj.run("execute", "fragile", "--json")
    assert r.returncode == 1, r
    parent = r.json
    assert [s["status"] for s in parent["steps"]] == ["succeeded", "failed", "skipped",
                                                      "skipped"]
    assert parent["next"] == f"planrun retry {parent['run_id']}"

    proj.touch("fix-b")
    r = proj.run("retry", parent["run_id"][:8], "--json")
    assert r.returncode == 1, r  # c still fails
    child = r.json
    assert child["run_id"] != parent["run_id"]
    assert child["parent_run_id"] == parent["run_id"]
    assert child["root_run_id"] == parent["run_id"]
    steps = {s["id"]: s for s in child["steps"]}
    assert steps["a"]["status"] == "succeeded"
    assert steps["a"]["replayed"] is True
    assert steps["b"]["status"] == "succeeded"
    assert steps["b"]["replayed"] is False
    assert steps["c"]["status"] == "failed"
    assert steps["d"]["status"] == "skipped"

    proj.touch("fix-c")
    r = proj.run("retry", child["run_id"], "--json")
    assert r.returncode == 0, r
    grandchild = r.json
    assert grandchild["status"] == "completed"
    assert grandchild["parent_run_id"] == child["run_id"]
    assert grandchild["root_run_id"] == parent["run_id"]
    replayed = {s["id"]: s["replayed"] for s in grandchild["steps"]}
    assert replayed == {"a": True, "b": True, "c": False, "d": False}
    # a ran once; b and c once failing and once succeeding; d once.
    assert proj.counts() == {"a": 1, "b": 2, "c": 2, "d": 1}
    # The parents keep their own status; a retried run cannot be resumed.
    assert status(proj, parent["run_id"])["status"] == "failed"
    assert status(proj, child["run_id"])["status"] == "failed"
    refused(proj.run("retry", grandchild["run_id"], "--json"), "run_not_resumable")


def test_resolve_succeeded_output_feeds_dependents(proj: CliProject) -> None:
    proj.plan("feed", """
        planrun: 1
        goal: A step whose output a later step uses
        steps:
          - {id: a, tool: once, arguments: {label: a}}
          - {id: b, tool: once, depends_on: [a], arguments: {value: "{steps.a.output.token}"}}
    """)
    run_id = crash(proj, "feed", "dispatch:a")
    r = proj.run("resume", run_id, "--json")
    refused(r, "indeterminate")
    assert f"planrun resolve {run_id} a --succeeded" in r.json["error"]["hint"]
    assert proj.counts() == {}

    bad = proj.run("resolve", run_id, "a", "--succeeded", "--output", "{not json")
    assert bad.returncode == 2, bad
    r = proj.run("resolve", run_id, "a", "--succeeded", "--output",
                 '{"token": "from-operator"}', "--reason", "checked by hand", "--json")
    assert r.returncode == 0, r
    again = proj.run("resolve", run_id, "a", "--failed", "--json")
    assert again.returncode == 5, again  # already settled

    r = proj.run("resume", run_id, "--json")
    assert r.returncode == 0, r
    assert r.json["status"] == "completed"
    assert proj.counts() == {"b": 1}  # a was never called: a person settled it
    assert proj.calls("b")[0]["output"]["args"] == {"value": "from-operator"}
    out = proj.run("output", run_id, "a")
    assert out.returncode == 0, out
    assert json.loads(out.stdout) == {"token": "from-operator"}
    log = proj.run("log", run_id, "--json")
    resolved = [e for e in log.json if e["kind"] == "indeterminate_resolved"]
    assert [(e["step"], e["data"]["status"]) for e in resolved] == [("a", "succeeded")]


# --- leases and unlock ---------------------------------------------------------------------


def test_unlock_of_a_dead_local_holder_says_whose_lease_it_was(proj: CliProject) -> None:
    # a fresh interpreter: the lease names the pid of planrun itself, not a fork server's
    r = proj.run("execute", "chain", "--json", crash="outcome:a", real=True)
    assert r.returncode == -9, r
    killed = proj.procs[-1].pid
    (run_id,) = proj.probe().run_ids()
    lease = proj.probe().lease(run_id)
    owner = lease.owner if lease else None
    assert owner is not None
    assert owner.startswith(f"{socket.gethostname()}:")
    u = proj.run("unlock", run_id)
    assert u.returncode == 0, u
    assert run_id in u.stdout, u
    assert owner in u.stdout, u
    assert int(owner.split(":")[1]) == killed
    assert proj.probe().lease(run_id) is None
    u = proj.run("unlock", run_id, "--json")
    assert u.returncode == 0, u
    assert u.json == {"run_id": run_id, "released": False, "owner": None}
    r = proj.run("resume", run_id, "--json")
    assert r.returncode == 0, r


@pytest.mark.sqlite
def test_a_lease_held_on_another_host_needs_unlock(proj: CliProject) -> None:
    run_id = crash(proj, "chain", "outcome:a")
    # What a planrun on another machine sharing this journal would leave behind.
    holder = "elsewhere.invalid:4242:cafebabe"
    with closing(sqlite3.connect(proj.journal)) as conn:
        conn.execute("UPDATE runs SET lease_owner = ?, lease_expires = ? WHERE run_id = ?",
                     (holder, time.time() + 3600, run_id))
        conn.commit()
    r = proj.run("resume", run_id, "--json")
    refused(r, "run_busy")
    assert holder in r.stdout + r.stderr
    assert f"planrun unlock {run_id}" in r.stderr
    assert proj.run("resolve", run_id, "b", "--failed").returncode == 5
    ex = proj.run("resume", "--explain", "--json", run_id)
    assert ex.returncode == 0, ex
    assert ex.json["lease"]["owner"] == holder
    assert ex.json["lease"]["alive"] is None

    u = proj.run("unlock", run_id)
    assert u.returncode == 0, u
    assert holder in u.stdout, u
    r = proj.run("resume", run_id, "--json")
    assert r.returncode == 0, r
    assert proj.counts() == {"a": 1, "b": 1, "c": 1}


def test_unlock_refuses_a_live_local_holder(proj: CliProject) -> None:
    proj.plan("slow", """
        planrun: 1
        goal: A step that waits for a file
        steps:
          - {id: w, tool: wait, arguments: {file: go}}
    """)
    p = proj.start("execute", "slow", "--json")
    proj.wait_started("w", p)
    (run_id,) = proj.probe().run_ids()
    u = proj.run("unlock", run_id, "--json")
    refused(u, "run_busy")
    assert str(p.pid) in u.stderr
    proj.touch("go")
    done = proj.finish(p)
    assert done.returncode == 0, done
    assert proj.counts() == {"w": 1}


@pytest.mark.sqlite
def test_an_expired_lease_is_taken_over_even_if_its_pid_now_lives(proj: CliProject) -> None:
    """SPEC §7: an expired lease is taken over, whoever has the pid now.

    A live planrun renews its lease every LEASE_TTL_S / 3, so an expired lease whose pid
    is alive means that pid was reused (or the holder is stuck); refusing it would leave
    the run stuck for good (``unlock`` refuses a live local pid too).
    """
    run_id = crash(proj, "chain", "outcome:a")
    # The dead planrun's pid now belongs to an unrelated process, and its lease, never
    # renewed since the crash, expired a minute ago.
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                             start_new_session=True)
    try:
        holder = f"{socket.gethostname()}:{other.pid}:0badf00d"
        with closing(sqlite3.connect(proj.journal)) as conn:
            conn.execute("UPDATE runs SET lease_owner = ?, lease_expires = ? "
                         "WHERE run_id = ?", (holder, time.time() - 60, run_id))
            conn.commit()
        r = proj.run("resume", run_id, "--json")
        assert r.returncode == 0, r
        assert proj.counts() == {"a": 1, "b": 1, "c": 1}
    finally:
        other.kill()
        other.wait()


def test_resume_keeps_a_partial_step_and_does_not_call_its_failed_items(
        proj: CliProject) -> None:
    # issue 17: a partial fan-out is finished; resume replays it (and its facets) as it is
    proj.plan("partial", """
        planrun: 1
        goal: A fan-out that ends partial, then a step the run dies at
        steps:
          - id: f
            tool: flaky
            for_each: [fix-0, fix-1]
            on_item_error: skip
            arguments: {file: "{item}"}
            facets: {counts: {ok: "."}}
          - id: after
            tool: idem
            depends_on: [f]
            when: steps.f.facets.ok == 1
            arguments: {label: after}
    """)
    proj.touch("fix-0")
    run_id = crash(proj, "partial", "dispatch:after")
    assert {s["id"]: s["status"] for s in status(proj, run_id)["steps"]} == {
        "f": "partial", "after": "running"}
    proj.touch("fix-1")  # resume does not call the failed item again, even now
    explained = proj.run("resume", "--explain", run_id, "--json")
    assert [s["action"] for s in explained.json["steps"]] == ["replay", "run"]
    r = proj.run("resume", run_id, "--json")
    assert r.returncode == 0, r  # a run with a partial step is completed
    steps = {s["id"]: s for s in r.json["steps"]}
    assert (steps["f"]["status"], steps["after"]["status"]) == ("partial", "succeeded")
    assert proj.counts() == {"f#0": 1, "f#1": 1, "after": 1}
    assert r.json["next"] == f"planrun retry {run_id}"
    r = proj.run("retry", run_id, "--json")  # retry does call the failed item again
    assert r.returncode == 0, r
    steps = {s["id"]: s for s in r.json["steps"]}
    assert steps["f"]["status"] == "succeeded"
    assert steps["f"]["facets"] == {"ok": 2}
    assert steps["after"]["status"] == "skipped"  # its condition reads ok == 2 now
    assert proj.counts() == {"f#0": 1, "f#1": 2, "after": 1}


def test_collect_keeps_failed_items_as_error_objects_on_each_journal(
        proj: CliProject) -> None:
    proj.plan("collect", """
        planrun: 1
        goal: Keep every item, failed ones as error objects
        steps:
          - id: f
            tool: flaky
            for_each: [fix-0, fix-1, fix-2]
            on_item_error: collect
            arguments: {file: "{item}"}
    """)
    proj.touch("fix-1")
    r = proj.run("execute", "collect", "--json")
    assert r.returncode == 0, r
    assert [e["index"] for e in r.json["steps"][0]["item_errors"]] == [0, 2]
    out = proj.run("output", r.json["run_id"], "f").json
    assert [sorted(o) for o in out] == [["item_error"], ["args", "effect"], ["item_error"]]
    assert out[2]["item_error"] == {"index": 2, "code": "tool_error",
                                    "message": "RuntimeError: fix-2 is not there yet"}


# --- a failure stops the run, also after a crash (found by an attacker) ---------------------


def test_resume_after_a_crash_in_a_cleanup_step_still_stops_for_the_failure(
        proj: CliProject) -> None:
    """A run stopped by a failure runs only its clean-up steps. Killed in the clean-up
    step, ``resume`` forgot the failure and ran ``after`` too, a step the run that never
    crashed skips as ``stopped`` (found by an attacker)."""
    proj.plan("cleanup", """
        planrun: 1
        goal: Fail, clean up, and nothing else
        steps:
          - {id: bad, tool: flaky, arguments: {file: never-there}}
          - {id: cleanup, tool: idem, depends_on: [bad], run_if: always,
             arguments: {label: cleanup}}
          - {id: after, tool: once, depends_on: [cleanup], arguments: {label: after}}
    """)
    whole = proj.run("execute", "cleanup", "--json")
    assert whole.returncode == 1, whole
    expected = {s["id"]: (s["status"], (s.get("error") or {}).get("code"))
                for s in whole.json["steps"]}
    assert expected["after"] == ("skipped", "stopped"), expected
    proj.effects.unlink()
    run_id = crash(proj, "cleanup", "call:cleanup")
    r = proj.run("resume", run_id, "--json")
    assert r.returncode == 1, r
    got = {s["id"]: (s["status"], (s.get("error") or {}).get("code"))
           for s in r.json["steps"]}
    assert got == expected
    assert proj.counts() == {"bad": 1, "cleanup": 2}  # cleanup again (idempotent); after never


def test_resume_after_resolve_failed_stops_as_the_failure_would_have(
        proj: CliProject) -> None:
    """A step settled ``--failed`` fails the run: resume starts no other ordinary step
    (it started them all, found by an attacker), only the clean-up steps."""
    proj.plan("settled", """
        planrun: 1
        goal: A step whose effect is unknown, settled as failed
        steps:
          - {id: a, tool: once, arguments: {label: a}}
          - {id: b, tool: once, arguments: {label: b}}
          - {id: notify, tool: idem, depends_on: [a, b], run_if: failure,
             arguments: {label: notify}}
    """)
    run_id = crash(proj, "settled", "dispatch:a", "--max-parallel", "1")
    r = proj.run("resolve", run_id, "a", "--failed", "--reason", "it did not happen")
    assert r.returncode == 0, r
    r = proj.run("resume", run_id, "--json")
    assert r.returncode == 1, r
    got = {s["id"]: (s["status"], (s.get("error") or {}).get("code"))
           for s in r.json["steps"]}
    assert got["b"] == ("skipped", "stopped"), got
    assert got["notify"] == ("succeeded", None), got
    assert proj.counts() == {"notify": 1}
