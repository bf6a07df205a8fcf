"""The threads collector's own CPU, for trees of 1 and 200 (mostly sleeping) threads.

    python benchmarks/threads_cost.py                 # 5 rounds of 3 s per cell (~2 minutes)
    python benchmarks/threads_cost.py --rounds 3 --seconds 2

The issue's bound: a tree of 200 threads sampled at 10 Hz stays under 1% of one core. Each
cell runs a Session with only the threads collector on a workload process (--pid target),
and reads the collector thread's on-CPU time (/proc/self/task/TID/schedstat of its sampling
thread, journal writes included) over `seconds` of steady state, after 1.5 s of warm-up (the first
flush, 1 s in, opens the journal segment), and after one warm-up session (the process's first
flush imports what pyarrow needs: ~0.2 s of CPU once). Cells are run in
a random order within each round; the figure is the median of the rounds, with min-max.
"""
from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKLOAD = r"""
import sys, threading, time
n = int(sys.argv[1])
stop = threading.Event()
def idle():                  # mostly sleeping: wakes every 50 ms for a moment of work
    while not stop.wait(0.05):
        sum(range(200))
threads = [threading.Thread(target=idle, daemon=True) for _ in range(n - 1)]
for t in threads:
    t.start()
print("ready", flush=True)
sys.stdin.readline()
"""


def cell(pid: int, interval_ms: float, seconds: float, root: Path) -> float:
    """% of one core the collector's thread used over one session of `seconds`."""
    from counterprof.collector import Target
    from counterprof.session import Session
    path = root / f"run-{time.monotonic_ns()}"
    s = Session(path, collectors=["threads"], config={"threads": {"interval_ms": interval_ms}},
                target=Target("pid", pid), on_warning=lambda m: print("warning:", m, file=sys.stderr))
    s.start()
    tid = s.collectors[0]._thread.native_id        # the collector's sampling thread
    time.sleep(1.5)                                 # past the first flush (at 1 s)
    t0, c0 = time.monotonic(), _on_cpu(tid)
    time.sleep(seconds)
    t1, c1 = time.monotonic(), _on_cpu(tid)
    s.stop(compact=False)
    return 100.0 * (c1 - c0) / (t1 - t0)


def _on_cpu(tid: int) -> float:
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    procs = {}
    for n in (1, 200):
        p = subprocess.Popen([sys.executable, "-c", WORKLOAD, str(n)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ready"
        procs[n] = p
    cells = [(n, ms) for n in (1, 200) for ms in (100.0, 10.0)]
    results: dict[tuple[int, float], list[float]] = {c: [] for c in cells}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cell(procs[1].pid, 100.0, 0.5, Path(tmp))    # warm-up: the process's first flush imports ~0.2 s
            for _ in range(args.rounds):
                order = cells[:]
                random.shuffle(order)
                for n, ms in order:
                    results[(n, ms)].append(cell(procs[n].pid, ms, args.seconds, Path(tmp)))
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
    print(f"threads collector CPU, % of one core (median of {args.rounds} rounds of {args.seconds:g} s; min-max)")
    print(f"{'threads':>8} {'interval':>9} {'CPU %':>7}  range")
    for n, ms in cells:
        v = results[(n, ms)]
        print(f"{n:>8} {ms:>7g}ms {statistics.median(v):>7.3f}  {min(v):.3f}-{max(v):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
