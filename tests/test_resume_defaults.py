"""``resume`` without a run id and with a secret not given again (found by a fresh user).

- A journal may hold several projects' runs (the default journal is one per user):
  ``planrun resume`` takes this project's latest resumable run, as ``planrun runs`` lists
  them, never another project's (which it would check against this project's registry).
- A secret parameter is never journaled, so resume needs it again: the refusal says so
  (and how), instead of "the plan no longer passes validation".

Real processes; the run is cut short by planrun's own SIGKILL (``PLANRUN_TEST_CRASH``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = """\
tools:
  echo:
    python: t:echo
    idempotent: true
    arguments:
      type: object
      properties: {text: {type: string}}
      required: [text]
      additionalProperties: false
"""
PLAN = """\
planrun: 1
goal: two echoes
params:
  word: {type: string, secret: SECRET}
steps:
  - {id: a, tool: echo, arguments: {text: "{params.word}"}}
  - {id: b, tool: echo, depends_on: [a], arguments: {text: b}}
"""


def project(root: Path, secret: bool) -> Path:
    (root / "plans").mkdir(parents=True)
    (root / "tools.yaml").write_text(TOOLS)
    (root / "t.py").write_text("def echo(text):\n    return {'n': len(text)}\n")
    (root / "plans" / "p.yaml").write_text(PLAN.replace("SECRET", str(secret).lower()))
    (root / "planrun.toml").write_text("")
    return root


def planrun(root: Path, journal: Path, *args: str, crash: str | None = None
            ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLANRUN_")}
    env["PLANRUN_JOURNAL"] = str(journal)
    if crash:
        env["PLANRUN_TEST_CRASH"] = crash
    return subprocess.run([sys.executable, "-m", "planrun", *args], cwd=root, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    return tmp_path / "shared.sqlite3"


def crashed(root: Path, journal: Path) -> None:
    cut = planrun(root, journal, "execute", "p", "-p", "word=hello", crash="dispatch:b")
    assert cut.returncode < 0, cut  # SIGKILLed at b's dispatch


def test_resume_takes_this_projects_latest_run_not_another_projects(tmp_path: Path,
                                                                     journal: Path) -> None:
    mine = project(tmp_path / "mine", secret=False)
    other = project(tmp_path / "other", secret=False)
    crashed(mine, journal)
    res = planrun(other, journal, "resume")
    assert res.returncode == 5, res
    assert "error[run_not_resumable]" in res.stderr
    assert str(other.resolve()) in res.stderr
    res = planrun(mine, journal, "resume")
    assert res.returncode == 0, res
    assert "completed" in res.stdout


def test_resume_without_a_secret_says_to_give_it_again(tmp_path: Path, journal: Path) -> None:
    mine = project(tmp_path / "mine", secret=True)
    crashed(mine, journal)
    res = planrun(mine, journal, "resume")
    assert res.returncode == 3, res
    assert "error[param_missing]" in res.stderr
    assert "needs its secret parameter(s) 'word' again" in res.stderr
    assert "-p word=VALUE" in res.stderr
    assert "PLANRUN_PARAM_word" in res.stderr
    assert "no longer passes validation" not in res.stderr
    explained = planrun(mine, journal, "resume", "--explain")
    assert "resume needs the secret parameter(s) word again" in explained.stdout
    assert planrun(mine, journal, "resume", "-p", "word=hello").returncode == 0


def test_a_resume_refused_by_a_changed_contract_points_by_pointer(tmp_path: Path,
                                                                 journal: Path) -> None:
    """The journaled plan is no file anyone can open: its issues have no line (SPEC §4),
    and the refusal says what to do (found by a fresh operator: it named line 39 of a
    24-line plan file)."""
    mine = project(tmp_path / "mine", secret=False)
    crashed(mine, journal)
    tools = mine / "tools.yaml"
    tools.write_text(tools.read_text().replace("{text: {type: string}}",
                                               "{text: {type: integer}}"))
    res = planrun(mine, journal, "resume")
    assert res.returncode == 3, res
    assert "error[arguments]" in res.stderr
    assert "(plans/p.yaml): error[arguments]" in res.stderr  # no :LINE:COLUMN after it
    assert "/steps/1/arguments/text" in res.stderr
    assert "as journaled from plans/p.yaml" in res.stderr
    assert "planrun resume" in res.stderr
    assert "tools.yaml" in res.stderr
    refused = planrun(mine, journal, "resume", "--json")
    issues = [i for p in json.loads(refused.stdout)["plans"] for i in p["issues"]]
    assert {(i["line"], i["column"]) for i in issues} == {(None, None)}
    assert "/steps/1/arguments/text" in {i["path"] for i in issues}
