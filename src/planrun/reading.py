"""Reading runs from the journal, and its maintenance (SPEC §7, §9).

``status``, ``runs``, ``log``, ``follow``, ``output``, ``report``; ``prune`` and
``forget``; what shell completion reads of a plan (``plan_outline``).
Below :mod:`planrun.api`, which offers these to the CLI. Read-only commands never create
or migrate a journal.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .checking import project_key
from .errors import RunError, UsageError
from .paths import Settings


def _reader(settings: Settings, write: bool = False) -> Any:
    from .journal import Journal

    journal = Journal(settings.journal, write=write)
    journal.project = project_key(settings)  # what `last` means here
    return journal


@contextmanager
def _snapshot(settings: Settings) -> Iterator[Any]:
    """The journal, read as one state of it: every read inside sees the same commits.

    A manifest, a log or a report is several queries; a run going on meanwhile would
    otherwise show a run ``running`` beside steps that its later commits finished, or an
    item count that does not add up (a read transaction: SQLite's WAL snapshot, PostgreSQL's
    ``REPEATABLE READ READ ONLY``).
    """
    with _reader(settings) as journal, journal.snapshot():
        yield journal


def _settle_planning(settings: Settings) -> None:
    """End the planning sessions of dead ``planrun plan`` processes (code ``interrupted``).

    Best effort, before ``status`` or ``runs`` reads a session still ``planning``: a
    journal this process cannot write is read as it is.
    """
    import contextlib

    from .errors import JournalError

    with contextlib.suppress(JournalError, OSError), _reader(settings, write=True) as journal:
        journal.settle_dead_planning()


def status(settings: Settings, run_ref: str = "last") -> dict[str, Any]:
    """The manifest of a run (id, unique prefix, or ``last``: this project's latest run).

    A planning session whose ``planrun plan`` died is settled first (``refused``, code
    ``interrupted``).

    When ``next`` would be ``planrun resume RUN``, the journaled plan is checked as resume
    checks it (against this project's tools.yaml and policy, :func:`resume_check`), so
    that ``next`` says what resume would do.

    Raises:
        RunError: ``unknown_run`` (exit 5).
    """
    from . import manifest

    with _snapshot(settings) as journal:
        shown = manifest.build(journal, journal.resolve_run_id(run_ref))
        if shown.get("status") != "planning":
            resume_check(settings, journal, shown)
            return shown
    _settle_planning(settings)
    with _snapshot(settings) as journal:
        return manifest.build(journal, journal.resolve_run_id(shown["run_id"]))


def resume_check(settings: Settings, journal: Any, shown: dict[str, Any]) -> None:
    """Make a manifest's ``next`` true to what ``resume`` or ``retry`` would do.

    Both rebuild the journaled plan against the current tools.yaml and policy
    (:func:`planrun.lifecycle.journaled_plan`) and refuse it when it no longer passes.
    When ``next`` is ``planrun resume RUN`` or ``planrun retry RUN`` it becomes:

    - the same command with ``-p NAME=VALUE ...`` when only the run's secret parameters
      are missing (never journaled; ``PLANRUN_PARAM_<NAME>`` given to this process counts);
    - when the plan no longer passes: ``planrun resume RUN --explain`` (it lists the
      issues), or instead of a retry ``planrun execute PLAN -p …`` (the plan file as it
      is now, with the run's values); and ``resume_refused`` / ``retry_refused``
      {``code``, ``message``} says why the command would refuse (exit 3).

    A manifest whose ``next`` is anything else is left as it is.
    """
    run_id = shown["run_id"]
    verb = next((v for v in ("resume", "retry")
                 if shown.get("next") == f"planrun {v} {run_id}"), None)
    if verb is None:
        return
    from .checking import param_input
    from .errors import Refused
    from .lifecycle import journaled_plan, missing_secrets
    from .manifest import _execute_again

    row = journal.run(run_id)
    instead = (f"planrun resume {run_id} --explain" if verb == "resume"
               else " ".join(_execute_again(row)))
    try:
        report, plan = journaled_plan(settings, row, param_input())
    except Refused as exc:  # tools.yaml or planrun.toml is broken now
        shown["next"] = instead
        shown[f"{verb}_refused"] = {"code": exc.code, "message": exc.message}
        return
    if plan is not None:
        return
    secrets = missing_secrets(row, report.issues)
    if secrets:
        shown["next"] += " " + " ".join(f"-p {n}=VALUE" for n in secrets)
        return
    first = report.issues[0] if report.issues else None
    shown["next"] = instead
    shown[f"{verb}_refused"] = {
        "code": first.code if first else "refused",
        "message": "the journaled plan no longer passes validation against the current "
        "tools.yaml and policy" + (f": {first.message}" if first else "")}


def runs(settings: Settings, *, plan: str | None = None, status: str | None = None,
         limit: int | None = None, all_projects: bool = False) -> list[dict[str, Any]]:
    """Run summaries, newest first: this project's (``all_projects``: every project's).

    Each has ``project``: the folder the run was started in (None for runs journaled
    before planrun recorded it; those are listed with every project); a ``running`` one
    also ``driven`` (False: its process died, it waits for resume). Planning sessions of
    dead ``planrun plan`` processes are settled first (``refused``, code ``interrupted``).
    """
    from .journal.records import driven

    def listed() -> list[dict[str, Any]]:
        with _snapshot(settings) as journal:
            rows = list(journal.list_runs(plan=plan, status=status, limit=limit,
                                          project=None if all_projects else journal.project))
            for r in rows:  # a running run whose process died waits for resume
                if r.get("status") == "running":
                    r["driven"] = driven(journal.lease(r["run_id"]))
            return rows

    rows = listed()
    if not any(r.get("status") == "planning" for r in rows):
        return rows
    _settle_planning(settings)  # a session of a dead `planrun plan` is shown settled
    return listed()


def log(settings: Settings, run_ref: str = "last") -> tuple[str, list[dict[str, Any]]]:
    """(run id, the run's events in order), all in memory (:func:`log_stream` for many)."""
    with _snapshot(settings) as journal:
        run_id = journal.resolve_run_id(run_ref)
        return run_id, list(journal.events(run_id))


def log_page(settings: Settings, run_ref: str = "last", *, after: int = 0,
             limit: int = 1000) -> tuple[str, list[dict[str, Any]], int | None]:
    """A page of the run's events: (run id, events, the ``after`` of the next page).

    At most ``limit`` events after event id ``after``, in order; the next page's
    ``after`` is None when these are the last. What an agent reads a log with (MCP
    ``run_log``): a 100,000-item fan-out's 200,000 events were one 51 MB answer. One
    state of the journal (:func:`_snapshot`).

    Raises:
        RunError: ``unknown_run`` (exit 5).
    """
    with _snapshot(settings) as journal:
        run_id = journal.resolve_run_id(run_ref)
        events: list[dict[str, Any]] = []
        for record in journal.iter_events(run_id, after, page=limit + 1):
            if len(events) == limit:
                return run_id, events, int(events[-1]["id"])
            events.append(record.to_json())
        return run_id, events, None


def log_stream(settings: Settings, run_ref: str = "last") -> Iterator[dict[str, Any]]:
    """The run's events in order (as :func:`log`), read a page at a time as they are taken.

    What ``planrun log`` prints: its memory does not grow with the number of events.
    Nothing is read before the first is asked for; the journal stays open until the last.

    Raises:
        RunError: ``unknown_run`` (exit 5), at the first event asked for.
        JournalError: the journal cannot be read (exit 6), at the event it happens.
    """
    with _reader(settings) as journal:
        run_id = journal.resolve_run_id(run_ref)
        for record in journal.iter_events(run_id):
            yield record.to_json()


def report(settings: Settings, run_ref: str = "last") -> tuple[str, str]:
    """(run id, the run's report page as HTML text) for ``planrun report`` (issue 18).

    Read-only. Secrets are shown as ``***``; see :mod:`planrun.report`.

    Raises:
        RunError: ``unknown_run`` (exit 5).
        JournalError: the journal cannot be read (exit 6).
    """
    from .report import html_of

    with _snapshot(settings) as journal:
        run_id = journal.resolve_run_id(run_ref)
        return run_id, html_of(journal, run_id)


def output(settings: Settings, run_ref: str, step: str, item: int | None = None) -> Any:
    """The output of one step (or fan-out item) of a run.

    Raises:
        RunError: ``unknown_run``; ``no_output`` when the step did not succeed (or end
            ``partial``, issue 17) (exit 5).
        UsageError: ``unknown_step``, the run has no such step or item (exit 2).
    """
    with _snapshot(settings) as journal:
        run_id = journal.resolve_run_id(run_ref)
        found = journal.step_output(run_id, step, item)
        if found is None:
            steps = [r.step_id for r in journal.steps(run_id)]
            raise UsageError(f"run {run_id} has no step {step!r}"
                             + (f" item {item}" if item is not None else "")
                             + f" (steps: {', '.join(steps)})", code="unknown_step")
        state, value = found
        if state not in ("succeeded", "partial"):
            raise RunError(f"step {step!r} of run {run_id} is {state}; it has no output",
                           code="no_output")
        return value


def follow(settings: Settings, run_ref: str = "last", *, poll_s: float = 0.5,
           after: int = 0, ended: Callable[[str, str], None] | None = None
           ) -> Iterator[dict[str, Any]]:
    """The run's events in order, then new ones as they are written, until the run ends.

    Ends when the run's status is no longer ``running`` (its last events read), or when
    nobody drives it any more (no lease, the lease expired, or its holder on this host
    died). ``poll_s``: the seconds between two reads of the journal. ``ended(run_id,
    status)`` is called at the end, after the last event: ``status`` is the run's, or
    ``"not driven"`` for a run still ``running`` that nobody drives (its process died).

    Raises:
        RunError: ``unknown_run`` (exit 5).
    """
    last = after
    while True:
        with _snapshot(settings) as journal:
            run_id = journal.resolve_run_id(run_ref)
            run_ref = run_id
            row = journal.run(run_id)
            # only the events after the last one shown: reading them all again at each
            # poll made following a 100,000-item fan-out quadratic (found by attack)
            for record in journal.iter_events(run_id, last):
                last = record.id
                yield record.to_json()
        driven = row.lease is not None and row.lease.driven()
        if row.status != "running" or not driven:
            with _snapshot(settings) as journal:
                status = journal.run(run_id).status
                for record in journal.iter_events(run_id, last):
                    last = record.id
                    yield record.to_json()
            if ended is not None:
                ended(run_id, "not driven" if status == "running" else status)
            return
        time.sleep(poll_s)


#: The longest age ``--older-than`` takes: 100 years (36,525 days), in seconds.
MAX_AGE_S = 36_525 * 86_400


def parse_age(text: str) -> float:
    """Seconds of an age such as ``30d``, ``12h``, ``90m``, ``2w``, ``45s``.

    At most :data:`MAX_AGE_S` (100 years): ``740000d`` reached before the year 1 of the
    calendar and ended ``prune`` with a traceback (found by a fresh operator).

    Raises:
        UsageError: not a positive whole number followed by s, m, h, d or w, or more
            than 100 years (exit 2).
    """
    import re

    m = re.fullmatch(r"\s*(\d+)\s*([smhdw])\s*", text)
    if not m:
        raise UsageError(f"--older-than {text!r}: give a number and a unit, e.g. 30d, 12h, "
                         "90m, 2w (s, m, h, d, w)")
    digits = m.group(1).lstrip("0")
    if not digits:
        raise UsageError(f"--older-than {text!r}: the age must be more than 0, e.g. 30d")
    unit = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2)]
    if len(digits) > len(str(MAX_AGE_S)) or int(digits) * unit > MAX_AGE_S:
        raise UsageError(f"--older-than {text!r}: at most 100 years ({MAX_AGE_S // 86400}d)")
    return int(digits) * unit


def prune(settings: Settings, *, older_than: str, status: str | None = None,
          plan: str | None = None, all_projects: bool = False,
          dry_run: bool = False, vacuum: bool = False) -> dict[str, Any]:
    """Delete runs started more than ``older_than`` ago, then reclaim the space.

    Only this project's runs unless ``all_projects``; ``status`` and ``plan`` narrow it.
    Without ``status``, a run that may still go on (``running``, ``interrupted``,
    ``awaiting_approval``, ``planning``, ``planned``) is kept: it may hold a call whose
    effect is unknown, and its journal is the only record of it (decided here; SPEC is
    silent). Each run goes with its steps, items, approvals, events and idempotency keys (a
    later run can no longer replay those calls). Each run is deleted in a transaction of
    its own and the space is given back in pieces (``Journal.delete_runs``), so runs going
    on meanwhile wait for their journal writes at most a moment; ``vacuum``: the SQLite
    file is rewritten whole instead (also with nothing to delete), which a journal file
    made by an earlier planrun (``auto_vacuum`` off) needs to give space back at all
    (other processes' writes wait for it: docs/journal-and-resume.md, "Keeping the
    journal small").

    Returns:
        ``{"deleted": [run ids], "events": n, "keys": n, "runs": [{"run_id", "status",
        "plan", "created_at"}], "kept_unfinished": [run ids], "reclaimed_bytes": n,
        "free_bytes": n}`` (``dry_run``: what would go); bytes given back to the disk,
        bytes still free inside the journal (reused by later runs).

    Raises:
        UsageError: a malformed ``older_than`` (exit 2).
        RunError: ``run_busy`` when a selected run is driven by a live process (exit 5).
    """
    from datetime import UTC, datetime, timedelta

    from .journal.base import UNFINISHED

    age = parse_age(older_than)
    before = (datetime.now(UTC) - timedelta(seconds=age)).isoformat(timespec="milliseconds")
    nothing: dict[str, Any] = {"deleted": [], "events": 0, "keys": 0, "runs": [],
                               "kept_unfinished": [], "reclaimed_bytes": 0, "free_bytes": 0}
    with _reader(settings, write=not dry_run) as journal:
        if journal.conn is None:
            return nothing
        found = journal.select_runs(before=before, status=status, plan=plan,
                                    project=None if all_projects else journal.project)
        # a named status takes its runs, unfinished or not; else unfinished ones are kept
        kept = [] if status is not None else [r[0] for r in found if r[1] in UNFINISHED]
        rows = [r for r in found if r[0] not in kept]
        ids = [r[0] for r in rows]
        runs = [{"run_id": r[0], "status": r[1], "plan": r[2], "created_at": r[3]}
                for r in rows]
        if dry_run:
            return {**nothing, "deleted": ids, "runs": runs, "kept_unfinished": kept}
        counts = journal.delete_runs(ids, rewrite=vacuum)
    return {"deleted": ids, "events": counts["events"], "keys": counts["keys"], "runs": runs,
            "kept_unfinished": kept, "reclaimed_bytes": counts["reclaimed_bytes"],
            "free_bytes": counts["free_bytes"]}


def forget(settings: Settings, run_ref: str) -> dict[str, Any]:
    """Delete one run and everything of its (idempotency keys too), then reclaim space.

    Returns ``{"deleted": [run id], "events": n, "keys": n, "reclaimed_bytes": n,
    "free_bytes": n}`` (as :func:`prune`).

    Raises:
        RunError: ``unknown_run``; ``run_busy`` when a live process drives it (exit 5).
    """
    with _reader(settings, write=True) as journal:
        run_id = journal.resolve_run_id(run_ref)
        counts = journal.delete_runs([run_id])
    return {"deleted": [run_id], "events": counts["events"], "keys": counts["keys"],
            "reclaimed_bytes": counts["reclaimed_bytes"], "free_bytes": counts["free_bytes"]}


def plan_outline(settings: Settings, *, plan: str | None = None, run: str = "last"
                 ) -> tuple[list[str], list[str], list[str]]:
    """(step ids, steps whose tool is irreversible, parameter names) for shell completion.

    Of the plan file ``plan`` (as ``execute PLAN`` finds it), else of the journaled plan
    of ``run`` (id, prefix or ``last``). Read-only; no validation (completion works on a
    plan being written). A registry that cannot be loaded leaves the second list empty.

    Raises:
        PlanrunError: the plan or run cannot be found or read (completion shows nothing).
    """
    data: Any = None
    if plan is not None:
        from .loading import load_file
        from .paths import find_plan

        data = load_file(find_plan(plan, settings.plans_dir)).data
    else:
        with _reader(settings) as journal:
            data = journal.run(journal.resolve_run_id(run)).plan
    if not isinstance(data, dict):
        return [], [], []
    steps = [s for s in data.get("steps") or [] if isinstance(s, dict)]
    ids = [str(s.get("id")) for s in steps if s.get("id") is not None]
    needs: list[str] = []
    try:
        from .registry import load_registry as load_tools

        registry, _ = load_tools(settings.registry, settings.pools)
        for s in steps:
            tool = registry.tools.get(str(s.get("tool")))
            if tool is not None and tool.entry.irreversible:
                needs.append(str(s.get("id")))
    except Exception:  # the registry is optional for completion
        pass
    declared = data.get("params")
    names = list(declared) if isinstance(declared, dict) else []
    return ids, needs, names
