"""The files of a run's tables: listed in one place, read with one damage policy.

Every reader of a run's rows (store.reader.Run, store.query.RunQuery, export.py)
lists them here and reads them by these rules, so that one damaged run reads the same way in
every subcommand.

What is listed (rundir and journal find the names): each rank's Parquet files of a table
(<table>-*.parquet in its dataset folder, or in the rank folder of the older layout: one per
writer, and the parts compacted while the run went on, <table>-<writer>~<seq>.parquet) and the
journal segments a live or killed writer left (not one whose part is already there). Not
listed: a symbolic link (skipped and named, safepath), a hidden or temporary name (.<file>.tmp:
a compaction still writing it), a segment kept aside as <segment>.damaged after compaction (its
readable rows are in the Parquet file).

The damage policy: what cannot be read is left out and named, the rest is read.
  - a Parquet file whose footer cannot be read: the file is left out;
  - a row group that fails to decode: that row group is left out, the file's others are read;
  - a journal segment: read up to where a killed writer cut it off, its damaged batches left
    out (journal.read_segment);
  - rows with times outside the run's span (store/span.py): left out and counted (a row
    group whose statistics prove every row inside is not looked at row by row).
Each is recorded on its RunFile (`damage`, `out_of_span`); a caller that must not go on with
less (Run's default) turns the first damage into an error instead of a warning.
"""
from __future__ import annotations

import os
from dataclasses import field
from pathlib import Path
from typing import Any
from collections.abc import Iterator
from .meta import RunMeta
from counterprof.ground.record import record

BATCH_ROWS = 64 * 1024


def read_errors() -> tuple[type[BaseException], ...]:
    """What reading damaged Parquet bytes raises (pyarrow, imported late)."""
    import pyarrow as pa
    return (pa.ArrowException, OSError, ValueError, IndexError)


@record(frozen=True)
class Damage:
    """What of one file could not be read: the whole file (group None) or one row group."""

    path: Path
    reason: str                 # the error's first line
    group: int | None = None    # 0-based
    groups: int = 0

    def __str__(self) -> str:       # "path: why", the form the readers' warnings take
        where = "" if self.group is None else f"row group {self.group + 1} of {self.groups}: "
        return f"{self.path}: {where}{self.reason}"

    def sentence(self) -> str:
        """The same, saying what was left out."""
        if self.group is None:
            return f"{self.path} is unreadable ({self.reason}): left out"
        return (f"{self.path}: row group {self.group + 1} of {self.groups} is unreadable "
                f"({self.reason}): its rows are left out, the file's others are not")


def _starved(exc: BaseException) -> bool:
    """Arrow failed for want of memory or threads (a `ulimit -v`, a cgroup), not for the bytes
    it read: such a file is not damaged, and the command stops as memory running out."""
    text = str(exc)
    return ("Failed to launch worker thread" in text or "std::bad_alloc" in text
            or "Cannot allocate memory" in text or "Out of memory" in text)


def _reason(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]


@record
class RunFile:
    """One file of a rank's table: a Parquet file, or a journal segment not yet compacted."""

    rank: int
    table: str
    path: Path
    journal: bool = False
    span: Any = None             # store.span.Span: rows outside it are left out
    damage: list[Damage] = field(default_factory=list)
    out_of_span: int = 0         # rows left out for their times

    @property
    def unreadable(self) -> bool:
        """Not even its footer could be read."""
        return any(d.group is None for d in self.damage)

    def _bad(self, exc: BaseException, group: int | None = None, groups: int = 0) -> None:
        if _starved(exc):       # the process's limits, not the file: no damage to record
            raise MemoryError(_reason(exc)) from None
        self.damage.append(Damage(self.path, _reason(exc), group, groups))

    def span_note(self) -> str | None:
        """The warning naming the rows left out for their times (None: none were)."""
        if not self.out_of_span:
            return None
        from .span import left_out
        return left_out(str(self.path), self.out_of_span, self.span)

    @property
    def problems(self) -> list[str]:
        """Every warning about this file, as sentences."""
        note = self.span_note()
        return [d.sentence() for d in self.damage] + ([note] if note else [])

    def footer(self) -> Any:
        """The Parquet file's metadata; None (and the file's damage recorded) when it cannot
        be read. A journal segment has none."""
        if self.journal or self.unreadable:
            return None
        import pyarrow.parquet as pq
        try:
            return pq.read_metadata(self.path)
        except read_errors() as exc:
            self._bad(exc)
            return None

    def rows(self) -> int | None:
        """Row count without reading the rows (None when the file cannot say)."""
        if self.journal:
            return None
        import pyarrow.parquet as pq
        try:
            return int(pq.ParquetFile(self.path).metadata.num_rows)
        except Exception:
            return None

    def batches(self, columns: list[str] | None = None, window: Window | None = None,
                batch_rows: int = BATCH_ROWS, validate: bool = False) -> Iterator[tuple[int, Any]]:
        """(row group, batch) for the file's rows inside the run's span (and the window), by
        the damage policy above. columns: exactly these, missing ones as nulls (None: the
        file's own). Row groups whose statistics put them outside the window are not read.
        validate: also leave out a row group that decodes into batches Arrow's kernels would
        crash on (a file another reader found damaged)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        from ..ground.schema import TABLES
        from .journal import batch_problem, read_segment
        from .span import TIME_COLUMNS
        if self.unreadable:
            return
        schema = TABLES[self.table]
        first, last = ("time", "time") if self.table == "samples" else ("start", "end")
        need = None if columns is None else list(dict.fromkeys(
            columns + [first, last] + list(TIME_COLUMNS.get(self.table, ()))))

        def shaped(b: Any, proven: str | None = None) -> Any:
            if self.span is not None:
                b, dropped = self.span.keep(self.table, b, proven)
                self.out_of_span += dropped
            if window is not None:
                b = window.filter(b, first, last)
            if columns is None:
                return b
            return pa.RecordBatch.from_arrays(
                [b.column(c) if c in b.schema.names else pa.nulls(b.num_rows, schema.field(c).type)
                 for c in columns], columns)

        if self.journal:      # a segment a killed writer cut off ends early; read_segment says so
            for b in read_segment(self.path):
                yield 0, shaped(b)
            return
        errors = read_errors()
        try:
            f = pq.ParquetFile(self.path, pre_buffer=False)
            md, arrow = f.metadata, f.schema_arrow
            have = set(arrow.names)
            groups = (window or Window()).row_groups(md, first, last)
        except errors as exc:
            self._bad(exc)
            return
        bad = {d.group for d in self.damage}
        read = None if need is None else [c for c in need if c in have]
        for g in groups:
            if g in bad:
                continue
            # a row group whose statistics put every row inside the span is not masked row by
            # row (~10% of reading a run whose rows all are)
            proven = None if self.span is None else self.span.proven(self.table, md, g, arrow)
            try:     # one row group at a time: a damaged one costs only its own rows
                for b in f.iter_batches(batch_size=batch_rows, row_groups=[g], columns=read):
                    problem = batch_problem(b) if validate else ""
                    if problem:
                        raise ValueError(problem)
                    yield g, shaped(b, proven)
            except errors as exc:
                self._bad(exc, g, md.num_row_groups)


# -- a file in the wrong table's folder ------------------------------------------------------

_SCHEMA_CACHE: dict[tuple[str, int, int], tuple[tuple[str, str], ...] | None] = {}


def _kind(t: Any) -> str:
    """A column type as the readers see it: a time, an integer, a float, a string (dictionary
    or not), or the type itself."""
    import pyarrow as pa
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_timestamp(t):
        return "time"
    if pa.types.is_integer(t):
        return "integer"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    return str(t)


def _file_columns(path: Path) -> tuple[tuple[str, str], ...] | None:
    """(name, kind) of every column of the Parquet file, from its footer alone; None when the
    footer cannot be read (the damage policy names that file as it is read). Cached by path,
    size and mtime: a command lists a run's files several times."""
    import pyarrow.parquet as pq
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _SCHEMA_CACHE:
        try:
            schema = pq.read_schema(path)
            _SCHEMA_CACHE[key] = tuple((f.name, _kind(f.type)) for f in schema)
        except Exception:      # damaged, unreadable: the readers' damage policy says so
            _SCHEMA_CACHE[key] = None
    return _SCHEMA_CACHE[key]


def schema_problem(columns: tuple[tuple[str, str], ...], table: str) -> str:
    """Why a file with these (name, kind) columns is not a file of table ("" when it is): a
    column the table requires (not nullable) is missing, or one of the table's columns has
    another type. Columns the table does not know are let be (readers select by name)."""
    from ..ground.schema import TABLES
    have = dict(columns)
    want = TABLES[table]
    missing = [f.name for f in want if not f.nullable and f.name not in have]
    if missing:
        return f"it has no {', '.join(missing)} column{'s' if len(missing) > 1 else ''}"
    for f in want:
        if f.name in have and have[f.name] != _kind(f.type):
            return f"its {f.name} column holds {have[f.name]}s, not {_kind(f.type)}s"
    return ""


def misplaced(path: Path, table: str) -> str:
    """The warning naming a Parquet file in table's folder that is not a file of table ("" when
    it is one, or when its footer cannot be read: then the damage policy names it)."""
    from ..ground.schema import TABLES
    columns = _file_columns(path)
    if columns is None:
        return ""
    problem = schema_problem(columns, table)
    if not problem:
        return ""
    other = [t for t in TABLES if t != table and not schema_problem(columns, t)]
    where = Path(path).parent
    if other:
        what = (f"it is a {other[0]} file: if it belongs to this run, move it to "
                f"{where.parent.parent / other[0] / where.name}/ (as {other[0]}-<name>.parquet)")
    else:
        what = f"its columns: {', '.join(n for n, _ in columns[:12])}; move it out of the run"
    return (f"{path} is not a {table} file ({problem}): left out, not read, exported, merged or "
            f"added to a history; {what}")


def table_parquet(run_path: str | os.PathLike[str], table: str,
                  rank: int | None = None) -> list[tuple[int, Path]]:
    """(rank, Parquet file) of one table, every rank or one (rundir.table_files), less the files
    whose schema is not the table's: each is named (once, to safepath's sink) and left out. What
    every reader and `merge` take a table's files from."""
    from . import safepath
    from .rundir import table_files
    out = []
    for r, f in table_files(Path(run_path), table, rank):
        why = misplaced(f, table)
        if why:
            safepath.skipped_file(f, why)
        else:
            out.append((r, f))
    return out


def list_files(run_path: str | os.PathLike[str], span: Any = None, table: str | None = None,
               rank: int | None = None) -> dict[int, list[RunFile]]:
    """Every file of the run's tables (or one table's; every rank or one), per rank: its
    Parquet files, then its journal segments. Every rank of the run is a key, the ranks with
    no file too."""
    from .compact import part_path
    from .journal import segments
    from .rundir import TABLE_NAMES, rank_dirs, ranks
    run_path = Path(run_path)
    out: dict[int, list[RunFile]] = {r: [] for r in ranks(run_path) if rank is None or r == rank}
    journals = [(r, d) for r, d in rank_dirs(run_path) if rank is None or r == rank]
    for name in TABLE_NAMES if table is None else (table,):
        # segments first, then the Parquet files: a segment compacted in between is found in
        # both (and read once, from its part), never in neither
        segs = [(r, d, s) for r, d in journals for s in segments(d) if s.table == name]
        parquet = table_parquet(run_path, name, rank)   # a misplaced file named, left out
        have = {f for _r, f in parquet}
        for r, f in parquet:
            out.setdefault(r, []).append(RunFile(r, name, f, span=span))
        for r, d, s in segs:
            if part_path(d, s) not in have:      # a part holds it: its rows are read there
                out.setdefault(r, []).append(RunFile(r, name, s.path, journal=True, span=span))
    return out


def earliest_ns(files: list[RunFile]) -> int | None:
    """The first timestamp in these files: Parquet statistics where the files have them."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    first = []
    for part in files:
        key = "time" if part.table == "samples" else "start"
        try:
            if part.journal:
                first += [pc.min(b.column(0).cast("int64")).as_py()
                          for _, b in part.batches([key])]
                continue
            md = pq.ParquetFile(part.path).metadata
            i = md.schema.to_arrow_schema().get_field_index(key)
            for g in range(md.num_row_groups):
                st = md.row_group(g).column(i).statistics
                if st is not None and st.has_min_max:
                    first.append(st.min_raw)
                else:        # no statistics: read the column
                    t = pq.ParquetFile(part.path).read_row_group(g, columns=[key])
                    first.append(pc.min(t.column(0).cast("int64")).as_py())
        except Exception:     # unreadable: its reader names it
            continue
    return min((v for v in first if v is not None), default=None)


@record
class Window:
    """A time window in epoch ns (either side None: open), and what it kept of what it saw."""

    w0: int | None = None
    w1: int | None = None
    seen: int = 0
    kept: int = 0
    lo: int | None = None          # the extent of what was seen
    hi: int | None = None

    def _saw(self, lo: int | None, hi: int | None, rows: int, kept: int) -> None:
        self.seen += rows
        self.kept += kept
        if lo is not None and hi is not None:
            self.lo = lo if self.lo is None else min(self.lo, lo)
            self.hi = hi if self.hi is None else max(self.hi, hi)

    def _outside(self, lo: int, hi: int) -> bool:
        return (self.w0 is not None and hi < self.w0) or (self.w1 is not None and lo > self.w1)

    def row_groups(self, md: Any, first: str, last: str) -> list[int]:
        """The row groups that may hold rows in the window (all, without statistics)."""
        every = list(range(md.num_row_groups))
        if self.w0 is None and self.w1 is None:
            return every
        names = md.schema.to_arrow_schema().names
        if first not in names or last not in names:
            return every
        i, j = names.index(first), names.index(last)
        keep = []
        for g in every:
            rg = md.row_group(g)
            a, b = rg.column(i).statistics, rg.column(j).statistics
            if a is None or b is None or not (a.has_min_max and b.has_min_max):
                keep.append(g)
            elif self._outside(a.min_raw, b.max_raw):
                self._saw(a.min_raw, b.max_raw, rg.num_rows, 0)
            else:
                keep.append(g)
        return keep

    def filter(self, batch: Any, first: str, last: str) -> Any:
        """Spans that overlap the window, samples timed in it (bounds included)."""
        import pyarrow.compute as pc
        if self.w0 is None and self.w1 is None:
            self._saw(None, None, batch.num_rows, batch.num_rows)
            return batch
        a = batch.column(first).cast("int64")
        b = batch.column(last).cast("int64") if last != first else a
        lo, hi = pc.min(a).as_py(), pc.max(b).as_py()
        keep = None
        if self.w0 is not None:
            keep = pc.greater_equal(b, self.w0)
        if self.w1 is not None:
            k = pc.less_equal(a, self.w1)
            keep = k if keep is None else pc.and_(keep, k)
        kept = batch.filter(keep)
        self._saw(lo, hi, batch.num_rows, kept.num_rows)
        return kept


def nothing_recorded(run: Any, meta: RunMeta | dict[str, Any], what: str, spans: int = 0, unreadable: int = 0) -> str:
    """Why a run holds nothing to `what` (judge, export), as meta.json tells it: collectors
    that were unavailable or failed, ones that ran but stopped before their first batch (a
    profiler killed at once), or spans of kinds the verdict does not read (imported cpu_op)."""
    if unreadable and not spans:
        return (f"{run.path} holds nothing readable to {what}: its {unreadable} file(s) with "
                "data are unreadable (named above); restore them from a copy")
    if unreadable:       # the spans alone (steps, regions) have no samples to judge them by
        return (f"{run.path} holds {spans:,} spans but no readable samples to {what} them by: "
                f"{unreadable} file(s) are unreadable (named above); restore them from a copy "
                "(`counterprof export --perfetto` shows the spans)")
    if spans:
        return (f"{run.path} holds {spans:,} spans but none that the verdict reads (GPU kernels, "
                "steps, regions, collectives or DataLoader waits) and no samples: nothing to "
                f"{what}; `counterprof export --perfetto` shows the spans")
    m = RunMeta.of(meta)
    ran = sorted(n for n, c in m.collectors.items() if c.ok)
    if ran:
        return (f"{run.path} holds no samples or spans to {what}: {', '.join(ran)} ran but the "
                f"profiler stopped (status {m.status}) before any wrote its first batch "
                "(each writes at least once a second): profile for longer")
    if not m.collectors:
        return f"{run.path} holds no samples or spans to {what}"
    return (f"{run.path} holds no samples or spans to {what}: every collector was unavailable or "
            "failed (see `counterprof list` and meta.json's collectors)")
