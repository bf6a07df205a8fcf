"""The live view's memory: a session sink that keeps the last minute of every series.

Session.emit calls write() on the collectors' own threads (perf's drain thread, the host
thread, ...), so it is thread-safe and cheap: one Arrow group-by per batch folds its rows
into per-display-tick sums (live/buckets.py: Bucket), merged under a lock that is held only
for that merge. Two resolutions: display ticks (250 ms) for the last RECENT_S seconds
(current values, the verdict), and one-second buckets for the whole WINDOW_S (sparklines).
Memory is bounded: per series at most RECENT_S / tick + WINDOW_S buckets, and a series that
has said nothing for a whole window (a thread that ended) is dropped.
"""
from __future__ import annotations

import threading
import time

import pyarrow as pa
import pyarrow.compute as pc

from .buckets import Bucket, Key, Snapshot, merge, side_by_side
from .traces import TraceMFU

TICK_NS = 250_000_000          # one display tick (the view refreshes 4 times a second)
WINDOW_S = 60.0                # what the sparklines show
HISTORY_TICKS = 4              # ticks per history bucket: one second
RECENT_S = 8.0                 # display ticks kept: "now" (1 s), the verdict (3 s), lag (2 s)


def _codes(arr: pa.Array) -> tuple[pa.Array, list[str]]:
    """Integer codes and their strings for a dictionary (or plain string) column."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode()
    return arr.indices, arr.dictionary.to_pylist()


# Arrow scalars made once: pyarrow converts a Python number on every call (and, without
# python-dateutil installed, searches sys.path for it each time)
_ZERO = pa.scalar(0.0, pa.float64())
_ONE = pa.scalar(1.0, pa.float64())
_TICKS: dict[int, pa.Scalar] = {}


def fold(batch: pa.RecordBatch, tick_ns: int) -> list[tuple[tuple[str, str, str], int, Bucket]]:
    """A samples batch as ((source, metric, entity), tick, Bucket) rows: one per series per
    tick (tid:N and cpu:N entities summed into tid:* and cpu:*)."""
    tick = _TICKS.get(tick_ns)
    if tick is None:
        tick = _TICKS[tick_ns] = pa.scalar(tick_ns, pa.int64())
    t = batch.column("time").cast(pa.int64())
    value = batch.column("value")
    dur = pc.fill_null(batch.column("duration_ns").cast(pa.float64()), _ZERO)
    known = pc.is_valid(value)
    q = pc.fill_null(batch.column("quality").cast(pa.float64()), _ONE)
    s_codes, s_names = _codes(batch.column("source"))
    m_codes, m_names = _codes(batch.column("metric"))
    e_codes, e_names = _codes(batch.column("entity"))
    table = pa.table({
        "tick": pc.divide(t, tick),      # integer division; times are positive: floor
        "s": s_codes, "m": m_codes, "e": e_codes,
        "value": value,
        "vdur": pc.multiply(value, dur),
        "kdur": pc.if_else(known, dur, _ZERO),
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
    out: dict[tuple[str, str, str, int], Bucket] = {}
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


def _trim(store: dict[Key, dict[int, Bucket]], oldest: int, keep: int) -> list[Key]:
    """Delete buckets before `oldest` in every series of store; the keys left empty."""
    empty: list[Key] = []
    for key, series in store.items():
        # buckets arrive nearly in order, so the oldest are first in the dict
        while series:
            first = next(iter(series))
            if first >= oldest:
                break
            del series[first]
        if len(series) > 2 * keep:       # arrived far out of order: sweep
            for t in [t for t in series if t < oldest]:
                del series[t]
        if not series:
            empty.append(key)
    return empty


class LiveWindow:
    """A sink: write(table, batch, rank) / close(); snapshot() for the view."""

    fresh_rows = True          # it shows the last seconds: collectors hand rows over every second

    def __init__(self, tick_ns: int = TICK_NS, window_s: float = WINDOW_S,
                 history_ticks: int = HISTORY_TICKS, recent_s: float = RECENT_S):
        self.tick_ns = tick_ns
        self.history_ticks = history_ticks
        self.window_ticks = max(history_ticks, round(window_s * 1e9 / tick_ns) // history_ticks * history_ticks)
        self.recent_ticks = max(1, round(recent_s * 1e9 / tick_ns))
        self._series: dict[tuple[str, str, str], dict[int, Bucket]] = {}     # display ticks
        self._history: dict[tuple[str, str, str], dict[int, Bucket]] = {}    # history buckets
        self._lock = threading.Lock()
        self._newest: int | None = None
        self._version = 0
        self.rows_seen = 0
        self.rows_ahead = 0        # rows stamped far ahead of the rest: left out (a damaged time)
        self.closed = False
        self.traces = TraceMFU()

    MAX_AHEAD_NS = 60_000_000_000

    def _plausible(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """batch without rows stamped more than a minute ahead of now (the wall clock, or the
        newest tick when the times are not epoch times): one such row would make "now" jump
        and every real series drop out of the window."""
        t = batch.column("time").cast(pa.int64())
        newest = self._newest
        ref = newest * self.tick_ns if newest is not None else pc.approximate_median(t).as_py()
        ref = max(int(ref), time.time_ns())     # a stopped workload's pause is no jump
        ok = pc.less_equal(t, int(ref) + self.MAX_AHEAD_NS)
        if pc.all(ok).as_py():
            return batch
        kept = batch.filter(ok)
        self.rows_ahead += batch.num_rows - kept.num_rows
        return kept

    def write(self, table: str, batch: pa.RecordBatch, rank: int = 0) -> None:
        # spans: torch traces, whose windows give the MFU figure (live/traces.py); ranks share one view
        if table == "spans" and batch.num_rows:
            if self.traces.write(batch, rank):
                with self._lock:
                    self._version += 1
            return
        if table != "samples" or batch.num_rows == 0:
            return
        batch = self._plausible(batch)
        if batch.num_rows == 0:
            return
        folded = fold(batch, self.tick_ns)
        h = self.history_ticks
        with self._lock:
            for key, tick, b in folded:
                for store, at in ((self._series, tick), (self._history, tick // h)):
                    series = store.get(key)
                    if series is None:
                        series = store[key] = {}
                    old = series.get(at)
                    series[at] = b if old is None else merge(old, b)
                if self._newest is None or tick > self._newest:
                    self._newest = tick
            self._evict()
            self.rows_seen += batch.num_rows
            self._version += 1

    def _evict(self) -> None:
        """Drop what is older than each resolution keeps, and series with no history left."""
        newest = self._newest
        assert newest is not None           # write() set it before evicting
        _trim(self._series, newest - self.recent_ticks + 1, self.recent_ticks)
        h = self.history_ticks
        for key in _trim(self._history, newest // h - self.window_ticks // h + 1,
                         self.window_ticks // h):
            del self._history[key]
            self._series.pop(key, None)

    def snapshot(self) -> Snapshot:
        with self._lock:
            return Snapshot(self.tick_ns, self.window_ticks,
                            {k: dict(v) for k, v in self._series.items()},
                            {k: dict(v) for k, v in self._history.items()},
                            self.history_ticks, self._newest, self._version,
                            tuple(self.traces.latest()))

    @property
    def version(self) -> int:
        return self._version

    def close(self) -> None:
        self.closed = True
