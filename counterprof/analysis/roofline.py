"""The roofline of a run's torch ops: per op and unique shape, achieved FLOP/s and bytes/s
against the machine's ceilings, the bound, the fraction of the roof, and MFU per step.

    r = roofline(spans, ceilings)              # spans: the run's spans table (pyarrow)
    r.ops, r.unmodelled, r.mfu, r.to_json()
    busy_split(spans, ceilings, (start_ns, end_ns))   # for the classifier

Time of an op: on a GPU, its kernels (each kernel's launch, found through `correlation`, lies
inside the op that launched it); on the CPU (a trace with no kernels), its self time (its own
time without its child ops). The time of an op without a cost model that runs inside one with
a model (aten::_convolution inside aten::convolution, aten::resolve_conj inside aten::addmm)
is the modelled op's. An op whose work is costed in its children (aten::linear -> aten::addmm,
aten::matmul -> aten::mm) counts no FLOPs itself: its own time is dispatch, listed with the
unmodelled time as "costed in its children".

Bound: compute when the op's intensity (FLOPs / bytes) is at or above the ridge point of its
ceilings (peak FLOP/s for its dtype / memory bandwidth), else memory. GEMM, convolution and
attention are held to the matmul peak of their dtype; every other op to the fp32 peak (the
vector units). Roof fraction: achieved FLOP/s over min(peak, intensity x bandwidth); for ops
without FLOPs (copies, embeddings), achieved bytes/s over the bandwidth. An op whose GPU time
is mostly host<->device copies is bound by the "host link" (held to the measured pinned
host<->device bandwidth when there is one). Bytes are a lower
bound (each tensor read or written once), so intensity is an upper bound.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .opcost import OpCost, has_model, op_cost
from .thresholds import value

GPU_WORK = ("kernel", "memcpy", "memset")


@dataclass
class OpRow:
    name: str
    input_dims: Any
    input_types: Any
    calls: int = 0
    flops: int = 0                  # summed over calls
    bytes: int = 0
    time_ns: int = 0
    dtype: str | None = None
    family: str | None = None
    flops_per_call: float = 0.0
    bytes_per_call: float = 0.0
    achieved_flops_per_s: float | None = None
    achieved_bytes_per_s: float | None = None
    intensity: float | None = None  # FLOP per byte (an upper bound: bytes are a lower bound)
    ridge: float | None = None
    bound: str | None = None        # compute | memory | None (no ceiling for its dtype)
    roof_fraction: float | None = None
    peak_name: str | None = None    # which ceiling: "fp32 matmul peak", "bf16 matmul peak", ...
    link_time_ns: int = 0           # of time_ns, copies between host and device (PCIe/NVLink-C2C)

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("flops"), d.pop("bytes")
        return d


@dataclass
class Roofline:
    device: str                     # cpu, or the GPU's name
    basis: str                      # "gpu kernel time" | "cpu self time"
    ceilings: dict | None           # the ceilings document used (None: none known)
    ops: list[OpRow] = field(default_factory=list)
    unmodelled: dict = field(default_factory=dict)
    mfu: dict | None = None
    total_time_ns: int = 0
    modelled_share: float | None = None
    missing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    _atoms: tuple | None = field(default=None, repr=False)   # (op start ns, ns, row index or -1)

    def to_json(self) -> dict:
        c = self.ceilings or {}
        return {
            "device": self.device, "basis": self.basis,
            "ceilings": {k: c.get(k) for k in ("source", "device", "device_name", "host", "measured_at",
                                               "peaks", "bandwidth_bytes_per_s", "datasheet_entry",
                                               "reference") if k in c} if self.ceilings else None,
            "ops": [o.to_json() for o in self.ops],
            "unmodelled": self.unmodelled, "mfu": self.mfu, "total_time_ns": self.total_time_ns,
            "modelled_share": self.modelled_share, "missing": self.missing, "notes": self.notes,
        }


# ---- ceilings ----------------------------------------------------------------------------------

def peak_for(ceilings: dict | None, cost_dtype: str | None, matrix: bool) -> tuple[float | None, str | None]:
    """(FLOP/s, its name) of the ceiling an op is held to; (None, what is missing) without one."""
    if not ceilings:
        return None, None
    peaks = ceilings.get("peaks") or {}
    key = cost_dtype if matrix else "fp32"
    v = peaks.get(key)
    if not v:
        return None, f"no {key} {'matmul ' if matrix else ''}peak in the ceilings"
    return float(v), f"{key} {'matmul ' if matrix else ''}peak"


# ---- the spans --------------------------------------------------------------------------------

class _Ops:
    """The cpu_op spans of a table with their nesting, self time and launched GPU time."""

    def __init__(self, spans: pa.Table, scope: tuple[int, int] | None = None):
        cat = spans.column("category").cast(pa.string()) if spans.num_rows else pa.array([], pa.string())
        self.has_rank = "rank" in spans.column_names
        op_t = spans.filter(pc.equal(cat, "cpu_op"))
        self.n = op_t.num_rows
        self.name = op_t.column("name").to_pylist()
        self.attrs = op_t.column("attrs").to_pylist()
        self.start = _ns(op_t.column("start"))
        self.end = _ns(op_t.column("end"))
        pid = _filled(op_t.column("pid"))
        tid = _filled(op_t.column("tid"))
        rank = _filled(op_t.column("rank")) if self.has_rank else np.zeros(self.n, np.int64)
        self.rank = rank
        self.parent = np.full(self.n, -1, np.int64)
        self.child_ns = np.zeros(self.n, np.int64)
        self.gpu_ns = np.zeros(self.n, np.int64)

        # GPU work -> its launch (runtime span with the same correlation, same rank) -> the op
        gpu_t = spans.filter(pc.and_(pc.is_in(cat, pa.array(GPU_WORK)),
                                     pc.invert(pc.fill_null(pc.equal(
                                         spans.column("kernel_class").cast(pa.string()), "communication"), False))))
        rt_t = spans.filter(pc.equal(cat, "runtime"))
        self.gpu_total_ns = int(pc.sum(pc.subtract(gpu_t.column("end").cast(pa.int64()),
                                                   gpu_t.column("start").cast(pa.int64()))).as_py() or 0) \
            if gpu_t.num_rows else 0
        self.device_names: set[str] = set()
        launches: dict[tuple[int, int], int] = {}     # (rank, correlation) -> GPU ns
        links: dict[tuple[int, int], int] = {}        # the part of it copying host <-> device
        if gpu_t.num_rows:
            g_rank = _filled(gpu_t.column("rank")) if self.has_rank else np.zeros(gpu_t.num_rows, np.int64)
            g_corr = _filled(gpu_t.column("correlation"))
            g_start = _ns(gpu_t.column("start"))
            g_dur = _ns(gpu_t.column("end")) - g_start
            g_link = np.asarray(pc.fill_null(pc.or_(pc.match_substring(gpu_t.column("name"), "HtoD"),
                                                    pc.match_substring(gpu_t.column("name"), "DtoH")),
                                             False).to_numpy(zero_copy_only=False), bool)
            keep = g_corr >= 0
            if scope is not None:
                keep &= (g_start >= scope[0]) & (g_start < scope[1])
            for r, c, d, link in zip(g_rank[keep].tolist(), g_corr[keep].tolist(), g_dur[keep].tolist(),
                                     g_link[keep].tolist()):
                launches[(r, c)] = launches.get((r, c), 0) + d
                if link:
                    links[(r, c)] = links.get((r, c), 0) + d
        self.gpu_attributed_ns = 0
        rt_start = _ns(rt_t.column("start")) if rt_t.num_rows else np.zeros(0, np.int64)
        rt_corr = _filled(rt_t.column("correlation")) if rt_t.num_rows else np.zeros(0, np.int64)
        rt_rank = (_filled(rt_t.column("rank")) if self.has_rank else np.zeros(rt_t.num_rows, np.int64)) \
            if rt_t.num_rows else np.zeros(0, np.int64)
        rt_pid = _filled(rt_t.column("pid")) if rt_t.num_rows else np.zeros(0, np.int64)
        rt_tid = _filled(rt_t.column("tid")) if rt_t.num_rows else np.zeros(0, np.int64)
        rt_ns = np.array([launches.get((r, c), 0) for r, c in zip(rt_rank.tolist(), rt_corr.tolist())],
                         np.int64) if launches else np.zeros(len(rt_start), np.int64)
        rt_link = np.array([links.get((r, c), 0) for r, c in zip(rt_rank.tolist(), rt_corr.tolist())],
                           np.int64) if links else np.zeros(len(rt_start), np.int64)
        self.link_ns = np.zeros(self.n, np.int64)

        # one sweep per thread: ops sorted by (start, longest first) and launches by time
        groups: dict[tuple[int, int, int], list[tuple[int, int, int, int]]] = {}
        for i, key in enumerate(zip(rank.tolist(), pid.tolist(), tid.tolist())):
            groups.setdefault(key, []).append((int(self.start[i]), 0, -int(self.end[i]), i))
        for j in np.nonzero(rt_ns)[0].tolist():
            key = (int(rt_rank[j]), int(rt_pid[j]), int(rt_tid[j]))
            groups.setdefault(key, []).append((int(rt_start[j]), 1, 0, j))
        end = self.end
        for events in groups.values():
            events.sort()
            stack: list[int] = []
            for t, kind, _neg_end, i in events:
                while stack and end[stack[-1]] <= t:
                    stack.pop()
                if kind == 1:
                    if stack:
                        self.gpu_ns[stack[-1]] += rt_ns[i]
                        self.link_ns[stack[-1]] += rt_link[i]
                        self.gpu_attributed_ns += int(rt_ns[i])
                    continue
                if stack:
                    p = stack[-1]
                    self.parent[i] = p
                    self.child_ns[p] += end[i] - self.start[i]
                stack.append(i)
        self.self_ns = np.maximum(self.end - self.start - self.child_ns, 0)
        self.in_scope = np.ones(self.n, bool) if scope is None else \
            (self.start >= scope[0]) & (self.start < scope[1])


def _ns(col) -> np.ndarray:
    return np.asarray(col.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False), np.int64)


def _filled(col) -> np.ndarray:
    return np.asarray(col.cast(pa.int64()).fill_null(-1).to_numpy(zero_copy_only=False), np.int64)


def _parse_attrs(text: str | None) -> tuple[Any, Any, Any] | None:
    if not text:
        return None
    try:
        a = json.loads(text)
    except ValueError:
        return None
    if not isinstance(a, dict) or "input_dims" not in a:
        return None
    return a["input_dims"], a.get("input_types"), a.get("concrete_inputs")


# ---- the analysis -----------------------------------------------------------------------------

def roofline(spans: pa.Table, ceilings: dict | None, rank: int | None = None,
             scope: tuple[int, int] | None = None, device: str | None = None,
             datasheet: dict | None = None) -> Roofline:
    """Per-op roofline rows of the spans (one rank or all), against `ceilings` (one device's
    document; None: rows without bounds, and `missing` says to calibrate).
    datasheet: the vendor's figures for the device, for MFU against the datasheet too."""
    if rank is not None and "rank" in spans.column_names:
        spans = spans.filter(pc.equal(spans.column("rank"), rank))
    ops = _Ops(spans, scope)
    gpu = ops.gpu_total_ns > 0
    basis = "gpu kernel time" if gpu else "cpu self time"
    r = Roofline(device or ("gpu" if gpu else "cpu"), basis, ceilings)
    if ops.n == 0:
        r.missing.append("torch op spans (counterprof run --torch, or import a torch profiler trace)")
        return r
    if ceilings is None:
        r.missing.append("ceilings: run `counterprof calibrate` on this machine (or pass --ceilings FILE)")

    # the cost of each op (cached per distinct attrs text), then which ops carry the cost
    cost_cache: dict[tuple[str, str | None], tuple[OpCost | None, tuple | None]] = {}
    costs: list[OpCost | None] = [None] * ops.n
    shapes: list[tuple | None] = [None] * ops.n
    modelled = np.zeros(ops.n, bool)
    any_shapes = False
    for i, (name, attrs) in enumerate(zip(ops.name, ops.attrs)):
        if not has_model(name):
            continue
        key = (name, attrs)
        hit = cost_cache.get(key)
        if hit is None:
            parsed = _parse_attrs(attrs)
            hit = (op_cost(name, *parsed) if parsed else None, parsed)
            cost_cache[key] = hit
        costs[i], shapes[i] = hit
        any_shapes |= hit[1] is not None
        modelled[i] = hit[0] is not None
    if not any_shapes:
        r.missing.append("op shapes: record the trace with record_shapes=True "
                         "(counterprof run --torch records them)")
    # A modelled op is "covered" (a wrapper) when modelled ops below it account for at least
    # half its work (FLOPs; bytes for ops without FLOPs): aten::linear over aten::addmm is,
    # aten::convolution over its bias's aten::add_ is not.
    parent = ops.parent
    order = np.lexsort((-ops.end, ops.start))       # parents before children
    below = np.zeros((ops.n, 2), np.float64)        # (FLOPs, bytes) costed below each op
    covered = np.zeros(ops.n, bool)
    for i in order[::-1].tolist():
        c = costs[i]
        if modelled[i]:
            work, under = (c.flops, below[i, 0]) if c.flops else (c.bytes, below[i, 1])
            covered[i] = under > 0 and under >= 0.5 * work
            if not covered[i]:
                below[i] += (c.flops, c.bytes)
        p = parent[i]
        if p >= 0:
            below[p] += below[i]
    effective = modelled & ~covered
    owner = np.full(ops.n, -1, np.int64)            # the effective op an op's time belongs to
    for i in order.tolist():
        if effective[i]:
            owner[i] = i
        elif parent[i] >= 0 and owner[parent[i]] >= 0:
            owner[i] = owner[parent[i]]

    atom = ops.gpu_ns if gpu else ops.self_ns
    atom = np.where(ops.in_scope, atom, 0)
    time_of = np.zeros(ops.n, np.int64)
    link_of = np.zeros(ops.n, np.int64)
    unmod: dict[str, dict] = {}
    for i in np.nonzero(atom)[0].tolist():
        o = owner[i]
        if o >= 0:
            time_of[o] += atom[i]
            if gpu:
                link_of[o] += ops.link_ns[i]
            continue
        name = ops.name[i]
        why = ("costed in its children" if modelled[i] and covered[i]
               else "shapes not recorded or not usable" if has_model(name) else "no cost model")
        u = unmod.setdefault(name, {"name": name, "calls": 0, "time_ns": 0, "why": why})
        u["calls"] += 1
        u["time_ns"] += int(atom[i])
    rows: dict[tuple[str, str, str], OpRow] = {}
    for i in np.nonzero(effective & ops.in_scope)[0].tolist():
        dims, types, _ = shapes[i]
        key = (ops.name[i], json.dumps(dims), json.dumps(types))
        row = rows.get(key)
        if row is None:
            row = rows[key] = OpRow(ops.name[i], dims, types, dtype=costs[i].dtype, family=costs[i].family)
        row.calls += 1
        row.flops += costs[i].flops
        row.bytes += costs[i].bytes
        row.time_ns += int(time_of[i])
        row.link_time_ns += int(link_of[i])
    modelled_ns = sum(x.time_ns for x in rows.values())
    unmod_ns = sum(u["time_ns"] for u in unmod.values())
    if gpu:
        unlaunched = max(0, _scoped_gpu_ns(ops, scope) - ops.gpu_attributed_ns)
        if unlaunched:
            unmod["(no torch op)"] = {"name": "(no torch op)", "calls": None, "time_ns": unlaunched,
                                      "why": "GPU work whose launch lies in no recorded op"}
            unmod_ns += unlaunched
    total = modelled_ns + unmod_ns
    r.total_time_ns = total
    r.modelled_share = modelled_ns / total if total else None
    bw = _bandwidth(ceilings)
    missing_peaks: set[str] = set()
    for row in rows.values():
        _finish_row(row, ceilings, bw, missing_peaks)
    r.ops = sorted((x for x in rows.values() if x.time_ns > 0), key=lambda x: -x.time_ns)
    # each op's time with its start and the row it went to (-1: unmodelled), for busy_split
    # over windows without computing it all again
    row_index = {id(x): j for j, x in enumerate(r.ops)}
    key_of = {}
    for i in np.nonzero(effective)[0].tolist():
        dims, types, _ = shapes[i]
        key_of[i] = row_index.get(id(rows[(ops.name[i], json.dumps(dims), json.dumps(types))]), -1)
    nz = np.nonzero(atom)[0]
    r._atoms = (ops.start[nz], atom[nz].astype(np.int64),
                np.array([key_of.get(int(owner[i]), -1) if owner[i] >= 0 else -1 for i in nz.tolist()], np.int64))
    for u in unmod.values():
        u["share"] = u["time_ns"] / total if total else None
    r.unmodelled = {"time_ns": unmod_ns, "share": unmod_ns / total if total else None,
                    "ops": sorted(unmod.values(), key=lambda u: -u["time_ns"])}
    if ceilings is not None and bw is None:
        r.missing.append("memory bandwidth in the ceilings")
    r.missing.extend(sorted(missing_peaks))
    r.mfu = _mfu(spans, ops, effective, costs, atom, ceilings, datasheet, gpu, scope)
    return r


def _scoped_gpu_ns(ops: _Ops, scope) -> int:
    return ops.gpu_total_ns if scope is None else ops.gpu_attributed_ns


def _bandwidth(ceilings: dict | None) -> float | None:
    if not ceilings:
        return None
    v = ceilings.get("bandwidth_bytes_per_s")
    return float(v) if v else None


def _finish_row(row: OpRow, ceilings: dict | None, bw: float | None, missing: set[str]) -> None:
    row.flops_per_call = row.flops / row.calls
    row.bytes_per_call = row.bytes / row.calls
    if row.time_ns > 0:
        s = row.time_ns / 1e9
        row.achieved_flops_per_s = row.flops / s
        row.achieved_bytes_per_s = row.bytes / s
    if row.bytes > 0:
        row.intensity = row.flops / row.bytes
    if row.time_ns and row.link_time_ns * 2 > row.time_ns:
        # a copy between host and device: the link, not the device's memory, sets its pace;
        # its traffic is the source's bytes (half of read + written)
        row.bound = "host link"
        link = _link_bandwidth(ceilings)
        if link and row.achieved_bytes_per_s is not None:
            row.roof_fraction = row.achieved_bytes_per_s / 2 / link
            row.peak_name = "host<->device pinned bandwidth"
        return
    matrix = row.family in ("gemm", "conv", "attention")
    peak, peak_name = peak_for(ceilings, row.dtype, matrix)
    if ceilings is None:
        return
    if peak is None:
        if peak_name:
            missing.add(f"{peak_name} (ops of that dtype have no bound): measure it with "
                        f"`counterprof calibrate` or give it in --ceilings")
        if row.flops == 0 and bw and row.achieved_bytes_per_s is not None:
            row.bound, row.roof_fraction = "memory", row.achieved_bytes_per_s / bw
        return
    row.peak_name = peak_name
    if bw is None:
        return
    row.ridge = peak / bw
    if row.flops == 0 or row.intensity is None:
        row.bound = "memory"
        if row.achieved_bytes_per_s is not None:
            row.roof_fraction = row.achieved_bytes_per_s / bw
        return
    row.bound = "compute" if row.intensity >= row.ridge else "memory"
    roof = min(peak, row.intensity * bw)
    if row.achieved_flops_per_s is not None:
        row.roof_fraction = row.achieved_flops_per_s / roof


def _link_bandwidth(ceilings: dict | None) -> float | None:
    hd = (ceilings or {}).get("host_device") or {}
    rates = [v.get("bytes_per_s") for k, v in hd.items() if k.endswith("_pinned") and isinstance(v, dict)]
    rates = [r for r in rates if r]
    return max(rates) if rates else None


def _mfu(spans: pa.Table, ops: _Ops, effective, costs, atom, ceilings, datasheet, gpu: bool,
         scope) -> dict | None:
    """Per step: the step's op FLOPs / step time / peak of the dominant dtype (matrix ops'
    FLOPs decide it), against the measured and the datasheet peak. Ops counted: those with
    time on the device (on a GPU, ops that launched kernels)."""
    idx = np.nonzero(effective & ops.in_scope & (atom > 0))[0]
    if not len(idx):
        return None
    by_dtype: dict[str, int] = {}
    for i in idx.tolist():
        c = costs[i]
        if c.matrix and c.dtype:
            by_dtype[c.dtype] = by_dtype.get(c.dtype, 0) + c.flops
    dtype = max(by_dtype, key=by_dtype.get) if by_dtype else "fp32"
    measured = (ceilings or {}).get("peaks", {}).get(dtype) if ceilings and ceilings.get("source") != "datasheet" else None
    sheet = (datasheet or {}).get("peaks", {}).get(dtype) or \
        ((ceilings or {}).get("datasheet") or {}).get("peaks", {}).get(dtype) or \
        ((ceilings or {}).get("peaks", {}).get(dtype) if ceilings and ceilings.get("source") == "datasheet" else None)
    if ceilings and ceilings.get("source") == "file":
        measured = ceilings.get("peaks", {}).get(dtype)
    cat = spans.column("category").cast(pa.string())
    steps = spans.filter(pc.equal(cat, "step"))
    flops = np.array([costs[i].flops for i in idx.tolist()], np.float64)
    start, rank = ops.start[idx], ops.rank[idx]
    windows: list[tuple[str, int, int, int]] = []     # (label, rank, start, end)
    # every step is timed, only those inside a trace window have their ops: MFU of the others
    # is unknown, not 0
    traced = spans.filter(pc.equal(cat, "window"))
    t_lo, t_hi = _ns(traced.column("start")), _ns(traced.column("end"))
    if steps.num_rows and traced.num_rows:
        s_lo, s_hi = _ns(steps.column("start")), _ns(steps.column("end"))
        # a step counts when most of it was recorded (the driver's step may start a little
        # before the window the profiler opened at that step's mark)
        overlap = np.clip(np.minimum(s_hi[:, None], t_hi[None, :]) - np.maximum(s_lo[:, None], t_lo[None, :]),
                          0, None).sum(axis=1)
        inside = overlap >= 0.5 * np.maximum(s_hi - s_lo, 1)
        steps = steps.filter(pa.array(inside))
    if steps.num_rows:
        s_rank = _filled(steps.column("rank")) if "rank" in steps.column_names else np.zeros(steps.num_rows, np.int64)
        for name, r, a, b in zip(steps.column("name").to_pylist(), s_rank.tolist(),
                                 _ns(steps.column("start")).tolist(), _ns(steps.column("end")).tolist()):
            if scope is None or (a >= scope[0] and a < scope[1]):
                windows.append((name, r, a, b))
    if not windows:
        windows = [("(whole trace)", -1, int(ops.start.min()), int(ops.end.max()))]
    per_step = []
    for label, r, a, b in windows:
        sel = (start >= a) & (start < b) & ((rank == r) if r >= 0 else True)
        f = float(flops[sel].sum())
        secs = (b - a) / 1e9
        if secs <= 0:
            continue
        rate = f / secs
        per_step.append({"step": label, "rank": None if r < 0 else r, "time_s": secs, "flops": f,
                         "flops_per_s": rate,
                         "mfu_measured": rate / measured if measured else None,
                         "mfu_datasheet": rate / sheet if sheet else None})
    if not per_step:
        return None
    med = lambda k: statistics.median([p[k] for p in per_step]) if all(p[k] is not None for p in per_step) else None  # noqa: E731
    return {"dtype": dtype, "peak_measured_flops_per_s": measured, "peak_datasheet_flops_per_s": sheet,
            "steps": per_step, "flops_per_s": med("flops_per_s"),
            "mfu_measured": med("mfu_measured"), "mfu_datasheet": med("mfu_datasheet"),
            "counted": "ops with time on the device" + (" (GPU kernels)" if gpu else "")}


# ---- for the classifier -----------------------------------------------------------------------

def busy_split(spans: pa.Table | Roofline, ceilings: dict | None,
               scope: tuple[int, int] | None = None) -> tuple[float | None, list[dict], list[str]]:
    """Share of the ops' busy time that is compute-bound (the rest memory-bound), by the
    time-weighted bound of the ops that started in scope. Pass a Roofline of the whole run to
    split many windows cheaply (each window cuts its ops' time out of it; the bounds stay the
    whole run's per op+shape); (None, evidence, missing) when it
    cannot say (no ceilings, no shapes, or ops with a cost model below the
    roofline_modelled threshold of the time). Evidence: dicts with the fields of
    classify.Evidence (metric, value, threshold, source, text), the top ops first."""
    r = spans if isinstance(spans, Roofline) else roofline(spans, ceilings, scope=scope)
    evidence: list[dict] = []
    if r.missing and (r.ceilings is None or not r.ops):
        return None, evidence, list(r.missing)
    # time per row in scope: a Roofline of the whole run is cut by its ops' start times
    in_scope = {id(o): o.time_ns for o in r.ops}
    total = r.total_time_ns
    if scope is not None and isinstance(spans, Roofline) and r._atoms is not None:
        start, ns, row = r._atoms
        sel = (start >= scope[0]) & (start < scope[1])
        total = int(ns[sel].sum())
        per_row = np.bincount(row[sel & (row >= 0)], weights=ns[sel & (row >= 0)], minlength=len(r.ops))
        in_scope = {id(o): int(per_row[j]) for j, o in enumerate(r.ops)}
    decided = [o for o in r.ops if o.bound in ("compute", "memory") and in_scope[id(o)] > 0]
    if not total or not decided:
        return None, evidence, list(r.missing) or ["ops with a cost model and a ceiling for their dtype"]
    t = lambda o: in_scope[id(o)]          # noqa: E731
    decided_ns = sum(t(o) for o in decided)
    share = decided_ns / total
    src = f"roofline ({(r.ceilings or {}).get('source', '?')} ceilings)"
    compute_ns = sum(t(o) for o in decided if o.bound == "compute")
    split = compute_ns / decided_ns
    evidence.append({"metric": "roofline_compute", "value": round(split, 6), "threshold": None,
                     "source": src,
                     "text": f"ops with a roofline: {100 * share:.0f}% of busy op time, "
                             f"{100 * split:.0f}% of it compute-bound"})
    for o in sorted(decided, key=lambda o: -t(o))[:3]:
        frac = f", at {100 * o.roof_fraction:.0f}% of the {'measured' if (r.ceilings or {}).get('source') == 'measured' else (r.ceilings or {}).get('source', '')} " \
               f"{o.peak_name if o.bound == 'compute' else 'memory bandwidth'}" if o.roof_fraction is not None else ""
        ridge = f", ridge {o.ridge:.0f}" if o.ridge is not None else ""
        inten = f"intensity {o.intensity:.1f} FLOP/B" if o.intensity is not None else "no FLOPs"
        evidence.append({"metric": "roofline_op", "value": round(t(o) / total, 6), "threshold": None,
                         "source": src,
                         "text": f"{o.name} {100 * t(o) / total:.0f}% of busy time, {o.bound}-bound "
                                 f"({inten}{ridge}){frac}"})
    if share < value("roofline_modelled"):
        return None, evidence, [f"cost models for more of the ops: only {100 * share:.0f}% of op time has "
                                f"a roofline (needs {100 * value('roofline_modelled'):.0f}%)"]
    return split, evidence, []


# ---- for compare and history ------------------------------------------------------------------

# the MFU as compare and history keep it: one value per traced step, per rank, in percent
MFU_SERIES = (("roofline.mfu", "mfu_measured", "percent"),
              ("roofline.mfu_datasheet", "mfu_datasheet", "percent"),
              ("roofline.flops_per_s", "flops_per_s", "FLOP/s"))


def mfu_series(r: Roofline, default_rank: int = 0) -> tuple[dict[str, dict[int, np.ndarray]], dict[str, str]]:
    """({series: {rank: per-step values}}, {series: unit}) of a Roofline's MFU: against the
    measured peak, the datasheet's, and the achieved FLOP/s. A series whose peak is unknown is
    left out (not 0). Steps without a rank (a trace without step marks) go to default_rank."""
    steps = (r.mfu or {}).get("steps") or []
    values: dict[str, dict[int, np.ndarray]] = {}
    units: dict[str, str] = {}
    for name, field_, unit in MFU_SERIES:
        by_rank: dict[int, list[float]] = {}
        scale = 100.0 if unit == "percent" else 1.0
        for s in steps:
            v = s.get(field_)
            if v is not None:
                by_rank.setdefault(default_rank if s.get("rank") is None else int(s["rank"]), []).append(scale * v)
        if by_rank:
            values[name] = {k: np.asarray(v, np.float64) for k, v in by_rank.items()}
            units[name] = unit
    return values, units
