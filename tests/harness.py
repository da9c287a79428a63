"""The one harness that runs the real ``planrun`` process in tests, and the test assets.

- :data:`PLANRUN` — the argv prefix of a planrun process (``python -m planrun``, the same
  interpreter as the tests);
- :func:`run_planrun` — one command to its end, output captured as text (stdin is not a
  terminal); what most process-level suites need;
- :class:`Result` — a finished process as ``planrun_cli.CliProject`` returns it (the
  crash, resume, signal and concurrency suites, which also start processes in their own
  session and kill them: see ``tests/planrun_cli.py``, built on this module);
- :func:`asset` — the text of a file under ``tests/assets/`` (registries shared by suites).

Commands that run to their end (:func:`run_planrun`, ``CliProject.run``) go through
``tests/planrun_forkserver.py`` (:func:`planrun_command`): planrun is imported once per test
process and each command is a fork of that warm interpreter, with the command's own
arguments, working folder, environment and standard streams, so to the test it *is* the
planrun process (exit status, death by a signal, output) — at ~0.05 s instead of ~0.35 s
of CPU a command. What a fork cannot show is asked for with ``real=True`` (or for every
command with ``TESTS_REAL_PROCESSES=1``): a fresh interpreter's imports (the
start-up budget), its own pid or session (kill and signal suites, which use
``CliProject.start``), or ``sys.path`` from the environment. The pexpect suites spawn
``PLANRUN`` in a terminal themselves.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

PLANRUN = (sys.executable, "-m", "planrun")
FORKSERVER = Path(__file__).with_name("planrun_forkserver.py")
#: Hang guard for one planrun process that is expected to finish on its own (seconds).
TIMEOUT_S = 60.0
ASSETS = Path(__file__).with_name("assets")


@cache
def asset(name: str) -> str:
    """The text of ``tests/assets/NAME`` (e.g. ``registries/record.yaml``)."""
    return (ASSETS / name).read_text(encoding="utf-8")


@cache
def _forkserver_socket() -> str | None:
    """Start this test process's planrun fork server once; its socket (None: unavailable)."""
    folder = tempfile.mkdtemp(prefix="planrun-fs-")
    sock = os.path.join(folder, "s")
    server = subprocess.Popen([sys.executable, str(FORKSERVER), "serve", sock],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)

    def stop() -> None:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a stuck server
            server.kill()
        shutil.rmtree(folder, ignore_errors=True)

    atexit.register(stop)
    assert server.stdout is not None
    if server.stdout.readline().strip() != "ready":  # pragma: no cover - shown as a fallback
        stop()
        return None
    return sock


def planrun_command(real: bool = False) -> list[str]:
    """The argv prefix of one planrun command that runs to its end.

    A fork server's client (see the module docstring) unless ``real`` or
    ``TESTS_REAL_PROCESSES`` is set, or the server cannot start: then ``PLANRUN``.
    """
    if not real and not os.environ.get("TESTS_REAL_PROCESSES"):
        sock = _forkserver_socket()
        if sock is not None:
            return [sys.executable, "-S", str(FORKSERVER), "client", sock]
    return list(PLANRUN)


def run_planrun(*args: str | bytes, cwd: Path, env: Mapping[str, str] | None = None,
                stdin: Any = subprocess.DEVNULL, timeout: float = TIMEOUT_S,
                errors: str | None = None, real: bool = False
                ) -> subprocess.CompletedProcess[str]:
    """``planrun ARGS`` in ``cwd`` to its end; stdout and stderr captured as text.

    ``env`` is the whole environment (default: this process's); ``errors`` is how bytes
    that do not decode are read (default strict); ``real``: a fresh interpreter rather
    than a fork of the warm one (:func:`planrun_command`). Raises
    ``subprocess.TimeoutExpired`` after ``timeout`` seconds.
    """
    return subprocess.run([*planrun_command(real), *args], cwd=cwd,
                          env=dict(os.environ) if env is None else dict(env),
                          stdin=stdin, capture_output=True, text=True, errors=errors,
                          timeout=timeout, check=False)


@dataclass
class Result:
    """A finished planrun process."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str

    @property
    def json(self) -> Any:
        """stdout parsed as JSON."""
        try:
            return json.loads(self.stdout)
        except ValueError as exc:  # pragma: no cover - shown on failure only
            raise AssertionError(f"stdout is not JSON ({exc}):\n{self}") from None

    @property
    def error_code(self) -> str | None:
        """The ``error.code`` of a ``--json`` error object on stdout, if any."""
        try:
            data = json.loads(self.stdout)
        except ValueError:
            return None
        if isinstance(data, dict) and isinstance(data.get("error"), dict):
            code = data["error"].get("code")
            return None if code is None else str(code)
        return None

    def __str__(self) -> str:
        return (f"$ {' '.join(self.argv)}\nexit {self.returncode}\n--- stdout\n"
                f"{self.stdout}\n--- stderr\n{self.stderr}")


def move_run_back(journal: Path, run_id: str, hours: float = 1) -> None:
    """Move every timestamp of a run (SQLite journal) ``hours`` into the past.

    As if what happened so far happened that long ago: the run died, or waited for a
    person, for that long before what the test does next.
    """
    import sqlite3
    from contextlib import closing
    from datetime import datetime, timedelta

    def back(ts: str | None) -> str | None:
        return None if ts is None else (datetime.fromisoformat(ts) - timedelta(hours=hours)
                                        ).isoformat(timespec="milliseconds")

    with closing(sqlite3.connect(journal)) as conn, conn:
        (created,) = conn.execute("SELECT created_at FROM runs WHERE run_id = ?",
                                  (run_id,)).fetchone()
        conn.execute("UPDATE runs SET created_at = ? WHERE run_id = ?", (back(created), run_id))
        for sid, st, fin in conn.execute("SELECT step_id, started_at, finished_at FROM steps "
                                         "WHERE run_id = ?", (run_id,)).fetchall():
            conn.execute("UPDATE steps SET started_at = ?, finished_at = ? WHERE run_id = ? "
                         "AND step_id = ?", (back(st), back(fin), run_id, sid))
        for eid, ts in conn.execute("SELECT id, ts FROM events WHERE run_id = ?",
                                    (run_id,)).fetchall():
            conn.execute("UPDATE events SET ts = ? WHERE id = ?", (back(ts), eid))
