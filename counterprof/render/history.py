"""`counterprof history show` as text and JSON: one line per series per command, a sparkline of
its trend and its change points. Formats; computes nothing."""
from __future__ import annotations

import math
from collections.abc import Sequence, Set
from typing import Any

from ..analysis.changepoints import ChangePoint
from ..store.history import Trend, command_display
from .console import inert
from ..ground import units

MAX_POINTS = 40        # sparkline: the newest values


def sparkline(values: list[float], marks: Set[int] = frozenset()) -> str:
    """The newest values' trend, scaled from their smallest to their largest; '|' before a
    change point (marks: indices into values)."""
    offset = max(0, len(values) - MAX_POINTS)
    return units.sparkline(values[offset:], lo=None, marks={m - offset for m in marks})


def _run_label(run: dict[str, Any]) -> str:
    bits = [f"run {run['seq']}"]
    if run.get("start_time"):
        bits.append(str(run["start_time"])[:10])
    if run.get("git_rev"):
        bits.append(f"rev {run['git_rev'][:8]}")
    return bits[0] + (f" ({', '.join(bits[1:])})" if len(bits) > 1 else "")


def change_text(t: Trend, cp: ChangePoint) -> str:
    return (f"{_run_label(t.runs[cp.index])}: {units.change(cp.change, none='from 0')} "
            f"({units.value(cp.before, t.unit)} → {units.value(cp.after, t.unit)})")


def _verdicts(t: Trend) -> str:
    words = [v for v in t.verdicts if v]
    if not words:
        return ""
    first, last = words[0], words[-1]
    return first if first == last else f"{first} → {last}"


def hidden_text(hidden: list[tuple[str, str]]) -> str:
    """The line that says which series the default view leaves out ((command, series) pairs),
    and how to show them; "" when none."""
    if not hidden:
        return ""
    metrics = sum(1 for _, s in hidden if s.startswith("metric:"))
    scoped = sum(1 for _, s in hidden if "@" in s and not s.startswith("metric:"))
    kinds = [f"{metrics} metric:*"] if metrics else []
    if scoped:
        kinds.append(f"{scoped} per step or region, NAME@SCOPE")
    if len(hidden) > metrics + scoped:
        kinds.append(f"{len(hidden) - metrics - scoped} other")
    return f"{len(hidden)} more series not shown ({', '.join(kinds)}): --metric '*' shows them"


def history_text(db: str, runs: int, trends: list[Trend], points: list[list[ChangePoint]],
                 threshold: float, hidden: Sequence[tuple[str, str]] = ()) -> str:
    lines = [f"counterprof history: {db}, {runs} run{'s' if runs != 1 else ''}"]
    command = None
    table: list[tuple[str, ...]] = []

    def flush() -> None:
        if not table:
            return
        head = ("series", "runs", "first", "latest", "median", "trend (oldest → newest)", "verdict", "change points")
        widths = [max(len(r[i]) for r in [head, *table]) for i in range(len(head))]
        for r in [head, *table]:
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        table.clear()

    for t, cps in zip(trends, points):
        if t.command != command:
            flush()
            command = t.command
            n = len({s for x in trends if x.command == command for s in x.seqs})
            hosts = sorted({r["host"] for x in trends if x.command == command for r in x.runs if r["host"]})
            lines += ["", f"command: {inert(command_display(command))}  ({n} run{'s' if n != 1 else ''}; "
                          f"host{'s' if len(hosts) != 1 else ''} "
                          f"{inert(', '.join(hosts)) or 'unknown'})"]
        known = t.known()
        table.append((inert(t.series), str(len(t.values)), units.value(known[0] if known else None, t.unit),
                      units.value(known[-1] if known else None, t.unit), units.value(t.median(), t.unit),
                      sparkline(t.values, {c.index for c in cps}), _verdicts(t),
                      "; ".join(change_text(t, c) for c in cps) or "none"))
    flush()
    if not trends:
        lines.append("no series to show")
    lines.append(f"change points: E-divisive (energy statistic, permutation test p < 0.05) with a median "
                 f"shift of at least {100 * threshold:g}%; '|' in a trend marks one")
    if hidden:
        lines.append(hidden_text(list(hidden)))
    return "\n".join(lines) + "\n"


def history_json(trends: list[Trend], points: list[list[ChangePoint]], threshold: float,
                 hidden: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
    return {"threshold": threshold, "method": "e-divisive, permutation test, alpha 0.05",
            "not_shown": [{"command": command_display(c), "series": s} for c, s in hidden],
            "series": [{"command": command_display(t.command), "series": t.series, "unit": t.unit,
                        "points": [{**r, "value": (v if math.isfinite(v) else None), "verdict": vd}
                                   for r, v, vd in zip(t.runs, t.values, t.verdicts)],
                        "change_points": [{"index": c.index, "run": t.runs[c.index], "before": c.before,
                                           "after": c.after, "change": c.change, "p_value": c.p_value}
                                          for c in cps]}
                       for t, cps in zip(trends, points)]}
