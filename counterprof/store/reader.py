"""Reading a run back: Run objects over a run directory.

Reading never changes the directory: journal segments that a killed profiler left
are read alongside the Parquet files (tolerating a cut-off tail), so a run is
readable before, during and after `counterprof recover`. Which files and how damage in them is
treated: store/run_files.py, the one lister every reader of a run uses. Runs of the older layout (rank=<r>/
folders holding everything of a rank) read the same (rundir finds their files).
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator

import pyarrow as pa

from ..ground.errors import RunDirectoryError
from ..ground.schema import TABLES
from . import rundir, safepath
from .meta import read_catalog, read_meta
from .run_files import BATCH_ROWS, RunFile, list_files
from .span import Span, run_span
from .rundir import CATALOG, META, RANKS, is_run, rank_dirs


class Run:
    """A run directory: its tables, samples and meta (counterprof.Run adds summary()); nothing
    here writes.

    An unreadable Parquet file or row group (a damaged disk, a partial copy between hosts) stops
    a read with a RunDirectoryError naming it; with skip_unreadable=True it is left out instead
    (store/run_files.py: the file's readable row groups stay) and named in `skipped`, for the
    subcommands that say so and go on."""

    def __init__(self, path: str | os.PathLike[str], skip_unreadable: bool = False):
        self.path = Path(path)
        self.skip_unreadable = skip_unreadable
        self.skipped: list[str] = []          # "path: why", once each
        self.left_out: list[str] = []         # rows outside the run's span: "path: how many"
        self._span: Span | None | bool = False      # not read yet
        self._dirs: tuple[list[int | None], int, dict[int, Path]] | None = None  # (mtimes, listed at, dirs)
        if not self.path.is_dir():
            raise RunDirectoryError(f"{self.path}: no such run directory")
        if not is_run(self.path):
            if safepath.is_link(self.path / META):
                raise safepath.LinkInRun(self.path / META, "not read, so this is not a run to read")
            raise RunDirectoryError(f"{self.path} is not a counterprof run (no {META})")

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r})"

    def _rank_dirs(self) -> dict[int, Path]:
        """rank_dirs(), listed again only when a folder holding them changed (a rank joined a
        live run): asked once per rank, a listing each time was quadratic in the ranks. A
        folder changed within 2 s of the listing is not trusted: a coarse clock (jiffies, FAT,
        NFS) may give a rank's arrival the listing's own mtime."""
        stamp: list[int | None] = []
        for folder in (self.path, self.path / RANKS):
            try:
                stamp.append(folder.stat().st_mtime_ns)
            except OSError:
                stamp.append(None)
        held = self._dirs
        if held is None or held[0] != stamp or any(t is not None and t >= held[1] - 2_000_000_000 for t in stamp):
            held = self._dirs = (stamp, time.time_ns(), dict(rank_dirs(self.path)))
        return held[2]

    @property
    def meta(self) -> dict[str, Any]:
        return read_meta(self.path / META)

    def rank_meta(self, rank: int) -> dict[str, Any]:
        """The meta.json of the process that wrote this rank: its own when it joined another
        process's run (_ranks/rank=<r>/meta.json), else the run's."""
        own = self._rank_dirs().get(rank)
        if own is not None and safepath.plain_file(own / META):
            return read_meta(own / META)
        return self.meta

    @property
    def catalog(self) -> dict[str, dict[str, Any]]:
        """Every metric of the run: the run's catalog and those of ranks that joined it."""
        out: dict[str, dict[str, Any]] = {}
        for path in [self.path / CATALOG] + [d / CATALOG for d in self._rank_dirs().values()]:
            if not safepath.plain_file(path):       # missing, or a link (named)
                continue
            try:
                entries = read_catalog(path)
            except RunDirectoryError as exc:     # the run reads without it: units unknown
                if str(exc) not in self.skipped:
                    self.skipped.append(str(exc))
                continue
            for m in entries:
                out.setdefault(m["name"], m)
        return out

    def ranks(self) -> list[int]:
        return rundir.ranks(self.path)

    @property
    def span(self) -> Span | None:
        """The times the run's rows can hold (store/span.py); rows outside are left out."""
        if isinstance(self._span, bool):       # False: not read yet
            self._span = run_span(self.path)
        return self._span

    def _rank_column(self, with_rank: bool | None) -> bool:
        return len(self.ranks()) > 1 if with_rank is None else with_rank

    def _files(self, name: str, rank: int | None) -> dict[int, list[RunFile]]:
        return list_files(self.path, self.span, name, rank)

    def _read(self, part: RunFile, columns: list[str] | None,
              batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        """A file's batches by the run's one damage policy (store/run_files.py): what it
        leaves out is named in `skipped` and `left_out`, or (strict, the default) stops the
        read with a RunDirectoryError naming the file."""
        seen = 0
        for _g, b in part.batches(columns, batch_rows=batch_rows):
            seen = self._noted(part, seen)
            yield b
        self._noted(part, seen)
        note = part.span_note()
        if note is not None and note not in self.left_out:
            self.left_out.append(note)

    def _noted(self, part: RunFile, seen: int) -> int:
        for d in part.damage[seen:]:
            if not self.skip_unreadable:
                raise RunDirectoryError(f"{d.path} is unreadable ({d.reason}); move it aside to "
                                        "read the rest of the run")
            if not any(w.startswith(f"{d.path}: ") for w in self.skipped):
                self.skipped.append(str(d))
        return len(part.damage)

    def table(self, name: str, rank: int | None = None, with_rank: bool | None = None) -> pa.Table:
        """One of the run's tables (samples, spans), all ranks or one, sorted by time. It has a
        rank column whenever the run has more than one rank (with_rank: always or never)."""
        schema = TABLES[name]
        add = self._rank_column(with_rank)
        parts: list[pa.Table] = []
        for r, files in sorted(self._files(name, rank).items()):
            for part in files:
                batches = list(self._read(part, None))
                if batches:
                    parts.append(_with_rank(_store_types(pa.Table.from_batches(batches), schema), r, add))
                elif not part.journal and not part.damage:      # no rows: its schema still counts
                    # (pyarrow.parquet loads here, as in run_files: a run's summary reads
                    # only the meta and catalog, and pyarrow.fs with ssl is ~20 ms)
                    import pyarrow.parquet as pq
                    empty = pq.ParquetFile(part.path).schema_arrow.empty_table()
                    parts.append(_with_rank(empty, r, add))
        if not parts:
            empty = schema.empty_table()
            return _with_rank(empty, 0, add).slice(0, 0)
        # (not combined first: take() makes the one copy, sorted; a combined copy before it
        # was a third copy of the table at the peak)
        # (promoted: files of one run can differ in nullability, or lack a later column)
        table = pa.concat_tables(parts, promote_options="default").unify_dictionaries()
        sort_key = "time" if "time" in table.column_names else "start"
        import pyarrow.compute as pc     # here only: `run`'s summary opens a Run and must not pay it
        return table.take(pc.sort_indices(table, [(sort_key, "ascending")]))

    def spans_by_rank(self) -> pa.Table:
        """The spans table with a rank column, by rank and then start: each rank's rows one
        slice (analysis.report.rank_tables), as RunQuery.spans(by_rank=True) gives them, by this
        Run's damage policy. Read as a stream and sorted a rank at a time (store.query.rank_ordered):
        the memory is the table's and one rank's; table()'s one sort of the whole held it twice
        (1024 ranks x 1 h: 1.9 GB at the read, against the table's 0.8)."""
        import numpy as np

        from .query import rank_ordered
        schema = TABLES["spans"]
        out = schema.append(pa.field("rank", pa.int32()))

        def rows() -> Iterator[pa.RecordBatch]:
            for r, files in sorted(self._files("spans", None).items()):
                for part in files:
                    for b in self._read(part, schema.names):
                        # one schema for the stream: a file's own types (a plain string for a
                        # dictionary, another time zone) are cast to the store's
                        cols = [c if c.type == f.type else c.cast(f.type) for c, f in zip(b.columns, schema)]
                        yield pa.RecordBatch.from_arrays(
                            [*cols, pa.array(np.full(b.num_rows, r, np.int32))], schema=out)
        table = rank_ordered(pa.RecordBatchReader.from_batches(out, rows()))
        return table.unify_dictionaries()

    def batches(self, name: str, columns: list[str] | None = None, rank: int | None = None,
                batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        """A table's rows in bounded pieces (file order, not time order): for aggregates over
        runs too big to hold in memory."""
        for _r, files in sorted(self._files(name, rank).items()):
            for part in files:
                yield from self._read(part, columns, batch_rows)

    def rank_batches(self, name: str, columns: list[str] | None = None, ranks: list[int] | None = None,
                     batch_rows: int = BATCH_ROWS) -> Callable[[int], Iterator[pa.RecordBatch]]:
        """batches(name, columns, rank=r) as a function of r, for reading ranks one at a time
        (ranks: those that will be asked for; None: every rank). The table's files are listed
        once for every rank, not at each call: a listing walks every rank's folders, so one per
        rank is quadratic in the ranks (~30 s of a 1024-rank run). Each call reads as
        batches(rank=r) would: files as they were listed (a rank whose journal segments were
        compacted away since, in a live run, is listed again first), by the same damage policy.
        With only some of the run's ranks asked for, each call lists its own rank (the others'
        files, a misplaced one among them, are not looked at)."""
        listed: dict[int, list[RunFile]] | None = None
        if ranks is None or set(self.ranks()) <= set(ranks):
            listed = self._files(name, None)

        def of_rank(rank: int) -> Iterator[pa.RecordBatch]:
            parts = None if listed is None else listed.get(rank, [])
            if parts is None or any(p.journal and not os.path.lexists(p.path) for p in parts):
                parts = self._files(name, rank).get(rank, [])
            for p in parts:       # a fresh RunFile each call: what it records is this read's
                yield from self._read(RunFile(p.rank, p.table, p.path, p.journal, p.span), columns,
                                      batch_rows)
        return of_rank

    def samples(self, rank: int | None = None, with_rank: bool | None = None) -> pa.Table:
        """Every sample (samples schema), time-ordered, with the partition's rank as a column
        whenever the run has more than one rank (with_rank: always or never)."""
        return self.table("samples", rank, with_rank)


def _store_types(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """table with each column the store's schema knows cast to the store's type: a file's own
    (a plain string for a dictionary, another time zone: written by another version or tool)
    would not concatenate with the others."""
    for i, f in enumerate(table.schema):
        j = schema.get_field_index(f.name)
        if j >= 0 and f.type != schema.field(j).type:
            table = table.set_column(i, f.name, table.column(i).cast(schema.field(j).type))
    return table


def _with_rank(table: pa.Table, rank: int, add: bool) -> pa.Table:
    if not add:
        return table
    return table.append_column("rank", pa.array([rank] * table.num_rows, pa.int32()))


def load(path: str | os.PathLike[str]) -> Run:
    return Run(path)
