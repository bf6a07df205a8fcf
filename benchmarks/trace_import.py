"""Trace import: counterprof vs HTA 0.5.0's TraceAnalysis, side by side in one run.

    python benchmarks/trace_import.py                          # real traces + synthetic 100 MB and 1 GB
    python benchmarks/trace_import.py --rounds 7 --json out.json
    python benchmarks/trace_import.py --quick                  # 3 rounds, no 1 GB trace

HTA is not a counterprof dependency: it runs from its own virtual environment (--hta-python,
default $HTA_PYTHON, else /work/hta-venv/bin/python), made with
    python3 -m venv hta-venv && hta-venv/bin/pip install holistictraceanalysis==0.5.0

Each measurement is a fresh process doing one job: `counterprof import TRACE -o RUN` (its
main() called in-process: stream conversion to Parquet spans, the run's meta.json), and HTA's
TraceAnalysis(trace_files=...) (parse, correlate, filter: everything before its first
analysis). Time is measured inside the
process around that call (library imports and interpreter start-up excluded, and reported
apart); peak RSS is the process's ru_maxrss (libraries included, for both). Each round runs
both tools on every trace, in a random order; figures are medians of per-round ratios.
The machine is shared with other work while this runs: ratios, not absolute times, are the
result. Targets: >= 10x faster, <= half the peak RSS; a 1 GB trace imports under 500 MB RSS.
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
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests"))

TARGET_SPEEDUP = 10.0
TARGET_RSS_RATIO = 0.5
TARGET_1GB_RSS_MB = 500.0

OURS = """
import json, os, resource, sys, time
t0 = time.perf_counter()
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # as `counterprof import` does before numpy loads
from counterprof.cli import main            # `counterprof import TRACE -o RUN -q`, timed inside
from counterprof.cli.process_setup import keep_pandas_out
keep_pandas_out()                           # as the command does first (pyarrow would import pandas)
import counterprof.cli.import_trace, counterprof.collectors.torch_trace.importer
t1 = time.perf_counter()
rc = main(["import", sys.argv[1], "-o", sys.argv[2], "-q"])
t2 = time.perf_counter()
if rc:
    sys.exit(rc)
print(json.dumps({"import_s": t1 - t0, "seconds": t2 - t1,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

HTA = """
import json, logging, os, resource, sys, time, warnings
logging.disable(logging.CRITICAL); warnings.simplefilter("ignore")
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
t1 = time.perf_counter()
TraceAnalysis(trace_files={0: sys.argv[1]}, trace_dir=os.path.dirname(sys.argv[1]))
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "seconds": t2 - t1,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def measure(python: str, code: str, trace: Path, work: Path) -> dict:
    run = work / f"run-{random.getrandbits(32):08x}"
    proc = subprocess.run([python, "-c", code, str(trace), str(run)], capture_output=True,
                          text=True, timeout=3600)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    subprocess.run(["rm", "-rf", str(run)])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def median(xs):
    return statistics.median(xs) if xs else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--traces", default=os.environ.get("COUNTERPROF_TRACES", "/work/shared/traces"))
    p.add_argument("--hta-python", default=os.environ.get("HTA_PYTHON") or next(
        (h for h in ("/work/hta-venv/bin/python", "/work/wt/hta-venv/bin/python") if os.path.exists(h)),
        "/work/hta-venv/bin/python"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="3 rounds, no 1 GB synthetic trace")
    p.add_argument("--synthetic-mb", type=int, default=100, help="synthetic trace both tools read")
    p.add_argument("--big-mb", type=int, default=1024, help="synthetic trace only counterprof reads")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    rounds = 3 if args.quick else args.rounds
    have_hta = Path(args.hta_python).exists()
    if not have_hta:
        print(f"HTA's python not found at {args.hta_python}: counterprof only. Make it with\n"
              "  python3 -m venv hta-venv && hta-venv/bin/pip install holistictraceanalysis==0.5.0\n"
              "and pass --hta-python hta-venv/bin/python", file=sys.stderr)

    from kineto_traces import write_big_trace
    work = Path(tempfile.mkdtemp(prefix="trace-bench-"))
    traces = sorted(Path(args.traces).glob("*.json.gz")) if Path(args.traces).is_dir() else []
    synthetic = work / f"synthetic_{args.synthetic_mb}mb.json"
    write_big_trace(synthetic, args.synthetic_mb << 20)
    traces.append(synthetic)
    results: dict[str, dict] = {t.name: {"bytes": t.stat().st_size, "ours": [], "hta": []} for t in traces}

    for r in range(rounds):
        jobs = [(t, tool) for t in traces for tool in (("ours", "hta") if have_hta else ("ours",))]
        random.shuffle(jobs)
        for trace, tool in jobs:
            python, code = (sys.executable, OURS) if tool == "ours" else (args.hta_python, HTA)
            results[trace.name][tool].append(measure(python, code, trace, work))
        print(f"round {r + 1}/{rounds} done", file=sys.stderr)

    rows = []
    for name, res in results.items():
        ours = [m for m in res["ours"] if "error" not in m]
        hta = [m for m in res["hta"] if "error" not in m]
        row = {"trace": name, "bytes": res["bytes"],
               "ours_s": median([m["seconds"] for m in ours]),
               "ours_rss_mb": median([m["peak_rss_mb"] for m in ours]),
               "hta_s": median([m["seconds"] for m in hta]) if hta else None,
               "hta_rss_mb": median([m["peak_rss_mb"] for m in hta]) if hta else None,
               "hta_error": next((m["error"] for m in res["hta"] if "error" in m), None)}
        if hta and len(hta) == len(ours):
            row["speedup"] = median([h["seconds"] / o["seconds"] for h, o in zip(hta, ours)])
            row["rss_ratio"] = median([o["peak_rss_mb"] / h["peak_rss_mb"] for h, o in zip(hta, ours)])
        rows.append(row)

    big = None
    if not args.quick:
        path = work / f"synthetic_{args.big_mb}mb.json"
        events = write_big_trace(path, args.big_mb << 20)
        runs = [measure(sys.executable, OURS, path, work) for _ in range(2)]
        ok = [m for m in runs if "error" not in m]
        big = {"trace": path.name, "bytes": path.stat().st_size, "events": events,
               "ours_s": median([m["seconds"] for m in ok]),
               "ours_rss_mb": max((m["peak_rss_mb"] for m in ok), default=None),
               "errors": [m["error"] for m in runs if "error" in m]}
        path.unlink()
    subprocess.run(["rm", "-rf", str(work)])

    print(f"\nTrace import, median of {rounds} rounds (time inside the process; peak RSS of the process)\n")
    print(f"{'trace':40} {'MB':>7} {'counterprof':>12} {'HTA 0.5.0':>10} {'faster':>7} "
          f"{'RSS MB ours':>12} {'RSS MB HTA':>11} {'RSS ratio':>10}")
    for r in rows:
        hta = f"{r['hta_s']:.3f} s" if r["hta_s"] is not None else (r["hta_error"] or "-")[:10]
        print(f"{r['trace']:40} {r['bytes'] / 2**20:7.1f} {r['ours_s']:10.3f} s {hta:>10} "
              f"{r.get('speedup', float('nan')):6.1f}x {r['ours_rss_mb']:12.0f} "
              f"{(r['hta_rss_mb'] or float('nan')):11.0f} {r.get('rss_ratio', float('nan')):10.2f}")
    speedups = [r["speedup"] for r in rows if "speedup" in r]
    ratios = [r["rss_ratio"] for r in rows if "rss_ratio" in r]
    verdict = {}
    if speedups:
        geo = statistics.geometric_mean(speedups)
        verdict = {"speedup_min": min(speedups), "speedup_geomean": geo,
                   "rss_ratio_max": max(ratios), "speedup_target_met": min(speedups) >= TARGET_SPEEDUP,
                   "rss_target_met": max(ratios) <= TARGET_RSS_RATIO}
        print(f"\nspeed-up: min {min(speedups):.1f}x, geometric mean {geo:.1f}x (target >= {TARGET_SPEEDUP:g}x)"
              f"; RSS ratio: max {max(ratios):.2f} (target <= {TARGET_RSS_RATIO})")
    if big:
        verdict["big_rss_target_met"] = big["ours_rss_mb"] is not None and big["ours_rss_mb"] < TARGET_1GB_RSS_MB
        print(f"{big['trace']}: {big['bytes'] / 2**20:.0f} MB, {big['events']:,} events in "
              f"{big['ours_s']:.1f} s ({big['bytes'] / 2**20 / big['ours_s']:.0f} MB/s), peak RSS "
              f"{big['ours_rss_mb']:.0f} MB (target < {TARGET_1GB_RSS_MB:g} MB)")
    print(f"\nmachine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end "
          "(shared with other work)")
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rounds, "rows": rows, "big": big,
                                               "verdict": verdict}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
