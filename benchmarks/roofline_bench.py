"""The roofline's costs, side by side in one run: `calibrate --quick` (and full) wall time;
`counterprof roofline RUN` against `counterprof import` of the same trace; peak RSS as the
trace grows: the largest shared trace as it is, and its events repeated 2x and 4x in time
(kineto_traces.duplicated_trace: the same ops, shapes and kernels, so every per-op figure
scales and nothing else changes), plus Kineto-shaped synthetic traces without shapes.

    python benchmarks/roofline_bench.py                  # 5 rounds, full calibrate once, 25 + 100 MB synthetic
    python benchmarks/roofline_bench.py --quick          # 3 rounds, no full calibrate, 25 MB synthetic
    python benchmarks/roofline_bench.py --no-calibrate --rounds 3    # only roofline vs import, RSS
    python benchmarks/roofline_bench.py --json out.json

Each measurement is a fresh process doing one job; import and roofline are timed inside the
process around main() (interpreter start-up and library imports excluded), calibrate from
outside (what a user waits for); peak RSS is the process's ru_maxrss. Rounds run the traces in
a random order; figures are medians (of per-round ratios for roofline / import). Targets:
calibrate --quick < 30 s on 2 cores; roofline < 2x the import of the same trace; roofline's
peak RSS flat in the trace's size (4x the trace: within MAX_RSS_GROWTH_MB of 1x). The machine
may be shared: ratios are the result.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests"))

TARGET_QUICK_S = 30.0
TARGET_RATIO = 2.0
MAX_RSS_GROWTH_MB = 25.0

TIMED = """
import json, resource, sys, time
t0 = time.perf_counter()
from counterprof.cli import main
import counterprof.cli.{module}
t1 = time.perf_counter()
rc = main({argv})
t2 = time.perf_counter()
if rc:
    sys.exit(rc)
print(json.dumps({{"import_s": t1 - t0, "seconds": t2 - t1,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}), file=sys.stderr)
"""


def timed(module: str, argv: list[str]) -> dict:
    code = TIMED.format(module=module, argv=repr(argv))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"{argv[0]} failed: {proc.stderr.strip()[-400:]}")
    return json.loads(proc.stderr.strip().splitlines()[-1])


def calibrate_wall(quick: bool) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "counterprof", "calibrate", "--json", "--no-save"]
                          + (["--quick"] if quick else []), capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"calibrate failed: {proc.stderr.strip()[-400:]}")
    return time.perf_counter() - t0


def shared_traces() -> list[Path]:
    base = REPO / "shared" / "traces"
    if not base.is_dir():
        base = Path("/work/shared/traces")
    return sorted(base.rglob("*.json.gz"), key=lambda p: p.stat().st_size)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="3 rounds, no full calibrate, 25 MB synthetic only")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    p.add_argument("--no-calibrate", action="store_true", help="leave out the calibrate timings")
    p.add_argument("--no-synthetic", action="store_true", help="leave out the synthetic traces")
    args = p.parse_args()
    rounds = 3 if args.quick else args.rounds
    from kineto_traces import write_big_trace
    out: dict = {"rounds": rounds}

    if not args.no_calibrate:
        quick = [calibrate_wall(True) for _ in range(min(rounds, 3))]
        out["calibrate_quick_s"] = {"median": statistics.median(quick), "runs": quick}
        print(f"calibrate --quick: median {statistics.median(quick):.1f} s of {len(quick)} "
              f"(target < {TARGET_QUICK_S:.0f} s): {[round(x, 1) for x in quick]}")
    if not args.quick and not args.no_calibrate:
        full = calibrate_wall(False)
        out["calibrate_full_s"] = full
        print(f"calibrate (full): {full:.1f} s")

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        largest = shared_traces()[-1]
        name = largest.name.removesuffix(".json.gz")
        traces = {f"{name} x1": largest}
        for k in (2, 4):
            path = work / f"{name}_x{k}.json"
            # in a child: a process's ru_maxrss starts at its parent's (fork), so this process
            # must stay small for the peaks measured below to be the children's own
            subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                            "from pathlib import Path; from kineto_traces import duplicated_trace; "
                            "duplicated_trace(Path(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))",
                            str(REPO / "tests"), str(largest), str(k), str(path)], check=True)
            traces[f"{name} x{k}"] = path
        for mb in ([] if args.no_synthetic else [25] if args.quick else [25, 100]):
            path = work / f"synthetic_{mb}mb.json"
            write_big_trace(path, mb << 20)
            traces[f"synthetic {mb} MB"] = path
        runs = {}
        for label, trace in traces.items():      # one import to analyse, kept for all rounds
            runs[label] = work / f"run-{len(runs)}"
            timed("import_trace", ["import", str(trace), "-o", str(runs[label]), "-q"])
        rows: dict[str, dict[str, list]] = {k: {"import": [], "roofline": [], "ratio": [], "rss": [],
                                                "import_rss": []} for k in traces}
        for _ in range(rounds):
            order = list(traces)
            random.shuffle(order)
            for label in order:
                scratch = work / f"scratch-{random.getrandbits(32):08x}"
                imp = timed("import_trace", ["import", str(traces[label]), "-o", str(scratch), "-q"])
                subprocess.run(["rm", "-rf", str(scratch)])
                roof = timed("roofline", ["roofline", str(runs[label]), "--json"])
                r = rows[label]
                r["import"].append(imp["seconds"])
                r["roofline"].append(roof["seconds"])
                r["ratio"].append(roof["seconds"] / imp["seconds"])
                r["rss"].append(roof["peak_rss_mb"])
                r["import_rss"].append(imp["peak_rss_mb"])
        out["traces"] = {}
        print(f"\n{'trace':<44} {'import s':>9} {'roofline s':>11} {'ratio':>7} "
              f"{'roofline RSS':>13} {'import RSS':>11}")
        for label, r in rows.items():
            med = {k: statistics.median(v) for k, v in r.items()}
            out["traces"][label] = {"size_mb": traces[label].stat().st_size / 2 ** 20, **med, "runs": r}
            print(f"{label:<44} {med['import']:>9.2f} {med['roofline']:>11.2f} {med['ratio']:>6.2f}x "
                  f"{med['rss']:>10.0f} MB {med['import_rss']:>8.0f} MB")
        worst = max(statistics.median(r["ratio"]) for r in rows.values())
        out["worst_ratio"] = worst
        print(f"\nroofline / import: worst median {worst:.2f}x (target < {TARGET_RATIO:.0f}x)")
        rss = {k: statistics.median(rows[f"{name} x{k}"]["rss"]) for k in (1, 2, 4)}
        out["rss_growth_4x_mb"] = rss[4] - rss[1]
        print(f"roofline peak RSS over 1x / 2x / 4x {name}: {rss[1]:.0f} / {rss[2]:.0f} / {rss[4]:.0f} MB: "
              f"+{rss[4] - rss[1]:.0f} MB at 4x (target: within {MAX_RSS_GROWTH_MB:.0f} MB)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
