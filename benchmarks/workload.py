"""A fixed-time, CPU-bound, single-threaded Python workload for the overhead benchmark.

    python benchmarks/workload.py [--seconds 2]

Spins a pure-Python arithmetic loop for SECONDS of wall time and prints one JSON line:
{"iterations", "elapsed_s", "rate" (iterations per second), "cpu_s" (its own CPU since
exec, resource.getrusage(RUSAGE_SELF)), "user_s", "system_s"}.

A profiler that takes CPU away from the workload shows up as fewer iterations in the
same wall time; `run()` is the same loop as a function, for the in-process benchmark.
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time

CHUNK = 2000   # iterations between clock reads (~100 us of work)


def spin(n: int, x: int) -> int:
    for i in range(n):
        x = (x * 1103515245 + i) & 0xFFFFFFFF
    return x


def run(seconds: float) -> dict:
    """Spin for `seconds` of wall time; the work done and the CPU the calling thread used."""
    x = 1
    iterations = 0
    t_cpu0 = time.thread_time()
    t0 = time.perf_counter()
    deadline = t0 + seconds
    now = t0
    while now < deadline:
        x = spin(CHUNK, x)
        iterations += CHUNK
        now = time.perf_counter()
    elapsed = now - t0
    return {"iterations": iterations, "elapsed_s": elapsed, "rate": iterations / elapsed,
            "thread_cpu_s": time.thread_time() - t_cpu0, "check": x & 0xFF}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=2.0, help="wall time to spin (default 2)")
    args = p.parse_args(argv)
    out = run(args.seconds)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    out.update(cpu_s=ru.ru_utime + ru.ru_stime, user_s=ru.ru_utime, system_s=ru.ru_stime)
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
