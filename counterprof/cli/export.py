"""counterprof export RUN --perfetto out.json.gz: the whole run as one timeline.

    counterprof export RUN --perfetto out.json.gz [--window START:END] [--ranks 0,1,4-7]

Every rank's spans (GPU kernels per device and stream, CPU ops per thread, annotations,
regions, steps, collectives, trace windows) and every sample series as counter tracks, on the
run's one clock, in a Chrome-trace JSON file (gzip'd when the name ends in .gz) that
ui.perfetto.dev opens. --window keeps what lies in START:END seconds from the run's start
(either side may be left out, not both: 30: or :10), --ranks keeps the ranks listed. The run is
read and written a batch at a time: memory does not grow with its size. FILE may not lie inside
the run directory.
"""
from __future__ import annotations

import argparse
import bisect
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from .common import (ArgumentParser, UsageFailure, err, guarded, nothing_recorded, open_run,
                     use_system_allocator)
from ..analysis.ranks import rank_ranges

BATCH_ROWS = 64 * 1024
BIG_JSON = 1 << 30      # beyond about this much JSON the browser UI runs out of memory


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="counterprof export", description=__doc__.split("\n\n")[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("run", help="run directory")
    p.add_argument("--perfetto", required=True, metavar="FILE",
                   help="write a Chrome-trace/Perfetto JSON file (gzip'd when FILE ends in .gz)")
    p.add_argument("--window", metavar="START:END",
                   help="only what lies in this window, in seconds from the run's start")
    p.add_argument("--ranks", metavar="LIST", help="only these ranks, e.g. 0,1 or 0-3,8")
    return p


def main(argv: list[str]) -> int:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # numpy's BLAS threads: never used here
    use_system_allocator()
    return guarded(lambda: _main(argv))


_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_DIGITS = re.compile(r"[0-9]+")
MAX_WINDOW_S = 1e9      # ~31 years: beyond it a bound no longer fits the run's int64 ns clock


def parse_window(text: str | None, usage: str) -> tuple[float | None, float | None]:
    """START:END in seconds, either side (not both) left out. Plain decimal numbers only: what
    float() also takes (1_0, inf, nan) is refused."""
    if text is None:
        return None, None
    lo, sep, hi = text.partition(":")
    lo, hi = lo.strip(), hi.strip()
    if not sep or not (lo or hi) or any(v and not _NUMBER.fullmatch(v) for v in (lo, hi)):
        raise UsageFailure(f"--window {text}: expected START:END in seconds, e.g. 10:20, 10: or :20",
                           usage)
    start = float(lo) if lo else None
    end = float(hi) if hi else None
    if any(v is not None and abs(v) > MAX_WINDOW_S for v in (start, end)):
        raise UsageFailure(f"--window {text}: a bound beyond {MAX_WINDOW_S:.0e} seconds is no time in a run",
                           usage)
    if start is not None and end is not None and end <= start:
        raise UsageFailure(f"--window {text}: END must be after START", usage)
    return start, end


Ranks = list[tuple[int, int]]      # --ranks as inclusive (lo, hi) ranges, never expanded


def parse_ranks(text: str | None, usage: str) -> Ranks | None:
    """--ranks 0,1,4-7 -> [(0, 1), (4, 7)]: sorted, overlapping and adjacent ranges joined.
    A range stays two numbers however wide (0-999999999 costs nothing)."""
    if text is None:
        return None
    pairs = []
    for item in text.split(","):
        lo, sep, hi = item.strip().partition("-")
        if not _DIGITS.fullmatch(lo.strip()) or (sep and not _DIGITS.fullmatch(hi.strip())):
            raise UsageFailure(f"--ranks {text}: expected ranks like 0,1 or 0-3,8", usage)
        a = int(lo)
        b = int(hi) if sep else a
        if b < a:
            raise UsageFailure(f"--ranks {text}: {item.strip()} is not a rank or a range of ranks",
                               usage)
        pairs.append((a, b))
    out: Ranks = []
    for a, b in sorted(pairs):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def in_ranks(rank: int, wanted: Ranks) -> bool:
    i = bisect.bisect_right(wanted, (rank, float("inf"))) - 1
    return i >= 0 and wanted[i][0] <= rank <= wanted[i][1]


def not_in_run(wanted: Ranks, have: list[int]) -> Ranks:
    """The parts of the wanted ranges that name no rank of the run (`have`, sorted)."""
    out: Ranks = []
    for a, b in wanted:
        at = a
        for r in have[bisect.bisect_left(have, a):bisect.bisect_right(have, b)]:
            if r > at:
                out.append((at, r - 1))
            at = r + 1
        if at <= b:
            out.append((at, b))
    return out


def real_path(path: Path) -> Path:
    """The path with every symlink resolved (as far as it exists); absolute where a loop of
    symlinks makes that impossible."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return Path(os.path.abspath(path))


def refuse_inside(out: Path, run_dir: Path, usage: str) -> None:
    """--perfetto must not write into the run it reads (it would replace the run's files)."""
    target, run_dir = real_path(out), real_path(run_dir)
    if target == run_dir or run_dir in target.parents:
        raise UsageFailure(f"--perfetto {out} is inside the run directory {run_dir}: writing there "
                           "would replace the run's files; name a file outside it", usage)


def size_text(n: float) -> str:
    """1234 -> "1.2 KB": small outputs do not read as 0.0 MB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} bytes"


def seconds_text(s: float) -> str:
    return f"{s * 1e3:.0f} ms" if s < 1 else f"{s:.1f} s"


@dataclass
class Part:
    """One file of a rank's table: a Parquet file, or a journal segment not yet compacted.
    What cannot be read of it is skipped, one row group at a time, and said in `problems`."""

    rank: int
    table: str
    path: Path
    journal: bool = False
    span: Any = None             # store.span.Span: rows outside it are left out

    def __post_init__(self):
        self.problems: list[str] = []
        self.out_of_span = 0
        self.unreadable = False              # not even its footer
        self.bad_groups: set[int] = set()

    def rows(self) -> int | None:
        """Row count without reading the rows (None when the file cannot say)."""
        if self.journal:
            return None
        import pyarrow.parquet as pq
        try:
            return pq.ParquetFile(self.path).metadata.num_rows
        except Exception:
            return None

    def _bad(self, exc: Exception, group: int | None = None, groups: int = 0) -> None:
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        if group is None:
            self.unreadable = True
            self.problems.append(f"{self.path} is unreadable ({reason}): left out")
        else:
            self.bad_groups.add(group)
            self.problems.append(f"{self.path}: row group {group + 1} of {groups} is unreadable "
                                 f"({reason}): its rows are left out, the file's others are not")

    def batches(self, columns: list[str], window: "Window") -> Iterator:
        """(row group, batch) for the part's rows in the window, with exactly `columns`
        (missing ones as nulls). Row groups whose statistics put them outside the window are
        not read; those found unreadable (now or before) are skipped."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        from ..schema import TABLES
        from ..store.journal import read_segment
        if self.unreadable:
            return
        schema = TABLES[self.table]
        first, last = ("time", "time") if self.table == "samples" else ("start", "end")
        need = columns + [c for c in (first, last) if c not in columns]

        def shaped(b):
            if self.span is not None:
                b, dropped = self.span.keep(self.table, b)
                if dropped:
                    self.out_of_span += dropped
                    from ..store.span import left_out
                    note = left_out(str(self.path), self.out_of_span, self.span)
                    self.problems = [p for p in self.problems if "outside the run's span" not in p]
                    self.problems.append(note)
            b = window.filter(b, first, last)
            return pa.RecordBatch.from_arrays(
                [b.column(c) if c in b.schema.names else pa.nulls(b.num_rows, schema.field(c).type)
                 for c in columns], columns)

        if self.journal:      # a segment a killed writer cut off ends early; read_segment says so
            for b in read_segment(self.path):
                yield 0, shaped(b)
            return
        errors = (pa.ArrowException, OSError, ValueError)
        try:
            f = pq.ParquetFile(self.path, pre_buffer=False)
            have = set(f.schema_arrow.names)
            groups = window.row_groups(f.metadata, first, last)
        except errors as exc:
            self._bad(exc)
            return
        for g in groups:
            if g in self.bad_groups:
                continue
            try:     # one row group at a time: a damaged one costs only its own rows
                for b in f.iter_batches(batch_size=BATCH_ROWS, row_groups=[g],
                                        columns=[c for c in need if c in have]):
                    yield g, shaped(b)
            except errors as exc:
                self._bad(exc, g, f.metadata.num_row_groups)


def list_parts(run) -> dict[int, list[Part]]:
    from ..store.journal import segments
    from ..store.rundir import rank_dirs, ranks, table_files
    out: dict[int, list[Part]] = {r: [] for r in ranks(run.path)}
    journals = dict(rank_dirs(run.path))
    for table in ("spans", "samples"):
        for rank, f in table_files(run.path, table):
            out[rank].append(Part(rank, table, f, span=run.span))
        for rank, d in journals.items():
            out[rank] += [Part(rank, table, s.path, journal=True, span=run.span)
                          for s in segments(d) if s.table == table]
    return out


def earliest_ns(parts: list[Part]) -> int | None:
    """The first timestamp in the run: Parquet statistics where the files have them."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    first = []
    for part in parts:
        key = "time" if part.table == "samples" else "start"
        try:
            if part.journal:
                first += [pc.min(b.column(0).cast("int64")).as_py()
                          for _, b in part.batches([key], Window())]
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
        except Exception:     # unreadable: reported when it is exported
            continue
    return min((v for v in first if v is not None), default=None)


@dataclass
class Window:
    """--window in epoch ns (either side None: open), and what it kept of what it saw."""

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

    def row_groups(self, md, first: str, last: str) -> list[int]:
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

    def filter(self, batch, first: str, last: str):
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


def _main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    usage = parser.format_usage()
    w_start, w_end = parse_window(args.window, usage)
    wanted = parse_ranks(args.ranks, usage)

    from ..errors import RunDirectoryError
    from ..render.perfetto import PLAN_COLUMNS, SAMPLE_COLUMNS, SPAN_COLUMNS, TraceWriter

    started = time.perf_counter()
    run = open_run(args.run)
    meta = run.meta
    parts = list_parts(run)
    if not any(parts.values()):
        raise RunDirectoryError(nothing_recorded(run, meta, "export"))
    ranks = sorted(parts)
    if wanted is not None:
        missing = not_in_run(wanted, ranks)
        ranks = [r for r in ranks if in_ranks(r, wanted)]
        if not ranks:
            raise UsageFailure(f"--ranks {args.ranks}: the run has rank(s) {rank_ranges(sorted(parts))} only",
                               usage)
        if missing:
            err(f"--ranks: the run has no rank(s) {rank_ranges(missing)}; exporting the others")
    chosen = [p for r in ranks for p in parts[r]]
    if all(p.rows() == 0 for p in chosen):
        raise RunDirectoryError(f"{run.path}: rank(s) {rank_ranges(ranks)} hold no samples or spans to export")

    start_ns = meta.get("start_ns")
    if not isinstance(start_ns, int):
        start_ns = earliest_ns([p for ps in parts.values() for p in ps]) or 0
    w0 = None if w_start is None else start_ns + round(w_start * 1e9)
    w1 = None if w_end is None else start_ns + round(w_end * 1e9)

    out = Path(args.perfetto)
    refuse_inside(out, run.path, usage)
    if out.is_dir():
        raise UsageFailure(f"--perfetto {out} is a directory; name a file, e.g. {out}/trace.json.gz", usage)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    # not the command line: it can hold secrets (the run directory is its owner's only)
    other = {"run": str(run.path), "ranks": ranks,
             "window_s": [w_start, w_end] if args.window else None}
    problems: list[str] = []
    span_cut, sample_cut = Window(w0, w1), Window(w0, w1)
    try:
        writer = TraceWriter(tmp, start_ns, other, run.catalog, gzip=out.name.endswith(".gz"))
    except OSError as exc:
        raise RunDirectoryError(f"cannot write {out}: {exc.strerror}") from exc
    try:
        with writer:
            for rank in ranks:
                spans = [p for p in parts[rank] if p.table == "spans"]
                # first pass: flows and nesting need every span of the rank (a few numbers
                # each); where each row group starts among them, for the second pass
                plan = writer.plan(rank)
                starts, rows = {}, {}
                for part in spans:
                    for g, b in part.batches(PLAN_COLUMNS, Window(w0, w1)):
                        starts.setdefault((part.path, g), plan.rows)
                        rows[(part.path, g)] = rows.get((part.path, g), 0) + b.num_rows
                        plan.add(b)
                plan.finish()
                for part in spans:
                    # a live run's last journal segment grows between the passes: only the
                    # rows the first pass planned are written
                    written: dict = {}
                    for g, b in part.batches(SPAN_COLUMNS, span_cut):
                        key = (part.path, g)
                        done = written.get(key, 0)
                        b = b.slice(0, max(0, min(b.num_rows, rows.get(key, 0) - done)))
                        if b.num_rows:
                            writer.spans(b, rank, plan, starts[key] + done)
                            written[key] = done + b.num_rows
                del plan
                for part in parts[rank]:
                    if part.table == "samples":
                        for _, b in part.batches(SAMPLE_COLUMNS, sample_cut):
                            writer.samples(b, rank)
                problems += [m for part in parts[rank] for m in part.problems]
            if span_cut.kept + sample_cut.kept == 0:
                raise RunDirectoryError(_nothing_message(run, ranks, args.window, start_ns,
                                                         span_cut, sample_cut, problems))
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            from ..errors import os_error
            raise os_error(exc, out, "writing the Perfetto timeline",
                           kept="nothing (the part-file was removed)") from None
        raise
    os.replace(tmp, out)
    _summary(out, writer.counts, ranks, parts, wanted, args.window, start_ns, span_cut, sample_cut,
             problems, time.perf_counter() - started)
    return 0


def _extent(span_cut: Window, sample_cut: Window) -> tuple[int | None, int | None]:
    los = [x for x in (span_cut.lo, sample_cut.lo) if x is not None]
    his = [x for x in (span_cut.hi, sample_cut.hi) if x is not None]
    return (min(los), max(his)) if los else (None, None)


def _nothing_message(run, ranks, window, start_ns, span_cut, sample_cut, problems) -> str:
    lo, hi = _extent(span_cut, sample_cut)
    if window and lo is not None:
        return (f"nothing to export: no span or sample of rank(s) {rank_ranges(ranks)} lies in --window "
                f"{window} (the run covers {(lo - start_ns) / 1e9:.3f} to {(hi - start_ns) / 1e9:.3f} s "
                "from its start)")
    why = "; ".join(problems) if problems else "they hold no rows"
    return f"nothing to export from rank(s) {rank_ranges(ranks)} of {run.path}: {why}"


def _summary(out, c, ranks, parts, wanted, window, start_ns, span_cut, sample_cut, problems,
             elapsed) -> None:
    size = out.stat().st_size
    packed = f", {size_text(size)} gzip'd" if out.name.endswith(".gz") else ""
    err(f"wrote {out}: rank(s) {rank_ranges(ranks)}; {c.spans:,} spans on {c.span_tracks} tracks, "
        f"{c.flows:,} launch→GPU flows, {c.samples:,} samples on {c.counter_tracks} counter tracks; "
        f"{size_text(c.bytes)} of JSON{packed}, in {seconds_text(elapsed)}")
    if window:
        lo, hi = _extent(span_cut, sample_cut)
        err(f"--window {window} (the run covers {(lo - start_ns) / 1e9:.3f} to "
            f"{(hi - start_ns) / 1e9:.3f} s from its start) kept {span_cut.kept:,} of "
            f"{span_cut.seen:,} spans (those overlapping it) and {sample_cut.kept:,} of "
            f"{sample_cut.seen:,} samples (those timed in it)")
    if wanted is not None:
        left = [r for r in sorted(parts) if r not in ranks]
        if left:
            rows = {"spans": 0, "samples": 0}
            unknown = 0
            for r in left:
                for p in parts[r]:
                    n = p.rows()
                    if n is None:
                        unknown += 1
                    else:
                        rows[p.table] += n
            more = f" and {unknown} journal segment(s)" if unknown else ""
            err(f"--ranks left out rank(s) {rank_ranges(left)}: {rows['spans']:,} spans, "
                f"{rows['samples']:,} samples{more}")
    for p in problems:
        err(p)
    notes = []
    if c.null_values:
        notes.append(f"{c.null_values:,} samples with unknown (null) values (a counter track "
                     "cannot show unknown: it holds the previous value)")
    if c.no_duration:
        notes.append(f"{c.no_duration:,} delta samples without a duration (no rate can be made)")
    if c.not_finite:
        notes.append(f"{c.not_finite:,} samples whose value, or rate over a zero-length interval, "
                     "is not finite")
    if notes:
        err("left out: " + "; ".join(notes))
    if c.out_of_order:
        err(f"{c.out_of_order:,} samples came out of time order within their counter track "
            "(several writers of one series in a partition?); written as they are: Perfetto sorts them")
    if c.negative_spans:
        err(f"{c.negative_spans:,} spans end before they start: written with duration 0")
    if c.relaned:
        err(f"{c.relaned:,} spans overlap another of their thread or stream without nesting in it "
            "(Perfetto would drop them): they are on extra tracks named '... (overlap N)'")
    if c.bad_attrs:
        err(f"{c.bad_attrs:,} spans' attrs were not JSON: written as strings")
    if c.uncataloged:
        err(f"not in the catalog, written as raw values: {', '.join(sorted(c.uncataloged))}")
    if c.bytes > BIG_JSON:
        err(f"{c.bytes / 1e9:.1f} GB of JSON is more than ui.perfetto.dev loads in a browser tab "
            "(about 1-2 GB): cut it with --window/--ranks, or open it with Perfetto's "
            "trace_processor")
