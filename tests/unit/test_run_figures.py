"""A run reduced for compare/history: per-window rates and means, per-rank values, step and region
durations, and the classifier's input built from the same pass agreeing with report's."""
import numpy as np
import pyarrow as pa
import pytest

from counterprof.analysis.classify import classify
from counterprof.analysis.run_figures import default_window_ns, run_figures, span_times, summary_series
from counterprof.analysis.signals import RunData, load_samples, signals
from counterprof.ground.schema import SAMPLES_SCHEMA, spans_batch

T0 = 1_700_000_000_000_000_000
MS = 1_000_000
CATALOG = {"task-clock": {"name": "task-clock", "unit": "ns", "kind": "delta", "source": "perf"},
           "page-faults": {"name": "page-faults", "unit": "count", "kind": "delta", "source": "perf"},
           "proc.rss": {"name": "proc.rss", "unit": "bytes", "kind": "gauge", "source": "host"}}
META = {"id": "r", "command": ["python", "x.py"], "start_ns": T0, "end_ns": T0 + 4000 * MS,
        "collectors": {"perf": {"status": "ok", "config": {"interval_ms": 10}},
                       "host": {"status": "ok", "config": {"interval_ms": 100}}}}


def samples(rank: int, cpus: float, faults_null_at: int | None = None) -> pa.RecordBatch:
    """4 s: task-clock every 10 ms (cpus CPUs busy), page-faults 5 per 10 ms, rss every 100 ms."""
    rows = {k: [] for k in ("time", "duration_ns", "source", "metric", "entity", "value", "quality")}

    def add(t, dur, src, metric, value):
        for k, v in zip(rows, (t, dur, src, metric, "process", value, 1.0)):
            rows[k].append(v)
    for i in range(1, 401):
        t = T0 + i * 10 * MS
        add(t, 10 * MS, "perf", "task-clock", cpus * 10 * MS)
        add(t, 10 * MS, "perf", "page-faults", None if i == faults_null_at else 5.0)
        if i % 10 == 0:
            add(t, None, "host", "proc.rss", 1000.0 * (rank + 1))
    arrays = [pa.array(rows["time"], pa.int64()).cast(SAMPLES_SCHEMA.field("time").type),
              pa.array(rows["duration_ns"], pa.int64())]
    arrays += [pa.array(rows[k]).dictionary_encode().cast(SAMPLES_SCHEMA.field(k).type)
               for k in ("source", "metric", "entity")]
    arrays += [pa.array(rows["value"], pa.float64()), pa.array(rows["quality"], pa.float32())]
    return pa.RecordBatch.from_arrays(arrays, schema=SAMPLES_SCHEMA)


def spans(rank: int, step_ms: float) -> pa.Table:
    st, en, name, cat = [], [], [], []
    for k in range(20):
        s = T0 + k * 200 * MS
        st += [s, s]
        en += [s + int(step_ms * MS), s + int(step_ms * MS / 2)]
        name += [f"ProfilerStep#{k}", "forward"]
        cat += ["step", "region"]
    t = pa.Table.from_batches([spans_batch(st, en, name, cat)])
    return t.append_column("rank", pa.array([rank] * t.num_rows, pa.int32()))


def test_window_values_are_rates_over_covered_time_and_means_of_gauges():
    batches = {0: [samples(0, 0.5)], 1: [samples(1, 1.0, faults_null_at=150)]}
    f = run_figures("r", META, CATALOG, [0, 1], lambda r: iter(batches[r]),
                    pa.concat_tables([spans(0, 100), spans(1, 150)]), window_ns=200 * MS)
    assert f.window_s == pytest.approx(0.2)
    assert len(f.metrics["task-clock"][0]) == 20
    assert np.allclose(f.metrics["task-clock"][0], 0.5) and np.allclose(f.metrics["task-clock"][1], 1.0)
    assert f.units["task-clock"] == "s/s" and f.units["page-faults"] == "/s" and f.units["proc.rss"] == "bytes"
    assert np.allclose(f.metrics["page-faults"][0], 500.0)
    # the window holding an unknown reading is left out, never counted as 0
    assert len(f.metrics["page-faults"][1]) == 19 and np.allclose(f.metrics["page-faults"][1], 500.0)
    assert np.allclose(f.metrics["proc.rss"][1], 2000.0)
    assert f.totals["task-clock"][0] == pytest.approx(0.5 * 4e9)
    assert np.allclose(f.times["step_time"][0], 0.1) and np.allclose(f.times["step_time"][1], 0.15)
    assert np.allclose(f.times["region:forward"][1], 0.075)
    assert set(f.scope_verdicts) == {"step_time", "region:forward"}
    names = [s[0] for s in summary_series(f)]
    assert names[:2] == ["wall_time", "region:forward"] and "step_time" in names
    assert "metric:task-clock" in names and "signal:cpu_busy" in names and "signal:cpu_busy@step_time" in names


def test_the_verdict_input_matches_what_report_builds_from_the_same_samples():
    batches = {0: [samples(0, 0.3)], 1: [samples(1, 0.2)]}
    sp = pa.concat_tables([spans(0, 100), spans(1, 150)])
    f = run_figures("r", META, CATALOG, [0, 1], lambda r: iter(batches[r]), sp)
    data = RunData(ranks=2)
    load_samples(data, [b for r in (0, 1) for b in batches[r]], CATALOG, 10 * MS)
    whole = signals(data, [(data.start_ns, data.end_ns)])
    assert f.scope_signals["run"]["cpu_busy"] == pytest.approx(whole["cpu_busy"].value, rel=1e-6)
    assert f.verdict.verdict == classify(whole).verdict
    assert f.verdict.shares == pytest.approx(classify(whole).shares, rel=1e-6)


def test_default_window_keeps_two_sampling_intervals_and_about_200_windows():
    assert default_window_ns(META, T0, T0 + 4000 * MS) == 200 * MS           # 2 x host's 100 ms
    assert default_window_ns(META, T0, T0 + 600_000 * MS) == 3000 * MS       # 10 min / 200


def test_span_times_without_steps_or_regions_is_empty_and_gpu_annotations_apart():
    assert span_times(pa.Table.from_batches([spans_batch([T0], [T0 + MS], ["k"], ["kernel"])])) == {}
    t = pa.Table.from_batches([spans_batch([T0, T0], [T0 + MS, T0 + 3 * MS], ["fwd", "fwd"],
                                           ["annotation", "annotation"], device=[None, 0])])
    got = span_times(t)
    assert set(got) == {"region:fwd", "region:fwd (GPU)"}
    assert got["region:fwd (GPU)"][0][0] == pytest.approx(0.003)


def _span_times_row_by_row(t: pa.Table) -> dict:
    """The reference: each step or region row appended to its (key, rank) in the table's order."""
    out: dict = {}
    for s, e, n, c, d, r in zip(*(t[c].to_pylist() for c in ("start", "end", "name", "category", "device", "rank"))):
        if c == "step":
            key = "step_time"
        elif c in ("region", "annotation"):
            key = f"region:{n}" + (" (GPU)" if d is not None else "")
        else:
            continue
        out.setdefault(key, {}).setdefault(r, []).append((e - s).total_seconds() if hasattr(e, "total_seconds")
                                                         else (e - s) / 1e9)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_span_times_are_each_key_and_ranks_rows_in_table_order(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    cats = rng.choice(["step", "region", "annotation", "kernel", "cpu_op"], n)
    names = rng.choice(["fwd", "bwd", "opt", "data"], n)
    start = T0 + rng.integers(0, 10**9, n)
    end = start + rng.integers(0, 10**7, n)
    dev = [int(x) if x >= 0 else None for x in rng.integers(-3, 2, n)]
    t = pa.Table.from_batches([spans_batch(start.tolist(), end.tolist(), names.tolist(), cats.tolist(),
                                           device=dev)])
    t = t.append_column("rank", pa.array(rng.integers(0, 5, n), pa.int32()))
    if seed % 2:          # the table's own order is not the time order
        t = t.take(pa.array(rng.permutation(n)))
    got = span_times(t)
    ref = {k: {r: [int(round(x * 1e9)) for x in v] for r, v in by.items()}
           for k, by in _span_times_row_by_row(pa.table({c: t[c].cast(pa.int64()) if c in ("start", "end") else t[c]
                                                          for c in t.column_names})).items()}
    assert list(got) == list(ref)                                 # keys as they first appear
    for k in ref:
        assert list(got[k]) == list(ref[k])                       # ranks as they first appear
        for r in ref[k]:
            assert [int(round(x * 1e9)) for x in got[k][r]] == ref[k][r]
