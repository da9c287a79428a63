"""Adversarial checks of issue 13's planning half (planners, approve, repair, mcp).

Each test reproduces a defect found by attacking the real CLI; real subprocesses, real
SIGKILL, a real SQLite journal.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

PLANRUN = [sys.executable, "-m", "planrun"]


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _wait_for(predicate: object, limit: float = 30.0) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc")
def test_a_planner_command_does_not_outlive_a_killed_planrun(tmp_path: Path) -> None:
    """SIGKILL of planrun while its planner command runs ends the planner too (SPEC §12)."""
    env = {**os.environ, "PLANRUN_JOURNAL": str(tmp_path / "j.sqlite3")}
    subprocess.run([*PLANRUN, "init"], cwd=tmp_path, env=env, check=True,
                   capture_output=True, stdin=subprocess.DEVNULL)
    (tmp_path / "slow.py").write_text(
        "import os, sys, time\n"
        "sys.stdin.read()\n"
        "open('planner.pid', 'w').write(str(os.getpid()))\n"
        "time.sleep(120)\n", encoding="utf-8")
    proc = subprocess.Popen([*PLANRUN, "plan", "say hi", "--planner", "cmd:python3 slow.py"],
                            cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pid_file = tmp_path / "planner.pid"
    try:
        assert _wait_for(lambda: pid_file.exists() and pid_file.read_text() != "")
        planner_pid = int(pid_file.read_text())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        gone = _wait_for(lambda: not _alive(planner_pid))
        if not gone:
            os.kill(planner_pid, signal.SIGKILL)
        assert gone, "the planner command outlived the planrun process that started it"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_mcp_reads_and_resumes_only_runs_of_its_own_project(tmp_path: Path) -> None:
    """A journal shared by projects (the default: one per user): the server of project A
    cannot read the outputs of, or resume, a run of project B (``unknown_run``)."""
    import anyio
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    journal = tmp_path / "shared.sqlite3"
    env = {**os.environ, "PLANRUN_JOURNAL": str(journal)}
    other, mine = tmp_path / "other", tmp_path / "mine"
    for folder in (other, mine):
        folder.mkdir()
        subprocess.run([*PLANRUN, "init"], cwd=folder, env=env, check=True,
                       capture_output=True, stdin=subprocess.DEVNULL)
    (other / "plans" / "secretive.yaml").write_text(
        "planrun: 1\ngoal: other project\nsteps:\n"
        "  - {id: s1, tool: say, arguments: {text: OTHER-PROJECT-DATA}}\n", encoding="utf-8")
    done = subprocess.run([*PLANRUN, "execute", "secretive", "--json"], cwd=other, env=env,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    import json

    run_id = json.loads(done.stdout)["run_id"]
    results: dict[str, Any] = {}

    async def main() -> None:
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "planrun", "mcp", "-C", str(mine), "--journal", str(journal)],
            env=env)
        async with stdio_client(params) as (r, w), ClientSession(r, w) as session:
            await session.initialize()
            for name, args in (("run_output", {"run": run_id, "step": "s1"}),
                               ("run_status", {"run": run_id}),
                               ("run_log", {"run": run_id}),
                               ("resume_run", {"run": run_id})):
                results[name] = await session.call_tool(name, args)

    anyio.run(main)
    for name, result in results.items():
        text = " ".join(getattr(c, "text", "") for c in result.content)
        assert result.is_error, (name, text)
        assert "OTHER-PROJECT-DATA" not in text, name
        assert "unknown_run" in text, (name, text)


def test_plan_out_never_replaces_a_file_that_is_not_a_regular_file(tmp_path: Path) -> None:
    """``--out /dev/stdout`` (or any device, FIFO) must not be replaced by a plan file."""
    env = {**os.environ, "PLANRUN_JOURNAL": str(tmp_path / "j.sqlite3")}
    subprocess.run([*PLANRUN, "init"], cwd=tmp_path, env=env, check=True,
                   capture_output=True, stdin=subprocess.DEVNULL)
    (tmp_path / "pl.py").write_text(
        "import json, sys\njson.load(sys.stdin)\n"
        "print(json.dumps({'planrun': 1, 'name': 'x', 'goal': 'g', 'steps': "
        "[{'id': 'a', 'tool': 'say', 'arguments': {'text': 'hi'}}]}))\n", encoding="utf-8")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = subprocess.run([*PLANRUN, "plan", "g", "--planner", "cmd:python3 pl.py",
                           "--out", str(fifo)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=60)
    import stat

    assert stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced by a plan file"
    assert done.returncode == 2, done.stderr
    assert "error[usage]" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.sqlite
def test_mcp_run_prefixes_match_only_runs_of_its_own_project(tmp_path: Path) -> None:
    """A prefix is matched against this project's runs: matched against the whole shared
    journal, an ambiguous one named the other project's run ids, a unique prefix of this
    project's run that another project's run also has was refused as ambiguous, and a
    foreign run answered differently from no run at all (found by an attacker)."""
    import json
    import sqlite3

    import anyio
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    journal = tmp_path / "shared.sqlite3"
    env = {**os.environ, "PLANRUN_JOURNAL": str(journal)}
    ids = {}
    for name in ("other", "mine"):
        folder = tmp_path / name
        folder.mkdir()
        subprocess.run([*PLANRUN, "init"], cwd=folder, env=env, check=True,
                       capture_output=True, stdin=subprocess.DEVNULL)
        (folder / "plans" / "p.yaml").write_text(
            "planrun: 1\ngoal: g\nsteps:\n  - {id: s1, tool: say, arguments: {text: hi}}\n",
            encoding="utf-8")
        done = subprocess.run([*PLANRUN, "execute", "p", "--json"], cwd=folder, env=env,
                              capture_output=True, text=True, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr
        ids[name] = json.loads(done.stdout)["run_id"]
    # The other project's run gets an id that shares its first 8 characters with mine.
    foreign = ids["mine"][:8] + "f" * (len(ids["mine"]) - 8)
    if foreign == ids["mine"]:
        foreign = ids["mine"][:8] + "e" * (len(ids["mine"]) - 8)
    with sqlite3.connect(journal) as conn:
        conn.execute("PRAGMA foreign_keys = OFF")
        for table, column in (("runs", "run_id"), ("runs", "root_run_id"), ("steps", "run_id"),
                              ("items", "run_id"), ("approvals", "run_id"),
                              ("events", "run_id"), ("idempotency_keys", "run_id"),
                              ("idempotency_keys", "root_run_id"), ("call_groups", "run_id")):
            conn.execute(f"UPDATE {table} SET {column} = ? WHERE {column} = ?",
                         (foreign, ids["other"]))
    results: dict[str, Any] = {}

    async def main() -> None:
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "planrun", "mcp", "-C", str(tmp_path / "mine"), "--journal",
                  str(journal)], env=env)
        async with stdio_client(params) as (r, w), ClientSession(r, w) as session:
            await session.initialize()
            for key, name, args in (
                    ("shared", "run_status", {"run": ids["mine"][:8]}),
                    ("output", "run_output", {"run": ids["mine"][:8], "step": "s1"}),
                    ("log", "run_log", {"run": ids["mine"][:8]}),
                    ("foreign", "run_status", {"run": foreign[:12]}),
                    ("none", "run_status", {"run": "0123456789ab"})):
                results[key] = await session.call_tool(name, args)

    anyio.run(main)

    def text(key: str) -> str:
        return " ".join(getattr(c, "text", "") for c in results[key].content)

    for key in ("shared", "output", "log"):
        assert not results[key].is_error, (key, text(key))
        assert foreign not in text(key) + json.dumps(results[key].structured_content)
    assert results["shared"].structured_content["run_id"] == ids["mine"]
    assert results["output"].structured_content["output"] is not None
    for key in ("foreign", "none"):
        assert results[key].is_error
        assert results[key].structured_content["error"]["code"] == "unknown_run"
    # a run of another project reads as no run at all: the same words
    assert text("foreign").replace(foreign[:12], "X") == text("none").replace(
        "0123456789ab", "X")
