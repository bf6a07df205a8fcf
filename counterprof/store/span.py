"""The run's span: the times its samples and spans can hold, from its meta.json files.

Readers size buckets, windows and cells from times; one flipped bit in a stored time (a sample
of 1915, a duration of 36 years) would make them allocate gigabytes. Every reader of a run's
tables (Run, RunQuery, export) leaves out rows outside the span and says how many it left out
and why: what sizes an allocation is then bounded by what the run's own meta.json says.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any
from collections.abc import Iterable

import pyarrow as pa
from counterprof.ground.record import record

# A rank on another host (clock skew), a trace's ops before the profiler's start, a workload
# still writing when the profiler stopped: rows this far outside the recorded span are real.
SLACK_NS = 3600 * 1_000_000_000
TIME_COLUMNS = {"samples": ("time", "duration_ns"), "spans": ("start", "end")}   # what mask() reads

# What a row group's statistics prove (Span.proven): every row inside the span, or (spans) every
# start and end inside it, each row's start <= end still to check.
INSIDE = "inside"
ORDER = "order"


@record(frozen=True)
class Span:
    lo: int                 # ns since the epoch
    hi: int

    def describe(self) -> str:
        fmt = "%Y-%m-%d %H:%M:%S"
        return (f"{time.strftime(fmt, time.gmtime(self.lo // 10**9))} to "
                f"{time.strftime(fmt, time.gmtime(self.hi // 10**9))} UTC, from meta.json "
                "with an hour's margin")

    def mask(self, table: str, batch: pa.RecordBatch | pa.Table) -> pa.Array | None:
        """True for the rows inside the span (None: every row is)."""
        import pyarrow.compute as pc      # here, not at import: `run`'s summary opens a Run without reading rows
        if table == "samples" and "time" in batch.schema.names:
            t = pc.cast(batch["time"], pa.int64())
            ok = pc.and_(pc.greater_equal(t, self.lo), pc.less_equal(t, self.hi))
            if "duration_ns" in batch.schema.names:
                d = batch["duration_ns"]
                ok = pc.and_(ok, pc.or_kleene(pc.is_null(d), pc.and_(pc.greater_equal(d, 0),
                                                               pc.less_equal(d, self.hi - self.lo))))
        elif table == "spans" and "start" in batch.schema.names:
            s, e = pc.cast(batch["start"], pa.int64()), pc.cast(batch["end"], pa.int64())
            ok = pc.and_(pc.and_(pc.greater_equal(s, self.lo), pc.less_equal(e, self.hi)),
                         pc.less_equal(s, e))
        else:
            return None
        ok = pc.fill_null(ok, False)
        return None if pc.all(ok).as_py() is not False else ok

    def keep(self, table: str, batch: pa.RecordBatch | pa.Table,
             proven: str | None = None) -> tuple[pa.RecordBatch | pa.Table, int]:
        """(the rows of batch inside the span, how many were left out). proven: what the
        statistics of the batch's row group prove (proven()): INSIDE, no row is looked at;
        ORDER, only each row's start <= end is. Either way the batch's extremes are held to
        the span first (a byte damaged on disk after the statistics were written shows there)."""
        if proven in (INSIDE, ORDER):
            proven = self._confirmed(table, batch, proven)
        if proven == INSIDE:
            return batch, 0
        if proven == ORDER and table == "spans":
            import pyarrow.compute as pc
            ok = pc.fill_null(pc.less_equal(pc.cast(batch["start"], pa.int64()),
                                            pc.cast(batch["end"], pa.int64())), False)
            ok = None if pc.all(ok).as_py() is not False else ok
        else:
            ok = self.mask(table, batch)
        if ok is None:
            return batch, 0
        kept = batch.filter(ok)
        return kept, batch.num_rows - kept.num_rows

    def _confirmed(self, table: str, batch: pa.RecordBatch | pa.Table, proven: str) -> str | None:
        """What the batch's own smallest and largest times (min_max calls, not mask()'s row by
        row) confirm of proven: it, ORDER (spans: inside, but a start after another's end), or
        None (a time outside the span or a null: mask() decides)."""
        import pyarrow.compute as pc

        def extremes(name: str) -> tuple[int | None, int | None]:
            col = batch[name]
            if col.null_count == len(col):
                return None, None
            mm = pc.min_max(pc.cast(col, pa.int64()))
            return mm["min"].as_py(), mm["max"].as_py()
        if table == "samples":
            lo, hi = extremes("time")
            if batch["time"].null_count or lo is None or hi is None or lo < self.lo or hi > self.hi:
                return None
            if "duration_ns" in batch.schema.names:
                dlo, dhi = extremes("duration_ns")
                if dlo is not None and dhi is not None and (dlo < 0 or dhi > self.hi - self.lo):
                    return None
            return proven
        s_lo, s_hi = extremes("start")
        e_lo, e_hi = extremes("end")
        if batch["start"].null_count or batch["end"].null_count or None in (s_lo, s_hi, e_lo, e_hi):
            return None
        assert s_lo is not None and s_hi is not None and e_lo is not None and e_hi is not None
        if s_lo < self.lo or e_hi > self.hi:
            return None
        return proven if proven == ORDER or s_hi <= e_lo else ORDER

    def proven(self, table: str, md: Any, group: int, schema: pa.Schema) -> str | None:
        """What the Parquet statistics of row group `group` (md: the file's metadata, schema:
        its Arrow schema, as its batches are read) prove of its rows against mask(): INSIDE,
        every row is inside the span; ORDER (spans), every start and end is, each row's
        start <= end unproven; None, nothing (a statistic missing, of another unit, or not
        proving it: mask() decides row by row)."""
        try:
            stats = _group_stats(md, group, schema)
            rows = int(md.row_group(group).num_rows)
            if table == "samples":
                t = stats.get("time")
                if t is None or t.nulls != 0 or t.lo is None or t.hi is None \
                        or t.lo < self.lo or t.hi > self.hi:
                    return None
                if "duration_ns" in schema.names:
                    d = stats.get("duration_ns")
                    if d is None or d.nulls is None:
                        return None
                    if d.nulls != rows and (d.lo is None or d.hi is None or d.lo < 0
                                            or d.hi > self.hi - self.lo):
                        return None
                return INSIDE
            if table == "spans":
                s, e = stats.get("start"), stats.get("end")
                if s is None or e is None or s.nulls != 0 or e.nulls != 0 or s.lo is None \
                        or s.hi is None or e.lo is None or e.hi is None \
                        or s.lo < self.lo or e.hi > self.hi:
                    return None
                return INSIDE if s.hi <= e.lo else ORDER     # every start before every end
        except Exception:     # statistics Arrow cannot give: the rows say
            return None
        return None

    def sql(self, table: str) -> str:
        """The same test as mask(), as a DuckDB predicate over the table's view."""
        if table == "samples":
            return (f"epoch_ns(time) BETWEEN {self.lo} AND {self.hi} AND (duration_ns IS NULL OR "
                    f"duration_ns BETWEEN 0 AND {self.hi - self.lo})")
        # (each bound + a volatile zero: DuckDB drops a filter that a row group's statistics say
        # every row passes, and a page damaged after writing then passes whole, starts in year
        # -292 and all; a volatile term is tested row by row. Spans only: on the samples it cost
        # 40% of the report's aggregates)
        z = "(random() * 0)::BIGINT"
        return f"epoch_ns(start) >= {self.lo} + {z} AND epoch_ns(\"end\") <= {self.hi} + {z} AND start <= \"end\""


@record(frozen=True)
class _Stat:
    """A column's statistics in one row group, as the int64 values mask() compares."""
    lo: int | None          # None: unknown (every value null, or not recorded)
    hi: int | None
    nulls: int | None       # None: unknown


def _stat_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _group_stats(md: Any, group: int, schema: pa.Schema) -> dict[str, _Stat]:
    """The time columns' (TIME_COLUMNS) statistics in a row group, by name: only those whose
    stored values are the values mask() compares (a column cast to int64 as it is read: an
    integer, or a timestamp stored in the unit it is read in), min and max from the raw int64s
    (a datetime or pandas.Timestamp from `min` would lose the nanoseconds)."""
    wanted = {c for cols in TIME_COLUMNS.values() for c in cols} & set(schema.names)
    rg = md.row_group(group)
    out = {}
    for i in range(rg.num_columns):
        col = rg.column(i)
        name = col.path_in_schema
        if name not in wanted or col.physical_type != "INT64":
            continue
        st = col.statistics
        if st is None:
            continue
        t = schema.field(name).type
        logical = st.logical_type
        if pa.types.is_timestamp(t):
            if logical.type != "TIMESTAMP" or \
                    f'"timeUnit":"{_UNITS[t.unit]}"' not in logical.to_json().replace(" ", ""):
                continue        # INT96, or another unit than the one it is read in
        elif not (pa.types.is_int64(t) and (logical.type == "NONE" or (
                logical.type == "INT" and '"isSigned":true' in logical.to_json().replace(" ", "")))):
            continue        # an unsigned column's statistics are ordered as unsigned
        has = st.has_min_max
        out[name] = _Stat(_stat_int(st.min_raw) if has else None,
                          _stat_int(st.max_raw) if has else None,
                          int(st.null_count) if st.has_null_count else None)
    return out


_UNITS = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds"}


def span_of(metas: Iterable[dict[str, Any]]) -> Span | None:
    """The span of a run from its meta.json and its ranks' (each start to its end, or to now
    for a run not finished), widened by SLACK_NS; None when no meta says when it started."""
    starts, ends = [], []
    now = time.time_ns()
    for m in metas:
        s, e = m.get("start_ns"), m.get("end_ns")
        if not isinstance(s, int) or isinstance(s, bool):
            continue
        starts.append(s)
        ends.append(e if isinstance(e, int) and not isinstance(e, bool) and e >= s else max(s, now))
    if not starts:
        return None
    return Span(min(starts) - SLACK_NS, max(ends) + SLACK_NS)


def run_span(run_path: str | os.PathLike[str]) -> Span | None:
    """span_of the run's meta.json and those of the ranks that joined it (unreadable ones
    left out: the reader that needs them says why)."""
    from ..ground.errors import RunDirectoryError
    from .meta import read_meta
    from .rundir import META, rank_dirs
    metas = []
    for path in [Path(run_path) / META] + [d / META for _, d in rank_dirs(Path(run_path))]:
        try:
            if path.exists():
                metas.append(read_meta(path))
        except RunDirectoryError:
            continue
    return span_of(metas)


def left_out(where: str, rows: int, span: Span) -> str:
    """The line naming rows left out for lying outside the span (a warning, "path: why")."""
    return (f"{where}: {rows:,} row(s) with times outside the run's span ({span.describe()}) "
            "left out: damaged bytes, or a clock that jumped")
