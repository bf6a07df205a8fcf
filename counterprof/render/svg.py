"""Inline SVG for the HTML pages (report, history, roofline): scales, axes, lines and text,
written as strings (no scripts, nothing fetched). One place for the plotting the three pages
share; what each draws on top (verdict bands, change points, roofs) stays with its page."""
from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterable


def num(v: float) -> str:
    """A coordinate: floats to one decimal, integers as they are."""
    return f"{v:.1f}" if isinstance(v, float) else str(v)


def element(tag: str, body: str | None = None, **attrs: object) -> str:
    """<tag a="v" .../> or <tag ...>body</tag>; `cls` is class, '_' in a name is '-'
    (stroke_width -> stroke-width). Numbers go through num(), strings as given (escape
    what is not yours)."""
    if "cls" in attrs:        # class first, as the pages' selectors read best
        attrs = {"cls": attrs.pop("cls"), **attrs}
    parts = [tag] + [f'{"class" if k == "cls" else k.replace("_", "-")}='
                     f'"{num(v) if isinstance(v, (int, float)) else v}"' for k, v in attrs.items()]
    return f"<{' '.join(parts)}/>" if body is None else f"<{' '.join(parts)}>{body}</{tag}>"


def line(x1: float, y1: float, x2: float, y2: float, body: str | None = None, **attrs: object) -> str:
    return element("line", body, x1=x1, y1=y1, x2=x2, y2=y2, **attrs)


def text(x: float, y: float, words: str, font_size: int = 10, **attrs: object) -> str:
    """Words at (x, y), escaped."""
    return element("text", html.escape(words), x=x, y=y, font_size=font_size, **attrs)


def polyline(points: Iterable[tuple[float, float]], stroke: str, width: float) -> str:
    """An unfilled line through the points, in order."""
    pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    return f'<polyline fill="none" stroke="{stroke}" stroke-width="{width}" points="{pts}"/>'


def scale(d0: float, d1: float, r0: float, r1: float, flip: bool = False, clamp: bool = False,
          log: bool = False) -> Callable[[float], float]:
    """The map from data [d0, d1] to pixels [r0, r1]; flip: d0 at r1 (SVG's y grows down);
    clamp: data outside [d0, d1] at the edge; log: on log10 of the data."""
    f = math.log10 if log else float
    lo, span = f(d0), f(d1) - f(d0)

    def at(v: float) -> float:
        if clamp:
            v = min(max(v, d0), d1)
        t = (f(v) - lo) / span
        return r0 + (r1 - r0) * (1 - t if flip else t)
    return at


def frame(x0: float, y0: float, x1: float, y1: float) -> str:
    """The plot area's outline."""
    return element("rect", x=x0, y=y0, width=x1 - x0, height=y1 - y0, fill="none", stroke="#ccc")


def baseline(x0: float, x1: float, y: float) -> str:
    """The x axis: a grey line under the plot."""
    return line(x0, y, x1, y, stroke="#ccc")


def log_grid(lo: float, hi: float, at: Callable[[float], float], across: tuple[float, float],
             label: Callable[[float], str], vertical: bool) -> list[str]:
    """One grid line and label per decade of [lo, hi] (log10 bounds): vertical lines labelled
    under the plot, or horizontal ones labelled to its left."""
    a, b = across
    out = []
    for e in range(int(lo), int(hi) + 1):
        p = at(10 ** e)
        if vertical:
            out.append(line(p, a, p, b, stroke="#eee")
                       + text(p, b + 14, label(10 ** e), text_anchor="middle"))
        else:
            out.append(line(a, p, b, p, stroke="#eee")
                       + text(a - 4, p + 3, label(10 ** e), text_anchor="end"))
    return out


def log_log_axes(xs: list[float], ys: list[float], box: tuple[float, float, float, float],
                 labels: tuple[Callable[[float], str], Callable[[float], str]],
                 titles: tuple[str, str], margin: float = 0.3
                 ) -> tuple[Callable[[float], float], Callable[[float], float], list[str], tuple[float, ...]]:
    """A log-log plot's frame over the data: the scales X and Y, the frame, a grid line and a
    label per decade, the axes' titles, and the bounds (x0, x1, y0, y1) rounded out to decades
    `margin` decades beyond the data. box: (left, top, right, bottom) of the plot area, the
    x title under it, the y title turned along its left."""
    left, top, right, bottom = box
    x0, x1 = 10 ** math.floor(math.log10(min(xs)) - margin), 10 ** math.ceil(math.log10(max(xs)) + margin)
    y0, y1 = 10 ** math.floor(math.log10(min(ys)) - margin), 10 ** math.ceil(math.log10(max(ys)) + 0.2)
    X = scale(x0, x1, left, right, log=True)
    Y = scale(y0, y1, top, bottom, flip=True, log=True)
    mid = (top + bottom) / 2
    out = [frame(left, top, right, bottom),
           *log_grid(math.log10(x0), math.log10(x1), X, (top, bottom), labels[0], vertical=True),
           *log_grid(math.log10(y0), math.log10(y1), Y, (left, right), labels[1], vertical=False),
           text((left + right) / 2, bottom + 34, titles[0], font_size=11, text_anchor="middle")
           + text(14, mid, titles[1], font_size=11, text_anchor="middle", transform=f"rotate(-90 14 {mid})")]
    return X, Y, out, (x0, x1, y0, y1)
