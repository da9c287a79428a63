"""Issue 10, bugs 6 and 7: SIGINT during a fan-out counts calls, and a run whose every call
finished within the grace period ends as what it is; a command's stderr is kept when it
succeeds."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness import run_planrun

TOOLS = """\
tools:
  wait_for:
    python: sigtools:wait_for
    arguments: {type: object, properties: {i: {type: integer}, gate: {type: string}},
                required: [i, gate], additionalProperties: false}
    idempotent: true
"""

MODULE = '''\
import os
import time


def wait_for(i, gate):
    open(f"{gate}.started.{i}", "w").close()
    while not os.path.exists(gate):
        time.sleep(0.05)
    return i
'''

PLAN = """\
planrun: 1
goal: Three items at once
params:
  gate: {type: string}
steps:
  - id: fan
    tool: wait_for
    for_each: [0, 1, 2]
    max_parallel: 3
    arguments: {i: "{item}", gate: "{params.gate}"}
"""


def test_sigint_during_fan_out_counts_calls_and_ends_as_what_it_is(tmp_path: Path) -> None:
    project = tmp_path / "p"
    (project / "plans").mkdir(parents=True)
    (project / "tools.yaml").write_text(TOOLS)
    (project / "sigtools.py").write_text(MODULE)
    (project / "plans" / "fan.yaml").write_text(PLAN)
    gate = tmp_path / "gate"
    proc = subprocess.Popen([sys.executable, "-m", "planrun", "execute", "fan", "-p",
                             f"gate={gate}", "--json"], cwd=project,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(1200):
            if all(Path(f"{gate}.started.{i}").exists() for i in range(3)):
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        assert proc.stderr is not None
        line = ""
        for line in proc.stderr:  # wait for planrun to say it is stopping
            if "interrupted" in line:
                break
        assert "for 3 running call(s)" in line, line
        gate.touch()
        out, err = proc.communicate(timeout=60)
    finally:
        gate.touch()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    m = json.loads(out)
    assert m["status"] == "completed"
    assert m["resumable"] is False


# --- bug 7: a command's stderr is kept when it succeeds ----------------------------------

WARN_TOOLS = """\
tools:
  warn:
    command: ["sh", "-c", "echo 'tar: file changed as we read it' >&2; echo done"]
    arguments: {type: object, properties: {}, additionalProperties: false}
    idempotent: true
  quiet:
    command: ["true"]
    arguments: {type: object, properties: {}, additionalProperties: false}
    idempotent: true
"""

WARN_PLAN = """\
planrun: 1
goal: Warn on stderr and succeed
steps:
  - id: pack
    tool: warn
  - id: calm
    tool: quiet
    depends_on: [pack]
"""


def test_stderr_tail_of_a_successful_command_is_kept(tmp_path: Path) -> None:
    project = tmp_path / "p"
    (project / "plans").mkdir(parents=True)
    (project / "tools.yaml").write_text(WARN_TOOLS)
    (project / "plans" / "w.yaml").write_text(WARN_PLAN)

    def planrun(*args: str) -> subprocess.CompletedProcess[str]:
        return run_planrun(*args, cwd=project)

    res = planrun("execute", "w")
    assert res.returncode == 0, res
    assert "file changed as we read it" not in res.stderr  # only with -v
    log = planrun("log")
    assert "step_succeeded pack" in log.stdout
    line = next(x for x in log.stdout.splitlines() if "step_succeeded pack" in x)
    assert "tar: file changed as we read it" in line
    events = json.loads(planrun("log", "--json").stdout)
    ok = {e["step"]: e for e in events if e["kind"] == "step_succeeded"}
    assert ok["pack"]["data"]["stderr_tail"] == "tar: file changed as we read it"
    assert "stderr_tail" not in (ok["calm"]["data"] or {})
    verbose = planrun("execute", "w", "-v")
    assert verbose.returncode == 0
    assert re.search(r"^planrun: run \w+: pack stderr: tar: file changed as we read it$",
                     verbose.stderr, flags=re.M), verbose.stderr


def test_a_stderr_nobody_reads_fails_no_python_tool(tmp_path: Path) -> None:
    # `planrun execute -q 2>&1 | head -0`-like: stderr is a pipe whose reader has gone.
    # A python tool that writes to file descriptors 1 and 2 itself failed with
    # BrokenPipeError (planrun's own -q writes never pointed them at /dev/null first);
    # writing to stderr never changes an outcome (found by an attacker).
    (tmp_path / "tools.yaml").write_text(
        "tools:\n  chatty:\n    python: chattools:chatty\n"
        "    arguments: {type: object, additionalProperties: false}\n")
    (tmp_path / "chattools.py").write_text(
        "import os\n\ndef chatty():\n    os.write(1, b'to fd 1\\n')\n"
        "    os.write(2, b'to fd 2\\n')\n    return 'done'\n")
    (tmp_path / "plans").mkdir()
    (tmp_path / "plans" / "chat.yaml").write_text(
        "planrun: 1\ngoal: Write on both descriptors\nsteps:\n  - {id: a, tool: chatty}\n")
    journal = tmp_path / "journal.sqlite3"
    proc = subprocess.Popen(
        [sys.executable, "-m", "planrun", "execute", "chat", "-q", "-C", str(tmp_path),
         "--journal", str(journal)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        cwd=tmp_path)
    assert proc.stderr is not None
    proc.stderr.close()  # the reader is gone before the tool runs
    assert proc.wait(timeout=60) == 0
    status = run_planrun("status", "last", "--json", "-C", str(tmp_path), "--journal",
                         str(journal), cwd=tmp_path)
    steps = json.loads(status.stdout)["steps"]
    assert [(s["status"], s.get("error")) for s in steps] == [("succeeded", None)]
