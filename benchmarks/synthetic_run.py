"""Write a synthetic run directory of any size, for the export and report benchmarks.

    python benchmarks/synthetic_run.py -o /tmp/big --ranks 64 --minutes 10 --hz 100 --metrics 20

Each rank gets samples of `metrics` perf/host-like series at `hz` (deltas with durations and
gauges), plus spans: one step every second with a gloo all_reduce inside it, so report,
export and compare have regions, steps and collectives to work on. Rank r's steps run 1% x r
longer (a gentle straggler gradient). Written straight to Parquet (64k-row groups, like
compaction), one rank at a time, so memory stays small however big the run.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from counterprof.ground.schema import SAMPLES_SCHEMA, SPANS_SCHEMA, spans_batch
from counterprof.store import rundir

DELTAS = ["task-clock", "context-switches", "page-faults", "cpu-migrations", "proc.cpu_user",
          "proc.cpu_system", "proc.read_bytes", "proc.write_bytes", "instructions", "cycles"]
GAUGES = ["proc.rss", "proc.threads", "system.mem_used", "system.mem_available", "gpu.util",
          "gpu.mem_used", "gpu.power", "gpu.temp", "gpu.sm_clock", "gpm.tensor_util"]
UNITS = {"task-clock": "ns", "proc.cpu_user": "s", "proc.cpu_system": "s", "proc.read_bytes": "bytes",
         "proc.write_bytes": "bytes", "proc.rss": "bytes", "system.mem_used": "bytes",
         "system.mem_available": "bytes", "gpu.util": "percent", "gpu.mem_used": "bytes",
         "gpu.power": "W", "gpu.temp": "celsius", "gpu.sm_clock": "MHz", "gpm.tensor_util": "percent"}
ROWS = 64 * 1024


def source_of(metric: str) -> str:
    if metric.startswith("gpm."):
        return "gpm"
    if metric.startswith("gpu."):
        return "nvml"
    if metric.startswith(("proc.", "system.")):
        return "host"
    return "perf"


def metrics(n: int) -> list[str]:
    both = [m for pair in zip(DELTAS, GAUGES) for m in pair]
    out = both[:n]
    while len(out) < n:   # more than 20: numbered raw events
        out.append(f"r{len(out):04x}")
    return out


def write_rank(run: Path, rank: int, names: list[str], t0: int, seconds: float, hz: float) -> int:
    step_ns = int(1e9 / hz)
    ticks = int(seconds * hz)
    dicts = {k: pa.array(v) for k, v in (("source", ["perf", "host", "nvml", "gpm"]), ("metric", names),
                                           ("entity", ["process", "system", "gpu:0"]))}
    src_idx = {"perf": 0, "host": 1, "nvml": 2, "gpm": 3}
    writer = pq.ParquetWriter(rundir.dataset_dir(run, "samples", rank) / "samples-synthetic.parquet",
                              SAMPLES_SCHEMA, compression="zstd")
    m = len(names)
    is_delta = np.array([x in DELTAS or x.startswith("r") for x in names])
    src = np.array([src_idx[source_of(x)] for x in names], np.int32)
    ent = np.array([2 if source_of(x) in ("nvml", "gpm") else 1 if x.startswith("system.") else 0
                    for x in names], np.int32)
    rows = 0
    per_batch = max(1, ROWS // m)
    for start in range(0, ticks, per_batch):
        k = np.arange(start, min(ticks, start + per_batch), dtype=np.int64)
        kk = np.repeat(k, m)                      # tick of each row
        ii = np.tile(np.arange(m), len(k))        # metric of each row
        t = t0 + (kk + 1) * step_ns
        delta = is_delta[ii]
        dur = pa.array(np.where(delta, step_ns, 0), mask=~delta)
        val = ((kk * 7 + ii * 13 + rank) % 97 + (kk // int(hz)) % 10).astype(np.float64)
        batch = pa.RecordBatch.from_arrays([
            pa.array(t).cast(SAMPLES_SCHEMA.field("time").type),
            dur,
            pa.DictionaryArray.from_arrays(pa.array(src[ii]), dicts["source"]),
            pa.DictionaryArray.from_arrays(pa.array(ii.astype(np.int32)), dicts["metric"]),
            pa.DictionaryArray.from_arrays(pa.array(ent[ii]), dicts["entity"]),
            pa.array(val),
            pa.array(np.ones(len(kk), np.float32)),
        ], schema=SAMPLES_SCHEMA)
        writer.write_batch(batch)
        rows += len(kk)
    writer.close()

    # one step a second, 60% of it inside an all_reduce; rank r's steps run 1% x r longer
    steps = int(seconds)
    st, en, name, cat, coll, nbytes = [], [], [], [], [], []
    for k in range(steps):
        s0 = t0 + k * 1_000_000_000
        length = int(0.9e9 * (1 + 0.01 * rank) / (1 + 0.01 * 63))
        st += [s0, s0 + length // 3]
        en += [s0 + length, s0 + length // 3 + int(length * 0.6)]
        name += [f"ProfilerStep#{k}", "gloo:all_reduce"]
        cat += ["step", "collective"]
        coll += [None, "all_reduce"]
        nbytes += [None, 32 << 20]
    spans = pa.Table.from_batches([spans_batch(st, en, name, cat, collective=coll, bytes=nbytes,
                                               pid=[1000 + rank] * len(st), tid=[1000 + rank] * len(st))])
    pq.write_table(spans.cast(SPANS_SCHEMA), rundir.dataset_dir(run, "spans", rank) / "spans-synthetic.parquet",
                   compression="zstd")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--hz", type=float, default=100.0)
    p.add_argument("--metrics", type=int, default=20)
    args = p.parse_args()
    run = Path(args.output)
    run.mkdir(parents=True, exist_ok=True, mode=0o700)
    names = metrics(args.metrics)
    t0 = time.time_ns() - int(args.minutes * 60e9)
    seconds = args.minutes * 60
    rows = 0
    started = time.perf_counter()
    for r in range(args.ranks):
        rows += write_rank(run, r, names, t0, seconds, args.hz)
    catalog = [{"name": m, "unit": UNITS.get(m, "count"),
                "kind": "delta" if (m in DELTAS or m.startswith("r")) else "gauge",
                "description": "synthetic", "source": source_of(m)} for m in names]
    (run / "catalog.json").write_text(json.dumps(catalog, indent=1))
    meta = {"id": run.name, "status": "complete", "command": ["synthetic", f"{args.ranks} ranks"],
            "start_ns": t0, "end_ns": t0 + int(seconds * 1e9), "duration_ns": int(seconds * 1e9),
            "host": {"hostname": "synthetic"}, "rank": 0,
            "collectors": {"perf": {"status": "ok", "config": {"interval_ms": 1000 / args.hz}},
                           "host": {"status": "ok", "config": {"interval_ms": 1000 / args.hz}}}}
    (run / "meta.json").write_text(json.dumps(meta, indent=1))
    size = sum(f.stat().st_size for f in run.rglob("*") if f.is_file())
    print(f"{run}: {args.ranks} ranks x {args.minutes:g} min x {args.hz:g} Hz x {args.metrics} metrics = "
          f"{rows:,} sample rows, {size / 1e6:.1f} MB on disk, written in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
