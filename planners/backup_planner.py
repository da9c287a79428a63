#!/usr/bin/env python3
"""A deterministic, rule-based planner for backups (planrun's planner protocol, version 1).

It reads one request (JSON) on stdin and prints one plan (YAML) on stdout; as a callable
(``--planner python:planners.backup_planner:plan``) it takes the request dict and returns
the plan text. It understands goals of the form::

    back up DIR to DEST [keeping N]        ("backup" and "keep N" work too; quote paths
                                            with spaces: back up "my data" to /b keeping 3)

and writes the ``nightly-backup`` shape: stamp → prepare → archive → checksum → manifest
(→ prune, when ``keeping N`` is given), with ``source``, ``dest`` (and ``keep``) as
parameters whose defaults are the goal's values. It uses only the tools the request's
catalog offers; a goal it cannot read, or a catalog without the tools it needs, makes it
exit 2 with the reason on stderr (planrun sends that back as a ``planner`` issue).

Try it from the repository root::

    planrun plan "back up ./docs to /tmp/backups keeping 3" \
        --planner "cmd:python3 planners/backup_planner.py"
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from typing import Any

GOAL = re.compile(r"^\s*back\s*up\s+(?P<rest>.+?)\s*$", re.IGNORECASE | re.DOTALL)
NEEDED = ("utc_stamp", "prepare_backup", "tar_directory", "sha256_file",
          "write_backup_manifest")


class CannotPlan(Exception):
    """The goal or the catalog does not fit this planner."""


def read_goal(goal: str) -> tuple[str, str, int | None]:
    """(source, dest, keep or None) from ``back up DIR to DEST [keeping N]``."""
    m = GOAL.match(goal)
    if not m:
        raise CannotPlan(f"cannot read the goal {goal!r}: write 'back up DIR to DEST "
                         "[keeping N]'")
    try:
        words = shlex.split(m.group("rest"))
    except ValueError as exc:
        raise CannotPlan(f"cannot read the goal {goal!r}: {exc}") from None
    keep = None
    if len(words) >= 2 and words[-2].lower() in ("keeping", "keep"):
        if not words[-1].isdigit() or int(words[-1]) < 1:
            raise CannotPlan(f"'keeping {words[-1]}': keep a whole number of archives >= 1")
        keep = int(words[-1])
        words = words[:-2]
    if len(words) != 3 or words[1].lower() != "to":
        raise CannotPlan(f"cannot read the goal {goal!r}: write 'back up DIR to DEST "
                         "[keeping N]' (quote a path with spaces)")
    return words[0], words[2], keep


def build(request: dict[str, Any]) -> dict[str, Any]:
    """The plan (a dict) for the request's goal."""
    source, dest, keep = read_goal(str(request.get("goal", "")))
    offered = {t.get("name") for t in request.get("catalog") or []}
    missing = [t for t in (*NEEDED, *(("prune_backups",) if keep else ())) if t not in offered]
    if missing:
        raise CannotPlan(f"the catalog lacks {', '.join(missing)} (not registered, or not "
                         "allowed by the policy)")
    params: dict[str, Any] = {
        "source": {"type": "string", "minLength": 1, "default": source,
                   "description": "Directory to back up"},
        "dest": {"type": "string", "minLength": 1, "default": dest,
                 "description": "Directory receiving the archives"},
    }
    steps: list[dict[str, Any]] = [
        {"id": "stamp", "tool": "utc_stamp", "intent": "Take the UTC time naming this backup"},
        {"id": "prepare", "tool": "prepare_backup", "depends_on": ["stamp"],
         "arguments": {"source": "{params.source}", "dest": "{params.dest}",
                       "name": "backup-{steps.stamp.output}.tar.gz"},
         "intent": "Check the source, create dest, reserve the archive name"},
        {"id": "archive", "tool": "tar_directory", "depends_on": ["prepare"],
         "arguments": {"source": "{steps.prepare.output.source}",
                       "archive": "{steps.prepare.output.archive}"},
         "intent": "Pack the source directory into the archive"},
        {"id": "checksum", "tool": "sha256_file", "depends_on": ["archive"],
         "arguments": {"path": "{steps.prepare.output.archive}"},
         "intent": "Hash the archive and write its .sha256"},
        {"id": "manifest", "tool": "write_backup_manifest", "depends_on": ["checksum"],
         "arguments": {"source": "{steps.prepare.output.source}",
                       "archive": "{steps.checksum.output.path}",
                       "sha256": "{steps.checksum.output.sha256}",
                       "archive_bytes": "{steps.checksum.output.bytes}"},
         "intent": "Record what the backup holds"},
    ]
    if keep is not None:
        params["keep"] = {"type": "integer", "minimum": 1, "default": keep,
                          "description": "How many archives to keep"}
        steps.append({"id": "prune", "tool": "prune_backups", "depends_on": ["manifest"],
                      "arguments": {"dest": "{params.dest}", "keep": "{params.keep}"},
                      "intent": "Delete archives older than the newest `keep`"})
    goal = f"Back up {source} to {dest}" + (f", keeping {keep}" if keep else "")
    return {"planrun": 1, "name": "backup", "goal": goal, "params": params, "steps": steps}


def plan(request: dict[str, Any]) -> str:
    """The callable form: the plan as JSON text (JSON is YAML too)."""
    return json.dumps(build(request), indent=2)


def main() -> int:
    """The command form: request on stdin, plan on stdout, exit 2 when it cannot plan."""
    request = json.load(sys.stdin)
    try:
        sys.stdout.write(plan(request) + "\n")
    except CannotPlan as exc:
        sys.stderr.write(f"backup_planner: {exc}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
