"""Is whoever writes a run still at it? The one place a run, a rank or a journal is judged
alive or abandoned (and so finished, recovered or compacted by someone else).

Three kinds of writer, each judged from what it left on disk (the caller reads the file):
- a run's profiler, or that of a rank that joined it: its meta.json's "status" and "profiler"
  (pid, host);
- a journal writer (the session, a workload's regions): the pid its writer id holds;
- the process that claimed a directory but has not written its first meta.json yet: the
  marker's "created_by" (pid, host).

A process on another host (a multi-node job on a shared filesystem) cannot be judged from here:
its pid means nothing on this host, so it counts as alive; only that host, or
`recover --force`, finishes what it writes.

A leaf module (the standard library and proctree only): rundir, compact and recover all ask it.
"""
from __future__ import annotations

import os
import re
import socket
from typing import Any, cast

from ..ground.proctree import pid_alive


def profiler_host(meta: dict[str, Any]) -> str | None:
    """The host a run's (rank's) meta.json says its profiler runs on; None when it does not say."""
    # a string where it says: read_meta checked profiler.host
    return cast("str | None", (meta.get("profiler") or {}).get("host"))


def profiler_on_this_host(meta: dict[str, Any]) -> bool:
    return profiler_host(meta) == socket.gethostname()


def profiler_elsewhere(meta: dict[str, Any]) -> str | None:
    """The other host whose profiler the meta.json says is still writing the run (rank), else
    None: none of that run's writers can be judged dead from this host."""
    host = profiler_host(meta)
    if meta.get("status") == "running" and host and host != socket.gethostname():
        return host
    return None


def profiler_alive(meta: dict[str, Any]) -> bool:
    """Is the profiler that writes this run (or rank) still running? One on another host counts
    as running."""
    if meta.get("status") != "running":
        return False
    if profiler_elsewhere(meta) is not None:
        return True
    pid = (meta.get("profiler") or {}).get("pid")
    return isinstance(pid, int) and pid > 0 and pid_alive(pid)


_WRITER_PID = re.compile(r"^\D*(\d+)-")      # "<pid>-<hex>", "regions<pid>-<hex>"


def journal_writer_alive(writer_id: str) -> bool:
    """Is the process writing these journal segments still running (another process on this
    host: a rank that joined the run, a workload's regions)? Its journal is its own to compact.
    Our own segments are not alive: we compact them because we stopped."""
    m = _WRITER_PID.match(writer_id)
    if not m:
        return False
    pid = int(m.group(1))
    return pid != os.getpid() and pid_alive(pid)


def claimer_alive(created_by: dict[str, Any]) -> bool:
    """Is the process that claimed a run directory (its marker's created_by) still running, so
    still about to write the run's first meta.json? One on another host (or not saying which)
    counts as running; we are not."""
    pid = created_by.get("pid")
    if created_by.get("host") != socket.gethostname():
        return True
    return isinstance(pid, int) and 0 < pid != os.getpid() and pid_alive(pid)
