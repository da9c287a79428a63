"""``planrun report``: one self-contained HTML file of a run (issue 18), through the CLI."""

from __future__ import annotations

import graphlib
import os
import re
import stat
import subprocess
import sys
import threading
import time
from html import unescape
from pathlib import Path

import pytest

from conftest import Project
from harness import run_planrun
from planrun.report.data import histogram, percentile
from planrun.report.svg import layers

from .report_support import NIGHTLY, NIGHTLY_STATUSES, REMOTE, SECRET, report
from .support import WIPE_TOOL, as_json, execute_json, invoke


def _nightly(proj: Project) -> str:
    proj.write_plan("nightly", NIGHTLY)
    result, m = execute_json(proj, "nightly", "-p", f"token={SECRET}", "--keep-going")
    assert result.exit_code == 1, result.output
    assert {s["id"]: s["status"] for s in m["steps"]} == NIGHTLY_STATUSES
    return str(m["run_id"])


def _row(page: str, step: str) -> str:
    found = re.search(rf'<tr id="step-{step}">(.*?)</tr>', page, re.DOTALL)
    assert found, f"no row for step {step}"
    return unescape(re.sub(r"<[^>]+>", " ", found.group(1)))


def test_default_file_shows_every_step_status_and_error_without_the_secret(
        proj: Project, tmp_path: Path, journal_location: Path | str) -> None:
    run_id = _nightly(proj)
    here = tmp_path / "elsewhere"
    here.mkdir()
    result = report(proj, cwd=here)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    written = here / f"planrun-report-{run_id}.html"
    assert result.stdout.strip() == str(Path(f"planrun-report-{run_id}.html"))
    page = written.read_text(encoding="utf-8")
    assert page.startswith("<!doctype html>")
    for step, status in NIGHTLY_STATUSES.items():
        # the DAG node (colour and the word), and the table row
        node = re.search(rf'<a href="#step-{step}" class="node" data-step="{step}" '
                         rf'data-status="{status}".*?</a>', page, re.DOTALL)
        assert node, (step, status)
        assert f"{status} · " in unescape(node.group(0))
        assert status in _row(page, step).split()
    assert "cannot handle" in _row(page, "bad")
    assert "tool_error" in _row(page, "bad")
    assert "dependency" in _row(page, "never")
    assert SECRET not in page
    assert "***" in page  # the parameter (and the error echoing it), masked
    assert not re.search("[\ufdd0-\ufdd2]", page)  # no reference form shown
    assert "nightly-label" in page  # a plain parameter is shown
    assert run_id in page
    assert "revision 3" in page
    assert "Fetch, fan out, and fail on purpose" in page
    assert "<details>" in page
    assert "step_failed" in page
    assert not REMOTE.search(page), REMOTE.search(page)
    assert "<script" not in page.lower()


def test_out_file_and_stdout(proj: Project, tmp_path: Path) -> None:
    run_id = _nightly(proj)
    target = tmp_path / "out" / "nightly.html"
    target.parent.mkdir()
    written = report(proj, run_id[:6], "--out", str(target))
    assert written.returncode == 0, written.stderr
    assert written.stdout.strip() == str(target)
    assert target.stat().st_mode & 0o777 == 0o600  # parameters and errors are in it
    on_stdout = report(proj, "last", "-o", "-")
    assert on_stdout.returncode == 0, on_stdout.stderr
    assert on_stdout.stdout == target.read_text(encoding="utf-8")
    assert not list(target.parent.glob(".*"))  # no temporary file left beside it
    quiet = report(proj, "--out", str(target), "-q")
    assert quiet.returncode == 0
    assert quiet.stdout == ""


def test_unknown_run_is_one_message_exit_5(proj: Project) -> None:
    _nightly(proj)
    result = report(proj, "zzzzzzzz")
    assert result.returncode == 5
    assert result.stderr.startswith("planrun: error[unknown_run]: no run 'zzzzzzzz'")
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_no_run_yet_is_unknown_run(proj: Project) -> None:
    result = report(proj)
    assert result.returncode == 5
    assert "error[unknown_run]" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("where", ["missing/folder/r.html", "."])
def test_unwritable_out_is_a_usage_error(proj: Project, tmp_path: Path, where: str) -> None:
    _nightly(proj)
    result = report(proj, "--out", str(tmp_path / where))
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("planrun: error[usage]: cannot write the report to ")
    assert "Traceback" not in result.stderr
    assert not list(tmp_path.glob(".*.html.*"))


def test_refused_run_shows_its_validation_report(broken: Project) -> None:
    result = invoke(broken, "execute", "broken")
    assert result.exit_code == 3
    shown = report(broken, "-o", "-")
    assert shown.returncode == 0, shown.stderr
    page = shown.stdout
    assert "Validation report" in page
    issues = re.search(r'<table class="issues">.*?</table>', page, re.DOTALL)
    assert issues
    text = unescape(issues.group(0))
    assert "unknown_tool" in text
    assert "arguments" in text
    for step in ("a", "b"):  # the plan's steps, never run
        assert f'data-step="{step}" data-status="not run"' in page


def test_refused_cycle_is_said_not_drawn(proj: Project) -> None:
    proj.write_plan("loop", """
        planrun: 1
        goal: Wait on each other
        steps:
          - {id: a, tool: echo, depends_on: [b], arguments: {value: 1}}
          - {id: b, tool: echo, depends_on: [a], arguments: {value: 2}}
    """)
    assert invoke(proj, "execute", "loop").exit_code == 3
    shown = report(proj, "-o", "-")
    assert shown.returncode == 0, shown.stderr
    assert "wait on each other" in shown.stdout
    assert "<code>cycle</code>" in shown.stdout


def test_retry_lineage_links_parent_and_child(proj: Project,
                                              journal_location: Path | str) -> None:
    parent = _nightly(proj)
    _, other = execute_json(proj, "nightly", "-p", f"token={SECRET}")  # a root of its own
    retried = invoke(proj, "retry", parent, "-p", f"token={SECRET}", "--json")
    assert retried.exit_code == 1, retried.output
    child = as_json(retried)["run_id"]
    assert child not in (parent, other["run_id"])
    of_child = report(proj, child, "-o", "-").stdout
    assert f'retry of <a href="planrun-report-{parent}.html">' in of_child
    of_parent = report(proj, parent, "-o", "-").stdout
    assert f'retried as <a href="planrun-report-{child}.html">' in of_parent
    assert f"planrun-report-{other['run_id']}.html" not in of_parent


def test_big_fan_out_is_summed_up_not_listed(proj: Project) -> None:
    proj.write_plan("wide", """
        planrun: 1
        goal: Many items
        steps:
          - {id: many, tool: echo, for_each: "{params.items}", arguments: {value: "{item}"}}
        params:
          items: {type: array}
    """)
    items = "[" + ",".join(str(i) for i in range(1500)) + "]"
    result, _m = execute_json(proj, "wide", "-p", f"items={items}")
    assert result.exit_code == 0, result.output
    page = report(proj, "-o", "-").stdout
    assert "1,500 items, 1,500 succeeded, 0 failed" in page
    assert "p99" in page
    assert 'class="hist"' in page
    shown = page.count('<td class="mono when"')  # event rows: item ones counted, not copied
    assert 300 <= shown < 1000
    assert "fan-out item events are not copied here" in page
    assert len(page.encode()) < 400_000


def test_cli_start_up_does_not_import_the_report() -> None:
    probe = ("import sys; import planrun.cli; from planrun.cli import app; "
             "print(sorted(m for m in sys.modules if m.startswith('planrun.report')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out.strip() == "[]"


def test_layers_follow_dependencies_and_refuse_cycles() -> None:
    deps = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"], "e": []}
    got = layers(list(deps), deps)
    assert got == [["a", "e"], ["b", "c"], ["d"]]
    with pytest.raises(graphlib.CycleError):
        layers(["x", "y"], {"x": ["y"], "y": ["x"]})


def test_percentiles_and_histogram() -> None:
    values = [float(v) for v in range(1, 101)]
    assert [percentile(values, q) for q in (50, 90, 99, 100)] == [50.0, 90.0, 99.0, 100.0]
    assert percentile([3.0], 50) == 3.0
    counts = histogram(values, bins=10)
    assert counts == [10] * 10
    assert histogram([2.0, 2.0], bins=4) == [2, 0, 0, 0]
    assert histogram([]) == []


def test_approvals_are_shown_with_who_cleared_each_step(proj: Project) -> None:
    proj.write("tools.yaml", proj.root.joinpath("tools.yaml").read_text() + WIPE_TOOL)
    proj.write_plan("careful", """
        planrun: 1
        goal: Clear before wiping
        steps:
          - {id: look, tool: echo, arguments: {value: 1}}
          - {id: wipe, tool: wipe, depends_on: [look], arguments: {value: 2}}
    """)
    result, m = execute_json(proj, "careful", "--approve", "wipe")
    assert result.exit_code == 0, result.output
    who = {s["id"]: s["approved_by"] for s in m["steps"]}["wipe"]
    assert who
    page = report(proj, "-o", "-").stdout
    assert who in _row(page, "wipe")
    approvals = re.search(r'<h2 id="approvals">.*?</table>', page, re.DOTALL)
    assert approvals
    text = unescape(re.sub(r"<[^>]+>", " ", approvals.group(0))).split()
    assert "wipe" in text
    assert "granted" in text
    assert who in " ".join(text)


def test_a_resumed_run_shades_the_idle_time_and_items_do_not_count_it(
        proj: Project) -> None:
    proj.write("tools.yaml", """
        tools:
          again:
            python: clitools:echo
            idempotent: true
            arguments: {type: object, properties: {value: {}}, required: [value],
                        additionalProperties: false}
    """)
    proj.write_plan("crashy", """
        planrun: 1
        goal: Die while fanning out, then go on
        steps:
          - {id: first, tool: again, arguments: {value: 0}}
          - {id: each, tool: again, depends_on: [first], for_each: [1, 2, 3],
             arguments: {value: "{item}"}}
    """)
    env = dict(os.environ, PLANRUN_TEST_CRASH="dispatch:each")  # item 0's dispatch record
    died = run_planrun("execute", "crashy", "-q", cwd=proj.root, env=env)
    assert died.returncode == -9, died.stderr
    time.sleep(2.0)  # nobody drives the run
    resumed = run_planrun("resume", "-q", cwd=proj.root)
    assert resumed.returncode == 0, resumed.stderr
    page = report(proj, "-o", "-").stdout
    assert 'class="idle"' in page
    assert "shaded: nobody drove the run" in page
    longest = re.search(r"<dt>max</dt><dd>([^<]+)</dd>", page)
    assert longest, "no item durations"
    assert longest.group(1).endswith(" ms"), longest.group(1)  # not the 2 s nobody worked


def test_a_run_awaiting_approval_says_what_it_waits_for(proj: Project) -> None:
    proj.write("tools.yaml", proj.root.joinpath("tools.yaml").read_text() + WIPE_TOOL)
    proj.write_plan("careful", """
        planrun: 1
        goal: Wait for a person
        steps:
          - {id: wipe, tool: wipe, arguments: {value: 2}}
    """)
    result = invoke(proj, "execute", "careful", "--defer-approval")
    assert result.exit_code == 4, result.output
    page = " ".join(unescape(re.sub(r"<[^>]+>", " ", report(proj, "-o", "-").stdout)).split())
    assert "status awaiting_approval" in page
    assert "waiting for wipe (wipe)" in page
    assert "approve planrun approve " in page


def test_out_through_a_symlink_and_into_a_fifo(proj: Project, tmp_path: Path) -> None:
    _nightly(proj)
    real = tmp_path / "reports" / "latest.html"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "latest.html"
    link.symlink_to(real)
    assert report(proj, "--out", str(link)).returncode == 0
    assert link.is_symlink()  # still a link; the file it names holds the page
    assert real.read_text(encoding="utf-8").startswith("<!doctype html>")
    # Something that is not a regular file (a FIFO; a device like /dev/stdout) is
    # written to, never replaced by a file.
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text(encoding="utf-8")),
                              daemon=True)
    reader.start()
    result = report(proj, "--out", str(fifo))
    reader.join(timeout=20)
    if reader.is_alive():  # nothing opened the FIFO: release the reader, then fail
        with open(fifo, "w"):
            pass
        reader.join(timeout=5)
    assert result.returncode == 0, result.stderr
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert got
    assert got[0].startswith("<!doctype html>")


@pytest.mark.sqlite
def test_out_never_replaces_a_journal(proj: Project, tmp_path: Path) -> None:
    # `--out` naming the journal (directly, through a symlink, or a file SQLite keeps
    # beside it) wrote the page over the whole history (found by an attacker). The same
    # for the other commands that write where --out says: plan and import.
    run_id = _nightly(proj)
    journal = Path(os.environ["PLANRUN_JOURNAL"])
    before = journal.read_bytes()
    other = tmp_path / "other.sqlite3"
    other.write_bytes(before)  # another journal, not the one in use
    wal = Path(f"{journal}-wal")
    wal.write_bytes(b"")  # what SQLite keeps beside a journal in WAL mode
    link = tmp_path / "link.html"
    link.symlink_to(journal)
    for target in (journal, link, other, wal):
        result = report(proj, run_id, "--out", str(target))
        assert result.returncode == 2, (target, result.stderr)
        assert result.stderr.startswith(
            f"planrun: error[usage]: cannot write the report to {target}: "), result.stderr
        assert "SQLite database" in result.stderr
        assert "Traceback" not in result.stderr
    assert journal.read_bytes()[:16] == b"SQLite format 3\x00"
    assert other.read_bytes() == before
    assert link.is_symlink()
    assert wal.read_bytes() == b""
    assert not list(journal.parent.glob(".*.sqlite3*"))  # no temporary file left
    assert report(proj, run_id, "--out", str(tmp_path / "fine.html")).returncode == 0
    status = run_planrun("status", run_id, "--json", "-C", str(proj.root), cwd=proj.root)
    assert status.returncode == 0, status.stderr  # the journal is whole

    planner = proj.write("planner.py", "import json, sys\njson.load(sys.stdin)\n"
                         "print(json.dumps({'planrun': 1, 'goal': 'g', 'steps': [{'id': 'a', "
                         "'tool': 'echo', 'arguments': {'value': 1}}]}))\n")
    planned = run_planrun("plan", "a goal", "--planner", f"cmd:{sys.executable} {planner}",
                          "--out", str(link), "-C", str(proj.root), cwd=proj.root)
    assert planned.returncode == 2, planned.stderr
    assert "SQLite database" in planned.stderr
    assert "Traceback" not in planned.stderr
    seed = proj.write("seed.json", '{"name": "s", "objective": "o", "nodes": [{"id": "a", '
                      '"tool": "echo", "depends_on": [], "args": {"value": 1}}]}')
    imported = run_planrun("import", str(seed), "--out", str(other), "-C", str(proj.root),
                           cwd=proj.root)
    assert imported.returncode == 2, imported.stderr
    assert "SQLite database" in imported.stderr
    assert "Traceback" not in imported.stderr
    assert journal.read_bytes()[:16] == b"SQLite format 3\x00"
    assert other.read_bytes() == before
