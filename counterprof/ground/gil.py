"""The profiler's own start and stop, quick in a process whose other threads hold the GIL.

A thread that gives the GIL up (for a read, a stat, a lock, a C call) waits to take it back
until the thread running Python code is asked to drop it, every switch interval (5 ms by
default). Starting or stopping a run takes the GIL back thousands of times (imports, files,
threads, Arrow calls), so beside one busy Python thread (a data loader's, a spinning worker's)
`profile()` took 9.9 s to start (0.7 s warm) and 1.5 s to stop; with 0.2 ms handoffs, 1.0 s
(0.09 s warm) and 0.07 s (tests/integration/test_perf_counts.py runs beside such a thread)."""
from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

QUICK_SWITCH_S = 0.0002


@contextmanager
def quick_handoffs() -> Iterator[None]:
    """Within it, the GIL changes hands every 0.2 ms at most; the process's own setting after."""
    before = sys.getswitchinterval()
    if before <= QUICK_SWITCH_S:
        yield
        return
    sys.setswitchinterval(QUICK_SWITCH_S)
    ours = sys.getswitchinterval()          # as CPython stores it (whole µs), not QUICK_SWITCH_S
    try:
        yield
    finally:
        if sys.getswitchinterval() == ours:                 # unless the workload set its own meanwhile
            sys.setswitchinterval(before)
