"""A workload that alternates a CPU-bound phase and a waiting phase, one line per phase.

Expected verdict: "CPU-bound" (about 1 CPU busy) during compute phases, "waiting" (about
0 CPUs busy, nearly all off-CPU) during sleep phases; `counterprof run --live` shows the
bottleneck line follow it.
Usage: python examples/phases.py [ROUNDS] [SECONDS]   (default 5 rounds of 2 s + 2 s)
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
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
    for i in range(rounds):
        print(f"round {i}: computed {spin(seconds)} iterations", flush=True)
        time.sleep(seconds)
        print(f"round {i}: slept {seconds:g} s", flush=True)
    print("done", flush=True)
