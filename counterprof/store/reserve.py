"""The space a session keeps on disk for its last meta.json.

A run fills the disk as it goes (journal segments, traces). At its start a session allocates
RESERVE_BYTES in a file of its own (rundir.RESERVE, beside its meta.json); at its stop it frees
that file first, then writes the workload's exit into the space: a full disk costs samples,
never the exit status (a reader finds the run still "running" and recovers it). A profiler
killed before its stop leaves the file: recovery (counterprof/recover.py) removes it.
"""
from __future__ import annotations

import os
from pathlib import Path

from . import safepath

RESERVE_BYTES = 256 * 1024      # kept for the last meta.json


def keep(path: Path, size: int = RESERVE_BYTES) -> None:
    """Allocate `size` bytes at path, a new file; without them (no space even now, a file system
    without fallocate) nothing is kept, and nothing said."""
    try:
        fd = safepath.create_new(path)   # never fallocate through a link
        try:
            os.posix_fallocate(fd, 0, size)
        finally:
            os.close(fd)
    except OSError:
        pass


def release(path: Path) -> None:
    """Free the space kept at path (none kept: nothing to do)."""
    try:
        path.unlink()
    except OSError:
        pass
