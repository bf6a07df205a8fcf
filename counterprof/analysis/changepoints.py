"""Change points in a series of runs (one value per run, oldest first): where a trend shifted.

The method is E-divisive with a permutation test (Matteson & James, "A Nonparametric Approach
for Multiple Change Point Analysis of Multivariate Data", JASA 2014), the method MongoDB's
performance CI runs over its nightly results (Daly et al., "The Use of Change Point Detection
to Identify Software Performance Regressions in a Continuous Integration System", ICPE 2020),
here in its simplest, binary-segmentation form on one series:

1. For a segment, every split point tau with at least MIN_SIZE values on each side gets the
   energy statistic Q(tau) = (a b / n) (2 mean|L - R| - mean|L - L'| - mean|R - R'|) (alpha = 1:
   plain absolute differences; a = |L|, b = |R|, n = a + b): large when the values before and
   after tau differ in distribution (location or spread), not only in mean, and robust to a
   single outlier run.
2. The best split is significant when its Q is exceeded by at most a fraction ALPHA of the best
   splits of PERMUTATIONS random shuffles of the segment (seeded: same series, same answer).
3. A significant split that moved the median by at least the threshold (default 3%, like
   compare) is a change point; both sides are searched again. Splits that are significant but
   smaller end the search in that segment: nightly noise below the threshold is not a change.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_SIZE = 3          # values on each side of a change point: one odd night is not a change
ALPHA = 0.05
PERMUTATIONS = 199    # p-values in steps of 1/200


@dataclass
class ChangePoint:
    index: int            # first value after the change
    before: float         # median of the segment before it
    after: float          # median of the segment after it
    change: float | None  # after / before - 1 (None when before is 0)
    p_value: float


def energy_statistic(y: np.ndarray, min_size: int = MIN_SIZE) -> tuple[int, float]:
    """(best split, its Q) over every split with min_size values on each side; (-1, 0) if none."""
    n = len(y)
    if n < 2 * min_size:
        return -1, 0.0
    d = np.abs(y[:, None] - y[None, :])
    p = d.cumsum(0).cumsum(1)                         # p[i, j] = sum of d[:i+1, :j+1]
    tau = np.arange(min_size, n - min_size + 1)
    a, b = tau.astype(np.float64), (n - tau).astype(np.float64)
    left = p[tau - 1, tau - 1]                        # sum over pairs in L, both orders
    cross = p[tau - 1, n - 1] - left                  # sum over i in L, j in R
    right = p[n - 1, n - 1] - 2 * p[tau - 1, n - 1] + left   # d is symmetric
    e = 2 * cross / (a * b) - left / (a * (a - 1)) - right / (b * (b - 1))
    q = a * b / n * e
    i = int(np.argmax(q))
    return int(tau[i]), float(q[i])


def _shift(before: np.ndarray, after: np.ndarray) -> tuple[float, float, float | None]:
    mb, ma = float(np.median(before)), float(np.median(after))
    return mb, ma, (ma / mb - 1.0) if mb != 0 else None


def change_points(values, threshold: float = 0.03, alpha: float = ALPHA, permutations: int = PERMUTATIONS,
                  min_size: int = MIN_SIZE, seed: int = 0) -> list[ChangePoint]:
    """Change points of a series, in order. NaN values are left out (their runs lack the series)."""
    y_all = np.asarray(values, np.float64)
    keep = np.nonzero(np.isfinite(y_all))[0]
    y = y_all[keep]
    rng = np.random.default_rng(seed)
    found: list[tuple[int, float]] = []      # (index into y, p)
    todo = [(0, len(y))]
    while todo:
        lo, hi = todo.pop()
        seg = y[lo:hi]
        tau, q = energy_statistic(seg, min_size)
        if tau < 0 or q <= 0:
            continue
        _, _, change = _shift(seg[:tau], seg[tau:])
        if change is not None and abs(change) < threshold:
            continue
        exceed = sum(energy_statistic(rng.permutation(seg), min_size)[1] >= q for _ in range(permutations))
        p_value = (exceed + 1) / (permutations + 1)
        if p_value >= alpha:
            continue
        found.append((lo + tau, p_value))
        todo += [(lo, lo + tau), (lo + tau, hi)]
    found.sort()
    cuts = [0] + [i for i, _ in found] + [len(y)]
    out = []
    for k, (i, p_value) in enumerate(found):   # magnitudes between neighbouring change points
        mb, ma, change = _shift(y[cuts[k]:i], y[i:cuts[k + 2]])
        out.append(ChangePoint(int(keep[i]), mb, ma, change, p_value))
    return out
