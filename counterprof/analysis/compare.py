"""`counterprof compare`'s statistics, as pure functions: numbers in, numbers out.

For each compared quantity (step time, each region's time, each metric per rank and over all
ranks) the two sides are sets of values: one per step or region occurrence, or one per metric
window (analysis/run_figures.py). The comparison is the **relative change of the median**,
median(candidate) / median(baseline) - 1 (the median, because steps have outliers: the first
step compiles, a checkpoint step writes), with a **percentile bootstrap confidence interval**
(Efron & Tibshirani, "An Introduction to the Bootstrap", 1993, ch. 13): resample each side with
replacement, take the ratio of the two medians, and read the interval from the resampled ratios'
percentiles. With several runs on a side the bootstrap has two stages (Davison & Hinkley,
"Bootstrap Methods and their Application", 1997, sec. 3.8): resample the runs, then values
within each chosen run, so the interval carries the run-to-run noise, not only the step-to-step
noise. Every row draws from its own generator, seeded from the seed and the row's name, so a
result does not depend on which other rows were compared.

Each compared quantity gets one **status**, from its interval and a band of "too small to
matter": the threshold (default 3%), for a region's time at least the noise floor (default 0.1
ms per occurrence: below it, a region of a few µs moves by tens of percent with the machine's
scheduling, and whatever it costs shows in the step time, which has no floor) over its median:
  regression / improvement   a time (step, region, wall time) whose interval excludes 0 and whose
                             median moved by at least the band: longer is a regression
  changed                    a counter or gauge whose whole interval lies beyond the band (more
                             instructions per second can mean faster or more wasteful code)
  context                    a reading of the machine (system.*, run delay) that moved: shown,
                             never flagged
  unchanged                  the whole interval lies inside the band: if it moved, by less than
                             what matters
  inconclusive               neither: the interval holds both "no change that matters" and a change
                             beyond the band (e.g. +631% [-8%, +1301%]): too wide to call; more
                             runs or steps narrow it
  too few values, no relative change, only in baseline / candidate: what they say.
A count that is too small to resolve a change (fewer than MIN_EVENTS events, or of CPU time
fewer than MIN_EVENTS clock ticks) is inconclusive when it would be flagged: quantized readings
give wide, lumpy intervals. Directions come from DIRECTIONS, the one table.

**Contention** (explain()): a regressed or improved time whose slower side's main thread waited
for a CPU much more (run_figures.Contention, per scope) is explained by the machine when the
added wait accounts for the change: with the wait taken out, (1 + change) x (1 - wait_c) /
(1 - wait_b) - 1, what is left is under the threshold or half of what the wait implies,
and the workload's own CPU use did not rise with the wait (its own threads would be the
competition). The cut-offs are in thresholds.py (contention_*). The CI gate does not fail on an
explained regression unless it is strict.
"""
from __future__ import annotations

import fnmatch
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .compare_bootstrap import CONFIDENCE, RESAMPLES, Change, Job, median_change, median_changes
from .run_figures import STEP, Contention, RunFigures, verdict_word
from ..ground.thresholds import value

WALL = "wall_time"

THRESHOLD = 0.03
MIN_TIME_CHANGE_S = 1e-4   # a region's median must move by this much to be flagged
MIN_EVENTS = 100           # a count (or tick-quantized CPU time) below this many units is too coarse
TICK_S = 0.01              # /proc's CPU times are in clock ticks (USER_HZ = 100 on Linux)
TICKED = ("metric:proc.cpu_user", "metric:proc.cpu_system")
MIN_VALUES = 5             # fewer values on a side: shown, never flagged (too few to resample)

# What "up" means, first match wins (fnmatch on the row's key). Only what is clearly known gets
# a direction: time a piece of the workload took. Counters and gauges say what changed, not
# whether it got better (more instructions per second can mean faster or more wasteful code).
#   lower:   lower is better: up beyond the threshold is a regression, down an improvement
#   either:  a flagged change is "changed"
#   context: measures the machine, not the workload (other jobs move it): shown, never flagged
DIRECTIONS: list[tuple[str, str, str]] = [
    (STEP, "lower", "a step's wall time: longer steps are slower training"),
    (WALL, "lower", "the workload's wall time, one value per run"),
    ("region:*", "lower", "a region's wall time per occurrence"),
    ("metric:gpu.throttle_time_*", "lower", "time the GPU's clocks were held down"),
    ("metric:system.*", "context", "machine-wide readings: other load on the host moves them"),
    ("metric:proc.run_delay", "context", "time runnable but waiting for a CPU: other load on the host"),
    ("metric:thread.*.runnable", "context", "a thread's time runnable but waiting for a CPU: other load"),
    ("metric:roofline.*", "either", "MFU and FLOP/s per traced step: fewer FLOPs per step (a smaller "
     "model) moves them as much as slower kernels; the step time says which"),
    ("metric:*", "either", "rates of counters and means of gauges: a change, not a verdict"),
]


def direction_of(key: str) -> str:
    for pattern, direction, _ in DIRECTIONS:
        if fnmatch.fnmatchcase(key, pattern):
            return direction
    return "either"


# ---- the statistics --------------------------------------------------------------------------

def judge(ch: Change, direction: str, threshold: float = THRESHOLD, min_abs: float = 0.0) -> str:
    """The status (module docstring): regression | improvement | changed (flagged); context;
    unchanged; inconclusive; too few values; no relative change (baseline median 0).
    min_abs: the smallest move of the median, in the quantity's unit, that matters."""
    return judgement(ch, direction, threshold, min_abs)[0]


def band_of(ch: Change, threshold: float, min_abs: float) -> float:
    """The relative change too small to matter: the threshold, or the floor over the median."""
    if min_abs > 0 and ch.base_median:
        return max(threshold, min_abs / abs(ch.base_median))
    return threshold


def judgement(ch: Change, direction: str, threshold: float = THRESHOLD,
              min_abs: float = 0.0) -> tuple[str, str]:
    """judge()'s status, and why when that is not plain from the figures ("" otherwise)."""
    if min(ch.n_base, ch.n_cand) < MIN_VALUES:
        return "too few values", f"fewer than {MIN_VALUES} values on a side"
    if ch.change is None or ch.ci is None:
        if ch.cand_median == ch.base_median:
            return "unchanged", ""
        return "no relative change", "the baseline's median is 0"
    lo, hi = ch.ci
    band = band_of(ch, threshold, min_abs)
    if -band < lo and hi < band:
        if band > threshold and not (-threshold < lo and hi < threshold):
            return "unchanged", f"moved less than the {min_abs * 1e3:g} ms noise floor"
        return "unchanged", ""
    if direction == "either":       # a counter: its whole interval beyond the band
        beyond = lo >= band or hi <= -band
    else:                           # a time: the interval excludes 0, the median beyond the band
        beyond = (lo > 0 or hi < 0) and abs(ch.change) >= band
    if not beyond:
        return "inconclusive", f"interval too wide to call: it reaches both inside and beyond ±{100 * band:.3g}%"
    if direction == "context":
        return "context", ""      # it moved, but it measures the machine: never flagged
    if direction == "lower":
        return ("regression" if ch.change > 0 else "improvement"), ""
    return "changed", ""


FLAGGED = ("regression", "improvement", "changed")


# ---- a whole comparison ----------------------------------------------------------------------

@dataclass
class Row:
    key: str                       # step_time | region:NAME | metric:NAME
    rank: int | None               # None: every rank (pooled), or the only one
    unit: str
    direction: str
    status: str                    # judge()'s, or "only in baseline" / "only in candidate"
    base_median: float | None = None
    cand_median: float | None = None
    change: float | None = None
    ci: tuple[float, float] | None = None
    n_base: int = 0
    n_cand: int = 0
    base_total: float | None = None    # deltas: the run's total (mean over a side's runs)
    cand_total: float | None = None
    verdict: tuple[str, str] | None = None   # the classifier's (baseline, candidate) for this scope
    note: str = ""
    # contention (explain()): "explains" | "partly" | "own" (the workload's own threads may be the
    # competition) | "" (the slower side did not wait more for a CPU, or no wait figures)
    contention: str = ""
    wait: tuple[float, float] | None = None          # the scope's CPU wait share, (baseline, candidate)
    adjusted_change: float | None = None             # the change with the CPU wait taken out
    adjusted_ci: tuple[float, float] | None = None

    @property
    def flagged(self) -> bool:
        return self.status in FLAGGED

    @property
    def explained(self) -> bool:
        """A flagged time that contention explains (the gate lets it pass unless strict)."""
        return self.flagged and self.contention == "explains"


@dataclass
class Side:
    paths: list[str]
    ids: list[str]
    command: list[str]
    ranks: list[list[int]]
    verdicts: list[str]            # each run's overall verdict, described
    verdict: str                   # the most common one


@dataclass
class Machine:
    """How busy the machine was for each side (the median over its runs), and how that moved."""
    baseline: Contention
    candidate: Contention
    scope: str = ""                       # whose waits wait_change compares: the steps', else the run's
    wait_change: float | None = None      # that CPU wait share, candidate - baseline
    other_change: float | None = None     # other processes' share of the machine's CPUs, c - b
    own_change: float | None = None       # the workload's own CPU use (CPUs), c - b
    moved: bool = False                   # a wait or the others' CPU moved beyond its cut-off
    busier: str = ""                      # "candidate" | "baseline": whose machine was busier: its
    #                                       main thread waited more (and not for its own threads),
    #                                       or, the waits unmoved, other processes used more CPU

    def to_json(self) -> dict[str, Any]:
        def side(c: Contention) -> dict[str, Any]:
            return {**asdict(c), "other_cpus": c.other_cpus, "other_share": c.other_share}
        return {"baseline": side(self.baseline), "candidate": side(self.candidate),
                "scope": self.scope, "wait_change": self.wait_change, "other_change": self.other_change,
                "own_change": self.own_change, "moved": self.moved, "busier": self.busier,
                "cut_offs": {k: value(k) for k in CONTENTION_CUT_OFFS}}


CONTENTION_CUT_OFFS = ("contention_wait_points", "contention_unexplained_share", "contention_own_share",
                       "contention_other_share")


@dataclass
class Comparison:
    baseline: Side
    candidate: Side
    settings: dict[str, Any]
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)   # why a side cannot be trusted: a failed
    #                                                     workload, lost steps (fail a CI gate too)
    machine: Machine | None = None

    @property
    def regressions(self) -> list[Row]:
        """Every regression, explained by contention or not."""
        return [r for r in self.rows if r.status == "regression"]

    @property
    def failing(self) -> list[Row]:
        """The regressions that fail the gate: all when strict, else those contention does not
        explain."""
        strict = self.settings.get("strict", False)
        return [r for r in self.regressions if strict or not r.explained]

    @property
    def inconclusive(self) -> list[Row]:
        return [r for r in self.rows if r.status == "inconclusive"]

    @property
    def flagged(self) -> list[Row]:
        return [r for r in self.rows if r.flagged]

    @property
    def failed(self) -> bool:
        """The gate's answer (--fail-on-regression): a failing regression or a run problem."""
        return bool(self.failing or self.problems)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["machine"] = self.machine.to_json() if self.machine else None
        out["regressions"] = len(self.regressions)
        out["explained_by_contention"] = sum(1 for r in self.rows if r.explained)
        out["inconclusive"] = len(self.inconclusive)
        out["failed"] = self.failed
        out["flagged"] = len(self.flagged)
        out["directions"] = [{"pattern": p, "direction": d, "why": w} for p, d, w in DIRECTIONS]
        return out


def _side(runs: list[RunFigures]) -> Side:
    words = [(verdict_word(r.verdict) or "none") for r in runs]
    common = Counter(words).most_common(1)[0][0] if words else "none"
    return Side([r.path for r in runs], [r.run_id for r in runs], runs[0].command if runs else [],
                [r.ranks for r in runs], words, common)


def _gather(runs: list[RunFigures], key: str, rank: int | None) -> list[np.ndarray]:
    """One value array per run that has this quantity. Rank None, all ranks: for a step or region
    that every rank ran equally often, the ranks' mean per occurrence (in a synchronous job the
    ranks' steps are one step each: pooling them would count each step once per rank and make
    the interval too narrow); otherwise the ranks' values pooled."""
    out = []
    for r in runs:
        by_rank = r.times.get(key) if not key.startswith("metric:") else r.metrics.get(key[7:])
        if not by_rank:
            continue
        if rank is None:
            arrays = [a for a in by_rank.values() if len(a)]
            if arrays and not key.startswith("metric:") and len({len(a) for a in arrays}) == 1:
                out.append(np.mean(np.vstack(arrays), axis=0))
            elif arrays:
                out.append(np.concatenate(arrays))
        elif rank in by_rank and len(by_rank[rank]):
            out.append(by_rank[rank])
    return out


def _total(runs: list[RunFigures], metric: str, rank: int | None) -> float | None:
    vals = []
    for r in runs:
        t = r.totals.get(metric)
        if not t:
            continue
        if rank is None:
            vals.append(sum(t.values()))
        elif rank in t:
            vals.append(t[rank])
    return float(np.mean(vals)) if vals else None


def _scope_verdict(runs: list[RunFigures], key: str) -> str | None:
    words = [(verdict_word(r.scope_verdicts[key]) or "none") for r in runs if key in r.scope_verdicts]
    return Counter(words).most_common(1)[0][0] if words else None


def compare(baseline: list[RunFigures], candidate: list[RunFigures], threshold: float = THRESHOLD,
            resamples: int = RESAMPLES, confidence: float = CONFIDENCE, seed: int = 0,
            min_time_change_s: float = MIN_TIME_CHANGE_S, strict: bool = False,
            workers: int | None = None) -> Comparison:
    """Every quantity either side has, per rank and (multi-rank runs) over all ranks. Nothing is
    dropped: a quantity one side lacks is a row that says so. strict: the gate fails on every
    regression, contention or not. workers: processes for the bootstrap (None: every CPU; the
    output is the same with any number)."""
    cmp = Comparison(_side(baseline), _side(candidate), {
        "threshold": threshold, "resamples": resamples, "confidence": confidence, "seed": seed,
        "statistic": "relative change of the median, percentile bootstrap interval",
        "window_s": max([r.window_s for r in baseline + candidate] or [0.0]),
        "min_values": MIN_VALUES, "min_time_change_s": min_time_change_s, "strict": strict})
    b_ranks = sorted({x for r in baseline for x in r.ranks})
    c_ranks = sorted({x for r in candidate for x in r.ranks})
    multi = len(b_ranks) > 1 or len(c_ranks) > 1
    if b_ranks != c_ranks:
        cmp.notes.append(
            f"different ranks: baseline {_ranks_text(b_ranks)}, candidate {_ranks_text(c_ranks)}; "
            "rows of ranks on one side only say so, and the all-ranks rows pool different rank sets")
    for side, runs in (("baseline", baseline), ("candidate", candidate)):
        counts = sorted({len(r.ranks) for r in runs})
        if len(counts) > 1:
            cmp.notes.append(f"the {side} runs have different rank counts ({', '.join(map(str, counts))})")
    ranks = sorted(set(b_ranks) | set(c_ranks))

    time_keys = sorted({k for r in baseline + candidate for k in r.times}, key=lambda k: (k != STEP, k))
    metric_keys = sorted({f"metric:{m}" for r in baseline + candidate for m in r.metrics})
    units: dict[str, str] = {}
    for r in baseline + candidate:
        for m, u in r.units.items():
            units.setdefault(f"metric:{m}", u)
    pending: list[tuple[Row, Job]] = []      # rows whose bootstrap is still to run
    for key in time_keys + metric_keys:
        unit = "s" if not key.startswith("metric:") else units.get(key, "")
        direction = direction_of(key)
        verdict = None
        if not key.startswith("metric:"):
            vb, vc = _scope_verdict(baseline, key), _scope_verdict(candidate, key)
            if vb or vc:
                verdict = (vb or "none", vc or "none")
        with_data = [r for r in ranks if _gather(baseline, key, r) or _gather(candidate, key, r)]
        # the all-ranks row where several ranks have it; per-rank rows in multi-rank runs
        scopes = ([None] if len(with_data) != 1 or not multi else []) + (with_data if multi else [])
        for rank in scopes:
            b, c = _gather(baseline, key, rank), _gather(candidate, key, rank)
            if not b and not c:
                continue
            row = Row(key, rank, unit, direction, "", verdict=verdict if rank == scopes[0] else None)
            if key.startswith("metric:"):
                row.base_total, row.cand_total = _total(baseline, key[7:], rank), _total(candidate, key[7:], rank)
            if not b or not c:
                row.status = "only in candidate" if not b else "only in baseline"
                vals = np.concatenate(b or c)
                if row.status == "only in candidate":
                    row.cand_median, row.n_cand = float(np.median(vals)), len(vals)
                else:
                    row.base_median, row.n_base = float(np.median(vals)), len(vals)
                cmp.rows.append(row)
                continue
            cmp.rows.append(row)
            pending.append((row, (b, c, f"{key}@{rank}")))
    # every row's bootstrap at once: a big comparison's rows go to every CPU (compare_bootstrap.py)
    changes = median_changes([job for _, job in pending], resamples, confidence, seed, workers)
    for (row, _), ch in zip(pending, changes):
        row.base_median, row.cand_median, row.change, row.ci = ch.base_median, ch.cand_median, ch.change, ch.ci
        row.n_base, row.n_cand = ch.n_base, ch.n_cand
        floor = min_time_change_s if row.key.startswith("region:") else 0.0
        row.status, row.note = judgement(ch, row.direction, threshold, floor)
        coarse = _too_coarse(row)
        if coarse and row.status in FLAGGED:
            row.status, row.note = "inconclusive", coarse
    del pending
    wall = _wall_row(baseline, candidate, threshold, resamples, confidence, seed)
    if wall is not None:
        at = sum(1 for r in cmp.rows if r.key == STEP)
        cmp.rows.insert(at, wall)
    if baseline and candidate:
        cmp.machine = machine(baseline, candidate)
        for row in cmp.rows:
            if not row.key.startswith("metric:"):
                explain(row, cmp.machine, threshold)
    cmp.problems.extend(_problems(baseline, candidate))
    if len(baseline) == 1 and len(candidate) == 1:
        cmp.notes.append("one run a side: the intervals carry no run-to-run noise (identical runs on a "
                         "shared machine can differ by several percent); for a CI gate compare sets of "
                         "runs (--baseline/--candidate, 3 or more each) or set --threshold above the "
                         "noise you measured")
    missing_b = sorted({k for k in metric_keys if not any(k[7:] in r.metrics for r in baseline)})
    missing_c = sorted({k for k in metric_keys if not any(k[7:] in r.metrics for r in candidate)})
    for side, keys in (("baseline", missing_b), ("candidate", missing_c)):
        if keys:
            cmp.notes.append(f"metrics the {side} does not have: " + ", ".join(k[7:] for k in keys))
    if not any(r.times for r in baseline + candidate):
        cmp.notes.append("no steps or regions in either side (mark them with counterprof.region(), "
                         "counterprof.step() or --torch): metrics only")
    return cmp


def _median(vals: list[float | None]) -> float | None:
    known = [v for v in vals if v is not None]
    return float(np.median(known)) if known else None


def side_contention(runs: list[RunFigures]) -> Contention:
    """A side's Contention: each figure's median over its runs."""
    cs = [r.contention for r in runs]
    sources = Counter(c.wait_source for c in cs if c.wait_source)
    scopes = sorted({k for c in cs for k in c.waits})
    return Contention(
        wait_source=sources.most_common(1)[0][0] if sources else "",
        waits={k: w for k in scopes if (w := _median([c.waits.get(k) for c in cs])) is not None},
        main_threads=_median([c.main_threads for c in cs if c.wait_source]) or 0.0,
        workload_cpus=_median([c.workload_cpus for c in cs]), busy_cpus=_median([c.busy_cpus for c in cs]),
        cpus=max((c.cpus for c in cs if c.cpus), default=None))


def machine(baseline: list[RunFigures], candidate: list[RunFigures]) -> Machine:
    b, c = side_contention(baseline), side_contention(candidate)
    m = Machine(b, c)
    m.scope = next((k for k in (STEP, "run") if k in b.waits and k in c.waits), "")
    if m.scope:        # the steps are what is compared first; the run holds start-up and the end
        m.wait_change = c.waits[m.scope] - b.waits[m.scope]
    if b.other_share is not None and c.other_share is not None:
        m.other_change = c.other_share - b.other_share
    if b.workload_cpus is not None and c.workload_cpus is not None:
        m.own_change = c.workload_cpus - b.workload_cpus
    wait, other = m.wait_change, m.other_change
    waited = wait is not None and abs(wait) >= value("contention_wait_points")
    others = other is not None and abs(other) >= value("contention_other_share")
    m.moved = waited or others
    if wait is not None and waited and not _own_threads(m, 1.0 if wait > 0 else -1.0, abs(wait)):
        m.busier = "candidate" if wait > 0 else "baseline"
    elif other is not None and others and not waited:
        m.busier = "candidate" if other > 0 else "baseline"
    return m


def _own_threads(m: Machine, sign: float, added: float) -> bool:
    """Whether the workload's own CPU use rose (on the side that waited more: sign) by
    contention_own_share of the added wait, in CPUs, or more: its own threads may be what its
    main threads waited for."""
    threads = max(m.baseline.main_threads, m.candidate.main_threads, 1.0)
    return m.own_change is not None and m.own_change * sign >= value("contention_own_share") * added * threads


def explain(row: Row, m: Machine, threshold: float = THRESHOLD) -> None:
    """Whether contention explains a regressed or improved time (sets row.contention, .wait and
    the change with the wait taken out). The slower side's main thread must have waited for a CPU
    at least contention_wait_points more of the scope's time; the workload's own CPU use must
    not have risen by contention_own_share of that added wait (else its own threads may be what
    it waited for); and the added wait must account for the change: a thread's time is running
    + blocked + waiting, so with the first two unchanged what is left of the change once the
    wait is taken out, (1 + change) x (1 - wait_c) / (1 - wait_b) - 1, is 0; it must be under the
    threshold or under contention_unexplained_share of the change the wait alone implies,
    (1 - wait_b) / (1 - wait_c) - 1 (sharing a core also lengthens the on-CPU time: caches and
    TLBs refilled after each switch). Else "partly"."""
    scope = "run" if row.key == WALL else row.key
    wb = m.baseline.waits.get(scope, m.baseline.waits.get("run"))
    wc = m.candidate.waits.get(scope, m.candidate.waits.get("run"))
    if wb is None or wc is None:
        return
    row.wait = (wb, wc)
    if row.status not in ("regression", "improvement") or not row.change or max(wb, wc) >= 1:
        return
    sign = 1.0 if row.status == "regression" else -1.0      # the slower side should have waited more
    added = (wc - wb) * sign
    if added < value("contention_wait_points"):
        return
    k = (1 - wc) / (1 - wb)
    row.adjusted_change = (1 + row.change) * k - 1
    if row.ci is not None:
        row.adjusted_ci = ((1 + row.ci[0]) * k - 1, (1 + row.ci[1]) * k - 1)
    if _own_threads(m, sign, added):
        row.contention = "own"
        return
    implied = abs(1 / k - 1)
    allowed = max(threshold, value("contention_unexplained_share") * implied)
    row.contention = "explains" if row.adjusted_change * sign < allowed else "partly"


def _too_coarse(row: Row) -> str:
    """Why a counter's change cannot be resolved ("" when it can): too few events, or too few
    clock ticks of CPU time, on both sides."""
    if not row.key.startswith("metric:") or row.base_total is None or row.cand_total is None:
        return ""
    most = max(abs(row.base_total), abs(row.cand_total))
    if row.key in TICKED and most < MIN_EVENTS * TICK_S:
        return f"under {MIN_EVENTS} clock ticks of CPU time a side: too coarse to compare"
    if row.unit == "/s" and most < MIN_EVENTS:
        return f"under {MIN_EVENTS} events a side: too few to compare"
    return ""


def _wall_row(baseline: list[RunFigures], candidate: list[RunFigures], threshold: float,
              resamples: int, confidence: float, seed: int) -> Row | None:
    """The workload's wall time (launched workloads: meta.json's workload.elapsed_s), one value
    per run: judged only with MIN_VALUES runs a side, shown always."""
    b = [np.array([r.workload_wall_s]) for r in baseline if r.workload_wall_s is not None]
    c = [np.array([r.workload_wall_s]) for r in candidate if r.workload_wall_s is not None]
    if not b or not c:
        return None
    ch = median_change(b, c, resamples, confidence, seed, WALL)
    row = Row(WALL, None, "s", "lower", judge(ch, "lower", threshold), ch.base_median, ch.cand_median,
              ch.change, ch.ci, ch.n_base, ch.n_cand)
    if row.status == "too few values":
        row.ci = None         # an interval from one or two values a side would mean nothing
        row.note = f"one value per run: judged with {MIN_VALUES} or more runs a side"
    return row


def _problems(baseline: list[RunFigures], candidate: list[RunFigures]) -> list[str]:
    """What makes a side's figures untrustworthy: its workload failed, or it lost steps."""
    out = []
    for side, runs in (("baseline", baseline), ("candidate", candidate)):
        for r in runs:
            w = r.workload
            if w.signal:
                out.append(f"the {side} run {r.run_id}'s workload was killed by signal {w.signal}")
            elif w.exit_status not in (None, 0):
                out.append(f"the {side} run {r.run_id}'s workload exited with status {w.exit_status}")
    steps = {side: [sum(len(a) for a in r.times.get(STEP, {}).values()) / max(1, len(r.ranks)) for r in runs]
             for side, runs in (("baseline", baseline), ("candidate", candidate))}
    b, c = steps["baseline"], steps["candidate"]
    if b and c and np.median(b) >= MIN_VALUES and np.median(c) < 0.5 * np.median(b):
        out.append(f"the candidate ran {np.median(c):g} steps per run against the baseline's "
                   f"{np.median(b):g}: it stopped early or lost its step data")
    return out


def _ranks_text(ranks: list[int]) -> str:
    if not ranks:
        return "none"
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{len(ranks)} ({ranks[0]}-{ranks[-1]})"
    return f"{len(ranks)} ({', '.join(map(str, ranks))})"
