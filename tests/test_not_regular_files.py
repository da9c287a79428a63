"""A FIFO, a device or a socket where planrun reads a file is refused at once, never waited
on (found by a fresh helper: a FIFO as ``tools.yaml`` or as the journal hung
``validate`` and ``runs`` forever; ``/dev/null`` as the journal read as "no runs").

Real processes with a timeout: a hang fails the test instead of stopping the suite.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

PLAN = "planrun: 1\ngoal: nothing\nsteps: []\n"
TOOLS = "tools: {}\n"


def planrun(root: Path, *args: str, journal: Path | str | None = None
            ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLANRUN_")}
    env["PLANRUN_JOURNAL"] = str(journal or root / "j.sqlite3")
    return subprocess.run([sys.executable, "-m", "planrun", *args, "-C", str(root)],
                          cwd=root, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=60)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "plans").mkdir()
    (tmp_path / "plans" / "p.yaml").write_text(PLAN)
    (tmp_path / "tools.yaml").write_text(TOOLS)
    return tmp_path


@contextmanager
def not_regular(path: Path, kind: str) -> Iterator[None]:
    """``path`` made a FIFO, a Unix socket (listening) or a device (a symlink to one)."""
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
        yield
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(path))
            s.listen()
            yield
    else:
        path.symlink_to("/dev/zero")
        yield


@pytest.mark.parametrize("kind", ["fifo", "socket", "device"])
@pytest.mark.parametrize("which", ["tools.yaml", "plans/p.yaml"])
def test_a_plan_or_registry_that_is_no_regular_file_is_refused(root: Path, kind: str,
                                                                which: str) -> None:
    with not_regular(root / which, kind):
        result = planrun(root, "validate", "p")
    assert result.returncode == 3, result  # refused, with the file named
    assert "not a regular file" in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("kind", ["fifo", "socket", "device"])
@pytest.mark.parametrize("command", [["runs"], ["status"], ["execute", "p"]])
def test_a_journal_that_is_no_regular_file_is_exit_6(root: Path, kind: str,
                                                     command: list[str]) -> None:
    journal = root / "journal"
    with not_regular(journal, kind):
        result = planrun(root, *command, journal=journal)
    assert result.returncode == 6, result
    assert "error[journal]" in result.stderr
    assert "not a regular file" in result.stderr
    assert "Traceback" not in result.stderr


def test_dev_null_as_the_journal_is_no_journal(root: Path) -> None:
    result = planrun(root, "runs", journal="/dev/null")
    assert result.returncode == 6, result
    assert "not a regular file" in result.stderr
