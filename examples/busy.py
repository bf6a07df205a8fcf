"""A CPU-bound pure-Python loop: the simplest thing to count.

Expected verdict: busy CPU. Compute vs memory cannot be told apart without hardware counters
(unknown, naming the counters that would decide it); compute where the PMU counts (high IPC).
Usage: python examples/busy.py [SECONDS]   (default 1.0; prints the iterations done)
"""
import sys
import time


def spin(seconds: float) -> int:
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        for _ in range(1000):
            n += 1
    return n


if __name__ == "__main__":
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    print(f"iterations {spin(seconds)}")
