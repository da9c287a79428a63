"""``dedupe: run | plan`` and ``dedupe_ttl`` (issue #17, part 5), through the real CLI.

A ``dedupe: plan`` tool's idempotency key leaves out the root run id, so a later run of
the same plan replays what an earlier run did (``replayed: true``, no call: the effects
log proves it); ``dedupe: run`` (the default) runs again in every run; an expired key
(older than ``dedupe_ttl``) runs again. Registry errors are ``registry``, exit 3.
Runs on each journal backend (SQLite; PostgreSQL where a server is installed).
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import pytest

from planrun_cli import CliProject

TOOLS = """
tools:
  nightly:
    description: Today's work (an effect that must happen once a day)
    python: crashtools:record
    dedupe: {DEDUPE}
    {TTL}
    key_arguments: [day]
    arguments:
      type: object
      properties:
        day: {type: string}
        note: {type: string}
      required: [day]
      additionalProperties: false
  after:
    description: Something after it
    python: crashtools:record
    arguments:
      type: object
      properties:
        label: {type: string}
      additionalProperties: false
"""

PLAN = """
planrun: 1
name: nightly
goal: Do today's work once
params:
  day: {type: string}
steps:
  - {id: work, tool: nightly, arguments: {day: "{params.day}", note: "{params.day} run"}}
  - {id: then, tool: after, depends_on: [work], arguments: {label: then}}
"""


def _project(cli: CliProject, dedupe: str, ttl: str = "") -> CliProject:
    cli.tools(TOOLS.replace("{DEDUPE}", dedupe).replace("{TTL}", ttl))
    cli.plan("nightly", PLAN)
    return cli


def _execute(cli: CliProject, day: str = "2026-12-01", **kw: str) -> dict[str, object]:
    r = cli.run("execute", "nightly", "-p", f"day={day}", "--json", **kw)
    assert r.returncode == 0, r
    manifest: dict[str, object] = r.json
    return manifest


def _step(manifest: dict[str, object], sid: str) -> dict[str, object]:
    steps = manifest["steps"]
    assert isinstance(steps, list)
    (found,) = [s for s in steps if s["id"] == sid]
    assert isinstance(found, dict)
    return found


@pytest.fixture
def proj(journal_location: object, cli: CliProject) -> CliProject:
    """A project journaled on each backend."""
    return cli


def test_plan_scope_replays_an_earlier_runs_call_in_a_fresh_run(proj: CliProject) -> None:
    _project(proj, "plan")
    first = _execute(proj)
    second = _execute(proj)
    assert first["run_id"] != second["run_id"]
    work = _step(second, "work")
    assert work["status"] == "succeeded"
    assert work["replayed"] is True
    outputs = [proj.run("output", str(m["run_id"]), "work") for m in (first, second)]
    assert outputs[0].returncode == 0, outputs[0]
    assert json.loads(outputs[1].stdout) == json.loads(outputs[0].stdout)
    assert json.loads(outputs[0].stdout)["args"]["day"] == "2026-12-01"
    assert _step(second, "then")["replayed"] is False  # a dedupe: run tool: runs again
    assert proj.counts() == {"work": 1, "then": 2}


def test_plan_scope_keys_differ_by_key_arguments(proj: CliProject) -> None:
    _project(proj, "plan")
    _execute(proj, day="2026-12-01")
    other = _execute(proj, day="2026-12-02")
    assert _step(other, "work")["replayed"] is False
    assert proj.counts() == {"work": 2, "then": 2}


def test_plan_scope_after_a_crashed_run_does_not_do_the_work_again(proj: CliProject) -> None:
    _project(proj, "plan")
    # The crashed nightly run did today's work, then died as `then` was dispatched.
    r = proj.run("execute", "nightly", "-p", "day=2026-12-01", "--json",
                 crash="dispatch:then")
    assert r.returncode == -9, r
    assert proj.counts() == {"work": 1}
    fresh = _execute(proj)  # a fresh run the next minute, not a resume
    assert _step(fresh, "work")["replayed"] is True
    assert fresh["status"] == "completed"
    assert proj.counts() == {"work": 1, "then": 1}


def test_plan_scope_after_a_crash_inside_the_call_asks_a_person_first(
        proj: CliProject) -> None:
    """The crashed run died inside the call (its effect happened, its outcome was never
    written): a fresh run took the key over and did the work again (found by an attacker).
    The tool is not idempotent: the fresh run stops until that call is settled."""
    _project(proj, "plan")
    r = proj.run("execute", "nightly", "-p", "day=2026-12-01", "--json", crash="call:work")
    assert r.returncode == -9, r
    assert proj.counts() == {"work": 1}
    (crashed,) = proj.probe().run_ids()
    fresh = proj.run("execute", "nightly", "-p", "day=2026-12-01", "--json")
    assert fresh.returncode == 5, fresh
    assert fresh.error_code == "indeterminate", fresh
    assert f"planrun resolve {crashed} work" in fresh.json["error"]["hint"], fresh
    assert proj.counts() == {"work": 1}
    # Settled as succeeded: the fresh run replays it and goes on.
    assert proj.run("resolve", crashed, "work", "--succeeded").returncode == 0
    done = proj.run("resume", fresh.json["error"]["run_id"], "--json")
    assert done.returncode == 0, done
    assert _step(done.json, "work")["replayed"] is True
    assert proj.counts() == {"work": 1, "then": 1}


def test_run_scope_is_the_default_and_runs_again_in_every_run(proj: CliProject) -> None:
    _project(proj, "run")
    _execute(proj)
    second = _execute(proj)
    assert _step(second, "work")["replayed"] is False
    assert proj.counts() == {"work": 2, "then": 2}
    proj.tools(TOOLS.replace("    dedupe: {DEDUPE}\n", "").replace("{TTL}", ""))
    third = _execute(proj)
    assert _step(third, "work")["replayed"] is False
    assert proj.counts() == {"work": 3, "then": 3}


def _age_keys(cli: CliProject, seconds: float) -> int:
    """Make step ``work``'s succeeded key ``seconds`` old (its time: RFC 3339 UTC text)."""
    from planrun.journal import Journal

    then = (datetime.now(UTC) - timedelta(seconds=seconds)).isoformat(
        timespec="milliseconds")
    with Journal(cli.journal, write=True) as j, j._write() as c:
        return int(c.execute("UPDATE idempotency_keys SET finished_at = ? "
                             "WHERE status = 'succeeded' AND step_id = 'work'", (then,)).rowcount)


def test_an_expired_key_is_not_replayed(proj: CliProject) -> None:
    _project(proj, "plan", ttl="dedupe_ttl: 3600")
    _execute(proj)
    assert _age_keys(proj, 1800) == 1  # half an hour old: still replayed
    assert _step(_execute(proj), "work")["replayed"] is True
    assert proj.counts() == {"work": 1, "then": 2}
    assert _age_keys(proj, 7200) == 1  # two hours old: expired, the call runs again
    again = _execute(proj)
    assert _step(again, "work")["replayed"] is False
    assert proj.counts() == {"work": 2, "then": 3}
    # ... and that new success is replayed while it is young.
    assert _step(_execute(proj), "work")["replayed"] is True
    assert proj.counts() == {"work": 2, "then": 4}


def test_an_expired_key_by_the_clock(proj: CliProject) -> None:
    _project(proj, "plan", ttl="dedupe_ttl: 1")
    _execute(proj)
    time.sleep(1.2)
    assert _step(_execute(proj), "work")["replayed"] is False
    assert proj.counts() == {"work": 2, "then": 2}


def test_a_young_key_is_replayed_with_a_duration_ttl(proj: CliProject) -> None:
    _project(proj, "plan", ttl="dedupe_ttl: 12h")
    _execute(proj)
    _age_keys(proj, 11 * 3600)
    second = _execute(proj)
    assert _step(second, "work")["replayed"] is True
    assert proj.counts() == {"work": 1, "then": 2}


BAD = [
    ("key_arguments: [when]", "/tools/nightly/key_arguments/0",
     "key argument 'when' is not a declared argument"),
    ("key_arguments: [note]", "/tools/nightly/key_arguments/0",
     "key argument 'note' is not required"),
    ("dedupe: run\n    dedupe_ttl: 60", "/tools/nightly/dedupe_ttl",
     "'dedupe_ttl' applies to 'dedupe: plan' only"),
    ("dedupe: plan\n    dedupe_ttl: 1.5h", "/tools/nightly/dedupe_ttl",
     "dedupe_ttl '1.5h' is not a duration"),
    ("dedupe: plan\n    dedupe_ttl: 0", "/tools/nightly/dedupe_ttl", "is not a duration"),
    ("dedupe: plan\n    dedupe_ttl: true", "/tools/nightly/dedupe_ttl", "valid number"),
    ("dedupe: always", "/tools/nightly/dedupe", "dedupe"),
]


@pytest.mark.parametrize(("fields", "ptr", "words"), BAD)
def test_registry_errors(cli: CliProject, fields: str, ptr: str, words: str) -> None:
    tools = TOOLS.replace("    dedupe: {DEDUPE}\n    {TTL}\n    key_arguments: [day]\n",
                          f"    {fields}\n")
    assert tools != TOOLS
    cli.tools(tools)
    cli.plan("nightly", PLAN)
    r = cli.run("validate", "--format", "json")
    assert r.returncode == 3, r
    report = json.loads(r.stdout)
    issues = report["issues"]
    # one issue (a value that is neither a number nor text: one per type it is not)
    assert len(issues) == (2 if fields.endswith("true") else 1), issues
    assert {(i["code"], i["path"]) for i in issues} == {("registry", ptr)}
    assert any(words in i["message"] for i in issues), issues
    assert all(i["line"] is not None for i in issues), issues
    # execute refuses it too, before any call
    r = cli.run("execute", "nightly", "-p", "day=d")
    assert r.returncode == 3, r
    assert "registry" in r.stdout + r.stderr
    assert proj_counts(cli) == 0


def proj_counts(cli: CliProject) -> int:
    """How many effects the project's tools had."""
    return sum(cli.counts().values())


WAITING = """
tools:
  hold:
    description: Waits for a file, then has its effect (not idempotent)
    python: crashtools:wait
    dedupe: plan
    arguments:
      type: object
      properties:
        file: {type: string}
      required: [file]
      additionalProperties: false
"""


def test_a_second_run_never_calls_a_plan_key_a_live_run_is_calling(proj: CliProject) -> None:
    proj.tools(WAITING)
    proj.plan("hold", """
        planrun: 1
        goal: Hold inside a plan-scoped call
        steps:
          - {id: w, tool: hold, arguments: {file: go}}
    """)
    first = proj.start("execute", "hold", "--json", name="first")
    proj.wait_started("w", first)
    second = proj.run("execute", "hold", "--json")
    assert second.returncode == 5, second
    assert "run_busy" in second.stdout + second.stderr, second
    proj.touch("go")
    assert proj.finish(first).returncode == 0
    assert proj.counts() == {"w": 1}
    # The refused run is resumable and then replays the first run's call.
    runs = [r for r in proj.probe().run_ids() if r != json.loads(
        proj.finish(first).stdout)["run_id"]]
    (refused,) = runs
    r = proj.run("resume", refused, "--json")
    assert r.returncode == 0, r
    assert _step(r.json, "w")["replayed"] is True
    assert proj.counts() == {"w": 1}
