"""What the classifier reads, measured over any stretch of a run (the whole run, a 1 s
window, the occurrences of a region).

RunData holds a run's samples bucketed to a fixed resolution (10 ms: memory stays bounded
however fine the sampling was) and its spans as interval sets. `signals(data, scope)` turns
them into named values over a scope, each with where it came from. Pure: no files, no prints.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import intervals as iv
from . import xla
from .comm_cost import comm_caused

BUCKET_NS = 10_000_000     # default resolution; build_report passes the run's finest interval
MAX_BUCKETS = 200_000      # per metric: bounds memory however long the run

# metric-name aliases: counterprof's perf names, and what the nvml collector may call things
CPU_EVENTS = ("task-clock", "cpu-clock", "context-switches", "cpu-migrations", "page-faults",
              "major-faults", "instructions", "cycles", "cpu-cycles", "LLC-load-misses",
              "cache-misses", "stalled-cycles-backend", "stalled-cycles-frontend",
              # Intel top-down level 1 (Icelake and newer: slots + topdown-*)
              "slots", "topdown-retiring", "topdown-bad-spec", "topdown-fe-bound",
              "topdown-be-bound", "topdown-mem-bound",
              # Arm Neoverse
              "stall_slot", "stall_slot_backend", "stall_slot_frontend", "stall_backend_mem",
              "cpu_cycles", "inst_retired",
              # AMD Zen 4 pipeline utilization (PPR names, as perf lists them)
              "ls_not_halted_cyc", "ex_ret_ops", "de_src_op_disp.all",
              "de_no_dispatch_per_slot.backend_stalls", "de_no_dispatch_per_slot.no_ops_from_frontend")
GPU_UTIL = ("gpu.util", "gpu.utilization")
GPM = {"tensor": ("gpm.tensor_util", "gpm.any_tensor_util"), "dram": ("gpm.dram_bw_util", "gpm.dram_util"),
       "sm": ("gpm.sm_util",)}
NEURON_EXEC_ERRORS = tuple(f"neuron.exec_errors_{k}" for k in
                           ("generic", "numerical", "transient", "model", "runtime", "hardware"))
NEURON_ECC = ("neuron.ecc_mem_uncorrected", "neuron.ecc_sram_uncorrected",
              "neuron.ecc_mem_corrected", "neuron.ecc_sram_corrected")
GPU_KERNEL_CATEGORIES = ("kernel", "memcpy", "memset", "sync")
# the torch driver's time-window traces (<host>_<pid>.<n>.time.pt.trace.json): recorded while
# nothing marked steps; a window span is named after its trace file
TIME_WINDOW_SUFFIXES = (".time.pt.trace.json", ".time.pt.trace.json.gz", ".time.jaxprof")


@dataclass
class Series:
    """One metric summed over its entities (threads, CPUs, ranks) or averaged (GPUs), in
    time buckets (numpy arrays, sorted by end)."""

    kind: str                       # delta | gauge | ratio
    starts: np.ndarray              # int64: bucket's first covered ns (deltas: end - duration)
    ends: np.ndarray                # int64: bucket's last sample time; sorted
    values: np.ndarray              # float64: deltas sum, gauges/ratios mean; NaN unknown

    def __post_init__(self) -> None:
        # starts are nearly sorted; their running max makes a safe search bound
        self._start_bound = np.maximum.accumulate(self.starts) if len(self.starts) else self.starts

    def _slice(self, lo: int, hi: int) -> slice:
        return slice(int(np.searchsorted(self.ends, lo, "right")),
                     int(np.searchsorted(self._start_bound, hi, "left")))

    def delta(self, lo: int, hi: int) -> tuple[float, float] | None:
        """Sum over [lo, hi), each bucket pro-rated by its overlap; (sum, share of the range
        covered by known values). None when nothing overlaps."""
        sl = self._slice(lo, hi)
        s, e, v = self.starts[sl], self.ends[sl], self.values[sl]
        ov = np.minimum(e, hi) - np.maximum(s, lo)
        hit = ov > 0
        if not hit.any():
            return None
        known = hit & ~np.isnan(v)
        width = np.maximum(e - s, 1)
        total = float(np.sum(v[known] * ov[known] / width[known]))
        return total, float(np.sum(ov[known])) / max(hi - lo, 1)

    # Many intervals at once (a rank's steps: one per step of an hour-long run), vectorized.
    # Where the buckets do not overlap one another (a metric's buckets are a grid), a delta's
    # pro-rated sum over [lo, hi) is F(hi) - F(lo) of its running integral F; else one at a time.

    def _integrals(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        cached: Any = getattr(self, "_integral_cache", None)
        if cached is not None:
            return None if cached == () else cast("tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]",
                                                  cached)
        s, e = self.starts, self.ends
        if len(s) == 0 or np.any(s[1:] < e[:-1]):
            self._integral_cache: Any = ()
            return None
        width = np.maximum(e - s, 1).astype(np.float64)
        has = e > s
        known = has & ~np.isnan(self.values)
        dens = np.where(known, np.nan_to_num(self.values) / width, 0.0)     # value per ns
        cov = known.astype(np.float64)                                     # known ns per ns
        anyb = has.astype(np.float64)                                      # any bucket per ns
        per = np.where(has, (e - s).astype(np.float64), 0.0)

        def running(d: np.ndarray) -> np.ndarray:
            return np.concatenate(([0.0], np.cumsum(d * per)))
        made = (running(dens), running(cov), running(anyb), dens, np.stack([cov, anyb]))
        self._integral_cache = made
        return made

    def _at(self, t: np.ndarray, cum: np.ndarray, rate: np.ndarray) -> np.ndarray:
        """The running integral at each time t: buckets wholly before t, and the part of the
        bucket holding t."""
        i = np.searchsorted(self.ends, t, "right")          # buckets ending at or before t: wholly before
        inside = np.clip(i, 0, len(self.ends) - 1)
        part = np.clip(t - self.starts[inside], 0, None) * (i < len(self.ends))
        part = np.minimum(part, np.maximum(self.ends[inside] - self.starts[inside], 0))
        return cast("np.ndarray", cum[i] + rate[inside] * part * (i < len(self.ends)))

    def delta_many(self, scope: iv.Intervals) -> tuple[float, float, bool] | None:
        """Over every interval of scope: (sum, known ns covered, any bucket overlapped), as the
        sum of delta() over each; None when the buckets overlap one another (use delta())."""
        ig = self._integrals()
        if ig is None or not scope:
            return None
        cum_v, cum_k, cum_a, dens, rates = ig
        lo = np.fromiter((a for a, _ in scope), np.int64, len(scope))
        hi = np.fromiter((b for _, b in scope), np.int64, len(scope))
        tot = float(np.sum(self._at(hi, cum_v, dens) - self._at(lo, cum_v, dens)))
        cov = float(np.sum(self._at(hi, cum_k, rates[0]) - self._at(lo, cum_k, rates[0])))
        hit = float(np.sum(self._at(hi, cum_a, rates[1]) - self._at(lo, cum_a, rates[1])))
        return tot, cov, hit > 0

    def mean_many(self, scope: iv.Intervals) -> float | None:
        """The mean over scope's intervals of mean(lo, hi) (those with a value), at once."""
        cached = getattr(self, "_mean_cache", None)
        if cached is None:
            ok = ~np.isnan(self.values)
            cached = self._mean_cache = (np.concatenate(([0.0], np.cumsum(np.where(ok, self.values, 0.0)))),
                                         np.concatenate(([0], np.cumsum(ok))))
        csum, ccount = cached
        lo = np.fromiter((a for a, _ in scope), np.int64, len(scope))
        hi = np.fromiter((b for _, b in scope), np.int64, len(scope))
        i, j = np.searchsorted(self.ends, lo, "left"), np.searchsorted(self.ends, hi, "left")
        n = ccount[j] - ccount[i]
        has = n > 0
        if not has.any():
            return None
        return float(np.mean((csum[j] - csum[i])[has] / n[has]))

    def mean(self, lo: int, hi: int) -> float | None:
        """Mean of the gauge/ratio buckets ending inside [lo, hi)."""
        i, j = np.searchsorted(self.ends, [lo, hi], "left")
        vals = self.values[i:j]
        vals = vals[~np.isnan(vals)]
        return float(vals.mean()) if len(vals) else None

    def peak(self, lo: int, hi: int) -> float | None:
        i, j = np.searchsorted(self.ends, [lo, hi], "left")
        vals = self.values[i:j]
        vals = vals[~np.isnan(vals)]
        return float(vals.max()) if len(vals) else None


@dataclass
class RunData:
    series: dict[str, Series] = field(default_factory=dict)     # metric -> series
    sources: dict[str, str] = field(default_factory=dict)       # metric -> collector
    start_ns: int = 0
    end_ns: int = 0
    ranks: int = 1                                               # processes doing the work
    gpu_busy: iv.Intervals = field(default_factory=list)         # any GPU activity
    gpu_class: dict[str, iv.Intervals] = field(default_factory=dict)   # kernel_class -> union
    gpu_kernel_count: int = 0
    short_kernels: int = 0                                       # shorter than the threshold
    cpu_collectives: iv.Intervals = field(default_factory=list)  # gloo & co. on the CPU
    windows: iv.Intervals = field(default_factory=list)          # where traces were recorded
    # where traces were recorded by the step schedule: a time window (recorded while nothing
    # marked steps: a long set-up) can hold the first step, not what steps are like
    step_windows: iv.Intervals = field(default_factory=list)
    regions: dict[str, iv.Intervals] = field(default_factory=dict)   # name -> its occurrences
    region_kind: dict[str, str] = field(default_factory=dict)    # name -> region|annotation|step
    region_count: dict[str, int] = field(default_factory=dict)
    # per rank: what the main (training) thread did, from spans
    input_waits: dict[int, iv.Intervals] = field(default_factory=dict)     # DataLoader next() waits
    input_whole_run: bool = False      # waits recorded for the whole run (else only in traces)
    rank_collectives: dict[int, iv.IntervalSet] = field(default_factory=dict)   # packed (iv.Packed)
    main_ops: dict[int, iv.Intervals] = field(default_factory=dict)       # main thread's own ops
    # per rank: the part of the main thread's op time the collectives caused (comm_cost.py)
    comm_ops: dict[int, iv.Intervals] = field(default_factory=dict)
    rank_steps: dict[int, iv.IntervalSet] = field(default_factory=dict)   # every step, per rank (packed)
    # per rank: the main thread's Python sampled while traced, (ns, "func (file:line)") sorted
    py_samples: dict[int, list[tuple[int, str]]] = field(default_factory=dict)
    # facts from meta.json the evidence names: the critical threads, other processes' CPU
    main_threads: list[dict[str, Any]] = field(default_factory=list)
    contenders: list[dict[str, Any]] = field(default_factory=list)
    # interval sets prepared for clipping by bisection (every verdict window clips the ops)
    _indexed: dict[int, iv.Indexed] = field(default_factory=dict, repr=False)
    _stacks: dict[str, tuple[Any, ...]] = field(default_factory=dict, repr=False)   # name -> (key, sources, stacks)
    steps_in_ops: float | None = None     # the traced steps' share in ops (-1: none), computed once
    steps_in_comm_ops: float = 0.0        # ... of it, in op time the collectives caused
    outside_ops_memo: dict[tuple[tuple[int, int], ...], tuple[int, int, dict[int, iv.Intervals]]] = field(
        default_factory=dict, repr=False)    # _outside_ops per scope
    comm_ops_memo: dict[tuple[tuple[int, int], ...], int] = field(default_factory=dict, repr=False)
    cpus: int | None = None               # the machine's CPUs (meta.json host.cpus): who held them
    # XLA's ops on the host's threads (JAX on the CPU, analysis/xla.py): the compute device's
    # work, as a GPU's kernels are; by class (compute, memory, communication, other)
    xla_busy: iv.Intervals = field(default_factory=list)
    xla_class: dict[str, iv.Intervals] = field(default_factory=dict)
    xla_ops: int = 0
    xla_dispatch: iv.Intervals = field(default_factory=list)   # PjitFunction & co. (the Python side)
    # a NeuronCore's device profile (Neuron Explorer, collectors/neuron/explorer.py): busy is
    # any engine instruction other than a semaphore wait, DMA packet or collective
    neuron_busy: iv.Intervals = field(default_factory=list)
    neuron_class: dict[str, iv.Intervals] = field(default_factory=dict)    # compute, memory, communication, other
    neuron_engines: dict[str, iv.Intervals] = field(default_factory=dict)  # engine -> its non-wait instructions
    neuron_waits: iv.Intervals = field(default_factory=list)               # semaphore waits on any engine
    neuron_dma_queues: dict[str, iv.Intervals] = field(default_factory=dict)   # DMA queue type -> packets
    neuron_dma_bytes: int = 0
    neuron_cc_ops: dict[str, int] = field(default_factory=dict)            # collective -> ns
    neuron_runtime: iv.Intervals = field(default_factory=list)   # the host's Neuron runtime calls (system profile)

    def clipped(self, sets: iv.IntervalSet, scope: iv.Intervals) -> iv.Intervals:
        """The part of one of this run's interval sets within the span of scope, found by
        bisection: a window's intersect then walks its own few intervals, not the run's."""
        sp = iv.span(scope)
        if not sp or not sets:
            return []
        ix = self._indexed.get(id(sets))
        if ix is None or ix.iv is not sets:
            ix = self._indexed[id(sets)] = iv.Indexed(sets)
        return ix.clip(*sp)

    def let_go_of_spans(self) -> None:
        """Each rank's span sets, and what was built of them, let go: for once every verdict
        over the whole run is made (the per-rank verdicts and the ranks table after them read
        only the samples' series of it, and would hold these beside their own)."""
        for k in ("input_waits", "rank_collectives", "main_ops", "comm_ops", "rank_steps", "py_samples"):
            setattr(self, k, {})
        for held in (self._indexed, self._stacks, self.outside_ops_memo, self.comm_ops_memo):
            held.clear()

    def has(self, metric: str) -> bool:
        return metric in self.series

    def collective_stacks(self) -> tuple[iv.Stacked, iv.Stacked, iv.Stacked]:
        """Per rank of rank_collectives (in its order), stacked: its collectives, the part of
        them under the main thread's own ops, its steps (a verdict window asks all three of
        every rank)."""
        def build() -> tuple[iv.Stacked, ...]:
            ranks = list(self.rank_collectives)
            coll = [self.rank_collectives[r] for r in ranks]
            under_own = [iv.intersect(c, own) if (own := self.main_ops.get(r)) else [] for r, c in zip(ranks, coll)]
            steps = (self.steps_stack() if ranks == list(self.rank_steps)     # (held once, not twice)
                     else iv.Stacked([self.rank_steps.get(r) or [] for r in ranks]))
            return iv.Stacked(coll), iv.Stacked(under_own), steps
        coll, under_own, steps = self._stacked("collectives", build,
                                               self.rank_collectives, self.main_ops, self.rank_steps)
        return coll, under_own, steps

    def steps_stack(self) -> iv.Stacked:
        """Every rank's steps, stacked (rank_steps' order)."""
        (steps,) = self._stacked("steps", lambda: (iv.Stacked(list(self.rank_steps.values())),), self.rank_steps)
        return steps

    def _stacked(self, name: str, build: Callable[[], tuple[iv.Stacked, ...]], *sources: dict[int, Any]
                 ) -> tuple[iv.Stacked, ...]:
        """Built once per run's sets: again only if they were replaced or grew (load_spans
        clears them; the sets are not changed in place after it, as the memos above assume)."""
        key = tuple((id(d), len(d)) for d in sources)
        held = self._stacks.get(name)
        if held is None or held[0] != key or any(a is not b for a, b in zip(held[1], sources)):
            held = self._stacks[name] = (key, sources, build())
        stacks: tuple[iv.Stacked, ...] = held[2]
        return stacks


def bucket_table(chunks: Iterable[pa.RecordBatch], bucket_ns: int = BUCKET_NS) -> pa.Table:
    """Samples batches -> one row per (metric, time bucket): covered span, sum, counts. The same
    columns store.query.RunQuery.buckets gives from files (for in-memory tables and tests)."""
    parts = []
    for chunk in chunks:
        if chunk.num_rows == 0:
            continue
        t = chunk["time"].cast(pa.int64())
        parts.append(pa.table({
            "metric": chunk["metric"].cast(pa.string()),
            "source": chunk["source"].cast(pa.string()),
            "b": pc.divide(t, bucket_ns),
            "start_ns": pc.subtract(t, pc.fill_null(chunk["duration_ns"], 0)),
            "end_ns": t,
            "value": chunk["value"],
            "null": pc.is_null(chunk["value"]).cast(pa.int64()),
        }).group_by(["metric", "b"], use_threads=False).aggregate([
            ("source", "min"), ("start_ns", "min"), ("end_ns", "max"), ("value", "sum"),
            ("value", "count"), ("null", "sum")]))
    if not parts:
        return pa.table({})
    merged = pa.concat_tables(parts).group_by(["metric", "b"], use_threads=False).aggregate([
        ("source_min", "min"), ("start_ns_min", "min"), ("end_ns_max", "max"), ("value_sum", "sum"),
        ("value_count", "sum"), ("null_sum", "sum")])
    return pa.table({"metric": merged["metric"], "source": merged["source_min_min"], "b": merged["b"],
                     "start_ns": merged["start_ns_min_min"], "end_ns": merged["end_ns_max_max"],
                     "vsum": merged["value_sum_sum"], "n": merged["value_count_sum"],
                     "nulls": merged["null_sum_sum"]})


def _in_metric_order(buckets: pa.Table) -> bool:
    """Are the rows ordered by metric, then bucket?"""
    m, b = buckets["metric"], buckets["b"]
    if m.null_count:
        return False        # (sorted: nulls last)
    if buckets.num_rows < 2:
        return True
    m0, m1 = m.slice(0, len(m) - 1), m.slice(1)
    later = pc.greater(m1, m0)
    same = pc.equal(m1, m0)
    ok = pc.or_(later, pc.and_(same, pc.greater_equal(b.slice(1), b.slice(0, len(b) - 1))))
    return bool(pc.all(ok).as_py())


def load_buckets(data: RunData, buckets: pa.Table, catalog: dict[str, dict[str, Any]]) -> None:
    """Series per metric from a bucket table (bucket_table() or RunQuery.buckets())."""
    if buckets.num_rows == 0:
        return
    if not _in_metric_order(buckets):      # (RunQuery.buckets' are: no second copy)
        buckets = buckets.sort_by([("metric", "ascending"), ("b", "ascending")])
    # each metric's rows as codes, not a Python string per row (2.9 M of them at 256 ranks x 4 h)
    metric = buckets["metric"]
    names = pc.dictionary_encode(pc.fill_null(metric, "None") if metric.null_count else metric).combine_chunks()
    codes = names.indices.to_numpy(zero_copy_only=False)
    bounds = np.flatnonzero(codes[1:] != codes[:-1]) + 1
    starts_all = buckets["start_ns"].to_numpy()
    ends_all = buckets["end_ns"].to_numpy()
    vsum = buckets["vsum"].to_numpy(zero_copy_only=False).astype(np.float64)
    n = buckets["n"].to_numpy().astype(np.float64)
    nulls = buckets["nulls"].to_numpy()
    source = buckets["source"]
    lo = hi = None
    for a, b in zip(np.r_[0, bounds], np.r_[bounds, len(codes)]):
        name = str(names.dictionary[int(codes[a])].as_py())
        kind = (catalog.get(name) or {}).get("kind", "delta")
        with np.errstate(invalid="ignore", divide="ignore"):
            if kind == "delta":   # any unknown member makes the bucket's sum unknown
                values = np.where((nulls[a:b] > 0) | (n[a:b] == 0), np.nan, vsum[a:b])
            else:
                values = np.where(n[a:b] > 0, vsum[a:b] / n[a:b], np.nan)
        order = np.argsort(ends_all[a:b], kind="stable")
        data.series[name] = Series(kind, starts_all[a:b][order], ends_all[a:b][order], values[order])
        data.sources[name] = str(source[int(a)].as_py())
        lo = starts_all[a:b].min() if lo is None else min(lo, starts_all[a:b].min())
        hi = ends_all[a:b].max() if hi is None else max(hi, ends_all[a:b].max())
    if lo is not None and hi is not None:      # set together
        data.start_ns = int(lo) if not data.start_ns else min(data.start_ns, int(lo))
        data.end_ns = max(data.end_ns, int(hi))


def load_samples(data: RunData, chunks: Iterable[pa.RecordBatch], catalog: dict[str, dict[str, Any]],
                 bucket_ns: int = BUCKET_NS) -> None:
    """Samples batches straight into series (in-memory tables; files go through RunQuery)."""
    load_buckets(data, bucket_table(chunks, bucket_ns), catalog)


# ops on the main thread that wait rather than compute: not "own compute" under a collective
_WAIT_OPS = ("c10d::", "gloo:", "nccl:", "record_param_comms", "aten::wait", "wait")
# torch's profiler names DataLoader waits "enumerate(DataLoader)#_...Iter.__next__"
DATALOADER_NEXT = "enumerate(DataLoader)#"


def shared_values(column: pa.ChunkedArray | pa.Array) -> list[Any]:
    """column.to_pylist(), each distinct value one object (a dictionary's values, indexed)."""
    if len(column) == 0:
        return []
    coded = pc.dictionary_encode(column)
    if isinstance(coded, pa.ChunkedArray):
        coded = coded.unify_dictionaries().combine_chunks() if coded.num_chunks else coded.combine_chunks()
    values = np.array(coded.dictionary.to_pylist() + [None], dtype=object)
    codes = pc.fill_null(coded.indices, len(values) - 1).to_numpy()
    return cast("list[Any]", values[codes].tolist())


SPAN_ROWS_AT_ONCE = 1 << 18


def _span_rows(spans: pa.Table, skip: np.ndarray | None = None) -> Iterator[tuple[int, tuple[Any, ...]]]:
    """(row, (start, end, category, kernel_class, device, name, rank, tid)) of every span (but
    those skip marks), as Python objects a slice at a time: a run's millions of spans are never
    whole lists."""
    n_rows = spans.num_rows
    for off in range(0, n_rows, SPAN_ROWS_AT_ONCE):
        part = spans.slice(off, SPAN_ROWS_AT_ONCE)
        rows: Iterable[int] = range(off, off + part.num_rows)
        if skip is not None and skip[off:off + part.num_rows].any():
            kept = np.flatnonzero(~skip[off:off + part.num_rows])
            part, rows = part.take(kept), (kept + off).tolist()
        n = part.num_rows
        # the repetitive columns as shared objects: a few thousand distinct names, categories,
        # ranks and threads, not a new str or int per row
        cols = [part["start"].cast(pa.int64()).to_pylist(), part["end"].cast(pa.int64()).to_pylist(),
                shared_values(part["category"].cast(pa.string())),
                shared_values(part["kernel_class"].cast(pa.string())), shared_values(part["device"]),
                shared_values(part["name"]),
                shared_values(part["rank"]) if "rank" in part.column_names else [0] * n,
                shared_values(part["tid"]) if "tid" in part.column_names else [None] * n]
        yield from zip(rows, zip(*cols))


def _bulk_rows(spans: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(steps, the host's collectives) as row masks: most of a big run's spans (a row per
    rank and step each), read as arrays rather than a tuple each."""
    cat = spans["category"]
    if pa.types.is_dictionary(cat.type):
        cat = cat.cast(pa.string())
    steps = pc.fill_null(pc.equal(cat, "step"), False)
    host_coll = pc.fill_null(pc.and_(pc.equal(cat, "collective"), pc.is_null(spans["device"])), False)
    return (np.asarray(steps.to_numpy(zero_copy_only=False), bool),
            np.asarray(host_coll.to_numpy(zero_copy_only=False), bool))


def _columns_at(spans: pa.Table, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, rank) of the rows mask marks, as int64 arrays (rank null: 0)."""
    rows = spans.select([c for c in ("start", "end", "rank") if c in spans.column_names]).filter(pa.array(mask))
    rank = (pc.fill_null(rows["rank"].cast(pa.int64()), 0).to_numpy() if "rank" in rows.column_names
            else np.zeros(rows.num_rows, np.int64))
    return rows["start"].cast(pa.int64()).to_numpy(), rows["end"].cast(pa.int64()).to_numpy(), rank


def _distinct_pairs(a: np.ndarray, b: np.ndarray) -> list[tuple[int, int]]:
    """The distinct (a[i], b[i]), sorted (np.unique(axis=0) sorts rows as bytes: 20x slower)."""
    if not len(a):
        return []
    a0, b0 = int(a.min()), int(b.min())
    width = int(b.max()) - b0 + 1
    if (int(a.max()) - a0 + 1) * width < 2 ** 62:         # one int64 key: one sort of numbers
        key = np.unique((a - a0) * width + (b - b0))
        return list(zip((key // width + a0).tolist(), (key % width + b0).tolist()))
    order = np.lexsort((b, a))
    a, b = a[order], b[order]
    new = np.r_[True, (a[1:] != a[:-1]) | (b[1:] != b[:-1])] if len(a) else np.zeros(0, bool)
    return list(zip(a[new].tolist(), b[new].tolist()))


def _per_rank_sets(rank: np.ndarray, start: np.ndarray, end: np.ndarray) -> dict[int, iv.IntervalSet]:
    """rank -> the union of its intervals, packed."""
    order = np.argsort(rank, kind="stable")
    by = rank[order]
    cuts = (np.flatnonzero(by[1:] != by[:-1]) + 1).tolist()
    return {int(by[a]): iv.Packed(iv.merge_array(start[order[a:b]], end[order[a:b]]))
            for a, b in zip([0, *cuts], [*cuts, len(by)])}


def load_spans(data: RunData, spans: pa.Table, short_kernel_us: float) -> None:
    if spans.num_rows == 0:
        return
    data._stacks.clear()
    by_class: dict[str, iv.Intervals]
    regions: dict[str, iv.Intervals]
    busy, by_class, cpu_coll, regions, windows, step_windows = [], {}, [], {}, [], []
    inputs: dict[int, iv.Intervals] = {}
    annotated_inputs: dict[int, iv.Intervals] = {}
    coll_by_rank: dict[int, iv.IntervalSet] = {}
    step_tids: dict[int, set[int]] = {}
    steps_by_rank: dict[int, iv.IntervalSet] = {}
    op_time: dict[tuple[int, Any], int] = {}
    ops: dict[tuple[int, Any], iv.Intervals] = {}
    short_ns = short_kernel_us * 1000
    op_rows: dict[tuple[int, Any], list[int]] = {}
    xla_rows: list[int] = []
    host_coll_rows: list[int] = []
    dispatch: iv.Intervals = []
    neuron_rows: list[int] = []
    first_row: dict[str, int] = {}     # region -> its first row (the regions' order)
    step_rows, host_coll_mask = _bulk_rows(spans)
    for i, (s, e, c, k, d, n, r, t) in _span_rows(spans, step_rows | host_coll_mask):
        r = r or 0
        if c in NEURON_CATEGORIES:
            neuron_rows.append(i)
        elif c in GPU_KERNEL_CATEGORIES and d is not None:
            busy.append((s, e))
            by_class.setdefault(k or "other", []).append((s, e))
            if c == "kernel":
                data.gpu_kernel_count += 1
                if e - s < short_ns:
                    data.short_kernels += 1
        elif c == "collective":      # on a device (the host's are taken in bulk below)
            by_class.setdefault("communication", []).append((s, e))
        elif c == "window":
            windows.append((s, e))
            if not (n or "").endswith(TIME_WINDOW_SUFFIXES):
                step_windows.append((s, e))
        elif c == "input":
            inputs.setdefault(r, []).append((s, e))
        elif c == "xla_op" and d is None:
            xla_rows.append(i)
        elif c == "dispatch":
            dispatch.append((s, e))
        elif c == "pysample":
            data.py_samples.setdefault(r, []).append((s, n or "?"))
        elif c == "cpu_op" and d is None:
            if n and n.startswith(DATALOADER_NEXT):
                annotated_inputs.setdefault(r, []).append((s, e))
            elif not (n or "").startswith(_WAIT_OPS):
                ops.setdefault((r, t), []).append((s, e))
                op_rows.setdefault((r, t), []).append(i)
                op_time[(r, t)] = op_time.get((r, t), 0) + (e - s)
        if c in ("region", "annotation"):        # steps are taken in bulk below
            pair = (s, e)       # one tuple in every list that holds it
            if c == "annotation" and n and n.startswith(DATALOADER_NEXT):
                annotated_inputs.setdefault(r, []).append(pair)
            key = n
            if key not in regions:
                first_row[key] = i
            regions.setdefault(key, []).append(pair)
            data.region_kind[key] = c
            data.region_count[key] = data.region_count.get(key, 0) + 1
    merged_regions = {k: iv.merge(v) for k, v in regions.items()}
    if step_rows.any():
        s_, e_, r_ = _columns_at(spans, step_rows)
        steps_by_rank = _per_rank_sets(r_, s_, e_)
        if "tid" in spans.column_names:
            tids = spans["tid"].filter(pa.array(step_rows))
            has = np.asarray(pc.is_valid(tids).to_numpy(zero_copy_only=False), bool)
            for rr, tt in _distinct_pairs(r_[has], pc.drop_null(tids).cast(pa.int64()).to_numpy()):
                step_tids.setdefault(rr, set()).add(tt)
        # every rank's steps as one region (a region a user named "ProfilerStep" joins it)
        first = int(np.argmax(step_rows))
        first_row["ProfilerStep"] = min(first, first_row.get("ProfilerStep", first))
        merged_regions["ProfilerStep"] = iv.union([iv.Packed(iv.merge_array(s_, e_)),
                                                   merged_regions.get("ProfilerStep", [])])
        data.region_kind["ProfilerStep"] = "step"
        data.region_count["ProfilerStep"] = data.region_count.get("ProfilerStep", 0) + int(step_rows.sum())
        del s_, e_, r_
    if host_coll_mask.any():
        s_, e_, r_ = _columns_at(spans, host_coll_mask)
        cpu_coll = [(a, b) for a, b in iv.merge_array(s_, e_).tolist()]
        coll_by_rank = _per_rank_sets(r_, s_, e_)
        host_coll_rows = np.flatnonzero(host_coll_mask).tolist() if xla_rows else []   # only _load_xla reads them
        del s_, e_, r_
    data.gpu_busy = iv.merge(busy)
    data.gpu_class = {k: iv.merge(v) for k, v in by_class.items()}
    data.cpu_collectives = cpu_coll
    data.regions = {k: merged_regions[k] for k in sorted(merged_regions, key=first_row.__getitem__)}
    data.windows = iv.merge(windows)
    data.step_windows = iv.merge(step_windows)
    data.input_whole_run = bool(inputs)
    data.input_waits = {r: iv.merge(v) for r, v in (inputs or annotated_inputs).items()}
    data.rank_collectives = coll_by_rank
    data.rank_steps = steps_by_rank
    for v in data.py_samples.values():
        v.sort()
    # each rank's main thread: the one that marks steps, else the one with the most op time
    for r in {r for r, _t in ops}:
        tids = step_tids.get(r) or {max((k for k in op_time if k[0] == r), key=op_time.__getitem__)[1]}
        data.main_ops[r] = iv.merge([p for t in tids for p in ops.get((r, t), [])])
        if data.rank_collectives.get(r):
            # (typed: none of the step thread's rows may be ops, and an empty list is of no type)
            main = spans.take(pa.array([i for t in tids for i in op_rows.get((r, t), [])], pa.int64()))
            attrs = (main["attrs"].to_pylist() if "attrs" in spans.column_names else [None] * main.num_rows)
            data.comm_ops[r] = comm_caused([(s, e, n or "", a) for s, e, n, a in zip(
                main["start"].cast(pa.int64()).to_pylist(), main["end"].cast(pa.int64()).to_pylist(),
                main["name"].to_pylist(), attrs)], data.rank_collectives[r])
    if xla_rows or neuron_rows:     # these index the whole table's rows
        start = spans["start"].cast(pa.int64()).to_pylist()
        end = spans["end"].cast(pa.int64()).to_pylist()
        cat = shared_values(spans["category"].cast(pa.string()))
        kclass = shared_values(spans["kernel_class"].cast(pa.string()))
        name = shared_values(spans["name"])
    # (read with the XLA ops only; kept for every rank all the same: a rank's own may have none)
    data.xla_dispatch = iv.merge(dispatch)
    if xla_rows:
        _load_xla(data, spans, xla_rows, host_coll_rows, start, end, name)
    if neuron_rows:
        _load_neuron(data, spans, neuron_rows, start, end, cat, kclass, name)
    _extend_to_spans(data)


def _extend_to_spans(data: RunData) -> None:
    """The run's extent widened to the device's work and the collectives (the samples' may be
    shorter: an imported trace has none)."""
    all_times = [p for p in (iv.span(data.gpu_busy), iv.span(data.cpu_collectives), iv.span(data.neuron_busy))
                 if p]
    if data.xla_busy:      # a JAX run: its steps and trace windows too (the host's waits lie there)
        all_times += [p for p in (iv.span(data.xla_busy), iv.span(data.windows),
                                  iv.span(iv.union(data.rank_steps.values()))) if p]
    for lo, hi in all_times:
        data.start_ns = lo if not data.start_ns else min(data.start_ns, lo)
        data.end_ns = max(data.end_ns, hi)


# RunData's interval sets that are the union of every rank's, and its {key: set} of such
_UNIONS = ("gpu_busy", "cpu_collectives", "windows", "step_windows", "xla_busy", "xla_dispatch",
           "neuron_busy", "neuron_waits", "neuron_runtime")
_KEYED_UNIONS = ("gpu_class", "regions", "xla_class", "neuron_class", "neuron_engines", "neuron_dma_queues")
_PER_RANK = ("rank_collectives", "rank_steps", "main_ops", "comm_ops")
_COUNTS = ("gpu_kernel_count", "short_kernels", "xla_ops", "neuron_dma_bytes")


def _joined(a: np.ndarray | None, b: iv.IntervalSet) -> np.ndarray:
    """The union of a packed set and another, packed (16 bytes an interval, not a tuple's ~130)."""
    b_arr = b.a if isinstance(b, iv.Packed) else np.asarray(b, np.int64).reshape(-1, 2)
    both = b_arr if a is None else np.concatenate([a, b_arr])
    return iv.merge_array(both[:, 0], both[:, 1])


def load_rank_spans(data: RunData, ranks: Iterable[tuple[int | None, pa.Table]], short_kernel_us: float) -> None:
    """load_spans of a run's spans given one rank at a time (each let go once read): the sets
    load_spans makes of the whole table, without holding it (a rank is loaded on its own and
    joined in). A rank's main thread and its DataLoader waits are its own; the one choice
    made for the whole run, DataLoader waits timed for the whole run over those only in
    traces, is made over every rank as before. Where XLA's collectives are told from gloo's,
    each rank is judged on its own (a run mixing both on different ranks, rare: the whole
    table's rule kept an all-XLA rank's collectives as the host's)."""
    data._stacks.clear()
    unions: dict[str, np.ndarray | None] = dict.fromkeys(_UNIONS)
    keyed: dict[str, dict[Any, np.ndarray]] = {k: {} for k in _KEYED_UNIONS}
    per_rank: dict[str, dict[int, Any]] = {k: {} for k in _PER_RANK}
    waits: dict[bool, dict[int, np.ndarray]] = {True: {}, False: {}}   # whole-run waits or traced ones
    steps = False
    for _r, table in ranks:
        part = RunData()
        load_spans(part, table, short_kernel_us)
        del table
        for k in _UNIONS:
            if (x := getattr(part, k)):
                unions[k] = _joined(unions[k], x)
        for k in _KEYED_UNIONS:
            into = keyed[k]
            for key, x in getattr(part, k).items():
                into[key] = _joined(into.get(key), x)
        for k in _PER_RANK:
            of_rank = per_rank[k]
            for r, x in getattr(part, k).items():      # (ranks null and 0 both load as 0)
                if r in of_rank:
                    both = _joined(_joined(None, of_rank[r]), x)
                    x = iv.Packed(both) if isinstance(x, iv.Packed) else [(s, e) for s, e in both.tolist()]
                of_rank[r] = x
        for r, x in part.input_waits.items():
            got = waits[part.input_whole_run]
            got[r] = _joined(got.get(r), x)
        for k in _COUNTS:
            setattr(data, k, getattr(data, k) + getattr(part, k))
        for key, n in part.region_count.items():
            data.region_count[key] = data.region_count.get(key, 0) + n
        data.region_kind.update(part.region_kind)
        steps = steps or bool(part.rank_steps)
        for key, ns in part.neuron_cc_ops.items():
            data.neuron_cc_ops[key] = data.neuron_cc_ops.get(key, 0) + ns
        for r, samples in part.py_samples.items():
            data.py_samples[r] = sorted(data.py_samples.get(r, []) + samples)
    data.py_samples = dict(sorted(data.py_samples.items()))
    for k, a in unions.items():
        setattr(data, k, [] if a is None else [(s, e) for s, e in a.tolist()])
    for k, sets in keyed.items():       # (in the order each key was first met: the regions' order)
        setattr(data, k, {key: [(s, e) for s, e in a.tolist()] for key, a in sets.items()})
    if steps:     # every rank's steps are one region, whatever a rank named a region of its own
        data.region_kind["ProfilerStep"] = "step"
    for k, sets in per_rank.items():        # (by rank, as load_spans gives them)
        setattr(data, k, dict(sorted(sets.items())))
    data.input_whole_run = bool(waits[True])
    data.input_waits = {r: [(s, e) for s, e in a.tolist()] for r, a in sorted((waits[True] or waits[False]).items())}
    _extend_to_spans(data)


NEURON_CATEGORIES = ("neuron_inst", "neuron_dma", "neuron_cc", "neuron_runtime")


def _load_neuron(data: RunData, spans: pa.Table, rows: list[int], start: list[int], end: list[int],
                 cat: list[Any], kclass: list[Any], name: list[Any]) -> None:
    """A NeuronCore's engine instructions ("<Engine> <OPCODE>"), DMA packets ("DMA <queue
    type>") and collectives (named by the collective), as the device's work."""
    nbytes = spans["bytes"].take(rows).to_pylist() if "bytes" in spans.column_names else [None] * len(rows)
    by_class: dict[str, iv.Intervals] = {}
    engines: dict[str, iv.Intervals] = {}
    queues: dict[str, iv.Intervals] = {}
    waits: iv.Intervals = []
    runtime: iv.Intervals = []
    for i, b in zip(rows, nbytes):
        s, e, c, k, n = start[i], end[i], cat[i], kclass[i], name[i] or "?"
        if c == "neuron_inst":
            if k == "compute" or k == "other" and not n.upper().endswith("SEMAPHORE") and "WAIT" not in n.upper():
                by_class.setdefault(k, []).append((s, e))
                engines.setdefault(n.split(" ", 1)[0], []).append((s, e))
            else:
                waits.append((s, e))
        elif c == "neuron_runtime":
            runtime.append((s, e))
        elif c == "neuron_dma":
            by_class.setdefault("memory", []).append((s, e))
            queues.setdefault(n[4:] if n.startswith("DMA ") else n, []).append((s, e))
            data.neuron_dma_bytes += b or 0
        else:
            by_class.setdefault("communication", []).append((s, e))
            data.neuron_cc_ops[n] = data.neuron_cc_ops.get(n, 0) + (e - s)
    data.neuron_class = {k: iv.merge(v) for k, v in by_class.items()}
    data.neuron_busy = iv.merge(p for v in data.neuron_class.values() for p in v)
    data.neuron_engines = {k: iv.merge(v) for k, v in engines.items()}
    data.neuron_waits = iv.merge(waits)
    data.neuron_dma_queues = {k: iv.merge(v) for k, v in queues.items()}
    data.neuron_runtime = iv.merge(runtime)


def _device_span(busy: iv.Intervals, traced: iv.Intervals) -> tuple[iv.Intervals, iv.Intervals, int, int] | None:
    """A device's busy set within the traced scope, the span from its first activity to its
    last (active), and their lengths; None when it did nothing there."""
    sp = iv.span(busy)
    traced_ns = iv.total(traced)
    if not sp or traced_ns <= 0:
        return None
    active = iv.intersect([sp], traced)
    active_ns = iv.total(active)
    return (busy, active, active_ns, traced_ns) if active_ns > 0 else None


def neuron_signals(data: RunData, traced: iv.Intervals, view: MetricView | None = None) -> dict[str, Signal]:
    """A NeuronCore's busy time as the GPU's from its kernels: shares of the span from its
    first activity to its last within the traced scope. Nothing running (no instruction other
    than a semaphore wait, no DMA, no collective) is the device waiting on the host; busy time
    by what ran, overlaps counted once: compute engines first, then collectives, then DMA."""
    spanned = _device_span(iv.intersect(data.neuron_busy, traced), traced)
    if spanned is None:
        return {}
    busy, active, active_ns, traced_ns = spanned
    cls = {k: iv.intersect(v, active) for k, v in data.neuron_class.items()}
    compute, comm, memory = cls.get("compute", []), cls.get("communication", []), cls.get("memory", [])
    comm_exposed = iv.subtract(comm, compute)
    mem_exposed = iv.subtract(iv.subtract(memory, compute), comm)
    other = iv.subtract(iv.subtract(iv.subtract(cls.get("other", []), compute), comm), memory)
    src = "neuron_explorer"
    out = {"neuron_active_share": Signal(active_ns / traced_ns, src, "NeuronCore-active span / traced wall"),
           "neuron_idle": Signal(1 - iv.total(busy) / active_ns, "neuron_explorer",
                                 "time no engine instruction (other than a semaphore wait), DMA packet or collective "
                                 "ran / NeuronCore-active span"),
           "neuron_compute": Signal(iv.total(compute) / active_ns, "neuron_explorer",
                                    "Tensor/Vector/Scalar/GpSimd instructions other than semaphore waits "
                                    "/ active span"),
           "neuron_comm_exposed": Signal(iv.total(comm_exposed) / active_ns, "neuron_explorer",
                                         "collective operations not overlapped by compute / active span"),
           "neuron_memory": Signal(iv.total(mem_exposed) / active_ns, "neuron_explorer",
                                   "DMA packets not overlapped by compute or collectives / active span")}
    idle = iv.subtract(active, busy)
    if idle and data.neuron_runtime:
        out["neuron_idle_in_runtime"] = Signal(
            iv.total(iv.intersect(idle, data.neuron_runtime)) / iv.total(idle), src,
            "idle time during which the host was inside a Neuron runtime call (system profile) / idle time")
    if other:
        out["neuron_other"] = Signal(iv.total(other) / active_ns, "neuron_explorer",
                                     "instructions of other engines (Sync) alone / active span")
    for engine, ivs in data.neuron_engines.items():
        out[f"neuron_engine:{engine}"] = Signal(iv.total(iv.intersect(ivs, active)) / active_ns, "neuron_explorer",
                                                f"{engine} engine's instructions other than semaphore waits "
                                                "/ active span")
    if mem_exposed and data.neuron_waits:
        out["neuron_wait_in_dma"] = Signal(
            iv.total(iv.intersect(data.neuron_waits, mem_exposed)) / iv.total(mem_exposed), "neuron_explorer",
            "DMA time not hidden by compute during which an engine sat in a semaphore wait / that DMA time")
    moving = iv.total(data.neuron_class.get("memory", []))
    if moving and data.neuron_dma_bytes:
        rate = data.neuron_dma_bytes / (moving / 1e9)       # packets carry bytes, not a rate per scope
        out["neuron_dma_rate"] = Signal(rate, src, "DMA bytes / time at least one DMA packet moved (whole profile)")
        peak = view.mean("neuron.profile.hbm_peak") if view is not None else None
        if peak:
            out["neuron_dma_of_peak"] = Signal(rate / peak, "neuron_explorer",
                                               "DMA rate while moving / the HBM peak the profile states")
    for key, metric in (("neuron_mfu", "neuron.profile.mfu"), ("neuron_mbu", "neuron.profile.mbu")):
        v = view.mean(metric) if view is not None else None
        if v is not None:
            out[key] = Signal(v / 100, "neuron_explorer", f"{metric} (Neuron Explorer's Summary)")
    for key, metric in (("neuron_intensity", "neuron.profile.mm_intensity"),
                        ("neuron_ridge", "neuron.profile.ridge")):
        v = view.mean(metric) if view is not None else None
        if v is not None and v > 0:
            out[key] = Signal(v, "neuron_explorer", f"{metric} (Neuron Explorer's Summary), FLOP/B")
    return out


def _load_xla(data: RunData, spans: pa.Table, rows: list[int], coll_rows: list[int],
              start: list[int], end: list[int], name: list[Any]) -> None:
    """XLA's ops on the host's threads: the device's busy intervals by class (analysis/xla.py).
    The collectives XLA ran (their attrs name an hlo_op) are its work too: taken out of the CPU
    collectives (gloo's model: a main thread waiting), into the device's communication."""
    attrs = spans["attrs"] if "attrs" in spans.column_names else None
    op_attrs = attrs.take(rows).to_pylist() if attrs is not None else [None] * len(rows)
    by_class: dict[str, iv.Intervals] = {}
    for i, a in zip(rows, op_attrs):
        k = xla.op_class(xla.field(a, "category"), xla.field(a, "opcode"), name[i])
        by_class.setdefault(k, []).append((start[i], end[i]))
    xla_coll = [i for i, a in zip(coll_rows, attrs.take(coll_rows).to_pylist() if attrs is not None and coll_rows
                                  else []) if a and '"hlo_op"' in a]
    if xla_coll:
        by_class.setdefault(xla.COMMUNICATION, []).extend((start[i], end[i]) for i in xla_coll)
        if len(xla_coll) == len(coll_rows):
            data.cpu_collectives, data.rank_collectives = [], {}
        else:
            out = set(xla_coll)
            data.cpu_collectives = iv.merge((start[i], end[i]) for i in coll_rows if i not in out)
            # per rank: left as recorded (a run that mixes gloo and XLA collectives is rare)
    data.xla_ops = len(rows) + len(xla_coll)
    data.xla_class = {k: iv.merge(v) for k, v in by_class.items()}
    data.xla_busy = iv.merge(p for v in data.xla_class.values() for p in v)


@dataclass
class Signal:
    value: float
    source: str          # collector / table it came from
    detail: str = ""     # how it was computed, in words


class MetricView:
    """Metric totals over one scope, as the signal table reads them. The report's view sums a
    run's buckets over any interval set (RunDataView); the live view's sums the last seconds of
    the live window (live/window.py, through live/verdict.py). One table of signals (counter_signals) reads both, so
    the report and the live line can never compute a signal two ways."""

    wall_ns: float = 0.0

    def delta(self, metric: str) -> float | None:       # sum over the scope; None: not measured
        raise NotImplementedError

    def mean(self, metric: str) -> float | None:        # gauges and ratios
        raise NotImplementedError

    def source(self, metric: str) -> str:
        return ""

    def device_mean(self, metric: str) -> float | None:
        """A gauge or ratio averaged over its entities (NeuronCores): a run's buckets already
        average them; the live view, which sums entities, overrides this."""
        return self.mean(metric)

    def first(self, names: Iterable[str]) -> str | None:
        return next((n for n in names if self.delta(n) is not None or self.mean(n) is not None), None)


class RunDataView(MetricView):
    def __init__(self, data: RunData, scope: iv.Intervals):
        self.data, self.scope = data, scope
        self.wall_ns = float(iv.total(scope))

    def delta(self, metric: str) -> float | None:
        s = self.data.series.get(metric)
        if s is None or s.kind != "delta":
            return None
        if len(self.scope) > 8 and (many := s.delta_many(self.scope)) is not None:
            tot, cov, found = many
            return tot if found and cov > 0 else None
        tot, cov, found = 0.0, 0.0, False
        for lo, hi in self.scope:
            r = s.delta(lo, hi)
            if r is not None:
                found = True
                tot += r[0]
                cov += r[1] * (hi - lo)
        return tot if found and cov > 0 else None

    def mean(self, metric: str) -> float | None:
        s = self.data.series.get(metric)
        if s is None:
            return None
        if len(self.scope) > 8:
            return s.mean_many(self.scope)
        vals = [m for lo, hi in self.scope if (m := s.mean(lo, hi)) is not None]
        return sum(vals) / len(vals) if vals else None

    def source(self, metric: str) -> str:
        return self.data.sources.get(metric, "")


# the thread-state collector's roles (collectors/threads.py): helpers are evidence, never time
THREAD_ROLES = {"intraop": "intra-op threads", "loader": "DataLoader workers",
                "comm": "communication threads", "other": "other threads of the job"}


def counter_signals(view: MetricView, ranks: int = 1) -> dict[str, Signal]:
    """Every signal that comes from samples (counters, host figures, thread states, GPU
    metrics) over the view's scope: the one signal table of the report and the live view."""
    out: dict[str, Signal] = {}
    wall = view.wall_ns
    if wall <= 0:
        return out
    delta, mean = view.delta, view.mean

    # --- CPU: how busy, how it waits ----------------------------------------------------
    task = delta("task-clock")
    if task is not None:
        out["cpu_busy"] = Signal(task / wall, "perf", "task-clock / wall")
    else:
        user, system = delta("proc.cpu_user"), delta("proc.cpu_system")
        if user is not None:
            out["cpu_busy"] = Signal((user + (system or 0.0)) * 1e9 / wall, "host",
                                     "(proc.cpu_user + proc.cpu_system) / wall")
    for metric, key in (("context-switches", "ctx_switches_per_s"), ("page-faults", "page_faults_per_s"),
                        ("major-faults", "major_faults_per_s"),
                        ("proc.ctx_switches_voluntary", "voluntary_switches_per_s")):
        v = delta(metric)
        if v is not None:
            out[key] = Signal(v * 1e9 / wall, view.source(metric), f"{metric} per second")
    rd = delta("proc.run_delay")
    if rd is not None:
        out["run_queue_wait"] = Signal(rd * 1e9 / wall, "host",
                                       "main threads' run-queue delay / wall (runnable, no CPU free)")
    io = [v for m in ("proc.read_bytes", "proc.write_bytes") if (v := delta(m)) is not None]
    if io:
        out["io_bytes_per_s"] = Signal(sum(io) * 1e9 / wall, "host", "storage bytes read+written per second")
    iowait = mean("system.cpu_iowait")
    if iowait is not None:
        out["system_iowait"] = Signal(iowait / 100, "host", "share of CPU time idle waiting for I/O")

    # --- the critical (main) thread's states, and its helpers' CPU ----------------------------
    states = {k: delta(f"thread.main.{k}") for k in ("running", "runnable", "blocked")}
    known = sum(v for v in states.values() if v is not None)
    if states["running"] is not None and known > 0:
        for k, v in states.items():
            out[f"main_{k}"] = Signal((v or 0.0) / known, "threads",
                                      f"thread.main.{k} / the main thread's time")
        out["main_threads"] = Signal(known * 1e9 / wall, "threads",
                                     "main threads' time / wall (one per rank)")
    for role in THREAD_ROLES:
        v = delta(f"thread.{role}.running")
        if v is not None:
            out[f"{role}_cpus"] = Signal(v * 1e9 / wall, "threads", f"thread.{role}.running / wall")
    workers = mean("thread.loader.workers")
    if workers and "loader_cpus" in out:
        out["loader_workers"] = Signal(workers, "threads", "DataLoader worker processes (mean)")
        out["loader_busy"] = Signal(min(1.0, out["loader_cpus"].value / workers), "threads",
                                    "DataLoader workers' CPU / workers")

    # --- CPU: what the busy time is made of (hardware counters) ----------------------------
    ins = delta("instructions") or delta("inst_retired")
    cyc = delta("cycles") or delta("cpu-cycles") or delta("cpu_cycles")
    if ins is not None and cyc:
        out["ipc"] = Signal(ins / cyc, "perf", "instructions / cycles")
    llc = delta("LLC-load-misses")
    if llc is not None and ins:
        out["llc_mpki"] = Signal(1000 * llc / ins, "perf", "LLC-load-misses per 1000 instructions")
    be = delta("stalled-cycles-backend")
    if be is not None and cyc:
        out["backend_stall"] = Signal(be / cyc, "perf", "stalled-cycles-backend / cycles")
    slots = delta("slots")
    if slots:   # Intel top-down level 1 (and topdown-mem-bound from level 2)
        for ev, key in (("topdown-retiring", "td_retiring"), ("topdown-bad-spec", "td_bad_spec"),
                        ("topdown-fe-bound", "td_frontend"), ("topdown-be-bound", "td_backend"),
                        ("topdown-mem-bound", "td_memory")):
            v = delta(ev)
            if v is not None:
                out[key] = Signal(v / slots, "perf", f"{ev} / slots")
    amd_cyc = delta("ls_not_halted_cyc")
    if amd_cyc:   # AMD Zen 4: 6 dispatch slots per cycle
        total_slots = 6 * amd_cyc
        for ev, key in (("ex_ret_ops", "td_retiring"), ("de_no_dispatch_per_slot.backend_stalls", "td_backend"),
                        ("de_no_dispatch_per_slot.no_ops_from_frontend", "td_frontend")):
            v = delta(ev)
            if v is not None:
                out[key] = Signal(v / total_slots, "perf", f"{ev} / (6 x ls_not_halted_cyc)")
    arm_slots = delta("stall_slot")
    arm_cyc = delta("cpu_cycles")
    if arm_slots is not None and arm_cyc:   # Arm Neoverse: STALL_SLOT_* over slots
        for ev, key in (("stall_slot_backend", "td_backend"), ("stall_slot_frontend", "td_frontend")):
            v = delta(ev)
            if v is not None and arm_slots:
                out[key] = Signal(v / arm_slots, "perf", f"{ev} / stall_slot")
        mem = delta("stall_backend_mem")
        if mem is not None:
            out["td_memory"] = Signal(mem / arm_cyc, "perf", "stall_backend_mem / cpu_cycles")

    # --- GPU: from NVML/GPM samples ----------------------------------------------------------
    # All in percent (the nvml collector's catalog). Never guessed from the value: a mean
    # under 1 % is a percent too (an embedding job's tensor cores, 0.9 %, read as 90 % once).
    util_metric = view.first(GPU_UTIL)
    if util_metric:
        u = mean(util_metric)
        if u is not None:
            out["gpu_util"] = Signal(u / 100, view.source(util_metric) or "nvml",
                                     f"{util_metric} mean (share of time a kernel ran)")
    for key, names in GPM.items():
        m = view.first(names)
        if m:
            v = mean(m)
            if v is not None:
                out[f"gpm_{key}"] = Signal(v / 100, view.source(m) or "gpm", f"{m} mean")
    out.update(_neuron_signals(delta, view.device_mean))
    return out


def _neuron_signals(delta: Callable[[str], float | None],
                    mean: Callable[[str], float | None]) -> dict[str, Signal]:
    """Neuron devices (collectors/neuron): NeuronCore utilization as the device's busy share,
    FLOP/s, and the runtime's execution errors and the devices' ECC events as counts."""
    out: dict[str, Signal] = {}
    u = mean("neuron.core_util")
    if u is not None:
        out["neuron_util"] = Signal(u / 100, "neuron", "neuron.core_util mean (share of time the NeuronCores ran)")
    f = mean("neuron.flops_rate")
    if f is not None:
        out["neuron_flops"] = Signal(f, "neuron", "neuron.flops_rate mean (FLOP/s per NeuronCore)")
    for key, names in (("neuron_exec_errors", NEURON_EXEC_ERRORS), ("neuron_ecc_uncorrected", NEURON_ECC[:2]),
                       ("neuron_ecc_corrected", NEURON_ECC[2:])):
        vals = [v for m in names if (v := delta(m)) is not None]
        if vals:
            out[key] = Signal(sum(vals), "neuron", " + ".join(names) + " (count)")
    return out


def others_cpus(view: MetricView, cpus: int | None, sig: dict[str, Signal]) -> dict[str, Signal]:
    """The CPUs other processes held over the scope: the machine's busy CPUs less the workload
    tree's (who the main thread may have waited for)."""
    util = view.mean("system.cpu_util") if cpus else None
    if util is None or not cpus or "cpu_busy" not in sig:
        return {}
    return {"others_cpus": Signal(max(0.0, util / 100 * cpus - sig["cpu_busy"].value), "host",
                                  "system.cpu_util x CPUs - the workload's CPUs")}


def beside_the_rank(whole: RunData, scope: iv.Intervals, rank_sig: dict[str, Signal]) -> dict[str, Signal]:
    """Who held the CPUs beside one rank, from the whole run over the rank's scope: other
    processes (the machine's busy CPUs less the whole job's) and the job's other ranks (the
    job's CPUs less this rank's). A rank's own samples know neither, and without them its
    runnable time would all go to the few holders it does know (its gloo threads)."""
    view = RunDataView(whole, scope)
    job = counter_signals(view, whole.ranks)
    out = others_cpus(view, whole.cpus, job)
    if "cpu_busy" in job and "cpu_busy" in rank_sig:
        out["other_ranks_cpus"] = Signal(max(0.0, job["cpu_busy"].value - rank_sig["cpu_busy"].value), "host",
                                         "the job's CPUs less this rank's (its other ranks)")
    return out


def signals(data: RunData, scope: iv.Intervals, steps: bool = False) -> dict[str, Signal]:
    """Every signal measurable over `scope` (a merged interval set). `steps`: the scope is the
    steps, whose span-derived shares come from the step schedule's windows where there are any
    (a time window that caught the first step is left out: the first step allocates the
    optimizer's state, the GPU waiting, and is not what a step is like)."""
    out: dict[str, Signal] = {}
    trace_windows = data.step_windows if steps and data.step_windows else data.windows
    wall = iv.total(scope)
    if wall <= 0:
        return out
    out["wall_s"] = Signal(wall / 1e9, "run", "wall time of the scope")
    if data.ranks > 1:
        out["ranks"] = Signal(float(data.ranks), "run", "rank partitions in the run")
    out.update(counter_signals(RunDataView(data, scope), data.ranks))
    ranks = max(1, data.ranks)
    out.update(others_cpus(RunDataView(data, scope), data.cpus, out))

    # --- the main thread's waits, from spans ----------------------------------------------
    # DataLoader next() waits: recorded for the whole run by the torch driver, or else only
    # inside trace windows (torch's own annotation of them)
    if data.input_waits:
        where = scope if data.input_whole_run else (iv.intersect(scope, trace_windows) if trace_windows else scope)
        where_ns = iv.total(where)
        if where_ns > 0:
            waited = sum(iv.total(iv.intersect(w, where)) for w in data.input_waits.values())
            out["input_wait"] = Signal(min(1.0, waited / (where_ns * ranks)), "spans",
                                       "time the main thread waited in DataLoader next() / wall"
                                       + ("" if data.input_whole_run else ", in the trace windows"))
            # how busy the workers were while the main thread waited for them: saturated
            # workers want more of them; idle ones point elsewhere (prefetch, IPC)
            waits = iv.intersect(iv.merge(p for w in data.input_waits.values() for p in w), where)
            workers_series = data.series.get("thread.loader.workers")
            workers = max((m for lo, hi in scope if workers_series is not None
                           and (m := workers_series.peak(lo, hi)) is not None), default=None)
            cpu = RunDataView(data, waits).delta("thread.loader.running") if waits else None
            if workers and cpu is not None and iv.total(waits) > 0:
                out["loader_workers"] = Signal(workers, "threads", "DataLoader worker processes (peak)")
                out["loader_busy"] = Signal(min(1.0, cpu * 1e9 / iv.total(waits) / workers), "threads",
                                            "DataLoader workers' CPU while the main thread waited / workers")
                ready = RunDataView(data, waits).delta("thread.loader.runnable")
                if ready is not None:
                    out["loader_runnable"] = Signal(min(1.0, ready * 1e9 / iv.total(waits) / workers), "threads",
                                                    "DataLoader workers' run-queue wait while the main thread "
                                                    "waited / workers")

    # --- GPU and collectives: from spans -----------------------------------------------------
    # Traces are recorded in windows (a few steps every N): span-derived shares are measured
    # over the recorded part of the scope only, never counting unrecorded time as idle.
    traced = iv.intersect(scope, trace_windows) if trace_windows else scope
    traced_ns = iv.total(traced)
    if trace_windows:
        out["trace_coverage"] = Signal(traced_ns / wall, "spans", "recorded trace windows / wall")
        if traced_ns == 0:
            out.update(_carried_op_share(data, scope, wall))
            return out
    if data.main_ops:
        out.update(main_op_signals(data, traced))
    if data.gpu_busy:
        busy = iv.intersect(data.gpu_busy, traced)
        sp = iv.span(busy)
        if sp:
            active = iv.intersect([sp], traced)
            active_ns = iv.total(active)
            busy_ns = iv.total(busy)
            out["gpu_active_share"] = Signal(active_ns / traced_ns, "spans", "GPU-active span / traced wall")
            out["gpu_idle"] = Signal(1 - busy_ns / active_ns if active_ns else 0.0, "spans",
                                     "time no kernel, copy or sync ran / GPU-active span")
            cls = {k: iv.intersect(v, active) for k, v in data.gpu_class.items()}
            compute = cls.get("compute", [])
            comm = cls.get("communication", [])
            memory = cls.get("memory", [])
            out["gpu_compute"] = Signal(iv.total(compute) / active_ns, "spans", "compute kernels / active span")
            exposed_comm = iv.subtract(comm, compute)
            out["gpu_comm_exposed"] = Signal(iv.total(exposed_comm) / active_ns, "spans",
                                             "communication not overlapped by compute / active span")
            out["gpu_memory"] = Signal(iv.total(iv.subtract(iv.subtract(memory, compute), comm)) / active_ns,
                                       "spans",
                                       "memcpy/memset not overlapped by compute or communication / active span")
            if comm:
                out["comm_overlap"] = Signal(iv.total(iv.intersect(comm, compute)) / iv.total(comm), "spans",
                                             "communication overlapped by compute / communication")
    if data.xla_busy:
        out.update(xla_signals(data, traced))
    if data.neuron_busy:
        out.update(neuron_signals(data, traced, RunDataView(data, scope)))
    if data.gpu_kernel_count:
        out["short_kernel_share"] = Signal(data.short_kernels / data.gpu_kernel_count, "spans",
                                           "kernels shorter than the launch-cost threshold / kernels")
    if data.cpu_collectives:
        coll = iv.intersect(data.cpu_collectives, traced)
        if coll:
            out["cpu_collective"] = Signal(iv.total(coll) / traced_ns, "spans",
                                           "time inside CPU collectives (gloo), any rank / traced wall")
            # per rank: the time its main thread waits for a collective with no op of its own
            # running (the exposed share); collective time under its own ops is overlapped.
            # Traces cover a few steps: the traced steps' exposed share stands for the scope's
            # steps (every step is timed), not for its start-up or other untraced time
            # (every rank at once: the stacked sets' totals inside traced and scope)
            coll_r, under_own_r, steps_r = data.collective_stacks()
            in_coll_r = coll_r.totals(traced)
            exposed_r = in_coll_r - under_own_r.totals(traced)
            traced_steps_r = steps_r.totals(traced)
            scope_steps_r = steps_r.totals(scope) if traced_steps_r.any() else traced_steps_r
            in_coll, exposed = int(in_coll_r.sum()), int(exposed_r.sum())
            share = 0.0
            for x, t_steps, s_steps in zip(exposed_r.tolist(), traced_steps_r.tolist(), scope_steps_r.tolist()):
                share += min(1.0, x / t_steps) * s_steps / wall if t_steps > 0 else x / traced_ns
            out["cpu_collective_exposed"] = Signal(
                min(1.0, share / ranks), "spans",
                "per rank, collective time not overlapped by the main thread's own ops, over the "
                "traced steps, times the scope's share of steps")
            if in_coll:
                out["cpu_collective_overlap"] = Signal(1 - exposed / in_coll, "spans",
                                                       "collective time overlapped by the main thread's ops")
            rest = iv.subtract(traced, coll)
            rest_ns = iv.total(rest)
            if rest_ns > 0 and "cpu_busy" in out:
                task_rest = None
                s = data.series.get("task-clock")
                many = s.delta_many(rest) if s is not None and len(rest) > 8 else None
                if many is not None:     # a rank's thousands of steps at once
                    task_rest = many[0] if many[2] else None
                elif s is not None:
                    parts = [d for lo, hi in rest if (d := s.delta(lo, hi)) is not None]
                    if parts:
                        task_rest = sum(p[0] for p in parts)
                if task_rest is not None:
                    out["cpu_busy_outside_collectives"] = Signal(task_rest / rest_ns, "perf",
                                                                 "task-clock / wall, outside collectives")
    return out


def xla_signals(data: RunData, traced: iv.Intervals) -> dict[str, Signal]:
    """The XLA ops as the device's work (analysis/xla.py), as the GPU's kernels are: shares of
    the span from the first op to the last within the traced scope. No op running is the
    device idle, waiting on the host; busy time by the ops' class, overlaps counted once
    (compute first, then communication, memory, the undecided rest)."""
    spanned = _device_span(iv.intersect(data.clipped(data.xla_busy, traced), traced), traced)
    if spanned is None:
        return {}
    busy, active, active_ns, traced_ns = spanned
    idle = iv.subtract(active, busy)
    # idle while the Python waits on an execution it launched (after its dispatch returned, up
    # to that execution's last op): the XLA runtime's own time between ops (scheduling, buffer
    # allocation, a worker waiting for a CPU), not the host's
    runtime_ns = iv.total(iv.intersect(idle, _executions(data.clipped(data.xla_dispatch, active), busy)))
    out = {"xla_active_share": Signal(active_ns / traced_ns, "spans", "XLA-active span / traced wall"),
           "xla_idle": Signal(max(0.0, (iv.total(idle) - runtime_ns) / active_ns), "spans",
                              "time no XLA op ran, outside executions the Python waited on / XLA-active span")}
    if runtime_ns > 0:
        out["xla_runtime"] = Signal(runtime_ns / active_ns, "spans",
                                    "time no XLA op ran while the Python waited on an execution it "
                                    "launched (from its dispatch's end to its last op) / XLA-active span")
    taken: iv.Intervals = []
    for k, key, words in ((xla.COMPUTE, "xla_compute", "dot/convolution ops"),
                          (xla.COMMUNICATION, "xla_comm", "collectives not overlapped by compute"),
                          (xla.MEMORY, "xla_memory", "elementwise, reduction and copy ops not overlapped "
                                                     "by the above"),
                          (xla.OTHER, "xla_other", "ops of other kinds not overlapped by the above")):
        own = iv.intersect(data.clipped(data.xla_class.get(k, []), active), active)
        if not own:
            continue
        if taken:
            own = iv.subtract(own, taken)
        out[key] = Signal(iv.total(own) / active_ns, "spans", f"{words} / XLA-active span")
        taken = iv.merge([*taken, *own])
    return out


def _executions(dispatch: iv.Intervals, busy: iv.Intervals) -> iv.Intervals:
    """Per dispatch: from its end to the end of the last op that ran before the next dispatch
    (the execution it launched, which the Python waits on when it blocks)."""
    if not dispatch or not busy:
        return []
    starts = np.fromiter((a for a, _ in busy), np.int64, len(busy))
    out = []
    for i, (_, e) in enumerate(dispatch):
        nxt = dispatch[i + 1][0] if i + 1 < len(dispatch) else busy[-1][1] + 1
        j = int(np.searchsorted(starts, nxt, "left")) - 1      # the last op starting before it
        if j >= 0 and busy[j][1] > e:
            out.append((e, min(busy[j][1], nxt)))
    return out


def _outside_ops(data: RunData, traced: iv.Intervals) -> tuple[int, int, dict[int, iv.Intervals]]:
    """Per rank with a traced main thread: its traced time outside its own torch ops and
    outside its waits (DataLoader next(), collectives not under its own ops): the Python of
    the loop. -> (ns in ops, ns outside ops and waits, rank -> those outside intervals)."""
    key = tuple(traced)
    if key in data.outside_ops_memo:       # a scope's signals and its host_where ask alike
        return data.outside_ops_memo[key]
    in_ops = outside = comm = 0
    where: dict[int, iv.Intervals] = {}
    for r, ops in data.main_ops.items():
        ops_r = iv.intersect(data.clipped(ops, traced), traced)
        waits = iv.merge([*data.clipped(data.input_waits.get(r, []), traced),
                          *data.clipped(data.rank_collectives.get(r, []), traced)])
        rest = iv.subtract(iv.subtract(traced, ops_r), waits)
        in_ops += iv.total(ops_r)
        outside += iv.total(rest)
        where[r] = rest
        if data.comm_ops.get(r):
            comm += iv.total(iv.intersect(data.clipped(data.comm_ops[r], traced), ops_r))
    if len(data.outside_ops_memo) > 64:
        data.outside_ops_memo.clear()
        data.comm_ops_memo.clear()
    data.outside_ops_memo[key] = (in_ops, outside, where)
    data.comm_ops_memo[key] = comm
    return in_ops, outside, where


def main_op_signals(data: RunData, traced: iv.Intervals) -> dict[str, Signal]:
    """The share of the main thread's traced time (outside its waits) spent inside its own
    torch ops; the rest is Python between ops (tokenization, collation, framework overhead):
    host time, however busy the CPU was. Measured over the traced part of the scope and
    carried to the whole of it, as the collective waits are."""
    in_ops, outside, _ = _outside_ops(data, traced)
    if in_ops + outside <= 0:
        return {}
    out = {"main_in_ops": Signal(in_ops / (in_ops + outside), "spans",
                                 "the main thread's time inside its own torch ops / its traced time "
                                 "outside input and collective waits")}
    comm = data.comm_ops_memo.get(tuple(traced), 0)
    if comm > 0:
        out["main_in_comm_ops"] = Signal(comm / (in_ops + outside), "spans",
                                         "of that time, op time the collectives caused (ops slowed "
                                         "beside them, the sync's own ops) / the same whole")
    return out


def _carried_op_share(data: RunData, scope: iv.Intervals, wall: int) -> dict[str, Signal]:
    """An untraced scope (a verdict window between trace windows) that holds steps: their part
    of it gets the traced steps' share of time in ops, the rest counts as in ops (unknown, as
    before traces were read this way)."""
    if not data.main_ops or not data.rank_steps:
        return {}
    if data.steps_in_ops is None:
        steps = iv.union(data.rank_steps.values())
        traced = iv.intersect(steps, data.step_windows or data.windows)
        in_ops, outside, _ = _outside_ops(data, traced)
        data.steps_in_ops = in_ops / (in_ops + outside) if in_ops + outside > 0 else -1.0
        if in_ops + outside > 0:
            data.steps_in_comm_ops = data.comm_ops_memo.get(tuple(traced), 0) / (in_ops + outside)
    if data.steps_in_ops < 0:
        return {}
    in_steps = int(data.steps_stack().totals(scope).sum())
    f = min(1.0, in_steps / (wall * max(1, len(data.rank_steps))))
    if f <= 0:
        return {}
    out = {"main_in_ops": Signal(data.steps_in_ops * f + (1 - f), "spans",
                                 "the traced steps' share of time inside torch ops, carried to this "
                                 "untraced time's steps")}
    if data.steps_in_comm_ops > 0:
        out["main_in_comm_ops"] = Signal(data.steps_in_comm_ops * f, "spans",
                                         "the traced steps' share of op time the collectives caused, "
                                         "carried to this untraced time's steps")
    return out


def _coverage(ivs: iv.Intervals) -> Callable[[np.ndarray], np.ndarray]:
    """For a sorted, disjoint interval set: t -> how much of the set lies before t."""
    starts = np.fromiter((a for a, _ in ivs), np.int64, len(ivs))
    ends = np.fromiter((b for _, b in ivs), np.int64, len(ivs))
    before = np.concatenate([[0], np.cumsum(ends - starts)])

    def covered(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(starts, t, "right") - 1
        j = np.maximum(i, 0)
        return np.where(i >= 0, before[j] + np.minimum(t, ends[j]) - starts[j], 0)
    return covered


def host_where(data: RunData, scope: iv.Intervals, steps: bool = False, exclude: str | None = None,
               most: int = 3) -> list[tuple[str, float]]:
    """Where the main thread's time outside ops went, by the user's regions and record_function
    annotations that cover it: [(name, share of that time outside ops)], largest first, those of
    at least 5%. exclude: the scope's own region."""
    trace_windows = data.step_windows if steps and data.step_windows else data.windows
    traced = iv.intersect(scope, trace_windows) if trace_windows else scope
    in_ops, outside, where = _outside_ops(data, traced)
    if outside <= 0:
        return []
    # how much of the outside time lies before any instant: one searchsorted per region
    covered = [_coverage(rest) for rest in where.values() if rest]
    found = []
    for name, occ in data.regions.items():
        if name == exclude or data.region_kind.get(name) == "step" or name.startswith(DATALOADER_NEXT):
            continue
        a = np.fromiter((p[0] for p in occ), np.int64, len(occ))
        b = np.fromiter((p[1] for p in occ), np.int64, len(occ))
        ns = sum(float(np.sum(c(b) - c(a))) for c in covered)
        share = ns / outside
        if share >= 0.05:
            found.append((name, share))
    found = sorted(found, key=lambda kv: -kv[1])[:most]
    if sum(sh for _, sh in found) < 0.5:
        # the regions do not say where most of it went: the sampled Python stack does
        found += _code_where(data, where, most)
    return found


def _code_where(data: RunData, where: dict[int, iv.Intervals], most: int) -> list[tuple[str, float]]:
    """The user's functions the main thread's sampled stack was in during its time outside
    ops, by function (as pyinstrument groups them), each named at its hottest line:
    [("func (file:line)", share of the samples in that function)], at least 5% and 3 samples."""
    counts: dict[str, int] = {}
    n = 0
    for r, rest in where.items():
        samples = data.py_samples.get(r)
        if not samples or not rest:
            continue
        times = np.fromiter((t for t, _ in samples), np.int64, len(samples))
        starts = np.fromiter((a for a, _ in rest), np.int64, len(rest))
        ends = np.fromiter((b for _, b in rest), np.int64, len(rest))
        i = np.searchsorted(starts, times, "right") - 1
        inside = (i >= 0) & (times < ends[np.maximum(i, 0)])
        for k in np.flatnonzero(inside):
            label = samples[k][1]
            counts[label] = counts.get(label, 0) + 1
            n += 1
    if n == 0:
        return []
    funcs: dict[str, int] = {}
    hottest: dict[str, tuple[int, str]] = {}
    for label, c in counts.items():
        func = label.rsplit(":", 1)[0]          # "tokenize (train.py:31)" -> "tokenize (train.py"
        funcs[func] = funcs.get(func, 0) + c
        if c > hottest.get(func, (0, ""))[0]:
            hottest[func] = (c, label)
    ranked = sorted(funcs.items(), key=lambda kv: -kv[1])
    return [(hottest[f][1], c / n) for f, c in ranked[:most] if c >= 3 and c / n >= 0.05]
