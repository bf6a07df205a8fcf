"""Each profiler thread's steady CPU in a running `counterprof run`, side by side for two builds.

    python benchmarks/thread_cpu.py --baseline BASE/.venv/bin/counterprof            # -I 100
    python benchmarks/thread_cpu.py --baseline BASE/.venv/bin/counterprof -- -I 10
    python benchmarks/thread_cpu.py --baseline BASE/.venv/bin/counterprof --perf-stat --window 12 32

Each run is `counterprof run -q -e task-clock,page-faults [ARGS] -- sleep TO+2`; the figure is
each thread's on-CPU time (/proc/PID/task/TID/schedstat) between FROM and TO s (--window, default
3 11), in % of a core: steady state, no start-up and no end of run (from -I 100 the drain wakes
every 10 s and its first wake-up opens the journal: start the window after it). --perf-stat adds
`perf stat -I` with the same events and interval to each round, and its ratio. The threads are
told apart by their kernel names (cp-sampler, cp-perf-drain, ...); a build before they were named
is read by start order. Rounds
run both builds in a random order; ratios are paired per round (median [min-max]).
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

# the threads of a run in the order they start (what a build without thread names is read by)
START_ORDER = ["main", "jemalloc_bg_thd", "cp-compact", "cp-host", "cp-threads", "cp-sampler", "cp-perf-drain"]


def snapshot(pid: int) -> dict[int, tuple[str, int]]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                out[int(tid)] = (comm, int(f.read().split()[0]))
        except OSError:
            pass
    if not any(c.startswith("cp-") for c, _ in out.values()):
        out = {t: (START_ORDER[i] if i < len(START_ORDER) else f"thread{i}", ns)
               for i, (t, (_c, ns)) in enumerate(sorted(out.items()))}
    return {t: ("main" if c == "counterprof" else c, ns) for t, (c, ns) in out.items()}


def one(exe: str, args: list[str], a: float = 3.0, b: float = 11.0) -> dict[str, float]:
    """Each thread's CPU between a and b seconds of `run -- sleep b+2` (exe "perf": `perf stat -I`
    with the same events and interval, its intervals written to a file)."""
    tmp = tempfile.mkdtemp(prefix="cp-thread-cpu-")
    try:
        if exe == "perf":
            interval = args[args.index("-I") + 1] if "-I" in args else "100"
            cmd = ["perf", "stat", "-I", interval, "-e", "task-clock,page-faults", "-o", f"{tmp}/perf.txt"]
        else:
            cmd = [exe, "run", "-q", "-e", "task-clock,page-faults", *args, "-o", f"{tmp}/run"]
        p = subprocess.Popen([*cmd, "--", "sleep", f"{b + 2:g}"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        time.sleep(a)
        s0 = snapshot(p.pid)
        time.sleep(b - a)
        s1 = snapshot(p.pid)
        p.wait()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out: dict[str, float] = {}
    for tid, (name, ns) in s1.items():
        out[name] = out.get(name, 0.0) + 100 * (ns - s0.get(tid, (name, 0))[1]) / 1e9 / (b - a)
    out["the process"] = sum(out.values())
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", required=True, help="the other build's counterprof executable")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--window", type=float, nargs=2, default=(3.0, 11.0), metavar=("FROM_S", "TO_S"),
                   help="the steady window (default 3 11); from -I 100 the drain wakes every 5 s and "
                        "its first wake-up opens the journal, so start it after 5 s (e.g. 7 27)")
    p.add_argument("--perf-stat", action="store_true",
                   help="also `perf stat -I` (same events and interval) in each round, for the goal's ratio")
    p.add_argument("args", nargs="*", help="more `run` options (after --), e.g. -I 10")
    a = p.parse_args()
    exes = {"base": a.baseline, "now": os.path.join(os.path.dirname(sys.executable), "counterprof")}
    if a.perf_stat:
        exes["perf stat"] = "perf"
    rng = random.Random(a.seed)
    got: dict[str, list[dict[str, float]]] = {k: [] for k in exes}
    for _ in range(a.rounds):
        order = list(exes)
        rng.shuffle(order)
        for k in order:
            got[k].append(one(exes[k], a.args, *a.window))
    names = sorted({n for runs in got.values() for r in runs for n in r} - {"the process"}) + ["the process"]
    print(f"run {' '.join(a.args) or '(-I 100)'}: each thread's CPU between {a.window[0]:g} and "
          f"{a.window[1]:g} s, % of a core, {a.rounds} paired rounds")
    print("| thread | base | now | now / base |")
    print("|---|---|---|---|")
    for n in names:
        b = [r.get(n, 0.0) for r in got["base"]]
        w = [r.get(n, 0.0) for r in got["now"]]
        ratios = [x / y for x, y in zip(w, b) if y > 0]
        ratio = (f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}–{max(ratios):.2f}]" if ratios else "–")
        print(f"| {n} | {statistics.median(b):.3f}% | {statistics.median(w):.3f}% | {ratio} |")
    if a.perf_stat:
        ps = [r["the process"] for r in got["perf stat"]]
        for k in ("base", "now"):
            ratios = [r["the process"] / x for r, x in zip(got[k], ps) if x > 0]
            print(f"{k} / perf stat (the process, paired): {statistics.median(ratios):.2f}x "
                  f"[{min(ratios):.2f}–{max(ratios):.2f}]")
        print(f"perf stat's process: {statistics.median(ps):.3f}% [{min(ps):.3f}–{max(ps):.3f}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
