"""The report's many-interval sums (a rank's steps over an hour: thousands of intervals) are
the one-interval sums added up: Series.delta_many / mean_many against delta / mean, and
intervals.intersect's bisection path against the plain merge, on random sets."""
from __future__ import annotations

import numpy as np
import pytest

from counterprof.analysis import intervals as iv
from counterprof.analysis.signals import Series


def _grid(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    edges = np.cumsum(rng.integers(0, 50, size=n + 1)) + 1000
    starts, ends = edges[:-1].copy(), edges[1:].copy()
    starts = np.minimum(starts + rng.integers(0, 3, size=n) * (rng.random(n) < 0.3), ends)   # gaps
    values = rng.random(n) * 10
    values[rng.random(n) < 0.1] = np.nan                                                      # unknowns
    return starts.astype(np.int64), ends.astype(np.int64), values


def _scope(rng: np.random.Generator, lo: int, hi: int) -> list[tuple[int, int]]:
    out, t = [], lo - 20
    while t < hi + 20:
        a = t + int(rng.integers(0, 30))
        b = a + int(rng.integers(1, 60))
        out.append((a, b))
        t = b
    return out


@pytest.mark.parametrize("seed", range(40))
def test_delta_and_mean_over_many_intervals_equal_their_sum_one_at_a_time(seed):
    rng = np.random.default_rng(seed)
    starts, ends, values = _grid(rng, int(rng.integers(1, 300)))
    scope = _scope(rng, int(starts[0]), int(ends[-1]))
    delta = Series("delta", starts, ends, values)
    got = delta.delta_many(scope)
    tot = cov = 0.0
    found = False
    for lo, hi in scope:
        r = delta.delta(lo, hi)
        if r is not None:
            found, tot, cov = True, tot + r[0], cov + r[1] * (hi - lo)
    assert got is not None
    assert got[0] == pytest.approx(tot, rel=1e-9, abs=1e-9) and got[1] == pytest.approx(cov, rel=1e-9, abs=1e-9)
    assert got[2] == found
    gauge = Series("gauge", starts, ends, values)
    means = [m for lo, hi in scope if (m := gauge.mean(lo, hi)) is not None]
    want = sum(means) / len(means) if means else None
    assert gauge.mean_many(scope) == (pytest.approx(want) if want is not None else None)


def test_overlapping_buckets_are_left_to_the_one_at_a_time_sum():
    s = Series("delta", np.array([0, 5], np.int64), np.array([10, 15], np.int64), np.array([1.0, 1.0]))
    assert s.delta_many([(0, 3), (4, 12)]) is None


@pytest.mark.parametrize("seed", range(40))
def test_intersect_by_bisection_equals_the_merge(seed):
    rng = np.random.default_rng(seed)

    def random_set(n: int, longest: int) -> iv.Intervals:
        return iv.merge((int(x), int(x) + int(rng.integers(0, longest))) for x in rng.integers(0, 10_000, size=n))

    def merge_walk(a: iv.Intervals, b: iv.Intervals) -> iv.Intervals:
        out, i, j = [], 0, 0
        while i < len(a) and j < len(b):
            s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
            if s < e:
                out.append((s, e))
            if a[i][1] < b[j][1]:
                i += 1
            else:
                j += 1
        return out

    many, few = random_set(int(rng.integers(50, 500)), 50), random_set(int(rng.integers(0, 5)), 3000)
    assert len(few) * 16 < len(many)          # the bisection path
    assert iv.intersect(few, many) == merge_walk(few, many) == iv.intersect(many, few)
