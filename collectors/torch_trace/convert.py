"""Kineto trace -> spans (counterprof.ground.schema.SPANS_SCHEMA), streamed in bounded batches.

    conversion = TraceConversion("rank0.json.gz")
    for batch in conversion:        # pyarrow.RecordBatch, SPANS_SCHEMA, epoch-ns times
        sink(batch)
    conversion.rank, conversion.info, conversion.problems

Categories (Kineto "cat" -> span category):
    kernel, Kernel -> kernel        gpu_memcpy, Memcpy -> memcpy      gpu_memset, Memset -> memset
    cuda_sync -> sync               cpu_op, operator, Operator -> cpu_op
    cuda_runtime, cuda_driver, Runtime, *_runtime -> runtime
    user_annotation, gpu_user_annotation -> annotation (the GPU one has device and stream)
    ProfilerStep#N (cpu_op or user_annotation) -> step
    enumerate(DataLoader)#<iterator>.__next__ (user_annotation or cpu_op) -> input (the wait
        for the next batch)
    record_param_comms (cpu_op), gloo:<coll> (user_annotation: gloo's CPU work) -> collective
    Trace ("PyTorch Profiler (0)") -> one "window" span per trace: the recorded window, with the
        trace's metadata in attrs (it ends the trace's spans: its presence says "complete")
Skipped (counted in the window's attrs): python_function, flow arrows, instants, metadata,
other categories.

drop_marks: leave out the step and input spans: the process that wrote the trace timed every
one of its steps and DataLoader waits itself (the torch driver's steps file, steps.py), and
those, one per step for the whole run, win over the trace's own for the steps it recorded.

GPU spans carry the host process's pid (Kineto gives them the device as pid), the device and
the stream; CPU spans carry pid and tid. `correlation` links a runtime launch to its GPU span.
Collective metadata (collective, bytes, group_size, attrs: process group, dtype, in/out bytes)
comes from record_param_comms; NCCL kernels get it through their External id (the launching
record_param_comms's) or, failing that, from their name; gloo:<coll> spans from their input
shapes (recorded with record_shapes=True); c10d::<coll>_ ops are tagged with the collective.

Time: Kineto's ts is µs, relative to baseTimeNanoseconds when the trace has it, else (older
traces) absolute epoch µs; start = base + ts exactly, in ns. Older PyTorch writes
baseTimeNanoseconds after traceEvents: then the batches are spilled to a temporary Arrow file
and shifted once the base is known (memory stays bounded either way).
"""
from __future__ import annotations

import json
import os
from array import array
from bisect import bisect_left
import re
from collections import Counter
from typing import Any
from collections.abc import Iterator

import pyarrow as pa

from counterprof.ground.kernels import (COMMUNICATION, collective_in_kernel_name,
                                          kernel_class)
from counterprof.ground.schema import SPANS_SCHEMA

from . import arrow_compute as pc
from .scan import BATCH_ROWS, CHUNK_BYTES, KinetoScanner, RawEvents, adopt, op_shapes, scan_ahead

CATEGORIES = ("kernel", "memcpy", "memset", "sync", "cpu_op", "runtime", "annotation",
              "step", "collective", "window", "input")
INPUT_PREFIX = "enumerate(DataLoader)#"
CLASSES = ("compute", "communication", "memory", "other")
_CAT_CODE = {c: i for i, c in enumerate(CATEGORIES)}
_CLASS_CODE: dict[str | None, int] = {c: i for i, c in enumerate(CLASSES)}

# intermediate kinds: the category before name-based refinements
SKIP, KERNEL, MEMCPY, MEMSET, SYNC, CPU_OP, RUNTIME, ANNOT, GPU_ANNOT, TRACE = range(10)
_KIND_OF_CAT = {
    "kernel": KERNEL, "Kernel": KERNEL,
    "gpu_memcpy": MEMCPY, "Memcpy": MEMCPY,
    "gpu_memset": MEMSET, "Memset": MEMSET,
    "cuda_sync": SYNC,
    "cpu_op": CPU_OP, "operator": CPU_OP, "Operator": CPU_OP,
    "cuda_runtime": RUNTIME, "cuda_driver": RUNTIME, "Runtime": RUNTIME, "Driver": RUNTIME,
    "user_annotation": ANNOT, "gpu_user_annotation": GPU_ANNOT,
    "Trace": TRACE,
}
_KIND_CATEGORY = {KERNEL: "kernel", MEMCPY: "memcpy", MEMSET: "memset", SYNC: "sync",
                  CPU_OP: "cpu_op", RUNTIME: "runtime", ANNOT: "annotation",
                  GPU_ANNOT: "annotation"}
# the kinds as Arrow sets and tables (the conversion's array work is Arrow's: no numpy)
_GPU_KINDS = pa.array([KERNEL, MEMCPY, MEMSET, SYNC, GPU_ANNOT], pa.int64())
_GPU_WORK_KINDS = pa.array([KERNEL, MEMCPY, MEMSET, SYNC], pa.int64())
_COPY_KINDS = pa.array([MEMCPY, MEMSET], pa.int64())
_HOST_KINDS = pa.array([CPU_OP, RUNTIME, ANNOT], pa.int64())
_HOSTISH_KINDS = pa.array([CPU_OP, ANNOT], pa.int64())
_DROPPED_KINDS = pa.array([SKIP, TRACE], pa.int64())
# kind -> category code (SKIP and TRACE rows are dropped before: 0 stands in for them)
_CATEGORY_OF_KIND = pa.array([_CAT_CODE[_KIND_CATEGORY[k]] if k in _KIND_CATEGORY else 0
                              for k in range(TRACE + 1)], pa.int32())
# Arrays here are typed: a pa.array that infers its type loads dateutil (~1 ms of an import)
_OP_CATS = pa.array(["cpu_op", "operator", "Operator"], pa.string())   # torch ops: their shapes are kept
ABSOLUTE_NS = 10 ** 18        # ts beyond this (2001 as epoch µs) is absolute, not relative
_RANK_IN_NAME = re.compile(r"rank[-_=]?(\d+)", re.IGNORECASE)
_DTYPE_BYTES = {
    "float": 4, "double": 8, "half": 2, "bfloat16": 2, "c10::half": 2, "c10::bfloat16": 2,
    "int": 4, "long": 8, "long int": 8, "int64": 8, "int32": 4, "short": 2, "short int": 2,
    "byte": 1, "char": 1, "signed char": 1, "unsigned char": 1, "bool": 1, "int8": 1,
    "uint8": 1, "complexfloat": 8, "complexdouble": 16, "c10::complex<float>": 8,
    "c10::complex<double>": 16, "float8_e4m3fn": 1, "float8_e5m2": 1, "c10::float8_e4m3fn": 1,
    "c10::float8_e5m2": 1, "float16": 2, "float32": 4, "float64": 8,
}


def kind_of_category(cat: str | None) -> int:
    if cat is None:
        return SKIP
    kind = _KIND_OF_CAT.get(cat)
    if kind is None and cat.endswith("_runtime"):   # hip_runtime, xpu_runtime, privateuse1_runtime
        kind = RUNTIME
    return SKIP if kind is None else kind


def wants_args(cat: pa.Array, name: pa.Array) -> pa.Array:
    """Rows whose args the converter decodes: collectives and the Trace span (a few rows)."""
    return pc.or_(pc.or_(pc.equal(name, "record_param_comms"), pc.equal(cat, "Trace")),
                  pc.or_(pc.starts_with(name, "gloo:"), pc.starts_with(name, "c10d::")))


def wants_shapes(cat: pa.Array, name: pa.Array) -> pa.Array:
    """The torch ops that have a cost model, but for those wants_args takes: their recorded
    shapes (the roofline's input) as attrs, which the native scanner writes from the args'
    text (decoding every op's args in Python cost the import half its time)."""
    return pc.and_(pc.and_(pc.is_in(name, _costed_ops()), pc.is_in(cat, _OP_CATS)),
                   pc.invert(wants_args(cat, name)))


def _costed_ops() -> pa.Array:
    global _COSTED
    if _COSTED is None:
        from counterprof.ground.opcost import FORMULAS
        _COSTED = pa.array(sorted(FORMULAS), pa.string())
    return _COSTED


_COSTED = None


def rank_from_name(path: str | os.PathLike[str]) -> int | None:
    m = _RANK_IN_NAME.search(os.path.basename(os.fspath(path)))
    return _int(m.group(1), 0, MAX_RANK) if m else None


def dtype_bytes(dtype: Any) -> int | None:
    if not isinstance(dtype, str):
        return None
    return _DTYPE_BYTES.get(dtype.strip().lower())


class TraceConversion:
    """Iterate to get the spans batches; afterwards: rank, rank_source, info, problems.

    default_rank: the rank when the trace names none (distributedInfo, then the file name).
    spill_dir: where a trace with baseTimeNanoseconds after its events is staged (default:
    the system's temporary directory).
    """

    def __init__(self, path: str | os.PathLike[str], *, default_rank: int = 0,
                 spill_dir: str | os.PathLike[str] | None = None, native: bool = True,
                 chunk_bytes: int = CHUNK_BYTES, batch_rows: int = BATCH_ROWS,
                 drop_marks: bool = False, scan_ahead: bool = False):
        self.path = os.fspath(path)
        self.scan_ahead = scan_ahead
        self.default_rank = default_rank
        self.drop_marks = drop_marks
        self.spill_dir = spill_dir
        self.native = native
        early = adopt(self.path, native=native, chunk_bytes=chunk_bytes, batch_rows=batch_rows,
                      wants_args=wants_args, wants_shapes=wants_shapes) if scan_ahead else None
        self.scanner = early or KinetoScanner(self.path, native=native, chunk_bytes=chunk_bytes,
                                              batch_rows=batch_rows, wants_args=wants_args,
                                              wants_shapes=wants_shapes)
        self.problems: list[str] = []
        self.rank: int | None = None
        self.rank_source = ""
        self.info: dict[str, Any] = {}
        self.spans = 0
        self.gpu_spans = 0
        self.host_pid: int | None = None
        self._pids: Counter[int] = Counter()
        self._skipped_categories: Counter[str] = Counter()
        self._collectives = _CollectiveIndex()      # External id -> (collective, bytes, group, attrs)
        self._trace_extent: tuple[int, int] | None = None
        self._extent = [None, None]
        self._single_group: int | None = None
        self._negative = 0          # complete events left out for a negative dur

    # -- the stream ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        base: int | None = None
        spill = spill_writer = None
        batches = scan_ahead(self.scanner) if self.scan_ahead else \
            ((raw, self.scanner.meta) for raw in self.scanner)
        try:
            for raw, meta in batches:
                if base is None and spill is None:
                    if "baseTimeNanoseconds" in meta:
                        base = _base_time(meta, self.problems) or 0
                    else:
                        first = raw.columns["ts_ns"]
                        first_ts = pc.min(first).as_py()
                        if first_ts is not None and first_ts >= ABSOLUTE_NS:
                            base = 0          # older trace: absolute epoch µs
                        else:
                            import tempfile     # (and random: only for the traces that spill)
                            spill = tempfile.TemporaryFile(dir=self.spill_dir, prefix="counterprof-spill-")
                            spill_writer = pa.ipc.new_stream(spill, SPANS_SCHEMA)
                self._single_group = _single_group_size(meta.get("distributedInfo"))
                batch = self._convert(raw, base or 0)
                if batch is None:
                    continue
                if spill_writer is not None:
                    spill_writer.write_batch(batch)
                else:
                    yield batch
            meta = self.scanner.meta
            late_base = _base_time(meta, self.problems)
            if spill_writer is not None:
                spill_writer.close()
                assert spill is not None          # (made with its writer)
                spill.seek(0)
                shift = late_base or 0
                for batch in pa.ipc.open_stream(spill):
                    yield _shift(batch, shift)
                base = shift
            elif late_base is not None and base == 0 and late_base != 0:
                self.problems.append("baseTimeNanoseconds comes after events whose timestamps "
                                     "already look absolute; kept them as absolute")
            window = self._window(base or 0)
            if window is not None:
                yield window
        finally:
            batches.close()         # the scan thread done (stopped when the caller stopped early)
            if spill is not None:
                spill.close()
            self._finish()

    def _finish(self) -> None:
        sc = self.scanner
        self.problems = [*sc.problems, *self.problems]
        if self._negative:
            self.problems.append(f"{self._negative:,} complete event(s) (ph X) left out: their dur "
                                 "is negative (they would end before they start)")
        meta = sc.meta
        dist: Any = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
        rank = _int(dist.get("rank"), 0, MAX_RANK)
        if dist.get("rank") is not None and rank is None:
            self.problems.append(f"distributedInfo.rank {str(dist.get('rank'))[:40]} is not a rank "
                                 f"(0 to {MAX_RANK:,}): left out, the rank comes from the file "
                                 "name or --rank")
        if rank is not None:
            self.rank, self.rank_source = rank, "distributedInfo"
        elif rank_from_name(self.path) is not None:
            self.rank, self.rank_source = rank_from_name(self.path), "file name"
        else:
            self.rank, self.rank_source = self.default_rank, "default"
        if not sc.found_events and not sc.problems:
            self.problems.append("no traceEvents in the file: not a PyTorch profiler trace?")

    # -- one batch ----------------------------------------------------------------------------

    def _convert(self, raw: RawEvents, base: int) -> pa.RecordBatch | None:
        cols = raw.columns
        cat_enc = pc.dictionary_encode(cols["cat"])
        cat_names = cat_enc.dictionary.to_pylist() + [None]
        cat_kinds = [kind_of_category(c) for c in cat_names]       # the last: no cat
        idx = pc.fill_null(cat_enc.indices, len(cat_names) - 1)
        kind = pc.take(pa.array(cat_kinds, pa.int64()), idx)
        names = pc.fill_null(cols["name"], "")
        counts = [0] * len(cat_names)
        for item in pc.value_counts(idx).to_pylist():
            counts[item["values"]] = item["counts"]
        for c, k, count in zip(cat_names, cat_kinds, counts):
            if k == SKIP and count:
                self._skipped_categories[c if c is not None else "(no cat)"] += count

        ts = _filled(cols["ts_ns"])
        dur = _filled(cols["dur_ns"])
        pid = cols["pid"]
        # the Trace span: the recorded window's extent
        trace_rows = pc.int_view(pc.indices_nonzero(pc.equal(kind, TRACE))).tolist()
        if trace_rows:
            ts_v, dur_v = pc.int_view(ts), pc.int_view(dur)
            for r in trace_rows:
                if dur_v[r] >= 0:       # a window that ends before it starts is no window
                    self._trace_extent = (ts_v[r], _wrap64(ts_v[r] + dur_v[r]))
        host = pc.is_in(kind, _HOST_KINDS)
        if pc.any_(host):
            host_pids = pc.filter(pid, host)
            vc = pc.value_counts(pc.drop_null(host_pids))
            for item in vc.to_pylist():
                self._pids[item["values"]] += item["counts"]
            if self._pids:
                self.host_pid = self._pids.most_common(1)[0][0]

        keep = pc.invert(pc.is_in(kind, _DROPPED_KINDS))
        shortest = pc.min(dur).as_py()
        if shortest is not None and shortest < 0:   # ends before it starts: named and left out, like NaN
            from pyarrow import _compute      # (pyarrow.compute's `less`, unwrapped: arrow_compute)
            negative = _compute.call_function("less", [dur, pa.scalar(0, pa.int64())])
            self._negative += len(pc.indices_nonzero(pc.and_(keep, negative)))
            keep = pc.and_(keep, pc.invert(negative))
        if self.drop_marks:
            hostish_all = pc.is_in(kind, _HOSTISH_KINDS)
            if pc.any_(hostish_all):
                marks = pc.or_(pc.starts_with(names, "ProfilerStep#"), pc.starts_with(names, INPUT_PREFIX))
                keep = pc.and_(keep, pc.invert(pc.and_(hostish_all, marks)))
        if not pc.any_(keep):
            return None
        take = pc.indices_nonzero(keep)          # the rows kept (uint64, ascending)
        n = len(take)
        kind = pc.take(kind, take)
        names = pc.take(names, take)
        gpu_mask = pc.is_in(kind, _GPU_KINDS)

        # category codes, then the name-based refinements
        category = pc.take(_CATEGORY_OF_KIND, kind)
        hostish = pc.is_in(kind, _HOSTISH_KINDS)
        is_step = pc.and_(hostish, pc.starts_with(names, "ProfilerStep#"))
        category = pc.if_else(is_step, _code(_CAT_CODE["step"]), category)
        is_input = pc.and_(hostish, pc.starts_with(names, INPUT_PREFIX))
        category = pc.if_else(is_input, _code(_CAT_CODE["input"]), category)
        is_rpc = pc.and_(pc.equal(kind, CPU_OP), pc.equal(names, "record_param_comms"))
        is_gloo = pc.and_(pc.equal(kind, ANNOT), pc.starts_with(names, "gloo:"))
        category = pc.if_else(pc.or_(is_rpc, is_gloo), _code(_CAT_CODE["collective"]), category)

        # kernel classes, per distinct name
        gpu_work_mask = pc.is_in(kind, _GPU_WORK_KINDS)
        gpu_work = pc.indices_nonzero(gpu_work_mask)
        klass = pa.nulls(n, pa.int32())
        comm_rows: list[int] = []
        if len(gpu_work):
            enc = pc.dictionary_encode(pc.take(names, gpu_work))
            dict_names = enc.dictionary.to_pylist()
            codes = enc.indices
            kinds_here = pc.take(kind, gpu_work)
            cat_name = {KERNEL: "kernel", MEMCPY: "memcpy", MEMSET: "memset", SYNC: "sync"}
            classes = None
            for k in sorted(item["values"] for item in pc.value_counts(kinds_here).to_pylist()):
                per_name = pa.array([_CLASS_CODE[kernel_class(cat_name[k], nm)] for nm in dict_names],
                                    pa.int32())
                here = pc.take(per_name, codes)
                classes = here if classes is None else pc.if_else(pc.equal(kinds_here, k), here, classes)
            klass = pc.replace_with_mask(klass, gpu_work_mask, classes)
            comm_rows = pc.int_view(pc.indices_nonzero(
                pc.fill_null(pc.equal(klass, _CLASS_CODE[COMMUNICATION]), False))).tolist()

        ts_r, dur_r = pc.take(ts, take), pc.take(dur, take)
        start = pc.add(ts_r, pa.scalar(base, pa.int64()))
        end = pc.add(start, dur_r)
        lo, hi = pc.min(ts_r).as_py(), pc.max(pc.add(ts_r, dur_r)).as_py()   # kept relative to the base
        if self._extent[0] is None or lo < self._extent[0]:
            self._extent[0] = lo
        if self._extent[1] is None or hi > self._extent[1]:
            self._extent[1] = hi

        pid_r = pc.take(pid, take)
        tid_r = pc.take(cols["tid"], take)
        device_r = pc.take(cols["device"], take)
        stream_r = pc.take(cols["stream"], take)
        # GPU spans: the device (args.device, else Kineto's pid), the stream (args.stream, else
        # Kineto's tid), and the host process's pid
        device_col = pc.cast(pc.if_else(gpu_mask, pc.coalesce(device_r, pid_r), None), pa.int32())
        stream_col = pc.if_else(gpu_mask, pc.coalesce(stream_r, tid_r), None)
        pid_col = pc.if_else(gpu_mask, pa.scalar(self.host_pid, pa.int64()), pid_r)
        tid_col = pc.if_else(gpu_mask, pa.scalar(None, pa.int64()), tid_r)
        correlation = pc.take(cols["correlation"], take)
        bytes_col = pc.if_else(pc.is_in(kind, _COPY_KINDS), pc.take(cols["bytes"], take), None)

        # collectives: a few rows, handled one by one
        collective: list[str | None] = [None] * n
        group: list[int | None] = [None] * n
        attrs: list[str | None] = [None] * n
        bytes_list = None
        special = {}
        if raw.args:
            rows = pc.int_view(take)
            for raw_row, args in raw.args.items():
                i = bisect_left(rows, raw_row)
                if i < n and rows[i] == raw_row:
                    special[i] = args
        if special or comm_rows:
            ext_r = pc.int_view(pc.take(pc.fill_null(cols["external_id"], -1), take))
            category_v, kind_v = pc.int_view(category), pc.int_view(kind)
            bytes_list = bytes_col.to_pylist()
            idx = sorted(special)
            for i, name in zip(idx, pc.take(names, pa.array(idx, pa.int64())).to_pylist()):
                args = special[i]
                if category_v[i] == _CAT_CODE["collective"] and name == "record_param_comms":
                    info = _record_param_comms(args)
                    if ext_r[i] >= 0:
                        self._collectives.add(ext_r[i], info)
                elif name.startswith("gloo:"):
                    info = _shaped_collective(name[5:], args, self._single_group)
                elif name.startswith("c10d::"):
                    info = _shaped_collective(name[6:].rstrip("_"), args, None)
                else:
                    if kind_v[i] == CPU_OP:
                        attrs[i] = op_shapes(args)
                    continue
                collective[i], bytes_list[i], group[i], attrs[i] = info
            if comm_rows:
                found = self._collectives.lookup([ext_r[i] for i in comm_rows])
                comm_names = pc.take(names, pa.array(comm_rows, pa.int64())).to_pylist()
                for i, known, name in zip(comm_rows, found, comm_names):
                    info = known if known is not None else (collective_in_kernel_name(name), None, None, None)
                    collective[i], bytes_list[i], group[i], attrs[i] = info

        self.spans += n
        self.gpu_spans += len(gpu_work)
        return pa.RecordBatch.from_arrays([
            pc.cast(start, SPANS_SCHEMA.field("start").type),
            pc.cast(end, SPANS_SCHEMA.field("end").type),
            names,
            pa.DictionaryArray.from_arrays(category, pa.array(CATEGORIES, pa.string())),
            pa.DictionaryArray.from_arrays(klass, pa.array(CLASSES, pa.string())),
            device_col,
            stream_col,
            pid_col,
            tid_col,
            correlation,
            pa.array(collective, pa.string()),
            pa.array(bytes_list, pa.int64()) if bytes_list is not None else bytes_col,
            pa.array(group, pa.int32()),
            _with_shapes(pa.array(attrs, pa.string()), raw.shapes, take),
        ], schema=SPANS_SCHEMA)

    # -- the window span ----------------------------------------------------------------------

    def _window(self, base: int) -> pa.RecordBatch | None:
        extents = [e for e in (self._trace_extent, tuple(self._extent)) if e[0] is not None] \
            if self._trace_extent is not None else ([tuple(self._extent)] if self._extent[0] is not None else [])
        if not extents:
            return None
        # the recorded window; the spans may run past the Trace span (GPU work finishing late)
        start = min(e[0] for e in extents) + base
        end = max(e[1] for e in extents) + base
        self._finish_info()
        attrs = json.dumps(self.info, separators=(",", ":"), default=str)
        return pa.RecordBatch.from_arrays([
            pc.cast(pa.array([start], pa.int64()), SPANS_SCHEMA.field("start").type),
            pc.cast(pa.array([end], pa.int64()), SPANS_SCHEMA.field("end").type),
            pa.array([os.path.basename(self.path)], pa.string()),
            pa.DictionaryArray.from_arrays(pa.array([_CAT_CODE["window"]], pa.int32()),
                                           pa.array(CATEGORIES, pa.string())),
            pa.DictionaryArray.from_arrays(pa.array([None], pa.int32()), pa.array(CLASSES, pa.string())),
            pa.array([None], pa.int32()),
            pa.array([None], pa.int64()),
            pa.array([self.host_pid], pa.int64()),
            pa.array([None], pa.int64()),
            pa.array([None], pa.int64()),
            pa.array([None], pa.string()),
            pa.array([None], pa.int64()),
            pa.array([None], pa.int32()),
            pa.array([attrs], pa.string()),
        ], schema=SPANS_SCHEMA)

    def _finish_info(self) -> None:
        sc = self.scanner
        meta = sc.meta
        dist = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else None
        devices: Any = meta.get("deviceProperties") if isinstance(meta.get("deviceProperties"), list) else []
        self.info = {
            "trace": os.path.basename(self.path),
            "schema_version": meta.get("schemaVersion"),
            "base_time_ns": _int(meta.get("baseTimeNanoseconds")),
            "devices": [d.get("name") for d in devices if isinstance(d, dict)],
            "distributed": {k: v for k, v in (dist or {}).items()
                            if k in ("backend", "rank", "world_size", "pg_count", "nccl_version")},
            "events": sc.events,
            "spans": self.spans + 1,
            "gpu_spans": self.gpu_spans,
            "skipped": sc.skipped,
            "skipped_categories": dict(self._skipped_categories),
            "truncated": sc.truncated,
        }


# ---- helpers ------------------------------------------------------------------------------

def _filled(arr: pa.Array) -> pa.Array:
    """An int64 column with its nulls as 0."""
    return pc.fill_null(arr, 0) if arr.null_count else arr


def _code(code: int) -> pa.Scalar:
    return pa.scalar(code, pa.int32())


def _wrap64(v: int) -> int:
    """v as int64 arithmetic leaves it (wrapped around, as the arrays' sums are)."""
    return (v + 2**63) % 2**64 - 2**63


_INT64 = (-2**63, 2**63 - 1)
MAX_RANK = 2**20 - 1          # a million ranks: beyond, a rank is a damaged or hostile number


def _int(v: Any, lo: int = _INT64[0], hi: int = _INT64[1]) -> int | None:
    """v as an int when it is one in [lo, hi] (a JSON 1e40 is not a time: it would overflow)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    elif isinstance(v, str) and v.strip().lstrip("-").isdigit() and len(v) < 40:
        v = int(v)
    return v if isinstance(v, int) and lo <= v <= hi else None


def _base_time(meta: dict[str, Any], problems: list[str]) -> int | None:
    """baseTimeNanoseconds, when it is a time; else said once in problems."""
    raw = meta.get("baseTimeNanoseconds")
    base = _int(raw, 0)
    if raw is not None and base is None:
        note = (f"baseTimeNanoseconds {str(raw)[:40]!r} is not a time (ns since the epoch, "
                "below 2^63): the events' times are kept as they are")
        if note not in problems:
            problems.append(note)
    return base


def _shift(batch: pa.RecordBatch, ns: int) -> pa.RecordBatch:
    if ns == 0:
        return batch
    cols = batch.columns
    t = SPANS_SCHEMA.field("start").type
    shift = pa.scalar(ns, pa.int64())        # typed: inferring a Python int's type loads dateutil
    start = pc.cast(pc.add(pc.cast(cols[0], pa.int64()), shift), t)
    end = pc.cast(pc.add(pc.cast(cols[1], pa.int64()), shift), t)
    return pa.RecordBatch.from_arrays([start, end, *cols[2:]], schema=SPANS_SCHEMA)


def _single_group_size(dist: Any) -> int | None:
    """The group size when the trace has one process group (else which group is unknown)."""
    if not isinstance(dist, dict):
        return None
    configs = dist.get("pg_config")
    if isinstance(configs, list) and len(configs) == 1 and isinstance(configs[0], dict):
        return _int(configs[0].get("pg_size"))
    if dist.get("pg_count") in (None, 1):
        return _int(dist.get("world_size"))
    return None


class _CollectiveIndex:
    """External id -> collective info, for the NCCL kernels that come after their
    record_param_comms in the file. Compact (12 bytes an entry; each distinct info once), since
    a long trace holds many collectives."""

    def __init__(self) -> None:
        self.ext = array("q")
        self.idx = array("i")
        self.infos: list[tuple[Any, ...]] = []
        self._ids: dict[tuple[Any, ...], int] = {}
        self._sorted: tuple[list[int], list[int]] | None = None

    def add(self, ext: int, info: tuple[Any, ...]) -> None:
        i = self._ids.get(info)
        if i is None:
            i = self._ids[info] = len(self.infos)
            self.infos.append(info)
        self.ext.append(ext)
        self.idx.append(i)
        self._sorted = None

    def lookup(self, exts: list[int]) -> list[tuple[Any, ...] | None]:
        if not self.ext:
            return [None] * len(exts)
        if self._sorted is None:
            order = sorted(range(len(self.ext)), key=self.ext.__getitem__)    # stable
            self._sorted = [self.ext[o] for o in order], [self.idx[o] for o in order]
        keys, ids = self._sorted
        last = len(keys) - 1
        found: list[tuple[Any, ...] | None] = []
        for e in exts:
            p = min(bisect_left(keys, e), last)       # the first entry of that id
            found.append(self.infos[ids[p]] if keys[p] == e and e >= 0 else None)
        return found


_RPC_FIELDS = ("Collective name", "dtype", "In msg nelems", "Out msg nelems", "Group size",
               "Process Group Name", "Process Group Description", "Process Group Ranks")
_rpc_cache: dict[tuple[Any, ...], tuple[Any, ...]] = {}


def _record_param_comms(args: dict[str, Any]) -> tuple[Any, ...]:
    """(collective, bytes, group size, attrs json) from record_param_comms's args (the same
    arguments recur all through a trace: computed once each)."""
    key = tuple(str(args.get(k)) for k in _RPC_FIELDS)
    info = _rpc_cache.get(key)
    if info is None:
        if len(_rpc_cache) > 10_000:
            _rpc_cache.clear()
        info = _rpc_cache[key] = _record_param_comms_uncached(args)
    return info


def _record_param_comms_uncached(args: dict[str, Any]) -> tuple[Any, ...]:
    size = dtype_bytes(args.get("dtype"))
    in_n, out_n = _int(args.get("In msg nelems")), _int(args.get("Out msg nelems"))
    in_b = in_n * size if in_n is not None and size else None
    out_b = out_n * size if out_n is not None and size else None
    attrs = {k: v for k, v in (("pg", args.get("Process Group Name")),
                               ("pg_desc", args.get("Process Group Description")),
                               ("dtype", args.get("dtype")),
                               ("in_bytes", in_b), ("out_bytes", out_b)) if v is not None}
    ranks = args.get("Process Group Ranks")
    if isinstance(ranks, str) and len(ranks) <= 200:
        attrs["ranks"] = ranks
    coll = args.get("Collective name")
    return (coll if isinstance(coll, str) else None, in_b, _int(args.get("Group size")),
            json.dumps(attrs, separators=(",", ":")) if attrs else None)


def _shaped_collective(coll: str, args: dict[str, Any], group: int | None) -> tuple[Any, ...]:
    """(collective, bytes, group size, attrs) from a collective's recorded input shapes."""
    dims, types = args.get("Input Dims"), args.get("Input type")
    total = None
    if isinstance(dims, list) and isinstance(types, list):
        total = 0
        for d, t in zip(dims, types):
            size = dtype_bytes(t)
            for shape in _shapes(d):
                if size:
                    n = 1
                    for x in shape:
                        n *= x if isinstance(x, int) else 1
                    total += n * size
        total = total or None
    attrs = json.dumps({"dtype": types[0]}, separators=(",", ":")) \
        if isinstance(types, list) and types and isinstance(types[0], str) and types[0] else None
    return (coll or None, total, group, attrs)


def _with_shapes(attrs: pa.Array, shapes: pa.Array | None, take: pa.Array) -> pa.Array:
    """attrs, with the scanner's op shapes on the rows that have them (never a row whose attrs
    the collectives set: wants_shapes leaves those out)."""
    if shapes is None or shapes.null_count == len(shapes):
        return attrs
    return pc.coalesce(attrs, pc.take(shapes, take))


def _shapes(d: Any) -> list[list[Any]]:
    """Shapes in an Input Dims entry: [n, m] for a tensor, [[n], [m]] for a TensorList."""
    if isinstance(d, list) and d and all(isinstance(x, list) for x in d):
        return [x for x in d if all(isinstance(y, int) for y in x)]
    if isinstance(d, list) and all(isinstance(x, int) for x in d) and d:
        return [d]
    return []
