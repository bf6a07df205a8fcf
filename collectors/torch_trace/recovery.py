"""`counterprof recover` for torch traces: convert what a killed profiler left unconverted.

A trace's spans end with its window span (named after the trace file), so a trace file in
a rank's traces/ without a window span of that name was not converted, or was cut off while
being converted. Such a trace is converted again into its own Parquet file; rows a cut-off
conversion had already written are dropped first. They are recognisable without any id: they
come from the trace's process (pid) and lie in its recorded window, and one process's windows
never overlap in time. Each step is safe to repeat: the new file appears (by rename) only after
the old rows are gone, and a trace with its window span is never touched again.

Recovery may run while other processes of the run still convert traces (a rank whose
profiler is alive, `counterprof run`'s collector): each trace is taken through its claim
(claim.py) first, so a trace being converted is left to its converter, and one a live
process converted (its spans possibly still in its journal) is not converted again.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from counterprof.store import rundir, safepath
from counterprof.store.compact import compact_rank
from counterprof.store.journal import read_segment, segments

from .trace_files import TRACE_PATTERNS, rank_of_trace_dir
from .claim import Claim, claim_path
from .convert import CATEGORIES
from .importer import ImportedTrace, convert_to_parquet
from .steps import MARK_CATEGORIES, steps_file_of_trace

_TORCH = pa.array([c for c in CATEGORIES])
# a process that timed its own steps: its step and input rows come from its steps file
# (steps.py), never from a trace, so a cut-off trace's rows to drop are the others
_TRACE_ONLY = pa.array([c for c in CATEGORIES if c not in MARK_CATEGORIES])


def _windows(t: pa.Table) -> list[str]:
    w = t.filter(pc.equal(t["category"].cast(pa.string()), "window"))
    names: list[str] = w["name"].to_pylist()
    return names


def converted_traces(run_path: Path, rank: int | None = None) -> set[tuple[int, str]]:
    """(rank, trace file name) of every trace whose window span is in the run: in its Parquet
    files or in a journal not compacted yet (a live process's, or one that died since). The
    journal is read first: a compaction running meanwhile renames its Parquet file into place
    before deleting the segments, so a span is seen in one or the other."""
    done: set[tuple[int, str]] = set()
    for r, d in rundir.rank_dirs(run_path):
        if rank is not None and r != rank:
            continue
        for s in segments(d):
            if s.table == "spans":
                for b in read_segment(s.path):
                    done.update((r, n) for n in _windows(b.select(["name", "category"])))
        for f in rundir.parquet_files(rundir.table_dir(d, "spans"), "spans"):
            try:
                t = pq.read_table(f, columns=["name", "category"])
            except (pa.ArrowInvalid, OSError):
                continue      # unreadable: readers skip it too, so its traces count as pending
            done.update((r, n) for n in _windows(t))
    return done


def _drop_rows(parquet: Path, pid: int, start: int, end: int, categories: pa.Array = _TORCH) -> int:
    """Rewrite `parquet` without the rows of `categories` of process `pid` inside [start, end]."""
    try:
        f = pq.ParquetFile(parquet)
    except (pa.ArrowInvalid, OSError):
        return 0           # unreadable: readers skip it, so its rows count nowhere
    dropped = 0
    tmp = parquet.with_name(f".{parquet.name}.{os.getpid()}.tmp")     # readers skip dot names
    writer = None
    try:
        for batch in f.iter_batches(batch_size=64 * 1024):
            t0 = pc.cast(batch.column("start"), pa.int64())
            cut = pc.and_(pc.and_(pc.equal(batch.column("pid"), pid),
                                  pc.and_(pc.greater_equal(t0, start), pc.less_equal(t0, end))),
                          pc.is_in(batch.column("category").cast(pa.string()), value_set=categories))
            cut = pc.fill_null(cut, False)
            n = pc.sum(cut).as_py() or 0
            dropped += n
            keep = batch.filter(pc.invert(cut))
            if writer is None:
                safepath.unlink_in_run(tmp)
                safepath.create_private(tmp)
                writer = pq.ParquetWriter(str(tmp), f.schema_arrow, compression="zstd")
            writer.write_batch(keep)
    finally:
        if writer is not None:
            writer.close()
    if dropped:
        os.chmod(tmp, 0o600)
        os.replace(tmp, parquet)
    else:
        tmp.unlink(missing_ok=True)
    return dropped


def recover_traces(run_path: Path) -> list[str]:
    lines = []
    done: set[tuple[int, str]] | None = None
    for tmp in rundir.trace_files(run_path, "*.tmp"):
        lines.append(f"{tmp}: a trace the workload did not finish writing (the process was "
                     "killed while exporting it); left as is")
    for path in rundir.trace_files(run_path, *TRACE_PATTERNS):      # no link followed
        rank = rank_of_trace_dir(path)
        if safepath.is_link(claim_path(path)):     # planted: never truncated or written through
            safepath.skipped_link(claim_path(path))
            continue
        claim = Claim.take_or_skip(path)
        if claim is None:
            lines.append(f"{path.name} (rank {rank}): being converted by another process; "
                         "left to it")
            continue
        with claim:
            if claim.converted_by_live_process():
                continue               # its spans are that process's to compact
            if done is None:
                done = converted_traces(run_path)
            if (rank, path.name) not in done and claim.converted_by is not None:
                # its converter said it converted it, and has died since the first look
                done |= converted_traces(run_path, rank)
            if (rank, path.name) in done:
                continue
            lines.append(_convert(path, rank, claim))
    return lines


def _convert(path: Path, rank: int, claim: Claim) -> str:
    folder = rundir.table_dir(path.parent.parent, "spans")
    rundir.make_dirs(folder, rundir.run_of_rank(path.parent.parent))
    target = folder / f"spans-recovered-{path.name}.parquet"
    staging = target.with_name(f".{target.name}.tmp")
    trace = ImportedTrace(str(path))
    timed = steps_file_of_trace(path)
    convert_to_parquet(trace, staging, rank, path.parent, drop_marks=timed)
    if trace.failed:
        staging.unlink(missing_ok=True)
        return f"{path}: not converted: {trace.failed}"
    dropped = 0
    if trace.window and trace.host_pid is not None:
        part = path.parent.parent
        # one rewriter of a partition's files at a time (two recoveries may run at once)
        lock = safepath.open_lock(part / "traces" / ".recover.lock")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            # a converter that died since the run's compaction left its rows in its journal
            compact_rank(part)
            for f in rundir.parquet_files(folder, "spans"):
                dropped += _drop_rows(f, trace.host_pid, *trace.window,
                                      categories=_TRACE_ONLY if timed else _TORCH)
            os.replace(staging, target)
        finally:
            os.close(lock)
    else:
        os.replace(staging, target)
    claim.mark_converted("recover")
    note = f" (replacing {dropped:,} rows of a cut-off conversion)" if dropped else ""
    return f"converted {path.name}: {trace.spans:,} spans into rank {rank}{note}"
