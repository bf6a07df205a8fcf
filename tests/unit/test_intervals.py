"""Interval-set algebra against a brute-force model over integer time."""
import random

import numpy as np

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


def packed(pairs):
    """pairs merged into a Packed set, as load_spans makes them."""
    import numpy as np
    return iv.Packed(iv.merge_array(np.array([p[0] for p in pairs], np.int64),
                                    np.array([p[1] for p in pairs], np.int64)))


@pytest.mark.parametrize("seed", range(300))
def test_a_packed_set_answers_as_the_list_it_replaces(seed):
    """A rank's steps and collectives are held packed (an int64 array): every operation gives
    what the list of tuples gave, whichever side is packed, long or short (the bisection path
    too: a few windows against thousands of intervals)."""
    rng = random.Random(seed)
    n = rng.choice([0, 1, 3, 8, 200])
    raw_a, raw_b = random_set(rng, n, 400), random_set(rng, rng.choice([0, 1, 2, 8, 200]), 400)
    a, b = iv.merge(raw_a), iv.merge(raw_b)
    pa_, pb = packed(raw_a), packed(raw_b)
    assert pa_ == a and list(pa_) == a and len(pa_) == len(a) and bool(pa_) == bool(a)
    assert all(type(x) is tuple and type(x[0]) is int for x in pa_)
    for x, y in ((pa_, b), (a, pb), (pa_, pb)):
        assert iv.intersect(x, y) == iv.intersect(a, b)
        assert iv.subtract(a, y) == iv.subtract(a, b)
    assert iv.subtract(pa_, b) == iv.subtract(a, b)
    assert iv.total(pa_) == iv.total(a)
    assert iv.span(pa_) == iv.span(a)
    lo, hi = sorted(rng.sample(range(-5, 420), 2))
    assert iv.clip(pa_, lo, hi) == iv.clip(a, lo, hi) == iv.Indexed(pa_).clip(lo, hi)
    assert iv.union([pa_, b]) == iv.merge(raw_a + raw_b) == iv.union([a, pb])
    assert sorted(iv.edges(pa_).tolist()) == sorted(t for p in a for t in p)
    if a:
        assert pa_[0] == a[0] and pa_[-1] == a[-1] and pa_[1:] == a[1:]


def test_merge_array_joins_touching_and_drops_empty_as_merge_does():
    import numpy as np
    pairs = [(5, 5), (0, 3), (3, 4), (10, 12), (11, 11), (9, 10), (20, 25), (21, 22)]
    got = iv.merge_array(np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs]))
    assert got.tolist() == [list(p) for p in iv.merge(pairs)] == [[0, 4], [9, 12], [20, 25]]
    assert iv.merge_array(np.array([], np.int64), np.array([], np.int64)).shape == (0, 2)


@pytest.mark.parametrize("seed", range(300))
def test_stacked_sets_total_inside_a_query_as_each_intersect_does(seed):
    """A verdict window asks every rank's collectives and steps at once (iv.Stacked): each
    set's total inside the query is the point count of the intersection, packed or list sets,
    empty ones among them, queries before, across and after every set; and the same where the
    one sorted key would overflow (each set searched on its own)."""
    rng = random.Random(seed)
    raws = [random_set(rng, rng.choice([0, 1, 3, 8, 40]), 300) for _ in range(rng.randint(0, 7))]
    sets = [packed(r) if r and rng.random() < 0.5 else iv.merge(r) for r in raws]
    query = iv.merge(random_set(rng, rng.choice([0, 1, 2, 8]), 400))
    want = [len(points(s) & points(query)) for s in sets]
    st = iv.Stacked(sets)
    assert st.totals(query).tolist() == want
    st.keys = None                       # as for a run too long for the key (n x stride > 2**62)
    assert st.totals(query).tolist() == want


def test_stacked_sets_far_apart_in_time_keep_exact_totals():
    """Epoch-nanosecond times (1.8e18) on a thousand sets: the key is relative to the earliest
    start, so it fits; totals stay exact integers."""
    t0 = 1_796_596_396_473_161_579
    sets = [[(t0 + r * 1000 + k * 10_000_000, t0 + r * 1000 + k * 10_000_000 + 3_000_000) for k in range(50)]
            for r in range(1024)]
    st = iv.Stacked(sets)
    assert st.keys is not None
    q = [(t0 + 5_000_000, t0 + 205_000_000)]
    assert st.totals(q).tolist() == [iv.total(iv.intersect(s, q)) for s in sets]


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("block", [1, 3, 7, 1 << 20])
def test_union_folded_a_block_at_a_time_is_the_merge_of_every_set(seed, block, monkeypatch):
    """union() folds the sets in blocks (a thousand ranks' steps are not sorted as one array):
    the result is merge() of all of them, whatever the block and whether sets overlap, touch,
    lie apart, are empty, packed or lists."""
    monkeypatch.setattr(iv, "UNION_BLOCK", block)
    rng = random.Random(seed)
    sets: list = []
    for _ in range(rng.randint(0, 12)):
        base = rng.choice([0, 10_000 * rng.randint(0, 5)])       # overlapping ranks, or apart
        ivs = [(a, a + rng.randint(0, 40)) for a in (base + rng.randint(0, 500) for _ in range(rng.randint(0, 9)))]
        merged = iv.merge(ivs)
        sets.append(iv.Packed(iv.merge_array(*map(np.array, zip(*merged))) if merged
                              else np.zeros((0, 2), np.int64)) if rng.random() < 0.5 else merged)
    every = [p for s in sets for p in (s.a.tolist() if isinstance(s, iv.Packed) else s)]
    assert iv.union(sets) == iv.merge([tuple(p) for p in every])
