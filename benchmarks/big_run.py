"""Time and peak RSS of `counterprof report` and `counterprof export` on a large synthetic run,
side by side with reading the same run (the floor: every sample and span read once, nothing
computed or written).

    python benchmarks/synthetic_run.py -o /tmp/big --ranks 64 --minutes 10 --hz 100 --metrics 20
    python benchmarks/big_run.py /tmp/big --rounds 3

Each measurement is a fresh process (wall time from outside, peak RSS from getrusage of the
child); every round runs each mode once, in random order; the table shows medians over the
rounds [min-max], and each mode's median ratio to the read-only floor of the same round.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

READ_ONLY = """
import sys, pyarrow as pa
from counterprof.store.reader import Run
pa.set_memory_pool(pa.system_memory_pool())
run = Run(sys.argv[1])
rows = 0
for table in ("spans", "samples"):
    for b in run.batches(table, batch_rows=64 * 1024):
        rows += b.num_rows
print(rows)
"""


def measure(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MB) of a command in a fresh child of a fresh interpreter."""
    code = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
            "p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
            "w = time.perf_counter() - t; "
            "print(p.returncode, w, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
            "sys.stderr.write(p.stderr[-2000:])")
    out = subprocess.run([sys.executable, "-c", code, *cmd], capture_output=True, text=True)
    rc, wall, rss = out.stdout.split()
    if rc != "0":
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr}")
    return float(wall), int(rss) / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a run directory, e.g. from benchmarks/synthetic_run.py")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--plain", action="store_true", help="also export to plain .json (8 GB on disk)")
    args = p.parse_args()
    out_dir = Path(tempfile.mkdtemp(prefix="export-bench-"))
    cp = [sys.executable, "-m", "counterprof", "export", args.run, "--perfetto"]
    report = [sys.executable, "-m", "counterprof", "report", args.run]
    modes = {
        "read the run (floor)": [sys.executable, "-c", READ_ONLY, args.run],
        "report": report,
        "report --json": report + ["--json"],
        "export --perfetto t.json.gz": cp + [str(out_dir / "t.json.gz")],
        "export --window 300:310 (every rank)": cp + [str(out_dir / "w.json.gz"), "--window", "300:310"],
        "export --ranks 0": cp + [str(out_dir / "r.json.gz"), "--ranks", "0"],
    }
    if args.plain:
        modes["export --perfetto t.json (plain)"] = cp + [str(out_dir / "t.json")]
    rng = random.Random(args.seed)
    results: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    ratios: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(args.rounds):
        order = list(modes)
        rng.shuffle(order)
        this = {}
        for m in order:
            this[m] = measure(modes[m])
            results[m].append(this[m])
            print(f"round {r + 1}: {m}: {this[m][0]:.1f} s, {this[m][1]:.0f} MB", file=sys.stderr)
        for m in modes:
            ratios[m].append(this[m][0] / this["read the run (floor)"][0])
        for f in out_dir.iterdir():
            f.unlink()
    load = os.getloadavg()
    print(f"\n{args.run}: {args.rounds} rounds, medians [min-max]; load average {load[0]:.1f} "
          f"{load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} CPUs\n")
    print("| mode | wall time | × the read-only floor | peak RSS |")
    print("|---|---|---|---|")
    for m, rs in results.items():
        w = [x[0] for x in rs]
        m_rss = [x[1] for x in rs]
        print(f"| {m} | {statistics.median(w):.1f} s [{min(w):.1f}-{max(w):.1f}] | "
              f"{statistics.median(ratios[m]):.1f} | {statistics.median(m_rss):.0f} MB "
              f"[{min(m_rss):.0f}-{max(m_rss):.0f}] |")
    out_dir.rmdir()


if __name__ == "__main__":
    main()
