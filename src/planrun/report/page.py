"""The report as one self-contained HTML page (issue 18).

Built with :func:`html.escape` and string joins: styles and pictures (inline SVG) are in
the page, there is no script, and a Content-Security-Policy forbids loading anything,
so the file opens the same offline, attached to a CI job or mailed by cron.
"""

from __future__ import annotations

import graphlib
import json
from html import escape as _html_escape
from typing import Any

from ..loading import visible
from . import svg
from .data import RunReport


def escape(text: str, quote: bool = True) -> str:
    """HTML-escaped ``text``, its bidirectional controls as escapes (:func:`visible`)."""
    return _html_escape(visible(text), quote=quote)


CSS = """
:root{--fg:#1d1d1f;--muted:#5b5b60;--line:#d6d6db;--bg:#fff;--soft:#f6f6f8}
*{box-sizing:border-box}
body{margin:0;font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",
sans-serif;color:var(--fg);background:var(--bg)}
main{max-width:1180px;margin:0 auto;padding:20px 24px 48px}
h1{font-size:1.45rem;margin:0 0 4px;overflow-wrap:anywhere}
h2{font-size:1.12rem;margin:28px 0 8px;border-bottom:1px solid var(--line);padding-bottom:4px}
.goal{color:var(--muted);margin:0 0 14px;overflow-wrap:anywhere}
.facts{display:grid;grid-template-columns:max-content 1fr;gap:3px 16px;margin:0}
.facts dt{color:var(--muted)}.facts dd{margin:0;overflow-wrap:anywhere}
code,.mono{font-family:ui-monospace,"DejaVu Sans Mono",Menlo,Consolas,monospace;font-size:.88em}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;border:1.5px solid;
font-weight:600;font-size:.85em;white-space:nowrap}
.s-succeeded{color:#1b7a3a;background:#dff3e4}.s-failed{color:#b3261e;background:#fde0de}
.s-partial{color:#8a5a00;background:#fdf0d5}
.s-indeterminate{color:#7b2f9e;background:#f1e2f8}.s-running{color:#1f5fbf;background:#dde9fb}
.s-skipped,.s-pending,.s-not-run,.s-refused,.s-denied,.s-interrupted,.s-planning,
.s-planned,.s-awaiting_approval,.s-completed{color:#3b3b40;background:#ececec}
.s-completed{color:#1b7a3a;background:#dff3e4}.s-refused,.s-denied{color:#b3261e;
background:#fde0de}.s-skipped,.s-pending,.s-not-run{border-style:dashed}
.scroll{overflow:auto;max-width:100%;border:1px solid var(--line);border-radius:6px;
background:var(--soft)}
.scroll.pic{max-height:80vh}
.scroll.pic svg{margin:0 auto}
table.params{width:auto;min-width:40%}
svg{display:block;font-family:system-ui,"DejaVu Sans",sans-serif}
svg .edges path{fill:none;stroke:#777;stroke-width:1.4;stroke-linejoin:round}
svg .edges path.long{stroke:#8a8a95;stroke-dasharray:none}
svg .sid{font-size:13px;font-weight:600;fill:#1d1d1f}
svg .st,svg .note,svg .lbl{font-size:12px;fill:#2b2b30}
svg .axis{font-size:11px;fill:var(--muted)}
svg .grid{stroke:#d0d0d6;stroke-width:1}
svg .idle{fill:#c9c9cf;fill-opacity:.45}
svg.hist rect{fill:#5677a8}
svg a.node:focus rect,svg a.node:hover rect{stroke-width:3.5}
table{border-collapse:collapse;width:100%;font-size:.92em}
th,td{text-align:left;vertical-align:top;padding:5px 8px;border-bottom:1px solid var(--line)}
th{background:var(--soft);font-weight:600;white-space:nowrap}
td.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
tr:target{outline:2px solid #1f5fbf;outline-offset:-2px}
.err{color:#8c1d18;overflow-wrap:break-word}
td.errs{min-width:16em}
.fan{margin:14px 0;padding:10px 12px;border:1px solid var(--line);border-radius:6px}
.fan h3{margin:0 0 6px;font-size:1rem}
.fan .cols{display:flex;flex-wrap:wrap;gap:12px 28px;align-items:flex-start}
details{margin-top:6px}summary{cursor:pointer;font-weight:600}
.events td:last-child{overflow-wrap:anywhere}.events td.when{white-space:nowrap}
.legend{display:flex;flex-wrap:wrap;gap:6px 10px;margin:6px 0 8px;padding:0;list-style:none}
.muted{color:var(--muted)}
footer{margin-top:36px;color:var(--muted);font-size:.85em}
@media (max-width:700px){main{padding:12px}.facts{gap:2px 10px}table{font-size:.85em}
th,td{padding:4px 5px}}
"""

#: Longest event data text shown in a row (characters); the rest is `planrun log`'s.
EVENT_DATA_CHARS = 400


def _e(value: Any) -> str:
    return escape("" if value is None else str(value), quote=True)


def badge(status: str) -> str:
    """A status word in a coloured pill (the word is the status; colour is extra)."""
    return f'<span class="badge s-{_e(status.replace(" ", "-"))}">{_e(status)}</span>'


def size(n: int | None) -> str:
    """A byte count for people: ``512 B``, ``1.5 KB``, ``2.25 MB`` (1 KB = 1,000 B)."""
    if n is None:
        return "\N{EN DASH}"
    if n < 1000:
        return f"{n} B"
    if n < 1_000_000:
        return f"{n / 1000:.1f} KB"
    return f"{n / 1_000_000:.2f} MB"


def report_file(run_id: str) -> str:
    """The default file name of a run's report: ``planrun-report-RUNID.html``."""
    return f"planrun-report-{run_id}.html"


def _json(value: Any, limit: int | None = None) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    if limit is not None and len(text) > limit:
        text = text[:limit - 1] + "…"
    return text


def _header(r: RunReport) -> str:
    m = r.manifest
    plan = m["plan"]
    c = m["counts"]
    counts = ", ".join(f"{c[k]} {k}" for k in ("succeeded", "partial", "failed",
                                               "skipped", "indeterminate", "running",
                                               "pending")
                       if c.get(k))
    took = svg.duration(m.get("duration_s"))
    wall = m.get("wall_s")
    if wall is not None and m.get("duration_s") is not None and wall - m["duration_s"] >= 1:
        took += f" of work ({svg.duration(wall)} since it started)"
    facts = [
        ("run", f'<code>{_e(m["run_id"])}</code>'),
        ("plan", f'{_e(plan["name"])} revision {_e(plan["revision"])}'
         + (f' — <code>{_e(plan["file"])}</code>' if plan.get("file") else "")),
        ("digest", f'<code>{_e(plan.get("digest"))}</code>'),
        ("status", badge(m["status"]) + (
            " \N{EM DASH} nobody drives it: its process is gone (see next)"
            if m.get("driven") is False else "")),
        ("steps", f'{_e(c["total"])} — {_e(counts) or "none ran"}'),
        ("started", _e(m.get("started_at") or "\N{EN DASH}")),
        ("finished", _e(m.get("finished_at") or "not finished")),
        ("duration", _e(took)),
    ]
    lineage = []
    if m.get("parent_run_id"):
        lineage.append(f'retry of <a href="{_e(report_file(m["parent_run_id"]))}">'
                       f'<code>{_e(m["parent_run_id"])}</code></a>')
    if m.get("root_run_id") and m["root_run_id"] not in (m["run_id"], m.get("parent_run_id")):
        lineage.append(f'first run <a href="{_e(report_file(m["root_run_id"]))}">'
                       f'<code>{_e(m["root_run_id"])}</code></a>')
    if r.children:
        lineage.append("retried as " + ", ".join(
            f'<a href="{_e(report_file(c))}"><code>{_e(c)}</code></a>' for c in r.children))
    if lineage:
        facts.append(("lineage", "; ".join(lineage)))
    approval = m.get("approval") or {}
    if approval.get("waiting"):  # awaiting approval: what it waits for, who decides how
        facts.append(("waiting for", ", ".join(
            f'<code>{_e(w["step"])}</code> ({_e(w["tool"])})' for w in approval["waiting"])))
        facts.append(("approve", f'<code>{_e(approval.get("approve"))}</code>'))
        facts.append(("deny", f'<code>{_e(approval.get("deny"))}</code>'))
    if m.get("next"):
        facts.append(("next", f'<code>{_e(m["next"])}</code>'))
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
    params = m.get("params") or {}
    rows = "".join(f"<tr><th scope=row><code>{_e(k)}</code></th>"
                   f'<td class="mono">{_e(_json(v, 500))}</td></tr>'
                   for k, v in sorted(params.items()))
    ptable = (f'<h2>Parameters</h2><div class="scroll"><table class="params"><tbody>{rows}</tbody>'
              "</table></div>" if rows else "")
    return (f'<h1>{_e(plan["name"])}: {badge(m["status"])}</h1>'
            f'<p class="goal">{_e(m.get("goal") or "")}</p><dl class="facts">{dl}</dl>'
            + ptable)


def _legend() -> str:
    items = "".join(f"<li>{badge(s)}</li>" for s in ("succeeded", "partial", "failed",
                                                     "indeterminate", "running", "skipped",
                                                     "pending"))
    return f'<ul class="legend" aria-label="Status colours">{items}</ul>'


def _graph(r: RunReport) -> str:
    try:
        picture = svg.dag(r)
    except graphlib.CycleError as exc:
        return (f'<h2>Steps</h2><p class="muted">The plan\'s steps wait on each other '
                f"({_e(' → '.join(map(str, exc.args[1])))}); no graph to draw.</p>")
    if not picture:
        return '<h2>Steps</h2><p class="muted">The run has no steps.</p>'
    return (f'<h2 id="graph">Steps and what they wait on</h2>{_legend()}'
            f'<div class="scroll pic">{picture}</div>')


def _timeline(r: RunReport) -> str:
    picture = svg.timeline(r)
    if not picture:
        return ""
    note = (' <span class="muted">(shaded: nobody drove the run)</span>' if r.idle else "")
    return f'<h2 id="timeline">Timeline{note}</h2><div class="scroll pic">{picture}</div>'


def _step_rows(r: RunReport) -> str:
    steps = {s["id"]: s for s in r.manifest["steps"]}
    rows = []
    for sid in r.order:
        s = steps.get(sid)
        if s is None:
            rows.append(f'<tr id="step-{_e(sid)}"><td><code>{_e(sid)}</code></td>'
                        f'<td>{_e(r.tools.get(sid))}</td><td>{badge("not run")}</td>'
                        + "<td></td>" * 6 + "</tr>")
            continue
        error = s.get("error") or {}
        err = (f'<span class="err"><code>{_e(error.get("code"))}</code> '
               f'{_e(error.get("message"))}</span>' if error else "")
        fan = r.fan_outs.get(sid)
        if fan is not None:
            extra = f"{fan.total:,} items: {fan.succeeded:,} succeeded"
            if fan.failed:
                extra += f", {fan.failed:,} failed"
            if fan.replayed:
                extra += f", {fan.replayed:,} replayed"
            err = f'{err}<div class="muted">{_e(extra)}</div>'
        rows.append(
            f'<tr id="step-{_e(sid)}"><td><code>{_e(sid)}</code></td><td>{_e(s["tool"])}</td>'
            f'<td>{badge(s["status"])}</td><td class="num">{_e(s["attempts"])}</td>'
            f'<td class="num">{_e(svg.duration(s.get("duration_s")))}</td>'
            f'<td class="num">{_e(size(s.get("output_bytes")))}</td><td class="errs">{err}</td>'
            f'<td>{_e(s.get("approved_by") or "")}</td>'
            f'<td>{"yes" if s.get("replayed") else ""}</td></tr>')
    head = "".join(f"<th scope=col>{h}</th>" for h in (
        "step", "tool", "status", "attempts", "duration", "output", "error", "approved by",
        "replayed"))
    return (f'<h2 id="steps">Each step</h2><div class="scroll"><table class="steps">'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>")


def _fan_outs(r: RunReport) -> str:
    out = []
    for sid, fan in r.fan_outs.items():
        p = fan.percentiles
        stats = ("".join(f"<dt>{k}</dt><dd>{_e(svg.duration(v))}</dd>" for k, v in p.items())
                 if p else "<dt>durations</dt><dd>no item finished</dd>")
        fails = "".join(f'<li>item {_e(f["index"])}: <span class="err"><code>'
                        f'{_e(f["code"])}</code> {_e(f["message"])}</span></li>'
                        for f in fan.failures)
        more = fan.failed - len(fan.failures)
        if more > 0:
            fails += f"<li>… {more:,} more failed items (<code>planrun log</code>)</li>"
        out.append(
            f'<section class="fan" data-step="{_e(sid)}"><h3>Fan-out <code>{_e(sid)}</code>: '
            f"{fan.total:,} items, {fan.succeeded:,} succeeded, {fan.failed:,} failed</h3>"
            f'<div class="cols"><div>{svg.spread(fan)}<div class="muted">item durations'
            f'</div></div><dl class="facts">{stats}</dl>'
            + (f"<div><strong>failed items</strong><ul>{fails}</ul></div>" if fails else "")
            + "</div></section>")
    return "".join(out)


def _approvals(r: RunReport) -> str:
    if not r.approvals:
        return ""
    rows = "".join(
        f'<tr><td><code>{_e(a["step"])}</code>'
        + (f'[{_e(a["item"])}]' if a["item"] is not None else "")
        + f'</td><td>{_e(a["tool"])}</td><td>{"granted" if a["granted"] else "denied"}</td>'
        f'<td>{_e(a["decided_by"])}</td><td>{_e(a["method"])}</td>'
        f'<td>{_e(a["decided_at"])}</td><td>{_e(a["reason"] or "")}</td></tr>'
        for a in r.approvals)
    head = "".join(f"<th scope=col>{h}</th>" for h in (
        "step", "tool", "decision", "by", "how", "when", "reason"))
    return (f'<h2 id="approvals">Approvals</h2><div class="scroll"><table>'
            f"<thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>")


def _issues(r: RunReport) -> str:
    if not r.issues:
        return ""
    rows = "".join(
        f'<tr><td><code>{_e(i.get("code"))}</code></td><td>{_e(i.get("severity"))}</td>'
        f'<td><code>{_e(i.get("step") or "")}</code></td>'
        f'<td>{_e(i.get("file") or "")}{":" + _e(i["line"]) if i.get("line") else ""}</td>'
        f'<td class="err">{_e(i.get("message"))}</td></tr>' for i in r.issues)
    head = "".join(f"<th scope=col>{h}</th>" for h in (
        "code", "severity", "step", "where", "message"))
    return (f'<h2 id="validation">Validation report</h2><div class="scroll"><table '
            f'class="issues"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'
            "</div>")


def _clock(ts: str, day: str) -> str:
    """An event's time: the time of day on the run's first day, else the whole stamp."""
    date, sep, rest = ts.partition("T")
    return rest.split("+")[0] if sep and date == day else ts


def _events(r: RunReport) -> str:
    rows = []
    day = str(r.manifest.get("started_at") or "").partition("T")[0]
    for n, e in enumerate(r.events):
        if n == r.events_cut_at:
            rows.append(f'<tr><td colspan=4 class="muted">{r.events_cut:,} events are not '
                        f'copied here; <code>planrun log {_e(r.manifest["run_id"])}</code> '
                        'shows every one.</td></tr>')
        where = _e(e["step"] or "") + (f'[{_e(e["item"])}]' if e["item"] is not None else "")
        data = _json(e["data"], EVENT_DATA_CHARS) if e["data"] else ""
        rows.append(f'<tr><td class="mono when" title="{_e(e["ts"])}">{_e(_clock(e["ts"], day))}'
                    f'</td><td>{_e(e["kind"])}</td>'
                    f'<td><code>{where}</code></td><td class="mono">{_e(data)}</td></tr>')
    left = (f'<p class="muted">{r.events_left_out:,} fan-out item events are not copied here; '
            f'<code>planrun log {_e(r.manifest["run_id"])}</code> shows every one.</p>'
            if r.events_left_out else "")
    head = "".join(f"<th scope=col>{h}</th>" for h in ("time (UTC)", "event", "step",
                                                        "data"))
    return (f'<h2 id="events">Events</h2><details><summary>{r.events_total:,} events in order'
            f'</summary>{left}<div class="scroll"><table class="events"><thead><tr>{head}'
            f"</tr></thead><tbody>{''.join(rows)}</tbody></table></div></details>")


def render(r: RunReport, *, version: str = "") -> str:
    """The whole page (UTF-8 HTML text) of a gathered run.

    Nothing in it loads from elsewhere: links are to places in the page (``#step-ID``)
    or to the reports of related runs beside it (``planrun-report-RUNID.html``).
    """
    m = r.manifest
    title = f"planrun report: {m['plan']['name']} — {m['status']} ({m['run_id']})"
    body = (_header(r) + _issues(r) + _graph(r) + _timeline(r) + _step_rows(r)
            + _fan_outs(r) + _approvals(r) + _events(r))
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "style-src 'unsafe-inline'; img-src data:\">"
        "<link rel=\"icon\" href=\"data:,\">"
        f"<title>{_e(title)}</title><style>{CSS}</style></head>\n<body><main>{body}"
        f"<footer>Written by planrun {_e(version)} from the journal. Secret values are "
        "shown as <code>***</code>.</footer></main></body></html>\n")
