"""Predicted against measured (`counterprof correlate`): a run's ops, kernels, regions and steps
held to a model's, a simulator's, the roofline's or another run's predictions.

    m = measure(roofline, durations)       # the run's items: roofline(..., keep_calls=True) for the
                                           # ops, OpRows.durations() for kernels, regions, steps
    preds = read by store/correlate.py, or roofline_predictions(m, doc, source), or run_predictions(other)
    c = correlate(m, preds, tolerance)     # per prediction row: measured, predicted, ratio, within;
                                           # per source: coverage, MAPE, geo-mean ratio, Pearson, Spearman,
                                           # per group (op family) and per rank; rows that matched nothing

Items measured:
    op       a roofline row: op name + input shapes + input types (torch; XLA: HLO op + module +
             category), its own time per call (kernel time on GPUs, self time on CPUs; the roofline's
             rules), with the FLOPs and bytes per call that rates turn into times; ops without a
             cost model are items by name alone (their mean per call: their calls are summed)
    kernel   GPU kernels, copies and sets by name
    region   counterprof.region() and trace annotations by name
    step     steps by name less its "#N" (ProfilerStep#7 -> ProfilerStep)

Matching: each measured item goes to the most specific prediction row of a source that matches it
(an exact name before a pattern, shapes given before none, a dtype given before none; the
earlier line on a tie). A row's figures are those of the items it got.

Figures of a row: measured_us is the median per call (p10, p90 beside it); the ratio is
measured / predicted: median / predicted_us, or measured total / predicted total for a row that
predicts a total, or a rate over several items of different sizes. error = ratio - 1; within:
|error| <= tolerance. A source's MAPE is sum(w |m - p| / m) / sum(w) and its geo-mean ratio
exp(sum(w ln(m / p)) / sum(w)), w the row's measured time; coverage: the measured time of the
kinds the source predicts that a row holds; Pearson and Spearman: over the rows, on log times.
"""
from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .roofline import CallTimes, peak_for

if TYPE_CHECKING:
    import pyarrow as pa

    from .roofline import Roofline

KINDS = ("op", "kernel", "region", "step")
GROUPS = ("GEMM", "convolution", "attention", "normalization", "elementwise", "reduction",
          "collectives", "memory copies", "other")
_OP_FAMILY = {"gemm": "GEMM", "conv": "convolution", "attention": "attention", "norm": "normalization",
              "softmax": "reduction", "reduction": "reduction", "elementwise": "elementwise",
              "copy": "memory copies", "embedding": "memory copies"}
# names to a group where no cost model says (kernels, ops without a model): first match wins
_NAME_GROUPS = [
    ("collectives", re.compile(r"nccl|rccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast|"
                               r"c10d|gloo|collective", re.I)),
    ("memory copies", re.compile(r"^memcpy|^memset|copy|^dma|fill|cat|index", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|sdpa|softmax_?attn", re.I)),
    ("convolution", re.compile(r"conv|cudnn|miopen|implicit_?gemm", re.I)),
    ("GEMM", re.compile(r"gemm|cutlass|xmma|cublas|hipblas|matmul|\bmm\b|addmm|bmm|linear|dot|wgmma", re.I)),
    ("normalization", re.compile(r"norm", re.I)),
    ("reduction", re.compile(r"reduce|softmax|sum|mean|max", re.I)),
    ("elementwise", re.compile(r"elementwise|triton_poi|add|mul|relu|gelu|silu|sigmoid|tanh|exp|div|sub", re.I)),
]
_STEP_SUFFIX = re.compile(r"#\d+$")


def group_of(name: str, family: str | None = None) -> str:
    if family and family in _OP_FAMILY:
        return _OP_FAMILY[family]
    for g, rx in _NAME_GROUPS:
        if rx.search(name):
            return g
    return "other"


def step_name(name: str) -> str:
    return _STEP_SUFFIX.sub("", name) or name


# ---- what was measured ----------------------------------------------------------------------

@dataclass
class Item:
    """One measured thing, on one rank or over every rank (rank None)."""
    kind: str
    name: str
    dims: Any = None                   # op: input shapes as the trace records them
    types: Any = None                  # op: input types (torch) / HLO category (XLA)
    dtype: str | None = None           # op: the dtype its cost is counted in (fp32, bf16...)
    group: str = "other"
    calls: int = 0
    total_ns: int = 0
    times: CallTimes | None = None     # None: only the total is known (mean per call)
    flops_per_call: float | None = None
    bytes_per_call: float | None = None
    bound: str | None = None           # op: the roofline's (compute, memory, host link)

    @property
    def key(self) -> str:
        """The item as text: kind, name and (ops) shapes and types."""
        if self.kind != "op" or self.dims is None:
            return f"{self.kind}:{self.name}"
        return f"op:{self.name} {json.dumps(self.dims, separators=(',', ':'))} " \
               f"{json.dumps(self.types, separators=(',', ':'))}"

    def add(self, other: Item) -> None:
        self.calls += other.calls
        self.total_ns += other.total_ns
        if self.times is not None and other.times is not None:
            self.times.merge(other.times)
        else:
            self.times = None

    def copy(self) -> Item:
        t = None
        if self.times is not None:
            t = CallTimes()
            t.merge(self.times)
        return Item(self.kind, self.name, self.dims, self.types, self.dtype, self.group, self.calls,
                    self.total_ns, t, self.flops_per_call, self.bytes_per_call, self.bound)


@dataclass
class Measured:
    """A run's items over every rank and per rank, and each kind's measured time."""
    items: dict[str, Item] = field(default_factory=dict)
    by_rank: dict[int, dict[str, Item]] = field(default_factory=dict)
    totals_ns: dict[str, int] = field(default_factory=dict)
    device: str = "cpu"
    notes: list[str] = field(default_factory=list)

    def _put(self, rank: int | None, item: Item) -> None:
        if rank is not None:
            self.by_rank.setdefault(rank, {})[item.key] = item
            item = item.copy()
        had = self.items.get(item.key)
        if had is None:
            self.items[item.key] = item
        else:
            had.add(item)


def measure(r: Roofline | None, durations: pa.Table | None) -> Measured:
    """The items of a run: r a Roofline made with keep_calls=True (its ops; None: no op spans),
    durations OpRows.durations() (kernels, regions and steps in log bins)."""
    m = Measured()
    if r is not None:
        m.device = r.device
        m.totals_ns["op"] = int(r.total_time_ns)
        for j, o in enumerate(r.ops):
            per_rank = {rank: v for (rank, jj), v in r.calls.items() if jj == j}
            base = dict(kind="op", name=o.name, dims=o.input_dims, types=o.input_types, dtype=o.dtype,
                        group=group_of(o.name, o.family), flops_per_call=o.flops_per_call,
                        bytes_per_call=o.bytes_per_call, bound=o.bound)
            if not per_rank:           # (a roofline made without keep_calls: totals only)
                m._put(None, Item(**base, calls=o.calls, total_ns=o.time_ns))
            for rank, (calls, ns, times) in sorted(per_rank.items()):
                m._put(rank, Item(**base, calls=calls, total_ns=ns, times=times))
        for u in (r.unmodelled or {}).get("ops", []):
            if not u.get("calls") and u.get("time_ns"):
                m.notes.append(f"{u['time_ns'] / 1e6:.3g} ms of GPU work launched outside any recorded op is no "
                               "item (it has no op to predict it by); coverage is of the items' time")
            if u.get("calls"):
                m._put(None, Item("op", u["name"], group=group_of(u["name"]), calls=int(u["calls"]),
                                  total_ns=int(u["time_ns"])))
        if (r.unmodelled or {}).get("ops") and len({rank for rank, _ in r.calls}) > 1:
            m.notes.append("ops without a cost model are measured over every rank together, by their "
                           "mean per call (their calls are summed as the roofline walks them)")
    if durations is not None and durations.num_rows:
        d = durations.to_pydict()
        found: dict[tuple[int, str, str], Item] = {}
        for rank, cat, name, kclass, b, n, ns in zip(d["rank"], d["category"], d["name"], d["kernel_class"],
                                                     d["bin"], d["calls"], d["ns"]):
            kind = {"kernel": "kernel", "memcpy": "kernel", "memset": "kernel", "region": "region",
                    "annotation": "region", "step": "step"}.get(cat)
            if kind is None:
                continue
            name = step_name(name) if kind == "step" else name
            it = found.get((rank, kind, name))
            if it is None:
                group = "collectives" if kclass == "communication" else \
                    "memory copies" if cat in ("memcpy", "memset") else group_of(name)
                it = found[(rank, kind, name)] = Item(kind, name, group=group if kind == "kernel" else kind,
                                                      times=CallTimes())
            it.calls += int(n)
            it.total_ns += int(ns)
            assert it.times is not None
            it.times.bins[int(b)] = it.times.bins.get(int(b), 0) + int(n)
        for (rank, kind, _), it in sorted(found.items(), key=lambda kv: kv[0]):
            m.totals_ns[kind] = m.totals_ns.get(kind, 0) + it.total_ns
            m._put(rank, it)
    return m


# ---- what was predicted -------------------------------------------------------------------------

@dataclass
class Prediction:
    """One row of predictions: what it keys (kind, name or pattern, shapes, dtype) and what it
    predicts (µs per call, a total, or rates the item's FLOPs / bytes turn into a time)."""
    line: int                            # in its file (1: the first row after a CSV's header); 0: a model's
    kind: str
    name: str
    source: str
    dims: Any = None
    types: Any = None
    dtype: str | None = None
    us: float | None = None              # per call
    total_us: float | None = None
    flops_per_s: float | None = None
    bytes_per_s: float | None = None
    tolerance: float | None = None       # a fraction (0.2: within 20%)
    extra: dict[str, Any] = field(default_factory=dict)
    by_rank: dict[int, float] | None = None     # µs per call per rank (another run's, rank by rank)
    _rx: Any = field(default=None, repr=False)

    @property
    def exact(self) -> bool:
        return not (self.name.startswith("re:") or any(c in self.name for c in "*?["))

    @property
    def key(self) -> str:
        if self.kind == "op" and self.dims is not None:
            return f"op:{self.name} {json.dumps(self.dims, separators=(',', ':'))}" + \
                   (f" {json.dumps(self.types, separators=(',', ':'))}" if self.types is not None else "") + \
                   (f" {self.dtype}" if self.dtype else "")
        return f"{self.kind}:{self.name or '*'}" + (f" {self.dtype}" if self.dtype else "")

    def names(self, name: str) -> bool:
        if not self.name or self.name == "*":
            return True
        if self.kind == "step" and self.exact:
            return name == step_name(self.name)           # ProfilerStep#3 is the step ProfilerStep
        if self.exact:
            return name == self.name
        if self._rx is None:
            self._rx = re.compile(self.name[3:]) if self.name.startswith("re:") else \
                re.compile(fnmatch.translate(self.name))
        return bool(self._rx.search(name) if self.name.startswith("re:") else self._rx.match(name))

    def matches(self, it: Item) -> bool:
        if it.kind != self.kind or not self.names(it.name):
            return False
        if self.dims is not None and it.dims != self.dims:
            return False
        if self.types is not None and it.types != self.types:
            return False
        if self.dtype:
            d = self.dtype.lower()
            types = it.types if isinstance(it.types, list) else [it.types]
            if d != (it.dtype or "").lower() and d not in [str(t).lower() for t in types]:
                return False
        return True

    def specificity(self) -> tuple[int, int]:
        return (4 * self.exact + 2 * (self.dims is not None) + (self.types is not None)
                + (self.dtype is not None), -self.line)

    def per_call_ns(self, it: Item, rank: int | None = None) -> float | None:
        """The predicted ns per call of one item (rates: from its FLOPs / bytes; None: cannot);
        rank: on that rank (another run's own figure for it, where there is one)."""
        if rank is not None and self.by_rank and rank in self.by_rank:
            return self.by_rank[rank] * 1e3
        if self.us is not None:
            return self.us * 1e3
        if self.total_us is not None:
            return self.total_us * 1e3 / it.calls if it.calls else None
        t = []
        if self.flops_per_s and it.flops_per_call:
            t.append(it.flops_per_call / self.flops_per_s * 1e9)
        if self.bytes_per_s and it.bytes_per_call:
            t.append(it.bytes_per_call / self.bytes_per_s * 1e9)
        return max(t) if t else None


def roofline_predictions(m: Measured, ceilings: dict[str, Any], source: str) -> list[Prediction]:
    """Each costed op's time per call as its roofline bounds it: max(FLOPs / peak of its dtype,
    bytes / memory bandwidth) under the ceilings (a calibrate or datasheet document); a copy
    between host and device by the measured pinned host<->device bandwidth (none known: no
    prediction for it)."""
    from .roofline import _link_bandwidth
    bw = float(ceilings.get("bandwidth_bytes_per_s") or 0) or None
    link = _link_bandwidth(ceilings)
    out = []
    for it in m.items.values():
        if it.kind != "op" or it.flops_per_call is None:
            continue
        if it.bound == "host link":
            if link and it.bytes_per_call:      # its traffic: the source's bytes (half of read + written)
                out.append(Prediction(0, "op", it.name, source, dims=it.dims, types=it.types,
                                      us=it.bytes_per_call / 2 / link * 1e6))
            continue
        matrix = it.group in ("GEMM", "convolution", "attention")
        peak, _ = peak_for(ceilings, it.dtype, matrix)
        t = [x for x in ((it.flops_per_call / peak if peak and it.flops_per_call else None),
                         (it.bytes_per_call / bw if bw and it.bytes_per_call else None)) if x]
        if t:
            out.append(Prediction(0, "op", it.name, source, dims=it.dims, types=it.types, us=max(t) * 1e6))
    return out


def run_predictions(other: Measured, source: str) -> list[Prediction]:
    """Another run's items as predictions for this one: each item's median per call (its mean
    where only a total is known), keyed exactly."""
    out = []
    for key, it in other.items.items():
        us = _median_ns(it) / 1e3 if it.calls else None
        if us:
            per_rank = {r: _median_ns(items[key]) / 1e3 for r, items in other.by_rank.items()
                        if key in items and items[key].calls}
            out.append(Prediction(0, it.kind, it.name, source, dims=it.dims,
                                  types=it.types if it.kind == "op" and it.dims is not None else None, us=us,
                                  by_rank=per_rank or None))
    return out


def _median_ns(it: Item) -> float:
    q = it.times.quantile(0.5) if it.times is not None else None
    return q if q is not None else it.total_ns / max(it.calls, 1)


# ---- the correlation ----------------------------------------------------------------------------

@dataclass
class Row:
    """A prediction row with the items it got: the figures of one line of the output."""
    pred: Prediction
    item: Item                         # its items merged
    matched: int                       # how many measured items
    predicted_total_ns: float
    ratio: float
    tolerance: float
    rank: int | None = None

    @property
    def measured_us(self) -> float:
        return _median_ns(self.item) / 1e3

    @property
    def predicted_us(self) -> float:
        return self.predicted_total_ns / max(self.item.calls, 1) / 1e3

    @property
    def within(self) -> bool:
        return abs(self.ratio - 1) <= self.tolerance

    @property
    def savings_ns(self) -> float:
        """What its calls would save at the predicted pace: their time less time / ratio."""
        return max(0.0, self.item.total_ns * (1 - 1 / self.ratio))

    def to_json(self) -> dict[str, Any]:
        it, p = self.item, self.pred
        def q(x: float) -> float | None:
            v = it.times.quantile(x) if it.times is not None else None
            return None if v is None else _sig(v / 1e3)
        return {"key": p.key if self.matched > 1 or not p.exact else it.key, "kind": p.kind, "name": p.name,
                "shapes": it.dims if self.matched == 1 else p.dims, "types": it.types if self.matched == 1 else p.types,
                "dtype": p.dtype or it.dtype, "source": p.source, "line": p.line or None, "group": it.group,
                "items": self.matched, "calls": it.calls, "measured_us": _sig(self.measured_us),
                "measured_stat": "median" if it.times is not None else "mean",
                "p10_us": q(0.1), "p90_us": q(0.9), "measured_total_us": _sig(it.total_ns / 1e3),
                "predicted_us": _sig(self.predicted_us), "predicted_total_us": _sig(self.predicted_total_ns / 1e3),
                "ratio": round(self.ratio, 4), "error": round(self.ratio - 1, 4), "tolerance": self.tolerance,
                "within": self.within, "savings_us": _sig(self.savings_ns / 1e3),
                **({"extra": p.extra} if p.extra else {})}


def _sig(x: float) -> float:
    """Six significant digits (a roofline's prediction for a tiny op is a fraction of a ns)."""
    return float(f"{x:.6g}")


@dataclass
class Figures:
    """A set of rows summed up, weighted by measured time."""
    rows: int
    measured_s: float
    coverage: float | None
    mape: float | None
    geomean_ratio: float | None
    within: float | None
    pearson: float | None
    spearman: float | None

    def to_json(self) -> dict[str, Any]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 4)
        return {"rows": self.rows, "measured_s": round(self.measured_s, 6), "coverage": r(self.coverage),
                "mape": r(self.mape), "geomean_ratio": r(self.geomean_ratio), "within": r(self.within),
                "pearson": r(self.pearson), "spearman": r(self.spearman)}


def figures(rows: list[Row], measured_total_ns: float | None) -> Figures:
    w = np.array([r.item.total_ns for r in rows], float)
    ratio = np.array([r.ratio for r in rows], float)
    covered = float(w.sum())
    if not rows or covered <= 0:
        return Figures(len(rows), covered / 1e9, 0.0 if measured_total_ns else None, None, None, None, None, None)
    ape = np.abs(1 - 1 / ratio)
    logm = np.log10([max(r.measured_us, 1e-6) for r in rows])
    logp = np.log10([max(r.predicted_us, 1e-6) for r in rows])
    return Figures(len(rows), covered / 1e9,
                   min(1.0, covered / measured_total_ns) if measured_total_ns else None,
                   float((w * ape).sum() / covered), float(np.exp((w * np.log(ratio)).sum() / covered)),
                   float(w[[r.within for r in rows]].sum() / covered),
                   _pearson(logm, logp), _pearson(_ranks(logm), _ranks(logp)))


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties given their mean rank (Spearman's)."""
    order = np.argsort(x, kind="stable")
    r = np.empty(len(x), float)
    r[order] = np.arange(1, len(x) + 1)
    for v in np.unique(x):
        tie = x == v
        if tie.sum() > 1:
            r[tie] = r[tie].mean()
    return r


def _pearson(a: np.ndarray, b: np.ndarray) -> float | None:
    if len(a) < 3 or np.std(a) == 0 or np.std(b) == 0:
        return None
    return float(np.corrcoef(a, b)[0, 1])


@dataclass
class Unmatched:
    pred: Prediction
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"line": self.pred.line or None, "source": self.pred.source, "key": self.pred.key, "why": self.why}


@dataclass
class Source:
    """One source's rows and figures (the file's `source` column, a model, another run)."""
    name: str
    rows: list[Row]
    figures: Figures
    by_group: dict[str, Figures]
    by_rank: dict[int, Figures]
    unmatched: list[Unmatched]
    uncovered: list[Item]              # measured items of its kinds that no row holds, longest first


@dataclass
class Correlation:
    sources: list[Source]
    measured: Measured
    notes: list[str] = field(default_factory=list)

    def to_json(self, top: int = 10) -> dict[str, Any]:
        def src(s: Source) -> dict[str, Any]:
            return {"source": s.name, **s.figures.to_json(),
                    "by_group": {g: f.to_json() for g, f in s.by_group.items()},
                    "by_rank": {str(k): f.to_json() for k, f in s.by_rank.items()},
                    "items": [r.to_json() for r in s.rows],
                    "unmatched": [u.to_json() for u in s.unmatched],
                    "uncovered": [{"key": it.key, "calls": it.calls, "measured_total_us": round(it.total_ns / 1e3, 3),
                                   "group": it.group} for it in s.uncovered[:top]]}
        first = self.sources[0] if self.sources else None
        head = first.figures.to_json() if first else {}
        return {"source": first.name if first else None,
                "coverage": head.get("coverage"), "mape": head.get("mape"),
                "geomean_ratio": head.get("geomean_ratio"), "spearman": head.get("spearman"),
                "pearson": head.get("pearson"), "within": head.get("within"),
                "device": self.measured.device,
                "items": [r.to_json() for r in first.rows] if first else [],
                "sources": [src(s) for s in self.sources], "notes": self.notes + self.measured.notes}


def correlate(m: Measured, preds: list[Prediction], tolerance: float) -> Correlation:
    """Every source's rows, figures and unmatched rows (sources in the order first seen)."""
    order: list[str] = []
    by_source: dict[str, list[Prediction]] = {}
    for p in preds:
        if p.source not in by_source:
            order.append(p.source)
        by_source.setdefault(p.source, []).append(p)
    c = Correlation([_source(name, by_source[name], m, tolerance) for name in order], m)
    if not m.items:
        c.notes.append("the run has no op, kernel, region or step spans: record it with `counterprof run "
                       "--torch` / `--jax`, or import a trace")
    return c


def _source(name: str, preds: list[Prediction], m: Measured, tolerance: float) -> Source:
    kinds = {p.kind for p in preds}
    got: dict[int, list[Item]] = {id(p): [] for p in preds}
    best_of: dict[str, Prediction] = {}
    exact: dict[tuple[str, str], list[Prediction]] = {}      # rows by (kind, name): no scan per item
    patterns: dict[str, list[Prediction]] = {}
    for p in preds:
        if p.exact and p.name and p.name != "*":
            exact.setdefault((p.kind, step_name(p.name) if p.kind == "step" else p.name), []).append(p)
        else:
            patterns.setdefault(p.kind, []).append(p)
    for key, it in m.items.items():
        if it.kind not in kinds:
            continue
        cands = [p for p in exact.get((it.kind, it.name), []) + patterns.get(it.kind, []) if p.matches(it)]
        if cands:
            best = max(cands, key=Prediction.specificity)
            got[id(best)].append(it)
            best_of[key] = best
    rows: list[Row] = []
    by_group: dict[str, list[Row]] = {}
    unmatched: list[Unmatched] = []
    index = _NameIndex(m)
    for p in preds:
        items = got[id(p)]
        if not items:
            unmatched.append(Unmatched(p, _why_unmatched(p, index, best_of)))
            continue
        row = _row(p, items, tolerance)
        if isinstance(row, str):
            unmatched.append(Unmatched(p, row))
            continue
        rows.append(row)
        groups: dict[str, list[Item]] = {}
        for it in items:               # a pattern's items counted in each one's own group
            groups.setdefault(it.group, []).append(it)
        for g, its in groups.items():
            part = row if len(groups) == 1 else _row(p, its, tolerance)
            if not isinstance(part, str):
                by_group.setdefault(g, []).append(part)
    rows.sort(key=lambda r: -r.savings_ns)
    # the measured time of the kinds predicted: the items' (GPU work launched outside any
    # recorded op is no item: the note says how much)
    measured_total = sum(it.total_ns for it in m.items.values() if it.kind in kinds)
    group_totals: dict[str, int] = {}
    for it in m.items.values():
        if it.kind in kinds:
            group_totals[it.group] = group_totals.get(it.group, 0) + it.total_ns
    by_rank: dict[int, Figures] = {}
    if len(m.by_rank) > 1:
        for rank, on_rank in sorted(m.by_rank.items()):
            rank_rows = []
            for p in preds:
                mine = [on_rank[it.key] for it in got[id(p)] if it.key in on_rank]
                if mine:
                    rr = _row(p, mine, tolerance, rank)
                    if not isinstance(rr, str):
                        rr.rank = rank
                        rank_rows.append(rr)
            total = sum(it.total_ns for it in on_rank.values() if it.kind in kinds)
            by_rank[rank] = figures(rank_rows, total)
    covered = {it.key for p in preds for it in got[id(p)]}
    uncovered = sorted((it for it in m.items.values() if it.kind in kinds and it.key not in covered),
                       key=lambda it: -it.total_ns)
    return Source(name, rows, figures(rows, measured_total),
                  {g: figures(rs, group_totals.get(g)) for g, rs in sorted(by_group.items(),
                                                                         key=lambda kv: GROUPS.index(kv[0])
                                                                         if kv[0] in GROUPS else len(GROUPS))},
                  by_rank, unmatched, uncovered)


class _NameIndex:
    """The run's items by kind and name, for saying why a row matched nothing without a scan
    of every item per row."""

    def __init__(self, m: Measured):
        self.kinds: set[str] = set()
        self.by_name: dict[tuple[str, str], list[Item]] = {}
        self.names: dict[str, list[str]] = {}
        for it in m.items.values():
            self.kinds.add(it.kind)
            self.by_name.setdefault((it.kind, it.name), []).append(it)
        for kind, n in self.by_name:
            self.names.setdefault(kind, []).append(n)

    def named(self, p: Prediction) -> list[Item]:
        if p.exact and p.name and p.name != "*":
            return self.by_name.get((p.kind, step_name(p.name) if p.kind == "step" else p.name), [])
        return [it for n in self.names.get(p.kind, []) if p.names(n) for it in self.by_name[(p.kind, n)]]


def _row(p: Prediction, items: list[Item], tolerance: float, rank: int | None = None) -> Row | str:
    """The row of a prediction over its items (on one rank, or over all: None), or why it
    cannot be figured."""
    per = [p.per_call_ns(it, rank) for it in items]
    if any(x is None or x <= 0 for x in per):
        if p.us is None and p.total_us is None:
            return ("a rate needs the item's FLOPs or bytes per call, which only costed ops carry: "
                    "give predicted_us (or predicted_total_us) for it")
        return "the prediction is not a positive time"
    merged = items[0].copy()
    for it in items[1:]:
        merged.add(it)
    if len({it.group for it in items}) > 1:
        merged.group = "mixed"
    if len({it.dtype for it in items}) > 1:
        merged.dtype = None
    if p.total_us is not None:
        predicted_total = p.total_us * 1e3
        ratio = merged.total_ns / predicted_total
    else:
        predicted_total = sum(x * it.calls for x, it in zip(per, items) if x is not None)
        if len(items) == 1 or p.us is not None or (rank is not None and p.by_rank):
            ratio = _median_ns(merged) / (predicted_total / max(merged.calls, 1))
        else:                              # a rate over items of different sizes: totals
            ratio = merged.total_ns / predicted_total
    if merged.total_ns <= 0 or ratio <= 0:
        return "its items took no measured time"
    return Row(p, merged, len(items), predicted_total, ratio, p.tolerance if p.tolerance is not None else tolerance)


def _why_unmatched(p: Prediction, index: _NameIndex, best_of: dict[str, Prediction]) -> str:
    if p.kind not in index.kinds:
        return f"the run has no {p.kind} items" + (" (no op spans: record shapes)" if p.kind == "op" else "")
    named = index.named(p)
    if not named:
        hint = " (a step's #N is not part of its name)" if p.kind == "step" else ""
        return f"no {p.kind} {'named' if p.exact else 'matching'} {p.name!r} in the run{hint}"
    fits = [it for it in named if p.matches(it)]
    if not fits and p.dims is not None and all(it.dims is None for it in named):
        return (f"{p.name} has no cost model, so it is measured by name alone, not per shape: "
                "give its row without shapes")
    if not fits:
        shapes = [json.dumps(it.dims, separators=(",", ":")) for it in named[:3]]
        what = "dtype" if p.dtype and p.dims is None else "shapes or dtype"
        return f"{p.name} ran with other {what}: {'; '.join(shapes)}" + \
               (f" (and {len(named) - 3} more)" if len(named) > 3 else "")
    takers = [best_of[it.key] for it in fits if it.key in best_of]
    same = [t for t in takers if t.key == p.key and t.specificity()[0] == p.specificity()[0]]
    if same:
        return f"the same key as line {same[0].line}, which took its items (a duplicate row)"
    lines = sorted({t.line for t in takers})
    return "every item it matches is predicted by a more specific row" + \
           (f" (line {', '.join(map(str, lines))})" if any(lines) else "")
