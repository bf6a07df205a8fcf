"""compare is honest about noise: the statuses (a change too wide to call is inconclusive, not
unchanged), the contention figures of a run, and the rule that says when the machine's
contention explains a change (and what the gate does then)."""
import json

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from counterprof.analysis.compare import compare, explain, judge, judgement, machine
from counterprof.analysis.compare_bootstrap import Change
from counterprof.analysis.run_figures import STEP, Contention, RunFigures, run_figures
from counterprof.ground.thresholds import value
from counterprof.render.compare import compare_markdown, compare_text
from counterprof.ground.schema import samples_batch, spans_batch


# ---- the statuses ------------------------------------------------------------------------------

@pytest.mark.parametrize("change, ci, direction, status", [
    (6.31, (-0.08, 13.01), "lower", "inconclusive"),     # the "+631% unchanged"
    (0.01, (-0.04, 0.06), "lower", "inconclusive"),      # holds 0 and changes beyond ±3%
    (0.02, (0.005, 0.05), "lower", "inconclusive"),      # a change, but maybe under 3%, maybe over
    (0.02, (0.01, 0.025), "lower", "unchanged"),         # a change, certainly under 3%
    (-0.01, (-0.02, 0.029), "lower", "unchanged"),
    (0.04, (0.01, 0.07), "lower", "regression"),         # a time: excludes 0, median beyond 3%
    (-0.10, (-0.12, -0.08), "lower", "improvement"),
    (0.04, (0.01, 0.07), "either", "inconclusive"),      # a counter: its whole interval must be beyond
    (0.10, (0.08, 0.12), "either", "changed"),
    (0.50, (0.40, 0.60), "context", "context"),
    (0.01, (-0.20, 0.30), "context", "inconclusive"),
])
def test_statuses(change, ci, direction, status):
    assert judge(Change(1.0, 1.0 + change, change, ci, 50, 50), direction) == status


def test_the_noise_floor_widens_a_regions_band():
    # a 1 ms region: the 0.1 ms floor is 10% of it
    assert judgement(Change(1e-3, 1.08e-3, 0.08, (0.05, 0.09), 50, 50), "lower", 0.03, 1e-4) == \
        ("unchanged", "moved less than the 0.1 ms noise floor")
    status, why = judgement(Change(1e-3, 1.08e-3, 0.08, (0.05, 0.11), 50, 50), "lower", 0.03, 1e-4)
    assert status == "inconclusive" and "±10%" in why
    assert judge(Change(1e-3, 1.2e-3, 0.2, (0.15, 0.25), 50, 50), "lower", 0.03, 1e-4) == "regression"


intervals = st.tuples(st.floats(-2, 5), st.floats(-2, 5), st.floats(-2, 5)).map(sorted)


@given(intervals, st.sampled_from(["lower", "either", "context"]), st.sampled_from([0.01, 0.03, 0.1]))
def test_every_interval_gets_exactly_the_status_its_definition_says(iv, direction, threshold):
    lo, mid, hi = iv
    status = judge(Change(1.0, 1.0 + mid, mid, (lo, hi), 50, 50), direction, threshold)
    inside = -threshold < lo and hi < threshold
    assert (status == "unchanged") == inside
    if status in ("regression", "improvement", "changed", "context"):
        assert lo > 0 or hi < 0                       # a flagged change excludes "no change"
        assert abs(mid) >= threshold
    if status == "changed":
        assert lo >= threshold or hi <= -threshold
    if status == "inconclusive":
        assert not inside
    assert status in ({"regression", "improvement", "unchanged", "inconclusive"} if direction == "lower" else
                      {"changed", "unchanged", "inconclusive"} if direction == "either" else
                      {"context", "unchanged", "inconclusive"})


def steps_run(run_id, step_s, sd, n, seed, wait=None, workload_cpus=None, busy_cpus=None):
    rng = np.random.default_rng(seed)
    f = RunFigures(path=f"/runs/{run_id}", run_id=run_id, command=["python", "train.py"], ranks=[0],
                   window_s=1.0)
    f.times[STEP] = {0: np.abs(rng.normal(step_s, sd, n))}
    if wait is not None:
        f.contention = Contention("proc.run_delay", {"run": wait, STEP: wait}, 1.0, workload_cpus,
                                  busy_cpus, 2)
    return f


def test_a_wide_interval_straddling_the_threshold_is_inconclusive_in_text_json_and_the_gate():
    base = steps_run("a", 0.100, 0.030, 12, 1)
    cand = steps_run("b", 0.105, 0.030, 12, 2)
    cmp = compare([base], [cand])
    (step,) = [r for r in cmp.rows if r.key == STEP]
    assert step.ci[0] < -0.03 and step.ci[1] > 0.03          # straddles the threshold both ways
    assert step.status == "inconclusive" and "too wide to call" in step.note
    j = json.loads(json.dumps(cmp.to_json(), default=str))
    assert j["inconclusive"] == 1 and j["regressions"] == 0 and j["failed"] is False
    assert j["rows"][0]["status"] == "inconclusive"
    text = compare_text(cmp)
    assert "0 regressions, 0 improvements, 0 changed, 1 inconclusive" in text.splitlines()[0]
    (line,) = [x for x in text.splitlines() if x.startswith("step time")]
    assert "inconclusive" in line and "too wide to call" in line
    assert "⚪ inconclusive" in compare_markdown(cmp)


# ---- contention --------------------------------------------------------------------------------

def contended_pair(slowdown, wait_b=0.04, wait_c=0.52, own_b=0.9, own_c=0.45, strict=False):
    base = steps_run("a", 0.022, 0.0002, 30, 1, wait_b, own_b, 1.9)
    cand = steps_run("b", 0.022 * slowdown, 0.0002, 30, 2, wait_c, own_c, 1.95)
    return compare([base], [cand], strict=strict)


def test_contention_that_accounts_for_the_change_explains_it_and_the_gate_passes():
    # as measured in tests/integration/test_compare_contention.py: +114%, waits 5% -> 53%
    cmp = contended_pair(2.14)
    (step,) = [r for r in cmp.rows if r.key == STEP]
    assert step.status == "regression" and step.contention == "explains" and step.explained
    k = (1 - 0.52) / (1 - 0.04)
    assert step.adjusted_change == pytest.approx((1 + step.change) * k - 1)
    assert abs(step.adjusted_change) < 0.1
    assert cmp.regressions == [step] and cmp.failing == [] and not cmp.failed
    text = compare_text(cmp)
    assert "REGRESSION" not in text and "slower (machine)" in text
    (mline,) = [x for x in text.splitlines() if x.startswith("machine: ")]
    assert "waited for a CPU 52% of its steps' time vs the baseline's 4%" in mline
    assert "the machine was busier for the candidate" in mline and "contention explains step time" in mline
    (row,) = [x for x in text.splitlines() if x.startswith("step time")]
    assert "the candidate waited for a CPU 52% of the time vs 4%: contention explains this" in row
    j = cmp.to_json()
    assert j["explained_by_contention"] == 1 and j["failed"] is False
    assert j["machine"]["moved"] and j["machine"]["wait_change"] == pytest.approx(0.48)
    assert j["machine"]["busier"] == "candidate" and j["machine"]["scope"] == STEP
    assert j["machine"]["cut_offs"]["contention_wait_points"] == value("contention_wait_points")
    assert "🟠 slower (machine)" in compare_markdown(cmp)


def test_strict_fails_on_an_explained_regression():
    cmp = contended_pair(2.14, strict=True)
    assert cmp.failed and len(cmp.failing) == 1
    text = compare_text(cmp)
    assert "REGRESSION" in text and text.startswith("counterprof compare: 1 regression,")


def test_contention_that_accounts_for_part_of_the_change_does_not_explain_it():
    cmp = contended_pair(3.4)            # +240%: the wait alone implies +100%, +70% is left
    (step,) = [r for r in cmp.rows if r.key == STEP]
    assert step.contention == "partly" and not step.explained and cmp.failed
    assert step.adjusted_change > 0.5
    assert "contention explains only part of this" in compare_text(cmp)


def test_a_wait_that_the_workloads_own_threads_may_cause_is_not_the_machine():
    # the candidate used 0.5 CPUs more itself while its main thread waited 48 points more
    cmp = contended_pair(2.14, own_c=1.4)
    (step,) = [r for r in cmp.rows if r.key == STEP]
    assert step.contention == "own" and not step.explained and cmp.failed
    assert cmp.machine.moved and cmp.machine.busier == ""          # not the machine's doing
    assert "its own threads may be the competition" in compare_text(cmp)


def test_no_explanation_without_a_moved_wait_or_in_the_wrong_direction():
    same = contended_pair(1.5, wait_b=0.04, wait_c=0.06)        # waited 2 points more: noise
    assert [r.contention for r in same.rows if r.key == STEP] == [""] and same.failed
    backwards = contended_pair(1.5, wait_b=0.52, wait_c=0.04)   # slower, though it waited less
    assert [r.contention for r in backwards.rows if r.key == STEP] == [""] and backwards.failed
    base, cand = steps_run("a", 0.022, 0.0002, 30, 1), steps_run("b", 0.044, 0.0002, 30, 2)
    none = compare([base], [cand])                              # no wait figures at all
    assert none.failed and all(not r.contention for r in none.rows)
    assert "machine:" not in compare_text(none)


def test_an_improvement_from_a_contended_baseline_is_explained_too():
    base = steps_run("a", 0.047, 0.0002, 30, 1, 0.52, 0.45, 1.95)
    cand = steps_run("b", 0.022, 0.0002, 30, 2, 0.04, 0.9, 1.9)
    cmp = compare([base], [cand])
    (step,) = [r for r in cmp.rows if r.key == STEP]
    assert step.status == "improvement" and step.contention == "explains"
    assert "faster (machine)" in compare_text(cmp) and cmp.machine.busier == "baseline"


def test_the_cut_offs_are_the_thresholds_tables():
    row_explains = lambda points: explain_step(0.04, 0.04 + points)   # noqa: E731
    edge = value("contention_wait_points")
    assert row_explains(edge + 0.01) == "explains"
    assert row_explains(edge - 0.01) == ""


def explain_step(wb, wc):
    """The contention of a step that got exactly as much slower as a CPU-bound thread waiting
    wc instead of wb would."""
    change = (1 - wb) / (1 - wc) - 1
    base, cand = steps_run("a", 0.1, 0.0, 10, 1, wb, 0.9, 1.9), steps_run("b", 0.1, 0.0, 10, 1, wc, 0.9, 1.9)
    from counterprof.analysis.compare import Row
    row = Row(STEP, None, "s", "lower", "regression", 0.1, 0.1 * (1 + change), change,
              (change * 0.9, change * 1.1), 10, 10)
    explain(row, machine([base], [cand]))
    return row.contention


# ---- a run's contention figures ----------------------------------------------------------------

def synthetic_run(wait_metric="proc.run_delay", processes=1.0):
    """2 s in 100 ms host samples: the main thread waits 10 ms per sample in the first second,
    50 ms in the second; the tree uses 0.5 CPUs; the machine (2 CPUs) is 75% busy. One step per
    sample, and a region "late" over the second second."""
    catalog = {m: {"name": m, "unit": u, "kind": k, "source": "host"} for m, u, k in (
        ("proc.run_delay", "s", "delta"), ("thread.main.runnable", "s", "delta"),
        ("proc.cpu_user", "s", "delta"), ("proc.cpu_system", "s", "delta"),
        ("proc.processes", "count", "gauge"), ("system.cpu_util", "percent", "ratio"))}
    n, dt = 20, 100_000_000
    t = [(i + 1) * dt for i in range(n)]
    rows = []
    for metric, vals in ((wait_metric, [0.01 * processes] * 10 + [0.05 * processes] * 10),
                         ("proc.cpu_user", [0.04] * n), ("proc.cpu_system", [0.01] * n),
                         ("proc.processes", [processes] * n), ("system.cpu_util", [75.0] * n)):
        gauge = metric == "proc.processes"
        rows.append(pa.Table.from_batches([samples_batch(
            t, [None if gauge else dt] * n, "host", [metric] * n, ["process"] * n, vals)]))
    samples = pa.concat_tables(rows)
    steps = [(i * dt, (i + 1) * dt) for i in range(n)]
    spans = pa.Table.from_batches([spans_batch(
        [s for s, _ in steps] + [10 * dt], [e for _, e in steps] + [20 * dt],
        ["step"] * n + ["late"], ["step"] * n + ["region"])])
    spans = spans.append_column("rank", pa.array([0] * spans.num_rows, pa.int32()))
    meta = {"id": "syn", "start_ns": 0, "end_ns": n * dt, "host": {"cpus": 2},
            "collectors": {"host": {"status": "ok", "config": {"interval_ms": 100}}}}
    return run_figures("/runs/syn", meta, catalog, [0], lambda _r: samples.to_batches(), spans)


def test_a_runs_waits_per_scope_and_the_other_processes_cpu():
    c = synthetic_run().contention
    assert c.wait_source == "proc.run_delay" and c.main_threads == 1.0
    assert c.waits["run"] == pytest.approx(0.30, abs=0.01)
    assert c.waits[STEP] == pytest.approx(0.30, abs=0.01)
    assert c.waits["region:late"] == pytest.approx(0.50, abs=0.01)
    assert c.workload_cpus == pytest.approx(0.5, abs=0.01)
    assert c.busy_cpus == pytest.approx(1.5) and c.cpus == 2
    assert c.other_cpus == pytest.approx(1.0, abs=0.01) and c.other_share == pytest.approx(0.5, abs=0.01)


def test_run_delay_is_per_main_thread_and_the_threads_collectors_wait_is_preferred():
    c = synthetic_run(processes=3.0).contention          # three processes' main threads, summed
    assert c.main_threads == 3.0 and c.waits["run"] == pytest.approx(0.30, abs=0.01)
    c = synthetic_run(wait_metric="thread.main.runnable").contention
    assert c.wait_source == "thread.main.runnable" and c.waits["region:late"] == pytest.approx(0.5, abs=0.01)


@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(1, 50)), max_size=20),
       st.lists(st.integers(-10, 1100), min_size=1, max_size=30))
def test_the_covered_length_before_each_time_is_the_brute_force_one(pairs, times):
    from counterprof.analysis import intervals as iv
    from counterprof.analysis.run_figures import _covered
    scope = iv.merge((a, a + n) for a, n in pairs)
    if not scope:
        return
    t = np.array(times, np.int64)
    brute = [sum(max(0, min(b, x) - a) for a, b in scope) for x in times]
    assert _covered(scope, t).tolist() == brute
