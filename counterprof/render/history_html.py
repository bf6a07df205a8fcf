"""`counterprof history show --html`: the trends as one self-contained page (inline SVG and CSS,
no scripts, nothing fetched), like `report --html`. One plot per series per command: the values
in run order, each point coloured by the scope's verdict, change points as dashed red lines
with the shift, and a tooltip per point (run, date, git revision, host, value). Formats only."""
from __future__ import annotations

import html
import math

from ..analysis.changepoints import ChangePoint
from ..store.history import Trend, command_display
from . import svg
from ..ground import units
from .report_html import COLORS, CSS

W, H, PAD, TOP = 900, 150, 56, 14


def _e(x: object) -> str:
    return html.escape(str(x))


def _color(verdict: str | None) -> str:
    if not verdict:
        return "#333"
    return COLORS.get(verdict.split(" ")[0], COLORS["unknown"])


def _plot(t: Trend, cps: list[ChangePoint]) -> str:
    pts = [(i, v) for i, v in enumerate(t.values) if math.isfinite(v)]
    if not pts:
        return ""
    lo, hi = min(v for _, v in pts), max(v for _, v in pts)
    if hi == lo:
        lo, hi = lo - (abs(lo) * 0.05 or 1), hi + (abs(hi) * 0.05 or 1)
    span = hi - lo
    lo, hi = lo - 0.08 * span, hi + 0.08 * span
    n = len(t.values)
    x = svg.scale(0, max(n - 1, 1), PAD, W - PAD)
    y = svg.scale(lo, hi, TOP, H - 24, flip=True)
    dots = []
    for i, v in pts:
        r = t.runs[i]
        tip = (f"run {r['seq']} {r.get('run_id') or ''} · {r.get('start_time') or ''} · "
               f"rev {(r.get('git_rev') or '-')[:12]} · {r.get('host') or ''} · {units.value(v, t.unit)}"
               + (f" · {t.verdicts[i]}" if t.verdicts[i] else ""))
        dots.append(svg.element("circle", f"<title>{_e(tip)}</title>", cls="pt", cx=x(i), cy=y(v), r=3.5,
                                fill=_color(t.verdicts[i])))
    marks = []
    cuts = [0] + [c.index for c in cps] + [n]
    for c in cps:
        xc = (x(c.index - 1) + x(c.index)) / 2
        marks.append(svg.line(xc, TOP - 6, xc, H - 24, cls="cp", stroke="#d62728", stroke_dasharray="4 3",
                              stroke_width=1.5)
                     + svg.text(xc + 3, TOP + 2, units.change(c.change, none="from 0"), font_size=11,
                                fill="#d62728"))
    for k in range(len(cuts) - 1 if cps else 0):     # each segment's median, between change points
        a, b = cuts[k], cuts[k + 1]
        med = cps[k].before if k < len(cps) else cps[-1].after
        marks.append(svg.line(x(a), y(med), x(b - 1), y(med), stroke="#d62728", stroke_opacity="0.35",
                              stroke_width=3))
    first, last = t.runs[0], t.runs[-1]
    vmax, vmin = max(v for _, v in pts), min(v for _, v in pts)
    axis = (svg.baseline(PAD, W - PAD, H - 24)
            + svg.text(2, y(vmax) + 4, units.value(vmax, t.unit))
            + svg.text(2, y(vmin) + 4, units.value(vmin, t.unit))
            + svg.text(PAD, H - 8, f'{str(first.get("start_time") or "")[:10]} run {first["seq"]}')
            + svg.text(W - PAD, H - 8, f'run {last["seq"]} {str(last.get("start_time") or "")[:10]}',
                       text_anchor="end"))
    cp_text = "; ".join(f"run {t.runs[c.index]['seq']}: {units.change(c.change, none='from 0')}" for c in cps)
    return (f'<h3>{_e(t.series)} <span class="dim">{_e(t.unit)} · {len(pts)} runs'
            f'{" · change points: " + _e(cp_text) if cps else ""}</span></h3>'
            f'<svg class="trend" data-series="{_e(t.series)}" width="{W}" height="{H}" role="img">'
            f'{axis}{svg.polyline(((x(i), y(v)) for i, v in pts), "#888", 1.2)}'
            f'{"".join(marks)}{"".join(dots)}</svg>')


def history_html(db: str, trends: list[Trend], points: list[list[ChangePoint]], threshold: float,
                 hidden: str = "") -> str:
    """hidden: the line that says which series are left out (render/history.py's hidden_text)."""
    legend = "".join(f"<span><svg width='10' height='10' style='display:inline'><rect width='10' height='10' "
                     f"fill='{c}'/></svg> {_e(k)}</span>" for k, c in COLORS.items())
    body = [f"<h1>counterprof history: {_e(db)}</h1>",
            f"<div class='dim'>points: one run each, coloured by the verdict of the series' scope; dashed red: "
            f"a change point (E-divisive, permutation test p &lt; 0.05, median shift ≥ {100 * threshold:g}%)</div>",
            f"<div class='legend dim'>{legend}</div>"]
    command = None
    for t, cps in zip(trends, points):
        if t.command != command:
            command = t.command
            body.append(f"<h2>{_e(command_display(command))}</h2>")
        body.append(_plot(t, cps))
    if not trends:
        body.append("<p>no series to show</p>")
    if hidden:
        body.append(f"<p class='dim hidden-series'>{_e(hidden)}</p>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>counterprof history: {_e(db)}</title>"
            f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>\n")
