"""The live view's number words: every value, detail and time the dashboard, the plain line,
the process table and the figures' `detail` show is written here, from a number and a unit
key. The figures carry numbers (live/figures.py: Figure.value and unit, Figure.detail_parts);
nothing else in the live view formats a number. Standard library only, so a figure's words
can be read without rich.

Two roundings of SI prefixes, on purpose: a value (VALUE_W, the panel's value column) keeps
three significant figures ("2.50M/s"), a detail (the narrow column after the sparkline) two
("of refs · 400K/s").
"""
from __future__ import annotations

from typing import Callable, Iterable, Union

# a detail: words and (value, unit key) pairs, e.g. ("sys ", (0.2, "percent")) -> "sys 0.2%"
DetailPart = Union[str, tuple]


def si(v: float) -> str:
    """A value with an SI prefix, three significant figures: 2.50M, 25.0K, 980."""
    a = abs(v)
    for div, s in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if a >= div:
            return f"{v / div:.2f}{s}" if a < 10 * div else f"{v / div:.1f}{s}"
    if a >= 100 or v == 0:
        return f"{v:.0f}"
    return f"{v:.2f}" if a < 10 else f"{v:.1f}"


def si_short(v: float) -> str:
    """An SI prefix in two significant figures, for the detail column: 400K, 2.5M, 12."""
    for div, s in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(v) >= div:
            return f"{v / div:.0f}{s}" if abs(v) >= 100 * div else f"{v / div:.1f}{s}"
    return f"{v:.0f}" if abs(v) >= 10 or v == 0 else f"{v:.1f}"


def binary_bytes(v: float) -> str:
    a = abs(v)
    for div, s in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if a >= div:
            return f"{v / div:.1f} {s}"
    return f"{v:.0f} B"


def plain(v: float) -> str:
    """A number in a unit of its own (MHz, W, C): plain up to 99999, then K/M/G."""
    a = abs(v)
    if a >= 1e5:
        return si(v)
    if a >= 100 or float(v).is_integer():
        return f"{v:.0f}"
    return f"{v:.1f}" if a >= 10 else f"{v:.2f}"


def fmt_value(v: float | None, unit: str) -> str:
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
        return binary_bytes(v)
    if unit == "bytes/s":
        return binary_bytes(v) + "/s"
    if unit == "/s":
        return si(v) + "/s"
    if unit == "count":
        return f"{v:.0f}" if float(v).is_integer() and abs(v) < 1e5 else si(v)
    if unit == "bitmask":                       # e.g. throttle reasons: the bits, not a quantity
        return f"{int(v):#x}"
    return f"{plain(v)} {unit}".strip()


# unit keys that only details use; any other key is written as fmt_value writes it
_DETAIL: dict[str, Callable[[float], str]] = {
    "GHz": lambda v: f"{v:.2f} GHz",
    "whole percent": lambda v: f"{v:.0f}%",            # "ran 50% of time"
    "whole": lambda v: f"{v:.0f}",                     # steps, ranks
    "short": si_short,                                 # "vol 12 · inv 3"
    "short/s": lambda v: si_short(v) + "/s",
    "short FLOP/s": lambda v: si_short(v) + "FLOP/s",
    "processes": lambda v: f"{v:.0f} process{'es' if v != 1 else ''}",
}


def fmt_detail(parts: Iterable[DetailPart]) -> str:
    """A figure's detail as text: its words as they are, each (value, unit) pair formatted."""
    out = []
    for p in parts:
        if isinstance(p, str):
            out.append(p)
        else:
            v, unit = p
            f = _DETAIL.get(unit)
            out.append(f(v) if f is not None else fmt_value(v, unit))
    return "".join(out)


def fmt_elapsed(s: float) -> str:
    s = int(max(0.0, s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"
