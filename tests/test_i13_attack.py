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
