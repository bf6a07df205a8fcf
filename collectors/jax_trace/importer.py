"""JAX profiles, and the Kineto traces given with them, -> a run directory (`counterprof import`).

counterprof/import_trace.py sends an import here when a path given is (or holds) a JAX profile;
the Kineto traces among the paths are converted by the torch importer's own conversion, so a
run may hold both. Each profile file becomes one Parquet file of spans ending with its window
span, written under a temporary name and renamed into spans/rank=<r>/ once every file is
converted (a run never holds half a profile); a profile of which nothing could be read is
named with the reason and the others are imported.

Ranks: a profile's own (a "rank" or "process_index" entry of its metadata, which
jax.profiler's set_metadata writes into the XSpace), else "rankN" in its file name or its log
dir's name, else, when the profiles given come from several processes (hosts, pids) and none
names a rank, their order by (host, pid); else --rank. As for Kineto traces, two files of one
rank over the same time are two processes, and the import stops naming them.
"""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from counterprof import __version__
from counterprof.ground.errors import CounterprofError, os_error
from counterprof.ground.record import record
from counterprof.ground.schema import SPANS_SCHEMA
from counterprof.store import rundir
from counterprof.store.parquet_writer import write_file

from ..torch_trace import importer as kineto
from . import convert


@record
class ImportedProfile(kineto.ImportedTrace):
    """An ImportedTrace (what `counterprof import` reports of each file) of a JAX profile."""

    source: str = "jax"
    host: str | None = None
    fmt: str = ""
    anchor: str = ""

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "source": "jax", "host": self.host, "format": self.fmt,
                "anchor": self.anchor}


def import_traces(jax_files: list[Path], other: list[str | os.PathLike[str]], run: str | os.PathLike[str], *,
                  replace: bool = False, default_rank: int = 0, command: list[str] | None = None,
                  on_trace: Callable[[Any], None] | None = None) -> list[Any]:
    """Convert the JAX profile files and the Kineto traces at `other` (files or directories)
    into the run directory `run`; the ImportedTrace of each, failed ones included."""
    kineto_files = kineto.find_traces(other) if other else []
    profiles = convert.choose_files(list(dict.fromkeys(Path(f).resolve() for f in jax_files)))
    run_path = Path(run)
    existed = run_path.exists()
    run_path = rundir.create(run_path, replace=replace)
    traces: list[Any] = [kineto.ImportedTrace(str(f)) for f in kineto_files]
    mine = [ImportedProfile(str(f)) for f in profiles]
    try:
        for i, trace in enumerate(traces):
            kineto.convert_to_parquet(trace, run_path / f".import-{os.getpid()}-{i}.parquet.tmp",
                                      default_rank, run_path)
            if on_trace is not None:
                on_trace(trace)
        identity: dict[int, tuple[str, int]] = {}
        for i, trace in enumerate(mine, start=len(traces)):
            identity[id(trace)] = _convert(trace, run_path / f".import-{os.getpid()}-{i}.parquet.tmp")
        _ranks(mine, identity, default_rank)
        for trace in mine:
            if on_trace is not None:
                on_trace(trace)
        traces += mine
        kineto._check_ranks(traces)
        if not any(t.tmp for t in traces):
            raise CounterprofError("nothing could be imported" + ("" if on_trace is not None else ": " + "; ".join(
                f"{t.path}: {t.failed}" for t in traces)))
        for i, trace in enumerate(traces):
            if trace.tmp is not None:
                target = rundir.dataset_dir(run_path, "spans", trace.rank) / f"spans-import-{i}.parquet"
                os.replace(trace.tmp, target)
                trace.tmp = None
    except BaseException as exc:
        for trace in [*traces, *mine]:
            if trace.tmp is not None:
                trace.tmp.unlink(missing_ok=True)
        if not existed:
            rundir.abandon(run_path)
        if isinstance(exc, OSError):
            raise os_error(exc, run_path, "importing the profiles",
                           kept="nothing (the part-files were removed)") from None
        raise
    try:
        _write_meta(run_path, traces, command)
    except OSError as exc:
        raise os_error(exc, run_path, "writing meta.json",
                       kept="the converted spans (`counterprof import --force` again once there "
                            "is space)") from None
    return traces


def _convert(trace: ImportedProfile, target: Path) -> tuple[str, int]:
    """One profile into `target` (its spans, then its window span); (host, pid) it came from."""
    t0 = time.perf_counter()
    try:
        done = convert.convert_file(trace.path)
    except convert.JaxProfileError as exc:
        trace.failed = str(exc)
        trace.seconds = time.perf_counter() - t0
        return "", 0
    trace.problems = list(done.problems)
    trace.spans, trace.gpu_spans, trace.events = done.spans, done.device_spans, done.events
    trace.window, trace.host_pid = done.window, done.pid
    trace.rank, trace.rank_source = done.rank, done.rank_source
    trace.host, trace.fmt, trace.anchor = done.host, done.fmt, done.anchor
    if done.table is None:
        trace.failed = "; ".join(done.problems) or "no events"
    else:
        window = done.window_batch()
        trace.spans += 1 if window is not None else 0
        _write(target, done.table, window)
        trace.tmp = target
    trace.seconds = time.perf_counter() - t0
    return done.host or "", done.pid or 0


def _write(target: Path, table: pa.Table, window: pa.RecordBatch | None) -> None:
    # the window span last: its presence says the profile is complete
    write_file(target, SPANS_SCHEMA, [table, *([pa.Table.from_batches([window])] if window is not None else [])],
               row_group_size=kineto.ROW_GROUP_ROWS, compression="zstd", use_dictionary=kineto.DICTIONARY_COLUMNS)


def _ranks(profiles: list[ImportedProfile], identity: dict[int, tuple[str, int]],
           default_rank: int) -> None:
    """Ranks of the profiles that name none: by their process's (host, pid) order when they
    come from several processes and no profile names a rank, else the default."""
    read = [t for t in profiles if not t.failed]
    rankless = [t for t in read if t.rank is None]
    processes = sorted({identity[id(t)] for t in rankless})
    by_order = len(processes) > 1 and len(rankless) == len(read)
    for t in rankless:
        if by_order:
            t.rank = default_rank + processes.index(identity[id(t)])
            host, pid = identity[id(t)]
            t.rank_source = f"order of the processes (host {host or '?'}, pid {pid or '?'})"
        else:
            t.rank, t.rank_source = default_rank, "default"
    for t in profiles:
        if t.failed and t.rank is None:
            t.rank = default_rank


def _write_meta(run_path: Path, traces: list[Any], command: list[str] | None) -> None:
    windows = [t.window for t in traces if t.window and not t.failed]
    start = min((w[0] for w in windows), default=None)
    end = max((w[1] for w in windows), default=None)
    imported = [t for t in traces if not t.failed]
    collectors: dict[str, Any] = {}
    for name, group in (("torch", [t for t in traces if not isinstance(t, ImportedProfile)]),
                        ("jax", [t for t in traces if isinstance(t, ImportedProfile)])):
        if group:
            ok = [t for t in group if not t.failed]
            collectors[name] = {"status": "ok" if ok else "failed",
                                "reason": "" if ok else f"no {'trace' if name == 'torch' else 'profile'} could be read",
                                "config": {"imported": len(ok), "files": len(group)}}
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
        "rank": min((t.rank for t in imported), default=0),
        "traces": [t.to_json() for t in traces],
        "collectors": collectors,
        "warnings": [f"{t.path}: {p}" for t in traces for p in t.problems],
    }
    rundir.write_json(run_path / rundir.META, meta)
    rundir.write_json(run_path / rundir.CATALOG, [])
