"""`counterprof roofline` and `counterprof calibrate` output: terminal tables and a
self-contained HTML page (inline SVG, no scripts). Formats; computes nothing."""
from __future__ import annotations

import html
import math
from typing import IO, Any

from rich.console import Console
from rich.table import Table

from ..analysis.roofline import MISFIT, Roofline, ceilings_words
from ..analysis.roofline_run import TODAYS
from ..ground.thresholds import value
from . import svg
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


# ---- roofline: HTML/SVG ------------------------------------------------------------------------

W, H, PADL, PADB, PADT, PADR = 820, 460, 70, 40, 16, 150
CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:20px} h2{font-size:16px;margin-top:28px} .dim{color:#777;font-size:12px}
table{border-collapse:collapse;font-size:12px} td,th{padding:2px 10px 2px 0;text-align:left}
td.n{text-align:right} svg{display:block;margin:6px 0}
"""


def _e(x: object) -> str:
    return html.escape(str(x))


def roofline_svg(r: Roofline) -> str:
    """Log-log: x arithmetic intensity (FLOP/B), y FLOP/s; the memory roof and each dtype's
    peak as lines; each op+shape a dot, area proportional to its time, colored by its bound."""
    # (op, intensity, FLOP/s) of the ops with both
    pts = [(o, o.intensity, o.achieved_flops_per_s) for o in r.ops
           if o.intensity and o.achieved_flops_per_s]
    c = r.ceilings or {}
    peaks = {k: float(v) for k, v in (c.get("peaks") or {}).items() if v}
    bw = c.get("bandwidth_bytes_per_s")
    xs = [x for _, x, _ in pts] + ([p / bw for p in peaks.values()] if bw else [])
    ys = [y for _, _, y in pts] + list(peaks.values())
    if not xs or not ys:
        return "<p class='dim'>nothing to draw: no op with FLOPs and time</p>"
    X, Y, out, (x0, x1, y0, y1) = svg.log_log_axes(
        xs, ys, (PADL, PADT, W - PADR, H - PADB), (lambda v: f"{v:g}", si),
        ("arithmetic intensity (FLOP/byte, bytes a lower bound)", "FLOP/s"))
    if bw:
        top = max(peaks.values()) if peaks else y1
        xr = min(top / bw, x1)
        out.append(svg.line(X(x0), Y(max(bw * x0, y0)), X(xr), Y(min(bw * xr, y1)),
                            f'<title>memory {si(bw, "B/s")}</title>', cls="roof memory", stroke="#b23ab2",
                            stroke_width=2))
        out.append(svg.text(X(x0) + 6, Y(max(bw * x0, y0)) - 6, f'memory {si(bw, "B/s")}', fill="#b23ab2"))
        same: dict[float, list[str]] = {}       # dtypes with one peak share a line and a label
        for k, p in peaks.items():
            same.setdefault(p, []).append(k)
        for p, names in sorted(same.items()):
            k = ", ".join(names)
            ridge = p / bw
            title = f'<title>{_e(k)} peak {si(p, "FLOP/s")}, ridge {ratio(ridge)} FLOP/B</title>'
            out.append(svg.element("line", title,
                                   cls="roof compute", data_dtype=_e(" ".join(names)), x1=X(max(ridge, x0)),
                                   y1=Y(p), x2=X(x1), y2=Y(p), stroke="#2e9e44", stroke_width=2)
                       + svg.text(W - PADR + 4, Y(p) + 3, f'{k} {si(p, "FLOP/s")}', fill="#2e9e44"))
    total = r.total_time_ns or 1
    for o, intensity, flops_per_s in sorted(pts, key=lambda p: -p[0].time_ns):
        rad = 3 + 22 * math.sqrt(o.time_ns / total)
        tip = (f'{o.name} {dims_text(o.input_dims, 80)} {o.dtype or ""}: {o.calls} calls, {duration(o.time_ns)} '
               f'({pct(o.time_ns / total)}), {si(flops_per_s, "FLOP/s")}, {ratio(intensity)} FLOP/B, '
               f'{o.bound or "no bound"}, {pct(o.roof_fraction)} of roof')
        out.append(svg.element("circle", f"<title>{_e(tip)}</title>", cls="op", cx=X(intensity),
                               cy=Y(flops_per_s), r=rad, fill=BOUND_COLORS.get(o.bound),
                               fill_opacity="0.55", stroke="#333", stroke_width="0.5"))
    return f'<svg class="roofline" width="{W}" height="{H}" role="img" xmlns="http://www.w3.org/2000/svg">{"".join(out)}</svg>'


def roofline_section(r: Roofline, top: int = 25) -> str:
    """The roofline as an HTML fragment: the plot, the ceilings, the top ops, MFU, what is missing."""
    rows = "".join(
        f"<tr><td>{_e(o.name)}</td><td>{_e(dims_text(o.input_dims, 60))}</td><td>{_e(o.dtype or '-')}</td>"
        f"<td class=n>{o.calls}</td><td class=n>{duration(o.time_ns)}</td>"
        f"<td class=n>{pct(o.time_ns / r.total_time_ns if r.total_time_ns else None)}</td>"
        f"<td class=n>{si(o.achieved_flops_per_s, 'FLOP/s')}</td><td class=n>{si(o.achieved_bytes_per_s, 'B/s')}</td>"
        f"<td class=n>{ratio(o.intensity)}</td>"
        f"<td style='color:{BOUND_COLORS.get(o.bound)}'>{_e(o.bound or '-')}</td>"
        f"<td class=n>{_e(_of_roof(o.roof_fraction))}</td></tr>"
        for o in r.ops[:top])
    parts = [f"<h2>roofline ({_e(r.device)}, op time = {_e(r.basis)})</h2>",
             f"<div class='dim'>{_e(_ceilings_line(r))}</div>",
             *(f"<p class='caveat' style='background:#fff3cd;border-left:4px solid #e0a800;padding:6px 10px'>"
               f"<b>{_e(n)}</b></p>" for n in caveats(r.notes)),
             roofline_svg(r),
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
    return "".join(parts)


def roofline_html(r: Roofline, title: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title)}</title><style>{CSS}</style>"
            f"</head><body><h1>{_e(title)}</h1>{roofline_section(r)}</body></html>\n")
