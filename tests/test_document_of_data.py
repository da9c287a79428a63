"""A plan the journal holds is checked without writing it out as text (issue 16).

``resume``/``retry``/``repair`` check the journaled plan again; its text exists only to
point issues at a line, so it is written (indented JSON, Python's slow encoder: 156 ms for
10,000 steps) only when an issue is located — and then as before.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from conftest import Project, check_document, codes
from planrun.loading import Document, parse_text

PLAN: dict[str, Any] = {
    "planrun": 1, "goal": "g",
    "steps": [{"id": "a", "tool": "lister", "arguments": {"n": 3}},
              {"id": "b", "tool": "lister", "depends_on": ["a"], "arguments": {"n": 4}}],
}


def test_a_plan_that_passes_is_never_written_out(basic_project: Project) -> None:
    doc = Document.of_data(PLAN, "journal:r1 (plans/p.yaml)")
    report, plan = check_document(doc, basic_project.good_registry(),
                                  basic_project.settings())
    assert plan is not None, report
    assert doc.text == ""  # not rendered: nothing had to be located


def test_an_issue_of_a_journaled_plan_has_its_pointer_and_no_line(
        basic_project: Project) -> None:
    """No file holds the journaled plan's text: its issues carry their JSON Pointer and
    no line or column (SPEC §4), which pointed into a rendering nobody could see (a
    resume refused after a registry change named line 39 of a 24-line plan file)."""
    bad = json.loads(json.dumps(PLAN))
    bad["steps"][1]["arguments"] = {"n": -1}
    lazy = Document.of_data(bad, "journal:r1 (plans/p.yaml)")
    eager = parse_text(json.dumps(bad, indent=2), kind="json", file="journal:r1")
    got = check_document(lazy, basic_project.good_registry(), basic_project.settings())[0]
    want = check_document(eager, basic_project.good_registry(), basic_project.settings())[0]
    assert codes(got) == codes(want) == ["arguments"]
    assert [i.path for i in got.issues] == [i.path for i in want.issues] == \
        ["/steps/1/arguments/n"]
    assert want.issues[0].line is not None  # a file read from text is located
    assert [(i.line, i.column) for i in got.issues] == [(None, None)]
    assert lazy.text == ""  # nothing had to be written to locate it


@pytest.mark.parametrize(("value", "marks"), [
    ("plain", False), ("\ufdd0params.x\ufdd1", True), ("caf\u00e9 \ufdd2", True),
    ("\\ufdd0 spelt", True),
])
def test_marker_characters_are_seen_without_the_text(value: str, marks: bool) -> None:
    data = {"planrun": 1, "steps": [{"id": "a", "arguments": {"v": value}}]}
    lazy = Document.of_data(data, "journal:r1")
    eager = Document(data=data, file="x", text=json.dumps(data, indent=2), kind="json")
    assert lazy.may_hold_marks() is eager.may_hold_marks() is marks
    assert lazy.text == ""
