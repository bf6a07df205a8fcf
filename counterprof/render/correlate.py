"""`counterprof correlate` output: a terminal summary and table per source, and a self-contained
HTML page (inline SVG, no scripts): predicted against measured on log-log axes with y = x, the
tolerance band, the outliers labelled and every row's figures on hover. Formats; computes nothing."""
from __future__ import annotations

import math
from typing import IO

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..analysis.correlate import Correlation, Figures, Row, Source
from ..ground.units import share
from . import svg
from .roofline import CSS, _e     # one look for the standalone pages

W, H, PADL, PADR, PADT, PADB = 640, 460, 70, 20, 20, 50
UNMATCHED_SHOWN = 20            # unmatched rows the text lists (--json has every one)
COLORS = {"GEMM": "#1f77b4", "convolution": "#17becf", "attention": "#b23ab2", "normalization": "#2e9e44",
          "elementwise": "#e08a00", "reduction": "#8c564b", "collectives": "#d62728", "memory copies": "#7f7f7f",
          "region": "#bcbd22", "step": "#000000"}


def us(x: float | None) -> str:
    if x is None:
        return "-"
    if x >= 1e6:
        return f"{x / 1e6:.3g} s"
    if x >= 1e3:
        return f"{x / 1e3:.3g} ms"
    if x < 0.1:
        return f"{x * 1e3:.3g} ns"
    return f"{x:.3g} µs"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x" if x < 1000 else f"{x:.3g}x"


def _r(x: float | None) -> str:
    return "-" if x is None else f"{x:+.2f}"


def figures_line(f: Figures) -> str:
    return (f"coverage {share(f.coverage) if f.coverage is not None else '-'}, MAPE "
            f"{share(f.mape) if f.mape is not None else '-'}, geo-mean measured/predicted {_ratio(f.geomean_ratio)}, "
            f"within tolerance {share(f.within) if f.within is not None else '-'} of the time, "
            f"Pearson {_r(f.pearson)} / Spearman {_r(f.spearman)} on log times ({f.rows} rows)")


def _label(r: Row, width: int = 52) -> str:
    j = r.to_json()
    text = str(j["key"])
    return text if len(text) <= width else text[:width - 1] + "…"


def correlate_text(c: Correlation, out: IO[str], top: int = 15) -> None:
    console = Console(file=out, width=150, highlight=False)
    if not c.sources:
        console.print("no predictions")
    for s in c.sources:
        # (figures on one line each, whatever the width: grep finds them)
        console.print(f"[bold]{escape(s.name)}[/bold]: {figures_line(s.figures)}", soft_wrap=True)
        if s.by_group:
            console.print("  by group: " + "; ".join(
                f"{g} {share(f.mape) if f.mape is not None else '-'} MAPE, {_ratio(f.geomean_ratio)}"
                for g, f in s.by_group.items()), soft_wrap=True)
        if s.by_rank:
            console.print("  by rank: " + "; ".join(
                f"{k}: {share(f.mape) if f.mape is not None else '-'} MAPE, {_ratio(f.geomean_ratio)}"
                for k, f in s.by_rank.items()), soft_wrap=True)
        if s.rows:
            t = Table(title=f"rows by the time they would save at their prediction (top {min(top, len(s.rows))} "
                            f"of {len(s.rows)})", title_justify="left", box=None, pad_edge=False)
            for i, col in enumerate(("item", "group", "calls", "measured", "p10-p90", "predicted", "ratio",
                                     "within", "would save")):
                t.add_column(col, justify="left" if i < 2 else "right", no_wrap=True)
            for r in s.rows[:top]:
                j = r.to_json()
                spread = "-" if j["p10_us"] is None else f"{us(j['p10_us'])}-{us(j['p90_us'])}"
                t.add_row(_label(r), r.item.group, str(r.item.calls), us(j["measured_us"]), spread,
                          us(j["predicted_us"]), _ratio(r.ratio), "yes" if r.within else f"no (±{r.tolerance:.0%})",
                          us(j["savings_us"]))
            console.print(t)
        for u in s.unmatched[:UNMATCHED_SHOWN]:
            where = f"line {u.pred.line}: " if u.pred.line else ""
            console.print(f"  [dim]unmatched[/dim] {escape(where + u.pred.key)}: {escape(u.why)}", soft_wrap=True)
        if len(s.unmatched) > UNMATCHED_SHOWN:
            more = len(s.unmatched) - UNMATCHED_SHOWN
            console.print(f"  [dim]... and {more} more unmatched rows (all in --json)[/dim]")
        if s.uncovered:
            total = sum(it.total_ns for it in s.uncovered)
            names = ", ".join(f"{it.key} ({us(it.total_ns / 1e3)})" for it in s.uncovered[:3])
            console.print(f"  no prediction for {len(s.uncovered)} measured item(s), {us(total / 1e3)} in all; "
                          f"the longest: {escape(names)}", soft_wrap=True)
        console.print("")
    for n in c.notes + c.measured.notes:
        console.print(f"[dim]note: {escape(n)}[/dim]", soft_wrap=True)


def scatter_svg(s: Source, labelled: int = 8) -> str:
    """Log-log: x predicted µs per call, y measured; y = x, the tolerance band, a dot per row
    (sized by its measured time), the rows furthest from y = x by time labelled."""
    rows = [r for r in s.rows if r.predicted_us > 0 and r.measured_us > 0]
    if not rows:
        return "<p class='dim'>nothing to draw: no row with a prediction and a measured time</p>"
    xs = [r.predicted_us for r in rows]
    ys = [r.measured_us for r in rows]
    lo, hi = min(xs + ys), max(xs + ys)
    X, Y, out, (x0, x1, y0, y1) = svg.log_log_axes([lo, hi], [lo, hi], (PADL, PADT, W - PADR, H - PADB),
                                                   (us, us), ("predicted per call", "measured per call (median)"))
    tol = sorted(r.tolerance for r in rows)[len(rows) // 2]      # the band: the rows' usual tolerance
    a, b = max(x0, y0), min(x1, y1)
    band = [(X(a), Y(a * (1 + tol))), (X(b), Y(b * (1 + tol))), (X(b), Y(b / (1 + tol))), (X(a), Y(a / (1 + tol)))]
    out.append(svg.element("polygon", cls="band", points=" ".join(f"{px:.1f},{py:.1f}" for px, py in band),
                           fill="#2e9e44", fill_opacity="0.12", stroke="none"))
    out.append(svg.line(X(a), Y(a), X(b), Y(b), cls="diagonal", stroke="#2e9e44", stroke_width="1.2"))
    biggest = max(r.item.total_ns for r in rows) or 1
    far = sorted(rows, key=lambda r: -abs(math.log(r.ratio)) * r.item.total_ns)[:labelled]
    for r in sorted(rows, key=lambda r: -r.item.total_ns):
        j = r.to_json()
        tip = (f"{j['key']} ({r.item.group}, {r.item.calls} calls): measured {us(j['measured_us'])} "
               f"(p10-p90 {us(j['p10_us'])}-{us(j['p90_us'])}), predicted {us(j['predicted_us'])}, "
               f"ratio {r.ratio:.2f}x, {'within' if r.within else 'outside'} ±{r.tolerance:.0%}, "
               f"would save {us(j['savings_us'])}" + (f", line {r.pred.line}" if r.pred.line else ""))
        radius = 2.5 + 6 * math.sqrt(r.item.total_ns / biggest)
        out.append(svg.element("circle", f"<title>{_e(tip)}</title>", cls="row" + ("" if r.within else " out"),
                               cx=X(r.predicted_us), cy=Y(r.measured_us), r=round(radius, 1),
                               fill=COLORS.get(r.item.group, "#555"), fill_opacity="0.6", stroke="#333",
                               stroke_width="0.4"))
    taken: list[tuple[float, float]] = []      # labels' anchors: one within 11 px of another is left out
    for r in far:
        if abs(math.log(r.ratio)) <= math.log(1 + r.tolerance):
            continue
        x, y = X(r.predicted_us), Y(r.measured_us) - 5
        if any(abs(y - ty) < 11 and abs(x - tx) < 200 for tx, ty in taken):
            continue
        taken.append((x, y))
        left = x > (PADL + W - PADR) / 2                  # in the right half: the label to the left
        out.append(svg.text(x - 7 if left else x + 7, y, _label(r, 40), cls="outlier", font_size=9,
                            text_anchor="end" if left else "start", stroke="#fff", stroke_width="3",
                            paint_order="stroke"))      # (a halo: readable over the dots)
    legend_y = PADT + 12
    out.append(svg.text(PADL + 8, legend_y, f"— measured = predicted, band ±{tol:.0%}", fill="#2e9e44"))
    legend_y += 12
    for g in sorted({r.item.group for r in rows}):
        out.append(svg.text(PADL + 8, legend_y, f"● {g}", fill=COLORS.get(g, "#555")))
        legend_y += 12
    return f'<svg class="scatter" width="{W}" height="{H}" role="img">{"".join(out)}</svg>'


def correlate_html(c: Correlation, title: str, top: int = 25) -> str:
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title)}</title><style>{CSS}</style>"
             f"</head><body><h1>{_e(title)}</h1>"]
    if not c.sources:
        parts.append("<p class='dim'>no predictions</p>")
    for s in c.sources:
        parts.append(f"<h2>{_e(s.name)}</h2><div>{_e(figures_line(s.figures))}</div>")
        parts.append(scatter_svg(s))
        if s.by_group:
            parts.append("<table><tr><th>group</th><th>rows</th><th>coverage</th><th>MAPE</th><th>geo-mean ratio</th>"
                         "<th>within</th></tr>" + "".join(
                             f"<tr><td>{_e(g)}</td><td class=n>{f.rows}</td>"
                             f"<td class=n>{share(f.coverage) if f.coverage is not None else '-'}</td>"
                             f"<td class=n>{share(f.mape) if f.mape is not None else '-'}</td>"
                             f"<td class=n>{_ratio(f.geomean_ratio)}</td>"
                             f"<td class=n>{share(f.within) if f.within is not None else '-'}</td></tr>"
                             for g, f in s.by_group.items()) + "</table>")
        rows = "".join(
            f"<tr><td>{_e(_label(r, 90))}</td><td>{_e(r.item.group)}</td><td class=n>{r.item.calls}</td>"
            f"<td class=n>{_e(us(r.measured_us))}</td><td class=n>{_e(us(r.predicted_us))}</td>"
            f"<td class=n>{_ratio(r.ratio)}</td><td class=n>{'yes' if r.within else 'no'}</td>"
            f"<td class=n style='white-space:nowrap'>{_e(us(r.savings_ns / 1e3))}</td></tr>" for r in s.rows[:top])
        parts.append("<h3>rows by the time they would save at their prediction</h3><table><tr><th>item</th>"
                     "<th>group</th><th>calls</th><th>measured</th><th>predicted</th><th>ratio</th><th>within</th>"
                     f"<th>would save</th></tr>{rows}</table>")
        parts.extend(f"<div class='dim'>unmatched {('line ' + str(u.pred.line) + ': ') if u.pred.line else ''}"
                     f"{_e(u.pred.key)}: {_e(u.why)}</div>" for u in s.unmatched)
    parts.extend(f"<div class='dim'>{_e(n)}</div>" for n in c.notes + c.measured.notes)
    parts.append("</body></html>\n")
    return "".join(parts)
