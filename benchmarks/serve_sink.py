"""The cost of `--serve` per batch, beside the live window's (the sink every live run has):
both fed the same perf-shaped samples batches in one process, in alternating rounds.

    python benchmarks/serve_sink.py [--rows 200] [--rounds 7]

Prints µs per batch for openmetrics.Totals.write and LiveWindow.write (medians over rounds)
and their ratio, then the cost of one scrape (the whole exposition) over those totals.
"""
from __future__ import annotations

import argparse
import statistics
import time

import pyarrow as pa

from counterprof.openmetrics import LiveCollector, Totals
from counterprof.live.window import LiveWindow

METRICS = ["task-clock", "page-faults", "context-switches", "cpu-migrations"]


def batch(rows: int, t0: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({
        "time": pa.array([t0 + i * 10_000_000 for i in range(rows)], pa.int64()),
        "duration_ns": pa.array([10_000_000] * rows, pa.int64()),
        "source": pa.array(["perf"] * rows).dictionary_encode(),
        "metric": pa.array([METRICS[i % 4] for i in range(rows)]).dictionary_encode(),
        "entity": pa.array(["process"] * rows).dictionary_encode(),
        "value": pa.array([1e7] * rows, pa.float64()),
        "quality": pa.array([1.0] * rows, pa.float64())})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=200)
    a = ap.parse_args()
    b = batch(a.rows, time.time_ns())
    totals, window = Totals(), LiveWindow()
    res: dict[str, list[float]] = {"totals": [], "window": []}
    for _ in range(a.rounds):
        for name, sink in (("totals", totals), ("window", window)):
            s = time.perf_counter()
            for _ in range(a.calls):
                sink.write("samples", b, 0)
            res[name].append((time.perf_counter() - s) / a.calls * 1e6)
    for name, v in res.items():
        print(f"{name:7s} {statistics.median(v):8.0f} µs per {a.rows}-row batch")
    print(f"ratio   {statistics.median(res['totals']) / statistics.median(res['window']):8.2f} (totals / window)")
    from prometheus_client import CollectorRegistry, generate_latest
    reg = CollectorRegistry(auto_describe=False)
    reg.register(LiveCollector(totals, window))
    scrapes = []
    for _ in range(a.rounds):
        s = time.perf_counter()
        generate_latest(reg)
        scrapes.append((time.perf_counter() - s) * 1e3)
    print(f"scrape  {statistics.median(scrapes):8.2f} ms (exposition of {len(totals.rows())} series)")


if __name__ == "__main__":
    main()
