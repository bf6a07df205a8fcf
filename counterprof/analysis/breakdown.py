"""Trace breakdowns over spans: where the GPU's time went. Pure functions: tables in, plain
dataclasses out; nothing here reads files or prints.

    work = gpu_work(spans)                 # the GPU spans counted, window by window
    temporal_breakdown(work)               # idle / compute / non-compute over the GPU-active span
    kernel_type_breakdown(work)            # compute, communication, memory and their overlaps
    comm_comp_overlap(work)                # share of communication time overlapped by compute
    idle_time_breakdown(work)              # per stream: host wait, kernel wait, other
    launch_statistics(work)                # CPU launch -> GPU span: durations and launch delay
    top_kernels(work)
    analyze({rank: spans, ...})            # all of the above per rank and summed over ranks

The definitions are HTA 0.5.0's (hta/analyzers/breakdown_analysis.py, communication_analysis.py,
cuda_kernel_analysis.py), on exact ns times:

- A rank's trace may hold several recorded windows (one "window" span per Kineto trace: the
  torch collector records a few steps every N). Each window is analysed on its own and the
  figures are summed, so the time between windows never counts as idle.
- Which GPU spans count (HTA's choice): when a window has two or more ProfilerStep#N steps,
  the spans launched (runtime span with the same correlation) before the last step starts;
  the last step may be cut off by the end of recording. Otherwise every GPU span.
- GPU spans: categories kernel, memcpy, memset, sync (sync is busy on a stream, class other).
- kernel time: first start to last end of the counted spans; idle: kernel time minus their
  union; compute: the union of compute spans; non-compute: the rest (busy, not computing).
- Idle-time categories for a gap between consecutive spans on one stream: host wait when the
  next span's launch came after the previous span ended, kernel wait when the gap is shorter than
  30 µs (HTA's consecutive_kernel_delay=30, compared with µs timestamps; its docstring says ns),
  other otherwise. Overlapping spans on a stream make a gap of 0, not a negative one (HTA sums
  negative gaps).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any
from collections.abc import Callable, Iterable, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..ground.kernels import CLASSES, COMMUNICATION, COMPUTE, MEMORY, RULES

KERNEL_WAIT_NS = 30_000
RUNTIME_OUTLIER_NS = 50_000        # HTA's runtime_cutoff (µs 50)
LAUNCH_DELAY_OUTLIER_NS = 100_000  # HTA's launch_delay_cutoff (µs 100)
_CLASS_CODE = {c: i for i, c in enumerate(CLASSES)}
_GPU = ("kernel", "memcpy", "memset", "sync")
COLUMNS = ["start", "end", "name", "category", "kernel_class", "stream", "pid", "correlation"]


class NoGpuWork(ValueError):
    """The spans hold no GPU activity (a CPU-only trace): nothing to break down."""


@dataclass
class GpuWork:
    """The counted GPU spans of one rank (all windows), as aligned numpy arrays."""

    start: np.ndarray            # int64 ns
    end: np.ndarray
    klass: np.ndarray            # index into kernels.CLASSES
    category: np.ndarray         # index into _GPU
    stream: np.ndarray           # int64, -1 unknown
    window: np.ndarray           # int32
    name: np.ndarray             # index into names
    launch_start: np.ndarray     # int64 ns of the runtime span that launched it, -1 none
    launch_end: np.ndarray
    names: list[str]
    windows: int = 1
    excluded: int = 0            # GPU spans left out (launched in a window's last step, ...)

    def __len__(self) -> int:
        return len(self.start)

    def select(self, mask: np.ndarray) -> GpuWork:
        return GpuWork(self.start[mask], self.end[mask], self.klass[mask], self.category[mask],
                       self.stream[mask], self.window[mask], self.name[mask],
                       self.launch_start[mask], self.launch_end[mask], self.names,
                       self.windows, self.excluded)


def _indices(rows: np.ndarray) -> pa.Array:
    """numpy indices as an Arrow array, through its buffer (pa.array(ndarray) imports numpy.ma)."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(rows), [None, pa.py_buffer(rows)])


def distinct(values: np.ndarray) -> np.ndarray:
    """np.unique without its import of numpy.ma (12 ms in a fresh process)."""
    s = np.sort(values, kind="stable")
    if len(s) == 0:
        return s
    return s[np.r_[True, s[1:] != s[:-1]]]


def _codes(col: pa.ChunkedArray | pa.Array, values: tuple[str, ...]) -> np.ndarray:
    """Index of each row's string in `values` (-1: null or another value)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if pa.types.is_dictionary(col.type):
        lookup = np.array([values.index(v) if v in values else -1
                           for v in col.dictionary.to_pylist()] + [-1], np.int64)
        idx = col.indices.fill_null(len(lookup) - 1).to_numpy(zero_copy_only=False)
        codes: np.ndarray = lookup[idx]
        return codes
    enc = pc.dictionary_encode(col)
    return _codes(enc, values)


def _ints(col: pa.ChunkedArray | pa.Array, fill: int = -1) -> np.ndarray:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if pa.types.is_timestamp(col.type):
        col = col.cast(pa.int64())
    ints: np.ndarray = col.fill_null(fill).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return ints


def gpu_work(spans: pa.Table, *, rules: str | Callable[[str, str], str | None] = "counterprof",
             include_last_step: bool = False) -> GpuWork:
    """The GPU spans a breakdown counts, window by window (see the module's docstring).

    rules: "counterprof" (the kernel_class column), "hta" (HTA 0.5.0's rules, to compare), or a
    function (category, name) -> class.
    include_last_step: also count spans launched in each window's last step (HTA's
    include_last_profiler_step).
    """
    cats = ("kernel", "memcpy", "memset", "sync", "runtime", "step", "window")
    category = _codes(spans["category"], cats)
    start, end = _ints(spans["start"]), _ints(spans["end"])
    pid = _ints(spans["pid"])
    correlation = _ints(spans["correlation"])
    is_gpu = (category >= 0) & (category <= 3)
    is_runtime, is_step, is_window = category == 4, category == 5, category == 6

    # windows, and each row's window: the one of the same process that started last before it
    w_rows = np.nonzero(is_window)[0]
    w_rows = w_rows[np.lexsort((start[w_rows], pid[w_rows]))]
    n_windows = max(1, len(w_rows))
    window = np.zeros(len(start), np.int32)
    if len(w_rows) > 1:
        rows = np.nonzero(is_gpu | is_runtime | is_step)[0]
        w_pid = pid[w_rows]
        known = set(w_pid.tolist())
        for p in distinct(pid[rows]):
            sel = rows[pid[rows] == p]
            cand = np.nonzero(w_pid == p)[0] if p in known else np.arange(len(w_rows))
            order = cand[np.argsort(start[w_rows[cand]], kind="stable")]
            pos = np.searchsorted(start[w_rows[order]], start[sel], side="right") - 1
            window[sel] = order[np.clip(pos, 0, len(order) - 1)]

    names_col = spans["name"]
    gpu_idx = np.nonzero(is_gpu)[0]
    if len(gpu_idx) == 0:
        raise NoGpuWork("no GPU activity in these spans (no kernel, memcpy, memset or sync)")

    # which GPU spans count: per window, HTA's "launched before the last step" rule
    keep = np.ones(len(gpu_idx), bool)
    rt_idx = np.nonzero(is_runtime)[0]
    step_idx = np.nonzero(is_step)[0]
    if len(step_idx) and not include_last_step:
        step_names = pc.take(names_col, _indices(step_idx)).to_pylist()
        for w in range(n_windows):
            in_w = window[step_idx] == w
            if len(set(n for n, m in zip(step_names, in_w) if m)) < 2:
                continue
            cutoff = start[step_idx[in_w]].max()
            rt_w = rt_idx[(window[rt_idx] == w) & (start[rt_idx] < cutoff)]
            g = window[gpu_idx] == w
            keep[g] = np.isin(correlation[gpu_idx[g]], correlation[rt_w]) & (correlation[gpu_idx[g]] >= 0)
    excluded = int(np.count_nonzero(~keep))
    gpu_idx = gpu_idx[keep]

    # the runtime span that launched each GPU span (same window, same correlation)
    launch_start = np.full(len(gpu_idx), -1, np.int64)
    launch_end = np.full(len(gpu_idx), -1, np.int64)
    if len(rt_idx):
        key_rt = window[rt_idx].astype(np.int64) * (1 << 42) + (correlation[rt_idx] & ((1 << 42) - 1))
        order = np.argsort(key_rt, kind="stable")
        key_sorted = key_rt[order]
        key_gpu = window[gpu_idx].astype(np.int64) * (1 << 42) + (correlation[gpu_idx] & ((1 << 42) - 1))
        pos = np.clip(np.searchsorted(key_sorted, key_gpu), 0, len(key_sorted) - 1)
        found = (key_sorted[pos] == key_gpu) & (correlation[gpu_idx] >= 0)
        src = rt_idx[order[pos[found]]]
        launch_start[found] = start[src]
        launch_end[found] = end[src]

    gpu_names = pc.take(names_col, _indices(gpu_idx))
    enc = pc.dictionary_encode(gpu_names)
    if isinstance(enc, pa.ChunkedArray):
        enc = enc.combine_chunks()
    names = enc.dictionary.to_pylist()
    name_idx = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    gcat = category[gpu_idx]
    if rules == "counterprof":
        klass = _codes(pc.take(spans["kernel_class"], _indices(gpu_idx)), CLASSES)
        klass = np.where(klass < 0, _CLASS_CODE["other"], klass)
    else:
        fn = RULES[rules] if isinstance(rules, str) else rules
        klass = np.empty(len(gpu_idx), np.int64)
        for c in distinct(gcat):
            table = np.array([_CLASS_CODE[fn(_GPU[c], n) or "other"] for n in names], np.int64)
            sel = gcat == c
            klass[sel] = table[name_idx[sel]]
    stream = _ints(spans["stream"])[gpu_idx]
    return GpuWork(start[gpu_idx], end[gpu_idx], klass.astype(np.int8), gcat.astype(np.int8),
                   stream, window[gpu_idx], name_idx, launch_start, launch_end, names,
                   n_windows, excluded)


# ---- interval arithmetic ------------------------------------------------------------------

def merge(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals as sorted, disjoint intervals (touching ones merge)."""
    if len(start) == 0:
        return start[:0], end[:0]
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(len(s), bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    first = np.nonzero(new)[0]
    last = np.r_[first[1:] - 1, len(s) - 1]
    return s[first], reach[last]


def union_ns(start: np.ndarray, end: np.ndarray) -> int:
    s, e = merge(start, end)
    return int((e - s).sum())


def _per_window(work: GpuWork) -> Iterator[GpuWork]:
    for w in distinct(work.window):
        yield work.select(work.window == w)


# ---- the breakdowns -----------------------------------------------------------------------

@dataclass
class Temporal:
    kernel_time_ns: int = 0      # first start to last end of the counted GPU spans, per window
    idle_ns: int = 0
    compute_ns: int = 0
    non_compute_ns: int = 0

    def pct(self, value: int) -> float | None:
        return 100.0 * value / self.kernel_time_ns if self.kernel_time_ns else None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(idle_pct=self.pct(self.idle_ns), compute_pct=self.pct(self.compute_ns),
                 non_compute_pct=self.pct(self.non_compute_ns))
        return d

    def __add__(self, other: Temporal) -> Temporal:
        return Temporal(*(a + b for a, b in zip(asdict(self).values(), asdict(other).values())))


def temporal_breakdown(work: GpuWork) -> Temporal:
    total = Temporal()
    for w in _per_window(work):
        kernel_time = int(w.end.max() - w.start.min())
        busy = union_ns(w.start, w.end)
        comp = w.klass == _CLASS_CODE[COMPUTE]
        compute = union_ns(w.start[comp], w.end[comp])
        total = total + Temporal(kernel_time, kernel_time - busy, compute, busy - compute)
    return total


def _label(mask: int, classes: tuple[str, ...]) -> str:
    return " + ".join(c for i, c in enumerate(classes) if mask & (1 << i))


def kernel_type_breakdown(work: GpuWork, include_memory: bool = True,
                          unit_ns: int = 1) -> dict[str, int]:
    """Time (ns) in each combination of running classes: "compute", "communication",
    "compute + communication", ... (HTA's "COMPUTATION overlapping COMMUNICATION").
    HTA leaves memory out by default (include_memory_kernels=False).
    unit_ns: floor each segment of the sweep to a multiple of this; HTA 0.5.0 floors to whole
    µs (astype(int) on µs durations), which unit_ns=1000 reproduces for comparisons."""
    classes = (COMPUTE, COMMUNICATION, MEMORY) if include_memory else (COMPUTE, COMMUNICATION)
    out: dict[str, int] = {}
    for w in _per_window(work):
        times, deltas = [], []
        for bit, cls in enumerate(classes):
            sel = w.klass == _CLASS_CODE[cls]
            s, e = merge(w.start[sel], w.end[sel])
            times += [s, e]
            deltas += [np.full(len(s), 1 << bit), np.full(len(e), -(1 << bit))]
        t = np.concatenate(times)
        if len(t) == 0:
            continue
        d = np.concatenate(deltas)
        order = np.argsort(t, kind="stable")
        t, d = t[order], d[order]
        running = np.cumsum(d)
        seg = np.diff(t)
        if unit_ns > 1:
            seg = seg // unit_ns * unit_ns
        state = running[:-1]
        for m in distinct(state):
            if m > 0:
                label = _label(int(m), classes)
                out[label] = out.get(label, 0) + int(seg[state == m].sum())
    return out


def percentages(times: Mapping[str, int]) -> dict[str, float]:
    total = sum(times.values())
    return {k: 100.0 * v / total for k, v in times.items()} if total else {}


@dataclass
class Overlap:
    communication_ns: int = 0
    overlapped_ns: int = 0       # communication time during which compute also ran

    @property
    def pct(self) -> float | None:
        return 100.0 * self.overlapped_ns / self.communication_ns if self.communication_ns else None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "pct": self.pct}

    def __add__(self, other: Overlap) -> Overlap:
        return Overlap(self.communication_ns + other.communication_ns,
                       self.overlapped_ns + other.overlapped_ns)


def comm_comp_overlap(work: GpuWork) -> Overlap:
    total = Overlap()
    for w in _per_window(work):
        comm = w.klass == _CLASS_CODE[COMMUNICATION]
        comp = w.klass == _CLASS_CODE[COMPUTE]
        a = union_ns(w.start[comm], w.end[comm])
        b = union_ns(w.start[comp], w.end[comp])
        both = comm | comp
        total = total + Overlap(a, a + b - union_ns(w.start[both], w.end[both]))
    return total


@dataclass
class StreamIdle:
    stream: int
    host_wait_ns: int = 0
    kernel_wait_ns: int = 0
    other_ns: int = 0

    @property
    def idle_ns(self) -> int:
        return self.host_wait_ns + self.kernel_wait_ns + self.other_ns

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "idle_ns": self.idle_ns}


def idle_time_breakdown(work: GpuWork, kernel_wait_ns: int = KERNEL_WAIT_NS) -> list[StreamIdle]:
    """Per stream, the gaps between consecutive kernels/memcpys/memsets (sync events left out,
    as HTA does) by cause."""
    out: dict[int, StreamIdle] = {}
    busy = work.category <= 2
    for w in _per_window(work.select(busy)):
        for stream in distinct(w.stream):
            sel = np.nonzero(w.stream == stream)[0]
            order = sel[np.argsort(w.start[sel], kind="stable")]
            s, e, ls = w.start[order], w.end[order], w.launch_start[order]
            acc = out.setdefault(int(stream), StreamIdle(int(stream)))
            if len(s) < 2:
                continue
            prev_end = e[:-1]
            gap = np.maximum(s[1:] - prev_end, 0)
            host = ls[1:] > prev_end
            kernel = ~host & (gap < kernel_wait_ns)
            acc.host_wait_ns += int(gap[host].sum())
            acc.kernel_wait_ns += int(gap[kernel].sum())
            acc.other_ns += int(gap[~host & ~kernel].sum())
    return [out[k] for k in sorted(out)]


@dataclass
class Distribution:
    count: int = 0
    mean_ns: float | None = None
    p50_ns: float | None = None
    p95_ns: float | None = None
    max_ns: int | None = None
    total_ns: int = 0

    @classmethod
    def of(cls, values: np.ndarray) -> Distribution:
        if len(values) == 0:
            return cls()
        return cls(len(values), float(values.mean()), float(np.percentile(values, 50)),
                   float(np.percentile(values, 95)), int(values.max()), int(values.sum()))


@dataclass
class LaunchStats:
    launches: int = 0                    # GPU spans whose CPU launch is in the trace
    unlaunched: int = 0                  # GPU spans without one
    cpu_duration: Distribution = field(default_factory=Distribution)    # the runtime call
    gpu_duration: Distribution = field(default_factory=Distribution)    # the GPU span
    launch_delay: Distribution = field(default_factory=Distribution)    # launch end -> GPU start
    slow_launches: int = 0               # runtime call longer than 50 µs
    delayed_launches: int = 0            # launch delay longer than 100 µs

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def launch_statistics(work: GpuWork) -> LaunchStats:
    """Kernels, memcpys and memsets with the runtime call that launched them (HTA's kernel launch
    statistics, over any runtime/driver launch: cudaLaunchKernel, cuLaunchKernel, hipLaunchKernel...)."""
    busy = work.category <= 2
    launched = busy & (work.launch_start >= 0)
    cpu = work.launch_end[launched] - work.launch_start[launched]
    gpu = work.end[launched] - work.start[launched]
    delay = np.maximum(work.start[launched] - work.launch_end[launched], 0)
    return LaunchStats(int(launched.sum()), int((busy & ~launched).sum()), Distribution.of(cpu),
                       Distribution.of(gpu), Distribution.of(delay),
                       int((cpu > RUNTIME_OUTLIER_NS).sum()),
                       int((delay > LAUNCH_DELAY_OUTLIER_NS).sum()))


@dataclass
class KernelTime:
    name: str
    kernel_class: str
    count: int
    total_ns: int
    mean_ns: float
    max_ns: int
    share_pct: float              # of all counted GPU span time

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def top_kernels(work: GpuWork, n: int = 10) -> list[KernelTime]:
    if len(work) == 0:
        return []
    dur = work.end - work.start
    total = max(int(dur.sum()), 1)
    sums = np.bincount(work.name, weights=dur, minlength=len(work.names))
    counts = np.bincount(work.name, minlength=len(work.names))
    maxes = np.zeros(len(work.names), np.int64)
    np.maximum.at(maxes, work.name, dur)
    klass = np.zeros(len(work.names), np.int64)
    klass[work.name] = work.klass
    out = []
    for i in np.argsort(-sums, kind="stable")[:n]:
        if counts[i] == 0:
            break
        out.append(KernelTime(work.names[i], CLASSES[klass[i]], int(counts[i]), int(sums[i]),
                              float(sums[i] / counts[i]), int(maxes[i]), 100.0 * sums[i] / total))
    return out


# ---- everything, per rank and summed ----------------------------------------------------------

@dataclass
class RankBreakdown:
    rank: int | None              # None: summed over ranks
    windows: int
    gpu_spans: int
    excluded_spans: int
    temporal: Temporal
    kernel_types: dict[str, int]
    overlap: Overlap
    idle: list[StreamIdle]
    launches: LaunchStats
    top: list[KernelTime]

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank, "windows": self.windows, "gpu_spans": self.gpu_spans,
            "excluded_spans": self.excluded_spans,
            "temporal": self.temporal.to_json(),
            "kernel_types": [{"kernel_type": k, "time_ns": v, "pct": p} for (k, v), p in
                             zip(self.kernel_types.items(), percentages(self.kernel_types).values())],
            "comm_comp_overlap": self.overlap.to_json(),
            "idle_time": [s.to_json() for s in self.idle],
            "launches": self.launches.to_json(),
            "top_kernels": [k.to_json() for k in self.top],
        }


@dataclass
class Breakdown:
    ranks: list[RankBreakdown]
    total: RankBreakdown | None
    skipped: dict[int, str]       # ranks without GPU activity, and why

    def to_json(self) -> dict[str, Any]:
        return {"ranks": [r.to_json() for r in self.ranks],
                "total": self.total.to_json() if self.total else None,
                "skipped_ranks": {str(k): v for k, v in self.skipped.items()}}


def rank_breakdown(work: GpuWork, rank: int | None, top_n: int = 10) -> RankBreakdown:
    return RankBreakdown(rank, work.windows, len(work), work.excluded, temporal_breakdown(work),
                         _sorted(kernel_type_breakdown(work)), comm_comp_overlap(work),
                         idle_time_breakdown(work), launch_statistics(work), top_kernels(work, top_n))


def _sorted(d: dict[str, int]) -> dict[str, int]:
    return dict(sorted(d.items(), key=lambda kv: -kv[1]))


def analyze(spans_by_rank: Mapping[int, pa.Table], *, rules: str | Callable[[str, str], str | None] = "counterprof",
            include_last_step: bool = False, top_n: int = 10) -> Breakdown:
    """Every breakdown for each rank, and summed over the ranks (times add up; launch and
    top-kernel statistics pool the ranks' spans)."""
    ranks, works, skipped = [], [], {}
    for rank in sorted(spans_by_rank):
        try:
            work = gpu_work(spans_by_rank[rank], rules=rules, include_last_step=include_last_step)
        except NoGpuWork as exc:
            skipped[rank] = str(exc)
            continue
        works.append(work)
        ranks.append(rank_breakdown(work, rank, top_n))
    if not ranks:
        return Breakdown([], None, skipped)
    total_work = _pool(works)
    total = RankBreakdown(
        None, sum(r.windows for r in ranks), sum(r.gpu_spans for r in ranks),
        sum(r.excluded_spans for r in ranks), sum((r.temporal for r in ranks), Temporal()),
        _sorted(_sum_dicts(r.kernel_types for r in ranks)),
        sum((r.overlap for r in ranks), Overlap()), _sum_idle(ranks),
        launch_statistics(total_work), top_kernels(total_work, top_n))
    return Breakdown(ranks, total, skipped)


def _sum_dicts(ds: Iterable[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in ds:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


def _sum_idle(ranks: list[RankBreakdown]) -> list[StreamIdle]:
    total = StreamIdle(-1)
    for r in ranks:
        for s in r.idle:
            total.host_wait_ns += s.host_wait_ns
            total.kernel_wait_ns += s.kernel_wait_ns
            total.other_ns += s.other_ns
    return [total]


def _pool(works: list[GpuWork]) -> GpuWork:
    """One GpuWork of several ranks' (names re-indexed into one list), for pooled statistics."""
    names: dict[str, int] = {}
    name_parts = []
    for w in works:
        remap = np.array([names.setdefault(n, len(names)) for n in w.names], np.int64)
        name_parts.append(remap[w.name] if len(w.names) else w.name)

    def cat(attr: str) -> np.ndarray:
        return np.concatenate([getattr(w, attr) for w in works])
    return GpuWork(cat("start"), cat("end"), cat("klass"), cat("category"), cat("stream"),
                   cat("window"), np.concatenate(name_parts), cat("launch_start"),
                   cat("launch_end"), list(names), sum(w.windows for w in works),
                   sum(w.excluded for w in works))
