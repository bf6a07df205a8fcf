"""Change points in a series of runs (one value per run, oldest first): where a trend shifted.

The method is E-divisive with a permutation test (Matteson & James, "A Nonparametric Approach
for Multiple Change Point Analysis of Multivariate Data", JASA 2014), the method MongoDB's
performance CI runs over its nightly results (Daly et al., "The Use of Change Point Detection
to Identify Software Performance Regressions in a Continuous Integration System", ICPE 2020),
here on one series, by binary segmentation:

1. For a segment, every pair tau < kappa with at least MIN_SIZE values in X = [start, tau) and
   in Y = [tau, kappa) gets the energy statistic
   Q(tau, kappa) = (a b / (a + b)) (2 mean|X - Y| - mean|X - X'| - mean|Y - Y'|) (alpha = 1:
   plain absolute differences; a = |X|, b = |Y|): large when the values before and after tau
   differ in distribution (location or spread), not only in mean, and robust to a single
   outlier run. Searching kappa as well as tau (Matteson & James's tau-hat and kappa-hat) is
   what finds a temporary shift, a regression later fixed: with Y fixed to run to the segment's
   end, the runs after the fix dilute it. The best tau is the change point; kappa only bounds
   what it is compared with. All pairs at once from 2-D prefix sums of |y_i - y_j|: O(n^2)
   time and memory per segment.
2. The best pair is significant when its Q is exceeded by at most a fraction ALPHA of the best
   pairs of PERMUTATIONS random shuffles of the segment (seeded: same series, same answer;
   the shuffles stop early once the split cannot be significant any more).
3. A significant split whose median moved by at least the threshold (default 3%, like compare;
   median of X against median of Y) is a change point; both sides of tau are searched again.
   Splits that are significant but smaller end the search in that segment: nightly noise below
   the threshold is not a change.

Minimum segment length: MIN_SIZE (3) runs, for X and for Y. A change is found only with at
least 3 runs before it and 3 after it (within the segment being searched), so a series needs
at least 6 values (NaNs left out) for any; a temporary shift needs to last 3 runs or more, and
its end is found only with 3 runs or more after it. One odd night alone is not a change point (it
sets no median of 3 or more runs); two odd nights in a row can read as a 3-run shift when
they are far out (2 of the 3 runs set the median).

Cost: O(n^2) per segment and shuffle, up to PERMUTATIONS + 1 times per segment searched; a
segment is shuffled only when its best split moves the median by the threshold, and the
shuffles stop once the split cannot be significant. 365 runs, on the project's shared 2-core
VM: noise alone ~0.01-0.03 s, one change ~0.3-0.6 s, three ~0.9 s.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt

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


@lru_cache(maxsize=16)
def _weights(n: int, min_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Q(tau, kappa) = S[tau, kappa] w1 - S[tau, tau] w2 - S[kappa, kappa] w3 + off, with S the
    2-D prefix sums of |y_i - y_j| (S[i, j] = sum over i' < i, j' < j), for tau in
    [min_size, n - min_size] (rows) and kappa in [2 min_size, n] (columns); off is -inf where
    Y would hold fewer than min_size values. Depends on n only: computed once per length."""
    a = np.arange(min_size, n - min_size + 1, dtype=np.float64)[:, None]      # |X| = tau
    kappa = np.arange(2 * min_size, n + 1, dtype=np.float64)[None, :]
    ok = kappa - a >= min_size
    b = np.where(ok, kappa - a, 2.0)                                            # |Y|
    cc = 2 / (a + b)                                  # cross sum S[t,k] - S[t,t], over a b; times a b / (a + b)
    cx = b / ((a + b) * (a - 1))                      # within X: S[t,t]
    cy = a / ((a + b) * (b - 1))                      # within Y: S[k,k] - 2 S[t,k] + S[t,t]
    w1, w2, w3 = cc + 2 * cy, cc + cx + cy, cy
    off = np.where(ok, 0.0, -np.inf)
    for w in (w1, w2, w3, off):
        w.setflags(write=False)
    return w1, w2, w3, off


def energy_statistic(y: np.ndarray, min_size: int = MIN_SIZE) -> tuple[int, int, float]:
    """(tau, kappa, Q) of the best pair: X = y[:tau], Y = y[tau:kappa], each of at least
    min_size values, Q = (a b / (a + b)) (2 mean|X - Y| - mean|X - X'| - mean|Y - Y'|);
    (-1, -1, 0) if the series is too short for one."""
    n = len(y)
    if n < 2 * min_size:
        return -1, -1, 0.0
    s = np.zeros((n + 1, n + 1))
    np.abs(y[:, None] - y[None, :], out=s[1:, 1:])
    s.cumsum(0, out=s)
    s.cumsum(1, out=s)
    diag = s.diagonal()
    w1, w2, w3, off = _weights(n, min_size)
    t0, k0 = min_size, 2 * min_size
    q = s[t0:n - min_size + 1, k0:] * w1
    q -= diag[t0:n - min_size + 1, None] * w2
    q -= diag[None, k0:] * w3
    q += off
    i, j = np.unravel_index(int(np.argmax(q)), q.shape)
    return t0 + int(i), k0 + int(j), float(q[i, j])


def _shift(before: np.ndarray, after: np.ndarray) -> tuple[float, float, float | None]:
    mb, ma = float(np.median(before)), float(np.median(after))
    return mb, ma, (ma / mb - 1.0) if mb != 0 else None


def change_points(values: npt.ArrayLike, threshold: float = 0.03, alpha: float = ALPHA,
                  permutations: int = PERMUTATIONS, min_size: int = MIN_SIZE, seed: int = 0) -> list[ChangePoint]:
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
        tau, kappa, q = energy_statistic(seg, min_size)
        if tau < 0 or q <= 0:
            continue
        _, _, change = _shift(seg[:tau], seg[tau:kappa])
        if change is not None and abs(change) < threshold:
            continue
        exceed = 0
        for _ in range(permutations):
            exceed += energy_statistic(rng.permutation(seg), min_size)[2] >= q
            if (exceed + 1) / (permutations + 1) >= alpha:    # cannot be significant any more
                break
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
