"""Finishing a run a killed profiler left: compact its journal, mark it recovered."""
from __future__ import annotations

import os
import socket
from pathlib import Path

from ..errors import RunDirectoryError
from ..proctree import pid_alive
from . import rundir
from .compact import CompactionReport, compact_rank


def writer_alive(meta: dict) -> bool:
    """Is the profiler that writes this run still running (on this host)?"""
    prof = meta.get("profiler") or {}
    pid = prof.get("pid")
    if meta.get("status") != "running" or prof.get("host") != socket.gethostname():
        return False
    if not isinstance(pid, int) or pid <= 0:
        return False
    return pid_alive(pid)


def recover(path: str | os.PathLike, force: bool = False) -> CompactionReport:
    """Compact every partition's journal; safe to repeat and to interrupt."""
    path = Path(path)
    meta = rundir.read_json(path / rundir.META)
    if writer_alive(meta) and not force:
        raise RunDirectoryError(
            f"{path} is still being written by counterprof (pid {meta['profiler']['pid']}); "
            "stop it first, or pass --force")
    report = CompactionReport()
    for _rank, d in rundir.rank_dirs(path):
        compact_rank(d, report)
    for _rank, d in rundir.rank_dirs(path):      # ranks that joined the run keep their own meta
        own = d / rundir.META
        if own.exists():
            rank_meta = rundir.read_json(own)
            if rank_meta.get("status") == "running" and not writer_alive(rank_meta):
                rank_meta["status"] = "recovered"
                rundir.write_json(own, rank_meta)
    if meta.get("status") == "running":
        meta["status"] = "recovered"
        meta.setdefault("warnings", []).append(
            "the profiler stopped without finishing; the journal was compacted by "
            "`counterprof recover` (at most the last second before it died is missing)")
        rundir.write_json(path / rundir.META, meta)
    return report


def needs_recovery(meta: dict) -> bool:
    return meta.get("status") == "running" and not writer_alive(meta)
