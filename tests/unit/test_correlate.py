"""`correlate`'s parts on spans whose truth is written here: how items are measured (per call, per
rank, in 1% bins), which prediction row gets which item, the figures (ratio, MAPE, geo-mean,
Spearman), the rows that match nothing and why, and the predictions file's checks."""
from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from counterprof.analysis.correlate import (Prediction, correlate, measure, roofline_predictions,
                                            run_predictions)
from counterprof.analysis.roofline import CallTimes, roofline
from counterprof.ground.errors import UsageError
from counterprof.ground.schema import spans_batch
from counterprof.store.correlate import read_predictions
from counterprof.store.op_rows import OpRows

US = 1000
MM = ("aten::mm", [[64, 64], [64, 64]], ["float", "float"])
ADD = ("aten::add", [[64, 64], [64, 64], []], ["float", "float", "Scalar"])
DURATIONS = ("kernel", "memcpy", "memset", "region", "annotation", "step")


def job(ranks: dict[int, float]) -> pa.Table:
    """Per rank: 10 steps `train#i`, each a region `fwd` holding one aten::mm of ranks[r] µs and
    one aten::add of 20 µs, 10 µs apart."""
    rows: dict[str, list] = {k: [] for k in ("start", "end", "name", "category", "attrs", "pid", "tid", "rank")}

    def span(s: int, e: int, name: str, cat: str, rank: int, attrs: str | None = None) -> None:
        for k, v in zip(rows, (s, e, name, cat, attrs, 100 + rank, 100 + rank, rank)):
            rows[k].append(v)
    for rank, mm_us in ranks.items():
        t = 1_000_000
        for i in range(10):
            s = t
            span(t, t + int((mm_us + 40) * US), "fwd", "region", rank)
            t += 10 * US
            span(t, t + int(mm_us * US), MM[0], "cpu_op", rank, json.dumps({"input_dims": MM[1], "input_types": MM[2]}))
            t += int(mm_us * US) + 10 * US
            span(t, t + 20 * US, ADD[0], "cpu_op", rank, json.dumps({"input_dims": ADD[1], "input_types": ADD[2]}))
            t += 40 * US
            span(s, t, f"train#{i}", "step", rank)
            t += 5 * US
    batch = spans_batch(rows["start"], rows["end"], rows["name"], rows["category"], attrs=rows["attrs"],
                        pid=rows["pid"], tid=rows["tid"])
    return pa.Table.from_batches([batch]).append_column("rank", pa.array(rows["rank"], pa.int64()))


def measured(t: pa.Table):
    r = roofline(t, None, keep_atoms=False, keep_calls=True)
    src = OpRows.of(t)
    try:
        return measure(r, src.durations(DURATIONS, CallTimes.STEP))
    finally:
        src.close()


def pred(kind: str, name: str, line: int = 1, source: str = "file", **kw) -> Prediction:
    return Prediction(line, kind, name, source, **kw)


def test_call_times_quantiles_within_one_percent():
    rng = np.random.default_rng(1)
    x = rng.lognormal(10, 1, 5000)
    t = CallTimes()
    for v in x:
        t.add(v)
    for q in (0.1, 0.5, 0.9):
        assert abs(t.quantile(q) / np.quantile(x, q) - 1) < 0.011, q
    half = CallTimes()
    for v in x[:2500]:
        half.add(v)
    other = CallTimes()
    for v in x[2500:]:
        other.add(v)
    half.merge(other)
    assert half.bins == t.bins and CallTimes().quantile(0.5) is None


def test_items_per_call_and_per_rank():
    m = measured(job({0: 100, 1: 300}))
    mm = next(it for it in m.items.values() if it.name == "aten::mm")
    assert (mm.calls, mm.dims, mm.types, mm.group) == (20, MM[1], MM[2], "GEMM")
    assert mm.total_ns == 10 * 100 * US + 10 * 300 * US
    assert abs(mm.times.quantile(0.1) / (100 * US) - 1) < 0.01 and abs(mm.times.quantile(0.9) / (300 * US) - 1) < 0.01
    assert mm.flops_per_call == 2 * 64 ** 3
    assert {r: m.by_rank[r][mm.key].calls for r in (0, 1)} == {0: 10, 1: 10}
    step = m.items["step:train"]                          # train#0..#9 are one item
    assert step.calls == 20 and m.items["region:fwd"].calls == 20
    assert m.totals_ns["op"] == mm.total_ns + 20 * 20 * US


def test_the_most_specific_row_gets_an_item_and_ratios_are_measured_over_predicted():
    m = measured(job({0: 100, 1: 100}))
    rows = [pred("op", "aten::*", 1, us=10.0),                                   # a pattern: add only
            pred("op", "aten::mm", 2, us=50.0),                                  # any shape of mm
            pred("op", "aten::mm", 3, dims=MM[1], us=200.0),                     # exact: wins mm
            pred("op", "aten::mm", 4, dims=[[8, 8], [8, 8]], us=1.0),            # other shapes
            pred("op", "aten::nope", 5, us=1.0),
            pred("region", "fwd", 6, total_us=20 * 140.0),
            pred("step", "", 7, us=180.0, tolerance=0.5)]
    c = correlate(m, rows, 0.2)
    s = c.sources[0]
    got = {r.pred.line: r for r in s.rows}
    assert set(got) == {1, 3, 6, 7}
    assert abs(got[3].ratio - 0.5) < 0.01 and not got[3].within and got[3].item.calls == 20
    assert abs(got[1].ratio - 2.0) < 0.02 and got[1].item.name == "aten::add"
    assert abs(got[6].ratio - 1.0) < 1e-9 and got[6].within                    # totals: exact
    assert abs(got[7].ratio - 160 / 180) < 0.01 and got[7].tolerance == 0.5 and got[7].within
    why = {u.pred.line: u.why for u in s.unmatched}
    assert "more specific row (line 3)" in why[2]
    assert "ran with other shapes" in why[4] and "[[64,64],[64,64]]" in why[4]
    assert "no op named 'aten::nope'" in why[5]
    # rows ordered by the time they would save: add (20 calls x 10 µs over) first; mm is faster
    # than predicted: it would save nothing
    assert s.rows[0].pred.line == 1 and got[3].savings_ns == 0
    # MAPE and geo-mean weighted by measured time, by hand
    w = {k: r.item.total_ns for k, r in got.items()}
    mape = sum(w[k] * abs(1 - 1 / got[k].ratio) for k in w) / sum(w.values())
    geo = math.exp(sum(w[k] * math.log(got[k].ratio) for k in w) / sum(w.values()))
    assert abs(s.figures.mape - mape) < 1e-9 and abs(s.figures.geomean_ratio - geo) < 1e-9
    # coverage: every op, region and step has a row
    assert abs(s.figures.coverage - 1.0) < 1e-9 and not s.uncovered


def test_each_source_is_summed_up_on_its_own():
    m = measured(job({0: 100}))
    rows = [pred("op", "aten::mm", 1, source="sim-v3", us=100.0), pred("op", "aten::mm", 2, source="rtl", us=50.0),
            pred("op", "aten::add", 3, source="sim-v3", us=40.0)]
    c = correlate(m, rows, 0.2)
    assert [s.name for s in c.sources] == ["sim-v3", "rtl"]
    sim, rtl = c.sources
    assert len(sim.rows) == 2 and len(rtl.rows) == 1 and abs(rtl.rows[0].ratio - 2) < 0.02
    # coverage is of the kinds each source predicts: rtl has mm only (of mm + add)
    assert rtl.figures.coverage == pytest.approx(10 * 100 / (10 * 100 + 10 * 20), rel=1e-6)
    assert [u.key for u in rtl.uncovered] == [next(k for k in m.items if "aten::add" in k)]
    doc = c.to_json()
    assert doc["source"] == "sim-v3" and doc["mape"] == sim.figures.to_json()["mape"]


def test_rates_turn_flops_and_bytes_into_times():
    m = measured(job({0: 100}))
    add_bytes = 3 * 64 * 64 * 4                     # two inputs read, the output written, fp32
    rows = [pred("op", "aten::add", 1, bytes_per_s=add_bytes / 20e-6),                      # 20 µs
            pred("op", "aten::mm", 2, flops_per_s=2 * 64 ** 3 / 50e-6, bytes_per_s=1e15),    # 50 µs
            pred("step", "train", 3, flops_per_s=1e9)]
    s = correlate(m, rows, 0.2).sources[0]
    got = {r.pred.line: r for r in s.rows}
    assert abs(got[1].ratio - 1) < 0.01 and abs(got[2].ratio - 2) < 0.02
    assert "only costed ops carry" in s.unmatched[0].why and s.unmatched[0].pred.line == 3


def test_by_rank_and_outliers_ranked_by_what_they_would_save():
    m = measured(job({0: 100, 1: 400}))             # rank 1's matmul is 4x slower
    s = correlate(m, [pred("op", "aten::mm", 1, us=100.0), pred("op", "aten::add", 2, us=10.0)], 0.2).sources[0]
    assert s.by_rank[0].geomean_ratio == pytest.approx(2 ** (200 / 1200), rel=0.02) and s.by_rank[1].geomean_ratio > 2.5
    # the median call met its prediction: mm would save nothing at its ratio (1.0); add (2x) half
    # its time; rank 1's slow matmuls are rank 1's figures
    assert s.rows[0].pred.name == "aten::add" and s.rows[0].savings_ns == pytest.approx(20 * 10 * US, rel=0.02)
    assert next(r for r in s.rows if r.pred.name == "aten::mm").savings_ns == 0


def test_a_run_predicting_itself_is_exact_and_spearman_is_one():
    m = measured(job({0: 100, 1: 130}))
    s = correlate(m, run_predictions(m, "self"), 0.05).sources[0]
    assert len(s.rows) == len(m.items) and all(abs(r.ratio - 1) < 1e-9 for r in s.rows)
    assert s.figures.mape == pytest.approx(0, abs=1e-9) and s.figures.spearman == pytest.approx(1)
    assert all(r.savings_ns == 0 for r in s.rows)
    # each rank against the same rank of the other run, not against the ranks pooled
    assert {r: f.mape for r, f in s.by_rank.items()} == {0: pytest.approx(0, abs=1e-9), 1: pytest.approx(0, abs=1e-9)}


def test_roofline_predictor_is_the_larger_of_flops_over_peak_and_bytes_over_bandwidth():
    m = measured(job({0: 100}))
    ceilings = {"peaks": {"fp32": 1e9}, "bandwidth_bytes_per_s": 1e8}
    preds = {p.name: p for p in roofline_predictions(m, ceilings, "roofline")}
    assert preds["aten::mm"].us == pytest.approx(max(2 * 64 ** 3 / 1e9, 3 * 64 * 64 * 4 / 1e8) * 1e6)
    assert preds["aten::add"].us == pytest.approx(max(64 * 64 / 1e9, 3 * 64 * 64 * 4 / 1e8) * 1e6)
    assert preds["aten::mm"].dims == MM[1] and preds["aten::mm"].types == MM[2]


# ---- the predictions file ----------------------------------------------------------------------

def test_csv_jsonl_and_parquet_read_alike(tmp_path):
    csv = tmp_path / "sim-v3.csv"
    csv.write_text('kind,name,shapes,predicted_us,tolerance,chip\n'
                   'op,aten::mm,"[[64, 64], [64, 64]]",50,10%,A0\n'
                   'kernel,*gemm*,,12.5,,A0\n'
                   'step,,,1000,0.3,\n')
    rows = read_predictions(str(csv))
    assert [(r["line"], r["kind"], r["name"], r["us"], r["tolerance"], r["source"]) for r in rows] == [
        (2, "op", "aten::mm", 50.0, 0.1, "sim-v3"), (3, "kernel", "*gemm*", 12.5, None, "sim-v3"),
        (4, "step", "", 1000.0, 0.3, "sim-v3")]
    assert rows[0]["dims"] == [[64, 64], [64, 64]] and rows[0]["extra"] == {"chip": "A0"}
    jl = tmp_path / "p.jsonl"
    jl.write_text('{"name": "aten::mm", "shapes": [[64, 64], [64, 64]], "predicted_us": 50, "source": "rtl"}\n\n'
                  '{"kind": "region", "name": "fwd", "predicted_total_us": 9}\n')
    rows = read_predictions(str(jl))
    assert [(r["line"], r["kind"], r["dims"], r["source"]) for r in rows] == [
        (1, "op", [[64, 64], [64, 64]], "rtl"), (3, "region", None, "p")]
    pqf = tmp_path / "p.parquet"
    pq.write_table(pa.table({"name": ["aten::mm", "aten::add"], "shapes": [[[64, 64], [64, 64]], None],
                             "predicted_us": [50.0, None], "predicted_bytes_per_s": [None, 1e9]}), pqf)
    rows = read_predictions(str(pqf))
    assert rows[0]["dims"] == [[64, 64], [64, 64]] and rows[1]["bytes_per_s"] == 1e9 and rows[1]["us"] is None


@pytest.mark.parametrize("body, words", [
    ("kind,name,predicted_us\nop,aten::mm,fast\n", "line 2: predicted_us 'fast' is not a number"),
    ("kind,name,predicted_us\nop,aten::mm,-3\n", "line 2: predicted_us '-3' must be a positive number"),
    ("kind,name,predicted_us\nop,aten::mm,1\nop,aten::add,\n", "line 3: no prediction"),
    ("kind,name,predicted_us,predicted_total_us\nop,aten::mm,1,2\n", "line 2: predicted_us and predicted_total_us"),
    ("kind,name,predicted_us\nlayer,x,1\n", "line 2: kind 'layer' is none of op, kernel, region, step"),
    ("kind,name,shapes,predicted_us\nop,aten::mm,[[1,2]],1\n", "line 2: more values than columns"),
    ("kind,name,shapes,predicted_us\nop,aten::mm,\"(1, 2)\",1\n", "line 2: shapes '(1, 2)' is not JSON"),
    ("kind,name,predicted_us\nkernel,re:(,1\n", "line 2: 're:(' is not a regular expression"),
    ("kind,name,shapes,predicted_us\nkernel,k,\"[[1]]\",1\n", "line 2: shapes, types and dtype key ops only"),
    ("kind,name,predicted_us,tolerance\nop,a,1,lots\n", "line 2: tolerance 'lots'"),
    ('{"name": "aten::mm", "predicted_us": 1}\n{"name": \n', "line 2: not JSON"),
    ("a,b\n1,2\n", "neither `kind` nor `name`"),
    ("kind,name,predicted_us\n", "no rows"),
    ('[{"name": "aten::mm", "predicted_us": 1}]\n', "a JSON list; JSON lines are one object per line"),
    ('{"name": "aten::mm", "predicted_us": true}\n', "line 1: predicted_us True is not a number"),
    ("kind,name,predicted_us\nop,aten::mm,1e300\n", "is past 1e+15 µs"),
    ("kind;name;predicted_us\nop;aten::mm;1\n", "separated by commas, not semicolons"),
])
def test_a_bad_file_is_refused_with_its_line(tmp_path, body, words):
    f = tmp_path / "bad.csv"
    f.write_text(body)
    with pytest.raises(UsageError) as e:
        read_predictions(str(f))
    assert words in str(e.value) and str(f) in str(e.value)


def test_a_missing_or_binary_file_says_so(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        read_predictions(str(tmp_path / "nope.csv"))
    (tmp_path / "x.bin").write_bytes(b"\xff\xfe\x00garbage\xff")
    with pytest.raises(UsageError, match="not text"):
        read_predictions(str(tmp_path / "x.bin"))
