"""Batches for the live-view tests: a recorded run, and batches shaped like what collectors
this machine cannot run emit (a PMU's cycles/instructions with multiplexing, NVML's GPU
metrics), built with the same schema helper the collectors use."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from counterprof.ground.schema import Metric, samples_batch

RECORDED = Path(__file__).resolve().parent / "data" / "live-phases"
T0 = 1_700_000_000_000_000_000      # an epoch time in ns, a whole number of 250 ms ticks
MS = 1_000_000


def recorded():
    """The run `counterprof run -- python examples/phases.py 2 1` recorded here (no PMU):
    (samples table, catalog by name, meta)."""
    import counterprof
    run = counterprof.load(RECORDED)
    return run.samples(), run.catalog, run.meta


def in_arrival_order(table: pa.Table, rows: int = 64) -> list[pa.RecordBatch]:
    """The table cut into batches the way collectors hand them over: by source, in time order."""
    out = []
    for source in ("perf", "host"):
        part = table.filter(pa.compute.equal(table["source"].cast(pa.string()), source))
        part = part.sort_by("time")
        out.extend(part.to_batches(max_chunksize=rows))
    return out


def perf_batch(t_ns: int, d_ns: int, values: dict[str, float | None], quality: float = 1.0,
               entity: str = "process") -> pa.RecordBatch:
    names = list(values)
    return samples_batch([t_ns] * len(names), [d_ns] * len(names), "perf", names,
                         [entity] * len(names), [values[n] for n in names], [quality] * len(names))


def host_batch(t_ns: int, d_ns: int, values: dict[str, float | None]) -> pa.RecordBatch:
    gauges = {"proc.rss", "proc.threads", "proc.processes", "system.mem_used", "system.mem_available"}
    names = list(values)
    return samples_batch([t_ns] * len(names), [None if n in gauges else d_ns for n in names], "host",
                         names, ["system" if n.startswith("system.") else "process" for n in names],
                         [values[n] for n in names])


# What an NVML collector records per GPU (gauges, plus a throttle-time counter as a delta).
GPU_METRICS = [
    Metric("gpu.util", "percent", "gauge", "share of time a kernel ran", "nvml"),
    Metric("gpm.sm_util", "percent", "gauge", "SM activity", "nvml"),
    Metric("gpm.tensor_util", "percent", "gauge", "tensor pipe activity", "nvml"),
    Metric("gpu.mem_used", "bytes", "gauge", "device memory in use", "nvml"),
    Metric("gpu.mem_total", "bytes", "gauge", "device memory", "nvml"),
    Metric("gpu.power", "W", "gauge", "board power", "nvml"),
    Metric("gpu.power_limit", "W", "gauge", "power limit", "nvml"),
    Metric("gpu.temperature", "C", "gauge", "GPU temperature", "nvml"),
    Metric("gpu.clock_sm", "MHz", "gauge", "SM clock", "nvml"),
    Metric("gpu.throttle_time", "ns", "delta", "time clocks were held down", "nvml"),
    Metric("gpu.throttle_reasons", "bitmask", "gauge", "why clocks are held down", "nvml"),
]


def gpu_batch(t_ns: int, d_ns: int, entity: str, values: dict[str, float | None]) -> pa.RecordBatch:
    kinds = {m.name: m.kind for m in GPU_METRICS}
    names = list(values)
    return samples_batch([t_ns] * len(names), [d_ns if kinds.get(n) == "delta" else None for n in names],
                         "nvml", names, [entity] * len(names), [values[n] for n in names])


def catalog(*extra: Metric) -> dict[str, Metric]:
    base = [Metric("task-clock", "ns", "delta", "", "perf"),
            Metric("context-switches", "", "delta", "", "perf"),
            Metric("page-faults", "", "delta", "", "perf"),
            Metric("cycles", "", "delta", "", "perf"),
            Metric("instructions", "", "delta", "", "perf"),
            Metric("cache-references", "", "delta", "", "perf"),
            Metric("cache-misses", "", "delta", "", "perf"),
            Metric("proc.cpu_user", "s", "delta", "", "host"),
            Metric("proc.cpu_system", "s", "delta", "", "host"),
            Metric("proc.rss", "bytes", "gauge", "", "host"),
            Metric("proc.read_bytes", "bytes", "delta", "", "host"),
            Metric("proc.write_bytes", "bytes", "delta", "", "host"),
            Metric("system.cpu_util", "percent", "ratio", "", "host"),
            Metric("system.cpu_iowait", "percent", "ratio", "", "host"),
            *GPU_METRICS, *extra]
    return {m.name: m for m in base}
