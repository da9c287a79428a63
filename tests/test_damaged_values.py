"""A journal whose stored JSON was damaged: one clear journal error (exit 6), never a
traceback, and nothing of the run is lost (mended, it resumes to the end)."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

TOOLS = """\
tools:
  give:
    python: dtools:give
    idempotent: true
    arguments: {type: object, properties: {v: {}}, additionalProperties: false}
"""
PLAN = """\
planrun: 1
goal: a step reads the output of the step before
steps:
  - {id: s1, tool: give, arguments: {v: 1}}
  - {id: s2, tool: give, depends_on: [s1], arguments: {v: "{steps.s1.output.v}"}}
"""


def planrun(root: Path, *args: str, crash: str | None = None
            ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PLANRUN_JOURNAL": str(root / "j.sqlite3")}
    if crash:
        env["PLANRUN_TEST_CRASH"] = crash
    return subprocess.run([sys.executable, "-m", "planrun", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120, check=False,
                          stdin=subprocess.DEVNULL)


def set_output(root: Path, text: str) -> None:
    with sqlite3.connect(root / "j.sqlite3") as conn:
        conn.execute("UPDATE steps SET output_json = ? WHERE step_id = 's1'", (text,))


def test_a_damaged_output_is_a_journal_error_and_the_run_resumes_once_mended(
        tmp_path: Path) -> None:
    (tmp_path / "plans").mkdir()
    (tmp_path / "tools.yaml").write_text(TOOLS)
    (tmp_path / "dtools.py").write_text("def give(v=None):\n    return {'v': v}\n")
    (tmp_path / "plans" / "two.yaml").write_text(PLAN)
    assert planrun(tmp_path, "execute", "two", crash="dispatch:s2").returncode == -9
    set_output(tmp_path, "{bad")
    for args in (["resume"], ["output", "last", "s1"]):
        proc = planrun(tmp_path, *args)
        assert proc.returncode == 6, (args, proc.stdout, proc.stderr)
        # resume names the run it stopped (planrun.runner.journal_stopped)
        said = "run " if args == ["resume"] else ""
        assert re.search(rf"error\[journal\]: {said}.*the journal holds a damaged value",
                         proc.stderr), proc.stderr
        assert "Traceback" not in proc.stderr
    explained = planrun(tmp_path, "resume", "--explain")  # says what resume would do
    assert explained.returncode == 0, explained.stderr
    assert "replay  s1" in explained.stdout
    set_output(tmp_path, '{"v": 1}')
    done = planrun(tmp_path, "resume")
    assert done.returncode == 0, done.stderr
    assert "2/2 succeeded" in done.stdout
