"""One GPU's sampling: what it supports (found by a first read), and each tick's rows.

Rows are (time_ns, duration_ns | None, metric, entity, value) on the run's axis. Every NVML
call costs the sampling thread ~0.6 ms of CPU on a GPU VM (issue 35), so each reading is made
as seldom as its resolution allows. Three cadences, driven by the collector's thread:
  tick()       every interval (default 100 ms): one batched nvmlDeviceGetFieldValues (power,
               energy, PCIe and NVLink byte counters, throttle times: a counter's resolution
               is how often it is read); the first tick after each slow tick carries the
               rare fields too (average power, power limit, memory temperature);
  gpm_tick()   every GPM window (>= 100 ms) on GPUs with GPM: one nvmlGpmSampleGet and the
               metrics between it and the previous sample;
  slow_tick()  once a second: the driver's sample buffers (nvmlDeviceGetSamples) since the
               last-seen timestamp, each sample at the driver's own time: utilization, memory
               utilization, power, SM and memory clocks, at the driver's period (1/6 s or
               faster) for one call a second each; the slow-moving readings with no field
               (temperature, memory used, throttle reasons); GPU memory of the workload's
               processes; memory size.
Where a GPU's buffer does not answer (NOT_SUPPORTED, or empty at the first read), the reading
it stands in for is polled every tick as before. A buffer that loses samples between two reads
(it held less than a second) is read more often, down to every tick.
With sample_buffers=False, everything is polled every tick (the path before issue 35).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from counterprof.ground.clock import Clock
from counterprof.ground.errors import NVML_ERROR_NOT_FOUND, NVML_ERROR_NOT_SUPPORTED, NVML_SUCCESS

from .devices import Gpu
from .library import Nvml, union_value
from .metrics import DRIVER_SAMPLES, FIELDS, GPM, NVLINK_FIELDS, NVLINK_LINK_COUNT, FieldSpec, SampleSpec

# one sample: (time_ns, duration_ns | None, metric, entity, value)
Row = tuple[int, int | None, str, str, float]

MIN_GPM_WINDOW_MS = 100.0   # NVML documents GPM metrics over windows of at least 100 ms
BUFFER_READ_NS = 1_000_000_000      # the driver's sample buffers: read once a second
# polled readings with no field and no buffer that move slowly: once a second, not every tick
RARE_CALLS = ("memory", "temp", "reasons")


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
        # the run clock read between two wall-clock reads, the tightest bracket of three: a
        # thread preempted between two reads would shift every driver stamp until the next
        # refresh (the sample buffers' rows all land through this)
        best = (1 << 62, 0)
        for _ in range(3):
            a = time.time_ns()
            mid = self.clock.now_ns()
            b = time.time_ns()
            if b - a < best[0]:
                best = (b - a, (a + b) // 2 - mid)
            if b - a < 20_000:
                break
        self.skew = best[1]

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


class Buffer:
    """One sample buffer being read: its sampling type, what it feeds, the last driver stamp
    seen (epoch µs), how often it is read, and the most samples one read has returned (the
    first read takes the whole buffer: about its capacity)."""

    def __init__(self, stype: int, spec: SampleSpec, name: str, metrics: tuple[str, ...],
                 last_us: int, period_ns: int, now_ns: int, capacity: int):
        self.stype, self.spec, self.name, self.metrics = stype, spec, name, metrics
        self.capacity = capacity
        self.last_us = last_us
        self.seen = False                # last_us is a driver stamp (not the probe's "now")
        self.period_ns = period_ns
        self.read_ns = now_ns


class GpuSampler:
    def __init__(self, nvml: Nvml, gpu: Gpu, wall: WallClock, *, gpm: bool = True,
                 on_new_metrics: Callable[[set[str]], None] = lambda names: None,
                 interval_ns: int = 100_000_000, sample_buffers: bool = True):
        self.nvml, self.gpu, self.wall = nvml, gpu, wall
        # GPM says per metric whether it is supported only in a first window: those that
        # answer are handed to on_new_metrics then (the catalog), the others named in meta.json
        self.on_new_metrics = on_new_metrics
        self.gpm_answered = False
        self.where = gpu.entity
        self.interval_ns = int(interval_ns)
        self.bulk = sample_buffers
        lib = nvml.lib
        # every field: (field id, scope id), its spec, entity and name; the index is its key
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
        self._batches()
        self.clock_sm = nvml.const("NVML_CLOCK_SM", 1)
        self.clock_mem = nvml.const("NVML_CLOCK_MEM", 2)
        self.temp_gpu = nvml.const("NVML_TEMPERATURE_GPU", 0)
        self.reasons_fn = ("nvmlDeviceGetCurrentClocksEventReasons"
                           if hasattr(lib, "nvmlDeviceGetCurrentClocksEventReasons")
                           else "nvmlDeviceGetCurrentClocksThrottleReasons")
        # calls without a field: key -> (name in meta.json, metrics it gives); each on until
        # the first read says NOT_SUPPORTED
        self.calls = {"util": ("nvmlDeviceGetUtilizationRates", ("gpu.util", "gpu.mem_util")),
                      "memory": ("nvmlDeviceGetMemoryInfo", ("gpu.mem_used",)),
                      "sm_clock": ("nvmlDeviceGetClockInfo(NVML_CLOCK_SM)", ("gpu.sm_clock",)),
                      "mem_clock": ("nvmlDeviceGetClockInfo(NVML_CLOCK_MEM)", ("gpu.mem_clock",)),
                      "temp": ("nvmlDeviceGetTemperature", ("gpu.temp",)),
                      "reasons": (self.reasons_fn, ("gpu.throttle_reasons",))}
        self.use = {key: True for key in self.calls}
        self.use["procs"] = True
        self.polled: set[str] = {m for _, metrics in self.calls.values() for m in metrics}
        self.tick_calls = list(self.calls)          # until the probe: every call, every tick
        self.rare_due = False                       # the next tick carries the rare fields
        self.slow_calls: list[str] = []
        # the driver's sample buffers (set by the probe)
        self.buffers: list[Buffer] = []
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

    def _batches(self) -> None:
        """The two nvmlDeviceGetFieldValues requests: (ids, names, keys) of the fields read
        every tick, and of those plus the rare ones (once a second, or every tick with
        sample_buffers off)."""
        def batch(keys: list[int]) -> tuple[list[tuple[int, int]], list[str], list[int]]:
            return [self.fields[i] for i in keys], [self.names[i] for i in keys], keys
        every = [i for i, (spec, _) in enumerate(self.specs) if not (self.bulk and spec.rare)]
        rare = [i for i, (spec, _) in enumerate(self.specs) if self.bulk and spec.rare]
        self.batch_fast, self.batch_all = batch(every), batch(every + rare)

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

    def _open_buffers(self) -> None:
        """Which sample buffers answer: read whole (lastSeenTimeStamp 0) once; samples from
        before the run are skipped. A buffer that is unsupported or holds nothing is not
        used, and the reading it stands in for stays polled."""
        nvml, h, w = self.nvml, self.gpu.handle, self.where
        now_us, now_ns = self.wall.now_us(), self.wall.clock.now_ns()
        for spec in DRIVER_SAMPLES:
            stype = nvml.const(spec.const)
            if stype is None:           # this nvidia-ml-py predates the sampling type
                continue
            metrics = tuple(m for m in (spec.metric, spec.replaces if self.bulk else None) if m)
            if not metrics:
                continue
            name = f"nvmlDeviceGetSamples({spec.const})"
            got = nvml.call("nvmlDeviceGetSamples", h, stype, 0, where=w, name=name,
                            absent_codes=(NVML_ERROR_NOT_FOUND,), absent=(None, []))
            if got is None or not got[1]:
                continue
            self.buffers.append(Buffer(stype, spec, name, metrics, now_us, BUFFER_READ_NS, now_ns,
                                       len(got[1])))

    def probe(self, rows: list[Row]) -> None:
        """The first read: sets the counters' baselines, finds which sample buffers answer,
        and turns off whatever NVML says this GPU does not support (named once in
        meta.json, left out of the catalog). Every polled reading is made once here, so a
        run shorter than the driver's sample period still has a value of each."""
        self._open_buffers()
        self.tick(rows, rare=True)
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
        self._batches()
        self.rare_due = False
        for key, (name, _) in self.calls.items():
            if nvml.is_unsupported(name, w):
                self.use[key] = False
        if nvml.is_unsupported("nvmlDeviceGetComputeRunningProcesses", w):
            self.use["procs"] = False
        # a buffer that answers stands in for its polled reading
        buffered = {b.spec.replaces for b in self.buffers if b.spec.replaces in b.metrics}
        self.polled = {m for key, (_, metrics) in self.calls.items() if self.use[key]
                       for m in metrics if m not in buffered}
        wanted = [key for key, (_, metrics) in self.calls.items()
                  if self.use[key] and self.polled.intersection(metrics)]
        self.slow_calls = [k for k in wanted if self.bulk and k in RARE_CALLS]
        self.tick_calls = [k for k in wanted if k not in self.slow_calls]

    def metrics(self) -> set[str]:
        """Names of the metrics this GPU will record (GPM's come after its first window)."""
        out = {spec.metric for spec, _ in self.specs}
        out |= self.polled
        out.update(m for b in self.buffers for m in b.metrics)
        if self.use["procs"]:
            out.add("gpu.proc_mem_used")
        if self.gpu.memory_total is not None:
            out.add("gpu.mem_total")
        return out

    def buffer_periods(self) -> dict[str, float]:
        """meta.json: each sample buffer read, and how often (ms)."""
        return {b.spec.const: b.period_ns / 1e6 for b in self.buffers}

    # -- ticks ---------------------------------------------------------------------------

    def tick(self, rows: list[Row], rare: bool = False) -> None:
        """The fast tick: the field batch (with the rare fields when `rare` or after a slow
        tick), the readings still polled every tick, and any buffer read faster than once a
        second."""
        batch = self.batch_all if rare or self.rare_due or not self.bulk else self.batch_fast
        self.rare_due = False
        if batch[0]:
            self._fields(rows, *batch)
        for key in self.tick_calls:
            self._poll(key, rows)
        if self.buffers:
            now = self.wall.clock.now_ns()
            for b in self.buffers:
                if b.period_ns < BUFFER_READ_NS and now - b.read_ns >= b.period_ns - self.interval_ns // 2:
                    self._read_buffer(b, rows, now)

    def _fields(self, rows: list[Row], ids: list[tuple[int, int]], names: list[str],
                keys: list[int]) -> None:
        wall = self.wall
        now = wall.clock.now_ns()
        values = self.nvml.field_values(self.gpu.handle, ids, names, self.where)
        for i, got in zip(keys, values):
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

    def _poll(self, key: str, rows: list[Row]) -> None:
        """One call without a field; each reading stamped when its call returned."""
        nvml, h, w, polled = self.nvml, self.gpu.handle, self.where, self.polled
        name, _ = self.calls[key]
        if key == "util":
            u = nvml.call("nvmlDeviceGetUtilizationRates", h, where=w)
            if u is not None:
                now = self.wall.clock.now_ns()
                if "gpu.util" in polled:
                    rows.append((now, None, "gpu.util", w, float(u.gpu)))
                if "gpu.mem_util" in polled:
                    rows.append((now, None, "gpu.mem_util", w, float(u.memory)))
            return
        if key == "memory":
            m = nvml.call("nvmlDeviceGetMemoryInfo", h, where=w)
            got, metric = (None if m is None else m.used), "gpu.mem_used"
        elif key == "sm_clock":
            got, metric = nvml.call("nvmlDeviceGetClockInfo", h, self.clock_sm, where=w, name=name), "gpu.sm_clock"
        elif key == "mem_clock":
            got, metric = nvml.call("nvmlDeviceGetClockInfo", h, self.clock_mem, where=w, name=name), "gpu.mem_clock"
        elif key == "temp":
            got, metric = nvml.call("nvmlDeviceGetTemperature", h, self.temp_gpu, where=w), "gpu.temp"
        else:
            got, metric = nvml.call(self.reasons_fn, h, where=w), "gpu.throttle_reasons"
        if got is not None:
            rows.append((self.wall.clock.now_ns(), None, metric, w, float(got)))

    def _read_buffer(self, b: Buffer, rows: list[Row], now_ns: int) -> None:
        """Every sample newer than the last one seen, at the driver's own times."""
        b.read_ns = now_ns
        got = self.nvml.call("nvmlDeviceGetSamples", self.gpu.handle, b.stype, b.last_us,
                             where=self.where, name=b.name,
                             absent_codes=(NVML_ERROR_NOT_FOUND,), absent=(None, []))
        if got is None:
            return
        value_type, samples = got
        stamps = []
        run_ns, scale, w = self.wall.run_ns, b.spec.scale, self.where
        for s in samples:
            stamp = int(s.timeStamp)
            if stamp <= b.last_us:
                continue
            value, _ = union_value(value_type, s.sampleValue)
            if value is not None:
                t, v = run_ns(stamp), value * scale
                for metric in b.metrics:
                    rows.append((t, None, metric, w, v))
            stamps.append(stamp)
        if not stamps:
            return
        stamps.sort()
        full = len(samples) >= b.capacity
        b.capacity = max(b.capacity, len(samples))
        if full and b.seen and len(stamps) >= 3 and b.period_ns > self.interval_ns:
            # a read as full as the buffer gets, whose first new sample is further from the
            # last one seen than the driver's own spacing: the buffer wrapped between two
            # reads and samples were lost; read it more often from now on
            gaps = sorted(y - x for x, y in zip(stamps, stamps[1:]))
            spacing = gaps[len(gaps) // 2]
            if spacing > 0 and stamps[0] - b.last_us > 1.5 * spacing:
                b.period_ns = max(self.interval_ns, b.period_ns // 2)
        b.last_us, b.seen = stamps[-1], True

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
        """Once a second: memory size, the workload's GPU memory, the slow-moving polled
        readings and every sample buffer; the rare fields ride on the next fast tick's batch
        (one call, not two)."""
        nvml, h, w, wall = self.nvml, self.gpu.handle, self.where, self.wall
        now = wall.clock.now_ns()
        if self.gpu.memory_total is not None:
            rows.append((now, None, "gpu.mem_total", w, float(self.gpu.memory_total)))
        if self.use["procs"] and (pids is not None or probing):
            procs = nvml.call("nvmlDeviceGetComputeRunningProcesses", h, where=w)
            if procs is not None and pids is not None:
                used = sum(p.usedGpuMemory or 0 for p in procs if p.pid in pids)
                rows.append((now, None, "gpu.proc_mem_used", w, float(used)))
        for key in self.slow_calls:
            self._poll(key, rows)
        if not probing:
            self.rare_due = True
            for b in self.buffers:
                self._read_buffer(b, rows, now)

    def close(self) -> None:
        for s in self.gpm_samples:
            try:
                self.nvml.call("nvmlGpmSampleFree", s, where=self.where)
            except Exception:
                pass
        self.gpm_samples = []
