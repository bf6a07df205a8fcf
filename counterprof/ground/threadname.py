"""The profiler's threads, named in the kernel."""
from __future__ import annotations

import threading


def name_os_thread(name: str) -> None:
    """Give the calling thread its name in the kernel too (top -H, ps -L, perf, py-spy show it):
    "counterprof-perf-drain" becomes "cp-perf-drain" (the kernel keeps 15 characters). Python
    before 3.14 leaves every thread named after the process, so under profile() the profiler's
    threads would read as the workload's."""
    short = "cp-" + name.removeprefix("counterprof-")
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
            f.write(short[:15])
    except OSError:
        pass              # no procfs, or a kernel that refuses: the name is only a convenience
