"""Where a NeuronCore's time went, from its device profile (Neuron Explorer, imported by
collectors/neuron/explorer.py): per rank, each engine's busy time (instructions other than
semaphore waits, overlaps counted once) and its semaphore waits, the instructions that took the
most time (engine and opcode, as Explorer's own guide groups them), the DMA queues by type
(time moving, bytes, the rate while moving) and the collectives. Shares are of the span from the
core's first activity to its last, as the verdict's are.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

COLUMNS = ["start", "end", "name", "category", "bytes"]
CATEGORIES = ("neuron_inst", "neuron_dma", "neuron_cc")


def _union_ns(start: np.ndarray, end: np.ndarray) -> int:
    if not len(start):
        return 0
    order = np.argsort(start, kind="stable")
    s, e = start[order], np.maximum.accumulate(end[order])
    gaps = s[1:] > e[:-1]
    firsts = np.r_[s[0], s[1:][gaps]]
    lasts = np.r_[e[:-1][gaps], e[-1]]
    return int((lasts - firsts).sum())


@dataclass
class Row:
    name: str
    count: int
    busy_ns: int                 # union of its intervals
    total_ns: int = 0            # sum of durations (overlaps counted each time)
    nbytes: int = 0
    waits_ns: int = 0

    def to_json(self, active_ns: int) -> dict[str, Any]:
        out = {"name": self.name, "count": self.count, "busy_ns": self.busy_ns, "total_ns": self.total_ns,
               "share": self.busy_ns / active_ns if active_ns else None}
        if self.nbytes:
            out["bytes"] = self.nbytes
            out["bytes_per_s_moving"] = self.nbytes / (self.busy_ns / 1e9) if self.busy_ns else None
        if self.waits_ns:
            out["semaphore_wait_ns"] = self.waits_ns
        return out


@dataclass
class NeuronBreakdown:
    rank: int
    active_ns: int
    engines: list[Row] = field(default_factory=list)
    top: list[Row] = field(default_factory=list)
    dma: list[Row] = field(default_factory=list)
    collectives: list[Row] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "active_ns": self.active_ns,
                **{k: [r.to_json(self.active_ns) for r in getattr(self, k)]
                   for k in ("engines", "top", "dma", "collectives")}}


def _rows(keys: np.ndarray, start: np.ndarray, end: np.ndarray, nbytes: np.ndarray | None = None) -> list[Row]:
    out = []
    for k in np.unique(keys):
        m = keys == k
        out.append(Row(str(k), int(m.sum()), _union_ns(start[m], end[m]), int((end[m] - start[m]).sum()),
                       int(nbytes[m].sum()) if nbytes is not None else 0))
    return sorted(out, key=lambda r: -r.busy_ns)


def neuron_breakdown(spans: pa.Table, rank: int, top_n: int = 10) -> NeuronBreakdown | None:
    """The breakdown of one rank's Neuron spans (None: it has none)."""
    cat = spans["category"].cast(pa.string())
    spans = spans.filter(pc.is_in(cat, value_set=pa.array(CATEGORIES)))
    if spans.num_rows == 0:
        return None
    cat = np.asarray(spans["category"].cast(pa.string()).to_pylist(), dtype=object)
    name = np.asarray(spans["name"].cast(pa.string()).to_pylist(), dtype=object)
    start = spans["start"].cast(pa.int64()).to_numpy()
    end = spans["end"].cast(pa.int64()).to_numpy()
    nbytes = (spans["bytes"].fill_null(0).to_numpy() if "bytes" in spans.column_names
              else np.zeros(len(start), np.int64))
    inst = cat == "neuron_inst"
    upper = np.char.upper(name.astype(str))
    wait = inst & ((np.char.find(upper, "SEMAPHORE") >= 0) | (np.char.find(upper, "WAIT") >= 0))
    work = inst & ~wait
    activity = work | (cat != "neuron_inst")
    active_ns = int(end[activity].max() - start[activity].min()) if activity.any() else 0
    engine = np.asarray([n.split(" ", 1)[0] for n in name], dtype=object)
    b = NeuronBreakdown(rank, active_ns)
    b.engines = _rows(engine[work], start[work], end[work])
    for r in b.engines:
        m = wait & (engine == r.name)
        r.waits_ns = _union_ns(start[m], end[m])
    for e in sorted(set(engine[wait]) - {r.name for r in b.engines}):       # engines that only waited
        m = wait & (engine == e)
        b.engines.append(Row(str(e), 0, 0, waits_ns=_union_ns(start[m], end[m])))
    b.top = sorted(_rows(name[inst], start[inst], end[inst]), key=lambda r: -r.total_ns)[:top_n]
    dma = cat == "neuron_dma"
    queue = np.asarray([n[4:] if n.startswith("DMA ") else n for n in name[dma]], dtype=object)
    b.dma = _rows(queue, start[dma], end[dma], nbytes[dma])
    cc = cat == "neuron_cc"
    b.collectives = _rows(name[cc], start[cc], end[cc], nbytes[cc])
    return b
