"""The live view's sink: per-tick sums from batches, a bounded window, safe from many threads."""
from __future__ import annotations

import threading

import pyarrow as pa
import pytest
from live_batches import MS, T0, host_batch, perf_batch

from counterprof.live.buckets import Bucket
from counterprof.live.window import TICK_NS, LiveWindow, fold
from counterprof.ground.schema import SAMPLES_SCHEMA, samples_batch


def test_fold_sums_rows_of_one_tick_and_keeps_unknown_apart():
    # three 100 ms intervals ending inside tick 0 of T0 (250 ms ticks), one value unknown
    b = samples_batch([T0 + 50 * MS, T0 + 150 * MS, T0 + 240 * MS], [100 * MS] * 3, "perf",
                      ["cycles"] * 3, ["process"] * 3, [10.0, None, 30.0], [1.0, 0.0, 0.5])
    (key, tick, bucket), = fold(b, TICK_NS)
    assert key == ("perf", "cycles", "process")
    assert tick == T0 // TICK_NS
    assert bucket == Bucket(vsum=40.0, vdur=4000.0 * MS, kdur=200.0 * MS, qdur=150.0 * MS,
                            dur=300.0 * MS, known=2, unknown=1, last=30.0, vmax=30.0,
                            t_last=T0 + 240 * MS)


def test_fold_splits_ticks_series_and_entities():
    b = samples_batch([T0 + 100 * MS, T0 + 300 * MS, T0 + 300 * MS, T0 + 300 * MS],
                      [100 * MS] * 4, "nvml", ["gpu.util", "gpu.util", "gpu.util", "gpu.power"],
                      ["gpu:0", "gpu:0", "gpu:1", "gpu:0"], [1.0, 2.0, 3.0, 4.0])
    got = {(k, t - T0 // TICK_NS): bk.vsum for k, t, bk in fold(b, TICK_NS)}
    assert got == {(("nvml", "gpu.util", "gpu:0"), 0): 1.0,
                   (("nvml", "gpu.util", "gpu:0"), 1): 2.0,
                   (("nvml", "gpu.util", "gpu:1"), 1): 3.0,
                   (("nvml", "gpu.power", "gpu:0"), 1): 4.0}


def test_threads_and_cpus_are_summed_side_by_side():
    # --per-thread: three threads over the same 100 ms; -A: two CPUs
    b = samples_batch([T0 + 100 * MS] * 5, [100 * MS] * 5, "perf", ["task-clock"] * 5,
                      ["tid:1", "tid:2", "tid:3", "cpu:0", "cpu:1"], [10.0, 20.0, None, 5.0, 6.0],
                      [1.0, 1.0, 0.0, 0.5, 1.0])
    got = {k[2]: bk for k, _t, bk in fold(b, TICK_NS)}
    assert set(got) == {"tid:*", "cpu:*"}
    threads = got["tid:*"]
    # values add, the interval is not counted three times, the share counted is the worst
    assert (threads.vsum, threads.kdur, threads.dur, threads.known, threads.unknown) == (
        30.0, 100 * MS, 100 * MS, 2, 1)
    assert threads.qdur == 0.0
    assert (got["cpu:*"].vsum, got["cpu:*"].qdur) == (11.0, 50 * MS)


def test_fold_takes_plain_string_columns_too():
    plain = pa.RecordBatch.from_arrays([
        pa.array([T0 + MS], pa.int64()).cast(SAMPLES_SCHEMA.field("time").type),
        pa.array([None], pa.int64()), pa.array(["nvml"]), pa.array(["gpu.util"]),
        pa.array(["gpu:0"]), pa.array([42.0]), pa.array([1.0], pa.float32())],
        names=SAMPLES_SCHEMA.names)
    (key, _t, bucket), = fold(plain, TICK_NS)
    assert key == ("nvml", "gpu.util", "gpu:0") and bucket.last == 42.0 and bucket.dur == 0


def test_batches_merge_into_the_same_tick():
    w = LiveWindow()
    w.write("samples", perf_batch(T0 + 100 * MS, 100 * MS, {"task-clock": 5e7}), 0)
    w.write("samples", perf_batch(T0 + 200 * MS, 100 * MS, {"task-clock": 7e7}), 0)
    snap = w.snapshot()
    b = snap.series[("perf", "task-clock", "process")][T0 // TICK_NS]
    assert (b.vsum, b.kdur, b.known, b.last) == (12e7, 200 * MS, 2, 7e7)
    assert snap.newest == T0 // TICK_NS and snap.version == 2 and w.rows_seen == 2


def test_spans_and_empty_batches_are_ignored():
    w = LiveWindow()
    w.write("spans", perf_batch(T0, MS, {"x": 1.0}), 0)
    w.write("samples", perf_batch(T0, MS, {"x": 1.0}).slice(0, 0), 0)
    assert w.snapshot().series == {} and w.version == 0


def test_memory_is_bounded_to_the_window_and_stale_series_go():
    w = LiveWindow(window_s=60)
    # two minutes at 100 ms; a thread (tid:7) that ends after 10 s
    for i in range(1200):
        t = T0 + (i + 1) * 100 * MS
        w.write("samples", perf_batch(t, 100 * MS, {"task-clock": 1e8}), 0)
        if i < 100:
            w.write("samples", perf_batch(t, 100 * MS, {"task-clock": 1e8}, entity="tid:7"), 0)
    snap = w.snapshot()
    key = ("perf", "task-clock", "process")
    assert set(snap.series) == set(snap.history) == {key}
    ticks = snap.series[key]                       # display ticks: the last 8 s
    assert len(ticks) == w.recent_ticks == 32 and min(ticks) == snap.newest - 31
    seconds = snap.history[key]                    # one-second buckets: the last 60 s
    assert len(seconds) == 60 and min(seconds) == snap.newest // 4 - 59
    # both resolutions hold the same counts for the time they share
    assert sum(seconds[t].vsum for t in range(snap.newest // 4 - 6, snap.newest // 4 + 1)) == \
        pytest.approx(sum(b.vsum for t, b in ticks.items() if t // 4 >= snap.newest // 4 - 6))


def test_concurrent_writers_lose_nothing():
    w = LiveWindow(window_s=3600, recent_s=3600)
    n_threads, n_batches = 4, 300

    def writer(k):
        for i in range(n_batches):
            w.write("samples", host_batch(T0 + i * 100 * MS, 100 * MS,
                                          {"proc.cpu_user": 0.01 * (k + 1), "proc.rss": float(i)}), 0)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = w.snapshot()
    user = snap.series[("host", "proc.cpu_user", "process")]
    assert sum(b.known for b in user.values()) == n_threads * n_batches
    assert sum(b.vsum for b in user.values()) == pytest.approx(n_batches * 0.01 * (1 + 2 + 3 + 4))
    assert w.rows_seen == 2 * n_threads * n_batches
    assert w.version == n_threads * n_batches


def test_snapshot_is_a_copy():
    w = LiveWindow()
    w.write("samples", perf_batch(T0 + MS, MS, {"task-clock": 1.0}), 0)
    snap = w.snapshot()
    w.write("samples", perf_batch(T0 + 2 * MS, MS, {"task-clock": 1.0}), 0)
    assert snap.series[("perf", "task-clock", "process")][T0 // TICK_NS].vsum == 1.0


def test_a_row_stamped_far_ahead_is_left_out_not_made_now():
    """A damaged time (the year 2200) would make every real series fall out of the window."""
    import time as _time
    from counterprof.live.window import LiveWindow
    from counterprof.ground.schema import samples_batch
    w = LiveWindow()
    now = _time.time_ns()
    w.write("samples", samples_batch([now - 10**9, now, 7_258_000_000 * 10**9], [10**8] * 3, "perf",
                                     ["task-clock"] * 3, ["process"] * 3, [1.0, 2.0, 3.0]))
    assert w.rows_ahead == 1
    assert w._newest == now // w.tick_ns
