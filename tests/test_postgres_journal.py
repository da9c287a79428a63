"""The PostgreSQL journal (SPEC §11): what only PostgreSQL has, on a real server.

The rules both backends share are tested once for both (``journal_location`` in
``test_journal_backend.py``, ``test_resume.py``, ``test_concurrency_processes.py``, the
acceptance cases). Here: start-up imports, errors (server down, database missing, unknown
role, a newer schema, a database that is not a journal), the schema, passwords, two hosts
on one journal, and a server restart in the middle of a run. The server is a throw-away
cluster on a Unix socket (``tests/pgcluster.py``).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from harness import asset
from planrun.errors import JournalError
from planrun.journal import SCHEMA_VERSION, Journal, NewRun, now
from planrun_cli import PLANRUN, TIMEOUT_S, CliProject, Result

TOOLS = asset("registries/record.yaml") + asset("registries/waiting.yaml")

HOLD = """
planrun: 1
goal: A step that holds the run until a file appears
steps:
  - {id: a, tool: once, arguments: {label: a}}
  - {id: w, tool: wait, depends_on: [a], arguments: {file: go}}
  - {id: z, tool: once, depends_on: [w], arguments: {label: z}}
"""


def one_error(r: Result, exit_code: int = 6) -> str:
    """One ``error[...]`` message, the exit status, no traceback; the stderr text."""
    assert r.returncode == exit_code, r
    assert "Traceback" not in r.stderr, r
    assert r.stderr.count("error[") == 1, r
    return r.stderr


# --- start-up: psycopg only for a postgresql:// journal ------------------------------------

_IMPORTS = textwrap.dedent("""
    import atexit, sys
    def report():
        loaded = sorted(m for m in sys.modules if m.split(".")[0].startswith("psycopg"))
        sys.stderr.write("PSYCOPG:" + ",".join(loaded) + "\\n")
    atexit.register(report)
    from planrun.cli import main
    sys.argv = ["planrun", *sys.argv[1:]]
    main()
""")


def psycopg_modules(cli: CliProject, *args: str) -> tuple[Result, list[str]]:
    proc = subprocess.run([sys.executable, "-c", _IMPORTS, *args], cwd=cli.root,
                          env=cli.env(), capture_output=True, text=True, timeout=TIMEOUT_S,
                          check=False)
    line = [x for x in proc.stderr.splitlines() if x.startswith("PSYCOPG:")][-1]
    mods = [m for m in line.removeprefix("PSYCOPG:").split(",") if m]
    return Result(argv=list(args), returncode=proc.returncode, stdout=proc.stdout,
                  stderr=proc.stderr), mods


def test_help_and_sqlite_runs_never_import_psycopg(cli: CliProject) -> None:
    cli.tools(TOOLS)
    cli.plan("chain", HOLD.replace("{id: w, tool: wait, depends_on: [a], arguments: "
                                   "{file: go}}", "{id: w, tool: idem, depends_on: [a]}"))
    r, mods = psycopg_modules(cli, "--help")
    assert r.returncode == 0, r
    assert mods == []
    r, mods = psycopg_modules(cli, "execute", "chain", "--json")
    assert r.returncode == 0, r
    assert mods == []
    r, mods = psycopg_modules(cli, "runs", "--json")
    assert r.returncode == 0, r
    assert mods == []


def test_a_postgresql_journal_imports_psycopg(cli: CliProject, pg_url: str) -> None:
    r, mods = psycopg_modules(cli, "runs", "--json", "--journal", pg_url)
    assert r.returncode == 0, r
    assert "psycopg" in mods


# --- errors: one message, exit 6, no password ------------------------------------------------


def test_a_server_that_is_not_there(cli: CliProject, tmp_path: Path) -> None:
    url = f"postgresql://alice:s3cret@/planrun?host={tmp_path / 'nosock'}"
    cli.tools(TOOLS)
    cli.plan("chain", HOLD)
    for args in (("runs",), ("execute", "chain"), ("status", "abcd")):
        r = cli.run(*args, "--journal", url)
        text = one_error(r)
        assert "error[journal]" in text, r
        assert "cannot connect to the PostgreSQL journal" in text, r
        assert "postgresql://alice:***@/planrun" in text, r
        assert "s3cret" not in r.stdout + r.stderr, r


def test_a_missing_database(cli: CliProject, pg_cluster: Any) -> None:
    url = pg_cluster.url("no_such_database")
    text = one_error(cli.run("runs", "--journal", url))
    assert "no_such_database" in text
    assert "createdb" in text  # the hint says what to do


def test_an_unknown_role_with_a_password(cli: CliProject, pg_cluster: Any) -> None:
    url = (f"postgresql://mallory:hunter2hunter2@/postgres?host={pg_cluster.sock}")
    r = cli.run("runs", "--journal", url)
    text = one_error(r)
    assert "mallory" in text
    assert "hunter2" not in r.stdout + r.stderr, r
    url = f"postgresql:///postgres?host={pg_cluster.sock}&user=mallory&password=hunter2x"
    r = cli.run("runs", "--journal", url)
    one_error(r)
    assert "hunter2x" not in r.stdout + r.stderr, r
    assert "password=***" in r.stderr, r


#: Commands naming a run that is not there (a mistyped id), or none in an empty journal.
UNKNOWN_RUN = [("status", "abcd"), ("log", "abcd"), ("output", "abcd", "a"),
               ("report", "abcd"), ("resolve", "abcd", "a", "--failed"), ("retry", "abcd"),
               ("approve", "abcd", "--all"), ("unlock", "abcd"), ("resume", "abcd")]
NO_RUN_YET = [("status",), ("log",), ("output", "last", "a"), ("report",), ("resume",)]


def test_no_message_about_a_run_shows_the_urls_password(cli: CliProject,
                                                        pg_cluster: Any) -> None:
    """``unknown_run``, "no run yet" and "the journal is empty" named the journal by its
    raw URL, password and all, for any mistyped run id (found by an attacker)."""
    secret = "s3cretPW42"
    cli.tools(TOOLS)
    cli.plan("one", "planrun: 1\ngoal: One step\nsteps:\n"
                    "  - {id: a, tool: once, arguments: {label: a}}\n")

    def spellings(url: str) -> list[str]:
        # libpq decodes a parameter's name too: pass%77ord= is a password (found by an
        # attacker: shown in clear)
        # sslpassword= (the SSL client key's) was shown in clear (found by an attacker)
        return [url.replace("postgresql:///", f"postgresql://postgres:{secret}@/"),
                f"{url}&password={secret}", f"{url}&pass%77ord={secret}",
                f"{url}&sslpassword={secret}"]

    used, empty = pg_cluster.database("used"), pg_cluster.database("empty")
    assert cli.run("execute", "one", "--journal", spellings(used)[0]).returncode == 0
    seen = 0
    for location, commands in ((used, UNKNOWN_RUN), (empty, NO_RUN_YET)):
        for url in spellings(location):
            for args in commands:
                json_too = args[0] not in ("output", "report")  # those have no --json
                for extra in ((), ("--json",)) if json_too else ((),):
                    r = cli.run(*args, *extra, "--journal", url)
                    assert r.returncode == 5, r  # unknown_run / run_not_resumable
                    assert secret not in r.stdout + r.stderr, r
                    seen += 1
    assert seen == 4 * (2 * (len(UNKNOWN_RUN) + len(NO_RUN_YET)) - 4)


def _sql(url: str, statement: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(statement.encode())


@pytest.mark.parametrize("command", [("runs",), ("execute", "chain")])
def test_a_journal_newer_than_this_planrun_is_refused(cli: CliProject, pg_url: str,
                                                      command: tuple[str, ...]) -> None:
    cli.tools(TOOLS)
    cli.plan("chain", HOLD)
    Journal(pg_url, write=True).close()
    _sql(pg_url, f"UPDATE planrun_schema SET version = {SCHEMA_VERSION + 1}")
    text = one_error(cli.run(*command, "--journal", pg_url))
    assert f"schema version {SCHEMA_VERSION + 1}, newer" in text


def test_a_database_with_other_tables_is_not_taken(cli: CliProject, pg_url: str) -> None:
    _sql(pg_url, "CREATE TABLE runs (id integer)")
    cli.tools(TOOLS)
    cli.plan("chain", HOLD)
    text = one_error(cli.run("execute", "chain", "--journal", pg_url))
    assert "not a planrun journal" in text
    # reads refuse it too, as on SQLite (they had called it "no runs", exit 0; found by
    # an attacker)
    for args in (("runs",), ("status", "last")):
        text = one_error(cli.run(*args, "--journal", pg_url))
        assert "has a table 'runs' but is not a planrun journal" in text


# --- the schema ---------------------------------------------------------------------------


def test_the_schema_has_the_tables_and_columns_of_the_sqlite_journal(
        pg_url: str, tmp_path: Path) -> None:
    """Same tables, same columns in the same order, same version (SPEC §11)."""
    import psycopg

    Journal(pg_url, write=True).close()
    Journal(tmp_path / "j.sqlite3", write=True).close()
    with closing(sqlite3.connect(tmp_path / "j.sqlite3")) as lite:
        tables = [r[0] for r in lite.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        expected = {t: [r[1] for r in lite.execute(f"PRAGMA table_info({t})")]
                    for t in tables}
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name <> 'planrun_schema' "
            "ORDER BY table_name, ordinal_position").fetchall()
        (version,) = conn.execute("SELECT version FROM planrun_schema").fetchone() or (0,)
        types = dict(conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_name = 'runs'").fetchall())
    actual: dict[str, list[str]] = {}
    for table, column in rows:
        actual.setdefault(table, []).append(column)
    assert actual == expected
    assert version == SCHEMA_VERSION
    assert types["lease_expires"] == "double precision"
    assert types["lease_epoch"] == "bigint"
    assert types["plan_json"] == "text"


def test_processes_setting_up_one_new_database_at_once(pg_url: str) -> None:
    """The migration runs under an advisory lock: six first opens at once all succeed."""
    code = ("import sys; from planrun.journal import Journal; "
            "Journal(sys.argv[1], write=True).close()")
    procs = [subprocess.Popen([sys.executable, "-c", code, pg_url], stderr=subprocess.PIPE,
                              text=True) for _ in range(6)]
    for p in procs:
        _out, err = p.communicate(timeout=TIMEOUT_S)
        assert p.returncode == 0, err
    with Journal(pg_url, write=False) as j:
        assert j.run_ids() == []


# --- passwords and tools ------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["postgres:pa55word@", "?password=pa55word",
                                      "?pass%77ord=pa55word", "?sslpassword=pa55word"],
                         ids=["user-part", "parameter", "encoded-name", "ssl-key"])  # not in env
def test_tools_never_get_the_journals_password(cli: CliProject, pg_cluster: Any,
                                               monkeypatch: pytest.MonkeyPatch,
                                               spelling: str) -> None:
    """Neither in the URL nor as PGPASSWORD (the cluster trusts local users: unused).

    A URL whose password parameter has a percent-encoded name (libpq decodes it) was
    given to tools whole (found by an attacker).
    """
    name = pg_cluster.database("pw").split("///")[1].split("?")[0]
    if spelling.endswith("@"):
        url = f"postgresql://{spelling}/{name}?host={pg_cluster.sock}"
    else:
        url = f"postgresql://postgres@/{name}?host={pg_cluster.sock}&{spelling[1:]}"
    monkeypatch.setenv("PLANRUN_JOURNAL", url)
    monkeypatch.setenv("PGPASSWORD", "pgpa55word")
    cli.journal = url
    cli.write("envtool.py", """
        import json, os, sys
        print(json.dumps(dict(os.environ)))
    """)
    cli.tools("""
        tools:
          env:
            description: prints its environment
            command: ["{python}", "envtool.py"]
            output: json
            arguments: {type: object, additionalProperties: false}
    """.replace("{python}", sys.executable))
    cli.plan("env", """
        planrun: 1
        goal: show the environment
        steps:
          - {id: e, tool: env}
    """)
    r = cli.run("execute", "env", "--json")
    assert r.returncode == 0, r
    out = cli.probe().step("e").output
    assert "PLANRUN_JOURNAL" not in out
    assert "PGPASSWORD" not in out
    assert "HOME" in out  # the rest of the environment is there
    assert "pa55word" not in json.dumps(out)
    assert "pa55word" not in r.stdout + r.stderr
    for event in cli.probe().events():
        assert "pa55word" not in json.dumps(event.data)


# --- two hosts, one journal ---------------------------------------------------------------------


def _wait_for(predicate: Any, what: str, timeout: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_another_host_resumes_only_after_the_dead_hosts_lease_expires(
        cli: CliProject, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Host alpha is SIGKILLed mid-run; host beta is refused until alpha's lease expires.

    Then beta resumes: no completed step runs twice.
    """
    monkeypatch.setenv("PLANRUN_JOURNAL", pg_url)
    cli.journal = pg_url
    monkeypatch.setenv("PLANRUN_TEST_LEASE_TTL_S", "3")
    cli.tools(TOOLS)
    cli.plan("hold", HOLD)
    monkeypatch.setenv("PLANRUN_TEST_HOST", "alpha")
    alpha = cli.start("execute", "hold", "--json", name="alpha")
    cli.wait_started("w", alpha)
    run_id = cli.probe().run_ids()[0]
    lease = cli.probe().lease(run_id)
    assert lease is not None
    assert lease.owner.startswith("alpha:")
    os.killpg(alpha.pid, signal.SIGKILL)
    alpha.wait(timeout=TIMEOUT_S)

    monkeypatch.setenv("PLANRUN_TEST_HOST", "beta")
    r = cli.run("resume", run_id, "--json")
    assert r.returncode == 5, r
    assert r.error_code == "run_busy", r
    assert "another host" in r.stderr, r
    assert cli.probe().lease(run_id) is not None  # refused: nothing changed
    _wait_for(lambda: (cli.probe().lease(run_id) or lease).expired, "the lease to expire")
    cli.touch("go")
    r = cli.run("resume", run_id, "--json")
    assert r.returncode == 0, r
    assert r.json["status"] == "completed"
    assert cli.counts() == {"a": 1, "w": 1, "z": 1}
    run = cli.probe().run(run_id)
    assert run.lease is None


@pytest.mark.parametrize("cut", ["heartbeat", "both"])
def test_a_process_that_cannot_renew_its_lease_gives_the_run_up_before_it_runs_out(
        cli: CliProject, pg_url: str, monkeypatch: pytest.MonkeyPatch, cut: str) -> None:
    """The heartbeat's connection failed silently: the lease ran out while the process
    still drove the run, and a resume called its step a second time (found by an
    attacker). Now the process gives the run up two beats into failing renewals, before
    anyone can take it over; resume completes it, nothing runs twice.

    ``both``: the run's own connection ends too: the journal error ends the run at once
    (exit 6), not when the python call running in a thread ends (it waited for it)."""
    name = pg_url.split("///", 1)[1].split("?", 1)[0]
    role = f"alice_{name[-10:]}"  # roles are the cluster's: one per test
    _sql(pg_url, f"CREATE ROLE {role} LOGIN")
    _sql(pg_url, f'ALTER DATABASE "{name}" OWNER TO {role}')
    url = pg_url.replace("user=postgres", f"user={role}")
    monkeypatch.setenv("PLANRUN_JOURNAL", url)
    cli.journal = url
    monkeypatch.setenv("PLANRUN_TEST_LEASE_TTL_S", "3")
    cli.tools(TOOLS)
    cli.plan("hold", HOLD)
    first = cli.start("execute", "hold", "--json", name="first")
    cli.wait_started("w", first)
    import psycopg

    def backends() -> list[int]:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            return [int(r[0]) for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE usename = %s "
                "ORDER BY backend_start", (role,)).fetchall()]

    _wait_for(lambda: len(backends()) == 2, "the heartbeat's own connection")
    # The run's connection stays; the heartbeat's ends and no new one may be made: its
    # next renewals cannot reach the journal.
    _sql(pg_url, f"ALTER ROLE {role} CONNECTION LIMIT {1 if cut == 'heartbeat' else 0}")
    for pid in backends()[-1:] if cut == "heartbeat" else backends():
        _sql(pg_url, f"SELECT pg_terminate_backend({pid})")
    gave_up = cli.finish(first, timeout=30)  # before: it waited in w
    assert "could not be renewed" in gave_up.stderr or cut == "both", gave_up
    if cut == "heartbeat":
        assert gave_up.returncode == 5, gave_up
        assert "gave the run up before its lease could run out" in gave_up.stderr, gave_up
    else:
        assert gave_up.returncode == 6, gave_up
        assert "lost the connection to the PostgreSQL journal" in gave_up.stderr, gave_up

    _sql(pg_url, f"ALTER ROLE {role} CONNECTION LIMIT -1")
    cli.touch("go")
    (run_id,) = cli.probe().run_ids()
    _wait_for(lambda: (cli.probe().lease(run_id) is None
                       or cli.probe().lease(run_id).expired), "the lease to run out")
    done = cli.run("resume", run_id, "--json")
    assert done.returncode == 0, done
    assert cli.counts() == {"a": 1, "w": 1, "z": 1}


def _unshare_works() -> bool:
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                              capture_output=True, timeout=30, check=False).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def test_a_holder_in_another_pid_namespace_of_this_host_keeps_its_lease(
        cli: CliProject, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A container sharing the host's name (host network) is not this host's pid space.

    Its planrun's pid (1 there) was looked up here, found dead (or another process), and
    its live lease taken over at once: the holder was stopped mid-step, and the resume
    ran the idempotent step again beside the call still running (found by an attacker).
    """
    if not _unshare_works():
        pytest.skip("unshare --pid --fork --mount-proc is not available (needs root)")
    monkeypatch.setenv("PLANRUN_JOURNAL", pg_url)
    cli.journal = pg_url
    cli.tools(TOOLS)
    cli.plan("hold", HOLD)
    out, err = (cli.root.parent / "ns.out").open("wb"), (cli.root.parent / "ns.err").open("wb")
    with out, err:
        holder = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--mount-proc", *PLANRUN, "execute", "hold",
             "--json"], cwd=cli.root, env=cli.env(), stdin=subprocess.DEVNULL, stdout=out,
            stderr=err, start_new_session=True)
    holder.out_path = Path(out.name)  # type: ignore[attr-defined]
    holder.err_path = Path(err.name)  # type: ignore[attr-defined]
    cli.procs.append(holder)
    cli.wait_started("w", holder)
    (run_id,) = cli.probe().run_ids()
    lease = cli.probe().lease(run_id)
    assert lease is not None
    r = cli.run("resume", run_id, "--json")
    assert r.returncode == 5, r
    assert r.error_code == "run_busy", r
    assert "Traceback" not in r.stderr
    after = cli.probe().lease(run_id)
    assert after is not None
    assert (after.owner, after.epoch) == (lease.owner, lease.epoch)  # not taken over
    cli.touch("go")
    done = cli.finish(holder)
    assert done.returncode == 0, done
    assert cli.counts() == {"a": 1, "w": 1, "z": 1}


def test_unlock_releases_a_lease_of_another_host(cli: CliProject, pg_url: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANRUN_JOURNAL", pg_url)
    cli.journal = pg_url
    cli.tools(TOOLS)
    cli.plan("hold", HOLD)
    monkeypatch.setenv("PLANRUN_TEST_HOST", "alpha")
    alpha = cli.start("execute", "hold", "--json", name="alpha")
    cli.wait_started("w", alpha)
    run_id = cli.probe().run_ids()[0]
    os.killpg(alpha.pid, signal.SIGKILL)
    alpha.wait(timeout=TIMEOUT_S)
    monkeypatch.setenv("PLANRUN_TEST_HOST", "beta")
    assert cli.run("resume", run_id, "--json").returncode == 5
    u = cli.run("unlock", run_id)
    assert u.returncode == 0, u
    assert "alpha:" in u.stdout, u
    cli.touch("go")
    r = cli.run("resume", run_id, "--json")
    assert r.returncode == 0, r
    assert cli.counts() == {"a": 1, "w": 1, "z": 1}


def test_four_processes_on_four_runs_at_once(cli: CliProject, pg_url: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANRUN_JOURNAL", pg_url)
    cli.journal = pg_url
    cli.tools(TOOLS)
    cli.plan("fan", """
        planrun: 1
        goal: many small writes
        steps:
          - {id: a, tool: once, arguments: {label: a}}
          - id: f
            tool: idem
            depends_on: [a]
            for_each: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
            arguments: {value: "{item}"}
          - {id: z, tool: once, depends_on: [f], arguments: {label: z}}
    """)
    procs = []
    for host in ("h1", "h2", "h3", "h4"):
        monkeypatch.setenv("PLANRUN_TEST_HOST", host)
        procs.append(cli.start("execute", "fan", "--json", name=host))
    results = [cli.finish(p) for p in procs]
    for r in results:
        assert r.returncode == 0, r
        assert r.json["status"] == "completed", r
        assert "error" not in r.stderr.lower(), r
    assert len({r.json["run_id"] for r in results}) == 4
    counts = cli.counts()
    assert counts["a"] == counts["z"] == 4
    assert all(counts[f"f#{i}"] == 4 for i in range(20))


def test_batch_claimed_items_carry_their_arguments_digest(cli: CliProject, pg_url: str,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    # Issue 17: every dispatch record's step_started event has arguments_digest, also
    # the fan-out items PostgreSQL claims in one batch (FOR UPDATE SKIP LOCKED).
    import hashlib

    monkeypatch.setenv("PLANRUN_JOURNAL", pg_url)
    cli.journal = pg_url
    cli.tools(TOOLS)
    cli.plan("fan", """
        planrun: 1
        goal: items claimed in a batch
        steps:
          - {id: f, tool: idem, for_each: [1, 2, 3], arguments: {value: "{item}"}}
    """)
    r = cli.run("execute", "fan", "--json")
    assert r.returncode == 0, r
    log = cli.run("log", r.json["run_id"], "--json")
    digests = {e["item"]: e["data"]["arguments_digest"] for e in json.loads(log.stdout)
               if e["kind"] == "step_started" and e["item"] is not None}
    assert digests == {i: hashlib.sha256(f'{{"value":{i + 1}}}'.encode()).hexdigest()
                       for i in range(3)}


# --- the server restarts in the middle of a run ---------------------------------------------------


@pytest.fixture
def own_cluster() -> Any:
    """A cluster of this test's own (it is restarted)."""
    from pgcluster import Cluster, server_bindir

    bindir = server_bindir()
    if bindir is None:
        pytest.skip("no PostgreSQL server installed")
    cluster = Cluster.start(bindir)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.postgres
def test_a_server_restart_mid_run_fails_cleanly_and_resume_completes(
        cli: CliProject, own_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    url = own_cluster.database("restart")
    monkeypatch.setenv("PLANRUN_JOURNAL", url)
    cli.journal = url
    cli.tools(TOOLS)
    cli.plan("hold", HOLD)
    proc = cli.start("execute", "hold", "--json", name="exec")
    cli.wait_started("w", proc)
    own_cluster.restart()
    cli.touch("go")
    r = cli.finish(proc)
    text = one_error(r)
    assert "lost the connection to the PostgreSQL journal" in text, r
    run_id = cli.probe().run_ids()[0]
    r = cli.run("resume", run_id, "--json")
    assert r.returncode == 0, r
    assert r.json["status"] == "completed"
    counts = cli.counts()
    assert counts["a"] == 1  # what was committed stayed committed
    assert counts["z"] == 1
    assert 1 <= counts["w"] <= 2  # idempotent: its outcome was lost, so it ran again


# --- SQL written once, for both backends ------------------------------------------------------


def test_placeholders_become_psycopg_style_outside_literals() -> None:
    pytest.importorskip("psycopg")
    from planrun.journal.backends.postgres import pg_sql, pg_statement

    assert pg_sql("SELECT a FROM t WHERE b = ? AND c IN (?, ?)") == \
        "SELECT a FROM t WHERE b = %s AND c IN (%s, %s)"
    assert pg_sql("SELECT '?', \"x?\", ? WHERE d LIKE ? ESCAPE '\\'") == \
        "SELECT '?', \"x?\", %s WHERE d LIKE %s ESCAPE '\\'"
    assert pg_sql("SELECT 'it''s ?', 5 % 2, ?") == "SELECT 'it''s ?', 5 %% 2, %s"
    assert pg_statement("CREATE TABLE x (id INTEGER PRIMARY KEY, n INTEGER NOT NULL, "
                        "f REAL) WITHOUT ROWID") == (
        "CREATE TABLE x (id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, "
        "n BIGINT NOT NULL, f DOUBLE PRECISION)")


def test_every_sqlite_migration_has_a_postgresql_statement(pg_url: str) -> None:
    """Each migration step applies on PostgreSQL, one version after another."""
    import psycopg

    from planrun.journal.backends.postgres import pg_statement
    from planrun.journal.schema import MIGRATIONS

    with psycopg.connect(pg_url, autocommit=True) as conn:
        for version, statements in enumerate(MIGRATIONS):
            with conn.transaction():
                for statement in statements:
                    conn.execute(pg_statement(statement).encode())
            assert version < SCHEMA_VERSION


def test_without_psycopg_a_postgresql_journal_is_one_message(cli: CliProject,
                                                             tmp_path: Path) -> None:
    """psycopg is an optional extra: without it, exit 6 and what to install."""
    code = ("import sys; sys.modules['psycopg'] = None; from planrun.cli import main; "
            "sys.argv = ['planrun', *sys.argv[1:]]; main()")
    url = f"postgresql://alice:s3cret@/planrun?host={tmp_path}"
    proc = subprocess.run([sys.executable, "-c", code, "runs", "--journal", url],
                          cwd=cli.root, env=cli.env(), capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False)
    r = Result(argv=["runs"], returncode=proc.returncode, stdout=proc.stdout,
               stderr=proc.stderr)
    text = one_error(r)
    assert "pip install 'planrun[postgres]'" in text
    assert "s3cret" not in r.stdout + r.stderr


# --- batch claims of fan-out items -----------------------------------------------------------


def test_a_batch_claim_skips_an_item_another_transaction_holds_instead_of_waiting(
        pg_url: str) -> None:
    """``FOR UPDATE SKIP LOCKED``: an item row locked elsewhere is never waited for.

    The batch that asked for it fails at once (every item asked for must be claimed; a
    waiting writer would fail "stayed busy" after its 30 s lock_timeout) and writes
    nothing; once the other transaction ends, the same claim succeeds.
    """
    import psycopg

    run = "0123456789abcdef"
    with Journal(pg_url, write=True) as j:
        j.create_run(run=NewRun(
            run_id=run, root_run_id=run, plan_name="p", plan={"steps": []}, digest="0" * 64,
            revision=1, status="running", created_at=now(), params={}, contracts={},
            options={}, plan_file="plans/p.yaml"), steps=[("a", 0, "echo")])
        j.fanout_begin(run, "a", 2)
        with psycopg.connect(pg_url, autocommit=False) as other:
            other.execute("SELECT 1 FROM items WHERE item_index = 1 FOR UPDATE").fetchall()
            j.step_started(run, "a", attempt=1, key="k0", root_run_id=run, item=0, defer=True)
            j.step_started(run, "a", attempt=1, key="k1", root_run_id=run, item=1, defer=True)
            with pytest.raises(JournalError) as caught:
                j.flush()
            j.drop_deferred()
        # Skipped, not waited for: waiting would end in "stayed busy" after lock_timeout.
        assert "item(s) 0, 1 of step 'a'" in str(caught.value)
        assert "not pending" in str(caught.value)
        assert [i.status for i in j.items(run, "a")] == ["pending", "pending"]
        j.step_started(run, "a", attempt=1, key="k0", root_run_id=run, item=0, defer=True)
        j.step_started(run, "a", attempt=1, key="k1", root_run_id=run, item=1, defer=True)
        j.flush()
        assert [i.status for i in j.items(run, "a")] == ["running", "running"]


# --- the server-side writes (planrun_finish, planrun_start, planrun_claim) ------------------

MINE = f"{os.uname().nodename}:{os.getpid()}:aaaaaaaa"
THEIRS = f"{os.uname().nodename}:{os.getpid()}:bbbbbbbb"
WRITE_FUNCTIONS = ("planrun_begin", "planrun_finish", "planrun_start", "planrun_claim")


def _calls_journal(url: str, runs: tuple[str, ...] = ("0123456789abcdef",)) -> Journal:
    """A journal driving ``runs`` as a fresh run's process does: server-side writes.

    Each run has steps ``a`` and ``b`` and the fan-out step ``f`` (3 pending items); this
    handle holds every run's lease.
    """
    j = Journal(url, write=True)
    assert j.backend.calls is not None  # the writes below are the server's functions
    j.fresh_keys = True
    for run in runs:
        j.create_run(run=NewRun(
            run_id=run, root_run_id=run, plan_name="p", plan={"steps": []}, digest="0" * 64,
            revision=1, status="running", created_at=now(), params={}, contracts={},
            options={}, plan_file="plans/p.yaml", lease_owner=MINE),
            steps=[("a", 0, "echo"), ("b", 1, "echo"), ("f", 2, "echo")])
        j.fanout_begin(run, "f", 3)
    return j


def _take_over(j: Journal, url: str, run: str) -> None:
    """``j``'s lease of the run expires and another process takes it (its epoch goes up)."""
    j.renew_lease(run, MINE, ttl=-1.0)
    with Journal(url, write=True) as other:
        other.take_lease(run, THEIRS)


def _state(url: str, run: str) -> tuple[Any, ...]:
    """Everything the journal holds of a run's steps, items, keys and events."""
    from planrun.journal.probe import probe

    seen = probe(url)
    return (tuple((s.step_id, s.status, s.idempotency_key) for s in seen.steps(run)),
            tuple((i.index, i.status, i.idempotency_key) for i in seen.items("f", run)),
            tuple((e.kind, e.step, e.item) for e in seen.events(run)),
            tuple(seen.key(k) for k in ("k-a", "k-b", "k-b2", "k-f0", "k-f1", "k-f1b",
                                        "ok-a")))


@pytest.mark.parametrize("write", ["finish", "start", "claim"])
def test_a_server_side_write_checks_the_lease_and_rolls_back_the_whole_transaction(
        pg_url: str, write: str) -> None:
    """A lost lease found inside planrun_finish/start/claim: LeaseLost naming the holder.

    The write of the other run before it in the same transaction (whose lease holds) is
    rolled back with it: nothing of the transaction is written.
    """
    from planrun.journal.store import LeaseLost

    ok, lost = "0123456789abcdef", "fedcba9876543210"
    with _calls_journal(pg_url, (ok, lost)) as j:
        j.step_started(lost, "a", attempt=1, key="k-a", root_run_id=lost)
        j.step_started(ok, "a", attempt=1, key="ok-a", root_run_id=ok)
        _take_over(j, pg_url, lost)
        before = (_state(pg_url, ok), _state(pg_url, lost))
        j.step_finished(ok, "a", status="succeeded", key="ok-a", output=1, defer=True)
        if write == "finish":
            j.step_finished(lost, "a", status="succeeded", key="k-a", output=1, defer=True)
        elif write == "start":
            j.step_started(lost, "b", attempt=1, key="k-b", root_run_id=lost, defer=True)
        else:
            j.step_started(lost, "f", attempt=1, key="k-f0", root_run_id=lost, item=0,
                           defer=True)
            j.step_started(lost, "f", attempt=1, key="k-f1", root_run_id=lost, item=1,
                           defer=True)
        with pytest.raises(LeaseLost) as caught:
            j.flush()
        j.drop_deferred()
    assert caught.value.code == "run_busy"
    assert f"run {lost} is now held by {THEIRS}" in str(caught.value)
    assert (_state(pg_url, ok), _state(pg_url, lost)) == before


@pytest.mark.parametrize("write", ["finish", "start", "claim"])
def test_a_server_side_write_of_a_record_not_in_its_state_rolls_back_everything(
        pg_url: str, write: str) -> None:
    """planrun_finish/start/claim changing another number of rows than asked: JournalError.

    Its message names the record, and the transaction's earlier write (a valid outcome
    record) is rolled back with it.
    """
    run = "0123456789abcdef"
    with _calls_journal(pg_url, (run,)) as j:
        j.step_started(run, "a", attempt=1, key="k-a", root_run_id=run)
        j.step_started(run, "b", attempt=1, key="k-b", root_run_id=run)
        j.step_finished(run, "b", status="succeeded", key="k-b", output=2)
        j.step_started(run, "f", attempt=1, key="k-f1", root_run_id=run, item=1)
        j.step_finished(run, "f", status="succeeded", key="k-f1", output=1, item=1)
        before = _state(pg_url, run)
        j.step_finished(run, "a", status="succeeded", key="k-a", output=1, defer=True)
        if write == "finish":  # b succeeded already: it is not running
            j.step_finished(run, "b", status="failed", key="k-b", defer=True,
                            error={"code": "x", "message": "x"})
            expected = "step 'b' of run 0123456789abcdef was not running"
        elif write == "start":  # b succeeded already: it is not pending
            j.step_started(run, "b", attempt=2, key="k-b2", root_run_id=run, defer=True)
            expected = "step 'b' of run 0123456789abcdef is not pending"
        else:  # item 1 succeeded already: the batch of items 0 and 1 claims nothing
            j.step_started(run, "f", attempt=1, key="k-f0", root_run_id=run, item=0,
                           defer=True)
            j.step_started(run, "f", attempt=2, key="k-f1b", root_run_id=run, item=1,
                           defer=True)
            expected = "item(s) 0, 1 of step 'f' of run 0123456789abcdef are not pending"
        with pytest.raises(JournalError) as caught:
            j.flush()
        j.drop_deferred()
        assert expected in str(caught.value)
        assert _state(pg_url, run) == before
        j.step_finished(run, "a", status="succeeded", key="k-a", output=1)  # still usable
    assert _state(pg_url, run)[0][0] == ("a", "succeeded", "k-a")


def test_server_side_writes_write_what_the_journals_sql_writes(pg_url: str,
                                                               tmp_path: Path) -> None:
    """The same calls through planrun_* (PostgreSQL) and the journal's SQL (SQLite).

    Steps, items, keys and events (kind, step, item, data) come out the same; facets and
    a released key included.
    """
    run = "0123456789abcdef"
    lite = tmp_path / "j.sqlite3"
    seen = []
    for location in (pg_url, str(lite)):
        with Journal(location, write=True) as j:
            j.fresh_keys = True
            j.create_run(run=NewRun(
                run_id=run, root_run_id=run, plan_name="p", plan={"steps": []},
                digest="0" * 64, revision=1, status="running", created_at=now(),
                params={}, contracts={}, options={}, plan_file="plans/p.yaml",
                lease_owner=MINE), steps=[("a", 0, "echo"), ("b", 1, "echo"),
                                          ("f", 2, "echo")])
            assert (j.backend.calls is not None) == (location == pg_url)
            j.step_started(run, "a", attempt=1, key="k-a", root_run_id=run,
                           arguments_digest="d" * 64)
            j.step_finished(run, "a", status="succeeded", key="k-a", output={"é": [1]},
                            facets={"values": {"n": 1}, "cut": []}, defer=True,
                            event_data={"stderr_tail": "warn"})
            j.step_started(run, "b", attempt=1, key="k-b", root_run_id=run, defer=True)
            j.flush()
            j.step_finished(run, "b", status="failed", key="k-b",
                            error={"code": "tool_error", "message": "no"})
            j.fanout_begin(run, "f", 3)
            for i in (2, 0):
                j.step_started(run, "f", attempt=1, key=f"k-f{i}", root_run_id=run, item=i,
                               defer=True, arguments_digest=f"{i}" * 64)
            j.flush()
            j.step_finished(run, "f", status="succeeded", key="k-f2", output=2, item=2,
                            defer=True)
            j.step_finished(run, "f", status="indeterminate", key=None, item=0,
                            error={"code": "lost", "message": "?"}, defer=True)
            j.flush()
            steps = [(s.step_id, s.status, s.attempts, s.idempotency_key, s.output, s.error,
                      s.facets) for s in j.steps(run)]
            items = [(i.index, i.status, i.attempts, i.idempotency_key, i.output, i.error)
                     for i in j.items(run, "f")]
            events = [(e["kind"], e["step"], e["item"], e["data"]) for e in j.events(run)]
            keys = [j.succeeded_key(k) for k in ("k-a", "k-b", "k-f0", "k-f2")]
        seen.append((steps, items, events, keys))
    assert seen[0] == seen[1]
    assert seen[0][3] == [(True, {"é": [1]}), (False, None), (False, None), (True, 2)]


def _functions(url: str) -> dict[str, str | None]:
    """The planrun_* functions of the journal, with their comments."""
    import psycopg

    with psycopg.connect(url) as conn:
        return dict(conn.execute(
            "SELECT proname, obj_description(oid, 'pg_proc') FROM pg_proc "
            "WHERE proname LIKE 'planrun%'").fetchall())


def test_a_journal_without_the_write_functions_gets_them_when_opened_for_writing(
        pg_url: str) -> None:
    """A journal of the previous planrun: planrun_expect alone.

    Read, it stays as it is (a write would use the journal's SQL); opened for writing,
    the migration (under its lock) creates the functions, which the writes then use.
    """
    from planrun.journal.backends.postgres import FUNCTIONS_VERSION

    Journal(pg_url, write=True).close()
    _sql(pg_url, "DROP FUNCTION " + ", ".join(WRITE_FUNCTIONS))
    assert set(_functions(pg_url)) == {"planrun_expect"}
    with Journal(pg_url, write=False) as j:
        assert j.backend.calls is None
        assert j.run_ids() == []
    assert set(_functions(pg_url)) == {"planrun_expect"}
    run = "0123456789abcdef"
    with _calls_journal(pg_url, (run,)) as j:
        j.step_started(run, "a", attempt=1, key="k-a", root_run_id=run)
        j.step_finished(run, "a", status="succeeded", key="k-a", output=1)
        assert [s.status for s in j.steps(run)] == ["succeeded", "pending", "running"]
    functions = _functions(pg_url)
    assert set(functions) == {"planrun_expect", *WRITE_FUNCTIONS}
    assert functions["planrun_begin"] == f"planrun write functions {FUNCTIONS_VERSION}"


def test_a_journal_of_an_older_schema_migrates_with_the_write_functions(pg_url: str) -> None:
    """Schema version 4 (before facets) with planrun_expect alone: one migration, both."""
    import psycopg

    from planrun.journal.backends.postgres import EXPECT_FUNCTION, pg_statement
    from planrun.journal.schema import MIGRATIONS

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE planrun_schema (version BIGINT NOT NULL)")
        conn.execute("INSERT INTO planrun_schema (version) VALUES (4)")
        for statements in MIGRATIONS[:4]:
            for statement in statements:
                conn.execute(pg_statement(statement).encode())
        conn.execute(EXPECT_FUNCTION.encode())
    run = "0123456789abcdef"
    with _calls_journal(pg_url, (run,)) as j:
        j.step_started(run, "a", attempt=1, key="k-a", root_run_id=run)
        j.step_finished(run, "a", status="succeeded", key="k-a", output=1,
                        facets={"values": {}, "cut": []})
        assert j.steps(run)[0].facets == {"values": {}, "cut": []}  # version 5's column
    assert set(_functions(pg_url)) == {"planrun_expect", *WRITE_FUNCTIONS}


def test_newer_write_functions_are_never_replaced_by_older_ones(pg_url: str) -> None:
    """A newer planrun's functions (a higher version) stay as they are.

    Also when this planrun migrates (it found older ones, and a newer planrun created
    its own before this one got the migration's lock): they are read again under it.
    """
    import psycopg

    from planrun.journal.backends.postgres import PgConnection, migrate

    Journal(pg_url, write=True).close()
    _sql(pg_url, "COMMENT ON FUNCTION planrun_begin() IS 'planrun write functions 99'")
    _sql(pg_url, "DROP FUNCTION planrun_claim")
    with psycopg.connect(pg_url, autocommit=True) as raw:
        migrate(PgConnection(raw), pg_url)
    run = "0123456789abcdef"
    with _calls_journal(pg_url, (run,)) as j:
        j.step_started(run, "a", attempt=1, key="k-a", root_run_id=run)
    functions = _functions(pg_url)
    assert functions["planrun_begin"] == "planrun write functions 99"
    assert "planrun_claim" not in functions


def test_every_secret_a_url_can_carry_is_masked_where_it_is_shown() -> None:
    """libpq reads a password from ``password=``, ``sslpassword=`` (the SSL key's) and a
    ``dbname`` that is a whole connection string; none is shown, the rest is."""
    from planrun.journal.backends import shown_location

    cases = {
        "postgresql://u:pw1@h/db?sslmode=require": "postgresql://u:***@h/db?sslmode=require",
        "postgresql://u@h/db?sslpassword=pw2&sslmode=require":
            "postgresql://u@h/db?sslpassword=***&sslmode=require",
        "postgresql://u@h/db?ssl%70assword=pw3": "postgresql://u@h/db?ssl%70assword=***",
        "postgresql:///?dbname=host%3Dh%20password%3Dpw4": "postgresql:///?dbname=***",
        "postgresql:///?dbname=postgresql://u:pw5@h/db": "postgresql:///?dbname=***",
        "postgresql:///?dbname=plain&host=/tmp": "postgresql:///?dbname=plain&host=/tmp",
    }
    for url, shown in cases.items():
        assert shown_location(url) == shown, url


def test_only_a_login_password_in_the_url_keeps_pgpassword_from_libpq() -> None:
    """A PGPASSWORD kept from children (planrun.childenv) is handed to libpq unless the
    URL gives the login password itself: an SSL key's password (sslpassword=) is not
    one (a merge had the check call a helper that was renamed: every connect without
    PGPASSWORD in the environment raised NameError)."""
    from planrun.journal.backends.postgres import _login_password

    assert _login_password("postgresql://u:pw@h/db")
    assert _login_password("postgresql://u@h/db?password=pw")
    assert _login_password("postgresql://u@h/db?pass%77ord=pw")
    assert not _login_password("postgresql://u@h/db?sslpassword=pw")
    assert not _login_password("postgresql://u@h/db")
    assert not _login_password("postgresql://u@h/db?password=")
