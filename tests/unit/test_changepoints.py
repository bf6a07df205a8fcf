"""Change points (E-divisive with a permutation test) on synthetic nightly series."""
import time

import numpy as np
import pytest

from counterprof.analysis.changepoints import change_points, energy_statistic


def test_a_step_change_is_found_where_it_happened():
    rng = np.random.default_rng(1)
    y = np.concatenate([rng.normal(100, 1, 20), rng.normal(130, 1, 15)])
    (cp,) = change_points(y)
    assert cp.index == 20
    assert cp.change == pytest.approx(0.30, abs=0.02) and cp.p_value < 0.05
    assert cp.before == pytest.approx(100, abs=1) and cp.after == pytest.approx(130, abs=1)


def test_two_changes_up_then_down():
    rng = np.random.default_rng(2)
    y = np.concatenate([rng.normal(100, 2, 12), rng.normal(125, 2, 12), rng.normal(95, 2, 12)])
    assert [c.index for c in change_points(y)] == [12, 24]


def test_noise_and_small_shifts_are_not_change_points():
    false = 0
    for seed in range(40):
        rng = np.random.default_rng(100 + seed)
        false += bool(change_points(rng.normal(100, 5, 30), seed=seed))
    assert false <= 4, false            # alpha 0.05, and most noise moves medians < 3%
    rng = np.random.default_rng(3)
    y = np.concatenate([rng.normal(100, 0.2, 20), rng.normal(102, 0.2, 20)])   # real, but 2%
    assert change_points(y) == []
    assert [c.index for c in change_points(y, threshold=0.01)] == [20]


def test_one_odd_night_is_not_a_change_and_missing_values_are_skipped():
    rng = np.random.default_rng(4)
    y = rng.normal(100, 1, 30)
    y[15] = 200                          # one outlier run
    assert change_points(y) == []
    z = np.concatenate([rng.normal(100, 1, 10), [np.nan], rng.normal(150, 1, 10)])
    (cp,) = change_points(z)
    assert cp.index == 11                # index into the series as given (the NaN run counts)


def test_the_same_series_gives_the_same_answer_and_short_series_none():
    rng = np.random.default_rng(5)
    y = np.concatenate([rng.normal(10, 1, 8), rng.normal(11, 1, 8)])
    assert change_points(y, seed=3) == change_points(y, seed=3)
    assert change_points([1.0, 2.0, 3.0, 50.0, 51.0]) == []
    assert energy_statistic(np.array([1.0, 2.0]))[0] == -1


def test_energy_statistic_matches_its_definition():
    rng = np.random.default_rng(6)
    for n in (6, 7, 14, 23):
        y = rng.normal(0, 1, n)
        best = None
        for t in range(3, n - 2):                # X = y[:t], Y = y[t:k], both of 3 values or more
            for k in range(t + 3, n + 1):
                L, R = y[:t], y[t:k]
                a, b = len(L), len(R)
                cross = np.abs(L[:, None] - R[None, :]).mean()
                wl = np.abs(L[:, None] - L[None, :]).sum() / (a * (a - 1))
                wr = np.abs(R[:, None] - R[None, :]).sum() / (b * (b - 1))
                val = a * b / (a + b) * (2 * cross - wl - wr)
                if best is None or val > best[2]:
                    best = (t, k, val)
        tau, kappa, q = energy_statistic(y, 3)
        assert (tau, kappa) == best[:2] and q == pytest.approx(best[2])


@pytest.mark.parametrize("middle", [8, 5, 3])
def test_a_regression_later_fixed_is_found_at_both_ends(middle):
    """A temporary shift: the runs after the fix must not hide it (the split's right end is
    searched, not fixed at the segment's end). 3 runs is the shortest shift found."""
    for seed in range(10):
        rng = np.random.default_rng(seed)
        y = np.r_[1 + .005 * rng.standard_normal(8), 1.1 * (1 + .005 * rng.standard_normal(middle)),
                  1 + .005 * rng.standard_normal(8)]
        cps = change_points(y)
        assert [c.index for c in cps] == [8, 8 + middle], seed
        assert cps[0].change == pytest.approx(0.10, abs=0.02) and cps[1].change == pytest.approx(-1 / 11, abs=0.02)


def test_a_year_of_nightly_runs_is_searched_in_seconds():
    rng = np.random.default_rng(7)
    level = np.r_[np.ones(150), 1.08 * np.ones(20), np.ones(120), 1.15 * np.ones(75)]    # 365 runs
    y = 0.25 * level * (1 + 0.01 * rng.standard_normal(365))
    t0 = time.perf_counter()
    cps = change_points(y)
    elapsed = time.perf_counter() - t0
    assert [c.index for c in cps] == [150, 170, 290]
    assert elapsed < 10, elapsed          # ~0.6 s on one core of the project's VM
