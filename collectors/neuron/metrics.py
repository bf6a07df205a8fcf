"""What the neuron collector records: the catalog.

Names follow gpu.*: `neuron.*`, suffixes saying the unit family (`_util` percent, `_rate` per
second over the monitor's period, `_bytes`/`_used` bytes, `_time` seconds). Entities:
`neuron:D` (a Neuron device), `neuron:D/core:C` (NeuronCore C, numbered across the machine as
neuron-monitor and NEURON_RT_VISIBLE_CORES number them), `neuron:D/core:C/phys:P` (a physical
core of a logical NeuronCore on Trn2), `neuron:D/pid:P` (a Neuron runtime: process P, on the
device of its first NeuronCore).
"""
from __future__ import annotations

from counterprof.ground.schema import Metric

SOURCE = "neuron"

MONITOR = "neuron-monitor"
SYSFS = "Neuron sysfs"


def _m(name: str, unit: str, kind: str, origin: str, description: str) -> Metric:
    return Metric(name, unit, kind, f"{description} ({origin})", SOURCE)


# error_summary keys -> metric (per period: the monitor counts them over its captured period)
ERROR_KINDS = ("generic", "numerical", "transient", "model", "runtime", "hardware")
# execution_summary (older: inference_summary) keys other than "completed"
OUTCOMES = ("completed_with_err", "completed_with_num_err", "timed_out", "incorrect_input",
            "failed_to_queue")
DEVICE_MEM_PARTS = ("constants", "model_code", "model_shared_scratchpad", "runtime_memory", "tensors")
HOST_MEM_PARTS = ("application_memory", "constants", "dma_buffers", "tensors")
ECC = ("mem_ecc_corrected", "mem_ecc_uncorrected", "sram_ecc_corrected", "sram_ecc_uncorrected")

METRICS = [
    _m("neuron.core_util", "percent", "ratio", MONITOR,
       "NeuronCore utilization over the monitor's period (entity neuron:D/core:C)"),
    _m("neuron.phys_core_util", "percent", "ratio", MONITOR,
       "utilization of one physical core of a logical NeuronCore (Trn2's v3d; entity neuron:D/core:C/phys:P)"),
    _m("neuron.flops_rate", "FLOP/s", "ratio", MONITOR,
       "floating-point operations per second on the NeuronCore over the period (flops, or effective_flops on newer runtimes)"),
    _m("neuron.device_mem_used", "bytes", "gauge", MONITOR,
       "device memory the workload's runtime holds on the NeuronCore (sum of the breakdown; older runtimes: the runtime's total, on its first device)"),
    *[_m(f"neuron.device_mem_{p}", "bytes", "gauge", MONITOR, f"device memory used for {p.replace('_', ' ')} on the NeuronCore")
      for p in DEVICE_MEM_PARTS],
    _m("neuron.device_mem_total", "bytes", "gauge", MONITOR, "memory size of the Neuron device"),
    _m("neuron.host_mem_used", "bytes", "gauge", MONITOR, "host memory the Neuron runtime holds (entity neuron:D/pid:P)"),
    *[_m(f"neuron.host_mem_{p}", "bytes", "gauge", MONITOR, f"host memory the runtime uses for {p.replace('_', ' ')}")
      for p in HOST_MEM_PARTS],
    _m("neuron.runtime_vcpu_user", "percent", "ratio", MONITOR, "vCPU time the Neuron runtime spent in user code over the period"),
    _m("neuron.runtime_vcpu_system", "percent", "ratio", MONITOR, "vCPU time the Neuron runtime spent in the kernel over the period"),
    _m("neuron.exec_completed", "count", "delta", MONITOR, "executions (model runs) completed without error in the interval"),
    *[_m(f"neuron.exec_{o}", "count", "delta", MONITOR, f"executions {o.replace('_', ' ')} in the interval")
      for o in OUTCOMES],
    *[_m(f"neuron.exec_errors_{k}", "count", "delta", MONITOR, f"{k} execution errors in the interval")
      for k in ERROR_KINDS],
    _m("neuron.latency_p50", "s", "gauge", MONITOR, "median execution latency as the runtime measured it, over the period"),
    _m("neuron.latency_p99", "s", "gauge", MONITOR, "99th-percentile execution latency as the runtime measured it, over the period"),
    _m("neuron.device_latency_p50", "s", "gauge", MONITOR, "median time an execution spent on the device, over the period"),
    _m("neuron.device_latency_p99", "s", "gauge", MONITOR, "99th-percentile time an execution spent on the device, over the period"),
    *[_m(f"neuron.ecc_{k.replace('_ecc', '')}", "count", "delta", MONITOR,
         f"{k.split('_')[0].upper()} ECC events {k.split('_')[-1]} on the device in the interval")
      for k in ECC],
    _m("neuron.flop_count", "FLOP", "delta", SYSFS, "floating-point operations on the NeuronCore in the interval (other_info/flop_count)"),
    _m("neuron.nc_time_in_use", "s", "delta", SYSFS, "time the NeuronCore was executing in the interval (other_info/nc_time_in_use, µs)"),
    _m("neuron.sysfs_device_mem_used", "bytes", "gauge", SYSFS, "device memory in use on the NeuronCore (memory_usage/device_mem, every category's total)"),
    _m("neuron.power_util", "percent", "gauge", SYSFS, "device power as a share of its maximum, the driver's per-minute average (stats/power/utilization)"),
]
BY_NAME = {m.name: m for m in METRICS}
