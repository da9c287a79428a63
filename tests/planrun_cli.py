"""Driving the real ``planrun`` process from tests: a project folder, runs, the effects log.

Built on ``tests/harness.py`` (``PLANRUN``, ``Result``). Used by the process-level suites
(crash matrix, resume, concurrency, signals) through the ``cli`` fixture of
``conftest.py``. planrun runs as ``[sys.executable, "-m", "planrun"]`` (or a fork of a warm
one for commands that run to their end: ``harness.planrun_command``) in the
project folder, with the environment the isolation fixture set up
(``PLANRUN_JOURNAL`` in ``tmp_path``, ``HOME``, ``NO_COLOR``) plus ``CRASH_EFFECTS``.
The tool module is ``tests/crashtools.py``, copied into the project.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import closing, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import PLANRUN, TIMEOUT_S, Result, planrun_command

__all__ = ["PLANRUN", "TIMEOUT_S", "CliProject", "Result", "dedent", "lines",
           "resolve_targets", "wait_dead"]

TOOLS_SOURCE = Path(__file__).with_name("crashtools.py")


def dedent(text: str) -> str:
    """``textwrap.dedent`` without the leading newline."""
    return textwrap.dedent(text).lstrip("\n")


@dataclass
class CliProject:
    """A project folder with ``crashtools.py``, run through the real ``planrun`` CLI."""

    root: Path
    effects: Path
    #: The journal: a file, or a ``postgresql://`` URL (``journal_location``).
    journal: Path | str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @classmethod
    def create(cls, base: Path) -> CliProject:
        """A fresh project in ``base/proj`` with the tool module copied in."""
        root = base / "proj"
        root.mkdir()
        shutil.copyfile(TOOLS_SOURCE, root / "crashtools.py")
        location = os.environ["PLANRUN_JOURNAL"]
        return cls(root=root, effects=base / "effects.log",
                   journal=location if "://" in location else Path(location))

    # --- files --------------------------------------------------------------------------

    def write(self, relative: str, text: str) -> Path:
        """Write a file under the project (dedented); ``{PY}`` becomes this interpreter."""
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dedent(text).replace("{PY}", json.dumps(sys.executable)),
                        encoding="utf-8")
        return path

    def tools(self, text: str) -> Path:
        """Write ``tools.yaml``."""
        return self.write("tools.yaml", text)

    def plan(self, name: str, text: str) -> Path:
        """Write ``plans/<name>.yaml``."""
        return self.write(f"plans/{name}.yaml", text)

    def touch(self, relative: str) -> None:
        """Create an empty file in the project (what waiting tools wait for)."""
        (self.root / relative).touch()

    # --- running planrun ------------------------------------------------------------------

    def env(self, crash: str | None = None) -> dict[str, str]:
        """The environment of a planrun process (``PLANRUN_TEST_CRASH`` when given)."""
        env = dict(os.environ)
        env["CRASH_EFFECTS"] = str(self.effects)
        env.pop("PLANRUN_TEST_CRASH", None)
        if crash:
            env["PLANRUN_TEST_CRASH"] = crash
        return env

    def run(self, *args: str, crash: str | None = None,
            timeout: float = TIMEOUT_S, real: bool = False) -> Result:
        """Run ``planrun ARGS`` to its end (stdin is not a terminal).

        ``real``: a fresh interpreter rather than a fork of a warm one
        (``harness.planrun_command``).
        """
        argv = [*planrun_command(real), *args]
        proc = subprocess.Popen(argv, cwd=self.root, env=self.env(crash),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        self.procs.append(proc)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_group(proc)
            out, err = proc.communicate()
            raise AssertionError(f"planrun {' '.join(args)} did not finish in {timeout} s:\n"
                                 f"{out.decode()}\n{err.decode()}") from None
        return Result(argv, proc.returncode, out.decode(), err.decode())

    def start(self, *args: str, crash: str | None = None, name: str = "proc"
              ) -> subprocess.Popen[bytes]:
        """Start ``planrun ARGS`` in its own session; stdout/stderr go to files.

        Read them with :meth:`finish`.
        """
        out = (self.root.parent / f"{name}.{len(self.procs)}.out").open("wb")
        err = (self.root.parent / f"{name}.{len(self.procs)}.err").open("wb")
        with out, err:
            proc = subprocess.Popen([*PLANRUN, *args], cwd=self.root, env=self.env(crash),
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    start_new_session=True)
        proc.out_path = Path(out.name)  # type: ignore[attr-defined]
        proc.err_path = Path(err.name)  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def finish(self, proc: subprocess.Popen[bytes], timeout: float = TIMEOUT_S) -> Result:
        """Wait for a started process (hang guard ``timeout``) and collect its output."""
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_group(proc)
            proc.wait()
            raise AssertionError(f"planrun (pid {proc.pid}) did not finish in {timeout} s:"
                                 f"\n{self.output_of(proc)}") from None
        return Result([str(a) for a in proc.args],  # type: ignore[union-attr]
                      proc.returncode, *self.output_of(proc))

    @staticmethod
    def output_of(proc: subprocess.Popen[bytes]) -> tuple[str, str]:
        """(stdout, stderr) written so far by a started process."""
        return (proc.out_path.read_text(errors="replace"),  # type: ignore[attr-defined]
                proc.err_path.read_text(errors="replace"))  # type: ignore[attr-defined]

    @staticmethod
    def kill_group(proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL a started process's whole session (it and any command it started)."""
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def cleanup(self) -> None:
        """Kill what is left of every process group started by this project."""
        for proc in self.procs:
            self.kill_group(proc)
            if proc.poll() is None:
                proc.wait()

    # --- the effects log ----------------------------------------------------------------

    def entries(self) -> list[dict[str, Any]]:
        """Every line of the effects log, in order."""
        if not self.effects.exists():
            return []
        return [json.loads(line) for line in self.effects.read_text().splitlines() if line]

    def calls(self, effect: str | None = None) -> list[dict[str, Any]]:
        """The ``call`` lines (of one effect)."""
        return [e for e in self.entries() if e["event"] == "call"
                and (effect is None or e["effect"] == effect)]

    def counts(self) -> Counter[str]:
        """How many times each effect happened."""
        return Counter(e["effect"] for e in self.calls())

    def started(self, effect: str) -> list[dict[str, Any]]:
        """The ``start`` markers of one effect."""
        return [e for e in self.entries() if e["event"] == "start" and e["effect"] == effect]

    def wait_started(self, effect: str, proc: subprocess.Popen[bytes] | None = None,
                     count: int = 1, timeout: float = TIMEOUT_S) -> dict[str, Any]:
        """Wait until ``effect`` logged its ``count``-th start marker; returns it."""
        deadline = time.monotonic() + timeout
        while True:
            marks = self.started(effect)
            if len(marks) >= count:
                return marks[count - 1]
            if proc is not None and proc.poll() is not None:
                raise AssertionError(f"planrun exited {proc.returncode} before {effect} "
                                     f"started:\n{self.output_of(proc)}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{effect} never started")
            time.sleep(0.02)

    # --- the journal ----------------------------------------------------------------------

    def probe(self) -> Any:
        """The journal as records (``planrun.journal.probe``): what tests ask, not SQL."""
        from planrun.journal.probe import probe

        return probe(self.journal)

    def query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        """Rows of a read-only query on the journal (never writes, never migrates)."""
        uri = f"{self.journal.resolve().as_uri()}?mode=ro"
        with closing(sqlite3.connect(uri, uri=True)) as conn:
            return conn.execute(sql, args).fetchall()

    def journal_exists(self) -> bool:
        """Whether the journal was created (a file; a PostgreSQL database set up by planrun)."""
        if isinstance(self.journal, str):
            from planrun.journal import Journal

            with Journal(self.journal, write=False) as j:
                return j.conn is not None
        return self.journal.exists()

    def integrity(self) -> str:
        """``PRAGMA integrity_check`` of the journal (``"ok"`` when sound).

        On PostgreSQL (no such check; the server keeps its own files sound): every run,
        its steps and events read back as records.
        """
        if isinstance(self.journal, str):
            p = self.probe()
            for run in p.runs():
                p.steps(run.run_id)
                p.events(run.run_id)
            return "ok"
        rows = self.query("PRAGMA integrity_check")
        return "; ".join(str(r[0]) for r in rows)

    def dump(self) -> list[str]:
        """Every row of every table of the journal, as text (for before/after checks)."""
        uri = f"{self.journal.resolve().as_uri()}?mode=ro"
        with closing(sqlite3.connect(uri, uri=True)) as conn:
            return list(conn.iterdump())

    def journal_files(self) -> dict[str, bytes | None]:
        """The bytes of the journal and its WAL (None where a file does not exist)."""
        out: dict[str, bytes | None] = {}
        for suffix in ("", "-wal"):
            path = Path(f"{self.journal}{suffix}")
            out[suffix or "main"] = path.read_bytes() if path.exists() else None
        return out


#: ``planrun resolve RUN STEP [--item N] --succeeded`` in an ``indeterminate`` hint.
_RESOLVE = re.compile(r"planrun resolve (\S+) ([A-Za-z][A-Za-z0-9_-]*)(?: --item (\d+))? "
                      r"--succeeded")


def resolve_targets(result: Result) -> list[tuple[str, str, int | None]]:
    """(run, step, item) of every ``planrun resolve`` command an ``indeterminate`` names."""
    text = result.stdout + "\n" + result.stderr
    found = []
    for m in _RESOLVE.finditer(text):
        target = (m.group(1), m.group(2), None if m.group(3) is None else int(m.group(3)))
        if target not in found:
            found.append(target)
    return found


def wait_dead(pid: int, timeout: float = 10.0) -> bool:
    """True once no process ``pid`` exists (polled up to ``timeout`` s as a hang guard)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # a zombie nobody reaped yet has stopped running too
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (OSError, IndexError):
            pass
        time.sleep(0.02)
    return False


def lines(text: str) -> Iterator[str]:
    """Non-empty lines."""
    return (line for line in text.splitlines() if line.strip())
