"""Compaction: journal segments -> one Parquet file per table and writer.

A rank's journal (<run>/_ranks/rank=<r>/journal/) becomes one file per table and writer in the
table's dataset, <run>/<table>/rank=<r>/<table>-<writer>.parquet (rundir.table_dir; beside the
journal in a run of the older layout).

Streams segment by segment and writes row groups of bounded size, so memory does
not grow with the run. Safe to repeat and safe to interrupt: the Parquet file is
written under a temporary name and renamed, and segments are deleted only after.
"""
from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import RunDirectoryError, os_error
from . import safepath
from .journal import SegmentRead, read_segment, segments
from .liveness import journal_writer_alive, profiler_elsewhere
from .meta import read_meta
from .rundir import JOURNAL, META, make_dirs, run_of_rank, table_dir

# Readers decode a whole row group at a time: 64k rows keeps that to a few MB.
ROW_GROUP_ROWS = 64 * 1024


@dataclass
class CompactionReport:
    files: list[Path] = field(default_factory=list)
    rows: int = 0
    segments: int = 0
    truncated: list[str] = field(default_factory=list)   # "segment: what was wrong"
    damaged: list[str] = field(default_factory=list)     # "segment: N batches left out (why)"
    live: list[str] = field(default_factory=list)        # writers still running: left alone


def parquet_name(table: str, writer: str) -> str:
    return f"{table}-{writer}.parquet"


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
    lock = safepath.open_lock(Path(rank_path) / LOCK)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _compact(Path(rank_path), report)
    finally:
        os.close(lock)


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
        target = folder / parquet_name(table, writer)
        if safepath.plain_file(target):
            # An earlier compaction renamed its file but died before deleting segments.
            for s in group:
                s.path.unlink(missing_ok=True)
            continue
        tmp = folder / f".{target.name}.tmp"            # dataset readers skip dot names
        writer_obj = None
        pending: list[pa.RecordBatch] = []
        pending_rows = 0

        def flush(folder: Path = folder, tmp: Path = tmp) -> None:     # this table's, bound now
            nonlocal writer_obj, pending, pending_rows
            if not pending:
                return
            table_obj = pa.Table.from_batches(pending).unify_dictionaries()
            if writer_obj is None:
                make_dirs(folder, run_of_rank(rank_path))
                safepath.unlink_in_run(tmp)          # a killed compaction's (one at a time)
                safepath.create_private(tmp)         # 0600 before a byte is in it; no link
                writer_obj = pq.ParquetWriter(str(tmp), table_obj.schema, compression="zstd")
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
    journal = Path(rank_path) / JOURNAL
    try:
        journal.rmdir()
    except OSError:
        pass
    return report
