"""Time and peak memory of `counterprof compare` on two large synthetic runs, side by side with
the floor: reading both runs' samples once (the same streaming reader, nothing computed).

    python benchmarks/compare_bench.py --ranks 64 --minutes 10 --hz 100 --metrics 20 --rounds 3

Both runs come from benchmarks/synthetic_run.py (the same data); the candidate's last rank then
gets steps 30% longer, so the comparison has a regression to find (checked every round). Each
round runs every mode once, in random order, each in a fresh process (peak RSS from wait4);
figures are medians over the rounds with [min-max].
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from counterprof.store import rundir

HERE = Path(__file__).resolve().parent
READ_ONLY = """
import sys, pyarrow as pa
pa.set_memory_pool(pa.system_memory_pool())
import counterprof
rows = 0
for path in sys.argv[1:]:
    run = counterprof.load(path)
    for r in run.ranks():
        for b in run.batches("samples", ["time", "duration_ns", "metric", "value"], rank=r):
            rows += b.num_rows
print(rows)
"""


def slow_down_rank(run: Path, rank: int, factor: float) -> None:
    """Stretch one rank's step spans by `factor` (the candidate's straggler)."""
    f = next(f for _, f in rundir.table_files(run, "spans", rank))
    t = pq.read_table(f)
    start = t["start"].cast(pa.int64())
    length = pc.subtract(t["end"].cast(pa.int64()), start)
    is_step = pc.equal(t["category"].cast(pa.string()), "step")
    new_len = pc.if_else(is_step, pc.cast(pc.multiply(length.cast(pa.float64()), factor), pa.int64()), length)
    end = pc.add(start, new_len).cast(t.schema.field("end").type)
    pq.write_table(t.set_column(t.schema.get_field_index("end"), "end", end).cast(t.schema), f,
                   compression="zstd")


def measure_rss(cmd: list[str]) -> tuple[float, float, str, int]:
    """(wall s, peak RSS MB of that process, stdout, exit status), in a fresh process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_maxrss / 1024, out.decode(), proc.returncode


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--hz", type=float, default=100.0)
    p.add_argument("--metrics", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--dir", help="keep the runs here (reused when they exist)")
    args = p.parse_args()
    random.seed(args.seed)
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="compare-bench-"))
    a, b = root / "baseline", root / "candidate"
    for run in (a, b):
        if not (run / "meta.json").exists():
            subprocess.run([sys.executable, str(HERE / "synthetic_run.py"), "-o", str(run), "--ranks",
                            str(args.ranks), "--minutes", str(args.minutes), "--hz", str(args.hz),
                            "--metrics", str(args.metrics)], check=True)
            if run == b:
                slow_down_rank(b, args.ranks - 1, 1.3)
    modes = {
        "read both runs' samples (the floor)": [sys.executable, "-c", READ_ONLY, str(a), str(b)],
        "counterprof compare A B --json": [sys.executable, "-m", "counterprof", "compare", str(a), str(b), "--json"],
    }
    results: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    for rnd in range(args.rounds):
        order = list(modes)
        random.shuffle(order)
        for m in order:
            wall, rss, out, rc = measure_rss(modes[m])
            if rc != 0:
                sys.exit(f"{m}: exit {rc}")
            if "compare" in m:
                j = json.loads(out)
                flagged = {(r["key"], r["rank"]) for r in j["rows"] if r["status"] == "regression"}
                assert ("step_time", args.ranks - 1) in flagged, flagged
                rows = len(j["rows"])
            results[m].append((wall, rss))
            print(f"round {rnd + 1}: {m}: {wall:.1f} s, {rss:.0f} MB", file=sys.stderr)
    floor = [w for w, _ in results["read both runs' samples (the floor)"]]
    print(f"\n{args.ranks} ranks x {args.minutes:g} min x {args.hz:g} Hz x {args.metrics} metrics, two runs; "
          f"{args.rounds} rounds; compare rows: {rows}; load average {os.getloadavg()[0]:.1f}")
    print("| mode | wall (s) | peak RSS (MB) | wall / floor (paired) |")
    print("|---|---|---|---|")
    for m, vals in results.items():
        walls, rss = [w for w, _ in vals], [r for _, r in vals]
        ratio = [w / f for w, f in zip(walls, floor)]
        print(f"| {m} | {statistics.median(walls):.1f} [{min(walls):.1f}-{max(walls):.1f}] | "
              f"{statistics.median(rss):.0f} [{min(rss):.0f}-{max(rss):.0f}] | "
              f"{statistics.median(ratio):.2f} [{min(ratio):.2f}-{max(ratio):.2f}] |")


if __name__ == "__main__":
    main()
