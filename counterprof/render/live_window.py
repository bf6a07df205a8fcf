"""The live view's memory: a session sink that keeps the last minute of every series.

Session.emit calls write() on the collectors' own threads (perf's drain thread, the host
thread, ...), so it is thread-safe and cheap: one Arrow group-by per batch folds its rows
into per-display-tick sums (analysis.live.Bucket), merged under a lock that is held only
for that merge. Memory is bounded: per series at most WINDOW_S / TICK_S buckets, and a
series that has said nothing for a whole window (a thread that ended) is dropped.
"""
from __future__ import annotations

import threading

import pyarrow as pa
import pyarrow.compute as pc

from ..analysis.live import Bucket, Snapshot, merge, side_by_side

TICK_NS = 250_000_000          # one display tick (the view refreshes 4 times a second)
WINDOW_S = 60.0                # what the sparklines show


def _codes(arr: pa.Array) -> tuple[pa.Array, list[str]]:
    """Integer codes and their strings for a dictionary (or plain string) column."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode()
    return arr.indices, arr.dictionary.to_pylist()


def fold(batch: pa.RecordBatch, tick_ns: int) -> list[tuple[tuple[str, str, str], int, Bucket]]:
    """A samples batch as ((source, metric, entity), tick, Bucket) rows: one per series per
    tick (tid:N and cpu:N entities summed into tid:* and cpu:*)."""
    t = batch.column("time").cast(pa.int64())
    value = batch.column("value")
    dur = pc.fill_null(batch.column("duration_ns"), 0).cast(pa.float64())
    known = pc.is_valid(value)
    q = pc.fill_null(batch.column("quality").cast(pa.float64()), 1.0)
    s_codes, s_names = _codes(batch.column("source"))
    m_codes, m_names = _codes(batch.column("metric"))
    e_codes, e_names = _codes(batch.column("entity"))
    table = pa.table({
        "tick": pc.divide(t, pa.scalar(tick_ns, pa.int64())),   # times are positive: floor
        "s": s_codes, "m": m_codes, "e": e_codes,
        "value": value,
        "vdur": pc.multiply(value, dur),
        "kdur": pc.if_else(known, dur, 0.0),
        "qdur": pc.multiply(q, dur),
        "dur": dur,
        "unknown": pc.invert(known).cast(pa.int64()),
        "time": t,
    })
    agg = table.group_by(["tick", "s", "m", "e"], use_threads=False).aggregate([
        ("value", "sum"), ("vdur", "sum"), ("kdur", "sum"), ("qdur", "sum"), ("dur", "sum"),
        ("value", "count"), ("unknown", "sum"), ("value", "last"), ("value", "max"), ("time", "max"),
    ])
    cols = agg.to_pydict()
    entity_of = [_summed_entity(e) for e in e_names]
    out: dict[tuple, Bucket] = {}
    for i in range(agg.num_rows):
        key = (s_names[cols["s"][i]], m_names[cols["m"][i]], entity_of[cols["e"][i]], cols["tick"][i])
        b = Bucket(cols["value_sum"][i] or 0.0, cols["vdur_sum"][i] or 0.0,
                   cols["kdur_sum"][i] or 0.0, cols["qdur_sum"][i] or 0.0,
                   cols["dur_sum"][i] or 0.0, cols["value_count"][i],
                   cols["unknown_sum"][i], cols["value_last"][i], cols["value_max"][i],
                   cols["time_max"][i])
        old = out.get(key)
        out[key] = b if old is None else side_by_side(old, b)
    return [(k[:3], k[3], b) for k, b in out.items()]


def _summed_entity(entity: str) -> str:
    """Threads (--per-thread) and CPUs (-A) are summed here: the dashboard shows totals, and
    the window then does not grow with the number of threads or CPUs. Summing side by side
    (the interval counted once) within a batch relies on what perf does: each drain carries
    every thread's (or CPU's) rows for the intervals it covers."""
    for prefix in ("tid:", "cpu:"):
        if entity.startswith(prefix):
            return prefix + "*"
    return entity


class LiveWindow:
    """A sink: write(table, batch, rank) / close(); snapshot() for the view."""

    def __init__(self, tick_ns: int = TICK_NS, window_s: float = WINDOW_S):
        self.tick_ns = tick_ns
        self.window_ticks = max(1, round(window_s * 1e9 / tick_ns))
        self._series: dict[tuple[str, str, str], dict[int, Bucket]] = {}
        self._lock = threading.Lock()
        self._newest: int | None = None
        self._version = 0
        self.rows_seen = 0
        self.closed = False

    def write(self, table: str, batch: pa.RecordBatch, rank: int = 0) -> None:
        # spans (torch traces) have no place in the dashboard yet; ranks share one view
        if table != "samples" or batch.num_rows == 0:
            return
        folded = fold(batch, self.tick_ns)
        with self._lock:
            for key, tick, b in folded:
                series = self._series.get(key)
                if series is None:
                    series = self._series[key] = {}
                old = series.get(tick)
                series[tick] = b if old is None else merge(old, b)
                if self._newest is None or tick > self._newest:
                    self._newest = tick
            self._evict()
            self.rows_seen += batch.num_rows
            self._version += 1

    def _evict(self) -> None:
        """Drop ticks older than the window, and series with nothing left in it."""
        oldest = self._newest - self.window_ticks + 1
        gone = []
        for key, series in self._series.items():
            # ticks arrive nearly in order, so the oldest are first in the dict
            while series:
                first = next(iter(series))
                if first >= oldest:
                    break
                del series[first]
            if len(series) > 2 * self.window_ticks:    # arrived far out of order: sweep
                for t in [t for t in series if t < oldest]:
                    del series[t]
            if not series:
                gone.append(key)
        for key in gone:
            del self._series[key]

    def snapshot(self) -> Snapshot:
        with self._lock:
            series = {k: dict(v) for k, v in self._series.items()}
            return Snapshot(self.tick_ns, self.window_ticks, series, self._newest, self._version)

    @property
    def version(self) -> int:
        return self._version

    def close(self) -> None:
        self.closed = True
