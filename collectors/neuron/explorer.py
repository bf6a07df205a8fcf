"""A Neuron Explorer profile directory -> spans and samples on the run's clock.

Neuron Explorer (Neuron SDK >= 2.29) processes a device profile (.ntff with its .neff) and a
system profile (trace_info.pb, ntrace.pb, ...) into a directory of Parquet tables, documented
table by table and field by field in its "Profile Parquet Schema Reference"; large tables are
split into numbered files (Instruction_0.parquet, Instruction_1.parquet). What is read:

| table | becomes |
|---|---|
| Metadata | the schema version (gate), the device clock's start on the Unix clock, the core's peaks |
| Instruction | spans `neuron_inst` "<Engine> <OPCODE>" on `neuron:D/core:C/engine:E` (waits: class other) |
| DmaPacket | spans `neuron_dma` "DMA <queue_type>" with their bytes, on `neuron:D/core:C/dma:Q` |
| CcOp | spans `neuron_cc` (the collective, its bytes), on `neuron:D/core:C/cc` |
| ExecutionInfo | spans `neuron_exec` (one per execution of a NEFF) |
| Summary | samples `neuron.profile.*` (MFU, MBU, HBM bytes, DMA and engine active time) over the profile |
| SystemProfileEvents | spans `neuron_runtime` on the host's threads (pid, tid); nrt_execute aligns the clocks |

Versions: Metadata.profile_schema_version is MAJOR.MINOR.PATCH, MAJOR an incompatible change.
The majors this reader maps are SUPPORTED; another is refused, naming what to do. Within a
major, a field this reader needs must be in the Parquet file with the documented type, and,
where the profile's own SchemaFields table describes it, with the documented unit: a renamed or
retyped field stops the import naming it (never a misread). Tables and fields this reader does
not know are named in the import's problems and left alone.
"""
from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from counterprof.ground.errors import CounterprofError
from counterprof.ground.record import record
from counterprof.ground.schema import SAMPLES_SCHEMA, SPANS_SCHEMA, Metric

from .profile_dirs import is_profile_dir, table_files  # noqa: F401  (is_profile_dir: this reader's test of a directory)

SOURCE = "neuron_explorer"

# the majors read, and the Neuron SDK that writes them
SUPPORTED = {7: "Neuron SDK 2.31 (schema 7.x)", 12: "Neuron SDK 2.33 (schema 12.x)"}

# the fields read, per table: name -> (Parquet type family, unit as SchemaFields names it,
# required by this reader). 7.x from the 7.4.0 reference; 12.x keeps these names and units
# (the profile's SchemaFields is checked against them, so a change stops the import).
_INT, _NUM, _STR = "integer", "number", "string"
_FIELDS: dict[str, dict[str, tuple[str, str | None, bool]]] = {
    "Metadata": {"profile_schema_version": (_STR, None, True), "first_hw_timestamp": (_INT, "nanoseconds", True),
                 "last_hw_timestamp": (_INT, "nanoseconds", True), "first_ts": (_STR, None, True),
                 "hbm_ddr_bandwidth": (_NUM, "bytes_per_second", False),
                 "dma_ddr_bandwidth": (_NUM, "bytes_per_second", False),
                 "neuroncore_idx": (_INT, None, False), "neuron_device_idx": (_INT, None, False),
                 "instance_type": (_STR, None, False)},
    "Instruction": {"start_ts": (_INT, "nanoseconds", True), "end_ts": (_INT, "nanoseconds", True),
                    "engine": (_STR, None, True), "opcode": (_STR, None, True)},
    "DmaPacket": {"start_ts": (_INT, "nanoseconds", True), "end_ts": (_INT, "nanoseconds", True),
                  "transfer_bytes": (_INT, "bytes", True), "queue_type": (_STR, None, True),
                  "queue_name": (_STR, None, False)},
    "CcOp": {"start_ts": (_INT, "nanoseconds", True), "end_ts": (_INT, "nanoseconds", True),
             "operation": (_STR, None, True), "input_size": (_INT, "bytes", False),
             "output_size": (_INT, "bytes", False)},
    "ExecutionInfo": {"execution_index": (_INT, None, True), "neff_name": (_STR, None, False),
                      "execution_start_ts": (_INT, "nanoseconds", False),
                      "execution_end_ts": (_INT, "nanoseconds", False)},
    "Summary": {},          # every documented figure that is there (SUMMARY below)
    "SystemProfileEvents": {"name": (_STR, None, True), "start_ts": (_INT, "nanoseconds", True),
                            "end_ts": (_INT, "nanoseconds", True), "process_id": (_INT, None, True),
                            "thread_id": (_INT, None, True), "nc_idx": (_INT, None, False)},
}
KNOWN_TABLES = {*_FIELDS, "SchemaFields", "Warning", "SystemProfileMetadata", "ActiveTime", "AssemblyInstruction",
                "BirInstruction", "CcInstruction", "CcStream", "CoreBarriers", "CpuUsage", "DeviceProfileList",
                "DmaPacketAggregated", "DmaQueuesInfo", "DmaUsage", "DmaUsageSummary", "Error", "Flow",
                "FrameworkInstruction", "FrameworkNode", "HbmUsage", "HbmUsageSummaryByType", "HloInstruction",
                "HostMemUsage", "KernelInstructions", "KernelIterationVariables", "KernelStackFrames", "NeffHeader",
                "OpcodeSummary", "PendingDma", "PenguinInstruction", "PsumUsage", "SbufAllocation", "SbufUsage",
                "SemaphoreUpdate", "StackFrame", "StackFrameFileLocation", "StackFrameFileName",
                "StackFrameFunctionName", "SystemProfileHbmUsage", "Throttle", "ThrottleSummary"}

# Summary fields -> (metric, unit, kind, what): percent stays percent, as the neuron
# collector's utilizations are (Parquet: 0-100)
_PCT, _ENGINE_BUSY = ("percent", "ratio"), "ran an instruction other than a semaphore wait (Summary)"
SUMMARY = {
    "mfu_estimated_percent": ("neuron.profile.mfu", *_PCT, "Model FLOPs Utilization Explorer estimated"),
    "hfu_estimated_percent": ("neuron.profile.hfu", *_PCT, "Hardware FLOPs Utilization Explorer estimated"),
    "mbu_estimated_percent": ("neuron.profile.mbu", *_PCT,
                              "Memory Bandwidth Utilization: achieved HBM bandwidth over the peak"),
    "hbm_read_bytes": ("neuron.profile.hbm_read_bytes", "bytes", "delta", "bytes the DMA engines read from HBM"),
    "hbm_write_bytes": ("neuron.profile.hbm_write_bytes", "bytes", "delta", "bytes the DMA engines wrote to HBM"),
    "model_flops": ("neuron.profile.model_flops", "FLOP", "delta", "useful Tensor Engine FLOPs of the model"),
    "dma_active_time_percent": ("neuron.profile.dma_active", *_PCT, "time at least one DMA packet was moving"),
    "tensor_engine_active_time_percent": ("neuron.profile.tensor_active", *_PCT, "time the Tensor engine "
                                          + _ENGINE_BUSY),
    "vector_engine_active_time_percent": ("neuron.profile.vector_active", *_PCT, "time the Vector engine "
                                          + _ENGINE_BUSY),
    "scalar_engine_active_time_percent": ("neuron.profile.scalar_active", *_PCT, "time the Scalar engine "
                                          + _ENGINE_BUSY),
    "gpsimd_engine_active_time_percent": ("neuron.profile.gpsimd_active", *_PCT, "time the GpSimd engine "
                                          + _ENGINE_BUSY),
    "cc_op_active_time_percent": ("neuron.profile.cc_active", *_PCT, "time at least one collective was active"),
    "mm_arithmetic_intensity": ("neuron.profile.mm_intensity", "FLOP/B", "gauge",
                                "MATMUL FLOPs per byte moved to and from DRAM"),
    "peak_flops_bandwidth_ratio": ("neuron.profile.ridge", "FLOP/B", "gauge",
                                   "the roofline's ridge: peak Tensor FLOP/s over peak DRAM bandwidth"),
}
METRICS = [Metric(m, unit, kind, f"{words} (Summary.{f})", SOURCE) for f, (m, unit, kind, words) in SUMMARY.items()] + [
    Metric("neuron.profile.hbm_peak", "bytes/s", "gauge", "the HBM stack's peak bandwidth the profile states "
           "(Metadata.hbm_ddr_bandwidth)", SOURCE)]

# engines that compute; a semaphore wait on any engine is the engine waiting, not computing.
# The UI and guides print "Tensor", "Vector", "Scalar", "GpSimd" (its DMA trigger: "Pool"),
# "Sync"; field examples print them lower-case
COMPUTE_ENGINES = ("tensor", "vector", "scalar", "gpsimd", "pool", "act", "pe", "dve")
WAIT_OPCODES = re.compile(r"SEMAPHORE|^WAIT|_WAIT$", re.IGNORECASE)


class NeuronProfileError(CounterprofError):
    """A Neuron Explorer profile this reader cannot read (named, with what to do)."""


@record
class Alignment:
    method: str           # how the device clock was put on the Unix clock
    within_ns: int        # how far off it can be
    pairs: int = 0        # executions matched to the runtime's nrt_execute calls
    shift_ns: int = 0     # the move from Metadata's own start, where nrt_execute decided

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "within_ns": self.within_ns, "pairs": self.pairs, "shift_ns": self.shift_ns}


@record
class Profile:
    path: Path
    version: str
    device: int
    core: int
    spans: pa.Table
    samples: pa.Table
    window: tuple[int, int]                 # the profile's span on the Unix clock
    alignment: Alignment
    counts: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)


def _read(files: list[Path], table: str) -> pa.Table:
    parts = []
    for f in files:
        try:
            parts.append(pq.read_table(f))
        except (pa.ArrowInvalid, OSError) as exc:
            raise NeuronProfileError(f"{f}: not a readable Parquet file ({_short(exc)}): the profile was cut "
                                     "or damaged; process it again with neuron-explorer") from None
    try:
        return pa.concat_tables(parts, promote_options="permissive")
    except pa.ArrowInvalid as exc:
        raise NeuronProfileError(f"{table}: its numbered files disagree on their fields ({_short(exc)})") from None


def _short(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


def _family(t: pa.DataType) -> str:
    if pa.types.is_integer(t) or pa.types.is_timestamp(t):
        return _INT
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return _NUM
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t):
        return _STR
    return str(t)


def _version_major(version: str, where: Path) -> int:
    m = re.fullmatch(r"\s*(\d+)\.(\d+)\.(\d+)\s*", version or "")
    if not m:
        raise NeuronProfileError(f"{where}: Metadata.profile_schema_version is {version!r}, not MAJOR.MINOR.PATCH: "
                                 "not a Neuron Explorer profile this reader knows")
    major = int(m.group(1))
    if major not in SUPPORTED:
        known = ", ".join(f"{k}.x" for k in SUPPORTED)
        raise NeuronProfileError(
            f"{where}: profile schema {version} (major {major}) is not one this counterprof reads ({known}: "
            f"{'; '.join(SUPPORTED.values())}). A major change renames or retypes fields, so it is not read "
            "by guess: process the .ntff/.neff again with the neuron-explorer of one of those SDKs, or "
            "upgrade counterprof")
    return major


class _Checked:
    """One table's columns, checked against what this reader maps for the profile's major."""

    def __init__(self, name: str, table: pa.Table, schema_fields: dict[tuple[str, str], dict[str, Any]],
                 version: str, problems: list[str]):
        self.name, self.table = name, table
        wanted = _FIELDS.get(name, {})
        cols = set(table.column_names)
        for fname, (family, unit, required) in wanted.items():
            described = schema_fields.get((name, fname))
            if fname not in cols:
                if required:
                    raise NeuronProfileError(
                        f"{name}: no field {fname!r} in this profile (schema {version}); counterprof reads "
                        f"{name}.{fname} ({family}{', ' + unit if unit else ''}) in this major: the field was "
                        "renamed or removed; report the schema version, or process the profile with the "
                        "neuron-explorer of a supported SDK")
                continue
            got = _family(table.schema.field(fname).type)
            if got != family:
                raise NeuronProfileError(f"{name}.{fname} is {table.schema.field(fname).type} in this profile, "
                                         f"not the {family} of schema {version}: not read by guess")
            if described and unit and described.get("field_unit") and described["field_unit"] != unit:
                raise NeuronProfileError(f"{name}.{fname}: the profile's SchemaFields gives its unit as "
                                         f"{described['field_unit']!r}, not {unit!r}: not read by guess")
        if wanted:
            extra = sorted(cols - set(wanted) - _DOCUMENTED.get(name, set()))
            if extra:
                problems.append(f"{name}: fields not known to this reader (left out): {', '.join(extra)}")

    def col(self, name: str) -> pa.ChunkedArray | None:
        return self.table[name] if name in self.table.column_names else None


# the documented fields of 7.4.0 this reader does not use (not named as unknown)
_DOCUMENTED = {
    "Instruction": {"duration_ns", "timeline_track", "pcore_idx", "operands", "compiler_opcode", "compiler_operands",
                    "id", "pc", "compiler_pc", "penguin_id", "raw_penguin_id", "bir_id", "raw_bir_id",
                    "bir_instruction_name", "kernel_instruction_name", "crc_in", "crc_out", "evt_wait_time_ns",
                    "hlo_attrs", "hlo_name", "raw_hlo_id", "raw_framework_id", "layer", "stack_frame_ids",
                    "nki_source_location", "bir_debug_info_source_location", "dma_trigger_start_ts",
                    "dma_trigger_end_ts", "dma_wait_time_ns"},
    "DmaPacket": {"duration_ns", "pcore_idx", "id", "packet_idx", "packet_aggregation_id", "engine_idx",
                  "read_bytes", "write_bytes", "throughput", "variable", "queue_idx", "crc"},
    "CcOp": {"duration_ns", "algorithm", "num_elements", "dtype", "op_id", "stream_id", "stream_index",
             "trigger_engine", "algorithm_bandwidth", "bus_bandwidth", "trigger_start_ts", "cc_trigger_start_delay",
             "replica_group_id", "replica_group"},
    "ExecutionInfo": {"num_subgraphs", "row_count"},
    "Metadata": {"ntff_version", "num_physical_cores", "vnc_enabled", "last_ts", "num_dma_engines_per_neuroncore",
                 "tensor_engine_num_rows", "tensor_engine_num_cols", "tensor_engine_clock_freq",
                 "vector_engine_clock_freq", "vector_engine_num_channels", "scalar_engine_clock_freq",
                 "scalar_engine_num_channels", "gpsimd_engine_clock_freq", "gpsimd_engine_num_channels",
                 "neuroncore_clock_freq", "ticks_per_nanosec", "runtime_version", "collectives_version",
                 "driver_version", "explorer_version", "compiler_version", "ultraserver_id", "ultraserver_type",
                 "ultraserver_size", "ultraserver_instance_index", "s3_bucket_path", "profile_name",
                 "explorer_build_time", "is_simulation"},
    "SystemProfileEvents": {"id", "duration_ns", "trace_event_source", "instance_id", "pcore_idx", "worker_gid",
                            "flow_id", "framework_stream_id", "extra_attributes_json"},
}


def _unix_ns(text: str) -> tuple[int, int]:
    """'2026-12-06 10:00:00.123456789+00:00' -> (Unix ns, resolution ns of the text)."""
    m = re.fullmatch(r"\s*(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?\s*(Z|[+-]\d\d:?\d\d)?\s*", text or "")
    if not m:
        raise NeuronProfileError(f"Metadata.first_ts is {text!r}, not a date and time: the device clock "
                                 "cannot be placed on the Unix clock")
    zone = m.group(3) or "+00:00"
    base = dt.datetime.fromisoformat(m.group(1).replace(" ", "T") + ("+00:00" if zone == "Z" else zone))
    frac = m.group(2) or ""
    return int(base.timestamp()) * 1_000_000_000 + int(frac.ljust(9, "0") or 0), 10 ** (9 - len(frac))


def read_profile(path: str | Path) -> Profile:
    """Read one processed profile directory (see the module's table)."""
    root = Path(path)
    files = table_files(root)
    if "Metadata" not in files:
        raise NeuronProfileError(f"{root}: no Metadata.parquet: not a Neuron Explorer profile directory (the "
                                 "directory neuron-explorer writes with --output-file, or <data-path>/profiles/"
                                 "global/<name>@latest/)")
    problems: list[str] = []
    meta_t = _read(files["Metadata"], "Metadata")
    if meta_t.num_rows == 0 or "profile_schema_version" not in meta_t.column_names:
        raise NeuronProfileError(f"{root}: Metadata has no profile_schema_version: not a profile this reader knows")
    meta = meta_t.slice(0, 1).to_pylist()[0]
    version = str(meta["profile_schema_version"])
    _version_major(version, root)
    schema_fields: dict[tuple[str, str], dict[str, Any]] = {}
    if "SchemaFields" in files:
        sf = _read(files["SchemaFields"], "SchemaFields")
        if {"table_name", "field_name"} <= set(sf.column_names):
            for row in sf.to_pylist():
                schema_fields[(row["table_name"], row["field_name"])] = row
    _Checked("Metadata", meta_t, schema_fields, version, problems)
    unknown = sorted(set(files) - KNOWN_TABLES)
    if unknown:
        problems.append(f"tables not known to this reader (left in the profile, not imported): {', '.join(unknown)}")
    if "Warning" in files:
        for w in _read(files["Warning"], "Warning").to_pylist()[:5]:
            problems.append(f"Neuron Explorer warned: {w.get('category') or ''}: {w.get('message') or ''}".strip())

    first_hw, last_hw = int(meta["first_hw_timestamp"]), int(meta["last_hw_timestamp"])
    start_unix, resolution = _unix_ns(str(meta["first_ts"]))
    hw_to_unix = start_unix - first_hw
    device = int(meta.get("neuron_device_idx") or 0)
    core = int(meta.get("neuroncore_idx") or 0)
    tables: dict[str, _Checked] = {}
    for name in ("Instruction", "DmaPacket", "CcOp", "ExecutionInfo", "SystemProfileEvents", "Summary"):
        if name in files:
            tables[name] = _Checked(name, _read(files[name], name), schema_fields, version, problems)
    if not any(n in tables for n in ("Instruction", "DmaPacket", "CcOp")):
        raise NeuronProfileError(f"{root}: no Instruction, DmaPacket or CcOp table: a system profile alone has no "
                                 "device timeline; give the device profile's directory")
    alignment = Alignment("Metadata.first_ts", resolution)
    execs = _executions(tables.get("ExecutionInfo"), first_hw)
    runtime = tables.get("SystemProfileEvents")
    if runtime is not None and execs:
        alignment, hw_to_unix = _align(execs, runtime, core, hw_to_unix, alignment, problems)
    elif execs:
        problems.append("no system profile beside the device profile: its clock is placed from Metadata.first_ts "
                        f"alone (to within {_dur(resolution)}); process the device and system profiles together "
                        "to align it to the microsecond")

    d, c = device, core
    parts = []
    if "Instruction" in tables:
        parts.append(_instructions(tables["Instruction"], hw_to_unix, d, c))
    if "DmaPacket" in tables:
        parts.append(_dma(tables["DmaPacket"], hw_to_unix, d, c))
    if "CcOp" in tables:
        parts.append(_cc(tables["CcOp"], hw_to_unix, d, c))
    if execs:
        parts.append(_exec_spans(execs, tables.get("ExecutionInfo"), hw_to_unix, d, c))
    if runtime is not None:
        parts.append(_runtime(runtime))
    window = (first_hw + hw_to_unix, last_hw + hw_to_unix)
    facts = {"hbm_bandwidth": meta.get("hbm_ddr_bandwidth"), "dma_bandwidth": meta.get("dma_ddr_bandwidth"),
             "instance_type": meta.get("instance_type"), "schema_version": version}
    parts.append(_window(root, window, d, c, alignment, facts))
    spans = pa.concat_tables([p.cast(SPANS_SCHEMA) for p in parts])
    samples = _summary(tables.get("Summary"), window, d, c, meta)
    counts = {n: t.table.num_rows for n, t in tables.items()}
    return Profile(root, version, device, core, spans, samples, window, alignment, counts, problems, facts)


def _dur(ns: int) -> str:
    return f"{ns / 1e9:g} s" if ns >= 1e9 else f"{ns / 1e3:g} µs" if ns >= 1e3 else f"{ns} ns"


def _executions(t: _Checked | None, first_hw: int) -> list[tuple[int, int]]:
    if t is None or t.col("execution_start_ts") is None or t.col("execution_end_ts") is None:
        return []
    s, e = t.col("execution_start_ts").to_pylist(), t.col("execution_end_ts").to_pylist()   # type: ignore[union-attr]
    # "relative to the start of the profile"
    return [(first_hw + a, first_hw + b) for a, b in zip(s, e) if a is not None and b is not None and b >= a]


def _align(execs: list[tuple[int, int]], runtime: _Checked, core: int, hw_to_unix: int, first: Alignment,
           problems: list[str]) -> tuple[Alignment, int]:
    """Put each execution inside the runtime's nrt_execute call that ran it (in order, on this
    NeuronCore): the offsets that fit every pair form a range; its middle is taken, and half its
    width is how far off the clocks can be."""
    names = runtime.col("name").to_pylist()                     # type: ignore[union-attr]
    nc = runtime.col("nc_idx")
    ncs = nc.to_pylist() if nc is not None else [None] * len(names)
    s, e = runtime.col("start_ts").to_pylist(), runtime.col("end_ts").to_pylist()  # type: ignore[union-attr]
    calls = sorted((a, b) for n, c, a, b in zip(names, ncs, s, e)
                   if n == "nrt_execute" and (c is None or c == core) and a is not None and b is not None)
    if not calls:
        problems.append("the system profile has no nrt_execute call on this NeuronCore: the device clock is placed "
                        f"from Metadata.first_ts alone (to within {_dur(first.within_ns)})")
        return first, hw_to_unix
    if len(calls) != len(execs):
        problems.append(f"{len(execs)} executions on the device but {len(calls)} nrt_execute calls on the host: "
                        "matched in order, as many as both have")
    n = min(len(calls), len(execs))
    # pair i: the device's execution must start after its call starts and end before it ends
    lo = max(calls[i][0] - execs[i][0] for i in range(n))
    hi = min(calls[i][1] - execs[i][1] for i in range(n))
    if lo <= hi:
        off, within = (lo + hi) // 2, (hi - lo) // 2
    else:       # no single offset fits every pair (a call shorter than its execution): the median
        mids = sorted((calls[i][0] + calls[i][1]) // 2 - (execs[i][0] + execs[i][1]) // 2 for i in range(n))
        off = mids[n // 2]
        within = max(abs(m - off) for m in mids)
        problems.append("the executions do not all fit inside their nrt_execute calls at one clock offset: "
                        f"aligned by their middles, to within {_dur(within)}")
    return Alignment("nrt_execute", max(1, within), n, off - hw_to_unix), off


def _ts(col: pa.ChunkedArray, offset: int) -> pa.Array:
    return pc.add(col.cast(pa.int64()), offset).cast(pa.timestamp("ns", tz="UTC"))


def _spans(n: int, start: Any, end: Any, name: Any, category: str, klass: Any, device: int, core: int,
           *, collective: Any = None, nbytes: Any = None, attrs: Any = None, pid: Any = None,
           tid: Any = None) -> pa.Table:
    def const(v: Any, t: pa.DataType) -> pa.Array:
        if isinstance(v, (pa.Array, pa.ChunkedArray)):
            return v
        return pa.nulls(n, t) if v is None else pa.array([v] * n, t)
    return pa.table({
        "start": start, "end": end, "name": name,
        "category": const(category, pa.string()), "kernel_class": klass if not isinstance(klass, (str, type(None)))
        else const(klass, pa.string()),
        "device": const(device if pid is None else None, pa.int32()),
        "stream": const(core if pid is None else None, pa.int64()),
        "pid": const(pid, pa.int64()), "tid": const(tid, pa.int64()),
        "correlation": pa.nulls(n, pa.int64()), "collective": const(collective, pa.string()),
        "bytes": const(nbytes, pa.int64()), "group_size": pa.nulls(n, pa.int32()),
        "attrs": const(attrs, pa.string())})


def _clean(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """A name fit for an entity and a JSON string: letters, digits, _ . - only."""
    return pc.replace_substring_regex(pc.fill_null(col.cast(pa.string()), "?"), r"[^A-Za-z0-9_.\-]", "_")


def _instructions(t: _Checked, off: int, d: int, c: int) -> pa.Table:
    engine = _clean(t.col("engine"))
    opcode = pc.fill_null(t.col("opcode").cast(pa.string()), "?")        # type: ignore[union-attr]
    low = pc.utf8_lower(engine)
    computes = pc.is_in(low, pa.array(COMPUTE_ENGINES))
    waits = pc.match_substring_regex(opcode, WAIT_OPCODES.pattern, ignore_case=True)
    klass = pc.if_else(pc.and_(computes, pc.invert(waits)), "compute", "other")
    entity = pc.binary_join_element_wise(f"neuron:{d}/core:{c}/engine:", engine, "")
    attrs = pc.binary_join_element_wise('{"engine":"', engine, '","entity":"', entity,
                                        pc.if_else(waits, '","wait":true}', '"}'), "")
    return _spans(t.table.num_rows, _ts(t.col("start_ts"), off), _ts(t.col("end_ts"), off),
                  pc.binary_join_element_wise(engine, opcode, " "), "neuron_inst", klass, d, c, attrs=attrs)


def _dma(t: _Checked, off: int, d: int, c: int) -> pa.Table:
    qtype = _clean(t.col("queue_type"))
    qname = _clean(t.col("queue_name")) if t.col("queue_name") is not None else qtype
    entity = pc.binary_join_element_wise(f"neuron:{d}/core:{c}/dma:", qname, "")
    attrs = pc.binary_join_element_wise('{"queue_type":"', qtype, '","queue":"', qname, '","entity":"', entity,
                                        '"}', "")
    return _spans(t.table.num_rows, _ts(t.col("start_ts"), off), _ts(t.col("end_ts"), off),
                  pc.binary_join_element_wise("DMA", qtype, " "), "neuron_dma", "memory", d, c,
                  nbytes=t.col("transfer_bytes").cast(pa.int64()), attrs=attrs)      # type: ignore[union-attr]


def _cc(t: _Checked, off: int, d: int, c: int) -> pa.Table:
    op = pc.fill_null(t.col("operation").cast(pa.string()), "collective")   # type: ignore[union-attr]
    n = t.table.num_rows
    sizes = [t.col(f) for f in ("input_size", "output_size") if t.col(f) is not None]
    nbytes = (pc.max_element_wise(*[s.cast(pa.int64()) for s in sizes]) if sizes  # type: ignore[union-attr]
              else pa.nulls(n, pa.int64()))
    return _spans(n, _ts(t.col("start_ts"), off), _ts(t.col("end_ts"), off), op,
                  "neuron_cc", "communication", d, c, collective=op, nbytes=nbytes,
                  attrs=json.dumps({"entity": f"neuron:{d}/core:{c}/cc"}))


def _exec_spans(execs: list[tuple[int, int]], t: _Checked | None, off: int, d: int, c: int) -> pa.Table:
    names = (t.col("neff_name").to_pylist() if t is not None and t.col("neff_name") is not None  # type: ignore[union-attr]
             else [None] * len(execs))
    ts = pa.timestamp("ns", tz="UTC")
    return _spans(len(execs), pa.array([a + off for a, _ in execs], pa.int64()).cast(ts),
                  pa.array([b + off for _, b in execs], pa.int64()).cast(ts),
                  pa.array([n or "execution" for n in names[:len(execs)]], pa.string()), "neuron_exec", None, d, c,
                  attrs=pa.array([json.dumps({"execution": i, "entity": f"neuron:{d}/core:{c}"})
                                  for i in range(len(execs))], pa.string()))


def _runtime(t: _Checked) -> pa.Table:
    # the system profile's events are on the Unix clock already (SystemProfileMetadata.first_ts_ns)
    return _spans(t.table.num_rows, _ts(t.col("start_ts"), 0), _ts(t.col("end_ts"), 0),
                  pc.fill_null(t.col("name").cast(pa.string()), "?"), "neuron_runtime", None, 0, 0,   # type: ignore[union-attr]
                  pid=t.col("process_id").cast(pa.int64()), tid=t.col("thread_id").cast(pa.int64()))  # type: ignore[union-attr]


def _window(root: Path, window: tuple[int, int], d: int, c: int, alignment: Alignment,
            facts: dict[str, Any]) -> pa.Table:
    ts = pa.timestamp("ns", tz="UTC")
    attrs = json.dumps({"entity": f"neuron:{d}/core:{c}", "alignment": alignment.to_json(),
                        **{k: v for k, v in facts.items() if v is not None}})
    return _spans(1, pa.array([window[0]], pa.int64()).cast(ts), pa.array([window[1]], pa.int64()).cast(ts),
                  pa.array([f"{root.name}.neuron-profile"], pa.string()), "window", None, d, c, attrs=attrs)


def _summary(t: _Checked | None, window: tuple[int, int], d: int, c: int, meta: dict[str, Any]) -> pa.Table:
    rows: list[tuple[str, float, str]] = []
    entity = f"neuron:{d}/core:{c}"
    if t is not None and t.table.num_rows:
        first = t.table.slice(0, 1).to_pylist()[0]
        for fname, (metric, _u, _k, _w) in SUMMARY.items():
            v = first.get(fname)
            if isinstance(v, (int, float)):
                rows.append((metric, float(v), entity))
    if isinstance(meta.get("hbm_ddr_bandwidth"), (int, float)):
        rows.append(("neuron.profile.hbm_peak", float(meta["hbm_ddr_bandwidth"]), entity))
    n = len(rows)
    dur = window[1] - window[0]
    # a count over the profile ends with it; a utilization or peak is one figure for the whole
    # profile, put at its middle (the report's scope starts at the first activity, after the
    # profile's own start)
    delta = {m for m, _u, kind, _w in SUMMARY.values() if kind == "delta"}
    return pa.table({
        "time": pa.array([window[1] if r[0] in delta else (window[0] + window[1]) // 2 for r in rows],
                         pa.int64()).cast(SAMPLES_SCHEMA.field("time").type),
        "duration_ns": pa.array([dur if r[0] in delta else None for r in rows], pa.int64()),
        "source": pa.array([SOURCE] * n, pa.string()), "metric": pa.array([r[0] for r in rows], pa.string()),
        "entity": pa.array([r[2] for r in rows], pa.string()), "value": pa.array([r[1] for r in rows], pa.float64()),
        "quality": pa.array([1.0] * n, pa.float32())}).cast(SAMPLES_SCHEMA)
