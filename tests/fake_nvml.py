"""A fake NVML for tests: the calls the nvml collector makes, with nvidia-ml-py's behaviour.

CI has no GPU, so the collector is tested against this object passed in where `pynvml`
would be. Everything that is not an NVML function comes from the real pynvml: the NVML_*
constants, the ctypes structures (c_nvmlFieldValue_t, c_nvmlSample_t, c_nvmlGpmMetricsGet_t,
nvmlPciInfo_t, ...) and NVMLError with its per-code subclasses, so an error raised here is the
same class the real library raises. What it imitates:

- nvmlInit / nvmlShutdown reference counting; calls before nvmlInit raise Uninitialized;
  no driver -> nvmlInit raises LibraryNotFound.
- nvmlDeviceGetFieldValues fills one c_nvmlFieldValue_t per (field, scope) with its own
  nvmlReturn, valueType and epoch-µs timestamp; unsupported fields get NOT_SUPPORTED there,
  not as an exception.
- Counters (energy, PCIe bytes, NVLink KiB, throttle ns) integrate their current rates over
  time; a 32-bit PCIe counter wraps at 2**32 and is reported as UNSIGNED_INT.
- nvmlDeviceGetSamples keeps a bounded buffer per sampling type (utilization, memory
  utilization, total power, processor and memory clocks) at the driver's own period, returns
  (value type, list of c_nvmlSample_t) for those newer than the given timestamp and raises
  NOT_FOUND when there are none, as nvidia-ml-py does: its wrapper calls the C function twice
  (the count, then the samples), which `c_calls` counts. A sampling type can be made
  unsupported per GPU; a GPU in MIG mode has no utilization samples.
- Calls are counted per function (`calls`), per function and GPU (`device_calls`, by PCI bus
  id) and per function and whole second since the fake was made (`calls_by_second`).
- GPM: opaque samples from nvmlGpmSampleAlloc, snapshots at nvmlGpmSampleGet, metrics between
  two snapshots with a per-metric nvmlReturn; pre-Hopper answers isSupportedDevice = 0.
- A lost GPU raises GPU_IS_LOST from every call on its handle.
"""
from __future__ import annotations

import ctypes
import threading
import time
from collections import Counter
from typing import Any

import pynvml as real

NS = 1_000_000_000


class FakeGpu:
    """One device. Rates can be changed while a collector samples it (under the fake's lock)."""

    def __init__(self, name: str = "NVIDIA H100 80GB HBM3", *, uuid: str | None = None,
                 bus_id: str = "00000000:17:00.0", memory_total: int = 80 * 2**30,
                 memory_used: int = 2 * 2**30, gpm: bool = True, power_w: float | None = 300.0,
                 util: int = 60, mem_util: int = 25, sm_clock: int = 1755, mem_clock: int = 2619,
                 temp: int = 45, mem_temp: int | None = 40, throttle_reasons: int = 0,
                 pcie_tx_rate: float = 1.0e9, pcie_rx_rate: float = 2.0e9, pcie_bits: int = 64,
                 pcie_start: int = 0, nvlinks: int = 0, nvlink_tx_rate: float = 5.0e9,
                 throttle_power_share: float = 0.25, gpm_values: dict[str, float] | None = None,
                 processes: list[tuple[int, int | None]] | None = None, mig: bool = False,
                 mig_uuids: list[str] | None = None, sample_period_s: float | None = 0.02,
                 sample_buffer_len: int = 100, samples_unsupported: tuple[str, ...] = ()):
        self.name = name
        self.uuid = uuid or f"GPU-{abs(hash((name, bus_id))) % 16**8:08x}-0000-0000-0000-000000000000"
        self.bus_id = bus_id
        self.memory_total = memory_total
        self.memory_used = memory_used
        self.gpm = gpm
        self.power_w = power_w
        self.util, self.mem_util = util, mem_util
        self.sm_clock, self.mem_clock = sm_clock, mem_clock
        self.temp, self.mem_temp = temp, mem_temp
        self.throttle_reasons = throttle_reasons
        self.pcie_tx_rate, self.pcie_rx_rate = pcie_tx_rate, pcie_rx_rate
        self.pcie_bits = pcie_bits
        self.nvlinks = nvlinks
        self.nvlink_tx_rate = nvlink_tx_rate
        self.throttle_power_share = throttle_power_share
        self.gpm_values = gpm_values if gpm_values is not None else {
            "NVML_GPM_METRIC_GRAPHICS_UTIL": 97.0, "NVML_GPM_METRIC_SM_UTIL": 90.0,
            "NVML_GPM_METRIC_SM_OCCUPANCY": 40.0, "NVML_GPM_METRIC_ANY_TENSOR_UTIL": 70.0,
            "NVML_GPM_METRIC_DRAM_BW_UTIL": 35.0, "NVML_GPM_METRIC_FP16_UTIL": 1.0,
            "NVML_GPM_METRIC_FP32_UTIL": 5.0, "NVML_GPM_METRIC_FP64_UTIL": 0.0}
        self.processes = list(processes or [])
        self.mig = mig
        self.mig_uuids = list(mig_uuids or [])
        self.sample_period_s = sample_period_s
        self.sample_buffer_len = sample_buffer_len
        # NVML_*_SAMPLES names this GPU answers NOT_SUPPORTED for
        self.samples_unsupported = {getattr(real, name) for name in samples_unsupported}
        self.lost = False
        # cumulative state, advanced by _advance()
        self._t = time.monotonic()
        self.energy_mj = 123_456_789.0
        self.pcie_tx = float(pcie_start)
        self.pcie_rx = float(pcie_start)
        self.nvlink_tx_kib = [0.0] * nvlinks
        self.throttle_ns = {k: 0.0 for k in range(74, 82)}
        self._samples: dict[int, list[tuple[int, float]]] = {}
        self._next_sample_us = time.time_ns() // 1000

    def advance(self) -> None:
        """Integrate the counters' rates up to now (called before every read)."""
        now = time.monotonic()
        dt, self._t = now - self._t, now
        if self.power_w is not None:
            self.energy_mj += self.power_w * 1000.0 * dt
        self.pcie_tx += self.pcie_tx_rate * dt
        self.pcie_rx += self.pcie_rx_rate * dt
        for link in range(self.nvlinks):
            self.nvlink_tx_kib[link] += self.nvlink_tx_rate * dt / 1024.0
        self.throttle_ns[74] += self.throttle_power_share * dt * NS
        # the driver's sample buffers: one sample per period, the last sample_buffer_len kept
        # (sample_period_s None: a driver that keeps none, so every read is NOT_FOUND)
        if self.sample_period_s is None:
            return
        now_us = time.time_ns() // 1000
        period_us = int(self.sample_period_s * 1e6)
        while self._next_sample_us <= now_us:
            stamp = self._next_sample_us
            for stype, value in ((real.NVML_GPU_UTILIZATION_SAMPLES, self.util),
                                 (real.NVML_MEMORY_UTILIZATION_SAMPLES, self.mem_util),
                                 (real.NVML_TOTAL_POWER_SAMPLES,
                                  None if self.power_w is None else self.power_w * 1000),
                                 (real.NVML_PROCESSOR_CLK_SAMPLES, self.sm_clock),
                                 (real.NVML_MEMORY_CLK_SAMPLES, self.mem_clock)):
                if value is not None:
                    buf = self._samples.setdefault(stype, [])
                    buf.append((stamp, value))
                    del buf[:-self.sample_buffer_len]
            self._next_sample_us += period_us


class FakeHandle:
    """What nvmlDeviceGetHandleByIndex returns (the real one is an opaque pointer)."""

    def __init__(self, gpu: FakeGpu, mig_uuid: str | None = None):
        self.gpu = gpu
        self.mig_uuid = mig_uuid


def _raise(code: int):
    raise real.NVMLError(code)


class FakeNvml:
    """Stands in for the pynvml module."""

    def __init__(self, gpus: list[FakeGpu], *, driver: str = "550.54.15", library: bool = True):
        self.gpus = gpus
        self.driver = driver
        self.library = library
        self.inits = 0
        self.calls: Counter[str] = Counter()
        self.c_calls: Counter[str] = Counter()                  # calls into the C library
        self.device_calls: Counter[tuple[str, str]] = Counter()  # (function, PCI bus id)
        self.calls_by_second: Counter[tuple[str, int]] = Counter()
        self._t0 = time.monotonic()
        self.lock = threading.Lock()
        self._gpm_buffers: dict[int, Any] = {}
        self._gpm_snapshots: dict[int, tuple[FakeGpu, float, float, float]] = {}

    def __getattr__(self, name: str):
        # constants, structures and error classes are the real library's; a function the fake
        # does not implement is missing, as in an older nvidia-ml-py
        if name.startswith("nvml") and callable(getattr(real, name, None)):
            raise AttributeError(f"fake NVML does not implement {name}")
        return getattr(real, name)

    # -- helpers ---------------------------------------------------------------------------

    def _enter(self, fn: str, gpu: FakeGpu | None = None) -> None:
        self.calls[fn] += 1
        self.c_calls[fn] += 1
        self.calls_by_second[fn, int(time.monotonic() - self._t0)] += 1
        if gpu is not None:
            self.device_calls[fn, gpu.bus_id] += 1
        if self.inits == 0:
            _raise(real.NVML_ERROR_UNINITIALIZED)

    def per_gpu(self, since: Counter[tuple[str, str]] | None = None) -> dict[str, Counter[str]]:
        """Calls per GPU (bus id) per function, made since the `device_calls` copy `since`."""
        out: dict[str, Counter[str]] = {}
        for (fn, bus), n in (self.device_calls - (since or Counter())).items():
            out.setdefault(bus, Counter())[fn] += n
        return out

    def _gpu(self, fn: str, handle: FakeHandle) -> FakeGpu:
        self._enter(fn, handle.gpu)
        gpu = handle.gpu
        if gpu.lost:
            _raise(real.NVML_ERROR_GPU_IS_LOST)
        gpu.advance()
        return gpu

    # -- library ---------------------------------------------------------------------------

    def nvmlInit(self):
        self.calls["nvmlInit"] += 1
        if not self.library:
            _raise(real.NVML_ERROR_LIBRARY_NOT_FOUND)
        self.inits += 1

    def nvmlShutdown(self):
        self.calls["nvmlShutdown"] += 1
        if self.inits == 0:
            _raise(real.NVML_ERROR_UNINITIALIZED)
        self.inits -= 1

    def nvmlSystemGetDriverVersion(self):
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlDeviceGetCount(self):
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        return FakeHandle(self.gpus[index])

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self._enter("nvmlDeviceGetHandleByUUID")
        for g in self.gpus:
            if g.uuid == uuid:
                return FakeHandle(g)
            if uuid in g.mig_uuids:
                return FakeHandle(g, mig_uuid=uuid)
        _raise(real.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle):
        self._enter("nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
        if handle.mig_uuid is None:
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        return FakeHandle(handle.gpu)

    # -- device facts ----------------------------------------------------------------------

    def nvmlDeviceGetName(self, handle):
        return self._gpu("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetUUID(self, handle):
        gpu = self._gpu("nvmlDeviceGetUUID", handle)
        return handle.mig_uuid or gpu.uuid

    def nvmlDeviceGetPciInfo(self, handle):
        gpu = self._gpu("nvmlDeviceGetPciInfo", handle)
        info = real.nvmlPciInfo_t()
        info.busId = gpu.bus_id.encode()
        info.busIdLegacy = gpu.bus_id[4:].encode()
        dom, bus, rest = gpu.bus_id.split(":")
        info.domain, info.bus, info.device = int(dom, 16), int(bus, 16), int(rest.split(".")[0], 16)
        return info

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        return real.c_nvmlMemory_t(total=gpu.memory_total, free=gpu.memory_total - gpu.memory_used,
                                   used=gpu.memory_used)

    def nvmlDeviceGetMigMode(self, handle):
        gpu = self._gpu("nvmlDeviceGetMigMode", handle)
        mode = real.NVML_DEVICE_MIG_ENABLE if gpu.mig else real.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    # -- readings --------------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle):
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        if gpu.mig:
            _raise(real.NVML_ERROR_NOT_SUPPORTED)
        return real.c_nvmlUtilization_t(gpu=gpu.util, memory=gpu.mem_util)

    def nvmlDeviceGetClockInfo(self, handle, type):
        gpu = self._gpu("nvmlDeviceGetClockInfo", handle)
        if type == real.NVML_CLOCK_SM:
            return gpu.sm_clock
        if type == real.NVML_CLOCK_MEM:
            return gpu.mem_clock
        _raise(real.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        gpu = self._gpu("nvmlDeviceGetTemperature", handle)
        if sensor != real.NVML_TEMPERATURE_GPU:
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temp

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle).throttle_reasons

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        gpu = self._gpu("nvmlDeviceGetComputeRunningProcesses", handle)
        out = []
        for pid, used in gpu.processes:
            obj = real.nvmlStructToFriendlyObject(real.c_nvmlProcessInfo_t(
                pid=pid, usedGpuMemory=real.NVML_VALUE_NOT_AVAILABLE_ulonglong.value if used is None else used))
            if obj.usedGpuMemory == real.NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
                obj.usedGpuMemory = None          # as the real wrapper does
            out.append(obj)
        return out

    def nvmlDeviceGetNvLinkState(self, handle, link):
        gpu = self._gpu("nvmlDeviceGetNvLinkState", handle)
        if not 0 <= link < max(gpu.nvlinks, 1) or gpu.nvlinks == 0:
            _raise(real.NVML_ERROR_NOT_SUPPORTED if gpu.nvlinks == 0 else real.NVML_ERROR_INVALID_ARGUMENT)
        return real.NVML_FEATURE_ENABLED

    def _field(self, gpu: FakeGpu, fid: int, scope: int):
        """(value type, union member, value) or an NVML return code."""
        ull, ui = real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, real.NVML_VALUE_TYPE_UNSIGNED_INT
        power = {real.NVML_FI_DEV_POWER_INSTANT: 1.0, real.NVML_FI_DEV_POWER_AVERAGE: 1.0,
                 real.NVML_FI_DEV_POWER_CURRENT_LIMIT: None}
        if fid in power or fid == real.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
            if gpu.power_w is None:
                return real.NVML_ERROR_NOT_SUPPORTED
            if fid == real.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
                return ull, "ullVal", int(gpu.energy_mj)
            if fid == real.NVML_FI_DEV_POWER_CURRENT_LIMIT:
                return ui, "uiVal", 700_000
            return ui, "uiVal", int(gpu.power_w * 1000)
        if fid == real.NVML_FI_DEV_MEMORY_TEMP:
            return real.NVML_ERROR_NOT_SUPPORTED if gpu.mem_temp is None else (ui, "uiVal", gpu.mem_temp)
        if fid in (real.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, real.NVML_FI_DEV_PCIE_COUNT_RX_BYTES):
            total = gpu.pcie_tx if fid == real.NVML_FI_DEV_PCIE_COUNT_TX_BYTES else gpu.pcie_rx
            value = int(total) % (1 << gpu.pcie_bits)
            return (ui, "uiVal", value) if gpu.pcie_bits == 32 else (ull, "ullVal", value)
        if 74 <= fid <= 81:
            return ull, "ullVal", int(gpu.throttle_ns[fid])
        if fid == real.NVML_FI_DEV_NVLINK_LINK_COUNT:
            return ui, "uiVal", gpu.nvlinks
        if fid in (real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX):
            if gpu.nvlinks == 0:
                return real.NVML_ERROR_NOT_SUPPORTED
            if not 0 <= scope < gpu.nvlinks:
                return real.NVML_ERROR_INVALID_ARGUMENT
            return ull, "ullVal", int(gpu.nvlink_tx_kib[scope])   # rx mirrors tx
        return real.NVML_ERROR_INVALID_ARGUMENT

    def nvmlDeviceGetFieldValues(self, handle, fieldIds):
        with self.lock:
            gpu = self._gpu("nvmlDeviceGetFieldValues", handle)
            values = (real.c_nvmlFieldValue_t * len(fieldIds))()
            stamp = time.time_ns() // 1000
            for i, fid in enumerate(fieldIds):
                fid, scope = fid if isinstance(fid, tuple) else (fid, 0)
                v = values[i]
                v.fieldId, v.scopeId, v.timestamp, v.latencyUsec = fid, scope, stamp, 0
                got = self._field(gpu, fid, scope)
                if isinstance(got, int):
                    v.nvmlReturn = got
                    continue
                v.valueType, member, number = got
                v.nvmlReturn = real.NVML_SUCCESS
                setattr(v.value, member, number)
            return values

    def nvmlDeviceGetSamples(self, device, sampling_type, timeStamp):
        # as nvidia-ml-py: a first C call for the count (its error raised as NVMLError),
        # then a second into an array of that many c_nvmlSample_t, returned as a list
        with self.lock:
            gpu = self._gpu("nvmlDeviceGetSamples", device)
            if not 0 <= sampling_type < real.NVML_SAMPLINGTYPE_COUNT:
                _raise(real.NVML_ERROR_INVALID_ARGUMENT)
            unsupported = (sampling_type in gpu.samples_unsupported
                           or (sampling_type == real.NVML_TOTAL_POWER_SAMPLES and gpu.power_w is None)
                           or (gpu.mig and sampling_type in (real.NVML_GPU_UTILIZATION_SAMPLES,
                                                             real.NVML_MEMORY_UTILIZATION_SAMPLES))
                           or sampling_type not in (real.NVML_GPU_UTILIZATION_SAMPLES,
                                                    real.NVML_MEMORY_UTILIZATION_SAMPLES,
                                                    real.NVML_TOTAL_POWER_SAMPLES,
                                                    real.NVML_PROCESSOR_CLK_SAMPLES,
                                                    real.NVML_MEMORY_CLK_SAMPLES))
            if unsupported:
                _raise(real.NVML_ERROR_NOT_SUPPORTED)
            newer = [(t, v) for t, v in gpu._samples.get(sampling_type, []) if t > timeStamp]
            if not newer:
                _raise(real.NVML_ERROR_NOT_FOUND)
            self.c_calls["nvmlDeviceGetSamples"] += 1
            out = (real.c_nvmlSample_t * len(newer))()
            for s, (t, v) in zip(out, newer):
                s.timeStamp = t
                s.sampleValue.uiVal = int(v)
            return (real.NVML_VALUE_TYPE_UNSIGNED_INT, out[0:len(newer)])

    # -- GPM -------------------------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, device):
        gpu = self._gpu("nvmlGpmQueryDeviceSupport", device)
        support = real.c_nvmlGpmSupport_t()
        support.version = real.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = 1 if gpu.gpm else 0
        return support

    def nvmlGpmSampleAlloc(self):
        self._enter("nvmlGpmSampleAlloc")
        buf = ctypes.create_string_buffer(16)       # a distinct address per sample
        sample = ctypes.cast(buf, real.c_nvmlGpmSample_t)
        self._gpm_buffers[ctypes.addressof(buf)] = buf
        return sample

    @staticmethod
    def _address(sample) -> int:
        return ctypes.cast(sample, ctypes.c_void_p).value or 0

    def nvmlGpmSampleFree(self, gpmSample):
        self._enter("nvmlGpmSampleFree")
        if self._gpm_buffers.pop(self._address(gpmSample), None) is None:
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlGpmSampleGet(self, device, gpmSample):
        with self.lock:
            gpu = self._gpu("nvmlGpmSampleGet", device)
            if not gpu.gpm:
                _raise(real.NVML_ERROR_NOT_SUPPORTED)
            addr = self._address(gpmSample)
            if addr not in self._gpm_buffers:
                _raise(real.NVML_ERROR_INVALID_ARGUMENT)
            self._gpm_snapshots[addr] = (gpu, time.monotonic(), gpu.pcie_tx, gpu.pcie_rx)
            return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet):
        first = self._gpm_snapshots.get(self._address(metricsGet.sample1))
        self._enter("nvmlGpmMetricsGet", first[0] if first else None)
        if metricsGet.version != real.NVML_GPM_METRICS_GET_VERSION:
            _raise(real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        a = self._gpm_snapshots.get(self._address(metricsGet.sample1))
        b = self._gpm_snapshots.get(self._address(metricsGet.sample2))
        if a is None or b is None or a[0] is not b[0] or b[1] <= a[1]:
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        gpu, dt = a[0], b[1] - a[1]
        if gpu.lost:
            _raise(real.NVML_ERROR_GPU_IS_LOST)
        by_id = {getattr(real, k): v for k, v in gpu.gpm_values.items()}
        by_id[real.NVML_GPM_METRIC_PCIE_TX_PER_SEC] = (b[2] - a[2]) / dt / 2**20
        by_id[real.NVML_GPM_METRIC_PCIE_RX_PER_SEC] = (b[3] - a[3]) / dt / 2**20
        if gpu.nvlinks:     # (a GPU without NVLink answers NOT_SUPPORTED for these)
            by_id[real.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC] = gpu.nvlinks * gpu.nvlink_tx_rate / 2**20
            by_id[real.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC] = gpu.nvlinks * gpu.nvlink_tx_rate / 2**20
        for i in range(metricsGet.numMetrics):
            m = metricsGet.metrics[i]
            if m.metricId in by_id:
                m.value, m.nvmlReturn = by_id[m.metricId], real.NVML_SUCCESS
            else:
                m.value, m.nvmlReturn = 0.0, real.NVML_ERROR_NOT_SUPPORTED
        return metricsGet


def hopper(**kw) -> FakeGpu:
    return FakeGpu("NVIDIA H100 80GB HBM3", **kw)


def ampere(**kw) -> FakeGpu:
    kw.setdefault("gpm", False)
    kw.setdefault("memory_total", 40 * 2**30)
    return FakeGpu("NVIDIA A100-SXM4-40GB", **kw)
