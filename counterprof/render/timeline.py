"""The report page's timeline: every collector's series over the run, from the per-metric time
buckets the report is built from (analysis.signals.bucket_table's columns, or
store.query.RunQuery.buckets), one panel per collector and unit. Counters (kind "delta") are
drawn as rates (CPU time per second as CPUs, bytes as bytes/s), gauges and ratios as their
means. Formats what the buckets hold; judges nothing."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

MAX_POINTS = 1500          # per series: a long run's buckets are averaged down to this many


@dataclass
class Series:
    metric: str
    values: list[float | None]


@dataclass
class Panel:
    source: str
    unit: str                       # what the y axis shows: "CPUs", "bytes/s", "/s", a gauge's unit
    x: list[float]                  # seconds from the run's start, the buckets' middles
    series: list[Series] = field(default_factory=list)
    flat_zero: list[str] = field(default_factory=list)     # series that are zero throughout


def shown_unit(unit: str, kind: str) -> tuple[str, float]:
    """(the unit a series is drawn in, the factor from the catalog's unit per second)."""
    if kind != "delta":
        return unit or "count", 1.0
    if unit == "s":
        return "CPUs", 1.0
    if unit == "ns":
        return "CPUs", 1e-9
    if unit == "bytes":
        return "bytes/s", 1.0
    if unit in ("", "count"):
        return "/s", 1.0
    return f"{unit}/s", 1.0


def collector_panels(buckets: pa.Table, catalog: Mapping[str, Mapping[str, Any]], start_ns: int,
                     bucket_ns: int) -> list[Panel]:
    """Panels by (collector, shown unit), in the collectors' order of first appearance, each
    series on the panel's x (gaps as None)."""
    if buckets.num_rows == 0 or "metric" not in buckets.column_names or bucket_ns <= 0:
        return []
    b_all = np.asarray(buckets["b"].to_numpy(zero_copy_only=False), dtype=np.int64)
    b0, b1 = int(b_all.min()), int(b_all.max())
    length = b1 - b0 + 1
    k = max(1, -(-length // MAX_POINTS))         # buckets per point
    npts = -(-length // k)
    width_s = k * bucket_ns / 1e9
    x = [round((b0 * bucket_ns - start_ns) / 1e9 + (i + 0.5) * width_s, 6) for i in range(npts)]
    metrics = buckets["metric"].to_pylist()
    sources = buckets["source"].to_pylist()
    vsum = np.nan_to_num(np.asarray(buckets["vsum"].to_numpy(zero_copy_only=False), dtype=np.float64))
    count = np.asarray(buckets["n"].to_numpy(zero_copy_only=False), dtype=np.float64)
    rows: dict[str, list[int]] = {}
    for i, m in enumerate(metrics):
        rows.setdefault(m, []).append(i)
    panels: dict[tuple[str, str], Panel] = {}
    for metric, idx in rows.items():
        entry = catalog.get(metric) or {}
        unit, factor = shown_unit(str(entry.get("unit") or ""), str(entry.get("kind") or "gauge"))
        source = str(entry.get("source") or sources[idx[0]] or "?")
        slot = (b_all[idx] - b0) // k
        s = np.zeros(npts)
        n = np.zeros(npts)
        np.add.at(s, slot, vsum[idx])
        np.add.at(n, slot, count[idx])
        if str(entry.get("kind") or "gauge") == "delta":
            covered = np.zeros(npts)
            np.add.at(covered, slot, 1.0)          # buckets with a reading: a rate over those
            with np.errstate(invalid="ignore", divide="ignore"):
                v = np.where(covered > 0, s * factor / (covered * bucket_ns / 1e9), np.nan)
        else:
            with np.errstate(invalid="ignore", divide="ignore"):
                v = np.where(n > 0, s / n, np.nan)
        panel = panels.setdefault((source, unit), Panel(source, unit, x))
        known = v[np.isfinite(v)]
        if known.size and not np.any(known):
            panel.flat_zero.append(metric)
            continue
        panel.series.append(Series(metric, [None if not np.isfinite(a) else round(float(a), 6) for a in v]))
    return [p for p in panels.values() if p.series or p.flat_zero]
