"""The rows the roofline reads, through DuckDB, in the order it walks them: memory that does not
grow with the trace.

    src = OpRows.of(spans)          # a spans table (pyarrow), or a store.query.RunQuery of a run
    src.counts(scope)               # (torch ops, GPU work ns)
    src.shapes()                    # distinct (name, attrs) of the ops, with how many calls
    src.events(keys, scope)         # record batches: ops and their launches' GPU time, per thread
                                    # in time order (the walk that nests ops and finds self time)
    src.marks()                     # step and window spans (few)

Only the columns the roofline uses are read, the Parquet files in DuckDB's batches; the ops come
with the integer id of their (name, attrs) instead of the text (`keys`: a small table of the
distinct ones), so the sort DuckDB does holds numbers only, and spills to disk past
MEMORY_LIMIT. Ranks: the run's rank column (-1 where it is null; 0 for a table without one).
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any
from collections.abc import Iterable, Iterator

import pyarrow as pa

if TYPE_CHECKING:
    from .query import RunQuery

GPU_WORK = ("kernel", "memcpy", "memset")
MEMORY_LIMIT = "64MB"          # DuckDB's own ceiling for the sort (it spills to a temp file past it)
BATCH_ROWS = 64 * 1024
CHUNK_ROWS = 50_000             # ops and launches sorted at once (one slice of the trace's time)
# an op's (name, attrs) as a 64-bit hash: the sort carries numbers only (shapes() checks that
# the distinct pairs of a run have distinct hashes)
_KEY = "hash(name, coalesce(attrs, ''))"


def _in(values: Iterable[str]) -> str:
    return ", ".join(f"'{v}'" for v in values)


class OpRows:
    def __init__(self, con: Any, view: str, owned: bool, rank: int | None = None,
                 memory_limit: str | None = None) -> None:
        self.con, self.owned = con, owned
        self.memory_limit = memory_limit       # a borrowed connection's own, put back at close
        where = f"WHERE coalesce(rank, -1) = {int(rank)}" if rank is not None else ""
        self.view = f"(SELECT * FROM {view} {where})"

    @classmethod
    def of(cls, spans: pa.Table | RunQuery, rank: int | None = None) -> OpRows:
        """A spans table (registered in a connection of its own) or a RunQuery (its connection,
        its spans view)."""
        import duckdb
        if isinstance(spans, pa.Table):
            from .limits import duckdb_config
            con = duckdb.connect(config={**duckdb_config(), "threads": 1})
            con.register("roofline_in", spans.append_column("roofline_row", pa.array(range(spans.num_rows),
                                                                                   pa.int64())))
            rank_col = "rank" if "rank" in spans.column_names else "0"
            con.execute(f"""CREATE VIEW roofline_spans AS SELECT
                epoch_ns(start) AS s, epoch_ns("end") AS e, name, category::VARCHAR AS category,
                kernel_class::VARCHAR AS kernel_class, pid, tid, correlation, attrs,
                {rank_col}::BIGINT AS rank, roofline_row AS row FROM roofline_in""")
            return cls(con, "roofline_spans", True, rank)
        con = spans.con
        memory_limit = con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]
        con.execute(f"SET memory_limit = '{MEMORY_LIMIT}'")
        # the files read again with their row numbers: two ops of one thread with the same start
        # and end nest in the order the trace wrote them (the parent first)
        parts = []
        files = spans.files.parquet.get("spans", [])
        if files:
            paths = ", ".join("'" + str(f).replace("'", "''") + "'" for _, f in files)
            parts.append(f"""SELECT start, "end", name, category, kernel_class, pid, tid, correlation, attrs,
                                    rank, file_row_number AS row
                             FROM read_parquet([{paths}], hive_partitioning = true, union_by_name = true,
                                               file_row_number = true)""")
        # the readable row groups of files found damaged (the view's rows: RunQuery._rescue)
        parts += [f"""SELECT start, "end", name, category, kernel_class, pid, tid, correlation, attrs,
                             rank, row_number() OVER () AS row FROM {name}"""
                  for name in spans.rescued("spans")]
        if "spans_journal" in {r[0] for r in con.execute("SHOW TABLES").fetchall()}:
            parts.append("""SELECT start, "end", name, category, kernel_class, pid, tid, correlation, attrs,
                                   rank, row_number() OVER () AS row FROM spans_journal""")
        if not parts:
            con.execute("""CREATE OR REPLACE TEMP VIEW roofline_spans AS SELECT 0::BIGINT AS s, 0::BIGINT AS e,
                           ''::VARCHAR AS name, ''::VARCHAR AS category, NULL::VARCHAR AS kernel_class,
                           0::BIGINT AS pid, 0::BIGINT AS tid, 0::BIGINT AS correlation,
                           NULL::VARCHAR AS attrs, 0::BIGINT AS rank, 0::BIGINT AS row WHERE false""")
        else:
            con.execute(f"""CREATE OR REPLACE TEMP VIEW roofline_spans AS SELECT
                epoch_ns(start) AS s, epoch_ns("end") AS e, name, category::VARCHAR AS category,
                kernel_class::VARCHAR AS kernel_class, pid, tid, correlation,
                CASE WHEN category::VARCHAR IN ('cpu_op', 'window', 'xla_op') THEN attrs END AS attrs,
                rank::BIGINT AS rank, row FROM ({" UNION ALL BY NAME ".join(parts)})
                {f"WHERE {spans.span.sql('spans')}" if spans.span is not None else ""}""")
        return cls(con, "roofline_spans", False, rank, memory_limit)

    def close(self) -> None:
        if self.owned:
            self.con.close()
        elif self.memory_limit is not None:
            self.con.execute(f"SET memory_limit = '{self.memory_limit}'")

    # -- small answers --------------------------------------------------------------------

    def _gpu_where(self, scope: tuple[int, int] | None) -> str:
        w = (f"category IN ({_in(GPU_WORK)}) AND coalesce(kernel_class, '') <> 'communication'")
        if scope is not None:
            w += f" AND s >= {int(scope[0])} AND s < {int(scope[1])}"
        return w

    def counts(self) -> tuple[int, int]:
        """(torch ops, ns of GPU work that is not communication)."""
        row = self.con.execute(f"""SELECT count(*) FILTER (WHERE category = 'cpu_op'),
                                          coalesce(sum(e - s) FILTER (WHERE {self._gpu_where(None)}), 0)
                                   FROM {self.view}""").fetchall()[0]
        return int(row[0]), int(row[1])

    def ranks(self) -> list[int]:
        return [r[0] for r in self.con.execute(f"SELECT DISTINCT rank FROM {self.view} ORDER BY 1").fetchall()]

    def shapes(self) -> pa.Table:
        """name, attrs, key, calls: one row per distinct op name and attrs text; key: their hash,
        what events() gives each op instead of the text."""
        return self.con.sql(f"""SELECT name, attrs, {_KEY} AS key, count(*) AS calls FROM {self.view}
                                    WHERE category = 'cpu_op' GROUP BY name, attrs""").to_arrow_table()

    def marks(self) -> pa.Table:
        """The step and window spans: category, name, rank, s, e, attrs."""
        return self.con.sql(f"""SELECT category, name, coalesce(rank, -1) AS rank, s, e,
                                           CASE WHEN category = 'window' THEN attrs END AS attrs
                                    FROM {self.view} WHERE category IN ('step', 'window')
                                    ORDER BY s""").to_arrow_table()

    def durations(self, categories: Iterable[str], log_step: float) -> pa.Table:
        """Per rank, category and name: how many spans of the categories lasted how long, in bins
        of ln(ns) / log_step (rank, category, name, kernel_class, bin, calls, ns): what
        `correlate` measures kernels, regions and steps by, in memory of the distinct bins."""
        return self.con.sql(f"""SELECT coalesce(rank, -1) AS rank, category, name,
                                       any_value(kernel_class) AS kernel_class,
                                       round(ln(greatest(e - s, 1)) / {float(log_step)!r})::BIGINT AS bin,
                                       count(*) AS calls, sum(e - s)::BIGINT AS ns
                                FROM {self.view} WHERE category IN ({_in(categories)})
                                GROUP BY coalesce(rank, -1), category, name, bin""").to_arrow_table()

    def has_kernels(self) -> bool:
        return bool(self.con.execute(f"SELECT count(*) FROM {self.view} WHERE category = 'kernel'").fetchall()[0][0])

    # -- the walk ---------------------------------------------------------------------------

    def events(self, scope: tuple[int, int] | None = None, batch_rows: int = BATCH_ROWS,
               chunk_rows: int | None = None) -> Iterator[pa.RecordBatch]:
        """Ops and launches, sorted per thread (rank, pid, tid) by start, ops before launches at
        the same time, the longer op first (the parent). Columns: rank, pid, tid, s, kind (0 op,
        1 launch), e, key (the op's key in shapes()), ns and link (a launch's GPU ns and the part
        of it copying between host and device; GPU work started in scope).

        In slices of time holding about chunk_rows ops each, one after another: each slice is
        sorted on its own (memory: one slice, whatever the trace's length), so a thread's rows
        still come in time order across slices and its open ops carry over from one to the next.
        The ops and launches (with their GPU time) are staged once, in start order, in a temp
        table of numbers DuckDB keeps on disk past MEMORY_LIMIT: a slice reads only the blocks
        of its time (their min/max), not the whole run again (slices x the run: 3 min for 2 M
        calls over 64 ranks, before)."""
        table = self._stage(scope)
        path = self._stage_path
        try:
            lo, hi, n = self.con.execute(f"SELECT min(s), max(s), count(*) FROM {table}").fetchall()[0]
            if not n:
                return
            slices = max(1, -(-n // (chunk_rows or CHUNK_ROWS)))
            step = (hi - lo) // slices + 1
            for i in range(slices):
                a, b = lo + i * step, lo + (i + 1) * step
                rel = self.con.sql(f"""SELECT * FROM {table} WHERE s >= {a} AND s < {b}
                                       ORDER BY rank, pid, tid, s, kind, e DESC, row""")
                yield from rel.to_arrow_reader(batch_rows)
        finally:
            self.con.execute("DETACH DATABASE IF EXISTS op_stage")
            for f in (path, path + ".wal"):
                if os.path.exists(f):
                    os.unlink(f)

    def _stage(self, scope: tuple[int, int] | None) -> str:
        """The staged table's name: in a database file of its own in the spill directory (an
        in-memory table cannot leave memory; a file's blocks can)."""
        from .limits import spill_dir
        path = os.path.join(spill_dir(), f"op_events_{id(self)}.duckdb")
        self._stage_path = path
        self.con.execute(f"ATTACH '{path}' AS op_stage")
        # one thread: under MEMORY_LIMIT each thread's pinned blocks add up (two ran out of it)
        threads = self.con.execute("SELECT current_setting('threads')").fetchall()[0][0]
        self.con.execute("SET threads = 1")
        try:
            self._fill(scope)
        finally:
            self.con.execute(f"SET threads = {int(threads)}")
        return "op_stage.op_events"

    def _fill(self, scope: tuple[int, int] | None) -> None:
        self.con.execute(f"""
                CREATE TABLE op_stage.op_events AS
                WITH g AS (SELECT coalesce(rank, -1) AS rank, correlation, sum(e - s) AS ns,
                             sum(CASE WHEN name LIKE '%HtoD%' OR name LIKE '%DtoH%' THEN e - s ELSE 0 END) AS link
                      FROM {self.view} WHERE {self._gpu_where(scope)} AND correlation >= 0
                      GROUP BY ALL)
                SELECT coalesce(v.rank, -1) AS rank, coalesce(pid, -1) AS pid, coalesce(tid, -1) AS tid,
                       s, 0 AS kind, e, {_KEY} AS key, 0::BIGINT AS ns, 0::BIGINT AS link, row
                FROM {self.view} v WHERE category = 'cpu_op'
                UNION ALL
                SELECT coalesce(v.rank, -1), coalesce(pid, -1), coalesce(tid, -1), s, 1, 0, 0::UBIGINT,
                       g.ns::BIGINT, g.link::BIGINT, row
                FROM {self.view} v JOIN g ON coalesce(v.rank, -1) = g.rank AND v.correlation = g.correlation
                WHERE category = 'runtime' AND g.ns > 0
                ORDER BY s""")
