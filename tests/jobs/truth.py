"""The jobs' own accounting, kept apart from what they do: a job imports this first (its wall
clock starts then, before torch's imports, which the profiler sees too), keeps its own timers,
and at the end writes one JSON line with them and the kernel's figures for its main thread.

The kernel's figures come from /proc/self/task/<tid>/schedstat: time on a CPU, time runnable
but waiting for one (run delay), both since the thread started. Nothing here knows counterprof.
"""
import json
import os
import threading
import time

T0, T0_UNIX_NS = time.perf_counter(), time.time_ns()
MAIN_TID = threading.get_native_id()


def schedstat(pid: int, tid: int | None = None) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting) of one thread since it started."""
    path = f"/proc/{pid}/task/{tid}/schedstat" if tid else f"/proc/{pid}/schedstat"
    with open(path) as f:
        run_ns, delay_ns, _ = f.read().split()
    return int(run_ns) / 1e9, int(delay_ns) / 1e9


def main_thread() -> tuple[float, float]:
    """schedstat() of this process's main thread (the one that imported this module)."""
    return schedstat(os.getpid(), MAIN_TID)


def record(job: str, path: str | None = None, **figures) -> dict:
    """Append this job's truth (its figures, its wall time, its main thread's CPU and run
    delay) as one JSON line to `path` (default $JOB_TRUTH); return it."""
    wall = time.perf_counter() - T0
    on_cpu, run_delay = main_thread()
    truth = {"job": job, "pid": os.getpid(), "wall_s": wall, "main_on_cpu_s": on_cpu,
             "main_run_delay_s": run_delay, "start_unix_ns": T0_UNIX_NS,
             "end_unix_ns": T0_UNIX_NS + int(wall * 1e9), **figures}
    path = path or os.environ.get("JOB_TRUTH")
    if path:
        with open(path, "a") as f:          # one short append per process: ranks share a file
            f.write(json.dumps(truth) + "\n")
    return truth
