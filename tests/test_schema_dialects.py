"""A ``$schema`` inside a contract does not turn planrun's strict checks off.

jsonschema switches to the validator class a ``$schema`` names whenever it enters a
subschema holding one (also a 2020-12 one, and the root's again through ``$ref: "#"``):
that class has none of planrun's strictness — ``2.0`` passed as an ``integer`` (SPEC
"Strict types") and patterns were matched by Python's backtracking ``re`` instead of RE2
(SPEC §4: no pattern can make planrun hang). Real ``planrun`` processes; the subprocess
timeout is the hang guard.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from harness import run_planrun

DRAFT_07 = "http://json-schema.org/draft-07/schema#"
DRAFT_2020 = "https://json-schema.org/draft/2020-12/schema"

MODULE = '''
import json, os

def record(**kwargs):
    with open(os.environ["SEEN_FILE"], "a") as f:
        f.write(json.dumps(kwargs) + "\\n")
    return kwargs
'''


def _project(root: Path, contract: object) -> dict[str, str]:
    (root / "plans").mkdir(parents=True)
    (root / "rec.py").write_text(MODULE)
    (root / "tools.yaml").write_text(
        "tools:\n  rec:\n    python: rec:record\n    arguments: " + json.dumps(contract) + "\n")
    return dict(os.environ, PLANRUN_JOURNAL=str(root / "journal.sqlite3"),
                SEEN_FILE=str(root / "seen.jsonl"))


def _plan(root: Path, arguments: object, for_each: object = None) -> None:
    step: dict[str, object] = {"id": "s", "tool": "rec", "arguments": arguments}
    if for_each is not None:
        step["for_each"] = for_each
    (root / "plans" / "p.json").write_text(json.dumps(
        {"planrun": 1, "goal": "g", "steps": [step]}))


def _issues(res: subprocess.CompletedProcess[str]) -> list[tuple[str, str]]:
    report = json.loads(res.stdout)
    return [(i["code"], i["path"]) for i in report["issues"]
            + [i for plan in report["plans"] for i in plan["issues"]]]


def test_a_fan_out_item_of_a_lenient_looking_shape_is_still_refused(tmp_path: Path) -> None:
    """2.0 was a fit (draft-07 integer), so 2.5, of the same shape, came from the memo."""
    contract = {"type": "object", "required": ["n"], "additionalProperties": False,
                "properties": {"n": {"$schema": DRAFT_07, "type": "integer"}}}
    env = _project(tmp_path, contract)
    _plan(tmp_path, {"n": "{item}"}, for_each=[1, 2.0, 2.5])
    res = run_planrun("execute", "p", "--json", "--keep-going", cwd=tmp_path, env=env)
    assert res.returncode == 1, res.stdout + res.stderr
    seen = [json.loads(line) for line in (tmp_path / "seen.jsonl").read_text().splitlines()]
    assert seen == [{"n": 1}]  # neither 2.0 nor 2.5 reached the tool
    assert "Traceback" not in res.stderr


def test_a_recursive_contract_with_a_root_schema_is_strict_at_every_level(
        tmp_path: Path) -> None:
    contract = {"$schema": DRAFT_2020, "type": "object", "additionalProperties": False,
                "properties": {"n": {"type": "integer"}, "child": {"$ref": "#"}}}
    env = _project(tmp_path, contract)
    _plan(tmp_path, {"child": {"child": {"n": 60.0}}})
    res = run_planrun("validate", "p", "--format", "json", cwd=tmp_path, env=env)
    assert res.returncode == 3, res.stdout + res.stderr
    assert _issues(res) == [("arguments", "/steps/0/arguments/child/child/n")]


def test_a_pattern_under_another_dialect_is_still_matched_in_linear_time(
        tmp_path: Path) -> None:
    contract = {"type": "object", "properties": {
        "name": {"$schema": DRAFT_07, "type": "string", "pattern": "^(a+)+$"}}}
    env = _project(tmp_path, contract)
    _plan(tmp_path, {"name": "a" * 60 + "!"})  # Python's re: 2^60 steps
    res = run_planrun("validate", "p", "--format", "json", cwd=tmp_path, env=env)
    assert res.returncode == 3, res.stdout + res.stderr
    assert _issues(res) == [("arguments", "/steps/0/arguments/name")]
