"""The roofline of a run's torch ops: per op and unique shape, achieved FLOP/s and bytes/s
against the machine's ceilings, the bound, the fraction of the roof, and MFU per step.

    r = roofline(spans, ceilings)              # spans: a spans table (pyarrow), or a run's RunQuery
                                               # (read in slices: memory flat in the run's size)
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

import bisect
import json
import statistics
from array import array
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any
from collections.abc import Iterable

import numpy as np
import pyarrow as pa

from .opcost import OpCost, has_model, op_cost
from .thresholds import value

if TYPE_CHECKING:
    from ..store.op_rows import OpRows
    from ..store.query import RunQuery


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

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("flops"), d.pop("bytes")
        return d


@dataclass
class Roofline:
    device: str                     # cpu, or the GPU's name
    basis: str                      # "gpu kernel time" | "cpu self time"
    ceilings: dict[str, Any] | None           # the ceilings document used (None: none known)
    ops: list[OpRow] = field(default_factory=list)
    unmodelled: dict[str, Any] = field(default_factory=dict)
    mfu: dict[str, Any] | None = None
    total_time_ns: int = 0
    modelled_share: float | None = None
    missing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # (op start ns, ns, row index or -1)
    _atoms: tuple[np.ndarray, np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    def to_json(self) -> dict[str, Any]:
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

def peak_for(ceilings: dict[str, Any] | None, cost_dtype: str | None, matrix: bool) -> tuple[float | None, str | None]:
    """(FLOP/s, its name) of the ceiling an op is held to; (None, what is missing) without one."""
    if not ceilings:
        return None, None
    peaks = ceilings.get("peaks") or {}
    key = cost_dtype if matrix else "fp32"
    v = peaks.get(key)
    if not v:
        return None, f"no {key} {'matmul ' if matrix else ''}peak in the ceilings"
    return float(v), f"{key} {'matmul ' if matrix else ''}peak"


# ---- the walk over the ops ----------------------------------------------------------------------

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


class _Key:
    """One distinct (op name, attrs text): its cost, and the row it aggregates into."""
    __slots__ = ("name", "cost", "shapes", "row_key", "why")

    def __init__(self, name: str, attrs: str | None):
        self.name = name
        self.cost: OpCost | None = None
        self.shapes: tuple[Any, Any, Any] | None = None
        self.row_key: tuple[str, str, str] | None = None
        if has_model(name):
            self.shapes = _parse_attrs(attrs)
            if self.shapes is not None:
                self.cost = op_cost(name, *self.shapes)
            if self.cost is not None and self.shapes is not None:      # (a cost needs shapes)
                dims, types, _ = self.shapes
                self.row_key = (name, json.dumps(dims), json.dumps(types))
        # why its time is unmodelled when nothing modelled above it takes it (covered: set at close)
        self.why = "shapes not recorded or not usable" if has_model(name) else "no cost model"


class _Steps:
    """The windows MFU is counted over (a step, or the whole trace) and the FLOPs of the ops
    that started in each: per rank, steps sorted by start; an op's step found by bisection."""

    def __init__(self, windows: list[tuple[str, int, int, int]]):
        self.windows = windows
        self.flops = [0.0] * len(windows)
        self.by_rank: dict[int, tuple[list[int], list[int], int]] = {}
        for r in {w[1] for w in windows}:
            idx = sorted((j for j, w in enumerate(windows) if w[1] == r), key=lambda j: windows[j][2])
            longest = max(windows[j][3] - windows[j][2] for j in idx)
            self.by_rank[r] = ([windows[j][2] for j in idx], idx, longest)

    def add(self, rank: int, start: int, flops: float) -> None:
        for r in ((rank, -1) if rank != -1 else (-1,)):     # a step without a rank holds every rank's ops
            hit = self.by_rank.get(r)
            if hit is None:
                continue
            starts, idx, longest = hit
            k = bisect.bisect_right(starts, start) - 1
            while k >= 0 and starts[k] > start - longest - 1:
                j = idx[k]
                if start < self.windows[j][3]:
                    self.flops[j] += flops
                k -= 1


class _Walk:
    """One pass over the ops of each thread in time order (store/op_rows.OpRows.events): a
    stack of open ops nests them; an op is closed when the next event starts at or after its
    end, and its own time, its children's costs and the unowned time below it are settled then
    (children close before their parent). State: the open ops of one thread, the rows (one per
    op name + shapes) and the unmodelled names: nothing grows with the number of ops, except
    the atoms kept for busy_split over windows (8 bytes x 3 per op with time, keep_atoms)."""

    def __init__(self, keys: dict[int, _Key], gpu: bool, scope: tuple[int, int] | None, steps: _Steps | None,
                 keep_atoms: bool):
        self.keys, self.gpu, self.scope, self.steps = keys, gpu, scope, steps
        self.rows: dict[tuple[str, str, str], OpRow] = {}
        self.unmod: dict[str, dict[str, Any]] = {}
        self.gpu_attributed_ns = 0
        self.first_start: int | None = None
        self.last_end: int | None = None
        self.dtype_flops: dict[str, int] = {}
        self.mfu_ops = 0
        self.total_flops = 0
        self.keep_atoms = keep_atoms
        self.atoms = (array("q"), array("q"), array("q"))    # (start, ns, row id: index into row_ids)
        self.row_ids: list[tuple[str, str, str]] = []
        self._row_id: dict[tuple[str, str, str], int] = {}

    def run(self, batches: Iterable[pa.RecordBatch]) -> None:
        stacks: dict[tuple[Any, Any, Any], list[list[Any]]] = {}     # per thread: its open ops (slices of time follow
        stack: list[list[Any]] = []                   # one another: a thread's ops carry over)
        thread = None
        for b in batches:
            cols = [b.column(i).to_pylist() for i in range(9)]
            for rank, pid, tid, s, kind, e, kid, ns, link in zip(*cols):
                if (rank, pid, tid) != thread:
                    thread = (rank, pid, tid)
                    stack = stacks.setdefault(thread, [])
                while stack and stack[-1][0] <= s:
                    self._close(stack)
                if kind == 1:
                    if stack:
                        top = stack[-1]
                        top[4] += ns
                        top[5] += link
                        self.gpu_attributed_ns += ns
                    continue
                if self.first_start is None or s < self.first_start:
                    self.first_start = s
                if self.last_end is None or e > self.last_end:
                    self.last_end = e
                if stack:
                    stack[-1][3] += e - s                     # the parent's child time
                # end, start, kid, child ns, gpu ns, link ns, FLOPs below, bytes below,
                # unowned time below {(name, why): [calls, ns]}, its ns, its link ns, its atoms, rank
                stack.append([e, s, kid, 0, 0, 0, 0, 0, None, 0, 0, None, rank])
        for stack in stacks.values():
            while stack:
                self._close(stack)

    def _close(self, stack: list[list[Any]]) -> None:
        f = stack.pop()
        e, s, kid, child, gpu_ns, link_ns, below_f, below_b, pending, pend_ns, pend_link, pend_atoms, rank = f
        k = self.keys[kid]
        c = k.cost
        covered = False
        if c is not None:
            work, under = (c.flops, below_f) if c.flops else (c.bytes, below_b)
            covered = under > 0 and under >= 0.5 * work
            if not covered:
                below_f += c.flops
                below_b += c.bytes
        parent = stack[-1] if stack else None
        if parent is not None:
            parent[6] += below_f
            parent[7] += below_b
        in_scope = self.scope is None or (self.scope[0] <= s < self.scope[1])
        atom = (gpu_ns if self.gpu else max(e - s - child, 0)) if in_scope else 0
        link = link_ns if self.gpu else 0
        if c is not None and not covered:                  # effective: it owns the time below it
            assert k.row_key is not None and k.shapes is not None      # set with k.cost
            if in_scope:
                row = self.rows.get(k.row_key)
                if row is None:
                    row = self.rows[k.row_key] = OpRow(k.name, k.shapes[0], k.shapes[1], dtype=c.dtype,
                                                       family=c.family)
                row.calls += 1
                row.flops += c.flops
                row.bytes += c.bytes
                row.time_ns += atom + pend_ns
                row.link_time_ns += (link if atom else 0) + pend_link
                if atom > 0:
                    self._mfu_op(rank, s, c)
            if self.keep_atoms:
                rid = self._rid(k.row_key)
                if atom:
                    self._atom(s, atom, rid)
                for a_s, a_ns in pend_atoms or ():
                    self._atom(a_s, a_ns, rid)
            return
        if atom:
            why = "costed in its children" if covered else k.why
            pending = pending if pending is not None else {}
            p = pending.get((k.name, why))
            if p is None:
                pending[(k.name, why)] = [1, atom]
            else:
                p[0] += 1
                p[1] += atom
            pend_ns += atom
            pend_link += link
            if self.keep_atoms:
                pend_atoms = (pend_atoms or []) + [(s, atom)]
        if not pending and not pend_atoms:
            return
        if parent is None:                                  # no modelled op above: unmodelled
            for (name, why), (calls, ns) in (pending or {}).items():
                u = self.unmod.setdefault(name, {"name": name, "calls": 0, "time_ns": 0, "why": why})
                u["calls"] += calls
                u["time_ns"] += ns
            for a_s, a_ns in pend_atoms or ():
                self._atom(a_s, a_ns, -1)
            return
        if pending:
            mine = parent[8]
            if mine is None:
                parent[8] = pending
            else:
                for key, (calls, ns) in pending.items():
                    p = mine.get(key)
                    if p is None:
                        mine[key] = [calls, ns]
                    else:
                        p[0] += calls
                        p[1] += ns
        parent[9] += pend_ns
        parent[10] += pend_link
        if pend_atoms:
            parent[11] = pend_atoms if parent[11] is None else parent[11] + pend_atoms

    def _mfu_op(self, rank: int, start: int, c: OpCost) -> None:
        self.mfu_ops += 1
        self.total_flops += c.flops
        if c.matrix and c.dtype:
            self.dtype_flops[c.dtype] = self.dtype_flops.get(c.dtype, 0) + c.flops
        if self.steps is not None:
            self.steps.add(rank, start, c.flops)

    def _rid(self, row_key: tuple[str, str, str]) -> int:
        rid = self._row_id.get(row_key)
        if rid is None:
            rid = self._row_id[row_key] = len(self.row_ids)
            self.row_ids.append(row_key)
        return rid

    def _atom(self, s: int, ns: int, rid: int) -> None:
        self.atoms[0].append(s)
        self.atoms[1].append(ns)
        self.atoms[2].append(rid)


# ---- the analysis -----------------------------------------------------------------------------

def roofline(spans: pa.Table | RunQuery | OpRows, ceilings: dict[str, Any] | None, rank: int | None = None,
             scope: tuple[int, int] | None = None, device: str | None = None,
             datasheet: dict[str, Any] | None = None, keep_atoms: bool = True) -> Roofline:
    """Per-op roofline rows of the spans (one rank or all), against `ceilings` (one device's
    document; None: rows without bounds, and `missing` says to calibrate).
    spans: a spans table (pyarrow) or a store.query.RunQuery (read in batches, memory flat in
    the run's size). datasheet: the vendor's figures for the device, for MFU against the
    datasheet too. keep_atoms: keep each op's time and start for busy_split over windows."""
    from ..store.op_rows import OpRows
    if isinstance(spans, OpRows):
        return _roofline(spans, ceilings, scope, device, datasheet, keep_atoms)
    src = OpRows.of(spans, rank)
    try:
        return _roofline(src, ceilings, scope, device, datasheet, keep_atoms)
    finally:
        src.close()


def _roofline(src: OpRows, ceilings: dict[str, Any] | None, scope: tuple[int, int] | None, device: str | None,
              datasheet: dict[str, Any] | None, keep_atoms: bool) -> Roofline:
    n_ops, gpu_total_ns = src.counts()
    gpu = gpu_total_ns > 0
    basis = "gpu kernel time" if gpu else "cpu self time"
    r = Roofline(device or ("gpu" if gpu else "cpu"), basis, ceilings)
    if n_ops == 0:
        r.missing.append("torch op spans (counterprof run --torch, or import a torch profiler trace)")
        return r
    if ceilings is None:
        r.missing.append("ceilings: run `counterprof calibrate` on this machine (or pass --ceilings FILE)")
    shapes = src.shapes()
    keys = {h: _Key(n, a) for n, a, h in zip(shapes.column("name").to_pylist(), shapes.column("attrs").to_pylist(),
                                            shapes.column("key").to_pylist())}
    if len(keys) != shapes.num_rows:
        raise ValueError("two distinct op shapes with one hash: cannot tell their ops apart")
    if not any(k.shapes is not None for k in keys.values()):
        r.missing.append("op shapes: record the trace with record_shapes=True "
                         "(counterprof run --torch records them)")
    windows = _mfu_windows(src.marks(), scope)
    walk = _Walk(keys, gpu, scope, _Steps(windows) if windows else None, keep_atoms)
    walk.run(src.events(scope))

    unmod = walk.unmod
    modelled_ns = sum(x.time_ns for x in walk.rows.values())
    unmod_ns = sum(u["time_ns"] for u in unmod.values())
    if gpu:
        unlaunched = max(0, (gpu_total_ns if scope is None else walk.gpu_attributed_ns) - walk.gpu_attributed_ns)
        if unlaunched:
            unmod["(no torch op)"] = {"name": "(no torch op)", "calls": None, "time_ns": unlaunched,
                                      "why": "GPU work whose launch lies in no recorded op"}
            unmod_ns += unlaunched
    total = modelled_ns + unmod_ns
    r.total_time_ns = total
    r.modelled_share = modelled_ns / total if total else None
    bw = _bandwidth(ceilings)
    missing_peaks: set[str] = set()
    for row in walk.rows.values():
        _finish_row(row, ceilings, bw, missing_peaks)
    r.ops = sorted((x for x in walk.rows.values() if x.time_ns > 0),
                   key=lambda x: (-x.time_ns, x.name, json.dumps(x.input_dims), json.dumps(x.input_types)))
    if keep_atoms:
        # each op's time with its start and the row it went to (-1: unmodelled), for busy_split
        # over windows without computing it all again
        index = {(o.name, json.dumps(o.input_dims), json.dumps(o.input_types)): j for j, o in enumerate(r.ops)}
        to_row = np.array([index.get(k, -1) for k in walk.row_ids] + [-1], np.int64)
        rid = np.frombuffer(walk.atoms[2], np.int64) if len(walk.atoms[2]) else np.zeros(0, np.int64)
        r._atoms = (np.frombuffer(walk.atoms[0], np.int64).copy() if len(walk.atoms[0]) else np.zeros(0, np.int64),
                    np.frombuffer(walk.atoms[1], np.int64).copy() if len(walk.atoms[1]) else np.zeros(0, np.int64),
                    to_row[rid])
    for u in unmod.values():
        u["share"] = u["time_ns"] / total if total else None
    r.unmodelled = {"time_ns": unmod_ns, "share": unmod_ns / total if total else None,
                    "ops": sorted(unmod.values(), key=lambda u: -u["time_ns"])}
    if ceilings is not None and bw is None:
        r.missing.append("memory bandwidth in the ceilings")
    r.missing.extend(sorted(missing_peaks))
    r.mfu = _mfu(walk, windows, ceilings, datasheet, gpu)
    return r


def _mfu_windows(marks: pa.Table, scope: tuple[int, int] | None) -> list[tuple[str, int, int, int]]:
    """(label, rank, start, end) of the steps MFU is counted over: every step is timed, only
    those inside a trace window have their ops (MFU of the others is unknown, not 0)."""
    cat = marks.column("category").to_pylist()
    rows = marks.to_pylist()
    steps = [x for x, c in zip(rows, cat) if c == "step"]
    traced = [x for x, c in zip(rows, cat) if c == "window"]
    if steps and traced:
        s_lo = np.array([x["s"] for x in steps], np.int64)
        s_hi = np.array([x["e"] for x in steps], np.int64)
        t_lo = np.array([x["s"] for x in traced], np.int64)
        t_hi = np.array([x["e"] for x in traced], np.int64)
        # a step counts when most of it was recorded (the driver's step may start a little
        # before the window the profiler opened at that step's mark)
        overlap = np.clip(np.minimum(s_hi[:, None], t_hi[None, :]) - np.maximum(s_lo[:, None], t_lo[None, :]),
                          0, None).sum(axis=1)
        inside = overlap >= 0.5 * np.maximum(s_hi - s_lo, 1)
        steps = [x for x, keep in zip(steps, inside.tolist()) if keep]
    return [(x["name"], int(x["rank"]), int(x["s"]), int(x["e"])) for x in steps
            if scope is None or scope[0] <= x["s"] < scope[1]]


def _bandwidth(ceilings: dict[str, Any] | None) -> float | None:
    if not ceilings:
        return None
    v = ceilings.get("bandwidth_bytes_per_s")
    return float(v) if v else None


def _finish_row(row: OpRow, ceilings: dict[str, Any] | None, bw: float | None, missing: set[str]) -> None:
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


def _link_bandwidth(ceilings: dict[str, Any] | None) -> float | None:
    hd: dict[str, Any] = (ceilings or {}).get("host_device") or {}
    rates: list[Any] = [v.get("bytes_per_s") for k, v in hd.items() if k.endswith("_pinned") and isinstance(v, dict)]
    rates = [r for r in rates if r]
    return max(rates) if rates else None


def _mfu(walk: _Walk, windows: list[tuple[str, int, int, int]], ceilings: dict[str, Any] | None,
         datasheet: dict[str, Any] | None, gpu: bool) -> dict[str, Any] | None:
    """Per step: the step's op FLOPs / step time / peak of the dominant dtype (matrix ops'
    FLOPs decide it), against the measured and the datasheet peak. Ops counted: those with
    time on the device (on a GPU, ops that launched kernels)."""
    if not walk.mfu_ops:
        return None
    by_dtype = walk.dtype_flops
    dtype = max(by_dtype, key=by_dtype.__getitem__) if by_dtype else "fp32"
    measured = ((ceilings or {}).get("peaks", {}).get(dtype)
                if ceilings and ceilings.get("source") != "datasheet" else None)
    sheet = (datasheet or {}).get("peaks", {}).get(dtype) or \
        ((ceilings or {}).get("datasheet") or {}).get("peaks", {}).get(dtype) or \
        ((ceilings or {}).get("peaks", {}).get(dtype) if ceilings and ceilings.get("source") == "datasheet" else None)
    if ceilings and ceilings.get("source") == "file":
        measured = ceilings.get("peaks", {}).get(dtype)
    if windows and walk.steps is not None:       # (the walk has steps when there are windows)
        counted = list(zip(windows, walk.steps.flops))
    else:
        assert walk.first_start is not None and walk.last_end is not None      # mfu_ops: ops were walked
        counted = [(("(whole trace)", -1, walk.first_start, walk.last_end), walk.total_flops)]
    per_step: list[dict[str, Any]] = []
    for (label, r, a, b), f in counted:
        secs = (b - a) / 1e9
        if secs <= 0:
            continue
        rate = f / secs
        per_step.append({"step": label, "rank": None if r < 0 else r, "time_s": secs, "flops": float(f),
                         "flops_per_s": rate,
                         "mfu_measured": rate / measured if measured else None,
                         "mfu_datasheet": rate / sheet if sheet else None})
    if not per_step:
        return None

    def med(k: str) -> Any:
        return statistics.median([p[k] for p in per_step]) if all(p[k] is not None for p in per_step) else None
    return {"dtype": dtype, "peak_measured_flops_per_s": measured, "peak_datasheet_flops_per_s": sheet,
            "steps": per_step, "flops_per_s": med("flops_per_s"),
            "mfu_measured": med("mfu_measured"), "mfu_datasheet": med("mfu_datasheet"),
            "counted": "ops with time on the device" + (" (GPU kernels)" if gpu else "")}


# ---- for the classifier -----------------------------------------------------------------------

def busy_split(spans: pa.Table | Roofline, ceilings: dict[str, Any] | None,
               scope: tuple[int, int] | list[tuple[int, int]] | None = None
               ) -> tuple[float | None, list[dict[str, Any]], list[str]]:
    """Share of the ops' busy time that is compute-bound (the rest memory-bound), by the
    time-weighted bound of the ops that started in scope (one interval, or a merged interval set:
    a region's occurrences, so a region is judged by the ops inside it, not by those between
    its first and last occurrence). Pass a Roofline of the whole run to
    split many windows cheaply (each window cuts its ops' time out of it; the bounds stay the
    whole run's per op+shape); (None, evidence, missing) when it
    cannot say (no ceilings, no shapes, or ops with a cost model below the
    roofline_modelled threshold of the time). Evidence: dicts with the fields of
    classify.Evidence (metric, value, threshold, source, text), the top ops first."""
    ivs = [scope] if isinstance(scope, tuple) else scope
    span = (ivs[0][0], ivs[-1][1]) if ivs else None
    r = spans if isinstance(spans, Roofline) else roofline(spans, ceilings, scope=span)
    evidence: list[dict[str, Any]] = []
    if r.missing and (r.ceilings is None or not r.ops):
        return None, evidence, list(r.missing)
    # time per row in scope: a Roofline of the whole run is cut by its ops' start times
    in_scope = {id(o): o.time_ns for o in r.ops}
    total = r.total_time_ns
    if ivs is not None and (isinstance(spans, Roofline) or len(ivs) > 1) and r._atoms is not None:
        start, ns, row = r._atoms
        sel = _started_in(start, ivs)
        total = int(ns[sel].sum())
        per_row = np.bincount(row[sel & (row >= 0)], weights=ns[sel & (row >= 0)], minlength=len(r.ops))
        in_scope = {id(o): int(per_row[j]) for j, o in enumerate(r.ops)}
    decided = [o for o in r.ops if o.bound in ("compute", "memory") and in_scope[id(o)] > 0]
    if not total or not decided:
        return None, evidence, list(r.missing) or ["ops with a cost model and a ceiling for their dtype"]

    def t(o: OpRow) -> int:
        return in_scope[id(o)]
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
        source = (r.ceilings or {}).get("source", "")
        frac = f", at {100 * o.roof_fraction:.0f}% of the {'measured' if source == 'measured' else source} " \
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


def _started_in(start: np.ndarray, ivs: list[tuple[int, int]]) -> np.ndarray:
    """Which of the start times fall inside one of the (sorted, disjoint) intervals."""
    lo = np.asarray([a for a, _ in ivs], np.int64)
    hi = np.asarray([b for _, b in ivs], np.int64)
    i = np.searchsorted(lo, start, side="right") - 1
    return (i >= 0) & (start < hi[np.clip(i, 0, None)])


def scope_facts(r: Roofline | None, scope: list[tuple[int, int]]) -> dict[str, Any]:
    """The classifier's roofline fact for a scope (intervals): busy_split over the ops that
    started inside its intervals; {} without a roofline. What report, compare and history pass
    classify, so that their verdicts are decided alike."""
    if r is None or not scope:
        return {}
    return {"roofline": busy_split(r, None, scope)}


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
