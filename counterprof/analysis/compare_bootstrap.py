"""The bootstrap of compare's medians (analysis/compare.py says what it estimates), and the rows
of a big comparison spread over the machine's CPUs.

Every row draws from its own generator, seeded from the seed and the row's name, so a row's
interval is the same whichever process computes it and whatever else is compared: a big
comparison (1024 ranks: ~20 k rows, ~3 ms each) is split over worker processes and its output
is the same, figure for figure, as one process's (analysis/workers.py: a worker that fails
costs nothing, its rows are computed here).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from functools import partial

import numpy as np

from .workers import MAX_WORKERS, cpus, spread

RESAMPLES = 2000
CONFIDENCE = 0.95
CHUNK_ELEMENTS = 1 << 20   # bootstrap draws at most this many values at once (bounded memory)
PARALLEL_MIN_ROWS = 400    # fewer rows (~1 s in one process): not worth a worker's start (~0.1 s)

Job = tuple[list[np.ndarray], list[np.ndarray], str]    # (baseline's values per run, candidate's, row name)


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def bootstrap_medians(groups: list[np.ndarray], resamples: int, rng: np.random.Generator) -> np.ndarray:
    """`resamples` bootstrap replicates of the median of the pooled values. One group: resample
    its values (resampled_medians: exact, without drawing the resamples). Several (one per run):
    resample the groups, then, from each chosen group, as many values as the groups hold on
    average (each run weighs the same)."""
    groups = [np.asarray(g, np.float64) for g in groups if len(g)]
    if len(groups) == 1:
        return resampled_medians(np.sort(groups[0]), resamples, rng)
    out = np.empty(resamples)
    pooled = np.concatenate(groups)
    sizes = np.array([len(g) for g in groups])
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    k = len(groups)
    per = max(1, int(round(sizes.mean())))
    step = max(1, CHUNK_ELEMENTS // (k * per))
    for i in range(0, resamples, step):
        m = min(step, resamples - i)
        chosen = rng.integers(0, k, size=(m, k))                       # runs, with replacement
        within = (rng.random((m, k, per)) * sizes[chosen][:, :, None]).astype(np.int64)
        idx = offsets[chosen][:, :, None] + within
        out[i:i + m] = np.median(pooled[idx.reshape(m, k * per)], axis=1)
    return out


def resampled_medians(x: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """The medians (np.median's: the mean of the two middle values when n is even) of
    `resamples` samples of n values drawn with replacement from the sorted array x, without
    drawing them: O(resamples x log n) instead of O(resamples x n).

    A resample puts a Multinomial(n, 1/n) count on each sorted position. Its k-th smallest value
    sits where the counts' running sum passes k. Find it by halving: the count that falls in the
    left half of a segment holding c values is Binomial(c, left share); the k-th value is in the
    left half if that count exceeds k, else it is the (k - count)-th of the right half. For even
    n the upper middle value follows the lower one until a split sends it right (the lower one
    was the left half's last): from there it is the smallest value of that right half, found by
    the same descent (given the split, the halves are independent multinomials)."""
    n = len(x)
    lower = (n - 1) // 2
    a, b = np.zeros(resamples, np.int64), np.full(resamples, n, np.int64)
    c, r = np.full(resamples, n, np.int64), np.full(resamples, lower, np.int64)
    parted = np.zeros(resamples, bool)          # even n: the upper middle value went its own way
    a2, b2, c2 = a.copy(), b.copy(), c.copy()
    while True:
        width = b - a
        if not (width > 1).any():
            break
        mid = a + width // 2
        left = rng.binomial(c, (mid - a) / width)     # width 1: p = 0, nothing moves
        go = r < left
        if n % 2 == 0:
            part = ~parted & (left == r + 1)          # lower is the left half's last value
            if part.any():
                a2[part], b2[part], c2[part] = mid[part], b[part], (c - left)[part]
                parted |= part
        a, b = np.where(go, a, mid), np.where(go, mid, b)
        c, r = np.where(go, left, c - left), np.where(go, r, r - left)
    upper = a.copy()
    if parted.any():
        pa, pb, pc_ = a2[parted], b2[parted], c2[parted]
        pr = np.zeros(len(pa), np.int64)
        while True:
            width = pb - pa
            if not (width > 1).any():
                break
            mid = pa + width // 2
            left = rng.binomial(pc_, (mid - pa) / width)
            go = pr < left
            pa, pb = np.where(go, pa, mid), np.where(go, mid, pb)
            pc_, pr = np.where(go, left, pc_ - left), np.where(go, pr, pr - left)
        upper[parted] = pa
    mids: np.ndarray = (x[a] + x[upper]) / 2
    return mids


@dataclass
class Change:
    base_median: float | None
    cand_median: float | None
    change: float | None               # relative: cand / base - 1
    ci: tuple[float, float] | None     # of the relative change
    n_base: int
    n_cand: int


def median_change(base: list[np.ndarray], cand: list[np.ndarray], resamples: int = RESAMPLES,
                  confidence: float = CONFIDENCE, seed: int = 0, name: str = "") -> Change:
    """Relative change of the median from `base` to `cand` (each a list of value arrays, one per
    run) with its percentile bootstrap interval. No interval when a side has no values, or the
    baseline's median is 0 (no relative change exists)."""
    b = np.concatenate([np.asarray(x, np.float64) for x in base]) if base else np.empty(0)
    c = np.concatenate([np.asarray(x, np.float64) for x in cand]) if cand else np.empty(0)
    if not len(b) or not len(c):
        return Change(float(np.median(b)) if len(b) else None, float(np.median(c)) if len(c) else None,
                      None, None, len(b), len(c))
    mb, mc = float(np.median(b)), float(np.median(c))
    if mb == 0:
        return Change(mb, mc, None, None, len(b), len(c))
    rng = _rng(seed, name)
    rb = bootstrap_medians(base, resamples, rng)
    rc = bootstrap_medians(cand, resamples, rng)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = rc / rb - 1.0
    ratios = ratios[np.isfinite(ratios)]
    alpha = (1.0 - confidence) / 2
    ci = (float(np.quantile(ratios, alpha)), float(np.quantile(ratios, 1 - alpha))) if len(ratios) else None
    return Change(mb, mc, mc / mb - 1.0, ci, len(b), len(c))


def median_changes(jobs: list[Job], resamples: int = RESAMPLES, confidence: float = CONFIDENCE,
                   seed: int = 0, workers: int | None = None) -> list[Change]:
    """median_change of each job, in order. workers: processes in all, this one included (None:
    the CPUs this process may run on); one, or fewer than PARALLEL_MIN_ROWS jobs: here alone."""
    n = workers if workers is not None else cpus()
    n = max(1, min(n, MAX_WORKERS, len(jobs) // max(1, PARALLEL_MIN_ROWS // 2)))
    if n == 1 or len(jobs) < PARALLEL_MIN_ROWS:
        return _changes(resamples, confidence, seed, jobs)
    parts = spread(partial(_changes, resamples, confidence, seed), _split(jobs, n))
    return [c for part in parts for c in part]


def _changes(resamples: int, confidence: float, seed: int, jobs: list[Job]) -> list[Change]:
    return [median_change(b, c, resamples, confidence, seed, name) for b, c, name in jobs]


def _split(jobs: list[Job], n: int) -> list[list[Job]]:
    """n runs of consecutive jobs of about equal cost (a row's descent is ~log2 of its values per
    side: the all-ranks rows pool every rank's values)."""
    cost = np.cumsum([np.log2(2 + sum(len(x) for x in b)) + np.log2(2 + sum(len(x) for x in c))
                      for b, c, _ in jobs])
    cuts = np.searchsorted(cost, cost[-1] * np.arange(1, n) / n).tolist()
    bounds = [0, *cuts, len(jobs)]
    return [jobs[a:b] for a, b in zip(bounds, bounds[1:])]
