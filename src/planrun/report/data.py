"""What a report shows of a run, gathered from the journal's reads (issue 18).

:func:`gather` reads one run through :class:`planrun.journal.Journal` (its manifest, the
plan's dependencies, fan-out items, approvals, events, lineage) and returns plain data in
the form a person may see: every secret value is ``***`` (:func:`planrun.redact.display`,
SPEC §7), tracebacks are left out. Big runs stay small: a fan-out step's items are
summed up (counts, duration percentiles and histogram, the first failures), never listed,
and item events past :data:`ITEM_EVENTS_SHOWN` are counted, not copied.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .. import redact
from ..journal import Journal

#: Item events (``step_started`` … of one fan-out item) copied into a report; failures and
#: retries of items are copied up to the same number again. The rest are counted.
ITEM_EVENTS_SHOWN = 300
#: Events a report copies from each end of a run's events (item events past
#: :data:`ITEM_EVENTS_SHOWN` already left out); those between are counted: a run resumed
#: 200 times, or of 10,000 steps, has tens of thousands (20,000 events made 5 MB of a
#: 16 MB page; found by attack).
EVENTS_SHOWN_EACH_END = 1000
#: Failed items of a fan-out step whose error a report names.
FAILED_ITEMS_SHOWN = 5
#: Bins of a fan-out step's item duration histogram.
HISTOGRAM_BINS = 20


@dataclass
class FanOut:
    """A fan-out step's items, summed up.

    Attributes:
        total, succeeded, failed, replayed: item counts.
        durations_s: each finished item's duration in seconds (working time: less the
            time nobody drove the run), sorted ascending.
        percentiles: ``{"p50", "p90", "p99", "max"}`` of ``durations_s`` (seconds;
            empty when no item finished).
        histogram: ``HISTOGRAM_BINS`` counts of ``durations_s`` over equal-width bins
            from ``durations_s[0]`` to ``durations_s[-1]`` (empty when none finished).
        failures: up to ``FAILED_ITEMS_SHOWN`` ``{"index", "code", "message"}``.
    """

    total: int = 0
    succeeded: int = 0
    failed: int = 0
    replayed: int = 0
    durations_s: list[float] = field(default_factory=list)
    percentiles: dict[str, float] = field(default_factory=dict)
    histogram: list[int] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class RunReport:
    """One run as a report shows it (display form: secrets are ``***``).

    Attributes:
        manifest: the run's manifest (:func:`planrun.manifest.build`; SPEC §5 keys).
        depends_on: step id → the ids of the steps it waits on (the journaled plan's
            ``depends_on``, restricted to steps that exist).
        order: step ids in plan order (journaled steps first, then steps of the plan
            that have none: a refused run's).
        tools: step id → tool name, for steps of the plan that were never journaled.
        fan_outs: step id → :class:`FanOut` for fan-out steps.
        children: ids of the runs retried from this one.
        approvals: ``{"step", "item", "tool", "granted", "decided_by", "method",
            "decided_at", "reason"}`` in order.
        events: ``{"id", "ts", "kind", "step", "item", "data"}`` in order (no
            tracebacks); ``events_total``: how many the run has, ``events_left_out``:
            how many item events were counted, not copied; ``events_cut``: how many
            events between the first and the last :data:`EVENTS_SHOWN_EACH_END` were
            counted, not copied, and ``events_cut_at`` the index in ``events`` where
            they would be (None: none).
        issues: a refused run's validation issues (``Issue.to_json`` objects).
        idle: (start, end) RFC 3339 pairs when nobody drove the run.
    """

    manifest: dict[str, Any]
    depends_on: dict[str, list[str]]
    order: list[str]
    tools: dict[str, str]
    fan_outs: dict[str, FanOut]
    children: list[str]
    approvals: list[dict[str, Any]]
    events: list[dict[str, Any]]
    events_total: int
    events_left_out: int
    issues: list[dict[str, Any]]
    idle: list[tuple[str, str]]
    events_cut_at: int | None = None
    events_cut: int = 0


def seconds_between(start: str | None, end: str | None,
                    idle: list[tuple[datetime, datetime]] | None = None) -> float | None:
    """Seconds from RFC 3339 ``start`` to ``end`` less the ``idle`` times inside them.

    Working time, as the manifest's durations: the time nobody drove the run (it died and
    was resumed later) is not an item's. None when ``start`` or ``end`` is missing.
    """
    if not start or not end:
        return None
    a, b = datetime.fromisoformat(start), datetime.fromisoformat(end)
    seconds = (b - a).total_seconds()
    for g0, g1 in idle or ():
        lo, hi = max(a, g0), min(b, g1)
        if hi > lo:
            seconds -= (hi - lo).total_seconds()
    return seconds


def percentile(sorted_values: list[float], q: float) -> float:
    """The nearest-rank ``q`` percentile (0 < q <= 100) of a non-empty ascending list."""
    rank = max(1, -(-len(sorted_values) * q // 100))  # ceil(n * q / 100)
    return sorted_values[int(rank) - 1]


def histogram(sorted_values: list[float], bins: int = HISTOGRAM_BINS) -> list[int]:
    """Counts of ``sorted_values`` over ``bins`` equal-width bins from min to max."""
    if not sorted_values:
        return []
    lo, hi = sorted_values[0], sorted_values[-1]
    counts = [0] * bins
    width = (hi - lo) / bins
    for v in sorted_values:
        counts[min(bins - 1, int((v - lo) / width)) if width > 0 else 0] += 1
    return counts


def _fan_out(journal: Journal, run_id: str, step_id: str,
             idle: list[tuple[datetime, datetime]]) -> FanOut:
    fan = FanOut()
    for item in journal.items(run_id, step_id):
        fan.total += 1
        if item.status == "succeeded":
            fan.succeeded += 1
        elif item.status == "failed":
            fan.failed += 1
            if len(fan.failures) < FAILED_ITEMS_SHOWN:
                error = item.error or {}
                fan.failures.append({"index": item.index, "code": error.get("code"),
                                     "message": error.get("message")})
        fan.replayed += item.replayed
        took = seconds_between(item.started_at, item.finished_at, idle)
        if took is not None:
            fan.durations_s.append(max(0.0, took))
    fan.durations_s.sort()
    if fan.durations_s:
        fan.percentiles = {"p50": percentile(fan.durations_s, 50),
                           "p90": percentile(fan.durations_s, 90),
                           "p99": percentile(fan.durations_s, 99),
                           "max": fan.durations_s[-1]}
        fan.histogram = histogram(fan.durations_s)
    return fan


def _plan_steps(plan: Any) -> list[tuple[str, str, list[str]]]:
    """(id, tool, depends_on) of each step of a stored plan document that has an id.

    A refused plan may be malformed: what is not a string is left out.
    """
    steps = plan.get("steps") if isinstance(plan, dict) else None
    out: list[tuple[str, str, list[str]]] = []
    for step in steps if isinstance(steps, list) else []:
        if not isinstance(step, dict) or not isinstance(step.get("id"), str):
            continue
        deps = step.get("depends_on")
        out.append((step["id"], step["tool"] if isinstance(step.get("tool"), str) else "",
                    [d for d in deps if isinstance(d, str)] if isinstance(deps, list) else []))
    return out


def _issues(report: Any) -> list[dict[str, Any]]:
    """The issues of a stored validation report (``Report.to_json``), file-level first."""
    if not isinstance(report, dict):
        return []
    found = [i for i in report.get("issues") or [] if isinstance(i, dict)]
    for plan in report.get("plans") or []:
        if isinstance(plan, dict):
            found += [i for i in plan.get("issues") or [] if isinstance(i, dict)]
    return found


def _events(journal: Journal, run_id: str
            ) -> tuple[list[dict[str, Any]], int, int, int | None, int]:
    """(events shown, events in all, item events left out, where the cut is, events cut).

    Tracebacks dropped. Of the events that would be copied (item events within
    :data:`ITEM_EVENTS_SHOWN`), the first and the last :data:`EVENTS_SHOWN_EACH_END` are;
    those between them are counted, and the cut is the index in the list shown where
    they would be (None: nothing cut).
    """
    head: list[dict[str, Any]] = []
    tail: deque[dict[str, Any]] = deque(maxlen=EVENTS_SHOWN_EACH_END)
    total = items = problems = copyable = 0
    for record in journal.iter_events(run_id):  # a page at a time, not all at once
        total += 1
        if record.item is not None:
            if record.kind in ("step_failed", "step_retried"):
                problems += 1
                if problems > ITEM_EVENTS_SHOWN:
                    continue
            else:
                items += 1
                if items > ITEM_EVENTS_SHOWN:
                    continue
        copyable += 1
        event = record.to_json()
        if isinstance(event["data"], dict):
            event["data"] = {k: v for k, v in event["data"].items() if k != "traceback"}
        (head if len(head) < EVENTS_SHOWN_EACH_END else tail).append(event)
    cut = copyable - len(head) - len(tail)
    return head + list(tail), total, total - copyable, len(head) if cut else None, cut


def gather(journal: Journal, run_id: str) -> RunReport:
    """Everything a report shows of run ``run_id``, in display form (secrets ``***``).

    Raises:
        RunError: ``unknown_run`` (exit 5).
        JournalError: the journal cannot be read (exit 6).
    """
    from .. import manifest as manifests

    m = manifests.build(journal, run_id)
    run = journal.run(run_id)
    journaled = [s["id"] for s in m["steps"]]
    planned = _plan_steps(run.plan)
    order = journaled + [sid for sid, _, _ in planned if sid not in set(journaled)]
    known = set(order)
    depends_on: dict[str, list[str]] = {sid: [] for sid in order}
    tools: dict[str, str] = {}
    for sid, tool, deps in planned:
        depends_on[sid] = list(dict.fromkeys(d for d in deps if d in known and d != sid))
        tools.setdefault(sid, tool)
    idle = journal.idle_gaps(run_id)
    gaps = [(datetime.fromisoformat(a), datetime.fromisoformat(b)) for a, b in idle]
    fan_outs = {s["id"]: _fan_out(journal, run_id, s["id"], gaps) for s in m["steps"]
                if s.get("items")}
    approvals = [{"step": a.step_id, "item": a.item, "tool": a.tool, "granted": a.granted,
                  "decided_by": a.decided_by, "method": a.method,
                  "decided_at": a.decided_at, "reason": a.reason}
                 for a in journal.approval_records(run_id)]
    events, total, left_out, cut_at, cut = _events(journal, run_id)
    issues = _issues(run.report)
    if not issues:  # a resume refused the journaled plan: its report is in the event
        refused = [e for e in events if e["kind"] == "plan_refused"]
        issues = _issues(refused[-1]["data"]) if refused else []
    for fan in fan_outs.values():
        fan.failures = redact.display(fan.failures)
    return RunReport(
        manifest=redact.display(m), depends_on=depends_on, order=order, tools=tools,
        fan_outs=fan_outs, children=journal.child_run_ids(run_id),
        approvals=redact.display(approvals), events=redact.display(events),
        events_total=total, events_left_out=left_out, events_cut_at=cut_at,
        events_cut=cut, issues=redact.display(issues),
        idle=idle)
