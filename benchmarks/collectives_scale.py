"""`counterprof collectives` on synthetic many-rank runs: seconds and peak memory as the calls grow.

    python benchmarks/collectives_scale.py [--ranks 64] [--steps 50 200 800] [--calls 4] [--rounds 3]

Each run: RANKS ranks, STEPS steps of CALLS all_reduces (4 MiB, gloo spans) each, arrivals
jittered by up to 0.5 ms, the last rank 20 ms late to every 5th step's first call, plus 20 CPU
ops per call on each rank's main thread (what `exposed` is measured against). Runs of each size
are written once; then, per round, `collectives RUN --json` on each size in turn (paired
rounds), in a fresh interpreter, timed, with its peak RSS (its own VmHWM, read as it exits). Prints the
median seconds and peak MB per size, and the ratios of the larger size to the smaller.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from counterprof.ground.schema import SPANS_SCHEMA, spans_batch
from counterprof.store import rundir


def write_run(run: Path, ranks: int, steps: int, calls: int) -> int:
    run.mkdir(parents=True, exist_ok=True, mode=0o700)
    t0 = time.time_ns() - int(steps * 0.1e9) - 10**9
    rng = np.random.default_rng(0)
    for r in range(ranks):
        st, en, name, cat, coll, nbytes, tid = [], [], [], [], [], [], []
        for k in range(steps):
            s0 = t0 + k * 100_000_000
            st.append(s0)
            en.append(s0 + 99_000_000)
            name.append(f"ProfilerStep#{k}")
            cat.append("step")
            coll.append(None)
            nbytes.append(None)
            tid.append(1)
            for c in range(calls):
                late = 20_000_000 if (r == ranks - 1 and k % 5 == 0 and c == 0) else 0
                a = s0 + 5_000_000 + c * 20_000_000 + int(rng.integers(0, 500_000)) + late
                end = s0 + 5_000_000 + c * 20_000_000 + 20_000_000 + 4_000_000 + (late if c == 0 else 0)
                st.append(a)
                en.append(max(a + 1000, end))
                name.append("gloo:all_reduce")
                cat.append("collective")
                coll.append("all_reduce")
                nbytes.append(4 << 20)
                tid.append(2)
                for o in range(20):          # the main thread's ops beside it
                    oa = s0 + c * 20_000_000 + o * 900_000
                    st.append(oa)
                    en.append(oa + 600_000)
                    name.append("aten::mm")
                    cat.append("cpu_op")
                    coll.append(None)
                    nbytes.append(None)
                    tid.append(1)
        t = pa.Table.from_batches([spans_batch(st, en, name, cat, collective=coll, bytes=nbytes,
                                               pid=[1000 + r] * len(st), tid=tid)])
        pq.write_table(t.cast(SPANS_SCHEMA), rundir.dataset_dir(run, "spans", r) / "spans-synthetic.parquet",
                       compression="zstd")
    meta = {"id": run.name, "status": "complete", "command": ["synthetic", f"{ranks} ranks"],
            "start_ns": t0, "end_ns": t0 + steps * 100_000_000, "duration_ns": steps * 100_000_000,
            "host": {"hostname": "synthetic"}, "rank": 0, "collectors": {}}
    (run / "meta.json").write_text(json.dumps(meta))
    (run / "catalog.json").write_text("[]")
    return ranks * steps * calls


# the child reports its own peak: VmHWM belongs to the memory the exec gave it (getrusage's
# ru_maxrss would count the parent's pages the fork started from)
CHILD = ("import atexit, runpy, sys\n"
         "def peak():\n"
         "    hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM'))\n"
         "    sys.stderr.write('PEAK ' + hwm.split()[1] + '\\n')\n"
         "atexit.register(peak)\n"
         "sys.argv = ['counterprof', 'collectives', sys.argv[1], '--json']\n"
         "runpy.run_module('counterprof', run_name='__main__')\n")


def timed(run: Path) -> tuple[float, float, int]:
    """(seconds, peak RSS in MB, calls matched) of one `collectives --json` in a fresh interpreter."""
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, str(run)], capture_output=True, text=True)
    secs = time.perf_counter() - t
    assert proc.returncode == 0, proc.stderr[-2000:]
    peak_kb = int(next(ln for ln in proc.stderr.splitlines() if ln.startswith("PEAK ")).split()[1])
    return secs, peak_kb / 1024, len(json.loads(proc.stdout)["calls"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--steps", type=int, nargs="+", default=[50, 200, 800])
    p.add_argument("--calls", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = {}
        for s in args.steps:
            runs[s] = Path(tmp) / f"run{s}"
            n = write_run(runs[s], args.ranks, s, args.calls)
            print(f"{args.ranks} ranks x {s} steps x {args.calls} calls = {n:,} rank-calls")
        secs: dict[int, list[float]] = {s: [] for s in args.steps}
        peaks: dict[int, list[float]] = {s: [] for s in args.steps}
        matched = {}
        for _ in range(args.rounds):
            for s in args.steps:
                a, m, n = timed(runs[s])
                secs[s].append(a)
                peaks[s].append(m)
                matched[s] = n
        print(f"{'steps':>6} {'calls':>7} {'median s':>9} {'peak MB':>8} {'µs/call':>8}")
        for s in args.steps:
            med = statistics.median(secs[s])
            print(f"{s:>6} {matched[s]:>7} {med:>9.2f} {max(peaks[s]):>8.0f} {1e6 * med / matched[s]:>8.0f}")
        lo, hi = args.steps[0], args.steps[-1]
        print(f"x{hi / lo:g} the calls: x{statistics.median(secs[hi]) / statistics.median(secs[lo]):.2f} "
              f"the time (medians of {args.rounds} paired rounds), peak RSS x{max(peaks[hi]) / max(peaks[lo]):.2f}")


if __name__ == "__main__":
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    main()
