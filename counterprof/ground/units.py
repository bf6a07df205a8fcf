"""Numbers into words: the one place a figure becomes text, one function per rule (like
nvitop's formatting module). Standard library only and importing nothing of counterprof, so
the verdict's evidence and the summary's notes (words analysis carries as data) use the same
rules without pulling a renderer in.

`none` is what a missing figure reads as: "-" in tables, "—" in compare's and history's
columns (their tests hold each)."""
from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Sequence

BINARY = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
BLOCKS = " ▁▂▃▄▅▆▇█"          # sparkline levels: index 0 is an unknown point
ASCII_LEVELS = " .:-=+*#%@"


# ---- shares and changes -----------------------------------------------------------------

def share(x: float | None, digits: int = 0, none: str = "-") -> str:
    """A fraction as a percent: 0.5 -> "50%"."""
    return none if x is None else f"{100 * x:.{digits}f}%"


def points(x: float | None, digits: int = 1, none: str = "-") -> str:
    """A figure already in percent: 50.0 -> "50.0%"."""
    return none if x is None else f"{x:.{digits}f}%"


def change(x: float | None, none: str = "—") -> str:
    """A relative change, signed: 0.05 -> "+5.0%"."""
    return none if x is None else f"{100 * x:+.1f}%"


def interval(ci: Sequence[float] | None, none: str = "—") -> str:
    """A confidence interval of a relative change: "[+1.0%, +9.0%]"."""
    return none if ci is None else f"[{change(ci[0])}, {change(ci[1])}]"


def spread(mean: float, sd: float, unit: str | None = None) -> str:
    """A standard deviation over runs, relative like perf stat -r's: "( +- 1.23% )"; of a zero
    mean, in the figure's unit (or as a bare number when it has none)."""
    if mean:
        return f"( +- {points(100 * sd / abs(mean), 2)} )"
    if unit is None:
        return f"( +- {sd:.3g} )"
    num, u = stat_number(sd, unit)
    return f"( +- {num} {u} )".replace("  )", " )")


# ---- times ------------------------------------------------------------------------------

def duration(ns: float | None) -> str:
    """Nanoseconds in the largest unit that keeps them >= 1: "1,234.50 ms"."""
    if ns is None:
        return "-"
    for div, unit in ((1e9, "s"), (1e6, "ms"), (1e3, "µs")):
        if abs(ns) >= div:
            return f"{ns / div:,.2f} {unit}"
    return f"{ns:,.0f} ns"


def seconds(v: float) -> str:
    """Seconds, in s, ms or µs: "1.234 s", "12.30 ms", "5.0 µs"."""
    a = abs(v)
    if a >= 1:
        return f"{v:.3f} s"
    if a >= 1e-3:
        return f"{v * 1e3:.2f} ms"
    return f"{v * 1e6:.1f} µs"


def secs(s: float) -> str:
    """Seconds, always in s with three decimals: region totals, which line up in a column."""
    return f"{s:.3f} s"


def ms(s: float | None) -> str:
    """Seconds in milliseconds, one decimal: per-step figures."""
    return "-" if s is None else f"{s * 1e3:.1f} ms"


def ns_as_ms(ns: float) -> str:
    """Nanoseconds in milliseconds, two decimals: kernel totals."""
    return f"{ns / 1e6:.2f} ms"


# ---- quantities with a unit ---------------------------------------------------------------

def _binary(v: float) -> tuple[float, str]:
    for name, div in BINARY:
        if abs(v) >= div:
            return v / div, name
    return v, "B"


def value(v: float | None, unit: str, none: str = "—") -> str:
    """A figure in its catalog unit ("s", "bytes", "bytes/s", "percent", anything else with
    SI prefixes from ten of them): compare's and history's columns."""
    if v is None:
        return none
    if unit == "s":
        return seconds(v)
    if unit.startswith("bytes"):
        x, name = _binary(v)
        return f"{v:.0f} B{unit[5:]}" if name == "B" else f"{x:.2f} {name}{unit[5:]}"
    if unit == "percent":
        return points(v)
    for prefix, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= div * 10:
            return f"{v / div:.3g}{prefix} {unit}".rstrip()
    return f"{v:.4g} {unit}".rstrip()


def si(x: float | None, unit: str = "") -> str:
    """A throughput or peak with SI prefixes up to P: "312 TFLOP/s", "1.5 GB/s"."""
    if x is None:
        return "-"
    for div, p in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g} {p}{unit}"
    return f"{x:.3g} {unit}".rstrip()


def rate(count: float, secs: float) -> str:
    """Events per second, perf stat's way: "1.234 M/sec"."""
    r = count / secs
    for div, p in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if r >= div:
            return f"{r / div:.3f} {p}/sec"
    return f"{r:.3f} /sec"


def stat_number(v: float, unit: str) -> tuple[str, str]:
    """A counter as perf stat prints it: (number, unit) in two columns; ns as msec."""
    if unit == "ns":
        return f"{v / 1e6:,.2f}", "msec"
    if unit == "s":
        return f"{v:,.3f}", "s"
    if unit == "bytes":
        x, name = _binary(v)
        return (f"{v:,.0f}", "B") if name == "B" else (f"{x:,.2f}", name)
    if unit == "percent":
        return f"{v:,.1f}", "%"
    if float(v).is_integer() or abs(v) >= 100:
        return f"{v:,.0f}", ""
    return f"{v:,.2f}", unit if unit != "count" else ""


def ratio(x: float | None) -> str:
    """A ratio without a unit prefix (FLOP per byte, a ridge point): three significant digits."""
    return "-" if x is None else f"{x:.3g}"


def number(x: float | None) -> str:
    """A device figure's mean or peak: three significant digits, whole from 1000."""
    if x is None:
        return "-"
    return f"{x:,.3g}" if abs(x) < 1000 else f"{x:,.0f}"


# ---- trends -----------------------------------------------------------------------------

def sparkline(values: Sequence[float | None], hi: float | None = None, lo: float | None = 0.0,
              ascii_only: bool = False, marks: Collection[int] = ()) -> str:
    """One glyph per point, from the lowest to the full block; ' ' where a point is unknown
    (None or not finite). The scale runs from `lo` (None: the smallest point) to the larger of
    `hi` and the largest point; a point at the bottom still shows the lowest glyph (zero is not
    unknown). marks: indices of known points that get a '|' before their glyph (change
    points)."""
    levels = ASCII_LEVELS if ascii_only else BLOCKS
    known = [v for v in values if v is not None and math.isfinite(v)]
    bottom = min(known, default=0.0) if lo is None else lo
    top = max([*known, bottom if hi is None else hi], default=bottom)
    n = len(levels) - 1
    out = []
    for i, v in enumerate(values):
        if v is None or not math.isfinite(v):
            out.append(" ")
            continue
        if i and i in marks:
            out.append("|")
        if top <= bottom:
            out.append(levels[1])
        else:
            out.append(levels[max(1, min(n, round(n * max(0.0, v - bottom) / (top - bottom))))])
    return "".join(out)


# ---- the live view's narrow columns -----------------------------------------------------
# The dashboard's value column (VALUE_W) and the detail column after its sparkline are narrow:
# their forms are shorter than the tables' above. Two roundings of SI prefixes, on purpose: a
# value keeps three significant figures ("2.50M/s"), a detail two ("of refs · 400K/s").
# Figures carry numbers (live/figures.py: Figure.value and unit, Figure.detail_parts); these
# write them.

# a detail: words and (value, unit key) pairs, e.g. ("sys ", (0.2, "percent")) -> "sys 0.2%"
DetailPart = str | tuple[float, str]


def live_si(v: float) -> str:
    """A value with an SI prefix, three significant figures: 2.50M, 25.0K, 980."""
    a = abs(v)
    for div, s in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if a >= div:
            return f"{v / div:.2f}{s}" if a < 10 * div else f"{v / div:.1f}{s}"
    if a >= 100 or v == 0:
        return f"{v:.0f}"
    return f"{v:.2f}" if a < 10 else f"{v:.1f}"


def live_si_short(v: float) -> str:
    """An SI prefix in two significant figures, for the detail column: 400K, 2.5M, 12."""
    for div, s in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(v) >= div:
            return f"{v / div:.0f}{s}" if abs(v) >= 100 * div else f"{v / div:.1f}{s}"
    return f"{v:.0f}" if abs(v) >= 10 or v == 0 else f"{v:.1f}"


def binary_short(v: float) -> str:
    a = abs(v)
    for div, s in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if a >= div:
            return f"{v / div:.1f} {s}"
    return f"{v:.0f} B"


def plain(v: float) -> str:
    """A number in a unit of its own (MHz, W, C): plain up to 99999, then K/M/G."""
    a = abs(v)
    if a >= 1e5:
        return live_si(v)
    if a >= 100 or float(v).is_integer():
        return f"{v:.0f}"
    return f"{v:.1f}" if a >= 10 else f"{v:.2f}"


def live_value(v: float | None, unit: str) -> str:
    """A figure's value with its unit, short enough for VALUE_W."""
    if v is None:
        return "—"
    if unit == "cpus":
        return f"{v:.2f} CPUs"
    if unit == "ratio":
        return f"{v:.2f}"
    if unit == "percent":
        return f"{v:.1f}%" if abs(v) < 1000 else f"{v:.0f}%"
    if unit in ("bytes", "B"):
        return binary_short(v)
    if unit == "bytes/s":
        return binary_short(v) + "/s"
    if unit == "/s":
        return live_si(v) + "/s"
    if unit == "count":
        return f"{v:.0f}" if float(v).is_integer() and abs(v) < 1e5 else live_si(v)
    if unit == "bitmask":                       # e.g. throttle reasons: the bits, not a quantity
        return f"{int(v):#x}"
    return f"{plain(v)} {unit}".strip()


# unit keys that only details use; any other key is written as live_value writes it
_DETAIL: dict[str, Callable[[float], str]] = {
    "GHz": lambda v: f"{v:.2f} GHz",
    "whole percent": lambda v: f"{v:.0f}%",            # "ran 50% of time"
    "whole": lambda v: f"{v:.0f}",                     # steps, ranks
    "short": live_si_short,                                 # "vol 12 · inv 3"
    "short/s": lambda v: live_si_short(v) + "/s",
    "short FLOP/s": lambda v: live_si_short(v) + "FLOP/s",
    "processes": lambda v: f"{v:.0f} process{'es' if v != 1 else ''}",
}


def live_detail(parts: Iterable[DetailPart]) -> str:
    """A figure's detail as text: its words as they are, each (value, unit) pair formatted."""
    out = []
    for p in parts:
        if isinstance(p, str):
            out.append(p)
        else:
            v, unit = p
            f = _DETAIL.get(unit)
            out.append(f(v) if f is not None else live_value(v, unit))
    return "".join(out)


def elapsed(s: float) -> str:
    s = int(max(0.0, s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"
