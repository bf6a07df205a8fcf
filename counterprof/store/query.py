"""Aggregations over a whole run, however big, through DuckDB (embedded, no server).

A run of 64 ranks x 10 minutes at 100 Hz is ~77M sample rows: reading them through Python
is minutes, DuckDB aggregates them in seconds with bounded memory. Every query reads the
run's Parquet files (checked first: a corrupt file is skipped and named, not fatal) and any
journal segments a live or killed profiler left (as Arrow batches), so it sees what
Run.samples() sees. The results are small Arrow tables for analysis/ to work on.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar
from collections.abc import Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .journal import read_segment
from .run_files import RunFile, list_files
from .span import left_out, run_span

T = TypeVar("T")

GROUPS_PER_SLICE = 250_000     # (metric, bucket) groups one bucket query aggregates (RunQuery.buckets)
MAX_SLICES = 256               # and the most bucket queries of a run (each reads every file's footer)

# sums and counts every per-metric figure is made of (analysis.summary reads these names)
_TOTALS = """
    sum(value) AS value_sum, max(value) AS value_max, count(value) AS value_count,
    sum(coalesce(duration_ns, 0)::DOUBLE) AS dur_sum,
    sum(coalesce(quality, 1.0)::DOUBLE * coalesce(duration_ns, 0)) AS qdur_sum,
    (count(*) - count(value))::BIGINT AS unknown_sum,
    sum(value * coalesce(duration_ns, 0)) AS vdur_sum,
    sum(CASE WHEN value IS NULL THEN 0 ELSE coalesce(duration_ns, 0) END)::DOUBLE AS vdurw_sum"""


@dataclass
class RunFiles:
    """The readable parts of a run, per table, and what was skipped."""

    parquet: dict[str, list[tuple[int, str]]] = field(default_factory=dict)   # table -> (rank, path)
    journal: dict[str, list[tuple[int, Path]]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)                           # "path: why"
    left_out: list[str] = field(default_factory=list)      # rows outside the run's span, per table


def run_files(run_path: str | os.PathLike[str]) -> RunFiles:
    """The run's files (store/run_files.py lists them), each Parquet file's footer checked:
    one that cannot be read is left out and named."""
    out = RunFiles()
    for _rank, files in sorted(list_files(run_path).items()):
        for f in files:
            if f.journal:
                out.journal.setdefault(f.table, []).append((f.rank, f.path))
            elif f.footer() is None:
                out.skipped += [str(d) for d in f.damage]
            else:
                out.parquet.setdefault(f.table, []).append((f.rank, str(f.path)))
    return out


def _timestamp(ns: int) -> str:
    """A TIMESTAMPTZ_NS literal of epoch nanoseconds ns, comparable with the time column as it
    is stored, so that DuckDB skips the row groups its statistics put outside (epoch_ns(time)
    compared is not pushed down: every file read whole, measured 3x slower)."""
    return f"make_timestamp_ns({int(ns)})::TIMESTAMPTZ_NS"


def _sql_string(text: str) -> str:
    """A SQL string literal (a run directory may be named "bob's run")."""
    return "'" + text.replace("'", "''") + "'"


class RunQuery:
    """One DuckDB connection with a view per table (samples, spans), rank included. Rows
    outside the run's span (store/span.py) are not in the views; a file that turns out damaged
    while a query reads it is left out and the query run again. Both are named in
    files.skipped."""

    def __init__(self, run_path: str | os.PathLike[str], threads: int | None = None,
                 count_left_out: bool = True) -> None:
        import duckdb
        self.files = run_files(run_path)
        self.span = run_span(run_path)
        from .limits import duckdb_config
        config: dict[str, Any] = dict(duckdb_config())   # sized to the memory limits (none: DuckDB's own)
        if threads:
            config["threads"] = threads
        config.setdefault("threads", os.cpu_count() or 1)
        self.con = duckdb.connect(config=config)   # at connect: its threads start here
        self.con.execute("SET enable_progress_bar = false")
        try:        # (the time literals of buckets' slices name instants in UTC: _sliceable)
            self.con.execute("SET TimeZone = 'UTC'")
        except duckdb.Error:
            pass
        self.tables: set[str] = set()
        self._sliced: bool | None = None          # _sliceable()
        self._journal: dict[str, pa.Table] = {}     # table -> the journal's rows, registered
        self._rescued: dict[str, list[str]] = {}    # table -> registered rows of damaged files
        for table in ("samples", "spans"):     # DuckDB reads the footers here: one may fail
            self._run(partial(self._view, table))
        if count_left_out:      # (a second connection to a run need not scan for them again)
            self._note_out_of_span()

    def _view(self, table: str) -> None:
        self.con.execute(f"DROP VIEW IF EXISTS {table}")
        self.con.execute(f"DROP VIEW IF EXISTS {table}_all")
        self.tables.discard(table)
        parts = []
        files = self.files.parquet.get(table, [])
        if files:
            paths = ", ".join(_sql_string(str(p)) for _, p in files)
            parts.append(f"SELECT * FROM read_parquet([{paths}], hive_partitioning = true, "
                         f"union_by_name = true)")
        journal = self.files.journal.get(table, [])
        if table in self._journal:         # a rebuilt view: the segments were read already
            parts.append(f"SELECT * FROM {table}_journal")
        elif journal:
            batches = []
            for rank, path in journal:
                for b in read_segment(path):
                    batches.append(b.append_column("rank", pa.array([rank] * b.num_rows, pa.int64())))
            if batches:
                name = f"{table}_journal"
                self._journal[table] = pa.Table.from_batches(batches).unify_dictionaries()
                self.con.register(name, self._journal[table])
                parts.append(f"SELECT * FROM {name}")
        parts += [f"SELECT * FROM {name}" for name in self._rescued.get(table, [])]
        if parts:
            self.con.execute(f"CREATE VIEW {table}_all AS " + " UNION ALL BY NAME ".join(parts))
            where = f" WHERE {self.span.sql(table)}" if self.span is not None else ""
            self.con.execute(f"CREATE VIEW {table} AS SELECT * FROM {table}_all{where}")
            self.tables.add(table)
        else:        # none (left): an empty view, for a query retried without a damaged file
            from ..ground.schema import TABLES
            empty = TABLES[table].empty_table()
            self.con.register(f"{table}_none", empty.append_column("rank", pa.array([], pa.int64())))
            self.con.execute(f"CREATE VIEW {table} AS SELECT * FROM {table}_none")

    def _note_out_of_span(self) -> None:
        span = self.span          # a local: the checker sees it is not None below
        if span is None:
            return
        for table in sorted(self.tables):
            if self._inside_by_statistics(table):
                continue          # the footers say every row is inside: no scan
            sql = f"SELECT count(*) FROM {table}_all WHERE NOT coalesce({span.sql(table)}, false)"
            n: int = self._run(functools.partial(self._count, sql))
            if n:
                self.files.left_out.append(left_out(f"{table} of the run", n, span))

    def _count(self, sql: str) -> int:
        return int(self.con.sql(sql).fetchall()[0][0])

    def _inside_by_statistics(self, table: str) -> bool:
        """Do the Parquet files' row-group statistics (and the journal's rows) put every time
        of table inside the run's span? False when any cannot say."""
        assert self.span is not None          # _note_out_of_span asks only when the run has one
        from .span import INSIDE
        for _rank, path in self.files.parquet.get(table, []):
            try:
                md = pq.read_metadata(path)
                schema = md.schema.to_arrow_schema()
            except (pa.ArrowException, OSError, ValueError, TypeError):
                return False
            if any(self.span.proven(table, md, g, schema) != INSIDE for g in range(md.num_row_groups)):
                return False
        if table in self._journal and self.span.mask(table, self._journal[table]) is not None:
            return False
        return True

    def run(self, query: Callable[[], T]) -> T:
        """query() of this connection's views, again without each file it shows damaged."""
        return self._run(query)

    def _run(self, query: Callable[[], T]) -> T:
        """query(), again without each Parquet file that a DuckDB error shows is damaged (its
        footer read by Arrow, not by DuckDB; a page inside did not: "dictionary offset out of
        range")."""
        import duckdb
        while True:
            try:
                return query()
            except duckdb.Error as exc:
                if not self._drop_damaged(exc):
                    raise

    def _drop_damaged(self, exc: Exception) -> bool:
        """Find the files that fail to decode and read them row group by row group instead
        (the run's one damage policy, store/run_files.py: only what is damaged is left out, and
        named); False if none fails."""
        import duckdb
        damaged = set()
        for table, files in self.files.parquet.items():
            for rank, path in list(files):
                try:
                    self.con.sql(f"SELECT max(hash(COLUMNS(*))) FROM read_parquet({_sql_string(path)})"
                                 ).fetchall()
                except duckdb.Error as bad:
                    files.remove((rank, path))
                    self._rescue(table, rank, path, (str(bad).splitlines() or [type(bad).__name__])[0])
                    damaged.add(table)
        for table in sorted(damaged):      # once every damaged file is out of its list
            self._view(table)
        return bool(damaged)

    def _rescue(self, table: str, rank: int, path: str, why: str) -> None:
        """The row groups of a file DuckDB cannot decode that Arrow reads (checked), registered
        as rows of the view; the damaged ones named in files.skipped. Where Arrow finds no
        row group to blame, the whole file is left out (named with DuckDB's reason)."""
        part = RunFile(rank, table, Path(path))
        batches = [b.append_column("rank", pa.array([rank] * b.num_rows, pa.int64()))
                   for _g, b in part.batches(validate=True)]
        if not part.damage:
            self.files.skipped.append(f"{path}: {why}")
            return
        self.files.skipped += [str(d) for d in part.damage]
        if batches:
            name = f"{table}_rescued_{sum(len(v) for v in self._rescued.values())}"
            self.con.register(name, pa.Table.from_batches(batches).unify_dictionaries())
            self._rescued.setdefault(table, []).append(name)

    def arrow(self, sql: str) -> pa.Table:
        return self._run(lambda: self.con.sql(sql).to_arrow_table())

    def groups(self) -> pa.Table:
        """One scan of every sample: per (rank, source, metric, entity), the summary's sums, the
        covered span and the value counts. Totals, per-rank figures and GPU figures are small
        regroupings of this (one pass over the files instead of three)."""
        if "samples" not in self.tables:
            return pa.table({})
        return self.arrow(f"""SELECT rank, source::VARCHAR AS source, metric::VARCHAR AS metric,
                                     entity::VARCHAR AS entity, {_TOTALS},
                                     min(epoch_ns(time) - coalesce(duration_ns, 0)) AS start_ns,
                                     max(epoch_ns(time)) AS end_ns
                              FROM samples GROUP BY ALL""")

    def buckets(self, bucket_ns: int, extent: tuple[int, int] | None = None, metrics: int | None = None
                ) -> pa.Table:
        """Per metric and time bucket: covered span, sum, counts (signals' input), ordered by
        metric and bucket. Aggregated a slice of time at a time, each of at most
        GROUPS_PER_SLICE (metric, bucket) groups: DuckDB's hash table holds ~500 bytes a group,
        1.4 GB for 256 ranks x 4 h of 20 metrics at 100 ms in one query, and the row groups of
        time-ordered files outside a slice are skipped by their statistics. extent: the samples'
        (first, last) time, at least as wide as theirs (None: asked of DuckDB); metrics: how
        many there are (None: counted)."""
        if "samples" not in self.tables:
            return pa.table({})
        lo, hi = extent if extent is not None else self.extent()
        bn = int(bucket_ns)
        cuts = []        # slice edges, on bucket edges; the first and last slices are open-ended
        if lo is not None and hi is not None and self._sliceable():
            # (edges inside the run's span, none below 0: DuckDB's // rounds toward zero, and a
            # damaged time that passed the statistics must not make millions of slices)
            if self.span is not None:
                lo, hi = max(lo, self.span.lo), min(hi, self.span.hi)
            lo = max(lo, 0)
            if metrics is None:
                metrics = self._run(partial(self._count, "SELECT count(DISTINCT metric) FROM samples"))
            per = max(1, GROUPS_PER_SLICE // max(1, metrics), -(-(hi // bn - lo // bn) // MAX_SLICES))
            cuts = [b * bn for b in range(lo // bn + per, hi // bn + 1, per)]
        edges: list[int | None] = [None, *cuts, None]
        parts = []
        for a, b in zip(edges, edges[1:]):
            where = " AND ".join(([f"time >= {_timestamp(a)}"] if a is not None else [])
                                 + ([f"time < {_timestamp(b)}"] if b is not None else [])) or "true"
            parts.append(self.arrow(f"""
                SELECT metric::VARCHAR AS metric, any_value(source::VARCHAR) AS source,
                       epoch_ns(time) // {bn} AS b,
                       min(epoch_ns(time) - coalesce(duration_ns, 0)) AS start_ns,
                       max(epoch_ns(time)) AS end_ns,
                       sum(value) AS vsum, count(value) AS n, (count(*) - count(value))::BIGINT AS nulls
                FROM samples WHERE {where} GROUP BY ALL ORDER BY metric, b"""))
        if len(parts) == 1:
            return parts[0]
        # each slice is in (metric, bucket) order and the slices in time order: a stable sort by
        # metric orders the whole (Arrow's sort is stable)
        whole = pa.concat_tables(parts)
        del parts
        return whole.take(pc.sort_indices(whole, [("metric", "ascending")]))

    def _sliceable(self) -> bool:
        """Can the samples be read a slice of time at a time: their time column is stored as
        TIMESTAMPTZ_NS (a file of another type makes the view's another, which _timestamp's
        literals do not compare with), and the connection's zone is UTC (set at connect), so
        that the literals are the instants they name (DuckDB casts to TIMESTAMPTZ in the
        session's zone)."""
        import duckdb
        if self._sliced is None:
            try:
                kind = {r[0]: r[1] for r in self.con.sql("DESCRIBE samples").fetchall()}.get("time")
                probe = 1_000_000_000_123_456_789
                back = self.con.sql(f"SELECT epoch_ns({_timestamp(probe)})").fetchall()[0][0]
                self._sliced = kind == "TIMESTAMPTZ_NS" and back == probe
            except duckdb.Error:
                self._sliced = False        # one query over the whole run, as before
        return self._sliced

    def spans(self, by_rank: bool = False) -> pa.Table:
        """Every span, with its rank (small next to the samples: read whole), in time order; by
        rank then time with by_rank (each rank's rows one slice: analysis.report.rank_tables)."""
        from ..ground.schema import SPANS_SCHEMA
        if "spans" not in self.tables:
            return SPANS_SCHEMA.empty_table().append_column("rank", pa.array([], pa.int64()))
        if not by_rank:
            return self.arrow("SELECT * FROM spans ORDER BY start")
        # DuckDB's ORDER BY holds a second copy of every span while it sorts (1024 ranks x 1 h:
        # 0.9 GB more at the peak); the files are read in rank order already (run_files), each
        # usually in time order, so the rows are read as they come and sorted only if they are not
        return self._run(lambda: rank_ordered(self.con.sql("SELECT * FROM spans").to_arrow_reader(1 << 17)))

    def spans_of_each_rank(self) -> Iterator[tuple[int | None, pa.Table]]:
        """(rank, its spans in time order) for each rank in rank order (null last), read again
        at each call and let go rank by rank: the memory is one rank's, not the run's. A live
        run's journal rows may come after the files' in the stream: there, spans(by_rank=True)
        is read whole and sliced."""
        import duckdb
        if "spans" not in self.tables:
            return
        last: int | None = None        # the last rank given whole
        if self._journal.get("spans") is None and not self._rescued.get("spans"):
            try:
                # (DuckDB keeps the files' order, listed by rank, without an ORDER BY:
                # preserve_insertion_order; a rank is given once the next one begins)
                for r, t in rank_chunks(self.con.sql("SELECT * FROM spans").to_arrow_reader(1 << 17)):
                    yield r, t
                    last = r
                return
            # a file found damaged on the way (DuckDB's error, through Arrow's reader an OSError):
            # left out as _run leaves it, the rows it still gives coming last: read whole below
            except (duckdb.Error, OSError, pa.ArrowException) as exc:
                if not self._drop_damaged(exc):
                    raise
        for r, t in rank_slices(self.spans(by_rank=True)):
            if last is None or r is None or r > last:
                yield r, t

    def rescued(self, table: str) -> list[str]:
        """The registered tables holding the readable rows of the table's damaged files."""
        return list(self._rescued.get(table, []))

    def count(self, table: str) -> int:
        """The table's rows (0 without one)."""
        if table not in self.tables:
            return 0
        return int(self._run(lambda: self.con.sql(f"SELECT count(*) FROM {table}").fetchall()[0][0]))

    def extent(self) -> tuple[int | None, int | None]:
        if "samples" not in self.tables:
            return None, None
        row = self._run(lambda: self.con.sql(
            "SELECT min(epoch_ns(time)), max(epoch_ns(time)) FROM samples").fetchall()[0])
        return row[0], row[1]

    def close(self) -> None:
        self.con.close()


_NULL_RANK = 2 ** 63 - 1     # a null rank, where ranks are sorted: last


def rank_chunks(rows: pa.RecordBatchReader) -> Iterator[tuple[int | None, pa.Table]]:
    """(rank, its rows in time order) for each run of one rank in the stream, as soon as the
    next rank begins: the memory is one rank's, plus one batch's. A rank that comes back later
    in the stream comes out again (rank_ordered puts such rows in place)."""
    import numpy as np
    import pyarrow.compute as pc
    schema = rows.schema
    pending: list[pa.RecordBatch] = []  # the rank being read

    def finish() -> pa.Table:
        t = pa.Table.from_batches(pending, schema)
        pending.clear()
        start = pc.fill_null(t["start"].cast(pa.int64()), np.iinfo(np.int64).min).to_numpy()
        # copied even when in order: a batch read holds several ranks, and one rank's slice
        # kept would keep the whole batch alive beside the other ranks' sorted copies
        return t.take(pa.array(np.argsort(start, kind="stable")))

    current: int | None = None
    for batch in rows:
        if batch.num_rows == 0:
            continue
        rank = pc.fill_null(batch["rank"].cast(pa.int64()), _NULL_RANK).to_numpy()
        cuts = (np.flatnonzero(rank[1:] != rank[:-1]) + 1).tolist()
        for a, b in zip([0, *cuts], [*cuts, len(rank)]):
            r = int(rank[a])
            if r != current:
                if pending:
                    yield (None if current == _NULL_RANK else current), finish()
                current = r
            pending.append(batch.slice(a, b - a))
    if pending:
        yield (None if current == _NULL_RANK else current), finish()


def rank_slices(table: pa.Table) -> Iterator[tuple[int | None, pa.Table]]:
    """(rank, its rows) of a table in rank order (rank_ordered's), as slices."""
    import numpy as np
    import pyarrow.compute as pc
    if not table.num_rows:
        return
    rank = pc.fill_null(table["rank"].cast(pa.int64()), _NULL_RANK).to_numpy()
    cuts = (np.flatnonzero(rank[1:] != rank[:-1]) + 1).tolist()
    for a, b in zip([0, *cuts], [*cuts, len(rank)]):
        yield (None if rank[a] == _NULL_RANK else int(rank[a])), table.slice(a, b - a)


def rank_ordered(rows: pa.RecordBatchReader | pa.Table) -> pa.Table:
    """rows by rank (nulls last), then start. Read as a stream, each rank's rows are put in
    time order as soon as the next rank begins: the memory is the table's, plus one batch's
    (sorting the whole table would hold it twice). Ranks that come back later in the stream
    (a live run's journal rows after its files) are put in place by one sort of the whole."""
    import numpy as np
    import pyarrow.compute as pc
    if isinstance(rows, pa.Table):
        rows = pa.RecordBatchReader.from_batches(rows.schema, rows.to_batches())
    schema = rows.schema
    done: list[pa.Table] = []           # each rank's rows, in time order
    seen: set[int | None] = set()
    contiguous = True                   # each rank once, in ascending order (null last)
    before = -_NULL_RANK - 1
    for r, t in rank_chunks(rows):
        key = _NULL_RANK if r is None else r
        contiguous = contiguous and r not in seen and key > before
        seen.add(r)
        before = key
        done.append(t)
    table = pa.concat_tables(done) if done else schema.empty_table()
    if contiguous:
        return table
    rank = pc.fill_null(table["rank"].cast(pa.int64()), np.iinfo(np.int64).max).to_numpy()
    start = pc.fill_null(table["start"].cast(pa.int64()), np.iinfo(np.int64).min).to_numpy()
    return table.take(pa.array(np.lexsort((start, rank))))
