"""What one read of the contenders (every process's CPU, outside the workload's tree) costs, in C
(collectors.threads.process_table + numpy) against the Python scan it replaced, side by side.

    python benchmarks/contenders_cost.py                      # 0, 500, 1500 extra processes
    python benchmarks/contenders_cost.py --extra 0 1000 --rounds 9

A GPU node lists ~1500 processes (its kernel threads too: one set per CPU); this VM ~65, so
the bench starts `sleep` processes to get there. Each round reads both ways in a random order;
the figure is the median thread CPU per read, with the per-round ratio C / Python, and what a
read every 5 s (the threads collector's pace) costs in % of a core.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import time

from counterprof.collectors.threads import Contenders


def python_scan(proc: str = "/proc") -> dict:
    """The scan as it was (collectors/threads.py before 2026-12-03): one open/read/parse per process."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/stat", "rb") as f:
                text = f.read().decode(errors="replace")
        except OSError:
            continue
        head, _, rest = text.rpartition(")")
        fields = rest.split()
        if len(fields) < 20:
            continue
        out[(int(name), int(fields[19]))] = (head.partition("(")[2], int(fields[1]),
                                             (int(fields[11]) + int(fields[12])) / tick)
    return out


def cpu_of(fn, repeat: int) -> float:
    t = time.thread_time()
    for _ in range(repeat):
        fn()
    return (time.thread_time() - t) / repeat


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--extra", type=int, nargs="+", default=[0, 500, 1500], help="sleeping processes to add")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--repeat", type=int, default=5, help="reads per measurement")
    a = p.parse_args()
    rng = random.Random(1)
    print("| processes listed | Python scan (µs/read) | C + numpy (µs/read) | ratio C/Python (paired) | every 5 s, C |")
    print("|---|---|---|---|---|")
    for extra in a.extra:
        sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(extra)]
        try:
            c = Contenders([os.getpid()])
            c.read()
            python_scan()                             # both warm
            py, cc = [], []
            for _ in range(a.rounds):
                order = [("py", python_scan), ("c", c.read)]
                rng.shuffle(order)
                for name, fn in order:
                    (py if name == "py" else cc).append(cpu_of(fn, a.repeat))
            listed = len([n for n in os.listdir("/proc") if n.isdigit()])
            ratios = [x / y for x, y in zip(cc, py)]
            print(f"| {listed} | {1e6 * statistics.median(py):.0f} | {1e6 * statistics.median(cc):.0f} | "
                  f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}–{max(ratios):.2f}] | "
                  f"{100 * statistics.median(cc) / 5:.3f}% |")
        finally:
            for s in sleepers:
                s.kill()
            for s in sleepers:
                s.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
