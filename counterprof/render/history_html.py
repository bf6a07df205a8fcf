"""`counterprof history show --html`: the trends as one self-contained page (render/charts.py:
uPlot and the data inline, nothing fetched), like `report --html`. One plot per series per
command: the values in run order on a y axis from zero (a 14% drift looks like 14%), each point
coloured by the scope's verdict, change points as dashed red lines with the shift, each
segment's median, and a tooltip per point (run, date, git revision, host, value). Formats only."""
from __future__ import annotations

import html
import math
from typing import Any

from ..analysis.changepoints import ChangePoint
from ..store.history import Trend, command_display
from . import charts
from ..ground import units
from .report_html import COLORS, CSS

W = 900


def _e(x: object) -> str:
    return html.escape(str(x))


def _color(verdict: str | None) -> str:
    if not verdict:
        return "#333"
    return COLORS.get(verdict.split(" ")[0], COLORS["unknown"])


def _chart(t: Trend, cps: list[ChangePoint], chart_id: str) -> dict[str, Any] | None:
    if not any(math.isfinite(v) for v in t.values):
        return None
    tips = []
    for i, v in enumerate(t.values):
        r = t.runs[i]
        tips.append([f"run {r['seq']} {r.get('run_id') or ''}: {units.value(v, t.unit)}"
                     + (f" ({t.verdicts[i]})" if t.verdicts[i] else ""),
                     f"{r.get('start_time') or ''} · rev {(r.get('git_rev') or '-')[:12]} · {r.get('host') or ''}"])
    cuts = [0] + [c.index for c in cps] + [len(t.values)]
    segments = [[cuts[k], cuts[k + 1] - 1, cps[k].before if k < len(cps) else cps[-1].after]
                for k in range(len(cuts) - 1)] if cps else []
    return {"kind": "trend", "id": chart_id, "width": W, "unit": t.unit, "x": [r["seq"] for r in t.runs],
            "y": [charts.finite(v) for v in t.values], "colors": [_color(v) for v in t.verdicts], "tips": tips,
            "cps": [{"i": c.index, "label": units.change(c.change, none="from 0"),
                     "title": f"change point before run {t.runs[c.index]['seq']}: median "
                              f"{units.value(c.before, t.unit)} → {units.value(c.after, t.unit)} "
                              f"(p {c.p_value:.3g})"} for c in cps],
            "segments": segments}


def history_html(db: str, trends: list[Trend], points: list[list[ChangePoint]], threshold: float,
                 hidden: str = "") -> str:
    """hidden: the line that says which series are left out (render/history.py's hidden_text)."""
    legend = "".join(f"<span><svg width='10' height='10' style='display:inline'><rect width='10' height='10' "
                     f"fill='{c}'/></svg> {_e(k)}</span>" for k, c in COLORS.items())
    body = [f"<h1>counterprof history: {_e(db)}</h1>",
            f"<div class='dim'>points: one run each, coloured by the verdict of the series' scope; y axes start "
            f"at zero; dashed red: a change point (E-divisive, permutation test p &lt; 0.05, median shift ≥ "
            f"{100 * threshold:g}%), with each segment's median; hover a point for its run</div>",
            f"<div class='legend dim'>{legend}</div>"]
    specs = []
    command = None
    for n, (t, cps) in enumerate(zip(trends, points)):
        if t.command != command:
            command = t.command
            body.append(f"<h2>{_e(command_display(command))}</h2>")
        chart = _chart(t, cps, f"trend-{n}")
        if chart is None:
            continue
        specs.append(chart)
        known = sum(1 for v in t.values if math.isfinite(v))
        cp_text = "; ".join(f"run {t.runs[c.index]['seq']}: {units.change(c.change, none='from 0')}" for c in cps)
        body.append(f'<h3>{_e(t.series)} <span class="dim">{_e(t.unit)} · {known} runs'
                    f'{" · change points: " + _e(cp_text) if cps else ""}</span></h3>'
                    f'<div id="trend-{n}" class="trend" data-series="{_e(t.series)}"></div>')
    if not trends:
        body.append("<p>no series to show</p>")
    if hidden:
        body.append(f"<p class='dim hidden-series'>{_e(hidden)}</p>")
    return charts.page(f"counterprof history: {_e(db)}", CSS, "".join(body), specs)
