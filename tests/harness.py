"""The one harness that runs the real ``planrun`` process in tests, and the test assets.

- :data:`PLANRUN` — the argv prefix of a planrun process (``python -m planrun``, the same
  interpreter as the tests);
- :func:`run_planrun` — one command to its end, output captured as text (stdin is not a
  terminal); what most process-level suites need;
- :class:`Result` — a finished process as ``planrun_cli.CliProject`` returns it (the
  crash, resume, signal and concurrency suites, which also start processes in their own
  session and kill them: see ``tests/planrun_cli.py``, built on this module);
- :func:`asset` — the text of a file under ``tests/assets/`` (registries shared by suites).

Documented examples run through ``tests/planrun_forkserver.py`` instead (the fast path:
planrun imported once, a fork per command); the pexpect suites spawn ``PLANRUN`` in a
terminal themselves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

PLANRUN = (sys.executable, "-m", "planrun")
#: Hang guard for one planrun process that is expected to finish on its own (seconds).
TIMEOUT_S = 60.0
ASSETS = Path(__file__).with_name("assets")


@cache
def asset(name: str) -> str:
    """The text of ``tests/assets/NAME`` (e.g. ``registries/record.yaml``)."""
    return (ASSETS / name).read_text(encoding="utf-8")


def run_planrun(*args: str | bytes, cwd: Path, env: Mapping[str, str] | None = None,
                stdin: Any = subprocess.DEVNULL, timeout: float = TIMEOUT_S,
                errors: str | None = None) -> subprocess.CompletedProcess[str]:
    """``planrun ARGS`` in ``cwd`` to its end; stdout and stderr captured as text.

    ``env`` is the whole environment (default: this process's); ``errors`` is how bytes
    that do not decode are read (default strict). Raises ``subprocess.TimeoutExpired``
    after ``timeout`` seconds.
    """
    return subprocess.run([*PLANRUN, *args], cwd=cwd,
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
