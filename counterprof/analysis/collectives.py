"""Every collective call, matched across ranks: who arrived when, who waited, the transfer
itself and its bus bandwidth against this machine's measured curve. Pure: spans in (with their
rank), dataclasses out; `counterprof collectives` prints them.

Which spans are the calls: per rank, the device's communication kernels where there are any
(NCCL: the transfer on the GPU), else gloo's own spans (`gloo:all_reduce`, on its threads),
else the recorded calls (`record_param_comms`, `c10d::*`).

Matching: a call of one rank is the same call on another when it is the k-th call of the same
operation in the same process group within the same step (steps matched by name, as
across_ranks does), or, without steps, the k-th over the whole run. Never by position across
steps: a rank whose trace window missed a step would pair every later call with its neighbour.
Calls some rank of their group lacks (its window ended, its trace was dropped) are counted and
named per operation, not matched.

Per call (nccl-tests' and TraceLens's definitions): each rank's arrival (the call's start on
it), skew (the last arrival less the first), transfer (the shortest rank's duration: the rank
that arrived last waited least, so its time is the collective itself), each rank's wait (its
duration less the transfer), algbw = bytes / transfer and busbw = algbw x factor(op, n):
all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n, all_to_all (n-1)/n, broadcast and
reduce 1. Bytes as nccl-tests counts them: the buffer per rank for all_reduce, broadcast and
reduce; the gathered (whole) buffer for all_gather; the input (whole) for reduce_scatter.
With one rank of a group in the run (one imported trace), its duration is the transfer's upper
bound and skew unknown.
"""
from __future__ import annotations

import functools
import json
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# the spelling of each operation in torch's traces (record_param_comms' "Collective name",
# gloo's span names, c10d's op names, NCCL's kernel names) -> nccl-tests' names
OPS = {
    "allreduce": "all_reduce", "all_reduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "allgather": "all_gather", "all_gather": "all_gather", "_allgather_base": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather", "all_gather_into_tensor": "all_gather",
    "allgather_coalesced": "all_gather",
    "reducescatter": "reduce_scatter", "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "broadcast": "broadcast", "reduce": "reduce",
    "alltoall": "all_to_all", "all_to_all": "all_to_all", "alltoall_base": "all_to_all",
    "all_to_allv": "all_to_all", "alltoallv": "all_to_all",
    "sendrecv": "send_recv", "send": "send", "recv": "recv", "barrier": "barrier",
    "gather": "gather", "scatter": "scatter", "collective_permute": "collective_permute",
}
NOT_CALLS = {"wait", "coalesced", ""}       # record_param_comms rows that mark, not move

BUSBW_FACTOR: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}

DEFINITIONS = {
    "start_ns": "the first arrival, in ns since the epoch (the run's clock)",
    "arrival": "the call's start on each rank (aligned to the lowest rank's clock across hosts)",
    "skew_us": "the last rank's arrival less the first's",
    "transfer_us": "the shortest rank's duration: the last to arrive waited least",
    "wait_us": "a rank's duration less the transfer: its wait for the others",
    "busbw_gbps": "bytes / transfer x nccl-tests' bus factor, in GB/s (1e9 bytes)",
    "fraction_of_curve": "busbw over this machine's measured busbw at the call's size (calibrate)",
    "exposed_us": "the call's time on a rank not overlapped by its own ops (mean over ranks)",
    "imbalance": "all_to_all: the largest rank's bytes over the ranks' mean (1 is balanced)",
    "latency_floor": "a call whose transfer is within 2x the measured latency (the 8-byte call) and "
                     "whose size is below the curve's knee (half its best busbw): its size does not "
                     "matter, its count does (fuse or bucket)",
}


def normalize_op(name: str | None) -> str | None:
    """nccl-tests' name of a collective as any of torch's traces spell it; None: not a call."""
    if not name:
        return None
    key = name.lower().strip()
    for prefix in ("gloo:", "c10d::", "nccl:", "ncclkernel_", "ncclDevKernel_".lower()):
        if key.startswith(prefix):
            key = key[len(prefix):]
    key = key.rstrip("_").split("(")[0].replace("-", "_")     # XLA's opcodes: all-reduce
    if key in NOT_CALLS:
        return None
    if key in OPS:
        return OPS[key]
    for spelled, op in OPS.items():        # NCCL kernels: AllReduce_RING_LL_Sum_float...
        if key.replace("_", "").startswith(spelled.replace("_", "")):
            return op
    return key


def nccl_tests_bytes(op: str, in_bytes: float | None, out_bytes: float | None, n: int) -> float | None:
    """The size nccl-tests reports for a call (see the module's docstring)."""
    if op == "all_gather":
        if out_bytes:
            return out_bytes
        return in_bytes * n if in_bytes else None
    return in_bytes if in_bytes else out_bytes


@dataclass
class Curve:
    """Latency and busbw per message size for one operation (calibrate's sweep)."""
    op: str
    backend: str
    sizes: list[int]
    busbw: list[float]                # bytes per second, per size
    latency_s: float | None = None

    def knee(self) -> float:
        """The size at which the curve first reaches half its best busbw (in log-size between
        the measured sizes around it)."""
        half = max(self.busbw) / 2
        pts = list(zip(self.sizes, self.busbw))
        for (s0, b0), (s1, b1) in zip(pts, pts[1:]):
            if b1 >= half > b0:
                t = (half - b0) / (b1 - b0)
                return float(2 ** (math.log2(max(s0, 1)) + t * (math.log2(s1) - math.log2(max(s0, 1)))))
        return float(pts[0][0])

    def at(self, size: float) -> float | None:
        """busbw at `size`, interpolated in log-size between measured sizes; beyond the ends,
        the nearest measured size's."""
        if not self.sizes:
            return None
        xs = np.log2(np.maximum(np.asarray(self.sizes, float), 1.0))
        return float(np.interp(math.log2(max(size, 1.0)), xs, np.asarray(self.busbw, float)))


def curves_from_ceilings(doc: dict[str, Any] | None) -> dict[str, Curve]:
    """{op: Curve} from a calibrate document's `collectives` ({backend: {op: {sizes...}}}):
    NCCL's where the document has it (a GPU's), else gloo's."""
    out: dict[str, Curve] = {}
    block = doc.get("collectives") if isinstance(doc, dict) else None
    if not isinstance(block, dict):
        return out
    for backend in sorted(block, key=lambda b: b != "nccl"):
        per_op = block[backend]
        if not isinstance(per_op, dict):
            continue
        for op, figures in per_op.items():
            if op in out or not isinstance(figures, dict) or not isinstance(figures.get("sizes"), dict):
                continue
            pts = sorted((int(s), float(r["busbw_bytes_per_s"])) for s, r in figures["sizes"].items()
                         if isinstance(r, dict) and r.get("busbw_bytes_per_s"))
            if pts:
                lat = figures.get("latency_s")
                out[op] = Curve(op, backend, [p[0] for p in pts], [p[1] for p in pts],
                                float(lat) if isinstance(lat, (int, float)) else None)
    return out


@dataclass
class Call:
    """One call on every rank seen making it: per-rank figures as arrays aligned with `ranks`
    (a few KiB a call at 64 ranks, so a run of many calls stays small)."""
    op: str
    group: str                        # the process group ("0", "default_pg"...) or its size
    index: int                        # k-th call of this op in this group within its step
    step: str | None
    ranks: tuple[int, ...]            # the ranks seen making it, ascending
    group_size: int | None
    bytes: float | None               # as nccl-tests counts them
    dtype: str | None
    arrival: np.ndarray               # ns, per rank (aligned with ranks)
    duration: np.ndarray              # ns, per rank
    exposed: np.ndarray | None = None           # ns, per rank: not hidden behind its own work
    own_bytes: np.ndarray | None = None         # each rank's own input (all_to_all's split)
    curve: Curve | None = None

    @property
    def arrival_ns(self) -> dict[int, int]:
        return dict(zip(self.ranks, self.arrival.tolist()))

    @property
    def duration_ns(self) -> dict[int, int]:
        return dict(zip(self.ranks, self.duration.tolist()))

    @property
    def exposed_ns(self) -> dict[int, int]:
        return {} if self.exposed is None else dict(zip(self.ranks, self.exposed.tolist()))

    @property
    def bytes_by_rank(self) -> dict[int, float]:
        if self.own_bytes is None:
            return {}
        return {r: float(b) for r, b in zip(self.ranks, self.own_bytes.tolist()) if b > 0}

    @property
    def imbalance(self) -> float | None:
        """all_to_all: the largest rank's bytes over the mean (1: balanced); None elsewhere."""
        b = self.own_bytes
        if self.op != "all_to_all" or b is None or len(b) < 2 or not bool(np.all(b > 0)):
            return None
        return float(b.max() / b.mean())

    @property
    def n(self) -> int:
        return self.group_size or len(self.ranks)

    @property
    def complete(self) -> bool:
        return len(self.ranks) >= self.n > 1

    @property
    def start_ns(self) -> int:
        return int(self.arrival.min())

    @property
    def transfer_ns(self) -> int:
        return int(self.duration.min())

    @property
    def skew_ns(self) -> int | None:
        if len(self.ranks) < 2:
            return None
        return int(self.arrival.max() - self.arrival.min())

    @property
    def last(self) -> int | None:
        if len(self.ranks) < 2:
            return None
        return self.ranks[int(np.argmax(self.arrival))]

    def wait_ns(self, rank: int) -> int:
        return int(self.duration[self.ranks.index(rank)]) - self.transfer_ns

    @property
    def waits(self) -> np.ndarray:
        """ns, per rank: its duration less the transfer."""
        w: np.ndarray = self.duration - self.duration.min()
        return w

    @property
    def busbw(self) -> float | None:
        factor = BUSBW_FACTOR.get(self.op)
        if not self.bytes or factor is None or self.transfer_ns <= 0 or self.n < 1:
            return None
        return self.bytes / (self.transfer_ns / 1e9) * factor(max(self.n, 2))

    @property
    def fraction_of_curve(self) -> float | None:
        if self.curve is None or self.busbw is None or not self.bytes:
            return None
        ref = self.curve.at(self.bytes)
        return self.busbw / ref if ref else None

    @property
    def under_latency_floor(self) -> bool:
        """Too small to use the link: within twice the measured 8-byte time, and smaller than
        the size at which the curve reaches half its best busbw."""
        cv = self.curve
        if cv is None or cv.latency_s is None or not self.bytes:
            return False
        return self.transfer_ns / 1e9 <= 2 * cv.latency_s and self.bytes < cv.knee()

    def to_json(self) -> dict[str, Any]:
        skew, busbw, frac, start = self.skew_ns, self.busbw, self.fraction_of_curve, self.start_ns
        names = _names(self.ranks)
        return {
            "op": self.op, "group": self.group, "step": self.step, "index": self.index,
            "start_ns": start,
            "ranks": list(self.ranks), "group_size": self.n, "complete": self.complete,
            "bytes": None if self.bytes is None else int(self.bytes), "dtype": self.dtype,
            "arrival_us": dict(zip(names, np.round((self.arrival - start) / 1e3, 3).tolist())),
            "skew_us": None if skew is None else round(skew / 1e3, 3),
            "last_rank": self.last,
            "transfer_us": round(self.transfer_ns / 1e3, 3),
            "wait_us": dict(zip(names, np.round(self.waits / 1e3, 3).tolist())),
            "exposed_us": None if self.exposed is None else round(float(self.exposed.mean()) / 1e3, 3),
            "busbw_gbps": None if busbw is None else round(busbw / 1e9, 6),
            "fraction_of_curve": None if frac is None else round(frac, 4),
            "under_latency_floor": self.under_latency_floor,
            **({"bytes_by_rank": {str(r): int(b) for r, b in sorted(self.bytes_by_rank.items())},
                "imbalance": round(imb, 4)} if (imb := self.imbalance) is not None else {}),
        }


@functools.lru_cache(maxsize=16)
def _names(ranks: tuple[int, ...]) -> list[str]:
    """The ranks as JSON's keys: one list for the calls of one set of ranks (not read-only: do
    not change it)."""
    return [str(r) for r in ranks]


def size_bucket(b: float | None) -> str:
    """Powers of two, as nccl-tests' sweep: '1 MiB' holds [1 MiB, 2 MiB)."""
    if not b:
        return "0 B"
    p = int(math.floor(math.log2(b)))
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if p >= shift:
            return f"{1 << (p - shift)} {unit}"
    return f"{1 << p} B"


@dataclass
class OpSummary:
    op: str
    size: str
    group: str
    calls: int
    time_s: float                     # the calls' time summed over the ranks
    exposed_s: float | None
    median_skew_us: float | None
    median_transfer_us: float
    median_busbw_gbps: float | None
    median_fraction_of_curve: float | None
    worst: list[dict[str, Any]]       # the calls furthest below the curve, or the slowest


@dataclass
class RankSummary:
    rank: int
    calls: int
    last: int                         # calls it arrived last at
    waited_s: float                   # its own wait in them
    others_waited_s: float            # the others' wait in the calls it arrived last at


@dataclass
class CollectiveCalls:
    calls: list[Call] = field(default_factory=list)
    unmatched: dict[str, int] = field(default_factory=dict)     # "op on rank R" -> calls
    ranks: list[int] = field(default_factory=list)
    hosts: int = 1
    level: dict[int, str] = field(default_factory=dict)        # rank -> which spans were the calls
    curve_backend: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def on_device(self) -> bool:
        return "device kernels" in self.level.values()

    def attach(self, curves: dict[str, Curve]) -> None:
        """Hold every call to this machine's measured curve for its operation."""
        for c in self.calls:
            c.curve = curves.get(c.op)
        self.curve_backend = next(iter(curves.values())).backend if curves else None
        over = [c for c in self.calls if (f := c.fraction_of_curve) is not None and f > 1.2]
        if over:
            self.notes.append(f"{len(over)} calls ran more than 20% above the measured curve: it was "
                              "measured on a loaded machine, with other settings, or with few repeats; "
                              "calibrate again on a quiet machine (without --quick)")
        missing = sorted({c.op for c in self.calls if c.curve is None and c.busbw is not None})
        if curves and missing:
            self.notes.append(f"no measured curve for {', '.join(missing)} (calibrate measures all_reduce, "
                              "all_gather and reduce_scatter)")

    def summary(self, top: int = 3) -> list[OpSummary]:
        groups: dict[tuple[str, str, str], list[Call]] = defaultdict(list)
        for c in self.calls:
            groups[(c.op, size_bucket(c.bytes), c.group)].append(c)
        out = []
        for (op, size, group), calls in sorted(groups.items(), key=lambda kv: -sum(
                int(c.duration.sum()) for c in kv[1])):
            skews = [s for c in calls if (s := c.skew_ns) is not None]
            bws = [b for c in calls if (b := c.busbw) is not None]
            fr = [f for c in calls if (f := c.fraction_of_curve) is not None]
            ex = [int(c.exposed.sum()) for c in calls if c.exposed is not None]
            worst = sorted(calls, key=lambda c: (c.fraction_of_curve if c.fraction_of_curve is not None
                                                  else -c.transfer_ns))[:top]
            out.append(OpSummary(
                op, size, group, len(calls), sum(int(c.duration.sum()) for c in calls) / 1e9,
                sum(ex) / 1e9 if ex else None,
                float(np.median(skews)) / 1e3 if skews else None,
                float(np.median([c.transfer_ns for c in calls])) / 1e3,
                float(np.median(bws)) / 1e9 if bws else None,
                float(np.median(fr)) if fr else None,
                [c.to_json() for c in worst]))
        return out

    def by_rank(self) -> list[RankSummary]:
        """Per rank, over the calls (arrays per set of ranks: no object per call and rank)."""
        at: dict[int, np.ndarray] = {}                # id of a calls' ranks tuple -> positions
        tuples = {id(c.ranks): c.ranks for c in self.calls}
        ranks = sorted(set(self.ranks).union(*tuples.values()))
        for key, rt in tuples.items():
            at[key] = np.searchsorted(ranks, rt)
        calls = np.zeros(len(ranks), np.int64)
        last = np.zeros(len(ranks), np.int64)
        waited = np.zeros(len(ranks))
        others = np.zeros(len(ranks))
        for c in self.calls:
            where = at[id(c.ranks)]
            waits = c.waits
            calls[where] += 1
            waited[where] += waits / 1e9              # in call order, as one sum per rank
            if len(c.ranks) >= 2:
                i = int(np.argmax(c.arrival))
                last[where[i]] += 1
                others[where[i]] += float(waits.sum() - waits[i]) / 1e9
        return [RankSummary(r, int(n), int(x), float(w), float(o))
                for r, n, x, w, o in zip(ranks, calls.tolist(), last.tolist(), waited.tolist(), others.tolist())]

    def to_json(self, top: int = 3, calls: bool = True) -> dict[str, Any]:
        """Everything as one JSON object; calls=False leaves the calls out (write_json streams
        them instead)."""
        return {
            "ranks": self.ranks, "hosts": self.hosts,
            "link": {0: "hosts not recorded", 1: "intra-node"}.get(self.hosts, "inter-node"),
            "calls_from": {str(r): lv for r, lv in sorted(self.level.items())},
            "curve": self.curve_backend,
            **({"calls": [c.to_json() for c in self.calls]} if calls else {}),
            "unmatched": self.unmatched,
            "summary": [asdict(s) for s in self.summary(top)],
            "by_rank": [asdict(s) for s in self.by_rank()],
            "notes": self.notes,
            "definitions": DEFINITIONS,
        }

    def write_json(self, out: IO[str], top: int = 3, **head: Any) -> None:
        """The same object as to_json (with `head`'s keys first), written a call at a time: the
        calls' JSON is never all in memory at once."""
        doc = {**head, **self.to_json(top, calls=False)}
        body = json.dumps(doc, indent=1)
        out.write(body[:-2] + ',\n "calls": [')          # the object reopened before its "}"
        for i, c in enumerate(self.calls):
            out.write(("\n  " if i == 0 else ",\n  ") + json.dumps(c.to_json()))
        out.write("\n ]\n}\n")


# ---- reading the spans --------------------------------------------------------------------------

COLUMNS = ["start", "end", "name", "category", "kernel_class", "device", "tid", "collective", "bytes",
           "group_size", "attrs"]
NEEDED = ("collective", "kernel", "cpu_op", "xla_op", "step", "window")
XLA_LEVEL = "XLA collective ops"


class _Codes:
    """Strings (or None) as small integers, the same on every rank."""

    def __init__(self) -> None:
        self.ids: dict[str | None, int] = {}
        self.names: list[Any] = []
        self._known = pa.array([], pa.string())      # (ids_of's: the names as one array)

    def id(self, s: str | None) -> int:
        i = self.ids.get(s)
        if i is None:
            i = self.ids[s] = len(self.names)
            self.names.append(s)
        return i

    def ids_of(self, values: pa.Array) -> np.ndarray:
        """The codes of distinct strings (new ones numbered in their order), looked up in one go."""
        if len(self._known) != len(self.names):
            self._known = pa.array(self.names, pa.string())
        idx = pc.index_in(values, value_set=self._known)
        if idx.null_count:
            for v in values.filter(pc.is_null(idx)).to_pylist():
                self.id(v)
            self._known = pa.array(self.names, pa.string())
            idx = pc.index_in(values, value_set=self._known)
        out: np.ndarray = idx.to_numpy(zero_copy_only=False).astype(np.int32)
        return out


@dataclass
class _RankCalls:
    """One rank's calls, in start order: arrays; op, group and dtype as codes."""
    op: np.ndarray
    group: np.ndarray
    start: np.ndarray
    span: np.ndarray                  # end less start
    in_bytes: np.ndarray              # per call, 0: unknown (also its own bytes: all_to_all's split)
    out_bytes: np.ndarray
    group_size: np.ndarray
    dtype: np.ndarray
    exposed: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    step: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))   # its step's name (code), -1: none


def _pick_level(t: pa.Table) -> tuple[pa.Table, str]:
    """The rows that are the calls on one rank (see the module's docstring), and their name."""
    coll = t.filter(pc.invert(pc.is_null(t["collective"])))
    if not coll.num_rows:
        return coll, "none"
    cat = coll["category"].cast(pa.string())
    kernels = coll.filter(pc.equal(cat, "kernel"))
    if kernels.num_rows:
        return kernels, "device kernels"
    names = coll["name"].cast(pa.string())
    gloo = coll.filter(pc.starts_with(names, "gloo:"))
    if gloo.num_rows:
        return gloo, "gloo spans"
    rpc = coll.filter(pc.equal(cat, "collective"))
    if rpc.num_rows:
        if pc.any(pc.equal(rpc["name"].cast(pa.string()), "record_param_comms")).as_py():
            return rpc, "record_param_comms"
        return rpc, XLA_LEVEL            # jax: XLA's collective ops (all-reduce, all-gather...)
    return coll, "c10d ops"


def _attrs(s: str | None) -> dict[str, Any]:
    if not s:
        return {}
    try:
        v = json.loads(s)
    except ValueError:
        return {}
    return v if isinstance(v, dict) else {}


def _num(x: Any) -> float | None:
    if isinstance(x, (int, float)) and not (isinstance(x, float) and math.isnan(x)) and x > 0:
        return float(x)
    return None


def _encoded(col: pa.ChunkedArray | pa.Array) -> tuple[list[Any], np.ndarray]:
    """A column's distinct values (strings) and each row's index into them (-1: null)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    enc = pc.dictionary_encode(col.cast(pa.string()))
    idx = pc.fill_null(enc.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    return enc.dictionary.to_pylist(), idx


def _rank_calls(t: pa.Table, codes: dict[str, _Codes]) -> _RankCalls:
    """The calls among one rank's rows (the level _pick_level chose), in start order. Each
    distinct (collective, name) is named once, each distinct attrs parsed once."""
    t = t.sort_by("start")
    colls, ci = _encoded(t["collective"])
    names, ni = _encoded(t["name"])
    w = len(names) + 1
    pairs, which = np.unique((ci + 1) * w + (ni + 1), return_inverse=True)
    op_of = np.empty(len(pairs), np.int32)
    for k, c in enumerate(pairs.tolist()):
        coll, name = colls[c // w - 1] if c // w else None, names[c % w - 1] if c % w else None
        spelled = normalize_op(coll) or normalize_op(name)
        op_of[k] = -1 if spelled is None else codes["op"].id(spelled)
    op = op_of[which.reshape(-1)]
    keep = np.flatnonzero(op >= 0)
    op = op[keep]
    texts, ai = _encoded(t["attrs"])
    ai = ai[keep]
    # per distinct attrs (the last row: no attrs): its process group, bytes in and out, dtype
    parsed = [_attrs(x) for x in texts] + [{}]
    pg = [x.get("pg") or x.get("pg_desc") for x in parsed]
    has_pg = np.array([bool(v) for v in pg], bool)[ai]
    pg_code = np.array([codes["group"].id(str(v)) if v else -1 for v in pg], np.int32)[ai]
    attr_in = np.array([_num(x.get("in_bytes")) or 0.0 for x in parsed], np.float64)[ai]
    out_bytes = np.array([_num(x.get("out_bytes")) or 0.0 for x in parsed], np.float64)[ai]
    dtype = np.array([codes["dtype"].id(d if isinstance(d := x.get("dtype"), str) else None) for x in parsed],
                     np.int32)[ai]
    b = pc.fill_null(t["bytes"], 0).to_numpy().astype(np.int64)[keep]
    g = pc.fill_null(t["group_size"], 0).to_numpy().astype(np.int64)[keep]
    size = np.where(g > 0, g, 0)
    sizes, si = np.unique(size, return_inverse=True)
    size_code = np.array([codes["group"].id(f"{x} ranks" if x else "?") for x in sizes.tolist()], np.int32)
    group = np.where(has_pg, pg_code, size_code[si.reshape(-1)]).astype(np.int32)
    # arrays, not lists of floats: a run of many calls stays small; 0 is unknown
    in_bytes = np.where(attr_in > 0, attr_in, np.where(b > 0, b.astype(np.float64), 0.0))
    start = t["start"].cast(pa.int64()).to_numpy()[keep]
    return _RankCalls(op, group, start, t["end"].cast(pa.int64()).to_numpy()[keep] - start, in_bytes, out_bytes,
                      size.astype(np.int32), dtype)


def _steps_of(t: pa.Table, steps: _Codes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One rank's steps in start order: start, end and name (codes, the same on every rank)."""
    s = t.filter(pc.equal(t["category"].cast(pa.string()), "step")).sort_by("start")
    col = s["name"].combine_chunks()
    enc = pc.dictionary_encode(col.cast(pa.string()))
    lut = steps.ids_of(enc.dictionary)
    idx = enc.indices.to_numpy(zero_copy_only=False)
    return (s["start"].cast(pa.int64()).to_numpy(), s["end"].cast(pa.int64()).to_numpy(),
            lut[idx] if len(idx) else np.empty(0, np.int32))


def _main_ops(t: pa.Table) -> np.ndarray:
    """The rank's own CPU ops on the thread that issued the most of them (its main thread),
    as merged [start, end) rows: what a collective overlapping them is hidden behind."""
    ops = t.filter(pc.equal(t["category"].cast(pa.string()), "cpu_op"))
    ops = ops.filter(pc.invert(pc.is_null(ops["tid"])))
    ops = ops.filter(pc.is_null(ops["collective"]))
    if not ops.num_rows:
        return np.empty((0, 2), np.int64)
    counts = pc.value_counts(ops["tid"]).to_pylist()
    main = max(counts, key=lambda c: c["counts"])["values"]
    return _merged(ops.filter(pc.equal(ops["tid"], main)))


def _compute_kernels(t: pa.Table) -> np.ndarray:
    """The device's kernels that are not communication, merged into [start, end) rows."""
    k = t.filter(pc.equal(t["category"].cast(pa.string()), "kernel"))
    k = k.filter(pc.is_null(k["collective"]))
    cls = k["kernel_class"].cast(pa.string())
    k = k.filter(pc.invert(pc.fill_null(pc.equal(cls, "communication"), False)))
    return _merged(k)


def _merged(rows: pa.Table) -> np.ndarray:
    """[start, end) rows merged into disjoint intervals (ops nest and overlap), sorted."""
    if not rows.num_rows:
        return np.empty((0, 2), np.int64)
    lo = rows["start"].cast(pa.int64()).to_numpy()
    hi = rows["end"].cast(pa.int64()).to_numpy()
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], hi[order]
    reach = np.maximum.accumulate(hi)
    first = np.ones(len(lo), bool)
    first[1:] = lo[1:] > reach[:-1]          # a new interval: it starts past all before it
    at = np.flatnonzero(first)
    return np.column_stack([lo[at], np.maximum.reduceat(hi, at)])


def _covered_all(iv: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """For each [lo, hi): how much of it the disjoint sorted intervals `iv` cover."""
    if not len(iv) or not len(lo):
        return np.zeros(len(lo), np.int64)
    # covered length of [0, t) for any t: prefix sums over the intervals
    starts, ends = iv[:, 0], iv[:, 1]
    before = np.concatenate([[0], np.cumsum(ends - starts)])

    def upto(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(starts, t, "right")        # intervals starting at or before t
        full = before[np.maximum(k - 1, 0)]
        inside = np.where(k > 0, np.minimum(t, ends[np.maximum(k - 1, 0)]) - starts[np.maximum(k - 1, 0)], 0)
        return np.where(k > 0, full + np.maximum(inside, 0), 0)
    covered: np.ndarray = upto(hi) - upto(lo)
    return covered


def _best_offset(ref: np.ndarray, other: np.ndarray, most: int = 64) -> int:
    """The shift d that lines other[i + d] up with ref[i] best (least median start gap over
    the pairs both have); 0 when either is empty."""
    if not len(ref) or not len(other):
        return 0
    best, best_gap = 0, None
    for d in range(-min(most, len(ref) - 1), min(most, len(other) - 1) + 1):
        a = ref[max(0, -d):]
        b = other[max(0, d):]
        n = min(len(a), len(b))
        if n == 0:
            continue
        gap = float(np.median(np.abs(a[:n] - b[:n])))
        if best_gap is None or gap < best_gap:
            best, best_gap = d, gap
    return best


def analyze_calls(spans: Mapping[int, pa.Table] | Iterable[tuple[int, pa.Table]],
                  hosts: dict[int, str | None] | None = None,
                  curves: dict[str, Curve] | None = None) -> CollectiveCalls:
    """{rank: spans (COLUMNS, the NEEDED categories)}, or (rank, spans) pairs one rank at a
    time (a rank's table is let go once its calls are taken) -> every call matched across ranks.

    Every rank's calls are held as arrays (codes for names), matched all at once: sorted by
    (step, group, op) key, then rank, then start, so each key's calls on a rank are one run of
    rows, and where every rank holds as many (the rule), a key's calls are a (ranks x calls)
    block of that order."""
    out = CollectiveCalls()
    codes = {"op": _Codes(), "group": _Codes(), "dtype": _Codes(), "step": _Codes()}
    per_rank: dict[int, _RankCalls] = {}
    has_steps: dict[int, bool] = {}
    # each rank's steps are held only where clocks may need aligning (ranks on several hosts)
    steps: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    keep_steps = len({h for h in (hosts or {}).values() if h is not None}) > 1
    pairs = spans.items() if isinstance(spans, Mapping) else spans
    for r, t in pairs:
        out.ranks.append(r)
        rows, level = _pick_level(t)
        out.level[r] = level
        s_lo, s_hi, s_name = _steps_of(t, codes["step"])
        has_steps[r] = len(s_lo) > 0
        if keep_steps:
            steps[r] = s_lo, s_hi, s_name
        if rows.num_rows:
            c = per_rank[r] = _rank_calls(rows, codes)
            j = np.searchsorted(s_lo, c.start, "right") - 1
            inside = (j >= 0) & (c.start < s_hi[np.maximum(j, 0)]) if len(s_lo) else np.zeros(len(j), bool)
            c.step = np.where(inside, s_name[np.maximum(j, 0)] if len(s_lo) else -1, -1).astype(np.int32)
            # what hides a call: on a GPU the device's other kernels, under XLA its other ops,
            # on a CPU the main thread's own ops
            cover = (_compute_kernels(t) if level == "device kernels" else
                     _merged(t.filter(pc.equal(t["category"].cast(pa.string()), "xla_op"))) if level == XLA_LEVEL
                     else _main_ops(t))
            c.exposed = c.span - _covered_all(cover, c.start, c.start + c.span)
        del t, rows, s_lo, s_hi, s_name
    out.ranks.sort()
    named_hosts = {(hosts or {}).get(r) for r in out.ranks} - {None}
    out.hosts = len(named_hosts) if named_hosts else 0          # 0: not known (imported traces)
    if not per_rank:
        out.notes.append("no collective calls in this run's traces")
        return out
    # clocks across hosts: aligned as across_ranks estimates them
    skew: dict[int, int] = {}
    if out.hosts > 1:
        from .across_ranks import clock_skew
        skew = clock_skew({r: {"start": c.start, "end": c.start + c.span, "name": c.op} for r, c in per_rank.items()},
                          {r: {"start": s[0], "end": s[1], "name": s[2]} for r, s in steps.items()})
    use_steps = all(has_steps[r] for r in per_rank) and len(per_rank) > 1
    if not use_steps and len(per_rank) > 1:
        out.notes.append("calls matched by their order over the whole run (not every rank has steps)")
    del steps
    calls = _Matched(per_rank, use_steps, skew, codes)
    del per_rank
    unmatched: dict[str, int] = defaultdict(int)
    made: list[Call] = []
    for key in range(calls.keys):
        calls.match(key, len(out.ranks), unmatched, made)
    calls.tuples.clear()
    out.calls = [made[i] for i in np.argsort(np.asarray(calls.first, np.int64), kind="stable").tolist()]
    out.unmatched = dict(sorted(unmatched.items()))
    if curves:
        out.attach(curves)
    if any(not c.complete for c in out.calls):
        partial = sum(not c.complete for c in out.calls)
        out.notes.append(f"{partial} calls seen on fewer ranks than their group ({_ranks_text(out.ranks)} in "
                         "this run): their skew is over the ranks seen, their transfer an upper bound")
    return out


def _joined(per_rank: dict[int, _RankCalls], field: str, order: np.ndarray) -> np.ndarray:
    """One field of every rank's calls in one array, in `order`; each rank's own let go."""
    x = np.concatenate([getattr(c, field) for c in per_rank.values()])
    for c in per_rank.values():
        setattr(c, field, np.empty(0, x.dtype))
    out: np.ndarray = x[order]
    return out


class _Matched:
    """Every rank's calls in one set of arrays, sorted by key (step, group, op: numbered in the
    order first seen, ranks in the order given, calls by start), then rank, then start: each
    key's calls on one rank are a run of rows. The per-rank arrays are let go as they are
    joined. A call made by every rank of its key as often (the rule) takes its figures as
    views of these arrays, without a copy."""

    def __init__(self, per_rank: dict[int, _RankCalls], use_steps: bool, skew: dict[int, int],
                 codes: dict[str, _Codes]):
        self.codes = codes
        ranks = list(per_rank)
        sizes = [len(per_rank[r].start) for r in ranks]
        n_ops, n_groups = len(codes["op"].names), len(codes["group"].names)
        key = []
        for r in ranks:
            c = per_rank[r]
            step = c.step.astype(np.int64) if use_steps else np.full(len(c.start), -1, np.int64)
            key.append(((step + 1) * n_groups + c.group) * n_ops + c.op)
            c.step = c.group = c.op = np.empty(0, np.int32)            # (let go: the key holds them)
        # keys numbered in the order first seen (ranks as given, each rank's calls by start)
        enc = pc.dictionary_encode(pa.array(np.concatenate(key)))
        del key
        kid = enc.indices.to_numpy(zero_copy_only=False)
        packed = enc.dictionary.to_numpy(zero_copy_only=False)              # key number -> its parts
        del enc
        self.keys = len(packed)
        self.key_op = (packed % n_ops).tolist()
        self.key_group = (packed // n_ops % n_groups).tolist()
        self.key_step = (packed // n_ops // n_groups - 1).tolist()
        rank = np.repeat(np.asarray(ranks, np.int64), sizes)
        order = np.lexsort((rank, kid))          # stable: within a key and rank, in start order
        kid, rank = kid[order], rank[order]

        def joined(field: str) -> np.ndarray:
            return _joined(per_rank, field, order)
        shift = np.repeat(np.array([skew.get(r, 0) for r in ranks], np.int64), sizes)
        self.aligned = joined("start")
        if skew:
            self.aligned -= shift[order]
        del shift
        self.length = np.maximum(joined("span"), 0)
        self.exposed = joined("exposed")
        self.in_bytes = joined("in_bytes")
        self.out_bytes = joined("out_bytes")
        self.dtype = joined("dtype")
        group_size = joined("group_size")
        per_rank.clear()
        key_at = np.searchsorted(kid, np.arange(self.keys + 1))
        # runs of one (key, rank): where each begins, its rank, its first call's group size
        cut = np.flatnonzero((kid[1:] != kid[:-1]) | (rank[1:] != rank[:-1])) + 1
        self.run_at = np.concatenate([[0], cut, [len(kid)]])
        self.run_rank = rank[self.run_at[:-1]]
        self.run_size = group_size[self.run_at[:-1]]
        del kid, rank, group_size, cut
        self.runs_of_key = np.searchsorted(self.run_at[:-1], key_at)
        self.tuples: dict[bytes, tuple[int, ...]] = {}     # one tuple per set of ranks
        self.first: list[int] = []                         # each call's first arrival

    def _ranks(self, ranks: np.ndarray) -> tuple[int, ...]:
        return self.tuples.setdefault(ranks.tobytes(), tuple(ranks.tolist()))

    def match(self, key: int, n_ranks: int, unmatched: dict[str, int], made: list[Call]) -> None:
        """The calls of one key, made (appended to `made`) or counted unmatched (the rules in
        the module's docstring)."""
        op = self.codes["op"].names[self.key_op[key]]
        g = self.codes["group"].names[self.key_group[key]]
        step = self.codes["step"].names[self.key_step[key]] if self.key_step[key] >= 0 else None
        r0, r1 = self.runs_of_key[key], self.runs_of_key[key + 1]
        lo = self.run_at[r0:r1]
        counts = self.run_at[r0 + 1:r1 + 1] - lo
        ranks = self.run_rank[r0:r1]
        sizes = self.run_size[r0:r1]
        n = int(sizes.max()) if sizes.max() > 0 else len(ranks)
        if len(ranks) > 1 and (step is None or counts.min() != counts.max()):
            at = self._lined_up(op, ranks, lo, counts, unmatched)
            if at is None:
                return
        else:
            at = self._block(lo, counts, op, ranks, unmatched)
        k = at.shape[1]
        if 1 < len(ranks) < n and n_ranks >= n:
            # the run holds every rank of the group, yet some made none of these calls here:
            # a window that missed the step; the others' calls are not matched to nothing
            for r in ranks.tolist():
                unmatched[f"{op} on rank {r}"] += k
            return
        if k == 0:
            return
        first = at[0]
        ins = self.in_bytes[first].tolist()
        outs = self.out_bytes[first].tolist()
        dtypes = self.codes["dtype"].names
        dtype = self.dtype[first].tolist()
        rank_tuple = self._ranks(ranks)
        a0, nr = int(at[0, 0]), len(ranks)
        if at[-1, -1] - a0 == nr * k - 1:
            # one block, rank after rank: call idx is every k-th row from a0 + idx (views)
            self.first.extend(self.aligned[a0:a0 + nr * k].reshape(nr, k).min(axis=0).tolist())
            for idx in range(k):
                rows = slice(a0 + idx, a0 + nr * k, k)
                made.append(Call(op, g, idx, step, rank_tuple, n,
                                 nccl_tests_bytes(op, ins[idx] or None, outs[idx] or None, n),
                                 dtypes[dtype[idx]], self.aligned[rows], self.length[rows],
                                 self.exposed[rows], self.in_bytes[rows]))
            return
        # (k calls x ranks) matrices: a call's figures are a row of each (a view, no copy)
        at = np.ascontiguousarray(at.T)
        start = self.aligned[at]
        length, hidden, own = self.length[at], self.exposed[at], self.in_bytes[at]
        self.first.extend(start.min(axis=1).tolist())
        for idx in range(k):
            made.append(Call(op, g, idx, step, rank_tuple, n,
                             nccl_tests_bytes(op, ins[idx] or None, outs[idx] or None, n),
                             dtypes[dtype[idx]], start[idx], length[idx], hidden[idx], own[idx]))

    def _block(self, lo: np.ndarray, counts: np.ndarray, op: str, ranks: np.ndarray,
               unmatched: dict[str, int]) -> np.ndarray:
        """(ranks x k) rows of each rank's first k calls of the key (k: the fewest a rank made);
        the rest unmatched."""
        k = int(counts.min())
        if counts.max() == k and lo[-1] - lo[0] == k * (len(lo) - 1):       # one after another
            return np.arange(lo[0], lo[0] + k * len(lo)).reshape(len(lo), k)
        for r, c in zip(ranks.tolist(), counts.tolist()):
            if c > k:
                unmatched[f"{op} on rank {r}"] += c - k
        return lo[:, None] + np.arange(k)[None, :]

    def _lined_up(self, op: str, ranks: np.ndarray, lo: np.ndarray, counts: np.ndarray,
                  unmatched: dict[str, int]) -> np.ndarray | None:
        """No steps, or a step some rank holds fewer of these calls in (its window began or
        ended inside it): on one clock the same call starts at nearly the same moment
        everywhere, so each rank's sequence is shifted to where it lies closest to the lowest
        rank's (ref[i] is rank r's [i + d_r]); calls outside the span all ranks share are
        unmatched. (ranks x k) rows, or None when no call is left."""
        rows = [np.arange(a, a + c) for a, c in zip(lo.tolist(), counts.tolist())]
        ref = self.aligned[rows[0]]
        shift = [0] + [_best_offset(ref, self.aligned[x]) for x in rows[1:]]
        first = max(0, *(-d for d in shift))
        last = min(len(x) - d for x, d in zip(rows, shift))
        for i, (r, d) in enumerate(zip(ranks.tolist(), shift)):
            kept = rows[i][first + d:max(first, last) + d]
            if len(rows[i]) > len(kept):
                unmatched[f"{op} on rank {r}"] += len(rows[i]) - len(kept)
            rows[i] = kept
        if last <= first:
            return None
        lens = np.array([len(x) for x in rows])
        return self._block(np.array([x[0] for x in rows]), lens, op, ranks, unmatched)


def _ranks_text(ranks: Iterable[int]) -> str:
    from .across_ranks import rank_ranges
    return "rank " + rank_ranges(sorted(ranks)) if len(list(ranks)) == 1 else "ranks " + rank_ranges(sorted(ranks))
