"""The live view's MFU panel: the trace windows' MFU (live/traces.py computes it
per window with the roofline; here it becomes figures), against the measured and the datasheet
peak."""
from __future__ import annotations

from statistics import median
from typing import Any

from .figures import Figure, PanelContext, PanelFigures


def mfu_panel(c: PanelContext) -> PanelFigures:
    """The newest trace window's MFU (median over its steps; over its ranks' newest windows in
    a multi-rank job), against the measured and the datasheet peak; the sparkline has one point
    per window, placed at its end."""
    wins = [w for w in c.snap.mfu if w.get("mfu")]
    # "torch trace" or "jax trace": whose windows the figures are (the newest's)
    panel = PanelFigures(f"{(c.snap.mfu[-1] if c.snap.mfu else {}).get('framework', 'torch')} trace")
    if not wins:
        panel.notes.append("no MFU: no op with a cost model and shapes in the trace windows")
        return panel
    newest: dict[int, dict[str, Any]] = {}
    for w in wins:
        newest[w["rank"]] = w["mfu"]
    last = list(newest.values())
    dtype = last[-1].get("dtype")
    steps = sum(len(m.get("steps") or []) for m in last)
    ranks = (" · ", (len(last), "whole"), " ranks") if len(last) > 1 else ()
    for field_, label, short, of in (("mfu_measured", f"MFU ({dtype}, measured)", "MFU", "measured"),
                                     ("mfu_datasheet", f"MFU ({dtype}, datasheet)", "MFU sheet", "datasheet")):
        vals = [m[field_] for m in last if m.get(field_) is not None]
        if not vals:
            continue
        peak = last[-1].get(f"peak_{of}_flops_per_s")
        hist = _window_points(c, wins, field_)
        panel.figures.append(Figure(f"torch.{field_}", label, short, 100.0 * median(vals), "percent",
                                    hist, scale=100.0, headline=field_ == "mfu_measured" or not any(
                                        m.get("mfu_measured") is not None for m in last),
                                    detail_parts=("of ", (peak, "short FLOP/s"), " · ", (steps, "whole"), " steps",
                                                  *ranks) if peak else ()))
    rate = [m["flops_per_s"] for m in last if m.get("flops_per_s") is not None]
    if rate:
        panel.figures.append(Figure("torch.flops", "FLOP/s (traced steps)", "FLOP/s", median(rate), "/s",
                                    _window_points(c, wins, "flops_per_s", 1.0)))
    if not panel.figures[:1] or panel.figures[0].key == "torch.flops":
        panel.notes.append("MFU: no peak for the dtype: run `counterprof calibrate`")
    return panel


def _window_points(c: PanelContext, wins: list[dict[str, Any]], field_: str,
                   scale: float = 100.0) -> list[float | None]:
    """One value per sparkline point: the newest window ending in it (None where none did)."""
    if not c.points:
        return []
    tick = c.snap.tick_ns
    # "now": the newest sample's tick (the other panels' right edge), else the newest window's end
    end = (c.snap.newest + 1) * tick if c.snap.newest is not None else max(w["end_ns"] for w in wins) + 1
    span = c.snap.window_ticks * tick
    out: list[float | None] = [None] * c.points
    for w in wins:
        v = w["mfu"].get(field_)
        at = (w["end_ns"] - (end - span)) * c.points // span
        if v is not None and 0 <= at < c.points:
            out[at] = scale * v
    return out
