"""The critical thread's three states add up: running + runnable + blocked is each row's interval,
while running and runnable over the run stay schedstat's (collectors/thread_rows.py: settle,
main_states). The recorded readings are a real spin loop's: it never blocks, so any blocked
time is the arithmetic's."""
import json
import struct

import numpy as np
from hypothesis import given, settings, strategies as st

from helpers import REPO
from counterprof.collectors.perf.spill import SCHED, spill_rows
from counterprof.collectors.thread_rows import ThreadRows, main_states, settle

READINGS = REPO / "tests" / "data" / "thread_states" / "spin_contended_10ms.json"


def recorded():
    """(time, run, wait ns) of the spin loop, every 10 ms for 3 s, and its interval deltas."""
    a = np.array(json.loads(READINGS.read_text())["readings"], np.int64)
    return a, np.diff(a[:, 0]), np.diff(a[:, 1]), np.diff(a[:, 2])


def test_the_recorded_readings_show_the_defect_the_old_rule_had():
    """max(0, length - run - wait) per interval: the spin loop 'blocked' ~40% of the time and
    its states over 140% of the wall time, though schedstat's totals say it never blocked."""
    _a, d, r, w = recorded()
    assert abs(d.sum() - r.sum() - w.sum()) < 0.002 * d.sum()           # the truth: never blocked
    old_blocked = np.maximum(0, d - r - w)
    assert old_blocked.sum() > 0.2 * d.sum()
    assert (r + w + old_blocked).sum() > 1.2 * d.sum()


def test_settled_states_add_up_per_interval_and_blocked_is_the_truth():
    _a, d, r, w = recorded()
    run, wait, blocked, carry = settle(d, r, w)
    assert (run + wait + blocked == d).all()                             # exactly, in ns
    assert (run >= 0).all() and (wait >= 0).all() and (blocked >= 0).all()
    # over the run: schedstat's totals, less what is carried past the last reading (none here)
    assert run.sum() + carry[0] == r.sum() and wait.sum() + carry[1] == w.sum()
    assert blocked.sum() == d.sum() - r.sum() - w.sum() + sum(carry)
    assert blocked.sum() <= 0.002 * d.sum()
    # no row with a made-up wait (the total's 0.7 ms, the wait not yet accounted at the last
    # reading, is in one row at the end)
    assert (blocked > 0.01 * d).sum() <= 1 and (blocked[:-5] == 0).all()


def test_forward_only_would_keep_a_lags_worth_of_blocked():
    """main_states alone (no going back) leaves the interval before each new peak of the kernel's
    lag blocked; settle puts those waits back where they happened."""
    _a, d, r, w = recorded()
    *_rw, blocked, carry = main_states(d, r, w)
    *_rw2, settled, _c = settle(d, r, w)
    assert blocked.sum() == d.sum() - r.sum() - w.sum() + sum(carry)
    assert blocked.sum() > settled.sum()


def test_taken_a_second_at_a_time_as_the_collector_does():
    """The rows taken once a second (100 readings at 10 ms): each taking settles its own
    readings, the carry goes on to the next; the same totals, blocked within 2% of the wall."""
    a, d, r, w = recorded()
    rows = ThreadRows("threads")
    values, durations = [], []
    for k in range(1, len(a), 100):
        part = a[k:k + 100]
        rows.main_readings(part[:, 0], part[:, 1], part[:, 2], tuple(int(x) for x in a[k - 1]), "tid:9")
        batch = rows.take().to_pydict()
        assert set(batch["entity"]) == {"tid:9"}
        values += batch["value"]
        durations += batch["duration_ns"][::3]
    v = np.array(values).reshape(-1, 3)
    assert np.allclose(v.sum(axis=1), np.array(durations) / 1e9, rtol=0, atol=1e-9)
    carried = rows.carried_s("tid:9")
    assert abs(v[:, 0].sum() + carried[0] - r.sum() / 1e9) < 1e-6
    assert abs(v[:, 1].sum() + carried[1] - w.sum() / 1e9) < 1e-6
    assert v[:, 2].sum() <= 0.02 * d.sum() / 1e9


def test_a_wait_accounted_late_fills_the_interval_it_happened_in():
    # 10 ns intervals: nothing accounted in the first, the whole 20 ns wait at its end in the second
    run, wait, blocked, carry = settle(np.array([10, 10]), np.array([0, 0]), np.array([0, 20]))
    assert run.tolist() == [0, 0] and wait.tolist() == [10, 10] and blocked.tolist() == [0, 0]
    assert carry == (0, 0)
    # with no interval before it in the same taking, it goes forward instead, into the next rows
    rows = ThreadRows("threads")
    rows.main_readings(np.array([10]), np.array([0]), np.array([20]), (0, 0, 0), "tid:1")
    first = rows.take().to_pydict()["value"]
    assert first == [0.0, 10e-9, 0.0] and rows.carried_s("tid:1") == (0.0, 10e-9)
    rows.main_readings(np.array([20]), np.array([0]), np.array([20]), (10, 0, 20), "tid:1")
    assert rows.take().to_pydict()["value"] == [0.0, 10e-9, 0.0]
    assert rows.carried_s("tid:1") == (0.0, 0.0)


def test_a_new_baseline_does_not_take_the_carry_of_another_series():
    rows = ThreadRows("threads")
    rows.main_readings(np.array([10]), np.array([30]), np.array([0]), (0, 0, 0), "tid:1")
    rows.take()
    assert rows.carried_s("tid:1") == (20e-9, 0.0)
    # not following on from (10, 30, 0): a thread followed afresh, its own baseline
    rows.main_readings(np.array([110]), np.array([60]), np.array([0]), (100, 50, 0), "tid:1")
    assert rows.take().to_pydict()["value"] == [10e-9, 0.0, 0.0]
    assert rows.carried_s("tid:1") == (0.0, 0.0)


def test_the_spill_recovers_the_same_settled_rows():
    """counterprof recover turns the spill's readings into rows with the same code, one record at a
    time: the carry follows the records (each names the reading before it)."""
    a, *_ = recorded()
    records = []
    for k in range(1, len(a)):
        (t, r, w), (pt, pr, pw) = a[k].tolist(), a[k - 1].tolist()
        records.append((SCHED, struct.pack("<qqqiiqqqi4x", t, r, w, 7, 0, pt, pr, pw, 7)))
    labels = {"perf": {"slots": [], "scale": None}, "host": {"metrics": [], "system_from": 0},
              "threads": {"epochs": {"7": "tid:42"}}}
    table = spill_rows(records, labels).to_pydict()
    got = np.array(table["value"]).reshape(-1, 3)
    rows = ThreadRows("threads")
    rows.main_readings(a[1:, 0], a[1:, 1], a[1:, 2], tuple(int(x) for x in a[0]), "tid:42")
    want = np.array(rows.take().to_pydict()["value"]).reshape(-1, 3)
    assert set(table["entity"]) == {"tid:42"}
    assert np.allclose(got, want, rtol=0, atol=1e-12)


intervals = st.lists(st.tuples(st.integers(0, 10**8), st.integers(0, 2 * 10**8), st.integers(0, 2 * 10**8)),
                     min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(intervals, st.integers(0, 10**8), st.integers(0, 10**8))
def test_settle_conserves_each_state_and_fills_every_interval_exactly(rows, c_run, c_wait):
    d, r, w = (np.array(x, np.int64) for x in zip(*rows))
    run, wait, blocked, (out_run, out_wait) = settle(d, r, w, (c_run, c_wait))
    assert (run + wait + blocked == d).all()
    assert (run >= 0).all() and (wait >= 0).all() and (blocked >= 0).all()
    assert run.sum() + out_run == r.sum() + c_run
    assert wait.sum() + out_wait == w.sum() + c_wait
    # carried: only the net excess of the whole taking (each interval's spare room filled first)
    assert out_run + out_wait == max(0, int(r.sum() + w.sum() + c_run + c_wait - d.sum()))


@settings(max_examples=300, deadline=None)
@given(intervals, st.integers(0, 10**8), st.integers(0, 10**8))
def test_main_states_is_the_interval_by_interval_carry(rows, c_run, c_wait):
    """The numpy form against the rule written out one interval at a time."""
    d, r, w = (np.array(x, np.int64) for x in zip(*rows))
    run, wait, blocked, carry = main_states(d, r, w, (c_run, c_wait))
    cr, cw = c_run, c_wait
    for i in range(len(d)):
        pending_run, pending_wait = cr + r[i], cw + w[i]
        over = max(0, pending_run + pending_wait - d[i])
        cw = min(over, pending_wait)           # waits carried first
        cr = over - cw
        assert (run[i], wait[i]) == (pending_run - cr, pending_wait - cw)
        assert blocked[i] == d[i] - (pending_run - cr) - (pending_wait - cw)
    assert carry == (cr, cw)
