"""The HTML pages' charts: uPlot (MIT, vendored in assets/ with its license, ~51 KB minified)
and counterprof's own drawing over it (assets/charts.js), inlined into each page with the
charts' data as JSON, so a page stays one file that opens offline and fetches nothing.

Why uPlot: one 51 KB file that draws a 200,000-point timeline on a canvas in milliseconds, with
cursor sync and drag-to-zoom built in; Vega-Lite (vega + vega-lite + vega-embed) is ~830 KB of
JavaScript per page and compiles a spec at load (docs/PERFORMANCE.md has the figures).

After drawing, a page writes what it drew into #cp-layout as JSON (each chart's series,
points, tick labels and any overlapping text boxes): the tests read it back from chromium."""
from __future__ import annotations

import json
from functools import cache
from importlib.resources import files
from typing import Any

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf"]

CSS = """
.cp-chart{margin:2px 0} .cp-panel{margin:10px 0 4px;position:relative}
.cp-title{font-size:12px;color:#555;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.cp-label{position:absolute;font-size:11px;line-height:14px;white-space:nowrap;pointer-events:none}
.cp-lane-name{overflow:hidden;text-overflow:ellipsis;color:#333;pointer-events:auto}
.cp-label.cp{color:#d62728} .cp-op{color:#222;background:rgba(255,255,255,.7)} .cp-roof{font-weight:600}
.cp-tip{position:absolute;z-index:10;background:#fff;border:1px solid #bbb;border-radius:3px;padding:4px 7px;
font-size:12px;box-shadow:0 1px 4px rgba(0,0,0,.2);pointer-events:none;max-width:520px}
.cp-swatch{display:inline-block;width:9px;height:9px;margin-right:5px;border-radius:2px}
.cp-hint{color:#777;font-size:12px} .u-legend{font-size:11px} .u-legend th{font-weight:normal}
.ellip{display:inline-block;max-width:260px;overflow:hidden;text-overflow:ellipsis;white-space:nowrap;
vertical-align:bottom}
"""


@cache
def asset(name: str) -> str:
    return files("counterprof.render").joinpath("assets").joinpath(name).read_text(encoding="utf-8")


def data_json(value: Any) -> str:
    """JSON safe inside a <script> element: no '<', '>' or '&' in it as themselves (a name
    holding "</script>" stays data)."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def finite(v: float | None) -> float | None:
    """A value JSON can carry: None for NaN and infinities (a gap in a line)."""
    return None if v is None or v != v or v in (float("inf"), float("-inf")) else float(v)


def page(title: str, css: str, body: str, charts: list[dict[str, Any]]) -> str:
    """One self-contained page: the body, then uPlot, the charts' data and the code that draws
    them (at the end of the body, so the elements they draw into exist)."""
    scripts = ""
    if charts:
        scripts = (f"<pre id='cp-layout' hidden></pre>"
                   f"<script type='application/json' id='cp-data'>{data_json({'charts': charts})}</script>"
                   f"<script>{asset('uPlot.iife.min.js')}</script><script>{asset('charts.js')}</script>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
            f"<style>{asset('uPlot.min.css') if charts else ''}{css}{CSS}</style></head>"
            f"<body>{body}{scripts}</body></html>\n")
