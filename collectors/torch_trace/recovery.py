"""`counterprof recover` for torch traces: convert what a killed profiler left unconverted.

A trace's spans end with its window span (named after the trace file), so a trace file in
rank=<r>/traces/ without a window span of that name was not converted, or was cut off while
being converted. Such a trace is converted again into its own Parquet file; rows a cut-off
conversion had already written are dropped first. They are recognisable without any id: they
come from the trace's process (pid) and lie in its recorded window, and one process's windows
never overlap in time. Each step is safe to repeat: the new file appears (by rename) only after
the old rows are gone, and a trace with its window span is never touched again.
"""
from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from counterprof.store import rundir

from . import TRACE_GLOBS, rank_of_trace_dir
from .convert import CATEGORIES
from .importer import ImportedTrace, convert_to_parquet

_TORCH = pa.array([c for c in CATEGORIES])


def converted_traces(run_path: Path) -> set[tuple[int, str]]:
    """(rank, trace file name) of every trace whose window span is in the run."""
    done = set()
    for rank, d in rundir.rank_dirs(run_path):
        for f in d.glob("spans-*.parquet"):
            t = pq.read_table(f, columns=["name", "category"])
            w = t.filter(pc.equal(t["category"].cast(pa.string()), "window"))
            done.update((rank, n) for n in w["name"].to_pylist())
    return done


def _drop_rows(parquet: Path, pid: int, start: int, end: int) -> int:
    """Rewrite `parquet` without the torch rows of process `pid` inside [start, end]."""
    f = pq.ParquetFile(parquet)
    dropped = 0
    tmp = parquet.with_name(parquet.name + ".tmp")
    writer = None
    try:
        for batch in f.iter_batches(batch_size=64 * 1024):
            t0 = pc.cast(batch.column("start"), pa.int64())
            cut = pc.and_(pc.and_(pc.equal(batch.column("pid"), pid),
                                  pc.and_(pc.greater_equal(t0, start), pc.less_equal(t0, end))),
                          pc.is_in(batch.column("category").cast(pa.string()), value_set=_TORCH))
            cut = pc.fill_null(cut, False)
            n = pc.sum(cut).as_py() or 0
            dropped += n
            keep = batch.filter(pc.invert(cut))
            if writer is None:
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
    done = converted_traces(run_path)
    for tmp in run_path.glob("rank=*/traces/*.tmp"):
        lines.append(f"{tmp}: a trace the workload did not finish writing (the process was "
                     "killed while exporting it); left as is")
    for path in sorted(p for g in TRACE_GLOBS for p in run_path.glob(g)):
        rank = rank_of_trace_dir(path)
        if (rank, path.name) in done:
            continue
        target = path.parent.parent / f"spans-recovered-{path.name}.parquet"
        staging = target.with_name(target.name + ".tmp")
        trace = ImportedTrace(str(path))
        convert_to_parquet(trace, staging, rank, path.parent)
        if trace.failed:
            staging.unlink(missing_ok=True)
            lines.append(f"{path}: not converted: {trace.failed}")
            continue
        dropped = 0
        if trace.window and trace.host_pid is not None:
            for f in path.parent.parent.glob("spans-*.parquet"):
                dropped += _drop_rows(f, trace.host_pid, *trace.window)
        os.replace(staging, target)
        note = f" (replacing {dropped:,} rows of a cut-off conversion)" if dropped else ""
        lines.append(f"converted {path.name}: {trace.spans:,} spans into rank {rank}{note}")
    return lines
