"""A run as one Perfetto timeline: the export's passes over each rank's files, and its account.

export_run reads the chosen ranks a batch at a time (store/run_files.py: the run's one lister
and damage policy) and writes them with render/perfetto.py's TraceWriter (Chrome-trace JSON)
or render/perfetto_proto.py's ProtoTraceWriter (Perfetto's protobuf format, by the file's
name: see trace_format); what it wrote, cut and left out comes back as an ExportResult, whose
lines() are what the CLI prints.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .analysis.across_ranks import rank_ranges
from .ground.errors import RunDirectoryError
from .store.run_files import RunFile, Window, earliest_ns
from .render.perfetto import PLAN_COLUMNS, SAMPLE_COLUMNS, SPAN_COLUMNS, Counts, TraceWriter

if TYPE_CHECKING:
    from .store.reader import Run

BIG_JSON = 1 << 30      # beyond about this much JSON the browser UI runs out of memory
PROTO_SUFFIXES = (".pftrace", ".perfetto-trace")     # and each with .gz
# a protobuf trace's clock starts this long before the first thing it holds: a delta sample's
# counter point sits at the start of its interval, before its row's time
ORIGIN_MARGIN_NS = 60_000_000_000


def trace_format(out: Path) -> str:
    """"proto" for a name Perfetto's tools give protobuf traces (.pftrace, .perfetto-trace, and
    those with .gz), else "json"."""
    name = out.name.lower().removesuffix(".gz")
    return "proto" if name.endswith(PROTO_SUFFIXES) else "json"


def size_text(n: float) -> str:
    """1234 -> "1.2 KB": small outputs do not read as 0.0 MB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} bytes"


def seconds_text(s: float) -> str:
    return f"{s * 1e3:.0f} ms" if s < 1 else f"{s:.1f} s"


# Counts fields of what the writer left out, and of what it wrote other than as it was
_LEFT_OUT = (
    ("null_values", "{:,} samples with unknown (null) values (a counter track cannot show "
                    "unknown: it holds the previous value)"),
    ("no_duration", "{:,} delta samples without a duration (no rate can be made)"),
    ("not_finite", "{:,} samples whose value, or rate over a zero-length interval, is not finite"))
_WRITTEN_ODDLY = (
    ("out_of_order", "{:,} samples came out of time order within their counter track (several "
                     "writers of one series in a partition?); written as they are: Perfetto sorts them"),
    ("negative_spans", "{:,} spans end before they start: written with duration 0"),
    ("relaned", "{:,} spans overlap another of their thread or stream without nesting in it "
                "(Perfetto would drop them): they are on extra tracks named '... (overlap N)'"),
    ("bad_attrs", "{:,} spans' attrs were not JSON: written as strings"))
_LEFT_OUT_PROTO = (
    ("before_origin", "{:,} spans or samples timed before the trace's clock origin (more than a "
                      "minute before the first row's time: a protobuf trace's times cannot be negative)"),)


@dataclass
class ExportResult:
    """What one export wrote, cut and left out."""

    run_path: Path
    out: Path
    files: dict[int, list[RunFile]]       # every rank of the run, chosen or not
    ranks: list[int]                      # the ranks exported
    ranks_cut: bool                       # --ranks was given
    window: str | None                    # --window as typed (None: the whole run)
    start_ns: int                         # the run's time 0
    span_cut: Window
    sample_cut: Window
    problems: list[str] = field(default_factory=list)
    counts: Counts | None = None          # once written
    elapsed: float = 0.0

    def extent(self) -> tuple[int | None, int | None]:
        """The times of what the export saw, cut or not."""
        los = [x for x in (self.span_cut.lo, self.sample_cut.lo) if x is not None]
        his = [x for x in (self.span_cut.hi, self.sample_cut.hi) if x is not None]
        return (min(los), max(his)) if los else (None, None)

    def _covers(self) -> str:
        lo, hi = self.extent()
        assert lo is not None and hi is not None, "asked once the export saw something"
        return (f"the run covers {(lo - self.start_ns) / 1e9:.3f} to {(hi - self.start_ns) / 1e9:.3f} s "
                "from its start")

    def nothing_message(self) -> str:
        """Why nothing was exported."""
        ranks = rank_ranges(self.ranks)
        if self.window and self.extent()[0] is not None:
            return (f"nothing to export: no span or sample of rank(s) {ranks} lies in --window "
                    f"{self.window} ({self._covers()})")
        why = "; ".join(self.problems) if self.problems else "they hold no rows"
        return f"nothing to export from rank(s) {ranks} of {self.run_path}: {why}"

    def left_out_ranks(self) -> str | None:
        """What --ranks left out, counted from the files' footers."""
        left = [r for r in sorted(self.files) if r not in self.ranks]
        if not self.ranks_cut or not left:
            return None
        rows = {"spans": 0, "samples": 0}
        unknown = 0
        for r in left:
            for p in self.files[r]:
                n = p.rows()
                if n is None:
                    unknown += 1
                else:
                    rows[p.table] += n
        more = f" and {unknown} journal segment(s)" if unknown else ""
        return (f"--ranks left out rank(s) {rank_ranges(left)}: {rows['spans']:,} spans, "
                f"{rows['samples']:,} samples{more}")

    def lines(self) -> list[str]:
        """The export's account, a line each: what was written, cut, and left out."""
        c, out = self.counts, self.out
        assert c is not None, "the account of a written export"
        packed = f", {size_text(out.stat().st_size)} gzip'd" if out.name.endswith(".gz") else ""
        lines = [f"wrote {out}: rank(s) {rank_ranges(self.ranks)}; {c.spans:,} spans on {c.span_tracks} "
                 f"tracks, {c.flows:,} launch→GPU flows, {c.samples:,} samples on {c.counter_tracks} "
                 f"counter tracks; {size_text(c.bytes)} of {c.format}{packed}, in {seconds_text(self.elapsed)}"]
        if self.window:
            lines.append(f"--window {self.window} ({self._covers()}) kept {self.span_cut.kept:,} of "
                         f"{self.span_cut.seen:,} spans (those overlapping it) and {self.sample_cut.kept:,} "
                         f"of {self.sample_cut.seen:,} samples (those timed in it)")
        left = self.left_out_ranks()
        if left:
            lines.append(left)
        lines += self.problems
        notes = [text.format(n) for name, text in _LEFT_OUT + _LEFT_OUT_PROTO if (n := getattr(c, name))]
        if notes:
            lines.append("left out: " + "; ".join(notes))
        lines += [text.format(n) for name, text in _WRITTEN_ODDLY if (n := getattr(c, name))]
        if c.uncataloged:
            lines.append(f"not in the catalog, written as raw values: {', '.join(sorted(c.uncataloged))}")
        if c.format == "JSON" and c.bytes > BIG_JSON:
            lines.append(f"{c.bytes / 1e9:.1f} GB of JSON is more than ui.perfetto.dev loads in a browser "
                         "tab (about 1-2 GB): cut it with --window/--ranks, or open it with Perfetto's "
                         "trace_processor, or write Perfetto's protobuf format (FILE.pftrace: a "
                         "fraction of the bytes)")
        return lines


def export_run(run: Run, files: dict[int, list[RunFile]], ranks: list[int], out: Path, *,
               window_s: tuple[float | None, float | None] = (None, None),
               window: str | None = None, ranks_cut: bool = False, fmt: str | None = None) -> ExportResult:
    """Write ranks of run (files: list_files' answer) to out as a Chrome-trace/Perfetto JSON
    file or (fmt "proto"; None: by out's name, trace_format) a Perfetto protobuf trace, gzip'd
    when its name ends in .gz, keeping what lies in window_s (seconds from the run's start).
    Written to a part-file renamed at the end: a failed export leaves no file."""
    started = time.perf_counter()
    if all(p.rows() == 0 for r in ranks for p in files[r]):
        raise RunDirectoryError(f"{run.path}: rank(s) {rank_ranges(ranks)} hold no samples or spans to export")
    from .store.meta import RunMeta
    start_ns = RunMeta.of(run.meta).start_ns
    if not isinstance(start_ns, int):
        start_ns = earliest_ns([p for ps in files.values() for p in ps]) or 0
    w0, w1 = (None if s is None else start_ns + round(s * 1e9) for s in window_s)
    res = ExportResult(run.path, out, files, ranks, ranks_cut, window, start_ns,
                       Window(w0, w1), Window(w0, w1))
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    # not the command line: it can hold secrets (the run directory is its owner's only)
    other = {"run": str(run.path), "ranks": ranks, "window_s": list(window_s) if window else None}
    fmt = fmt or trace_format(out)
    try:
        if fmt == "proto":
            from .render.perfetto_proto import ProtoTraceWriter
            chosen = [p for r in ranks for p in files[r]]
            first = min(start_ns, earliest_ns(chosen) or start_ns)
            writer: TraceWriter = ProtoTraceWriter(tmp, first - ORIGIN_MARGIN_NS, other, run.catalog,
                                                   gzip=out.name.endswith(".gz"))
        else:
            writer = TraceWriter(tmp, start_ns, other, run.catalog, gzip=out.name.endswith(".gz"))
    except OSError as exc:
        raise RunDirectoryError(f"cannot write {out}: {exc.strerror}") from exc
    try:
        with writer:
            for rank in ranks:
                _write_rank(writer, rank, files[rank], res, (w0, w1))
                res.problems += [m for part in files[rank] for m in part.problems]
            if res.span_cut.kept + res.sample_cut.kept == 0:
                raise RunDirectoryError(res.nothing_message())
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            from .ground.errors import os_error
            raise os_error(exc, out, "writing the Perfetto timeline",
                           kept="nothing (the part-file was removed)") from None
        raise
    os.replace(tmp, out)
    res.counts, res.elapsed = writer.counts, time.perf_counter() - started
    return res


def _write_rank(writer: TraceWriter, rank: int, parts: list[RunFile], res: ExportResult,
                bounds: tuple[int | None, int | None]) -> None:
    spans = [p for p in parts if p.table == "spans"]
    # first pass: flows and nesting need every span of the rank (a few numbers each); where
    # each row group starts among them, for the second pass
    plan = writer.plan(rank)
    starts: dict[tuple[Path, int], int] = {}
    rows: dict[tuple[Path, int], int] = {}
    for part in spans:
        for g, b in part.batches(PLAN_COLUMNS, Window(*bounds)):
            starts.setdefault((part.path, g), plan.rows)
            rows[(part.path, g)] = rows.get((part.path, g), 0) + b.num_rows
            plan.add(b)
    plan.finish()
    for part in spans:
        # a live run's last journal segment grows between the passes: only the rows the first
        # pass planned are written
        written: dict[tuple[Path, int], int] = {}
        for g, b in part.batches(SPAN_COLUMNS, res.span_cut):
            key = (part.path, g)
            done = written.get(key, 0)
            b = b.slice(0, max(0, min(b.num_rows, rows.get(key, 0) - done)))
            if b.num_rows:
                writer.spans(b, rank, plan, starts[key] + done)
                written[key] = done + b.num_rows
    writer.finish_rank(plan)
    del plan
    for part in parts:
        if part.table == "samples":
            for _, b in part.batches(SAMPLE_COLUMNS, res.sample_cut):
                writer.samples(b, rank)
