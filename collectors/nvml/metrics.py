"""What the nvml collector records: the catalog, and where each metric comes from.

Names: `gpu.*` are NVML device readings, `gpm.*` GPU Performance Monitoring metrics over a
window (Hopper and newer). Suffixes say the unit family: `_util` percent, `_bytes` bytes in the
interval (delta), `_rate` bytes per second over the window, `_clock` MHz, `_time_*` seconds in
the interval. Entities: `gpu:N` (CUDA ordinal), `gpu:N/nvlink:L` for one NVLink link.
"""
from __future__ import annotations


from counterprof.ground.schema import Metric
from counterprof.ground.record import record

SOURCE = "nvml"


def _m(name: str, unit: str, kind: str, description: str) -> Metric:
    return Metric(name, unit, kind, description, SOURCE)


@record(frozen=True)
class FieldSpec:
    """One NVML field read with nvmlDeviceGetFieldValues. counter: a cumulative counter whose
    difference between two reads is the metric (a delta over the fields' own timestamps);
    else a gauge. scale: to the catalog's unit. rare: a slow-moving gauge read once a second
    (riding on one fast tick's batch), not every tick."""

    const: str           # the NVML_FI_* name in nvidia-ml-py
    metric: str
    counter: bool
    scale: float = 1.0
    rare: bool = False


# In one nvmlDeviceGetFieldValues call per GPU per fast tick: a counter's resolution is how
# often it is read, and no NVML call gives a field's history, so these stay at the interval.
FIELDS = [
    FieldSpec("NVML_FI_DEV_POWER_INSTANT", "gpu.power", False, 1e-3),            # mW
    FieldSpec("NVML_FI_DEV_POWER_AVERAGE", "gpu.power_avg", False, 1e-3, rare=True),  # driver's 1 s mean
    FieldSpec("NVML_FI_DEV_POWER_CURRENT_LIMIT", "gpu.power_limit", False, 1e-3, rare=True),
    FieldSpec("NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "gpu.energy", True, 1e-3),  # mJ since driver load
    FieldSpec("NVML_FI_DEV_MEMORY_TEMP", "gpu.mem_temp", False, rare=True),
    FieldSpec("NVML_FI_DEV_PCIE_COUNT_TX_BYTES", "gpu.pcie_tx_bytes", True),
    FieldSpec("NVML_FI_DEV_PCIE_COUNT_RX_BYTES", "gpu.pcie_rx_bytes", True),
    # Cumulative time the clocks were held down by each policy, in ns (as
    # nvmlDeviceGetViolationStatus's violationTime). These ids (74-81) are the same in every
    # nvidia-ml-py; the newer CLOCKS_EVENT_REASON_{SW,HW}_THERM / POWER_BRAKE ids were
    # renumbered between releases (251.. vs 269..), so reading them could return another field.
    FieldSpec("NVML_FI_DEV_PERF_POLICY_POWER", "gpu.throttle_time_power", True, 1e-9),
    FieldSpec("NVML_FI_DEV_PERF_POLICY_THERMAL", "gpu.throttle_time_thermal", True, 1e-9),
    FieldSpec("NVML_FI_DEV_PERF_POLICY_SYNC_BOOST", "gpu.throttle_time_sync_boost", True, 1e-9),
    FieldSpec("NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT", "gpu.throttle_time_board_limit", True, 1e-9),
    FieldSpec("NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION", "gpu.throttle_time_low_util", True, 1e-9),
    FieldSpec("NVML_FI_DEV_PERF_POLICY_RELIABILITY", "gpu.throttle_time_reliability", True, 1e-9),
    FieldSpec("NVML_FI_DEV_PERF_POLICY_TOTAL_APP_CLOCKS", "gpu.throttle_time_app_clocks", True, 1e-9),
    FieldSpec("NVML_FI_DEV_PERF_POLICY_TOTAL_BASE_CLOCKS", "gpu.throttle_time_base_clocks", True, 1e-9),
]
# Per NVLink link (scope id = link), cumulative KiB of data (payload, no protocol overhead).
NVLINK_FIELDS = [
    FieldSpec("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", "gpu.nvlink_tx_bytes", True, 1024.0),
    FieldSpec("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", "gpu.nvlink_rx_bytes", True, 1024.0),
]
NVLINK_LINK_COUNT = "NVML_FI_DEV_NVLINK_LINK_COUNT"

# GPM metric constant -> (metric, scale to the catalog unit)
GPM = {
    "NVML_GPM_METRIC_GRAPHICS_UTIL": ("gpm.graphics_util", 1.0),
    "NVML_GPM_METRIC_SM_UTIL": ("gpm.sm_util", 1.0),
    "NVML_GPM_METRIC_SM_OCCUPANCY": ("gpm.sm_occupancy", 1.0),
    "NVML_GPM_METRIC_ANY_TENSOR_UTIL": ("gpm.tensor_util", 1.0),
    "NVML_GPM_METRIC_DRAM_BW_UTIL": ("gpm.dram_bw_util", 1.0),
    "NVML_GPM_METRIC_FP16_UTIL": ("gpm.fp16_util", 1.0),
    "NVML_GPM_METRIC_FP32_UTIL": ("gpm.fp32_util", 1.0),
    "NVML_GPM_METRIC_FP64_UTIL": ("gpm.fp64_util", 1.0),
    "NVML_GPM_METRIC_PCIE_TX_PER_SEC": ("gpm.pcie_tx_rate", 1048576.0),        # MiB/s
    "NVML_GPM_METRIC_PCIE_RX_PER_SEC": ("gpm.pcie_rx_rate", 1048576.0),
    "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC": ("gpm.nvlink_tx_rate", 1048576.0),
    "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC": ("gpm.nvlink_rx_rate", 1048576.0),
}



@record(frozen=True)
class SampleSpec:
    """One of the driver's sample buffers (nvmlDeviceGetSamples), read in bulk: every sample
    since the last one seen, each at the driver's own timestamp. metric: always from the
    buffer. replaces: the polled reading the buffer stands in for (the same driver sample,
    with its history), polled each tick again where the buffer does not answer."""

    const: str                  # the NVML_*_SAMPLES name in nvidia-ml-py
    metric: str | None
    replaces: str | None
    scale: float = 1.0


DRIVER_SAMPLES = [
    SampleSpec("NVML_GPU_UTILIZATION_SAMPLES", "gpu.util_sampled", "gpu.util"),
    SampleSpec("NVML_MEMORY_UTILIZATION_SAMPLES", "gpu.mem_util_sampled", "gpu.mem_util"),
    SampleSpec("NVML_TOTAL_POWER_SAMPLES", "gpu.power_sampled", None, 1e-3),     # mW
    SampleSpec("NVML_PROCESSOR_CLK_SAMPLES", None, "gpu.sm_clock"),              # MHz
    SampleSpec("NVML_MEMORY_CLK_SAMPLES", None, "gpu.mem_clock"),
]

METRICS = [
    _m("gpu.util", "percent", "gauge", "share of the driver's sample period (1/6 s to 1 s) in which a kernel ran, every period at the driver's time (its sample buffer; nvmlDeviceGetUtilizationRates each tick where the buffer does not answer)"),
    _m("gpu.mem_util", "percent", "gauge", "share of the driver's sample period in which device memory was read or written (as gpu.util)"),
    _m("gpu.util_sampled", "percent", "gauge", "gpu.util from the driver's sample buffer, at the driver's own times (sub-second history)"),
    _m("gpu.mem_util_sampled", "percent", "gauge", "gpu.mem_util from the driver's sample buffer, at the driver's own times"),
    _m("gpu.mem_used", "bytes", "gauge", "device memory in use (all processes), once a second"),
    _m("gpu.mem_total", "bytes", "gauge", "device memory size"),
    _m("gpu.proc_mem_used", "bytes", "gauge", "device memory used by the workload's process tree"),
    _m("gpu.power", "W", "gauge", "instantaneous board power"),
    _m("gpu.power_avg", "W", "gauge", "board power averaged by the driver over 1 s, once a second"),
    _m("gpu.power_sampled", "W", "gauge", "board power from the driver's sample buffer, at the driver's own times"),
    _m("gpu.power_limit", "W", "gauge", "power limit in force, once a second"),
    _m("gpu.energy", "J", "delta", "energy used in the interval (difference of the driver's energy counter)"),
    _m("gpu.sm_clock", "MHz", "gauge", "SM clock, every driver sample at its time (NVML_PROCESSOR_CLK_SAMPLES; nvmlDeviceGetClockInfo each tick where the buffer does not answer)"),
    _m("gpu.mem_clock", "MHz", "gauge", "memory clock (as gpu.sm_clock, NVML_MEMORY_CLK_SAMPLES)"),
    _m("gpu.temp", "celsius", "gauge", "GPU die temperature, once a second"),
    _m("gpu.mem_temp", "celsius", "gauge", "memory temperature, once a second"),
    _m("gpu.pcie_tx_bytes", "bytes", "delta", "bytes the GPU sent over PCIe in the interval (difference of the byte counter)"),
    _m("gpu.pcie_rx_bytes", "bytes", "delta", "bytes the GPU received over PCIe in the interval"),
    _m("gpu.nvlink_tx_bytes", "bytes", "delta", "data bytes sent over one NVLink link in the interval (entity gpu:N/nvlink:L)"),
    _m("gpu.nvlink_rx_bytes", "bytes", "delta", "data bytes received over one NVLink link in the interval"),
    _m("gpu.throttle_reasons", "bitmask", "gauge", "clock-event (throttle) reasons, once a second: nvmlClocksEventReason* bits (0x1 idle, 0x4 SW power cap, 0x8 HW slowdown, 0x20 SW thermal, 0x40 HW thermal, 0x80 power brake)"),
    _m("gpu.throttle_time_power", "s", "delta", "time in the interval the clocks were held down by the power policy (SW power cap)"),
    _m("gpu.throttle_time_thermal", "s", "delta", "time in the interval the clocks were held down by the thermal policy"),
    _m("gpu.throttle_time_sync_boost", "s", "delta", "time in the interval the clocks were held down by sync boost"),
    _m("gpu.throttle_time_board_limit", "s", "delta", "time in the interval the clocks were held down by the board limit"),
    _m("gpu.throttle_time_low_util", "s", "delta", "time in the interval the clocks were held down for low utilization"),
    _m("gpu.throttle_time_reliability", "s", "delta", "time in the interval the clocks were held down by the reliability policy"),
    _m("gpu.throttle_time_app_clocks", "s", "delta", "time in the interval the clocks ran below the application clocks"),
    _m("gpu.throttle_time_base_clocks", "s", "delta", "time in the interval the clocks ran below the base clocks"),
    _m("gpm.graphics_util", "percent", "ratio", "share of the window in which any graphics or compute work was active"),
    _m("gpm.sm_util", "percent", "ratio", "share of SMs busy over the window"),
    _m("gpm.sm_occupancy", "percent", "ratio", "resident warps over the theoretical maximum, over the window"),
    _m("gpm.tensor_util", "percent", "ratio", "share of the window the SMs ran any tensor-core instruction"),
    _m("gpm.dram_bw_util", "percent", "ratio", "device-memory bandwidth used over the theoretical maximum"),
    _m("gpm.fp16_util", "percent", "ratio", "share of the window the SMs ran non-tensor FP16 math"),
    _m("gpm.fp32_util", "percent", "ratio", "share of the window the SMs ran non-tensor FP32 math"),
    _m("gpm.fp64_util", "percent", "ratio", "share of the window the SMs ran non-tensor FP64 math"),
    _m("gpm.pcie_tx_rate", "bytes/s", "ratio", "PCIe bytes per second sent by the GPU over the window"),
    _m("gpm.pcie_rx_rate", "bytes/s", "ratio", "PCIe bytes per second received by the GPU over the window"),
    _m("gpm.nvlink_tx_rate", "bytes/s", "ratio", "NVLink bytes per second sent over all links over the window"),
    _m("gpm.nvlink_rx_rate", "bytes/s", "ratio", "NVLink bytes per second received over all links over the window"),
]
