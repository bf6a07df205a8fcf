"""Across ranks: step times, stragglers, time in collectives, clock skew. Pure: spans in (with
their rank), dataclasses out.

Steps are matched across ranks by name (ProfilerStep#N from torch traces). In a synchronous
job every rank's step lasts about as long (they meet in the collectives), so the straggler is
not the rank with the longest step but the one that arrives last at the collectives: it waits
there least. Per step, the rank with the least collective time is the slowest, and every
other rank's wait for it is its collective time minus the slowest's; the run's straggler is
the rank whose lateness cost the others the most time over the steps (not the one slowest
most often). Without collectives in
the steps (independent ranks), the straggler is the rank with the longest step.

Clock skew (ranks on different hosts only; one host has one clock): every rank leaves a
collective at nearly the same moment (none can finish before the last contributes), so the
median difference of matched collective end times estimates each host's clock offset. Spans
are aligned by it before steps are compared. Collectives are matched within the steps both
ranks have, by name and order, and only in steps where both recorded the same ones (never by
position in the whole run: one missing collective would pair every later one with the wrong
one); a rank none of whose collectives match is not aligned, and a note says so.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SKEW_REPORT_NS = 1_000_000        # under 1 ms of disagreement is not worth a line


DEFINITIONS = {
    "steps": "the steps every rank recorded; with collectives, those every rank traced",
    "step_mean_s": "the rank's mean step time over those steps",
    "collective_s_per_step": "time inside collective calls per step (overlapped by its own ops or "
                             "not): the calls' length, not what they cost the step",
    "waited_s_per_step": "per step, how much longer the rank was inside collectives than the "
                         "straggler (which arrived last and waited least): its wait for the straggler",
    "straggler_lag_s": "the mean of the other ranks' waited_s_per_step, over the same steps",
    "verdict shares": "the headline's collectives share is what collectives cost the steps: waits with "
                      "no own op running, plus the CPU the job's communication threads took from the "
                      "main thread (over every step, traced steps carried to the rest)",
}


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
    # the others' mean wait for the straggler per step, over the same steps as the ranks table
    # (the `steps` every rank has, traced ones where there are collectives): the mean of the
    # other ranks' waited_s_per_step, so the bullet and the table say one number
    straggler_lag_s: float | None = None
    skew_max_ms: float | None = None
    notes: list[str] = field(default_factory=list)
    # what each figure is, and over which steps: report --json states it with the figures
    definitions: dict[str, str] = field(default_factory=lambda: dict(DEFINITIONS))

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


def _traced_steps(steps: dict[str, tuple[int, int]], windows: dict[str, np.ndarray] | None) -> set[str]:
    """The steps (name -> (start, end)) most of which lie inside one of the trace windows; all
    of them when the rank has no window spans (a trace imported without one)."""
    if not windows or not len(windows["start"]):
        return set(steps)
    lo, hi = windows["start"], windows["end"]
    out = set()
    for name, (a, b) in steps.items():
        overlap = np.clip(np.minimum(b, hi) - np.maximum(a, lo), 0, None).sum()
        if overlap >= 0.5 * max(b - a, 1):
            out.add(name)
    return out


def _matched_ends(ref: dict[str, np.ndarray], other: dict[str, np.ndarray],
                  ref_steps: dict[str, np.ndarray] | None,
                  other_steps: dict[str, np.ndarray] | None) -> tuple[np.ndarray, np.ndarray]:
    """The end times of the collectives both ranks recorded, paired: within each step both have
    (by its name), when the step holds the same collectives, by name, in the same order, on both
    ranks (a step where one rank lacks some is left out); without steps in common, the whole
    sequences, only when they are the same. Never by position alone: one collective missing
    (a dropped trace window) would pair every later one with its neighbour."""
    def per_step(c: dict[str, np.ndarray], s: dict[str, np.ndarray]) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        for name, lo, hi in zip(s["name"], s["start"], s["end"]):
            i, j = np.searchsorted(c["start"], [lo, hi], "left")
            out[name] = (i, j)
        return out

    a_end, b_end = [], []
    if ref_steps is not None and other_steps is not None:
        ra, rb = per_step(ref, ref_steps), per_step(other, other_steps)
        for name in ra.keys() & rb.keys():
            (i, j), (k, m) = ra[name], rb[name]
            if j - i and j - i == m - k and (ref["name"][i:j] == other["name"][k:m]).all():
                a_end.append(ref["end"][i:j])
                b_end.append(other["end"][k:m])
    if not a_end and len(ref["name"]) and len(ref["name"]) == len(other["name"]) \
            and (ref["name"] == other["name"]).all():
        a_end, b_end = [ref["end"]], [other["end"]]
    if not a_end:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return np.concatenate(a_end), np.concatenate(b_end)


def clock_skew(colls: dict[int, dict[str, np.ndarray]],
               steps: dict[int, dict[str, np.ndarray]] | None = None) -> dict[int, int]:
    """rank -> its clock minus the lowest rank's, in ns, from matched collective end times
    (see _matched_ends). A rank whose collectives cannot be matched with the lowest rank's is
    left out: its clock is not estimated."""
    if len(colls) < 2:
        return {}
    steps = steps or {}
    ref = min(colls)
    out = {ref: 0}
    for r, c in colls.items():
        if r == ref:
            continue
        a, b = _matched_ends(colls[ref], c, steps.get(ref), steps.get(r))
        if len(a):
            out[r] = int(np.median(b - a))
    return out if len(out) > 1 else {}


def parse_world_size(value: Any) -> int | None:
    """WORLD_SIZE as meta.json's env records it (a string), or None when absent or not a
    positive number."""
    text = str(value).strip() if isinstance(value, (int, str)) else ""
    n = int(text) if re.fullmatch(r"[0-9]+", text) else 0
    return n if n > 0 else None


def rank_ranges(ranks: list[int] | list[tuple[int, int]]) -> str:
    """[0, 1, 2, 5] (sorted) or [(0, 2), (5, 5)] -> "0-2, 5"."""
    pairs: list[list[int]] = []
    for item in ranks:
        a, b = item if isinstance(item, tuple) else (item, item)
        if pairs and a == pairs[-1][1] + 1 and not isinstance(item, tuple):
            pairs[-1][1] = b
        else:
            pairs.append([a, b])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in pairs)


def _missing(present: list[int], world: int | None) -> str:
    """The ranks below the world size (else below the highest rank present) that are not
    present, as ranges; cheap however large the world size."""
    end = world if world is not None else (max(present) + 1 if present else 0)
    out, at = [], 0
    for r in sorted(set(present)):
        if r >= end:
            break
        if r > at:
            out.append(str(at) if r - 1 == at else f"{at}-{r - 1}")
        at = r + 1
    if at < end:
        out.append(str(at) if end - 1 == at else f"{at}-{end - 1}")
    return ", ".join(out)


def _inside(coll: tuple[np.ndarray, np.ndarray, np.ndarray] | None, lo: int, hi: int) -> float:
    """Time a rank's collectives spent inside [lo, hi). coll: (start sorted, end, the running
    maximum of end) -- before the first index whose running end exceeds lo, none reaches it."""
    if coll is None:
        return 0.0
    start, end, end_bound = coll
    i = int(np.searchsorted(start, hi, "left"))           # collectives starting before hi
    j = int(np.searchsorted(end_bound[:i], lo, "right"))  # ... and ending after lo
    s, e = start[j:i], end[j:i]
    ov = np.minimum(e, hi) - np.maximum(s, lo)
    return float(ov[ov > 0].sum())


def analyze_ranks(spans: pa.Table, hosts: dict[int, str | None] | None = None,
                  world_size: int | str | None = None) -> RankAnalysis | None:
    """None for a run of one rank (of a job of one rank). hosts: rank -> host of every rank
    partition in the run (with or without spans); skew is estimated only across hosts.
    world_size: the job's WORLD_SIZE when known (meta.json's env): ranks up to it that the run
    lacks are named, the highest ones included."""
    steps = _by_rank(spans, ("step",))
    colls = _by_rank(spans, ("collective",))
    windows = _by_rank(spans, ("window",))
    ranks = sorted(set(steps) | set(colls))
    present = sorted(set(ranks) | {r for r in (hosts or {}) if r >= 0})
    gaps = _missing(present, parse_world_size(world_size))
    if len(ranks) < 2 and not gaps:
        return None
    out = RankAnalysis()
    if gaps:
        out.notes.append(f"ranks missing from this run: {gaps} (their partitions are absent: a host "
                         "not merged in, or a rank that never started or was not profiled)")
    several_hosts = len({(hosts or {}).get(r) for r in ranks}) > 1
    skew = clock_skew(colls, steps) if several_hosts else {}
    if several_hosts and colls and hosts is not None:       # (ranks on the lowest rank's host share its clock)
        ref = min(colls)
        lost = [r for r in ranks if r not in skew and hosts.get(r) != hosts.get(ref)]
        if lost:
            out.notes.append(f"clock skew not estimated: ranks {ref} and {rank_ranges(lost)} recorded "
                             "different collectives (no step holds the same ones on both): their "
                             "spans are compared on their own clocks")
    figures = {r: RankFigures(r) for r in present}
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
        if colls:
            # every step is timed, only the traced ones hold their collectives: who waited for
            # whom is read from the steps every rank recorded in a trace window
            traced = {r: _traced_steps(named[r], windows.get(r)) for r in named}
            common_traced = set.intersection(*traced.values())
            if common_traced:
                common = common_traced
        missing = sorted(set(present) - set(named))
        if missing:
            out.notes.append(f"ranks without steps: {', '.join(map(str, missing))}")
        out.steps = len(common)
        # each rank's collectives on the aligned clock, searchable by time
        aligned = {r: (c["start"] - skew.get(r, 0), c["end"] - skew.get(r, 0),
                       np.maximum.accumulate(c["end"]) - skew.get(r, 0)) for r, c in colls.items()}
        lags = []
        per_rank_coll: dict[int, list[float]] = {r: [] for r in named}
        per_rank_wait: dict[int, list[float]] = {r: [] for r in named}
        durations: dict[int, list[float]] = {r: [] for r in named}
        for name in common:
            d = {r: named[r][name][1] - named[r][name][0] for r in named}
            cs = {r: _inside(aligned.get(r), *named[r][name]) for r in named}
            if any(cs.values()):      # synchronous: last to the collectives waits least
                slow = min(cs, key=cs.__getitem__)
                waits = [cs[r] - cs[slow] for r in named if r != slow]
                lags.append((slow, float(np.mean(waits)) if waits else 0.0))
            else:                     # independent ranks: the longest step
                slow = max(d, key=d.__getitem__)
                lags.append((slow, d[slow] - float(np.mean(list(d.values())))))
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
            # the straggler is who cost the others the most time, not who was last most often
            # (a rank 40 ms late every third step outweighs one 1 ms late in the others): the
            # same rank `collectives` names by the others' wait for it, call by call
            cost = {r: 0.0 for r in named}
            for slow, lag in lags:
                cost[slow] += lag
            out.straggler = max(cost, key=lambda r: (cost[r], figures[r].slowest_in))
            others = [w for r in named if r != out.straggler and (w := figures[r].waited_s_per_step) is not None]
            if any(any(c) for c in per_rank_coll.values()) and others:
                out.straggler_lag_s = float(np.mean(others))
            else:      # independent ranks: the straggler's step over the mean step
                out.straggler_lag_s = float(np.mean([lag for r, lag in lags if r == out.straggler])) / 1e9
    out.ranks = [figures[r] for r in present]
    return out
