"""Who converts a trace file: one process at a time, and each trace once.

Several processes may find the same trace in a run: the torch collector of `counterprof run`
(every rank's traces), the in-process collector of each rank's counterprof.profile(), and the
recovery that `counterprof recover` / `report` / `export` / `compare` run on a run a killed
profiler left. Before converting, a process takes the trace's claim: an exclusive flock on
`traces/.<trace>.claim` (created next to the trace, never removed). The lock is held for the
conversion only and dies with its process, so a profiler killed mid-conversion leaves the trace
claimable (recovery then replaces the rows it had written). After converting, the holder
writes into the claim who converted it (host, pid): a later claimant reads that and leaves the
trace alone; recovery does so while that converter still runs (its spans may still be in its
journal), and otherwise trusts only the trace's window span in the run.

The trace file itself is never renamed: it stays where README and Perfetto users expect it.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
from pathlib import Path
from typing import Any

from counterprof.store import safepath


# Claims this process holds. A child forked meanwhile (a DataLoader worker, in profile() mode
# the conversion runs in the workload) would hold each lock for its whole life: it closes them.
_held: set[int] = set()


def _close_held_in_child() -> None:
    for fd in _held:
        try:
            os.close(fd)
        except OSError:
            pass
    _held.clear()


os.register_at_fork(after_in_child=_close_held_in_child)


def claim_path(trace: Path) -> Path:
    return trace.with_name(f".{trace.name}.claim")


class Claim:
    """A held claim on one trace file (use as a context manager; `take()` gives None when
    another process holds it)."""

    def __init__(self, trace: Path, fd: int):
        self.trace = trace
        self.fd = fd

    @classmethod
    def take_or_skip(cls, trace: Path) -> Claim | None:
        """take(), with a planted link at the claim's name skipped and named (safepath): the
        trace is not converted, and nothing is written through the link."""
        try:
            return cls.take(trace)
        except safepath.LinkInRun as exc:
            safepath.skipped_link(exc.path)
            return None

    @classmethod
    def take(cls, trace: Path) -> Claim | None:
        try:
            # never through a link: a planted claim would be truncated and written (LinkInRun)
            fd = safepath.open_lock(claim_path(trace))
        except FileNotFoundError:          # the run (or its traces folder) was removed
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except OSError:
            os.close(fd)
            raise
        _held.add(fd)
        return cls(trace, fd)

    @property
    def converted_by(self) -> dict[str, Any] | None:
        """{"host", "pid", "by"} of the process that converted the trace, or None."""
        data = os.pread(self.fd, 4096, 0)
        if not data.strip():
            return None
        try:
            out = json.loads(data)
        except ValueError:
            return None      # a holder killed while writing this: not known to be converted
        return out if isinstance(out, dict) else None

    def converted_by_live_process(self) -> bool:
        """Converted by a process that still runs on this host (its spans may be in its
        journal, not yet in Parquet)."""
        by = self.converted_by
        if not by or by.get("host") != socket.gethostname():
            return False
        pid = by.get("pid")
        if not isinstance(pid, int) or pid <= 0:
            return False
        if pid == os.getpid():
            return True
        from counterprof.ground.proctree import pid_alive
        return pid_alive(pid)

    def mark_converted(self, by: str) -> None:
        data = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "by": by}).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data + b"\n", 0)

    def release(self) -> None:
        if self.fd >= 0:
            _held.discard(self.fd)
            os.close(self.fd)        # releases the lock
            self.fd = -1

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
