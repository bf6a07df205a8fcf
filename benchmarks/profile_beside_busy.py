"""profile()'s start and stop in a process whose other thread runs Python all the time.

    python benchmarks/profile_beside_busy.py                 # 5 paired rounds, ~1 minute
    python benchmarks/profile_beside_busy.py --rounds 7

A data loader's thread, a spinning worker, a metrics pusher: beside a thread that runs Python
code, every time the profiler's start or stop gives the GIL up (a file, an import, a lock, a C
call) it waits for the busy thread to be asked to hand it back, every switch interval (5 ms by
default). counterprof.profile() hands it over every 0.2 ms while it starts and stops
(counterprof/ground/gil.py); this measures that against the same code with the process's own setting.

Each round runs both modes once, in a random order, each in a fresh process (the first
profile() imports pyarrow and numpy: "cold"), then a second profile() in the same process
("warm"). Wall seconds of `with profile(...)`'s enter and exit, median [min-max] over rounds,
and the per-round ratio quick / own. Nothing is compared with a constant.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import contextlib, json, sys, tempfile, threading, time
mode = sys.argv[1]
import counterprof.ground.gil, counterprof.api
if mode == "own":     # the same start and stop, at the process's own switch interval
    counterprof.api.quick_handoffs = contextlib.nullcontext
stop = False
def spin():           # pure Python: holds the GIL until asked to drop it
    n = 0
    while not stop:
        n += 1
threading.Thread(target=spin, daemon=True).start()
time.sleep(0.05)
import counterprof
out = {}
with tempfile.TemporaryDirectory() as tmp:
    for i, phase in enumerate(("cold", "warm")):
        t0 = time.perf_counter()
        p = counterprof.profile(path=f"{tmp}/run{i}", collectors=["perf", "host"], events="task-clock")
        p.__enter__()
        t1 = time.perf_counter()
        time.sleep(0.2)
        t2 = time.perf_counter()
        p.__exit__(None, None, None)
        t3 = time.perf_counter()
        out[f"{phase}_enter"] = t1 - t0
        out[f"{phase}_exit"] = t3 - t2
stop = True
print(json.dumps(out))
"""

MODES = ("quick", "own")
FIGURES = ("cold_enter", "cold_exit", "warm_enter", "warm_exit")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seed", type=int, default=None)
    args = p.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    got: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for mode in rng.sample(MODES, len(MODES)):
                proc = subprocess.run([sys.executable, "-c", CHILD, mode], cwd=tmp, capture_output=True,
                                      text=True, timeout=300)
                if proc.returncode != 0:
                    print(proc.stderr, file=sys.stderr)
                    return 1
                got[mode].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(f"profile() beside a GIL-spinning thread, {args.rounds} paired rounds (seed {seed}); "
          f"wall seconds, median [min-max]")
    print(f"{'figure':<12} {'own switch interval':>26} {'quick handoffs':>26} {'quick / own':>22}")
    for fig in FIGURES:
        cells = []
        for mode in ("own", "quick"):
            v = [r[fig] for r in got[mode]]
            cells.append(f"{statistics.median(v):.3f} [{min(v):.3f}-{max(v):.3f}]")
        ratios = [q[fig] / o[fig] for q, o in zip(got["quick"], got["own"])]
        cells.append(f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]")
        print(f"{fig:<12} {cells[0]:>26} {cells[1]:>26} {cells[2]:>22}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
