"""`counterprof report --html`: one self-contained file (inline SVG and CSS, no scripts,
nothing fetched), so it opens anywhere, offline, and can be attached to a ticket.
Formats a Report; computes nothing."""
from __future__ import annotations

import html
import shlex
from typing import TYPE_CHECKING, Any

from ..analysis.classify import Verdict, describe
from ..analysis.report import Report, asked_words
from . import svg
from ..ground import units

if TYPE_CHECKING:
    from ..analysis.roofline import Roofline

COLORS = {"compute": "#2e9e44", "memory": "#b23ab2", "collectives": "#1f8fb5", "host": "#d9a400",
          "unknown": "#9a9a9a", "compute|memory": "#4a6fd6"}
PLOTS = [("cpu_busy", "CPU utilization (CPUs busy)", None), ("ipc", "IPC (instructions per cycle)", None),
         ("gpu_util", "GPU utilization", 1.0), ("gpm_tensor", "tensor-core utilization (GPM)", 1.0),
         ("gpm_dram", "DRAM bandwidth utilization (GPM)", 1.0), ("gpu_idle", "GPU idle share (traces)", 1.0),
         ("neuron_util", "NeuronCore utilization (neuron-monitor)", 1.0)]
W, H, PAD = 900, 120, 40
CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:980px}
h1{font-size:20px} h2{font-size:16px;margin-top:28px} .verdict{font-size:18px;font-weight:600}
.ev{margin:2px 0 2px 12px} .dim{color:#777;font-size:12px} table{border-collapse:collapse;font-size:13px}
td,th{padding:2px 10px 2px 0;text-align:left} svg{display:block;margin:6px 0} .legend span{margin-right:14px}
"""


def _e(x: object) -> str:
    return html.escape(str(x))


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


def _plot(r: Report, key: str, title: str, ymax: float | None) -> str:
    pts = [(p["t_s"], p[key]) for p in r.plot if key in p]
    if not pts:
        return ""
    start, end = r.overall.start_ns, r.overall.end_ns
    assert start is not None and end is not None        # a report with plot points spans the run
    t_end = max((end - start) / 1e9, 1e-9)
    top = ymax or max(1e-9, max(v for _, v in pts) * 1.1)
    x = svg.scale(0.0, t_end, PAD, W - PAD, clamp=True)
    y = svg.scale(0.0, top, 8, H - 8, flip=True, clamp=True)
    half = r.plot_step_s / 2
    band = []
    for w in r.windows:   # the verdict band under the plot
        assert w.start_ns is not None and w.end_ns is not None      # a window's verdict has its times
        x0, x1 = x((w.start_ns - start) / 1e9), x((w.end_ns - start) / 1e9)
        band.append(svg.element("rect", f"<title>{_e(describe(w))}</title>", x=x0, y=H, width=max(x1 - x0, 0.5),
                                height=8, fill=COLORS.get(w.verdict, "#999")))
    marks = []
    for i, rv in enumerate(r.regions[:5]):   # region markers: where each of the top regions ran
        yy = H + 12 + 6 * i
        for a, b in rv.occurrences_s:
            marks.append(svg.element("rect", f"<title>{_e(rv.name)}</title>", x=x(a), y=yy,
                                     width=max(x(b) - x(a), 1.0), height=4, fill="#555"))
        marks.append(svg.text(W - PAD + 4, yy + 4, rv.name[:18], font_size=9))
    axis = (svg.baseline(PAD, W - PAD, H - 8) + svg.text(2, 14, f"{top:.2g}") + svg.text(2, H - 8, "0")
            + svg.text(W - PAD, H + 48, f"{t_end:.1f} s", text_anchor="end"))
    return (f'<h3 class="dim">{_e(title)}</h3><svg class="plot" data-signal="{_e(key)}" width="{W + 60}" '
            f'height="{H + 52}" role="img">{axis}'
            f'{svg.polyline(((x(t + half), y(v)) for t, v in pts), "#333", 1.5)}{"".join(band)}{"".join(marks)}</svg>')


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


def report_html(r: Report, roofline: Roofline | None = None) -> str:
    """roofline: an analysis.roofline.Roofline of the run, drawn after the GPU breakdown."""
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
    plots = [_plot(r, k, t, m) for k, t, m in PLOTS]
    plots = [p for p in plots if p]
    if plots:
        body.append(f"<h2>over time ({r.window_s:g} s windows; band: verdict per window; "
                    f"bars: top regions)</h2>")
        body.extend(plots)
    if r.regions:
        rows = "".join(f"<tr><td>{_e(rv.name)}</td><td>{_e(rv.kind)}</td><td>{rv.count}</td>"
                       f"<td>{units.secs(rv.total_s)}</td><td>{_bar(rv.verdict, 240)}</td>"
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
    if r.summary is not None and r.summary.rows:
        rows = "".join(f"<tr><td>{_e(x.metric)}</td>"
                       f"<td>{'&lt;' + _e(x.status) + '&gt;' if x.value is None else f'{x.value:,.4g}'}"
                       f"</td><td>{_e(x.unit)}</td><td>{_e(x.note)}</td></tr>" for x in r.summary.rows)
        body.append(f"<h2>counters</h2><table>{rows}</table>")
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
        body.append(roofline_section(roofline))
    if r.top_kernels:
        rows = "".join(f"<tr><td>{_e(k['name'][:90])}</td><td>{_e(k['kernel_class'])}</td><td>{k['count']}</td>"
                       f"<td>{units.ns_as_ms(k['total_ns'])}</td><td>{units.points(k['share_pct'])}</td></tr>"
                       for k in r.top_kernels)
        body.append(f"<h2>top kernels</h2><table>{rows}</table>")
    if r.next_steps:
        body.append("<h2>what to look at next</h2>" + "".join(f"<div class='ev'>→ {_e(s)}</div>" for s in r.next_steps))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>counterprof: {_e(r.run.get('id'))}</title>"
            f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>\n")
