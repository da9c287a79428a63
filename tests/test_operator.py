"""Issue 10: the nightly job works unattended, and the operator's commands fit their habits.

Everything here goes through the real ``planrun`` process (``python -m planrun``) in a
project folder written by the test.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness import move_run_back, run_planrun

ROOT = Path(__file__).resolve().parents[1]

GRANT_TOML = """\
[policy.classes.cleanup]
tools = ["prune_backups"]
level = "act"

[[policy.grants]]
id = "nightly-prune"
class = "cleanup"
arguments = {type = "object", properties = {keep = {type = "integer", minimum = 3}}}
expires = 2099-12-31T00:00:00Z
granted_by = "ops@example.com"
"""


def run(cwd: Path, *args: str, env: dict[str, str] | None = None,
        stdin: Any = subprocess.DEVNULL, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``planrun ARGS`` in ``cwd`` (no terminal)."""
    return run_planrun(*args, cwd=cwd, env=env or dict(os.environ), stdin=stdin,
                       timeout=timeout)


def backup_project(base: Path, *, runtime_dest: bool = False) -> Path:
    """This repository's project in ``base/app`` with a grant for prune.

    ``runtime_dest``: prune's ``dest`` comes from ``{steps.prepare.output.dest}`` (known only
    at run time), as the plan shipped before issue 10.
    """
    app = base / "app"
    app.mkdir(parents=True)
    for name in ("tools.yaml", "backup_tools.py", "tree_tools.py"):
        shutil.copy(ROOT / name, app / name)
    shutil.copytree(ROOT / "plans", app / "plans")
    if runtime_dest:
        plan = app / "plans" / "nightly-backup.yaml"
        text = plan.read_text(encoding="utf-8")
        assert 'dest: "{params.dest}"\n      keep' in text
        plan.write_text(text.replace('dest: "{params.dest}"\n      keep',
                                     'dest: "{steps.prepare.output.dest}"\n      keep'),
                        encoding="utf-8")
    (app / "planrun.toml").write_text(GRANT_TOML, encoding="utf-8")
    data = base / "data"
    data.mkdir()
    (data / "f.txt").write_text("x\n", encoding="utf-8")
    return app


# --- bug 1: a step no grant can ever clear --------------------------------------------------


def test_static_checks_warn_when_no_grant_can_ever_clear_a_step(tmp_path: Path) -> None:
    app = backup_project(tmp_path, runtime_dest=True)
    params = ["-p", f"source={tmp_path / 'data'}", "-p", f"dest={tmp_path / 'b'}"]
    for args in (["policy", "check", "--strict"], ["validate", "--strict", "nightly-backup"]):
        proc = run(app, *args)
        assert proc.returncode == 3, proc
        assert "warning[ungrantable]" in proc.stdout
        assert "'prune'" in proc.stdout
        assert "nightly-prune" in proc.stdout
    # Without --strict it is a warning, not a failure.
    assert run(app, "policy", "check").returncode == 0
    for args in (["show", "nightly-backup"], ["execute", "nightly-backup", *params,
                                              "--dry-run"]):
        proc = run(app, *args)
        assert proc.returncode == 0, proc
        assert "warning[ungrantable]" in proc.stderr, proc
    shown = json.loads(run(app, "show", "nightly-backup", "--json").stdout)
    assert [w["code"] for w in shown["warnings"]] == ["ungrantable"]


def test_no_warning_without_a_grant_or_with_arguments_known_before_the_run(
        tmp_path: Path) -> None:
    app = backup_project(tmp_path)
    proc = run(app, "validate", "--strict")
    assert proc.returncode == 0, proc
    assert "ungrantable" not in proc.stdout
    # A runtime argument but no grant and no act class: no warning (a person clears it).
    bare = backup_project(tmp_path / "bare", runtime_dest=True)
    (bare / "planrun.toml").write_text("[policy]\nrequire_approval = []\n", encoding="utf-8")
    proc = run(bare, "validate", "--strict", "nightly-backup")
    assert proc.returncode == 0, proc


def test_shipped_plan_runs_unattended_under_a_grant(tmp_path: Path) -> None:
    app = backup_project(tmp_path)
    proc = run(app, "execute", "nightly-backup", "-p", f"source={tmp_path / 'data'}",
               "-p", "dest=backups", "--json")
    assert proc.returncode == 0, proc
    manifest = json.loads(proc.stdout)
    assert {s["id"]: s["approved_by"] for s in manifest["steps"]}["prune"] == "nightly-prune"
    assert len(list((app / "backups").glob("backup-*.tar.gz"))) == 1


def test_runtime_dest_with_approve_resolved_runs_unattended_under_the_grant(
        tmp_path: Path) -> None:
    # Issue 17: prune's dest from prepare's output (known only at run time) and
    # ``approve: resolved``: the grant checks the resolved values at dispatch.
    app = backup_project(tmp_path, runtime_dest=True)
    plan = app / "plans" / "nightly-backup.yaml"
    text = plan.read_text(encoding="utf-8")
    marker = "    depends_on: [manifest]\n"
    assert marker in text
    plan.write_text(text.replace(marker, marker + "    approve: resolved\n"), encoding="utf-8")
    assert "ungrantable" not in run(app, "validate", "--strict").stdout
    proc = run(app, "execute", "nightly-backup", "-p", f"source={tmp_path / 'data'}",
               "-p", "dest=backups", "--json")
    assert proc.returncode == 0, proc
    manifest = json.loads(proc.stdout)
    assert {s["id"]: s["approved_by"] for s in manifest["steps"]}["prune"] == "nightly-prune"
    # keep outside the grant: the run waits for a person, the archive is already made
    proc = run(app, "execute", "nightly-backup", "-p", f"source={tmp_path / 'data'}",
               "-p", "dest=backups", "-p", "keep=2", "--json")
    assert proc.returncode == 4, proc
    waiting = json.loads(proc.stdout)
    assert waiting["status"] == "awaiting_approval"
    assert [w["step"] for w in waiting["approval"]["waiting"]] == ["prune"]
    assert len(list((app / "backups").glob("backup-*.tar.gz"))) == 2


# --- bug 2: why a grant did not apply ------------------------------------------------------


def test_approval_required_says_why_the_grant_did_not_apply(tmp_path: Path) -> None:
    app = backup_project(tmp_path, runtime_dest=True)
    params = ["-p", f"source={tmp_path / 'data'}", "-p", f"dest={tmp_path / 'b'}"]
    proc = run(app, "execute", "nightly-backup", *params)
    assert proc.returncode == 4, proc
    assert "error[approval_required]" in proc.stderr
    assert "grant 'nightly-prune' cannot check arguments only known at run time" in proc.stderr
    assert "give a policy grant that covers them" not in proc.stderr
    assert "ops@example.com" not in proc.stderr  # the details are for -v
    verbose = run(app, "execute", "nightly-backup", *params, "-v")
    assert verbose.returncode == 4
    assert "grant nightly-prune (class cleanup" in verbose.stderr
    assert '"dest": "{steps.prepare.output.dest}"' in verbose.stderr
    # Arguments outside the grant: the reason is the schema's.
    app2 = backup_project(tmp_path / "two")
    proc = run(app2, "execute", "nightly-backup", "-p", f"source={tmp_path / 'data'}",
               "-p", "dest=b", "-p", "keep=2")
    assert proc.returncode == 4
    assert "arguments leave grant 'nightly-prune': 2 is less than the minimum of 3" in proc.stderr


def test_approval_required_without_grants_still_suggests_one(tmp_path: Path) -> None:
    app = backup_project(tmp_path)
    (app / "planrun.toml").unlink()
    proc = run(app, "execute", "nightly-backup", "-p", f"source={tmp_path / 'data'}",
               "-p", "dest=b")
    assert proc.returncode == 4
    assert "give a policy grant that covers them" in proc.stderr


# --- a small project of our own --------------------------------------------------------------

OPS_TOOLS = """\
tools:
  say:
    python: opstools:say
    arguments: {type: object, properties: {text: {type: string}}, required: [text],
                additionalProperties: false}
    idempotent: true
  wait_for:
    python: opstools:wait_for
    arguments: {type: object, properties: {path: {type: string}}, required: [path],
                additionalProperties: false}
    idempotent: true
  wipe:
    python: opstools:say
    irreversible: true
    arguments: {type: object, properties: {text: {type: string}}, required: [text],
                additionalProperties: false}
"""

OPS_MODULE = '''\
import os
import time


def say(text):
    return {"said": text}


def wait_for(path):
    # Signals that it started, then waits until the test creates `path`.
    open(path + ".started", "w").close()
    while not os.path.exists(path):
        time.sleep(0.05)
    return "done"
'''

HELLO = """\
planrun: 1
goal: Say hello and wipe
params:
  who: {type: string, default: world}
steps:
  - id: hello
    tool: say
    arguments: {text: "hello {params.who}"}
  - id: publish
    tool: wipe
    depends_on: [hello]
    arguments: {text: "{steps.hello.output.said}"}
"""

WAIT = """\
planrun: 1
goal: Wait for a file
params:
  path: {type: string}
steps:
  - id: first
    tool: say
    arguments: {text: one}
  - id: wait
    tool: wait_for
    depends_on: [first]
    arguments: {path: "{params.path}"}
"""


def ops_project(folder: Path) -> Path:
    """A project with tools say / wait_for / wipe and plans hello and wait."""
    (folder / "plans").mkdir(parents=True)
    (folder / "tools.yaml").write_text(OPS_TOOLS, encoding="utf-8")
    (folder / "opstools.py").write_text(OPS_MODULE, encoding="utf-8")
    (folder / "plans" / "hello.yaml").write_text(HELLO, encoding="utf-8")
    (folder / "plans" / "wait.yaml").write_text(WAIT, encoding="utf-8")
    (folder / "planrun.toml").write_text("", encoding="utf-8")
    return folder


def killed_waiting_run(project: Path, gate: Path) -> None:
    """:func:`start_waiting_run`, SIGKILLed mid-call (and reaped): a run nobody drives."""
    proc = start_waiting_run(project, gate)
    proc.kill()
    proc.communicate(timeout=60)


def start_waiting_run(project: Path, gate: Path) -> subprocess.Popen[str]:
    """``planrun execute wait`` in the background, returned once its tool is running."""
    proc = subprocess.Popen([sys.executable, "-m", "planrun", "execute", "wait", "-p",
                             f"path={gate}", "--json"], cwd=project, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started = Path(str(gate) + ".started")
    for _ in range(1200):
        if started.exists() or proc.poll() is not None:
            break
        import time
        time.sleep(0.05)
    assert started.exists(), proc.communicate()
    return proc


# --- status / log / output default to the latest run, and `last` -----------------------------


def test_status_log_output_default_to_the_latest_run(tmp_path: Path) -> None:
    app = ops_project(tmp_path / "app")
    first = json.loads(run(app, "execute", "hello", "-p", "who=a", "--approve", "publish",
                           "--json").stdout)["run_id"]
    second = json.loads(run(app, "execute", "hello", "-p", "who=b", "--approve", "publish",
                            "--json").stdout)["run_id"]
    assert first != second
    for args in ([], ["last"]):
        status = run(app, "status", *args, "--json")
        assert status.returncode == 0, status
        assert json.loads(status.stdout)["run_id"] == second
        log = run(app, "log", *args, "--json")
        assert log.returncode == 0, log
        assert json.loads(log.stdout)[-1]["kind"] == "run_finished"
    for args in (["hello"], ["last", "hello"], [second[:6], "hello"]):
        out = run(app, "output", *args)
        assert out.returncode == 0, out
        assert json.loads(out.stdout) == {"said": "hello b"}
    assert json.loads(run(app, "output", first, "hello").stdout) == {"said": "hello a"}
    # Another project sharing the journal has no run yet: `last` says so, exit 5.
    other = ops_project(tmp_path / "other")
    none = run(other, "status")
    assert none.returncode == 5
    assert "error[unknown_run]" in none.stderr
    assert "runs --all" in none.stderr


# --- planrun plans ----------------------------------------------------------------------------


def test_plans_lists_name_revision_goal_steps_and_approvals(tmp_path: Path) -> None:
    app = ops_project(tmp_path / "app")
    (app / "plans" / "broken.yaml").write_text("planrun: 1\ngoal: x\nsteps: []\n",
                                               encoding="utf-8")
    res = run(app, "plans")
    assert res.returncode == 0, res
    assert "hello  r1  2 step(s)  needs approval: publish" in res.stdout
    assert "Say hello and wipe" in res.stdout
    assert "broken" in res.stdout
    assert "refused" in res.stdout
    rows = {r["name"]: r for r in json.loads(run(app, "plans", "--json").stdout)}
    assert rows["hello"]["needs_approval"] == ["publish"]
    assert rows["wait"] == {"name": "wait", "file": "plans/wait.yaml", "revision": 1,
                            "goal": "Wait for a file", "steps": 2, "needs_approval": [],
                            "ok": True, "issues": 0}
    assert rows["broken"]["ok"] is False


# --- runs: the project, this project's runs by default, --all ---------------------------------


def test_runs_show_the_project_and_filter_to_this_one(tmp_path: Path) -> None:
    one = ops_project(tmp_path / "one")
    two = ops_project(tmp_path / "two")
    a = json.loads(run(one, "execute", "wait", "-p", "path=/", "--json").stdout)["run_id"]
    b = json.loads(run(two, "execute", "wait", "-p", "path=/", "--json").stdout)["run_id"]
    here = run(one, "runs")
    assert a in here.stdout
    assert b not in here.stdout
    assert str(one.resolve()) in here.stdout
    every = run(one, "runs", "--all", "--json")
    projects = {r["run_id"]: r["project"] for r in json.loads(every.stdout)}
    assert projects == {a: str(one.resolve()), b: str(two.resolve())}
    text = run(two, "runs", "--all").stdout
    assert str(one.resolve()) in text
    assert str(two.resolve()) in text
    # -C names the project from anywhere.
    assert b in run(tmp_path, "-C", str(two), "runs").stdout


# --- journal upkeep: prune and forget ---------------------------------------------------------


def _journal_counts(journal: Path, run_id: str) -> dict[str, int]:
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(journal)) as conn:
        return {table: conn.execute(f"SELECT count(*) FROM {table} WHERE run_id = ?",
                                    (run_id,)).fetchone()[0]
                for table in ("runs", "steps", "events", "approvals", "idempotency_keys")}


def test_forget_deletes_a_run_and_its_keys(tmp_path: Path) -> None:
    app = ops_project(tmp_path / "app")
    journal = Path(os.environ["PLANRUN_JOURNAL"])
    run_id = json.loads(run(app, "execute", "hello", "--approve", "publish",
                            "--json").stdout)["run_id"]
    kept = json.loads(run(app, "execute", "hello", "--approve", "publish",
                          "--json").stdout)["run_id"]
    before = _journal_counts(journal, run_id)
    assert before["idempotency_keys"] > 0
    assert before["approvals"] > 0
    res = run(app, "forget", run_id[:8])
    assert res.returncode == 0, res
    assert f"deleted run {run_id}" in res.stdout
    assert set(_journal_counts(journal, run_id).values()) == {0}
    assert _journal_counts(journal, kept)["runs"] == 1
    gone = run(app, "status", run_id)
    assert gone.returncode == 5
    assert "unknown_run" in gone.stderr
    assert run(app, "forget", run_id).returncode == 5


@pytest.mark.sqlite
def test_prune_deletes_old_runs_by_age_status_and_plan(tmp_path: Path) -> None:
    import sqlite3
    from contextlib import closing

    app = ops_project(tmp_path / "app")
    other = ops_project(tmp_path / "other")
    journal = Path(os.environ["PLANRUN_JOURNAL"])
    old_done = json.loads(run(app, "execute", "wait", "-p", "path=/", "--json").stdout)
    old_denied = run(app, "execute", "hello", "--json")  # exit 4: denied (no terminal)
    assert old_denied.returncode == 4
    old_other = json.loads(run(other, "execute", "wait", "-p", "path=/", "--json").stdout)
    new = json.loads(run(app, "execute", "wait", "-p", "path=/", "--json").stdout)
    with closing(sqlite3.connect(journal)) as conn, conn:
        conn.execute("UPDATE runs SET created_at = '2020-01-01T00:00:00.000+00:00' "
                     "WHERE run_id != ?", (new["run_id"],))
    assert run(app, "prune", "--older-than", "thirty").returncode == 2
    dry = run(app, "prune", "--older-than", "30d", "--dry-run", "--json")
    assert dry.returncode == 0, dry
    assert len(json.loads(dry.stdout)["deleted"]) == 2  # this project's two old runs
    only_failed = run(app, "prune", "--older-than", "30d", "--status", "denied", "--json")
    assert len(json.loads(only_failed.stdout)["deleted"]) == 1
    res = run(app, "prune", "--older-than", "30d", "--plan", "wait")
    assert res.returncode == 0, res
    assert old_done["run_id"] in res.stdout
    assert "1 run(s) deleted" in res.stdout
    listed = [r["run_id"] for r in json.loads(run(app, "runs", "--all", "--json").stdout)]
    assert listed == [new["run_id"], old_other["run_id"]]
    res = run(app, "prune", "--older-than", "30d", "--all")
    assert old_other["run_id"] in res.stdout
    assert [r["run_id"] for r in json.loads(run(app, "runs", "--all", "--json").stdout)] == [
        new["run_id"]]


@pytest.mark.sqlite
def test_forget_and_prune_refuse_a_run_a_live_process_drives(tmp_path: Path) -> None:
    import sqlite3
    from contextlib import closing

    app = ops_project(tmp_path / "app")
    gate = tmp_path / "gate"
    proc = start_waiting_run(app, gate)
    try:
        run_id = json.loads(run(app, "runs", "--json").stdout)[0]["run_id"]
        res = run(app, "forget", run_id)
        assert res.returncode == 5, res
        assert "error[run_busy]" in res.stderr
        journal = Path(os.environ["PLANRUN_JOURNAL"])
        with closing(sqlite3.connect(journal)) as conn, conn:
            conn.execute("UPDATE runs SET created_at = '2020-01-01T00:00:00.000+00:00'")
        res = run(app, "prune", "--older-than", "1d")  # unfinished: kept, not tried
        assert res.returncode == 0, res
        assert "kept 1 unfinished run(s)" in res.stdout
        res = run(app, "prune", "--older-than", "1d", "--status", "running")
        assert res.returncode == 5, res
        assert "error[run_busy]" in res.stderr
        assert _journal_counts(journal, run_id)["runs"] == 1
    finally:
        gate.touch()
        proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert run(app, "forget", run_id).returncode == 0


@pytest.mark.sqlite
def test_prune_keeps_an_unfinished_run_unless_its_status_is_named(tmp_path: Path) -> None:
    """A run killed mid-call may hold a call of unknown effect: ``prune --older-than`` keeps
    it (found by a fresh user: the dry run listed dead runs whose step was never settled).
    """
    import sqlite3
    from contextlib import closing

    app = ops_project(tmp_path / "app")
    gate = tmp_path / "gate"
    killed_waiting_run(app, gate)  # the run stays running, its step unsettled
    dead = json.loads(run(app, "runs", "--json").stdout)[0]
    assert dead["status"] == "running"
    done = json.loads(run(app, "execute", "hello", "--approve", "publish", "--json").stdout)
    journal = Path(os.environ["PLANRUN_JOURNAL"])
    with closing(sqlite3.connect(journal)) as conn, conn:
        conn.execute("UPDATE runs SET created_at = '2020-01-01T00:00:00.000+00:00', "
                     "lease_expires = 0")
    dry = json.loads(run(app, "prune", "--older-than", "30d", "--dry-run", "--json").stdout)
    assert dry["deleted"] == [done["run_id"]]
    assert dry["kept_unfinished"] == [dead["run_id"]]
    assert dry["runs"][0]["status"] == "completed"
    res = run(app, "prune", "--older-than", "30d")
    assert res.returncode == 0, res
    assert f"deleted {done['run_id']}  completed  hello" in res.stdout
    assert f"kept 1 unfinished run(s) ({dead['run_id']})" in res.stdout
    assert _journal_counts(journal, dead["run_id"])["runs"] == 1
    res = run(app, "prune", "--older-than", "30d", "--status", "running")
    assert res.returncode == 0, res
    assert _journal_counts(journal, dead["run_id"])["runs"] == 0


def test_status_and_runs_say_when_nobody_drives_a_running_run(tmp_path: Path) -> None:
    """A run whose process died is still ``running`` in the journal (SPEC §7): status and
    runs say that nobody drives it, and the counts show its running step (found by a fresh
    user: "running — 0/2 succeeded, 1 pending" read like a live run)."""
    app = ops_project(tmp_path / "app")
    gate = tmp_path / "gate"
    proc = start_waiting_run(app, gate)
    try:
        alive = json.loads(run(app, "status", "--json").stdout)
        assert alive["status"] == "running"
        assert alive["driven"] is True
        assert "nobody drives it" not in run(app, "status").stdout
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    dead = json.loads(run(app, "status", "--json").stdout)
    assert dead["driven"] is False
    assert dead["counts"]["running"] == 1
    text = run(app, "status").stdout
    assert "running (nobody drives it: its process is gone)" in text
    # its step counted as its line says it: nothing runs it (the headline said "1
    # running" above "unfinished wait"; found by a fresh operator)
    assert "1 unfinished" in text
    assert "unfinished    wait (wait_for)" in text
    listed = run(app, "runs").stdout
    assert "nobody drives it" in listed
    assert "succeeded, 1 unfinished" in listed
    assert json.loads(run(app, "runs", "--json").stdout)[0]["driven"] is False


def test_no_runs_names_the_journal_it_looked_in(tmp_path: Path) -> None:
    """An empty journal and no journal at all read differently: a mistyped path (a cron
    job's PLANRUN_JOURNAL) read as an empty history (found by a fresh operator)."""
    app = ops_project(tmp_path / "app")
    elsewhere = tmp_path / "nosuchdir" / "j.sqlite3"
    res = run(app, "runs", env={**os.environ, "PLANRUN_JOURNAL": str(elsewhere)})
    assert res.returncode == 0, res
    assert res.stdout.strip() == (f"no runs: there is no journal at {elsewhere} (execute "
                                  "creates it; is it the journal you meant?)"), res.stdout
    assert not elsewhere.parent.exists()  # a read creates nothing
    empty = tmp_path / "empty.sqlite3"
    env = {**os.environ, "PLANRUN_JOURNAL": str(empty)}
    assert run(app, "execute", "hello", env=env).returncode in (0, 4)
    res = run(app, "runs", "--plan", "wait", env=env)
    assert f"no runs in {app.resolve()} in the journal {empty}" in res.stdout


def test_a_killed_run_whose_process_is_not_reaped_is_not_held(tmp_path: Path) -> None:
    """A zombie holds no lease: its pid answers ``kill(pid, 0)``, but it does nothing (found
    by a fresh user: resume said run_busy for a killed run whose parent had not waited)."""
    app = ops_project(tmp_path / "app")
    gate = tmp_path / "gate"
    proc = start_waiting_run(app, gate)  # this test is its parent and does not wait yet
    proc.kill()
    for _ in range(200):  # until it is a zombie (its /proc entry says Z)
        if (Path("/proc") / str(proc.pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] \
                == "Z":
            break
        import time
        time.sleep(0.05)
    try:
        run_id = json.loads(run(app, "runs", "--json").stdout)[0]["run_id"]
        gate.touch()  # a call made again by resume returns at once
        res = run(app, "resume", run_id)
        assert "run_busy" not in res.stderr, res
        assert res.returncode in (0, 5), res
    finally:
        proc.communicate(timeout=60)


# --- log --follow -----------------------------------------------------------------------------


def test_log_follow_of_a_run_nobody_drives_says_so(tmp_path: Path) -> None:
    """``log --follow`` of a run whose process died ends at once, and says why (found by a
    fresh user: it ended silently, as if the run had finished)."""
    app = ops_project(tmp_path / "app")
    gate = tmp_path / "gate"
    killed_waiting_run(app, gate)
    res = run(app, "log", "--follow")
    assert res.returncode == 0, res
    assert "still running but nobody drives it" in res.stderr
    assert "step_started" in res.stdout


def test_log_follow_prints_events_until_the_run_ends(tmp_path: Path) -> None:
    app = ops_project(tmp_path / "app")
    gate = tmp_path / "gate"
    proc = start_waiting_run(app, gate)
    try:
        follower = subprocess.Popen([sys.executable, "-m", "planrun", "log", "--follow",
                                     "--json"], cwd=app, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        assert follower.stdout is not None
        seen = []
        for line in follower.stdout:
            seen.append(json.loads(line)["kind"])
            if seen[-1] == "step_started" and len(seen) > 2:
                break
        assert follower.poll() is None  # still following: the run goes on
        gate.touch()
        rest, _ = follower.communicate(timeout=60)
    finally:
        gate.touch()
        proc.communicate(timeout=60)
    kinds = seen + [json.loads(line)["kind"] for line in rest.splitlines()]
    assert kinds[0] == "planned"
    assert kinds[-1] == "run_finished"
    assert follower.returncode == 0
    # A finished run: --follow prints it all and ends at once.
    text = run(app, "log", "last", "--follow")
    assert text.returncode == 0
    assert "run_finished" in text.stdout.splitlines()[-1]


# --- bug 3: the journaled plan path means the same from anywhere ------------------------------


def test_plan_path_is_journaled_relative_to_the_project(tmp_path: Path) -> None:
    app = ops_project(tmp_path / "app")
    res = run(Path("/"), "-C", str(app), "execute", "wait", "-p", "path=/", "--json")
    assert res.returncode == 0, res
    manifest = json.loads(res.stdout)
    assert manifest["plan"]["file"] == "plans/wait.yaml"


# --- completion: -C DIR, --approve STEP, -p NAME=, resumable runs (bug 11) --------------------


def _complete(cwd: Path, tmp_path: Path, *lines: str) -> list[list[str]]:
    """Run bash completion for each ``COMP_WORDS`` line; the candidates of each."""
    if not shutil.which("bash"):
        pytest.skip("no bash")
    shim = tmp_path / "bin"
    shim.mkdir(exist_ok=True)
    (shim / "planrun").write_text(f"#!/bin/sh\nexec {sys.executable} -m planrun \"$@\"\n")
    (shim / "planrun").chmod(0o755)
    script = (ROOT / "completions" / "planrun.bash").read_text()
    probe = script + "\n" + "\n".join(
        f"COMP_WORDS=({words}); COMP_CWORD={len(words.split()) - (0 if words.endswith(' ') else 1)}"
        f"; _planrun_completion planrun; echo \"got:${{COMPREPLY[*]}}\""
        for words in lines)
    env = dict(os.environ, PATH=f"{shim}:{os.environ['PATH']}")
    out = subprocess.run(["bash", "-c", probe], cwd=cwd, env=env, text=True,
                         capture_output=True, timeout=120, check=False)
    got = [line[4:].split() for line in out.stdout.splitlines() if line.startswith("got:")]
    assert len(got) == len(lines), out
    return got


def test_completion_follows_the_command_line(tmp_path: Path) -> None:
    app = ops_project(tmp_path / "app")
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "plans").mkdir(parents=True)
    (elsewhere / "tools.yaml").write_text("tools: {}\n")
    (elsewhere / "plans" / "local.yaml").write_text("planrun: 1\ngoal: x\nsteps: []\n")
    gate = tmp_path / "gate"
    proc = start_waiting_run(app, gate)
    try:
        os.kill(proc.pid, 9)
        proc.communicate(timeout=30)
    finally:
        gate.touch()
    done = json.loads(run(app, "execute", "wait", "-p", "path=/", "--json").stdout)["run_id"]
    interrupted = [r["run_id"] for r in json.loads(run(app, "runs", "--json").stdout)
                   if r["status"] == "running"]
    assert len(interrupted) == 1
    got = _complete(
        elsewhere, tmp_path,
        f"planrun -C {app} execute ''",
        f"planrun execute -C {app} ''",
        "planrun execute ''",
        f"planrun -C {app} execute hello --approve ''",
        f"planrun -C {app} execute hello --approve p",
        f"planrun -C {app} execute hello -p ''",
        f"planrun -C {app} resume ''",
        f"planrun -C {app} status ''",
    )
    assert got[0] == ["hello", "wait"]
    assert got[1] == ["hello", "wait"]
    assert got[2] == ["local"]
    assert got[3] == ["publish", "hello"]
    assert got[4] == ["publish"]
    assert got[5] == ["who="]
    assert got[6] == interrupted
    assert set(got[7]) == {done, *interrupted}


# --- did you mean -----------------------------------------------------------------------------


def test_approve_typo_suggests_the_step(tmp_path: Path) -> None:
    app = ops_project(tmp_path / "app")
    res = run(app, "execute", "hello", "--approve", "pubish")
    assert res.returncode == 2
    assert ("planrun: error[usage]: --approve 'pubish': the plan has no such step. "
            "Did you mean 'publish'?") in res.stderr
    assert "needing approval: publish" in res.stderr
    # resume and retry say the same
    denied = run(app, "execute", "hello", "-p", "who=x", "--json")
    assert denied.returncode == 4
    gate = tmp_path / "gate"
    proc = start_waiting_run(app, gate)
    os.kill(proc.pid, 9)
    proc.communicate(timeout=30)
    gate.touch()
    res = run(app, "resume", "--approve", "wiat")
    assert res.returncode == 2, res
    assert "Did you mean 'wait'?" in res.stderr


def test_unknown_fields_in_tools_yaml_and_planrun_toml_suggest_the_name(tmp_path: Path) -> None:
    app = ops_project(tmp_path / "app")
    tools = (app / "tools.yaml").read_text()
    (app / "tools.yaml").write_text(tools.replace("    idempotent: true\n  wait_for:",
                                                  "    retry: {max_attempts: 2}\n  wait_for:"))
    res = run(app, "validate")
    assert res.returncode == 3
    assert "unknown field 'retry'. Did you mean 'retries'?" in res.stdout
    (app / "tools.yaml").write_text(tools.replace(
        "    idempotent: true\n  wait_for:",
        "    retries: {max_attempt: 2}\n  wait_for:"))
    res = run(app, "validate")
    assert "unknown field 'max_attempt'. Did you mean 'max_attempts'?" in res.stdout
    (app / "tools.yaml").write_text(tools)
    (app / "planrun.toml").write_text("max_paralel = 2\n")
    res = run(app, "validate")
    assert res.returncode == 3
    assert "Did you mean 'max_parallel'?" in res.stdout + res.stderr
    (app / "planrun.toml").write_text("[policy]\nallowed_tool = []\n")
    res = run(app, "validate")
    assert res.returncode == 3
    assert "Did you mean 'allowed_tools'?" in res.stdout + res.stderr


# --- retry --from STEP ------------------------------------------------------------------------


def test_retry_from_reruns_a_succeeded_step_and_everything_after_it(tmp_path: Path) -> None:
    app = ops_project(tmp_path / "app")
    marker = tmp_path / "m"
    marker.touch()
    done = json.loads(run(app, "execute", "wait", "-p", f"path={marker}", "--json").stdout)
    assert done["status"] == "completed"
    started = Path(f"{marker}.started")
    started.unlink()
    plain = run(app, "retry", done["run_id"])
    assert plain.returncode == 5
    assert "--from" in plain.stderr
    bad = run(app, "retry", done["run_id"], "--from", "wiat")
    assert bad.returncode == 2
    assert "error[unknown_step]" in bad.stderr
    assert "Did you mean 'wait'?" in bad.stderr
    res = run(app, "retry", done["run_id"], "--from", "wait", "--json")
    assert res.returncode == 0, res
    child = json.loads(res.stdout)
    assert child["parent_run_id"] == done["run_id"]
    steps = {s["id"]: s for s in child["steps"]}
    assert steps["first"]["replayed"] is True
    assert steps["wait"]["replayed"] is False
    assert started.exists()  # the tool really ran again
    # --from the first step: everything runs again
    res = run(app, "retry", child["run_id"], "--from", "first", "--json")
    assert res.returncode == 0, res
    assert [s["replayed"] for s in json.loads(res.stdout)["steps"]] == [False, False]


# --- progress: fan-out lines off a terminal, no "0/?", a sane rate (bug 9) --------------------


def _fan_project(tmp_path: Path) -> Path:
    from test_terminal import FAN, SLOW_REGISTRY, SLOW_TOOLS

    root = tmp_path / "fanproj"
    (root / "plans").mkdir(parents=True)
    (root / "slowtools.py").write_text(SLOW_TOOLS)
    (root / "tools.yaml").write_text(SLOW_REGISTRY)
    # a plain step that runs long enough to be drawn (it used to show "0/?")
    (root / "plans" / "fan.yaml").write_text(FAN + "  - id: pause\n    tool: slow\n"
                                             "    depends_on: [emit]\n"
                                             "    arguments: {i: 1}\n")
    return root


def test_status_of_a_fan_out_cut_short_shows_its_items_and_no_running(
        tmp_path: Path) -> None:
    """After a kill -9 mid-fan-out the text status said ``running double (double)``:
    nothing ran it, and its items were only in --json (found by a fresh operator)."""
    import re

    root = _fan_project(tmp_path)
    cut = run(root, "execute", "fan", "-p", "n=20", "--approve", "wipe",
              env=dict(os.environ, PLANRUN_TEST_CRASH="dispatch:double#5"))
    assert cut.returncode == -9, cut
    text = run(root, "status", "last").stdout
    line = next(x for x in text.splitlines() if " double (" in x)
    assert line.split()[0] == "unfinished", text
    head = text.splitlines()[0]  # the headline's count says it the same way
    assert "1 unfinished" in head, head
    assert "running" not in head.split("—", 1)[1], head
    assert re.search(r"\b\d+/20 items\b", line), line
    shown = json.loads(run(root, "status", "last", "--json").stdout)
    step = next(s for s in shown["steps"] if s["id"] == "double")
    assert step["status"] == "running"  # the journal's word, unchanged in --json
    assert step["items"]["total"] == 20


def test_fan_out_progress_lines_off_a_terminal(tmp_path: Path) -> None:
    import re

    root = _fan_project(tmp_path)
    res = run(root, "execute", "fan", "-p", "n=20", "--approve", "wipe")
    assert res.returncode == 0, res
    counts = [int(m.group(1)) for m in re.finditer(r"^planrun: run \w+: double (\d+)/20 items",
                                                   res.stderr, flags=re.M)]
    assert counts == [2, 4, 6, 8, 10, 12, 14, 16, 18], res.stderr  # every tenth
    assert re.search(r"planrun: run \w+: double succeeded", res.stderr), res.stderr
    quiet = run(root, "execute", "fan", "-p", "n=20", "--approve", "wipe", "-q")
    assert quiet.stderr == ""


def test_live_progress_has_no_empty_counter_for_plain_steps(tmp_path: Path) -> None:
    pexpect = pytest.importorskip("pexpect")
    root = _fan_project(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env["TERM"] = "xterm"
    child = pexpect.spawn(sys.executable, ["-m", "planrun", "execute", "fan", "--approve",
                                           "wipe"], cwd=str(root), env=env,
                          encoding="utf-8", timeout=60, dimensions=(40, 160))
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert "/?" not in (child.before or "")


def test_item_rate_is_items_over_elapsed_time() -> None:
    from planrun.ui import item_rate

    assert item_rate(2, 2.0) == "1.0 items/s"
    assert item_rate(0, 5.0) == ""
    assert item_rate(3, 0.1) == ""
    assert item_rate(500, 10.0) == "50 items/s"


# --- show / --dry-run show `when` and `for_each`; graph marks conditional edges ---------------

COND = """\
planrun: 1
goal: Conditional and fan-out
params:
  go: {type: boolean, default: true}
steps:
  - id: first
    tool: say
    arguments: {text: one}
  - id: each
    tool: say
    depends_on: [first]
    for_each: ["a", "b"]
    arguments: {text: "{item}"}
  - id: maybe
    tool: say
    depends_on: [first]
    when: "params.go"
    arguments: {text: maybe}
"""


def test_a_run_nobody_could_approve_says_what_to_run_next(tmp_path: Path) -> None:
    """Unattended, with a step left to clear: ``denied`` though nobody said no; its status
    gave no next step (found by a fresh operator). A denied run is not retried: the plan
    is run again with ``--approve``."""
    app = ops_project(tmp_path / "app")
    res = run(app, "execute", "hello")
    assert res.returncode == 4, res
    shown = json.loads(run(app, "status", "last", "--json").stdout)
    assert shown["status"] == "denied"
    # with the run's parameter values (the default too): the same run, not another
    assert shown["next"] == "planrun execute hello -p who=world --approve publish"
    assert f"next: {shown['next']}" in run(app, "status", "last").stdout
    again = run(app, *shown["next"].split()[1:])
    assert again.returncode == 0, again


def test_a_denied_runs_next_gives_every_value_again_quoted_secrets_left_out(
        tmp_path: Path) -> None:
    """A pasted ``next`` ran the plan with a defaulted value instead of the one denied
    (found by a fresh operator): it names every journaled value, shell-quoted, as ``-p``
    reads it; a secret is never written (it is given again, SPEC §7)."""
    import shlex

    app = ops_project(tmp_path / "app")
    (app / "plans" / "many.yaml").write_text("""\
planrun: 1
goal: Parameters of several types
params:
  who: {type: string}
  keep: {type: integer, default: 7}
  names: {type: array, items: {type: string}}
  token: {type: string, secret: true}
steps:
  - {id: hi, tool: say, arguments: {text: "{params.who} keeps {params.keep}"}}
  - {id: each, tool: say, for_each: "{params.names}", arguments: {text: "{item}"}}
  - {id: publish, tool: wipe, depends_on: [hi], arguments: {text: "{params.token}"}}
""", encoding="utf-8")
    secret = {**os.environ, "PLANRUN_PARAM_TOKEN": "s3cr3t-value"}
    res = run(app, "execute", "many", "-p", "who=it's me", "-p", "keep=2", "-p",
              'names=["a b", "c"]', "--json", env=secret)
    assert res.returncode == 4, res
    nxt = json.loads(res.stdout)["error"]
    assert nxt["run_id"], nxt  # the run the error is about, for a monitor (not in a hint)
    shown = json.loads(run(app, "status", nxt["run_id"], "--json").stdout)["next"]
    assert "s3cr3t" not in shown
    assert "token" not in shown
    argv = shlex.split(shown)
    assert argv[:3] == ["planrun", "execute", "many"]
    given = [argv[i + 1] for i, a in enumerate(argv) if a == "-p"]
    assert sorted(given) == sorted(["who=it's me", "keep=2", 'names=["a b","c"]'])
    assert argv[-2:] == ["--approve", "publish"]
    again = run(app, *argv[1:], "--json", env=secret)
    assert again.returncode == 0, again
    assert json.loads(again.stdout)["params"] == json.loads(
        run(app, "status", nxt["run_id"], "--json").stdout)["params"]


def test_show_names_the_parameter_a_fan_out_is_over_when_it_has_no_value(
        tmp_path: Path) -> None:
    """``fan-out over "<unknown>"`` said nothing (found by a fresh operator)."""
    app = ops_project(tmp_path / "app")
    (app / "plans" / "over.yaml").write_text(
        "planrun: 1\ngoal: over a list\nparams:\n  sites: {type: array}\nsteps:\n"
        "  - {id: each, tool: say, for_each: \"{params.sites}\", arguments: {text: \"{item}\"}}\n")
    shown = run(app, "show", "over")
    assert shown.returncode == 0, shown
    assert 'fan-out over "{params.sites}"' in shown.stdout
    assert "<unknown>" not in shown.stdout
    steps = json.loads(run(app, "show", "over", "--json").stdout)["steps"]
    assert steps[0]["for_each"] == "{params.sites}"
    given = run(app, "show", "over", "-p", 'sites=["x"]')
    assert 'fan-out over ["x"]' in given.stdout, given


def test_show_dry_run_and_graph_show_conditions_and_fan_out(tmp_path: Path) -> None:
    app = ops_project(tmp_path / "app")
    (app / "plans" / "cond.yaml").write_text(COND)
    shown = run(app, "show", "cond")
    assert shown.returncode == 0, shown
    assert 'fan-out over ["a", "b"]' in shown.stdout
    assert "when params.go" in shown.stdout
    steps = {s["id"]: s for s in json.loads(run(app, "show", "cond", "--json").stdout)["steps"]}
    assert steps["each"]["for_each"] == ["a", "b"]
    assert steps["maybe"]["when"] == "params.go"
    dry = run(app, "execute", "cond", "--dry-run")
    assert dry.returncode == 0, dry
    assert "when: params.go" in dry.stdout
    assert 'for_each: ["a", "b"]' in dry.stdout
    dry_json = json.loads(run(app, "execute", "cond", "--dry-run", "--json").stdout)
    by_id = {s["id"]: s for s in dry_json["steps"]}
    assert by_id["maybe"]["when"] == "params.go"
    assert by_id["each"]["for_each"] == ["a", "b"]
    mermaid = run(app, "graph", "cond").stdout
    assert "first -.->|when| maybe" in mermaid
    assert "first --> each" in mermaid
    dot = run(app, "graph", "cond", "--format", "dot").stdout
    assert '"first" -> "maybe" [style=dashed, label="when"' in dot
    assert '"first" -> "each";' in dot


# --- init points at help a pip-only user has ---------------------------------------------------


def test_init_toml_points_at_help_that_ships_with_planrun(tmp_path: Path) -> None:
    res = run(tmp_path, "init", "proj")
    assert res.returncode == 0, res
    toml = (tmp_path / "proj" / "planrun.toml").read_text()
    assert "README" not in toml
    assert "planrun --help" in toml
    assert "planrun schema plan|tools" in toml
    # every key the file mentions is one planrun knows (commented ones included)
    import re
    import tomllib

    uncommented = "\n".join(re.sub(r"^# ?", "", line) for line in toml.splitlines()
                            if not line.startswith("# planrun") and not line.startswith(
                                ("# Help", "# `planrun"))
                            and not re.match(r"^#\s+#", line) and line.strip() != "#")
    data = tomllib.loads(uncommented)
    assert set(data) <= {"plans_dir", "registry", "journal", "max_parallel", "max_steps",
                         "policy", "pools"}
    assert run(tmp_path / "proj", "validate", "--strict").returncode == 0
    assert run(tmp_path / "proj", "execute", "hello").returncode == 0


# --- bugs 3, 4, 12, 13: a run that died, resumed from elsewhere, and one still driven --------


def _killed_waiting_run(app: Path, tmp_path: Path) -> str:
    gate = tmp_path / "gate"
    proc = start_waiting_run(app, gate)
    os.kill(proc.pid, 9)
    proc.communicate(timeout=30)
    gate.touch()
    return str(json.loads(run(app, "runs", "--json").stdout)[0]["run_id"])


def test_changed_plan_note_from_any_folder_and_in_explain(tmp_path: Path) -> None:
    app = ops_project(tmp_path / "app")
    gate = tmp_path / "gate"
    # started from / with -C: the journaled path still means plans/wait.yaml of app
    proc = subprocess.Popen([sys.executable, "-m", "planrun", "-C", str(app), "execute",
                             "wait", "-p", f"path={gate}"], cwd="/",
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    started = Path(f"{gate}.started")
    import time
    for _ in range(1200):
        if started.exists():
            break
        time.sleep(0.05)
    os.kill(proc.pid, 9)
    proc.communicate(timeout=30)
    plan = app / "plans" / "wait.yaml"
    plan.write_text(plan.read_text().replace("Wait for a file", "Wait for a file (edited)"))
    explain = run(app, "resume", "--explain")
    assert explain.returncode == 0, explain
    assert "note: plans/wait.yaml changed since run" in explain.stdout
    elsewhere = run(tmp_path, "-C", str(app), "resume", "--explain", "--json")
    assert "plans/wait.yaml changed since run" in json.loads(elsewhere.stdout)["notes"][0]
    gate.touch()
    res = run(app, "resume")
    assert res.returncode == 0, res
    note = ": note: plans/wait.yaml changed since run"
    assert res.stderr.count(note) == 1, res.stderr
    # said before any step runs (it matters to what is about to run), not after them
    lines = res.stderr.splitlines()
    first_step = next(i for i, line in enumerate(lines)
                      if re.match(r"planrun: run \w+: [\w-]+ started", line))
    assert next(i for i, line in enumerate(lines) if note in line) < first_step, res.stderr
    quiet = run(app, "resume", "-q")  # nothing left to do: refused, no note needed
    assert "Traceback" not in quiet.stderr


@pytest.mark.sqlite
def test_durations_after_resume_are_working_time(tmp_path: Path) -> None:
    import sqlite3
    from contextlib import closing

    app = ops_project(tmp_path / "app")
    run_id = _killed_waiting_run(app, tmp_path)
    journal = Path(os.environ["PLANRUN_JOURNAL"])

    move_run_back(journal, run_id)  # the run died an hour ago
    # a resume refused at validation (its plan_refused event) ran nothing: the hour before
    # it is idle time too
    tools = app / "tools.yaml"
    good = tools.read_text(encoding="utf-8")
    tools.write_text(good.replace("  wait_for:", "  waits_for:"), encoding="utf-8")
    refused = run(app, "resume", run_id, "--json")
    assert refused.returncode == 3, refused
    tools.write_text(good, encoding="utf-8")
    with closing(sqlite3.connect(journal)) as conn:
        kinds = [k for (k,) in conn.execute("SELECT kind FROM events WHERE run_id = ?",
                                            (run_id,))]
    assert kinds[-1] == "plan_refused"
    res = run(app, "resume", run_id, "--json")
    assert res.returncode == 0, res
    m = json.loads(res.stdout)
    assert m["wall_s"] > 3600
    assert m["duration_s"] < 600
    steps = {s["id"]: s for s in m["steps"]}
    assert steps["wait"]["duration_s"] < 600  # started before the crash, ended after
    text = run(app, "status", run_id).stdout
    assert "of work (" in text


def test_status_of_a_run_another_process_drives_does_not_suggest_resume(
        tmp_path: Path) -> None:
    app = ops_project(tmp_path / "app")
    gate = tmp_path / "gate"
    proc = start_waiting_run(app, gate)
    try:
        m = json.loads(run(app, "status", "--json").stdout)
        assert m["status"] == "running"
        assert m["next"] == f"planrun log {m['run_id']} --follow"
        assert "planrun resume" not in run(app, "status").stdout
    finally:
        gate.touch()
        proc.communicate(timeout=60)
    (tmp_path / "k").mkdir()
    _killed = _killed_waiting_run(app, tmp_path / "k")
    m = json.loads(run(app, "status", _killed, "--json").stdout)
    assert m["next"] == f"planrun resume {_killed}"  # its holder is dead: resume takes it


# --- bug 5: nightly-backup's next: is never a dead end ------------------------------------------


def test_backup_with_taken_stamps_completes_without_overwriting(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    app = backup_project(tmp_path)
    (app / "planrun.toml").unlink()
    dest = tmp_path / "backups"
    dest.mkdir()
    now = datetime.now(UTC)
    taken = {f"backup-{(now + timedelta(seconds=k)).strftime('%Y%m%dT%H%M%SZ')}.tar.gz"
             for k in range(-2, 90)}
    for name in taken:
        (dest / name).write_bytes(b"someone else's")
    res = run(app, "execute", "nightly-backup", "-p", f"source={tmp_path / 'data'}",
              "-p", f"dest={dest}", "-p", "keep=1000", "--approve", "prune", "--json")
    assert res.returncode == 0, res
    m = json.loads(res.stdout)
    assert m["status"] == "completed"
    assert m["next"] is None
    archive = json.loads(run(app, "output", m["run_id"], "prepare").stdout)["archive"]
    assert Path(archive).name not in taken
    assert all((dest / name).read_bytes() == b"someone else's" for name in taken)


# --- bug 8: resolve --succeeded without --output when later steps read it ------------------------

MAKE_TOOLS = OPS_TOOLS + """\
  make:
    python: opstools:make
    arguments: {type: object, properties: {}, additionalProperties: false}
    output_schema: {type: object, properties: {x: {type: integer}}, required: [x]}
  use:
    python: opstools:use
    arguments: {type: object, properties: {x: {type: integer}}, required: [x],
                additionalProperties: false}
"""

MAKE_PLAN = """\
planrun: 1
goal: Make then use
steps:
  - id: make
    tool: make
  - id: use
    tool: use
    depends_on: [make]
    arguments: {x: "{steps.make.output.x}"}
"""


def test_resolve_succeeded_needs_the_output_later_steps_read(tmp_path: Path) -> None:
    app = ops_project(tmp_path / "app")
    (app / "tools.yaml").write_text(MAKE_TOOLS)
    with (app / "opstools.py").open("a") as f:
        f.write("\n\ndef make():\n    return {'x': 1}\n\n\ndef use(x):\n    return x * 10\n")
    (app / "plans" / "mk.yaml").write_text(MAKE_PLAN)
    crashed = run(app, "execute", "mk", env=dict(os.environ,
                                                  PLANRUN_TEST_CRASH="call:make"))
    assert crashed.returncode == -9, crashed
    stuck = run(app, "resume")
    assert stuck.returncode == 5
    assert "indeterminate" in stuck.stderr
    run_id = json.loads(run(app, "runs", "--json").stdout)[0]["run_id"]
    bare = run(app, "resolve", run_id, "make", "--succeeded")
    assert bare.returncode == 2, bare
    assert "later steps read its output (use)" in bare.stderr
    assert "--output" in bare.stderr
    wrong = run(app, "resolve", run_id, "make", "--succeeded", "--output", '{"y": 1}')
    assert wrong.returncode == 2, wrong
    assert "does not fit the output_schema of tool 'make'" in wrong.stderr
    ok = run(app, "resolve", run_id, "make", "--succeeded", "--output", '{"x": 5}')
    assert ok.returncode == 0, ok
    done = run(app, "resume", "--json")
    assert done.returncode == 0, done
    assert json.loads(run(app, "output", run_id, "use").stdout) == 50
    # --failed needs no output


# --- bug 10: flags where operators put them ------------------------------------------------------


def test_validate_json_quiet_and_common_flags_before_the_command(tmp_path: Path) -> None:
    app = ops_project(tmp_path / "app")
    as_json = run(app, "validate", "--json")
    assert as_json.returncode == 0, as_json
    assert json.loads(as_json.stdout)["ok"] is True
    assert json.loads(run(app, "validate", "--format", "json").stdout) == json.loads(
        as_json.stdout)
    clash = run(app, "validate", "--json", "--format", "github")
    assert clash.returncode == 2
    quiet = run(app, "validate", "-q")
    assert quiet.returncode == 0
    assert quiet.stdout == ""
    assert ": ok" in run(app, "validate").stdout
    (app / "plans" / "bad.yaml").write_text("planrun: 1\ngoal: x\nsteps: []\n")
    bad = run(app, "validate", "-q")
    assert bad.returncode == 3
    assert ": ok" not in bad.stdout
    assert "error[empty]" in bad.stdout
    (app / "plans" / "bad.yaml").unlink()
    before = run(app, "-q", "execute", "wait", "-p", "path=/")
    assert before.returncode == 0, before
    assert before.stderr == ""
    m = json.loads(run(app, "--json", "-v", "status").stdout)
    assert m["status"] == "completed"
    mixed = run(tmp_path, "-C", str(app), "-q", "--json", "execute", "wait", "-p", "path=/")
    assert mixed.returncode == 0, mixed
    assert json.loads(mixed.stdout)["status"] == "completed"
    assert mixed.stderr == ""


# --- a journal from before projects were recorded -------------------------------------------------


@pytest.mark.sqlite
def test_a_version_1_journal_is_migrated_and_its_runs_listed(tmp_path: Path) -> None:
    import sqlite3
    from contextlib import closing

    from planrun.journal.schema import MIGRATIONS

    journal = Path(os.environ["PLANRUN_JOURNAL"])
    with closing(sqlite3.connect(journal)) as conn, conn:
        for statement in MIGRATIONS[0]:
            conn.execute(statement)
        conn.execute(
            "INSERT INTO runs (run_id, root_run_id, plan_name, plan_file, plan_json, digest,"
            " revision, params_json, contracts_json, status, created_at, finished_at) VALUES"
            " ('0123456789abcdef', '0123456789abcdef', 'old', 'plans/old.yaml', '{}', 'd', 1,"
            " '{}', '{}', 'completed', '2026-01-01T00:00:00.000+00:00',"
            " '2026-01-01T00:00:01.000+00:00')")
        conn.execute("PRAGMA user_version = 1")
    app = ops_project(tmp_path / "app")
    listed = run(app, "runs", "--json")  # a read command: migrates, then reads
    assert listed.returncode == 0, listed
    rows = json.loads(listed.stdout)
    assert [(r["run_id"], r["project"]) for r in rows] == [("0123456789abcdef", None)]
    assert run(app, "status").returncode == 0  # listed with every project: it is `last`
    with closing(sqlite3.connect(journal)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] >= 2


def test_zsh_and_fish_completion_follow_the_command_line(tmp_path: Path) -> None:
    app = ops_project(tmp_path / "app")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def complete(shell: str, line: str) -> str:
        env = dict(os.environ, _PLANRUN_COMPLETE=f"complete_{shell}",
                   _TYPER_COMPLETE_ARGS=line, _TYPER_COMPLETE_FISH_ACTION="get-args")
        return run(elsewhere, env=env).stdout

    assert '"who="' in complete("zsh", f"planrun -C {app} execute hello -p ")
    assert '"wait"' in complete("zsh", f"planrun -C {app} execute ")
    assert complete("fish", f"planrun -C {app} execute hello --approve ").split() == [
        "publish", "hello"]
    assert complete("fish", f"planrun execute hello -C {app} --approve p").split() == [
        "publish"]
