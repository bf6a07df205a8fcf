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

    def keep(self, table: str, batch: pa.RecordBatch | pa.Table) -> tuple[pa.RecordBatch | pa.Table, int]:
        """(the rows of batch inside the span, how many were left out)."""
        ok = self.mask(table, batch)
        if ok is None:
            return batch, 0
        kept = batch.filter(ok)
        return kept, batch.num_rows - kept.num_rows

    def sql(self, table: str) -> str:
        """The same test as mask(), as a DuckDB predicate over the table's view."""
        if table == "samples":
            return (f"epoch_ns(time) BETWEEN {self.lo} AND {self.hi} AND (duration_ns IS NULL OR "
                    f"duration_ns BETWEEN 0 AND {self.hi - self.lo})")
        return f"epoch_ns(start) >= {self.lo} AND epoch_ns(\"end\") <= {self.hi} AND start <= \"end\""


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
