"""What sampling the main thread's Python stack costs a Python-bound loop: the torch driver's
sampler (_counterprof_torch_driver.Driver._pystack_loop: sys._current_frames() and a walk of the
main thread's frames to the innermost one of the user's own files, every PYSAMPLE_S) run beside
a pure-Python tokenizer loop, against the same loop alone, in paired rounds in one process.

    python benchmarks/pystack_cost.py [--rounds 15] [--seconds 1.0]

Prints the median of the rounds' ratios (with sampler / alone) of the loop's iterations per
second, and the samples taken. A script, not a timed test: the machine is shared.
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import threading
import time
from pathlib import Path

DRIVER = (Path(__file__).resolve().parents[1] / "collectors" / "torch_trace" / "bootstrap"
          / "_counterprof_torch_driver.py")


def load_driver():
    spec = importlib.util.spec_from_file_location("_cp_driver_bench", DRIVER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Sampler:
    """Just what _pystack_loop reads of its driver: pid, stopped, prof, window_prof, _wake, _records."""

    def __init__(self, mod):
        import collections
        import os
        self.pid, self.stopped, self.prof, self.window_prof = os.getpid(), "", object(), None
        self._wake, self._records = threading.Event(), collections.deque()
        self.loop = mod.Driver._pystack_loop


def work(seconds: float) -> float:
    words = ("the model learns tokens from text and gradients flow back through layers " * 40).split()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        ids = [hash(w) % 2048 for w in words for _ in range(3)]
        n += len(ids)
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--seconds", type=float, default=1.0)
    args = ap.parse_args()
    mod = load_driver()
    ratios, samples = [], 0
    for r in range(args.rounds):
        order = [False, True] if r % 2 else [True, False]
        rate = {}
        for on in order:
            s = Sampler(mod) if on else None
            th = threading.Thread(target=s.loop, args=(s,), daemon=True) if s else None
            if th:
                th.start()
            rate[on] = work(args.seconds)
            if s:
                s._wake.set()
                th.join()
                samples += len(s._records)
        ratios.append(rate[True] / rate[False])
    print(f"loop rate with the sampler / alone: median {statistics.median(ratios):.4f} "
          f"(min {min(ratios):.4f}, max {max(ratios):.4f}) over {args.rounds} paired rounds; "
          f"{samples / (args.rounds * args.seconds):.0f} samples/s taken (PYSAMPLE_S {mod.PYSAMPLE_S})")


if __name__ == "__main__":
    sys.exit(main())
