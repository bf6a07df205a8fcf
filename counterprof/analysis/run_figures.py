"""A run reduced to what `compare` and `history` compare: per-step and per-region durations, each
metric's value per time window (per rank), and the classifier's verdicts. Pure: it takes the
run's meta, catalog, a way to stream each rank's samples and the spans table; it reads no files.

One streaming pass over the samples (Arrow batches into dense numpy accumulators: memory is
bounded by metrics x cells, not by the run's length or rank count) gives both:
- per rank, each metric per window (`window_ns`): deltas as a rate over the time the window's
  samples cover (sum / (last end - first start)), gauges and ratios as the mean of the window's
  samples. A window with an unknown (null) delta reading is left out, never read as 0;
- summed over ranks, the classifier's input (signals.RunData) at a resolution of at most
  MAX_CELLS buckets per metric, so that `signals()`/`classify()` give the verdicts exactly as
  `counterprof report` computes them (which buckets at the finest sampling interval: identical
  for runs shorter than MAX_CELLS intervals, coarser only beyond).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..ground.redact import redact_argv
from ..store.meta import RunMeta, WorkloadFacts
from . import intervals as iv
from .classify import Verdict, classify
from .signals import RunData, Series, load_spans, signals
from ..ground.thresholds import value

MAX_CELLS = 4000           # verdict resolution: buckets per metric (bounds memory and time)
MAX_WINDOW_CELLS = 100_000  # cells per metric however short compare's shared window
RANK_BLOCKS = 16           # the ranks' samples are reduced in at most this many blocks (rank_blocks)
WINDOWS = 200              # default: aim for this many metric windows per run (enough values
#                            for a bootstrap interval) ...
MIN_SAMPLES_PER_WINDOW = 2  # ... but never fewer than 2 sampling intervals per window
MAX_VERDICT_REGIONS = 50   # regions that get their own verdict (by total time), like report's 20
REGION_CATEGORIES = ("region", "annotation")
STEP = "step_time"
# The main threads' time runnable but waiting for a CPU, first found wins: the threads collector's
# (the rank's main thread itself), else the host collector's (each process's main thread, summed)
WAIT_METRICS = ("thread.main.runnable", "proc.run_delay")
KEY_SIGNALS = ("cpu_busy", "ipc", "gpu_util", "gpm_tensor", "gpm_dram", "gpu_idle", "cpu_collective",
               "io_bytes_per_s", "run_queue_wait")


@dataclass
class Contention:
    """How long the workload's main threads waited for a CPU, and how busy the machine was
    around the workload, over one run (compare's evidence that the machine moved)."""

    wait_source: str = ""       # the metric the waits come from (WAIT_METRICS); "" without one
    waits: dict[str, float] = field(default_factory=dict)   # "run", "step_time", "region:NAME" ->
    #                             share of the scope's wall time a main thread spent waiting for a CPU
    main_threads: float = 0.0   # the waits are the mean over this many main threads
    workload_cpus: float | None = None   # the workload tree's CPU use, in CPUs (proc.cpu_user + system)
    busy_cpus: float | None = None       # the machine's (system.cpu_util x its CPUs)
    cpus: int | None = None              # the machine's CPUs (meta.json host.cpus)

    @property
    def other_cpus(self) -> float | None:
        """CPUs other processes used (the machine's busy CPUs less the workload's)."""
        if self.busy_cpus is None or self.workload_cpus is None:
            return None
        return max(0.0, self.busy_cpus - self.workload_cpus)

    @property
    def other_share(self) -> float | None:
        o = self.other_cpus
        return o / self.cpus if o is not None and self.cpus else None


@dataclass
class RunFigures:
    """One run, reduced. Keys of `times`: "step_time" and "region:NAME" ("region:NAME (GPU)" for
    GPU-side annotations); of `metrics`: the metric's name."""

    path: str
    run_id: str
    command: list[str]
    ranks: list[int]
    window_s: float
    start_ns: int = 0
    end_ns: int = 0
    times: dict[str, dict[int, np.ndarray]] = field(default_factory=dict)    # key -> rank -> s
    metrics: dict[str, dict[int, np.ndarray]] = field(default_factory=dict)  # metric -> rank -> per window
    units: dict[str, str] = field(default_factory=dict)        # metric -> unit of its per-window values
    kinds: dict[str, str] = field(default_factory=dict)        # metric -> delta | gauge | ratio
    totals: dict[str, dict[int, float]] = field(default_factory=dict)   # delta metric -> rank -> sum
    verdict: Verdict | None = None                             # the whole run
    scope_verdicts: dict[str, Verdict] = field(default_factory=dict)    # "step_time", "region:NAME"
    scope_signals: dict[str, dict[str, float]] = field(default_factory=dict)  # "run" and the scopes
    meta: dict[str, Any] = field(default_factory=dict)         # meta.json as read (RunMeta.raw)
    contention: Contention = field(default_factory=Contention)
    workload: WorkloadFacts = field(default_factory=WorkloadFacts)

    @property
    def workload_wall_s(self) -> float | None:
        """The launched workload's wall time (meta.json's workload.elapsed_s), None without one."""
        w = self.workload.elapsed_s
        return float(w) if isinstance(w, (int, float)) and w > 0 else None

    @property
    def wall_s(self) -> float:
        """The workload's wall time; for a run without a launched workload (profile()), the
        span profiled."""
        return self.workload_wall_s or (self.end_ns - self.start_ns) / 1e9


def collector_intervals_ns(meta: RunMeta | dict[str, Any]) -> list[int]:
    """Sampling intervals of the collectors that ran (config interval_ms), in ns."""
    return [int(c.interval_ms * 1e6) for c in RunMeta.of(meta).collectors.values()
            if c.ran and c.interval_ms]


def default_window_ns(meta: RunMeta | dict[str, Any], start_ns: int, end_ns: int) -> int:
    """Metric windows for one run: about WINDOWS of them, each at least MIN_SAMPLES_PER_WINDOW of
    the slowest collector's intervals (and at least 100 ms). compare takes the largest over the
    runs it compares, so that every run's rates average over the same length of time."""
    slowest = max(collector_intervals_ns(meta) or [100_000_000])
    return int(max(MIN_SAMPLES_PER_WINDOW * slowest, (end_ns - start_ns) / WINDOWS, 100_000_000))


def time_bounds(meta: RunMeta | dict[str, Any], batches: Callable[[], Iterable[pa.RecordBatch]]) -> tuple[int, int]:
    """The run's first and last ns: from meta.json, or (a recovered run has no end) the samples."""
    m = RunMeta.of(meta)
    lo, hi = m.start_ns, m.end_ns
    if isinstance(lo, int) and isinstance(hi, int) and hi > lo:
        return lo, hi
    lo = hi = None
    for b in batches():
        if b.num_rows == 0:
            continue
        mm = pc.min_max(b["time"].cast(pa.int64())).as_py()
        lo = mm["min"] if lo is None else min(lo, mm["min"])
        hi = mm["max"] if hi is None else max(hi, mm["max"])
    if lo is None:
        s = m.start_ns or 0
        return s, s
    assert hi is not None           # set with lo
    return (min(lo, m.start_ns) if isinstance(m.start_ns, int) else lo), hi


class _Cells:
    """Dense per-(metric, cell) accumulators: sum and count of known values, unknowns, first
    covered ns (time - duration) and last time. Grows when a new metric appears."""

    def __init__(self, ncells: int):
        self.ncells = ncells
        self.names: list[str] = []
        self.sum = np.zeros((0, ncells))
        self.count = np.zeros((0, ncells), np.int64)
        self.nulls = np.zeros((0, ncells), np.int64)
        self.first = np.zeros((0, ncells), np.int64)
        self.last = np.zeros((0, ncells), np.int64)

    _NONE_FIRST = np.iinfo(np.int64).max
    _NONE_LAST = np.iinfo(np.int64).min

    def _grow(self, rows: int) -> None:
        add = rows - self.sum.shape[0]
        if add <= 0:
            return
        n = self.ncells
        self.sum = np.vstack([self.sum, np.zeros((add, n))])
        self.count = np.vstack([self.count, np.zeros((add, n), np.int64)])
        self.nulls = np.vstack([self.nulls, np.zeros((add, n), np.int64)])
        self.first = np.vstack([self.first, np.full((add, n), self._NONE_FIRST, np.int64)])
        self.last = np.vstack([self.last, np.full((add, n), self._NONE_LAST, np.int64)])

    def ids(self, names: list[str], index: dict[str, int]) -> np.ndarray:
        out = []
        for n in names:
            i = index.get(n)
            if i is None:
                i = index[n] = len(self.names)
                self.names.append(n)
            out.append(i)
        self._grow(len(self.names))
        return np.asarray(out, np.int64)

    def add(self, metric_ids: np.ndarray, cells: np.ndarray, t: np.ndarray, first: np.ndarray,
            values: np.ndarray, known: np.ndarray | None) -> None:
        """known: which values are not null (None: all of them, the usual case)."""
        n = self.ncells
        size = len(self.names) * n
        key = metric_ids * n + cells
        if known is None:
            self.sum.reshape(-1)[:] += np.bincount(key, weights=values, minlength=size)
            self.count.reshape(-1)[:] += np.bincount(key, minlength=size)
        else:
            self.sum.reshape(-1)[:] += np.bincount(key, weights=np.where(known, values, 0.0), minlength=size)
            rows = np.bincount(key, minlength=size)
            good = np.bincount(key, weights=known, minlength=size).astype(np.int64)
            self.count.reshape(-1)[:] += good
            self.nulls.reshape(-1)[:] += rows - good
        np.minimum.at(self.first.reshape(-1), key, first)
        np.maximum.at(self.last.reshape(-1), key, t)

    def merge_into(self, other: _Cells, index: dict[str, int]) -> None:
        """Add these cells (one rank's) into `other` (all ranks')."""
        ids = other.ids(self.names, index)
        other.sum[ids] += self.sum
        other.count[ids] += self.count
        other.nulls[ids] += self.nulls
        other.first[ids] = np.minimum(other.first[ids], self.first)
        other.last[ids] = np.maximum(other.last[ids], self.last)

    def seen(self) -> np.ndarray:
        return (self.count + self.nulls) > 0


def _rate_unit(unit: str) -> tuple[float, str]:
    """Per-second rates of a delta: (factor, unit). Time spent per second is in s/s (CPUs)."""
    if unit == "ns":
        return 1e-9, "s/s"
    if unit == "s":
        return 1.0, "s/s"
    if unit in ("", "count"):
        return 1.0, "/s"
    return 1.0, f"{unit}/s"


def window_values(cells: _Cells, k: int, kinds: dict[str, str]) -> dict[str, np.ndarray]:
    """Each metric's value per window of k cells (NaN-free: empty and unknown windows left out)."""
    n = cells.sum.shape[1]
    edges = np.arange(0, n, k)     # no padding: a window may be far longer than the run

    def fold(a: np.ndarray, how: np.ufunc) -> np.ndarray:
        return how.reduceat(a, edges, axis=1) if n else a

    s = fold(cells.sum, np.add)
    c = fold(cells.count, np.add)
    u = fold(cells.nulls, np.add)
    first = fold(cells.first, np.minimum)
    last = fold(cells.last, np.maximum)
    out = {}
    for i, name in enumerate(cells.names):
        if kinds.get(name, "delta") == "delta":
            span = (last[i] - first[i]).astype(np.float64)
            ok = (c[i] > 0) & (u[i] == 0) & (span > 0)
            vals = s[i][ok] / (span[ok] / 1e9)
        else:
            ok = c[i] > 0
            vals = s[i][ok] / c[i][ok]
        out[name] = vals
    return out


@dataclass(frozen=True)
class Grid:
    """The cells a run's samples are summed into: `ncells` of `bucket` ns from `start_ns`, a
    metric window every `k` cells."""

    start_ns: int
    bucket: int
    k: int
    ncells: int


def grid_of(start_ns: int, end_ns: int, window_ns: int, finest_ns: int) -> Grid:
    bucket = max(finest_ns, -(-(end_ns - start_ns) // MAX_CELLS), 1_000_000)
    # windows shorter than a cell (compare's shared window on a run that spans years: merged
    # with an old trace) are one cell each; their number, not the span, bounds the arrays
    window_ns = max(window_ns, -(-(end_ns - start_ns) // MAX_WINDOW_CELLS))
    k = max(1, window_ns // bucket)
    bucket = window_ns // k                       # windows are whole numbers of cells
    return Grid(start_ns, bucket, k, max(1, -(-(end_ns - start_ns) // bucket)))


def rank_blocks(ranks: list[int]) -> list[list[int]]:
    """The ranks in at most RANK_BLOCKS consecutive blocks: each block's sums are added in rank
    order, then the blocks' in block order, so the all-ranks figures are the same to the last
    bit however many processes reduce the blocks."""
    size = max(1, -(-len(ranks) // RANK_BLOCKS))
    return [ranks[i:i + size] for i in range(0, len(ranks), size)]


@dataclass
class RanksPart:
    """A block of ranks' samples, reduced (ranks_part)."""

    per_window: dict[str, dict[int, np.ndarray]]
    totals: dict[str, dict[int, float]]
    cells: _Cells              # the block's ranks summed


def ranks_part(batches_of_rank: Callable[[int], Iterable[pa.RecordBatch]], ranks: list[int],
               catalog: dict[str, dict[str, Any]], grid: Grid) -> RanksPart:
    """One pass over these ranks' samples: each metric per window and each delta's total, per
    rank, and the ranks' cells summed."""
    kinds = {name: (m or {}).get("kind", "delta") for name, m in catalog.items()}
    start_ns, bucket, k, ncells = grid.start_ns, grid.bucket, grid.k, grid.ncells
    block = _Cells(ncells)
    block_index: dict[str, int] = {}
    per_window: dict[str, dict[int, np.ndarray]] = {}
    totals: dict[str, dict[int, float]] = {}
    for rank in ranks:
        cells = _Cells(ncells)
        index: dict[str, int] = {}
        for b in batches_of_rank(rank):
            if b.num_rows == 0:
                continue
            metric = b["metric"]
            if isinstance(metric, pa.ChunkedArray):
                metric = metric.combine_chunks()
            if pa.types.is_dictionary(metric.type):
                codes = metric.indices      # (fill_null copies even when there is none: ~4 s a 1024-rank run)
                codes = codes.fill_null(0) if codes.null_count else codes
                ids = cells.ids(metric.dictionary.to_pylist(), index)[codes.to_numpy(zero_copy_only=False)]
            else:
                names = pc.unique(metric).to_pylist()
                ids = cells.ids(names, index)[pc.index_in(metric, pa.array(names)).to_numpy()]
            t = b["time"].cast(pa.int64()).to_numpy(zero_copy_only=False)
            dur = b["duration_ns"]
            dur = (dur.fill_null(0) if dur.null_count else dur).to_numpy(zero_copy_only=False)
            val = b["value"]
            if val.null_count:
                known = val.is_valid().to_numpy(zero_copy_only=False)
                v = val.fill_null(0.0).to_numpy(zero_copy_only=False)
            else:
                known, v = None, val.to_numpy(zero_copy_only=False)
            # a reading stamped at a cell's end (deltas are stamped at their interval's end) is that cell's
            cell = np.clip((t - start_ns - 1) // bucket, 0, ncells - 1)
            cells.add(ids, cell, t, t - dur, v, known)
        for name, vals in window_values(cells, k, kinds).items():
            if (catalog.get(name) or {}).get("unit") == "bitmask":
                continue      # a set of flags (throttle reasons): its mean says nothing
            factor = (_rate_unit((catalog.get(name) or {}).get("unit", ""))[0]
                      if kinds.get(name, "delta") == "delta" else 1.0)
            per_window.setdefault(name, {})[rank] = vals * factor
        for i, name in enumerate(cells.names):
            if kinds.get(name, "delta") == "delta":
                totals.setdefault(name, {})[rank] = float(cells.sum[i].sum())
        cells.merge_into(block, block_index)
    return RanksPart(per_window, totals, block)


PartsOf = Callable[[list[list[int]], Grid], Iterable[RanksPart]]


def samples_pass(batches_of_rank: Callable[[int], Iterable[pa.RecordBatch]], ranks: list[int],
                 catalog: dict[str, dict[str, Any]], start_ns: int, end_ns: int, window_ns: int,
                 finest_ns: int, parts_of: PartsOf | None = None
                 ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], RunData]:
    """One pass over every rank's samples. Returns (per-window values: metric -> rank -> array,
    totals: delta metric -> rank -> sum, units, RunData for the classifier). parts_of(blocks,
    grid): the blocks' RanksParts made elsewhere (compare_runs: in worker processes); None: here."""
    grid = grid_of(start_ns, end_ns, window_ns, finest_ns)
    blocks = rank_blocks(ranks)
    # each block merged as it comes (a block holds cells of its own: not all of them at once)
    parts = (parts_of(blocks, grid) if parts_of is not None
             else (ranks_part(batches_of_rank, block, catalog, grid) for block in blocks))
    kinds = {name: (m or {}).get("kind", "delta") for name, m in catalog.items()}
    allranks = _Cells(grid.ncells)
    all_index: dict[str, int] = {}
    per_window: dict[str, dict[int, np.ndarray]] = {}
    totals: dict[str, dict[int, float]] = {}
    for part in parts:           # in rank order: each metric's ranks as they were read
        for name, by_rank in part.per_window.items():
            per_window.setdefault(name, {}).update(by_rank)
        for name, by_rank_total in part.totals.items():
            totals.setdefault(name, {}).update(by_rank_total)
        part.cells.merge_into(allranks, all_index)
    units = {}
    for name in per_window:
        unit = (catalog.get(name) or {}).get("unit", "")
        units[name] = _rate_unit(unit)[1] if kinds.get(name, "delta") == "delta" else unit
    return per_window, totals, units, _run_data(allranks, kinds, catalog, len(ranks))


def _run_data(cells: _Cells, kinds: dict[str, str], catalog: dict[str, dict[str, Any]], ranks: int) -> RunData:
    """The classifier's input from the all-ranks cells, as signals.load_samples would build it."""
    data = RunData(ranks=max(1, ranks))
    seen = cells.seen()
    lo, hi = None, None
    for i, name in enumerate(cells.names):
        idx = np.nonzero(seen[i])[0]
        if not len(idx):
            continue
        kind = kinds.get(name, "delta")
        s, c, u = cells.sum[i][idx], cells.count[i][idx], cells.nulls[i][idx]
        if kind == "delta":    # any unknown member makes the sum unknown
            vals = np.where(u > 0, np.nan, s).astype(np.float64)
        else:
            with np.errstate(invalid="ignore", divide="ignore"):
                vals = np.where(c > 0, s / np.maximum(c, 1), np.nan).astype(np.float64)
        starts, ends = cells.first[i][idx].astype(np.int64), cells.last[i][idx].astype(np.int64)
        data.series[name] = Series(kind, starts, ends, vals)
        data.sources[name] = (catalog.get(name) or {}).get("source", "")
        lo = int(starts.min()) if lo is None else min(lo, int(starts.min()))
        hi = int(ends.max()) if hi is None else max(hi, int(ends.max()))
    if lo is not None and hi is not None:
        data.start_ns, data.end_ns = lo, hi
    return data


def span_times(spans: pa.Table) -> dict[str, dict[int, np.ndarray]]:
    """Durations (s) of every step and region occurrence, per key and rank."""
    out: dict[str, dict[int, np.ndarray]] = {}
    if spans.num_rows == 0:
        return out
    keep = pc.is_in(spans["category"].cast(pa.string()), pa.array(["step", *REGION_CATEGORIES]))
    # the columns read, only: a filter of every column (attrs too) was ~0.4 GB of 3.7 M steps;
    # each array is let go once used (1024 ranks x 1 h: each is 30 MB)
    t = spans.select([c for c in ("category", "name", "device", "start", "end", "rank")
                      if c in spans.column_names]).filter(keep)
    del keep
    if t.num_rows == 0:
        return out
    step = pc.equal(t["category"].cast(pa.string()), "step").to_numpy(zero_copy_only=False)
    gpu = pc.is_valid(t["device"]).to_numpy(zero_copy_only=False)
    names = pc.fill_null(t["name"], "").combine_chunks().dictionary_encode()
    # a row's key from its name, whether it is a step and whether on a GPU: made once per
    # distinct triple, not per row
    triple = names.indices.to_numpy().astype(np.int64) * 4 + step * 2 + gpu
    uniq, inverse = np.unique(triple, return_inverse=True)
    keys: dict[str, int] = {}
    of_triple = [keys.setdefault(STEP if u & 2 else f"region:{names.dictionary[u // 4].as_py()}"
                                 + (" (GPU)" if u & 1 else ""), len(keys)) for u in uniq.tolist()]
    code = np.asarray(of_triple, np.int64)[inverse.reshape(-1)]
    key_names = list(keys)
    del triple, inverse, step, gpu, names
    dur = (t["end"].cast(pa.int64()).to_numpy() - t["start"].cast(pa.int64()).to_numpy()) / 1e9
    rank = (t["rank"].cast(pa.int64()).fill_null(0).to_numpy() if "rank" in t.column_names
            else np.zeros(t.num_rows, np.int64))
    # grouped in arrays, not Python lists: 3.7 M steps as Python floats were ~0.7 GB at the peak
    del t
    order = np.lexsort((rank, code))             # stable: each group's rows keep the table's order
    k, r, d = code[order], rank[order], dur[order]
    del code, rank, dur
    cuts = np.flatnonzero((k[1:] != k[:-1]) | (r[1:] != r[:-1])) + 1
    starts = np.concatenate([[0], cuts])
    ends = np.concatenate([cuts, [len(order)]])
    for g in np.argsort(order[starts], kind="stable"):    # groups as they first appear
        a, b = starts[g], ends[g]
        out.setdefault(key_names[k[a]], {})[int(r[a])] = d[a:b].copy()
    return out


def verdicts(data: RunData, roofline: Any = None, bucket: int | None = None
             ) -> tuple[Verdict | None, dict[str, Verdict], dict[str, dict[str, float]]]:
    """The run's verdict, the step's and each region's (the MAX_VERDICT_REGIONS longest), and the
    key signals over each of those scopes (what `history` keeps). roofline: the run's
    analysis.roofline.Roofline, which splits busy time where no PMU or GPM does (as in report)."""
    if data.end_ns <= data.start_ns:
        return None, {}, {}
    from .headline import headline
    from .roofline import scope_facts
    from .signals import host_where

    def facts_for(scope: iv.Intervals, steps: bool = False, name: str | None = None) -> dict[str, Any]:
        return {**scope_facts(roofline, scope), "host_where": host_where(data, scope, steps, exclude=name)}
    whole = [(data.start_ns, data.end_ns)]
    overall, _ = headline(data, whole, facts_for, bucket)      # the steps' when the run has steps, as report's
    scope_signals = {"run": _key_signals(signals(data, whole))}
    scoped: dict[str, Verdict] = {}
    steps = [(n, occ) for n, occ in data.regions.items() if data.region_kind.get(n) == "step"]
    regions = sorted(((n, occ) for n, occ in data.regions.items() if data.region_kind.get(n) != "step"),
                     key=lambda kv: iv.total(kv[1]), reverse=True)
    for name, occ in steps + regions[:MAX_VERDICT_REGIONS]:
        key = STEP if data.region_kind.get(name) == "step" else f"region:{name}"
        s = signals(data, occ, steps=key == STEP)
        scoped[key] = classify(s, key, facts_for(occ, key == STEP, name))
        scope_signals[key] = _key_signals(s)
    return overall, scoped, scope_signals


def contention(data: RunData, catalog: dict[str, dict[str, Any]], ranks: int,
               cpus: int | None) -> Contention:
    """The run's Contention from the classifier's input (all ranks summed). A scope's wait is its
    occurrences' share of the wait metric (buckets pro-rated by overlap) over their wall time,
    per main thread: proc.run_delay sums each process's main thread, so it is divided by the
    tree's mean process count (exact for a one-process workload, an average over a launcher and
    its workers otherwise); thread.main.runnable by the rank count."""
    out = Contention(cpus=cpus if isinstance(cpus, int) and cpus > 0 else None)
    if data.end_ns <= data.start_ns:
        return out
    span = [(data.start_ns, data.end_ns)]

    def delta_s(metric: str, scope: iv.Intervals) -> float | None:
        """The metric's sum over the scope, each bucket pro-rated by its overlap (as
        Series.delta, for every occurrence at once); None when no known bucket overlaps."""
        sr = data.series.get(metric)
        if sr is None or sr.kind != "delta" or not scope or not len(sr.values):
            return None
        ov = _covered(scope, sr.ends) - _covered(scope, sr.starts)
        known = (ov > 0) & ~np.isnan(sr.values)
        if not known.any():
            return None
        width = np.maximum(sr.ends - sr.starts, 1)
        factor = 1e-9 if (catalog.get(metric) or {}).get("unit") == "ns" else 1.0
        return float(np.sum(sr.values[known] * ov[known] / width[known])) * factor

    wall_s = (data.end_ns - data.start_ns) / 1e9
    user, system = delta_s("proc.cpu_user", span), delta_s("proc.cpu_system", span)
    if user is not None:
        out.workload_cpus = (user + (system or 0.0)) / wall_s
    util = data.series.get("system.cpu_util")
    mean_util = util.mean(data.start_ns, data.end_ns + 1) if util is not None else None
    if mean_util is not None and out.cpus:
        out.busy_cpus = mean_util / 100 * out.cpus
    source = next((m for m in WAIT_METRICS if m in data.series and data.series[m].kind == "delta"), None)
    if source is None:
        return out
    if source == "proc.run_delay":
        procs = data.series.get("proc.processes")
        per_rank = procs.mean(data.start_ns, data.end_ns + 1) if procs is not None else None
        threads = max(1.0, per_rank or 1.0) * max(1, ranks)
    else:
        # the main threads followed, over time (a launcher's ranks in one partition count each):
        # their states add up to their time, so their total over the wall is how many there were
        known = [d for k in ("running", "runnable", "blocked") if (d := delta_s(f"thread.main.{k}", span)) is not None]
        threads = max(1.0, sum(known) / wall_s) if known and wall_s > 0 else float(max(1, ranks))
    out.wait_source, out.main_threads = source, threads
    scopes = {"run": span}
    for name, occ in data.regions.items():
        scopes[STEP if data.region_kind.get(name) == "step" else f"region:{name}"] = occ
    for key, occ in scopes.items():
        wall = iv.total(occ) / 1e9
        waited = delta_s(source, occ) if wall > 0 else None
        if waited is not None:
            out.waits[key] = min(1.0, waited / wall / threads)
    return out


def _covered(scope: iv.Intervals, t: np.ndarray) -> np.ndarray:
    """For each time in t, how much of the (sorted, disjoint) interval set lies before it."""
    starts = np.fromiter((a for a, _ in scope), np.int64, len(scope))
    ends = np.fromiter((b for _, b in scope), np.int64, len(scope))
    before = np.concatenate([[0], np.cumsum(ends - starts)])     # whole intervals before each one
    i = np.searchsorted(starts, t, "right") - 1                  # the last interval starting by t
    j = np.maximum(i, 0)
    return np.where(i >= 0, before[j] + np.minimum(t, ends[j]) - starts[j], 0)


def _key_signals(sig: Any) -> dict[str, float]:
    return {k: round(sig[k].value, 6) for k in KEY_SIGNALS if k in sig}


def run_figures(path: str, meta: RunMeta | dict[str, Any], catalog: dict[str, dict[str, Any]], ranks: list[int],
                batches_of_rank: Callable[[int], Iterable[pa.RecordBatch]], spans: pa.Table,
                window_ns: int | None = None, bounds: tuple[int, int] | None = None,
                roofline: Any = None, parts_of: PartsOf | None = None) -> RunFigures:
    """Everything compare and history need from one run. `batches_of_rank(r)` streams rank r's
    samples (time, duration_ns, metric, value); `spans` is the spans table with a "rank" column;
    roofline: the run's analysis.roofline.Roofline, for the verdicts (None: no torch ops);
    parts_of: as samples_pass's."""
    ranks = ranks or [0]
    meta = RunMeta.of(meta)
    if bounds is None:
        bounds = time_bounds(meta, lambda: (b for r in ranks for b in batches_of_rank(r)))
    start_ns, end_ns = bounds
    window_ns = window_ns or default_window_ns(meta, start_ns, end_ns)
    finest = min(collector_intervals_ns(meta) or [10_000_000])
    per_window, totals, units, data = samples_pass(batches_of_rank, ranks, catalog, start_ns, end_ns,
                                                   window_ns, finest, parts_of)
    load_spans(data, spans, value("short_kernel_us"))
    data.cpus = meta.host.cpus
    overall, scoped, scope_signals = verdicts(data, roofline, finest)
    busy = contention(data, catalog, len(ranks), meta.host.cpus)
    kinds = {m: (catalog.get(m) or {}).get("kind", "delta") for m in per_window}
    return RunFigures(path=path, run_id=str(meta.id or path), command=redact_argv(meta.command),
                      ranks=list(ranks), window_s=window_ns / 1e9, start_ns=start_ns, end_ns=end_ns,
                      times=span_times(spans), metrics=per_window, units=units, kinds=kinds, totals=totals,
                      verdict=overall, scope_verdicts=scoped, scope_signals=scope_signals, meta=meta.raw,
                      contention=busy, workload=meta.workload)


def verdict_word(v: Verdict | None) -> str | None:
    """A verdict as one word (unknown with what it could not tell apart); None without one."""
    if v is None:
        return None
    if v.verdict == "unknown" and v.undecided:
        return "unknown (" + "|".join(v.undecided) + ")"
    return v.verdict


def summary_series(f: RunFigures) -> list[tuple[str, float, str, int, str | None]]:
    """The run as history keeps it: (series, value, unit, n, verdict) rows; names in
    store/history.py. Medians over every rank's values."""
    out: list[tuple[str, float, str, int, str | None]] = [
        ("wall_time", f.wall_s, "s", 1, verdict_word(f.verdict))]
    for key, by_rank in sorted(f.times.items()):
        vals = np.concatenate([v for v in by_rank.values() if len(v)] or [np.empty(0)])
        if len(vals):
            out.append((key, float(np.median(vals)), "s", len(vals), verdict_word(f.scope_verdicts.get(key))))
    for metric, by_rank in sorted(f.metrics.items()):
        vals = np.concatenate([v for v in by_rank.values() if len(v)] or [np.empty(0)])
        if len(vals):
            out.append((f"metric:{metric}", float(np.median(vals)), f.units.get(metric, ""), len(vals), None))
    for scope, sig in sorted(f.scope_signals.items()):
        suffix = "" if scope == "run" else f"@{scope}"
        for name, v in sorted(sig.items()):
            out.append((f"signal:{name}{suffix}", float(v), "", 1, None))
    return out
