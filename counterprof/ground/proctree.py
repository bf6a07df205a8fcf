"""The workload's process tree from Python: its pids (the nvml collector picks the workload's
processes out of NVML's per-GPU lists with them) and each process's rank (the rank watcher).

Walked the way native/procstat.c walks it for the host collector: children of every thread
from /proc/PID/task/TID/children, not a scan of all of /proc.
"""
from __future__ import annotations

import os
from collections import deque
from collections.abc import Mapping


# where a process's rank is: COUNTERPROF_RANK (set it yourself, for a job without
# torch.distributed or a launcher that sets none of the others; it wins over them), then the
# launchers': torchrun/torch.distributed, Open MPI, MPICH/PMI, Slurm. Read from
# /proc/PID/environ, the environment at exec: set it in the environment a rank process is
# started with (subprocess env=, os.environ before a "spawn" multiprocessing start), not in
# os.environ of a process already running (a forked child's changes are not seen).
RANK_VARIABLES = ("COUNTERPROF_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def tree_pids(root: int, proc: str = "/proc") -> set[int]:
    """root and every live descendant; empty when root is gone."""
    return set(tree_order(root, proc))


def tree_order(root: int, proc: str = "/proc") -> list[int]:
    """root and its live descendants, parents before their children (breadth first, through
    every thread's /proc/PID/task/TID/children); a process that exits meanwhile is left out."""
    out, queue, seen = [], deque([root]), {root}
    while queue:
        pid = queue.popleft()
        try:
            tids = os.listdir(f"{proc}/{pid}/task")
        except OSError:
            continue
        out.append(pid)
        for tid in tids:
            try:
                with open(f"{proc}/{pid}/task/{tid}/children") as f:
                    children = f.read().split()
            except OSError:
                continue
            for child in map(int, children):
                if child not in seen:
                    seen.add(child)
                    queue.append(child)
    return out


def environ(pid: int, proc: str = "/proc") -> dict[str, str]:
    """A process's environment as it was at exec (empty when unreadable)."""
    try:
        with open(f"{proc}/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


# multiprocessing's helper processes: started by the first Process.start() of a "spawn" or
# "forkserver" context, they inherit the environment that process was given (its
# COUNTERPROF_RANK), but are never ranks
_MP_HELPERS = (b"from multiprocessing.resource_tracker import main",
               b"from multiprocessing.forkserver import main",
               b"from multiprocessing.semaphore_tracker import main")


def cmdline(pid: int, proc: str = "/proc", limit: int = 4096) -> bytes:
    """A process's command line, NUL-separated, its first `limit` bytes (b"" when unreadable)."""
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as f:
            return f.read(limit)
    except OSError:
        return b""


def helper_kind(command: bytes) -> str:
    """Which of multiprocessing's helpers a command line is: "resource_tracker", "forkserver"
    (whose children are its starter's workers) or "" (none)."""
    for h in _MP_HELPERS:
        if h in command:
            return "forkserver" if b".forkserver " in h else "resource_tracker"
    return ""


def multiprocessing_helper(pid: int, proc: str = "/proc") -> bool:
    """Is this process multiprocessing's resource tracker or fork server?"""
    return helper_kind(cmdline(pid, proc)) != ""


def cpu_ticks(pid: int, proc: str = "/proc") -> int | None:
    """utime + stime of a process (all its threads, not its children), in clock ticks; None
    when it is gone."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            text = f.read(1024)
        fields = text[text.rindex(b")") + 2:].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return None


def rank_of(env: Mapping[str, str]) -> int | None:
    for var in RANK_VARIABLES:
        value = env.get(var)
        if value is not None and value.strip().isdigit():
            return int(value)
    return None


def rank_from_env(environ: Mapping[str, str] = os.environ) -> int:
    """This process's rank as the launcher set it (RANK, or MPI's and Slurm's own), else 0:
    the same reading as the rank watcher's, so counters and regions land in one partition."""
    return rank_of(environ) or 0
