"""JAX (XProf) profiles -> spans (counterprof.ground.schema.SPANS_SCHEMA), times in epoch ns (UTC).

    table = convert_profile("logdir")      # every profile under it, one table (no window spans)
    for done in read_profiles("logdir"):   # per file: .table, .window, .rank, .problems, ...
        ...
    costs = module_costs("logdir")         # XLA's cost analysis of each module the profile ran

Which file is read: the XSpace (`<host>.xplane.pb`) is what jax.profiler records; the Chrome
traces beside it (`<host>.trace.json.gz`, `perfetto_trace.json.gz`) are views made from it that
lose what a run needs: their times are relative to the session's start with no anchor, their
pids are plane numbers, and they drop the HLO of each module (so no op's opcode, no collective
told from a fusion by anything but its name). A session folder's XSpace is read when there is
one; a Chrome trace only where there is none (or it could not be read at all), anchored with
the XSpace beside it when its start time can be read, else with the folder's name (the local
time jax wrote it, to the second) and said so.

Decoding: Google's protobuf runtime (upb) against tsl's schema (tsl/profiler/protobuf/xplane.proto
and the HLO fields of xla/service/hlo.proto and xla/xla_data.proto, declared below by field
number: no package ships these as Python classes -- xprof reads an XSpace through its own 41 MB
C++ library, and jaxlib's ProfileData shows neither a line's thread id nor the event metadata
that holds each module's HLO). The outer layers (the XSpace's planes, a plane's lines and
metadata entries) are walked here by their wire framing, each part decoded by protobuf on its
own: a cut or damaged file keeps every part that decodes, and the problem is said with where.
An XPlane writes its event names after its events, so a plane cut inside its events keeps none.

Categories (host planes: /host:CPU):
    an event with an hlo_op stat -> xla_op (name: the HLO instruction; attrs: hlo_op,
        hlo_module, program_id, device_ordinal, run_id, and from the module's HLO its opcode
        and category: "dot fusion", "loop fusion", "convolution", "copy", ...); a collective
        (all-reduce, all-gather, reduce-scatter, collective-permute, all-to-all, by opcode,
        else by name) -> collective, with the collective, its bytes and group size. On the CPU
        the ops run on the host's threads: device stays null (it means an accelerator here) and
        the XLA device is attrs' device_ordinal.
    an event with a correlation_id stat (a GPU runtime call: cuLaunchKernel, hipMemcpyDtoDAsync)
        -> runtime, with the correlation that links it to its kernel, as in torch traces
    an event with a step_num stat (jax.profiler.StepTraceAnnotation) -> step, named
        ProfilerStep#<step_num> as the torch side names steps (attrs: step_num, annotation)
    PjitFunction(...), PmapFunction(...), ExecuteReplicated.__call__ -> dispatch (outermost)
    device_put / device_get / np.asarray of an array -> transfer (outermost; attrs: direction)
    *Client::Compile -> compile (outermost)
    Python functions ($...), the runtime's own steps, markers: left out, counted.
Device planes (/device:GPU:N, /device:TPU:N): stream lines' events -> kernel, memcpy, memset
with the device, stream and correlation (kernel_class as for torch traces; attrs: hlo_op,
hlo_module and the op's opcode and category); the "XLA Ops" line (TPU) -> xla_op/collective
with the device; the lines that repeat others (XLA Modules, Steps, ...) left out. Checked
against real ROCm GPU profiles (shared/traces/jax); the TPU lines from XPlane's conventions only.
No XLA op on the CPU or GPU carries its FLOPs or bytes; where a profile's events do (TPU's),
they go into attrs as flops and bytes_accessed. Elsewhere the conversion gets them from XLA's
own cost analysis of the modules' HLO (module_costs' per-op figures: each top-level op alone,
jaxlib's HloCostAnalysis), run in a child process (costs_in_subprocess: an XLA abort or hang
cannot take an import or a run down; COUNTERPROF_JAX_COST_TIMEOUT seconds, default 60, 0 turns
it off) and put into each xla_op/collective span's attrs: flops, bytes_accessed (XLA's "bytes
accessed" of the op as one op: for a fusion what the fused op reads and writes in memory, its
internal intermediates not counted -- already fused traffic), transcendentals, dtype (of the
op's result: fp16/bf16/fp32/fp64, absent for others). What was done is in the window span's
attrs as xla_costs {status: ok|none|off, reason, modules, ops, op_spans, seconds}; a failure
is also a problem of the file ("no FLOPs or bytes per XLA op: ..."). A profile with no HLO (a
Chrome trace, a cut metadata plane) has no costs and no xla_costs.

pid: the profile's process_id (the OS pid); tid: the XLine's id (tsl's id of the thread, not
the OS tid). Device spans carry the host process's pid, as torch's do.

A Chrome trace is read as the host's events only (its device processes are not told apart):
the fallback where there is no XSpace.
"""
from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import field
from pathlib import Path
from typing import Any

import pyarrow as pa

from counterprof.ground.kernels import collective_in_kernel_name, kernel_class
from counterprof.ground.errors import CounterprofError
from counterprof.ground.record import record
from counterprof.ground.schema import SPANS_SCHEMA

from . import JSON_SUFFIX, PERFETTO_NAME, STAMP, XPLANE_SUFFIX, in_session_folder

CATEGORIES = ("xla_op", "collective", "dispatch", "transfer", "compile", "step", "kernel",
              "memcpy", "memset", "runtime", "window")
CLASSES = ("compute", "communication", "memory", "other")
_CAT = {c: i for i, c in enumerate(CATEGORIES)}
_CLASS = {c: i for i, c in enumerate(CLASSES)}
BATCH_ROWS = 64 * 1024
ABSOLUTE_NS = 10 ** 18         # a line timestamp beyond this (2001) is epoch ns, not relative
MAX_RANK = 2 ** 20 - 1

COLLECTIVE_OPCODES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute",
                      "all-to-all", "ragged-all-to-all", "collective-broadcast")
_COLLECTIVE_NAME = re.compile(r"^(" + "|".join(COLLECTIVE_OPCODES) + r")(?:-start|-done)?(?:[.\d]|$)")
_DISPATCH = re.compile(r"^(?:PjitFunction|PmapFunction)\(|^ExecuteReplicated\.__call__$")
_COMPILE = re.compile(r"Client::Compile(?:AndLoad)?$")
# jax's names for its host<->device copies (the outermost of each; the nested steps are dropped)
_TRANSFERS = {
    "DevicePut": "h2d", "DevicePutWithSharding": "h2d", "BufferFromPyval": "h2d",
    "batched_copy_array_to_devices_with_sharding": "h2d", "TransferToDevice": "h2d",
    "TransferLiteralToDevice": "h2d", "BatchedDevicePut": "h2d",
    "ArrayImpl.copy_to_host_async": "d2h", "np.asarray(jax.Array)": "d2h",
    "ArrayImpl._value": "d2h", "CopyToHostAsync": "d2h", "TransferLiteralFromDevice": "d2h",
}
# host-plane events left out by their name alone (no stat read): Python, markers, thread pools
_SKIP_PREFIXES = ("$", "end: ", "ThreadpoolListener::")
# device-plane lines that repeat what other lines hold
_DEVICE_SKIP_LINES = ("XLA Modules", "Steps", "Framework Ops", "Framework Name Scope",
                      "Source code", "XLA TraceMe", "Launch Stats", "TensorFlow Ops",
                      "TensorFlow Name Scope")
_DEVICE_PLANE = re.compile(r"^/device:([A-Z_]+):(\d+)")

# event kinds, decided once per event metadata (its name) before any stat is read
SKIP, STATS, DISPATCH, TRANSFER, COMPILE = range(5)
# the stats read (anything else is ignored)
_WANTED_STATS = ("hlo_op", "hlo_module", "program_id", "device_ordinal", "run_id", "step_num",
                 "flops", "bytes_accessed", "model_flops", "correlation_id", "memcpy_details")
(HLO_OP, HLO_MODULE, PROGRAM_ID, DEVICE_ORDINAL, RUN_ID, STEP_NUM, FLOPS, BYTES_ACCESSED,
 MODEL_FLOPS, CORRELATION, MEMCPY) = range(len(_WANTED_STATS))
_N_STATS = len(_WANTED_STATS)
# the stats an op event on the CPU carries first: once all are read, the rest are not
_HOST_OP_STATS = 5


class JaxProfileError(CounterprofError):
    """The file cannot be read as a JAX profile at all (missing, empty, not an XSpace)."""


@record
class Converted:
    """One profile file's spans and what was learned reading it."""

    path: str
    fmt: str = "xplane"                      # "xplane" or "chrome-json"
    table: pa.Table | None = None            # its spans (no window span)
    window: tuple[int, int] | None = None    # epoch ns: the profile session (its recorded time)
    host: str | None = None
    pid: int | None = None
    rank: int | None = None                  # from the profile ("rank"/"process_index" metadata) or its path
    rank_source: str = ""
    events: int = 0                          # events read
    spans: int = 0
    device_spans: int = 0
    anchor: str = ""                         # where the absolute start time came from
    problems: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)   # for the window span's attrs

    def window_batch(self) -> pa.RecordBatch | None:
        """The window span of this file (the recorded session, with what was read in attrs)."""
        if self.window is None:
            return None
        attrs = json.dumps({**self.info, "problems": self.problems} if self.problems else self.info,
                           separators=(",", ":"), default=str)
        cols = _Columns()
        cols.add(self.window[0], self.window[1], os.path.basename(self.path), _CAT["window"],
                 pid=self.pid, attrs=attrs)
        return cols.batch(0)


# ---- files ------------------------------------------------------------------------------

def profile_files(path: str | os.PathLike[str]) -> list[Path]:
    """The files to read for `path`: a profile file as given, or under a directory (a log dir,
    its plugins/profile, a session folder) each session's XSpace per host, and a Chrome trace
    only for a host that has no XSpace. Raises JaxProfileError when there is none."""
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.exists():
        raise JaxProfileError(f"{p}: no such file or directory")
    if not p.is_dir():
        raise JaxProfileError(f"{p}: not a regular file or directory")
    found = sorted(f for f in p.rglob("*") if f.is_file() and not f.name.startswith(".")
                   and (f.name.endswith(XPLANE_SUFFIX) or f.name.endswith(JSON_SUFFIX)
                        or f.name == PERFETTO_NAME))
    chosen = choose_files(found)
    if not chosen:
        raise JaxProfileError(f"{p}: no JAX profile in it (jax.profiler writes "
                              "plugins/profile/<time>/<host>.xplane.pb under the folder it is given)")
    return chosen


def choose_files(files: list[Path]) -> list[Path]:
    """Of a session folder's files, the XSpace of each host; a host's Chrome trace only where it
    has no XSpace; perfetto_trace.json.gz only where the folder has nothing else."""
    by_dir: dict[Path, list[Path]] = {}
    for f in files:
        by_dir.setdefault(f.parent, []).append(f)
    chosen: list[Path] = []
    for group in by_dir.values():
        names = {f.name for f in group}
        hosts = {f.name[:-len(XPLANE_SUFFIX)] for f in group if f.name.endswith(XPLANE_SUFFIX)}
        for f in sorted(group):
            if f.name.endswith(XPLANE_SUFFIX):
                chosen.append(f)
            elif f.name == PERFETTO_NAME:
                if not hosts and not any(n.endswith(JSON_SUFFIX) for n in names):
                    chosen.append(f)
            elif f.name[:-len(JSON_SUFFIX)] not in hosts:
                chosen.append(f)
    return chosen


def sibling_json(path: Path) -> Path | None:
    """The Chrome trace jax wrote beside an XSpace (the same session of the same host)."""
    for candidate in (path.with_name(path.name[:-len(XPLANE_SUFFIX)] + JSON_SUFFIX),
                      path.with_name(PERFETTO_NAME)):
        if candidate.is_file():
            return candidate
    return None


# ---- the public calls ---------------------------------------------------------------------

def convert_profile(path: str | os.PathLike[str]) -> pa.Table:
    """Spans (SPANS_SCHEMA, epoch-ns times) of every profile file at `path` (a log dir at any
    level, a session folder, or one .xplane.pb / .trace.json.gz / perfetto_trace.json.gz), in
    one table, with no window span. Raises JaxProfileError when nothing could be read; what
    was read of a damaged file is kept (read_profiles says what was wrong)."""
    results = read_profiles(path)
    tables = [r.table for r in results if r.table is not None]
    if not tables:
        raise JaxProfileError("; ".join(f"{r.path}: {'; '.join(r.problems) or 'no events'}"
                                        for r in results))
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def read_profiles(path: str | os.PathLike[str]) -> list[Converted]:
    """convert_file of each of profile_files(path)."""
    return [convert_file(f) for f in profile_files(path)]


def convert_file(path: str | os.PathLike[str]) -> Converted:
    """One file, with a fallback: an XSpace of which nothing could be read gives way to the
    Chrome trace jax wrote beside it (its problems said first)."""
    p = Path(path)
    if p.name.endswith(XPLANE_SUFFIX):
        done = _XSpaceConversion(p).run()
        if done.table is None:
            alt = sibling_json(p)
            if alt is not None:
                other = _ChromeConversion(alt, xspace=p).run()
                other.problems[:0] = [f"{p.name}: {q}" for q in done.problems] + \
                    [f"read {alt.name} instead (the Chrome trace jax wrote beside it)"]
                return other
        return done
    return _ChromeConversion(p).run()


# ---- wire format: the framing of the outer layers ------------------------------------------

class _Cut(Exception):
    def __init__(self, pos: int):
        super().__init__(pos)
        self.pos = pos


class _Damaged(Exception):
    def __init__(self, pos: int, why: str):
        super().__init__(why)
        self.pos, self.why = pos, why


def _varint(buf: Any, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise _Cut(pos)
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise _Damaged(pos, "a number runs past 10 bytes")


def _fields(buf: Any, pos: int, end: int) -> Iterator[tuple[int, int, Any, int]]:
    """(field number, wire type, value, offset) of each field of the message in buf[pos:end]:
    value is the number of a varint, (start, end) of a length-delimited field."""
    while pos < end:
        at = pos
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise _Damaged(at, "a field numbered 0")
        value: Any = None
        if wire == 0:
            value, pos = _varint(buf, pos, end)
        elif wire == 2:
            n, pos = _varint(buf, pos, end)
            if pos + n > end:
                raise _Cut(at)
            value = (pos, pos + n)
            pos += n
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
            if pos > end:
                raise _Cut(at)
        else:
            raise _Damaged(at, f"wire type {wire} (not protobuf)")
        yield number, wire, value, at


# ---- the protobuf messages ----------------------------------------------------------------

# message -> (field, number, type, repeated, oneof); types: scalars by name, else a message here
_XPLANE_SCHEMA: dict[str, list[tuple[str, int, str, bool, str | None]]] = {
    # tsl/profiler/protobuf/xplane.proto (XSpace and XPlane are walked here, not decoded)
    "XLine": [("id", 1, "int64", False, None), ("display_id", 10, "int64", False, None),
              ("name", 2, "string", False, None), ("display_name", 11, "string", False, None),
              ("timestamp_ns", 3, "int64", False, None), ("duration_ps", 9, "int64", False, None),
              ("events", 4, "XEvent", True, None)],
    "XEvent": [("metadata_id", 1, "int64", False, None), ("offset_ps", 2, "int64", False, "data"),
               ("num_occurrences", 5, "int64", False, "data"), ("duration_ps", 3, "int64", False, None),
               ("stats", 4, "XStat", True, None)],
    "XStat": [("metadata_id", 1, "int64", False, None), ("double_value", 2, "double", False, "value"),
              ("uint64_value", 3, "uint64", False, "value"), ("int64_value", 4, "int64", False, "value"),
              ("str_value", 5, "string", False, "value"), ("bytes_value", 6, "bytes", False, "value"),
              ("ref_value", 7, "uint64", False, "value")],
    "XEventMetadata": [("id", 1, "int64", False, None), ("name", 2, "string", False, None),
                       ("display_name", 4, "string", False, None), ("metadata", 3, "bytes", False, None),
                       ("stats", 5, "XStat", True, None), ("child_id", 6, "int64", True, None)],
    "XStatMetadata": [("id", 1, "int64", False, None), ("name", 2, "string", False, None),
                      ("description", 3, "string", False, None)],
    # XPlane's map<int64, XEventMetadata> event_metadata = 4 and stat_metadata = 5, one entry each
    "EventMetadataEntry": [("key", 1, "int64", False, None), ("value", 2, "XEventMetadata", False, None)],
    "StatMetadataEntry": [("key", 1, "int64", False, None), ("value", 2, "XStatMetadata", False, None)],
    # xla/service/hlo.proto, xla/xla_data.proto: the fields read here (the rest kept as unknown fields)
    "HloProto": [("hlo_module", 1, "HloModuleProto", False, None)],
    "HloModuleProto": [("name", 1, "string", False, None), ("entry_computation_name", 2, "string", False, None),
                       ("computations", 3, "HloComputationProto", True, None),
                       ("host_program_shape", 4, "ProgramShapeProto", False, None),
                       ("id", 5, "int64", False, None), ("entry_computation_id", 6, "int64", False, None),
                       # StackFrameIndexProto, copied as it is (the ops' metadata point into it)
                       ("stack_frame_index", 17, "bytes", False, None)],
    "HloComputationProto": [("name", 1, "string", False, None),
                            ("instructions", 2, "HloInstructionProto", True, None),
                            ("program_shape", 4, "ProgramShapeProto", False, None),
                            ("id", 5, "int64", False, None), ("root_id", 6, "int64", False, None),
                            ("is_fusion_computation", 7, "bool", False, None)],
    "HloInstructionProto": [("name", 1, "string", False, None), ("opcode", 2, "string", False, None),
                            ("shape", 3, "ShapeProto", False, None),
                            ("parameter_number", 9, "int64", False, None),
                            ("fusion_kind", 11, "string", False, None), ("id", 35, "int64", False, None),
                            ("operand_ids", 36, "int64", True, None),
                            ("control_predecessor_ids", 37, "int64", True, None),
                            ("called_computation_ids", 38, "int64", True, None),
                            ("replica_groups", 49, "ReplicaGroup", True, None),
                            ("collective_device_list", 87, "CollectiveDeviceListProto", False, None)],
    "ShapeProto": [("element_type", 2, "int32", False, None), ("dimensions", 3, "int64", True, None),
                   ("tuple_shapes", 4, "ShapeProto", True, None)],
    "ProgramShapeProto": [("parameters", 1, "ShapeProto", True, None), ("result", 2, "ShapeProto", False, None),
                          ("parameter_names", 3, "string", True, None)],
    "ReplicaGroup": [("replica_ids", 1, "int64", True, None)],
    "CollectiveDeviceListProto": [("replica_groups", 1, "ReplicaGroup", True, None),
                                  ("iota_replica_group_list", 2, "IotaReplicaGroupListProto", False, None)],
    "IotaReplicaGroupListProto": [("num_replica_groups", 1, "int64", False, None),
                                  ("num_devices_per_group", 2, "int64", False, None)],
}
_PACKAGE = "counterprof.xprof"
_MESSAGES: dict[str, Any] | None = None


def messages() -> dict[str, Any]:
    """The message classes of _XPLANE_SCHEMA (protobuf's runtime, built once)."""
    global _MESSAGES
    if _MESSAGES is None:
        try:
            from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
        except ImportError:
            raise JaxProfileError("reading a JAX profile (.xplane.pb) needs the protobuf package: "
                                  "pip install 'counterprof[jax]'") from None
        fdp = descriptor_pb2.FileDescriptorProto(name="counterprof_xprof.proto", package=_PACKAGE,
                                                 syntax="proto3")
        F = descriptor_pb2.FieldDescriptorProto
        scalars = {"int64": F.TYPE_INT64, "uint64": F.TYPE_UINT64, "int32": F.TYPE_INT32,
                   "string": F.TYPE_STRING, "bytes": F.TYPE_BYTES, "double": F.TYPE_DOUBLE,
                   "bool": F.TYPE_BOOL}
        for name, fields in _XPLANE_SCHEMA.items():
            m = fdp.message_type.add(name=name)
            oneofs: list[str] = []
            for fname, number, ftype, repeated, oneof in fields:
                f = m.field.add(name=fname, number=number,
                                label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
                if ftype in scalars:
                    f.type = scalars[ftype]
                else:
                    f.type, f.type_name = F.TYPE_MESSAGE, f".{_PACKAGE}.{ftype}"
                if oneof is not None:
                    if oneof not in oneofs:
                        oneofs.append(oneof)
                        m.oneof_decl.add(name=oneof)
                    f.oneof_index = oneofs.index(oneof)
        pool = descriptor_pool.DescriptorPool()
        pool.Add(fdp)
        _MESSAGES = {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
                     for name in _XPLANE_SCHEMA}
    return _MESSAGES


def _decode_errors() -> tuple[type[BaseException], ...]:
    from google.protobuf.message import DecodeError
    return (DecodeError, ValueError)


# ---- HLO: what each op is -------------------------------------------------------------------

# bytes per element of xla.PrimitiveType (xla_data.proto); sub-byte types as fractions
_ELEMENT_BYTES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 2, 8: 4, 9: 8, 10: 2, 11: 4, 12: 8, 15: 8,
                  16: 2, 18: 16, 19: 1, 20: 1, 21: 0.5, 22: 0.5, 23: 1, 24: 1, 25: 1, 26: 0.25,
                  27: 0.25, 28: 1, 29: 1, 30: 0.125, 31: 0.125, 32: 0.5, 33: 1}


def shape_bytes(shape: Any) -> int:
    """Bytes of an xla ShapeProto (a tuple's: its elements')."""
    if shape.element_type == 13:          # TUPLE
        return sum(shape_bytes(s) for s in shape.tuple_shapes)
    size = _ELEMENT_BYTES.get(shape.element_type, 0)
    n = 1
    for d in shape.dimensions:
        n *= d
    return int(n * size)


@record(frozen=True)
class OpInfo:
    opcode: str
    category: str
    collective: str | None = None
    bytes: int | None = None
    group_size: int | None = None


_FUSION_HEROES = ("convolution", "dot", *COLLECTIVE_OPCODES, "scatter", "gather", "reduce")


def module_ops(module: Any) -> dict[str, OpInfo]:
    """Each instruction of a decoded HloModuleProto by name: opcode, category (xprof's words:
    a fusion by the heaviest op it holds, "dot fusion", "loop fusion"), and for collectives
    what they move and among how many devices."""
    comps = {c.id: c for c in module.computations}
    out: dict[str, OpInfo] = {}
    for comp in module.computations:
        for ins in comp.instructions:
            opcode = ins.opcode
            category = opcode
            if opcode == "fusion":
                inner = {i.opcode for cid in ins.called_computation_ids if cid in comps
                         for i in comps[cid].instructions}
                hero = next((h for h in _FUSION_HEROES if h in inner or f"{h}-start" in inner), None)
                kind = ins.fusion_kind[1:].lower() if ins.fusion_kind.startswith("k") else "loop"
                category = f"{hero} fusion" if hero else f"{kind} fusion"
            base = opcode[:-6] if opcode.endswith("-start") else opcode[:-5] if opcode.endswith("-done") else opcode
            if base in COLLECTIVE_OPCODES and not opcode.endswith("-done"):
                out[ins.name] = OpInfo(opcode, category, base, shape_bytes(ins.shape), _group_size(ins))
            else:
                out[ins.name] = OpInfo(opcode, category)
    return out


def _group_size(ins: Any) -> int | None:
    groups = list(ins.replica_groups) or list(ins.collective_device_list.replica_groups)
    if groups:
        return len(groups[0].replica_ids) or None
    iota = ins.collective_device_list.iota_replica_group_list
    return iota.num_devices_per_group or None


# ---- the output -----------------------------------------------------------------------------

class _Columns:
    """Span rows, as tuples in SPANS_SCHEMA's order with correlation last (one append per
    row), turned into RecordBatches."""

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, start: int, end: int, name: str, cat: int, *, klass: int | None = None,
            device: int | None = None, stream: int | None = None, pid: int | None = None,
            tid: int | None = None, collective: str | None = None, nbytes: int | None = None,
            group: int | None = None, attrs: str | None = None,
            correlation: int | None = None) -> None:
        self.rows.append((start, end, name, cat, klass, device, stream, pid, tid, collective,
                          nbytes, group, attrs, correlation))

    def batch(self, shift: int) -> pa.RecordBatch:
        """The rows as a batch, times + shift (ns); then empty."""
        import pyarrow.compute as pc
        (start, end, name, cat, klass, device, stream, pid, tid, collective, nbytes, group,
         attrs, correlation) = zip(*self.rows)
        t = SPANS_SCHEMA.field("start").type
        s = pc.add(pa.array(start, pa.int64()), pa.scalar(shift, pa.int64()))
        e = pc.add(pa.array(end, pa.int64()), pa.scalar(shift, pa.int64()))
        out = pa.RecordBatch.from_arrays([
            s.cast(t), e.cast(t),
            pa.array(name, pa.string()),
            pa.DictionaryArray.from_arrays(pa.array(cat, pa.int32()), pa.array(CATEGORIES, pa.string())),
            pa.DictionaryArray.from_arrays(pa.array(klass, pa.int32()), pa.array(CLASSES, pa.string())),
            pa.array(device, pa.int32()),
            pa.array(stream, pa.int64()),
            pa.array(pid, pa.int64()),
            pa.array(tid, pa.int64()),
            pa.array(correlation, pa.int64()),
            pa.array(collective, pa.string()),
            pa.array(nbytes, pa.int64()),
            pa.array(group, pa.int32()),
            pa.array(attrs, pa.string()),
        ], schema=SPANS_SCHEMA)
        self.rows = []
        return out


def _json(d: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in d.items() if v is not None}, separators=(",", ":"))


class _Emitter:
    """What both decoders share: events classified into span rows, counted."""

    def __init__(self, ops: dict[tuple[str, int], dict[str, OpInfo]],
                 costs: dict[tuple[str, int], dict[str, dict[str, Any]]] | None = None):
        self.ops = ops
        self.ops_by_module: dict[str, dict[str, OpInfo] | None] = {}
        for (module, _prog), table in ops.items():    # a module name with one program: found by name
            self.ops_by_module[module] = table if module not in self.ops_by_module else None
        self.costs = costs or {}
        self.costs_by_module: dict[str, dict[str, dict[str, Any]] | None] = {}
        for (module, _prog), ctable in self.costs.items():
            self.costs_by_module[module] = ctable if module not in self.costs_by_module else None
        self.costed = 0                 # op spans given XLA's cost analysis' figures
        self.cols = _Columns()
        self.batches: list[pa.RecordBatch] = []
        self.skipped: Counter[str] = Counter()
        self.spans = 0
        self.device_spans = 0
        self.lo: int | None = None
        self.hi: int | None = None
        self._op_attrs: dict[tuple[Any, ...], tuple[Any, ...]] = {}

    def flush(self) -> None:
        if len(self.cols):
            self.spans += len(self.cols)
            lo, hi = min(r[0] for r in self.cols.rows), max(r[1] for r in self.cols.rows)
            self.lo = lo if self.lo is None else min(self.lo, lo)
            self.hi = hi if self.hi is None else max(self.hi, hi)
            self.batches.append(self.cols.batch(0))

    def op_info(self, module: str | None, prog: int | None, op: str) -> OpInfo | None:
        table = self.ops.get((module, prog)) if prog is not None and module is not None else None
        if table is None and module is not None:
            table = self.ops_by_module.get(module)
        return table.get(op) if table else None

    def op(self, start: int, end: int, op: str, module: str | None, prog: int | None,
           dev: int | None, run: int | None, tid: int | None, pid: int | None,
           device: int | None = None, stream: int | None = None, flops: float | None = None,
           nbytes: float | None = None) -> None:
        """An XLA op (on a host thread, or on a device's "XLA Ops" line: device set)."""
        key = (module, prog, op, dev)
        cached = self._op_attrs.get(key)
        if cached is None:
            cached = self._op_attrs[key] = self._op_row(module, prog, op, dev, device)
        prefix, cat, klass, coll, nb, group, cost = cached
        if flops is not None or nbytes is not None:
            prefix += "".join(f',"{k}":{json.dumps(v)}' for k, v in (("flops", flops), ("bytes_accessed", nbytes))
                              if v is not None)
        elif cost:
            prefix += cost
            self.costed += 1
        self.cols.rows.append((start, end, op, cat, klass, device, stream, pid, tid, coll, nb, group,
                               f'{prefix},"run_id":{run}}}' if run is not None else prefix + "}", None))
        if device is not None:
            self.device_spans += 1
        if len(self.cols.rows) >= BATCH_ROWS:
            self.flush()

    def _op_row(self, module: str | None, prog: int | None, op: str, dev: int | None,
                device: int | None) -> tuple[Any, ...]:
        """(attrs without its closing brace, category, class, collective, bytes, group size)."""
        info = self.op_info(module, prog, op)
        m = None if info is not None else _COLLECTIVE_NAME.match(op)
        if info is None and m:
            info = OpInfo(m.group(1), m.group(1), m.group(1))
        prefix = _json({"hlo_op": op, "hlo_module": module, "program_id": prog,
                        "device_ordinal": dev, "opcode": info.opcode if info else None,
                        "category": info.category if info else None})[:-1]
        cost = self._cost_attrs(module, prog, op)
        if info is not None and info.collective:
            return (prefix, _CAT["collective"], _CLASS["communication"] if device is not None else None,
                    info.collective, info.bytes, info.group_size, cost)
        return prefix, _CAT["xla_op"], None, None, None, None, cost

    def _cost_attrs(self, module: str | None, prog: int | None, op: str) -> str:
        """',"flops":..,"bytes_accessed":..' of XLA's cost analysis of the op ("" when none)."""
        if not self.costs or module is None:
            return ""
        table = self.costs.get((module, prog)) if prog is not None else None
        if table is None:
            table = self.costs_by_module.get(module)
        c = table.get(op) if table else None
        if not c or "flops" not in c or "bytes_accessed" not in c:
            return ""
        return "".join(f',"{k}":{json.dumps(c[k])}' for k in ("flops", "bytes_accessed", "transcendentals", "dtype")
                       if c.get(k) is not None)

    def runtime(self, start: int, end: int, name: str, stats: list[Any], tid: int | None,
                pid: int | None) -> None:
        """A GPU runtime call (cudaLaunchKernel, hipMemcpyDtoDAsync): its correlation id links
        it to the kernel or copy it launched, as in torch traces."""
        attrs = _json({"hlo_op": stats[HLO_OP], "hlo_module": stats[HLO_MODULE],
                       "program_id": _int(stats[PROGRAM_ID])})
        self.cols.rows.append((start, end, name, _CAT["runtime"], None, None, None, pid, tid, None,
                               None, None, attrs if attrs != "{}" else None, _int(stats[CORRELATION])))
        if len(self.cols.rows) >= BATCH_ROWS:
            self.flush()

    def step(self, start: int, end: int, step_num: Any, annotation: str, tid: int | None,
             pid: int | None) -> None:
        n = _int(step_num)
        self.cols.add(start, end, f"ProfilerStep#{n if n is not None else step_num}", _CAT["step"],
                      pid=pid, tid=tid, attrs=_json({"step_num": n if n is not None else str(step_num),
                                                     "annotation": annotation}))

    def host(self, kind: int, start: int, end: int, name: str, tid: int | None,
             pid: int | None) -> None:
        if kind == DISPATCH:
            self.cols.add(start, end, name, _CAT["dispatch"], pid=pid, tid=tid)
        elif kind == TRANSFER:
            self.cols.add(start, end, name, _CAT["transfer"], pid=pid, tid=tid,
                          attrs=_json({"direction": _TRANSFERS.get(name)}))
        else:
            self.cols.add(start, end, name, _CAT["compile"], pid=pid, tid=tid)
        if len(self.cols) >= BATCH_ROWS:
            self.flush()

    def device_event(self, start: int, end: int, name: str, device: int, stream: int,
                     pid: int | None, stats: list[Any]) -> None:
        """An event of a device's stream line: a kernel, memcpy or memset."""
        low = name.lower()
        cat = "memcpy" if low.startswith("memcpy") or stats[MEMCPY] is not None else \
            "memset" if low.startswith("memset") else "kernel"
        klass = kernel_class(cat, name)
        op = stats[HLO_OP]
        info = self.op_info(stats[HLO_MODULE], _int(stats[PROGRAM_ID]), op) if op else None
        attrs = _json({"hlo_op": op, "hlo_module": stats[HLO_MODULE], "program_id": _int(stats[PROGRAM_ID]),
                       "opcode": info.opcode if info else None, "category": info.category if info else None,
                       "flops": stats[FLOPS], "bytes_accessed": stats[BYTES_ACCESSED]})
        coll = info.collective if info and info.collective else \
            collective_in_kernel_name(name) if klass == "communication" else None
        self.cols.add(start, end, name, _CAT[cat], klass=_CLASS[klass] if klass else None,
                      device=device, stream=stream, pid=pid, collective=coll,
                      nbytes=info.bytes if info and info.collective else None,
                      group=info.group_size if info and info.collective else None,
                      attrs=attrs if attrs != "{}" else None, correlation=_int(stats[CORRELATION]))
        self.device_spans += 1
        if len(self.cols) >= BATCH_ROWS:
            self.flush()


def _kind_of_name(name: str) -> int:
    if name.startswith(_SKIP_PREFIXES):
        return SKIP
    if _DISPATCH.search(name):
        return DISPATCH
    if name in _TRANSFERS:
        return TRANSFER
    if _COMPILE.search(name):
        return COMPILE
    return STATS


def _int(v: Any, lo: int = -2 ** 63, hi: int = 2 ** 63 - 1) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    elif isinstance(v, str) and v.strip().lstrip("-").isdigit() and len(v) < 40:
        v = int(v)
    elif isinstance(v, int) and v >= 2 ** 63:      # a uint64 stat holding a negative int64
        v -= 2 ** 64
    return v if isinstance(v, int) and lo <= v <= hi else None


# ---- the XSpace -----------------------------------------------------------------------------

class _Plane:
    """One plane's decoded parts (each decoded on its own: a damaged one is counted, not fatal)."""

    def __init__(self, start: int, data: bytes):
        self.start = start                # its offset in the file
        self.data = data
        self.id = 0
        self.name = ""
        self.lines: list[tuple[int, int]] = []
        self.event_meta: dict[int, Any] = {}      # XEventMetadata
        self.stat_names: dict[int, str] = {}
        self.stats: list[Any] = []                # XStat
        self.problem = ""
        self.damaged_parts = 0

    def read(self, cut: bool) -> None:
        msgs = messages()
        errors = _decode_errors()
        data = memoryview(self.data)
        try:
            for number, wire, value, _at in _fields(data, 0, len(data)):
                if wire != 2 and number != 1:
                    continue
                if number == 1:
                    self.id = value
                elif number == 2:
                    self.name = bytes(data[value[0]:value[1]]).decode("utf-8", "replace")
                elif number == 3:
                    self.lines.append(value)
                elif number in (4, 5, 6):
                    cls = msgs["EventMetadataEntry" if number == 4 else "StatMetadataEntry" if number == 5
                               else "XStat"]
                    try:
                        m = cls.FromString(data[value[0]:value[1]])
                    except errors:
                        self.damaged_parts += 1
                        continue
                    if number == 4:
                        self.event_meta[m.key] = m.value
                    elif number == 5:
                        self.stat_names[m.key] = m.value.name
                    else:
                        self.stats.append(m)
        except _Cut as exc:
            self.problem = f"cut off inside its part that starts at byte {self.start + exc.pos:,}"
        except _Damaged as exc:
            self.problem = f"damaged at byte {self.start + exc.pos:,} ({exc.why})"
        else:
            if cut:
                self.problem = "cut off at its end"

    def stat_value(self, st: Any) -> Any:
        which = st.WhichOneof("value")
        if which == "ref_value":
            return self.stat_names.get(st.ref_value)
        return getattr(st, which) if which else None

    def plane_stats(self) -> dict[str, Any]:
        return {self.stat_names.get(st.metadata_id, str(st.metadata_id)): self.stat_value(st)
                for st in self.stats}


class _XSpaceConversion:
    def __init__(self, path: Path, with_costs: bool = True):
        self.path = path
        self.out = Converted(str(path), fmt="xplane")
        self.planes: list[tuple[int, int, bool, str]] = []    # (start, end, complete, name)
        self.hostnames: list[str] = []
        self.notes: list[str] = []          # the XSpace's own errors and warnings
        self.events = 0
        self.lost_lines = 0                 # of the plane being read
        self.lost_events = 0
        self.hlo_protos: dict[tuple[str, int], bytes] = {}
        self.with_costs = with_costs
        self.cost_info: dict[str, Any] | None = None

    # -- the file's layout --

    def _walk(self, f: Any, size: int) -> None:
        """The XSpace's fields: planes located (not read), hostnames, errors."""
        pos = 0
        while pos < size:
            f.seek(pos)
            head = f.read(24)
            try:
                key, i = _varint(head, 0, len(head))
                number, wire = key >> 3, key & 7
                if number not in (1, 2, 3, 4) or wire != 2:      # planes, errors, warnings, hostnames
                    raise _Damaged(0, f"field {number} of wire type {wire}, which an XSpace has not")
                n, i = _varint(head, i, len(head))
            except _Cut:
                self.out.problems.append(f"the file is cut off at byte {pos:,} of {size:,} "
                                         "(cut while it was written?)")
                return
            except _Damaged as exc:
                if pos == 0:
                    raise JaxProfileError(f"{self.path} is not an XSpace profile (it starts with "
                                          f"{head[:8]!r}); jax.profiler writes <host>.xplane.pb") from None
                self.out.problems.append(f"the file is damaged at byte {pos:,} ({exc.why}): "
                                         "what follows was not read")
                return
            start, end = pos + i, pos + i + n
            if number == 1:
                self.planes.append((start, min(end, size), end <= size, ""))
            elif number in (2, 3, 4) and end <= size:
                f.seek(start)
                text = f.read(n).decode("utf-8", "replace")
                (self.hostnames if number == 4 else self.notes).append(text)
            if end > size:
                what = "a plane" if number == 1 else "its host names"
                self.out.problems.append(f"the file is cut off at byte {size:,}, inside {what} that "
                                         f"runs to byte {end:,} (cut while it was written? what "
                                         "could be read before the cut is kept)")
                return
            pos = end

    def _plane(self, f: Any, where: tuple[int, int, bool, str]) -> _Plane:
        start, end, complete, _ = where
        f.seek(start)
        plane = _Plane(start, f.read(end - start))
        plane.read(cut=not complete)
        return plane

    def _plane_name(self, f: Any, start: int, end: int) -> str:
        f.seek(start)
        head = f.read(min(end - start, 4096))
        try:
            for number, wire, value, _at in _fields(head, 0, len(head)):
                if number == 2 and wire == 2:
                    return str(head[value[0]:value[1]].decode("utf-8", "replace"))
                if number > 2:
                    break
        except (_Cut, _Damaged):
            pass
        return ""

    def _locate(self, f: Any) -> None:
        """The planes of the open file, located and named (none read yet)."""
        self._walk(f, os.fstat(f.fileno()).st_size)
        self.planes = [(s, e, c, self._plane_name(f, s, e)) for s, e, c, _ in self.planes]

    # -- the conversion --

    def run(self) -> Converted:
        out = self.out
        t0 = time.perf_counter()
        try:
            f = open(self.path, "rb")
        except OSError as exc:
            raise JaxProfileError(f"{self.path}: {exc.strerror}") from None
        with f:
            if os.fstat(f.fileno()).st_size == 0:
                raise JaxProfileError(f"{self.path} is empty")
            self._locate(f)
            if not self.planes:
                out.problems.append("no planes in the file: not a jax.profiler profile?")
                return out
            names = [p[3] for p in self.planes]
            # the session's start and stop (the Task Environment plane, written last)
            base, window = None, None
            env = self._find(f, "Task Environment")
            if env is not None:
                st = env.plane_stats()
                start, stop = _int(st.get("profile_start_time")), _int(st.get("profile_stop_time"))
                if start:
                    base, out.anchor = start, "profile_start_time"
                    window = (start, stop if stop and stop >= start else start)
                if env.problem:
                    out.problems.append(f"plane Task Environment: {env.problem}")
            meta = self._find(f, "/host:metadata")
            ops: dict[tuple[str, int], dict[str, OpInfo]] = {}
            meta_stats: dict[str, Any] = {}
            if meta is not None:
                meta_stats = meta.plane_stats()
                ops = self._hlo(meta)
                if meta.problem or meta.damaged_parts:
                    out.problems.append(f"plane /host:metadata: {meta.problem or 'damaged'}"
                                        + (f", {meta.damaged_parts} part(s) damaged" if meta.damaged_parts else "")
                                        + ": some modules' HLO (each op's opcode) is missing")
            costs: dict[tuple[str, int], dict[str, dict[str, Any]]] | None = None
            if self.hlo_protos and self.with_costs:
                costs, self.cost_info = costs_in_subprocess(self.hlo_protos)
                if costs is None and self.cost_info["status"] != "off":
                    out.problems.append(f"no FLOPs or bytes per XLA op: {self.cost_info['reason']}")
            emitter = _Emitter(ops, costs)
            pid = _int(meta_stats.get("process_id"))
            out.host = self.hostnames[0] if self.hostnames else _host_of(self.path)
            absolute = False
            plane_names: list[str] = []
            for where, name in zip(self.planes, names):
                if name in ("Task Environment", "/host:metadata"):
                    continue
                plane = self._plane(f, where)
                plane_names.append(plane.name or name)
                if plane.name.startswith("/host:") or not plane.name:
                    pstats = plane.plane_stats()
                    pid = _int(pstats.get("process_id")) or pid
                    absolute |= self._host_plane(plane, emitter, pid)
                else:
                    m = _DEVICE_PLANE.match(plane.name)
                    if m is None:
                        emitter.skipped[f"plane {plane.name}"] += 1
                        continue
                    absolute |= self._device_plane(plane, emitter, int(m.group(2)), pid)
                lost = self._lost(plane)
                if lost:
                    out.problems.append(f"plane {plane.name or '(unnamed)'}: {lost}")
        emitter.flush()
        out.pid = pid
        out.events = self.events
        out.spans, out.device_spans = emitter.spans, emitter.device_spans
        if absolute:           # lines in epoch ns (a profile not normalized to its start)
            base, out.anchor = 0, "absolute line timestamps"
        elif base is None:
            if emitter.hi is not None:
                base, out.anchor, words = _fallback_anchor(self.path, emitter.hi)
                out.problems.append("the profile's start time (its Task Environment plane, written "
                                    f"last) could not be read: times placed by {words}")
        if base is None:
            base = 0
        if emitter.lo is not None and window is None:
            window = (emitter.lo + base, emitter.hi + base)   # type: ignore[operator]
        elif emitter.lo is not None and window is not None:    # device work may end after the stop
            window = (min(window[0], emitter.lo + base), max(window[1], emitter.hi + base))  # type: ignore[operator]
        out.window = window
        if emitter.batches:
            out.table = _shifted(emitter.batches, base)
        elif not out.problems:
            out.problems.append("no events in the profile (was anything run while it recorded?)")
        out.rank, out.rank_source = _rank(meta_stats, self.path)
        out.info = {"profile": "jax", "format": "xplane", "file": self.path.name, "host": out.host,
                    "hosts": self.hostnames, "pid": pid, "planes": plane_names, "anchor": out.anchor,
                    "jax_version": meta_stats.get("jax_version"),
                    "jaxlib_version": meta_stats.get("jaxlib_version"),
                    "backends": {k[:-len("_version")]: v for k, v in meta_stats.items()
                                 if k.endswith("_version") and k not in ("jax_version", "jaxlib_version")},
                    "modules": sorted(f"{m}({p})" for m, p in ops),
                    "events": self.events, "spans": out.spans, "device_spans": out.device_spans,
                    "skipped": dict(emitter.skipped.most_common(20)), "notes": self.notes[:10],
                    "seconds": round(time.perf_counter() - t0, 3)}
        if self.cost_info is not None:
            out.info["xla_costs"] = {**self.cost_info, "op_spans": emitter.costed}
        return out

    def _lost(self, plane: _Plane) -> str:
        """What of a plane could not be read, in words ("" when all was)."""
        said = [plane.problem] if plane.problem else []
        if plane.damaged_parts:
            said.append(f"{plane.damaged_parts:,} metadata part(s) damaged and left out")
        if self.lost_lines:
            said.append(f"{self.lost_lines:,} thread(s) damaged and left out")
        if (plane.lines or plane.problem) and not plane.event_meta:
            said.append("its events' names come after its events and are missing: none of its "
                        "events can be read")
        elif self.lost_events:
            said.append(f"{self.lost_events:,} event(s) whose names are missing left out")
        return "; ".join(said)

    def _find(self, f: Any, name: str) -> _Plane | None:
        where = next((p for p in self.planes if p[3] == name), None)
        return self._plane(f, where) if where is not None else None

    def _hlo(self, meta: _Plane) -> dict[tuple[str, int], dict[str, OpInfo]]:
        """(module, program id) -> its ops, from the HloProto of each module (metadata plane)."""
        msgs = messages()
        errors = _decode_errors()
        ops: dict[tuple[str, int], dict[str, OpInfo]] = {}
        self.hlo_protos = {}
        for em in meta.event_meta.values():
            proto, prog = None, None
            for st in em.stats:
                sname = meta.stat_names.get(st.metadata_id)
                if sname == "Hlo Proto":
                    proto = st.bytes_value
                elif sname == "program_id":
                    prog = _int(meta.stat_value(st))
            if proto is None:
                continue
            try:
                module = msgs["HloProto"].FromString(proto).hlo_module
            except errors:
                meta.damaged_parts += 1
                continue
            if prog is None:          # the metadata's name is "module(program id)"
                m = re.search(r"\((\d+)\)$", em.name)
                prog = int(m.group(1)) if m else -1
            ops[(module.name, prog)] = module_ops(module)
            self.hlo_protos[(module.name, prog)] = proto
        return ops

    def _lines(self, plane: _Plane) -> Iterator[Any]:
        cls = messages()["XLine"]
        errors = _decode_errors()
        data = memoryview(plane.data)
        for s, e in plane.lines:
            try:
                yield cls.FromString(data[s:e])
            except errors:
                self.lost_lines += 1

    def _kinds(self, plane: _Plane) -> tuple[dict[int, int], dict[int, list[Any]], dict[int, int]]:
        """Per event metadata id: its kind, the wanted stats it carries for all its events;
        per stat metadata id: which wanted stat it is."""
        stat_ids = {sid: _WANTED_STATS.index(n) for sid, n in plane.stat_names.items() if n in _WANTED_STATS}
        kinds: dict[int, int] = {}
        shared: dict[int, list[Any]] = {}
        for mid, em in plane.event_meta.items():
            kinds[mid] = _kind_of_name(em.name)
            wanted: list[Any] = [None] * _N_STATS
            for st in em.stats:
                if st.metadata_id in stat_ids:
                    wanted[stat_ids[st.metadata_id]] = plane.stat_value(st)
            if any(v is not None for v in wanted):
                shared[mid] = wanted
        return kinds, shared, stat_ids

    def _host_plane(self, plane: _Plane, em: _Emitter, pid: int | None) -> bool:
        """Rows of a host plane's events; True when its lines' timestamps are absolute."""
        kinds, shared, stat_ids = self._kinds(plane)
        names = {mid: m.name for mid, m in plane.event_meta.items()}
        stat_names = plane.stat_names
        self.lost_lines = self.lost_events = 0
        absolute = False
        skipped = 0
        for line in self._lines(plane):
            t0 = line.timestamp_ns
            absolute |= t0 >= ABSOLUTE_NS
            tid = line.id
            outer = {DISPATCH: (0, -1), TRANSFER: (0, -1), COMPILE: (0, -1)}   # the last kept span of each
            events = line.events
            self.events += len(events)
            for ev in events:
                mid = ev.metadata_id
                kind = kinds.get(mid)
                if kind is None:
                    self.lost_events += 1
                    continue
                if kind == SKIP:
                    skipped += 1
                    continue
                off = ev.offset_ps
                start = t0 + off // 1000
                end = t0 + (off + ev.duration_ps) // 1000
                if kind != STATS:
                    last = outer[kind]
                    if start >= last[0] and end <= last[1]:
                        continue          # inside the last one of its kind: the outermost counts
                    outer[kind] = (start, end)
                    em.host(kind, start, end, names[mid], tid, pid)
                    continue
                found = shared.get(mid)
                stats = ev.stats
                if found is None and not len(stats):     # (most runtime events: no stat at all)
                    skipped += 1
                    continue
                got = [None] * _N_STATS if found is None else list(found)
                n = 0
                for st in stats:
                    k = stat_ids.get(st.metadata_id)
                    if k is None:
                        continue
                    which = st.WhichOneof("value")
                    got[k] = stat_names.get(st.ref_value) if which == "ref_value" else \
                        getattr(st, which) if which else None
                    n += 1
                    if n == _HOST_OP_STATS:
                        break
                op = got[HLO_OP]
                if got[CORRELATION] is not None:       # a GPU runtime call (a launch, a copy)
                    em.runtime(start, end, names[mid], got, tid, pid)
                elif op is not None:
                    prog, dev, run = got[PROGRAM_ID], got[DEVICE_ORDINAL], got[RUN_ID]
                    em.op(start, end, op, got[HLO_MODULE], prog if type(prog) is int else _int(prog),
                          dev if type(dev) is int else _int(dev), run if type(run) is int else _int(run),
                          tid, pid)
                elif got[STEP_NUM] is not None:
                    em.step(start, end, got[STEP_NUM], names[mid], tid, pid)
                else:
                    skipped += 1
        em.skipped["host events (Python, runtime)"] += skipped
        return absolute

    def _device_plane(self, plane: _Plane, em: _Emitter, device: int, pid: int | None) -> bool:
        kinds, shared, stat_ids = self._kinds(plane)
        names = {mid: m.name for mid, m in plane.event_meta.items()}
        self.lost_lines = self.lost_events = 0
        absolute = False
        for line in self._lines(plane):
            t0 = line.timestamp_ns
            absolute |= t0 >= ABSOLUTE_NS
            lname = line.name or line.display_name
            events = line.events
            self.events += len(events)
            if lname.startswith(_DEVICE_SKIP_LINES):
                em.skipped[f"device line {lname}"] += len(events)
                continue
            ops_line = lname == "XLA Ops"
            for ev in events:
                mid = ev.metadata_id
                if mid not in kinds:
                    self.lost_events += 1
                    continue
                off = ev.offset_ps
                start = t0 + off // 1000
                end = t0 + (off + ev.duration_ps) // 1000
                found = shared.get(mid)
                got = [None] * _N_STATS if found is None else list(found)
                for st in ev.stats:
                    k = stat_ids.get(st.metadata_id)
                    if k is not None:
                        got[k] = plane.stat_value(st)
                if ops_line:
                    em.op(start, end, got[HLO_OP] or names[mid], got[HLO_MODULE],
                          _int(got[PROGRAM_ID]), device, _int(got[RUN_ID]), None, pid,
                          device=device, stream=line.id, flops=got[FLOPS] or got[MODEL_FLOPS],
                          nbytes=got[BYTES_ACCESSED])
                else:
                    em.device_event(start, end, names[mid], device, line.id, pid, got)
        return absolute


def _shifted(batches: list[pa.RecordBatch], base: int) -> pa.Table:
    import pyarrow.compute as pc
    table = pa.Table.from_batches(batches, schema=SPANS_SCHEMA)
    if base == 0:
        return table
    t = SPANS_SCHEMA.field("start").type
    shift = pa.scalar(base, pa.int64())
    for col in ("start", "end"):
        moved = pc.add(table[col].cast(pa.int64()), shift).cast(t)
        table = table.set_column(table.schema.get_field_index(col), SPANS_SCHEMA.field(col), moved)
    return table


def _host_of(path: Path) -> str | None:
    for suffix in (XPLANE_SUFFIX, JSON_SUFFIX):
        if path.name.endswith(suffix):
            return path.name[:-len(suffix)]
    return None


_RANK_IN_NAME = re.compile(r"rank[-_=]?(\d+)", re.IGNORECASE)


def _rank(meta: dict[str, Any], path: Path) -> tuple[int | None, str]:
    """The rank a profile names: its metadata ("rank" or "process_index", set with
    jax.profiler's set_metadata), else "rankN" in its file name or its log dir's name."""
    for key in ("rank", "process_index"):
        r = _int(meta.get(key), 0, MAX_RANK)
        if r is not None:
            return r, f"profile metadata {key}"
    candidates = [path.name]
    if in_session_folder(path):
        candidates.append(path.parent.parent.parent.parent.name)    # <logdir>/plugins/profile/<stamp>/
    for name in candidates:
        m = _RANK_IN_NAME.search(name)
        if m and _int(m.group(1), 0, MAX_RANK) is not None:
            return int(m.group(1)), "file name"
    return None, ""


def _fallback_anchor(path: Path, rel_end: int) -> tuple[int, str, str]:
    """(base ns, anchor, words) for a profile whose start time is lost: the session folder's
    name is the local time jax wrote it at (after the stop, to the second); else the file's
    modification time (when it was written, after the stop)."""
    m = STAMP.match(path.parent.name)
    if m:
        stamp = time.mktime(tuple(int(g) for g in m.groups()) + (0, 0, -1))   # type: ignore[arg-type]
        # written within the second after the stop: the middle of that second
        return int(stamp * 1e9) + 500_000_000 - rel_end, "session folder name", \
            (f"the session folder's name {path.parent.name} (this machine's local time, to the "
             "second: up to a second off the run's other data)")
    mtime = os.stat(path).st_mtime_ns
    return mtime - rel_end, "file modification time", \
        "the file's modification time (when it was written, after the profile stopped: up to " \
        "seconds off the run's other data)"


# ---- the Chrome trace (a view of the XSpace) ------------------------------------------------

class _ChromeConversion:
    """<host>.trace.json.gz or perfetto_trace.json.gz: relative µs times (anchored with the
    XSpace beside it, else the folder's name), synthetic pids, no HLO (collectives by name)."""

    def __init__(self, path: Path, xspace: Path | None = None):
        self.path = path
        self.xspace = xspace
        self.out = Converted(str(path), fmt="chrome-json")

    def _anchor(self) -> tuple[int | None, tuple[int, int] | None, dict[str, Any]]:
        """(start ns, window, /host:metadata stats) from an XSpace of the same session."""
        candidates = [self.xspace] if self.xspace else \
            sorted(self.path.parent.glob(f"*{XPLANE_SUFFIX}"))
        for xs in candidates:
            if xs is None:
                continue
            conv = _XSpaceConversion(xs)
            try:
                with open(xs, "rb") as f:
                    conv._locate(f)
                    env = conv._find(f, "Task Environment")
                    meta = conv._find(f, "/host:metadata")
            except (OSError, JaxProfileError):
                continue
            stats = meta.plane_stats() if meta is not None else {}
            if env is not None:
                st = env.plane_stats()
                start, stop = _int(st.get("profile_start_time")), _int(st.get("profile_stop_time"))
                if start:
                    return start, (start, stop if stop and stop >= start else start), stats
            if stats:
                return None, None, stats
        return None, None, {}

    def run(self) -> Converted:
        from ..torch_trace.scan import KinetoScanner, TraceFileError
        out = self.out
        t0 = time.perf_counter()
        import pyarrow.compute as pc

        def wants_args(cat: pa.Array, name: pa.Array) -> pa.Array:
            names = pc.fill_null(name, "")
            skip = pc.or_(pc.or_(pc.starts_with(names, "$"), pc.starts_with(names, "end: ")),
                          pc.starts_with(names, "ThreadpoolListener::"))
            return pc.invert(skip)

        base, window, meta = self._anchor()
        if base is not None:
            out.anchor = "profile_start_time of the XSpace beside it"
        pid = _int(meta.get("process_id"))
        scanner = KinetoScanner(self.path, wants_args=wants_args)
        em = _Emitter({})
        outer: dict[tuple[int, int], tuple[int, int]] = {}
        skipped = 0
        try:
            for raw in scanner:
                cols = raw.columns
                names = cols["name"].to_pylist()
                ts = cols["ts_ns"].to_pylist()
                dur = cols["dur_ns"].to_pylist()
                tids = cols["tid"].to_pylist()
                for i, name in enumerate(names):
                    if name is None or ts[i] is None:
                        skipped += 1
                        continue
                    start, end = ts[i], ts[i] + (dur[i] or 0)
                    kind = _kind_of_name(name)
                    tid = tids[i]
                    if kind in (DISPATCH, TRANSFER, COMPILE):
                        last = outer.get((kind, tid), (0, -1))
                        if start >= last[0] and end <= last[1]:
                            continue
                        outer[(kind, tid)] = (start, end)
                        em.host(kind, start, end, name, tid, pid)
                        continue
                    args = raw.args.get(i) if kind == STATS else None
                    if args is None:
                        skipped += 1
                    elif "hlo_op" in args:
                        em.op(start, end, str(args["hlo_op"]), args.get("hlo_module"),
                              _int(args.get("program_id")), _int(args.get("device_ordinal")),
                              _int(args.get("run_id")), tid, pid)
                    elif "step_num" in args:
                        em.step(start, end, args["step_num"], name, tid, pid)
                    else:
                        skipped += 1
        except TraceFileError as exc:
            raise JaxProfileError(str(exc)) from None
        em.skipped["host events (Python, runtime)"] += skipped + scanner.skipped
        em.flush()
        out.problems += scanner.problems
        out.events = scanner.events
        out.spans = em.spans
        out.pid = pid
        out.host = _host_of(self.path)
        if base is None and em.hi is not None:
            base, out.anchor, words = _fallback_anchor(self.path, em.hi)
            out.problems.append(f"its times are relative to the profile's start, which only the "
                                f"XSpace (.xplane.pb) holds: times placed by {words}")
        base = base or 0
        if em.lo is not None:
            lo, hi = em.lo + base, em.hi + base       # type: ignore[operator]
            out.window = (min(window[0], lo), max(window[1], hi)) if window else (lo, hi)
        if em.batches:
            out.table = _shifted(em.batches, base)
        elif not out.problems:
            out.problems.append("no events in the trace")
        out.rank, out.rank_source = _rank(meta, self.path)
        out.info = {"profile": "jax", "format": "chrome-json", "file": self.path.name,
                    "host": out.host, "pid": pid, "anchor": out.anchor, "events": out.events,
                    "spans": out.spans, "skipped": dict(em.skipped),
                    "seconds": round(time.perf_counter() - t0, 3)}
        return out


# ---- XLA's cost analysis of the profile's modules ------------------------------------------

def module_costs(path: str | os.PathLike[str], per_op: bool = True) -> dict[str, dict[str, Any]]:
    """XLA's own cost analysis (HloCostAnalysis, jaxlib's) of each module the profile holds the
    HLO of, by "module(program id)": {"module", "program_id", "flops", "transcendentals",
    "bytes_accessed", "ops": {op name: {"opcode", "category", "flops", "bytes_accessed"}}}; a
    figure XLA cannot count (custom calls) is left out and named in "not_counted".

    The profile carries each compiled module's HLO (its /host:metadata plane), not its costs:
    on the CPU no op event has flops or bytes. So the HLO is analysed here, with the jaxlib
    installed (its CPU client's analysis: FLOPs are the backend's own count; bytes are those of
    the CPU's layouts, and a GPU module's custom calls, cuBLAS GEMMs among them, count no FLOPs).
    Per op: each op of each non-fusion computation alone in a module of its own (its operands
    as parameters), so a fusion's bytes are what it reads and writes, not its insides; an op
    that cannot stand alone (tuple plumbing, control flow) has none. Raises JaxProfileError
    when jaxlib is missing or the profile holds no HLO."""
    hlo: dict[tuple[str, int], bytes] = {}
    for f in profile_files(path):
        if f.name.endswith(XPLANE_SUFFIX):
            conv = _XSpaceConversion(f)
            with open(f, "rb") as fh:
                conv._locate(fh)
                meta = conv._find(fh, "/host:metadata")
            if meta is not None:
                conv._hlo(meta)
                hlo.update(conv.hlo_protos)
    if not hlo:
        raise JaxProfileError(f"{path}: no module's HLO in the profile (the XSpace's /host:metadata "
                              "plane holds it; a Chrome trace does not)")
    return _analyse_modules(hlo, per_op)


def _analyse_modules(hlo: dict[tuple[str, int], bytes], per_op: bool = True) -> dict[str, dict[str, Any]]:
    """module_costs of HloProtos by (module, program id)."""
    analyse = _cost_analysis()
    msgs = messages()
    out: dict[str, dict[str, Any]] = {}
    for (name, prog), proto in sorted(hlo.items()):
        module = msgs["HloProto"].FromString(proto).hlo_module
        whole = analyse(module.SerializeToString())
        entry: dict[str, Any] = {"module": name, "program_id": prog, **_cost_fields(whole)}
        if per_op:
            infos = module_ops(module)
            ops: dict[str, Any] = {}
            for comp, ins in _top_level_ops(module):
                single = _op_module(module, comp, ins)
                cost = analyse(single) if single is not None else None
                info = infos.get(ins.name)
                ops[ins.name] = {"opcode": ins.opcode, "category": info.category if info else ins.opcode,
                                 "dtype": _result_dtype(ins.shape),
                                 **(_cost_fields(cost) if cost is not None else {})}
            entry["ops"] = ops
        out[f"{name}({prog})"] = entry
    return out


_DTYPES = {10: "fp16", 11: "fp32", 12: "fp64", 16: "bf16"}     # xla.PrimitiveType -> a ceilings' dtype


def _result_dtype(shape: Any) -> str | None:
    """The floating dtype of an op's result (a tuple's first element's), None for others."""
    while shape.element_type == 13 and len(shape.tuple_shapes):
        shape = shape.tuple_shapes[0]
    return _DTYPES.get(shape.element_type)


def _cost_fields(cost: dict[str, float] | None) -> dict[str, Any]:
    """XLA's figures under our names; one it cannot count (a custom call: cuDNN, cuBLAS, a
    kernel of its own) comes back negative and is left out, said in "not_counted"."""
    if not cost:
        return {}
    out: dict[str, Any] = {}
    unknown = []
    for k, src in (("flops", "flops"), ("transcendentals", "transcendentals"),
                   ("bytes_accessed", "bytes accessed")):
        if src in cost:
            if cost[src] < 0:
                unknown.append(k)
            else:
                out[k] = cost[src]
    if "flops" not in out and not unknown:
        out["flops"] = 0.0            # XLA leaves out a figure that is zero
    if unknown:
        out["not_counted"] = unknown
    return out


def _cost_analysis() -> Any:
    """serialized HloModuleProto -> XLA's cost dict (None where XLA refuses the module)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")     # no client start-up lines on the terminal
    try:
        from jaxlib import _hlo, _jax  # type: ignore[attr-defined, unused-ignore]  # jaxlib's private modules (untyped where jaxlib is absent, as in CI's lint step); jaxlib alone: jax costs ~1 s more
        client = _jax.get_tfrt_cpu_client(asynchronous=False)
        cost = _jax.hlo_module_cost_analysis
        from_proto = _hlo.HloModule.from_serialized_hlo_module_proto
    except (ImportError, AttributeError) as exc:
        raise JaxProfileError(f"XLA's cost analysis needs jaxlib (pip install jax): {exc}") from None

    def analyse(serialized: bytes) -> dict[str, float] | None:
        try:
            return dict(cost(client, from_proto(serialized)))
        except Exception:          # XLA's verifier refusing one module: that op has no cost
            return None
    return analyse


_NOT_OPS = ("parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all",
            "partition-id", "replica-id")


def _top_level_ops(module: Any) -> Iterator[tuple[Any, Any]]:
    """The ops that run as such: those of the entry computation and of the computations it
    runs through control flow (loop bodies, branches, calls); not a fusion's insides nor a
    reduction's reducer."""
    comps = {c.id: c for c in module.computations}
    entry = module.entry_computation_id if module.entry_computation_id in comps else \
        next((c.id for c in module.computations if c.name == module.entry_computation_name), None)
    todo, seen = [entry] if entry is not None else [], set()
    while todo:
        cid = todo.pop()
        if cid in seen or cid not in comps:
            continue
        seen.add(cid)
        for ins in comps[cid].instructions:
            if ins.opcode in _CONTROL_FLOW:
                todo += list(ins.called_computation_ids)
            elif ins.opcode not in _NOT_OPS and not ins.opcode.endswith("-done"):
                yield comps[cid], ins


_CONTROL_FLOW = ("while", "conditional", "call")


def _op_module(module: Any, comp: Any, ins: Any) -> bytes | None:
    """A serialized HloModuleProto computing `ins` alone: its operands as parameters, the
    computations it calls (and theirs) as they are."""
    msgs = messages()
    by_id = {i.id: i for i in comp.instructions}
    comps = {c.id: c for c in module.computations}
    found = [by_id.get(o) for o in ins.operand_ids]
    operands = [o for o in found if o is not None]
    if len(operands) != len(found):
        return None
    needed: set[int] = set()
    todo = list(ins.called_computation_ids)
    while todo:
        cid = todo.pop()
        if cid in needed or cid not in comps:
            continue
        needed.add(cid)
        todo += [c for i in comps[cid].instructions for c in i.called_computation_ids]
    single = msgs["HloModuleProto"]()
    single.name = f"{module.name}.{ins.name}"
    single.id = module.id
    single.stack_frame_index = module.stack_frame_index
    for c in module.computations:            # callees before callers, as the module lists them
        if c.id in needed:
            single.computations.add().CopyFrom(c)
    entry = single.computations.add()
    entry.name = f"{ins.name}.computation"
    entry.id = max([c.id for c in module.computations] + [0]) + 1
    # the entry's instructions numbered afresh in its own id space (XLA keys an instruction by
    # the low 32 bits of its id, the computation's id above them)
    params = []
    for n, operand in enumerate(operands):
        p = entry.instructions.add()
        p.name, p.opcode, p.parameter_number, p.id = f"p{n}", "parameter", n, (entry.id << 32) | (n + 1)
        p.shape.CopyFrom(operand.shape)
        params.append(p.id)
        entry.program_shape.parameters.add().CopyFrom(operand.shape)
        entry.program_shape.parameter_names.append(f"p{n}")
    op = entry.instructions.add()
    op.CopyFrom(ins)
    op.id = (entry.id << 32) | (len(operands) + 1)
    del op.operand_ids[:]
    op.operand_ids.extend(params)
    del op.control_predecessor_ids[:]
    entry.program_shape.result.CopyFrom(ins.shape)
    entry.root_id = op.id
    single.entry_computation_name, single.entry_computation_id = entry.name, entry.id
    single.host_program_shape.CopyFrom(entry.program_shape)
    return bytes(single.SerializeToString())


# ---- the cost analysis at conversion, in a process of its own ------------------------------

COST_TIMEOUT_S = 60.0          # COUNTERPROF_JAX_COST_TIMEOUT overrides it; 0 turns the analysis off
_COST_ENV = "COUNTERPROF_JAX_COST_TIMEOUT"


# XLA's costs of the modules already analysed in this process, by their HLO's hash: the same
# jitted step recurs in every window of a run, and a child that imports jaxlib costs ~0.3 s (a
# Flax loop under `run --jax` at 1.22-1.28x with a child per window, 1.03-1.15x without any)
_COST_CACHE: dict[tuple[str, int, str], dict[str, dict[str, Any]]] = {}
_COST_CACHE_MAX = 512


def costs_in_subprocess(hlo: dict[tuple[str, int], bytes], timeout: float | None = None
                        ) -> tuple[dict[tuple[str, int], dict[str, dict[str, Any]]] | None, dict[str, Any]]:
    """costs_in_child for the modules not analysed before in this process (_COST_CACHE)."""
    import hashlib
    keys = {k: (k[0], k[1], hashlib.sha1(v).hexdigest()) for k, v in hlo.items()}
    known = {k: _COST_CACHE[c] for k, c in keys.items() if c in _COST_CACHE}
    missing = {k: v for k, v in hlo.items() if k not in known}
    if not missing:
        n_ops = sum(1 for ops in known.values() for c in ops.values() if "flops" in c and "bytes_accessed" in c)
        return known, {"status": "ok", "source": "XLA's HloCostAnalysis (jaxlib's CPU client) of each "
                       "top-level op alone, analysed before in this process", "modules": len(known),
                       "ops": n_ops, "seconds": 0.0}
    costs, info = costs_in_child(missing, timeout)
    if costs is None:
        return (known or None), info if not known else {**info, "modules": len(known)}
    if len(_COST_CACHE) > _COST_CACHE_MAX:
        _COST_CACHE.clear()
    for k, ops in costs.items():
        if k in keys:
            _COST_CACHE[keys[k]] = ops
    merged = {**known, **costs}
    info = {**info, "modules": len(merged),
            "ops": sum(1 for ops in merged.values() for c in ops.values() if "flops" in c and "bytes_accessed" in c)}
    return merged, info


def costs_in_child(hlo: dict[tuple[str, int], bytes], timeout: float | None = None
                   ) -> tuple[dict[tuple[str, int], dict[str, dict[str, Any]]] | None, dict[str, Any]]:
    """XLA's cost analysis of each op of the modules (module_costs' "ops") run in a child
    process, so that XLA aborting on a module (a CHECK failure kills the process) or hanging
    cannot take the conversion down: ({(module, program id): {op: costs}}, what was done) or
    (None, {"status": "none", "reason": ...}) on any failure."""
    import pickle
    import subprocess
    import sys
    t0 = time.perf_counter()
    if timeout is None:
        try:
            timeout = float(os.environ.get(_COST_ENV, COST_TIMEOUT_S))
        except ValueError:
            timeout = COST_TIMEOUT_S

    def failed(reason: str) -> tuple[None, dict[str, Any]]:
        return None, {"status": "none", "reason": reason, "seconds": round(time.perf_counter() - t0, 3)}
    if timeout <= 0:
        return None, {"status": "off", "reason": f"XLA's cost analysis turned off ({_COST_ENV}="
                      f"{os.environ.get(_COST_ENV)})", "seconds": 0.0}
    import counterprof
    root = str(Path(counterprof.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
           "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"), "JAX_PLATFORMS": "cpu"}
    try:
        proc = subprocess.run([sys.executable, "-c", "from counterprof.collectors.jax_trace.convert import "
                               "_cost_child; _cost_child()"],
                              input=pickle.dumps(dict(hlo)), capture_output=True, timeout=timeout, env=env,
                              cwd=root)
    except subprocess.TimeoutExpired:
        return failed(f"XLA's cost analysis did not finish in {timeout:g} s (left out; "
                      f"{_COST_ENV} sets the limit)")
    except OSError as exc:
        return failed(f"XLA's cost analysis could not be started: {exc}")
    if proc.returncode != 0:
        tail = (proc.stderr or b"").decode(errors="replace").strip().splitlines()
        why = tail[-1][:300] if tail else ""
        how = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit status {proc.returncode}"
        return failed(f"XLA's cost analysis failed ({how}){': ' + why if why else ''}")
    try:
        doc = json.loads(proc.stdout)
        costs = {(str(m), int(p)): ops for m, p, ops in doc["modules"]}
    except (ValueError, KeyError, TypeError) as exc:
        return failed(f"XLA's cost analysis gave no readable answer ({exc})")
    n_ops = sum(1 for ops in costs.values() for c in ops.values() if "flops" in c and "bytes_accessed" in c)
    return costs, {"status": "ok", "source": "XLA's HloCostAnalysis (jaxlib's CPU client) of each "
                   "top-level op alone", "modules": len(costs), "ops": n_ops,
                   "seconds": round(time.perf_counter() - t0, 3)}


def _cost_child() -> None:
    """The child of costs_in_subprocess: HloProtos (pickled, by (module, program id)) on stdin,
    {"modules": [[module, program id, {op: costs}], ...]} as JSON on stdout."""
    import pickle
    import sys
    hlo = pickle.loads(sys.stdin.buffer.read())
    try:
        done = _analyse_modules(hlo, per_op=True)
    except JaxProfileError as exc:
        print(exc, file=sys.stderr)
        sys.exit(3)
    sys.stdout.write(json.dumps({"modules": [[e["module"], e["program_id"], e.get("ops", {})]
                                             for e in done.values()]}))
