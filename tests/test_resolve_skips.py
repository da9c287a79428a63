"""After ``planrun resolve``, a skipped step's reason is true again (found by a review).

A step skipped because its dependency was ``indeterminate`` kept "dependency 'x'
indeterminate" in ``status`` (and the report) after ``x`` was resolved, so the run's
page said something false. Now resolve rewrites, in the same transaction, the reason of
each step skipped because of the resolved step, and its ``indeterminate_resolved`` event
lists them (``planrun log``). A step skipped because *its* dependency was skipped keeps
its reason, which stays true. Real planrun processes, a real SQLite journal.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from harness import run_planrun

TOOLS = f"""
tools:
  slow:
    command: ["{sys.executable}", "-c", "import time; time.sleep(30)"]
    arguments: {{type: object}}
  ok:
    command: ["{sys.executable}", "-c", "pass"]
    arguments: {{type: object}}
"""
PLAN = """
planrun: 1
goal: one slow step and what hangs on it
steps:
  - {id: x, tool: slow, timeout: 0.3, arguments: {}}
  - {id: y, tool: ok, depends_on: [x], arguments: {}}
  - {id: z, tool: ok, depends_on: [y], arguments: {}}
  - {id: w, tool: ok, arguments: {}}
"""


def planrun(root: Path, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLANRUN_")}
    env["PLANRUN_JOURNAL"] = str(root / "j.sqlite3")
    r = run_planrun(*args, cwd=root, env=env)
    return r.returncode, r.stdout, r.stderr


@pytest.fixture
def run_id(tmp_path: Path) -> str:
    """A failed run (--keep-going): x timed out (indeterminate), y and z skipped."""
    (tmp_path / "plans").mkdir()
    (tmp_path / "plans" / "p.yaml").write_text(PLAN)
    (tmp_path / "tools.yaml").write_text(TOOLS)
    code, out, err = planrun(tmp_path, "execute", "p", "--keep-going", "--json")
    assert code == 1, err
    m = json.loads(out)
    steps = {s["id"]: s for s in m["steps"]}
    assert steps["x"]["status"] == "indeterminate"
    assert steps["y"]["error"]["message"] == "dependency 'x' indeterminate"
    return str(m["run_id"])


def _steps(root: Path, run_id: str) -> dict[str, Any]:
    code, out, err = planrun(root, "status", run_id, "--json")
    assert code == 0, err
    return {s["id"]: s for s in json.loads(out)["steps"]}


@pytest.mark.parametrize(("how", "said"), [
    ("--succeeded", "dependency 'x' indeterminate when the run stopped; resolved as "
     "succeeded since"),
    ("--failed", "dependency 'x' failed (resolved as failed)")])
def test_a_skip_reason_says_what_became_of_the_resolved_step(
        tmp_path: Path, run_id: str, how: str, said: str) -> None:
    code, _, err = planrun(tmp_path, "resolve", run_id, "x", how)
    assert code == 0, err
    steps = _steps(tmp_path, run_id)
    assert steps["x"]["status"] == ("succeeded" if how == "--succeeded" else "failed")
    assert steps["y"]["status"] == "skipped"
    assert steps["y"]["error"] == {"code": "dependency", "message": said}
    assert steps["z"]["error"] == {"code": "dependency",
                                   "message": "dependency 'y' skipped"}  # still true
    code, out, err = planrun(tmp_path, "status", run_id)
    assert code == 0, err
    assert "dependency 'x' indeterminate\n" not in out + "\n"
    assert said in out
    code, out, err = planrun(tmp_path, "log", run_id, "--json")
    assert code == 0, err
    events = [json.loads(line) for line in out.splitlines() if line.strip()] \
        if not out.lstrip().startswith("[") else json.loads(out)
    resolved = [e for e in events if e.get("kind") == "indeterminate_resolved"]
    assert resolved
    assert resolved[-1]["data"]["skips"] == {"y": said}
    # retry runs the skipped steps; the parent keeps reasons that stay true
    code, out, err = planrun(tmp_path, "retry", run_id, "--json")
    if how == "--succeeded":
        assert code == 0, err
        assert json.loads(out)["status"] == "completed"
    assert _steps(tmp_path, run_id)["y"]["error"]["message"] == said
