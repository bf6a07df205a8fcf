"""The neuron collector's pure parts: neuron-monitor's report lines (the guide's examples in
tests/data/neuron, and the variants real releases print), the config it is given, the sysfs
tree's counters, NEURON_RT_VISIBLE_CORES and neuron-ls -j."""
from __future__ import annotations

import copy
import json
import os

import pytest

from counterprof.collectors.neuron import metrics, monitor, sysfs, topology
from counterprof.collectors.neuron.monitor import Parser
from fake_neuron import DATA, bump, make_sysfs

GUIDE = json.loads((DATA / "monitor-guide.json").read_text())
OLD = json.loads((DATA / "monitor-old-guide.json").read_text())


def rows_of(obj, wanted=lambda pid, tag: True, parser=None):
    parser = parser or Parser()
    rows, errors = parser.rows(obj, wanted)
    return {(r.metric, r.entity): r for r in rows}, errors, parser


def test_guide_line_every_group():
    got, errors, parser = rows_of(GUIDE)
    assert errors == {}
    # neuron_hardware_info: 4 logical NeuronCores per device, so cores 0 and 1 are on device 0
    assert parser.topology.cores_per_device == 4 and parser.topology.device_memory == 103079215104
    assert got[("neuron.core_util", "neuron:0/core:0")].value == 42.01
    assert got[("neuron.core_util", "neuron:0/core:1")].value == 42.02
    assert got[("neuron.core_util", "neuron:0/core:1")].duration_ns == 1_000_113_182
    # Trn2's physical cores of each logical one
    assert got[("neuron.phys_core_util", "neuron:0/core:0/phys:0")].value == 21.01
    assert got[("neuron.phys_core_util", "neuron:0/core:1/phys:3")].value == 63.02
    assert got[("neuron.flops_rate", "neuron:0/core:0")].value == 1234567891011
    # memory: the per-core breakdown and its sum, the runtime's host memory
    assert got[("neuron.device_mem_constants", "neuron:0/core:0")].value == 193986816
    assert got[("neuron.device_mem_used", "neuron:0/core:1")].value == 193986816 + 176285056 + 20971520
    rt = "neuron:0/pid:0"
    assert got[("neuron.host_mem_used", rt)].value == 6997643264
    assert got[("neuron.host_mem_dma_buffers", rt)].value == 1048576
    assert got[("neuron.device_mem_total", "neuron:0")].value == 103079215104
    # executions, errors, latencies, vCPU
    assert got[("neuron.exec_completed", rt)].value == 123
    assert got[("neuron.exec_completed", rt)].duration_ns == 1_030_613_214
    assert got[("neuron.exec_errors_numerical", rt)].value == 0
    assert got[("neuron.latency_p50", rt)].value == 0.01100008
    assert got[("neuron.latency_p99", rt)].value == 0.01100012
    assert got[("neuron.device_latency_p99", rt)].value == 0.01000012
    assert got[("neuron.latency_p50", rt)].duration_ns is None          # a gauge
    assert got[("neuron.runtime_vcpu_user", rt)].value == 42.01
    assert got[("neuron.runtime_vcpu_system", rt)].value == 12.34
    # ECC of the device the runtime uses
    assert got[("neuron.ecc_mem_corrected", "neuron:0")].value == 0
    assert got[("neuron.ecc_sram_uncorrected", "neuron:0")].duration_ns == 1_030_359_284
    # every metric is in the catalog
    assert {m for m, _ in got} <= set(metrics.BY_NAME)


def test_catalog_entries():
    for m in metrics.METRICS:
        assert m.source == "neuron" and m.unit and m.kind in ("delta", "gauge", "ratio")
        assert m.description.endswith(("(neuron-monitor)", "(Neuron sysfs)"))
    kinds = {m.name: m.kind for m in metrics.METRICS}
    assert kinds["neuron.exec_completed"] == kinds["neuron.ecc_mem_uncorrected"] == "delta"
    assert kinds["neuron.flop_count"] == kinds["neuron.nc_time_in_use"] == "delta"
    assert kinds["neuron.latency_p99"] == "gauge"


def test_effective_flops_and_device_spelling():
    line = copy.deepcopy(GUIDE)
    rep = line["neuron_runtime_data"][0]["report"]
    for c in rep["neuroncore_counters"]["neuroncores_in_use"].values():
        c["effective_flops"] = c.pop("flops") * 2
    used = rep["memory_used"]["neuron_runtime_used_bytes"]
    used["device"] = used.pop("neuron_device")
    del used["usage_breakdown"]["neuroncore_memory_usage"]     # only the total is left
    got, _, _ = rows_of(line)
    assert got[("neuron.flops_rate", "neuron:0/core:0")].value == 2 * 1234567891011
    # no per-core breakdown: the runtime's total, on the device of its first NeuronCore
    assert got[("neuron.device_mem_used", "neuron:0")].value == 12519788544


def test_null_latency_gives_no_row_and_an_error_string_is_reported():
    line = copy.deepcopy(GUIDE)
    ex = line["neuron_runtime_data"][0]["report"]["execution_stats"]
    ex["latency_stats"] = {"total_latency": None, "device_latency": None}
    ex["error"] = "failed to read execution stats"
    line["neuron_runtime_data"][0]["pid"] = 77
    got, errors, _ = rows_of(line)
    assert not any(m.startswith(("neuron.latency", "neuron.device_latency")) for m, _ in got)
    assert errors == {"runtime pid 77 execution_stats": "failed to read execution stats"}
    assert got[("neuron.exec_completed", "neuron:0/pid:77")].value == 123     # the rest is kept


def test_runtime_error_and_hardware_info_error():
    line = copy.deepcopy(GUIDE)
    line["neuron_runtime_data"][0]["error"] = "runtime went away"
    line["neuron_hardware_info"] = {"error": "Neuron driver not loaded"}
    _, errors, parser = rows_of(line)
    assert errors["runtime pid 0"] == "runtime went away"
    assert errors["neuron_hardware_info"] == "Neuron driver not loaded"
    assert parser.topology.cores_per_device is None


def test_older_group_names():
    got, errors, parser = rows_of(OLD)
    assert errors == {}
    # no neuron_hardware_info in old output: cores per device unknown, device 0
    assert got[("neuron.core_util", "neuron:0/core:3")].value == 42.04
    rt = "neuron:0/pid:-"
    assert got[("neuron.exec_completed", rt)].value == 123
    assert got[("neuron.latency_p99", rt)].value == 0.01100012
    assert got[("neuron.runtime_vcpu_user", rt)].value == 42.01
    assert got[("neuron.host_mem_used", rt)].value == 1000000
    assert got[("neuron.device_mem_used", "neuron:0")].value == 2000000       # runtime_memory.device
    assert got[("neuron.ecc_mem_uncorrected", "neuron:0")].value == 0          # hw_counters, device_index
    assert ("neuron.ecc_sram_corrected", "neuron:0") not in got               # the old group has none
    assert ("neuron.exec_errors_model", rt) not in got                        # nor this kind


def test_only_the_workload_runtimes_and_its_devices():
    line = copy.deepcopy(GUIDE)
    other = copy.deepcopy(line["neuron_runtime_data"][0])
    other.update(pid=999, neuron_runtime_tag="someone-else")
    other["report"]["neuroncore_counters"]["neuroncores_in_use"] = {"8": {"neuroncore_utilization": 99.0}}
    other["report"]["memory_used"]["neuron_runtime_used_bytes"]["usage_breakdown"]["neuroncore_memory_usage"] = {}
    line["neuron_runtime_data"].append(other)
    line["system_data"]["neuron_hw_counters"]["neuron_devices"].append(
        {"neuron_device_index": 2, "mem_ecc_corrected": 5, "mem_ecc_uncorrected": 0,
         "sram_ecc_uncorrected": 0, "sram_ecc_corrected": 0})
    got, _, parser = rows_of(line, wanted=lambda pid, tag: pid == 0)
    assert not any("core:8" in e or "pid:999" in e for _, e in got)
    assert ("neuron.ecc_mem_corrected", "neuron:2") not in got       # not the workload's device
    assert parser.cores_seen == {0, 1} and parser.devices_used == {0}
    got, _, _ = rows_of(line, wanted=lambda pid, tag: tag == "someone-else")
    assert got[("neuron.core_util", "neuron:2/core:8")].value == 99.0
    assert got[("neuron.ecc_mem_corrected", "neuron:2")].value == 5


def test_values_that_are_not_numbers_give_no_row():
    line = copy.deepcopy(GUIDE)
    c = line["neuron_runtime_data"][0]["report"]["neuroncore_counters"]["neuroncores_in_use"]["0"]
    c["neuroncore_utilization"], c["flops"] = None, "n/a"
    line["neuron_runtime_data"][0]["report"]["neuron_runtime_vcpu_usage"]["vcpu_usage"]["user"] = True
    got, _, _ = rows_of(line)
    assert ("neuron.core_util", "neuron:0/core:0") not in got
    assert ("neuron.flops_rate", "neuron:0/core:0") not in got
    assert ("neuron.runtime_vcpu_user", "neuron:0/pid:0") not in got
    assert got[("neuron.core_util", "neuron:0/core:1")].value == 42.02


@pytest.mark.parametrize("line, why", [
    (b'{"neuron_runtime_data": [{"pid": 1, "rep', "not JSON"),
    (b"[1, 2]", "a JSON list"),
    (b"\xff\xfe garbage", "not JSON"),
])
def test_decode_says_what_is_wrong(line, why):
    with pytest.raises(ValueError, match=why):
        monitor.decode(line)


def test_decode_a_guide_line():
    assert monitor.decode((json.dumps(GUIDE) + "\n").encode())["neuron_hardware_info"]["neuron_device_count"] == 16


def test_config_at_the_interval():
    cfg = monitor.config(0.1)
    assert cfg["period"] == "1s"                          # never below a second
    assert monitor.config(2.0)["period"] == "2s" and monitor.config(1.5)["period"] == "1500ms"
    assert [m["type"] for m in cfg["neuron_runtimes"][0]["metrics"]] == [
        "neuroncore_counters", "memory_used", "neuron_runtime_vcpu_usage", "execution_stats"]
    assert cfg["neuron_runtimes"][0]["tag_filter"] == ".*"
    assert cfg["system_metrics"] == [{"type": "neuron_hw_counters"}]
    assert monitor.config(1, "my.app+1")["neuron_runtimes"][0]["tag_filter"] == r"^my\.app\+1$"


@pytest.mark.parametrize("text, cores", [
    ("0-3", [0, 1, 2, 3]), ("4,5", [4, 5]), ("0-1,6", [0, 1, 6]), (" 2 ", [2]), ("1,1", [1]),
    ("", None), (None, None), ("a-b", None), ("3-1", None), ("0-", None),
])
def test_visible_cores(text, cores):
    assert topology.parse_core_list(text) == cores


def test_neuron_ls_rows():
    devices = json.loads((DATA / "neuron-ls.json").read_text())
    assert topology.device_rows(devices) == [
        ["neuron:0", "cc:00.0", "8", "2", "96.0 GiB", "0,1,2,3", "268911 neuron-bench exec --run-as-cc-neff"]]


def test_sysfs_counters_as_deltas(tmp_path):
    root = make_sysfs(tmp_path / "nd", devices=2, cores=2)
    s = sysfs.SysfsSampler(str(root))
    assert [(d, c) for d, c, _ in s.layout] == [(0, 0), (0, 1), (1, 2), (1, 3)]
    first = s.tick(1_000_000_000, None)
    assert not any(r.metric in ("neuron.flop_count", "neuron.nc_time_in_use") for r in first)   # a baseline
    power = [r for r in first if r.metric == "neuron.power_util"]
    assert [(r.entity, r.value) for r in power] == [("neuron:0", 32.5), ("neuron:1", 32.5)]
    mem = {r.entity: r.value for r in first if r.metric == "neuron.sysfs_device_mem_used"}
    assert mem["neuron:1/core:3"] == 2 * (1 << 20)        # constants + tensors totals
    bump(root, 1, 1, flops=5_000_000, us=250_000)
    half = {(r.metric, r.entity): r for r in s.tick(1_500_000_000, {3})}
    assert half[("neuron.flop_count", "neuron:1/core:3")].value == 5_000_000
    assert half[("neuron.flop_count", "neuron:1/core:3")].duration_ns == 500_000_000
    assert half[("neuron.nc_time_in_use", "neuron:1/core:3")].value == pytest.approx(0.25)
    assert {m for m, _ in half} == {"neuron.flop_count", "neuron.nc_time_in_use"}   # gauges: once a second
    bump(root, 1, 1, flops=1)
    second = {(r.metric, r.entity): r for r in s.tick(2_000_000_000, {3})}
    assert second[("neuron.flop_count", "neuron:1/core:3")].value == 1
    assert second[("neuron.sysfs_device_mem_used", "neuron:1/core:3")].value == 2 * (1 << 20)
    assert not any("core:0" in e for _, e in second)       # only the wanted core
    assert second[("neuron.power_util", "neuron:1")].value == 32.5     # the wanted core's device
    assert ("neuron.power_util", "neuron:0") not in second


def test_sysfs_counter_directories_and_a_cleared_counter(tmp_path):
    root = make_sysfs(tmp_path / "nd", devices=1, cores=1, counter_dirs=True)
    s = sysfs.SysfsSampler(str(root))
    bump(root, 0, 0, flops=100)
    s.tick(1_000, None)
    bump(root, 0, 0, flops=50)
    assert [r.value for r in s.tick(2_000, None) if r.metric == "neuron.flop_count"] == [50]
    (root / "neuron0" / "neuron_core0" / "stats" / "other_info" / "flop_count" / "total").write_text("7\n")
    assert [r for r in s.tick(3_000, None) if r.metric == "neuron.flop_count"] == []   # cleared
    bump(root, 0, 0, flops=3)
    assert [r.value for r in s.tick(4_000, None) if r.metric == "neuron.flop_count"] == [3]


@pytest.mark.parametrize("text, got", [
    ("POWER_STATUS_VALID,1700000000,10.00,55.00,32.50\n", (1700000000, 32.5)),
    ("POWER_STATUS_NO_DATA,1700000000,0,0,0", None),
    ("POWER_STATUS_INVALID,0,0,0,0", None),
    ("POWER_STATUS_VALID,soon,1,2,3", None),
    ("", None),
])
def test_power_line(text, got):
    assert sysfs.parse_power(text) == got


def test_sysfs_never_opened_for_writing(tmp_path, monkeypatch):
    root = make_sysfs(tmp_path / "nd")
    modes = []
    real_open = open

    def spy(path, mode="r", *a, **k):
        if str(path).startswith(str(root)):
            modes.append(mode)
        return real_open(path, mode, *a, **k)

    real_os_open = os.open

    def os_spy(path, flags, *a, **k):
        if str(path).startswith(str(root)):
            modes.append("r" if flags & os.O_ACCMODE == os.O_RDONLY else f"flags {flags:#x}")
        return real_os_open(path, flags, *a, **k)

    monkeypatch.setattr("builtins.open", spy)
    monkeypatch.setattr(os, "open", os_spy)
    s = sysfs.SysfsSampler(str(root))
    s.tick(1, None)
    s.tick(2, None)
    assert modes and set(modes) == {"r"}
