"""`counterprof report --html`: one self-contained file (CSS, uPlot and the charts' data
inline, nothing fetched), so it opens anywhere, offline, and can be attached to a ticket.
The timeline: the report's signals and, given the run's buckets, every collector's series,
one panel per collector and unit, steps as bands, the verdict per window and the regions as
lanes; hover for values, drag to zoom (all panels together), double-click to zoom out.
Formats a Report; computes nothing."""
from __future__ import annotations

import html
import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..analysis.classify import Verdict, describe
from ..analysis.report import Report, asked_words
from . import charts, svg
from ..ground import units
from .summary import _cells

if TYPE_CHECKING:
    import pyarrow as pa

    from ..analysis.roofline import Roofline

COLORS = {"compute": "#2e9e44", "memory": "#b23ab2", "collectives": "#1f8fb5", "host": "#d9a400",
          "unknown": "#9a9a9a", "compute|memory": "#4a6fd6"}
# the report's own signals: (key, title, unit the page draws it in, top of the y axis)
PLOTS = [("cpu_busy", "CPU utilization (CPUs busy)", "CPUs", None),
         ("ipc", "IPC (instructions per cycle)", "ratio", None),
         ("gpu_util", "GPU utilization", "share", 1.0), ("gpm_tensor", "tensor-core utilization (GPM)", "share", 1.0),
         ("gpm_dram", "DRAM bandwidth utilization (GPM)", "share", 1.0),
         ("gpu_idle", "GPU idle share (traces)", "share", 1.0),
         ("neuron_util", "NeuronCore utilization (neuron-monitor)", "share", 1.0)]
W = 900
MAX_LANES = 12           # regions drawn as lanes under the timeline (the table lists them all)
CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:980px}
h1{font-size:20px} h2{font-size:16px;margin-top:28px} .verdict{font-size:18px;font-weight:600}
.ev{margin:2px 0 2px 12px} .dim{color:#777;font-size:12px} table{border-collapse:collapse;font-size:13px}
td,th{padding:2px 10px 2px 0;text-align:left} td.n{text-align:right;font-variant-numeric:tabular-nums}
svg{display:block;margin:6px 0} .legend span{margin-right:14px}
"""


def _e(x: object) -> str:
    return html.escape(str(x))


def _cut(text: str, width: int = 260) -> str:
    """Text in a box that cuts it with an ellipsis; the whole text in its title."""
    return f"<span class='ellip' style='max-width:{width}px' title='{_e(text)}'>{_e(text)}</span>"


def _last_at(b: dict[str, Any] | None) -> str:
    return f"{b['last']} of {b['calls']}" if b else "-"


def _bar(v: Verdict, width: int = W) -> str:
    x, out = 0.0, []
    for cls, share in sorted(v.shares.items(), key=lambda kv: kv[1], reverse=True):
        w = share * width
        if w >= 0.5:
            out.append(svg.element("rect", f"<title>{_e(cls)} {units.share(share, 1)}</title>", x=x, y=0, width=w,
                                   height=18, fill=COLORS.get(cls, "#999")))
        x += w
    return f'<svg class="bar" width="{width}" height="18" role="img">{"".join(out)}</svg>'


def _signal_panels(r: Report) -> list[dict[str, Any]]:
    panels = []
    for key, title, unit, top in PLOTS:
        pts = [(p["t_s"] + r.plot_step_s / 2, p[key]) for p in r.plot if key in p]
        if pts:
            panels.append({"id": f"signal-{key}", "signal": key, "title": title, "unit": unit, "ymax": top,
                           "x": [round(t, 6) for t, _ in pts],
                           "series": [{"label": key, "color": "#333", "values": [charts.finite(v) for _, v in pts]}]})
    return panels


def _collector_panels(buckets: pa.Table, catalog: Mapping[str, Mapping[str, Any]], start_ns: int,
                      bucket_ns: int) -> tuple[list[dict[str, Any]], list[str]]:
    from .timeline import collector_panels
    out, zero = [], []
    for p in collector_panels(buckets, catalog, start_ns, bucket_ns):
        zero.extend(p.flat_zero)
        if not p.series:
            continue
        out.append({"id": f"{p.source}-{p.unit}", "title": f"{p.source} · {p.unit}"
                    + (" (rates)" if p.unit in ("CPUs", "bytes/s") or p.unit.endswith("/s") else ""),
                    "unit": p.unit, "ymax": None, "x": p.x,
                    "series": [{"label": s.metric, "color": charts.PALETTE[i % len(charts.PALETTE)],
                                "values": s.values} for i, s in enumerate(p.series)]})
    return out, zero


def _lanes(r: Report, start: int) -> list[dict[str, Any]]:
    lanes: list[dict[str, Any]] = []
    spans = []
    for w in r.windows:      # the verdict per window
        assert w.start_ns is not None and w.end_ns is not None      # a window's verdict has its times
        spans.append([round((w.start_ns - start) / 1e9, 6), round((w.end_ns - start) / 1e9, 6),
                      COLORS.get(w.verdict, "#999"), describe(w)])
    if spans:
        lanes.append({"name": "verdict", "title": "verdict per window", "spans": spans})
    for rv in r.regions[:MAX_LANES]:
        lanes.append({"name": rv.name, "title": f"{rv.name} ({rv.kind}, {rv.count} times, "
                      f"{units.duration(rv.total_s * 1e9)} in all)",
                      "color": "#555" if rv.kind != "step" else "#1f77b4",
                      "spans": [[round(a, 6), round(b, 6)] for a, b in rv.occurrences_s]})
    return lanes


def _timeline(r: Report, buckets: pa.Table | None, catalog: Mapping[str, Mapping[str, Any]] | None,
              bucket_ns: int | None) -> tuple[dict[str, Any] | None, list[str]]:
    start, end = r.overall.start_ns, r.overall.end_ns
    if start is None or end is None:
        return None, []
    panels = _signal_panels(r)
    zero: list[str] = []
    if buckets is not None and catalog is not None and bucket_ns:
        more, zero = _collector_panels(buckets, catalog, start, bucket_ns)
        panels += more
    if not panels:
        return None, zero
    steps = [[round(a, 6), round(b, 6)] for rv in r.regions if rv.kind == "step" for a, b in rv.occurrences_s]
    return {"kind": "timeline", "id": "timeline", "width": W, "t_end": round(max((end - start) / 1e9, 1e-6), 6),
            "steps": sorted(steps), "lanes": _lanes(r, start), "panels": panels}, zero


def _evidence(v: Verdict) -> str:
    out = []
    for e in v.evidence:
        extra = f" <span class='dim'>[threshold {e.threshold:g}; {_e(e.source)}]</span>" if e.threshold is not None \
            else (f" <span class='dim'>[{_e(e.source)}]</span>" if e.source else "")
        out.append(f"<div class='ev'>• {_e(e.text)}{extra}</div>")
    for e in v.secondary:
        out.append(f"<div class='ev dim'>◦ also: {_e(e.text)}</div>")
    if v.missing and v.verdict == "unknown":
        out.append(f"<div class='ev'><i>→ would decide it: {_e('; '.join(v.missing))}</i></div>")
    return "".join(out)


def report_html(r: Report, roofline: Roofline | None = None, buckets: pa.Table | None = None,
                catalog: Mapping[str, Mapping[str, Any]] | None = None, bucket_ns: int | None = None) -> str:
    """roofline: an analysis.roofline.Roofline of the run, drawn after the GPU breakdown.
    buckets, catalog, bucket_ns: the run's per-metric time buckets (ReportInputs.buckets), its
    catalog and the buckets' width: with them the timeline has every collector's series, without
    them only the report's signals."""
    o = r.overall
    cmd = shlex.join(r.run.get("command") or []) or "(no command)"
    legend = "".join(f"<span><svg width='10' height='10' style='display:inline'><rect width='10' height='10' "
                     f"fill='{c}'/></svg> {_e(k)}</span>" for k, c in COLORS.items())
    body = [f"<h1>counterprof report: {_e(r.run.get('id'))}</h1><div class='dim'>{_e(cmd)}</div>",
            f"<p class='verdict' style='color:{COLORS.get(o.verdict, '#333')}'>{_e(describe(o))}</p>",
            _bar(o), f"<div class='legend dim'>{legend}</div>", _evidence(o)]
    if r.roofline:            # the roofline's ceilings do not fit the run (or are not its own): first
        from .roofline import caveats
        body.extend(f"<p class='caveat' style='background:#fff3cd;border-left:4px solid #e0a800;"
                    f"padding:6px 10px'>{_e(n)}</p>" for n in caveats(r.roofline.get("notes") or []))
    timeline, zero = _timeline(r, buckets, catalog, bucket_ns)
    specs = []
    if timeline is not None:
        specs.append(timeline)
        body.append(f"<h2>over time</h2><div class='cp-hint'>grey bands: steps; lanes: the verdict per "
                    f"{r.window_s:g} s window and the top regions. Hover for values, drag to zoom (every "
                    "panel), double-click to zoom out.</div><div id='timeline'>"
                    + "".join(f'<div class="cp-panel" id="panel-{_e(p["id"])}"'
                              + (f' data-signal="{_e(p["signal"])}"' if p.get("signal") else "") + "></div>"
                              for p in timeline["panels"]) + "</div>")
        if zero:
            body.append(f"<div class='dim'>zero throughout (not drawn): {_e(', '.join(sorted(zero)))}</div>")
    if r.regions:
        rows = "".join(f"<tr><td>{_cut(rv.name)}</td><td>{_e(rv.kind)}</td><td class=n>{rv.count}</td>"
                       f"<td class=n>{units.duration(rv.total_s * 1e9)}</td><td>{_bar(rv.verdict, 240)}</td>"
                       f"<td>{_e(describe(rv.verdict))}</td></tr>"
                       for rv in r.regions)
        body.append("<h2>regions</h2><table><tr><th>region</th><th>kind</th><th>count</th><th>time</th>"
                    f"<th>breakdown</th><th>verdict</th></tr>{rows}</table>")
    if r.rank_verdicts or r.rank_analysis:
        figs = {f["rank"]: f for f in (r.rank_analysis or {}).get("ranks", [])}
        verdicts = {int(v.scope.split()[-1]): v for v in r.rank_verdicts}
        straggler = (r.rank_analysis or {}).get("straggler")
        late = {b["rank"]: b for b in (r.collective_calls or {}).get("by_rank", [])}
        rows = "".join(
            f"<tr><td>{rank}{' ◀ straggler' if rank == straggler else ''}</td>"
            f"<td>{_bar(verdicts[rank], 200) if rank in verdicts else ''}</td>"
            f"<td>{_e(describe(verdicts[rank])) if rank in verdicts else '-'}</td>"
            f"<td>{units.ms(figs.get(rank, {}).get('step_mean_s'))}</td>"
            f"<td>{figs.get(rank, {}).get('slowest_in', '-')}</td>"
            f"<td>{units.ms(figs.get(rank, {}).get('collective_s_per_step'))}</td>"
            f"<td>{units.ms(figs.get(rank, {}).get('waited_s_per_step'))}</td>"
            f"<td>{_last_at(late.get(rank))}</td></tr>"
            for rank in sorted(set(figs) | set(verdicts)))
        body.append("<h2>ranks</h2><table><tr><th>rank</th><th>breakdown</th><th>verdict</th><th>step (mean)</th>"
                    "<th>straggler in</th><th>collectives/step</th><th>waited/step</th><th>last at calls</th>"
                    f"</tr>{rows}</table>")
        notes = (r.rank_analysis or {}).get("notes", []) + r.rank_notes
        body.extend(f"<div class='ev'>{_e(n)}</div>" for n in notes)
    if r.asked_windows:
        body.append("<h2>windows asked for (counterprof trace)</h2>")
        body.extend(f"<div class='ev'>{_e(asked_words(a))}</div>" for a in r.asked_windows)
    rows = "".join(f"<tr><td>{_e(n)}</td><td>{_e(c.get('status'))}</td><td>{_e(c.get('reason', ''))}</td></tr>"
                   for n, c in r.collectors.items())
    body.append(f"<h2>collectors</h2><table>{rows}</table>")
    if r.summary is not None and r.summary.rows:      # as the text report writes them (perf stat's way)
        cells = [_cells(x, r.summary.runs) for x in r.summary.rows]
        rows = "".join(f"<tr><td class=n>{_e(num)}</td><td>{_e(unit)}</td><td>{_e(name)}</td>"
                       f"<td class=dim>{_e(note[0].removeprefix('#').strip())}</td></tr>"
                       for (num, _), (unit, _), (name, _), note in cells)
        body.append(f"<h2>counters</h2><table class='counters'>{rows}</table>")
    if r.gpu_breakdown:
        tm = r.gpu_breakdown["temporal"]
        bars = Verdict("gpu", "unknown", "gpu", shares={"host": tm["idle_pct"] / 100,
                                                       "compute": tm["compute_pct"] / 100,
                                                       "unknown": tm["non_compute_pct"] / 100})
        body.append("<h2>GPU time (temporal breakdown)</h2>" + _bar(bars) +
                    f"<div class='dim'>idle {units.points(tm['idle_pct'])} · "
                    f"compute {units.points(tm['compute_pct'])} · "
                    f"non-compute {units.points(tm['non_compute_pct'])}</div>")
    if roofline is not None:
        from .roofline import roofline_section
        section, chart = roofline_section(roofline, chart_id="roofline")
        body.append(section)
        if chart is not None:
            specs.append(chart)
    if r.top_kernels:
        rows = "".join(f"<tr><td>{_cut(k['name'], 520)}</td><td>{_e(k['kernel_class'])}</td>"
                       f"<td class=n>{k['count']}</td><td class=n>{units.ns_as_ms(k['total_ns'])}</td>"
                       f"<td class=n>{units.points(k['share_pct'])}</td></tr>"
                       for k in r.top_kernels)
        body.append(f"<h2>top kernels</h2><table>{rows}</table>")
    if r.next_steps:
        body.append("<h2>what to look at next</h2>" + "".join(f"<div class='ev'>→ {_e(s)}</div>" for s in r.next_steps))
    return charts.page(f"counterprof: {_e(r.run.get('id'))}", CSS, "".join(body), specs)
