"""compare's statistics on synthetic samples: the bootstrap's distribution, coverage and
reproducibility, the flagging rule, the direction table, and what a comparison says about
quantities, ranks and runs one side lacks."""
import numpy as np
import pytest

from counterprof.analysis.compare import DIRECTIONS, MIN_VALUES, compare, direction_of, judge
from counterprof.analysis.compare_bootstrap import median_change, resampled_medians
from counterprof.analysis.run_figures import RunFigures


@pytest.mark.parametrize("n", [1, 2, 3, 4, 9, 10, 51, 200])
def test_resampled_medians_have_the_brute_force_bootstrap_distribution(n):
    rng = np.random.default_rng(n)
    x = np.sort(np.round(rng.normal(0, 1, n), 1))          # rounding: ties, as step times have
    fast = resampled_medians(x, 100_000, np.random.default_rng(1))
    brute = np.median(x[np.random.default_rng(2).integers(0, n, size=(100_000, n))], axis=1)
    assert set(np.unique(fast)) <= set(np.unique(brute)) | {(a + b) / 2 for a in x for b in x}
    assert fast.mean() == pytest.approx(brute.mean(), abs=0.01)
    assert fast.std() == pytest.approx(brute.std(), rel=0.05, abs=0.003)
    for q in (0.05, 0.25, 0.5, 0.75, 0.95):
        # the same distribution: each quantile of one lies within the other's neighbouring quantiles
        assert np.quantile(brute, q - 0.02 if q > 0.02 else 0) <= np.quantile(fast, q) <= \
            np.quantile(brute, min(1, q + 0.02))


def test_the_same_seed_gives_the_same_interval_and_rows_do_not_share_a_stream():
    rng = np.random.default_rng(0)
    a, b = rng.normal(100, 5, 40), rng.normal(102, 5, 40)
    one = median_change([a], [b], seed=7, name="step_time@None")
    assert one == median_change([a], [b], seed=7, name="step_time@None")
    assert one.ci != median_change([a], [b], seed=8, name="step_time@None").ci
    # a row's interval depends on its own name and the seed, not on what was computed before it
    median_change([b], [a], seed=7, name="other")
    assert one == median_change([a], [b], seed=7, name="step_time@None")


def test_identical_distributions_give_an_interval_holding_zero_about_95_percent_of_the_time():
    hits, seeds = 0, 300
    for seed in range(seeds):
        rng = np.random.default_rng(10_000 + seed)
        a, b = rng.normal(100, 5, 30), rng.normal(100, 5, 30)
        lo, hi = median_change([a], [b], seed=seed).ci
        hits += lo <= 0 <= hi
    assert 0.90 <= hits / seeds <= 0.99, hits / seeds


def test_a_ten_percent_shift_on_tight_data_is_flagged_and_noise_is_not():
    rng = np.random.default_rng(3)
    base = rng.normal(0.100, 0.001, 50)                   # 100 ms steps, 1% noise
    slow = rng.normal(0.110, 0.001, 50)
    ch = median_change([base], [slow])
    assert ch.change == pytest.approx(0.10, abs=0.01) and ch.ci[0] > 0.08 and ch.ci[1] < 0.12
    assert judge(ch, direction_of("step_time")) == "regression"
    assert judge(median_change([slow], [base]), "lower") == "improvement"
    assert judge(ch, direction_of("metric:instructions")) == "changed"
    same = median_change([base], [rng.normal(0.100, 0.001, 50)])
    assert judge(same, "lower") == "unchanged"


def test_the_threshold_and_the_interval_must_both_be_passed():
    rng = np.random.default_rng(4)
    base = rng.normal(100, 0.2, 200)
    small = median_change([base], [rng.normal(102, 0.2, 200)])     # 2%: certain, but small
    assert small.ci[0] > 0
    assert judge(small, "lower", threshold=0.03) == "unchanged"
    assert judge(small, "lower", threshold=0.01) == "regression"
    wide = median_change([rng.normal(100, 40, 8)], [rng.normal(110, 40, 8)])   # big but uncertain
    assert wide.ci[0] < 0 < wide.ci[1] and judge(wide, "lower") == "inconclusive"   # too wide to call


def test_a_region_of_microseconds_is_not_flagged_below_the_noise_floor():
    rng = np.random.default_rng(5)
    tiny = median_change([rng.normal(20e-6, 1e-6, 100)], [rng.normal(32e-6, 1e-6, 100)])   # +60%
    assert tiny.ci[0] > 0.4
    assert judge(tiny, "lower") == "regression"
    assert judge(tiny, "lower", min_abs=1e-4) == "unchanged"
    big = median_change([rng.normal(0.010, 1e-4, 100)], [rng.normal(0.012, 1e-4, 100)])     # +2 ms
    assert judge(big, "lower", min_abs=1e-4) == "regression"


def test_few_values_and_a_zero_baseline_are_never_flagged():
    few = median_change([np.array([1.0, 1.0, 1.0])], [np.array([2.0, 2.0, 2.0])])
    assert judge(few, "lower") == "too few values"
    zero = median_change([np.zeros(20)], [np.ones(20)])
    assert zero.change is None and judge(zero, "either") == "no relative change"
    assert MIN_VALUES >= 3


def test_several_runs_per_side_carry_the_run_to_run_noise():
    """Runs whose levels differ (machine noise between runs): the two-stage bootstrap's interval
    is wider than the one from the pooled values, which ignores that noise."""
    rng = np.random.default_rng(5)
    runs = lambda: [rng.normal(100 + rng.normal(0, 3), 2, 40) for _ in range(4)]   # noqa: E731
    base, cand = runs(), runs()
    two_stage = median_change(base, cand)
    pooled = median_change([np.concatenate(base)], [np.concatenate(cand)])
    assert two_stage.change == pooled.change
    assert (two_stage.ci[1] - two_stage.ci[0]) > 1.5 * (pooled.ci[1] - pooled.ci[0])


def test_the_direction_table():
    assert direction_of("step_time") == "lower"
    assert direction_of("region:forward") == "lower"
    assert direction_of("region:fwd (GPU)") == "lower"
    assert direction_of("metric:gpu.throttle_time_power") == "lower"
    assert direction_of("metric:system.cpu_util") == "context"
    assert direction_of("metric:task-clock") == "either"
    assert direction_of("metric:gpu.util") == "either"
    assert {d for _, d, _ in DIRECTIONS} == {"lower", "either", "context"}
    assert all(why for _, _, why in DIRECTIONS)


def figures(run_id, ranks, step_s, metrics=None, seed=0, n=40):
    rng = np.random.default_rng(seed)
    f = RunFigures(path=f"/runs/{run_id}", run_id=run_id, command=["python", "train.py"], ranks=ranks,
                   window_s=1.0)
    f.times["step_time"] = {r: rng.normal(step_s, step_s / 200, n) for r in ranks}
    for m, level in (metrics or {}).items():
        f.metrics[m] = {r: rng.normal(level, level / 100, n) for r in ranks}
        f.units[m] = "/s"
        f.kinds[m] = "delta"
        f.totals[m] = {r: level * n for r in ranks}
    return f


def test_a_comparison_keeps_what_one_side_lacks_and_says_so():
    base = figures("a", [0, 1], 0.1, {"task-clock": 1.0, "page-faults": 50.0})
    cand = figures("b", [0, 1, 2], 0.1, {"task-clock": 1.0, "gpu.util": 80.0}, seed=1)
    cmp = compare([base], [cand])
    rows = {(r.key, r.rank): r for r in cmp.rows}
    assert rows[("metric:page-faults", None)].status == "only in baseline"
    assert rows[("metric:gpu.util", None)].status == "only in candidate"
    assert rows[("step_time", 2)].status == "only in candidate"
    assert rows[("step_time", None)].status == "unchanged"
    assert rows[("metric:task-clock", 0)].base_total == pytest.approx(40.0)
    notes = " ".join(cmp.notes)
    assert "different ranks: baseline 2 (0, 1), candidate 3 (0-2)" in notes
    assert "metrics the baseline does not have: gpu.util" in notes
    assert "metrics the candidate does not have: page-faults" in notes
    assert not cmp.regressions


def test_a_slow_rank_is_a_regression_in_its_row_and_in_the_all_ranks_row():
    base = figures("a", [0, 1], 0.1)
    cand = figures("b", [0, 1], 0.1, seed=1)
    cand.times["step_time"][1] = cand.times["step_time"][1] * 1.5
    cmp = compare([base], [cand])
    status = {r.rank: r.status for r in cmp.rows if r.key == "step_time"}
    assert status == {None: "regression", 0: "unchanged", 1: "regression"}, status
    j = cmp.to_json()
    assert j["regressions"] == 2 and j["settings"]["resamples"] == 2000
    assert {"key", "rank", "status", "change", "ci", "base_median", "cand_median", "n_base", "n_cand",
            "direction", "unit", "verdict"} <= set(j["rows"][0])


def test_a_counters_interval_must_lie_beyond_the_threshold_but_a_times_need_not():
    from counterprof.analysis.compare_bootstrap import Change
    lumpy = Change(10.0, 16.7, 0.667, (0.016, 1.746), 12, 10)    # a reviewer's proc.cpu_user rerun
    assert judge(lumpy, "either") == "inconclusive"          # reaches inside the threshold
    assert judge(lumpy, "lower") == "regression"                # a time: the usual rule
    tight = Change(100.0, 110.0, 0.10, (0.08, 0.12), 50, 50)
    assert judge(tight, "either") == "changed"


def test_counts_too_small_to_resolve_are_not_flagged():
    from counterprof.analysis.compare import Row, _too_coarse
    few = Row("metric:cpu-migrations", None, "/s", "either", "changed", base_total=4, cand_total=0)
    assert "too few" in _too_coarse(few)
    many = Row("metric:cpu-migrations", None, "/s", "either", "changed", base_total=400, cand_total=90)
    assert _too_coarse(many) == ""
    ticks = Row("metric:proc.cpu_user", None, "s/s", "either", "changed", base_total=0.12, cand_total=0.2)
    assert "clock ticks" in _too_coarse(ticks)
    assert _too_coarse(Row("metric:proc.cpu_user", None, "s/s", "either", "changed",
                           base_total=3.0, cand_total=2.0)) == ""
    assert _too_coarse(Row("metric:task-clock", None, "s/s", "either", "changed",
                           base_total=0.01, cand_total=0.02)) == ""       # ns resolution: fine


def test_the_noise_floor_holds_regions_only_not_the_step_time():
    from counterprof.analysis.compare import compare
    from counterprof.analysis.run_figures import RunFigures
    rng = np.random.default_rng(8)

    def run(name, step_us):
        t = rng.normal(step_us, 1.0, 200) * 1e-6
        return RunFigures(name, name, ["python", "w.py"], [0], 0.2,
                          times={"step_time": {0: t}, "region:tiny": {0: t.copy()}})
    cmp = compare([run("a", 131)], [run("b", 182)])          # +39%, +51 µs
    status = {r.key: r for r in cmp.rows}
    assert status["step_time"].status == "regression"
    assert status["region:tiny"].status == "unchanged"
    assert "noise floor" in status["region:tiny"].note
    assert compare([run("a", 131)], [run("b", 182)], min_time_change_s=0).rows[1].status == "regression"


def test_why_a_moved_quantity_is_unchanged_or_inconclusive_is_said():
    from counterprof.analysis.compare import judgement
    from counterprof.analysis.compare_bootstrap import Change
    # a counter 4% up whose interval reaches back inside the 3% threshold: too wide to call
    assert judgement(Change(100.0, 104.0, 0.04, (0.02, 0.06), 50, 50), "either") == \
        ("inconclusive", "interval too wide to call: it reaches both inside and beyond ±3%")
    assert judgement(Change(100.0, 104.0, 0.04, (0.035, 0.05), 50, 50), "either") == ("changed", "")
    # a region 50% slower by 0.05 ms: under the 0.1 ms floor
    assert judgement(Change(1e-4, 1.5e-4, 0.5, (0.4, 0.6), 50, 50), "lower", 0.03, 1e-4) == \
        ("unchanged", "moved less than the 0.1 ms noise floor")
    assert judgement(Change(1.0, 2.0, 1.0, (0.5, 1.5), 2, 50), "lower")[1].startswith("fewer than")


def test_a_bitmask_is_not_compared_as_a_number(tmp_path):
    """Throttle reasons are flags: their mean over a window means nothing, so neither compare
    nor history keeps them."""
    import pyarrow as pa
    from counterprof.analysis.run_figures import samples_pass
    from counterprof.ground.schema import samples_batch
    catalog = {"gpu.throttle_reasons": {"name": "gpu.throttle_reasons", "unit": "bitmask", "kind": "gauge"},
               "gpu.util": {"name": "gpu.util", "unit": "%", "kind": "gauge"}}
    n = 20
    t = [(i + 1) * 100_000_000 for i in range(n)]
    b = pa.concat_tables([pa.Table.from_batches([samples_batch(
        t, [None] * n, "nvml", [m] * n, ["gpu:0"] * n, [float(v)] * n, [1.0] * n)])
        for m, v in (("gpu.throttle_reasons", 4), ("gpu.util", 50))])
    per_window, *_ = samples_pass(lambda _r: b.to_batches(), [0], catalog, 0, t[-1], 500_000_000,
                                  100_000_000)
    assert "gpu.util" in per_window and "gpu.throttle_reasons" not in per_window
