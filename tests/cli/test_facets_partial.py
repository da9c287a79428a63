"""Facets and partial fan-outs through the command line (issue 17, features 1 and 2).

``planrun execute|status|output|retry|validate|report`` through ``typer.testing.CliRunner``
on a project whose python tools log each call to ``calls.log``: facets computed when a
step succeeds, journaled, shown in the manifest and read by ``when`` (without loading the
output); ``on_item_error: skip|collect`` and the step status ``partial``.
"""

from __future__ import annotations

from typing import Any

import pytest

from conftest import Project

from .support import as_json, calls, execute_json, invoke

MODULE = '''
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _log(text):
    with open(HERE / "calls.log", "a", encoding="utf-8") as f:
        f.write(f"{text}\\n")


def scan(count):
    _log(f"scan {count}")
    return {"root": "/data",
            "files": [{"name": f"f{i}", "ext": ["py", "txt", "md", "csv"][i % 4]}
                      for i in range(count)]}


def check(value):
    _log(f"check {value}")
    if str(value).startswith("bad") and not (HERE / f"fixed-{value}").exists():
        raise ValueError(f"cannot check {value}")
    return {"value": value, "size": len(str(value))}


def flaky(value):
    marker = HERE / f"tried-{value}"
    _log(f"flaky {value}")
    if not marker.exists():
        marker.write_text("once")
        raise RuntimeError(f"first try of {value} fails")
    return value


def echo(value):
    _log(f"echo {value}")
    return value
'''

TOOLS = """
tools:
  scan:
    python: facettools:scan
    arguments:
      type: object
      properties: {count: {type: integer}}
      required: [count]
      additionalProperties: false
    output_schema:
      type: object
      properties:
        root: {type: string}
        files:
          type: array
          items:
            type: object
            properties: {name: {type: string}, ext: {type: string}}
            additionalProperties: false
      additionalProperties: false
  check:
    python: facettools:check
    arguments:
      type: object
      properties: {value: {type: string}}
      required: [value]
      additionalProperties: false
  flaky:
    python: facettools:flaky
    arguments:
      type: object
      properties: {value: {type: string}}
      required: [value]
      additionalProperties: false
  echo:
    python: facettools:echo
    arguments:
      type: object
      properties: {value: {}}
      required: [value]
      additionalProperties: false
"""

FACETS = """
planrun: 1
goal: Decide on a count, not on a large output
params:
  count: {type: integer, default: 6}
steps:
  - id: scan
    tool: scan
    arguments: {count: "{params.count}"}
    facets:
      paths: {root: root, names: "files[].name"}
      counts: {files: "files[]", missing: files.99.name}
      group_counts: {by_ext: "files[].ext"}
      max_group_keys: 3
  - id: many
    tool: echo
    depends_on: [scan]
    when: steps.scan.facets.files > 5 && steps.scan.facets.by_ext.py == 2
    arguments: {value: many}
  - id: few
    tool: echo
    depends_on: [scan]
    when: steps.scan.facets.files <= 5
    arguments: {value: few}
"""

FAN = """
planrun: 1
goal: Check every value, keep going past the bad ones
steps:
  - id: checks
    tool: check
    for_each: [a, bad1, bb, bad2, ccc]
    on_item_error: MODE
    arguments: {value: "{item}"}
    facets:
      paths: {values: value}
      counts: {ok: value}
      group_counts: {sizes: size}
  - id: after
    tool: echo
    depends_on: [checks]
    when: steps.checks.facets.ok == 3
    arguments: {value: "{steps.checks.output}"}
"""


@pytest.fixture
def proj(project: Project, monkeypatch: pytest.MonkeyPatch) -> Project:
    monkeypatch.chdir(project.root)
    project.write_tools(TOOLS, module=MODULE, module_name="facettools")
    project.write_plan("facets", FACETS)
    for mode in ("skip", "collect", "continue"):
        project.write_plan(f"fan-{mode}", FAN.replace("MODE", mode))
    return project


def steps(m: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["id"]: s for s in m["steps"]}


def test_facets_are_journaled_shown_and_read_by_when(proj: Project) -> None:
    result, m = execute_json(proj, "facets")
    assert result.exit_code == 0, result.output
    scan = steps(m)["scan"]
    assert scan["facets"] == {"root": "/data", "names": ["f0", "f1", "f2"], "files": 6,
                              "missing": 0, "by_ext": {"py": 2, "txt": 2, "md": 1,
                                                       "(other)": 1}}
    assert scan["facets_cut"] == ["names"]  # six names reached, three kept
    assert [steps(m)[s]["status"] for s in ("many", "few")] == ["succeeded", "skipped"]
    assert m["output_bytes"] == sum(s["output_bytes"] for s in m["steps"]) > 0
    # the journal is the truth: status shows the same facets later, as text too
    assert as_json(invoke(proj, "status", m["run_id"], "--json")) == m
    text = invoke(proj, "status", m["run_id"]).stdout
    assert 'facets root="/data"' in text
    assert "files=6" in text

    _, small = execute_json(proj, "facets", "-p", "count=2")
    assert steps(small)["scan"]["facets"]["files"] == 2
    assert [steps(small)[s]["status"] for s in ("many", "few")] == ["skipped", "succeeded"]


def test_a_condition_on_facets_does_not_load_the_output(
        proj: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    from planrun.journal.reads import ReadsMixin

    loaded: list[str] = []
    original = ReadsMixin.step_output

    def spy(self: Any, run_id: str, step_id: str, item: int | None = None) -> Any:
        loaded.append(step_id)
        return original(self, run_id, step_id, item)

    monkeypatch.setattr(ReadsMixin, "step_output", spy)
    proj.write_plan("count", FAN.replace("MODE", "skip").replace(
        '{value: "{steps.checks.output}"}', "{value: enough}"))
    result, m = execute_json(proj, "count")  # checks' output stays in the journal
    assert result.exit_code == 0, result.output
    assert steps(m)["after"]["status"] == "succeeded"
    assert loaded == []  # the condition read steps.checks.facets.ok, not the output


def test_fan_out_facets_sum_merge_and_gather_over_succeeded_items(proj: Project) -> None:
    _, m = execute_json(proj, "fan-skip")
    checks = steps(m)["checks"]
    assert checks["facets"] == {"values": ["a", "bb", "ccc"], "ok": 3,
                                "sizes": {"1": 1, "2": 1, "3": 1}}
    assert "facets_cut" not in checks


def test_skip_drops_failed_items_and_the_step_is_partial(proj: Project) -> None:
    result, m = execute_json(proj, "fan-skip")
    assert result.exit_code == 0, result.output  # partial is not a failure
    assert m["status"] == "completed"
    assert m["counts"]["partial"] == 1
    assert m["counts"]["failed"] == 0
    checks = steps(m)["checks"]
    assert checks["status"] == "partial"
    assert checks["items"] == {"total": 5, "succeeded": 3, "failed": 2}
    assert checks["error"]["code"] == "items_failed"
    assert checks["item_errors"] == [
        {"index": 1, "code": "tool_error", "message": "ValueError: cannot check bad1"},
        {"index": 3, "code": "tool_error", "message": "ValueError: cannot check bad2"}]
    assert m["next"] == f"planrun retry {m['run_id']}"
    expected = [{"value": "a", "size": 1}, {"value": "bb", "size": 2},
                {"value": "ccc", "size": 3}]
    out = invoke(proj, "output", m["run_id"], "checks")
    assert out.exit_code == 0
    assert as_json(out) == expected
    # the step after it ran on the items that succeeded
    assert steps(m)["after"]["status"] == "succeeded"
    assert as_json(invoke(proj, "output", m["run_id"], "after")) == expected
    text = invoke(proj, "status", m["run_id"]).stdout
    assert "partial" in text
    assert "checks[1]: [tool_error] ValueError: cannot check bad1" in text


def test_collect_keeps_every_item_with_error_objects(proj: Project) -> None:
    result, m = execute_json(proj, "fan-collect")
    assert result.exit_code == 0, result.output
    assert steps(m)["checks"]["status"] == "partial"
    out = as_json(invoke(proj, "output", m["run_id"], "checks"))
    assert out == [
        {"value": "a", "size": 1},
        {"item_error": {"index": 1, "code": "tool_error",
                        "message": "ValueError: cannot check bad1"}},
        {"value": "bb", "size": 2},
        {"item_error": {"index": 3, "code": "tool_error",
                        "message": "ValueError: cannot check bad2"}},
        {"value": "ccc", "size": 3}]
    # facets count only the items that succeeded
    assert steps(m)["checks"]["facets"]["ok"] == 3


def test_continue_still_fails_the_step(proj: Project) -> None:
    result, m = execute_json(proj, "fan-continue")
    assert result.exit_code == 1
    checks = steps(m)["checks"]
    assert checks["status"] == "failed"
    assert "facets" not in checks
    assert [e["index"] for e in checks["item_errors"]] == [1, 3]


def test_every_item_failed_fails_a_skip_step(proj: Project) -> None:
    proj.write_plan("allbad", FAN.replace("MODE", "skip").replace(
        "[a, bad1, bb, bad2, ccc]", "[bad1, bad2]"))
    result, m = execute_json(proj, "allbad")
    assert result.exit_code == 1
    assert m["status"] == "failed"
    checks = steps(m)["checks"]
    assert checks["status"] == "failed"
    assert "every item failed" in checks["error"]["message"]


def test_an_item_is_an_error_only_after_its_retries(proj: Project) -> None:
    proj.write_plan("flaky", """
        planrun: 1
        goal: Retry items before counting them as failed
        steps:
          - id: f
            tool: flaky
            for_each: [x, y]
            on_item_error: skip
            retries: {max_attempts: 2}
            arguments: {value: "{item}"}
        """)
    result, m = execute_json(proj, "flaky")
    assert result.exit_code == 0, result.output
    assert steps(m)["f"]["status"] == "succeeded"
    assert "item_errors" not in steps(m)["f"]
    assert sorted(calls(proj)) == ["flaky x", "flaky x", "flaky y", "flaky y"]


def test_retry_calls_only_the_failed_items_again(proj: Project) -> None:
    _, first = execute_json(proj, "fan-skip")
    assert first["status"] == "completed"
    (proj.root / "calls.log").unlink()
    for value in ("bad1", "bad2"):
        (proj.root / f"fixed-{value}").write_text("")
    result = invoke(proj, "retry", first["run_id"], "--json")
    assert result.exit_code == 0, result.output
    m = as_json(result)
    assert m["parent_run_id"] == first["run_id"]
    assert steps(m)["checks"]["status"] == "succeeded"
    assert steps(m)["checks"]["facets"]["ok"] == 5
    # the items that succeeded were replayed by their keys; `after` ran on the new output
    assert sorted(calls(proj))[:2] == ["check bad1", "check bad2"]
    assert not [c for c in calls(proj) if c.startswith("check") and "bad" not in c]
    assert steps(m)["after"]["status"] == "skipped"  # ok is 5 now, not 3


def test_validation_of_facets_and_on_item_error(proj: Project) -> None:
    proj.write_plan("bad", """
        planrun: 1
        goal: Every facet problem at once
        steps:
          - id: scan
            tool: scan
            arguments: {count: 1}
            on_item_error: skip
            facets:
              paths: {root: root.deep, size: "files[].size", whole: "."}
              counts: {files: "files[", root: "root[]"}
          - id: next
            tool: echo
            depends_on: [scan]
            when: steps.scan.facets.filez > 1
            arguments: {value: 1}
          - id: last
            tool: echo
            depends_on: [next]
            when: steps.next.facets.x > 1
            arguments: {value: 1}
        """)
    proj.write_plan("kind", """
        planrun: 1
        goal: An unknown facet kind
        steps:
          - {id: scan, tool: scan, arguments: {count: 1}, facets: {sums: {a: files}}}
        """)
    result = invoke(proj, "validate", "bad", "kind", "--json")
    assert result.exit_code == 3
    found = {(i["code"], i["path"]) for p in as_json(result)["plans"] for i in p["issues"]}
    assert found == {
        ("schema", "/steps/0/on_item_error"),
        ("schema", "/steps/0/facets/counts/files"),  # bad syntax
        ("schema", "/steps/0/facets/counts/root"),  # root declared twice
        ("reference", "/steps/0/facets/paths/root"),  # a string has no 'deep'
        ("reference", "/steps/0/facets/paths/size"),  # files[] items have no 'size'
        ("reference", "/steps/0/facets/counts/root"),  # [] over a string
        ("condition", "/steps/1/when"),  # filez is not declared
        ("condition", "/steps/2/when"),  # next declares no facets
        ("schema", "/steps/0/facets/sums"),  # unknown kind
    }


def test_report_shows_a_partial_step(proj: Project) -> None:
    _, m = execute_json(proj, "fan-skip")
    out = proj.root / "report.html"
    result = invoke(proj, "report", m["run_id"], "--out", str(out))
    assert result.exit_code == 0, result.output
    page = out.read_text(encoding="utf-8")
    assert 'class="badge s-partial">partial</span>' in page
    assert ".s-partial{" in page  # its own colour, and a legend entry


def test_a_retry_inherits_the_facets_of_the_steps_it_keeps(proj: Project) -> None:
    proj.write_plan("inherit", """
        planrun: 1
        goal: A step with facets, then one that fails until fixed
        steps:
          - id: scan
            tool: scan
            arguments: {count: 3}
            facets: {counts: {files: "files[]"}}
          - id: fragile
            tool: check
            depends_on: [scan]
            when: steps.scan.facets.files == 3
            arguments: {value: bad3}
        """)
    _, first = execute_json(proj, "inherit")
    assert first["status"] == "failed"
    (proj.root / "fixed-bad3").write_text("")
    m = as_json(invoke(proj, "retry", first["run_id"], "--json"))
    assert m["status"] == "completed"
    assert steps(m)["scan"]["replayed"] is True
    assert steps(m)["scan"]["facets"] == {"files": 3}
    assert calls(proj).count("scan 3") == 1
