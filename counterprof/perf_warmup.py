"""Turn the kernel's perf context-switch hooks on while the command line still imports.

When no perf event exists on the machine, the first task event anyone opens enables the
kernel's perf_sched_events static key, and perf_event_open waits for an RCU grace period
before it returns: 5-23 ms on the 2-core VM (a fresh `counterprof run -- true` spent that in
its first perf_event_open). The key stays on for about a second after the last event closes.
So `counterprof run` opens and closes one disabled task-clock counter on a thread of its own
as it starts: that thread sleeps in the kernel while the main thread imports numpy and pyarrow,
and the session's own events open at their usual speed. Nothing depends on it: where perf
events cannot be opened the thread ends and the collector says why, as before.
"""
from __future__ import annotations

import os
import threading

PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK = 1, 1


def open_and_close() -> str:
    """Open and close one disabled task-clock counter on this thread: what it opened ("all",
    "user space" where only user-space counting is allowed), or why it opened none."""
    try:
        from counterprof._native import ffi, lib
    except ImportError:           # an uncompiled tree: the perf collector will say so
        return "no native core"
    spec = ffi.new("struct cp_event_spec *")
    spec.type, spec.config, spec.disabled = PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK, 1
    fd, opened = lib.cp_event_open(spec, 0, -1, -1), "all"
    if fd < 0:                    # paranoid 2, unprivileged: user-space counting is allowed
        spec.exclude_kernel = spec.exclude_hv = 1
        fd, opened = lib.cp_event_open(spec, 0, -1, -1), "user space"
    if fd < 0:
        return f"none ({os.strerror(-fd)})"
    lib.cp_close(fd)
    return opened


def warm_up() -> threading.Thread:
    """Start the open-and-close on a daemon thread (joined by nobody: it ends by itself)."""
    thread = threading.Thread(target=open_and_close, name="cp-perf-warmup", daemon=True)
    thread.start()
    return thread
