"""The live view's panels of the workload's own collectors: perf (counters), host (the
process tree and the system) and threads (the critical thread's states). Numbers only: each
figure's detail is words and (value, unit) pairs that ground/units.py writes."""
from __future__ import annotations

from typing import Any, overload
from collections.abc import Mapping

from .buckets import (CURRENT_S, LiveSeries, Snapshot, combined, coverage, cpu_seconds,
                      cpus_from_seconds, current_value, gauge_last, gauge_mean, history_value,
                      kind_of, per_ns, quotient, rate, weighted)
from .figures import Figure, PanelContext, PanelFigures, panel_status


def event_base(metric: str) -> str:
    return metric.split(":")[0]


def _series_by_base(snap: Snapshot, source: str) -> dict[str, LiveSeries]:
    """perf metrics by event name without modifiers (cycles:u -> cycles), entities summed."""
    out: dict[str, LiveSeries] = {}
    names: dict[str, str] = {}
    for s, m, _e in snap.series:
        if s == source:
            names.setdefault(event_base(m), m)
    for base, metric in names.items():
        out[base] = combined(snap, source, metric) or LiveSeries({}, {})
    return out


@overload
def _mux_coverage(series: Mapping[str, LiveSeries], c: PanelContext, seconds: float) -> float | None: ...
@overload
def _mux_coverage(series: Mapping[str, LiveSeries], c: PanelContext, seconds: None) -> list[float | None]: ...
def _mux_coverage(series: Mapping[str, LiveSeries], c: PanelContext, seconds: float | None
                  ) -> float | list[float | None] | None:
    """The worst share counted among the events, now (seconds) or per bin (None)."""
    if seconds is not None:
        now = [coverage(c.now(b, seconds)) for b in series.values()]
        vals = [v for v in now if v is not None]
        return min(vals) if vals else None
    per_event = [c.bins(b) for b in series.values()]
    hist: list[float | None] = []
    for i in range(c.points):
        at = [coverage(p[i]) for p in per_event if p[i] is not None]
        vals = [v for v in at if v is not None]
        hist.append(min(vals) if vals else None)
    return hist


def perf_panel(c: PanelContext, statuses: Mapping[str, Any], title: str = "perf") -> PanelFigures:
    panel = PanelFigures(title)
    ser = _series_by_base(c.snap, "perf")
    used: set[str] = set()
    figs = panel.figures

    clock = next((n for n in ("task-clock", "cpu-clock") if n in ser), None)
    if clock:
        used.add(clock)
    if c.perf_system_wide:
        clock = None              # every CPU's whole time, idle included: no busy figure, no GHz
    if clock:
        b = ser[clock]
        figs.append(Figure("perf.cpus", "CPU utilization", clock, per_ns(c.now(b)), "cpus",
                           [per_ns(x) for x in c.bins(b)], scale=1.0, headline=True))
    cyc = next((n for n in ("cycles", "cpu-cycles") if n in ser), None)
    if cyc and "instructions" in ser:
        used.update((cyc, "instructions"))
        ib, cb = ser["instructions"], ser[cyc]
        ghz = quotient(c.now(cb), c.now(ser[clock])) if clock else None
        figs.append(Figure("perf.ipc", "IPC", "IPC",
                           quotient(c.now(ib), c.now(cb)), "ratio",
                           [quotient(i, k) for i, k in zip(c.bins(ib), c.bins(cb))],
                           detail_parts=((ghz, "GHz"),) if ghz else (), headline=True))
    # misses as a share of their accesses, where the PMU counts both
    pairs = [("cache-misses", "cache-references", "cache misses", "of refs")]
    for base in ser:
        if base.endswith("-load-misses"):
            pairs.append((base, base.replace("-load-misses", "-loads"),
                          base.replace("-load-misses", " load misses"), "of loads"))
    pairs.append(("branch-misses", "branches", "branch misses", "of branches"))
    for miss, total, label, of in pairs:
        if miss not in ser:
            continue
        used.add(miss)
        mb = ser[miss]
        if total in ser:
            used.add(total)
            tb = ser[total]
            r = rate(c.now(mb))
            figs.append(Figure(f"perf.{miss}", label, miss, quotient(c.now(mb), c.now(tb), 100.0),
                               "percent", [quotient(m, t, 100.0) for m, t in zip(c.bins(mb), c.bins(tb))],
                               detail_parts=(of,) + ((" · ", (r, "short/s")) if r is not None else ()),
                               headline=miss == "cache-misses"))
        else:
            figs.append(Figure(f"perf.{miss}", label, miss, rate(c.now(mb)), "/s",
                               [rate(x) for x in c.bins(mb)]))
    for base, b in ser.items():      # everything else counted: a rate per second
        if base in used:
            continue
        kind, unit = kind_of(c.catalog, base, b.fine)
        value, ukey = current_value(kind, unit, c.now(b))
        figs.append(Figure(f"perf.{base}", base, base, value, ukey,
                           [history_value(kind, unit, x) for x in c.bins(b)]))
    if ser:
        hist = _mux_coverage(ser, c, None)
        now = _mux_coverage(ser, c, CURRENT_S)
        if any(h is not None and h < 0.9999 for h in hist) or (now is not None and now < 0.9999):
            figs.append(Figure("perf.mux", "multiplexed", "mux",
                               None if now is None else 100.0 * (1 - now), "percent",
                               [None if h is None else 100.0 * (1 - h) for h in hist], scale=100.0,
                               detail_parts=() if now is None else ("ran ", (100 * now, "whole percent"), " of time"),
                               alert=now is not None and now < 0.9999, headline=True))
    st = statuses.get("perf") or {}
    events = st.get("events") or {}
    missing = [n for n, e in events.items() if e.get("status") not in (None, "counted")]
    if missing:
        panel.notes.append(f"not counted here: {', '.join(missing)}")
    panel_status(panel, st)
    return panel


def host_panel(c: PanelContext, statuses: Mapping[str, Any]) -> PanelFigures:
    panel = PanelFigures("host")
    figs = panel.figures

    def s(metric: str, entity: str) -> LiveSeries | None:
        return combined(c.snap, "host", metric, [entity])

    user, sys_ = s("proc.cpu_user", "process"), s("proc.cpu_system", "process")
    if user is not None or sys_ is not None:
        busy, hist = _cpu_percent(c, cpu_seconds(user, sys_))
        sys_cpus = cpus_from_seconds(c.now(sys_))
        figs.append(Figure("host.cpu", "CPU (tree)", "CPU", busy, "percent", hist, scale=100.0,
                           detail_parts=() if sys_cpus is None else ("sys ", (100.0 * sys_cpus, "percent")),
                           headline=True))
    rss = s("proc.rss", "process")
    if rss is not None:
        figs.append(_gauge_figure(c, rss, "host.rss", "RSS", "RSS", "bytes", headline=True))
    for metric, label, short in (("proc.read_bytes", "disk read", "read"),
                                 ("proc.write_bytes", "disk write", "write")):
        b = s(metric, "process")
        if b is not None:
            figs.append(Figure(f"host.{short}", label, short, rate(c.now(b)), "bytes/s",
                               [rate(x) for x in c.bins(b)], headline=True))
    vol, inv = s("proc.ctx_switches_voluntary", "process"), s("proc.ctx_switches_involuntary", "process")
    if vol is not None or inv is not None:
        rv, ri = rate(c.now(vol)), rate(c.now(inv))
        tot = None if rv is None and ri is None else (rv or 0) + (ri or 0)
        hist = [None if a is None and b is None else (a or 0) + (b or 0)
                for a, b in zip(map(rate, c.bins(vol)), map(rate, c.bins(inv)))]
        figs.append(Figure("host.ctx", "context switches", "ctx-sw", tot, "/s", hist,
                           detail_parts=("vol ", (rv or 0, "short"), " · inv ", (ri or 0, "short"))))
    thr, procs = s("proc.threads", "process"), s("proc.processes", "process")
    if thr is not None:
        np_ = gauge_last(c.now(procs))
        figs.append(_gauge_figure(c, thr, "host.threads", "threads", "threads", "count",
                                  detail_parts=() if np_ is None else ((np_, "processes"),)))
    util, iow = s("system.cpu_util", "system"), s("system.cpu_iowait", "system")
    if util is not None:
        w = weighted(c.now(iow))
        figs.append(Figure("host.system_cpu", "system CPU", "sys-CPU", weighted(c.now(util)), "percent",
                           [weighted(x) for x in c.bins(util)], scale=100.0,
                           detail_parts=() if w is None else ("iowait ", (w, "percent")), headline=True))
    used, avail = s("system.mem_used", "system"), s("system.mem_available", "system")
    if used is not None:
        a = gauge_last(c.now(avail))
        figs.append(_gauge_figure(c, used, "host.mem", "memory used", "mem", "bytes",
                                  detail_parts=() if a is None else ((a, "bytes"), " avail")))
    panel_status(panel, statuses.get("host") or {})
    return panel


def threads_panel(c: PanelContext, statuses: Mapping[str, Any]) -> PanelFigures:
    """The critical (main) thread's states and the helper roles' CPU (threads collector)."""
    panel = PanelFigures("threads")
    figs = panel.figures

    def s(metric: str) -> LiveSeries | None:
        return combined(c.snap, "threads", metric)

    states = {k: s(f"thread.main.{k}") for k in ("running", "runnable", "blocked")}
    if states["running"] is not None:
        # shares of the main threads' time: several main threads (a launcher's workers, ranks)
        # show as one thread's states, not as 200% on-CPU (their states add up to their time)
        raw = {k: _cpu_percent(c, ser) for k, ser in states.items() if ser is not None}
        now_n = sum(v[0] for v in raw.values() if v[0] is not None) / 100.0
        hist_n = [sum(v[1][i] or 0.0 for v in raw.values()) / 100.0 for i in range(len(raw["running"][1]))]
        for key, label, short in (("running", "main on-CPU", "main"),
                                  ("runnable", "main runnable", "runq"),
                                  ("blocked", "main blocked", "blocked")):
            if key not in raw:
                continue
            now, hist = raw[key]
            if now is not None and now_n > 1.0:
                now /= now_n
            hist = [h / n if h is not None and n > 1.0 else h for h, n in zip(hist, hist_n)]
            figs.append(Figure(f"threads.main_{key}", label, short, now, "percent", hist,
                               scale=100.0, headline=key != "blocked", alert=key == "runnable"
                               and now is not None and now >= 5.0))
    for role, label in (("intraop", "intra-op"), ("loader", "DataLoader"),
                        ("comm", "comm"), ("other", "other")):
        ser = s(f"thread.{role}.running")
        if ser is None:
            continue
        now, hist = _cpu_percent(c, ser)
        figs.append(Figure(f"threads.{role}", f"{label} CPU", role, now, "percent", hist, scale=100.0))
    panel_status(panel, statuses.get("threads") or {})
    return panel


def _cpu_percent(c: PanelContext, cpu_s: LiveSeries) -> tuple[float | None, list[float | None]]:
    """A series of CPU seconds as the percent of one CPU it kept busy: now, and per point."""
    now = cpus_from_seconds(c.now(cpu_s))
    return (None if now is None else 100.0 * now,
            [None if v is None else 100.0 * v for v in map(cpus_from_seconds, c.bins(cpu_s))])


def _gauge_figure(c: PanelContext, ser: LiveSeries, key: str, label: str, short: str, unit: str,
                  **kw: Any) -> Figure:
    """A gauge (RSS, threads, memory used): its newest value now, its mean per sparkline point."""
    return Figure(key, label, short, gauge_last(c.now(ser)), unit, [gauge_mean(x) for x in c.bins(ser)], **kw)
