"""`counterprof collectives` output: terminal tables and a self-contained HTML page (inline
SVG, no scripts): per-call bus bandwidth against message size over this machine's measured
curve, and each rank's arrival lag over time. Formats; computes nothing."""
from __future__ import annotations

import html
from typing import IO, Any

from rich.console import Console
from rich.table import Table

from ..analysis.across_ranks import rank_ranges
from ..analysis.collectives import CollectiveCalls
from ..ground.units import share, si
from . import svg
from .roofline import CSS, _e     # one look for the standalone pages

OP_COLORS = {"all_reduce": "#1f77b4", "all_gather": "#2e9e44", "reduce_scatter": "#b23ab2",
             "broadcast": "#e08a00", "all_to_all": "#d62728", "reduce": "#8c564b"}


def _us(x: float | None) -> str:
    if x is None:
        return "-"
    if x >= 1e6:
        return f"{x / 1e6:.2f} s"
    if x >= 1e3:
        return f"{x / 1e3:.2f} ms"
    return f"{x:.0f} µs"


def _bytes(b: float | None) -> str:
    return "-" if not b else si(b, "B")


def _gbps(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g} GB/s"


def _frac(x: float | None) -> str:
    return "-" if x is None else share(x)


def _table(title: str, *columns: str) -> Table:
    t = Table(title=title, title_justify="left", title_style="bold", box=None, pad_edge=False)
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i < 3 else "right", no_wrap=True)
    return t


def collectives_text(r: CollectiveCalls, out: IO[str], top: int = 3) -> None:
    console = Console(file=out, width=130, highlight=False)
    j = r.to_json(top)
    if not r.calls:
        console.print("no collective calls matched" + (": " + "; ".join(r.notes) if r.notes else ""))
        return
    levels = sorted(set(r.level.values()) - {"none"})
    on = f"rank {r.ranks[0]}" if len(r.ranks) == 1 else f"ranks {rank_ranges(r.ranks)}"   # 0-1023, not each
    console.print(f"{len(r.calls)} collective calls on {on} "
                  f"({j['link']}; calls from {', '.join(levels)}); curve: "
                  f"{r.curve_backend + ' (calibrate)' if r.curve_backend else 'none (run `counterprof calibrate`)'}")
    t = _table("per operation, size and group", "op", "size", "group", "calls", "time", "exposed",
               "median skew", "median transfer", "median busbw", "of curve")
    for s in j["summary"]:
        t.add_row(s["op"], s["size"], s["group"], str(s["calls"]), _us(s["time_s"] * 1e6),
                  _us(None if s["exposed_s"] is None else s["exposed_s"] * 1e6), _us(s["median_skew_us"]),
                  _us(s["median_transfer_us"]),
                  _gbps(s["median_busbw_gbps"]),
                  _frac(s["median_fraction_of_curve"]))
    console.print(t)
    t = _table("per rank", "rank", "", "", "calls", "arrived last", "its wait", "others' wait for it")
    for b in j["by_rank"]:
        last = f"{b['last']} ({share(b['last'] / b['calls']) if b['calls'] else '-'})"
        t.add_row(str(b["rank"]), "", "", str(b["calls"]), last,
                  _us(b["waited_s"] * 1e6), _us(b["others_waited_s"] * 1e6))
    console.print(t)
    named = _named(j["calls"], top)
    if named:
        t = _table("calls to look at", "op", "step", "why", "bytes", "skew", "last", "transfer",
                   "busbw", "of curve")
        for why, c in named:
            t.add_row(c["op"], c["step"] or "-", why, _bytes(c["bytes"]), _us(c["skew_us"]),
                      "-" if c["last_rank"] is None else str(c["last_rank"]), _us(c["transfer_us"]),
                      _gbps(c["busbw_gbps"]),
                      _frac(c["fraction_of_curve"]))
        console.print(t)
    if r.unmatched:
        console.print("not matched across ranks: " + ", ".join(f"{k} {v}" for k, v in r.unmatched.items()))
    for n in r.notes:
        console.print(f"[dim]{html.escape(n, quote=False)}[/dim]")


def _named(calls: list[dict[str, Any]], top: int) -> list[tuple[str, dict[str, Any]]]:
    """The calls a user would look at, each with why: late ranks (a skew that matters), far
    below the curve (slow link or contention), under the latency floor (too small)."""
    out: list[tuple[str, dict[str, Any]]] = []
    # late: the others' wait (the skew) is a real part of the call: 1 ms or more, and at least a
    # third of the transfer
    late = sorted((c for c in calls if (c["skew_us"] or 0) >= max(1000.0, c["transfer_us"] / 3)),
                  key=lambda c: -c["skew_us"])
    out += [(f"rank {c['last_rank']} late", c) for c in late[:top]]
    slow = sorted((c for c in calls if c["fraction_of_curve"] is not None and c["fraction_of_curve"] < 0.5
                   and not c["under_latency_floor"] and c not in late[:top]),
                  key=lambda c: c["fraction_of_curve"])
    out += [("below the curve", c) for c in slow[:top]]
    small = [c for c in calls if c["under_latency_floor"]]
    if small:
        out.append((f"latency floor ({len(small)} calls)", small[0]))
    return out


# ---- HTML ------------------------------------------------------------------------------------

W, H, PADL, PADB, PADT, PADR = 820, 420, 70, 40, 16, 130


def busbw_svg(r: CollectiveCalls) -> str:
    """Log-log: x message size (bytes), y busbw; the measured curve per op as a line, each call
    a dot colored by its op."""
    pts = [(c, float(c.bytes), c.busbw) for c in r.calls if c.bytes and c.busbw]
    curves = {c.curve.op: c.curve for c in r.calls if c.curve is not None}
    xs = [x for _, x, _ in pts] + [s for cv in curves.values() for s in cv.sizes]
    ys = [y for _, _, y in pts] + [b for cv in curves.values() for b in cv.busbw]
    if not pts:
        return "<p class='dim'>nothing to draw: no call with a size and a bus bandwidth</p>"
    X, Y, out, _ = svg.log_log_axes(xs, ys, (PADL, PADT, W - PADR, H - PADB),
                                    (lambda v: si(v, "B"), lambda v: si(v, "B/s")),
                                    ("message size (nccl-tests' bytes)", "bus bandwidth"), margin=0.2)
    used: list[float] = []           # label heights taken: a label 12 px from another moves down
    for op, cv in sorted(curves.items()):
        color = OP_COLORS.get(op, "#555")
        y_label = Y(cv.busbw[-1]) + 3
        while any(abs(y_label - u) < 12 for u in used):
            y_label += 12
        used.append(y_label)
        out.append(f"<g class='curve' data-op='{_e(op)}'><title>{_e(op)} {_e(cv.backend)}: calibrate's "
                   "measured curve</title>" + svg.polyline([(X(s), Y(b)) for s, b in zip(cv.sizes, cv.busbw)],
                                                          color, 2) + "</g>")
        out.append(svg.text(W - PADR + 4, y_label, f"{op} ({cv.backend})", fill=color))
    y_free = max(used, default=PADT) + 14
    for op in sorted({c.op for c, _, _ in pts} - set(curves)):      # ops without a measured curve
        out.append(svg.text(W - PADR + 4, y_free, f"{op} (no curve)", fill=OP_COLORS.get(op, "#555")))
        y_free += 12
    for c, x, y in pts:
        j = c.to_json()
        tip = (f"{c.op} {si(x, 'B')} {c.step or ''} #{c.index}: transfer {_us(j['transfer_us'])}, "
               f"skew {_us(j['skew_us'])}, busbw {si(y, 'B/s')}, {_frac(j['fraction_of_curve'])} of the curve")
        out.append(svg.element("circle", f"<title>{_e(tip)}</title>", cls="call", cx=X(x), cy=Y(y), r=3.5,
                               fill=OP_COLORS.get(c.op, "#555"), fill_opacity="0.55", stroke="#333",
                               stroke_width="0.4"))
    return (f'<svg class="busbw" width="{W}" height="{H}" role="img">'
            f'{"".join(out)}</svg>')


def skew_svg(r: CollectiveCalls, height_per_rank: int = 26) -> str:
    """Per rank, a strip over time: at each call, how long after the first rank it arrived
    (the darker, the later); the last to arrive is the one the others waited for."""
    calls = [c for c in r.calls if len(c.arrival_ns) > 1]
    if not calls:
        return "<p class='dim'>no call seen on two ranks or more</p>"
    t0 = min(min(c.arrival_ns.values()) for c in calls)
    t1 = max(max(c.arrival_ns.values()) for c in calls)
    worst = max((c.skew_ns or 0) for c in calls) or 1
    ranks = sorted({rk for c in calls for rk in c.arrival_ns})
    h = PADT + height_per_rank * len(ranks) + PADB
    X = svg.scale(t0, max(t1, t0 + 1), PADL, W - PADR)
    out = [svg.frame(PADL, PADT, W - PADR, h - PADB)]
    for i, rk in enumerate(ranks):
        y = PADT + i * height_per_rank
        out.append(svg.text(PADL - 6, y + height_per_rank / 2 + 3, f"rank {rk}", text_anchor="end"))
        for c in calls:
            if rk not in c.arrival_ns:
                continue
            lag = c.arrival_ns[rk] - min(c.arrival_ns.values())
            dark = int(230 - 200 * min(1.0, lag / worst))
            tip = f"{c.op} {c.step or ''}: rank {rk} arrived {_us(lag / 1e3)} after the first"
            out.append(svg.element("rect", f"<title>{_e(tip)}</title>",
                                   cls="lag", x=X(c.arrival_ns[rk]), y=y + 3, width=2.5, height=height_per_rank - 6,
                                   fill=f"rgb({dark},{dark},255)"))
    out.append(svg.text((PADL + W - PADR) / 2, h - 8,
                        f"time ({_us((t1 - t0) / 1e3)} shown); darker: later to arrive (worst {_us(worst / 1e3)})",
                        font_size=11, text_anchor="middle"))
    return f'<svg class="skew" width="{W}" height="{h}" role="img">{"".join(out)}</svg>'


def collectives_html(r: CollectiveCalls, title: str, top: int = 5) -> str:
    j = r.to_json(top)
    rows = "".join(
        f"<tr><td>{_e(s['op'])}</td><td>{_e(s['size'])}</td><td>{_e(s['group'])}</td><td class=n>{s['calls']}</td>"
        f"<td class=n>{_e(_us(s['time_s'] * 1e6))}</td><td class=n>{_e(_us(s['median_skew_us']))}</td>"
        f"<td class=n>{_e(_us(s['median_transfer_us']))}</td>"
        f"<td class=n>{_gbps(s['median_busbw_gbps'])}</td>"
        f"<td class=n>{_e(_frac(s['median_fraction_of_curve']))}</td></tr>" for s in j["summary"])
    ranks = "".join(
        f"<tr><td>{b['rank']}</td><td class=n>{b['calls']}</td><td class=n>{b['last']}</td>"
        f"<td class=n>{_e(_us(b['waited_s'] * 1e6))}</td><td class=n>{_e(_us(b['others_waited_s'] * 1e6))}</td></tr>"
        for b in j["by_rank"])
    named = "".join(
        f"<tr><td>{_e(c['op'])}</td><td>{_e(c['step'] or '-')}</td><td>{_e(why)}</td>"
        f"<td class=n>{_e(_bytes(c['bytes']))}</td>"
        f"<td class=n>{_e(_us(c['skew_us']))}</td><td class=n>{_e(_us(c['transfer_us']))}</td>"
        f"<td class=n>{_e(_frac(c['fraction_of_curve']))}</td></tr>" for why, c in _named(j["calls"], top))
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title)}</title><style>{CSS}</style>"
             f"</head><body><h1>{_e(title)}</h1>",
             f"<div class='dim'>{len(r.calls)} calls, ranks {_e(rank_ranges(r.ranks))}, {_e(j['link'])}; "
             f"curve: {_e(r.curve_backend or 'none: run counterprof calibrate')}</div>",
             "<h2>bus bandwidth per call against the measured curve</h2>", busbw_svg(r),
             "<h2>arrival lag per rank over time</h2>", skew_svg(r),
             "<h2>per operation, size and group</h2><table><tr><th>op</th><th>size</th><th>group</th>"
             "<th>calls</th><th>time</th><th>median skew</th><th>median transfer</th><th>median busbw</th>"
             f"<th>of curve</th></tr>{rows}</table>",
             "<h2>per rank</h2><table><tr><th>rank</th><th>calls</th><th>arrived last</th><th>its wait</th>"
             f"<th>others' wait for it</th></tr>{ranks}</table>"]
    if named:
        parts.append("<h2>calls to look at</h2><table><tr><th>op</th><th>step</th><th>why</th><th>bytes</th>"
                     f"<th>skew</th><th>transfer</th><th>of curve</th></tr>{named}</table>")
    parts.extend(f"<div class='dim'>{_e(n)}</div>" for n in r.notes)
    if r.unmatched:
        parts.append("<div class='dim'>not matched across ranks: "
                     + _e(", ".join(f"{k} {v}" for k, v in r.unmatched.items())) + "</div>")
    parts.append("</body></html>\n")
    return "".join(parts)
