"""``planrun import FILE [--out FILE]`` (issue #17, part 6), through the real CLI.

Seed-format plans (AI-Parrot style JSON) written for these tests: one that maps fully
(then validates against the project's registry and executes), two that report each
construct they cannot map at its JSON Pointer, and bad input (one message with a code,
exit 3, never a traceback).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from planrun_cli import TIMEOUT_S, CliProject, Result

TOOLS = """
tools:
  gather:
    description: Lists what to store (its output carries the items)
    python: crashtools:record
    arguments:
      type: object
      properties:
        source: {type: string}
        items: {type: array, items: {type: string}}
      required: [source, items]
      additionalProperties: false
  store:
    description: Stores one item
    python: crashtools:record
    arguments:
      type: object
      properties:
        name: {type: string}
        position: {type: integer}
        label: {type: string}
      required: [name]
      additionalProperties: false
"""

GOOD: dict[str, Any] = {
    "name": "seeded",
    "objective": "Gather the files of a source and store each one",
    "nodes": [
        {"id": "gather", "tool": "gather", "depends_on": [],
         "args": {"source": "{artifacts.source}", "items": ["a.txt", "b.txt", "c.txt"]}},
        {"id": "store", "tool": "store", "depends_on": ["gather"],
         "for_each": "{nodes.gather.output.args.items}",
         "args": {"name": "{item}", "position": "{index}",
                  "label": "from {artifacts.source}"},
         "retry": {"max_attempts": 3}, "timeout": 30, "when": True},
        {"id": "summary", "tool": "store", "depends_on": ["store"],
         "args": {"name": "{nodes.gather.output.args.source}"}},
    ],
}

#: Unmappable node-level constructs: (pointer, words of the message).
BAD_NODES: dict[str, Any] = {
    "name": "bad-nodes",
    "objective": "Constructs with no planrun equivalent",
    "version": "2",
    "nodes": [
        {"id": "a", "tool": "store", "args": {"name": "x"},
         "when": "{nodes.b.output.ok} == true"},
        {"id": "b", "tool": "store", "args": {"name": "y"},
         "retry": {"max_attempts": 2, "backoff": 5}, "timeout": "30s"},
        {"id": "c", "tool": "store", "args": {"name": "z"}, "retry": 3,
         "description": "no intent mapping", "for_each": "items of b"},
        {"id": "d", "tool": "store", "args": {"name": "w"},
         "retry": {"max_attempts": 0}, "timeout": 0},
    ],
}
BAD_NODES_ISSUES = [
    ("/version", "seed field 'version'"),
    ("/nodes/0/when", "not CEL"),
    ("/nodes/1/retry/backoff", "retry field 'backoff'"),
    ("/nodes/1/timeout", "timeout '30s'"),
    ("/nodes/2/description", "node field 'description'"),
    ("/nodes/2/for_each", "for_each 'items of b'"),
    ("/nodes/2/retry", "only {max_attempts: N} maps"),
    ("/nodes/3/retry/max_attempts", "max_attempts 0"),
    ("/nodes/3/timeout", "timeout 0"),
]

#: Unmappable text and placeholders.
BAD_TEXT: dict[str, Any] = {
    "objective": "Placeholders and text with no planrun equivalent",
    "nodes": [
        {"id": "a", "tool": "store", "args": {
            "name": "{nodes.b.status}", "label": "{artifacts.cfg.path}"}},
        {"id": "b", "tool": "store", "args": {
            "name": "{{literal}}", "label": "<params.who>"}},
        {"id": "c", "tool": "store", "args": {
            "name": "{params.who}", "label": "{item}", "{artifacts.k}": "v"}},
        {"id": "3rd", "tool": "store", "args": {"name": "{steps.a.output}"}},
        {"id": "e", "tool": "store", "args": {"name": "{artifacts.9lives}"}},
    ],
}
BAD_TEXT_ISSUES = [
    ("/nodes/0/args/name", "{nodes.b.status}"),
    ("/nodes/0/args/label", "{artifacts.cfg.path}"),
    ("/nodes/1/args/name", "'{{' or '}}'"),
    ("/nodes/1/args/label", "'<params."),
    ("/nodes/2/args/name", "{params.who}: not a seed placeholder"),
    ("/nodes/2/args/label", "{item} outside a node with 'for_each'"),
    ("/nodes/2/args/{artifacts.k}", "keys are never substituted"),
    ("/nodes/3/id", "node id '3rd' is not a planrun step id"),
    ("/nodes/3/args/name", "{steps.a.output}: not a seed placeholder"),
    ("/nodes/4/args/name", "{artifacts.9lives}"),
]


@pytest.fixture
def proj(cli: CliProject) -> CliProject:
    cli.tools(TOOLS)
    return cli


def _seed(cli: CliProject, data: Any, name: str = "seed.json") -> Path:
    path = cli.root / name
    path.write_text(json.dumps(data, indent=1) if not isinstance(data, str) else data,
                    encoding="utf-8")
    return path


def _one_error(r: Result, code: str, exit_code: int = 3) -> dict[str, Any]:
    """The single issue of a refused import's JSON report (on stderr without --out)."""
    assert r.returncode == exit_code, r
    assert "Traceback" not in r.stdout + r.stderr, r
    assert r.stdout == "", r  # nothing mapped: no plan on stdout
    report = json.loads(r.stderr)
    issues = [i for p in report["plans"] for i in p["issues"]] + report["issues"]
    assert len(issues) == 1, issues
    assert issues[0]["code"] == code
    return dict(issues[0])


def test_a_seed_plan_that_maps_converts_validates_and_executes(proj: CliProject) -> None:
    _seed(proj, GOOD)
    r = proj.run("import", "seed.json", "--out", "plans/seeded.yaml")
    assert r.returncode == 0, r
    assert "seed.json: ok" in r.stdout, r
    assert "plans/seeded.yaml: ok" in r.stdout, r
    plan = yaml.safe_load((proj.root / "plans/seeded.yaml").read_text(encoding="utf-8"))
    assert plan == {
        "planrun": 1, "name": "seeded",
        "goal": "Gather the files of a source and store each one",
        "params": {"source": {"description": "artifact 'source' of the seed plan"}},
        "steps": [
            {"id": "gather", "tool": "gather", "arguments": {
                "source": "{params.source}", "items": ["a.txt", "b.txt", "c.txt"]}},
            {"id": "store", "tool": "store", "arguments": {
                "name": "{item}", "position": "{index}", "label": "from {params.source}"},
             "depends_on": ["gather"], "for_each": "{steps.gather.output.args.items}",
             "when": "true", "retries": {"max_attempts": 3}, "timeout": 30},
            {"id": "summary", "tool": "store",
             "arguments": {"name": "{steps.gather.output.args.source}"},
             "depends_on": ["store"]},
        ]}
    r = proj.run("execute", "seeded", "-p", "source=inbox", "--json")
    assert r.returncode == 0, r
    assert r.json["status"] == "completed"
    assert proj.counts() == {"gather": 1, "store#0": 1, "store#1": 1, "store#2": 1,
                             "summary": 1}
    stored = [c["output"]["args"] for c in proj.calls() if c["effect"].startswith("store")]
    assert sorted(stored, key=lambda a: a["position"]) == [
        {"name": n, "position": i, "label": "from inbox"}
        for i, n in enumerate(["a.txt", "b.txt", "c.txt"])]


def test_without_out_the_plan_goes_to_stdout_and_the_report_to_stderr(
        proj: CliProject) -> None:
    _seed(proj, GOOD)
    r = proj.run("import", "seed.json")
    assert r.returncode == 0, r
    assert yaml.safe_load(r.stdout)["steps"][1]["for_each"] == \
        "{steps.gather.output.args.items}"
    assert "seed.json: ok" in r.stderr
    assert "<imported>: ok" in r.stderr
    assert not (proj.root / "plans").exists()
    # JSON when --out names a .json file, and a seed without `name` takes its stem.
    data = {k: v for k, v in GOOD.items() if k != "name"}
    _seed(proj, data, "nameless.json")
    r = proj.run("import", "nameless.json", "--out", "out/copy.json", "--format", "json")
    assert r.returncode == 0, r
    assert json.loads(r.stdout)["ok"] is True
    assert json.loads((proj.root / "out/copy.json").read_text())["name"] == "copy"


@pytest.mark.parametrize(("seed", "expected"), [(BAD_NODES, BAD_NODES_ISSUES),
                                                (BAD_TEXT, BAD_TEXT_ISSUES)],
                         ids=["nodes", "text"])
def test_each_unmappable_construct_is_reported_at_its_pointer(
        proj: CliProject, seed: dict[str, Any], expected: list[tuple[str, str]]) -> None:
    _seed(proj, seed)
    r = proj.run("import", "seed.json", "--out", "plans/x.yaml", "--format", "json")
    assert r.returncode == 3, r
    assert "Traceback" not in r.stderr
    assert not (proj.root / "plans/x.yaml").exists()
    report = json.loads(r.stdout)
    assert report["ok"] is False
    (seed_report,) = report["plans"]  # one report: the seed file's, no validation
    assert seed_report["file"] == "seed.json"
    got = [(i["path"], i["message"]) for i in seed_report["issues"]]
    assert all(i["code"] == "unmappable" for i in seed_report["issues"]), got
    assert all(i["line"] is not None for i in seed_report["issues"]), got
    assert len(got) == len(expected), got
    for ptr, words in expected:
        assert any(p == ptr and words in m for p, m in got), (ptr, words, got)
    # the text format names the code and the pointer of each, and stdout gets no plan
    r = proj.run("import", "seed.json")
    assert r.returncode == 3, r
    assert r.stdout == "", r
    assert r.stderr.count("error[unmappable]") == len(expected), r
    for ptr, _words in expected:
        assert f"(at {ptr})" in r.stderr, ptr


def test_a_plan_that_maps_but_does_not_validate_is_written_and_refused(
        proj: CliProject) -> None:
    seed = json.loads(json.dumps(GOOD))
    seed["nodes"][2]["tool"] = "stor"
    seed["nodes"][2]["depends_on"] = []  # reads gather's output without depending on it
    _seed(proj, seed)
    r = proj.run("import", "seed.json", "--out", "plans/seeded.yaml", "--format", "json")
    assert r.returncode == 3, r
    assert (proj.root / "plans/seeded.yaml").exists()  # it mapped: the plan is written
    seed_report, converted = json.loads(r.stdout)["plans"]
    assert seed_report["ok"] is True
    assert converted["file"] == "plans/seeded.yaml"
    codes = {(i["code"], i["path"]) for i in converted["issues"]}
    assert ("unknown_tool", "/steps/2/tool") in codes, codes
    assert r.stdout.count('"line": null') < len(converted["issues"])


def test_a_bad_registry_is_reported_like_validate(proj: CliProject) -> None:
    proj.tools(TOOLS + "  broken: {python: 'crashtools:record'}\n")
    _seed(proj, GOOD)
    r = proj.run("import", "seed.json", "--out", "plans/seeded.yaml", "--format", "json")
    assert r.returncode == 3, r
    report = json.loads(r.stdout)
    assert [i["code"] for i in report["issues"]] == ["registry"]


ALIAS_BOMB = textwrap.dedent("""\
    a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]
    b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
    c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
    d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]
    e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]
    f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]
    objective: boom
    nodes: [*f]
""")


@pytest.mark.parametrize(("name", "text", "code", "ptr"), [
    ("seed.json", "{not json", "syntax", None),
    ("seed.json", "[1, 2]", "schema", ""),
    ("seed.json", '"a string"', "schema", ""),
    ("seed.json", '{"objective": "x"}', "schema", ""),
    ("seed.json", '{"objective": "x", "nodes": {"a": 1}}', "schema", "/nodes"),
    ("seed.json", '{"objective": "x", "objective": "y", "nodes": []}', "duplicate_key",
     "/objective"),
    ("seed.yaml", ALIAS_BOMB, "too_large", None),
    ("seed.json", "\xff", "syntax", None),
], ids=["not-json", "a-list", "a-string", "no-nodes", "nodes-not-a-list", "duplicate-key",
        "alias-bomb", "not-utf8"])
def test_bad_input_is_one_message_with_a_code(proj: CliProject, name: str, text: str,
                                              code: str, ptr: str | None) -> None:
    path = proj.root / name
    if text == "\xff":
        path.write_bytes(b"\xff\xfe{")
    else:
        path.write_text(text, encoding="utf-8")
    r = proj.run("import", name, "--format", "json")
    issue = _one_error(r, code)
    if ptr is not None:
        assert issue["path"] == ptr
    r = proj.run("import", name)
    assert r.returncode == 3, r
    assert r.stderr.count("error[") == 1, r
    assert f"error[{code}]" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_missing_file_and_a_missing_argument(proj: CliProject) -> None:
    issue = _one_error(proj.run("import", "nowhere.json", "--format", "json"), "not_found")
    assert "nowhere.json" in issue["message"]
    r = proj.run("import")
    assert r.returncode == 2, r
    assert "Traceback" not in r.stderr, r


def test_help_does_not_import_the_converter(proj: CliProject) -> None:
    probe = textwrap.dedent("""
        import atexit, sys
        atexit.register(lambda: sys.stderr.write(
            "LOADED:" + str("planrun.importing" in sys.modules) + "\\n"))
        from planrun.cli import main
        sys.argv = ["planrun", *sys.argv[1:]]
        main()
    """)

    def loaded(*args: str) -> tuple[int, bool, str]:
        p = subprocess.run([sys.executable, "-c", probe, *args], cwd=proj.root,
                           env=proj.env(), capture_output=True, text=True,
                           timeout=TIMEOUT_S, check=False)
        return p.returncode, "LOADED:True" in p.stderr, p.stdout

    code, was, out = loaded("--help")
    assert code == 0
    assert not was
    assert "import" in out
    _seed(proj, GOOD)
    code, was, _ = loaded("import", "seed.json")
    assert code == 0
    assert was
