"""What `counterprof trace` costs a job that is never asked, and how fast an ask reaches every rank.

    python benchmarks/trace_now_cost.py [--calls 20000] [--asks 3] [--ranks 4]

1. Being askable: the torch driver's flusher looks for asks once a second (one listdir of
   <run>/_control/trace). Its cost per look is measured in this process on a Driver (no
   workload): with no ask ever made (the folder absent), and with 50 asks already served (the
   folder read, every name known), interleaved in rounds; the share of a core is that cost once
   a second.
2. Reach: a local job of RANKS processes (a launcher starting independent workers with RANK set,
   each marking a step every 10 ms under `counterprof run --torch`) asked ASKS times for one step
   with `counterprof trace --steps 1`: per ask, the seconds from the ask to each process taking
   it (its answer's seen_ns), the slowest rank's, and the command's wall time.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "collectors" / "torch_trace" / "bootstrap"))

WORKER = """
import os, sys, time, torch, counterprof
a = torch.randn(64, 64)
while not os.path.exists(sys.argv[1]):
    a @ a
    counterprof.step()
    time.sleep(0.01)
"""
LAUNCHER = """
import os, subprocess, sys
worker, stop, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
procs = [subprocess.Popen([sys.executable, worker, stop], env={**os.environ, "RANK": str(r)}) for r in range(n)]
sys.exit(max(p.wait() for p in procs))
"""


def look_cost(calls: int, rounds: int = 5) -> dict[str, float]:
    """µs per look of the flusher for asks, without asks and with 50 served ones."""
    import _counterprof_torch_driver as drv
    out: dict[str, list[float]] = {"no ask ever made": [], "50 asks served": []}
    with tempfile.TemporaryDirectory() as empty, tempfile.TemporaryDirectory() as served:
        folder = Path(served) / "_control" / "trace"
        folder.mkdir(parents=True)
        ids = []
        for i in range(50):
            ids.append(f"2026{i:04d}")
            (folder / f"{ids[-1]}.json").write_text(json.dumps({"id": ids[-1], "steps": 1, "asked_ns": 0}))
        d_empty, d_served = drv.Driver(empty), drv.Driver(served)
        d_served.asks_seen.update(ids)
        for _ in range(rounds):
            for name, d in (("no ask ever made", d_empty), ("50 asks served", d_served)):
                t = time.perf_counter_ns()
                for _ in range(calls):
                    d._poll_asks(0.0)
                out[name].append((time.perf_counter_ns() - t) / calls / 1e3)
    return {k: statistics.median(v) for k, v in out.items()}


def reach(ranks: int, asks: int) -> list[dict[str, float]]:
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        (t / "worker.py").write_text(textwrap.dedent(WORKER))
        (t / "launch.py").write_text(textwrap.dedent(LAUNCHER))
        run, stop = t / "run", t / "stop"
        job = subprocess.Popen([py, "-m", "counterprof", "run", "--torch", "-q", "-o", str(run), "--", py,
                                str(t / "launch.py"), str(t / "worker.py"), str(stop), str(ranks)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while len(list((run / "_control" / "drivers").glob("*.json"))) < ranks or \
                    len(list(run.glob("_ranks/rank=*/traces/*.steps"))) < ranks:
                if time.monotonic() > deadline:
                    raise SystemExit("the job's processes did not start in 120 s")
                time.sleep(0.2)
            time.sleep(2)
            out = []
            for _ in range(asks):
                t0 = time.monotonic()
                proc = subprocess.run([py, "-m", "counterprof", "trace", str(run), "--steps", "1", "--json"],
                                      capture_output=True, text=True, timeout=120)
                wall = time.monotonic() - t0
                doc = json.loads(proc.stdout)
                asked = json.loads(next((run / "_control" / "trace").glob(f"{doc['id']}.json")).read_text())["asked_ns"]
                seen = [(a["seen_ns"] - asked) / 1e9 for a in doc["answers"] if a.get("seen_ns")]
                out.append({"answered": sum(a["status"] == "traced" for a in doc["answers"]),
                            "reach_median_s": statistics.median(seen), "reach_max_s": max(seen), "wall_s": wall})
                time.sleep(1)
            return out
        finally:
            stop.touch()
            job.wait(timeout=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--asks", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=4)
    args = ap.parse_args()
    costs = look_cost(args.calls)
    print("the flusher's look for asks, once a second (medians of 5 interleaved rounds):")
    for name, us in costs.items():
        print(f"  {name:18s} {us:8.2f} µs per look = {us / 1e6:.6%} of a core")
    print(f"\nreach: {args.ranks} processes under `run --torch`, `trace --steps 1` asked {args.asks} times:")
    print("  ask  traced  reach median s  reach slowest s  command wall s")
    rows = reach(args.ranks, args.asks)
    for i, r in enumerate(rows, 1):
        print(f"  {i:3d}  {r['answered']:6d}  {r['reach_median_s']:14.2f}  {r['reach_max_s']:15.2f}"
              f"  {r['wall_s']:14.2f}")
    print(f"  slowest rank over every ask: {max(r['reach_max_s'] for r in rows):.2f} s")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()
