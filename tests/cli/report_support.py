"""What the report tests share (issue 18): a plan with a secret, a fan-out and a failure."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from conftest import Project
from harness import run_planrun

#: The value given to the secret parameter: it must appear nowhere in a report.
SECRET = "Tok3n-s3cret-98765"

NIGHTLY = """
planrun: 1
name: nightly
revision: 3
goal: Fetch, fan out, and fail on purpose
params:
  token: {type: string, secret: true}
  label: {type: string, default: nightly-label}
steps:
  - {id: fetch, tool: echo, arguments: {value: "{params.token}"}}
  - id: each
    tool: echo
    depends_on: [fetch]
    for_each: [1, 2, 3, 4]
    arguments: {value: "{item}"}
  - {id: side, tool: echo, depends_on: [fetch], arguments: {value: "{params.label}"}}
  - {id: bad, tool: boom, depends_on: [side], arguments: {value: "{params.token}"}}
  - {id: never, tool: echo, depends_on: [bad, each], arguments: {value: 3}}
"""
#: step id → status after ``execute nightly --keep-going``.
NIGHTLY_STATUSES = {"fetch": "succeeded", "each": "succeeded", "side": "succeeded",
                    "bad": "failed", "never": "skipped"}

#: ``src``/``href`` attributes and CSS ``url(…)`` that would load from elsewhere.
REMOTE = re.compile(r"""(?:\b(?:src|href|xlink:href)\s*=\s*["']?\s*(?:https?:)?//)"""
                    r"""|url\(\s*["']?\s*(?:https?:)?//|@import""", re.IGNORECASE)


def report(project: Project, *args: str, cwd: Path | None = None
           ) -> subprocess.CompletedProcess[str]:
    """``python -m planrun report ARGS -C PROJECT`` (a real process) in ``cwd``."""
    return run_planrun("report", *args, "-C", str(project.root),
                       cwd=cwd or project.root)
