"""Every input gets an issue with a code, never a traceback or a hang (issue 9 §4).

Each example of the issue and each sibling found runs the real ``planrun`` process with a
10-second hang guard: regular expressions (compiled and matched with RE2, checked at
validation), self-referencing schemas, lone surrogates, integers Python cannot print or
SQLite cannot store, quadratic-time parsing, undecodable command-line bytes, and a journal
on read-only storage.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from harness import PLANRUN, run_planrun

#: No input may keep planrun busy longer than this (seconds).
HANG_S = 10

MODULE = '''
def echo(**kwargs):
    return kwargs

def give(value):
    return value
'''

BASE_TOOLS: dict[str, Any] = {
    "echo": {"python": "mod:echo", "arguments": {"type": "object"}},
    "give": {"python": "mod:give", "arguments": {
        "type": "object", "properties": {"value": {}}, "required": ["value"]}},
}

CATASTROPHIC = "^(a+)+$"
EVIL_TEXT = "a" * 40 + "!"


class Proj:
    def __init__(self, root: Path, tools: dict[str, Any] | None = None) -> None:
        self.root = root
        (root / "plans").mkdir(parents=True)
        (root / "mod.py").write_text(MODULE)
        self.tools({})
        if tools:
            self.tools(tools)
        self.journal = root / "journal.sqlite3"

    def tools(self, tools: dict[str, Any]) -> None:
        (self.root / "tools.yaml").write_text(
            json.dumps({"tools": {**BASE_TOOLS, **tools}}, indent=1))

    def plan(self, name: str, data: Any, suffix: str = ".yaml") -> None:
        text = data if isinstance(data, str) else json.dumps(data, indent=1)
        (self.root / "plans" / f"{name}{suffix}").write_text(text)

    def run(self, *args: str | bytes, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
        full = {**os.environ, "PLANRUN_JOURNAL": str(self.journal), **(env or {})}
        res = run_planrun(*args, cwd=self.root, env=full, errors="replace", timeout=HANG_S)
        assert "Traceback" not in res.stderr, res.stderr
        return res


def one_param_plan(schema: dict[str, Any]) -> dict[str, Any]:
    return {"planrun": 1, "goal": "g", "params": {"p": schema},
            "steps": [{"id": "s", "tool": "give", "arguments": {"value": "{params.p}"}}]}


def tool_plan(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"planrun": 1, "goal": "g", "steps": [{"id": "s", "tool": tool,
                                                  "arguments": arguments}]}


def report(res: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(res.stdout)
    return data


def all_codes(res: subprocess.CompletedProcess[str]) -> list[str]:
    data = report(res)
    return [i["code"] for i in data["issues"]] + [
        i["code"] for p in data["plans"] for i in p["issues"]]


@pytest.fixture
def proj(tmp_path: Path) -> Proj:
    return Proj(tmp_path / "p")


# --- regular expressions ---------------------------------------------------------------

BAD_PATTERNS = ["(", "a{99999999999}", "a{1001}", "(?=a)b", r"(a)\1", "[z-a]"]


@pytest.mark.parametrize("pattern", BAD_PATTERNS)
def test_a_bad_pattern_in_a_parameter_schema_is_schema(proj: Proj, pattern: str) -> None:
    proj.plan("p", one_param_plan({"type": "string", "pattern": pattern}))
    res = proj.run("validate", "--format", "json")
    assert res.returncode == 3
    assert all_codes(res) == ["schema"]
    issue = report(res)["plans"][0]["issues"][0]
    assert issue["path"] == "/params/p/pattern"
    assert issue["line"] is not None


@pytest.mark.parametrize("where", ["pattern", "patternProperties", "output_schema",
                                   "format"])
@pytest.mark.parametrize("pattern", BAD_PATTERNS[:2])
def test_a_bad_pattern_in_a_tool_contract_is_registry(proj: Proj, where: str,
                                                      pattern: str) -> None:
    schema: dict[str, Any] = {"type": "object"}
    tool: dict[str, Any] = {"python": "mod:echo", "arguments": schema}
    if where == "pattern":
        schema["properties"] = {"x": {"type": "string", "pattern": pattern}}
    elif where == "patternProperties":
        schema["patternProperties"] = {pattern: {"type": "string"}}
    elif where == "output_schema":
        tool["output_schema"] = {"type": "object", "properties": {
            "x": {"anyOf": [{"pattern": pattern}]}}}
    else:  # a value checked against format: regex is a pattern too (at call time)
        schema["properties"] = {"x": {"type": "string", "format": "regex"}}
    proj.tools({"t": tool})
    if where == "format":
        proj.plan("p", tool_plan("t", {"x": pattern}))
        res = proj.run("validate", "--format", "json")
        assert res.returncode == 3
        assert all_codes(res) == ["arguments"]
        return
    res = proj.run("validate", "--format", "json")
    assert res.returncode == 3
    assert all_codes(res) == ["registry"]
    assert report(res)["issues"][0]["line"] is not None


def test_a_bad_pattern_in_a_pydantic_contract_is_registry(proj: Proj) -> None:
    (proj.root / "models.py").write_text(
        "from pydantic import BaseModel, Field\n"
        "class M(BaseModel):\n"
        "    x: str = Field(json_schema_extra={'pattern': '(?<=a)b'})\n"
        "def f(x):\n    return x\n")
    proj.tools({"t": {"python": "models:f", "accepts": "models:M"}})
    res = proj.run("validate", "--format", "json")
    assert res.returncode == 3
    assert all_codes(res) == ["registry"]
    assert "lookbehind" in report(res)["issues"][0]["message"]


@pytest.mark.parametrize("pattern", BAD_PATTERNS[:2])
def test_a_bad_pattern_in_a_grant_is_config(proj: Proj, pattern: str) -> None:
    (proj.root / "planrun.toml").write_text(
        "[[policy.grants]]\nid = 'g'\ntool = 'echo'\ngranted_by = 'me'\n"
        "expires = 2099-01-01T00:00:00Z\n"
        "arguments = {type = 'object', properties = {x = {pattern = "
        + json.dumps(pattern) + "}}}\n")
    res = proj.run("validate", "--format", "json")
    assert res.returncode == 3
    assert all_codes(res) == ["config"]


def test_catastrophic_pattern_against_a_parameter_answers_at_once(proj: Proj) -> None:
    proj.plan("p", one_param_plan({"type": "string", "pattern": CATASTROPHIC}))
    res = proj.run("validate", "-p", f"p={EVIL_TEXT}", "--format", "json")
    assert res.returncode == 3
    assert all_codes(res) == ["param_type"]
    res = proj.run("validate", "-p", "p=" + "a" * 100_000 + "!", "--format", "json")
    assert all_codes(res) == ["param_type"]
    assert proj.run("validate", "-p", "p=aaaa").returncode == 0


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"x": {"type": "string", "pattern": CATASTROPHIC}}},
    {"type": "object", "patternProperties": {CATASTROPHIC: {}}, "additionalProperties": False},
    {"type": "object", "patternProperties": {CATASTROPHIC: {}},
     "unevaluatedProperties": False},
    {"type": "object", "propertyNames": {"pattern": CATASTROPHIC}},
], ids=["pattern", "additionalProperties", "unevaluatedProperties", "propertyNames"])
def test_catastrophic_pattern_in_a_contract_answers_at_once(proj: Proj,
                                                            schema: dict[str, Any]) -> None:
    proj.tools({"t": {"python": "mod:echo", "arguments": schema}})
    key = "x" if "properties" in schema else EVIL_TEXT
    proj.plan("p", tool_plan("t", {key: EVIL_TEXT}))
    res = proj.run("validate", "--format", "json")
    assert res.returncode == 3
    assert all_codes(res) == ["arguments"]


def test_catastrophic_pattern_in_an_output_schema_fails_the_step(proj: Proj) -> None:
    proj.tools({"t": {"python": "mod:give", "arguments": BASE_TOOLS["give"]["arguments"],
                      "output_schema": {"type": "string", "pattern": CATASTROPHIC}}})
    proj.plan("p", tool_plan("t", {"value": EVIL_TEXT}))
    res = proj.run("execute", "p", "--json")
    assert res.returncode == 1
    step = report(res)["steps"][0]
    assert step["error"]["code"] == "output"


def test_patterns_follow_json_schema_ecma_conventions(proj: Proj) -> None:
    # \uXXXX (ECMA-262) is accepted; $ matches only at the end; \d is ASCII
    proj.plan("p", one_param_plan({"type": "string", "pattern": "^\\u00e9\\d$"}))
    assert proj.run("validate", "-p", "p=é1").returncode == 0
    assert proj.run("validate", "-p", "p=é1\n").returncode == 3
    assert proj.run("validate", "-p", "p=é٣").returncode == 3


# --- schemas that never finish -----------------------------------------------------------

@pytest.mark.parametrize("schema", [
    {"$ref": "#"},
    {"$ref": "#", "default": 1},
    {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}},
     "$ref": "#/$defs/a"},
    {"anyOf": [{"not": {"$ref": "#"}}]},
], ids=["self", "self-default", "mutual", "anyOf-not"])
def test_a_reference_loop_is_a_schema_issue(proj: Proj, schema: dict[str, Any]) -> None:
    proj.plan("p", one_param_plan(schema))
    res = proj.run("validate", "--format", "json")
    assert res.returncode == 3
    assert all_codes(res) == ["schema"]
    assert "never finish" in report(res)["plans"][0]["issues"][0]["message"]


def test_a_recursive_schema_that_descends_is_fine(proj: Proj) -> None:
    tree = {"type": "object", "properties": {"kids": {"type": "array",
                                                       "items": {"$ref": "#"}}}}
    proj.plan("p", one_param_plan(tree))
    assert proj.run("validate", "-p", 'p={"kids": [{"kids": []}]}').returncode == 0


def test_a_reference_loop_in_a_contract_is_registry(proj: Proj) -> None:
    proj.tools({"t": {"python": "mod:echo", "arguments": {"$ref": "#"}}})
    res = proj.run("validate", "--format", "json")
    assert res.returncode == 3
    assert all_codes(res) == ["registry"]


# --- text that is not text ---------------------------------------------------------------

SURROGATE_PLAN = ('{"planrun": 1, "goal": "\\ud800", "steps": [{"id": "s", "tool": "echo", '
                  '"arguments": {"x": "\\udfff"}}]}')


@pytest.mark.parametrize("fmt", ["text", "json", "github"])
def test_a_lone_surrogate_in_a_json_plan_is_syntax_in_every_format(proj: Proj,
                                                                   fmt: str) -> None:
    proj.plan("s", SURROGATE_PLAN, suffix=".json")
    res = proj.run("validate", "--format", fmt)
    assert res.returncode == 3
    assert "syntax" in res.stdout
    if fmt == "json":
        issue = report(res)["plans"][0]["issues"][0]
        assert (issue["code"], issue["path"], issue["line"]) == ("syntax", "/goal", 1)


@pytest.mark.parametrize("command", [["execute", "s"], ["show", "s"], ["graph", "s"]])
def test_a_lone_surrogate_plan_is_refused_by_every_command(proj: Proj,
                                                           command: list[str]) -> None:
    proj.plan("s", SURROGATE_PLAN, suffix=".json")
    res = proj.run(*command)
    assert res.returncode == 3
    assert "error[" in res.stderr


def test_a_surrogate_key_and_a_surrogate_params_file(proj: Proj) -> None:
    proj.plan("k", '{"planrun": 1, "goal": "g", "steps": [{"id": "s", "tool": "echo", '
              '"arguments": {"\\ud83d": 1}}]}', suffix=".json")
    res = proj.run("validate", "--format", "json")
    assert all_codes(res) == ["syntax"]
    proj.plan("p", one_param_plan({"type": "string"}))
    (proj.root / "values.json").write_text('{"p": "\\ud800"}')
    res = proj.run("validate", "p", "--params-file", "values.json")
    assert res.returncode == 3
    assert "error[syntax]" in res.stderr


def test_undecodable_bytes_in_a_value_are_param_type(proj: Proj) -> None:
    proj.plan("p", one_param_plan({"type": "string"}))
    res = subprocess.run([*PLANRUN, "validate", "p", "-p", "p=\udcff", "--format", "json"],
                         cwd=proj.root, capture_output=True, timeout=HANG_S,
                         env=dict(os.environ, PLANRUN_JOURNAL=str(proj.journal)))
    assert res.returncode == 3
    assert all_codes(res)  # type: ignore[arg-type]
    env = dict(os.environ, PLANRUN_JOURNAL=str(proj.journal))
    env_b = {k.encode(): v.encode() for k, v in env.items()}
    env_b[b"PLANRUN_PARAM_P"] = b"\xff\xfe"
    res = subprocess.run([*PLANRUN, "execute", "p", "--json"], cwd=proj.root,
                         capture_output=True, timeout=HANG_S, env=env_b)  # type: ignore[arg-type]
    assert res.returncode == 3
    assert b"param_type" in res.stdout + res.stderr
    assert b"Traceback" not in res.stderr


@pytest.mark.parametrize("args", [
    ["status", "\udcff\udcff\udcff\udcff"], ["log", "ab\udcffcd"], ["output", "abcd", "\udcff"],
    ["runs", "--plan", "\udcff"], ["resume", "\udcff\udcff\udcff\udcff"],
    ["retry", "\udcff\udcff\udcff\udcff"], ["unlock", "\udcff\udcff\udcff\udcff"],
    ["resolve", "abcd", "s", "--failed", "--reason", "\udcff"],
])
def test_undecodable_ids_on_the_command_line_are_usage(proj: Proj, args: list[str]) -> None:
    res = proj.run(*args)
    assert res.returncode == 2
    assert "error[usage]" in res.stderr
    assert "not UTF-8 text" in res.stderr


# --- numbers -------------------------------------------------------------------------------

HEX = "0x" + "F" * 4000


def test_an_integer_python_cannot_print_is_syntax(proj: Proj) -> None:
    proj.plan("h", f"planrun: 1\ngoal: g\nsteps:\n  - {{id: s, tool: echo, arguments: "
                   f"{{x: {HEX}}}}}\n")
    proj.plan("d", "planrun: 1\ngoal: g\nsteps:\n  - {id: s, tool: echo, arguments: "
                   "{x: " + "9" * 5000 + "}}\n")
    res = proj.run("validate", "--format", "json")
    assert res.returncode == 3
    assert all_codes(res) == ["syntax", "syntax"]
    (proj.root / "values.yaml").write_text(f"p: {HEX}\n")
    proj.plan("p", one_param_plan({"type": "integer"}))
    res = proj.run("validate", "p", "--params-file", "values.yaml")
    assert res.returncode == 3
    assert "error[syntax]" in res.stderr


def test_an_unprintable_integer_in_tools_yaml_is_registry(proj: Proj) -> None:
    (proj.root / "tools.yaml").write_text(
        f"tools:\n  t:\n    python: mod:echo\n    arguments: {{type: object, maxLength: {HEX}}}\n")
    res = proj.run("validate", "--format", "json")
    assert res.returncode == 3
    assert all_codes(res) == ["registry"]


@pytest.mark.parametrize(("field", "value"), [
    ("revision", 2**63), ("max_parallel", 2**63), ("timeout", 1e300),
])
def test_plan_numbers_beyond_what_planrun_can_keep_are_schema(proj: Proj, field: str,
                                                              value: Any) -> None:
    plan = tool_plan("echo", {})
    plan[field] = value
    proj.plan("n", plan)
    res = proj.run("execute", "n", "--json")
    assert res.returncode == 3
    assert "schema" in res.stdout + res.stderr


@pytest.mark.parametrize("retries", [{"max_attempts": 10**30}, {"backoff_s": 1e300}])
def test_retry_numbers_beyond_the_bounds_are_schema(proj: Proj,
                                                    retries: dict[str, Any]) -> None:
    plan = tool_plan("echo", {})
    plan["steps"][0]["retries"] = retries
    proj.plan("r", plan)
    res = proj.run("validate", "--format", "json")
    assert res.returncode == 3
    assert all_codes(res) == ["schema"]


def test_the_largest_stored_revision_runs(proj: Proj) -> None:
    plan = tool_plan("echo", {})
    plan["revision"] = 2**63 - 1
    proj.plan("n", plan)
    assert proj.run("execute", "n").returncode == 0
    assert proj.run("runs").returncode == 0


@pytest.mark.parametrize("args", [
    ["runs", "--limit", str(2**63)], ["runs", "--limit", "9" * 5000],
    ["output", "abcd", "s", "--item", str(2**63)],
    ["resolve", "abcd", "s", "--failed", "--item", str(2**64)],
    ["execute", "x", "--max-parallel", str(2**63)],
    ["execute", "x", "--approval-timeout", "1e999"],
    ["execute", "x", "--approval-timeout", "nan"],
    ["resume", "--max-parallel", "9" * 5000],
])
def test_cli_numbers_beyond_the_bounds_are_usage(proj: Proj, args: list[str]) -> None:
    res = proj.run(*args)
    assert res.returncode == 2
    assert "error[usage]" in res.stderr


def test_a_huge_integer_parameter_has_a_plain_message(proj: Proj) -> None:
    proj.plan("p", one_param_plan({"type": "integer"}))
    res = proj.run("validate", "-p", "p=" + "9" * 5000, "--format", "json")
    assert all_codes(res) == ["param_type"]
    message = report(res)["plans"][0]["issues"][0]["message"]
    assert "4,300 digits" in message
    assert "set_int_max_str_digits" not in message
    assert len(message) < 300


def test_parsing_long_values_takes_linear_time(proj: Proj) -> None:
    # a backtracking number syntax took ~60 s on 40,000 digits and an 'x'
    proj.plan("p", one_param_plan({"type": "number"}))
    res = proj.run("validate", "-p", "p=" + "1" * 100_000 + "x", "--format", "json")
    assert all_codes(res) == ["param_type"]
    res = proj.run("execute", "p", "--json", env={"PLANRUN_PARAM_P": "1" * 100_000 + "x"})
    assert res.returncode == 3
    assert "param_type" in res.stdout
    proj.tools({"t": {"command": ["1" * 1_000_000 + "x"], "arguments": {"type": "object"}}})
    assert proj.run("validate").returncode == 0


@pytest.mark.parametrize("output", ["NaN", "[" * 100_000, '{"a": 1, "a": 2}',
                                    '"\\ud800"', "9" * 5000])
def test_resolve_output_is_read_like_a_json_file(proj: Proj, output: str) -> None:
    res = proj.run("resolve", "abcd", "s", "--succeeded", "--output", output)
    assert res.returncode == 2
    assert "--output is not valid JSON" in res.stderr


# --- a journal on read-only storage ----------------------------------------------------------

def _read_only(folder: Path, argv: list[str], cwd: Path | None = None
               ) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` with ``folder`` read-only: a read-only bind mount when root, else chmod."""
    env = dict(os.environ, PLANRUN_JOURNAL=str(folder / "journal.sqlite3"))
    if os.geteuid() != 0:
        for p in folder.iterdir():
            p.chmod(0o444)
        folder.chmod(0o555)
        try:
            return subprocess.run(argv, text=True, capture_output=True, env=env,
                                  timeout=HANG_S, cwd=cwd)
        finally:
            folder.chmod(0o755)
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("root without unshare: cannot make a read-only folder")
    script = ('mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && '
              'exec "$@"')
    res = subprocess.run([unshare, "-m", "sh", "-c", script, "sh", str(folder), *argv],
                         text=True, capture_output=True, env=env, timeout=HANG_S, cwd=cwd)
    if "mount" in res.stderr and res.returncode != 0 and "planrun" not in res.stderr:
        pytest.skip(f"cannot mount read-only here: {res.stderr.strip()}")
    return res


def _journal_with_runs(proj: Proj, folder: Path) -> tuple[str, str]:
    folder.mkdir()
    proj.plan("e", tool_plan("echo", {"x": 1}))
    env = {"PLANRUN_JOURNAL": str(folder / "journal.sqlite3")}
    first = json.loads(proj.run("execute", "e", "--json", env=env).stdout)["run_id"]
    second = json.loads(proj.run("execute", "e", "--json", env=env).stdout)["run_id"]
    return first, second


def test_a_cleanly_closed_journal_on_read_only_storage_is_read(proj: Proj,
                                                               tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    first, _second = _journal_with_runs(proj, folder)
    assert sorted(p.name for p in folder.iterdir()) == ["journal.sqlite3",
                                                        "journal.sqlite3.setup-lock"]
    res = _read_only(folder, [*PLANRUN, "runs", "--all", "--json"])
    assert res.returncode == 0, res.stderr
    assert len(json.loads(res.stdout)) == 2
    res = _read_only(folder, [*PLANRUN, "status", first[:8], "--json"])
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["status"] == "completed"


@pytest.mark.sqlite
def test_a_journal_with_a_wal_but_no_shm_on_read_only_storage_is_read(
        proj: Proj, tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    _journal_with_runs(proj, folder)
    # a WAL with committed records and no -shm (e.g. copied by a backup tool)
    conn = sqlite3.connect(folder / "journal.sqlite3")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("UPDATE runs SET goal = 'from the wal'")
    conn.commit()
    wal = (folder / "journal.sqlite3-wal").read_bytes()
    saved = folder.parent / "saved-wal"
    saved.write_bytes(wal)
    conn.close()
    (folder / "journal.sqlite3-shm").unlink(missing_ok=True)
    saved.replace(folder / "journal.sqlite3-wal")
    assert not (folder / "journal.sqlite3-shm").exists()
    res = _read_only(folder, [*PLANRUN, "runs", "--all", "--json"])
    assert res.returncode == 0, res.stderr
    assert len(json.loads(res.stdout)) == 2
    run_id = json.loads(res.stdout)[0]["run_id"]
    res = _read_only(folder, [*PLANRUN, "status", run_id, "--json"])
    assert json.loads(res.stdout)["goal"] == "from the wal"
    leftovers = [p for p in Path(os.environ.get("TMPDIR", "/tmp")).glob("planrun-ro-*")]
    assert leftovers == []


def test_writing_to_a_journal_on_read_only_storage_is_still_journal_error(
        proj: Proj, tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    _journal_with_runs(proj, folder)
    res = _read_only(folder, [*PLANRUN, "execute", "e"], cwd=proj.root)
    assert res.returncode == 6
    assert "error[journal]" in res.stderr


# --- paths the operating system cannot even look at -------------------------------------

LONG = "x" * 5000


@pytest.mark.parametrize(("args", "status", "code"), [
    (["validate", LONG], 3, "not_found"), (["execute", LONG], 3, "not_found"),
    (["show", LONG], 3, "not_found"), (["execute", "./" + LONG], 3, "bad_name"),
    (["validate", "--params-file", LONG], 2, "usage"), (["runs", "-C", LONG], 2, "usage"),
    (["execute", "e", "--journal", "/tmp/" + LONG], 6, "journal"),
    (["init", "/tmp/" + LONG], 2, "usage"),
])
def test_a_path_too_long_for_the_file_system_is_an_ordinary_error(
        proj: Proj, args: list[str], status: int, code: str) -> None:
    proj.plan("e", tool_plan("echo", {}))
    res = proj.run(*args)
    assert res.returncode == status
    assert f"error[{code}]" in res.stdout + res.stderr


@pytest.mark.parametrize("key", ["plans_dir", "registry"])
def test_a_path_too_long_in_planrun_toml_is_not_there(proj: Proj, key: str) -> None:
    proj.plan("e", tool_plan("echo", {}))
    (proj.root / "planrun.toml").write_text(f'{key} = "{LONG}"\n')
    res = proj.run("validate", "e", "--format", "json")
    assert res.returncode == 3
    assert all_codes(res) == ["not_found" if key == "plans_dir" else "unknown_tool"]


def test_a_grant_total_beyond_a_float_is_config(proj: Proj) -> None:
    (proj.root / "planrun.toml").write_text(
        "[[policy.grants]]\nid = 'g'\ntool = 'echo'\ngranted_by = 'me'\n"
        f"expires = 2099-01-01T00:00:00Z\namount_field = 'x'\nmax_total = {10**400}\n")
    res = proj.run("validate", "--format", "json")
    assert res.returncode == 3
    assert all_codes(res) == ["config"]
