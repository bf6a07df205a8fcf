"""`counterprof correlate` at scale: seconds and peak memory on the largest shared real trace and
on synthetic many-rank runs as the op calls grow, each beside `counterprof roofline` on the same run.

    python benchmarks/correlate_scale.py [--ranks 64] [--calls 2000 4000 8000] [--rounds 3]
                                         [--trace /work/shared/traces/tracelens/h100_timesformer.json.gz]
    python benchmarks/correlate_scale.py --calls 2000 32000 --rounds 1 --trace ''    # ~11 min on 2 cores

Real trace: imported once (`counterprof import TRACE -o DIR -q`); per round, `correlate DIR --model
datasheet --json` and `roofline DIR --json`.

Synthetic runs: RANKS ranks of CALLS op calls each, torch-shaped: cpu_op spans alternating
aten::mm [[256,256],[256,256]] and aten::add [[256,256],[256,256],[]] (attrs JSON with input_dims
and input_types), each with a cudaLaunchKernel (runtime span) and its kernel on the GPU (same
correlation id, durations jittered), a ProfilerStep#k every 100 calls, and the window span naming
an H100 (as an import writes it). Each size is written once, with a copy beside it (the run a run
is held against), and a predictions CSV (kind,name,shapes,predicted_us: the two ops, the two
kernels and the step). Per round, on each size in turn (paired rounds): `roofline RUN --json`,
`correlate RUN --predictions FILE.csv --json`, `correlate RUN --predictions COPY --json` (run vs
run: both runs are measured).

Every command runs in a fresh interpreter, timed from outside (start-up included: what a user
waits for), with its peak RSS (its own VmHWM, read as it exits). Prints the median seconds and
peak MB per command and size, the ratio of each correlate to roofline on the same run (median
of per-round ratios), and the growth from the smallest size to the largest. Target: seconds, not
minutes, with memory flat in the number of calls.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from counterprof.ground.schema import SPANS_SCHEMA
from counterprof.store import rundir

TRACE = "/work/shared/traces/tracelens/h100_timesformer.json.gz"
DEVICE = "NVIDIA H100 80GB HBM3"
OPS = [  # name, input_dims, input_types, kernel, kernel µs (median), predicted µs
    ("aten::mm", [[256, 256], [256, 256]], ["float", "float"], "ampere_sgemm_64x64_nn", 12.0, 10.0),
    ("aten::add", [[256, 256], [256, 256], []], ["float", "float", "Scalar"],
     "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", 3.0, 2.5),
]
CALLS_PER_STEP = 100
GAP_NS = 50_000                      # one op call every 50 µs on the host


def _strings(idx: np.ndarray, values: list[str | None]) -> pa.Array:
    return pa.DictionaryArray.from_arrays(pa.array(idx, pa.int32()), pa.array(values, pa.string())).cast(pa.string())


def write_run(run: Path, ranks: int, calls: int, seed: int = 0) -> int:
    """RANKS ranks of CALLS op calls each (module docstring); the op calls in all."""
    run.mkdir(parents=True, exist_ok=True, mode=0o700)
    t0 = time.time_ns() - calls * GAP_NS - 10**9
    rng = np.random.default_rng(seed)
    attrs = [json.dumps({"input_dims": d, "input_types": t}, separators=(",", ":")) for _, d, t, *_ in OPS]
    steps = -(-calls // CALLS_PER_STEP)
    dur_ns = calls * GAP_NS + 100_000
    for r in range(ranks):
        k = np.arange(calls, dtype=np.int64)
        which = (k % len(OPS)).astype(np.int32)
        s_op = t0 + k * GAP_NS
        e_op = s_op + 20_000
        s_rt, e_rt = s_op + 5_000, s_op + 10_000
        med = np.array([o[4] for o in OPS])[which] * 1000
        kdur = np.maximum(1000, med * rng.lognormal(0.0, 0.1, calls)).astype(np.int64)
        s_k = s_op + 15_000
        e_k = s_k + kdur
        corr = 1_000_000 + k
        s_st = t0 + np.arange(steps, dtype=np.int64) * CALLS_PER_STEP * GAP_NS
        e_st = np.minimum(s_st + CALLS_PER_STEP * GAP_NS - 1_000, t0 + dur_ns)
        n_ops, n_st = calls, steps
        # rows: ops | launches | kernels | steps | window
        start = np.concatenate([s_op, s_rt, s_k, s_st, [t0]])
        end = np.concatenate([e_op, e_rt, e_k, e_st, [t0 + dur_ns]])
        cats = ["cpu_op", "runtime", "kernel", "step", "window"]
        cat_idx = np.concatenate([np.full(n_ops, 0), np.full(n_ops, 1), np.full(n_ops, 2),
                                  np.full(n_st, 3), [4]]).astype(np.int32)
        names = [o[0] for o in OPS] + [o[3] for o in OPS] + ["cudaLaunchKernel", "trace.json"] + \
            [f"ProfilerStep#{i}" for i in range(steps)]
        nk = len(OPS)
        name_idx = np.concatenate([which, np.full(n_ops, 2 * nk), which + nk,
                                   2 * nk + 2 + np.arange(steps), [2 * nk + 1]]).astype(np.int32)
        n = len(start)
        window = json.dumps({"trace": "trace.json", "schema_version": 1, "devices": [DEVICE], "distributed": {}})
        attr_idx = np.concatenate([which, np.full(n_ops, len(OPS)), np.full(n_ops, len(OPS)),
                                   np.full(n_st, len(OPS)), [len(OPS) + 1]]).astype(np.int32)
        nulls_i = np.zeros(n, dtype=bool)
        gpu = np.concatenate([np.zeros(2 * n_ops, bool), np.ones(n_ops, bool), np.zeros(n_st + 1, bool)])
        has_corr = np.concatenate([np.zeros(n_ops, bool), np.ones(2 * n_ops, bool), np.zeros(n_st + 1, bool)])
        host = np.concatenate([np.ones(2 * n_ops, bool), np.zeros(n_ops, bool), np.ones(n_st, bool), [False]])
        has_attrs = np.concatenate([np.ones(n_ops, bool), np.zeros(2 * n_ops + n_st, bool), [True]])
        cols = {
            "start": pa.array(start, pa.int64()).cast(pa.timestamp("ns", tz="UTC")),
            "end": pa.array(end, pa.int64()).cast(pa.timestamp("ns", tz="UTC")),
            "name": _strings(name_idx, names),
            "category": pa.DictionaryArray.from_arrays(pa.array(cat_idx, pa.int32()), pa.array(cats, pa.string())),
            "kernel_class": pa.DictionaryArray.from_arrays(
                pa.array(np.zeros(n, np.int32), pa.int32(), mask=~gpu), pa.array(["compute"], pa.string())),
            "device": pa.array(np.zeros(n, np.int32), pa.int32(), mask=~gpu),
            "stream": pa.array(np.full(n, 7, np.int64), pa.int64(), mask=~gpu),
            "pid": pa.array(np.full(n, 1000 + r, np.int64), pa.int64(), mask=nulls_i),
            "tid": pa.array(np.full(n, 1000 + r, np.int64), pa.int64(), mask=~host),
            "correlation": pa.array(np.concatenate([np.zeros(n_ops, np.int64), corr, corr,
                                                    np.zeros(n_st + 1, np.int64)]), pa.int64(), mask=~has_corr),
            "collective": pa.nulls(n, pa.string()),
            "bytes": pa.nulls(n, pa.int64()),
            "group_size": pa.nulls(n, pa.int32()),
            "attrs": pa.DictionaryArray.from_arrays(pa.array(attr_idx, pa.int32(), mask=~has_attrs),
                                                    pa.array(attrs + ["", window], pa.string())).cast(pa.string()),
        }
        t = pa.Table.from_arrays([cols[f.name] for f in SPANS_SCHEMA], schema=SPANS_SCHEMA).sort_by("start")
        pq.write_table(t, rundir.dataset_dir(run, "spans", r) / "spans-synthetic.parquet", compression="zstd")
    meta = {"id": run.name, "status": "complete", "source": "import", "command": ["synthetic", f"{ranks} ranks"],
            "start_ns": t0, "end_ns": t0 + dur_ns, "duration_ns": dur_ns,
            "host": {"hostname": "synthetic"}, "rank": 0, "collectors": {}}
    (run / "meta.json").write_text(json.dumps(meta))
    (run / "catalog.json").write_text("[]")
    return ranks * calls


def write_predictions(path: Path) -> None:
    lines = ["kind,name,shapes,predicted_us"]
    for name, dims, _, kernel, _, pred in OPS:
        lines.append(f'op,{name},"{json.dumps(dims)}",{pred}')
        lines.append(f'kernel,"{kernel}",,{pred * 1.1}')
    lines.append(f"step,ProfilerStep,,{CALLS_PER_STEP * GAP_NS / 1000 * 0.9}")
    path.write_text("\n".join(lines) + "\n")


# the child reports its own peak: VmHWM belongs to the memory the exec gave it (getrusage's
# ru_maxrss would count the parent's pages the fork started from)
CHILD = ("import atexit, runpy, sys\n"
         "def peak():\n"
         "    hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM'))\n"
         "    sys.stderr.write('PEAK ' + hwm.split()[1] + '\\n')\n"
         "atexit.register(peak)\n"
         "sys.argv = ['counterprof'] + sys.argv[1:]\n"
         "runpy.run_module('counterprof', run_name='__main__')\n")


def timed(argv: list[str]) -> tuple[float, float, dict]:
    """(seconds, peak RSS in MB, its JSON) of one `counterprof ARGV` in a fresh interpreter."""
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True)
    secs = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"counterprof {' '.join(argv)} failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    peak_kb = int(next(ln for ln in proc.stderr.splitlines() if ln.startswith("PEAK ")).split()[1])
    return secs, peak_kb / 1024, json.loads(proc.stdout)


def op_calls(doc: dict) -> int:
    """The op calls a correlate --json output's rows hold (summed over its sources' op items)."""
    return sum(int(it.get("calls") or 0) for it in doc.get("items", []) if it.get("kind") == "op")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--calls", type=int, nargs="+", default=[2000, 4000, 8000], help="op calls per rank")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--trace", default=TRACE, help="the real trace ('' to skip it)")
    args = p.parse_args()
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        real = None
        if args.trace:
            real = Path(tmp) / "real"
            subprocess.run([sys.executable, "-m", "counterprof", "import", args.trace, "-o", str(real), "-q"],
                           check=True)
        csv = Path(tmp) / "sim.csv"
        write_predictions(csv)
        runs, copies = {}, {}
        for n in args.calls:
            t = time.perf_counter()
            runs[n] = Path(tmp) / f"run{n}"
            total = write_run(runs[n], args.ranks, n)
            copies[n] = Path(tmp) / f"other{n}"
            shutil.copytree(runs[n], copies[n])
            print(f"{args.ranks} ranks x {n:,} op calls = {total:,} op calls ({3 * total:,} op/launch/kernel "
                  f"spans), written in {time.perf_counter() - t:.1f} s", flush=True)
        jobs: dict[tuple[str, str], list[str]] = {}
        if real is not None:
            jobs[("real", "roofline")] = ["roofline", str(real), "--json"]
            jobs[("real", "datasheet")] = ["correlate", str(real), "--model", "datasheet", "--json"]
        for n in args.calls:
            jobs[(str(n), "roofline")] = ["roofline", str(runs[n]), "--json"]
            jobs[(str(n), "csv")] = ["correlate", str(runs[n]), "--predictions", str(csv), "--json"]
            jobs[(str(n), "run")] = ["correlate", str(runs[n]), "--predictions", str(copies[n]), "--json"]
        secs: dict[tuple[str, str], list[float]] = {j: [] for j in jobs}
        peaks: dict[tuple[str, str], list[float]] = {j: [] for j in jobs}
        last: dict[tuple[str, str], dict] = {}
        for i in range(args.rounds):
            t = time.perf_counter()
            for j, argv in jobs.items():
                a, m, doc = timed(argv)
                secs[j].append(a)
                peaks[j].append(m)
                last[j] = doc
            print(f"round {i + 1}/{args.rounds}: {time.perf_counter() - t:.1f} s", flush=True)

        def ratio(j: tuple[str, str]) -> float:
            base = (j[0], "roofline")
            return statistics.median(a / b for a, b in zip(secs[j], secs[base]))

        print()
        if real is not None:
            d = last[("real", "datasheet")]
            print(f"real trace {Path(args.trace).name}: {len(d['items'])} rows, coverage {d['coverage']}, "
                  f"MAPE {d['mape']}, {op_calls(d):,} op calls in rows")
            print(f"{'command':<38} {'median s':>9} {'peak MB':>8} {'x roofline':>11}")
            for j, label in ((("real", "roofline"), "roofline --json"),
                             (("real", "datasheet"), "correlate --model datasheet --json")):
                print(f"{label:<38} {statistics.median(secs[j]):>9.2f} {max(peaks[j]):>8.0f} "
                      f"{ratio(j) if j[1] != 'roofline' else 1.0:>11.2f}")
            print()
        print(f"synthetic: {args.ranks} ranks; medians of {args.rounds} paired rounds, fresh interpreter each")
        print(f"{'calls/rank':>10} {'calls':>10} {'command':<22} {'median s':>9} {'peak MB':>8} "
              f"{'x roofline':>11} {'op calls in rows':>17}")
        labels = {"roofline": "roofline", "csv": "correlate --pred CSV", "run": "correlate --pred RUN"}
        for n in args.calls:
            for what in ("roofline", "csv", "run"):
                j = (str(n), what)
                matched = "" if what == "roofline" else f"{op_calls(last[j]):,}"
                print(f"{n:>10,} {args.ranks * n:>10,} {labels[what]:<22} {statistics.median(secs[j]):>9.2f} "
                      f"{max(peaks[j]):>8.0f} {ratio(j) if what != 'roofline' else 1.0:>11.2f} {matched:>17}")
        lo, hi = str(args.calls[0]), str(args.calls[-1])
        print()
        for what in ("roofline", "csv", "run"):
            print(f"{labels[what]:<22} x{args.calls[-1] / args.calls[0]:g} the calls: "
                  f"x{statistics.median(secs[(hi, what)]) / statistics.median(secs[(lo, what)]):.2f} the time, "
                  f"peak RSS x{max(peaks[(hi, what)]) / max(peaks[(lo, what)]):.2f} "
                  f"({max(peaks[(lo, what)]):.0f} -> {max(peaks[(hi, what)]):.0f} MB)")
        print(f"\ntotal {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    main()
