"""Change points (E-divisive with a permutation test) on synthetic nightly series."""
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
    y = rng.normal(0, 1, 14)
    tau, q = energy_statistic(y, 3)
    best = None
    for t in range(3, 12):
        L, R = y[:t], y[t:]
        a, b = len(L), len(R)
        cross = np.abs(L[:, None] - R[None, :]).mean()
        wl = np.abs(L[:, None] - L[None, :]).sum() / (a * (a - 1))
        wr = np.abs(R[:, None] - R[None, :]).sum() / (b * (b - 1))
        val = a * b / (a + b) * (2 * cross - wl - wr)
        if best is None or val > best[1]:
            best = (t, val)
    assert tau == best[0] and q == pytest.approx(best[1])
