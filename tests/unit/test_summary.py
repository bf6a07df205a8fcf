"""summarize() over recorded values: totals, peaks, coverage and perf stat's derived figures."""
import pytest

from counterprof.analysis.summary import summarize
from counterprof.render.summary import summary_text
from counterprof.ground.schema import samples_batch
import pyarrow as pa

MS = 1_000_000


def table(rows):
    """rows: (source, metric, entity, value, duration_ns, quality)"""
    return pa.Table.from_batches([samples_batch(
        [i for i in range(len(rows))], [r[4] for r in rows], "x", [r[1] for r in rows],
        [r[2] for r in rows], [r[3] for r in rows], [r[5] for r in rows],
    ).set_column(2, "source", pa.array([r[0] for r in rows]).dictionary_encode())])


CATALOG = {
    "task-clock": {"name": "task-clock", "unit": "ns", "kind": "delta"},
    "page-faults": {"name": "page-faults", "unit": "count", "kind": "delta"},
    "cycles": {"name": "cycles", "unit": "count", "kind": "delta"},
    "instructions": {"name": "instructions", "unit": "count", "kind": "delta"},
    "proc.rss": {"name": "proc.rss", "unit": "bytes", "kind": "gauge"},
    "system.cpu_util": {"name": "system.cpu_util", "unit": "percent", "kind": "ratio"},
}
META = {
    "command": ["python", "train.py"],
    "workload": {"elapsed_s": 2.0, "user_s": 1.5, "system_s": 0.1, "exit_status": 0},
    "collectors": {
        "perf": {"status": "ok", "events": {
            "task-clock": {"status": "counted"},
            "page-faults": {"status": "counted"},
            "cycles": {"status": "counted"},
            "instructions": {"status": "counted"},
            "branches": {"status": "not supported", "reason": "branches: no PMU (ENOENT)"},
        }},
        "nvml": {"status": "unavailable", "reason": "no NVIDIA driver"},
    },
}
ROWS = [
    ("perf", "task-clock", "process", 600 * MS, 1000 * MS, 1.0),
    ("perf", "task-clock", "process", 900 * MS, 1000 * MS, 1.0),
    ("perf", "page-faults", "process", 100.0, 1000 * MS, 1.0),
    ("perf", "page-faults", "process", 200.0, 1000 * MS, 1.0),
    # multiplexed: counted half of the time, and one interval never counted
    ("perf", "cycles", "process", 3e9, 1000 * MS, 0.5),
    ("perf", "cycles", "process", None, 1000 * MS, 0.0),
    ("perf", "instructions", "process", 6e9, 1000 * MS, 0.5),
    ("perf", "instructions", "process", None, 1000 * MS, 0.0),
    ("host", "proc.rss", "process", 100e6, None, 1.0),
    ("host", "proc.rss", "process", 300e6, None, 1.0),
    ("host", "system.cpu_util", "system", 20.0, 100 * MS, 1.0),
    ("host", "system.cpu_util", "system", 80.0, 300 * MS, 1.0),
]


def test_totals_peaks_and_means():
    s = summarize(table(ROWS), CATALOG, META)
    assert s.value("task-clock") == 1500 * MS
    assert s.value("page-faults") == 300
    assert s.row("proc.rss").value == 300e6 and s.row("proc.rss").aggregate == "peak"
    # duration-weighted mean: (20*100 + 80*300) / 400
    assert s.row("system.cpu_util").value == pytest.approx(65.0)


def test_unsupported_and_never_counted_are_unknown_not_zero():
    s = summarize(table(ROWS), CATALOG, META)
    br = s.row("branches")
    assert br.value is None and br.status == "not supported" and "ENOENT" in br.reason
    cyc = s.row("cycles")
    assert cyc.unknown_intervals == 1
    assert cyc.coverage == pytest.approx(0.25)     # half of one interval out of two


def test_perf_stat_derived_figures():
    s = summarize(table(ROWS), CATALOG, META)
    assert s.row("task-clock").note == "0.750 CPUs utilized"        # 1.5 s CPU over 2 s
    assert s.row("page-faults").note == "200.000 /sec"               # per task-clock second
    assert s.row("instructions").note == "2.00 insn per cycle"
    assert s.row("cycles").note == "2.000 GHz"


def test_rendered_like_perf_stat():
    text = summary_text(summarize(table(ROWS), CATALOG, META))
    assert "Performance counter stats for 'python train.py'" in text
    assert "1,500.00  msec  task-clock" in text
    assert "<not supported>" in text and "branches" in text
    assert "(25.00%)" in text and "[1 intervals unknown]" in text
    assert "2.000000000 seconds time elapsed" in text
    assert "not available here: nvml (no NVIDIA driver)" in text


def test_empty_run():
    empty = table(ROWS).slice(0, 0)
    s = summarize(empty, {}, {"collectors": {}})
    assert s.rows == [] and s.elapsed_s is None
    assert "Performance counter stats" in summary_text(s)


def test_streamed_chunks_give_the_same_summary():
    whole = summarize(table(ROWS), CATALOG, META)
    t = table(ROWS)
    chunks = [t.slice(i, 3) for i in range(0, t.num_rows, 3)]
    streamed = summarize(iter(chunks), CATALOG, META)
    assert [(r.metric, r.value, r.coverage, r.unknown_intervals) for r in streamed.rows] == \
        [(r.metric, r.value, r.coverage, r.unknown_intervals) for r in whole.rows]


def test_ratio_mean_ignores_unknown_intervals():
    rows = [("host", "system.cpu_util", "system", 50.0, 100 * MS, 1.0),
            ("host", "system.cpu_util", "system", None, 900 * MS, 0.0)]
    assert summarize(table(rows), CATALOG, META).row("system.cpu_util").value == 50.0


TWO_RANKS = [
    # two ranks' trees, ~350 MB and 1 process each, sampled at about the same times
    ("host", "proc.rss", "process", 340e6, None, 1.0),
    ("host", "proc.rss", "process", 343e6, None, 1.0),
    ("host", "proc.rss", "process", 341e6, None, 1.0),
    ("host", "proc.rss", "process", 342e6, None, 1.0),
    ("host", "proc.cpu_user", "process", 1.0, 1000 * MS, 1.0),
    ("host", "proc.cpu_user", "process", 2.0, 1000 * MS, 1.0),
    ("host", "system.mem_used", "system", 9e9, None, 1.0),
]
CATALOG_RANKS = {**CATALOG, "proc.cpu_user": {"name": "proc.cpu_user", "unit": "s", "kind": "delta"},
                 "system.mem_used": {"name": "system.mem_used", "unit": "bytes", "kind": "gauge"}}


@pytest.mark.parametrize("meta", [
    {**META, "per_rank": True, "ranks": {"0": {"pid": 10}, "1": {"pid": 11}}},    # counterprof run
    {**META, "job": "host:123", "rank": 0, "env": {"RANK": "0", "WORLD_SIZE": "2"}},  # profile() per rank
], ids=["per-rank run", "joined profile"])
def test_a_process_tree_gauge_of_several_ranks_is_named_one_ranks_peak(meta):
    s = summarize(table(TWO_RANKS), CATALOG_RANKS, meta)
    assert s.ranks == 2
    rss = s.row("proc.rss")
    assert rss.value == 343e6 and rss.aggregate == "peak of one rank"
    assert s.row("proc.cpu_user").value == 3.0              # totals are over every rank
    assert s.row("system.mem_used").aggregate == "peak"     # the machine's, not a rank's
    text = summary_text(s)
    assert "proc.rss (peak of one rank)" in text and "not summed over the 2 ranks" in text
    assert "proc.rss (peak)" not in text
    assert "process trees of 2 ranks and the system (host collector)" in text


def test_one_rank_keeps_plain_peaks_and_a_caller_may_say_how_many_ranks():
    s = summarize(table(TWO_RANKS), CATALOG_RANKS, META)
    assert s.ranks == 1 and s.row("proc.rss").aggregate == "peak"
    assert "process trees of" not in summary_text(s) and "not summed" not in summary_text(s)
    assert summarize(table(TWO_RANKS), CATALOG_RANKS, META, ranks=3).row("proc.rss").aggregate \
        == "peak of one rank"


def test_the_report_counts_the_rank_partitions_it_read_not_the_jobs_world_size():
    """One host's directory of an 8-rank job holds 2 ranks: the summary says 2, not 8."""
    from counterprof.analysis.report import build_report, inputs_from_samples
    from counterprof.ground.schema import SPANS_SCHEMA
    meta = {**META, "job": "host:123", "rank": 0, "env": {"RANK": "0", "WORLD_SIZE": "8"}}
    spans = SPANS_SCHEMA.empty_table()
    assert build_report(inputs_from_samples(table(TWO_RANKS), spans, CATALOG_RANKS, meta, ranks=2)).summary.ranks == 2
    assert build_report(inputs_from_samples(table(TWO_RANKS), spans, CATALOG_RANKS, meta)).summary.ranks == 8


def _reference_fold(table: pa.Table) -> dict:
    """The sums as pyarrow's group_by gives them (the fold before it moved to numpy): the oracle."""
    import pyarrow.compute as pc
    dur = pc.fill_null(table["duration_ns"], 0).cast(pa.float64())
    value = table["value"]
    t = pa.table({"source": table["source"].cast(pa.string()), "metric": table["metric"].cast(pa.string()),
                  "value": value, "dur": dur,
                  "qdur": pc.multiply(pc.fill_null(table["quality"].cast(pa.float64()), 1.0), dur),
                  "unknown": pc.is_null(value).cast(pa.int64()), "vdur": pc.multiply(value, dur),
                  "vdurw": pc.if_else(pc.is_null(value), 0.0, dur)})
    rows = t.group_by(["source", "metric"], use_threads=False).aggregate([
        ("value", "sum"), ("value", "max"), ("value", "count"), ("dur", "sum"), ("qdur", "sum"),
        ("unknown", "sum"), ("vdur", "sum"), ("vdurw", "sum")]).to_pylist()
    return {(r.pop("source"), r.pop("metric")): r for r in rows}


def test_the_numpy_fold_gives_what_pyarrows_group_by_gives():
    import random
    from counterprof.analysis.summary import _aggregate
    rng = random.Random(14)
    metrics = ["task-clock", "page-faults", "proc.rss", "system.cpu_util", "never"]
    batches = []
    for _ in range(4):                      # several batches, each its own dictionary
        n = rng.randrange(1, 300)
        ms = [rng.choice(metrics) for _ in range(n)]
        values = [None if m == "never" or rng.random() < 0.2 else rng.uniform(-5, 1e6) for m in ms]
        durations = [None if rng.random() < 0.1 else rng.randrange(1, 10**8) for _ in ms]
        quality = [None if rng.random() < 0.3 else rng.random() for _ in ms]
        batches.append(samples_batch(list(range(n)), durations, rng.choice(["perf", "host"]), ms,
                                     ["process"] * n, values, quality))
    table = pa.Table.from_batches(batches).unify_dictionaries()
    got = {(r.pop("source"), r.pop("metric")): r for r in _aggregate(table)}
    want = _reference_fold(table)
    assert got.keys() == want.keys()
    for key, w in want.items():
        g = got[key]
        assert g["value_count"] == w["value_count"] and g["unknown_sum"] == w["unknown_sum"], key
        for k in ("value_sum", "value_max", "dur_sum", "qdur_sum", "vdur_sum", "vdurw_sum"):
            if w[k] is None:
                assert g[k] is None, (key, k)
            else:
                assert g[k] == pytest.approx(w[k], rel=1e-9), (key, k)
    # a sliced batch (offset validity bitmaps) folds the same as its copy
    sliced = table.slice(7, table.num_rows - 20)

    def keyed(rows):
        return {(r.pop("source"), r.pop("metric")): r for r in rows}
    copy = pa.Table.from_pylist(sliced.to_pylist(), schema=sliced.schema)
    want, got = keyed(_aggregate(copy)), keyed(_aggregate(sliced))
    assert got.keys() == want.keys()
    for key, w in want.items():
        for k, v in w.items():
            assert (got[key][k] is None) if v is None else got[key][k] == pytest.approx(v, rel=1e-9), (key, k)
