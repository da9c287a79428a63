"""A fan-out's output, the list of its items' outputs, is bounded as one call's is.

Found by a review of what grows without bound: each item's output was at most 64 MiB, but
their list had no bound. Twenty items of 60 MB made a 1.2 GB list: SQLite refused it
("string or blob too big") after every item had run, the run stopped with a journal error
that told to check the journal file could be written, and every ``resume`` ran into the
same wall (the run could never end). A step reading the list would also have held it in
memory whole, and so did the facets of the items.

Now a fan-out whose items' outputs are together more than ``MAX_OUTPUT_BYTES`` (64 MiB) as
JSON fails with ``output`` (its items stay ``succeeded``: their effects happened) and
nothing is assembled. ``retry`` would replay the items, so the run's ``next`` is a new
``execute``. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from planrun.tools import MAX_OUTPUT_BYTES
from planrun_cli import CliProject

TOOLS = """\
tools:
  sizes:
    description: The item sizes read from sizes.txt
    python: bigtools:sizes
    arguments: {type: object, additionalProperties: false}
  big:
    description: A string of the given length
    python: bigtools:big
    idempotent: true
    arguments: {type: object, properties: {n: {type: integer}}, required: [n],
                additionalProperties: false}
  count:
    description: How many values
    python: bigtools:count
    arguments: {type: object, properties: {xs: {type: array}}, required: [xs],
                additionalProperties: false}
"""

MODULE = """\
from pathlib import Path


def sizes():
    return [int(n) for n in Path("sizes.txt").read_text().split()]


def big(n):
    return "y" * n


def count(xs):
    return len(xs)
"""

PLAN = """\
planrun: 1
goal: Big item outputs, then a step that reads their list
steps:
  - {id: sizes, tool: sizes, arguments: {}}
  - {id: big, tool: big, depends_on: [sizes], for_each: "{steps.sizes.output}",
     arguments: {n: "{item}"}}
  - {id: total, tool: count, depends_on: [big], arguments: {xs: "{steps.big.output}"}}
"""


def _list_bytes(lengths: list[int]) -> int:
    """Bytes of the JSON list of strings of these lengths: quotes, commas, brackets."""
    return sum(n + 2 for n in lengths) + len(lengths) - 1 + 2


@pytest.fixture
def proj(journal_location: object, cli: CliProject) -> CliProject:
    cli.tools(TOOLS)
    cli.write("bigtools.py", MODULE)
    cli.plan("fan", PLAN)
    return cli


def _run_with(proj: CliProject, lengths: list[int]) -> Any:
    (proj.root / "sizes.txt").write_text(" ".join(map(str, lengths)))
    return proj.run("execute", "fan", "--json", timeout=240)


def test_a_list_of_item_outputs_past_the_bound_fails_the_step_not_the_journal(
        proj: CliProject) -> None:
    lengths = [MAX_OUTPUT_BYTES // 2 - 2, MAX_OUTPUT_BYTES // 2]  # each far below 64 MiB
    size = _list_bytes(lengths)
    assert size > MAX_OUTPUT_BYTES
    r = _run_with(proj, lengths)
    assert r.returncode == 1, r
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "error[journal]" not in r.stderr, r.stderr[-2000:]
    steps = {s["id"]: s for s in r.json["steps"]}
    big = steps["big"]
    assert big["status"] == "failed", big
    assert big["error"]["code"] == "output", big
    assert f"{size:,} bytes" in big["error"]["message"], big
    assert big["items"]["succeeded"] == 2, big
    assert big["output_bytes"] == 0, big  # nothing was assembled
    assert steps["total"]["status"] == "skipped", steps["total"]
    # retry would replay both items and fail again: the next thing is a new run
    assert r.json["next"] == "planrun execute fan", r.json["next"]

    # the journal is whole and keeps the items' outputs
    if isinstance(proj.journal, Path):
        with sqlite3.connect(proj.journal) as db:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    out = proj.run("output", r.json["run_id"], "big", "--item", "1")
    assert out.returncode == 0, out
    assert len(out.stdout.strip()) == lengths[1] + 2  # the JSON string, quoted


def test_one_byte_past_the_bound_fails(proj: CliProject) -> None:
    """The measure is exact: quotes, commas and brackets count (one byte over fails)."""
    lengths = [MAX_OUTPUT_BYTES // 2 - 4, MAX_OUTPUT_BYTES // 2 - 2]
    assert _list_bytes(lengths) == MAX_OUTPUT_BYTES + 1
    r = _run_with(proj, lengths)
    assert r.returncode == 1, r
    big = {s["id"]: s for s in r.json["steps"]}["big"]
    assert big["error"]["code"] == "output", big
    assert f"{MAX_OUTPUT_BYTES + 1:,} bytes" in big["error"]["message"], big


def test_a_list_of_item_outputs_at_the_bound_is_kept(proj: CliProject) -> None:
    lengths = [MAX_OUTPUT_BYTES // 2 - 4, MAX_OUTPUT_BYTES // 2 - 3]
    assert _list_bytes(lengths) == MAX_OUTPUT_BYTES
    r = _run_with(proj, lengths)
    assert r.returncode == 0, r
    steps = {s["id"]: s for s in r.json["steps"]}
    assert steps["big"]["status"] == "succeeded", steps["big"]
    assert steps["big"]["output_bytes"] == MAX_OUTPUT_BYTES, steps["big"]
    total = proj.run("output", r.json["run_id"], "total")
    assert total.returncode == 0, total
    assert total.stdout.strip() == "2", total


def test_a_run_stopped_by_the_old_wall_ends_on_resume(proj: CliProject) -> None:
    """A run killed after its items' outcomes, before the list: resume fails the step."""
    lengths = [MAX_OUTPUT_BYTES // 2, MAX_OUTPUT_BYTES // 2]
    (proj.root / "sizes.txt").write_text(" ".join(map(str, lengths)))
    r = proj.run("execute", "fan", "--json", crash="outcome:big#1", timeout=240)
    if r.returncode != -9:
        pytest.fail(f"the crash seam outcome:big#1 did not kill the run: {r}")
    run_id = proj.probe().run_ids()[0]
    again = proj.run("resume", run_id, "--json", timeout=240)
    assert again.returncode == 1, again
    steps = {s["id"]: s for s in again.json["steps"]}
    assert steps["big"]["status"] == "failed", steps["big"]
    assert steps["big"]["error"]["code"] == "output", steps["big"]
    assert again.json["status"] == "failed"
