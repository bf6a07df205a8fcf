"""What the live view shows, as pure functions over the last minute of samples.

Input: a `Snapshot` of the live window (per (source, metric, entity), one `Bucket` of sums
per display tick), the metric catalog and the collectors' statuses. Output: panels of
`Figure`s (a current value, a history for the sparkline, a unit key the renderer formats)
and a `Verdict` line from raw signals. Nothing here reads files, keeps state or prints.

Rates are computed as sums over the covered time (value sum / duration the known values
cover), never as means of per-tick rates, so ticks of different lengths weigh right.
"""
from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

# One display tick of one series, as sums (so buckets merge by adding):
#   vsum  sum of known values            vdur  sum of value x duration (ratios)
#   kdur  duration the known values cover (ns)    qdur  duration actually counted (quality x duration)
#   dur   all duration, known or not     known/unknown  row counts
#   last  newest known value (gauges)    vmax  largest known value    t_last newest time (ns)
Bucket = namedtuple("Bucket", "vsum vdur kdur qdur dur known unknown last vmax t_last")
EMPTY = Bucket(0.0, 0.0, 0.0, 0.0, 0.0, 0, 0, None, None, 0)

CURRENT_S = 1.0    # "now" values: the last second every collector has reported
VERDICT_S = 3.0    # the bottleneck line: a little longer, so it does not flicker
STALE_S = 2.0      # a collector this far behind the others is left out of "now"

Key = tuple  # (source, metric, entity)


def merge(a: Bucket, b: Bucket) -> Bucket:
    """Two buckets of one series (or two entities' buckets: see merge_entities)."""
    if a.last is None or (b.last is not None and b.t_last >= a.t_last):
        last = b.last
    else:
        last = a.last
    vmax = a.vmax if b.vmax is None else (b.vmax if a.vmax is None else max(a.vmax, b.vmax))
    return Bucket(a.vsum + b.vsum, a.vdur + b.vdur, a.kdur + b.kdur, a.qdur + b.qdur,
                  a.dur + b.dur, a.known + b.known, a.unknown + b.unknown, last, vmax,
                  max(a.t_last, b.t_last))


@dataclass(frozen=True)
class Snapshot:
    """A copy of the live window at two resolutions: `series`, the last seconds in display
    ticks (keyed by time // tick_ns), for current values and the verdict; `history`, the
    whole window in buckets of `history_ticks` ticks (keyed by tick // history_ticks), for
    the sparklines, so a frame merges tens of buckets per series, not hundreds."""

    tick_ns: int
    window_ticks: int
    series: Mapping[Key, Mapping[int, Bucket]]
    history: Mapping[Key, Mapping[int, Bucket]] = field(default_factory=dict)
    history_ticks: int = 1
    newest: int | None = None          # newest tick seen in any series
    version: int = 0                   # changes whenever data arrives
    mfu: tuple = ()                    # per torch trace window, newest last: {"rank", "end_ns", "mfu"}

    def keys(self, source: str | None = None) -> list[Key]:
        return [k for k in self.series if source is None or k[0] == source]

    def get(self, key: Key) -> "Series":
        return Series(self.series.get(key, {}), self.history.get(key, {}))


@dataclass(frozen=True)
class Series:
    """One series (or a sum of several) at both resolutions."""

    fine: Mapping[int, Bucket]
    coarse: Mapping[int, Bucket]


@dataclass
class Figure:
    key: str                       # stable id, e.g. "perf.cpus", "gpu:0.gpu.util"
    label: str                     # "CPU utilization"
    short: str                     # for the one-line form: "CPUs"
    value: float | None            # None: unknown now
    unit: str                      # cpus | ratio | percent | bytes | bytes/s | /s | a catalog unit
    history: list[float | None] = field(default_factory=list)   # oldest first, one per point
    scale: float | None = None     # the sparkline's top at least this (100 for percent)
    detail: str = ""               # extra words: "sys 0.2%", "of 700 W"
    alert: bool = False            # worth a colour: throttling, multiplexing
    headline: bool = False         # shown in the compact and one-line forms


@dataclass
class PanelFigures:
    title: str
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    status: str = "ok"             # ok | failed | unavailable | waiting
    reason: str = ""


@dataclass
class Verdict:
    label: str                     # CPU-bound | GPU-bound | waiting | waiting for I/O | starved | idle | busy | unknown
    evidence: str                  # "1.00 CPUs busy, no GPU"
    shares: dict = field(default_factory=dict)   # the classifier's time share per class (workload scope)

    def __str__(self) -> str:
        return f"{self.label}: {self.evidence}" if self.evidence else self.label


@dataclass
class LiveFigures:
    panels: list[PanelFigures]
    verdict: Verdict


# -- series arithmetic ------------------------------------------------------------------

def combined(snap: Snapshot, source: str, metric: str, entities: Iterable[str] | None = None
             ) -> Series | None:
    """One series for (source, metric) over the given entities (default: all). Several
    entities add up side by side: values sum, and the time covered is the longest any one
    entity covers, so the rate of the sum is the sum of rates."""
    keys = [k for k in snap.series
            if k[0] == source and k[1] == metric and (entities is None or k[2] in entities)]
    if not keys:
        return None
    if len(keys) == 1:
        return snap.get(keys[0])
    return Series(_sum_side_by_side([snap.series[k] for k in keys]),
                  _sum_side_by_side([snap.history.get(k, {}) for k in keys]))


def _sum_side_by_side(parts: list[Mapping[int, Bucket]]) -> dict[int, Bucket]:
    out: dict[int, Bucket] = {}
    for part in parts:
        for t, b in part.items():
            a = out.get(t)
            out[t] = b if a is None else side_by_side(a, b)
    return out


def side_by_side(a: Bucket, b: Bucket) -> Bucket:
    """Two entities over the same interval: values add; the time covered is not doubled;
    the share counted is the worse one."""
    m = merge(a, b)
    dur = max(a.dur, b.dur)
    worst = min(coverage(a) if a.dur else 1.0, coverage(b) if b.dur else 1.0)
    return m._replace(kdur=max(a.kdur, b.kdur), dur=dur, qdur=worst * dur)


def common_end(snap: Snapshot) -> int | None:
    """The newest tick every source has completed (a source's newest tick is still filling).
    Collectors hand data over at their own cadence (perf every 0.5 s, host every second), so
    "now" ends where all of them have reported, and two panels never disagree only because
    one is fresher. A source silent for more than STALE_S (failed, finished) does not hold
    the others back."""
    newest: dict[str, int] = {}
    for (source, _m, _e), b in snap.series.items():
        if b:
            t = max(b)
            if t > newest.get(source, t - 1):
                newest[source] = t
    if not newest:
        return None
    top = max(newest.values())
    stale = round(STALE_S * 1e9 / snap.tick_ns)
    return min(t for t in newest.values() if t >= top - stale) - 1


def recent(buckets: Mapping[int, Bucket] | None, tick_ns: int, seconds: float,
           end: int | None = None) -> Bucket | None:
    """The `seconds` of a series up to tick `end` (default: its own newest tick)."""
    if not buckets:
        return None
    newest = max(buckets) if end is None else end
    span = max(1, round(seconds * 1e9 / tick_ns))
    acc = EMPTY
    for t in range(newest - span + 1, newest + 1):
        b = buckets.get(t)
        if b is not None:
            acc = merge(acc, b)
    return acc if acc.known or acc.unknown else None


def binned(buckets: Mapping[int, Bucket] | None, end: int | None, window_ticks: int,
           points: int) -> list[Bucket | None]:
    """The window ending at tick `end`, in `points` equal bins (oldest first); None where a
    bin holds no data."""
    out: list[Bucket | None] = [None] * points
    if not buckets or end is None or points <= 0:
        return out
    start = end - window_ticks + 1
    for t, b in buckets.items():
        if start <= t <= end:
            i = (t - start) * points // window_ticks
            out[i] = b if out[i] is None else merge(out[i], b)
    return out


def rate(b: Bucket | None) -> float | None:
    """Per second, for deltas: value sum over the time the known values cover."""
    if b is None or not b.known or b.kdur <= 0:
        return None
    return b.vsum / (b.kdur / 1e9)


def per_ns(b: Bucket | None) -> float | None:
    """Value per nanosecond of interval (task-clock ns per ns = CPUs; s per s likewise x1e9)."""
    if b is None or not b.known or b.kdur <= 0:
        return None
    return b.vsum / b.kdur


def cpus_from_seconds(b: Bucket | None) -> float | None:
    """CPU seconds per second of interval: CPUs kept busy."""
    v = per_ns(b)
    return None if v is None else v * 1e9


def _cpu_seconds(user: Series | None, sys_: Series | None) -> Series:
    """user + system CPU seconds (both cover the same intervals: time is not doubled)."""
    def add(u: Mapping[int, Bucket], s: Mapping[int, Bucket]) -> dict[int, Bucket]:
        out = {}
        for t in set(u) | set(s):
            a, b = u.get(t), s.get(t)
            out[t] = a if b is None else b if a is None else merge(a, b)._replace(
                kdur=max(a.kdur, b.kdur), dur=max(a.dur, b.dur))
        return out
    empty = Series({}, {})
    user, sys_ = user or empty, sys_ or empty
    return Series(add(user.fine, sys_.fine), add(user.coarse, sys_.coarse))


def weighted(b: Bucket | None) -> float | None:
    """Duration-weighted mean, for ratios (percent over an interval)."""
    if b is None or not b.known or b.kdur <= 0:
        return None
    return b.vdur / b.kdur


def gauge_last(b: Bucket | None) -> float | None:
    return None if b is None else b.last


def gauge_mean(b: Bucket | None) -> float | None:
    return None if b is None or not b.known else b.vsum / b.known


def quotient(a: Bucket | None, b: Bucket | None, scale: float = 1.0) -> float | None:
    """a's value sum over b's (instructions / cycles): both over the same ticks."""
    if a is None or b is None or not a.known or not b.known or b.vsum == 0:
        return None
    return scale * a.vsum / b.vsum


def coverage(b: Bucket | None) -> float | None:
    """Share of the interval the counter actually ran (1.0 unless multiplexed)."""
    if b is None or b.dur <= 0:
        return None
    return min(1.0, b.qdur / b.dur)


TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def current_value(kind: str, unit: str, b: Bucket | None) -> tuple[float | None, str]:
    """A series' value for display and its unit key, by catalog kind: gauges their newest
    value, ratios their weighted mean, deltas a rate (time counters as % of the time)."""
    if kind == "gauge":
        return gauge_last(b), unit
    if kind == "ratio":
        return weighted(b), unit
    if unit in TIME_UNITS:
        v = per_ns(b)
        return (None if v is None else 100.0 * v * 1e9 * TIME_UNITS[unit]), "percent"
    r = rate(b)
    if unit in ("bytes", "B"):
        return r, "bytes/s"
    if unit in ("", "count"):
        return r, "/s"
    return r, f"{unit}/s"


def history_value(kind: str, unit: str, b: Bucket | None) -> float | None:
    if kind == "gauge":
        return gauge_mean(b)
    return current_value(kind, unit, b)[0]


def kind_of(catalog: Mapping[str, Any], metric: str, buckets: Mapping[int, Bucket] | None) -> tuple[str, str]:
    """(kind, unit) from the catalog; without an entry, a series with durations is a delta."""
    entry = catalog.get(metric)
    if entry is not None:
        kind = getattr(entry, "kind", None) or entry.get("kind")
        unit = getattr(entry, "unit", None)
        if unit is None:
            unit = entry.get("unit", "")
        return kind, unit
    has_dur = any(b.dur > 0 for b in (buckets or {}).values())
    return ("delta" if has_dur else "gauge"), ""


# -- panels -------------------------------------------------------------------------------

class _Ctx:
    """What every panel builder needs: the snapshot, catalog and the sparkline width.
    perf_system_wide: perf counts every CPU (-a, top): its task-clock is then the CPUs'
    whole time, idle included, and says nothing about how busy anything is."""

    def __init__(self, snap: Snapshot, catalog: Mapping[str, Any], points: int,
                 perf_system_wide: bool = False):
        self.snap, self.catalog, self.points = snap, catalog, points
        self.perf_system_wide = perf_system_wide
        self.end = common_end(snap)

    def bins(self, series: Series | None) -> list[Bucket | None]:
        """The sparkline's points: the history buckets up to "now", in equal bins."""
        h = self.snap.history_ticks
        end = None if self.end is None else self.end // h
        return binned(series.coarse if series else None, end, self.snap.window_ticks // h, self.points)

    def now(self, series: Series | None, seconds: float = CURRENT_S) -> Bucket | None:
        return recent(series.fine if series else None, self.snap.tick_ns, seconds, self.end)


def _base(metric: str) -> str:
    return metric.split(":")[0]


def _series_by_base(snap: Snapshot, source: str) -> dict[str, Series]:
    """perf metrics by event name without modifiers (cycles:u -> cycles), entities summed."""
    out: dict[str, Series] = {}
    names: dict[str, str] = {}
    for s, m, _e in snap.series:
        if s == source:
            names.setdefault(_base(m), m)
    for base, metric in names.items():
        out[base] = combined(snap, source, metric) or Series({}, {})
    return out


def _mux_coverage(series: Mapping[str, Series], c: _Ctx, seconds: float | None):
    """The worst share counted among the events, now (seconds) or per bin (None)."""
    if seconds is not None:
        vals = [coverage(c.now(b, seconds)) for b in series.values()]
        vals = [v for v in vals if v is not None]
        return min(vals) if vals else None
    per_event = [c.bins(b) for b in series.values()]
    hist = []
    for i in range(c.points):
        vals = [coverage(p[i]) for p in per_event if p[i] is not None]
        vals = [v for v in vals if v is not None]
        hist.append(min(vals) if vals else None)
    return hist


def perf_panel(c: _Ctx, statuses: Mapping[str, Any], title: str = "perf") -> PanelFigures:
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
                           detail=f"{ghz:.2f} GHz" if ghz else "", headline=True))
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
                               detail=of + (f" · {_si(r)}/s" if r is not None else ""),
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
                               detail="" if now is None else f"ran {100 * now:.0f}% of time",
                               alert=now is not None and now < 0.9999, headline=True))
    st = statuses.get("perf") or {}
    events = st.get("events") or {}
    missing = [n for n, e in events.items() if e.get("status") not in (None, "counted")]
    if missing:
        panel.notes.append(f"not counted here: {', '.join(missing)}")
    _status(panel, st)
    return panel


def host_panel(c: _Ctx, statuses: Mapping[str, Any]) -> PanelFigures:
    panel = PanelFigures("host")
    figs = panel.figures

    def s(metric: str, entity: str):
        return combined(c.snap, "host", metric, [entity])

    user, sys_ = s("proc.cpu_user", "process"), s("proc.cpu_system", "process")
    if user is not None or sys_ is not None:
        tot = _cpu_seconds(user, sys_)
        busy = cpus_from_seconds(c.now(tot))
        sys_cpus = cpus_from_seconds(c.now(sys_)) if sys_ else None
        figs.append(Figure("host.cpu", "CPU (tree)", "CPU",
                           None if busy is None else 100.0 * busy, "percent",
                           [None if v is None else 100.0 * v for v in map(cpus_from_seconds, c.bins(tot))],
                           scale=100.0,
                           detail="" if sys_cpus is None else f"sys {100.0 * sys_cpus:.1f}%", headline=True))
    rss = s("proc.rss", "process")
    if rss is not None:
        figs.append(Figure("host.rss", "RSS", "RSS", gauge_last(c.now(rss)), "bytes",
                           [gauge_mean(x) for x in c.bins(rss)], headline=True))
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
                           detail=f"vol {_si(rv or 0)} · inv {_si(ri or 0)}"))
    thr, procs = s("proc.threads", "process"), s("proc.processes", "process")
    if thr is not None:
        np_ = gauge_last(c.now(procs)) if procs is not None else None
        figs.append(Figure("host.threads", "threads", "threads", gauge_last(c.now(thr)), "count",
                           [gauge_mean(x) for x in c.bins(thr)],
                           detail="" if np_ is None else f"{np_:.0f} process{'es' if np_ != 1 else ''}"))
    util, iow = s("system.cpu_util", "system"), s("system.cpu_iowait", "system")
    if util is not None:
        w = weighted(c.now(iow)) if iow is not None else None
        figs.append(Figure("host.system_cpu", "system CPU", "sys-CPU", weighted(c.now(util)), "percent",
                           [weighted(x) for x in c.bins(util)], scale=100.0,
                           detail="" if w is None else f"iowait {w:.1f}%", headline=True))
    used, avail = s("system.mem_used", "system"), s("system.mem_available", "system")
    if used is not None:
        a = gauge_last(c.now(avail)) if avail is not None else None
        figs.append(Figure("host.mem", "memory used", "mem", gauge_last(c.now(used)), "bytes",
                           [gauge_mean(x) for x in c.bins(used)],
                           detail="" if a is None else f"{_bytes(a)} avail"))
    _status(panel, statuses.get("host") or {})
    return panel


def threads_panel(c: _Ctx, statuses: Mapping[str, Any]) -> PanelFigures:
    """The critical (main) thread's states and the helper roles' CPU (threads collector)."""
    panel = PanelFigures("threads")
    figs = panel.figures

    def s(metric: str):
        return combined(c.snap, "threads", metric)

    states = {k: s(f"thread.main.{k}") for k in ("running", "runnable", "blocked")}
    if states["running"] is not None:
        for key, label, short in (("running", "main on-CPU", "main"),
                                  ("runnable", "main runnable", "runq"),
                                  ("blocked", "main blocked", "blocked")):
            ser = states[key]
            if ser is None:
                continue
            now = cpus_from_seconds(c.now(ser))
            figs.append(Figure(f"threads.main_{key}", label, short,
                               None if now is None else 100.0 * now, "percent",
                               [None if v is None else 100.0 * v for v in map(cpus_from_seconds, c.bins(ser))],
                               scale=100.0, headline=key != "blocked", alert=key == "runnable"
                               and now is not None and now >= 0.05))
    for role, label in (("intraop", "intra-op"), ("loader", "DataLoader"),
                        ("comm", "comm"), ("other", "other")):
        ser = s(f"thread.{role}.running")
        if ser is None:
            continue
        now = cpus_from_seconds(c.now(ser))
        figs.append(Figure(f"threads.{role}", f"{label} CPU", role,
                           None if now is None else 100.0 * now, "percent",
                           [None if v is None else 100.0 * v for v in map(cpus_from_seconds, c.bins(ser))],
                           scale=100.0))
    _status(panel, statuses.get("threads") or {})
    return panel


# GPU and any other collector: one panel per device (entity gpu:N) or per (source, entity),
# one row per metric, ordered by how the name (without its gpu./gpm. prefix) starts.
_ORDER = ("util", "core_util", "flops", "flop_count", "nc_time",   # (NeuronCores: neuron.*)
          "sm", "occupancy", "tensor", "fp", "dram", "mem", "device_mem", "host_mem", "power", "energy",
          "temp", "clock", "throttle", "pcie", "nvlink",
          # a Neuron runtime's executions and CPU
          "exec", "latency", "device_latency", "runtime_vcpu")
_ALERT_WORDS = ("throttle", "clock_event", "clocks_event", "xid", "ecc", "exec_errors", "exec_timed_out",
                "exec_failed_to_queue", "exec_completed_with", "exec_incorrect_input")
# a Neuron device's panel: the figures per core and runtime; the memory breakdowns and Trn2's
# physical cores stay in the run, and error counts show when there are some
_NEURON_DETAIL = ("neuron.device_mem_", "neuron.host_mem_", "neuron.sysfs_device_mem_used")
_NEURON_USED = ("neuron.device_mem_used", "neuron.host_mem_used", "neuron.device_mem_total")


def _hidden(metric: str, entity: str, value: float | None) -> bool:
    if not metric.startswith("neuron."):
        return False
    if "/phys:" in entity or (metric.startswith(_NEURON_DETAIL) and metric not in _NEURON_USED):
        return True
    return any(w in metric for w in _ALERT_WORDS) and not value


def _order(metric: str) -> tuple[int, str]:
    short = _short_name(metric).lower()
    for i, w in enumerate(_ORDER):
        if short.startswith(w):
            return i, short
    return len(_ORDER), short


def _short_name(metric: str) -> str:
    for prefix in ("gpu.", "gpm.", "nvml.", "neuron."):
        if metric.startswith(prefix):
            return metric[len(prefix):]
    return metric


def device_panels(c: _Ctx, exclude: Iterable[str] = ("perf", "host", "threads")) -> list[PanelFigures]:
    groups: dict[str, list[Key]] = {}
    skip = set(exclude)
    for key in c.snap.series:
        source, metric, entity = key
        if source in skip:
            continue
        groups.setdefault(_panel_title(source, entity), []).append(key)
    panels = []
    for title in sorted(groups, key=_device_sort):
        keys = sorted(groups[title], key=lambda k: (_order(k[1]), _entity_sort(k[2])))
        metrics = {k[1] for k in keys}
        panel = PanelFigures(title)
        shown_beside = {_companion(m) for m in metrics} & metrics
        for key in keys:
            source, metric, entity = key
            if metric in shown_beside:
                continue                        # a limit or total: "of N" beside its metric
            b = c.snap.get(key)
            kind, unit = kind_of(c.catalog, metric, b.fine)
            value, ukey = current_value(kind, unit, c.now(b))
            if _hidden(metric, entity, value):
                continue
            # a part of the device (neuron:0/core:1): its rows carry the part's name
            part = entity[len(title) + 1:] if entity.startswith(title + "/") else ""
            label = _part_label(part, metric) if part else _short_name(metric)
            fig = Figure(f"{entity if part else title}.{metric}", label, label, value, ukey,
                         [history_value(kind, unit, x) for x in c.bins(b)],
                         scale=100.0 if ukey == "percent" else None)
            limit_key = (source, _companion(metric), entity)
            if limit_key not in c.snap.series:       # a core's memory, of its device's size
                limit_key = (source, _companion(metric), title)
            if limit_key in c.snap.series:
                lim = gauge_last(c.now(c.snap.get(limit_key)))
                if lim:
                    fig.detail = f"of {_bytes(lim) if unit == 'bytes' else _fmt_plain(lim) + ' ' + unit}".rstrip()
                    fig.scale = lim
            if any(w in metric.lower() for w in _ALERT_WORDS) and value:
                fig.alert = True
            panel.figures.append(fig)
        for f in panel.figures[:2]:
            f.headline = True
        panels.append(panel)
    return panels


def _companion(metric: str) -> str:
    """The metric shown as "of N" beside this one: power -> power_limit, mem_used -> mem_total."""
    if metric.endswith("_used"):
        return metric[: -len("_used")] + "_total"
    return metric + "_limit"


# a Neuron device's rows in the panel's narrow label column: the part (nc1 = NeuronCore 1,
# p123 = the workload's runtime in process 123) and a short name
_NEURON_LABELS = {"core_util": "util", "flops_rate": "FLOP/s", "device_mem_used": "mem",
                  "flop_count": "FLOPs", "nc_time_in_use": "busy", "host_mem_used": "host mem",
                  "runtime_vcpu_user": "vCPU user", "runtime_vcpu_system": "vCPU sys",
                  "exec_completed": "execs", "latency_p50": "lat p50", "latency_p99": "lat p99",
                  "device_latency_p50": "dev p50", "device_latency_p99": "dev p99"}


def _part_label(part: str, metric: str) -> str:
    short = _short_name(metric)
    if part.startswith("core:"):
        return f"nc{part[5:]} {_NEURON_LABELS.get(short, short)}"
    if part.startswith("pid:"):
        return f"p{part[4:]} {_NEURON_LABELS.get(short, short)}"
    return f"{part} {short}"


def _panel_title(source: str, entity: str) -> str:
    """A GPU's panel is its entity; a Neuron device's holds its cores and runtimes
    (neuron:0/core:1 -> neuron:0); other collectors' entities are named with the source."""
    if entity.startswith("gpu"):
        return entity
    if entity.startswith("neuron:"):
        return entity.split("/", 1)[0]
    return f"{source} {entity}"


def _entity_sort(entity: str):
    return [(0, int(p), "") if p.isdigit() else (1, 0, p)
            for p in entity.replace(":", "/").split("/")]


def _device_sort(title: str):
    if title.startswith("gpu:") and title[4:].isdigit():
        return (0, int(title[4:]), title)
    if title.startswith("neuron:") and title[7:].isdigit():
        return (1, int(title[7:]), title)
    return (2, 0, title)


def _status(panel: PanelFigures, st: Mapping[str, Any]) -> None:
    status = st.get("status", "ok")
    if status in ("failed", "unavailable"):
        panel.status, panel.reason = status, st.get("reason", "")
    elif not panel.figures:
        panel.status = "waiting"


# -- the verdict ----------------------------------------------------------------------------

def _gpu_util(c: _Ctx, seconds: float) -> list[tuple[str, float]]:
    """Per GPU: the busiest utilization-like percent metric (name holds 'util')."""
    out: dict[str, float] = {}
    for key, fine in c.snap.series.items():
        source, metric, entity = key
        if not entity.startswith("gpu") or "util" not in metric.lower() or "mem" in metric.lower():
            continue
        kind, unit = kind_of(c.catalog, metric, fine)
        b = c.snap.get(key)
        if unit != "percent":
            continue
        v, _ = current_value(kind, unit, c.now(b, seconds))
        if v is not None:
            out[entity] = max(out.get(entity, 0.0), v)
    return sorted(out.items(), key=lambda kv: _device_sort(kv[0]))


class LiveView:
    """The live window's last `seconds` as the signal table reads a scope (signals.MetricView):
    every entity of a metric summed side by side, deltas as value per ns of covered time x
    the window, so the same formulas give the report's and the live line's signals."""

    def __init__(self, c: _Ctx, seconds: float):
        self.c, self.seconds = c, seconds
        self.wall_ns = seconds * 1e9
        self._keys: dict[str, list[Key]] = {}
        for key in c.snap.series:
            source, metric, _entity = key
            if source == "perf":
                if c.perf_system_wide:   # every CPU's time, idle included: says nothing of the workload
                    continue
                metric = _base(metric)
            self._keys.setdefault(metric, []).append(key)

    def _now(self, metric: str) -> Bucket | None:
        keys = self._keys.get(metric)
        if not keys:
            return None
        return self.c.now(Series(_sum_side_by_side([self.c.snap.series[k] for k in keys]), {}),
                          self.seconds)

    def _kind(self, metric: str) -> str:
        keys = self._keys.get(metric) or []
        name = keys[0][1] if keys else metric
        return kind_of(self.c.catalog, name, self.c.snap.series.get(keys[0]) if keys else None)[0]

    def delta(self, metric: str) -> float | None:
        if metric not in self._keys or self._kind(metric) != "delta":
            return None
        v = per_ns(self._now(metric))
        return None if v is None else v * self.wall_ns

    def mean(self, metric: str) -> float | None:
        if metric not in self._keys:
            return None
        kind = self._kind(metric)
        b = self._now(metric)
        return weighted(b) if kind == "ratio" else gauge_mean(b) if kind == "gauge" else None

    def source(self, metric: str) -> str:
        keys = self._keys.get(metric)
        return keys[0][0] if keys else ""

    def device_mean(self, metric: str) -> float | None:
        """The mean over entities of each one's own value (NeuronCores), not of their sum."""
        kind = self._kind(metric)
        if kind not in ("ratio", "gauge"):
            return None
        each = [v for k in self._keys.get(metric) or []
                if (v := (weighted if kind == "ratio" else gauge_mean)(self.c.now(self.c.snap.get(k), self.seconds)))
                is not None]
        return sum(each) / len(each) if each else None

    def first(self, names: Iterable[str]) -> str | None:
        return next((n for n in names if n in self._keys), None)


def live_signals(c: _Ctx, seconds: float) -> dict[str, Any]:
    """The classifier's signals over the last `seconds` of the window: the report's signal
    table (analysis.signals.counter_signals) over the live window."""
    from .signals import Signal, counter_signals
    out: dict[str, Signal] = {"wall_s": Signal(seconds, "live", "the last seconds")}
    out.update(counter_signals(LiveView(c, seconds)))
    return out


def verdict(c: _Ctx, scope: str = "process", cpus: int | None = None,
            statuses: Mapping[str, Any] | None = None) -> Verdict:
    """The current bottleneck over the last VERDICT_S seconds: the classifier (analysis.classify)
    for the workload; for the machine (counterprof top without --pid), plain system figures."""
    from .thresholds import value
    sec = VERDICT_S
    gpus = _gpu_util(c, sec)
    gpu_text = ", ".join(f"{e} {v:.0f}% busy" for e, v in gpus) if gpus else "no GPU"
    if scope == "machine":
        util = combined(c.snap, "host", "system.cpu_util", ["system"])
        iow = combined(c.snap, "host", "system.cpu_iowait", ["system"])
        sys_util = weighted(c.now(util, sec)) if util else None
        iowait = weighted(c.now(iow, sec)) if iow else None
        if sys_util is None:
            return Verdict("unknown", "no system CPU figures yet")
        n = cpus or 1
        busy = sys_util * n / 100.0
        if gpus and max(v for _, v in gpus) >= value("machine_gpu_busy"):
            return Verdict("GPU busy", f"{gpu_text}; {busy:.1f} of {n} CPUs busy")
        if iowait is not None and iowait >= value("machine_iowait"):
            return Verdict("waiting for I/O", f"iowait {iowait:.0f}%, {busy:.1f} of {n} CPUs busy")
        if sys_util < value("machine_idle"):
            return Verdict("idle", f"{busy:.1f} of {n} CPUs busy, {gpu_text}")
        label = "CPU-bound" if sys_util >= value("machine_busy") else "busy"
        return Verdict(label, f"{busy:.1f} of {n} CPUs busy ({sys_util:.0f}%), {gpu_text}")

    from .classify import classify, describe
    sig = live_signals(c, sec)
    if "cpu_busy" not in sig and "gpu_util" not in sig:
        return Verdict("unknown", "no CPU-time figures yet" + ("" if not gpus else f"; {gpu_text}"))
    threads = (statuses or {}).get("threads") or {}
    v = classify(sig, "now", {"main_threads": threads.get("main") or [],
                              "contenders": threads.get("contenders") or []})
    evidence = "; ".join(e.text for e in v.evidence[:2])
    return Verdict(describe(v), evidence, dict(v.shares))


# -- everything the view shows ----------------------------------------------------------

def live_figures(snap: Snapshot, catalog: Mapping[str, Any], statuses: Mapping[str, Any],
                 points: int, scope: str = "process", cpus: int | None = None,
                 perf_system_wide: bool = False) -> LiveFigures:
    """Panels (perf, host, then one per GPU or other device) and the verdict.
    points: sparkline width; statuses: meta.json's per-collector entries; scope: "process"
    (the workload) or "machine" (counterprof top)."""
    c = _Ctx(snap, catalog, points, perf_system_wide)
    panels = []
    if snap.keys("perf") or "perf" in statuses:
        panels.append(perf_panel(c, statuses))
    if snap.keys("host") or "host" in statuses:
        panels.append(host_panel(c, statuses))
    if snap.keys("threads") or "threads" in statuses:
        panels.append(threads_panel(c, statuses))
    panels.extend(device_panels(c))
    if snap.mfu:
        from .live_mfu import mfu_panel
        panels.append(mfu_panel(c))
    for name, st in statuses.items():      # a device collector that failed before any sample
        if name in ("perf", "host", "threads") or st.get("status") == "ok":
            continue
        if not any(p.title.endswith(name) for p in panels):
            panels.append(PanelFigures(name, status=st.get("status", "unavailable"),
                                       reason=st.get("reason", "")))
    return LiveFigures(panels, verdict(c, scope, cpus, statuses))


# -- top: processes by CPU ---------------------------------------------------------------

@dataclass
class ProcessRow:
    pid: int
    name: str
    cpu_pct: float | None       # percent of one CPU over the last poll interval
    rss: float | None


def top_processes(prev: Mapping[int, tuple[str, float, float]], cur: Mapping[int, tuple[str, float, float]],
                  seconds: float, n: int) -> list[ProcessRow]:
    """The n busiest processes between two polls. prev/cur: pid -> (name, cpu seconds, rss)."""
    rows = []
    for pid, (name, cpu, rss) in cur.items():
        before = prev.get(pid)
        pct = None if before is None or seconds <= 0 else max(0.0, 100.0 * (cpu - before[1]) / seconds)
        rows.append(ProcessRow(pid, name, pct, rss))
    rows.sort(key=lambda r: (-(r.cpu_pct or 0.0), -(r.rss or 0.0), r.pid))
    return rows[:n]


# -- small number words (used in details) -----------------------------------------------

def _si(v: float) -> str:
    for div, s in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(v) >= div:
            return f"{v / div:.0f}{s}" if abs(v) >= 100 * div else f"{v / div:.1f}{s}"
    return f"{v:.0f}" if abs(v) >= 10 or v == 0 else f"{v:.1f}"


def _bytes(v: float) -> str:
    for div, s in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if abs(v) >= div:
            return f"{v / div:.1f} {s}"
    return f"{v:.0f} B"


def _fmt_plain(v: float) -> str:
    return f"{v:.0f}" if abs(v) >= 10 else f"{v:.3g}"
