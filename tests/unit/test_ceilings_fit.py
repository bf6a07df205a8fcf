"""Ceilings that do not fit a run: the fit check's thresholds (an op above roofline_over_roof of
its ceiling with roofline_over_roof_share of the op time, the MFU, single CPU steps), busy_split
leaving the split out, the words it uses; calibrate's load arithmetic and rule; which ceilings a
run is held to (its own copy, never a later calibrate's). Small Kineto traces through the real
converter, real files in a temporary cache. tests/integration/test_ceilings_fit.py has the real
runs and the real calibrate against busy-loop contenders."""
from __future__ import annotations

import io
import json
import socket

import pyarrow as pa
import pytest

from kineto_traces import X, launch, write_trace

from counterprof.analysis.roofline import MISFIT, busy_split, roofline
from counterprof.analysis.roofline_run import TODAYS, choose_ceilings
from counterprof.ground.thresholds import value
from counterprof.calibrate import cache_path, save
from counterprof.calibrate.load import LoadMeter, Sample, between, words
from counterprof.collectors.torch_trace.convert import TraceConversion
from counterprof.render.report_text import roofline_line
from counterprof.render.roofline import above_peak, roofline_text

LIMIT = value("roofline_over_roof")
MIN_SHARE = value("roofline_over_roof_share")

MM_DIMS = [[64, 128], [128, 32]]
MM_FLOPS = 2 * 64 * 128 * 32
ADD_N = 1 << 20


def _spans(tmp_path, events) -> pa.Table:
    path = write_trace(tmp_path / "t.json", events, {"schemaVersion": 1, "baseTimeNanoseconds": 10 ** 18})
    return pa.Table.from_batches(list(TraceConversion(path)))


def op(name, ts, dur, dims, types, tid=100):
    return X("cpu_op", name, ts, dur, tid=tid, **{"Input Dims": dims, "Input type": types})


def mm(ts, dur):
    return op("aten::mm", ts, dur, MM_DIMS, ["float", "float"])


def add(ts, dur):
    return op("aten::add", ts, dur, [[ADD_N], [ADD_N], []], ["float", "float", "Scalar"])


def cpu_doc(peak, bw=1e15, **extra):
    return {"source": "measured", "device": "cpu", "kind": "cpu", "peaks": {"fp32": peak},
            "bandwidth_bytes_per_s": bw, **extra}


# ---- the op check --------------------------------------------------------------------------

def _mm_run(tmp_path, fraction):
    """One mm of 80 µs in a step of 1000 µs (MFU far below its roof), the peak set so that the mm
    runs at `fraction` of it."""
    events = [mm(10, 80), X("cpu_op", "ProfilerStep#1", 0, 1000, tid=100)]
    achieved = MM_FLOPS / 80e-6
    return roofline(_spans(tmp_path, events), cpu_doc(achieved / fraction))


@pytest.mark.parametrize("fraction, fits", [(0.95, True), (LIMIT - 0.01, True), (LIMIT + 0.01, False), (6.0, False)])
def test_an_op_above_its_ceiling_by_more_than_the_threshold_means_they_do_not_fit(tmp_path, fraction, fits):
    r = _mm_run(tmp_path, fraction)
    (row,) = r.ops
    assert row.bound == "compute" and row.roof_fraction == pytest.approx(fraction)
    assert r.mfu["mfu_measured"] == pytest.approx(fraction * 80 / 1000)       # the step: far below
    assert r.ceilings_fit is fits
    share, evidence, missing = busy_split(r, None)
    if fits:
        assert not r.over_roof and not any(n.startswith(MISFIT) for n in r.notes)
        assert share == 1.0 and not missing
        assert not any(e["metric"] == "roofline_over_roof" for e in evidence)
        if fraction > 1:       # above 100%, within the threshold: said, never a plain fact
            assert "above it, within the 5%" in evidence[1]["text"]
            out = io.StringIO()
            roofline_text(r, out)
            assert f"{100 * fraction:.1f}% ~" in out.getvalue() and "~ above 100%" in out.getvalue()
        return
    (item,) = r.over_roof
    assert item["what"] == "op" and item["name"] == "aten::mm"
    assert item["fraction"] == pytest.approx(fraction)
    assert f"aten::mm (64x128, 128x32) ran at {100 * fraction:.0f}% of the measured fp32 matmul peak" in item["text"]
    note = next(n for n in r.notes if n.startswith(MISFIT))
    assert item["text"] in note and "no verdict rests on them" in note
    # the classifier gets no split, one line of evidence saying why, and what would decide it
    assert share is None
    assert [e["metric"] for e in evidence] == ["roofline_over_roof"]
    assert evidence[0]["threshold"] == LIMIT and evidence[0]["value"] == pytest.approx(fraction, rel=1e-5)
    assert missing and missing[0].startswith("ceilings that fit this run (aten::mm")
    out = io.StringIO()
    roofline_text(r, out)
    assert f"{100 * fraction:.1f}% !" in out.getvalue() and out.getvalue().count("! " + MISFIT) == 1
    j = json.loads(json.dumps(r.to_json()))
    assert j["ceilings_fit"]["fits"] is False and j["ceilings_fit"]["over_roof"][0]["name"] == "aten::mm"


def test_a_short_op_above_its_ceiling_is_not_enough(tmp_path):
    """An mm far above its roof with under roofline_over_roof_share of the op time (a long add
    holds the rest) is not the ceilings' fault: short ops' timing is coarse."""
    mm_us, add_us = 1, 200          # the mm: 0.5% of the op time
    assert mm_us / (mm_us + add_us) < MIN_SHARE
    events = [mm(10, mm_us), add(100, add_us), X("cpu_op", "ProfilerStep#1", 0, 10_000, tid=100)]
    achieved = MM_FLOPS / (mm_us * 1e-6)
    bw = 3 * 4 * ADD_N / (add_us * 1e-6) * 2          # the add at 50% of the bandwidth
    r = roofline(_spans(tmp_path, events), cpu_doc(achieved / 3, bw))
    rows = {o.name: o for o in r.ops}
    assert rows["aten::mm"].roof_fraction == pytest.approx(3.0)
    assert rows["aten::add"].roof_fraction == pytest.approx(0.5)
    assert r.ceilings_fit is True and not r.over_roof
    share, _, _ = busy_split(r, None)
    assert share == pytest.approx(mm_us / (mm_us + add_us))
    # the same mm holding more of the time: it counts
    events = [mm(10, 20), add(100, add_us), X("cpu_op", "ProfilerStep#1", 0, 10_000, tid=100)]
    r = roofline(_spans(tmp_path, events), cpu_doc(MM_FLOPS / 20e-6 / 3, bw))
    assert [x["name"] for x in r.over_roof] == ["aten::mm"] and busy_split(r, None)[0] is None


def test_a_memory_bound_op_above_the_bandwidth_names_the_cache(tmp_path):
    """An add whose tensors fit in the last-level cache can beat DRAM's bandwidth: the note says
    so (the ceilings' memory figure is DRAM's), and it still does not fit."""
    events = [add(0, 100)]
    nbytes = 3 * 4 * ADD_N
    r = roofline(_spans(tmp_path, events), cpu_doc(1e12, nbytes / 100e-6 / 4.21,
                                                   memory={"llc_bytes": 32 << 20}))
    (item,) = r.over_roof
    assert item["ceiling"] == "measured memory bandwidth" and item["fraction"] == pytest.approx(4.21)
    assert "ran at 421% of the measured memory bandwidth" in item["text"]
    assert "last-level cache" in item["hint"]
    r = roofline(_spans(tmp_path, events), cpu_doc(1e12, nbytes / 100e-6 / 4.21, memory={"llc_bytes": 1 << 20}))
    assert r.over_roof[0]["hint"] is None          # 12 MiB per call: not from a 1 MiB cache


# ---- MFU and steps ---------------------------------------------------------------------------

def test_mfu_above_the_peak_does_not_fit_and_is_never_a_plain_fact(tmp_path):
    events = [mm(1, 98), X("cpu_op", "ProfilerStep#1", 0, 100, tid=100)]
    r = roofline(_spans(tmp_path, events), cpu_doc(MM_FLOPS / 100e-6 / 2.55))
    assert r.mfu["mfu_measured"] == pytest.approx(2.55)
    kinds = {x["what"] for x in r.over_roof}
    assert kinds == {"op", "mfu"}                 # (the one step is the median: not named twice)
    mfu_item = next(x for x in r.over_roof if x["what"] == "mfu")
    assert mfu_item["text"].startswith("MFU 255% of the measured fp32 peak")
    out = io.StringIO()
    roofline_text(r, out)
    text = out.getvalue()
    assert "! " + MISFIT in text
    assert "255.0% of the measured peak" in text and "(above the peak: the ceilings do not fit this run)" in text
    line = roofline_line({"mfu": r.mfu, "notes": r.notes, "modelled_share": r.modelled_share}).plain
    assert "MFU 255.0% of the measured fp32 peak (above the peak: the ceilings do not fit this run)" in line
    assert "! " + MISFIT in line


def test_above_peak_words():
    assert above_peak(None) == above_peak(0.99) == above_peak(1.0) == ""
    assert "within the spread" in above_peak(1.03)
    assert "do not fit" in above_peak(LIMIT + 0.001)


def test_one_cpu_step_above_the_peak_is_named(tmp_path):
    """A step whose MFU passes the peak though no op holds 2% of the time above its roof and the
    median step is far below: the step is named. On a GPU a step's FLOPs are those of the ops it
    launched, not of the kernels it ran (a first step at 318% on the real H200 GPT-2 run): not
    judged."""
    events = [mm(1, 10), X("cpu_op", "ProfilerStep#1", 0, 12, tid=100),
              add(100, 1000), X("cpu_op", "ProfilerStep#2", 100, 1000, tid=100),
              add(1200, 1000), X("cpu_op", "ProfilerStep#3", 1200, 1000, tid=100)]
    peak = MM_FLOPS / 10e-6 / 1.5                           # the mm at 150% of it, 0.5% of op time
    r = roofline(_spans(tmp_path, events), cpu_doc(peak))
    assert r.mfu["steps"][0]["mfu_measured"] == pytest.approx(1.5 * 10 / 12)
    assert r.mfu["mfu_measured"] < LIMIT
    (item,) = r.over_roof
    assert item["what"] == "step" and item["name"] == "ProfilerStep#1" and item["steps_over"] == 1
    assert "1 of 3 step(s) above 105% of the measured fp32 peak, step ProfilerStep#1 (rank 0) at 125%" in item["text"]
    assert busy_split(r, None)[0] is None

    # the same on a GPU: the addmm's kernel (100 µs) launched in a 60 µs step
    gpu = {"source": "measured", "device": "gpu", "kind": "gpu", "peaks": {"fp32": 1e12}, "bandwidth_bytes_per_s": 1e15}
    ev = [op("aten::addmm", 1010, 30, [[256], [64, 512], [512, 256], [], []], ["float"] * 3 + ["Scalar"] * 2),
          *launch("gemm_kernel", 1020, 5, 1, 1030, 100),
          X("cpu_op", "ProfilerStep#1", 1000, 60, tid=100),
          X("cpu_op", "ProfilerStep#2", 2000, 1000, tid=100),
          X("cpu_op", "ProfilerStep#3", 3000, 1000, tid=100)]
    flops = 2 * 64 * 512 * 256
    gpu["peaks"]["fp32"] = flops / 100e-6 / 0.9            # the kernel at 90% of the peak
    r = roofline(_spans(tmp_path, ev), gpu)
    assert r.mfu["steps"][0]["mfu_measured"] == pytest.approx(0.9 * 100 / 60)
    assert r.ceilings_fit is True and not r.over_roof


# ---- the words: where the ceilings came from -----------------------------------------------

LOADED = {"cpus": 2, "others_share": 0.48, "others_cpus": 0.96, "steal_share": 0.0,
          "worst": {"phase": "the CPU fp32 matmul", "others_share": 0.61, "others_cpus": 1.22},
          "loadavg_before": [3.1, 2.0, 1.0], "loadavg_after": [3.4, 2.1, 1.0], "loaded": True,
          "threshold": 0.25, "saved_anyway": True}


def test_the_note_says_when_and_on_how_loaded_a_machine(tmp_path):
    events = [mm(1, 98), X("cpu_op", "ProfilerStep#1", 0, 100, tid=100)]
    doc = cpu_doc(MM_FLOPS / 100e-6 / 2, host="vm", measured_at="2026-12-01T09:00:00Z", quick=True, load=LOADED)
    r = roofline(_spans(tmp_path, events), doc,
                 origin="ceilings copied into the run at its start, from `counterprof calibrate` on its host")
    note = next(n for n in r.notes if n.startswith(MISFIT))
    assert ("measured 2026-12-01T09:00:00Z on vm (`calibrate --quick`), other processes held 48% of its 2 CPU(s) "
            "(0.96 CPUs; 61% during the CPU fp32 matmul), load average 3.1 -> 3.4 (saved with --force); "
            "copied into the run at its start") in note
    assert r.to_json()["ceilings"]["load"]["others_share"] == 0.48
    # a calibration from before counterprof recorded the load; a hand-written file; a datasheet
    r = roofline(_spans(tmp_path, events), cpu_doc(MM_FLOPS / 100e-6 / 2, measured_at="2026-01-01T00:00:00Z"))
    assert "how loaded the machine was is not recorded" in r.notes[-1]
    r = roofline(_spans(tmp_path, events), {**cpu_doc(MM_FLOPS / 100e-6 / 2), "source": "file"})
    assert "from a file (when, where and on how loaded a machine they were measured is not in it)" in r.notes[-1]
    assert "of the given fp32 matmul peak" in r.notes[-1]


# ---- calibrate's load --------------------------------------------------------------------------

def test_load_between_two_samples():
    a = Sample(wall=100.0, busy_s=1000.0, steal_s=5.0, own_s=10.0, procs_running=2)
    # 2 s on 2 CPUs: the CPUs busy 3.0 s, of it ours 2.0 s: others held 1.0 s = 25%; 0.2 s stolen
    b = Sample(wall=102.0, busy_s=1003.0, steal_s=5.2, own_s=12.0, procs_running=3)
    d = between(a, b, 2)
    assert d["own_cpus"] == pytest.approx(1.0) and d["others_cpus"] == pytest.approx(0.5)
    assert d["steal_share"] == pytest.approx(0.05) and d["others_share"] == pytest.approx(0.3)
    # ticks and os.times() disagree a little: never below 0 (ours counted more than the CPUs' busy)
    c = Sample(wall=102.0, busy_s=1001.9, steal_s=5.0, own_s=12.0, procs_running=3)
    assert between(a, c, 2)["others_share"] == 0
    # no /proc/stat: unknown, not 0
    assert between(Sample(0, None, None, 0, None), Sample(1, None, None, 1, None), 2)["others_share"] is None


def test_the_meter_decides_on_its_busiest_phase():
    m = LoadMeter()
    m.phases = {"the CPU fp32 matmul": {"others_share": 0.24, "others_cpus": 0.48},
                "the CPU memory bandwidth": {"others_share": 0.05, "others_cpus": 0.1}}
    s = m.summary(threshold=0.25)
    assert s["loaded"] is False and s["worst"]["phase"] == "the CPU fp32 matmul"
    m.phases["the CPU memory bandwidth"]["others_share"] = 0.25
    s = m.summary(threshold=0.25)
    assert s["loaded"] is True and s["worst"] == {"phase": "the CPU memory bandwidth", "others_share": 0.25,
                                                  "others_cpus": 0.1}
    assert m.summary()["threshold"] == value("calibrate_others_share")
    m.phases = {}
    assert m.summary()["loaded"] is None


def test_load_words():
    assert "not recorded" in words(None)
    assert words({"others_share": None, "why": "not measured: no /proc/stat (Linux only)"}).endswith(
        "(not measured: no /proc/stat (Linux only))")
    assert words(LOADED).startswith("other processes held 48% of its 2 CPU(s)")


# ---- which ceilings a run is held to ------------------------------------------------------------

HERE = socket.gethostname()


def _cache(monkeypatch, tmp_path, peak):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    doc = {"schema": 1, "host": HERE, "measured_at": "2026-12-05T00:00:00Z", **cpu_doc(peak)}
    save({"cpu": doc})
    assert cache_path("cpu").is_file()
    return doc


def test_a_run_keeps_the_ceilings_it_started_with(monkeypatch, tmp_path):
    own = cpu_doc(1e9, measured_at="2026-12-01T00:00:00Z")
    _cache(monkeypatch, tmp_path, 5e11)                      # a later calibrate's
    doc, note = choose_ceilings(False, None, None, {"host": {"hostname": HERE}, "ceilings": {"cpu": own}})
    assert doc is own and note.startswith("ceilings copied into the run at its start")


def test_a_run_that_started_without_ceilings_does_not_take_a_later_calibrates(monkeypatch, tmp_path):
    _cache(monkeypatch, tmp_path, 5e11)
    doc, note = choose_ceilings(False, None, None, {"host": {"hostname": HERE}, "ceilings": None})
    assert doc is None and "no ceilings when this run started" in note and "--ceilings FILE" in note


def test_a_run_from_before_the_copy_takes_todays_cache_and_says_so(monkeypatch, tmp_path):
    cached = _cache(monkeypatch, tmp_path, 5e11)
    doc, note = choose_ceilings(False, None, None, {"host": {"hostname": HERE}})
    assert doc["peaks"] == cached["peaks"] and note.startswith(TODAYS)
    assert "measured 2026-12-05T00:00:00Z" in note
    # shown in front of the report's roofline line
    line = roofline_line({"mfu": None, "missing": [], "notes": [note]}).plain
    assert "! " + TODAYS in line
    # another host's run: this host's cache is not its machine
    doc, _ = choose_ceilings(False, None, None, {"host": {"hostname": HERE + "-elsewhere"}})
    assert doc is None
