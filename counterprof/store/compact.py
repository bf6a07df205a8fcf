"""Compaction: journal segments -> Parquet files, per table and writer.

A rank's journal (<run>/_ranks/rank=<r>/journal/) becomes Parquet files in the table's dataset,
<run>/<table>/rank=<r>/ (rundir.table_dir; beside the journal in a run of the older layout):
  - <table>-<writer>~<seq>.parquet, a part: one rotated segment, compacted while the run goes
    on (BackgroundCompactor, fed by the journal's rotations), so that the end of a run has
    only the open segments left, however long the run;
  - <table>-<writer>.parquet: every segment no part holds, compacted at the end of the run (or
    by `counterprof recover`).
Every reader lists <table>-*.parquet (rundir.parquet_files), so it reads both.

Streams segment by segment and writes row groups of bounded size, so memory does
not grow with the run. Safe to repeat and safe to interrupt: a Parquet file is
written under a temporary name and renamed, and its segments are deleted only after; a
segment whose part exists is already compacted (compacted(): readers skip it, the next
compaction deletes it), so no row is read twice.
"""
from __future__ import annotations

import fcntl
import os
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import field
from itertools import groupby
from pathlib import Path

import pyarrow as pa

from ..ground.errors import CounterprofError, RunDirectoryError, os_error
from ..ground.threadname import name_os_thread
from . import safepath
from .journal import Segment, SegmentRead, read_segment, segments
from .liveness import journal_writer_alive, profiler_elsewhere
from .meta import read_meta
from .parquet_writer import open_parquet
from .rundir import JOURNAL, META, make_dirs, rank_dirs, run_of_rank, table_dir
from counterprof.ground.record import record

# Readers decode a whole row group at a time: 64k rows keeps that to a few MB.
ROW_GROUP_ROWS = 64 * 1024


@record
class CompactionReport:
    files: list[Path] = field(default_factory=list)
    rows: int = 0
    segments: int = 0
    truncated: list[str] = field(default_factory=list)   # "segment: what was wrong"
    damaged: list[str] = field(default_factory=list)     # "segment: N batches left out (why)"
    live: list[str] = field(default_factory=list)        # writers still running: left alone


def parquet_name(table: str, writer: str) -> str:
    return f"{table}-{writer}.parquet"


def part_name(table: str, writer: str, seq: int) -> str:
    """The part holding exactly segment seq (a writer id holds no "~": the segment names'
    separator)."""
    return f"{table}-{writer}~{seq:06d}.parquet"


def part_path(rank_path: Path, seg: Segment) -> Path:
    return table_dir(rank_path, seg.table) / part_name(seg.table, seg.writer, seg.seq)


def compacted(rank_path: Path, seg: Segment) -> bool:
    """Is this segment's part in place (a compaction died between the part's rename and the
    segment's unlink)? Its rows are the part's: a reader must not read them twice."""
    return safepath.plain_file(part_path(rank_path, seg), report=False)


def _written_elsewhere(rank_path: Path) -> str | None:
    """The host, when the partition's own meta.json (a rank that joined the run) says a
    profiler on another host is still writing it (liveness.profiler_elsewhere)."""
    try:
        meta = read_meta(Path(rank_path) / META)
    except RunDirectoryError:
        return None
    return profiler_elsewhere(meta)


def compact_rank(rank_path: Path, report: CompactionReport | None = None, *,
                 force: bool = False) -> CompactionReport:
    """Compact the segments of every writer that is not still running (force: a partition
    another host's profiler says it writes too; `recover --force`)."""
    report = report if report is not None else CompactionReport()
    if not force and (host := _written_elsewhere(rank_path)) is not None:
        report.live.append(f"{Path(rank_path).name} (written on {host})")
        return report
    # Two compactions of one partition (two readers recovering a killed run, ranks of one job
    # stopping together) would write into one file: one at a time.
    with _partition_lock(Path(rank_path)):
        return _compact(Path(rank_path), report)


def compact_run(run: Path, report: CompactionReport, warn: Callable[[str], None]) -> bool:
    """The end of a session: compact every partition of the run (its own, and those the
    workload's processes wrote: regions, traces) into report, each problem said through warn;
    False when one could not be (a full disk: its journal stays whole)."""
    complete = True
    for _rank, rank_path in rank_dirs(run):
        try:
            compact_rank(rank_path, report)
        except CounterprofError as exc:       # a full disk: the journal stays whole
            warn(str(exc))
            complete = False
    for problem in report.truncated:
        warn(f"journal damaged: {problem}")
    for problem in report.damaged:
        warn(f"journal damaged: {problem}")
    return complete


@contextmanager
def _partition_lock(rank_path: Path) -> Iterator[None]:
    lock = safepath.open_lock(rank_path / LOCK)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
    finally:
        os.close(lock)


def compact_segment(rank_path: Path, seg: Segment, report: CompactionReport | None = None
                    ) -> CompactionReport:
    """Compact one closed segment into its part (the session's own, while it still writes
    others): what BackgroundCompactor does at each rotation."""
    report = report if report is not None else CompactionReport()
    rank_path = Path(rank_path)
    with _partition_lock(rank_path):
        target = part_path(rank_path, seg)
        if safepath.plain_file(target, report=False):
            seg.path.unlink(missing_ok=True)
        elif safepath.plain_file(seg.path, report=False):
            _write_parquet(rank_path, seg.table, [seg], target, report)
    return report


LOCK = ".compact.lock"
DAMAGED = ".damaged"      # a segment with damaged batches, once compacted (no reader reads it)


def _compact(rank_path: Path, report: CompactionReport) -> CompactionReport:
    segs = segments(rank_path)
    for (table, writer), grouped in groupby(segs, key=lambda s: (s.table, s.writer)):
        group = list(grouped)
        if journal_writer_alive(writer):
            report.live.append(writer)
            continue
        folder = table_dir(rank_path, table)
        rest = []
        for s in group:
            safepath.unlink_in_run(folder / f".{part_path(rank_path, s).name}.tmp")   # a killed part's
            if compacted(rank_path, s):         # its part was renamed in, the unlink never came
                s.path.unlink(missing_ok=True)
            else:
                rest.append(s)
        if not rest:
            continue
        target = folder / parquet_name(table, writer)
        if safepath.plain_file(target):
            # An earlier compaction renamed its file but died before deleting segments.
            for s in rest:
                s.path.unlink(missing_ok=True)
            continue
        _write_parquet(rank_path, table, rest, target, report)
    journal = Path(rank_path) / JOURNAL
    try:
        journal.rmdir()
    except OSError:
        pass
    return report


def _write_parquet(rank_path: Path, table: str, group: list[Segment], target: Path,
                   report: CompactionReport) -> None:
    """Stream these segments (of one table and writer) into target, then delete them."""
    folder = target.parent
    tmp = folder / f".{target.name}.tmp"            # dataset readers skip dot names
    writer_obj = None
    pending: list[pa.RecordBatch] = []
    pending_rows = 0

    def flush() -> None:
        nonlocal writer_obj, pending, pending_rows
        if not pending:
            return
        table_obj = pa.Table.from_batches(pending).unify_dictionaries()
        if writer_obj is None:
            make_dirs(folder, run_of_rank(rank_path))
            safepath.unlink_in_run(tmp)          # a killed compaction's (one at a time)
            safepath.create_private(tmp)         # 0600 before a byte is in it; no link
            writer_obj = open_parquet(tmp, table_obj.schema, compression="zstd")
        writer_obj.write_table(table_obj)
        report.rows += table_obj.num_rows
        pending, pending_rows = [], 0

    damaged: list[Path] = []
    try:
        for s in group:
            seg_report = SegmentRead()
            for batch in read_segment(s.path, seg_report):
                pending.append(batch)
                pending_rows += batch.num_rows
                if pending_rows >= ROW_GROUP_ROWS:
                    flush()
            if seg_report.truncated:
                report.truncated.append(f"{s.path.name}: {seg_report.error}")
            if seg_report.damaged:
                report.damaged.append(f"{s.path.name}: {seg_report.damaged} damaged batch(es) "
                                      f"left out ({seg_report.damage}); the segment is kept "
                                      f"as {s.path.name}{DAMAGED}")
                damaged.append(s.path)
            report.segments += 1
        flush()
        if writer_obj is not None:
            writer_obj.close()
    except BaseException as exc:
        # a full disk mid-file: the segments stay (nothing is lost), the part-file goes
        if writer_obj is not None:
            try:
                writer_obj.close()
            except Exception:
                pass
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise os_error(exc, folder, "compacting the journal into Parquet",
                           kept=f"every journal segment in {Path(rank_path) / JOURNAL} (`counterprof "
                                "recover` compacts them once there is space)") from None
        raise
    if writer_obj is not None:
        os.chmod(tmp, 0o600)
        os.replace(tmp, target)
        report.files.append(target)
    for s in group:
        if s.path in damaged:      # its good batches are in the Parquet file; kept to look at
            os.replace(s.path, s.path.with_name(s.path.name + DAMAGED))
        else:
            s.path.unlink(missing_ok=True)


class BackgroundCompactor:
    """Compacts the session's rotated segments into parts while the run goes on, one at a
    time on a thread of its own at low priority (never a collector's thread: submit() only
    queues). Its CPU is the same per segment however long the run, spent as the run goes; what
    it has not reached when the run stops is left to the end's compaction (compact_rank), so
    stopping never waits for a queue. A failure (a full disk) stops it: the segments stay,
    and the end's compaction (or recover) says why."""

    NICE = 10

    def __init__(self) -> None:
        self.report = CompactionReport()
        self.failed: str | None = None
        self._queue: queue.SimpleQueue[tuple[Path, Segment] | None] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="counterprof-compact", daemon=True)
        self._thread.start()
        # its native id (a profiler thread: counting collectors of an in-process session leave
        # it out), known once it runs
        self.native_id: int = self._thread.native_id or 0     # set once start() returns

    def submit(self, rank_path: Path, seg: Segment) -> None:
        self._queue.put((Path(rank_path), seg))

    def stop(self) -> CompactionReport:
        """Finish the segment in hand, leave the rest queued; what it did."""
        self._stopping.set()
        self._queue.put(None)
        self._thread.join()
        return self.report

    def _run(self) -> None:
        name_os_thread("counterprof-compact")
        try:      # this thread only (Linux: a thread's nice is its own)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.NICE)
        except (OSError, AttributeError):
            pass
        while not self._stopping.is_set():
            item = self._queue.get()
            if item is None or self._stopping.is_set():
                return
            try:
                compact_segment(item[0], item[1], self.report)
            except Exception as exc:     # the segment stays whole for the end's compaction
                self.failed = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                return
