"""Control characters in what a tool or a plan wrote are shown as escapes, never sent to the
terminal (found by attack): a tool's error message holding ``ESC ] 0 ; … BEL`` set the
terminal's title from ``planrun status``, ``ESC [ 2 J`` cleared the screen, a lone ``\\r``
or backspaces wrote over what came before; the report carried NUL and ESC into its page;
C1 controls and bidirectional controls went raw into ``planrun output`` and ``--json``.

What people read (status, log, the run's own lines on stderr, the validation report, the
report page, the approval prompt on a terminal) shows ``\\u001b``; JSON outputs are the
same values for a program (escapes of the same characters). Real ``planrun`` processes;
the terminal cases on a pseudo-terminal (pexpect).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pexpect

from harness import run_planrun
from planrun.loading import visible

#: Everything a terminal or a page would not show as itself.
HIDDEN = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]|\r(?!\n)")

BAD = ("A\x1b]0;PWNED\x07B\x1b[2J\x1b[1;1HC\rFAKE\x00N\x08\x08X\x9b31mY\x7fZ"
       "\u202erevd\u202c")

TOOLS = """
tools:
  boom:
    python: ht:boom
    arguments: {type: object, properties: {text: {type: string}}, required: [text]}
  give:
    python: ht:give
    arguments: {type: object, properties: {text: {type: string}}, required: [text]}
  sh:
    command: ["sh", "-c",
              "printf 'err \\\\033]0;PWN\\\\007 \\\\033[2J \\\\r over\\\\n' >&2; exit 3"]
    arguments: {type: object}
"""

MODULE = f"""
BAD = {BAD!r}

def boom(text):
    raise RuntimeError(BAD + text)

def give(text):
    return {{"k" + BAD: BAD, "t": text}}
"""

PLAN = """planrun: 1
goal: hostile values
params:
  tok: {type: string, secret: true}
steps:
  - {id: g, tool: give, arguments: {text: "x{params.tok}"}}
  - {id: b, tool: boom, arguments: {text: "y{params.tok}"}}
  - {id: s, tool: sh, arguments: {}}
"""


def _project(root: Path) -> dict[str, str]:
    (root / "plans").mkdir(parents=True)
    (root / "ht.py").write_text(MODULE, encoding="utf-8")
    (root / "tools.yaml").write_text(TOOLS, encoding="utf-8")
    (root / "plans" / "p.yaml").write_text(PLAN, encoding="utf-8")
    return dict(os.environ, PLANRUN_JOURNAL=str(root / "j.sqlite3"), NO_COLOR="1",
                PYTHONPATH=str(root))


def _planruns_own(stderr: str) -> str:
    """planrun's lines on stderr (not what a python tool wrote there itself)."""
    return "\n".join(line for line in stderr.splitlines() if line.startswith("planrun:"))


def test_visible_escapes_controls_keeps_tabs_newlines_and_crlf() -> None:
    assert visible("a\x1b[2Jb") == "a\\u001b[2Jb"
    assert visible("a\rb\r\nc\td\ne") == "a\\u000db\r\nc\td\ne"
    assert visible("\x00\x7f\x9b") == "\\u0000\\u007f\\u009b"
    assert visible("ok שלום é") == "ok שלום é"
    # JSON text stays JSON of the same value
    text = json.dumps({"k\x9b": "\u202e\x7f\ud800"}, ensure_ascii=False)
    assert json.loads(visible(text)) == {"k\x9b": "\u202e\x7f\ud800"}


def test_status_log_report_and_outputs_show_controls_as_escapes(tmp_path: Path) -> None:
    env = _project(tmp_path)
    ran = run_planrun("execute", "p", "-p", "tok=SEKRET123", cwd=tmp_path, env=env)
    assert ran.returncode == 1, ran
    assert not HIDDEN.search(ran.stdout), ran.stdout
    assert not HIDDEN.search(_planruns_own(ran.stderr)), ran.stderr
    assert "\\u001b]0;PWNED\\u0007" in ran.stdout
    shown = {args: run_planrun(*args, cwd=tmp_path, env=env) for args in (
        ("status",), ("status", "--json"), ("log",), ("log", "--json"),
        ("log", "--tracebacks"), ("runs",), ("output", "last", "g"))}
    for args, res in shown.items():
        assert res.returncode == 0, (args, res)
        assert not HIDDEN.search(res.stdout + res.stderr), (args, res.stdout)
        assert "SEKRET123" not in res.stdout + res.stderr
    assert "\\u001b" in shown[("status",)].stdout
    assert "\\u001b" in shown[("log", "--tracebacks")].stdout
    # programs get the values themselves
    assert json.loads(shown[("output", "last", "g")].stdout)["k" + BAD] == BAD
    steps = json.loads(shown[("status", "--json")].stdout)["steps"]
    assert BAD in next(s for s in steps if s["id"] == "b")["error"]["message"]
    out = tmp_path / "r.html"
    assert run_planrun("report", "-o", str(out), cwd=tmp_path, env=env).returncode == 0
    page = out.read_text(encoding="utf-8")
    assert not HIDDEN.search(page[page.index("<body"):])
    assert "\\u001b]0;PWNED" in page
    assert "SEKRET123" not in page


def test_a_validation_report_shows_controls_as_escapes(tmp_path: Path) -> None:
    env = _project(tmp_path)
    (tmp_path / "plans" / "v.yaml").write_text(
        'planrun: 1\ngoal: g\nsteps:\n  - {id: s, tool: sh, arguments: {}}\n'
        '  - {id: w, tool: sh, depends_on: [s], arguments: {},\n'
        '     when: "steps.s.status == \\"\\e]0;PWN\\a\\u202e\\" &&& "}\n'
        '  - {id: x, tool: give, arguments: {text: "{params.\\e[2J}"}}\n', encoding="utf-8")
    for fmt in ("text", "github", "json"):
        res = run_planrun("validate", "v", "--format", fmt, cwd=tmp_path, env=env)
        assert res.returncode == 3, res
        assert "PWN" in res.stdout + res.stderr, res
        assert not HIDDEN.search(res.stdout + res.stderr), (fmt, res.stdout, res.stderr)


def test_a_terminal_table_and_the_approval_prompt_show_escapes(tmp_path: Path) -> None:
    env = _project(tmp_path)
    (tmp_path / "tools.yaml").write_text(TOOLS + """  wipe:
    python: ht:give
    irreversible: true
    arguments: {type: object, properties: {text: {type: string}}, required: [text]}
""", encoding="utf-8")
    (tmp_path / "plans" / "w.yaml").write_text(
        'planrun: 1\ngoal: g\nsteps:\n  - id: w\n    tool: wipe\n'
        '    intent: "keep\\e[8m everything\\u202e"\n'
        '    arguments: {text: "\\x9b2J\\u202eabc"}\n', encoding="utf-8")
    assert run_planrun("execute", "p", "-p", "tok=x", cwd=tmp_path, env=env).returncode == 1

    def on_tty(*args: str) -> str:
        child = pexpect.spawn(sys.executable, ["-m", "planrun", *args], cwd=str(tmp_path),
                              env=env, encoding="utf-8", timeout=30, dimensions=(50, 400))
        if args[0] == "execute":
            child.expect(r"\[y/N\]")
            seen = child.before or ""
            child.sendline("n")
        else:
            seen = ""
        child.expect(pexpect.EOF)
        child.close()
        return seen + (child.before or "")

    table = on_tty("status", "last")
    assert "\\u001b]0;PWNED\\u0007" in table
    for raw in ("\x1b]0;PWNED", "\x07", "\x00"):
        assert raw not in table
    prompt = on_tty("execute", "w")
    for shown in ("\\u001b[8m", "\\u202e", "\\u009b"):
        assert shown in prompt
    for raw in ("\x1b[8m", "\u202e", "\x9b"):
        assert raw not in prompt
