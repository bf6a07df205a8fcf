"""Interval-set algebra against a brute-force model over integer time."""
import random

import pytest

from counterprof.analysis import intervals as iv


def points(s):
    return {t for a, b in s for t in range(a, b)}


def random_set(rng, n=8, span=60):
    pairs = []
    for _ in range(rng.randint(0, n)):
        a = rng.randint(0, span)
        pairs.append((a, a + rng.randint(0, 10)))
    return pairs


@pytest.mark.parametrize("seed", range(200))
def test_algebra_matches_point_sets(seed):
    rng = random.Random(seed)
    a, b = iv.merge(random_set(rng)), iv.merge(random_set(rng))
    assert points(a) == points(random_set(random.Random(seed)))  # merge keeps the covered points
    assert all(x[1] < y[0] for x, y in zip(a, a[1:])), "merged: sorted, disjoint, not touching"
    assert points(iv.intersect(a, b)) == points(a) & points(b)
    assert points(iv.subtract(a, b)) == points(a) - points(b)
    lo, hi = sorted(rng.sample(range(0, 70), 2))
    assert points(iv.clip(a, lo, hi)) == points(a) & set(range(lo, hi))
    assert iv.total(a) == len(points(a))
    assert points(iv.gaps(a)) == (set(range(a[0][0], a[-1][1])) - points(a) if a else set())


def test_indexed_clip_is_reusable():
    ix = iv.Indexed(iv.merge([(0, 10), (20, 30), (40, 50)]))
    assert ix.clip(5, 25) == [(5, 10), (20, 25)]
    assert ix.clip(30, 40) == []
    assert ix.clip(45, 100) == [(45, 50)]
