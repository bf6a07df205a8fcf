"""The workload's process tree, to pick its processes out of NVML's per-GPU process lists.

Walked the way native/procstat.c walks it for the host collector: children of every thread
from /proc/PID/task/TID/children, not a scan of all of /proc. Read once a second.
NVML reports process ids in the host's pid namespace; inside a container with its own pid
namespace they do not match /proc's and gpu.proc_mem_used stays 0.
"""
from __future__ import annotations

import os


def tree_pids(root: int, proc: str = "/proc") -> set[int]:
    """root and every live descendant; empty when root is gone."""
    if not os.path.exists(f"{proc}/{root}"):
        return set()
    seen = {root}
    stack = [root]
    while stack:
        pid = stack.pop()
        try:
            tids = os.listdir(f"{proc}/{pid}/task")
        except OSError:
            continue                     # exited meanwhile
        for tid in tids:
            try:
                with open(f"{proc}/{pid}/task/{tid}/children") as f:
                    children = f.read().split()
            except OSError:
                continue
            for child in map(int, children):
                if child not in seen:
                    seen.add(child)
                    stack.append(child)
    return seen
