"""The report's pictures as inline SVG text: the run's DAG, its timeline, histograms.

Drawn with the standard library only (a layered layout on ``graphlib``'s topological
generations), so a report needs nothing from the network. Every status is shown by
colour *and* by a word (and a glyph, and a dash pattern for steps that did not run), so
the pictures read in grey scale and to a screen reader.
"""

from __future__ import annotations

import graphlib
from collections.abc import Mapping, Sequence
from datetime import datetime
from html import escape as _html_escape
from typing import Any

from ..loading import visible
from .data import FanOut, RunReport


def escape(text: str, quote: bool = True) -> str:
    """HTML-escaped ``text``, its bidirectional controls as escapes (:func:`visible`)."""
    return _html_escape(visible(text), quote=quote)


#: status → (fill, stroke, glyph, dashed); unknown statuses look like ``pending``.
STATUS_STYLE: dict[str, tuple[str, str, str, bool]] = {
    "succeeded": ("#dff3e4", "#1b7a3a", "✓", False),
    "partial": ("#fdf0d5", "#8a5a00", "◐", False),
    "failed": ("#fde0de", "#b3261e", "✗", False),
    "indeterminate": ("#f1e2f8", "#7b2f9e", "?", False),
    "running": ("#dde9fb", "#1f5fbf", "▶", False),
    "skipped": ("#ececec", "#5f5f5f", "\N{EN DASH}", True),
    "pending": ("#ffffff", "#6f6f6f", "○", True),
    "not run": ("#ffffff", "#6f6f6f", "○", True),
}

NODE_W, NODE_H = 190, 50
GAP_X, GAP_Y = 20, 46
#: Nodes side by side before a layer wraps onto another row (keeps the picture legible
#: and within a 1280 px window, however wide the plan).
PER_ROW = 5
PAD = 12
#: Room on each side of the boxes for arrows that pass rows by.
SIDE = 26


def style(status: str) -> tuple[str, str, str, bool]:
    """(fill, stroke, glyph, dashed) of a status."""
    return STATUS_STYLE.get(status, STATUS_STYLE["pending"])


def _a(value: object) -> str:
    """An attribute value, escaped (quotes too)."""
    return escape(str(value), quote=True)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def layers(order: Sequence[str], depends_on: Mapping[str, Sequence[str]]) -> list[list[str]]:
    """Step ids in layers: each step one layer below the last of the steps it waits on.

    Within a layer, steps are sorted by the mean position of their parents (fewer
    crossing arrows), then by plan order.

    Raises:
        graphlib.CycleError: steps wait on each other (a refused plan).
    """
    sorter = graphlib.TopologicalSorter({sid: list(depends_on.get(sid, ())) for sid in order})
    sorter.prepare()
    rank = {sid: i for i, sid in enumerate(order)}
    pos: dict[str, float] = {}
    out: list[list[str]] = []
    while sorter.is_active():
        ready = list(sorter.get_ready())

        def key(sid: str) -> tuple[float, int]:
            parents = [pos[p] for p in depends_on.get(sid, ()) if p in pos]
            return (sum(parents) / len(parents) if parents else -1.0, rank[sid])

        ready.sort(key=key)
        for i, sid in enumerate(ready):
            pos[sid] = i
        out.append(ready)
        sorter.done(*ready)
    return out


def _node_text(report: RunReport, steps: Mapping[str, Mapping[str, Any]], sid: str
               ) -> tuple[str, str, str]:
    """(status, second line, full description) of a node; ``steps``: manifest steps by id."""
    step = steps.get(sid)
    status = step["status"] if step else "not run"
    tool = step["tool"] if step else report.tools.get(sid, "")
    line = f"{status} · {tool}" if tool else status
    fan = report.fan_outs.get(sid)
    if fan is not None:
        line = f"{status} · {fan.total:,} items" + (f", {fan.failed:,} ✗" if fan.failed
                                                    else "")
    full = f"step {sid}: {status}" + (f" ({tool})" if tool else "")
    if step and step.get("error"):
        full += f" — [{step['error'].get('code')}] {step['error'].get('message')}"
    return status, line, full


def dag(report: RunReport) -> str:
    """The run's steps and dependencies as one ``<svg>`` (top to bottom).

    Each node is a link to the step's row of the steps table (``#step-ID``) and carries
    ``data-step`` and ``data-status``; an empty string when the run has no steps.

    Raises:
        graphlib.CycleError: steps wait on each other (a refused plan).
    """
    if not report.order:
        return ""
    rows: list[list[str]] = []
    for layer in layers(report.order, report.depends_on):
        rows += [layer[i:i + PER_ROW] for i in range(0, len(layer), PER_ROW)]
    width = 2 * (PAD + SIDE) + min(PER_ROW, max(len(r) for r in rows)) * (NODE_W + GAP_X) \
        - GAP_X
    height = PAD * 2 + len(rows) * (NODE_H + GAP_Y) - GAP_Y
    at: dict[str, tuple[float, float]] = {}
    row_of: dict[str, int] = {}
    for r, row in enumerate(rows):
        row_w = len(row) * (NODE_W + GAP_X) - GAP_X
        x0 = (width - row_w) / 2
        for i, sid in enumerate(row):
            at[sid] = (x0 + i * (NODE_W + GAP_X), PAD + r * (NODE_H + GAP_Y))
            row_of[sid] = r
    lanes = {"left": 0, "right": 0}
    parts = [f'<svg class="dag" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}" role="group" '
             'aria-label="The run\'s steps and what each waits on">',
             '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" '
             'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
             '<path d="M0,0L10,5L0,10z" fill="#555"/></marker></defs>', '<g class="edges">']
    for sid in report.order:
        x1, y1 = at[sid]
        for dep in report.depends_on.get(sid, ()):
            x0, y0 = at[dep]
            ax, ay = x0 + NODE_W / 2, y0 + NODE_H
            bx, by = x1 + NODE_W / 2, y1 - 2
            if row_of[sid] - row_of[dep] <= 1:
                mid = (ay + by) / 2
                parts.append(f'<path d="M{ax:.1f},{ay:.1f} C{ax:.1f},{mid:.1f} {bx:.1f},'
                             f'{mid:.1f} {bx:.1f},{by:.1f}" marker-end="url(#arrow)"/>')
                continue
            # Past rows in between: around them, down a lane beside the nodes, never
            # through a box (which would read as an arrow into it).
            side = "left" if ax + bx < width else "right"
            k = lanes[side] % 5
            lanes[side] += 1
            cx = PAD + SIDE - 8 - 4 * k if side == "left" else width - PAD - SIDE + 8 + 4 * k
            y_out = ay + GAP_Y / 2 - 6 + 3 * k
            y_in = by - GAP_Y / 2 + 8 - 3 * k
            parts.append(f'<path class="long" d="M{ax:.1f},{ay:.1f} L{ax:.1f},{y_out:.1f} '
                         f"L{cx:.1f},{y_out:.1f} L{cx:.1f},{y_in:.1f} L{bx:.1f},{y_in:.1f} "
                         f'L{bx:.1f},{by:.1f}" marker-end="url(#arrow)"/>')
    parts.append("</g>")
    steps = {s["id"]: s for s in report.manifest["steps"]}
    for sid in report.order:
        x, y = at[sid]
        status, line, full = _node_text(report, steps, sid)
        fill, stroke, glyph, dashed = style(status)
        dash = ' stroke-dasharray="5 3"' if dashed else ""
        wide = 3 if status == "failed" else 1.5
        parts.append(
            f'<a href="#step-{_a(sid)}" class="node" data-step="{_a(sid)}" '
            f'data-status="{_a(status)}" aria-label="{_a(full)}">'
            f'<title>{escape(full)}</title>'
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{NODE_W}" height="{NODE_H}" rx="6" '
            f'fill="{fill}" stroke="{stroke}" stroke-width="{wide}"{dash}/>'
            f'<text x="{x + 10:.1f}" y="{y + 20:.1f}" class="sid">'
            f'<tspan fill="{stroke}">{glyph}</tspan> {escape(_cut(sid, 21))}</text>'
            f'<text x="{x + 10:.1f}" y="{y + 38:.1f}" class="st">'
            f'{escape(_cut(line, 28))}</text></a>')
    parts.append("</svg>")
    return "".join(parts)


def _t(ts: str) -> float:
    return datetime.fromisoformat(ts).timestamp()


#: The widest label column, the chart's width and a row's height (px).
LABEL_W, CHART_W, ROW_H = 190, 760, 24


def timeline(report: RunReport) -> str:
    """A Gantt bar per step that started, on the run's clock (``<svg>``, or "").

    Times when nobody drove the run (it died and was resumed later) are shaded. A fan-out
    step's bar says how many items it had; their spread is drawn by :func:`spread`.
    """
    m = report.manifest
    started = [s for s in m["steps"] if s.get("started_at")]
    if not started or not m.get("started_at"):
        return ""
    steps = m["steps"]
    # The label column fits the longest step id shown (24 characters at most).
    label_w = max(60, min(LABEL_W, 8 + 7 * max(len(_cut(s["id"], 24)) for s in steps)))
    t0 = _t(m["started_at"])
    ends = [_t(s["finished_at"]) for s in started if s.get("finished_at")]
    ends += [_t(s["started_at"]) for s in started]
    if m.get("finished_at"):
        ends.append(_t(m["finished_at"]))
    span = max(max(ends) - t0, 1e-3)
    height = PAD + 22 + len(steps) * ROW_H + PAD
    width = label_w + CHART_W + PAD * 2

    def x(ts: float) -> float:
        return label_w + PAD + max(0.0, min(1.0, (ts - t0) / span)) * CHART_W

    parts = [f'<svg class="timeline" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
             'aria-label="When each step ran, from the start of the run">']
    for a, b in report.idle:
        xa, xb = x(_t(a)), x(_t(b))
        parts.append(f'<rect class="idle" x="{xa:.1f}" y="{PAD + 18}" width="'
                     f'{max(1.0, xb - xa):.1f}" height="{len(steps) * ROW_H}"><title>'
                     f'nobody drove the run from {escape(a)} to {escape(b)}</title></rect>')
    for i in range(5):  # the time axis: 0, ¼, ½, ¾ and the whole span
        tx = label_w + PAD + CHART_W * i / 4
        parts.append(f'<line class="grid" x1="{tx:.1f}" y1="{PAD + 16}" x2="{tx:.1f}" '
                     f'y2="{height - PAD}"/><text class="axis" x="{tx:.1f}" y="{PAD + 8}" '
                     f'text-anchor="{"start" if i == 0 else "end" if i == 4 else "middle"}">'
                     f"{escape(duration(span * i / 4))}</text>")
    for r, s in enumerate(steps):
        y = PAD + 22 + r * ROW_H
        fill, stroke, glyph, dashed = style(s["status"])
        if not s.get("started_at"):  # never ran: its row says so, without a bar
            parts.append(
                f'<g class="bar" data-step="{_a(s["id"])}"><text class="lbl" '
                f'x="{label_w + PAD - 6}" y="{y + 16}" text-anchor="end">'
                f'{escape(_cut(s["id"], 24))}</text><text class="note" x="{label_w + PAD + 4}"'
                f' y="{y + 16}">{glyph} {escape(s["status"])}, did not run</text></g>')
            continue
        start = _t(s["started_at"])
        end = _t(s["finished_at"]) if s.get("finished_at") else max(ends)
        fan = report.fan_outs.get(s["id"])
        note = f"{s['status']}, {duration(s.get('duration_s'))}"
        if fan is not None:
            note += f", {fan.total:,} items"
        xa, xb = x(start), x(end)
        bar_dash = ' stroke-dasharray="4 2"' if dashed else ""
        # The note right of the bar; else left of it; else (a bar across the whole
        # chart) inside its end.
        if xb + 170 <= width:
            anchor, note_x = "", xb + 6
        elif xa - 170 >= label_w + PAD:
            anchor, note_x = ' text-anchor="end"', xa - 6
        else:
            anchor, note_x = ' text-anchor="end"', xb - 6
        parts.append(
            f'<g class="bar" data-step="{_a(s["id"])}"><title>{escape(s["id"])}: '
            f'{escape(note)}</title><text class="lbl" x="{label_w + PAD - 6}" '
            f'y="{y + 16}" text-anchor="end">{escape(_cut(s["id"], 24))}</text>'
            f'<rect x="{xa:.1f}" y="{y + 4}" width="{max(2.0, xb - xa):.1f}" '
            f'height="{ROW_H - 8}" rx="3" fill="{fill}" stroke="{stroke}"'
            f'{bar_dash}/>'
            f'<text class="note" x="{note_x:.1f}" y="{y + 16}"'
            f'{anchor}>{glyph} '
            f"{escape(note)}</text></g>")
    parts.append("</svg>")
    return "".join(parts)


def spread(fan: FanOut) -> str:
    """A fan-out step's item durations as a small histogram (``<svg>``, or "")."""
    if not fan.histogram:
        return ""
    w, h, pad = 320, 90, 4
    peak = max(fan.histogram)
    bar = (w - 2 * pad) / len(fan.histogram)
    lo, hi = fan.durations_s[0], fan.durations_s[-1]
    parts = [f'<svg class="hist" width="{w}" '
             f'height="{h + 18}" viewBox="0 0 {w} {h + 18}" role="img" aria-label="'
             f'{_a(f"item durations from {duration(lo)} to {duration(hi)}")}">']
    for i, n in enumerate(fan.histogram):
        bh = (h - 2 * pad) * n / peak if peak else 0
        a = lo + (hi - lo) * i / len(fan.histogram)
        b = lo + (hi - lo) * (i + 1) / len(fan.histogram)
        parts.append(f'<rect x="{pad + i * bar:.1f}" y="{h - pad - bh:.1f}" '
                     f'width="{max(1.0, bar - 1):.1f}" height="{bh:.1f}"><title>{n} items '
                     f"took {escape(duration(a))}\N{EN DASH}{escape(duration(b))}</title></rect>")
    parts.append(f'<text class="axis" x="{pad}" y="{h + 14}">{escape(duration(lo))}</text>'
                 f'<text class="axis" x="{w - pad}" y="{h + 14}" text-anchor="end">'
                 f"{escape(duration(hi))}</text></svg>")
    return "".join(parts)


def duration(seconds: float | None) -> str:
    """``seconds`` for people: ``850 ms``, ``4.21 s``, ``3 min 05 s``, ``2 h 07 min``."""
    if seconds is None:
        return "\N{EN DASH}"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.2f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"
