"""`counterprof import`: this checkout against another checkout's importer (main's), side by
side in one run, and a check that both write the same spans.

    python benchmarks/import_speed.py                                   # vs /work/main
    python benchmarks/import_speed.py --baseline /path/to/.venv/bin/python --rounds 7
    python benchmarks/import_speed.py --pythonpath /tmp/isal            # both with ISA-L
    python benchmarks/import_speed.py --baseline .venv/bin/python --baseline-pythonpath /tmp/base
                                       # main's commit as a package folder, made with
        git archive COMMIT | tar -x -C /tmp/src && cd /tmp/src &&
        PYTHONPATH=native python -c "from build_native import ffibuilder; ffibuilder.compile(tmpdir='.')" &&
        mkdir /tmp/base && cp -r counterprof /tmp/base/ && cp -r collectors /tmp/base/counterprof/ &&
        cp counterprof/_native*.so /tmp/base/counterprof/
      (needed while the checkout itself cannot be imported from: /work/main in the middle of a merge)
    python benchmarks/import_speed.py --hta /path/to/hta-venv/bin/python  # and HTA 0.5.0 beside them
    python benchmarks/import_speed.py --baseline none --rounds 7   # ours against HTA only
        (HTA from $HTA_PYTHON, else /work/hta-venv/bin/python, made with
         python3 -m venv /work/hta-venv && /work/hta-venv/bin/pip install HolisticTraceAnalysis==0.5.0)

Each measurement is a fresh process (`python -P`, so neither checkout's working directory
shadows the installed counterprof) doing `counterprof import TRACE -o RUN -q`: its wall time
from outside (what a user waits for: start-up included) and the import command's time inside
it, as the console script runs it: main(["import", ...]) with numpy, pyarrow and the importer
loaded by the command (the first trace is scanned while they load), so "import call" includes
their loading, where HTA's TraceAnalysis call does not include its imports.
With --hta, HTA 0.5.0's TraceAnalysis(trace_files=...) runs in the same rounds (as in
trace_import.py: parse, correlate, filter; --hta-pythonpath where HTA is a folder of packages).
Each round runs every tool on every trace in a random order; figures are medians over the
rounds, and the speed-up is the median of per-round ratios. Before timing, both importers'
spans of every trace are compared, every column and every attrs value: the script stops when
they differ (a faster import that writes other spans is no result).

Default traces: three shared ones of different sizes (1.8, 0.75 and 0.12 MB gzipped). Each
process runs with its compiled bytecode (PYTHONDONTWRITEBYTECODE is dropped, and the first,
unmeasured run of each tool writes it), as an installed package's and HTA's (pip compiles it)
are: compiling counterprof's modules on every start would cost it ~50 ms that no user pays.
The target (issue 14): the whole process of `counterprof import` at least 12x faster than HTA's.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from kineto_traces import SHARED  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from trace_import import HTA  # noqa: E402

DEFAULT_TRACES = ("a100_rank3of8.json.gz", "a100_nccl_rank0of2.json.gz", "sampled_rank0of128.json.gz")
TARGET_VS_HTA = 12.0          # issue 14: the whole process, against HTA 0.5.0's

IMPORT = """
import json, os, sys, time
t0 = time.perf_counter()
from counterprof.cli import main
t1 = time.perf_counter()
# as the console script runs it: the command loads numpy, pyarrow and the importer itself (and
# since 2026-12-04 scans the first trace while they load), so the call includes them
rc = main(["import", sys.argv[1], "-o", sys.argv[2], "-q"])
t2 = time.perf_counter()
print(json.dumps({"rc": rc, "import_s": t1 - t0, "seconds": t2 - t1}))
try:    # the end of `counterprof import`'s process, as its console script ends it
    from counterprof.cli import FAST_EXIT, exit_without_teardown
    if "import" in FAST_EXIT:
        exit_without_teardown(rc)
except ImportError:
    pass
"""


def measure(python: str, trace: str, run: Path, env: dict, code: str = IMPORT) -> dict:
    shutil.rmtree(run, ignore_errors=True)
    t0 = time.perf_counter()
    proc = subprocess.run([python, "-P", "-c", code, trace, str(run)], capture_output=True,
                          text=True, env=env, cwd=run.parent, timeout=600)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{python} import {trace}: {proc.stderr.strip()[-500:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["wall_s"] = wall
    return out


def spans(run: Path):
    import pyarrow.parquet as pq
    return [pq.read_table(f) for f in sorted(glob.glob(str(run / "spans" / "*" / "*.parquet")))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="*", help="default: " + ", ".join(DEFAULT_TRACES))
    p.add_argument("--baseline", default="/work/main/.venv/bin/python",
                   help="the other checkout's python ('none': ours and HTA only, no spans check)")
    p.add_argument("--baseline-pythonpath", help="put first on the baseline's PYTHONPATH (a folder "
                   "holding another checkout's counterprof package, built)")
    p.add_argument("--ours", default=sys.executable)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--pythonpath", help="prepended to both importers' PYTHONPATH (e.g. a folder with isal)")
    p.add_argument("--hta", default=os.environ.get("HTA_PYTHON") or next(
        (h for h in ("/work/hta-venv/bin/python",) if os.path.exists(h)), None),
                   help="a python that has HTA 0.5.0 (holistictraceanalysis); default $HTA_PYTHON, "
                        "else /work/hta-venv/bin/python where it exists; 'none': no HTA")
    p.add_argument("--hta-pythonpath", help="HTA's PYTHONPATH")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    print("command: " + " ".join([os.path.relpath(sys.executable), *sys.argv]), file=sys.stderr)
    no_baseline = args.baseline == "none"
    args.baseline, args.ours = os.path.abspath(args.baseline), os.path.abspath(args.ours)
    args.hta = args.hta and args.hta != "none" and os.path.abspath(args.hta)
    traces = args.traces or [str(SHARED / t) for t in DEFAULT_TRACES]
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if args.pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.pythonpath, env.get("PYTHONPATH")]))
    tools = {"ours": args.ours} if no_baseline else {"baseline": args.baseline, "ours": args.ours}
    envs = {"ours": env, "baseline": dict(env)}
    if args.baseline_pythonpath:
        envs["baseline"]["PYTHONPATH"] = os.pathsep.join(
            filter(None, [args.baseline_pythonpath, env.get("PYTHONPATH")]))
    hta_failed: dict[str, str] = {}
    hta_env = dict(env)
    if args.hta_pythonpath:
        hta_env["PYTHONPATH"] = args.hta_pythonpath
    work = Path(tempfile.mkdtemp(prefix="import_speed_"))
    try:
        for trace in traces:                   # the same spans, or no figures (and the bytecode written)
            got = {}
            for tool, python in tools.items():
                measure(python, trace, work / tool, envs[tool])
                got[tool] = spans(work / tool)
            if no_baseline:
                continue
            a, b = got["baseline"], got["ours"]
            if len(a) != len(b) or not all(x.equals(y) for x, y in zip(a, b)):
                print(f"{trace}: the spans differ from the baseline's", file=sys.stderr)
                return 1
        if not no_baseline:
            print(f"spans identical to the baseline's on {len(traces)} trace(s)", file=sys.stderr)
        for trace in traces if args.hta else []:   # HTA's first run: its files read once, unmeasured
            try:
                measure(args.hta, trace, work / "run", hta_env, HTA)
            except SystemExit:
                pass
        res: dict = {(tool, t): [] for tool in tools for t in traces}
        for r in range(args.rounds):
            jobs = [(tool, t) for tool in tools for t in traces]
            random.shuffle(jobs)
            if args.hta:
                jobs += [("hta", t) for t in traces]
                random.shuffle(jobs)
            for tool, t in jobs:
                if tool == "hta":
                    try:
                        res.setdefault((tool, t), []).append(measure(args.hta, t, work / "run", hta_env, HTA))
                    except SystemExit as exc:      # HTA 0.5.0 fails on some traces (the MI300X ones)
                        hta_failed[t] = str(exc).splitlines()[-1]
                else:
                    res[(tool, t)].append(measure(tools[tool], t, work / "run", envs[tool]))
            print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def med(tool, t, key):
        return statistics.median(m[key] for m in res[(tool, t)])

    def ratio(t, key, other="baseline"):
        return statistics.median(b[key] / o[key] for b, o in zip(res[(other, t)], res[("ours", t)]))

    rows = []
    if not no_baseline:
        print("| trace | gzipped | whole process: baseline | ours | faster | import call: baseline | ours | faster |")
        print("|---|---|---|---|---|---|---|---|")
    for t in traces:
        row = {"trace": os.path.basename(t), "gz_mb": os.path.getsize(t) / 1e6,
               **{f"{tool}_{k}": med(tool, t, k) for tool in tools for k in ("wall_s", "seconds", "import_s")}}
        rows.append(row)
        if no_baseline:
            continue
        row.update(wall_ratio=ratio(t, "wall_s"), call_ratio=ratio(t, "seconds"))
        print(f"| {row['trace']} | {row['gz_mb']:.1f} MB | {row['baseline_wall_s']:.3f} s | {row['ours_wall_s']:.3f} s "
              f"| {row['wall_ratio']:.2f}x | {row['baseline_seconds']:.3f} s | {row['ours_seconds']:.3f} s "
              f"| {row['call_ratio']:.2f}x |")
    if args.hta:
        print()
        print(f"against HTA 0.5.0, medians of {args.rounds} paired rounds; faster: the median of "
              f"per-round ratios (target: the whole process >= {TARGET_VS_HTA:g}x)")
        print()
        print("| trace | gzipped | whole process: HTA 0.5.0 | baseline | ours | ours faster than HTA "
              "| HTA's TraceAnalysis call | ours: import command (libraries loaded in it) "
              "| ours: the rest (interpreter, exit) |")
        print("|---|---|---|---|---|---|---|---|---|")
        for t, row in zip(traces, rows):
            if t in hta_failed:
                print(f"| {row['trace']} | {row['gz_mb']:.2f} MB | HTA fails: {hta_failed[t][:80]} | | | | | | |")
                continue
            row.update(hta_wall_s=med("hta", t, "wall_s"), hta_seconds=med("hta", t, "seconds"),
                       hta_wall_ratio=ratio(t, "wall_s", "hta"), hta_call_ratio=ratio(t, "seconds", "hta"))
            base = "-"
            if not no_baseline:
                row["hta_baseline_wall_ratio"] = statistics.median(
                    h["wall_s"] / b["wall_s"] for h, b in zip(res[("hta", t)], res[("baseline", t)]))
                base = f"{row['baseline_wall_s']:.3f} s ({row['hta_baseline_wall_ratio']:.1f}x)"
            print(f"| {row['trace']} | {row['gz_mb']:.2f} MB | {row['hta_wall_s']:.2f} s | {base} "
                  f"| {row['ours_wall_s']:.3f} s | {row['hta_wall_ratio']:.1f}x "
                  f"| {row['hta_seconds']:.2f} s | {row['ours_seconds']:.3f} s ({row['hta_call_ratio']:.1f}x) "
                  f"| {row['ours_wall_s'] - row['ours_seconds']:.3f} s |")
    print(f"\nmachine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end "
          "(shared with other work)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
