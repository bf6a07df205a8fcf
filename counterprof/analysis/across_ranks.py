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


class _Spans:
    """One kind of span (steps, collectives, windows), every rank's at once, sorted by rank and
    then start (stably: spans starting together keep the table's order): rank r's are the rows
    at[r] = (lo, hi). Names are codes (equal names, equal codes, across ranks) into `names`.
    `ranks`: in the order each first appears in the table."""

    def __init__(self, spans: pa.Table, categories: tuple[str, ...], names: bool = True):
        self.ranks: list[int] = []
        self.at: dict[int, tuple[int, int]] = {}
        self.start = self.end = np.empty(0, np.int64)
        self.name = np.empty(0, np.int32)      # (left empty with names=False)
        self.names: list[str] = []
        if spans.num_rows == 0 or "rank" not in spans.column_names:
            return
        cat = spans["category"]         # (a dictionary's is looked up as it is: not decoded)
        keep = pc.and_(pc.is_in(cat if pa.types.is_dictionary(cat.type) else cat.cast(pa.string()),
                                pa.array(list(categories))), pc.is_valid(spans["rank"]))
        del cat
        t = spans.select(["rank", "start", "end"] + (["name"] if names else [])).filter(keep)
        del keep
        if not t.num_rows:
            return
        rank = t["rank"].cast(pa.int64()).to_numpy()
        start = t["start"].cast(pa.int64()).to_numpy()
        if _in_rank_order(rank, start):     # (a report's rows, read a rank at a time: no copies)
            order = None
            self.start = start
            self.end = t["end"].cast(pa.int64()).to_numpy()
        else:
            order = np.lexsort((start, rank))                  # stable: ties keep the table's order
            self.start = start[order]
            self.end = t["end"].cast(pa.int64()).to_numpy()[order]
            rank = rank[order]
        del start
        if names:
            self.names, codes = _codes(t["name"])
            self.name = codes if order is None else codes[order]
        del t
        cuts = np.flatnonzero(rank[1:] != rank[:-1]) + 1
        los = np.concatenate([[0], cuts]).tolist()
        his = np.concatenate([cuts, [len(rank)]]).tolist()
        at = {int(rank[a]): (a, b) for a, b in zip(los, his)}
        # where each rank first appears
        first = {r: (a if order is None else int(order[a:b].min())) for r, (a, b) in at.items()}
        self.ranks = sorted(at, key=first.__getitem__)
        self.at = {r: at[r] for r in self.ranks}

    def __contains__(self, r: object) -> bool:
        return r in self.at

    def __len__(self) -> int:
        return len(self.at)

    def of(self, r: int) -> dict[str, np.ndarray]:
        """Rank r's spans as clock_skew takes them: start, end and name (codes), as views."""
        a, b = self.at[r]
        return {"start": self.start[a:b], "end": self.end[a:b], "name": self.name[a:b]}

    def by_rank(self) -> dict[int, dict[str, np.ndarray]]:
        return {r: self.of(r) for r in self.ranks}


def _in_rank_order(rank: np.ndarray, start: np.ndarray) -> bool:
    """Are the rows sorted by rank, then start (what a stable lexsort would leave as it is)?"""
    dr = np.diff(rank)
    return bool(np.all((dr > 0) | ((dr == 0) & (np.diff(start) >= 0))))


def _codes(names: pa.ChunkedArray) -> tuple[list[str], np.ndarray]:
    """Names as codes into a list of the distinct ones (int32, one per row)."""
    if pa.types.is_dictionary(names.type) and names.null_count == 0:
        # already codes (a report's spans read a rank at a time): one dictionary for all chunks
        one = pa.table({"n": names}).unify_dictionaries()["n"]
        if not one.num_chunks:
            return [], np.empty(0, np.int32)
        dictionary = one.chunks[0].dictionary
        codes = np.concatenate([c.indices.to_numpy(zero_copy_only=False) for c in one.chunks])
        # distinct names, numbered in their order: as dictionary_encode of the strings numbers them
        used, first = np.unique(codes, return_index=True)
        order = used[np.argsort(first)]
        renumber = np.empty(len(dictionary), np.int32)
        renumber[order] = np.arange(len(order), dtype=np.int32)
        return dictionary.take(pa.array(order)).to_pylist(), renumber[codes]
    enc = pc.dictionary_encode(names.cast(pa.string()))
    chunks = enc.chunks
    if not chunks:
        return [], np.empty(0, np.int32)
    # a chunked array's chunks come out sharing one dictionary; if not, as one array
    if not all(c.dictionary.equals(chunks[-1].dictionary) for c in chunks):
        one = pc.dictionary_encode(names.cast(pa.string()).combine_chunks())
        return one.dictionary.to_pylist(), one.indices.to_numpy(zero_copy_only=False).astype(np.int32)
    codes = np.concatenate([c.indices.to_numpy(zero_copy_only=False) for c in chunks]).astype(np.int32, copy=False)
    return chunks[-1].dictionary.to_pylist(), codes


def _ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The indices lo[k]..hi[k]-1 for every k, one after another."""
    n = np.maximum(hi - lo, 0)
    out: np.ndarray = np.arange(int(n.sum()), dtype=np.int64) + np.repeat(lo - (np.cumsum(n) - n), n)
    return out


def _overlaps(start: np.ndarray, end: np.ndarray, reach: np.ndarray, lo: np.ndarray, hi: np.ndarray,
              most: int = 1 << 22) -> np.ndarray:
    """For each [lo, hi): the summed overlap (ns) of the intervals [start, end) with it (each
    interval on its own: where they overlap each other, counted again). start sorted; reach:
    the running maximum of end. Only the intervals starting before hi that some interval up to
    them reaches past lo are looked at; at most `most` (interval, query) pairs at a time."""
    out = np.zeros(len(lo), np.int64)
    if not len(start) or not len(lo):
        return out
    i = np.searchsorted(start, hi, "left")                 # intervals starting before hi
    j = np.minimum(np.searchsorted(reach, lo, "right"), i)  # ... from the first reaching past lo
    n = i - j
    ends = np.cumsum(n)
    q0 = 0
    while q0 < len(lo):
        # the queries whose pairs fit in `most` (one at least)
        q1 = max(int(np.searchsorted(ends, (ends[q0 - 1] if q0 else 0) + most, "right")), q0 + 1)
        cnt = n[q0:q1]
        if cnt.sum():
            k = _ranges(j[q0:q1], i[q0:q1])
            q = np.repeat(np.arange(q0, q1), cnt)
            ov = np.minimum(end[k], hi[q]) - np.maximum(start[k], lo[q])
            np.maximum(ov, 0, out=ov)
            some = cnt > 0
            firsts = (np.cumsum(cnt) - cnt)[some]
            out[q0:q1][some] = np.add.reduceat(ov, firsts)
        q0 = q1
    return out


def _last_of_each(ids: np.ndarray) -> np.ndarray:
    """The index of each distinct id's last occurrence, in ascending order of the ids."""
    _, back = np.unique(ids[::-1], return_index=True)
    out: np.ndarray = len(ids) - 1 - back
    return out


def _matched_ends(ref: dict[str, np.ndarray], other: dict[str, np.ndarray],
                  ref_steps: dict[str, np.ndarray] | None,
                  other_steps: dict[str, np.ndarray] | None) -> tuple[np.ndarray, np.ndarray]:
    """The end times of the collectives both ranks recorded, paired: within each step both have
    (by its name), when the step holds the same collectives, by name, in the same order, on both
    ranks (a step where one rank lacks some is left out); without steps in common, the whole
    sequences, only when they are the same. Never by position alone: one collective missing
    (a dropped trace window) would pair every later one with its neighbour. Names: strings or
    codes; a step's name recurring on a rank means its last span."""
    a_end: list[np.ndarray] = []
    b_end: list[np.ndarray] = []
    if ref_steps is not None and other_steps is not None and len(ref_steps["name"]) and len(other_steps["name"]):
        # each step's collectives (those starting inside it) as rows i:j of its rank's
        ra, rb = ref_steps, other_steps
        _, code = np.unique(np.concatenate([np.asarray(ra["name"]), np.asarray(rb["name"])]), return_inverse=True)
        ca, cb = code[:len(ra["name"])], code[len(ra["name"]):]
        la, lb = _last_of_each(ca), _last_of_each(cb)
        both, ia, ib = np.intersect1d(ca[la], cb[lb], assume_unique=True, return_indices=True)
        la, lb = la[ia], lb[ib]
        i = np.searchsorted(ref["start"], ra["start"][la], "left")
        j = np.searchsorted(ref["start"], ra["end"][la], "left")
        k = np.searchsorted(other["start"], rb["start"][lb], "left")
        m = np.searchsorted(other["start"], rb["end"][lb], "left")
        keep = (j > i) & (j - i == m - k)
        i, j, k, m = i[keep], j[keep], k[keep], m[keep]
        if len(i):
            ka, kb = _ranges(i, j), _ranges(k, m)
            differ = np.asarray(ref["name"])[ka] != np.asarray(other["name"])[kb]
            firsts = np.cumsum(j - i) - (j - i)
            same = np.add.reduceat(differ.astype(np.int64), firsts) == 0
            if same.any():
                a_end = [ref["end"][_ranges(i[same], j[same])]]
                b_end = [other["end"][_ranges(k[same], m[same])]]
    if not a_end and len(ref["name"]) and len(ref["name"]) == len(other["name"]) \
            and (np.asarray(ref["name"]) == np.asarray(other["name"])).all():
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


def analyze_ranks(spans: pa.Table, hosts: dict[int, str | None] | None = None,
                  world_size: int | str | None = None) -> RankAnalysis | None:
    """None for a run of one rank (of a job of one rank). hosts: rank -> host of every rank
    partition in the run (with or without spans); skew is estimated only across hosts.
    world_size: the job's WORLD_SIZE when known (meta.json's env): ranks up to it that the run
    lacks are named, the highest ones included.

    Every rank at once: the spans sorted by (rank, start) once, each figure a (rank x step)
    array; of ranks equally slow in a step, the first seen in the table is named."""
    steps = _Spans(spans, ("step",))
    colls = _Spans(spans, ("collective",), names=False)       # (their names: for clock skew only)
    ranks = sorted(set(steps.ranks) | set(colls.ranks))
    present = sorted(set(ranks) | {r for r in (hosts or {}) if r >= 0})
    gaps = _missing(present, parse_world_size(world_size))
    if len(ranks) < 2 and not gaps:
        return None
    out = RankAnalysis()
    if gaps:
        out.notes.append(f"ranks missing from this run: {gaps} (their partitions are absent: a host "
                         "not merged in, or a rank that never started or was not profiled)")
    several_hosts = len({(hosts or {}).get(r) for r in ranks}) > 1
    skew: dict[int, int] = {}
    if several_hosts:
        colls = _Spans(spans, ("collective",))
        skew = clock_skew(colls.by_rank(), steps.by_rank())
    if several_hosts and len(colls) and hosts is not None:       # (ranks on the lowest rank's host share its clock)
        ref = min(colls.ranks)
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
    for r in colls.ranks:
        a, b = colls.at[r]
        figures[r].collective_s = float(np.sum(colls.end[a:b] - colls.start[a:b])) / 1e9

    named = steps.ranks                  # the ranks with steps, as first seen
    if len(named) >= 2:
        _compare_steps(out, figures, steps, colls, _Spans(spans, ("window",), names=False), skew, present)
    out.ranks = [figures[r] for r in present]
    return out


def _compare_steps(out: RankAnalysis, figures: dict[int, RankFigures], steps: _Spans, colls: _Spans,
                   windows: _Spans, skew: dict[int, int], present: list[int]) -> None:
    """Steps matched by name across the ranks that have them all (a name recurring on a rank:
    its last step); per step, who was slowest and who waited for it (the module's docstring)."""
    named = steps.ranks
    n = len(named)
    if len(colls):
        # every step is timed, only the traced ones hold their collectives: who waited for
        # whom is read from the steps every rank recorded in a trace window
        lo_m, hi_m = _common_steps(steps, skew, windows)
    else:
        lo_m, hi_m = _common_steps(steps, skew, None)
    missing = sorted(set(present) - set(named))
    if missing:
        out.notes.append(f"ranks without steps: {', '.join(map(str, missing))}")
    m = lo_m.shape[1]
    out.steps = m
    if not m:
        return
    inside = np.zeros((n, m), np.float64)               # time inside collectives, per rank per step
    for x, r in enumerate(named):
        if r not in colls:
            continue
        c = colls.of(r)
        d = skew.get(r, 0)
        inside[x] = _overlaps(c["start"] - d, c["end"] - d, np.maximum.accumulate(c["end"]) - d,
                              lo_m[x], hi_m[x]).astype(np.float64)
    dur = np.subtract(hi_m, lo_m, out=hi_m)
    del lo_m
    cols = np.arange(m)
    synchronous = (inside != 0).any(axis=0)
    # synchronous: the last to the collectives waits least; the others' mean wait for it.
    # independent ranks: the longest step, by how much it exceeds the mean step
    slow = np.where(synchronous, np.argmin(inside, axis=0), np.argmax(dur, axis=0))
    waited = inside - inside[slow, cols]
    lag = np.where(synchronous, waited.sum(axis=0) / (n - 1),
                   dur[slow, cols] - dur.sum(axis=0, dtype=np.float64) / n)
    slowest_in = np.bincount(slow, minlength=n)
    wait = np.maximum(waited, 0.0, out=waited)
    for x, r in enumerate(named):
        f = figures[r]
        f.steps = m
        f.slowest_in += int(slowest_in[x])
        f.step_mean_s = float(np.mean(dur[x])) / 1e9
        f.collective_s_per_step = float(np.mean(inside[x])) / 1e9
        f.waited_s_per_step = float(np.mean(wait[x])) / 1e9
    # the straggler is who cost the others the most time, not who was last most often
    # (a rank 40 ms late every third step outweighs one 1 ms late in the others): the
    # same rank `collectives` names by the others' wait for it, call by call
    cost = np.zeros(n)
    np.add.at(cost, slow, lag)
    best = max(range(n), key=lambda x: (cost[x], figures[named[x]].slowest_in))
    out.straggler = named[best]
    others = [w for r in named if r != out.straggler and (w := figures[r].waited_s_per_step) is not None]
    if inside.any() and others:
        out.straggler_lag_s = float(np.mean(others))
    else:      # independent ranks: the straggler's step over the mean step
        out.straggler_lag_s = float(np.mean(lag[slow == best])) / 1e9


def _common_steps(steps: _Spans, skew: dict[int, int], windows: _Spans | None) -> tuple[np.ndarray, np.ndarray]:
    """The steps every rank has (by name; a name recurring on a rank: its last step), as
    (ranks x steps) arrays of their start and end on the aligned clock: rows in steps.ranks'
    order, columns in the order of the names' codes. With windows: of those, the ones every
    rank traced, where there are any."""
    named = steps.ranks
    n = len(named)
    row = np.empty(len(steps.start), np.int32)          # each step's rank, as its index in `named`
    for x, r in enumerate(named):
        a, b = steps.at[r]
        row[a:b] = x
    n_names = max(len(steps.names), 1)
    last = _last_of_each(row.astype(np.int64) * n_names + steps.name)   # by rank, then name
    row, name = row[last], steps.name[last]
    offset = np.array([skew.get(r, 0) for r in named], np.int64)[row]
    lo, hi = steps.start[last] - offset, steps.end[last] - offset
    del last, offset
    common = np.bincount(name, minlength=n_names) == n
    if windows is not None:
        traced = _traced(row, lo, hi, named, windows)
        common_traced = np.bincount(name[traced], minlength=n_names) == n
        if common_traced.any():
            common = common_traced
    m = int(common.sum())
    column = np.cumsum(common) - 1
    keep = common[name]
    row, at = row[keep], column[name[keep]]
    lo_m = np.empty((n, m), np.int64)
    hi_m = np.empty((n, m), np.int64)
    lo_m[row, at] = lo[keep]
    hi_m[row, at] = hi[keep]
    return lo_m, hi_m


def _traced(row: np.ndarray, lo: np.ndarray, hi: np.ndarray, named: list[int], windows: _Spans) -> np.ndarray:
    """Which steps ([lo, hi), of rank named[row]; sorted by row) lie mostly inside one of their
    rank's trace windows: all of a rank's when it has no window spans (a trace imported
    without one)."""
    out = np.ones(len(row), bool)
    bounds = np.searchsorted(row, np.arange(len(named) + 1))
    for x, r in enumerate(named):
        if r not in windows:
            continue
        w = windows.of(r)
        a, b = bounds[x], bounds[x + 1]
        overlap = _overlaps(w["start"], w["end"], np.maximum.accumulate(w["end"]), lo[a:b], hi[a:b])
        out[a:b] = overlap >= 0.5 * np.maximum(hi[a:b] - lo[a:b], 1)
    return out
