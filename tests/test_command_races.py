"""Races of the commands other than ``execute`` on one journal (SPEC §7 "Leases").

Real ``planrun`` processes on a real SQLite file and a PostgreSQL server. Where a race
needs one process to act inside another's window, the test holds the journal's write lock
(``BEGIN IMMEDIATE`` on its own connection; PostgreSQL: the journal's advisory lock), as
any other writer would, and does the other side's write in it, so the order is certain,
not a matter of luck.
"""

from __future__ import annotations

import sqlite3
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest

from planrun_cli import TIMEOUT_S, CliProject

TOOLS = """
tools:
  flaky:
    description: Fails unless its file exists
    python: crashtools:flaky
    arguments:
      type: object
      properties:
        file: {type: string}
      required: [file]
      additionalProperties: false
  once:
    description: A python effect that must not happen twice
    python: crashtools:record
    arguments:
      type: object
      properties:
        label: {type: string}
      additionalProperties: false
"""

CHAIN = """
planrun: 1
goal: Two steps
steps:
  - {id: a, tool: once, arguments: {label: a}}
  - {id: b, tool: once, depends_on: [a], arguments: {label: b}}
"""


@pytest.fixture
def proj(journal_location: object, cli: CliProject) -> CliProject:
    """The project, journaled on each backend (SQLite file, PostgreSQL database)."""
    cli.tools(TOOLS)
    cli.plan("chain", CHAIN)
    return cli


def _opened(pid: int, journal: Path) -> bool:
    """Whether process ``pid`` has the journal file open."""
    try:
        return any(str(p.readlink()).startswith(str(journal))
                   for p in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False


def _lease_row() -> tuple[str, str | None, int | None]:
    """(owner, boot id, start ticks) of a lease held by this (live) test process.

    The row a ``planrun resume`` of this process would write when it takes a lease.
    """
    from planrun.journal.records import holder_identity
    from planrun.journal.store import lease_owner

    owner = lease_owner()
    return (owner, *holder_identity(owner))


#: The lease a live process takes: the same UPDATE as ``take_lease``, by each database's
#: clock (SQLite ``?`` parameters, PostgreSQL ``%s``).
TAKE = ("UPDATE runs SET lease_owner = ?, lease_epoch = lease_epoch + 1, "
        "lease_expires = {now} + 30, lease_boot = ?, lease_start = ? WHERE run_id = ?")


def _unlock_racing_a_takeover_on_sqlite(proj: CliProject, run_id: str) -> str:
    """Start ``unlock``; while it waits for the write lock, a live process takes the lease."""
    assert isinstance(proj.journal, Path)
    with closing(sqlite3.connect(proj.journal, isolation_level=None, timeout=TIMEOUT_S)
                 ) as conn:
        conn.execute("BEGIN IMMEDIATE")  # every writer waits for this transaction
        unlock = proj.start("unlock", run_id, "--json", name="unlock")
        deadline = time.monotonic() + TIMEOUT_S
        while not _opened(unlock.pid, proj.journal):
            assert unlock.poll() is None, proj.output_of(unlock)
            assert time.monotonic() < deadline, "unlock never opened the journal"
            time.sleep(0.02)
        time.sleep(1.0)  # it reads what it reads, then waits for the write lock
        owner, boot, start = _lease_row()
        conn.execute(TAKE.format(now="((julianday('now') - 2440587.5) * 86400.0)"),
                     (owner, boot, start, run_id))
        conn.execute("COMMIT")
    return owner


def _unlock_racing_a_takeover_on_postgres(proj: CliProject, run_id: str) -> str:
    """The same on PostgreSQL: the journal's write lock is its advisory lock.

    ``pg_locks`` shows when ``unlock`` waits for it, so no sleep is needed.
    """
    import psycopg

    from planrun.journal.backends.postgres import WRITE_LOCK

    assert isinstance(proj.journal, str)
    with psycopg.connect(proj.journal) as conn:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
        unlock = proj.start("unlock", run_id, "--json", name="unlock")
        deadline = time.monotonic() + TIMEOUT_S
        with psycopg.connect(proj.journal, autocommit=True) as watch:
            while not watch.execute("SELECT count(*) FROM pg_locks WHERE locktype = "
                                    "'advisory' AND NOT granted").fetchone()[0]:
                assert unlock.poll() is None, proj.output_of(unlock)
                assert time.monotonic() < deadline, "unlock never waited for the lock"
                time.sleep(0.02)
        owner, boot, start = _lease_row()
        conn.execute(TAKE.replace("?", "%s").format(
            now="EXTRACT(EPOCH FROM clock_timestamp())::double precision"),
            (owner, boot, start, run_id))
        conn.commit()
    return owner


def test_unlock_never_releases_a_lease_taken_while_it_checked(proj: CliProject) -> None:
    """``unlock`` checks the holder and clears the lease in one transaction.

    It read the lease of a dead process, then cleared whatever lease the run had by then:
    a ``resume`` that took the run over in between lost its lease while it ran, its calls
    cancelled (found by an attacker: 2 in 40 tries of resume and unlock at once). Here
    the test process is the live one that takes the lease while unlock waits to write.
    """
    r = proj.run("execute", "chain", "--json", crash="outcome:a")
    assert r.returncode == -9, r
    (run_id,) = proj.probe().run_ids()
    if isinstance(proj.journal, Path):
        owner = _unlock_racing_a_takeover_on_sqlite(proj, run_id)
    else:
        owner = _unlock_racing_a_takeover_on_postgres(proj, run_id)
    done = proj.finish(proj.procs[-1])
    assert done.returncode == 5, done
    assert done.error_code == "run_busy", done
    assert len(done.stderr.strip().splitlines()) == 2, done  # the message and its hint
    (run,) = proj.probe().runs()
    assert run.lease is not None, run
    assert run.lease.owner == owner, run
    assert proj.integrity() == "ok"


#: The start of a planner that waits in a room (a folder of markers) until ``parties``
#: planners are inside it at once.
MEETING = """
import json, sys, time
from pathlib import Path

request = json.load(sys.stdin)
room, label, parties = Path("room"), sys.argv[1], int(sys.argv[2])
room.mkdir(exist_ok=True)
(room / label).touch()
deadline = time.monotonic() + 60
while len(list(room.iterdir())) < parties and time.monotonic() < deadline:
    time.sleep(0.02)
"""

#: A planner that meets another one, then proposes a one-step plan named by its argument.
MEETING_PLANNER = MEETING + """print(json.dumps({"planrun": 1, "goal": request["goal"],
                  "steps": [{"id": label, "tool": "once", "arguments": {"label": label}}]}))
"""


def test_two_plans_of_one_name_at_once_write_one_revision_after_the_other(
        proj: CliProject) -> None:
    """Two ``planrun plan --name N`` at once: revisions 1 and 2, never two revision 1s.

    Each read the file (none yet) before its planner answered, then wrote "revision 1
    (new)": the second plan replaced the first without a trace in its session (found by
    an attacker).
    """
    proj.write("planner.py", MEETING_PLANNER)
    procs = [proj.start("plan", "greet", "--name", "greet", "--json", "--planner",
                        f"cmd:{sys.executable} planner.py {label} 2", name=label)
             for label in ("one", "two")]
    done = [proj.finish(p) for p in procs]
    for r in done:
        assert r.returncode == 0, r
    by_revision = {r.json["revision"]: r.json for r in done}
    assert sorted(by_revision) == [1, 2], done
    first, second = by_revision[1], by_revision[2]
    assert (first["previous_revision"], second["previous_revision"]) == (None, 1)
    text = (proj.root / "plans" / "greet.yaml").read_text()
    assert "revision: 2" in text
    assert f"id: {second['plan']['steps'][0]['id']}" in text
    log = proj.run("log", second["run_id"], "--json").json
    (planned,) = [e["data"] for e in log if e["kind"] == "planned"]
    assert planned["previous"]["revision"] == 1
    assert f"id: {first['plan']['steps'][0]['id']}" in planned["previous"]["content"]


#: A repair planner that meets another one (as :data:`MEETING_PLANNER`), then proposes
#: the failed run's plan with the failing step's file made one that exists.
MEETING_REPAIRER = MEETING + """plan = request["run"]["plan"]
for step in plan["steps"]:
    if step["id"] == "f":
        step["arguments"] = {"file": "tools.yaml"}
print(json.dumps(plan))
"""


def test_two_repairs_of_one_plan_at_once_write_one_revision_after_the_other(
        proj: CliProject) -> None:
    """Repairs of two failed runs of one plan at once: revisions 2 and 3 of its file.

    Both read revision 1 before their planners answered and wrote revision 2, the second
    over the first (the sibling of two ``planrun plan`` at once).
    """
    proj.plan("fix", """
        planrun: 1
        goal: A step that fails until its file exists
        steps:
          - {id: f, tool: flaky, arguments: {file: missing}}
    """)
    failed = [proj.run("execute", "fix", "--json").json["run_id"] for _ in range(2)]
    proj.write("planner.py", MEETING_REPAIRER)
    procs = [proj.start("repair", run_id, "--json", "--planner",
                        f"cmd:{sys.executable} planner.py {run_id} 2", name="repair")
             for run_id in failed]
    done = [proj.finish(p) for p in procs]
    for r in done:
        assert r.returncode == 0, r
        assert r.json["status"] == "completed", r
    assert sorted(r.json["plan"]["revision"] for r in done) == [2, 3], done
    assert "revision: 3" in (proj.root / "plans" / "fix.yaml").read_text()
