"""`counterprof breakdown` tables. Computes nothing: it formats an analysis.breakdown.Breakdown."""
from __future__ import annotations

import re

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..analysis.breakdown import Breakdown, RankBreakdown, percentages
from counterprof.ground.units import duration, points


def short_name(name: str, width: int = 60) -> str:
    """A kernel's name without template and argument lists (like HTA's shorten_name)."""
    if not name.startswith(("Memcpy", "Memset")):
        name = name.replace("(anonymous namespace)::", "")
        prev = None
        while prev != name:   # innermost first
            prev = name
            name = re.sub(r"<[^<>]*>", "", name)
            name = re.sub(r"\([^()]*\)", "", name)
        name = name.replace("void ", "").strip() or prev
    return name if len(name) <= width else name[: width - 1] + "…"


def _table(title: str, *columns: str, shrink_first: bool = False) -> Table:
    t = Table(title=title, title_justify="left", title_style="bold", box=None, pad_edge=False,
              padding=(0, 1))
    for i, c in enumerate(columns):
        if i == 0:
            t.add_column(c, justify="left", no_wrap=True, min_width=None if shrink_first else 9)
        else:
            t.add_column(c, justify="right", no_wrap=True)
    return t


def _who(r: RankBreakdown) -> str:
    return "all ranks" if r.rank is None else f"rank {r.rank}"


def render(b: Breakdown, rules: str = "counterprof") -> Group:
    rows = list(b.ranks) + ([b.total] if b.total is not None and len(b.ranks) > 1 else [])
    parts: list[RenderableType] = []
    if not b.ranks:
        parts.append(Text("No GPU activity in this run's traces (CPU-only traces): nothing to "
                          "break down.", style="yellow"))
    else:
        t = _table("GPU time (temporal breakdown over the GPU-active time of each window)",
                   "", "windows", "GPU-active", "idle", "compute", "non-compute", "GPU spans",
                   "left out")
        for r in rows:
            tm = r.temporal
            t.add_row(_who(r), str(r.windows), duration(tm.kernel_time_ns), points(tm.pct(tm.idle_ns)),
                      points(tm.pct(tm.compute_ns)), points(tm.pct(tm.non_compute_ns)),
                      f"{r.gpu_spans:,}", f"{r.excluded_spans:,}")
        parts += [t, Text("")]

        t = _table("Kernel types and their overlaps (share of the time any of them runs)",
                   "", "kernel types", "time", "share")
        for r in rows:
            shares = percentages(r.kernel_types)
            for i, (label, ns) in enumerate(r.kernel_types.items()):
                t.add_row(_who(r) if i == 0 else "", label, duration(ns), points(shares[label]))
        parts += [t, Text("")]

        t = _table("Communication overlapped by compute", "", "communication", "overlapped",
                   "overlap")
        for r in rows:
            o = r.overlap
            t.add_row(_who(r), duration(o.communication_ns), duration(o.overlapped_ns), points(o.pct))
        parts += [t, Text("")]

        t = _table("Idle time per stream (gaps between kernels, memcpys, memsets)", "", "stream",
                   "idle", "host wait", "kernel wait", "other")
        for r in b.ranks:
            for s in r.idle:
                t.add_row(_who(r), str(s.stream), duration(s.idle_ns), duration(s.host_wait_ns),
                          duration(s.kernel_wait_ns), duration(s.other_ns))
        parts += [t, Text("")]

        t = _table("Kernel launches (runtime call, then the delay until the GPU starts it)", "",
                   "launches", "call mean", "delay mean", "delay p95", ">50µs calls",
                   ">100µs delays")
        for r in rows:
            ls = r.launches
            t.add_row(_who(r), f"{ls.launches:,}", duration(ls.cpu_duration.mean_ns),
                      duration(ls.launch_delay.mean_ns), duration(ls.launch_delay.p95_ns),
                      f"{ls.slow_launches:,}", f"{ls.delayed_launches:,}")
        parts += [t, Text("")]

        top = (b.total or b.ranks[0]).top
        t = _table(f"Top kernels ({'all ranks' if len(b.ranks) > 1 else _who(b.ranks[0])})",
                   "kernel", "class", "count", "total", "mean", "share", shrink_first=True)
        for k in top:
            t.add_row(short_name(k.name), k.kernel_class, f"{k.count:,}", duration(k.total_ns),
                      duration(k.mean_ns), points(k.share_pct))
        parts.append(t)
    for rank, why in sorted(b.skipped.items()):
        parts.append(Text(f"rank {rank}: {why}", style="dim"))
    if rules != "counterprof":
        parts.append(Text(f"kernel classes: {rules} rules", style="dim"))
    return Group(*parts)
