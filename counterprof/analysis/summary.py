"""Totals per event, like perf stat's table: a pure function over a run's tables.

Delta metrics are summed over the run (and over threads or CPUs when recorded
separately); gauges give their peak; ratios their duration-weighted mean.

Several ranks (one run, a process tree per rank): totals are summed over the ranks, but a
process-tree gauge (proc.rss, proc.processes, proc.threads) is the highest value ONE rank
reached, and says so ("peak of one rank"): the summary's input carries no rank (Run.summary
streams every partition's rows alike; the report's totals are regrouped over ranks), so the
ranks' readings at one time cannot be told apart to be added up. perf
events also get perf stat's derived figure (CPUs utilized, GHz, insn per cycle,
% of all branches, rates per second of task-clock) and the share of time they
were actually counted (perf's "(xx.xx%)" when counters were multiplexed).
"""
from __future__ import annotations

from dataclasses import asdict, field
from typing import Any
from collections.abc import Iterable

import numpy as np
import pyarrow as pa

from ..ground.redact import redact_argv
from ..ground import units
from ..store.meta import PerfEventStatus, RunMeta
from ..store.reader import Run
from counterprof.ground.record import record


@record
class SummaryRow:
    source: str
    metric: str
    unit: str
    kind: str
    value: float | None          # None: unknown (not supported, never counted)
    status: str = "counted"      # counted | not supported | not counted | failed
    reason: str = ""
    coverage: float | None = None   # duration-weighted fraction counted, perf's (xx.xx%)
    unknown_intervals: int = 0
    note: str = ""               # perf stat's derived figure: "0.998 CPUs utilized"
    aggregate: str = "total"     # total | peak | peak of one rank | mean
    stddev: float | None = None  # over the runs of `run -r N` (analysis/repeat.py); else None


@record
class Summary:
    command: list[str] | None
    elapsed_s: float | None
    user_s: float | None
    system_s: float | None
    exit_status: int | None
    rows: list[SummaryRow] = field(default_factory=list)
    collectors: dict[str, dict[str, Any]] = field(default_factory=dict)
    path: str = ""
    ranks: int = 1               # process trees (ranks) the figures come from
    runs: int = 1                # repetitions the figures are the means of (`run -r N`)
    spread: dict[str, float | None] = field(default_factory=dict)   # their times' std deviations

    def row(self, metric: str) -> SummaryRow | None:
        return next((r for r in self.rows if r.metric == metric), None)

    def value(self, metric: str) -> float | None:
        r = self.row(metric)
        return r.value if r else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)



# what summarize() reads: a reader can project these and stream
COLUMNS = ("source", "metric", "value", "duration_ns", "quality")
_SUMS = ("value_sum", "value_count", "dur_sum", "qdur_sum", "unknown_sum", "vdur_sum", "vdurw_sum")


def _codes(column: Any) -> tuple[np.ndarray, list[Any]]:
    """(int codes, their strings) of a dictionary column, without materializing a string
    per row; plain string columns are encoded first."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode()
    return arr.indices.to_numpy(zero_copy_only=False), arr.dictionary.to_pylist()


def _numbers(column: Any, fill: float) -> tuple[np.ndarray, np.ndarray]:
    """(float64 values with nulls as fill, validity) of a numeric column."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    n = len(arr)
    values = arr.to_numpy(zero_copy_only=False).astype(np.float64, copy=True)
    if arr.null_count == 0:
        return values, np.ones(n, bool)
    bitmap = np.frombuffer(arr.buffers()[0], np.uint8)
    valid = np.unpackbits(bitmap, bitorder="little")[arr.offset:arr.offset + n].astype(bool)
    values[~valid] = fill
    return values, valid


def _aggregate(chunk: Any) -> list[dict[str, Any]]:
    """Per (source, metric) of one chunk: sums, max and counts, with numpy (pyarrow.compute and
    its group_by cost a run ~45 ms of imports before its summary; issue 14's start-up). A sum
    over no known value is None, as a SQL SUM is."""
    src_codes, src = _codes(chunk["source"])
    met_codes, met = _codes(chunk["metric"])
    value, known = _numbers(chunk["value"], 0.0)
    dur, _ = _numbers(chunk["duration_ns"], 0.0)
    quality, _ = _numbers(chunk["quality"], 1.0)
    keys, group = np.unique(src_codes.astype(np.int64) * max(1, len(met)) + met_codes, return_inverse=True)
    groups = len(keys)

    def total(weights: np.ndarray) -> np.ndarray:
        return np.bincount(group, weights=weights, minlength=groups)

    count = np.bincount(group, weights=known, minlength=groups).astype(np.int64)
    peak = np.full(groups, -np.inf)
    np.maximum.at(peak, group[known], value[known])
    sums = {"value_sum": total(value), "dur_sum": total(dur), "qdur_sum": total(quality * dur),
            "vdur_sum": total(value * dur), "vdurw_sum": total(np.where(known, dur, 0.0))}
    unknown = np.bincount(group, weights=~known, minlength=groups).astype(np.int64)
    rows = []
    for g, key in enumerate(keys.tolist()):
        some = bool(count[g])
        rows.append({"source": src[key // max(1, len(met))], "metric": met[key % max(1, len(met))],
                     "value_sum": float(sums["value_sum"][g]) if some else None,
                     "value_max": float(peak[g]) if some else None,
                     "value_count": int(count[g]), "dur_sum": float(sums["dur_sum"][g]),
                     "qdur_sum": float(sums["qdur_sum"][g]), "unknown_sum": int(unknown[g]),
                     "vdur_sum": float(sums["vdur_sum"][g]) if some else None,
                     "vdurw_sum": float(sums["vdurw_sum"][g])})
    return rows


def _merge(out: dict[tuple[str, str], dict[str, Any]], chunk: Any) -> None:
    for r in _aggregate(chunk):
        key = (r.pop("source"), r.pop("metric"))
        acc = out.get(key)
        if acc is None:
            out[key] = r
            continue
        for k in _SUMS:
            acc[k] = (acc[k] or 0) + (r[k] or 0)
        acc["value_max"] = max((m for m in (acc["value_max"], r["value_max"]) if m is not None),
                               default=None)


def _per_metric(chunks: Iterable[Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """(source, metric) -> sums, max and counts, combined chunk by chunk so a run of any
    length is summarized in bounded memory."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for chunk in chunks:
        if chunk.num_rows:
            _merge(out, chunk)
    return out


class Totals:
    """The same sums, taken from samples batches as a session emits them (a sink beside the
    journal): the end-of-run summary without reading the run back (issue 14: at -I 1 reading
    it back took as long as compacting it). Batches are folded FOLD_ROWS rows at a time, so
    memory stays bounded and a fold costs what it would cost reading the Parquet."""

    FOLD_ROWS = 65536

    def __init__(self) -> None:
        import threading
        self.stats: dict[tuple[str, str], dict[str, Any]] = {}
        self._pending: list[pa.RecordBatch] = []
        self._rows = 0
        self._lock = threading.Lock()     # collectors emit from their own threads

    def write(self, table: str, batch: pa.RecordBatch, rank: int) -> None:
        if table != "samples" or batch.num_rows == 0:
            return
        with self._lock:
            self._pending.append(batch.select(list(COLUMNS)))
            self._rows += batch.num_rows
            if self._rows >= self.FOLD_ROWS:
                self._fold()

    def _fold(self) -> None:
        if self._pending:
            _merge(self.stats, pa.Table.from_batches(self._pending).unify_dictionaries())
        self._pending, self._rows = [], 0

    def close(self) -> None:
        with self._lock:
            self._fold()

    def summary(self, catalog: dict[str, dict[str, Any]], meta: RunMeta | dict[str, Any],
                ranks: int | None = None) -> Summary:
        self.close()
        return _summary(self.stats, catalog, meta, ranks)


def metric_totals(chunks: Iterable[Any]) -> pa.Table:
    """Per (source, metric): the sums a summary is made of, as a table (the columns
    store.query.RunQuery.metric_totals gives from files)."""
    stats = _per_metric(chunks)
    rows = [{"source": src, "metric": m, **{k: v for k, v in s.items()}} for (src, m), s in stats.items()]
    return pa.Table.from_pylist(rows) if rows else pa.table({})


def summary_from_totals(totals: pa.Table, catalog: dict[str, dict[str, Any]],
                        meta: RunMeta | dict[str, Any], ranks: int | None = None) -> Summary:
    """ranks: the run's rank partitions, when the caller knows them (else read from meta)."""
    stats = {(r["source"], r["metric"]): r for r in (totals.to_pylist() if totals.num_rows else [])}
    return _summary(stats, catalog, meta, ranks)


def summarize(samples: pa.Table | Iterable[Any], catalog: dict[str, dict[str, Any]],
              meta: RunMeta | dict[str, Any], ranks: int | None = None) -> Summary:
    """samples: the samples table, or an iterable of its batches (COLUMNS suffice).
    ranks: the run's rank partitions, when the caller knows them (else read from meta)."""
    stats = _per_metric([samples] if isinstance(samples, (pa.Table, pa.RecordBatch)) else samples)
    return _summary(stats, catalog, meta, ranks)


def ranks_in(meta: RunMeta | dict[str, Any]) -> int:
    """How many ranks (process trees) wrote the run, as far as its meta.json says:
    `counterprof run --per-rank` and `counterprof merge` list them under "ranks"; a rank of a
    job whose ranks each ran counterprof.profile() into one run records its job and its
    WORLD_SIZE."""
    m = RunMeta.of(meta)
    if m.ranks:
        return len(m.ranks)
    if m.job:
        from .across_ranks import parse_world_size
        return parse_world_size(m.env.get("WORLD_SIZE")) or 1
    return 1


def _per_rank_gauge(source: str, metric: str) -> bool:
    """A gauge of one rank's process tree (each rank's host collector samples its own)."""
    return source == "host" and metric.startswith("proc.")


def _summary(stats: dict[tuple[str, str], dict[str, Any]], catalog: dict[str, dict[str, Any]],
             meta: RunMeta | dict[str, Any], ranks: int | None = None) -> Summary:
    meta = RunMeta.of(meta)
    workload = meta.workload
    elapsed = workload.elapsed_s
    if elapsed is None and meta.duration_ns:
        elapsed = meta.duration_ns / 1e9
    summary = Summary(
        command=redact_argv(meta.command) or None, elapsed_s=elapsed, user_s=workload.user_s,
        system_s=workload.system_s, exit_status=workload.exit_status,
        collectors={k: {"status": v.status, "reason": v.reason} for k, v in meta.collectors.items()},
        path=meta.path, ranks=max(1, ranks if ranks is not None else ranks_in(meta)))

    # perf events first, in the order they were asked for, unsupported ones included
    perf = meta.collector("perf")
    perf_events = perf.events if perf is not None else {}
    listed = set()
    for name, st in perf_events.items():
        listed.add(name)
        summary.rows.append(_row("perf", name, catalog.get(name, {}), stats.get(("perf", name)), st))
    for (source, metric), s in sorted(stats.items()):
        if source == "perf" and metric in listed:
            continue
        summary.rows.append(_row(source, metric, catalog.get(metric, {}), s, None))
    if summary.ranks > 1:
        for r in summary.rows:
            if r.aggregate == "peak" and _per_rank_gauge(r.source, r.metric):
                r.aggregate = "peak of one rank"
                r.note = f"not summed over the {summary.ranks} ranks"
    _add_notes(summary)
    return summary


def _row(source: str, metric: str, cat: dict[str, Any], s: dict[str, Any] | None,
         status: PerfEventStatus | None) -> SummaryRow:
    kind = cat.get("kind", "delta")
    row = SummaryRow(source, metric, cat.get("unit", ""), kind, None)
    if status is not None:
        row.status = status.status
        row.reason = status.reason
    if s is None or s["value_count"] == 0:
        if row.status == "counted":
            row.status = "not counted" if s is not None else row.status
        return row
    row.unknown_intervals = int(s["unknown_sum"])
    if kind == "delta":
        row.value = s["value_sum"]
        row.aggregate = "total"
        if s["dur_sum"]:
            row.coverage = s["qdur_sum"] / s["dur_sum"]
    elif kind == "gauge":
        row.value = s["value_max"]
        row.aggregate = "peak"
    else:
        row.value = s["vdur_sum"] / s["vdurw_sum"] if s["vdurw_sum"] else None
        row.aggregate = "mean"
    return row


def _add_notes(summary: Summary) -> None:
    v = {r.metric.split(":")[0]: r.value for r in summary.rows
         if r.source == "perf" and r.value is not None}
    task_ns = v.get("task-clock") or v.get("cpu-clock")
    elapsed = summary.elapsed_s
    cycles = v.get("cycles") or v.get("cpu-cycles")
    for r in summary.rows:
        if r.source != "perf" or r.value is None:
            continue
        base = r.metric.split(":")[0]
        if base in ("task-clock", "cpu-clock") and elapsed:
            r.note = f"{r.value / 1e9 / elapsed:.3f} CPUs utilized"
        elif base in ("cycles", "cpu-cycles") and task_ns:
            r.note = f"{r.value / task_ns:.3f} GHz"
        elif base == "instructions" and cycles:
            r.note = f"{r.value / cycles:.2f} insn per cycle"
        elif base == "branch-misses" and v.get("branches"):
            r.note = f"{units.points(100 * r.value / v['branches'], 2)} of all branches"
        elif base == "cache-misses" and v.get("cache-references"):
            r.note = f"{units.points(100 * r.value / v['cache-references'], 2)} of all cache refs"
        elif base.endswith("-load-misses") and v.get(base.replace("-load-misses", "-loads")):
            loads = v[base.replace('-load-misses', '-loads')]
            r.note = f"{units.points(100 * r.value / loads, 2)} of all {base.split('-load')[0]} accesses"
        elif base in ("stalled-cycles-frontend", "stalled-cycles-backend") and cycles:
            side = base.split("-")[-1]
            r.note = f"{units.points(100 * r.value / cycles, 2)} {side} cycles idle"
        elif task_ns and r.unit == "count":
            r.note = units.rate(r.value, task_ns / 1e9)


def run_summary(run: Run, rank: int | None = None) -> Summary:
    """A run's totals per event and its workload's figures (perf stat's table), streamed from
    its samples."""
    return summarize(run.batches("samples", list(COLUMNS), rank), run.catalog, run.meta)
