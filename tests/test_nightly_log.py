"""What a nightly job's log and the morning's commands tell the operator.

Found by a fresh operator who ran planrun under cron (no terminal, stdin from /dev/null,
stderr appended to one log file) and broke it in realistic ways: the log must say which
run each line belongs to, how it ended and what to do next; a run already retried must
send the operator to its child; a journal whose disk fills up mid-run must name the run
and the way on; the HTML report of a crashed night must not read as a job still going.
Each test runs the real ``planrun`` in a subprocess with no terminal.
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from test_operator import killed_waiting_run, ops_project, run, start_waiting_run

RFC3339 = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)"

FAILING = """\
planrun: 1
goal: A step that fails
steps:
  - {id: first, tool: say, arguments: {text: one}}
  - {id: broken, tool: fragile, depends_on: [first], arguments: {path: fixed}}
"""

FRAGILE_TOOL = """\
  fragile:
    python: fragiletools:fragile
    idempotent: true
    arguments: {type: object, properties: {path: {type: string}}, required: [path],
                additionalProperties: false}
"""

FRAGILE_MODULE = '''\
import os


def fragile(path):
    if not os.path.exists(path):
        raise RuntimeError("not fixed yet:\\n  line two of the reason\\n  line three")
    return "fixed"
'''


def failing_project(tmp_path: Path) -> Path:
    app = ops_project(tmp_path / "app")
    with (app / "tools.yaml").open("a", encoding="utf-8") as f:
        f.write(FRAGILE_TOOL)
    (app / "fragiletools.py").write_text(FRAGILE_MODULE, encoding="utf-8")
    (app / "plans" / "failing.yaml").write_text(FAILING, encoding="utf-8")
    return app


def test_the_log_of_a_run_says_which_run_it_was_how_it_ended_and_what_next(
        tmp_path: Path) -> None:
    app = failing_project(tmp_path)
    res = run(app, "execute", "failing", "--json")
    assert res.returncode == 1, res
    run_id = json.loads(res.stdout)["run_id"]
    lines = res.stderr.splitlines()
    assert re.fullmatch(rf"planrun: run {run_id} \(failing r1\) started at {RFC3339}",
                        lines[0]), lines
    end = lines[-1]
    assert end.startswith(f"planrun: run {run_id} (failing r1): failed — 1/2 succeeded, "
                          "1 failed"), end
    assert re.search(rf" at {RFC3339}; next: planrun retry {run_id}$", end), end
    # Every line between names the run too: a log several runs write to can be split.
    assert all(line.startswith(f"planrun: run {run_id}: ") for line in lines[1:-1]), lines
    # A message of several lines stays on its event's one line.
    broken = [line for line in lines if line.startswith(f"planrun: run {run_id}: broken failed")]
    assert len(broken) == 1, lines
    assert "not fixed yet: line two of the reason line three" in broken[0], lines

    # --quiet: no progress, so neither line
    quiet = run(app, "execute", "failing", "--json", "-q")
    assert quiet.returncode == 1, quiet
    assert "started at" not in quiet.stderr, quiet.stderr
    assert "next:" not in quiet.stderr, quiet.stderr


def test_a_retried_run_sends_the_operator_to_its_child(tmp_path: Path) -> None:
    app = failing_project(tmp_path)
    parent = json.loads(run(app, "execute", "failing", "--json").stdout)["run_id"]
    (app / "fixed").touch()
    res = run(app, "retry", parent, "--json")
    assert res.returncode == 0, res
    child = json.loads(res.stdout)["run_id"]
    assert re.match(rf"planrun: run {child} \(failing r1\) started \(a retry of {parent}\) "
                    rf"at {RFC3339}$", res.stderr.splitlines()[0]), res.stderr

    status = json.loads(run(app, "status", parent, "--json").stdout)
    assert status["status"] == "failed"
    assert status["next"] == f"planrun status {child}"  # not `retry` again
    assert f"next: planrun status {child}" in run(app, "status", parent).stdout

    rows = {r["run_id"]: r for r in json.loads(run(app, "runs", "--json").stdout)}
    assert rows[parent]["retried_as"] == child
    assert rows[parent]["parent_run_id"] is None
    assert rows[child]["parent_run_id"] == parent
    assert rows[child]["retried_as"] is None
    text = run(app, "runs").stdout
    line = next(t for t in text.splitlines() if t.startswith(parent))
    assert f"(retried as {child})" in line, text


def _fill_limit() -> None:
    # The journal's "disk" holds 600 KB: a write past it fails (EFBIG), as on a full disk.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (600_000, 600_000))


def test_a_journal_that_cannot_be_written_mid_run_names_the_run_and_the_way_on(
        tmp_path: Path) -> None:
    app = ops_project(tmp_path / "app")
    with (app / "tools.yaml").open("a", encoding="utf-8") as f:
        f.write("""\
  blob:
    python: blobtools:blob
    idempotent: true
    arguments: {type: object, properties: {n: {type: integer}}, required: [n],
                additionalProperties: false}
""")
    (app / "blobtools.py").write_text(
        "def blob(n):\n    return {'n': n, 'data': 'x' * 20000}\n", encoding="utf-8")
    (app / "plans" / "fill.yaml").write_text(
        "planrun: 1\ngoal: Outputs that fill a small disk\nsteps:\n"
        "  - {id: each, tool: blob, for_each: " + json.dumps(list(range(80)))
        + ', arguments: {n: "{item}"}}\n', encoding="utf-8")
    journal = tmp_path / "journal.sqlite3"
    env = {**os.environ, "PLANRUN_JOURNAL": str(journal)}
    cut = subprocess.run([sys.executable, "-m", "planrun", "execute", "fill", "--json"],
                         cwd=app, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                         text=True, timeout=120, preexec_fn=_fill_limit)
    assert cut.returncode == 6, cut
    error = json.loads(cut.stdout)["error"]
    run_id = error["run_id"]
    assert error["code"] == "journal"
    assert error["message"].startswith(f"run {run_id} stopped: cannot write the journal")
    assert f"planrun resume {run_id}" in error["hint"], error
    assert "else resume names it for `planrun resolve` first" in error["hint"], error
    assert "--journal" not in error["hint"], error  # another journal would orphan the run
    assert f"planrun resume {run_id}" in cut.stderr

    again = run(app, "resume", run_id, "--json", env=env)
    assert again.returncode == 0, again
    assert json.loads(again.stdout)["steps"][0]["items"]["succeeded"] == 80


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 700 KB file system (tmpfs): writes past it fail with ENOSPC, as on a full
    disk. Skipped where this process may not mount one (not root, no CAP_SYS_ADMIN)."""
    where = tmp_path / "small"
    where.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=700k", "tmpfs", str(where)],
                          capture_output=True, text=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


def test_a_fan_out_whose_journal_fills_up_ends_with_one_message(tmp_path: Path,
                                                               small_disk: Path) -> None:
    """The other workers of the fan-out were left to fail again at the loop's shutdown,
    each printing a traceback (found by an attacker whose journal's disk filled up)."""
    app = ops_project(tmp_path / "app")
    with (app / "tools.yaml").open("a", encoding="utf-8") as f:
        f.write("""\
  mark:
    python: marktools:mark
    arguments: {type: object, properties: {n: {type: integer}}, required: [n],
                additionalProperties: false}
""")
    (app / "marktools.py").write_text(
        "import os\n\n\ndef mark(n):\n    with open(f'marks-{n % 8}', 'a') as f:\n"
        "        f.write(f'{n}\\n')\n        f.flush()\n        os.fsync(f.fileno())\n"
        "    return {'n': n}\n", encoding="utf-8")
    (app / "plans" / "many.yaml").write_text(
        "planrun: 1\ngoal: Many small calls\nmax_parallel: 8\nsteps:\n"
        "  - {id: each, tool: mark, for_each: " + json.dumps(list(range(2000)))
        + ', arguments: {n: "{item}"}}\n', encoding="utf-8")
    env = {**os.environ, "PLANRUN_JOURNAL": str(small_disk / "journal.sqlite3")}
    cut = subprocess.run([sys.executable, "-m", "planrun", "execute", "many"], cwd=app,
                         env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         timeout=120)
    assert cut.returncode == 6, cut
    assert "disk is full" in cut.stderr, cut.stderr
    assert "Traceback" not in cut.stderr, cut.stderr
    assert "unhandled exception" not in cut.stderr, cut.stderr
    assert cut.stderr.count("error[journal]") == 1, cut.stderr


GRANTED = """\
[policy]
[[policy.grants]]
id = "small-wipes"
tool = "wipe"
arguments = {type = "object", properties = {text = {type = "string", maxLength = 5}}}
expires = 2099-12-31T00:00:00Z
granted_by = "ops@example.com"
"""


def test_a_value_outside_a_grant_is_told_to_fit_the_grant(tmp_path: Path) -> None:
    """The hint spoke of making arguments checkable when the grant had checked them and
    the value was simply out of range (found by a fresh operator)."""
    app = ops_project(tmp_path / "app")
    (app / "planrun.toml").write_text(GRANTED, encoding="utf-8")
    (app / "plans" / "direct.yaml").write_text(
        "planrun: 1\ngoal: Wipe what is named\nparams:\n  what: {type: string}\n"
        'steps:\n  - {id: publish, tool: wipe, arguments: {text: "{params.what}"}}\n',
        encoding="utf-8")
    res = run(app, "execute", "direct", "-p", "what=everything")
    assert res.returncode == 4, res
    assert "arguments leave grant 'small-wipes'" in res.stderr, res.stderr
    assert "give values the grant allows, or widen the grant" in res.stderr, res.stderr
    assert "so that the grant can check" not in res.stderr, res.stderr
    assert run(app, "execute", "direct", "-p", "what=tmp").returncode == 0

    # Arguments known only at run time: the grant cannot check them; that is the fix.
    late = run(app, "execute", "hello")
    assert late.returncode == 4, late
    assert "cannot check arguments only known at run time" in late.stderr, late.stderr
    assert "so that the grant can check the step's arguments" in late.stderr, late.stderr


def test_a_crashed_run_reads_as_nobody_driving_it(tmp_path: Path) -> None:
    """The report of a SIGKILLed night said only "running" (it read as a job still going),
    and ``resume --explain`` began "run … is running"."""
    app = ops_project(tmp_path / "app")
    killed_waiting_run(app, tmp_path / "gate")
    page = tmp_path / "report.html"
    rep = run(app, "report", "last", "--out", str(page))
    assert rep.returncode == 0, rep
    assert "nobody drives it: its process is gone" in page.read_text(encoding="utf-8")
    explain = run(app, "resume", "--explain")
    assert explain.returncode == 0, explain
    assert re.match(r"run \w+ is running \(nobody drives it: its process is gone\)",
                    explain.stdout), explain.stdout


def test_an_interrupted_run_without_a_keyboard_says_how_to_cancel_at_once(
        tmp_path: Path) -> None:
    app = ops_project(tmp_path / "app")
    proc = start_waiting_run(app, tmp_path / "gate")
    proc.send_signal(signal.SIGTERM)
    (tmp_path / "gate").touch()  # the call ends within its grace period
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err  # its last call ended in the grace period: completed
    assert f"kill -INT {proc.pid} cancels them now" in err, err
    assert "Ctrl-C" not in err, err


def test_schema_descriptions_are_for_users(tmp_path: Path) -> None:
    """An editor shows these on hover: no references into planrun's code or its spec."""
    def descriptions(value: object) -> list[str]:
        if isinstance(value, dict):
            return [d for k, v in value.items() for d in (
                [v] if k == "description" and isinstance(v, str) else descriptions(v))]
        if isinstance(value, list):
            return [d for v in value for d in descriptions(v)]
        return []

    for kind in ("plan", "tools"):
        res = run(tmp_path, "schema", kind)
        assert res.returncode == 0, res
        found = descriptions(json.loads(res.stdout))
        assert found, kind
        leaks = [d for d in found if re.search(r"SPEC|issue \d|:(mod|class|func):", d)]
        assert not leaks, leaks


@pytest.mark.parametrize("given", [["-p", "kep=5"], ["-p", "kep=5", "-p", "other=1"]])
def test_a_refused_plan_says_why_on_stderr_when_stdout_has_the_json(
        tmp_path: Path, given: list[str]) -> None:
    """``execute --json`` of a refused plan: the report is the JSON on stdout, so the one
    line on stderr (what a cron job keeps apart) carries the first error and how many
    more; it said "plan 'failing' was refused" alone (found by a fresh operator)."""
    app = failing_project(tmp_path)
    res = run(app, "execute", "failing", *given, "--json")
    assert res.returncode == 3, res
    out = json.loads(res.stdout)
    assert out["ok"] is False
    (line,) = res.stderr.splitlines()
    more = " (and 1 more)" if len(given) > 2 else ""
    (refused,) = [r["run_id"] for r in json.loads(run(app, "runs", "--json").stdout)
                  if r["status"] == "refused"]
    assert out["error"]["run_id"] == refused  # as every error that names a run has it
    # the run it journaled is named at the end, as every run's lines name it
    assert line == ("planrun: error[param_unknown]: plan 'failing' was refused: "
                    "plans/failing.yaml: parameter 'kep' is not declared by this plan. "
                    f"Declared: none{more} (run {refused})"), line


def test_a_second_run_of_a_plan_a_live_process_drives_says_so(tmp_path: Path) -> None:
    """Two cron nights that overlap: the second ``execute`` of a plan whose first run is
    still going notes that run on stderr (each run does all its steps: before, the log
    gave no sign that everything was done twice; found by a fresh operator). A run left
    by a dead process is no such note. It is a note only: the run goes on."""
    app = ops_project(tmp_path / "app")
    gate = tmp_path / "gate"
    first = start_waiting_run(app, gate)
    try:
        live = json.loads(run(app, "runs", "--json").stdout)[0]["run_id"]
        (tmp_path / "open").write_text("")  # the second run's wait ends at once
        res = run(app, "execute", "wait", "-p", f"path={tmp_path / 'open'}", "--json")
    finally:
        gate.write_text("")
        first.communicate(timeout=60)
    assert res.returncode == 0, res
    notes = [line for line in res.stderr.splitlines() if ": note: " in line]
    assert len(notes) == 1, res.stderr
    second = json.loads(res.stdout)["run_id"]
    assert notes[0].startswith(
        f"planrun: run {second}: note: run {live} of this plan is running now too ("), notes
    # a run nobody drives (its process killed) is not noted
    killed_waiting_run(app, tmp_path / "gate2")
    again = run(app, "execute", "wait", "-p", f"path={tmp_path / 'open'}", "--json")
    assert again.returncode == 0, again
    assert ": note: " not in again.stderr, again.stderr


def test_a_log_several_runs_wrote_at_once_splits_by_run(tmp_path: Path) -> None:
    """Three runs at once append their stderr to one file (cron jobs sharing a log): the
    lines of each are found by ``planrun: run ID`` alone, and they are all of its lines,
    from its first to its summary (found by a review: step lines named no run)."""
    from harness import planrun_command

    app = failing_project(tmp_path)
    log = tmp_path / "cron.log"
    with log.open("ab") as f:
        procs = [subprocess.Popen([*planrun_command(), "execute", "failing", "--json"],
                                  cwd=app, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=f) for _ in range(3)]
        ids = [json.loads(p.communicate(timeout=60)[0])["run_id"] for p in procs]
    lines = log.read_text(encoding="utf-8").splitlines()
    assert len(set(ids)) == 3
    mine = {i: [line for line in lines if line.startswith(f"planrun: run {i}")] for i in ids}
    assert sum(len(v) for v in mine.values()) == len(lines), lines  # no line is nobody's
    for run_id, own in mine.items():
        assert own[0].startswith(f"planrun: run {run_id} (failing r1) started at "), own
        assert own[-1].startswith(f"planrun: run {run_id} (failing r1): failed"), own
        steps = [line.removeprefix(f"planrun: run {run_id}: ").split(" ")[:2]
                 for line in own[1:-1]]
        assert ["first", "started"] in steps
        assert ["first", "succeeded"] in steps
        assert ["broken", "failed"] in steps
