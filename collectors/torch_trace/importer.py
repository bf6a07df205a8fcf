"""Existing torch profiler traces -> a run directory (`counterprof import`).

Each trace file is converted in a stream into one Parquet file of spans, written under a
temporary name and renamed into spans/rank=<r>/ once complete, so a run never holds half a trace.
The rank comes from the trace (distributedInfo.rank), else the file name (rank3, rank_3, ...),
else `default_rank`. Several files may share a rank when their recorded windows do not overlap
in time (one process's successive windows); two files claiming one rank over the same time are
two processes, and the import stops with a message naming them.
"""
from __future__ import annotations

import os
import stat
import sys
import time
from dataclasses import field
from pathlib import Path
from typing import Any
from collections.abc import Callable

import pyarrow as pa

from counterprof import __version__
from counterprof.ground.errors import CounterprofError, RunDirectoryError, UsageError, os_error
from counterprof.ground.schema import SPANS_SCHEMA
from counterprof.store import rundir, safepath
from counterprof.store.parquet_writer import open_parquet

from .convert import TraceConversion
from .scan import TraceFileError
from counterprof.ground.record import record

SUFFIXES = (".json", ".json.gz")
ROW_GROUP_ROWS = 32 * 1024
# dictionary pages for the columns that repeat; the times and correlation ids are distinct per
# span, where a dictionary only costs (Arrow's default dictionary-encodes every column: the
# writes took 1.6x as long for a file 1.7x the size)
DICTIONARY_COLUMNS = ["name", "category", "kernel_class", "device", "stream", "pid", "tid",
                      "collective", "group_size", "attrs"]


@record
class ImportedTrace:
    path: str
    rank: int | None = None
    rank_source: str = ""
    spans: int = 0
    gpu_spans: int = 0
    events: int = 0
    window: tuple[int, int] | None = None     # epoch ns of the recorded window
    host_pid: int | None = None
    problems: list[str] = field(default_factory=list)
    failed: str = ""                           # why nothing could be read
    seconds: float = 0.0
    tmp: Path | None = None

    def to_json(self) -> dict[str, Any]:
        return {"file": self.path, "rank": self.rank, "rank_source": self.rank_source,
                "events": self.events, "spans": self.spans, "gpu_spans": self.gpu_spans,
                "window_ns": list(self.window) if self.window else None,
                "problems": self.problems, "failed": self.failed or None}


def find_traces(paths: list[str | os.PathLike[str]]) -> list[Path]:
    """Files as given, and the trace files (*.json, *.json.gz) under directories."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found += sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(SUFFIXES)
                            and not f.name.startswith("."))
        elif p.exists():
            kind = _special_kind(p)
            if kind is not None:      # a pipe would block the open and cannot be re-read
                raise UsageError(f"{p}: not a regular file ({kind}); save the trace to a file "
                                 "and import that")
            found.append(p)
        else:
            raise UsageError(f"{p}: no such file or directory")
    if not found:
        raise UsageError(f"no trace files (*.json, *.json.gz) in {', '.join(map(str, paths))}")
    unique = list(dict.fromkeys(f.resolve() for f in found))
    return unique


def _special_kind(path: Path) -> str | None:
    """What a path that is neither a directory nor a regular file is (links followed)."""
    mode = path.stat().st_mode
    for test, kind in ((stat.S_ISFIFO, "a pipe"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return None


class _ParquetSink:
    """The spans of one trace as one Parquet file, row group by row group."""

    def __init__(self, target: Path):
        self.target = target
        self.writer: Any = None        # _parquet_writer's, once the first batch comes

    def write(self, batches: list[pa.RecordBatch]) -> None:
        if self.writer is None:
            safepath.unlink_in_run(self.target)      # a temporary name of ours (or a planted link)
            safepath.create_private(self.target)     # 0600 from its first byte
            self.writer = _parquet_writer(self.target)
        self.writer.write_table(pa.Table.from_batches(batches, schema=SPANS_SCHEMA),
                                row_group_size=ROW_GROUP_ROWS)

    def close(self) -> bool:
        """True when a file was written."""
        if self.writer is None:
            return False
        writer, self.writer = self.writer, None
        writer.close()
        return True

    def discard(self) -> None:
        """After a failure (a full disk): no part-file stays behind to block a rerun."""
        try:
            self.close()
        except Exception:
            pass
        self.target.unlink(missing_ok=True)


def _parquet_writer(target: Path) -> Any:
    """A Parquet writer of spans into target (write_table, close): pyarrow.parquet's defaults
    but for the dictionaries."""
    return open_parquet(target, SPANS_SCHEMA, compression="zstd", use_dictionary=DICTIONARY_COLUMNS)


def convert_to_parquet(trace: ImportedTrace, target: Path, default_rank: int,
                       spill_dir: Path, drop_marks: bool = False) -> None:
    """Convert one file into `target` (Parquet, row groups of up to ROW_GROUP_ROWS spans);
    drop_marks: as TraceConversion's."""
    t0 = time.perf_counter()
    conv = TraceConversion(trace.path, default_rank=default_rank, spill_dir=spill_dir,
                           drop_marks=drop_marks, scan_ahead=True)
    sink = _ParquetSink(target)
    pending: list[pa.RecordBatch] = []
    rows = 0
    window = None
    try:
        try:
            for batch in conv:
                if batch.num_rows == 1 and batch.column(3)[0].as_py() == "window":
                    window = (batch.column(0)[0].value, batch.column(1)[0].value)
                pending.append(batch)
                rows += batch.num_rows
                if rows >= ROW_GROUP_ROWS:
                    sink.write(pending)
                    pending, rows = [], 0
            if pending:
                sink.write(pending)
        except TraceFileError as exc:
            trace.failed = str(exc)
        written = sink.close()
    except BaseException:
        sink.discard()
        raise
    trace.rank, trace.rank_source = conv.rank, conv.rank_source
    trace.spans, trace.gpu_spans, trace.events = conv.spans, conv.gpu_spans, conv.scanner.events
    trace.problems = list(conv.problems)
    trace.window = window
    trace.host_pid = conv.host_pid
    trace.seconds = time.perf_counter() - t0
    if not written and not trace.failed:
        trace.failed = "; ".join(trace.problems) or "no events"
    if written:
        os.chmod(target, 0o600)
        trace.tmp = target


def import_traces(paths: list[str | os.PathLike[str]], run: str | os.PathLike[str], *, replace: bool = False,
                  default_rank: int = 0, command: list[str] | None = None,
                  on_trace: Callable[[ImportedTrace], None] | None = None,
                  file_ranks: dict[str, int] | None = None) -> list[ImportedTrace]:
    """Convert `paths` (files or directories) into the run directory `run`. file_ranks: a
    file's rank where the trace names none (path as given -> rank), else default_rank."""
    files = find_traces(paths)
    run_path = Path(run)
    existed = run_path.exists()
    run_path = rundir.create(run_path, replace=replace)
    traces = [ImportedTrace(str(f)) for f in files]
    try:
        for i, trace in enumerate(traces):
            convert_to_parquet(trace, run_path / f".import-{os.getpid()}-{i}.parquet.tmp",
                               (file_ranks or {}).get(trace.path, default_rank), run_path)
            if on_trace is not None:
                on_trace(trace)
        _check_ranks(traces)
        if not any(t.tmp for t in traces):
            # each file's reason was said as it was read (on_trace); without that, say them here
            raise CounterprofError("nothing could be imported" + ("" if on_trace is not None else ": " + "; ".join(
                f"{t.path}: {t.failed}" for t in traces)))
        for i, trace in enumerate(traces):
            if trace.tmp is not None:
                assert trace.rank is not None     # converted: its rank is known
                target = rundir.dataset_dir(run_path, "spans", trace.rank) / f"spans-import-{i}.parquet"
                os.replace(trace.tmp, target)
                trace.tmp = None
    except BaseException as exc:
        for trace in traces:
            if trace.tmp is not None:
                trace.tmp.unlink(missing_ok=True)
        if not existed:
            rundir.abandon(run_path)
        if isinstance(exc, OSError):
            raise os_error(exc, run_path, "importing the traces",
                           kept="nothing (the part-files were removed)") from None
        raise
    try:
        _write_meta(run_path, traces, command)
    except OSError as exc:
        raise os_error(exc, run_path, "writing meta.json",
                       kept="the converted spans (`counterprof import --force` again once there "
                            "is space)") from None
    return traces


def _check_ranks(traces: list[ImportedTrace]) -> None:
    by_rank: dict[int, list[ImportedTrace]] = {}
    for t in traces:
        if t.tmp is not None:
            assert t.rank is not None             # converted: its rank is known
            by_rank.setdefault(t.rank, []).append(t)
    clashes = []
    for rank, group in sorted(by_rank.items()):
        group = sorted(group, key=lambda t: t.window or (0, 0))
        for a, b in zip(group, group[1:]):
            if a.window is None or b.window is None or b.window[0] < a.window[1]:
                clashes.append(f"rank {rank}: {a.path} and {b.path} (rank from "
                               f"{a.rank_source} and {b.rank_source}) cover the same time")
    if clashes:
        raise CounterprofError(
            "two traces claim the same rank at the same time (two processes): "
            + "; ".join(clashes) + ". Import them into separate runs, or give files without "
            "rank information a rank with --rank")


def _write_meta(run_path: Path, traces: list[ImportedTrace], command: list[str] | None) -> None:
    windows = [t.window for t in traces if t.window]
    start = min((w[0] for w in windows), default=None)
    end = max((w[1] for w in windows), default=None)
    imported = [t for t in traces if not t.failed]
    meta = {
        "id": run_path.name,
        "counterprof_version": __version__,
        "status": "complete",
        "source": "import",
        "command": command,
        "argv": list(sys.argv),
        "cwd": os.getcwd(),
        "start_ns": start,
        "end_ns": end,
        "duration_ns": end - start if start is not None and end is not None else None,
        "rank": min((t.rank for t in imported if t.rank is not None), default=0),   # (each has one)
        "traces": [t.to_json() for t in traces],
        "collectors": {"torch": {"status": "ok" if imported else "failed",
                                 "reason": "" if imported else "no trace could be read",
                                 "config": {"imported": len(imported), "files": len(traces)}}},
        "warnings": [f"{t.path}: {p}" for t in traces for p in t.problems],
    }
    rundir.write_json(run_path / rundir.META, meta)
    rundir.write_json(run_path / rundir.CATALOG, [])


def check_run_target(run: str | os.PathLike[str], replace: bool) -> None:
    """Refuse early (before converting anything) what rundir.create would refuse."""
    p = Path(run)
    if p.exists() and rundir.is_run(p) and not replace:
        raise RunDirectoryError(rundir.already_holds_a_run(p, rundir.CLI_WORDS))
