"""``planrun status``'s ``next`` says what ``planrun resume`` would really do (SPEC §4).

A run that died (``PLANRUN_TEST_CRASH``: before its second step's dispatch) is
resumable; resume rebuilds the journaled plan against the tools.yaml and policy of that
moment and refuses it when it no longer passes, or asks for secrets again. ``next`` had
said ``planrun resume RUN`` regardless (found by a review): now it names the ``-p`` resume
needs, or ``planrun resume RUN --explain`` with ``resume_refused`` saying why, and what it
names is what resume then does. Real planrun processes, a real SQLite journal.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from harness import run_planrun

TOOLS = f"""
tools:
  count:
    command: ["{sys.executable}", "-c", "pass"]
    idempotent: true
    arguments:
      type: object
      properties: {{n: {{type: NTYPE}}, token: {{type: string}}}}
      required: [n]
"""
PLAN = """
planrun: 1
goal: count twice
params:
  token: {type: string, secret: true}
steps:
  - {id: a, tool: count, arguments: {n: 1}}
  - {id: b, tool: count, depends_on: [a], arguments: {n: 2, token: "{params.token}"}}
"""


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "plans").mkdir()
    (tmp_path / "plans" / "p.yaml").write_text(PLAN)
    (tmp_path / "tools.yaml").write_text(TOOLS.replace("NTYPE", "integer"))
    return tmp_path


def planrun(root: Path, *args: str, **env: str) -> tuple[int, str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("PLANRUN_")}
    base["PLANRUN_JOURNAL"] = str(root / "j.sqlite3")
    r = run_planrun(*args, cwd=root, env={**base, **env})
    return r.returncode, r.stdout, r.stderr


def died(root: Path) -> str:
    """A run of ``p`` whose planrun died before step b: its id."""
    code, out, err = planrun(root, "execute", "p", "-p", "token=t0k", "--json",
                             PLANRUN_TEST_CRASH="dispatch:b")
    assert code != 0, err
    code, out, err = planrun(root, "runs", "--json")
    run_id = str(json.loads(out)[0]["run_id"])
    return run_id


def status(root: Path, run_id: str, **env: str) -> dict:
    code, out, err = planrun(root, "status", run_id, "--json", **env)
    assert code == 0, err
    return dict(json.loads(out))


def test_next_asks_for_the_secrets_resume_needs(root: Path) -> None:
    run_id = died(root)
    m = status(root, run_id)
    assert m["resumable"] is True
    assert m["next"] == f"planrun resume {run_id} -p token=VALUE"
    assert "resume_refused" not in m
    # given to this process, the secret is at hand: plain resume
    assert status(root, run_id, PLANRUN_PARAM_TOKEN="t0k")["next"] == \
        f"planrun resume {run_id}"
    code, _, err = planrun(root, "resume", run_id, "--json")
    assert code == 3, err  # what plain resume does
    code, out, err = planrun(root, "resume", run_id, "-p", "token=t0k", "--json")
    assert code == 0, err
    assert json.loads(out)["status"] == "completed"


def test_next_does_not_offer_a_resume_that_would_be_refused(root: Path) -> None:
    run_id = died(root)
    (root / "tools.yaml").write_text(TOOLS.replace("NTYPE", "string"))  # n no longer fits
    m = status(root, run_id, PLANRUN_PARAM_TOKEN="t0k")
    assert m["next"] == f"planrun resume {run_id} --explain"
    refused = m["resume_refused"]
    assert "no longer passes validation" in refused["message"]
    code, out, err = planrun(root, "status", run_id, PLANRUN_PARAM_TOKEN="t0k")
    assert code == 0, err
    assert f"resume would refuse it: [{refused['code']}]" in out
    assert f"next: planrun resume {run_id} --explain" in out
    # the hint is right: resume refuses with that code, --explain says why
    code, out, err = planrun(root, "resume", run_id, "--json", PLANRUN_PARAM_TOKEN="t0k")
    assert code == 3, err
    assert json.loads(out)["error"]["code"] == refused["code"]
    code, out, err = planrun(root, "resume", run_id, "--explain", "--json",
                             PLANRUN_PARAM_TOKEN="t0k")
    assert code == 0, err
    assert json.loads(out)["revalidation"]["ok"] is False
    # the contract put back: resume is offered again, and works
    (root / "tools.yaml").write_text(TOOLS.replace("NTYPE", "integer"))
    assert status(root, run_id, PLANRUN_PARAM_TOKEN="t0k")["next"] == \
        f"planrun resume {run_id}"
    code, out, err = planrun(root, "resume", run_id, "--json", PLANRUN_PARAM_TOKEN="t0k")
    assert code == 0, err


def test_a_broken_registry_is_not_a_resume_either(root: Path) -> None:
    run_id = died(root)
    (root / "tools.yaml").write_text("tools: [not, a, mapping]\n")
    m = status(root, run_id, PLANRUN_PARAM_TOKEN="t0k")
    assert m["next"] == f"planrun resume {run_id} --explain"
    code, out, _ = planrun(root, "resume", run_id, "--json", PLANRUN_PARAM_TOKEN="t0k")
    assert code == 3
    assert json.loads(out)["error"]["code"] == m["resume_refused"]["code"]


BOOM = f"""
  boom:
    command: ["{sys.executable}", "-c", "import sys; sys.exit(4)"]
    arguments:
      type: object
      properties: {{token: {{type: string}}}}
"""


def test_next_does_not_offer_a_retry_that_would_be_refused(root: Path) -> None:
    """``retry`` rebuilds the journaled plan as resume does: the same class of hint."""
    (root / "tools.yaml").write_text(TOOLS.replace("NTYPE", "integer") + BOOM)
    (root / "plans" / "p.yaml").write_text(PLAN.replace("tool: count, depends_on: [a]",
                                                        "tool: boom, depends_on: [a]")
                                           .replace("n: 2, ", ""))
    code, out, err = planrun(root, "execute", "p", "-p", "token=t0k", "--json")
    assert code == 1, err
    run_id = json.loads(out)["run_id"]
    assert status(root, run_id)["next"] == f"planrun retry {run_id} -p token=VALUE"
    code, _, _ = planrun(root, "retry", run_id, "--json")
    assert code == 3  # plain retry asks for the secret
    assert status(root, run_id, PLANRUN_PARAM_TOKEN="t0k")["next"] == \
        f"planrun retry {run_id}"
    (root / "tools.yaml").write_text(TOOLS.replace("NTYPE", "string") + BOOM)
    m = status(root, run_id, PLANRUN_PARAM_TOKEN="t0k")
    assert m["next"] == "planrun execute p"  # the plan file as it is now, anew
    code, out, _ = planrun(root, "retry", run_id, "--json", PLANRUN_PARAM_TOKEN="t0k")
    assert code == 3
    assert json.loads(out)["error"]["code"] == m["retry_refused"]["code"]
    code, out, _ = planrun(root, "status", run_id, PLANRUN_PARAM_TOKEN="t0k")
    assert f"retry would refuse it: [{m['retry_refused']['code']}]" in out
