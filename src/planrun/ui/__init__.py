"""Everything a person sees: reports, manifests, prompts, errors.

The only module that imports :mod:`rich` (and only when output goes to a terminal).

Results go to stdout, diagnostics to stderr (SPEC principle 6). Colour follows ``NO_COLOR``
and ``--no-color``.

Secrets (SPEC §7): what is printed comes in reference form (:mod:`planrun.redact`), and
rendering shows ``***`` for each reference — so only values are masked, never field
names, ids, codes or planrun's own words, however short a secret is.
"""

from __future__ import annotations

import itertools
import json
import os
import select
import sys
from collections.abc import Iterable, Sequence
from typing import IO, TYPE_CHECKING, Any

from .. import masking, redact
from ..errors import PlanrunError
from ..issues import Issue, Report
from ..loading import visible

if TYPE_CHECKING:  # the approver below imports it when it asks (not at start-up)
    from ..approval import ApprovalRequest, Decision


def is_terminal(stream: IO[str]) -> bool:
    """True when ``stream`` is a TTY."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def can_prompt() -> bool:
    """A person can be asked: stdin and stderr are both terminals (SPEC §6)."""
    return is_terminal(sys.stdin) and is_terminal(sys.stderr)


class _Diagnostics:
    """stderr for planrun's own lines: past the masking of tools' writes during a run."""

    def __getattr__(self, name: str) -> Any:
        return getattr(masking.diagnostics(), name)


def _console(stderr: bool = False, no_color: bool = False) -> Any:
    from rich.console import Console

    return Console(file=_Diagnostics() if stderr else None,  # type: ignore[arg-type]
                   no_color=no_color or bool(os.environ.get("NO_COLOR")),
                   highlight=False, soft_wrap=False)


def _cell(text: str) -> Any:
    """A table cell of text a plan, a tool or the journal holds: shown as it is written.

    A plain string in a rich table is read as markup: an intent or an argument with
    ``[conceal]…[/conceal]`` hid what a person was asked to approve, ``[tool_error]``
    (the code before a failed step's message) vanished, and a ``[/]`` ended the run
    ``internal`` (MarkupError; found by an attacker). Secrets as ``***``, controls as
    escapes (:func:`planrun.loading.visible`).
    """
    from rich.text import Text

    return Text(visible(redact.display_text(text)))


def out(text: str = "") -> None:
    """One line of results on stdout.

    Secret values shown as ``***``, bidirectional controls as escapes
    (:func:`planrun.loading.visible`).
    """
    sys.stdout.write(visible(redact.display_text(text)) + "\n")


def err(text: str = "") -> None:
    """One line of diagnostics on stderr (as :func:`out` writes it)."""
    masking.diagnostics().write(visible(redact.display_text(text)) + "\n")


def print_json(value: Any) -> None:
    """A JSON document on stdout (secret values shown as ``***``).

    Characters that would not show as themselves (:func:`planrun.loading.visible`:
    controls JSON leaves as they are, DEL, C1, bidirectional controls, lone surrogates)
    are written as JSON escapes: the same value for a program, visible to a person.
    """
    shown = redact.display(value)
    text = visible(json.dumps(shown, indent=2, ensure_ascii=False))
    try:
        sys.stdout.write(text + "\n")
    except UnicodeEncodeError:  # a terminal that is not UTF-8
        sys.stdout.write(json.dumps(shown, indent=2) + "\n")


def print_json_array(values: Iterable[Any]) -> None:
    """A JSON array on stdout as :func:`print_json` writes it, each value as it comes.

    Nothing is written before the first value is there (an error raised by ``values``
    before it leaves stdout to the error), and the values are never all in memory.
    """
    it = iter(values)
    first = next(it, _NONE)
    if first is _NONE:
        sys.stdout.write("[]\n")
        return
    sys.stdout.write("[")
    sep = "\n"
    for value in itertools.chain((first,), it):
        shown = redact.display(value)
        text = visible(json.dumps(shown, indent=2, ensure_ascii=False))
        try:
            sys.stdout.write(sep + "  " + text.replace("\n", "\n  "))
        except UnicodeEncodeError:  # a terminal that is not UTF-8
            sys.stdout.write(sep + "  " + json.dumps(shown, indent=2).replace("\n", "\n  "))
        sep = ",\n"
    sys.stdout.write("\n]\n")


_NONE = object()


def print_error(exc: PlanrunError, verbose: bool = False) -> None:
    """One short message on stderr: code, what is wrong, what to do (``-v``: details).

    An error that ended a journaled run (denied at approval, a plan refused) names it at
    the end of its line, ``(run ID)``, unless the message does already: a cron log that
    several runs wrote to is split by run id, and such a run has no other line (found by
    a fresh operator).
    """
    run_id = getattr(exc, "run_id", None)
    named = f" (run {run_id})" if run_id and run_id not in exc.message else ""
    err(f"planrun: error[{exc.code}]: {exc.message}{named}")
    if exc.hint:
        err(f"  {exc.hint}")
    if verbose and exc.details:
        if isinstance(exc.details, list) and all(isinstance(d, str) for d in exc.details):
            for line in exc.details:
                err(f"  {redact.display_text(line)}")
        else:
            err(f"  details: {redact.display(exc.details)!r}")


# --- validation reports -----------------------------------------------------------------


def _where(issue: Issue) -> str:
    parts = [issue.file or "planrun"]
    if issue.line is not None:
        parts.append(str(issue.line))
        if issue.column is not None:
            parts.append(str(issue.column))
    return ":".join(parts)


def issue_line(issue: Issue) -> str:
    """``file:line:col: error[code]: message (at /pointer)``."""
    at = f" (at {issue.path})" if issue.path else ""
    return f"{_where(issue)}: {issue.severity}[{issue.code}]: {issue.message}{at}"


class _Masked:
    """A text stream wrapper that shows ``***`` for each secret reference written."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        return self.stream.write(visible(redact.display_text(text)))


def _gh_escape(text: str, prop: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if prop:
        text = text.replace(":", "%3A").replace(",", "%2C")
    return text


def github_line(issue: Issue) -> str:
    """A GitHub Actions annotation: ``::error file=…,line=…,col=…,title=…::message``."""
    props = []
    if issue.file:
        props.append(f"file={_gh_escape(issue.file, True)}")
    if issue.line is not None:
        props.append(f"line={issue.line}")
    if issue.column is not None:
        props.append(f"col={issue.column}")
    props.append(f"title={_gh_escape('planrun ' + issue.code, True)}")
    kind = "error" if issue.severity == "error" else "warning"
    at = f" (at {issue.path})" if issue.path else ""
    return f"::{kind} {','.join(props)}::{_gh_escape(issue.message + at)}"


def print_report(report: Report, fmt: str = "text", *, strict: bool = False,
                 stream: IO[str] | None = None, quiet: bool = False) -> None:
    """Write a validation report in ``text``, ``json`` or ``github`` format.

    ``quiet`` (text): only the issues, and the summary line when there are any; no
    ``FILE: ok`` lines. A report without issues prints nothing.
    """
    target = _Masked(stream or sys.stdout)
    if fmt == "json":
        target.write(json.dumps(redact.display(report.to_json(strict=strict)), indent=2,
                                ensure_ascii=False) + "\n")
        return
    if fmt == "github":
        for issue in report.all_issues():
            target.write(github_line(issue) + "\n")
        n = len(report.plans)
        target.write(f"{n} plan(s) checked: "
                     f"{'ok' if report.ok(strict=strict) else 'refused'}\n")
        return
    for issue in report.issues:
        target.write(issue_line(issue) + "\n")
    refused = 0
    for plan in report.plans:
        if not plan.issues:
            if not quiet:
                target.write(f"{plan.file}: ok\n")
            continue
        if not plan.ok:
            refused += 1
        for issue in plan.issues:
            target.write(issue_line(issue) + "\n")
    errors = sum(1 for i in report.all_issues() if i.severity == "error")
    warnings = sum(1 for i in report.all_issues() if i.severity == "warning")
    n = len(report.plans)
    counts = f"{errors} error(s), {warnings} warning(s)"
    if quiet and not errors and not warnings:
        return
    if n:
        target.write(f"{n} plan(s) checked, {n - refused} ok, {refused} refused; {counts}\n")
    else:
        target.write(("ok; " if not errors else "") + counts + "\n")


# --- manifests ------------------------------------------------------------------------------


def _shown_status(step: dict[str, Any], run: dict[str, Any]) -> str:
    """A step's status as a person reads it (``--json`` keeps the journal's).

    ``unfinished`` for one journaled ``running`` in a run that nothing drives
    (interrupted, or its process gone): nothing runs it (found by a fresh operator).
    """
    if step["status"] == "running" and (run["status"] != "running"
                                         or run.get("driven") is False):
        return "unfinished"
    return str(step["status"])


def _items_text(step: dict[str, Any]) -> str:
    """``2/8 items`` (``, 1 failed``) of a fan-out step, "" for any other."""
    items = step.get("items")
    if not items:
        return ""
    text = f"{items.get('succeeded', 0)}/{items.get('total', 0)} items"
    return text + (f", {items['failed']} failed" if items.get("failed") else "")


def _step_line(step: dict[str, Any], run: dict[str, Any] | None = None) -> str:
    status = step["status"] if run is None else _shown_status(step, run)
    bits = [f"{status:<13} {step['id']} ({step['tool']})"]
    if _items_text(step):
        bits.append(_items_text(step))
    if step.get("duration_s") is not None:
        bits.append(f"{step['duration_s']:.3f}s")
    if step.get("replayed"):
        bits.append("replayed")
    if step.get("approved_by"):
        bits.append(f"approved by {step['approved_by']}")
    if step.get("error"):
        e = step["error"]
        # on one line, as the item errors under it (a tool's several lines of stderr in
        # the message broke the summary's layout; found by a fresh operator)
        bits.append(f"[{e.get('code')}] {' '.join(str(e.get('message')).split())}")
    if step.get("facets"):
        bits.append(f"facets {_facets_text(step['facets'])}")
    return "  ".join(bits)


#: Longest facets text a human summary prints for one step (``--json`` has them whole).
FACETS_SHOWN = 300


def _facets_text(facets: dict[str, Any]) -> str:
    """``NAME=VALUE …`` (values as compact JSON), cut at :data:`FACETS_SHOWN` characters."""
    text = " ".join(f"{k}={json.dumps(v, ensure_ascii=False, separators=(',', ':'))}"
                    for k, v in facets.items())
    return text if len(text) <= FACETS_SHOWN else text[:FACETS_SHOWN - 1] + "…"


def _item_error_lines(m: dict[str, Any]) -> list[str]:
    """One line per item error a manifest lists: ``STEP[INDEX]: [CODE] message``.

    Indented under the steps; a message is put on one line and cut at 300 characters.
    """
    lines = []
    for s in m["steps"]:
        for e in s.get("item_errors") or []:
            text = " ".join(str(e.get("message") or "").split())
            text = text if len(text) <= 300 else text[:299] + "…"
            lines.append(f"    {s['id']}[{e['index']}]: [{e.get('code')}] {text}")
    return lines


def run_headline(m: dict[str, Any]) -> str:
    """``run ID (PLAN rN): STATUS — S/T succeeded, …  in D s``: a manifest in one line."""
    c = m["counts"]
    state = m["status"]
    if m.get("driven") is False:
        state += " (nobody drives it: its process is gone)"
    head = (f"run {m['run_id']} ({m['plan']['name']} r{m['plan']['revision']}): "
            f"{state} — {c['succeeded']}/{c['total']} succeeded")
    # steps journaled running in a run nothing drives are "unfinished", as their lines
    # say (the headline said "1 running" above "unfinished nap"; found by a fresh operator)
    undriven = m["status"] != "running" or m.get("driven") is False
    extra = [f"{c[k]} {'unfinished' if k == 'running' and undriven else k}"
             for k in ("partial", "failed", "skipped", "indeterminate", "running",
                       "pending") if c.get(k)]
    if extra:
        head += ", " + ", ".join(extra)
    if m.get("duration_s") is not None:
        head += f" in {m['duration_s']:.2f}s"
        wall = m.get("wall_s")
        if wall is not None and wall - m["duration_s"] >= 1:
            head += f" of work ({wall:.2f}s since it started)"
    return head


def print_run_end(m: dict[str, Any]) -> None:
    """The end of a driven run as one line on stderr, with its ``next`` command.

    ``planrun: run ID (PLAN rN): STATUS — … at FINISHED; next: CMD``. Printed where the
    progress is plain lines (stderr not a terminal: a cron or CI log), so that the log
    alone says which run it was, how it ended and what to do next, also when the manifest
    went elsewhere (``--json`` on stdout). Found by a fresh operator.
    """
    line = "planrun: " + run_headline(m)
    if m.get("finished_at"):
        line += f" at {m['finished_at']}"
    if m.get("next"):
        line += f"; next: {m['next']}"
    err(line)


def print_manifest(m: dict[str, Any], *, no_color: bool = False) -> None:
    """The human summary of a run on stdout (a table on a terminal).

    Failed steps are named with their error message either way.
    """
    head = run_headline(m)
    if is_terminal(sys.stdout):
        from rich.table import Table

        console = _console(no_color=no_color)
        console.print(visible(redact.display_text(head)), markup=False, highlight=False)
        table = Table()
        for col in ("step", "tool", "status", "time", "note"):
            table.add_column(col)
        for s in m["steps"]:
            note = _items_text(s)
            if s.get("error"):
                note = (note + "  " if note else "") + \
                    f"[{s['error'].get('code')}] {s['error'].get('message')}"
            elif s.get("replayed"):
                note = (note + "  " if note else "") + "replayed"
            elif s.get("approved_by"):
                note = (note + "  " if note else "") + f"approved by {s['approved_by']}"
            if s.get("facets"):
                note = (note + "  " if note else "") + f"facets {_facets_text(s['facets'])}"
            dur = f"{s['duration_s']:.3f}s" if s.get("duration_s") is not None else ""
            table.add_row(_cell(s["id"]), _cell(s["tool"]), _shown_status(s, m), dur,
                          _cell(note), style={
                "failed": "red", "indeterminate": "magenta", "skipped": "dim",
                "succeeded": "green", "partial": "yellow"}.get(s["status"]))
        console.print(table)
        for line in _item_error_lines(m):
            console.print(visible(redact.display_text(line)), markup=False, highlight=False)
    else:
        out(head)
        for s in m["steps"]:
            out("  " + _step_line(s, m))
        for line in _item_error_lines(m):
            out(line)
    refused = m.get("refused")
    if refused:  # why (a refused plan, a planning session that found none)
        out(f"refused: [{refused['code']}] {refused['message']}")
    approval = m.get("approval")
    if approval and approval["waiting"]:  # awaiting approval (SPEC §10): who decides
        out("waiting for approval: " + ", ".join(
            f"{w['step']} ({w['tool']})" for w in approval["waiting"]))
        out(f"approve: {approval['approve']}")
        out(f"deny: {approval['deny']}")
    for verb in ("resume", "retry"):  # would refuse the run's plan as it is now (status)
        blocked = m.get(f"{verb}_refused")
        if blocked:
            out(f"{verb} would refuse it: [{blocked['code']}] {blocked['message']}")
    if m.get("next"):
        out(f"next: {m['next']}")


def print_json_line(value: Any) -> None:
    """One JSON object on one line of stdout, flushed (a stream: ``log --follow --json``)."""
    sys.stdout.write(visible(json.dumps(redact.display(value), ensure_ascii=False)) + "\n")
    sys.stdout.flush()


def print_runs(rows: Sequence[dict[str, Any]], here: str | None = None,
               journal: str | None = None, missing: bool = False) -> None:
    """Run summaries, one line each (newest first), each with its project folder.

    ``here``: the project the list was filtered to (said once, in a heading), or None
    when every project's runs are listed. ``journal``: where they were looked for, said
    when there are none (a cron job's ``PLANRUN_JOURNAL`` may not be the shell's);
    ``missing``: no journal file is there at all, said so (a mistyped path read as an
    empty history; found by a fresh operator).
    """
    if not rows:
        if missing and journal:
            out(f"no runs: there is no journal at {journal} (execute creates it; is it the "
                "journal you meant?)")
            return
        out("no runs" + (f" in {here}" if here else "")
            + (f" in the journal {journal}" if journal else "")
            + (" (planrun runs --all: every project's)" if here else ""))
        return
    if here:
        out(f"runs of {here} (--all: every project's)")
    for r in rows:
        c = r["counts"]
        where = f"  {r.get('project') or '?'}" if not here else ""
        gone = "  (nobody drives it: planrun status shows what next)" \
            if r.get("driven") is False else ""
        if r.get("retried_as"):
            gone += f"  (retried as {r['retried_as']})"
        running = f", {c['running']} unfinished" if r.get("driven") is False and c.get(
            "running") else ""
        out(f"{r['run_id']}  {r['started_at']}  {r['status']:<11}  {r['plan']} "
            f"r{r['revision']}  {c['succeeded']}/{c['total']} succeeded{running}{where}{gone}")


def print_plans(rows: Sequence[dict[str, Any]]) -> None:
    """``planrun plans``: one line per plan, then its goal indented."""
    if not rows:
        out("no plans")
        return
    for r in rows:
        state = "" if r["ok"] else f"  [refused: {r['issues']} error(s), see planrun validate]"
        needs = (f"  needs approval: {', '.join(r['needs_approval'])}"
                 if r["needs_approval"] else "")
        out(f"{r['name']}  r{r['revision']}  {r['steps']} step(s){needs}{state}")
        if r["goal"]:
            out(f"    {' '.join(str(r['goal']).split())}")


def print_events(events: Iterable[dict[str, Any]], tracebacks: bool = False) -> None:
    """Events, one line each; tracebacks only when asked."""
    for e in events:
        data = dict(e["data"] or {})
        tb = data.pop("traceback", None)
        where = f" {e['step']}" if e["step"] else ""
        if e["item"] is not None:
            where += f"[{e['item']}]"
        detail = f" {json.dumps(data, ensure_ascii=False)}" if data else ""
        out(f"{e['ts']}  {e['kind']}{where}{detail}")
        if tracebacks and tb:
            for line in str(tb).rstrip().splitlines():
                out("    " + line)


def _short(value: Any, limit: int = 200) -> str:
    """JSON of ``value``, cut at ``limit`` characters (a long list says how many items)."""
    text = json.dumps(value, ensure_ascii=False)
    if len(text) <= limit:
        return text
    more = f" ({len(value)} items)" if isinstance(value, list) else ""
    return text[:limit] + f"…{more}"


def print_dry_run(dry: Any) -> None:
    """What ``execute --dry-run`` would do."""
    from ..params import as_written

    plan = dry.plan
    out(f"plan {plan.name} r{plan.revision}: {plan.goal}")
    out("would run, in this order (nothing was run or journaled):")
    needs = {r.step_id for r in dry.approvals}
    for n, sid in enumerate(dry.order, 1):
        step = plan.by_id[sid]
        mark = "  [needs approval]" if sid in needs else ""
        deps = f" after {', '.join(step.depends_on)}" if step.depends_on else ""
        out(f"  {n}. {sid} ({step.tool.name}){deps}{mark}")
        if step.when:
            out(f"       when: {step.when}  (skipped when false)")
        if step.for_each is not None:
            out(f"       for_each: {_short(as_written(step.for_each))}")
        out(f"       arguments: {json.dumps(as_written(step.arguments), ensure_ascii=False)}")
    if dry.approvals:
        out("would need approval: " + ", ".join(f"{r.step_id} ({r.tool})"
                                                for r in dry.approvals))
    else:
        out("no step needs approval")


# --- the person at the terminal -------------------------------------------------------------


class TerminalApprover:
    """Asks on the terminal: a table of the steps, then ``Approve STEP (TOOL)? [y/N]`` each.

    The default is No; Ctrl-D / Ctrl-C at the prompt deny; with ``timeout`` seconds of
    silence the step is denied with reason ``timeout``. Stops at the first denial.
    """

    def __init__(self, timeout: float | None = None, no_color: bool = False) -> None:
        self.timeout = timeout
        self.no_color = no_color

    def _table(self, requests: Sequence[ApprovalRequest]) -> None:
        from rich.table import Table

        console = _console(stderr=True, no_color=self.no_color)
        title = ("Step that needs your approval now, with its resolved arguments"
                 if requests and all(r.resolved for r in requests)
                 else "Steps that need your approval before anything runs")
        table = Table(title=title, title_justify="left")
        for col in ("step", "tool", "intent", "arguments"):
            table.add_column(col, overflow="fold")
        for r in requests:
            table.add_row(_cell(r.step_id), _cell(r.tool), _cell(r.intent or ""),
                          _cell(json.dumps(redact.display(r.arguments), ensure_ascii=False)))
        console.print(table)

    def _ask(self, question: str) -> tuple[bool, str | None]:
        try:
            # the question is written inside the try: a Ctrl-C that lands the moment it
            # shows (before the read starts) is the same denial as one during the read
            sys.stderr.write(question)
            sys.stderr.flush()
            if self.timeout is not None:
                ready, _, _ = select.select([sys.stdin], [], [], self.timeout)
                if not ready:
                    sys.stderr.write("\n")
                    return False, "timeout"
            line = sys.stdin.readline()
        except KeyboardInterrupt:
            sys.stderr.write("\n")
            return False, "interrupt"
        if line == "":
            sys.stderr.write("\n")
            return False, "eof"
        answer = line.strip().lower()
        if answer in ("y", "yes"):
            return True, None
        return False, "answered no" if answer else "default no"

    def decide(self, requests: Sequence[ApprovalRequest]) -> list[Decision]:
        """Ask about each request in order; stop at the first denial."""
        from ..approval import Decision, user_name

        who = user_name()
        try:
            self._table(requests)
        except KeyboardInterrupt:  # Ctrl-C while the table shows: a denial, as at the prompt
            sys.stderr.write("\n")
            return [Decision(requests[0].step_id, False, who, "prompt", "interrupt")] \
                if requests else []
        out_: list[Decision] = []
        for r in requests:
            ok, why = self._ask(f"Approve {r.step_id} ({r.tool})? [y/N] ")
            out_.append(Decision(r.step_id, ok, who, "prompt", why))
            if not ok:
                break
        return out_


def print_explain(report: dict[str, Any]) -> None:
    """``resume --explain``: per step, what resume would do and why."""
    lease = report.get("lease")
    state = report["status"]
    if state == "running" and (not lease or lease.get("alive") is False):
        state += " (nobody drives it: its process is gone)"
    out(f"run {report['run_id']} is {state}")
    if lease:
        state = {True: "alive", False: "dead", None: "on another host"}[lease["alive"]]
        out(f"lease: {lease['owner']} ({state}, expires in {lease['expires_in_s']} s)")
    for c in report.get("calls", []):
        state = {True: "still running", False: "ended", None: "on another host"}[c["alive"]]
        item = f"[{c['item']}]" if c["item"] is not None else ""
        out(f"call of {c['step']}{item}: process group {c['pgid']} on {c['host']} "
            f"({state})")
    secrets = report["revalidation"].get("missing_secrets")
    if secrets:
        out("resume needs the secret parameter(s) " + ", ".join(secrets) + " again (a secret "
            "is never journaled): " + " ".join(f"-p {n}=VALUE" for n in secrets))
    elif not report["revalidation"]["ok"]:
        out("the journaled plan no longer passes validation; resume would refuse it:")
        for i in report["revalidation"]["issues"]:
            out(f"  [{i.get('code')}] {i.get('message')}")
    for s in report["steps"]:
        out(f"  {s['action']:<7} {s['step']} ({s['tool']}): {s['why']}")
    if report["would_stop"]:
        out("resume would stop before running anything (see above)")
    for note in report.get("notes") or []:
        out(f"note: {note}")


def print_plan(data: dict[str, Any]) -> None:
    """``planrun show``: goal, parameters, steps in run order."""
    out(f"plan {data['name']} r{data['revision']} ({data['file']})")
    out(f"goal: {data['goal']}")
    if data["params"]:
        out("parameters:")
        for p in data["params"]:
            kind = p["type"] if isinstance(p["type"], str) else json.dumps(p["type"])
            need = "required" if p["required"] else \
                f"default {json.dumps(redact.display(p['default']), ensure_ascii=False)}"
            secret = ", secret" if p["secret"] else ""
            desc = f" — {p['description']}" if p["description"] else ""
            out(f"  {p['name']}: {kind} ({need}{secret}){desc}")
    out("steps, in run order:")
    for n, s in enumerate(data["steps"], 1):
        bits = [f"{n}. {s['id']} ({s['tool']})"]
        if s["depends_on"]:
            bits.append(f"after {', '.join(s['depends_on'])}")
        if s["fan_out"]:
            bits.append(f"fan-out over {_short(s.get('for_each'))}")
        if s["when"]:
            bits.append(f"when {s['when']}")
        if s.get("run_if", "success") != "success":
            bits.append(f"run_if {s['run_if']}")
        if s["approval"]:
            bits.append(f"needs approval ({s['approval']}"
                        + (", when reached, with its resolved arguments)"
                           if s.get("approve_at_dispatch") else ")"))
        out("  " + "; ".join(bits))
        if s["intent"]:
            out(f"       {s['intent']}")


def print_tools(rows: list[dict[str, Any]]) -> None:
    """``planrun tools``: one block per tool."""
    if not rows:
        out("no tools registered")
    for t in rows:
        flags = [t["kind"]]
        if t["irreversible"]:
            flags.append("irreversible")
        if t["idempotent"]:
            flags.append("idempotent")
        if not t.get("blocking", True):
            # a timed call runs in a thread whatever the tool says (docs: Which thread)
            flags.append("non-blocking (ignored: timeout)" if t["timeout"] else "non-blocking")
        if t["timeout"]:
            flags.append(f"timeout {t['timeout']:g}s")
        out(f"{t['name']} ({', '.join(flags)})" + (f": {t['description']}"
                                                  if t["description"] else ""))
        for a in t["arguments"]:
            kind = a["type"] if isinstance(a["type"], str) else json.dumps(a["type"])
            out(f"    {a['name']}: {kind}{'' if a['required'] else ' (optional)'}")


from .progress import (  # noqa: E402 - live progress needs the helpers above
    LiveProgress,
    PlainProgress,
    item_rate,
    progress_reporter,
)

__all__ = ["LiveProgress", "PlainProgress", "TerminalApprover", "can_prompt", "err",
           "github_line", "is_terminal", "issue_line", "item_rate", "out", "print_dry_run",
           "print_error", "print_events", "print_explain", "print_json", "print_json_line",
           "print_manifest", "print_plan", "print_plans", "print_report", "print_run_end",
           "print_runs", "print_tools", "progress_reporter", "run_headline"]
