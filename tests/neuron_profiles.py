"""Neuron Explorer profile directories, written as its "Profile Parquet Schema Reference"
documents them (schema 7.4.0, SDK 2.31: every table and field used here, with its Parquet type;
12.x: the same tables under a 12.0.1 profile_schema_version, see below), with timelines whose
truth is set by construction.

No Trainium machine is here, so no profile of a real one: these are the boundary counterprof
cannot have. What they hold:

- Metadata (profile_schema_version, first_hw_timestamp, first_ts, the device's peaks), Summary,
  Instruction, DmaPacket, CcOp, ExecutionInfo, SchemaFields, Warning; a system profile's
  SystemProfileEvents and SystemProfileMetadata when asked.
- engine names as Explorer's UI and its guide print them ("Tensor", "Vector", "Scalar",
  "GpSimd", "Sync"); semaphore waits as instructions (opcode EVENT_SEMAPHORE), which Explorer's
  ActiveTime leaves out of an engine's busy time.
- device timestamps in a hardware clock (ns) that starts nowhere near the Unix epoch; Metadata's
  first_ts (Unix time, whole seconds as its example prints) says where the clock started.
- the system profile's events in Unix ns, nrt_execute on the host's thread around each
  execution, as the runtime records them.

Each job's truth is computed here from the intervals it writes, by this file's own union code
(not counterprof's): shares of the device-active span (first execution's start to the last's
end) that are compute (non-wait instructions on Tensor/Vector/Scalar/GpSimd), exposed
collectives (CcOp outside compute), exposed memory (DMA outside both), idle (nothing running),
and the busiest engine.

12.x: only the introduction of the 12.0.1 reference could be read when this was written; its
tables here are 7.4.0's fields under a 12.0.1 version string (plus the SchemaFields rows that
describe them), so what is tested for 12.x is the version gate and the SchemaFields check, not
12.x's real field list.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ENGINES = ("Tensor", "Vector", "Scalar", "GpSimd", "Sync")
COMPUTE_ENGINES = ("Tensor", "Vector", "Scalar", "GpSimd")
HBM_BANDWIDTH = 410e9           # bytes/s per HBM stack (a trn1-like figure; Metadata.hbm_ddr_bandwidth)
DMA_BANDWIDTH = 200e9           # bytes/s per physical NeuronCore (Metadata.dma_ddr_bandwidth)

# (table, field, Parquet type, unit, required) as the 7.4.0 reference lists them
I64, I32, F32, STR, BOOL = pa.int64(), pa.int32(), pa.float32(), pa.string(), pa.bool_()
FIELDS: dict[str, list[tuple[str, pa.DataType, str, bool]]] = {
    "Metadata": [("profile_schema_version", STR, "", True), ("ntff_version", I32, "", True),
                 ("num_physical_cores", I32, "", True), ("vnc_enabled", BOOL, "", True),
                 ("first_hw_timestamp", I64, "nanoseconds", True), ("last_hw_timestamp", I64, "nanoseconds", True),
                 ("first_ts", STR, "", True), ("last_ts", STR, "", True),
                 ("dma_ddr_bandwidth", F32, "bytes_per_second", True),
                 ("num_dma_engines_per_neuroncore", I32, "", True),
                 ("hbm_ddr_bandwidth", F32, "bytes_per_second", True),
                 ("tensor_engine_num_rows", I64, "", True), ("tensor_engine_num_cols", I64, "", True),
                 ("tensor_engine_clock_freq", F32, "gigahertz", True),
                 ("neuroncore_clock_freq", F32, "gigahertz", True), ("ticks_per_nanosec", I64, "", True),
                 ("instance_type", STR, "", False), ("runtime_version", STR, "", False),
                 ("neuroncore_idx", I64, "", False), ("neuron_device_idx", I64, "", False)],
    "Instruction": [("start_ts", I64, "nanoseconds", True), ("end_ts", I64, "nanoseconds", True),
                    ("duration_ns", I64, "nanoseconds", True), ("engine", STR, "", True),
                    ("pcore_idx", I64, "", False), ("opcode", STR, "", True), ("operands", STR, "", True),
                    ("id", I64, "", True), ("pc", I64, "", True), ("bir_id", STR, "", True),
                    ("hlo_name", STR, "", False), ("evt_wait_time_ns", I64, "nanoseconds", False)],
    "DmaPacket": [("start_ts", I64, "nanoseconds", True), ("end_ts", I64, "nanoseconds", True),
                  ("duration_ns", I64, "nanoseconds", True), ("pcore_idx", I64, "", False),
                  ("id", I64, "", True), ("packet_idx", I32, "", True), ("packet_aggregation_id", I64, "", True),
                  ("engine_idx", I64, "", False), ("read_bytes", I64, "bytes", True),
                  ("write_bytes", I64, "bytes", True), ("transfer_bytes", I64, "bytes", True),
                  ("throughput", F32, "bytes_per_second", True), ("queue_type", STR, "", True),
                  ("queue_name", STR, "", False), ("crc", I64, "", True)],
    "CcOp": [("start_ts", I64, "nanoseconds", True), ("end_ts", I64, "nanoseconds", True),
             ("duration_ns", I64, "nanoseconds", True), ("operation", STR, "", True), ("algorithm", STR, "", True),
             ("num_elements", I64, "", True), ("dtype", STR, "", True), ("op_id", I64, "", True),
             ("stream_id", I64, "", True), ("stream_index", I64, "", True), ("trigger_engine", STR, "", True),
             ("input_size", I64, "bytes", False), ("output_size", I64, "bytes", False)],
    "ExecutionInfo": [("execution_index", I32, "", True), ("neff_name", STR, "", False),
                      ("execution_start_ts", I64, "nanoseconds", False),
                      ("execution_end_ts", I64, "nanoseconds", False)],
    "Summary": [("total_time", F32, "seconds", False), ("model_flops", I64, "flops", False),
                ("mfu_estimated_percent", F32, "percent", False), ("mbu_estimated_percent", F32, "percent", False),
                ("hbm_read_bytes", I64, "bytes", False), ("hbm_write_bytes", I64, "bytes", False),
                ("dma_active_time", F32, "seconds", False), ("dma_active_time_percent", F32, "percent", False),
                ("tensor_engine_active_time_percent", F32, "percent", False),
                ("cc_op_active_time_percent", F32, "percent", False),
                ("mm_arithmetic_intensity", F32, "", False), ("peak_flops_bandwidth_ratio", F32, "", False)],
    "Warning": [("message", STR, "", True), ("category", STR, "", True)],
    "SystemProfileEvents": [("id", I64, "", True), ("name", STR, "", True), ("start_ts", I64, "nanoseconds", True),
                            ("end_ts", I64, "nanoseconds", True), ("duration_ns", I64, "nanoseconds", True),
                            ("trace_event_source", STR, "", True), ("instance_id", STR, "", True),
                            ("process_id", I64, "", True), ("thread_id", I64, "", True),
                            ("nc_idx", I64, "", False)],
    "SystemProfileMetadata": [("first_ts", STR, "", True), ("last_ts", STR, "", True),
                              ("first_ts_ns", STR, "", True), ("last_ts_ns", STR, "", True),
                              ("ntff_version", I64, "", True), ("hbm_capacity_bytes", I64, "bytes", True)],
}


def _union(iv: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _minus(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for lo, hi in a:
        cur = lo
        for blo, bhi in b:
            if bhi <= cur or blo >= hi:
                continue
            if blo > cur:
                out.append((cur, blo))
            cur = max(cur, bhi)
        if cur < hi:
            out.append((cur, hi))
    return out


def _total(iv: list[tuple[int, int]]) -> int:
    return sum(b - a for a, b in iv)


@dataclass
class Truth:
    """What a generated profile holds, from the intervals written."""
    shares: dict[str, float]                   # compute, collectives, memory, host: of the active span
    engine_busy: dict[str, float]              # engine -> non-wait busy time / active span
    top_engine: str
    dma_bytes: int
    executions: int
    device_unix_ns: tuple[int, int]            # the device-active span on the Unix clock (truth)
    hw_to_unix_ns: int                         # unix = hw + this
    verdict: str
    rows: dict[str, int] = field(default_factory=dict)
    idle_in_runtime: float | None = None       # share of the idle time inside nrt_execute calls (system)


# per execution, as fractions of its length: (engine, opcode, start, end) instructions, DMA
# (start, end), CcOp (start, end), and the gap to the next execution (fraction of its length)
SHAPES = {
    # an engine-bound kernel: Tensor busy, DMA mostly hidden under it
    "compute": {"intensity": 400.0, "inst": [("Tensor", "MATMUL", 0.0, 0.70), ("Vector", "TENSOR_TENSOR", 0.70, 0.82),
                         ("Scalar", "ACTIVATE", 0.82, 0.86)],
                "dma": [(0.0, 0.30), (0.86, 0.92)], "cc": [], "gap": 0.05},
    # a DMA-bound copy: the engines wait on semaphores while the DMA queues move data
    "memory": {"intensity": 12.0, "inst": [("Tensor", "EVENT_SEMAPHORE", 0.0, 0.80), ("Tensor", "MATMUL", 0.80, 0.90),
                        ("Sync", "EVENT_SEMAPHORE", 0.0, 0.80)],
               "dma": [(0.0, 0.80), (0.90, 0.96)], "cc": [], "gap": 0.05},
    # a collective: an AllReduce the engines wait for
    "collectives": {"intensity": 300.0,
                    "inst": [("Tensor", "MATMUL", 0.0, 0.12), ("Pool", "EVENT_SEMAPHORE", 0.12, 0.85),
                             ("Vector", "TENSOR_TENSOR", 0.85, 0.95)],
                    "dma": [(0.0, 0.05)], "cc": [(0.12, 0.85)], "gap": 0.05},
    # host gaps: short compute executions far apart (the runtime waiting for the Python)
    "host": {"intensity": 300.0, "inst": [("Tensor", "MATMUL", 0.0, 0.75), ("Vector", "TENSOR_TENSOR", 0.75, 0.85)],
             "dma": [(0.85, 0.9)], "cc": [], "gap": 2.0},
}


def _unix_text(ns: int, whole_seconds: bool) -> str:
    t = dt.datetime.fromtimestamp(ns // 1_000_000_000, tz=dt.timezone.utc)
    if whole_seconds:
        return t.strftime("%Y-%m-%d %H:%M:%S+00:00")
    return t.strftime("%Y-%m-%d %H:%M:%S") + f".{ns % 1_000_000_000:09d}+00:00"


def _table(name: str, cols: dict[str, list[object]], extra_field: bool = False) -> pa.Table:
    fields = [f for f in FIELDS[name] if f[0] in cols]
    arrays = [pa.array(cols[f[0]], type=f[1]) for f in fields]
    names = [f[0] for f in fields]
    if extra_field:        # a MINOR addition this reader has never heard of
        n = len(arrays[0]) if arrays else 0
        arrays.append(pa.array(["future"] * n, type=pa.string()))
        names.append("added_in_a_later_minor")
    return pa.Table.from_arrays(arrays, names=names)


def write_profile(out: str | Path, shape: str, *, version: str = "7.4.0", executions: int = 6,
                  exec_ns: int = 2_000_000, unix_start_ns: int = 1_796_500_000_123_456_789,
                  hw_start_ns: int = 912_345_678_900, core: int = 0, device: int = 0,
                  split: tuple[str, ...] = (), system: bool = False, drop: tuple[str, ...] = (),
                  unknown: bool = False, pieces: int = 10) -> Truth:
    """A processed device profile in `out` (a directory), of one of SHAPES; its Truth.
    split: tables written as Name_0.parquet, Name_1.parquet; drop: tables left out (a missing
    optional table); unknown: an extra table and an extra field this reader does not know;
    system: a system profile's tables beside it (nrt_execute around each execution)."""
    spec = SHAPES[shape]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    gap = int(exec_ns * spec["gap"])
    inst: dict[str, list[object]] = {k: [] for k in ("start_ts", "end_ts", "duration_ns", "engine", "pcore_idx",
                                                     "opcode", "operands", "id", "pc", "bir_id", "hlo_name",
                                                     "evt_wait_time_ns")}
    dma: dict[str, list[object]] = {k: [] for k in ("start_ts", "end_ts", "duration_ns", "pcore_idx", "id",
                                                    "packet_idx", "packet_aggregation_id", "engine_idx",
                                                    "read_bytes", "write_bytes", "transfer_bytes", "throughput",
                                                    "queue_type", "queue_name", "crc")}
    cc: dict[str, list[object]] = {k: [] for k in ("start_ts", "end_ts", "duration_ns", "operation", "algorithm",
                                                   "num_elements", "dtype", "op_id", "stream_id", "stream_index",
                                                   "trigger_engine", "input_size", "output_size")}
    execs: list[tuple[int, int]] = []
    compute_iv: list[tuple[int, int]] = []
    engine_iv: dict[str, list[tuple[int, int]]] = {}
    dma_iv: list[tuple[int, int]] = []
    cc_iv: list[tuple[int, int]] = []
    dma_bytes = 0
    t = hw_start_ns + 50_000          # the first execution starts 50 µs into the trace
    for x in range(executions):
        execs.append((t, t + exec_ns))
        for engine, opcode, a, b in spec["inst"]:
            lo, hi = t + int(a * exec_ns), t + int(b * exec_ns)
            step = (hi - lo) // pieces
            for p in range(pieces):         # back-to-back instructions covering [lo, hi)
                s, e = lo + p * step, (hi if p == pieces - 1 else lo + (p + 1) * step)
                inst["start_ts"].append(s)
                inst["end_ts"].append(e)
                inst["duration_ns"].append(e - s)
                inst["engine"].append(engine)
                inst["pcore_idx"].append(0)
                inst["opcode"].append(opcode)
                inst["operands"].append("" if opcode == "EVENT_SEMAPHORE" else "size=128,128")
                inst["id"].append(len(inst["id"]))
                inst["pc"].append(p)
                inst["bir_id"].append(f"sg0000:{p}")
                inst["hlo_name"].append("dot.1" if opcode == "MATMUL" else None)
                inst["evt_wait_time_ns"].append(e - s if opcode == "EVENT_SEMAPHORE" else 0)
            if opcode != "EVENT_SEMAPHORE":
                engine_iv.setdefault(engine, []).append((lo, hi))
                if engine in COMPUTE_ENGINES:
                    compute_iv.append((lo, hi))
        for a, b in spec["dma"]:
            lo, hi = t + int(a * exec_ns), t + int(b * exec_ns)
            step = (hi - lo) // pieces
            for p in range(pieces):
                s, e = lo + p * step, (hi if p == pieces - 1 else lo + (p + 1) * step)
                # near the HBM stack's peak while it runs
                nbytes = int((e - s) * HBM_BANDWIDTH * 0.9 / 1e9)
                dma_bytes += nbytes
                dma["start_ts"].append(s)
                dma["end_ts"].append(e)
                dma["duration_ns"].append(e - s)
                dma["pcore_idx"].append(0)
                dma["id"].append(len(dma["id"]))
                dma["packet_idx"].append(p)
                dma["packet_aggregation_id"].append(x)
                dma["engine_idx"].append(p % 4)
                dma["read_bytes"].append(nbytes)
                dma["write_bytes"].append(nbytes)
                dma["transfer_bytes"].append(nbytes)
                dma["throughput"].append(nbytes / ((e - s) / 1e9))
                dma["queue_type"].append("data" if a == 0.0 else "output")
                dma["queue_name"].append(f"qSyncIO{p % 4}-Q{p % 16}")
                dma["crc"].append(2847562039)
            dma_iv.append((lo, hi))
        for a, b in spec["cc"]:
            lo, hi = t + int(a * exec_ns), t + int(b * exec_ns)
            cc["start_ts"].append(lo)
            cc["end_ts"].append(hi)
            cc["duration_ns"].append(hi - lo)
            cc["operation"].append("AllReduce")
            cc["algorithm"].append("Ring")
            cc["num_elements"].append(4 << 20)
            cc["dtype"].append("bf16")
            cc["op_id"].append(x)
            cc["stream_id"].append(0)
            cc["stream_index"].append(0)
            cc["trigger_engine"].append("Pool")
            cc["input_size"].append(8 << 20)
            cc["output_size"].append(8 << 20)
            cc_iv.append((lo, hi))
        t += exec_ns + gap
    last_hw = execs[-1][1] + 30_000
    # Metadata.first_ts in whole seconds (as its example prints): the device clock's start on
    # the Unix clock is only known to the second from it
    hw_to_unix = unix_start_ns - hw_start_ns
    activity = _union([*compute_iv, *dma_iv, *cc_iv])      # semaphore waits are not activity
    active = (activity[0][0], activity[-1][1])
    act_ns = active[1] - active[0]
    compute_u = _union(compute_iv)
    cc_exposed = _minus(_union(cc_iv), compute_u)
    mem_exposed = _minus(_minus(_union(dma_iv), compute_u), _union(cc_iv))
    idle = _minus([active], activity)
    shares = {"compute": _total(compute_u) / act_ns, "collectives": _total(cc_exposed) / act_ns,
              "memory": _total(mem_exposed) / act_ns, "host": _total(idle) / act_ns}
    engine_busy = {e: _total(_union(v)) / act_ns for e, v in engine_iv.items()}
    top = max((e for e in engine_busy if e in COMPUTE_ENGINES), key=engine_busy.__getitem__)
    verdict = max(shares, key=shares.__getitem__)

    meta = {"profile_schema_version": [version], "ntff_version": [6], "num_physical_cores": [1],
            "vnc_enabled": [False], "first_hw_timestamp": [hw_start_ns], "last_hw_timestamp": [last_hw],
            "first_ts": [_unix_text(unix_start_ns, True)],
            "last_ts": [_unix_text(last_hw + hw_to_unix, True)],
            "dma_ddr_bandwidth": [DMA_BANDWIDTH], "num_dma_engines_per_neuroncore": [16],
            "hbm_ddr_bandwidth": [HBM_BANDWIDTH], "tensor_engine_num_rows": [128], "tensor_engine_num_cols": [128],
            "tensor_engine_clock_freq": [2.8], "neuroncore_clock_freq": [2.8], "ticks_per_nanosec": [1],
            "instance_type": ["trn1.32xlarge"], "runtime_version": ["2.29.41"],
            "neuroncore_idx": [core], "neuron_device_idx": [device]}
    summary = {"total_time": [(last_hw - hw_start_ns) / 1e9], "model_flops": [int(2 * 4096 ** 3)],
               "mfu_estimated_percent": [round(100 * shares["compute"] * 0.6, 2)],
               "mbu_estimated_percent": [round(100 * shares["memory"] * 0.9, 2)],
               "hbm_read_bytes": [dma_bytes], "hbm_write_bytes": [dma_bytes],
               "dma_active_time": [_total(_union(dma_iv)) / 1e9],
               "dma_active_time_percent": [100 * _total(_union(dma_iv)) / act_ns],
               "tensor_engine_active_time_percent": [100 * engine_busy.get("Tensor", 0.0)],
               "cc_op_active_time_percent": [100 * _total(_union(cc_iv)) / act_ns],
               # the roofline Explorer states: MATMUL FLOPs per DRAM byte, and the ridge (peak
               # Tensor FLOP/s over peak DRAM bandwidth: 128x128 PE at 2.8 GHz, 2 FLOPs a MAC)
               "mm_arithmetic_intensity": [spec["intensity"]],
               "peak_flops_bandwidth_ratio": [128 * 128 * 2 * 2.8e9 / HBM_BANDWIDTH]}
    execinfo = {"execution_index": list(range(executions)), "neff_name": ["graph.neff"] * executions,
                "execution_start_ts": [a - hw_start_ns for a, _ in execs],
                "execution_end_ts": [b - hw_start_ns for _, b in execs]}
    tables = {"Metadata": meta, "Instruction": inst, "DmaPacket": dma, "ExecutionInfo": execinfo,
              "Summary": summary, "Warning": {"message": [], "category": []}}
    if cc["start_ts"]:        # "a workload with no collectives has no CcOp file"
        tables["CcOp"] = cc
    if system:
        ev: dict[str, list[object]] = {k: [] for k in ("id", "name", "start_ts", "end_ts", "duration_ns",
                                                       "trace_event_source", "instance_id", "process_id",
                                                       "thread_id", "nc_idx")}
        for i, (a, b) in enumerate(execs):
            s, e = a + hw_to_unix - 20_000, b + hw_to_unix + 15_000    # the host's call around it
            for k, v in (("id", i), ("name", "nrt_execute"), ("start_ts", s), ("end_ts", e), ("duration_ns", e - s),
                         ("trace_event_source", "neuron_rt"), ("instance_id", "i-0b1ea78ca2865fd32"),
                         ("process_id", 4242), ("thread_id", 4243), ("nc_idx", core)):
                ev[k].append(v)
        tables["SystemProfileEvents"] = ev
        calls = [(a - hw_to_unix, b - hw_to_unix) for a, b in zip(ev["start_ts"], ev["end_ts"])]  # on the hw clock
        idle_in_runtime = _total(_minus(idle, _minus(idle, _union(calls)))) / max(1, _total(idle))
        first = execs[0][0] + hw_to_unix - 20_000
        last = execs[-1][1] + hw_to_unix + 15_000
        tables["SystemProfileMetadata"] = {"first_ts": [_unix_text(first, False)], "last_ts": [_unix_text(last, False)],
                                           "first_ts_ns": [str(first)], "last_ts_ns": [str(last)],
                                           "ntff_version": [6], "hbm_capacity_bytes": [16 << 30]}
    rows = {}
    if not system:
        idle_in_runtime = None
    schema_rows: dict[str, list[object]] = {k: [] for k in ("table_name", "table_description", "field_name",
                                                            "field_description", "field_type", "field_required",
                                                            "field_format", "field_unit")}
    for name, cols in tables.items():
        if name in drop:
            continue
        table = _table(name, cols, extra_field=unknown and name == "Instruction")
        rows[name] = table.num_rows
        for fname, ftype, unit, required in FIELDS[name]:
            for k, v in (("table_name", name), ("table_description", f"{name} table"), ("field_name", fname),
                         ("field_description", fname), ("field_type", _openapi_type(ftype)),
                         ("field_required", required), ("field_format", _openapi_format(ftype)),
                         ("field_unit", unit or None)):
                schema_rows[k].append(v)
        if name in split and table.num_rows > 1:
            half = table.num_rows // 2
            pq.write_table(table.slice(0, half), out / f"{name}_0.parquet")
            pq.write_table(table.slice(half), out / f"{name}_1.parquet")
        else:
            pq.write_table(table, out / f"{name}.parquet")
    pq.write_table(pa.table({k: pa.array(v, type=BOOL if k == "field_required" else STR)
                             for k, v in schema_rows.items()}), out / "SchemaFields.parquet")
    if unknown:        # a table of a later version
        pq.write_table(pa.table({"ts": pa.array([hw_start_ns], I64), "what": ["new"]}), out / "FutureTable.parquet")
    return Truth(shares, engine_busy, top, dma_bytes, executions,
                 (active[0] + hw_to_unix, active[1] + hw_to_unix), hw_to_unix, verdict, rows, idle_in_runtime)


def _openapi_type(t: pa.DataType) -> str:
    return ("integer" if pa.types.is_integer(t) else "number" if pa.types.is_floating(t)
            else "boolean" if pa.types.is_boolean(t) else "string")


def _openapi_format(t: pa.DataType) -> str | None:
    return {pa.int64(): "int64", pa.int32(): "int32", pa.float32(): "float"}.get(t)
