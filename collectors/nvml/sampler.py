"""One GPU's sampling: what it supports (found by a first read), and each tick's rows.

Rows are (time_ns, duration_ns | None, metric, entity, value) on the run's axis. Three
cadences, driven by the collector's thread:
  tick()       every interval (default 100 ms): one batched nvmlDeviceGetFieldValues (power,
               energy, PCIe and NVLink byte counters, throttle times, memory temperature) and
               the calls that have no field (utilization, memory, clocks, temperature, reasons);
  gpm_tick()   every GPM window (>= 100 ms) on GPUs with GPM: the metrics between two samples;
  slow_tick()  once a second: the driver's sample buffer since the last-seen timestamp,
               GPU memory of the workload's processes, memory size.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from counterprof.ground.clock import Clock
from counterprof.ground.errors import NVML_ERROR_NOT_FOUND, NVML_ERROR_NOT_SUPPORTED, NVML_SUCCESS

from .devices import Gpu
from .library import Nvml, union_value
from .metrics import DRIVER_SAMPLES, FIELDS, GPM, NVLINK_FIELDS, NVLINK_LINK_COUNT, FieldSpec

# one sample: (time_ns, duration_ns | None, metric, entity, value)
Row = tuple[int, int | None, str, str, float]

MIN_GPM_WINDOW_MS = 100.0   # NVML documents GPM metrics over windows of at least 100 ms


class WallClock:
    """Puts NVML's own timestamps on the run's axis.

    Field values and the driver's sample buffer are stamped by NVML in CPU wall-clock
    microseconds since 1970; the run's axis is CLOCK_MONOTONIC plus an offset fixed at session
    start (counterprof/ground/clock.py). `skew` = wall clock - run clock, measured at every tick, so a
    stamp converts as stamp_us * 1000 - skew. A wall-clock step moves NVML's stamps and
    time.time_ns() alike, so after the next refresh (at most one interval later) stamps land
    on the run's axis again, even though the run clock itself never steps."""

    def __init__(self, clock: Clock):
        self.clock = clock
        self.skew = 0
        self.refresh()

    def refresh(self) -> None:
        self.skew = time.time_ns() - self.clock.now_ns()

    def run_ns(self, epoch_us: int) -> int:
        return epoch_us * 1000 - self.skew

    def now_us(self) -> int:
        return (self.clock.now_ns() + self.skew) // 1000


def counter_delta(prev: float, cur: float, width: int | None) -> float | None:
    """cur - prev of a cumulative counter, across a wrap of a `width`-bit unsigned counter.
    A 64-bit (or signed) counter that goes back was reset (driver reload), not wrapped: None.
    A counter that wraps more than once between two reads cannot be told apart (a 32-bit byte
    counter at 25 GB/s wraps every 170 ms: sample faster than that)."""
    if cur >= prev:
        return cur - prev
    if width is not None and width < 64:
        return cur + float(1 << width) - prev
    return None


class GpuSampler:
    def __init__(self, nvml: Nvml, gpu: Gpu, wall: WallClock, *, gpm: bool = True,
                 on_new_metrics: Callable[[set[str]], None] = lambda names: None):
        self.nvml, self.gpu, self.wall = nvml, gpu, wall
        # GPM says per metric whether it is supported only in a first window: those that
        # answer are handed to on_new_metrics then (the catalog), the others named in meta.json
        self.on_new_metrics = on_new_metrics
        self.gpm_answered = False
        self.where = gpu.entity
        lib = nvml.lib
        # fields read every tick: (field id, scope id), their spec, entity and name
        self.fields: list[tuple[int, int]] = []
        self.specs: list[tuple[FieldSpec, str]] = []
        self.names: list[str] = []
        self.prev: dict[int, tuple[float, int]] = {}     # counter fields: (value, stamp µs)
        self.last_stamp: dict[int, int] = {}             # gauge fields: stamp of the last row
        for spec in FIELDS:
            self._add_field(spec, 0, self.where, spec.const)
        self.nvlinks = self._nvlinks()
        for link in self.nvlinks:
            for spec in NVLINK_FIELDS:
                self._add_field(spec, link, f"{self.where}/nvlink:{link}", f"{spec.const}[link {link}]")
        # calls without a field: on until the first read says NOT_SUPPORTED
        self.use = {"util": True, "memory": True, "sm_clock": True, "mem_clock": True,
                    "temp": True, "reasons": True, "procs": True}
        self.clock_sm = nvml.const("NVML_CLOCK_SM", 1)
        self.clock_mem = nvml.const("NVML_CLOCK_MEM", 2)
        self.temp_gpu = nvml.const("NVML_TEMPERATURE_GPU", 0)
        self.reasons_fn = ("nvmlDeviceGetCurrentClocksEventReasons"
                           if hasattr(lib, "nvmlDeviceGetCurrentClocksEventReasons")
                           else "nvmlDeviceGetCurrentClocksThrottleReasons")
        # the driver's sample buffer: (sampling type, metric, scale, name), last stamp seen
        self.sample_types = []
        for const, (metric, scale) in DRIVER_SAMPLES.items():
            stype = nvml.const(const)
            if stype is not None:
                self.sample_types.append((stype, metric, scale, f"nvmlDeviceGetSamples({const})"))
        self.sample_last: dict[int, int] = {}
        # GPM
        self.gpm_metrics: list[tuple[int, str, float, str]] = []
        self.gpm_samples: list[Any] = []
        self.gpm_request = None
        self.gpm_prev_ns = 0
        self.gpm_status = "off"
        if gpm:
            self._gpm_open()

    # -- set-up --------------------------------------------------------------------------

    def _add_field(self, spec: FieldSpec, scope: int, entity: str, name: str) -> None:
        fid = self.nvml.const(spec.const)
        if fid is None:     # this nvidia-ml-py predates the field
            self.nvml.note(name, NVML_ERROR_NOT_SUPPORTED, self.where)
            return
        self.fields.append((fid, scope))
        self.specs.append((spec, entity))
        self.names.append(name)

    def _nvlinks(self) -> list[int]:
        fid = self.nvml.const(NVLINK_LINK_COUNT)
        if fid is None:
            return []
        got = self.nvml.field_values(self.gpu.handle, [(fid, 0)], [NVLINK_LINK_COUNT], self.where)[0]
        if got is None:
            return []
        enabled = self.nvml.const("NVML_FEATURE_ENABLED", 1)
        links = []
        for link in range(int(got[0])):
            state = self.nvml.call("nvmlDeviceGetNvLinkState", self.gpu.handle, link, where=self.where)
            if state == enabled:
                links.append(link)
        return links

    def _gpm_open(self) -> None:
        nvml, h = self.nvml, self.gpu.handle
        if self.gpu.mig:
            self.gpm_status = "off: the GPU is in MIG mode (per-instance GPM is not sampled)"
            return
        support = nvml.call("nvmlGpmQueryDeviceSupport", h, where=self.where)
        if support is None or not support.isSupportedDevice:
            if support is not None:   # answered "no" rather than failing: note it like an error
                nvml.note("nvmlGpmQueryDeviceSupport", NVML_ERROR_NOT_SUPPORTED, self.where)
            self.gpm_status = "not supported on this GPU (GPM needs Hopper or newer)"
            return
        for const, (metric, scale) in GPM.items():
            mid = nvml.const(const)
            if mid is None:
                nvml.note(const, NVML_ERROR_NOT_SUPPORTED, self.where)
            else:
                self.gpm_metrics.append((mid, metric, scale, const))
        samples = [nvml.call("nvmlGpmSampleAlloc", where=self.where) for _ in range(2)]
        self.gpm_samples = [s for s in samples if s is not None]
        if len(self.gpm_samples) < 2 or not self.gpm_metrics:
            self.close()
            self.gpm_status = "off: could not allocate GPM samples"
            return
        if nvml.call("nvmlGpmSampleGet", h, self.gpm_samples[0], where=self.where) is None:
            self.close()
            self.gpm_status = "off: nvmlGpmSampleGet failed"
            return
        self.gpm_prev_ns = self.wall.clock.now_ns()
        self.gpm_status = "on"

    def probe(self, rows: list[Row]) -> None:
        """The first read: sets the counters' baselines and turns off whatever NVML says
        this GPU does not support (named once in meta.json, left out of the catalog)."""
        for stype, *_ in self.sample_types:
            self.sample_last[stype] = self.wall.now_us()
        self.tick(rows)
        self.slow_tick(rows, None, probing=True)
        nvml, w = self.nvml, self.where
        keep = [i for i, name in enumerate(self.names) if not nvml.is_unsupported(name, w)]
        if len(keep) != len(self.fields):
            self.fields = [self.fields[i] for i in keep]
            self.specs = [self.specs[i] for i in keep]
            self.names = [self.names[i] for i in keep]
            moved = {old: new for new, old in enumerate(keep)}     # baselines follow their field
            self.prev = {moved[i]: v for i, v in self.prev.items() if i in moved}
            self.last_stamp = {moved[i]: v for i, v in self.last_stamp.items() if i in moved}
        for key, name in (("util", "nvmlDeviceGetUtilizationRates"), ("memory", "nvmlDeviceGetMemoryInfo"),
                          ("sm_clock", "nvmlDeviceGetClockInfo(NVML_CLOCK_SM)"),
                          ("mem_clock", "nvmlDeviceGetClockInfo(NVML_CLOCK_MEM)"),
                          ("temp", "nvmlDeviceGetTemperature"), ("reasons", self.reasons_fn),
                          ("procs", "nvmlDeviceGetComputeRunningProcesses")):
            if nvml.is_unsupported(name, w):
                self.use[key] = False
        self.sample_types = [s for s in self.sample_types if not nvml.is_unsupported(s[3], w)]

    def metrics(self) -> set[str]:
        """Names of the metrics this GPU will record (GPM's come after its first window)."""
        out = {spec.metric for spec, _ in self.specs}
        provides = {"util": ("gpu.util", "gpu.mem_util"), "memory": ("gpu.mem_used",),
                    "sm_clock": ("gpu.sm_clock",), "mem_clock": ("gpu.mem_clock",),
                    "temp": ("gpu.temp",), "reasons": ("gpu.throttle_reasons",),
                    "procs": ("gpu.proc_mem_used",)}
        for key, names in provides.items():
            if self.use[key]:
                out.update(names)
        out.update(metric for _, metric, _, _ in self.sample_types)
        if self.gpu.memory_total is not None:
            out.add("gpu.mem_total")
        return out

    # -- ticks ---------------------------------------------------------------------------

    def tick(self, rows: list[Row]) -> None:
        nvml, h, w = self.nvml, self.gpu.handle, self.where
        wall = self.wall
        now = wall.clock.now_ns()
        if self.fields:
            values = nvml.field_values(h, self.fields, self.names, w)
            for i, got in enumerate(values):
                if got is None:
                    continue
                value, width, stamp = got
                if stamp <= 0:          # no stamp from the driver: the time of the call
                    stamp = (now + wall.skew) // 1000
                spec, entity = self.specs[i]
                if spec.counter:
                    prev = self.prev.get(i)
                    if prev is not None and stamp <= prev[1]:
                        continue        # the same (cached) reading as last time
                    self.prev[i] = (value, stamp)
                    if prev is None:
                        continue
                    delta = counter_delta(prev[0], value, width)
                    if delta is not None:
                        rows.append((wall.run_ns(stamp), (stamp - prev[1]) * 1000, spec.metric,
                                     entity, delta * spec.scale))
                else:
                    if self.last_stamp.get(i) == stamp:
                        continue
                    self.last_stamp[i] = stamp
                    rows.append((wall.run_ns(stamp), None, spec.metric, entity, value * spec.scale))
        use, now_ns = self.use, wall.clock.now_ns       # each reading stamped when its call returned
        if use["util"]:
            u = nvml.call("nvmlDeviceGetUtilizationRates", h, where=w)
            if u is not None:
                now = now_ns()
                rows.append((now, None, "gpu.util", w, float(u.gpu)))
                rows.append((now, None, "gpu.mem_util", w, float(u.memory)))
        if use["memory"]:
            m = nvml.call("nvmlDeviceGetMemoryInfo", h, where=w)
            if m is not None:
                rows.append((now_ns(), None, "gpu.mem_used", w, float(m.used)))
        if use["sm_clock"]:
            c = nvml.call("nvmlDeviceGetClockInfo", h, self.clock_sm, where=w,
                          name="nvmlDeviceGetClockInfo(NVML_CLOCK_SM)")
            if c is not None:
                rows.append((now_ns(), None, "gpu.sm_clock", w, float(c)))
        if use["mem_clock"]:
            c = nvml.call("nvmlDeviceGetClockInfo", h, self.clock_mem, where=w,
                          name="nvmlDeviceGetClockInfo(NVML_CLOCK_MEM)")
            if c is not None:
                rows.append((now_ns(), None, "gpu.mem_clock", w, float(c)))
        if use["temp"]:
            t = nvml.call("nvmlDeviceGetTemperature", h, self.temp_gpu, where=w)
            if t is not None:
                rows.append((now_ns(), None, "gpu.temp", w, float(t)))
        if use["reasons"]:
            r = nvml.call(self.reasons_fn, h, where=w)
            if r is not None:
                rows.append((now_ns(), None, "gpu.throttle_reasons", w, float(r)))

    def gpm_tick(self, rows: list[Row]) -> None:
        """The GPM metrics over the window since the previous GPM sample."""
        if self.gpm_status != "on":
            return
        nvml, lib, w = self.nvml, self.nvml.lib, self.where
        if self.wall.clock.now_ns() - self.gpm_prev_ns < MIN_GPM_WINDOW_MS * 1e6:
            return              # too short a window for GPM: wait for the next
        prev, cur = self.gpm_samples
        if nvml.call("nvmlGpmSampleGet", self.gpu.handle, cur, where=w) is None:
            return
        now = self.wall.clock.now_ns()
        req = self.gpm_request
        if req is None or req.numMetrics != len(self.gpm_metrics):
            # built once (it holds room for every GPM metric NVML knows, ~19 KB); NVML fills
            # in value and nvmlReturn per metric and leaves the ids alone
            req = self.gpm_request = lib.c_nvmlGpmMetricsGet_t()
            req.version = nvml.const("NVML_GPM_METRICS_GET_VERSION", 1)
            req.numMetrics = len(self.gpm_metrics)
            for i, (mid, *_rest) in enumerate(self.gpm_metrics):
                req.metrics[i].metricId = mid
        req.sample1, req.sample2 = prev, cur
        got = nvml.call("nvmlGpmMetricsGet", req, where=w)
        if got is not None:
            window = now - self.gpm_prev_ns
            dropped = False
            for i, (_mid, metric, scale, const) in enumerate(self.gpm_metrics):
                m = got.metrics[i]
                if m.nvmlReturn != NVML_SUCCESS:
                    nvml.note(const, m.nvmlReturn, w)
                    dropped = dropped or nvml.is_unsupported(const, w)
                    continue
                rows.append((now, window, metric, w, float(m.value) * scale))
            if dropped:
                self.gpm_metrics = [g for g in self.gpm_metrics if not nvml.is_unsupported(g[3], w)]
            if not self.gpm_answered:
                self.gpm_answered = True
                self.on_new_metrics({metric for _, metric, _, _ in self.gpm_metrics})
        self.gpm_samples = [cur, prev]     # this sample opens the next window
        self.gpm_prev_ns = now

    def slow_tick(self, rows: list[Row], pids: set[int] | None, probing: bool = False) -> None:
        nvml, h, w, wall = self.nvml, self.gpu.handle, self.where, self.wall
        now = wall.clock.now_ns()
        if self.gpu.memory_total is not None:
            rows.append((now, None, "gpu.mem_total", w, float(self.gpu.memory_total)))
        if self.use["procs"] and (pids is not None or probing):
            procs = nvml.call("nvmlDeviceGetComputeRunningProcesses", h, where=w)
            if procs is not None and pids is not None:
                used = sum(p.usedGpuMemory or 0 for p in procs if p.pid in pids)
                rows.append((now, None, "gpu.proc_mem_used", w, float(used)))
        for stype, metric, scale, name in self.sample_types:
            last = self.sample_last.get(stype, 0)
            got = nvml.call("nvmlDeviceGetSamples", h, stype, last, where=w, name=name,
                            absent_codes=(NVML_ERROR_NOT_FOUND,), absent=(None, []))
            if got is None:
                continue
            value_type, samples = got
            for s in samples:
                stamp = int(s.timeStamp)
                if stamp <= last:
                    continue
                value, _ = union_value(value_type, s.sampleValue)
                if value is not None:
                    rows.append((wall.run_ns(stamp), None, metric, w, value * scale))
                self.sample_last[stype] = max(self.sample_last[stype], stamp)

    def close(self) -> None:
        for s in self.gpm_samples:
            try:
                self.nvml.call("nvmlGpmSampleFree", s, where=self.where)
            except Exception:
                pass
        self.gpm_samples = []
