"""The run manifest: the summary ``execute``/``resume``/``status`` print (SPEC §5).

Built from the journal alone, so ``planrun status RUN --json`` and the end of
``planrun execute --json`` are the same object.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from .journal import Journal, count_summary

#: Run statuses from which ``planrun resume`` continues.
RESUMABLE = ("interrupted", "running")


def _duration(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    delta = datetime.fromisoformat(end) - datetime.fromisoformat(start)
    return round(delta.total_seconds(), 3)


def build(journal: Journal, run_id: str) -> dict[str, Any]:
    """The manifest object of one run (keys of SPEC §5)."""
    run = journal.run_row(run_id)
    rows = journal.step_rows(run_id)
    items = journal.item_counts(run_id)
    by_status: dict[str, int] = {}
    steps = []
    for r in rows:
        by_status[r["status"]] = by_status.get(r["status"], 0) + 1
        error = json.loads(r["error_json"]) if r["error_json"] else None
        step: dict[str, Any] = {
            "id": r["step_id"],
            "tool": r["tool"],
            "status": r["status"],
            "attempts": r["attempts"],
            "started_at": r["started_at"],
            "finished_at": r["finished_at"],
            "duration_s": _duration(r["started_at"], r["finished_at"]),
            "output_bytes": len(r["output_json"].encode()) if r["output_json"] else 0,
            "replayed": bool(r["replayed"]),
            "approved_by": r["approved_by"],
            "error": {"code": error.get("code"), "message": error.get("message")}
            if error else None,
        }
        if r["step_id"] in items:
            step["items"] = items[r["step_id"]]
        steps.append(step)
    status = run["status"]
    resumable = status in RESUMABLE
    nxt = None
    if resumable:
        nxt = f"planrun resume {run_id}"
    elif status == "failed":
        unknown = [s["id"] for s in steps if s["status"] == "indeterminate"]
        nxt = (f"planrun resolve {run_id} {unknown[0]} --succeeded|--failed" if unknown
               else f"planrun retry {run_id}")
    return {
        "run_id": run_id,
        "root_run_id": run["root_run_id"],
        "parent_run_id": run["parent_run_id"],
        "plan": {"name": run["plan_name"], "revision": run["revision"],
                 "digest": run["digest"], "file": run["plan_file"]},
        "goal": run["goal"],
        "status": status,
        "params": json.loads(run["params_json"]),
        "started_at": run["created_at"],
        "finished_at": run["finished_at"],
        "duration_s": _duration(run["created_at"], run["finished_at"]),
        "counts": count_summary(by_status),
        "steps": steps,
        "resumable": resumable,
        "next": nxt,
    }
