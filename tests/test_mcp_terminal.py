"""``planrun mcp`` started by hand on a terminal says what it is and how to stop it.

It reads JSON-RPC from an MCP client on stdin and prints nothing else, so a person who
ran it by hand saw nothing and thought it hung (found by a review). On a terminal
(stdin a TTY) it now prints one line on stderr; a client's pipes get nothing more on
stderr. Real processes: a pseudo-terminal (pexpect) and pipes.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pexpect = pytest.importorskip("pexpect")
pytest.importorskip("mcp")

from harness import PLANRUN  # noqa: E402

LINE = "this is an MCP server for"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "plans").mkdir()
    (tmp_path / "tools.yaml").write_text("tools: {}\n", encoding="utf-8")
    return tmp_path


def _env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLANRUN_")}
    env["PLANRUN_JOURNAL"] = str(root / "j.sqlite3")
    return env


@pytest.mark.parametrize(("stop", "status"), [("eof", 0), ("intr", 130)])
def test_on_a_terminal_it_says_what_it_is_and_how_to_stop_it(
        root: Path, stop: str, status: int) -> None:
    child = pexpect.spawn(PLANRUN[0], [*PLANRUN[1:], "mcp"], cwd=str(root), env=_env(root),
                          encoding="utf-8", timeout=30, dimensions=(24, 400))
    try:
        child.expect(LINE)
        child.expect(r"Ctrl-D or Ctrl-C stops it[^\r\n]*\r?\n")
        said = child.before + child.after
        assert str(root) in said
        assert "Model Context Protocol" in said
        if stop == "eof":
            child.sendeof()
        else:
            child.sendintr()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == status, (child.exitstatus, child.signalstatus)


def test_a_client_on_pipes_gets_no_such_line(root: Path) -> None:
    proc = subprocess.run([*PLANRUN, "mcp"], cwd=root, env=_env(root), input=b"",
                          capture_output=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert LINE.encode() not in proc.stderr
    assert proc.stdout == b""
