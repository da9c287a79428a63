"""Races of the commands other than ``execute`` on one journal (SPEC §7 "Leases").

Real ``planrun`` processes on a real SQLite file. Where a race needs one process to act
inside another's window, the test holds the journal's write lock (``BEGIN IMMEDIATE`` on
its own connection, as any other writer would) and does the other side's write in it, so
the order is certain, not a matter of luck.
"""

from __future__ import annotations

import sqlite3
import time
from contextlib import closing
from pathlib import Path

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
def proj(cli: CliProject) -> CliProject:
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


def _take_lease_as_this_process(conn: sqlite3.Connection, run_id: str) -> str:
    """In ``conn``'s open transaction, give the run's lease to this (live) test process.

    The same row a ``planrun resume`` writes when it takes the lease; returns the owner.
    """
    from planrun.journal.records import holder_identity
    from planrun.journal.store import lease_owner

    owner = lease_owner()
    boot, start = holder_identity(owner)
    conn.execute("UPDATE runs SET lease_owner = ?, lease_epoch = lease_epoch + 1, "
                 "lease_expires = ((julianday('now') - 2440587.5) * 86400.0) + 30, "
                 "lease_boot = ?, lease_start = ? WHERE run_id = ?",
                 (owner, boot, start, run_id))
    return owner


@pytest.mark.sqlite
def test_unlock_never_releases_a_lease_taken_while_it_checked(proj: CliProject) -> None:
    """``unlock`` checks the holder and clears the lease in one transaction.

    It read the lease of a dead process, then cleared whatever lease the run had by then:
    a ``resume`` that took the run over in between lost its lease while it ran, its calls
    cancelled (found by an attacker: 2 in 40 tries of resume and unlock at once).
    """
    r = proj.run("execute", "chain", "--json", crash="outcome:a")
    assert r.returncode == -9, r
    (run_id,) = proj.probe().run_ids()
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
        owner = _take_lease_as_this_process(conn, run_id)  # a live process took the run
        conn.execute("COMMIT")
    done = proj.finish(unlock)
    assert done.returncode == 5, done
    assert done.error_code == "run_busy", done
    assert len(done.stderr.strip().splitlines()) == 2, done  # the message and its hint
    (run,) = proj.probe().runs()
    assert run.lease is not None, run
    assert run.lease.owner == owner, run
    assert proj.integrity() == "ok"
