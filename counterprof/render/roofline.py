"""`counterprof roofline` and `counterprof calibrate` output: terminal tables and a
self-contained HTML page (render/charts.py: uPlot and the data inline, nothing fetched).
Formats; computes nothing."""
from __future__ import annotations

import html
import math
from typing import IO, Any

from rich.console import Console
from rich.table import Table

from ..analysis.roofline import MISFIT, Roofline, ceilings_words
from ..analysis.roofline_run import TODAYS
from ..ground.thresholds import value
from ..ground.units import duration, ratio, seconds, share, si

BOUND_COLORS = {"compute": "#2e9e44", "memory": "#b23ab2", None: "#9a9a9a"}


def pct(x: float | None) -> str:
    return share(x, 1)       # roofline shares and fractions of a peak: one decimal


def dims_text(dims: Any, width: int = 44) -> str:
    """Input Dims without the empty (scalar) entries, shortened."""
    if not isinstance(dims, list):
        return str(dims)
    text = ", ".join("x".join(map(str, d)) if isinstance(d, list) and d and all(isinstance(v, int) for v in d)
                     else str(d) for d in dims if d != [])
    return text if len(text) <= width else text[: width - 1] + "…"


def _table(title: str, *columns: str) -> Table:
    t = Table(title=title, title_justify="left", title_style="bold", box=None, pad_edge=False)
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i < 2 else "right", no_wrap=i != 0, overflow="fold")
    return t


# ---- calibrate -------------------------------------------------------------------------------

def ceilings_table(docs: dict[str, dict[str, Any]], out: IO[str]) -> None:
    console = Console(file=out, width=120, highlight=False)
    for device, doc in docs.items():
        ds = doc.get("datasheet") or {}
        sheet = ds.get("peaks") or {}
        t = _table(f"{device}: {doc.get('device_name', '')} ({doc.get('host')}, "
                   f"{'quick' if doc.get('quick') else 'full'}, {doc.get('wall_s', '?')} s)",
                   "ceiling", "detail", "measured", "spread", "repeats", "datasheet", "measured/datasheet")
        for dtype, m in (doc.get("matmul") or {}).items():
            shape = "x".join(map(str, m.get("best_shape", [])))
            ref = sheet.get(dtype)
            t.add_row(f"matmul {dtype}", f"best of sweep at {shape}", si(m["flops_per_s"], "FLOP/s"),
                      pct(m.get("spread")), str(m.get("repeats", "")), si(ref, "FLOP/s"),
                      pct(m["flops_per_s"] / ref) if ref else "-")
        mem = doc.get("memory") or {}
        for kind in ("copy", "triad", "d2d"):
            if kind in mem:
                m = mem[kind]
                detail = (f"{mem.get('array_bytes', m.get('bytes', 0)) >> 20} MiB arrays" if kind != "d2d"
                          else "device to device")
                if "rep_s" in m:           # cpu_stream's figure: the best repetition, not the median
                    detail += f", best of {m.get('repeats', '?')} x {1000 * m['rep_s']:.0f} ms"
                ref = ds.get("bandwidth_bytes_per_s")
                t.add_row(f"memory {kind}", detail, si(m["bytes_per_s"], "B/s"), pct(m.get("spread")),
                          str(m.get("repeats", "")), si(ref, "B/s") if ref else "-",
                          pct(m["bytes_per_s"] / ref) if ref else "-")
        for kind, m in (doc.get("host_device") or {}).items():
            t.add_row(kind.replace("_", " "), "host <-> device", si(m["bytes_per_s"], "B/s"), pct(m.get("spread")),
                      str(m.get("repeats", "")), "-", "-")
        for pair, m in (doc.get("p2p") or {}).items():
            if isinstance(m, dict) and "bytes_per_s" in m:
                t.add_row(f"p2p {pair}", "peer copy", si(m["bytes_per_s"], "B/s"), pct(m.get("spread")),
                          str(m.get("repeats", "")), "-", "-")
        for backend, c in (doc.get("collectives") or {}).items():
            for coll in ("all_reduce", "all_gather", "reduce_scatter"):
                m = c.get(coll)
                if not isinstance(m, dict) or "busbw_bytes_per_s" not in m:
                    continue
                t.add_row(f"{backend} {coll}", f"busbw, {c.get('world_size')} ranks, {m['bytes'] >> 20} MiB",
                          si(m["busbw_bytes_per_s"], "B/s"), pct(m.get("spread")), str(m.get("repeats", "")),
                          "-", "-")
                t.add_row(f"{coll} latency", f"{backend}, {m['latency_bytes']} B message",
                          seconds(m['latency_s']), "", "", "-", "-")
        console.print(t)
        load = doc.get("load")
        if isinstance(load, dict):
            from ..calibrate.load import words
            console.print(f"  while measuring: {words(load)}"
                          + ("  (saved anyway: --force)" if load.get("saved_anyway") else ""),
                          style="yellow" if load.get("loaded") else "dim")
        for what, why in (doc.get("skipped") or {}).items():
            console.print(f"  skipped {what}: {why}", style="dim")
        for backend, c in (doc.get("collectives") or {}).items():
            for coll, m in c.items():
                if isinstance(m, dict) and "skipped" in m:
                    console.print(f"  skipped {backend} {coll}: {m['skipped']}", style="dim")
        if doc.get("kind") == "cpu":
            console.print("  CPUs have no datasheet figure here: the measured ceilings are the roofs.", style="dim")
        console.print()


# ---- roofline: text ----------------------------------------------------------------------------

def _ceilings_line(r: Roofline) -> str:
    c = r.ceilings
    if not c:
        return "ceilings: none (run `counterprof calibrate`, or pass --ceilings FILE)"
    peaks = ", ".join(f"{k} {si(v, 'FLOP/s')}" for k, v in (c.get("peaks") or {}).items())
    return (f"ceilings: {c.get('source', '?')}, {ceilings_words(c)}: {peaks}; "
            f"memory {si(c.get('bandwidth_bytes_per_s'), 'B/s')}")


def above_peak(x: float | None) -> str:
    """What follows a fraction of a ceiling above 1: never a plain fact."""
    if x is None or x <= 1:
        return ""
    if x <= value("roofline_over_roof"):
        return " (above the peak, within the spread of a calibration)"
    return " (above the peak: the ceilings do not fit this run)"


def _mfu_words(m: dict[str, Any]) -> str:
    parts = []
    for key, what in (("measured", "the measured peak"), ("datasheet", "the datasheet's")):
        peak = m[f"peak_{key}_flops_per_s"]
        x = m[f"mfu_{key}"]
        parts.append(f"{pct(x)} of {what} ({si(peak, 'FLOP/s')}){above_peak(x)}" if peak
                     else f"no {key} {m['dtype']} peak")
    return ", ".join(parts)


def caveats(notes: list[str]) -> list[str]:
    """The notes a reader must see before any figure: the ceilings do not fit the run, or they
    are this host's today and not the run's own."""
    return [n for n in notes if n.startswith(MISFIT) or n.startswith(TODAYS)]


def _of_roof(x: float | None) -> str:
    """A fraction of the roof; above it, marked (OF_ROOF_MARKS says what the marks mean)."""
    if x is None or x <= 1:
        return pct(x)
    return pct(x) + (" !" if x > value("roofline_over_roof") else " ~")


def of_roof_marks() -> str:
    return (f"of roof: ! above {pct(value('roofline_over_roof'))} of its ceiling; ~ above 100%, within the "
            "spread of a calibration")


def roofline_text(r: Roofline, out: IO[str], top: int = 15) -> None:
    console = Console(file=out, width=160, highlight=False)
    console.print(f"[bold]roofline[/bold]: {r.device}, op time = {r.basis}, {duration(r.total_time_ns)} in ops; "
                  f"{pct(r.modelled_share)} of it with a cost model")
    console.print(_ceilings_line(r))
    for n in caveats(r.notes):
        console.print(f"! {n}", style="bold yellow")
    if r.ops:
        t = _table(f"top ops by time (of {len(r.ops)} op+shape rows)", "op", "input dims", "dtype", "calls",
                   "time", "share", "FLOP/s", "B/s", "FLOP/B", "ridge", "bound", "of roof")
        for o in r.ops[:top]:
            t.add_row(o.name, dims_text(o.input_dims), o.dtype or "-", str(o.calls), duration(o.time_ns),
                      pct(o.time_ns / r.total_time_ns if r.total_time_ns else None),
                      si(o.achieved_flops_per_s), si(o.achieved_bytes_per_s),
                      ratio(o.intensity), ratio(o.ridge), o.bound or "-", _of_roof(o.roof_fraction))
        console.print(t)
        if any((o.roof_fraction or 0) > 1 for o in r.ops[:top]):
            console.print(of_roof_marks(), style="dim")
    u = r.unmodelled
    if u.get("ops"):
        names = "; ".join(f"{x['name']} {pct(x['share'])} ({x['why']})" for x in u["ops"][:5])
        console.print(f"without a roofline: {pct(u.get('share'))} of op time: {names}")
    if r.mfu:
        m = r.mfu
        console.print(f"MFU ({m['dtype']}, median of {len(m['steps'])} step(s)): "
                      f"{si(m['flops_per_s'], 'FLOP/s')} = " + _mfu_words(m))
    for n in r.notes:
        if n not in caveats([n]):
            console.print(n, style="dim")
    for miss in r.missing:
        console.print(f"missing: {miss}")
    console.print("bytes are the tensors read and written once each: a lower bound on traffic "
                  "(intensity an upper bound)", style="dim")


# ---- roofline: HTML ----------------------------------------------------------------------------

W, H = 900, 480
LABELLED = 10            # the ops with the most time get their name beside their dot; every dot has a tooltip
CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:20px} h2{font-size:16px;margin-top:28px} .dim{color:#777;font-size:12px}
table{border-collapse:collapse;font-size:12px} td,th{padding:2px 10px 2px 0;text-align:left}
td.n{text-align:right} svg{display:block;margin:6px 0}
"""


def _e(x: object) -> str:
    return html.escape(str(x))


def _short(name: str, width: int = 28) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def roofline_chart(r: Roofline, chart_id: str = "roofline") -> dict[str, Any] | None:
    """The roofline as charts.js draws it, log-log: x arithmetic intensity (FLOP/B), y FLOP/s;
    the memory roof and each dtype's peak as lines; each op+shape a dot, area proportional to
    its time, coloured by its bound, the LABELLED largest named, every one with a tooltip (op,
    shape, dtype, calls, time, FLOPs, bytes, intensity, FLOP/s, bound). None: nothing to draw."""
    pts = sorted(((o, o.intensity, o.achieved_flops_per_s) for o in r.ops
                  if o.intensity and o.achieved_flops_per_s), key=lambda p: -p[0].time_ns)
    c = r.ceilings or {}
    peaks = {k: float(v) for k, v in (c.get("peaks") or {}).items() if v}
    bw = c.get("bandwidth_bytes_per_s")
    xs = [x for _, x, _ in pts] + ([p / bw for p in peaks.values()] if bw else [])
    ys = [y for _, _, y in pts] + list(peaks.values())
    if not xs or not ys:
        return None
    x0, x1 = 10 ** math.floor(math.log10(min(xs)) - 0.3), 10 ** math.ceil(math.log10(max(xs)) + 0.3)
    y0, y1 = 10 ** math.floor(math.log10(min(ys)) - 0.3), 10 ** math.ceil(math.log10(max(ys)) + 0.2)
    roofs: list[dict[str, Any]] = []
    roof_labels: list[dict[str, Any]] = []
    if bw:
        top = max(peaks.values()) if peaks else y1
        xr = min(top / bw, x1)
        roofs.append({"name": "memory", "color": BOUND_COLORS["memory"], "x": [x0, xr], "y": [bw * x0, bw * xr]})
        xa = max(x0, y0 / bw)
        roof_labels.append({"text": f"memory {si(bw, 'B/s')}", "x": xa * 1.3, "y": bw * xa * 1.3})
        same: dict[float, list[str]] = {}       # dtypes with one peak share a line and a label
        for k, p in peaks.items():
            same.setdefault(p, []).append(k)
        for p, names in sorted(same.items()):
            ridge = p / bw
            roofs.append({"name": ", ".join(names), "color": BOUND_COLORS["compute"],
                          "x": [max(ridge, x0), x1], "y": [p, p]})
            roof_labels.append({"text": f"{', '.join(names)} peak {si(p, 'FLOP/s')}, ridge {ratio(ridge)} FLOP/B",
                                "x": max(ridge, x0) * 1.2, "y": p})
    total = r.total_time_ns or 1
    points = []
    for o, intensity, flops_per_s in pts:
        points.append({
            "x": intensity, "y": flops_per_s, "r": round(3 + 22 * math.sqrt(o.time_ns / total), 2),
            "color": BOUND_COLORS.get(o.bound), "label": _short(o.name),
            "tip": [f"{o.name} {o.dtype or ''}".strip(), f"input dims {dims_text(o.input_dims, 80)}",
                    f"{o.calls} calls, {duration(o.time_ns)} ({pct(o.time_ns / total)} of op time)",
                    f"{si(o.flops, 'FLOP')}, {si(o.bytes, 'B')} → {ratio(intensity)} FLOP/B",
                    f"{si(flops_per_s, 'FLOP/s')}, {si(o.achieved_bytes_per_s, 'B/s')}",
                    f"{o.bound or 'no'} bound, {_of_roof(o.roof_fraction)} of roof"]})
    return {"kind": "roofline", "id": chart_id, "width": W, "height": H, "x0": x0, "x1": x1, "y0": y0, "y1": y1,
            "x_title": "arithmetic intensity (FLOP/byte, bytes a lower bound)", "roofs": roofs,
            "roof_labels": roof_labels, "points": points, "labelled": LABELLED}


def roofline_section(r: Roofline, top: int = 25, chart_id: str = "roofline") -> tuple[str, dict[str, Any] | None]:
    """The roofline as an HTML fragment (the plot's element, the ceilings, the top ops, MFU, what
    is missing) and the plot's chart for charts.page (None: nothing to plot)."""
    chart = roofline_chart(r, chart_id)
    rows = "".join(
        f"<tr><td>{_e(o.name)}</td><td>{_e(dims_text(o.input_dims, 60))}</td><td>{_e(o.dtype or '-')}</td>"
        f"<td class=n>{o.calls}</td><td class=n>{duration(o.time_ns)}</td>"
        f"<td class=n>{pct(o.time_ns / r.total_time_ns if r.total_time_ns else None)}</td>"
        f"<td class=n>{si(o.achieved_flops_per_s, 'FLOP/s')}</td><td class=n>{si(o.achieved_bytes_per_s, 'B/s')}</td>"
        f"<td class=n>{ratio(o.intensity)}</td>"
        f"<td style='color:{BOUND_COLORS.get(o.bound)}'>{_e(o.bound or '-')}</td>"
        f"<td class=n>{_e(_of_roof(o.roof_fraction))}</td></tr>"
        for o in r.ops[:top])
    plot = (f"<div class='cp-hint'>dots: one op and input shape each, area by time, colour by bound "
            f"(green compute, purple memory, grey no ceiling); the {LABELLED} largest named; hover any dot "
            f"for its figures</div><div id='{_e(chart_id)}' class='roofline-plot'></div>" if chart is not None
            else "<p class='dim'>nothing to draw: no op with FLOPs and time</p>")
    parts = [f"<h2>roofline ({_e(r.device)}, op time = {_e(r.basis)})</h2>",
             f"<div class='dim'>{_e(_ceilings_line(r))}</div>",
             *(f"<p class='caveat' style='background:#fff3cd;border-left:4px solid #e0a800;padding:6px 10px'>"
               f"<b>{_e(n)}</b></p>" for n in caveats(r.notes)),
             plot,
             "<table><tr><th>op</th><th>input dims</th><th>dtype</th><th>calls</th><th>time</th><th>share</th>"
             f"<th>FLOP/s</th><th>B/s</th><th>FLOP/B</th><th>bound</th><th>of roof</th></tr>{rows}</table>",
             *([f"<div class='dim'>{_e(of_roof_marks())}</div>"]
               if any((o.roof_fraction or 0) > 1 for o in r.ops[:top]) else [])]
    u = r.unmodelled
    if u.get("ops"):
        parts.append("<div class='dim'>without a roofline: " + _e(f"{pct(u.get('share'))} of op time: ") +
                     "; ".join(_e(f"{x['name']} {pct(x['share'])} ({x['why']})") for x in u["ops"][:8]) + "</div>")
    if r.mfu:
        m = r.mfu
        parts.append(f"<p>MFU ({_e(m['dtype'])}, median of {len(m['steps'])} step(s)): "
                     f"{_e(si(m['flops_per_s'], 'FLOP/s'))} = {_e(_mfu_words(m))}</p>")
    parts.extend(f"<div class='dim'>{_e(n)}</div>" for n in r.notes if n not in caveats([n]))
    parts.extend(f"<div>missing: {_e(x)}</div>" for x in r.missing)
    parts.append("<div class='dim'>bytes are the tensors read and written once each: a lower bound on "
                 "traffic (intensity an upper bound)</div>")
    return "".join(parts), chart


def roofline_html(r: Roofline, title: str) -> str:
    from .charts import page
    section, chart = roofline_section(r)
    return page(_e(title), CSS, f"<h1>{_e(title)}</h1>{section}", [chart] if chart is not None else [])
