"""The run manifest: the summary ``execute``/``resume``/``status`` print (SPEC §5).

Built from the journal alone, so ``planrun status RUN --json`` and the end of
``planrun execute --json`` are the same object.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .journal import Journal, RunRecord, count_summary
from .journal.records import driven

#: Run statuses from which ``planrun resume`` continues.
RESUMABLE = ("interrupted", "running")
#: Failed items of a fan-out step a manifest lists (``item_errors``, issue 17).
ITEM_ERRORS_SHOWN = 10


def _duration(start: str | None, end: str | None,
              gaps: list[tuple[datetime, datetime]] | None = None) -> float | None:
    """Seconds from ``start`` to ``end``, less the idle ``gaps`` inside (working time)."""
    if not start or not end:
        return None
    a, b = datetime.fromisoformat(start), datetime.fromisoformat(end)
    seconds = (b - a).total_seconds()
    for g0, g1 in gaps or []:
        lo, hi = max(a, g0), min(b, g1)
        if hi > lo:
            seconds -= (hi - lo).total_seconds()
    return round(seconds, 3)


def _driven(run: RunRecord) -> bool:
    """True when a live process (not this one) holds the run's unexpired lease."""
    lease = run.lease
    if lease is None or lease.held_by_this_process():
        return False  # nobody, or this process: the manifest it prints at its own end
    return lease.driven()


def _blocked(journal: Journal, run_id: str, contracts: dict[str, Any],
             steps: list[dict[str, Any]]) -> str | None:
    """``STEP`` or ``STEP --item N``: the first call resume would stop on, or None.

    A call whose effect is unknown (``indeterminate``, or ``running`` in a run nobody
    drives: a crash cut it short) and whose tool may not be called again (not
    ``idempotent``) stops resume (exit 5, ``indeterminate``) until a person settles it
    (SPEC §5): that, not resume, is the run's next step. Resume's own rule
    (``planrun.lifecycle.analyse``), on the journaled contracts.
    """
    for s in steps:
        if s["status"] not in ("running", "indeterminate") or \
                (contracts.get(s["tool"]) or {}).get("idempotent"):
            continue
        if "items" not in s:
            return str(s["id"])
        for item in journal.items(run_id, s["id"]):
            if item.status in ("running", "indeterminate"):
                return f"{s['id']} --item {item.index}"
    return None


def _after_denial(journal: Journal, run: RunRecord) -> str:
    """What to run after a denied run: the plan again, ``--approve`` where needed.

    A denied run is not retried (``retry`` takes failed runs): its plan is executed anew
    (with the run's parameters given again). ``--approve STEP`` names each step nobody
    could be asked about: a run that ran unattended with steps left to clear is
    ``denied`` too, though nobody said no (its ``run_finished`` reason is
    ``approval_required``). Without this its status read as a person's refusal, with no
    next step (found by a fresh operator). A denied child of ``retry`` or ``repair``:
    the same command on its parent (``planrun retry PARENT``, ``planrun repair PARENT
    --planner P``), which keeps what the parent did.
    """
    import shlex

    again = _execute_again(run)
    events = list(journal.iter_events(run.run_id, kinds=("replanned", "run_finished",
                                                        "approval_required")))
    if run.parent_run_id:
        # A child of retry or repair holds steps its parent did: `execute` would do them
        # all again (a cron retry or repair nobody could clear ended here; found by a
        # fresh operator). The parent stays failed: retry (or repair) it again.
        replanned = [e for e in events if e.kind == "replanned" and isinstance(e.data, dict)
                     and e.data.get("planner")]
        again = (["planrun", "repair", run.parent_run_id, "--planner",
                  shlex.quote(str(replanned[-1].data["planner"]))] if replanned
                 else ["planrun", "retry", run.parent_run_id])
    finished = [e for e in events if e.kind == "run_finished"]
    reason = finished[-1].data.get("reason") if finished and isinstance(
        finished[-1].data, dict) else None
    if reason != "approval_required":
        return " ".join(again)  # a person said no: asked again on a terminal
    cleared = {a["step_id"] for a in journal.approvals(run.run_id) if a.get("granted")}
    waiting = list(dict.fromkeys(e.step for e in events if e.kind == "approval_required"
                                 and e.step and e.step not in cleared))
    return " ".join([*again, *(f"--approve {shlex.quote(s)}" for s in waiting)])


def _execute_again(run: RunRecord) -> list[str]:
    """``planrun execute PLAN -p NAME=VALUE …``: the run's plan anew, its values again."""
    import shlex

    return ["planrun", "execute", shlex.quote(run.plan_name), *_given_again(run.params)]


def _given_again(params: dict[str, Any]) -> list[str]:
    """``-p NAME=VALUE`` for each journaled parameter value, quoted for a shell.

    Every value the run had (defaults too): the command runs the same plan with the same
    values, not one whose missing parameter quietly takes its default (a fresh operator
    re-added two of three and got another run). A secret (a reference in the journal) is
    left out: it is given again as always (``-p``, ``--params-file`` or
    ``PLANRUN_PARAM_NAME``, SPEC §7). Values are written as ``-p`` reads them: text as
    it is, anything else as compact JSON.
    """
    import json
    import shlex

    from . import redact

    out = []
    for name, value in params.items():
        if value is None or redact.holds_reference(value):
            continue
        plain = redact.reveal(value, {})  # unescape a marker a value held literally
        text = plain if isinstance(plain, str) else json.dumps(
            plain, ensure_ascii=False, separators=(",", ":"))
        out.append("-p " + shlex.quote(f"{name}={text}"))
    return out


def _after_failure(journal: Journal, run: RunRecord, steps: list[dict[str, Any]]) -> str:
    """What to run after a failed run (or one completed with partial steps).

    A run already retried (or repaired) goes on in its newest child: ``planrun status
    CHILD`` (retrying it again would only replay what the child did; a morning's
    ``planrun runs --status failed`` lists the runs already dealt with, found by a fresh
    operator). A fan-out whose items' outputs were too much together (``output``) fails
    again whatever ``retry`` does, since it replays the items that succeeded: the plan is
    executed anew (with the run's parameters), once its tool returns less. Else a step
    whose effect is unknown is settled first (``resolve``), and then ``retry`` runs the
    failed and skipped steps (or a partial step's failed items).
    """
    run_id = run.run_id
    children = journal.child_run_ids(run_id)
    if children:
        return f"planrun status {children[-1]}"
    if any(s["status"] == "failed" and "items" in s and (s["error"] or {}).get("code")
           == "output" for s in steps):
        return " ".join(_execute_again(run))
    # retry refuses what resolve must settle first: a call of unknown effect whose tool
    # is not idempotent (of a fan-out: each such item, --item N)
    blocked = _blocked(journal, run_id, journal.run(run_id).contracts, steps)
    if blocked:
        return f"planrun resolve {run_id} {blocked}"  # it tells the choice (no pipe to paste)
    return f"planrun retry {run_id}"


def refusal(run: RunRecord) -> dict[str, Any]:
    """Why a ``refused`` run was refused: ``{"code", "message"}``, from its journaled report.

    A plan refused at ``execute``: its first error (and how many more). A planning
    session: no valid plan within its rounds (with the last round's first error), or its
    process ended before one was accepted. ``planrun status`` said only "refused — 0/0
    succeeded" (found by a fresh operator).
    """
    report = run.report if isinstance(run.report, dict) else {}
    issues = [i for i in report.get("issues") or [] if isinstance(i, dict)]
    for shown in report.get("plans") or []:
        if isinstance(shown, dict):
            issues.extend(i for i in shown.get("issues") or [] if isinstance(i, dict))
    errors = [i for i in issues if i.get("severity", "error") == "error"]
    code = report.get("code") or (errors[0].get("code") if errors else None) or "refused"
    message = report.get("message")
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        first = f"{errors[0].get('message')}{more}"
        if errors[0].get("code") != code:
            first = f"[{errors[0].get('code')}] {first}"
        if code == "replan_exhausted":
            rounds = report.get("rounds")
            first = f"no valid plan in {rounds} round(s); the last one: {first}"
        message = first if message is None else f"{message}: {first}"
    return {"code": code, "message": message or "the plan was refused"}


def build(journal: Journal, run_id: str) -> dict[str, Any]:
    """The manifest object of one run (keys of SPEC §5).

    Also ``output_bytes``: the sum of its steps' (each the length in bytes of the step's
    stored output, its compact JSON text in UTF-8). A step's ``facets`` (issue 17) are
    there once computed (``facets_cut``: the ``paths`` facets that kept only their first
    ``max_group_keys`` values), and a fan-out's ``item_errors`` list its first
    :data:`ITEM_ERRORS_SHOWN` failed items (``{"index", "code", "message"}``).

    A ``running`` run also has ``driven``: whether a live process drives it (False: its
    process died and the run waits for ``resume``). A run ``awaiting_approval`` also has
    ``approval``: the steps it waits for and the
    commands that decide (``approve``, ``deny``) and continue it (``resume``). A
    ``refused`` run (or planning session) also has ``refused``: :func:`refusal`.
    """
    run = journal.run(run_id)
    rows = journal.steps(run_id)
    # Durations are working time: a run resumed after it died (or was interrupted) does
    # not count the time nobody drove it (issue 10, bug 12); wall_s is the clock time.
    gaps = [(datetime.fromisoformat(a), datetime.fromisoformat(b))
            for a, b in journal.idle_gaps(run_id)]
    items = journal.item_counts(run_id)
    item_errors = journal.item_errors(run_id, limit=ITEM_ERRORS_SHOWN) if items else {}
    by_status: dict[str, int] = {}
    steps = []
    total_bytes = 0
    for r in rows:
        total_bytes += r.output_bytes
        by_status[r.status] = by_status.get(r.status, 0) + 1
        error = r.error
        step: dict[str, Any] = {
            "id": r.step_id,
            "tool": r.tool,
            "status": r.status,
            "attempts": r.attempts,
            "started_at": r.started_at,
            "finished_at": r.finished_at,
            "duration_s": _duration(r.started_at, r.finished_at, gaps),
            "output_bytes": r.output_bytes,
            "replayed": r.replayed,
            "approved_by": r.approved_by,
            "error": {"code": error.get("code"), "message": error.get("message")}
            if error else None,
        }
        if r.step_id in items:
            step["items"] = items[r.step_id]
        if r.step_id in item_errors:
            # the first failed items, with their index (issue 17)
            step["item_errors"] = item_errors[r.step_id]
        if r.facets is not None:
            step["facets"] = r.facets.get("values", {})
            if r.facets.get("cut"):
                step["facets_cut"] = r.facets["cut"]
        steps.append(step)
    status = run.status
    resumable = status in RESUMABLE
    nxt = None
    approval = None
    if status == "awaiting_approval":
        from .awaiting import summary

        # resume continues it once its steps are cleared (SPEC §10)
        resumable = True
        approval = summary(journal, run_id)
        nxt = approval["approve"] if approval["waiting"] else approval["resume"]
    elif resumable and _driven(run):
        # Another live process drives it: resume would be refused (run_busy); watch it.
        nxt = f"planrun log {run_id} --follow"
    elif resumable:
        blocked = _blocked(journal, run_id, run.contracts, steps)
        nxt = (f"planrun resolve {run_id} {blocked}" if blocked
               else f"planrun resume {run_id}")
    elif status == "failed" or (status == "completed" and by_status.get("partial")):
        nxt = _after_failure(journal, run, steps)
    elif status == "denied":
        nxt = _after_denial(journal, run)
    elif status == "refused" and run.options.get("planning"):
        nxt = f"planrun log {run_id}"  # every round: what the planner answered, and why not
    out = {
        "run_id": run_id,
        "root_run_id": run.root_run_id,
        "parent_run_id": run.parent_run_id,
        "plan": {"name": run.plan_name, "revision": run.revision,
                 "digest": run.digest, "file": run.plan_file},
        "goal": run.goal,
        "status": status,
        "params": run.params,
        "started_at": run.created_at,
        "finished_at": run.finished_at,
        "duration_s": _duration(run.created_at, run.finished_at, gaps),
        "wall_s": _duration(run.created_at, run.finished_at),
        "counts": count_summary(by_status),
        "output_bytes": total_bytes,
        "steps": steps,
        "resumable": resumable,
        "next": nxt,
    }
    if status == "running":
        # False: its process died (SIGKILL, power cut); it waits for resume (or resolve)
        out["driven"] = driven(run.lease)
    if status == "refused":
        out["refused"] = refusal(run)
    if approval is not None:
        # only for a run awaiting approval: {"waiting": [{"step", "tool", "reason"}],
        # "approve", "deny", "resume"} (the commands that decide and continue it)
        out["approval"] = approval
    return out


def ran_before_waiting(m: dict[str, Any], nothing: str = "nothing ran") -> str:
    """What ran of a run left ``awaiting_approval``, as its message says it (CLI, MCP).

    ``nothing`` when no step ran in this run: a retry's child holds its parent's succeeded
    steps replayed, which did not run again (it said "the steps before it ran (approve:
    resolved)"; found by a fresh operator); else the steps before an ``approve:
    resolved`` step ran.
    """
    steps = [s for s in m.get("steps") or [] if isinstance(s, dict)]
    ran = [s for s in steps if s.get("status") in ("succeeded", "failed", "partial")
           and not s.get("replayed")]
    inherited = sum(1 for s in steps if s.get("replayed"))
    if ran:
        return "the steps before it ran (approve: resolved)"
    if inherited and m.get("parent_run_id"):
        return (f"{nothing} ({inherited} succeeded step(s) kept from run "
                f"{m['parent_run_id']})")
    return nothing
