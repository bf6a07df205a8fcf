"""Everything `counterprof report` shows, as data: the overall verdict, per-window and
per-region verdicts, counter totals, GPU figures, top kernels. Pure: it takes a run's
tables (samples as an iterable of batches, so any length fits in memory) and returns a
Report; render/ turns that into a terminal page, JSON or HTML.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..ground.redact import redact_argv
from ..store.limits import release_freed
from ..store.meta import RunMeta
from . import intervals as iv
from .classify import HOST_NEXT_STEPS, NEXT_STEPS, Evidence, Verdict, classify
from .headline import headline, step_scope, too_short
from .signals import (BUCKET_NS, GPU_KERNEL_CATEGORIES, MAX_BUCKETS, RunData, beside_the_rank, bucket_table,
                      host_where, load_buckets, load_rank_spans, load_spans, signals)
from .summary import Summary, summary_from_totals
from ..ground.thresholds import value

MAX_REGIONS = 20
PLOT_POINTS = 200          # plots get their own resolution: finer than the verdict windows
MAX_MARKS = 200            # region occurrences kept for the HTML markers
# the collectors whose entities are devices (GPUs, Neuron devices): per-entity figures
DEVICE_SOURCES = ("nvml", "gpm", "neuron")
PLOT_SIGNALS = ("cpu_busy", "ipc", "gpu_util", "gpm_tensor", "gpm_dram", "gpu_idle", "neuron_util")


@dataclass
class RegionVerdict:
    name: str
    kind: str              # region | annotation | step
    count: int
    total_s: float
    verdict: Verdict
    occurrences_s: list[tuple[float, float]] = field(default_factory=list)   # from the run's start


@dataclass
class Report:
    run: dict[str, Any]
    overall: Verdict
    window_s: float
    windows: list[Verdict] = field(default_factory=list)
    plot_step_s: float = 0.0
    plot: list[dict[str, float]] = field(default_factory=list)   # signals at plot resolution
    regions: list[RegionVerdict] = field(default_factory=list)
    # with steps, the headline is the steps'; the time before the first step (start-up: imports,
    # model build, the first batches) and after the last (tear-down) are judged on their own
    phases: list[Verdict] = field(default_factory=list)
    summary: Summary | None = None
    collectors: dict[str, dict[str, Any]] = field(default_factory=dict)
    devices: list[dict[str, Any]] = field(default_factory=list)          # per GPU: metric means/peaks
    top_kernels: list[dict[str, Any]] = field(default_factory=list)
    gpu_breakdown: dict[str, Any] | None = None     # analysis.breakdown, summed over ranks
    rank_verdicts: list[Verdict] = field(default_factory=list)   # one per rank (scope "rank N")
    rank_analysis: dict[str, Any] | None = None     # analysis.across_ranks: steps, stragglers, skew
    # analysis.collectives, in short: calls matched, per rank who arrived last and the
    # others' wait for it, per operation and size (`counterprof collectives` shows every call)
    collective_calls: dict[str, Any] | None = None
    rank_notes: list[str] = field(default_factory=list)   # e.g. metrics that some ranks lack
    roofline: dict[str, Any] | None = None     # MFU, modelled share, top ops (counterprof roofline)
    next_steps: list[str] = field(default_factory=list)
    # the windows `counterprof trace` asked for: id, what, at_s (into the run), by, and per
    # process its answer (rank, pid, status, steps or ms, why)
    asked_windows: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


SpanSource = Callable[[], Iterable[tuple[int | None, pa.Table]]]


@dataclass
class ReportInputs:
    """A run's tables, already aggregated: what build_report reads. From files they come from
    store.query.RunQuery (DuckDB over the Parquet files); from in-memory tables, from
    inputs_from_samples()."""

    buckets: pa.Table           # per metric and time bucket (signals.bucket_table's columns)
    totals: pa.Table            # per (source, metric): summary sums (summary.COLUMNS' aggregates)
    devices: pa.Table           # per (entity, metric) of nvml/gpm: mean, peak
    # the spans, with a "rank" column when the run has several ranks; or a function giving each
    # rank's in turn, in rank order (RunQuery.spans_of_each_rank: read again at each call, one rank held)
    spans: pa.Table | SpanSource
    catalog: dict[str, dict[str, Any]]
    meta: RunMeta | dict[str, Any]
    ranks: int | None = None    # rank partitions (the processes doing the work); None: from meta
    rank_buckets: pa.Table | None = None   # per rank and metric, one bucket over the whole run
    hosts: dict[int, str | None] | None = None    # rank -> host that recorded it (clock skew across hosts)
    world_size: int | None = None          # the job's WORLD_SIZE, when a rank recorded it
    roofline: Any = None                   # analysis.roofline.Roofline of the run's ops, if any
    asks: list[tuple[dict[str, Any], list[dict[str, Any]]]] = field(default_factory=list)  # (ask, answers)


def regroup(groups: pa.Table) -> tuple[pa.Table, pa.Table, pa.Table]:
    """RunQuery.groups() -> (totals per source and metric, GPU figures per entity and metric,
    one bucket per rank and metric)."""
    if groups.num_rows == 0:
        return pa.table({}), pa.table({}), pa.table({})
    sums = ["value_sum", "value_count", "dur_sum", "qdur_sum", "unknown_sum", "vdur_sum", "vdurw_sum"]
    t = groups.group_by(["source", "metric"], use_threads=False).aggregate(
        [(c, "sum") for c in sums] + [("value_max", "max")])
    totals = pa.table({"source": t["source"], "metric": t["metric"],
                       **{c: t[f"{c}_sum"] for c in sums}, "value_max": t["value_max_max"]})
    src = groups["source"]
    gpu = groups.filter(pc.is_in(src, pa.array(DEVICE_SOURCES)))
    d = gpu.group_by(["entity", "metric"], use_threads=False).aggregate(
        [("value_sum", "sum"), ("value_count", "sum"), ("value_max", "max")])
    devices = pa.table({"entity": d["entity"], "metric": d["metric"], "vsum": d["value_sum_sum"],
                        "n": d["value_count_sum"], "peak": d["value_max_max"]})
    r = groups.group_by(["rank", "metric"], use_threads=False).aggregate(
        [("source", "min"), ("start_ns", "min"), ("end_ns", "max"), ("value_sum", "sum"),
         ("value_count", "sum"), ("unknown_sum", "sum")])
    rank_buckets = pa.table({"rank": r["rank"], "metric": r["metric"], "source": r["source_min"],
                             "b": pa.array([0] * r.num_rows, pa.int64()), "start_ns": r["start_ns_min"],
                             "end_ns": r["end_ns_max"], "vsum": r["value_sum_sum"],
                             "n": r["value_count_sum"], "nulls": r["unknown_sum_sum"]})
    return totals, devices, rank_buckets


def extent_of(groups: pa.Table) -> tuple[tuple[int, int] | None, int]:
    """RunQuery.groups() -> (the samples' (first, last) time, no narrower than theirs, or
    None; how many metrics): what RunQuery.buckets slices its reads by."""
    if groups.num_rows == 0 or "start_ns" not in groups.column_names:
        return None, 1
    lo, hi = pc.min(groups["start_ns"]).as_py(), pc.max(groups["end_ns"]).as_py()
    extent = (int(lo), int(hi)) if lo is not None and hi is not None else None
    return extent, len(pc.unique(groups["metric"]))


def inputs_from_samples(samples: pa.Table, spans: pa.Table, catalog: dict[str, dict[str, Any]],
                        meta: RunMeta | dict[str, Any], ranks: int | None = None) -> ReportInputs:
    """ReportInputs from an in-memory samples table (small runs, tests)."""
    from .summary import metric_totals
    return ReportInputs(bucket_table([samples], bucket_ns(meta)), metric_totals([samples]),
                        device_stats([samples]), spans, catalog, meta, ranks)


MAX_WINDOWS = 10_000       # verdict windows: each is a classify(); a run's span must not size them


def window_starts(data: RunData, step: int) -> tuple[int, list[int]]:
    """(window length, the start of each window to judge). Every window of the run while they
    are few; else only those holding samples or span edges (a run merged with a trace recorded
    years earlier spans years, nearly all empty), and longer windows if those are still too many."""
    lo, hi = data.start_ns, data.end_ns
    if -(-(hi - lo) // step) <= MAX_WINDOWS:
        return step, list(range(lo, hi, step))
    from itertools import chain
    sets = [data.gpu_busy, data.neuron_busy, data.cpu_collectives, data.windows, *data.regions.values(),
            *data.input_waits.values(), *data.main_ops.values(), *data.rank_steps.values()]
    # the windows each set's times fall in, joined a set at a time (every rank's steps at once
    # were 250 MB at 256 ranks x 8 h); a window of twice the length holds index // 2
    occupied = np.zeros(0, np.int64)
    for t in chain((x for s in data.series.values() for x in (s.ends, s.starts)),
                   (iv.edges(ivs) for ivs in sets if ivs)):
        occupied = np.union1d(occupied, (np.clip(t, lo, hi - 1) - lo) // step)
    while len(occupied) > MAX_WINDOWS:
        occupied, step = np.unique(occupied // 2), step * 2
    return step, [int(lo + i * step) for i in occupied]


def workload_span(meta: RunMeta | dict[str, Any], data: RunData) -> tuple[int, int]:
    """The whole run's scope: the launched workload's life (exec to exit, from meta.json) when
    known, so a 1 ms workload is judged over its 1 ms, not the profiler's start-up and stop
    around it; else the data's extent."""
    w = RunMeta.of(meta).workload
    a, b = w.started_ns, w.ended_ns
    if isinstance(a, int) and isinstance(b, int) and data.start_ns <= a < b:
        return a, min(b, data.end_ns) if b > data.start_ns else b
    return data.start_ns, data.end_ns


def build_report(inputs: ReportInputs, window_s: float = 1.0, keep_buckets: bool = True) -> Report:
    """The report of a run's inputs. keep_buckets=False lets inputs.buckets go (an empty table
    left in its place) once the series are made of it: only the HTML page's timeline reads it
    again, and it is ~70 bytes a metric's bucket (200 MB at 256 ranks x 4 h)."""
    meta, catalog = RunMeta.of(inputs.meta), inputs.catalog
    data = RunData(ranks=max(1, inputs.ranks or 1), cpus=meta.host.cpus)
    load_buckets(data, inputs.buckets, catalog)
    if not keep_buckets:
        inputs.buckets = inputs.buckets.schema.empty_table()
    scan = SpanScan(rows_per_rank=max(MIN_ROWS_PER_RANK, ACROSS_ROWS // max(1, inputs.ranks or 1)))
    load_rank_spans(data, scan.each(inputs.spans), value("short_kernel_us"))
    summary = summary_from_totals(inputs.totals, catalog, meta, ranks=inputs.ranks)
    bucket = bucket_ns(meta)
    asked = [asked_window(a, answers, meta.start_ns) for a, answers in inputs.asks]

    run_info = {"id": meta.id, "command": redact_argv(meta.command) if meta.command else None,
                "status": meta.status, "start_time": meta.start_time,
                "host": meta.raw.get("host"), "rank": meta.rank,       # host: shown as recorded
                "warnings": []}
    collectors = {k: {"status": c.status, "reason": c.reason} for k, c in meta.collectors.items()}
    # what the recording said of its data (a trace cut off, events not supported); a collector
    # that was unavailable is said in the collectors' section, not again here
    unavailable = tuple(f"{k} collector unavailable" for k, c in collectors.items() if c["status"] == "unavailable")
    run_info["warnings"] = [str(w) for w in meta.raw.get("warnings") or []
                            if w and not str(w).startswith(unavailable)]
    if data.end_ns <= data.start_ns:
        overall = Verdict("run", "unknown", "none", missing=["samples or spans: the run holds none"])
        return Report(run_info, overall, window_s, summary=summary, collectors=collectors)

    base_facts = verdict_facts(meta)

    def facts_for(scope: iv.Intervals, steps: bool = False, name: str | None = None) -> dict[str, Any]:
        """The facts, with the roofline's split of busy time over the scope and where the main
        thread's time outside ops went."""
        from .roofline import scope_facts
        return {**base_facts, **scope_facts(inputs.roofline, scope),
                "host_where": host_where(data, scope, steps, exclude=name)}

    whole = [workload_span(meta, data)]
    overall, phases = headline(data, whole, facts_for, bucket)
    report = Report(run_info, overall, window_s, summary=summary, collectors=collectors, phases=phases)

    def point(t: int, sig: Any) -> dict[str, float]:
        return {"t_s": (t - data.start_ns) / 1e9, **{k: round(sig[k].value, 6) for k in PLOT_SIGNALS if k in sig}}

    step, starts = window_starts(data, int(window_s * 1e9))
    if step != int(window_s * 1e9):
        report.window_s = window_s = step / 1e9
    window_points = []
    for t in starts:
        hi = min(t + step, data.end_ns)
        sig = signals(data, [(t, hi)])
        w = classify(sig, f"{(t - data.start_ns) / 1e9:.1f}s", facts_for([(t, hi)]))
        w = too_short(w, sig, hi - t, bucket)
        w.start_ns, w.end_ns = t, hi
        report.windows.append(w)
        window_points.append(point(t, sig))

    if len(report.windows) >= PLOT_POINTS:   # the windows are fine enough to plot
        report.plot_step_s, report.plot = window_s, window_points
    else:
        pstep = max(BUCKET_NS, (data.end_ns - data.start_ns) // PLOT_POINTS)
        report.plot_step_s = pstep / 1e9
        for t in range(data.start_ns, data.end_ns, pstep):
            report.plot.append(point(t, signals(data, [(t, min(t + pstep, data.end_ns))])))

    ranked = sorted(data.regions.items(), key=lambda kv: iv.total(kv[1]), reverse=True)
    for name, occ in ranked[:MAX_REGIONS]:
        is_step = data.region_kind.get(name) == "step"
        sig = signals(data, occ, steps=is_step)
        v = classify(sig, name, facts_for(occ, is_step, name))
        # back-to-back occurrences (steps) merge: their neighbours are their own kind
        v = too_short(v, sig, iv.total(occ) / max(1, len(occ)), bucket)
        sp = iv.span(occ)
        v.start_ns, v.end_ns = sp if sp else (None, None)
        marks = [((a - data.start_ns) / 1e9, (b - data.start_ns) / 1e9) for a, b in occ[:MAX_MARKS]]
        report.regions.append(RegionVerdict(name, data.region_kind.get(name, "region"),
                                            data.region_count.get(name, 0), iv.total(occ) / 1e9, v, marks))

    data.let_go_of_spans()      # (what follows reads its samples only, and holds spans of its own)
    release_freed()
    _per_rank(report, inputs, data, scan)
    gpu = _gpu_breakdown(scan)
    if gpu is not None and gpu.total is not None:
        total = gpu.total
        report.gpu_breakdown = total.to_json()
        report.top_kernels = [k.to_json() for k in total.top]
        idle = sum(x.idle_ns for x in total.idle)
        if idle and overall.device == "gpu" and overall.shares.get("host", 0) > value("host_wait_named"):
            wait = sum(x.host_wait_ns for x in total.idle)
            overall.evidence.insert(1, Evidence(
                "host_wait", wait / idle, None, "spans",
                f"{100 * wait / idle:.0f}% of that idle time the next kernel was launched after the "
                "previous one finished (host wait)"))
    report.devices = device_figures(inputs.devices, catalog)
    if inputs.roofline is not None:
        rl = inputs.roofline
        report.roofline = {"device": rl.device, "basis": rl.basis, "mfu": rl.mfu,
                           "modelled_share": rl.modelled_share, "missing": rl.missing, "notes": rl.notes,
                           "ceilings": (rl.ceilings or {}).get("source"),
                           "top_ops": [o.to_json() for o in sorted(rl.ops, key=lambda o: -o.time_ns)[:5]]}
    shares = overall.shares
    for cls, text in NEXT_STEPS.items():
        share = shares.get(cls, 0.0) + (shares.get("compute|memory", 0.0) if cls in ("compute", "memory") else 0.0)
        if share >= value("next_step_share") or overall.verdict == cls:
            if cls == "host" and overall.host_parts:
                lead = max(overall.host_parts.items(), key=lambda kv: kv[1])[0]
                text = HOST_NEXT_STEPS.get(lead, text)
            report.next_steps.append(text)
    report.asked_windows = asked
    return report


def asked_window(ask: dict[str, Any], answers: list[dict[str, Any]], start_ns: int | None) -> dict[str, Any]:
    """One `counterprof trace` ask as the report says it: what, when (s into the run), and
    each process's answer."""
    what = f"{ask.get('steps')} steps" + (f" from step {ask['start_step']}" if ask.get("start_step") is not None
                                          else "") if ask.get("steps") else f"{ask.get('ms')} ms"
    at = (ask["asked_ns"] - start_ns) / 1e9 if isinstance(ask.get("asked_ns"), int) and start_ns else None
    return {"id": ask.get("id"), "what": what, "at_s": at, "by": ask.get("by"),
            "answers": [{k: a.get(k) for k in ("rank", "pid", "host", "status", "steps", "ms", "file", "why")}
                        for a in sorted(answers, key=lambda a: (a.get("rank") if isinstance(a.get("rank"), int)
                                                                else 1 << 30, a.get("pid") or 0))]}


def asked_words(a: dict[str, Any]) -> str:
    """An asked window in one line (the text and HTML reports)."""
    def one(x: dict[str, Any]) -> str:
        who = f"rank {x.get('rank')}"
        if x.get("status") == "traced":
            return who + (f" steps {x['steps'][0]}-{x['steps'][1]}" if x.get("steps") else f" {x.get('ms')} ms")
        return f"{who} not reached ({x.get('why')})"
    at = f" at {a['at_s']:.1f} s" if a.get("at_s") is not None else ""
    return f"asked{at} for {a['what']} (ask {a['id']}): " + ("; ".join(one(x) for x in a["answers"])
                                                               or "no process answered")


def verdict_facts(meta: RunMeta | dict[str, Any]) -> dict[str, Any]:
    """What the verdict's evidence may name, from the threads collector's entry in meta.json:
    the main threads it followed and the other processes that used the CPUs."""
    entry = RunMeta.of(meta).collector("threads")
    if entry is None:
        return {}
    main, others = entry.detail("main"), entry.detail("contenders")
    return {"main_threads": main if isinstance(main, list) else [],
            "contenders": others if isinstance(others, list) else [],
            "cpus": RunMeta.of(meta).host.cpus}


def bucket_ns(meta: RunMeta | dict[str, Any]) -> int:
    """Resolution for the run's samples: its finest sampling interval (regions shorter than
    that cannot be resolved anyway), coarser only when the run is very long."""
    m = RunMeta.of(meta)
    intervals = [c.interval_ms for c in m.collectors.values() if c.interval_ms]
    finest = int(min(intervals) * 1e6) if intervals else BUCKET_NS
    length = max(0, (m.end_ns or 0) - (m.start_ns or 0))
    return max(finest, length // MAX_BUCKETS, 1_000_000)


def rank_tables(table: pa.Table) -> Iterator[tuple[int | None, pa.Table]]:
    """(rank, its rows in their order) for each rank of table, in rank order (nulls last). A
    table already in rank order (RunQuery.spans(by_rank=True)) is sliced, not copied; a filter
    per rank would read the whole table each time: quadratic in ranks."""
    if table.num_rows == 0 or "rank" not in table.column_names:
        return
    ranks = table["rank"]
    values = pc.fill_null(ranks, np.iinfo(np.int64).max).to_numpy()
    if np.any(values[1:] < values[:-1]):
        order = pc.sort_indices(ranks)     # stable
        table, values = table.take(order), values[order.to_numpy()]
    valid = pc.is_valid(table["rank"]).to_numpy(zero_copy_only=False)
    cuts = np.flatnonzero(values[1:] != values[:-1]) + 1
    for a, b in zip(np.r_[0, cuts].tolist(), np.r_[cuts, len(values)].tolist()):
        yield (int(values[a]) if valid[a] else None), table.slice(a, b - a)


def each_rank(spans: pa.Table | SpanSource) -> Iterator[tuple[int | None, pa.Table]]:
    """The spans a rank at a time, in rank order (null last): a source's, read again, or a
    table's slices (one without a rank column: one part, rank None)."""
    if callable(spans):
        yield from spans()
    elif spans.num_rows:
        yield from (rank_tables(spans) if "rank" in spans.column_names else [(None, spans)])


ACROSS_RANKS = ["rank", "start", "end", "name", "category"]       # what analyze_ranks reads
# the steps, collectives and trace windows the figures across ranks hold at once, shared out
# among the ranks (~21 bytes each, and about twice as much again while analyze_ranks works): the
# whole of 1,024 ranks x 1 h or 256 x 4 h of a step a second with a collective in each; of a
# longer run, the latest part (SpanScan.rows_per_rank, .cut), said in the figures' notes
ACROSS_ROWS = 8_000_000
MIN_ROWS_PER_RANK = 1_000
_ACROSS_CATEGORIES = pa.array(["step", "collective", "window"])


@dataclass
class SpanScan:
    """What the report keeps of its spans as they pass a rank at a time (build_report's first
    read): the rows the figures across ranks and the GPU breakdown read, in the columns they
    read; the rest is let go with its rank (load_rank_spans keeps its interval sets)."""

    ranked: bool = False                 # a rank column (several ranks)
    ranks: set[int] = field(default_factory=set)      # ranks >= 0 with spans
    collectives: bool = False            # a span with a collective named
    across: list[pa.Table] = field(default_factory=list)    # steps, collectives, windows (ACROSS_RANKS)
    gpu: dict[Any, pa.Table] = field(default_factory=dict)  # per rank with GPU work: breakdown's rows
    _codes: dict[str, int] = field(default_factory=dict)    # the across rows' names -> their codes
    # the most steps, collectives and windows kept of a rank for the figures across ranks (its
    # latest: ACROSS_ROWS over the ranks); 0: all of them
    rows_per_rank: int = 0
    cut: dict[int, int] = field(default_factory=dict)       # rank -> the start of its first kept row
    # where cut: the names of the steps every rank kept (across_ranks), from the first of
    # which on each rank the collective calls are matched (latest_calls); None: every call
    common_steps: list[str] | None = None

    def cut_note(self) -> str | None:
        """What the figures across ranks leave out, if anything."""
        if not self.cut:
            return None
        import datetime
        when = datetime.datetime.fromtimestamp(max(self.cut.values()) / 1e9, datetime.timezone.utc)
        return (f"figures across ranks are of the latest part of the run only, from "
                f"{when.isoformat(timespec='seconds')} on: {len(self.cut)} of {len(self.ranks)} ranks had "
                f"more than {self.rows_per_rank:,} steps, collectives and trace windows, and the earlier "
                "ones are let go to bound the report's memory" + (
                    "" if self.common_steps is None else
                    ": the ranks table and the collective calls are of the steps every rank kept") +
                " (the ranks' verdicts" + (", the collective calls" if self.common_steps is None else "") +
                " and `counterprof collectives` read them all)")

    def each(self, spans: pa.Table | SpanSource) -> Iterator[tuple[int | None, pa.Table]]:
        from .breakdown import COLUMNS as GPU_COLUMNS
        for r, t in each_rank(spans):
            cat = t["category"].cast(pa.string())
            if "rank" in t.column_names:
                self.ranked = True
                if r is not None:
                    if r >= 0:
                        self.ranks.add(r)
                    keep = pc.is_in(cat, _ACROSS_CATEGORIES)
                    if r >= 0 and self.rows_per_rank and (pc.sum(keep).as_py() or 0) > self.rows_per_rank:
                        keep = self._latest(t, cat, keep, r)
                    rows = t.select(["rank", "start", "end"]).filter(keep)
                    # (names and categories as codes, the names' one list for every rank: an hour
                    # of 1024 ranks' steps is millions of rows, their names each rank's own)
                    self.across.append(pa.table({
                        "rank": rows["rank"].cast(pa.int32()), "start": rows["start"], "end": rows["end"],
                        "name": self._name_codes(t["name"].filter(keep)),
                        "category": pc.index_in(cat.filter(keep), _ACROSS_CATEGORIES).cast(pa.int8())}))
                    del rows, keep
            if "collective" in t.column_names and t["collective"].null_count < t.num_rows:
                self.collectives = True
            if pc.any(pc.is_in(cat, pa.array(GPU_KERNEL_CATEGORIES))).as_py():
                keep = pc.is_in(cat, pa.array([*GPU_KERNEL_CATEGORIES, "runtime", "step", "window"]))
                self.gpu[r if "rank" in t.column_names else 0] = \
                    t.select([c for c in GPU_COLUMNS if c in t.column_names]).filter(keep)
            del cat
            yield r, t

    def _latest(self, t: pa.Table, cat: pa.ChunkedArray, keep: pa.ChunkedArray, rank: int) -> pa.ChunkedArray:
        """keep narrowed to the rank's latest rows_per_rank steps, collectives and windows,
        from a step's start on (a trace window that ends there or later kept whole)."""
        start = t["start"].cast(pa.int64())
        starts = pc.drop_null(start.filter(keep)).to_numpy()
        if len(starts) <= self.rows_per_rank:
            return keep
        cut = int(np.sort(starts)[-self.rows_per_rank])
        steps = pc.drop_null(start.filter(pc.equal(cat, "step"))).to_numpy()
        later = steps[steps >= cut]
        cut = int(later.min()) if len(later) else cut      # whole steps: from the first one after
        self.cut[rank] = cut
        after = pc.if_else(pc.equal(cat, "window"), pc.greater_equal(t["end"].cast(pa.int64()), cut),
                           pc.greater_equal(start, cut))
        return pc.and_(keep, pc.fill_null(after, False))

    def _common_steps(self, t: pa.Table) -> list[str] | None:
        """The names of the steps (t: the kept rows, names and categories as codes) that every
        rank (>= 0, with spans) holds: a step some rank started before the cut is no one's.
        None where some rank kept no named step, or no name is on every rank: its calls are
        matched by their order, and a cut in time could shift that order by a call, so every
        call is kept."""
        steps = t.filter(pc.and_(pc.equal(t["category"], _ACROSS_CATEGORIES.index("step").as_py()),
                                 pc.greater_equal(t["rank"], 0)))
        named = steps.filter(pc.is_valid(steps["name"]))
        ranks = pc.unique(named["rank"]).to_pylist()
        if not named.num_rows or set(ranks) != self.ranks:
            return None
        pairs = np.unique(np.stack([named["name"].to_numpy(), named["rank"].to_numpy()], axis=1), axis=0)
        held = np.flatnonzero(np.bincount(pairs[:, 0], minlength=len(self._codes)) == len(ranks))
        names = list(self._codes)
        return [names[i] for i in held.tolist()] or None

    def latest_calls(self, t: pa.Table) -> pa.Table:
        """A rank's rows for the collective calls: where the ranks table was cut, those from
        the rank's first step after the cut that every rank kept (common_steps) on (a trace
        window that ends there or later kept); else all of them."""
        if self.common_steps is None:
            return t
        cat = t["category"].cast(pa.string())
        start = t["start"].cast(pa.int64())
        shared = pc.and_(pc.and_(pc.equal(cat, "step"), pc.greater_equal(start, max(self.cut.values()))),
                         pc.is_in(t["name"].cast(pa.string()), pa.array(self.common_steps, pa.string())))
        first = pc.min(start.filter(pc.fill_null(shared, False))).as_py()
        if first is None:
            return t.slice(0, 0)
        after = pc.if_else(pc.equal(cat, "window"), pc.greater_equal(t["end"].cast(pa.int64()), first),
                           pc.greater_equal(start, first))
        return t.filter(pc.fill_null(after, False))

    def _name_codes(self, names: pa.ChunkedArray) -> pa.Array:
        """names as int32 codes into the run's list of them (null stays null)."""
        if pa.types.is_dictionary(names.type):
            names = names.cast(pa.string())
        enc = pc.dictionary_encode(names.combine_chunks())       # (nulls stay out of the dictionary)
        codes = np.array([self._codes.setdefault(n, len(self._codes)) for n in enc.dictionary.to_pylist()]
                         or [0], np.int32)
        at = enc.indices
        out = codes[at.fill_null(0).to_numpy(zero_copy_only=False)]
        return pa.array(out, pa.int32(), mask=None if at.null_count == 0 else
                        pc.is_null(at).to_numpy(zero_copy_only=False))

    def across_ranks(self) -> pa.Table:
        """The kept rows of every rank as one table, handed over: asked once."""
        if not self.across:
            return pa.table({c: pa.array([], pa.int64()) for c in ACROSS_RANKS})
        whole = pa.concat_tables(self.across, promote_options="default")
        self.across.clear()     # (the rows are whole's now: the cut below copies them once, not beside)
        if self.cut:        # every rank from the latest cut on: the figures cover one period
            cut = max(self.cut.values())
            start, end = whole["start"].cast(pa.int64()), whole["end"].cast(pa.int64())
            window = pc.equal(whole["category"], _ACROSS_CATEGORIES.index("window").as_py())
            whole = whole.filter(pc.fill_null(pc.if_else(window, pc.greater_equal(end, cut),
                                                         pc.greater_equal(start, cut)), False))
            self.common_steps = self._common_steps(whole)
        names = pa.array(list(self._codes), pa.string())
        return whole.set_column(
            3, "name", pa.DictionaryArray.from_arrays(whole["name"].combine_chunks(), names)).set_column(
            4, "category", pa.DictionaryArray.from_arrays(whole["category"].combine_chunks(), _ACROSS_CATEGORIES))


def _per_rank(report: Report, inputs: ReportInputs, whole: RunData, scan: SpanScan) -> None:
    """A verdict per rank, and the cross-rank figures (steps, stragglers, skew)."""
    from .across_ranks import analyze_ranks
    if inputs.rank_buckets is not None and inputs.rank_buckets.num_rows and \
            "rank" in inputs.rank_buckets.column_names:
        rb = inputs.rank_buckets
        report.rank_notes.extend(metric_set_notes(rb))
        buckets_of = {r: b for r, b in rank_tables(rb) if r is not None and r >= 0}
        verdicts: dict[int, Any] = {}

        def judge(r: int, spans: pa.Table | None) -> None:
            data = RunData()
            load_buckets(data, buckets_of[r], inputs.catalog)
            if spans is not None:
                load_spans(data, spans, value("short_kernel_us"))
            lo, hi = whole.start_ns, whole.end_ns
            # judged over its steps as the headline is (start-up apart), else its whole run
            steps = step_scope(data, [(lo, hi)])
            sig = signals(data, steps or [(lo, hi)], steps=bool(steps))
            sig.update(beside_the_rank(whole, steps or [(lo, hi)], sig))
            v = classify(sig, f"rank {r}")
            v.start_ns, v.end_ns = lo, hi
            verdicts[r] = v

        # each rank's spans read again, its buckets looked up (in whatever order the ranks come)
        for r, t in each_rank(inputs.spans):
            if r in buckets_of and r not in verdicts:
                judge(r, t)
            del t
        for r in buckets_of:
            if r not in verdicts:          # no spans of its own
                judge(r, None)
        report.rank_verdicts.extend(verdicts[r] for r in buckets_of)
        release_freed()     # (each rank's sets, freed: the ranks table is not made on top of them)
    analysis = analyze_ranks(scan.across_ranks(), inputs.hosts, world_size=inputs.world_size)
    release_freed()         # (glibc keeps the table's freed heap; the calls' pass would sit on it)
    if analysis is not None and (note := scan.cut_note()):
        analysis.notes.append(note)
    _collective_calls(report, inputs.spans, scan, inputs.hosts)
    if analysis is not None:
        report.rank_analysis = analysis.to_json()
        if analysis.straggler is not None and analysis.straggler_lag_s:
            report.overall.secondary.append(Evidence(
                "straggler", analysis.straggler_lag_s, None, "spans",
                f"rank {analysis.straggler} is the straggler in "
                f"{next(f.slowest_in for f in analysis.ranks if f.rank == analysis.straggler)} of "
                f"{analysis.steps} steps: the others wait {analysis.straggler_lag_s * 1e3:.1f} ms per step "
                "for it in collectives (mean over those steps, as the ranks table's 'waited')"))


def _collective_calls(report: Report, spans: pa.Table | SpanSource, scan: SpanScan,
                      hosts: dict[int, str | None] | None) -> None:
    """The calls matched across ranks, in short, and who the others waited for, said once."""
    from .collectives import COLUMNS, analyze_calls
    if not scan.ranked or not scan.collectives or len(scan.ranks) < 2:
        return
    calls = analyze_calls(((r, scan.latest_calls(t.select([c for c in COLUMNS if c in t.column_names])))
                           for r, t in each_rank(spans) if r is not None and r >= 0), hosts)
    if not calls.calls:
        return
    j = calls.to_json(top=1, calls=False)      # the summary: no JSON object per call
    by_rank = j["by_rank"]
    report.collective_calls = {"calls": len(calls.calls), "unmatched": j["unmatched"], "by_rank": by_rank,
                               "summary": [{k: v for k, v in x.items() if k != "worst"} for x in j["summary"]],
                               "notes": j["notes"] + ([note] if scan.common_steps is not None
                                                      and (note := scan.cut_note()) else [])}
    late = max(by_rank, key=lambda b: b["others_waited_s"])
    if late["others_waited_s"] > 0 and late["last"] > 0:
        skews = [c.skew_ns for c in calls.calls if c.last == late["rank"] and c.skew_ns is not None]
        part = "" if scan.common_steps is None else " in the run's latest part (see the notes)"
        report.overall.secondary.append(Evidence(
            "late_rank", round(late["others_waited_s"], 6), None, "spans",
            f"rank {late['rank']} arrived last at {late['last']} of {len(calls.calls)} collective calls{part}; "
            f"the others waited {late['others_waited_s'] * 1e3:.1f} ms in all for it there (median "
            f"skew {float(np.median(skews)) / 1e6:.2f} ms): `counterprof collectives` names each call"))


def metric_set_notes(rank_buckets: pa.Table, most: int = 8) -> list[str]:
    """Ranks with different metric sets, said once per group of ranks lacking the same metrics
    (a collector that failed or was not attached on some ranks; GPU metrics live in the rank
    that owns the GPU). Their per-rank verdicts rest on fewer signals."""
    by_rank: dict[int, set[str]] = {}
    for r, m in zip(rank_buckets["rank"].to_pylist(), rank_buckets["metric"].cast(pa.string()).to_pylist()):
        if r is not None and r >= 0:
            by_rank.setdefault(r, set()).add(m)
    if len(by_rank) < 2:
        return []
    everything = set().union(*by_rank.values())
    lacking: dict[tuple[str, ...], list[int]] = {}
    for r, have in sorted(by_rank.items()):
        gone = tuple(sorted(everything - have))
        if gone:
            lacking.setdefault(gone, []).append(r)
    notes = []
    for gone, ranks in sorted(lacking.items(), key=lambda kv: kv[1]):
        names = ", ".join(gone[:most]) + (f" and {len(gone) - most} more" if len(gone) > most else "")
        who = (f"rank {ranks[0]} lacks" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))} lack")
        whose = "its verdict rests" if len(ranks) == 1 else "their verdicts rest"
        notes.append(f"{who} {names}, which other ranks have: {whose} on fewer signals "
                     "(a collector that failed or was not attached there: see meta.json)")
    return notes


def _gpu_breakdown(scan: SpanScan) -> Any:
    """HTA-style breakdowns of the run's GPU spans, per rank and summed (None without GPU work)."""
    from .breakdown import analyze
    if not scan.gpu:
        return None
    gpu, scan.gpu = scan.gpu, {}
    return analyze(gpu)


def device_stats(chunks: Iterable[Any]) -> pa.Table:
    """Per (entity, metric) of the device sources: sum, count and peak (in-memory samples)."""
    parts = []
    for chunk in chunks:
        src = chunk["source"].cast(pa.string())
        mask = pc.is_in(src, pa.array(DEVICE_SOURCES))
        if chunk.num_rows == 0 or not pc.any(mask).as_py():
            continue
        t = pa.table({"entity": chunk["entity"].cast(pa.string()), "metric": chunk["metric"].cast(pa.string()),
                      "value": chunk["value"]}).filter(mask)
        parts.append(t)
    if not parts:
        return pa.table({})
    g = pa.concat_tables(parts).group_by(["entity", "metric"], use_threads=False).aggregate(
        [("value", "sum"), ("value", "count"), ("value", "max")])
    return pa.table({"entity": g["entity"], "metric": g["metric"], "vsum": g["value_sum"],
                     "n": g["value_count"], "peak": g["value_max"]})


def device_figures(stats: pa.Table, catalog: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per device entity (gpu:N, neuron:D/core:C ...): mean and peak of each of its metrics."""
    devices: dict[str, dict[str, Any]] = {}
    rows = stats.to_pylist() if stats.num_rows else []
    for r in sorted(rows, key=lambda r: (r["entity"], r["metric"])):
        d = devices.setdefault(r["entity"], {"entity": r["entity"], "metrics": {}})
        d["metrics"][r["metric"]] = {"mean": r["vsum"] / r["n"] if r["n"] else None, "peak": r["peak"],
                                     "unit": (catalog.get(r["metric"]) or {}).get("unit", "")}
    return list(devices.values())
