"""`counterprof breakdown` of a NeuronCore: formats analysis.breakdown_neuron's tables."""
from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from counterprof.ground.units import duration, share, si

from ..analysis.breakdown_neuron import NeuronBreakdown


def _table(title: str, *columns: str) -> Table:
    t = Table(title=title, title_justify="left", title_style="bold", box=None, pad_edge=False, padding=(0, 1))
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i == 0 else "right", no_wrap=True)
    return t


def render_neuron(breakdowns: list[NeuronBreakdown]) -> Group:
    parts: list[RenderableType] = []
    for b in breakdowns:
        a = b.active_ns
        parts.append(Text(f"rank {b.rank}: NeuronCore active {duration(a)} (first activity to last)", style="bold"))
        t = _table("engines (instructions other than semaphore waits, overlaps counted once)",
                   "engine", "instructions", "busy", "of active", "semaphore waits")
        for r in b.engines:
            t.add_row(r.name, f"{r.count:,}", duration(r.busy_ns), share(r.busy_ns / a if a else None),
                      duration(r.waits_ns) if r.waits_ns else "-")
        parts += [t, Text("")]
        t = _table("instructions by engine and opcode (summed durations)", "instruction", "count", "time",
                   "of active")
        for r in b.top:
            t.add_row(r.name, f"{r.count:,}", duration(r.total_ns), share(r.total_ns / a if a else None))
        parts += [t, Text("")]
        if b.dma:
            t = _table("DMA by queue type", "queue type", "packets", "moving", "of active", "bytes", "rate moving")
            for r in b.dma:
                t.add_row(r.name, f"{r.count:,}", duration(r.busy_ns), share(r.busy_ns / a if a else None),
                          si(r.nbytes, "B"), si(r.nbytes / (r.busy_ns / 1e9), "B/s") if r.busy_ns else "-")
            parts += [t, Text("")]
        if b.collectives:
            t = _table("collectives", "operation", "count", "time", "of active", "bytes")
            for r in b.collectives:
                t.add_row(r.name, f"{r.count:,}", duration(r.busy_ns), share(r.busy_ns / a if a else None),
                          si(r.nbytes, "B"))
            parts += [t, Text("")]
    return Group(*parts)
