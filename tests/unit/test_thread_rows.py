"""The threads collector's rows built as columns: the same rows, row for row, as the definitions
say (each role's seconds from the walk's sums, the critical thread's changes between readings)."""
import numpy as np

from counterprof.collectors.thread_rows import COMM, INTRAOP, LOADER, OTHER, ThreadRows
from counterprof.collectors.threads import ThreadsCollector


def rows_of(batch):
    d = batch.to_pydict()
    return [(t.value if hasattr(t, "value") else t, dur, m, e, v)
            for t, dur, m, e, v in zip(d["time"], d["duration_ns"], d["metric"], d["entity"], d["value"])]


def test_walks_give_each_roles_seconds_and_the_counts_without_a_duration():
    rows = ThreadRows("threads")
    run = np.zeros((2, 6))
    wait = np.zeros((2, 6))
    run[0, INTRAOP], wait[0, INTRAOP], run[0, LOADER], run[0, COMM], run[0, OTHER] = 0.5, 0.1, 0.25, 0.03, 0.02
    run[1, INTRAOP], wait[1, LOADER], wait[1, OTHER] = 0.7, 0.2, 0.05
    rows.walks(np.array([1_000, 2_000]), np.array([100, 1_000]), run, wait, np.array([4, 5]), np.array([2, 2]))
    batch = rows.take()
    assert batch.schema.field("source").type == batch.schema.field("metric").type
    got = rows_of(batch)
    assert len(got) == 18
    first = {m: (t, dur, e, v) for t, dur, m, e, v in got[:9]}
    assert first["thread.intraop.running"] == (1_000, 100, "process", 0.5)
    assert first["thread.intraop.runnable"] == (1_000, 100, "process", 0.1)
    assert first["thread.loader.running"][3] == 0.25 and first["thread.comm.running"][3] == 0.03
    assert first["thread.other.running"][3] == 0.02 and "thread.comm.runnable" not in first
    assert first["thread.intraop.count"] == (1_000, None, "process", 4.0)
    assert first["thread.loader.workers"] == (1_000, None, "process", 2.0)
    second = {m: (t, dur, v) for t, dur, m, _e, v in got[9:]}
    assert second["thread.intraop.running"] == (2_000, 1_000, 0.7)
    assert second["thread.loader.runnable"] == (2_000, 1_000, 0.2)
    assert second["thread.other.runnable"] == (2_000, 1_000, 0.05)
    assert rows.take() is None                      # taken: nothing pending


def test_main_readings_are_the_changes_between_readings_and_blocked_the_rest():
    rows = ThreadRows("threads")
    s = 1_000_000_000
    rows.main_readings(np.array([2 * s, 3 * s]), np.array([400_000_000, 300_000_000]),
                       np.array([100_000_000, 150_000_000]), (s, 0, 0), "tid:7")
    got = rows_of(rows.take())
    assert [(t, d, m, e) for t, d, m, e, _v in got] == [
        (2 * s, s, "thread.main.running", "tid:7"), (2 * s, s, "thread.main.runnable", "tid:7"),
        (2 * s, s, "thread.main.blocked", "tid:7"),
        (3 * s, s, "thread.main.running", "tid:7"), (3 * s, s, "thread.main.runnable", "tid:7"),
        (3 * s, s, "thread.main.blocked", "tid:7")]
    values = [v for *_x, v in got]
    # a run count that went down (a tid reused) is no time at all, never negative
    assert np.allclose(values, [0.4, 0.1, 0.5, 0.0, 0.05, 0.95])


def test_chunks_keep_their_order_and_entities():
    rows = ThreadRows("threads")
    rows.main_readings(np.array([20]), np.array([5]), np.array([1]), (10, 0, 0), "tid:1")
    rows.walks(np.array([30]), np.array([20]), np.zeros((1, 6)), np.zeros((1, 6)), np.array([0]), np.array([0]))
    rows.main_readings(np.array([40]), np.array([9]), np.array([1]), (20, 5, 1), "tid:2")
    got = rows_of(rows.take())
    assert [t for t, *_x in got] == [20] * 3 + [30] * 9 + [40] * 3
    assert [e for _t, _d, _m, e, _v in got] == ["tid:1"] * 3 + ["process"] * 9 + ["tid:2"] * 3


def test_the_collectors_readings_start_with_a_baseline_and_skip_what_crossed():
    col = ThreadsCollector()
    col.critical = None
    col._main_prev = None
    col._main_readings(np.array([100]), np.array([10]), np.array([0]))     # a baseline: no rows
    assert col._rows.take() is None
    assert col._main_prev == (100, 10, 0)
    # the sampler's last tick (90) and our own read (100) crossed: 90 is dropped, 150 counted
    col._main_readings(np.array([90, 150]), np.array([5, 30]), np.array([0, 4]))
    got = rows_of(col._rows.take())
    assert [(t, d, m, e) for t, d, m, e, _v in got][0] == (150, 50, "thread.main.running", "tid:?")
    assert [v for *_x, v in got][:2] == [20 / 1e9, 4 / 1e9]
    assert col._main_prev == (150, 30, 4)
