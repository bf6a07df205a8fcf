"""The verdict follows the critical (main) thread: its states share out the time; helper
threads' CPU is evidence, never the step's time (issue 10). Recorded signal values here; the
real jobs are in tests/integration/test_verdict_jobs.py."""
import pyarrow as pa
import pytest

from counterprof.analysis.classify import classify, describe
from counterprof.analysis.signals import RunData, Signal, load_samples, load_spans, signals


def sig(**values):
    out = {"wall_s": Signal(10.0, "run")}
    for k, v in values.items():
        out[k] = Signal(v, "threads")
    return out


def test_busy_helpers_do_not_hide_a_sleeping_main_thread():
    # GPT-2 loop with a sleep: the intra-op pool keeps 1.6 CPUs busy while the main thread
    # sleeps 40% of each step: today's task-clock rule said "busy CPU 100%"
    v = classify(sig(cpu_busy=1.7, main_running=0.6, main_runnable=0.0, main_blocked=0.4,
                     intraop_cpus=1.6))
    assert v.shares["host"] == pytest.approx(0.4)
    assert v.shares["compute|memory"] == pytest.approx(0.6)
    assert v.host_parts == {"blocked": pytest.approx(0.4)}
    assert "blocked 40%" in v.evidence[0].text and "main thread" in v.evidence[0].text
    helpers = next(e for e in v.evidence if e.metric == "helpers")
    assert "intra-op threads 1.60 CPUs" in helpers.text and "not the step's time" in helpers.text


def test_input_pipeline_wait_is_host_and_says_whether_workers_are_saturated():
    v = classify(sig(main_running=0.1, main_runnable=0.0, main_blocked=0.9, input_wait=0.85,
                     loader_cpus=1.9, loader_workers=2.0, loader_busy=0.95))
    assert v.verdict == "host"
    assert v.host_parts["input pipeline"] == pytest.approx(0.85)
    assert v.host_parts["blocked"] == pytest.approx(0.05)
    text = next(e.text for e in v.evidence if e.metric == "input_wait")
    assert "saturated: more workers" in text and "2 workers busy 95%" in text
    assert describe(v) == "host-bound (90% of the time; input pipeline 85%)"
    # the main thread on its own CPU inside next() (unpickling, pinning large batches) while
    # the workers idle: not the workers' speed
    idle = classify(sig(main_running=0.9, main_runnable=0.0, main_blocked=0.1, input_wait=0.85,
                        loader_cpus=0.6, loader_workers=2.0, loader_busy=0.3))
    assert "not saturated" in next(e.text for e in idle.evidence if e.metric == "input_wait")


def test_workers_blocked_on_io_want_more_workers_not_more_prefetch():
    """Workers off the CPU and not waiting for one while the main thread waits blocked for
    them: a fetch from storage or the network (tests/jobs/dataloader_io.py is the real job)."""
    v = classify(sig(main_running=0.03, main_runnable=0.0, main_blocked=0.97, input_wait=0.95,
                     loader_cpus=0.04, loader_workers=2.0, loader_busy=0.02, loader_runnable=0.01))
    text = next(e.text for e in v.evidence if e.metric == "input_wait")
    assert "2 workers busy 2%" in text and "blocked 97%" in text, text
    assert "num_workers" in text and "more prefetch" not in text, text
    # below the threshold (half their time), or with runnable time taking the rest: other texts
    half = classify(sig(main_running=0.03, main_runnable=0.0, main_blocked=0.97, input_wait=0.95,
                        loader_cpus=0.04, loader_workers=2.0, loader_busy=0.3, loader_runnable=0.3))
    assert "blocked" not in next(e.text for e in half.evidence if e.metric == "input_wait")


def test_a_loader_without_workers_loads_on_the_main_thread():
    # num_workers=0: the main thread is on-CPU inside next(): still the input pipeline
    v = classify(sig(main_running=0.95, main_runnable=0.0, main_blocked=0.05, input_wait=0.7))
    assert v.shares["host"] == pytest.approx(0.7)     # the 5% blocked was inside next()
    assert v.shares["compute|memory"] == pytest.approx(0.3)
    assert "num_workers=0" in next(e.text for e in v.evidence if e.metric == "input_wait")


def test_runnable_main_thread_is_cpu_contention_naming_the_other_processes():
    v = classify(sig(main_running=0.45, main_runnable=0.5, main_blocked=0.05),
                 facts={"main_threads": [{"pid": 4242, "tid": 4242, "comm": "python"}],
                        "contenders": [{"pid": 77, "comm": "stress", "cpu_s": 4.1}]})
    assert v.verdict == "host"
    assert v.host_parts["CPU contention"] == pytest.approx(0.5)
    assert describe(v) == "host-bound (55% of the time; CPU contention 50%)"
    text = next(e.text for e in v.evidence if e.metric == "main_runnable")
    assert "stress (pid 77, 4.1 CPU-s)" in text
    assert "python, pid 4242" in v.evidence[0].text


def test_exposed_collectives_count_not_the_overlapped_ones():
    v = classify(sig(main_running=0.8, main_runnable=0.0, main_blocked=0.2, cpu_collective=0.26,
                     cpu_collective_exposed=0.08, cpu_collective_overlap=0.45))
    assert v.shares["collectives"] == pytest.approx(0.08)
    assert v.shares["host"] == pytest.approx(0.12)
    text = next(e.text for e in v.evidence if e.metric == "cpu_collective_exposed")
    assert "45% of its collective time overlapped" in text
    mostly = classify(sig(main_running=0.1, main_runnable=0.0, main_blocked=0.9,
                          cpu_collective=0.9, cpu_collective_exposed=0.85))
    assert mostly.verdict == "collectives"


def test_per_rank_collective_exposure_from_spans():
    """Rank 0's main thread runs ops over half of its collective; rank 1 waits through all of
    it; the union over ranks (today's 'inside CPU collectives') would say 100%."""
    ms = 1_000_000
    rows = [  # (start, end, name, category, rank, tid)
        (0, 100 * ms, "window", "window", 0, 1), (0, 100 * ms, "window", "window", 1, 2),
        (0, 100 * ms, "ProfilerStep#1", "step", 0, 1), (0, 100 * ms, "ProfilerStep#1", "step", 1, 2),
        (0, 50 * ms, "aten::addmm", "cpu_op", 0, 1), (0, 40 * ms, "aten::addmm", "cpu_op", 1, 2),
        (20 * ms, 60 * ms, "gloo:all_reduce", "collective", 0, 9),
        (40 * ms, 80 * ms, "gloo:all_reduce", "collective", 1, 8),
        (60 * ms, 61 * ms, "c10d::allreduce_", "cpu_op", 1, 2),   # a wait op is not own compute
    ]
    spans = pa.table({
        "start": pa.array([r[0] for r in rows], pa.int64()).cast(pa.timestamp("ns", "UTC")),
        "end": pa.array([r[1] for r in rows], pa.int64()).cast(pa.timestamp("ns", "UTC")),
        "name": [r[2] for r in rows], "category": [r[3] for r in rows],
        "kernel_class": pa.array([None] * len(rows), pa.string()),
        "device": pa.array([None] * len(rows), pa.int64()),
        "rank": [r[4] for r in rows], "tid": [r[5] for r in rows]})
    data = RunData(ranks=2)
    load_spans(data, spans, 10.0)
    s = signals(data, [(0, 100 * ms)])
    # rank 0: 40 ms in collectives, 30 of them under its own ops -> 10 exposed; rank 1: 40 exposed
    assert s["cpu_collective_exposed"].value == pytest.approx((10 + 40) / (2 * 100))
    assert s["cpu_collective_overlap"].value == pytest.approx(1 - 50 / 80)
    assert s["cpu_collective"].value == pytest.approx(0.6)   # the union of any rank's


def test_thread_state_samples_become_main_thread_signals():
    ms = 1_000_000
    n = 10
    t = [100 * ms * (i + 1) for i in range(n)]
    rows = {"time": [], "duration_ns": [], "source": [], "metric": [], "entity": [], "value": []}
    for ti in t:
        for metric, v in (("thread.main.running", 0.06), ("thread.main.runnable", 0.01),
                          ("thread.main.blocked", 0.03), ("thread.intraop.running", 0.15)):
            rows["time"].append(ti)
            rows["duration_ns"].append(100 * ms)
            rows["source"].append("threads")
            rows["metric"].append(metric)
            rows["entity"].append("tid:1")
            rows["value"].append(v)
    table = pa.table(rows).set_column(0, "time", pa.array(rows["time"], pa.int64()).cast(pa.timestamp("ns", "UTC")))
    catalog = {m: {"kind": "delta", "unit": "s"} for m in set(rows["metric"])}
    data = RunData()
    load_samples(data, [table], catalog, bucket_ns=100 * ms)
    s = signals(data, [(0, n * 100 * ms)])
    assert s["main_running"].value == pytest.approx(0.6)
    assert s["main_runnable"].value == pytest.approx(0.1)
    assert s["main_blocked"].value == pytest.approx(0.3)
    assert s["intraop_cpus"].value == pytest.approx(1.5)
    v = classify(s)
    assert v.shares["host"] == pytest.approx(0.4)
