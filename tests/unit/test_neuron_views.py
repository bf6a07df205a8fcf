"""Neuron samples in the live view (a panel per device) and in the verdict (a Neuron device as
the compute device, errors and ECC as secondary findings), from batches shaped like the
collector's."""
from __future__ import annotations

import pyarrow as pa
import pytest
from live_batches import MS, T0, catalog, perf_batch

from counterprof.analysis.classify import classify, describe
from counterprof.live.frame import live_figures
from counterprof.analysis.signals import Signal
from counterprof.collectors.neuron.metrics import METRICS
from counterprof.live.window import LiveWindow
from counterprof.ground.schema import samples_batch

CAT = catalog(*METRICS)


def neuron_batch(t_ns: int, rows: list[tuple[str, str, float]]) -> pa.RecordBatch:
    kinds = {m.name: m.kind for m in METRICS}
    return samples_batch([t_ns] * len(rows),
                         [100 * MS if kinds[m] in ("delta", "ratio") else None for m, _, _ in rows],
                         "neuron", [m for m, _, _ in rows], [e for _, e, _ in rows], [v for _, _, v in rows])


def figures(errors: float = 0.0):
    w = LiveWindow()
    for i in range(30):
        t = T0 + (i + 1) * 100 * MS
        w.write("samples", perf_batch(t, 100 * MS, {"task-clock": 20 * MS}), 0)
        w.write("samples", neuron_batch(t, [
            ("neuron.core_util", "neuron:0/core:0", 90.0),
            ("neuron.core_util", "neuron:0/core:1", 70.0),
            ("neuron.phys_core_util", "neuron:0/core:1/phys:3", 99.0),
            ("neuron.flop_count", "neuron:0/core:0", 2e11),          # 2e12 FLOP/s
            ("neuron.device_mem_used", "neuron:0/core:0", 2.0 * 2**30),
            ("neuron.device_mem_tensors", "neuron:0/core:0", 1.0 * 2**30),
            ("neuron.device_mem_total", "neuron:0", 96.0 * 2**30),
            ("neuron.exec_errors_numerical", "neuron:0/pid:42", errors),
            ("neuron.latency_p99", "neuron:0/pid:42", 0.012),
            ("neuron.core_util", "neuron:1/core:4", 10.0),
            ("neuron.power_util", "neuron:0", 35.0),
        ]), 0)
    return live_figures(w.snapshot(), CAT, {}, 10)


def test_a_panel_per_neuron_device_with_its_cores():
    f = figures()
    titles = [p.title for p in f.panels]
    assert titles[-2:] == ["neuron:0", "neuron:1"]
    p0 = next(p for p in f.panels if p.title == "neuron:0")
    by_label = {x.label: x for x in p0.figures}
    assert by_label["nc0 util"].value == pytest.approx(90.0) and by_label["nc1 util"].value == pytest.approx(70.0)
    assert by_label["nc0 FLOPs"].value == pytest.approx(2e12) and by_label["nc0 FLOPs"].unit == "FLOP/s"
    assert by_label["nc0 mem"].detail == "of 96.0 GiB"
    assert by_label["p42 lat p99"].value == pytest.approx(0.012)
    # the utilization rows lead; breakdowns, physical cores and zero error counts stay out
    assert [x.label for x in p0.figures if x.headline] == ["nc0 util", "nc1 util"]
    assert [x.label for x in p0.figures[2:5]] == ["nc0 FLOPs", "nc0 mem", "power_util"]
    assert not any(x.label.startswith(("nc0 device_mem_tensors", "nc1 phys")) or "phys" in x.key
                   for x in p0.figures)
    assert "p42 exec_errors_numerical" not in by_label
    assert [x.label for x in next(p for p in f.panels if p.title == "neuron:1").figures] == ["nc4 util"]


def test_errors_show_and_are_flagged():
    p0 = next(p for p in figures(errors=3.0).panels if p.title == "neuron:0")
    err = next(x for x in p0.figures if x.label == "p42 exec_errors_numerical")
    assert err.alert and err.value == pytest.approx(30.0)          # 3 per 100 ms


def test_live_verdict_names_the_neuron_cores():
    v = figures().verdict
    # cores 0, 1 and 4: (90 + 70 + 10) / 3 busy: most of the time the NeuronCores waited
    assert v.label.startswith("host-bound") or v.label.startswith("unknown"), v
    assert "NeuronCores busy 57% of the time" in v.evidence


def sig(**values):
    return {k: Signal(v, "test", k) for k, v in {"wall_s": 10.0, "cpu_busy": 0.2, **values}.items()}


def test_idle_neuron_cores_are_host_time():
    v = classify(sig(neuron_util=0.25, neuron_flops=1.5e12))
    assert v.device == "neuron" and v.verdict == "host"
    assert v.shares == {"host": 0.75, "compute|memory": 0.25}
    assert [e.text for e in v.evidence] == ["NeuronCores busy 25% of the time (neuron-monitor)",
                                            "1.50 TFLOP/s per NeuronCore"]


def test_busy_neuron_cores_compute_or_memory_is_undecided_and_says_why():
    v = classify(sig(neuron_util=0.95))
    assert v.verdict == "unknown" and v.undecided == ["compute", "memory"]
    assert "peak FLOP/s and memory bandwidth" in v.missing[0]
    assert describe(v).startswith("unknown (busy NEURON")


def test_a_neuron_core_barely_used_is_not_the_compute_device():
    assert classify(sig(neuron_util=0.01)).device == "cpu"


def test_execution_errors_and_ecc_are_secondary_findings():
    v = classify(sig(neuron_util=0.5, neuron_exec_errors=4.0, neuron_ecc_uncorrected=1.0,
                     neuron_ecc_corrected=0.0))
    texts = [e.text for e in v.secondary]
    assert "4 execution errors reported by the Neuron runtime (neuron.exec_errors_*)" in texts
    assert "1 uncorrected ECC events on the Neuron devices (neuron.ecc_*)" in texts
    assert not any("corrected ECC" in t and t.startswith("0") for t in texts)
