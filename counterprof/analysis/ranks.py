"""Across ranks: step times, stragglers, time in collectives, clock skew. Pure: spans in (with
their rank), dataclasses out.

Steps are matched across ranks by name (ProfilerStep#N from torch traces). In a synchronous
job every rank's step lasts about as long (they meet in the collectives), so the straggler is
not the rank with the longest step but the one that arrives last at the collectives: it waits
there least. Per step, the rank with the least collective time is the straggler, and every
other rank's wait for it is its collective time minus the straggler's. Without collectives in
the steps (independent ranks), the straggler is the rank with the longest step.

Clock skew (ranks on different hosts only; one host has one clock): every rank leaves a
collective at nearly the same moment (none can finish before the last contributes), so the
median difference of matched collective end times estimates each host's clock offset. Spans
are aligned by it before steps are compared.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SKEW_REPORT_NS = 1_000_000        # under 1 ms of disagreement is not worth a line


@dataclass
class RankFigures:
    rank: int
    steps: int = 0
    step_mean_s: float | None = None
    slowest_in: int = 0               # steps this rank was the straggler of
    collective_s_per_step: float | None = None
    waited_s_per_step: float | None = None   # estimated wait for the straggler, per step
    collective_s: float = 0.0         # all its time inside collectives
    skew_ms: float | None = None      # its clock minus rank 0's, estimated


@dataclass
class RankAnalysis:
    ranks: list[RankFigures] = field(default_factory=list)
    steps: int = 0                    # steps every rank has
    straggler: int | None = None      # the rank most often slowest
    straggler_lag_s: float | None = None    # its median lag behind the median rank per step
    skew_max_ms: float | None = None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _by_rank(spans: pa.Table, categories: tuple[str, ...]) -> dict[int, dict[str, np.ndarray]]:
    if spans.num_rows == 0 or "rank" not in spans.column_names:
        return {}
    cat = spans["category"].cast(pa.string())
    t = spans.filter(pc.is_in(cat, pa.array(list(categories))))
    out: dict[int, dict[str, np.ndarray]] = {}
    for r in pc.unique(t["rank"]).to_pylist():
        sub = t.filter(pc.equal(t["rank"], r)).sort_by("start")
        out[int(r)] = {"start": sub["start"].cast(pa.int64()).to_numpy(),
                       "end": sub["end"].cast(pa.int64()).to_numpy(),
                       "name": np.array(sub["name"].to_pylist(), dtype=object)}
    return out


def clock_skew(colls: dict[int, dict[str, np.ndarray]]) -> dict[int, int]:
    """rank -> its clock minus the lowest rank's, in ns, from matched collective end times."""
    if len(colls) < 2:
        return {}
    ref = min(colls)
    out = {ref: 0}
    for r, c in colls.items():
        if r == ref:
            continue
        n = min(len(c["end"]), len(colls[ref]["end"]))
        if n == 0:
            continue
        same = c["name"][:n] == colls[ref]["name"][:n]
        if not same.any():
            continue
        out[r] = int(np.median((c["end"][:n] - colls[ref]["end"][:n])[same]))
    return out


def _inside(coll: tuple[np.ndarray, np.ndarray] | None, lo: int, hi: int) -> float:
    """Time a rank's collectives (sorted by start) spent inside [lo, hi)."""
    if coll is None:
        return 0.0
    start, end = coll
    i = int(np.searchsorted(start, hi, "left"))           # collectives starting before hi
    j = max(0, i - 64)                                    # ... overlapping lo: among the last few
    s, e = start[j:i], end[j:i]
    ov = np.minimum(e, hi) - np.maximum(s, lo)
    return float(ov[ov > 0].sum())


def analyze_ranks(spans: pa.Table, hosts: dict[int, str] | None = None) -> RankAnalysis | None:
    """None for a run of one rank. hosts: rank -> host; skew is estimated only across hosts."""
    steps = _by_rank(spans, ("step",))
    colls = _by_rank(spans, ("collective",))
    ranks = sorted(set(steps) | set(colls))
    if len(ranks) < 2:
        return None
    out = RankAnalysis()
    gaps = sorted(set(range(max(ranks) + 1)) - set(ranks))
    if gaps:
        out.notes.append(f"ranks missing from this run: {', '.join(map(str, gaps))} (their partitions "
                         "are absent: a host not merged in, or a rank that never started)")
    several_hosts = len({(hosts or {}).get(r) for r in ranks}) > 1
    skew = clock_skew(colls) if several_hosts else {}
    figures = {r: RankFigures(r) for r in ranks}
    for r, ns in skew.items():
        figures[r].skew_ms = ns / 1e6
    if skew:
        out.skew_max_ms = max(abs(v) for v in skew.values()) / 1e6
        if out.skew_max_ms * 1e6 >= SKEW_REPORT_NS:
            out.notes.append(f"clocks disagree by up to {out.skew_max_ms:.1f} ms (estimated from "
                             "collective end times); spans aligned to the lowest rank's clock")
    for r, c in colls.items():
        figures[r].collective_s = float(np.sum(c["end"] - c["start"])) / 1e9

    # steps matched by name across the ranks that have them all
    named = {r: dict(zip(s["name"], zip(s["start"] - skew.get(r, 0), s["end"] - skew.get(r, 0))))
             for r, s in steps.items()}
    if len(named) >= 2:
        common = set.intersection(*(set(v) for v in named.values()))
        missing = sorted(set(ranks) - set(named))
        if missing:
            out.notes.append(f"ranks without steps: {', '.join(map(str, missing))}")
        out.steps = len(common)
        # each rank's collectives on the aligned clock, searchable by time
        aligned = {r: (c["start"] - skew.get(r, 0), c["end"] - skew.get(r, 0)) for r, c in colls.items()}
        lags = []
        per_rank_coll = {r: [] for r in named}
        per_rank_wait = {r: [] for r in named}
        durations = {r: [] for r in named}
        for name in common:
            d = {r: named[r][name][1] - named[r][name][0] for r in named}
            cs = {r: _inside(aligned.get(r), *named[r][name]) for r in named}
            if any(cs.values()):      # synchronous: last to the collectives waits least
                slow = min(cs, key=cs.get)
                waits = [cs[r] - cs[slow] for r in named if r != slow]
                lags.append((slow, float(np.median(waits)) if waits else 0.0))
            else:                     # independent ranks: the longest step
                slow = max(d, key=d.get)
                lags.append((slow, d[slow] - float(np.median(list(d.values())))))
            figures[slow].slowest_in += 1
            for r in named:
                durations[r].append(d[r])
                per_rank_coll[r].append(cs[r])
                per_rank_wait[r].append(max(0.0, cs[r] - cs[slow]))
        for r in named:
            f = figures[r]
            f.steps = len(durations[r])
            if durations[r]:
                f.step_mean_s = float(np.mean(durations[r])) / 1e9
                f.collective_s_per_step = float(np.mean(per_rank_coll[r])) / 1e9
                f.waited_s_per_step = float(np.mean(per_rank_wait[r])) / 1e9
        if lags:
            counts = {r: figures[r].slowest_in for r in named}
            out.straggler = max(counts, key=counts.get)
            out.straggler_lag_s = float(np.median([lag for r, lag in lags if r == out.straggler])) / 1e9
    out.ranks = [figures[r] for r in ranks]
    return out
