"""Bidirectional controls in what a plan or a tool wrote are shown as escapes (found by
attack): a plan whose goal or name held U+202E (RIGHT-TO-LEFT OVERRIDE) made a terminal
and the report show the text after it reversed (``completed`` read ``detelpmoc``).

Letters of right-to-left scripts are left as they are. Real ``planrun`` processes.
"""

from __future__ import annotations

import os
from pathlib import Path

from harness import run_planrun

RLO = "\u202e"


def _project(root: Path) -> dict[str, str]:
    (root / "plans").mkdir(parents=True)
    (root / "t.py").write_text("def echo(text):\n    raise ValueError(text)\n")
    (root / "tools.yaml").write_text(
        "tools:\n  echo:\n    python: t:echo\n    arguments: {type: object, properties: "
        "{text: {type: string}}, required: [text]}\n")
    (root / "plans" / "p.yaml").write_text(
        f"planrun: 1\ngoal: \"nightly{RLO}gnp.exe שלום\"\nsteps:\n"
        f"  - {{id: a, tool: echo, arguments: {{text: \"bad{RLO}txt\"}}}}\n",
        encoding="utf-8")
    return dict(os.environ, PLANRUN_JOURNAL=str(root / "j.sqlite3"), NO_COLOR="1")


def test_a_terminal_and_the_report_show_bidi_controls_as_escapes(tmp_path: Path) -> None:
    env = _project(tmp_path)
    ran = run_planrun("execute", "p", cwd=tmp_path, env=env)
    assert ran.returncode == 1, ran
    shown = run_planrun("show", "p", cwd=tmp_path, env=env)
    status = run_planrun("status", "last", cwd=tmp_path, env=env)
    for res in (ran, shown, status):
        assert RLO not in res.stdout + res.stderr, res
    assert "\\u202e" in shown.stdout
    assert "שלום" in shown.stdout  # right-to-left letters as they are
    assert "bad\\u202etxt" in status.stdout
    out = tmp_path / "r.html"
    assert run_planrun("report", "--out", str(out), cwd=tmp_path, env=env).returncode == 0
    page = out.read_text(encoding="utf-8")
    start = page.index("<body")
    assert RLO not in page[start:]
    assert "\\u202e" in page
