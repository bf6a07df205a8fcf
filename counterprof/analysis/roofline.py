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

Fit: no figure may pass its roof unremarked. An op holding roofline_over_roof_share of the op
time or more, a step (CPU runs: a GPU step's FLOPs follow its launches, not its kernels) or the
MFU above roofline_over_roof of its ceiling means the ceilings do not fit this run (measured on
a loaded machine or another one, a dtype or cache level they do not have): `over_roof` names
each such figure, a note says where the ceilings came from (when, on how loaded a machine),
and busy_split does not split busy time by them.
"""
from __future__ import annotations

import bisect
import json
import math
import statistics
from array import array
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any
from collections.abc import Iterable

import numpy as np
import pyarrow as pa

from ..ground.opcost import OpCost, has_model, op_cost
from ..ground.thresholds import value

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
    # the figures above their ceiling (fit_check): {"what": op | step | mfu, "name", "fraction",
    # "ceiling", "text", ...}; empty: the ceilings fit (or there are none)
    over_roof: list[dict[str, Any]] = field(default_factory=list)
    origin: str | None = None       # where the ceilings came from (roofline_run.choose_ceilings)
    # keep_calls: per (rank, index into ops) [calls, ns, CallTimes] (what `correlate` reads)
    calls: dict[tuple[int, int], list[Any]] = field(default_factory=dict, repr=False)
    # (op start ns, ns, row index or -1)
    _atoms: tuple[np.ndarray, np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    @property
    def ceilings_fit(self) -> bool | None:
        """False when a figure passed its ceiling (over_roof); None without ceilings."""
        if not self.ceilings:
            return None
        return not self.over_roof

    def to_json(self) -> dict[str, Any]:
        c = self.ceilings or {}
        keys = ("source", "device", "device_name", "host", "measured_at", "quick", "peaks",
                "bandwidth_bytes_per_s", "datasheet_entry", "reference")
        ceil: dict[str, Any] | None = {k: c.get(k) for k in keys if k in c} if self.ceilings else None
        if ceil is not None:
            ceil["load"] = load_facts(c.get("load"))
            ceil["origin"] = self.origin
        return {
            "device": self.device, "basis": self.basis, "ceilings": ceil,
            "ceilings_fit": None if self.ceilings_fit is None else {
                "fits": self.ceilings_fit, "threshold": value("roofline_over_roof"),
                "min_op_share": value("roofline_over_roof_share"), "over_roof": self.over_roof},
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


class CallTimes:
    """The times of an op's calls as counts in bins 1% wide (log scale): quantiles to within 1%,
    memory in the number of distinct bins (a few hundred at most), not of calls; two merge
    exactly (what `correlate` reads, per rank and over ranks)."""
    __slots__ = ("bins",)
    STEP = math.log(1.01)

    def __init__(self) -> None:
        self.bins: dict[int, int] = {}

    def add(self, ns: float, count: int = 1) -> None:
        b = round(math.log(max(ns, 1.0)) / self.STEP)
        self.bins[b] = self.bins.get(b, 0) + count

    def merge(self, other: CallTimes) -> None:
        for b, n in other.bins.items():
            self.bins[b] = self.bins.get(b, 0) + n

    @property
    def count(self) -> int:
        return sum(self.bins.values())

    def quantile(self, q: float) -> float | None:
        """The q-quantile in ns (the bin's centre), None without calls."""
        n = self.count
        if not n:
            return None
        rank, seen = q * (n - 1), 0
        for b in sorted(self.bins):
            seen += self.bins[b]
            if seen > rank:
                return math.exp(b * self.STEP)
        return math.exp(max(self.bins) * self.STEP)


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
                 keep_atoms: bool, keep_calls: bool = False):
        self.keys, self.gpu, self.scope, self.steps = keys, gpu, scope, steps
        # per (rank, row): [calls, ns, CallTimes] (keep_calls: what `correlate` reads)
        self.calls: dict[tuple[int, tuple[str, str, str]], list[Any]] | None = {} if keep_calls else None
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
                if self.calls is not None and atom + pend_ns > 0:
                    per = self.calls.get((rank, k.row_key))
                    if per is None:
                        per = self.calls[(rank, k.row_key)] = [0, 0, CallTimes()]
                    per[0] += 1
                    per[1] += atom + pend_ns
                    per[2].add(atom + pend_ns)
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
             datasheet: dict[str, Any] | None = None, keep_atoms: bool = True,
             origin: str | None = None, keep_calls: bool = False) -> Roofline:
    """Per-op roofline rows of the spans (one rank or all), against `ceilings` (one device's
    document; None: rows without bounds, and `missing` says to calibrate).
    spans: a spans table (pyarrow) or a store.query.RunQuery (read in batches, memory flat in
    the run's size). datasheet: the vendor's figures for the device, for MFU against the
    datasheet too. keep_atoms: keep each op's time and start for busy_split over windows.
    keep_calls: keep each row's call times per rank (Roofline.calls, for `correlate`).
    origin: where the ceilings came from (a note, and the words of the fit check's)."""
    from ..store.op_rows import OpRows
    if isinstance(spans, OpRows):
        return _roofline(spans, ceilings, scope, device, datasheet, keep_atoms, origin, keep_calls)
    src = OpRows.of(spans, rank)
    try:
        return _roofline(src, ceilings, scope, device, datasheet, keep_atoms, origin, keep_calls)
    finally:
        src.close()


def _roofline(src: OpRows, ceilings: dict[str, Any] | None, scope: tuple[int, int] | None, device: str | None,
              datasheet: dict[str, Any] | None, keep_atoms: bool, origin: str | None = None,
              keep_calls: bool = False) -> Roofline:
    n_ops, gpu_total_ns = src.counts()
    gpu = gpu_total_ns > 0
    basis = "gpu kernel time" if gpu else "cpu self time"
    r = Roofline(device or ("gpu" if gpu else "cpu"), basis, ceilings, origin=origin)
    if origin:
        r.notes.append(origin)
    if n_ops == 0:
        if _xla_ops(src) and _xla_costed(src):
            return _xla_roofline(src, r, ceilings, scope, datasheet, keep_atoms, keep_calls)
        if _xla_ops(src):
            r.missing.append("FLOPs and bytes of the XLA ops: a JAX run's ops on the CPU carry none, and "
                             "XLA's cost analysis of the profile's HLO is not read into the roofline yet "
                             "(`counterprof report` classes the XLA ops by their HLO category instead)")
        else:
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
    walk = _Walk(keys, gpu, scope, _Steps(windows) if windows else None, keep_atoms, keep_calls)
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
    if walk.calls is not None:
        at = {(o.name, json.dumps(o.input_dims), json.dumps(o.input_types)): j for j, o in enumerate(r.ops)}
        r.calls = {(rank, at[k]): v for (rank, k), v in walk.calls.items() if k in at}
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
    r.over_roof = fit_check(r, gpu)
    if r.over_roof:
        r.notes.append(misfit_note(r))
    return r


def _xla_ops(src: OpRows) -> bool:
    """Whether the spans hold XLA ops (a JAX run: analysis/xla.py)."""
    try:
        return bool(src.con.execute(f"SELECT count(*) FROM {src.view} WHERE category = 'xla_op'").fetchall()[0][0])
    except Exception:         # the roofline's words only: never its failure
        return False


def _xla_costed(src: OpRows) -> bool:
    """Whether the XLA ops carry FLOPs and bytes (XLA's cost analysis at conversion)."""
    try:
        return bool(src.con.execute(f"""SELECT count(*) FROM {src.view} WHERE category = 'xla_op'
                                         AND attrs LIKE '%"bytes_accessed":%'""").fetchall()[0][0])
    except Exception:
        return False


_XLA_FAMILY = {"dot": "gemm", "convolution": "conv"}


def _xla_roofline(src: OpRows, r: Roofline, ceilings: dict[str, Any] | None, scope: tuple[int, int] | None,
                  datasheet: dict[str, Any] | None, keep_atoms: bool, keep_calls: bool = False) -> Roofline:
    """The roofline of a JAX run's XLA ops (xla_op spans whose attrs carry XLA's cost analysis:
    flops, bytes_accessed, dtype; collectors/jax_trace/convert.py). One row per HLO op of a
    module (name: the op; input_dims: "module(program id)"; input_types: its HLO category).
    A fusion's bytes are XLA's "bytes accessed" of the fusion as one op: what it reads and
    writes in memory, its insides' intermediates not counted (already fused traffic). Time: each
    op's own time on its thread (less the XLA ops nested in it). A dot or convolution (fusion)
    is held to the matmul peak of its result's dtype, every other op to the fp32 peak."""
    r.basis = "xla op time"
    if ceilings is None:
        r.missing.append("ceilings: run `counterprof calibrate` on this machine (or pass --ceilings FILE)")
    windows = _mfu_windows(src.marks(), scope)
    where = "" if scope is None else f" AND s >= {int(scope[0])} AND s < {int(scope[1])}"
    cur = src.con.execute(f"""SELECT coalesce(rank, -1) AS rank, coalesce(pid, -1) AS pid, coalesce(tid, -1) AS tid,
                                     s, e, name, attrs FROM {src.view} WHERE category = 'xla_op'{where}
                              ORDER BY 1, 2, 3, s, e DESC""")
    steps = _Steps(windows) if windows else None
    rows: dict[tuple[str, str, str], OpRow] = {}
    unmod: dict[str, dict[str, Any]] = {}
    costs: dict[str | None, tuple[float, float, str | None, tuple[str, str, str]] | None] = {}
    atoms: tuple[list[int], list[int], list[tuple[str, str, str] | None]] = ([], [], [])
    calls: dict[tuple[int, tuple[str, str, str]], list[Any]] = {}
    dtype_flops: dict[str, float] = {}
    total_flops, n_mfu = 0.0, 0
    first: int | None = None
    last: int | None = None

    def cost_of(name: str, attrs: str | None) -> tuple[float, float, str | None, tuple[str, str, str]] | None:
        try:
            a = json.loads(attrs) if attrs else {}
        except ValueError:
            a = {}
        if not isinstance(a, dict) or a.get("flops") is None or a.get("bytes_accessed") is None:
            return None
        cat = str(a.get("category") or a.get("opcode") or "")
        return (float(a["flops"]), float(a["bytes_accessed"]), a.get("dtype") or "fp32",
                (str(a.get("hlo_op") or name), f"{a.get('hlo_module')}({a.get('program_id')})", cat))

    def close(f: list[Any]) -> None:
        nonlocal total_flops, n_mfu
        rank, s, e, name, attrs, child = f
        own = max(e - s - child, 0)
        key = attrs if attrs is None else attrs.split(',"run_id"', 1)[0]
        if key not in costs:
            costs[key] = cost_of(name, attrs)
        c = costs[key]
        if c is None:
            u = unmod.setdefault(name, {"name": name, "calls": 0, "time_ns": 0,
                                        "why": "no cost from XLA's cost analysis"})
            u["calls"] += 1
            u["time_ns"] += own
            if keep_atoms and own:
                atoms[0].append(s)
                atoms[1].append(own)
                atoms[2].append(None)
            return
        flops, nbytes, dtype, rk = c
        row = rows.get(rk)
        if row is None:
            family = next((fam for h, fam in _XLA_FAMILY.items() if rk[2].startswith(h)), "xla")
            row = rows[rk] = OpRow(rk[0], rk[1], rk[2], dtype=dtype, family=family)
        row.calls += 1
        row.flops += int(flops)
        row.bytes += int(nbytes)
        row.time_ns += own
        if keep_calls and own > 0:
            per = calls.get((rank, rk))
            if per is None:
                per = calls[(rank, rk)] = [0, 0, CallTimes()]
            per[0] += 1
            per[1] += own
            per[2].add(own)
        if own > 0:
            n_mfu += 1
            total_flops += flops
            if row.family in ("gemm", "conv") and dtype:
                dtype_flops[dtype] = dtype_flops.get(dtype, 0.0) + flops
            if steps is not None:
                steps.add(rank, s, flops)
            if keep_atoms:
                atoms[0].append(s)
                atoms[1].append(own)
                atoms[2].append(rk)

    thread = None
    stack: list[list[Any]] = []
    for b in iter(lambda: cur.fetchmany(65536), []):
        for rank, pid, tid, s, e, name, attrs in b:
            if (rank, pid, tid) != thread:
                while stack:
                    close(stack.pop())
                thread = (rank, pid, tid)
            while stack and stack[-1][2] <= s:
                close(stack.pop())
            if stack:
                stack[-1][5] += min(e, stack[-1][2]) - s
            first = s if first is None or s < first else first
            last = e if last is None or e > last else last
            stack.append([rank, s, e, name, attrs, 0])
    while stack:
        close(stack.pop())

    modelled_ns = sum(x.time_ns for x in rows.values())
    unmod_ns = sum(u["time_ns"] for u in unmod.values())
    total = modelled_ns + unmod_ns
    r.total_time_ns = total
    r.modelled_share = modelled_ns / total if total else None
    bw = _bandwidth(ceilings)
    missing_peaks: set[str] = set()
    for row in rows.values():
        if row.calls:
            _finish_row(row, ceilings, bw, missing_peaks)
    r.ops = sorted((x for x in rows.values() if x.time_ns > 0), key=lambda x: (-x.time_ns, x.name, x.input_dims))
    if keep_calls:
        at = {(o.name, o.input_dims, o.input_types): j for j, o in enumerate(r.ops)}
        r.calls = {(rank, at[k]): v for (rank, k), v in calls.items() if k in at}
    if keep_atoms:
        index = {(o.name, o.input_dims, o.input_types): j for j, o in enumerate(r.ops)}
        r._atoms = (np.array(atoms[0], np.int64), np.array(atoms[1], np.int64),
                    np.array([index.get(k, -1) if k is not None else -1 for k in atoms[2]], np.int64))
    for u in unmod.values():
        u["share"] = u["time_ns"] / total if total else None
    r.unmodelled = {"time_ns": unmod_ns, "share": unmod_ns / total if total else None,
                    "ops": sorted(unmod.values(), key=lambda u: -u["time_ns"])}
    if ceilings is not None and bw is None:
        r.missing.append("memory bandwidth in the ceilings")
    r.missing.extend(sorted(missing_peaks))
    r.notes.append("XLA ops: FLOPs and bytes from XLA's cost analysis of each op (a fusion's bytes are "
                   "what the fused op reads and writes, its internal intermediates not counted); "
                   "time: each op's own time on its thread")
    if n_mfu:
        walk = _Walk({}, False, scope, steps, False)
        walk.mfu_ops, walk.total_flops = n_mfu, int(total_flops)
        walk.dtype_flops = {k: int(v) for k, v in dtype_flops.items()}
        walk.first_start, walk.last_end = first, last
        r.mfu = _mfu(walk, windows, ceilings, datasheet, False)
        if r.mfu is not None:
            r.mfu["counted"] = "XLA ops (FLOPs from XLA's cost analysis) that started in the step"
    r.over_roof = fit_check(r, False)
    if r.over_roof:
        r.notes.append(misfit_note(r))
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


# ---- do the ceilings fit the run? -----------------------------------------------------------

MISFIT = "the ceilings do not fit this run"     # how the note begins (renderers show it in front)


def load_facts(load: Any) -> dict[str, Any] | None:
    """The load record of a calibration without its per-step detail (for JSON next to a run)."""
    if not isinstance(load, dict):
        return None
    return {k: load.get(k) for k in ("cpus", "others_share", "others_cpus", "steal_share", "worst",
                                     "loadavg_before", "loadavg_after", "loaded", "threshold",
                                     "saved_anyway") if k in load}


def ceilings_words(c: dict[str, Any] | None) -> str:
    """Where a ceilings document came from, when, on how loaded a machine: the words of the
    fit note and of `roofline`'s ceilings line."""
    from ..calibrate.load import words
    if not c:
        return "none"
    source = c.get("source")
    if source == "datasheet":
        return f"the datasheet's figures for {c.get('datasheet_entry') or c.get('device')}"
    when = c.get("measured_at")
    text = "from a file" if source == "file" else "measured"
    if when:
        text += (" " if source != "file" else ", measured ") + str(when)
        if c.get("host"):
            text += f" on {c['host']}"
        if c.get("quick"):
            text += " (`calibrate --quick`)"
        text += ", " + words(c.get("load") if isinstance(c.get("load"), dict) else None)
        if isinstance(c.get("load"), dict) and c["load"].get("saved_anyway"):
            text += " (saved with --force)"
    elif source == "file":
        text += " (when, where and on how loaded a machine they were measured is not in it)"
    return text


def _sourced(c: dict[str, Any] | None) -> str:
    source = str((c or {}).get("source"))
    return {"measured": "measured", "datasheet": "datasheet's", "file": "given"}.get(source, "")


def _dims(dims: Any, width: int = 40) -> str:
    if not isinstance(dims, list):
        return ""
    text = ", ".join("x".join(map(str, d)) for d in dims
                     if isinstance(d, list) and d and all(isinstance(v, int) for v in d))
    return text if len(text) <= width else text[: width - 1] + "…"


def fit_check(r: Roofline, gpu: bool) -> list[dict[str, Any]]:
    """The figures of a Roofline above roofline_over_roof of their ceiling: ops with
    roofline_over_roof_share of the op time or more, the MFU (median of the steps, against the
    measured and the datasheet peak) and, on the CPU, the steps (the fastest named). Ops in the
    order of r.ops (the longest first), then the MFU and the steps."""
    from ..ground import units
    if not r.ceilings:
        return []
    limit, min_share = value("roofline_over_roof"), value("roofline_over_roof_share")
    c = r.ceilings
    src = _sourced(c)
    out: list[dict[str, Any]] = []
    total = r.total_time_ns
    for o in r.ops:                                    # (the longest first)
        if o.roof_fraction is None or o.roof_fraction <= limit:
            continue
        op_share = o.time_ns / total if total else 0.0
        if op_share < min_share:
            continue
        if o.bound == "host link":
            ceiling = "host<->device pinned bandwidth"
            figure = (o.achieved_bytes_per_s or 0) / 2
            unit = "B/s"
        elif o.bound == "compute":
            ceiling = o.peak_name or "peak"
            figure, unit = o.achieved_flops_per_s or 0, "FLOP/s"
        else:
            ceiling = "memory bandwidth"
            figure, unit = o.achieved_bytes_per_s or 0, "B/s"
        dims = _dims(o.input_dims)
        text = (f"{o.name}{f' ({dims})' if dims else ''} ran at {units.share(o.roof_fraction)} of the "
                f"{src} {ceiling} ({units.si(figure, unit)}, {units.share(op_share)} of op time)")
        hint = None
        llc = ((c.get("memory") or {}).get("llc_bytes") if isinstance(c.get("memory"), dict) else None)
        if o.bound == "memory" and llc and 0 < o.bytes_per_call <= llc:
            text += f", {units.si(o.bytes_per_call, 'B')} per call"
            hint = (f"an op whose data fit in the {units.si(llc, 'B')} last-level cache may run from it, "
                    "faster than the memory bandwidth (DRAM's) the ceilings hold")
        if gpu and o.bound == "compute" and o.dtype == "fp32" and o.family in ("conv", "gemm"):
            hint = ("fp32 matrix ops may run on TF32 tensor cores (cuDNN convolutions by default, matmuls "
                    "under torch.set_float32_matmul_precision('high')), which the fp32 peak does not cover")
        out.append({"what": "op", "name": o.name, "input_dims": o.input_dims, "dtype": o.dtype,
                    "fraction": o.roof_fraction, "share": op_share, "ceiling": f"{src} {ceiling}".strip(),
                    "text": text, "hint": hint})
    m = r.mfu or {}
    steps = m.get("steps") or []
    for key, peak_key, which in (("mfu_measured", "peak_measured_flops_per_s", src or "measured"),
                                 ("mfu_datasheet", "peak_datasheet_flops_per_s", "datasheet's")):
        v = m.get(key)
        if v is not None and v > limit:
            out.append({"what": "mfu", "name": key, "fraction": v,
                        "ceiling": f"{which} {m.get('dtype')} peak",
                        "text": f"MFU {units.share(v)} of the {which} {m.get('dtype')} peak "
                                f"({units.si(m.get(peak_key), 'FLOP/s')}; median of {len(steps)} step(s))"})
        if gpu:
            continue     # a GPU step's FLOPs are those of the ops it launched, not of the kernels it ran
        over = [s for s in steps if s.get(key) is not None and s[key] > limit]
        if over and not (v is not None and v > limit and len(over) == len(steps)):
            worst = max(over, key=lambda s: s[key])
            rank = f" (rank {worst['rank']})" if worst.get("rank") is not None else ""
            out.append({"what": "step", "name": str(worst.get("step")), "rank": worst.get("rank"),
                        "fraction": worst[key], "ceiling": f"{which} {m.get('dtype')} peak",
                        "steps_over": len(over), "steps": len(steps),
                        "text": f"{len(over)} of {len(steps)} step(s) above {units.share(limit)} of the "
                                f"{which} {m.get('dtype')} peak, step {worst.get('step')}{rank} at "
                                f"{units.share(worst[key])}"})
    return out


def misfit_note(r: Roofline) -> str:
    """The note of a Roofline whose figures pass their ceilings: which, where the ceilings came
    from (when, how loaded), that no verdict rests on them, and what to do."""
    items = [x["text"] for x in r.over_roof]
    shown = "; ".join(items[:3]) + (f"; {len(items) - 3} more" if len(items) > 3 else "")
    hints = list(dict.fromkeys(x["hint"] for x in r.over_roof[:3] if x.get("hint")))
    if hints:
        shown += " (" + "; ".join(hints) + ")"
    c = r.ceilings or {}
    where = ceilings_words(c)
    # where the run found them, when it is not already said (the datasheet, a file)
    origin = f"; {r.origin.removeprefix('ceilings ')}" if r.origin and c.get("source") == "measured" else ""
    if c.get("source") == "datasheet":
        todo = ("measure this machine (`counterprof calibrate`) and hold the run to that "
                "(`counterprof roofline RUN --ceilings FILE`)")
    else:
        todo = ("calibrate on a quiet machine (`counterprof calibrate`: the next runs copy it) and hold "
                "this run to that (`counterprof roofline RUN --ceilings FILE`, a `calibrate --json` output)")
    return (f"{MISFIT}: {shown}. The ceilings: {where}{origin}. A figure above its ceiling means "
            f"they are lower than what this machine did here (or the op's cost is counted too high): "
            f"no verdict rests on them; {todo}.")


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
    if r.over_roof:           # the ceilings do not fit the run: no split rests on them
        worst = r.over_roof[0]
        src = f"roofline ({(r.ceilings or {}).get('source', '?')} ceilings)"
        items = "; ".join(x["text"] for x in r.over_roof[:2])
        evidence.append({"metric": "roofline_over_roof", "value": round(worst["fraction"], 6),
                         "threshold": value("roofline_over_roof"), "source": src,
                         "text": f"{MISFIT} ({ceilings_words(r.ceilings)}): {items}; the roofline's "
                                 "compute/memory split is left out"})
        return None, evidence, [f"ceilings that fit this run ({worst['text']}): calibrate on a quiet "
                                "machine (`counterprof calibrate`), then `counterprof roofline RUN "
                                "--ceilings FILE`"]
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
        if o.roof_fraction is not None and o.roof_fraction > 1:
            frac += (f" (above it, within the {100 * value('roofline_over_roof') - 100:.0f}% a "
                     "calibration's spread allows)" if o.roof_fraction <= value("roofline_over_roof") else
                     f" (above it: an op under {100 * value('roofline_over_roof_share'):.0f}% of the op "
                     "time, too short to judge the ceilings by)")
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
