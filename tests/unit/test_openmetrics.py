"""openmetrics.py's naming and labels: every catalog metric of the built-in collectors named in
base units with its OpenMetrics unit, labels from bounded sets (no tid, pid or figure), GPU
series labelled as DCGM-exporter labels them, the verdict without its figures."""
from __future__ import annotations

import importlib
import re

import pyarrow as pa
import pytest

from counterprof.live.figures import LiveVerdict
from counterprof.openmetrics import LiveCollector, Totals, metric_name

pytest.importorskip("prometheus_client", reason="prometheus-client is in the test extra")
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

# what OpenMetrics and Prometheus' naming guide accept as a unit: base units, a ratio 0-1
BASE_UNITS = {"seconds", "bytes", "ratio", "joules", "watts", "hertz", "celsius",
              "bytes_per_second", "flops_per_second"}


def built_in_catalog():
    out = {}
    for mod in ("counterprof.collectors.host", "counterprof.collectors.nvml.metrics",
                "counterprof.collectors.neuron.metrics", "counterprof.collectors.threads"):
        for value in vars(importlib.import_module(mod)).values():
            if isinstance(value, list) and value and all(hasattr(m, "unit") and hasattr(m, "kind")
                                                         for m in value):
                out.update({m.name: m for m in value})
    return out


def test_every_built_in_metric_has_one_name_in_base_units():
    catalog = built_in_catalog()
    assert len(catalog) > 80, sorted(catalog)
    names = {}
    for m in catalog.values():
        if m.unit == "bitmask":
            continue
        name, factor, unit = metric_name(m.name, m.unit)
        assert re.fullmatch(r"counterprof_[a-z0-9_]+", name), name
        assert name not in names, (m.name, names.get(name))     # two metrics, one family
        names[name] = m.name
        if unit:
            assert unit in BASE_UNITS and name.endswith("_" + unit), (m.name, name, unit)
        # no unit twice, no unit of another scale left in the name
        assert not re.search(r"_(ms|us|ns|mhz|mw|mj|percent|pct|kib|mib)(_|$)", name), name
        assert "_count_" not in name and not name.endswith(("_count", "_sum", "_bucket", "_info")), name
        if m.unit == "percent":
            assert unit == "ratio" and factor == 0.01
    # the ones issue 34 names
    assert metric_name("thread.intraop.count", "threads") == ("counterprof_thread_intraop_threads", 1.0, "")
    assert metric_name("task-clock", "ns") == ("counterprof_task_clock_seconds", 1e-9, "seconds")
    assert metric_name("gpm.pcie_tx_rate", "bytes/s")[0] == "counterprof_gpm_pcie_tx_bytes_per_second"
    assert metric_name("neuron.flop_count", "FLOP")[0] == "counterprof_neuron_flops"
    assert metric_name("gpu.sm_clock", "MHz") == ("counterprof_gpu_sm_clock_hertz", 1e6, "hertz")


def batch(rows):
    """samples rows (source, metric, entity, value, time_ns) as a session emits them."""
    src, met, ent, val, t = zip(*rows)
    return pa.record_batch({"source": pa.array(src).dictionary_encode(),
                            "metric": pa.array(met).dictionary_encode(),
                            "entity": pa.array(ent).dictionary_encode(),
                            "value": pa.array(val, pa.float64()),
                            "time": pa.array(t, pa.timestamp("ns"))})


GPUS = [  # meta.json's "gpus" as the nvml collector writes them: CUDA_VISIBLE_DEVICES=1 here
    {"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-aaaa1111-2222-3333-4444-555566667777",
     "pci_bus_id": "00000000:3A:00.0", "nvml_index": 1},
]
CATALOG = {
    "task-clock": {"unit": "ns", "kind": "delta", "description": "CPU time"},
    "thread.main.running": {"unit": "s", "kind": "delta"},
    "gpu.util": {"unit": "percent", "kind": "gauge"},
    "gpu.nvlink_tx_bytes": {"unit": "bytes", "kind": "delta"},
    "gpu.throttle_reasons": {"unit": "bitmask", "kind": "gauge"},
    "neuron.host_mem_used": {"unit": "bytes", "kind": "gauge"},
    "neuron.latency_p50": {"unit": "s", "kind": "gauge"},
}


def collector(verdict=None):
    totals = Totals()
    for i in range(3):      # three scrapes' worth of batches: new tids and pids each time
        totals.write("samples", batch([
            ("perf", "task-clock", f"tid:{100 + i}", 1e9, i),
            ("threads", "thread.main.running", f"tid:{200 + i}", 0.5, i),
            ("nvml", "gpu.util", "gpu:0", 40.0 + i, i),
            ("nvml", "gpu.nvlink_tx_bytes", "gpu:0/nvlink:3", 1000.0, i),
            ("nvml", "gpu.throttle_reasons", "gpu:0", 4.0, i),
            ("neuron", "neuron.host_mem_used", f"neuron:0/pid:{300 + i}", 1e6, i),
            ("neuron", "neuron.latency_p50", f"neuron:0/pid:{300 + i}", 0.01 * (i + 1), i),
        ]))
    c = LiveCollector(totals, None, host="node7")
    c.catalog = lambda: CATALOG
    c.gpus = lambda: GPUS
    c.run_info = {"command": "python train.py", "run": "/runs/r1"}
    if verdict is not None:
        c._verdict = lambda: verdict          # the live window's verdict, as the view computes it
    return c


def samples(c):
    out = {}
    for fam in c.collect():
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_labels_are_bounded_and_gpu_labels_are_dcgm_exporters():
    got = samples(collector())
    # tids summed into one series per metric; seconds, not ns
    assert got["counterprof_task_clock_seconds_total"] == [
        ({"rank": "0", "entity": "tid:*", "Hostname": "node7"}, pytest.approx(3.0))]
    assert len(got["counterprof_thread_main_running_seconds_total"]) == 1
    # a GPU series: NVML's index (1, not the CUDA ordinal 0), its UUID and bus id, no entity
    ((labels, value),) = got["counterprof_gpu_util_ratio"]
    assert labels == {"rank": "0", "gpu": "1", "UUID": GPUS[0]["uuid"],
                      "pci_bus_id": "00000000:3A:00.0", "Hostname": "node7"}
    assert value == pytest.approx(0.42)                  # the newest percent as a ratio
    ((labels, value),) = got["counterprof_gpu_nvlink_tx_bytes_total"]
    assert labels["nvlink"] == "3" and labels["gpu"] == "1" and value == 3000.0
    assert not any("throttle_reasons" in name for name in got)       # a bitmask is no number
    # one GPU info series with the model and the workload's ordinal
    ((labels, value),) = got["counterprof_gpu_info"]
    assert labels == {"gpu": "1", "UUID": GPUS[0]["uuid"], "pci_bus_id": "00000000:3A:00.0",
                      "Hostname": "node7", "model_name": "NVIDIA H100 80GB HBM3", "cuda_device": "0"}
    # the processes of a Neuron device: one series, bytes added up, a latency averaged
    assert got["counterprof_neuron_host_mem_used_bytes"] == [
        ({"rank": "0", "entity": "neuron:0/pid:*", "Hostname": "node7"}, 3e6)]
    ((_, p50),) = got["counterprof_neuron_latency_p50_seconds"]
    assert p50 == pytest.approx(0.02)
    # no pid, tid or number in any label value but the bounded ones
    for name, rows in got.items():
        for labels, _ in rows:
            for key, val in labels.items():
                if key not in ("run", "command", "UUID", "pci_bus_id", "model_name"):
                    assert not re.search(r"(tid|pid|cpu):\d", val), (name, key, val)


def test_the_verdict_is_a_bounded_label_and_the_shares_gauges():
    v = LiveVerdict("host-bound (87% of the time; input pipeline 61%)", "pid 4242 waits 0.61 s",
                    {"host": 0.87, "compute": 0.13}, kind="host-bound")
    got = samples(collector(v))
    assert got["counterprof_verdict_info"] == [({"Hostname": "node7", "verdict": "host-bound"}, 1.0)]
    shares = {labels["class"]: value for labels, value in got["counterprof_time_share_ratio"]}
    # every class each scrape (0 where it has no share), so none comes and goes
    assert shares == {"compute": 0.13, "memory": 0.0, "compute|memory": 0.0, "collectives": 0.0,
                      "host": 0.87}
    # run_info: one series per target, no host label (Prometheus' instance says where)
    assert got["counterprof_run_info"] == [({"command": "python train.py", "run": "/runs/r1"}, 1.0)]
    # the machine view's verdicts have no figures: the label is the verdict
    assert LiveVerdict("idle", "0.1 of 2 CPUs busy").name == "idle"


def test_both_formats_carry_the_units():
    v = LiveVerdict("compute-bound (60% of the time)", "", {"compute": 0.6, "host": 0.4},
                    kind="compute-bound")
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector(v))
    om = generate_openmetrics(reg).decode()
    fams = {f.name: f for f in parse_openmetrics(om)}       # the strict OpenMetrics parser
    assert fams["counterprof_task_clock_seconds"].unit == "seconds"
    assert fams["counterprof_task_clock_seconds"].type == "counter"
    assert fams["counterprof_gpu_util_ratio"].unit == "ratio"
    assert fams["counterprof_time_share_ratio"].unit == "ratio"
    assert fams["counterprof_verdict"].type == "info"
    assert "# UNIT counterprof_gpu_nvlink_tx_bytes bytes" in om
    text = generate_latest(reg).decode()
    assert "counterprof_task_clock_seconds_total{" in text and "# UNIT" not in text
