"""Where a run keeps its torch traces: the file names torch.profiler's exports get, and the rank
a trace belongs to (from its folder, `[_ranks/]rank=<r>/traces/<file>`). Read by the collector
and by recovery alike, so neither imports the other for them."""
from __future__ import annotations

from pathlib import Path

from counterprof.store import rundir

TRACE_PATTERNS = ("*.pt.trace.json", "*.pt.trace.json.gz")


def rank_of_trace_dir(path: Path) -> int:
    return rundir.rank_of_dir(path.parent.parent)        # [_ranks/]rank=<r>/traces/<file>
