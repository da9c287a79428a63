"""The terminal experience (issue 6): progress, completions, show/graph/tools/schema/init."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness import run_planrun

ROOT = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

SLOW_TOOLS = '''
import time

def emit(n):
    return list(range(n))

def slow(i):
    time.sleep(0.15)
    return i * 2
'''

SLOW_REGISTRY = """
tools:
  emit:
    python: slowtools:emit
    idempotent: true
    arguments: {type: object, properties: {n: {type: integer}}, required: [n],
                additionalProperties: false}
  slow:
    python: slowtools:slow
    idempotent: true
    arguments: {type: object, properties: {i: {type: integer}}, required: [i],
                additionalProperties: false}
  wipe:
    python: slowtools:emit
    irreversible: true
    arguments: {type: object, properties: {n: {type: integer}}, required: [n],
                additionalProperties: false}
"""

FAN = """
planrun: 1
goal: Double slowly, one item at a time
params:
  n: {type: integer, default: 8, description: How many items}
steps:
  - id: emit
    tool: emit
    arguments: {n: "{params.n}"}
  - id: double
    tool: slow
    depends_on: [emit]
    for_each: "{steps.emit.output}"
    max_parallel: 1
    arguments: {i: "{item}"}
  - id: wipe
    tool: wipe
    depends_on: [double]
    arguments: {n: 1}
"""


def run(cwd: Path, *args: str, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    return run_planrun(*args, cwd=cwd, env=dict(os.environ, **(env or {})))


@pytest.fixture
def fan_project(tmp_path: Path) -> Path:
    root = tmp_path / "fanproj"
    (root / "plans").mkdir(parents=True)
    (root / "slowtools.py").write_text(SLOW_TOOLS)
    (root / "tools.yaml").write_text(SLOW_REGISTRY)
    (root / "plans" / "fan.yaml").write_text(FAN)
    return root


# --- progress ------------------------------------------------------------------------------


def test_live_progress_shows_the_fan_out_counter_on_a_terminal(fan_project: Path) -> None:
    pexpect = pytest.importorskip("pexpect")
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env["TERM"] = "xterm"
    child = pexpect.spawn(sys.executable, ["-m", "planrun", "execute", "fan",
                                           "--approve", "wipe"],
                          cwd=str(fan_project), env=env, encoding="utf-8", timeout=30,
                          dimensions=(40, 160))
    child.expect(r"double.*?(?<![0-9])[1-7]/8(?![0-9])")  # done/total while items run
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_progress_off_a_terminal_is_plain_lines_without_escape_codes(
        fan_project: Path) -> None:
    res = run(fan_project, "execute", "fan", "-p", "n=3", "--approve", "wipe")
    assert res.returncode == 0, res.stderr
    assert not ANSI.search(res.stderr)
    assert not ANSI.search(res.stdout)
    run_id = re.search(r"^planrun: run (\w+) ", res.stderr, flags=re.M)
    assert run_id is not None, res.stderr
    # every line of the run names it: a log several runs write to can be split by run
    tag = f"planrun: run {run_id.group(1)}: "
    assert f"{tag}double started (3 items)" in res.stderr
    assert f"{tag}wipe succeeded" in res.stderr
    # stdout holds only the result
    assert res.stdout.startswith("run ")
    quiet = run(fan_project, "execute", "fan", "-p", "n=3", "--approve", "wipe", "-q")
    assert quiet.returncode == 0
    assert quiet.stderr == ""


# --- show, graph, tools, schema -----------------------------------------------------------------


def test_show_lists_params_order_approvals_and_fan_out(fan_project: Path) -> None:
    res = run(fan_project, "show", "fan", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert [s["id"] for s in data["steps"]] == ["emit", "double", "wipe"]
    steps = {s["id"]: s for s in data["steps"]}
    assert steps["double"]["fan_out"] is True
    assert steps["wipe"]["approval"] == "irreversible"
    assert data["params"] == [{"name": "n", "type": "integer", "required": False,
                               "default": 8, "description": "How many items",
                               "secret": False}]
    text = run(fan_project, "show", "fan").stdout
    assert "needs approval (irreversible)" in text
    assert "n: integer (default 8)" in text


def test_graph_marks_irreversible_steps(fan_project: Path) -> None:
    mermaid = run(fan_project, "graph", "fan").stdout
    assert mermaid.startswith("flowchart TD")
    assert "emit --> double" in mermaid
    assert "double --> wipe" in mermaid
    assert '⚠ wipe' in mermaid
    assert "class wipe approval" in mermaid
    dot = run(fan_project, "graph", "fan", "--format", "dot").stdout
    assert dot.startswith('digraph "fan"')
    assert '"double" -> "wipe";' in dot
    assert re.search(r'"wipe" \[.*color=red', dot)
    if shutil.which("dot"):
        check = subprocess.run(["dot", "-Tsvg"], input=dot, text=True, capture_output=True)
        assert check.returncode == 0


def test_tools_lists_flags_and_arguments(fan_project: Path) -> None:
    data = json.loads(run(fan_project, "tools", "--json").stdout)
    by_name = {t["name"]: t for t in data}
    assert by_name["wipe"]["irreversible"] is True
    assert by_name["slow"]["idempotent"] is True
    assert by_name["slow"]["arguments"] == [{"name": "i", "type": "integer", "required": True}]


def test_schema_of_the_plan_format_validates_the_shipped_plans() -> None:
    from jsonschema import Draft202012Validator

    res = run(ROOT, "schema", "plan")
    schema = json.loads(res.stdout)
    Draft202012Validator.check_schema(schema)
    validator = Draft202012Validator(schema)
    for plan in sorted((ROOT / "plans").glob("*.yaml")):
        data = yaml.safe_load(plan.read_text())
        assert list(validator.iter_errors(data)) == [], plan.name
    assert list(validator.iter_errors({"planrun": 1, "goal": "g", "steps": [
        {"id": "a", "tool": "t", "colour": "red"}]}))  # unknown fields are refused
    tools = json.loads(run(ROOT, "schema", "tools").stdout)
    assert list(Draft202012Validator(tools).iter_errors(
        yaml.safe_load((ROOT / "tools.yaml").read_text()))) == []


# --- init ----------------------------------------------------------------------------------------


def test_init_then_execute_hello_works_and_init_never_overwrites(tmp_path: Path) -> None:
    folder = tmp_path / "fresh"
    folder.mkdir()
    res = run(folder, "init")
    assert res.returncode == 0, res.stderr
    assert run(folder, "validate").returncode == 0
    res = run(folder, "execute", "hello", "--json")
    assert res.returncode == 0, res.stderr
    run_id = json.loads(res.stdout)["run_id"]
    out = run(folder, "output", run_id, "signature")
    assert json.loads(out.stdout) == "hello, from planrun"
    before = (folder / "tools.yaml").read_text()
    (folder / "tools.yaml").write_text(before + "# mine\n")
    again = run(folder, "init")
    assert again.returncode == 2
    assert "refusing to overwrite" in again.stderr
    assert (folder / "tools.yaml").read_text() == before + "# mine\n"


# --- completions ------------------------------------------------------------------------------


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_shipped_completion_scripts_match_the_cli(shell: str) -> None:
    res = run(ROOT, "completion", shell)
    assert res.returncode == 0
    shipped = (ROOT / "completions" / f"planrun.{shell}").read_text()
    assert shipped == res.stdout, f"regenerate: planrun completion {shell} > completions/..."


def test_bash_completion_offers_plan_names_and_run_ids(fan_project: Path,
                                                         tmp_path: Path) -> None:
    if not shutil.which("bash"):
        pytest.skip("no bash")
    res = run(fan_project, "execute", "fan", "-p", "n=1", "--approve", "wipe", "--json")
    run_id = json.loads(res.stdout)["run_id"]
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "planrun").write_text(f"#!/bin/sh\nexec {sys.executable} -m planrun \"$@\"\n")
    (shim / "planrun").chmod(0o755)
    script = (ROOT / "completions" / "planrun.bash").read_text()
    probe = f"""
{script}
COMP_WORDS=(planrun execute f); COMP_CWORD=2; _planrun_completion planrun
echo "plans:${{COMPREPLY[*]}}"
COMP_WORDS=(planrun status {run_id[:3]}); COMP_CWORD=2; _planrun_completion planrun
echo "runs:${{COMPREPLY[*]}}"
COMP_WORDS=(planrun res); COMP_CWORD=1; _planrun_completion planrun
echo "commands:${{COMPREPLY[*]}}"
"""
    env = dict(os.environ, PATH=f"{shim}:{os.environ['PATH']}")
    out = subprocess.run(["bash", "-c", probe], cwd=fan_project, env=env, text=True,
                         capture_output=True, timeout=60)
    lines = dict(line.split(":", 1) for line in out.stdout.splitlines() if ":" in line)
    assert lines["plans"].split() == ["fan"]
    assert lines["runs"].split() == [run_id]
    assert set(lines["commands"].split()) == {"resolve", "resume"}
